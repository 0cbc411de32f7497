"""Transformer-encoder fusions over a compiled Program's steps (run after `fuse.py`'s conv
epilogues). Each pattern becomes one step that computes what the chain computes, one rounding
per operation in the same order, so results equal the unfused program's (to the kernels'
error):

    t = x / c; e = erf(t); s = e + a; y = x * (m * s)        -> y = gelu(x)       (torch's GELU
        also x * c (c = 1/sqrt 2); (x * s) * m and (x * m) * s when m is a power of two
    s = scores + mask; p = softmax(s); y = where(is_nan(p), v, p)
                                                             -> y = masked_softmax(scores, mask)
        (the add and the NaN fix are each optional; exported scaled_dot_product_attention)
    u = a @ w; v = u + bias; y = v + residual              -> y = matmul(a, w, bias, residual)
        (ops/matmul.py: w constant: the packed-weight sgemm with the adds in its store, also
        with no add; else the adds in place on each band of BLAS's product)
    w = cast(q) * scale; y = gather(w, ids)                  -> y = gather(q, ids) * scale[ids]
        (int8 embedding tables dequantized at run time: MiniLM-int8 spent ~40 ms a run
        dequantizing 30522 x 384 weights to read 128 rows of them)

A chain fuses only where its intermediate values have no reader outside it and are not graph
outputs, and only nodes at float32 precision (a reduced-precision node rounds its own result).
The fused step takes the place of the chain's last step: the chain reads only its first
input and constants, which exist before any of its steps.
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from ...ir.graph import Node
from ..reference.kernels import KERNELS as REF
from .ops import matmul as MM
from .ops import transformer as T

MAX_ADDS = 2  # bias and residual: what an encoder layer puts after its matmuls


def fuse(prog) -> dict[int, Node]:
    """Rewrite prog.steps in place; return {id(fused-away node): the node now computing it}."""
    if T.LIB is None:
        return {}
    f = _Fuser(prog)
    # Only the graph's own nodes start a pattern: a step fused earlier (here or by fuse.py)
    # is left alone, so running this twice changes nothing.
    own = [(n, attrs) for n, _, attrs, _ in prog.steps if id(n) in f.graph_nodes]
    for n, attrs in own:
        if n.op == "erf":
            f.gelu(n)
        elif n.op == "softmax":
            f.softmax(n, attrs)
        elif n.op == "gather":
            f.dequant_gather(n, attrs)
    for n, attrs in own:  # after the softmax took its mask add
        if n.op == "matmul":
            f.matmul_adds(n)
    return f.commit()


class _Fuser:
    def __init__(self, prog):
        self.prog, self.g = prog, prog.graph
        self.readers = self.g.consumers()
        self.producer = {o: n for n in self.g.nodes for o in n.outputs}
        self.outputs = set(self.g.outputs)
        self.index = {id(s[0]): k for k, s in enumerate(prog.steps)}
        self.graph_nodes = {id(n) for n in self.g.nodes}
        self.taken: set[int] = set()  # ids of nodes already in a fused chain
        self.plans = []  # (chain nodes, new node, fn)
        self.fused: dict[int, Node] = {}

    # -- helpers ------------------------------------------------------------------------
    def const(self, name):
        """The f32 scalar constant `name` as a float, else None."""
        v = self.g.values.get(name) if name else None
        if v is None or not v.is_const or v.data.size != 1 or v.data.dtype != np.float32:
            return None
        return float(v.data.reshape(()))

    def f32(self, name) -> bool:
        v = self.g.values.get(name)
        return v is not None and v.dtype == "f32"

    def only_reader(self, name, node) -> bool:
        rs = self.readers.get(name, [])
        return name not in self.outputs and len(rs) == 1 and rs[0] is node

    def sole(self, name, op):
        """The one reader of `name`, when it is an `op` node and nothing else reads it."""
        rs = self.readers.get(name, [])
        if name in self.outputs or len(rs) != 1 or rs[0].op != op:
            return None
        return rs[0]

    def usable(self, chain) -> bool:
        return all(id(n) in self.index and id(n) not in self.taken and n.precision in (None, "f32")
                   for n in chain)

    def plan(self, chain, node, fn):
        self.taken.update(id(n) for n in chain)
        self.plans.append((chain, node, fn))

    # -- patterns -----------------------------------------------------------------------
    def gelu(self, e_node):
        tp = self.producer.get(e_node.inputs[0])
        if tp is None or tp.op not in ("div", "mul") or not self.only_reader(e_node.inputs[0], e_node):
            return
        if tp.op == "div":
            x, d, mode = tp.inputs[0], self.const(tp.inputs[1]), 0
        else:
            k = 0 if self.const(tp.inputs[1]) is not None else 1
            x, d, mode = tp.inputs[k], self.const(tp.inputs[1 - k]), 1
        if d is None or not self.f32(x) or self.const(x) is not None:
            return
        add = self.sole(e_node.outputs[0], "add")
        if add is None:
            return
        a = self.const(next(i for i in add.inputs if i != e_node.outputs[0]) if len(set(add.inputs)) == 2 else None)
        if a is None:
            return
        s = add.outputs[0]
        m1 = self.sole(s, "mul")
        if m1 is None or len(m1.inputs) != 2 or s not in m1.inputs:
            return
        other = m1.inputs[1] if m1.inputs[0] == s else m1.inputs[0]
        pow2 = lambda v: v is not None and v != 0 and math.frexp(v)[0] == 0.5  # noqa: E731
        chain, m = None, None
        if self.const(other) is not None:  # y = x * (m * s): the kernel's own order, any m
            m2 = self.sole(m1.outputs[0], "mul")
            if m2 is not None and sorted(m2.inputs) == sorted([x, m1.outputs[0]]):
                chain, m = [tp, e_node, add, m1, m2], self.const(other)
        elif other == x:  # y = (x * s) * m, equal to x * (m * s) when m is a power of two
            m2 = self.sole(m1.outputs[0], "mul")
            if m2 is not None and len(m2.inputs) == 2 and m1.outputs[0] in m2.inputs:
                c = self.const(next(i for i in m2.inputs if i != m1.outputs[0]))
                if pow2(c):
                    chain, m = [tp, e_node, add, m1, m2], c
        else:  # h = x * m (read only here); y = h * s
            h = self.producer.get(other)
            if h is not None and h.op == "mul" and x in h.inputs and self.only_reader(other, m1):
                c = self.const(next((i for i in h.inputs if i != x), None))
                if pow2(c):
                    chain, m = [tp, e_node, add, h, m1], c
        if chain is None or not self.usable(chain):
            return
        y = chain[-1].outputs[0]
        node = Node("gelu", [x], [y], {"approximate": "none"}, name=e_node.name or chain[-1].name)
        self.plan(chain, node, lambda x_, *, _d=d, _a=a, _m=m, _mode=mode:
                  T.gelu_call(self.prog, x_, _d, _a, _m, _mode))

    def softmax(self, sm, attrs):
        v = self.g.values.get(sm.inputs[0])
        if v is None or attrs["axis"] not in (-1, len(v.shape) - 1) or not self.f32(sm.inputs[0]):
            return
        chain, ins = [sm], list(sm.inputs)
        add = self.producer.get(sm.inputs[0])
        if add is not None and add.op == "add" and len(add.inputs) == 2 and self.only_reader(sm.inputs[0], sm) \
                and all(self.f32(i) for i in add.inputs):
            chain, ins = [add, sm], list(add.inputs)
        nan_to, p = None, sm.outputs[0]
        rs = self.readers.get(p, [])
        if p not in self.outputs and len(rs) == 2:
            isnan = next((r for r in rs if r.op == "is_nan" and r.inputs == [p]), None)
            where = next((r for r in rs if r.op == "where"), None)
            if isnan is not None and where is not None and where.inputs[0] == isnan.outputs[0] \
                    and where.inputs[2] == p and self.only_reader(isnan.outputs[0], where) \
                    and self.const(where.inputs[1]) is not None:
                chain, nan_to = chain + [isnan, where], self.const(where.inputs[1])
        if len(chain) == 1 or not self.usable(chain):
            return
        node = Node("softmax", ins, [chain[-1].outputs[0]], {"axis": -1}, name=sm.name)
        self.plan(chain, node, partial(_masked_softmax, self.prog, nan_to))

    def dequant_gather(self, g_node, attrs):
        w = g_node.inputs[0]
        mul = self.producer.get(w)
        if mul is None or mul.op != "mul" or len(mul.inputs) != 2 or w in self.outputs:
            return
        k = next((j for j in (0, 1) if (p := self.producer.get(mul.inputs[j])) is not None and p.op == "cast"), None)
        if k is None:
            return
        cast, s_name = self.producer[mul.inputs[k]], mul.inputs[1 - k]
        qv, sv = self.g.values.get(cast.inputs[0]), self.g.values.get(s_name)
        if qv is None or sv is None or not qv.is_const or not sv.is_const or not self.only_reader(cast.outputs[0], mul):
            return
        q, s = qv.data, sv.data
        if s.ndim > q.ndim or np.broadcast_shapes(q.shape, s.shape) != q.shape:
            return
        gathers = self.readers.get(w, [])
        if len(gathers) != 1 or gathers[0] is not g_node or g_node.inputs.count(w) != 1:
            return
        chain = [cast, mul, g_node]
        if not self.usable(chain):
            return
        axis = attrs["axis"] % q.ndim
        s_full = s.reshape((1,) * (q.ndim - s.ndim) + s.shape)
        cast_attrs = self.prog.steps[self.index[id(cast)]][2]
        node = Node("gather", [cast.inputs[0], g_node.inputs[1]], list(g_node.outputs), dict(g_node.attrs),
                    name=g_node.name)
        self.plan(chain, node, partial(_dequant_gather, axis, s_full, cast_attrs, k))

    def matmul_adds(self, mm):
        if not all(self.f32(i) for i in mm.inputs):
            return
        chain, adds, u = [mm], [], mm.outputs[0]
        while len(adds) < MAX_ADDS:
            add = self.sole(u, "add")
            if add is None or len(add.inputs) != 2 or add.inputs.count(u) != 1:
                break
            other = add.inputs[1] if add.inputs[0] == u else add.inputs[0]
            if not self.f32(other):
                break
            chain.append(add)
            adds.append(other)
            u = add.outputs[0]
        w = self.g.values[mm.inputs[1]]
        const_w = w.is_const and w.data.ndim == 2
        if (not adds and not const_w) or not self.usable(chain):
            return
        node = Node("matmul", list(mm.inputs) + adds, [u], {}, name=mm.name)
        self.plan(chain, node, partial(_matmul_adds, self.prog, {} if const_w else None))

    # -- rewrite --------------------------------------------------------------------------
    def commit(self) -> dict[int, Node]:
        steps = list(self.prog.steps)
        drop = set()
        for chain, node, fn in self.plans:
            ks = sorted(self.index[id(n)] for n in chain)
            inner = {o for n in chain for o in n.outputs} - set(node.outputs)
            dead = [d for k in ks for d in steps[k][3] if d not in inner]
            steps[ks[-1]] = (node, fn, {}, list(dict.fromkeys(dead)))
            drop.update(ks[:-1])
            for n in chain:
                self.fused[id(n)] = node
        self.prog.steps = [s for k, s in enumerate(steps) if k not in drop]
        return self.fused


def _masked_softmax(prog, nan_to, x, mask=None):
    """softmax(x + mask) along the last axis, NaN rows set to nan_to (when given)."""
    if mask is not None and x.shape != np.broadcast_shapes(x.shape, mask.shape):
        x, mask = mask, x  # the add is commutative: the full-shaped operand is the scores
    y = T.softmax_call(prog, x, mask, nan_to)
    if y is None:  # a mask broadcast some other way, or not float32
        y = REF["softmax"](x if mask is None else REF["add"](x, mask), axis=-1)
        if nan_to is not None:
            y = REF["where"](REF["is_nan"](y), np.array(nan_to, y.dtype), y)
    return y


def _matmul_adds(prog, cache, a, b, *adds):
    """(a @ b) + adds[0] + ...: the packed-weight sgemm where b is a constant (cache holds
    its packing), else banded BLAS, else the reference kernels."""
    y = None if cache is None else MM.linear(prog, a, b, cache, adds)
    if y is None:
        y = MM.matmul_add(prog, a, b, adds)
    if y is None:
        y = REF["matmul"](a, b)
        for c in adds:
            y = REF["add"](y, c)
    return y


def _dequant_gather(axis, s_full, cast_attrs, k, q, ids):
    """gather(cast(q) * s, ids) as cast(gather(q, ids)) * s[ids]: the same products, on the
    gathered rows only. s_full: the scale at q's rank (1 where it broadcasts)."""
    rows = REF["cast"](REF["gather"](q, ids, axis=axis), **cast_attrs)
    if s_full.shape[axis] == 1:
        s = s_full.reshape(s_full.shape[:axis] + (1,) * ids.ndim + s_full.shape[axis + 1:])
    else:
        s = REF["gather"](s_full, ids, axis=axis)
    return REF["mul"](rows, s) if k == 0 else REF["mul"](s, rows)
