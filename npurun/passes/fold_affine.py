"""Affine folding: per-channel (or scalar) multiplies, adds, subtractions and divisions by
constants right after a conv, and a BatchNorm after one (fold_batchnorm.py takes a single BN;
this takes chains), become part of the conv's weights and bias:

    y = s * conv(x, w, b) + t  =  conv(x, s w, s b + t)      s, t per output channel

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
from .rewrite import new_const

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


def fold_affine(g: Graph) -> Graph:
    in_regions(fold_affine, g)
    c = Chains(g)
    for conv in list(g.nodes):
        if conv.op != "conv" or len(conv.outputs) != 1 or OPS["conv"].attrs_of(conv)["activation"]:
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
        wn = new_const(g, f"{tag}.weight.folded", (w.astype(np.float64) * s.reshape((m,) + (1,) * (w.ndim - 1)))
                       .astype(w.dtype), like=wv)
        bias = (0.0 if b is None else b.astype(np.float64)) * s + t
        bn = new_const(g, f"{tag}.bias.folded", bias.astype(w.dtype), like=g.values[bname] if bname else wv)
        c.replace(chain, Node("conv", [conv.inputs[0], wn, bn], [v], dict(conv.attrs), dict(conv.hints),
                              name=conv.name, precision=conv.precision))
    return c.commit()
