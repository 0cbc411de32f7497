"""Live ranges of a graph's values over its schedule.

The schedule is the graph's node order, the order `backends.base.Program` runs its steps: a
value is bound when the step that produces it runs and released right after its last reader
(Program's `dead` lists), so its live range is [producing step, last reading step], both
inclusive. Graph inputs are bound before step 0 (range starts at -1) and graph outputs are
kept to the end. Constants (weights) are resident: [0, last step].

A value whose size is not known for these shapes (data-dependent shapes, sequences) gets
`bytes=None`; the planner keeps it in DRAM and the report counts it apart.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.cost import concrete_values
from ..ir.dtypes import to_numpy
from ..ir.graph import Graph
from ..ir.shapes import numel


@dataclass
class LiveRange:
    name: str
    start: int          # step that binds it (-1: bound before the run, a graph input)
    end: int            # last step that needs it
    bytes: int | None   # None: size unknown for these shapes
    kind: str           # "input", "output", "const", "act" (an intermediate)
    reads: int = 0      # steps that read it
    producer: int | None = None  # the producing step (None for inputs and constants)

    def overlaps(self, other: "LiveRange") -> bool:
        return self.start <= other.end and other.start <= self.end


def value_bytes(v) -> int | None:
    if v.kind != "tensor":
        return None
    n = numel(v.shape)
    return None if n is None else n * to_numpy(v.dtype).itemsize


def node_reads(n) -> list[str]:
    """What a node reads: its operands and whatever its regions capture."""
    return [i for i in n.inputs if i] + [c for r in n.regions.values() for c in r.captures()]


def live_ranges(g: Graph, shapes: dict | None = None, values: dict | None = None) -> dict[str, LiveRange]:
    """name -> LiveRange for every value the top-level schedule touches. `shapes` are the
    concrete input shapes (graph inputs with symbolic dims otherwise stay unsized)."""
    vals = values if values is not None else concrete_values(g, shapes or {})
    last = len(g.nodes) - 1
    out: dict[str, LiveRange] = {}
    for nm in g.inputs:
        out[nm] = LiveRange(nm, -1, -1, value_bytes(vals[nm]), "input")
    for i, n in enumerate(g.nodes):
        for nm in dict.fromkeys(node_reads(n)):
            r = out.get(nm)
            if r is None and nm in vals and vals[nm].is_const:
                r = out[nm] = LiveRange(nm, 0, last, value_bytes(vals[nm]), "const")
            if r is None:
                continue  # a capture from an enclosing graph: not this schedule's to plan
            r.reads += 1
            if r.kind != "const":
                r.end = max(r.end, i)
        for nm in n.outputs:
            if nm:
                out[nm] = LiveRange(nm, i, i, value_bytes(vals[nm]), "act", producer=i)
    for nm in g.outputs:
        if nm in out and out[nm].kind != "const":
            r = out[nm]
            r.end = max(last, r.start)
            if r.kind == "act":
                r.kind = "output"
    return out


def peak_live_bytes(ranges, steps: int, names=None) -> tuple[int, int]:
    """(peak bytes live at once, the step where it happens) over `names` (all by default),
    counting each value once (no in-place sharing): what a host run holds."""
    delta = [0] * (steps + 2)
    for r in ranges.values():
        if r.bytes is None or (names is not None and r.name not in names):
            continue
        delta[r.start + 1] += r.bytes
        delta[r.end + 2] -= r.bytes
    best, at, cur = 0, -1, 0
    for k in range(steps + 1):
        cur += delta[k]
        if cur > best:
            best, at = cur, k - 1
    return best, at
