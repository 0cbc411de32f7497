"""Op fusion the IR can say with its own ops: chains of data movement become one node, and
a constant bias joins the product that precedes it.

    transpose(transpose(x, p1), p2)        -> transpose(x, [p1[i] for i in p2])
    reshape(R(x), t)   (R a reshape-like)  -> reshape(x, t)          t constant, no 0 left
    add(matmul(a, b), c)  (a, b 2-D; c const)  -> gemm(a, b, c)
    add(conv(x, w, b), c) (c const (1, M, 1..)) -> conv(x, w, b + c)

A fused node takes the name of the result it now computes (the later node's output), so
graph outputs keep their names; the earlier node is left for dead-code removal when nothing
else reads it. Nodes fuse only when their precisions agree.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.shapes import broadcast
from .rewrite import const_data, drop_unused_values, new_const, readers, sole_reader

# Ops that only reinterpret the shape of a contiguous tensor (no data moves).
RESHAPES = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})


def _perm(n: Node, rank: int) -> list[int]:
    return list(OPS["transpose"].attrs_of(n)["perm"] or reversed(range(rank)))


def _fuse_transposes(g: Graph, n: Node, prod: dict) -> bool:
    p = prod.get(n.inputs[0]) if n.inputs else None
    if n.op != "transpose" or p is None or p.op != "transpose" or p.precision != n.precision:
        return False
    x = p.inputs[0]
    rank = len(g.values[x].shape)
    p1, p2 = _perm(p, rank), _perm(n, rank)
    n.inputs[0], n.attrs["perm"] = x, [p1[i] for i in p2]
    return True


def _fuse_reshapes(g: Graph, n: Node, prod: dict) -> bool:
    p = prod.get(n.inputs[0]) if n.inputs else None
    if n.op != "reshape" or p is None or p.op not in RESHAPES or p.precision != n.precision:
        return False
    t = const_data(g, n.inputs[1])
    mid = g.values[n.inputs[0]].shape
    if t is None or OPS["reshape"].attrs_of(n)["allowzero"]:
        return False
    t = [int(v) for v in t]
    # 0 copies a dim of the intermediate value: resolve it, or give up if it is symbolic.
    if any(v == 0 and not isinstance(mid[i], int) for i, v in enumerate(t)):
        return False
    resolved = [mid[i] if v == 0 else v for i, v in enumerate(t)]
    if resolved != t:
        n.inputs[1] = new_const(g, f"{n.outputs[0]}.shape", np.array(resolved, np.int64),
                                like=g.values[n.inputs[1]])
    n.inputs[0] = p.inputs[0]
    return True


def _bias_of(g: Graph, n: Node, rd: dict, prod: dict):
    """(product node, constant bias) when n = add(product, bias) or add(bias, product)."""
    if n.op != "add":
        return None, None
    for k in (0, 1):
        p, c = prod.get(n.inputs[k]), n.inputs[1 - k]
        if p is not None and const_data(g, c) is not None and sole_reader(g, n.inputs[k], rd) is n \
                and p.precision == n.precision and g.values[c].dtype == g.values[n.inputs[k]].dtype:
            return p, c
    return None, None


def _fuse_gemm(g: Graph, n: Node, rd: dict, prod: dict) -> Node | None:
    p, c = _bias_of(g, n, rd, prod)
    if p is None or p.op != "matmul":
        return None
    a, b = (g.values[i] for i in p.inputs)
    y = g.values[n.outputs[0]]
    if len(a.shape) != 2 or len(b.shape) != 2 or broadcast(g.values[c].shape, y.shape) != tuple(y.shape):
        return None
    return Node("gemm", list(p.inputs) + [c], list(n.outputs), name=p.name or n.name, precision=p.precision,
                hints=dict(p.hints))


def _fuse_conv_bias(g: Graph, n: Node, rd: dict, prod: dict) -> Node | None:
    p, c = _bias_of(g, n, rd, prod)
    if p is None or p.op != "conv":
        return None
    y, cv = g.values[n.outputs[0]], g.values[c]
    m = g.values[p.inputs[1]].shape[0]
    data = cv.data
    # The constant must add one number per output channel: shape (1, M, 1, ...) or (M, 1, ...).
    per_channel = data.size == m and data.ndim >= len(y.shape) - 1 and \
        (data.ndim < len(y.shape) or data.shape[0] == 1) and data.shape[data.ndim - len(y.shape) + 1] == m
    if not per_channel or tuple(y.shape) != tuple(g.values[p.outputs[0]].shape):
        return None
    old = const_data(g, p.inputs[2]) if len(p.inputs) > 2 and p.inputs[2] else None
    bias = (0 if old is None else old.astype(np.float64)) + data.reshape(m).astype(np.float64)
    b = new_const(g, f"{p.name or n.outputs[0]}.bias", bias.astype(data.dtype), like=cv)
    return Node("conv", [p.inputs[0], p.inputs[1], b], list(n.outputs), dict(p.attrs), dict(p.hints),
                name=p.name, precision=p.precision)


def fuse_ops(g: Graph) -> Graph:
    for r in (r for n in g.nodes for r in n.regions.values()):
        fuse_ops(r)
    prod = g.producers()
    bypassed: list[Node] = []  # nodes a fused node reads past; dropped below if now unread
    for k, n in enumerate(g.nodes):
        if n.regions:
            continue
        before = prod.get(n.inputs[0]) if n.inputs and n.inputs[0] else None
        if _fuse_transposes(g, n, prod) or _fuse_reshapes(g, n, prod):
            bypassed.append(before)
            continue
        if n.op != "add":
            continue
        rd = readers(g)
        product = _bias_of(g, n, rd, prod)[0]
        fused = _fuse_gemm(g, n, rd, prod) or _fuse_conv_bias(g, n, rd, prod)
        if fused is not None:
            bypassed.append(product)
            g.nodes[k] = fused
            for o in fused.outputs:
                prod[o] = fused
    # Drop bypassed nodes nothing reads any more (latest first: one may feed another).
    for p in reversed(bypassed):
        rd = readers(g)
        if p in g.nodes and not any(rd.get(o) or o in g.outputs for o in p.outputs):
            g.nodes.remove(p)
    drop_unused_values(g)
    return g
