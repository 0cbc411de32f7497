"""A simple benefit-ordered SRAM placement, npusim's own until the memory-planning pass
(issue E) places values for every backend.

Graph inputs and outputs live in DRAM (the host's buffers). Every other value is a candidate
for SRAM over its live range (constants: the whole run, since weights stay resident between
inferences); candidates are taken in order of DRAM bytes saved per byte of SRAM (an activation
saves its write and each read, a weight its read), and one is placed if the SRAM in use over
its live range leaves room for it. What does not fit stays in DRAM.
"""
from __future__ import annotations

from ...ir.graph import Graph
from .model import value_bytes


def place(g: Graph, shapes: dict, precisions: list[str], capacity: int,
          resident_weights: bool = True) -> tuple[dict[str, str], int]:
    """value name -> 'sram' | 'dram', and the peak SRAM bytes used. `resident_weights=False`
    keeps weights out of SRAM (a plan that streams them from DRAM on every inference)."""
    n = max(len(g.nodes), 1)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    reads: dict[str, int] = {}
    prec: dict[str, str] = {}
    for i, node in enumerate(g.nodes):
        for nm in node.inputs:
            if nm:
                last[nm] = i
                reads[nm] = reads.get(nm, 0) + 1
                prec.setdefault(nm, precisions[i])
        for nm in node.outputs:
            first.setdefault(nm, i)
            last.setdefault(nm, i)
            prec[nm] = precisions[i]
    io = set(g.inputs) | set(g.outputs)
    cands = []
    for nm, v in g.values.items():
        if nm in io or nm not in prec:
            continue
        size = value_bytes(shapes.get(nm), prec[nm], v.dtype, weight=v.is_const)
        if size <= 0:
            continue
        if v.is_const and not resident_weights:
            continue
        if v.is_const:
            lo, hi, saved = 0, n - 1, reads.get(nm, 0) * size
        else:
            lo, hi, saved = first.get(nm, 0), last.get(nm, n - 1), (1 + reads.get(nm, 0)) * size
        cands.append((saved / size, -size, nm, lo, hi, size))
    cands.sort(reverse=True)
    used = [0] * n
    out = {nm: "dram" for nm in g.values}
    for _, _, nm, lo, hi, size in cands:
        if max(used[lo:hi + 1]) + size <= capacity:
            for k in range(lo, hi + 1):
                used[k] += size
            out[nm] = "sram"
    return out, max(used) if used else 0
