"""BatchNorm folding: an inference-form batch_normalization right after a conv (or a
conv_transpose) becomes part of that conv's weights and bias.

    y = bn(conv(x, w, b), scale, bias, mean, var)
      = conv(x, w * s, (b - mean) * s + bias)      s = scale / sqrt(var + epsilon)

w is (M, C/g, *K) for conv (s scales output channel = axis 0) and (C, M/g, *K) for
conv_transpose (axis 1, group 1 only). A conv without bias gets one. Folding happens only
when every BN operand and the conv's weights (and bias) are constants and the conv's result
is read by the BN alone; the arithmetic runs in float64 and is stored in the weights' dtype.
New weights are new constants (the old ones may be shared), in the old ones' memory space.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.stored import let_go
from .rewrite import const_data, drop_unused_values, new_const, readers, scaled, sole_reader


def _foldable(g: Graph, conv: Node | None) -> bool:
    if conv is None or conv.op not in ("conv", "conv_transpose") or conv.regions:
        return False
    if conv.op == "conv_transpose" and OPS[conv.op].attrs_of(conv)["group"] != 1:
        return False
    b = conv.inputs[2] if len(conv.inputs) > 2 else ""
    return const_data(g, conv.inputs[1]) is not None and (not b or const_data(g, b) is not None)


def _fold(g: Graph, conv: Node, bn: Node) -> Node:
    scale, bias, mean, var = (const_data(g, i).astype(np.float64) for i in bn.inputs[1:5])
    eps = OPS["batch_normalization"].attrs_of(bn)["epsilon"]
    s = scale / np.sqrt(var + eps)
    wv = g.values[conv.inputs[1]]
    w = wv.data
    axis = 0 if conv.op == "conv" else 1
    w = scaled(w, s.reshape((1,) * axis + (-1,) + (1,) * (w.ndim - axis - 1)))
    b0 = const_data(g, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
    b = ((0.0 if b0 is None else b0.astype(np.float64)) - mean) * s + bias
    tag = conv.name or bn.outputs[0]
    wn = new_const(g, f"{tag}.weight.bn", w, like=wv)
    bn_ = new_const(g, f"{tag}.bias.bn", b.astype(w.dtype),
                    like=g.values[conv.inputs[2]] if b0 is not None else wv)
    return Node(conv.op, [conv.inputs[0], wn, bn_], list(bn.outputs), dict(conv.attrs), dict(conv.hints),
                name=conv.name, precision=conv.precision)


def fold_batchnorm(g: Graph) -> Graph:
    for r in (r for n in g.nodes for r in n.regions.values()):
        fold_batchnorm(r)
    prod = g.producers()
    rd = readers(g)
    dropped = set()
    for k, n in enumerate(g.nodes):
        if n.op != "batch_normalization" or any(const_data(g, i) is None for i in n.inputs[1:5]):
            continue
        conv = prod.get(n.inputs[0])
        if not _foldable(g, conv) or sole_reader(g, n.inputs[0], rd) is not n \
                or len(g.values[n.inputs[0]].shape) < 2 or conv.precision != n.precision:
            continue
        g.nodes[k] = _fold(g, conv, n)  # the folded conv takes the BN's place and output
        if sole_reader(g, conv.inputs[1], rd) is conv:
            let_go(g.values[conv.inputs[1]])  # (its folded copy replaces it)
        dropped.add(id(conv))
    g.nodes = [n for n in g.nodes if id(n) not in dropped]
    drop_unused_values(g)
    return g
