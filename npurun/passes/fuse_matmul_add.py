"""Matmul + adds: the bias and the residual that follow a matmul join it
(ir/ops/fused.py `matmul_add`), so a backend can add them in the product's store:

    y = ((a @ b) + c0) + c1        -> matmul_add(a, b, c0, c1)     (at most two adds; also
                                                                   a matmul_add's own adds)

Each add's other operand must broadcast to the product's shape (a bias row, a residual of the
same shape); float32 only. A transformer layer has four such chains (QKV, output, two MLP).
A 2-D matmul by a constant with a constant bias row is fuse_ops.py's gemm already.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.shapes import broadcast
from .match import Chains, in_regions

MAX_ADDS = 2


def fuse_matmul_add(g: Graph) -> Graph:
    in_regions(fuse_matmul_add, g)
    c = Chains(g)
    for mm in list(g.nodes):
        if mm.op not in ("matmul", "matmul_add") or not all(c.dtype(i) == "f32" for i in mm.inputs) \
                or not c.free(mm):
            continue
        shape = tuple(g.values[mm.outputs[0]].shape)
        chain, adds, u = [mm], list(mm.inputs[2:]), mm.outputs[0]
        while len(adds) < MAX_ADDS:
            add = c.sole(u, "add")
            other = c.other(add, u) if add is not None else None
            if other is None or c.dtype(other) != "f32" or not c.free(add) or not c.ranked(other) \
                    or broadcast(shape, g.values[other].shape) != shape \
                    or tuple(g.values[add.outputs[0]].shape) != shape:
                break
            chain.append(add)
            adds.append(other)
            u = add.outputs[0]
        if len(chain) > 1:
            c.replace(chain, Node("matmul_add", list(mm.inputs[:2]) + adds, [u], name=mm.name))
    return c.commit()
