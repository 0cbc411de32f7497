"""The memory report: what `npurun compile MODEL --memory` prints.

    rep = memory_report(graph, workspace_mb=64, device="cpu", shapes={"input": (1, 1, 720, 1280)})
    print(rep.format()); rep.to_dict()

Per tier: its size, the arena the plan needs (peak, in-place sharing included), the bytes the
steps read and write there in one run, and resident weights. Then the fast-tier hit rate (the
share of accessed bytes the fast tier serves; the founding document's "SRAM hit rate"), the
operands streamed from DRAM, and what the split pass did. When the graph was split, the
unsplit graph's figures are given beside it. A model with symbolic input shapes and no
`shapes` is planned at run time; the report says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph
from .planner import MemoryPlan, prepare, plan_memory, symbolic_inputs
from .tiers import FAST, MB, MID, SLOW, tiers_for


def _mb(n) -> str:
    if n is None:
        return "-"
    return f"{n / MB:.1f} MB" if n >= MB / 10 or n == 0 else f"{n / 1024:.1f} KB"


@dataclass
class MemoryReport:
    model: str
    target: str
    shapes: dict
    symbolic: list[str] = field(default_factory=list)
    plan: MemoryPlan | None = None
    unsplit: MemoryPlan | None = None
    graph: Graph | None = None  # the planned (maybe split) graph, annotated

    def to_dict(self) -> dict:
        d = {"model": self.model, "target": self.target,
             "shapes": {k: list(v) for k, v in self.shapes.items()}, "symbolic_inputs": self.symbolic}
        if self.plan is None:
            d["planned"] = "at run time"
            return d
        d.update(_plan_dict(self.plan))
        if self.unsplit is not None:
            d["unsplit"] = _plan_dict(self.unsplit)
        return d

    def format(self) -> str:
        lines = [f"memory plan: {self.model} on {self.target}"]
        if self.plan is None:
            lines.append(f"  input(s) {', '.join(self.symbolic)} have symbolic shapes: the Executor plans each "
                         f"run's shapes when it sees them (and caches the plan); give shapes "
                         f"(--shape NAME=1x3x224x224) to see one")
            return "\n".join(lines) + "\n"
        p = self.plan
        if self.shapes:
            lines[0] += "  (" + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.shapes.items()) + ")"
        lines.append(f"  {'tier':<10} {'size':>10} {'peak':>10} {'moved/run':>11} {'weights':>10}  role")
        t, w = p.traffic(), p.weights()
        for space in (FAST, MID, SLOW):
            spec = p.tiers.by_space()[space]
            if space == MID and not spec.size:
                continue
            lines.append(f"  {space:<10} {_mb(spec.size) if spec.size is not None else 'unbounded':>10} "
                         f"{_mb(p.peak(space)):>10} {_mb(t[space]):>11} {_mb(w[space]):>10}  {spec.role}")
        lines.append(f"  fast-tier hit rate: {100 * p.hit_rate():.1f}% of {_mb(sum(t.values()))} accessed "
                     f"per run; a host run holds at most {_mb(p.run_peak_bytes())}")
        staged = sum(len(v) for v in p.staged.values())
        if staged:
            lines.append(f"  {staged} operand(s) of {len(p.staged)} step(s) streamed from DRAM0 "
                         f"(pipeline={p.tiers.pipeline}, burst={p.tiers.burst})")
        if w[SLOW]:
            lines.append(f"  weights streamed from DRAM0: {_mb(w[SLOW])}")
        if p.unknown():
            lines.append(f"  {len(p.unknown())} value(s) of data-dependent size kept in DRAM0, not counted")
        for s in p.split or []:
            lines.append(f"  split: chain {s['chain']} in {s['bands']} bands of {s['rows']} of {s['height']} "
                         f"rows (halo {s['halo_rows']} rows); band working set {_mb(s['band_bytes'])} "
                         f"instead of {_mb(s['whole_bytes'])}")
        if self.unsplit is not None:
            u = self.unsplit
            lines.append(f"  unsplit: fast-tier hit rate {100 * u.hit_rate():.1f}%, DRAM0 peak {_mb(u.peak(SLOW))}, "
                         f"a host run holds {_mb(u.run_peak_bytes())}")
        return "\n".join(lines) + "\n"


def _plan_dict(p: MemoryPlan) -> dict:
    t, w = p.traffic(), p.weights()
    return {"tiers": {s: {"size": spec.size, "peak": p.peak(s), "bytes_moved": t[s], "weights": w[s],
                          "role": spec.role} for s, spec in p.tiers.by_space().items()},
            "hit_rate": p.hit_rate(), "run_peak_bytes": p.run_peak_bytes(),
            "staged_operands": sum(len(v) for v in p.staged.values()),
            "unknown_size_values": len(p.unknown()), "split": p.split or []}


def memory_report(graph: Graph, workspace_mb: float | None = None, device=None, shapes: dict | None = None,
                  split: bool = True) -> MemoryReport:
    """Plan `graph` (split where a chain exceeds the fast tier) and report it."""
    tiers = tiers_for(device, workspace_mb)
    name = graph.name if graph.source.startswith("<") else graph.source
    shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
    sym = symbolic_inputs(graph, shapes)
    if sym:
        return MemoryReport(name, tiers.target, shapes, sym)
    g2, plan = prepare(graph, shapes, device=device, workspace_mb=workspace_mb, split=split)
    unsplit = plan_memory(graph, shapes, tiers=tiers) if plan.split else None
    return MemoryReport(name, tiers.target, shapes, [], plan, unsplit, g2)
