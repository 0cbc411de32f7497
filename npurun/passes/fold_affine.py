"""Affine folding: per-channel (or scalar) multiplies, adds, subtractions and divisions by
constants right after a conv, and a BatchNorm after one (fold_batchnorm.py takes a single BN;
this takes chains), become part of the conv's weights and bias:

    y = s * conv(x, w, b) + t  =  conv(x, s w, s b + t)      s, t per output channel

and the same after a linear layer (matmul, matmul_add with a bias, gemm) by a constant (K, N)
matrix, per column, also through views that keep the last axis (LeViT: matmul -> flatten to
(rows, N) -> BatchNorm1d -> reshape back):

    y = s * (x @ W + b) + t    =  x @ (W s) + (s b + t)       s, t per column

Chains of any length fold into one conv (PP-LCNetV3's "learnable affine" after each conv, a
BatchNorm an exporter wrote out as Mul and Add, a scale by a constant). A step is one of
`v * c`, `c * v`, `v + c`, `c + v`, `v - c`, `c - v`, `v / c` (c != 0) with c a constant of one
number per output channel (shape (M, 1, ...) or (1, M, 1, ...)) or a scalar, or an
inference-form batch_normalization. The arithmetic runs in float64, stored in the weights'
dtype. Only convs with constant weights (and bias), without a fused activation, whose result
each step alone reads.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions
from ..ir.stored import let_go
from .rewrite import new_const, scaled

AFFINE = ("add", "sub", "mul", "div")


def _per_channel(c: Chains, name: str, m: int, rank: int):
    """The constant `name` as float64 (m,) if it adds one number per channel (axis 1) of a
    rank-`rank` value, or a scalar; else None."""
    d = c.const(name)
    if d is None or d.dtype.kind != "f" or d.ndim > rank:
        return None
    if d.size == 1:
        return np.full(m, float(d.reshape(())), np.float64)
    shape = (1,) * (rank - d.ndim) + d.shape
    if shape[1] != m or any(s != 1 for i, s in enumerate(shape) if i != 1):
        return None
    return d.reshape(m).astype(np.float64)


def _step(c: Chains, n: Node, v: str, m: int, rank: int):
    """(a, b) with n's result = a * v + b, per channel; None if n is not such a step."""
    if n.op == "batch_normalization":
        if n.inputs[0] != v or len(n.outputs) != 1:
            return None
        ps = [c.const(i) for i in n.inputs[1:5]]
        if any(p is None or p.size != m for p in ps):
            return None
        g_, be, mu, var = (p.reshape(-1).astype(np.float64) for p in ps)
        a = g_ / np.sqrt(var + OPS["batch_normalization"].attrs_of(n)["epsilon"])
        return a, be - mu * a
    other = c.other(n, v) if n.op in AFFINE else None
    k = _per_channel(c, other, m, rank) if other else None
    if k is None or c.dtype(other) != c.dtype(v):
        return None
    first = n.inputs[0] == v
    if n.op == "add":
        return np.ones(m), k
    if n.op == "mul":
        return k, np.zeros(m)
    if n.op == "sub":
        return (np.ones(m), -k) if first else (-np.ones(m), k)
    if first and np.all(k != 0):  # v / c
        return 1.0 / k, np.zeros(m)
    return None


VIEWS = ("reshape", "flatten", "squeeze", "unsqueeze")


def _last_axis_step(c: Chains, n: Node, v: str, m: int):
    """(a, b) per column when n applies one number per last-axis entry (m of them) to v."""
    vv = c.g.values[v]
    if n.op == "batch_normalization":
        return _step(c, n, v, m, 2) if len(vv.shape) == 2 and vv.shape[1] == m else None
    other = c.other(n, v) if n.op in AFFINE else None
    d = c.const(other) if other else None
    if d is None or d.dtype.kind != "f" or c.dtype(other) != c.dtype(v) or d.ndim > len(vv.shape):
        return None
    if d.size != 1 and (d.shape[-1] != m or d.size != m):
        return None
    k = np.full(m, float(d.reshape(-1)[0])) if d.size == 1 else d.reshape(m).astype(np.float64)
    first = n.inputs[0] == v
    if n.op == "add":
        return np.ones(m), k
    if n.op == "mul":
        return k, np.zeros(m)
    if n.op == "sub":
        return (np.ones(m), -k) if first else (-np.ones(m), k)
    return (1.0 / k, np.zeros(m)) if first and np.all(k != 0) else None


def _fold_linear(g: Graph, c: Chains, mm: Node) -> None:
    """Per-column affines after a linear layer by a constant (K, N) weight, into it."""
    w = c.const(mm.inputs[1])
    if w is None or w.ndim != 2 or w.dtype.kind != "f" or not c.free(mm) or len(mm.outputs) != 1:
        return
    trans_b = mm.op == "gemm" and OPS["gemm"].attrs_of(mm)["trans_b"]
    if mm.op == "gemm" and (OPS["gemm"].attrs_of(mm)["alpha"] != 1.0 or OPS["gemm"].attrs_of(mm)["beta"] != 1.0):
        return
    m = w.shape[0] if trans_b else w.shape[1]
    adds = list(mm.inputs[2:])
    if mm.op == "matmul_add" and len(adds) > 1:
        return  # a residual is not scaled by the columns' factors
    bias = c.const(adds[0]) if adds and adds[0] else None
    if adds and adds[0] and (bias is None or bias.size != m):
        return
    s, t = np.ones(m), np.zeros(m)
    chain, views, v = [mm], [], mm.outputs[0]
    while (r := c.sole(v)) is not None and c.free(r) and len(r.outputs) == 1:
        out = g.values[r.outputs[0]]
        if r.op in VIEWS and r.inputs[0] == v and out.shape and out.shape[-1] == m:
            views.append(r)
        else:
            st = _last_axis_step(c, r, v, m)
            if st is None or tuple(out.shape) != tuple(g.values[v].shape):
                break
            a, k = st
            s, t = a * s, a * t + k
        chain.append(r)
        v = r.outputs[0]
    if len(chain) == len(views) + 1:
        return  # nothing but views
    while chain[-1] in views:  # trailing views stay as they are
        views.remove(chain.pop())
    v = chain[-1].outputs[0]
    wv = g.values[mm.inputs[1]]
    tag = mm.name or v
    scale = s.reshape(m, 1) if trans_b else s.reshape(1, m)
    # (only adds: the weights stay the very same constant, no second copy)
    wn = mm.inputs[1] if np.all(s == 1) else new_const(g, f"{tag}.weight.folded", scaled(w, scale), like=wv)
    if wn != mm.inputs[1] and c.only_readers(mm.inputs[1], [mm]):
        let_go(wv)  # (its folded copy replaces it)
    b = (0.0 if bias is None else bias.reshape(m).astype(np.float64)) * s + t
    bshape = (m,) if bias is None else bias.shape
    bn = new_const(g, f"{tag}.bias.folded", b.reshape(bshape).astype(w.dtype), like=wv)
    first_out = mm.outputs[0] if views else v  # (steps keep shapes: v has the product's shape)
    if mm.op == "gemm":
        prod = Node("gemm", [mm.inputs[0], wn, bn], [first_out], dict(mm.attrs), dict(mm.hints), mm.name, mm.precision)
    else:
        prod = Node("matmul_add", [mm.inputs[0], wn, bn], [first_out], {}, dict(mm.hints), mm.name, mm.precision)
    nodes, cur = [prod], first_out
    for i, view in enumerate(views):
        out = v if i == len(views) - 1 else view.outputs[0]
        nodes.append(Node(view.op, [cur] + list(view.inputs[1:]), [out], dict(view.attrs), dict(view.hints),
                          view.name, view.precision))
        cur = out
    c.replace(chain, nodes)


def fold_affine(g: Graph) -> Graph:
    in_regions(fold_affine, g)
    c = Chains(g)
    for mm in list(g.nodes):
        if mm.op in ("matmul", "matmul_add", "gemm") and id(mm) not in c.taken:
            _fold_linear(g, c, mm)
    for conv in list(g.nodes):
        if conv.op != "conv" or len(conv.outputs) != 1 or OPS["conv"].attrs_of(conv)["activation"] \
                or not c.free(conv):
            continue
        w = c.const(conv.inputs[1])
        bname = conv.inputs[2] if len(conv.inputs) > 2 else ""
        b = c.const(bname) if bname else None
        if w is None or w.dtype.kind != "f" or (bname and b is None) or not c.free(conv):
            continue
        m, rank = w.shape[0], len(g.values[conv.outputs[0]].shape)
        s, t = np.ones(m), np.zeros(m)
        chain, v = [conv], conv.outputs[0]
        while (r := c.sole(v)) is not None and c.free(r):
            st = _step(c, r, v, m, rank)
            if st is None or g.values[r.outputs[0]].shape != g.values[v].shape:
                break
            a, k = st
            s, t = a * s, a * t + k
            chain.append(r)
            v = r.outputs[0]
        if len(chain) == 1:
            continue
        wv = g.values[conv.inputs[1]]
        tag = conv.name or v
        wn = conv.inputs[1] if np.all(s == 1) else \
            new_const(g, f"{tag}.weight.folded", scaled(w, s.reshape((m,) + (1,) * (w.ndim - 1))), like=wv)
        if wn != conv.inputs[1] and c.only_readers(conv.inputs[1], [conv]):
            let_go(wv)
        bias = (0.0 if b is None else b.astype(np.float64)) * s + t
        bn = new_const(g, f"{tag}.bias.folded", bias.astype(w.dtype), like=g.values[bname] if bname else wv)
        c.replace(chain, Node("conv", [conv.inputs[0], wn, bn], [v], dict(conv.attrs), dict(conv.hints),
                              name=conv.name, precision=conv.precision))
    return c.commit()
