"""The memory planner: live ranges -> in-place buffers -> tier placement -> offsets, and the
split of conv chains too big for the fast tier.

    plan = plan_memory(graph, {"input": (1, 1, 720, 1280)}, device="cpu", workspace_mb=64)
    plan.peak("NPU_SRAM"), plan.hit_rate(), plan.traffic()
    graph2, plan2 = prepare(graph, shapes, device="cpu", workspace_mb=64)   # split if needed

A plan is for concrete shapes: a model with symbolic input dims is planned when its shapes
are known (the Executor plans per run shape and caches the plan). `prepare` splits every conv
chain whose working set exceeds the fast tier into bands (passes/split_bands.py), re-plans the
split graph, and returns it annotated: each value carries its memory space and each node
that streams an operand from DRAM the `pipeline`/`burst` hints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..errors import NpurunError
from ..ir.cost import concrete_values
from ..ir.graph import Graph
from ..passes.split_bands import WorkspaceError, split_bands_info
from .arena import Arena, Buffer, buffers, inplace_pairs
from .liveness import LiveRange, live_ranges, peak_live_bytes
from .placement import STAGING, place, staged_operands, staging_bytes
from .tiers import FAST, MB, MID, SLOW, Tiers, tiers_for
from .verify import verify_plan

# Weights bigger than this share of the fast tier are streamed, not kept resident, so they do
# not shrink the room left for a split chain's bands.
RESIDENT_WEIGHTS_SHARE = 0.25


@dataclass
class Slot:
    name: str
    space: str
    offset: int
    bytes: int
    start: int
    end: int


@dataclass
class MemoryPlan:
    graph: Graph
    shapes: dict
    tiers: Tiers
    ranges: dict[str, LiveRange]
    inplace: dict[str, str]
    arenas: dict[str, Arena]
    staged: dict[int, list[str]]
    split: dict | None = None  # what the split pass did (prepare), for the report
    space_of: dict[str, str] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.graph.source

    @property
    def steps(self) -> int:
        return len(self.graph.nodes)

    def capacity(self, space: str) -> int | None:
        return self.arenas[space].capacity

    def slots_by_space(self) -> dict[str, list[Slot]]:
        out: dict[str, list[Slot]] = {}
        for space, arena in self.arenas.items():
            for b in arena.placed:
                for v in b.values:
                    r = self.ranges.get(v)
                    nbytes = b.size if r is None else r.bytes
                    start, end = (b.start, b.end) if r is None else (r.start, r.end)
                    out.setdefault(space, []).append(Slot(v, space, b.offset, nbytes, start, end))
        return out

    def peak(self, space: str) -> int:
        """Bytes of the space's arena (in-place sharing and offsets included)."""
        return self.arenas[space].size

    def run_peak_bytes(self) -> int:
        """Most bytes a host run holds at once for this plan's values that the run allocates
        (intermediates and outputs; inputs and weights exist before it starts), counting each
        value whole: what Program allocates, which computes nothing in place."""
        names = {r.name for r in self.ranges.values() if r.kind in ("act", "output")}
        return peak_live_bytes(self.ranges, self.steps, names)[0]

    def traffic(self) -> dict[str, int]:
        """Bytes read and written per space in one run (each operand of each step once)."""
        out = {FAST: 0, MID: 0, SLOW: 0}
        for n in self.graph.nodes:
            for nm in [i for i in n.inputs if i] + list(n.outputs):
                r = self.ranges.get(nm)
                if r is not None and r.bytes:
                    out[self.space_of.get(nm, SLOW)] += r.bytes
        return out

    def hit_rate(self) -> float:
        """Share of the bytes the steps access that the fast tier serves."""
        t = self.traffic()
        total = sum(t.values())
        return t[FAST] / total if total else 1.0

    def weights(self) -> dict[str, int]:
        """Weight bytes resident per space (DRAM0: streamed on each use)."""
        out = {FAST: 0, MID: 0, SLOW: 0}
        for r in self.ranges.values():
            if r.kind == "const" and r.bytes:
                out[self.space_of.get(r.name, SLOW)] += r.bytes
        return out

    def unknown(self) -> list[str]:
        """Values whose size these shapes do not fix (data-dependent shapes, sequences)."""
        return [r.name for r in self.ranges.values() if r.bytes is None]

    def spilled(self) -> list[str]:
        """Intermediates (and weights) that did not fit the fast tier."""
        return [r.name for r in self.ranges.values()
                if r.kind in ("act", "const") and r.bytes and self.space_of.get(r.name) != FAST]


def specialize(g: Graph, shapes: dict | None) -> tuple[Graph, dict]:
    """A copy of `g` (nodes shared) with concrete shapes where `shapes` fix them, and the
    values of that copy."""
    vals = concrete_values(g, shapes or {})
    out = Graph(g.name, dict(vals), list(g.nodes), list(g.inputs), list(g.outputs), g.source)
    return out, vals


def symbolic_inputs(g: Graph, shapes: dict | None) -> list[str]:
    """Graph inputs whose shape neither the graph nor `shapes` fixes."""
    shapes = shapes or {}
    return [nm for nm in g.inputs if nm not in shapes and g.values[nm].kind == "tensor"
            and not all(isinstance(d, int) for d in g.values[nm].shape)]


def plan_memory(g: Graph, shapes: dict | None = None, *, device=None, workspace_mb: float | None = None,
                tiers: Tiers | None = None, check: bool = True) -> MemoryPlan:
    """Plan `g` for concrete input `shapes`: live ranges, in-place pairs, placement, offsets."""
    tiers = tiers or tiers_for(device, workspace_mb)
    sym = symbolic_inputs(g, shapes)
    if sym:
        raise NpurunError(f"{g.source}: input(s) {', '.join(map(repr, sym))} have symbolic shapes "
                          f"({', '.join(str(list(g.values[s].shape)) for s in sym)}); a plan needs concrete "
                          f"shapes: give them, or let the Executor plan each run's shapes")
    vals = concrete_values(g, shapes or {})
    ranges = live_ranges(g, values=vals)
    pairs = inplace_pairs(g, ranges)
    arenas = place(g, ranges, buffers(ranges, pairs), tiers)
    space_of = {v: a.space for a in arenas.values() for b in a.placed for v in b.values}
    plan = MemoryPlan(g, dict(shapes or {}), tiers, ranges, pairs, arenas,
                      staged_operands(g, space_of, ranges), space_of=space_of)
    if check:
        verify_plan(plan)
    return plan


def annotate(plan: MemoryPlan) -> Graph:
    """A copy of the plan's graph with concrete shapes, each value in its space, and the
    `pipeline`/`burst` hints on every node that streams an operand from DRAM0."""
    g = plan.graph
    vals = concrete_values(g, plan.shapes)
    values = {nm: replace(v, space=plan.space_of.get(nm, v.space)) for nm, v in vals.items()}
    nodes = []
    for i, n in enumerate(g.nodes):
        hints = dict(n.hints)
        if i in plan.staged:
            hints.update(pipeline=plan.tiers.pipeline, burst=plan.tiers.burst)
        nodes.append(replace(n, hints=hints, inputs=list(n.inputs), outputs=list(n.outputs)))
    return Graph(g.name, values, nodes, list(g.inputs), list(g.outputs), g.source)


def split_budget(g: Graph, shapes: dict | None, tiers: Tiers) -> int:
    """Fast-tier bytes a band of a split chain may use: the tier less the staging ring and the
    weights that stay resident."""
    cap = tiers.fast.size
    weights = sum(v.nbytes or 0 for v in g.constants())
    resident = weights if weights <= RESIDENT_WEIGHTS_SHARE * cap else 0
    return cap - staging_bytes(g, tiers) - resident


def prepare(g: Graph, shapes: dict | None = None, *, device=None, workspace_mb: float | None = None,
            split: bool = True, rows: int | None = None, find_smallest: bool = True,
            _probing: bool = False) -> tuple[Graph, MemoryPlan]:
    """Plan `g`; where a conv chain's working set exceeds the fast tier, split it into bands
    and plan the split graph. Returns the annotated graph and its plan.

    Raises WorkspaceError (naming the smallest workspace that works, found by planning again
    with larger workspaces unless `find_smallest` is False) when one band of the smallest
    height does not fit."""
    tiers = tiers_for(device, workspace_mb)
    if not split:
        plan = plan_memory(g, shapes, tiers=tiers)
        return annotate(plan), plan
    budget = split_budget(g, shapes, tiers)
    overhead = tiers.fast.size - budget  # staging ring and resident weights
    for attempt in range(4):  # shrink the budget if fragmentation spills a band's values
        try:
            g2, infos = split_bands_info(g, budget_bytes=max(budget, 1), shapes=shapes, rows=rows)
        except WorkspaceError as e:
            if _probing or not find_smallest:
                raise
            need = smallest_workspace_mb(g, shapes, device, (e.need_bytes + overhead) / MB)
            raise WorkspaceError(f"{g.source}: {e}; the fast tier is {tiers.fast.size / MB:.1f} MB "
                                 f"({tiers.fast.role}); the smallest workspace that works is "
                                 f"workspace_mb={need:g}", need_bytes=int(need * MB)) from None
        plan = plan_memory(g2, shapes, tiers=tiers)
        if not infos:
            break
        band_values = {v for info in infos for v in info["band_values"]}
        if not set(plan.spilled()) & band_values or rows is not None:
            break
        budget = int(budget * 0.85)
    plan.split = infos or None
    return annotate(plan), plan


def smallest_workspace_mb(g: Graph, shapes: dict | None, device, start_mb: float) -> float:
    """The smallest workspace (in steps of 0.1 MB) from `start_mb` up at which `prepare`
    succeeds: the estimate plus whatever the arena's fragmentation costs, proved by planning."""
    mb = math.ceil(start_mb * 10) / 10
    for k in range(40):
        try:
            prepare(g, shapes, device=device, workspace_mb=mb, _probing=True)
            return mb
        except WorkspaceError:
            mb = round(mb + (0.1 if k < 10 else max(0.1, mb / 20)), 1)
    return mb


__all__ = ["MemoryPlan", "Slot", "plan_memory", "prepare", "annotate", "specialize", "symbolic_inputs",
           "WorkspaceError", "STAGING", "Buffer"]
