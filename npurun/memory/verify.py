"""The plan verifier: proves that no two tensors live at the same time share bytes.

For every memory space, values are swept in order of their first step; each is checked
against the values still live then. Two values may overlap in address and time only when one
is computed in place over the other (the plan's `inplace` pairs) and they meet at exactly one
step: the step that reads the operand for the last time and writes the result. Every value
must also lie inside its arena's capacity. A broken plan raises PlanError naming both values,
their ranges and their offsets.
"""
from __future__ import annotations

import numpy as np

from ..errors import NpurunError


class PlanError(NpurunError):
    """A memory plan in which two live tensors overlap, or a tensor lies outside its arena."""


def _legal_handoff(a, b, inplace: dict[str, str]) -> bool:
    """a and b share a buffer legally: one is computed in place over the other at the single
    step where both are live."""
    first, second = (a, b) if a.start <= b.start else (b, a)
    return inplace.get(second.name) == first.name and first.end == second.start


def verify_plan(plan) -> None:
    """Raise PlanError on the first overlap of live tensors; `plan` is a MemoryPlan."""
    where = plan.source
    for space, slots in plan.slots_by_space().items():
        cap = plan.capacity(space)
        for s in slots:
            if s.offset < 0:
                raise PlanError(f"{where}: value {s.name!r} in {space} has no offset")
            if cap is not None and s.offset + s.bytes > cap:
                raise PlanError(f"{where}: value {s.name!r} at {space}[{s.offset}:{s.offset + s.bytes}] "
                                f"lies outside the {cap}-byte arena")
        slots = sorted(slots, key=lambda s: (s.start, s.offset))
        en = np.array([s.end for s in slots], np.int64)
        lo = np.array([s.offset for s in slots], np.int64)
        hi = lo + np.array([s.bytes for s in slots], np.int64)
        for i, s in enumerate(slots):
            # earlier-starting values still live at s's start whose bytes meet s's bytes
            hits = np.nonzero((en[:i] >= s.start) & (lo[:i] < hi[i]) & (lo[i] < hi[:i]))[0]
            for j in hits.tolist():
                p = slots[j]
                if not _legal_handoff(p, s, plan.inplace):
                    raise PlanError(
                        f"{where}: values {p.name!r} (steps {p.start}..{p.end}, {space}[{p.offset}:"
                        f"{p.offset + p.bytes}]) and {s.name!r} (steps {s.start}..{s.end}, {space}["
                        f"{s.offset}:{s.offset + s.bytes}]) are live at the same time and overlap")
