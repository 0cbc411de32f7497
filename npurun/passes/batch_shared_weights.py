"""Products by one constant weight that do not depend on each other run as one:

    y1 = gemm(x1, W, c); y2 = gemm(x2, W, c); ...   ->   y = gemm(concat(x1, x2, ...), W, c)
                                                          y1, y2, ... = split(y, rows)

An exporter that unrolls a recurrence (a traced LSTM, a Keras RNN built with unroll=True)
writes the input projection of every time step as its own small product by the same
weight: T matrix-vector products that each stream the whole weight from memory (captcha_crnn:
40 products by a 4096 x 400 weight, 6.5 MB read 40 times, 36 of a run's 55 ms). Rows stacked,
the weight is read once and the product is a real matrix product. The recurrent products
(h_t by the hidden weight) depend on one another and stay as they are.

Members: gemm and matmul nodes (float32, 2-D inputs, trans_a 0) with the same constant 2-D
weight and bias inputs, the same attributes, and inputs of known rows; of those, the ones whose input does not depend on any
member's output (so one node can compute them all). The graph is then reordered
(topologically, the original order kept where it can be) so the stacked product follows all
its inputs and precedes every reader of its parts.
"""
from __future__ import annotations

import heapq

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.shapes import UNKNOWN, dim_add
from .match import Chains, in_regions
from .rewrite import new_const, new_value

MIN_MEMBERS = 2


def batch_shared_weights(g: Graph) -> Graph:
    in_regions(batch_shared_weights, g)
    c = Chains(g)
    groups: dict[tuple, list[Node]] = {}
    for n in g.nodes:
        if n.op not in ("gemm", "matmul") or not c.free(n) or c.const(n.inputs[1]) is None \
                or c.const(n.inputs[1]).ndim != 2:
            continue
        a = OPS[n.op].attrs_of(n)
        x = g.values[n.inputs[0]]
        if a.get("trans_a") or len(x.shape) != 2 or not isinstance(x.shape[1], int) or x.shape[0] == UNKNOWN \
                or c.dtype(n.inputs[0]) != "f32" or (len(n.inputs) > 2 and n.inputs[2] and c.const(n.inputs[2]) is None):
            continue
        key = (n.op, n.inputs[1], n.inputs[2] if len(n.inputs) > 2 else "", tuple(sorted(a.items())), x.shape[1])
        groups.setdefault(key, []).append(n)
    merged = False
    for members in groups.values():
        members = _independent(g, c, members)
        rows = [g.values[m.inputs[0]].shape[0] for m in members]
        if not all(isinstance(r, int) for r in rows):  # symbolic rows: only all alike (equal parts)
            members = [m for m, r in zip(members, rows) if r == rows[0]]
            rows = [rows[0]] * len(members)
        if len(members) < MIN_MEMBERS:
            continue
        first = members[0]
        k = g.values[first.inputs[0]].shape[1]
        n_out = g.values[first.outputs[0]].shape[1]
        space = g.values[first.outputs[0]].space
        total = 0
        for r in rows:
            total = dim_add(total, r)
        stacked = new_value(g, f"{first.outputs[0]}.stacked_in", (total, k), "f32", space)
        out = new_value(g, f"{first.outputs[0]}.stacked", (total, n_out), "f32", space)
        if isinstance(rows[0], int):
            cut, parts = [out, new_const(g, f"{first.outputs[0]}.rows", np.array(rows, np.int64))], {}
        else:
            cut, parts = [out], {"num_outputs": len(members)}  # n equal parts (as ONNX: not both)
        name = first.name or first.outputs[0]
        new = [Node("concat", [m.inputs[0] for m in members], [stacked], {"axis": 0}, name=f"{name}.stack"),
               Node(first.op, [stacked] + list(first.inputs[1:]), [out], dict(first.attrs), name=f"{name}.stacked"),
               Node("split", cut, [m.outputs[0] for m in members], {"axis": 0, **parts}, name=f"{name}.unstack")]
        drop = {id(m) for m in members}
        g.nodes = [n for n in g.nodes if id(n) not in drop] + new
        merged = True
    if merged:
        g.nodes = _toposort(g)
    return g


def _independent(g: Graph, c: Chains, members: list[Node]) -> list[Node]:
    """The members whose input is not computed from any member's output."""
    outs = {m.outputs[0] for m in members}
    tainted: set[str] = set()  # values computed from a member's output
    for n in g.nodes:  # topological order
        reads = set(i for i in n.inputs if i) | {cap for r in n.regions.values() for cap in r.captures()}
        if reads & (outs | tainted):
            tainted.update(o for o in n.outputs if o)
    return [m for m in members if m.inputs[0] not in tainted and m.inputs[0] not in outs]


def _toposort(g: Graph) -> list[Node]:
    """Kahn's order, the earliest node of the current list first (so an already ordered
    graph keeps its order and the new nodes move only as far as they must)."""
    producer = {o: i for i, n in enumerate(g.nodes) for o in n.outputs if o}
    deps: list[set[int]] = []
    for n in g.nodes:
        reads = [i for i in n.inputs if i] + [cap for r in n.regions.values() for cap in r.captures()]
        deps.append({producer[r] for r in reads if r in producer})
    readers: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            readers.setdefault(j, []).append(i)
    left = [len(d) for d in deps]
    ready = [i for i, d in enumerate(left) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(g.nodes[i])
        for j in readers.get(i, []):
            left[j] -= 1
            if left[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(g.nodes):  # (cannot happen: members never depend on one another)
        raise AssertionError("batch_shared_weights made a cycle")
    return order
