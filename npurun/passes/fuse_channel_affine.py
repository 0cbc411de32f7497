"""Per-channel affine + activation fusion: a multiply and/or add by constants holding one value
per channel (axis 1), with at most one activation after them, become one `channel_affine` node
(ir/ops/fused.py), one pass over memory instead of one per node:

    u = x * S; v = u + T; y = relu(v)   ->   y = channel_affine(x, S', T', activation="relu")

S and T of shape (C, 1, 1) or (1, C, 1, 1) (a scalar is taken too, as C equal values) become
(C,). This is a BatchNorm as TF exporters write it (mul by scale / sqrt(var + eps), add of
shift) where there is no conv before it to fold into: after a concat (DenseNet), a residual
add (pre-activation ResNets). x - T is taken as x + (-T) (the same floats). At least two
nodes, at least one of them per channel (scalar chains are fuse_affine_chain's); float32.
Run after fold_affine and fuse_activation (what they fold into a conv is not left here).
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops.elementwise import FUSABLE_ACTIVATIONS
from .fuse_activation import _params
from .match import Chains, in_regions
from .rewrite import new_const


def _per_channel(c: Chains, v: str, k: str):
    """Constant k as one float32 value per channel of v's axis 1 ((C,) array), else None."""
    d = c.const(k)
    shape = c.g.values[v].shape
    if d is None or d.dtype != np.float32 or len(shape) < 2 or not isinstance(shape[1], int) or d.ndim > len(shape):
        return None
    ch = shape[1]
    if d.size == 1:
        return np.full(ch, d.reshape(()), np.float32)
    full = (1,) * (len(shape) - d.ndim) + d.shape
    if full[1] != ch or any(n != 1 for i, n in enumerate(full) if i != 1):
        return None
    return np.ascontiguousarray(d.reshape(ch))


def _step(c: Chains, n: Node, v: str):
    """('scale' | 'shift', (C,) array) when node n is v times / plus / minus a per-channel constant."""
    if n.op not in ("mul", "add", "sub") or len(n.outputs) != 1:
        return None
    k = c.other(n, v)
    if k is None or (n.op == "sub" and n.inputs[0] != v):
        return None
    arr = _per_channel(c, v, k)
    if arr is None or c.g.values[n.outputs[0]].shape != c.g.values[v].shape:
        return None
    if n.op == "mul":
        return "scale", arr, c.const(k).size > 1
    return "shift", (-arr if n.op == "sub" else arr), c.const(k).size > 1


def fuse_channel_affine(g: Graph) -> Graph:
    in_regions(fuse_channel_affine, g)
    c = Chains(g)
    for head in list(g.nodes):
        if id(head) in c.taken or head.op not in ("mul", "add", "sub") or not c.free(head):
            continue
        x = next((i for i in head.inputs if i and c.const(i) is None), None)
        if x is None or c.dtype(x) != "f32":
            continue
        first = _step(c, head, x)
        if first is None:
            continue
        chain, parts, per_channel, out = [head], {first[0]: first[1]}, first[2], head.outputs[0]
        nxt = c.sole(out)
        if first[0] == "scale" and nxt is not None and c.free(nxt):
            second = _step(c, nxt, out)
            if second is not None and second[0] == "shift":
                chain.append(nxt)
                parts["shift"] = second[1]
                per_channel |= second[2]
                out = nxt.outputs[0]
                nxt = c.sole(out)
        act, params = "", []
        if nxt is not None and nxt.op in FUSABLE_ACTIVATIONS and nxt.inputs[0] == out and c.free(nxt) \
                and g.values[nxt.outputs[0]].shape == g.values[out].shape:
            params = _params(c, nxt)
            if params is not None:
                chain.append(nxt)
                act = nxt.op
                out = nxt.outputs[0]
        if len(chain) < 2 or not per_channel:
            continue
        like = g.values[x]
        ins = [x] + [new_const(g, f"{head.name or x}.{k}", parts[k], like=like) if k in parts else ""
                     for k in ("scale", "shift")]
        while ins and ins[-1] == "":
            ins.pop()
        c.replace(chain, Node("channel_affine", ins, [out], {"activation": act, "activation_params": params or []},
                              name=chain[-1].name or head.name, precision=head.precision))
    return c.commit()
