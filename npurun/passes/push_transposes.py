"""Transpose push-down: a transpose moves below the elementwise ops that read it, until it
meets its inverse (then both go) or an op it cannot pass.

    T(x) -> relu            ->  relu(x) -> T            (any unary elementwise op)
    T(x) + c                ->  (x + c') -> T           (c constant: c' = c in x's layout)
    T(a) + T(b)             ->  (a + b) -> T            (the same perm on both sides)
    T2(T1(x))               ->  x, or T(x) with the composed perm   (for each reader T2)

NHWC exports (tf2onnx, keras2onnx, and PyTorch re-exports of TensorFlow models) wrap every
conv in transposes and put its bias, BatchNorm (as Sub/Mul/Add), activation and residual
add in NHWC between them; pushed down, the transposes cancel, and the per-channel
constants, now in NCHW, fold into the conv (fold_affine.py). A transpose is moved only when
it is the sole reader's only transposed operand (or both are the same perm), the op does not
broadcast its result beyond the transposed shape, and every node involved is float32 or
carries no precision.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .eliminate_dead_code import eliminate_dead_code
from .match import Chains, f32
from .rewrite import can_forward, new_const, new_value, rename_uses

MAX_ROUNDS = 64  # each round moves every transpose one op down


def _perm(g: Graph, t: Node) -> list[int]:
    rank = len(g.values[t.inputs[0]].shape)
    return list(OPS["transpose"].attrs_of(t)["perm"] or reversed(range(rank)))


def _in_layout(c: np.ndarray, perm: list[int]) -> np.ndarray:
    """A constant broadcast against T(x) (perm), rewritten to broadcast against x."""
    rank = len(perm)
    c = c.reshape((1,) * (rank - c.ndim) + c.shape)
    inv = list(np.argsort(perm))
    return np.ascontiguousarray(c.transpose(inv))


def _pushable(op: str) -> bool:
    """Elementwise ops: each result element depends on the same position of each operand."""
    d = OPS.get(op)
    return d is not None and "elementwise" in d.groups


def _one_round(g: Graph) -> bool:
    c = Chains(g)
    moved = False
    for t in list(g.nodes):
        if t.op != "transpose" or id(t) in c.taken or not c.free(t):
            continue
        e = c.sole(t.outputs[0])
        if e is None or not c.free(e) or len(e.outputs) != 1 or not _pushable(e.op):
            continue
        tv, yv = g.values[t.outputs[0]], g.values[e.outputs[0]]
        if tuple(tv.shape) != tuple(yv.shape) or tv.kind != "tensor":
            continue  # the op broadcasts beyond the transposed shape
        perm = _perm(g, t)
        x = t.inputs[0]
        ins, others = [], []
        ok = True
        for i in e.inputs:
            if i == t.outputs[0]:
                ins.append(x)
                continue
            if not i:
                ins.append(i)
                continue
            d = c.const(i)
            p = c.producer.get(i)
            if d is not None and (d.size == 1 or d.ndim <= len(perm)):
                if d.size == 1:
                    ins.append(i)
                else:
                    ins.append(new_const(g, f"{i}.t", _in_layout(d, perm), like=g.values[i]))
            elif p is not None and p.op == "transpose" and _perm(g, p) == perm and c.sole(i) is e \
                    and id(p) not in c.taken and f32(p):
                ins.append(p.inputs[0])
                others.append(p)
            else:
                ok = False
                break
        if not ok:
            continue
        xv = g.values[x]
        u = new_value(g, f"{e.outputs[0]}.pre", xv.shape, yv.dtype, yv.space)
        moved_e = Node(e.op, ins, [u], dict(e.attrs), dict(e.hints), e.name, e.precision)
        moved_t = Node("transpose", [u], list(e.outputs), dict(t.attrs), dict(t.hints), t.name, t.precision)
        c.replace(sorted([t, e] + others, key=g.nodes.index), [moved_e, moved_t])
        moved = True
    c.commit()
    return moved


def _cancel(g: Graph) -> bool:
    """Every transpose reading a transpose reads the first one's input instead, with the
    composed perm; an identity result is dropped and its readers read that input."""
    prod = g.producers()
    changed = False
    keep = []
    for n in g.nodes:
        p = prod.get(n.inputs[0]) if n.op == "transpose" else None
        if p is None or p.op != "transpose" or not f32(n, p) or g.values[p.inputs[0]].shape is None:
            keep.append(n)
            continue
        x = p.inputs[0]
        p1, p2 = _perm(g, p), _perm(g, n)
        perm = [p1[i] for i in p2]
        changed = True
        if perm == list(range(len(perm))) and can_forward(g, n.outputs[0], x):
            rename_uses(g, n.outputs[0], x)
            continue
        n.inputs[0], n.attrs["perm"] = x, perm
        keep.append(n)
    g.nodes = keep
    return changed


def push_transposes(g: Graph) -> Graph:
    for r in (r for n in g.nodes for r in n.regions.values()):
        push_transposes(r)
    for _ in range(MAX_ROUNDS):
        moved = _one_round(g)
        if not (_cancel(g) or moved):
            break
    eliminate_dead_code(g)  # transposes whose readers all read past them now
    return g
