"""Block4x4 weights: a matmul whose right operand is a constant (K, N) weight reads it packed
as (ceil(K/4), N, 4) — four consecutive K rows of one column side by side, the tile a 4-wide
multiply-accumulate kernel loads in one go — through `matmul_block4x4`.

    op matmul (x: [1, 32, 384] f32, w: [384, 1536] f32 -> y: [1, 32, 1536] f32)
 -> op matmul_block4x4 (x: [1, 32, 384] f32, w.b4x4: [96, 1536, 4] f32 -> y: [1, 32, 1536] f32)

The weight is packed here, once, so the rewritten graph has no layout conversion at run time
at all (the minimum); a weight shared by several matmuls is packed once. The blocked
constant stays in the weight's memory space. Off by default on cpu: bench/layouts.py measured
NumPy's BLAS, which packs its own panels, only losing time on a blocked operand (docs/passes.md).
"""
from __future__ import annotations

from ..backends.reference.kernels.layout import pack_block4x4
from ..ir.graph import Graph, Node
from .rewrite import const_data, drop_unused_values, new_const


def layout_block4x4(g: Graph) -> Graph:
    packed: dict[str, str] = {}  # weight name -> its blocked constant
    for k, n in enumerate(g.nodes):
        if n.op != "matmul" or n.regions:
            continue
        w = const_data(g, n.inputs[1])
        if w is None or w.ndim != 2 or w.dtype.kind != "f" or len(g.values[n.inputs[0]].shape) < 2:
            continue
        name = n.inputs[1]
        if name not in packed:
            packed[name] = new_const(g, f"{name}.b4x4", pack_block4x4(w), like=g.values[name])
        g.nodes[k] = Node("matmul_block4x4", [n.inputs[0], packed[name]], list(n.outputs),
                          hints=dict(n.hints), name=n.name, precision=n.precision)
    drop_unused_values(g)
    return g
