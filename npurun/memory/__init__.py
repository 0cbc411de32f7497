"""Memory planning: live ranges, arenas, tier placement, and splitting what does not fit.

    from npurun.memory import memory_report, plan_memory, prepare, verify_plan
    print(memory_report(g, workspace_mb=64, device="cpu", shapes={"input": (1, 1, 720, 1280)}).format())

liveness.py  live ranges over the Program's schedule (bound at first write, freed after last read)
arena.py     in-place pairs, buffers, offsets in one arena per memory space
placement.py fast tier by benefit, then the middle tier, then DRAM0; DRAM operands staged
verify.py    proof that no two live tensors share bytes
planner.py   plan_memory / prepare (split chains too big for the fast tier, re-plan)
report.py    memory_report: peaks, bytes per tier, fast-tier hit rate, splits
tiers.py     the tiers of a device (npusim device file, or the host's caches / workspace_mb)
See docs/memory.md.
"""
from .arena import Arena, Buffer, inplace_pairs
from .liveness import LiveRange, live_ranges
from .planner import MemoryPlan, WorkspaceError, annotate, plan_memory, prepare
from .report import MemoryReport, memory_report
from .tiers import FAST, MID, SLOW, Tiers, tiers_for
from .verify import PlanError, verify_plan

__all__ = ["memory_report", "MemoryReport", "plan_memory", "prepare", "annotate", "MemoryPlan",
           "WorkspaceError", "PlanError", "verify_plan", "live_ranges", "LiveRange", "inplace_pairs",
           "Arena", "Buffer", "tiers_for", "Tiers", "FAST", "MID", "SLOW"]
