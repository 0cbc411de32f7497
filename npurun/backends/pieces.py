"""Preemption points inside long nodes (issue L).

The scheduler switches tasks at node boundaries; a node of 20-60 ms (a big conv) makes a
better task that arrives meanwhile wait that long. A kernel that can compute its output in
row ranges runs as *pieces* of about PIECE_S each and calls `boundary()` between them; on a
task thread of the scheduler that is a yield point like a node boundary (the scheduler may
hand the unit to a better task there, and stops a cancelled or timed-out run). The output
buffer is the task's own, so the pieces after a switch simply go on filling it: the result is
bit-identical to the whole node's (the same kernels on the same rows; tests check it).

Pieces cost a few microseconds each (one more call into the kernels' thread pool), so a
kernel asks `wanted()` first: true only on a task thread whose device is *contended* (another
task was live on it within the last CONTENDED_S; the scheduler says). A model alone on the
device runs its nodes whole.
"""
from __future__ import annotations

import threading

PIECE_S = 0.001          # a piece's target duration
CONTENDED_S = 1.0        # a device stays contended this long after two tasks were live on it

_local = threading.local()


class Hook:
    """What the scheduler installs on a task thread: `boundary()` and `wanted()`."""

    def __init__(self, boundary, wanted):
        self.boundary, self.wanted = boundary, wanted


def install(hook: Hook | None) -> Hook | None:
    """Set this thread's hook (None: none); the previous one, to restore."""
    prev = getattr(_local, "hook", None)
    _local.hook = hook
    return prev


def wanted() -> bool:
    h = getattr(_local, "hook", None)
    return h is not None and h.wanted()


def boundary() -> None:
    """A preemption point between two pieces of a node (nothing off a task thread)."""
    h = getattr(_local, "hook", None)
    if h is not None:
        h.boundary()


def each(parts):
    """The items of `parts`, with a preemption point between two of them (not before the
    first: the node boundary before it was one; not after the last: the next one is)."""
    for k, p in enumerate(parts):
        if k:
            boundary()
        yield p


def split(total: int, seconds: float, unit: int = 1) -> list[tuple[int, int]]:
    """[0, total) cut into ranges of about PIECE_S each, given `seconds` for the whole; edges
    at multiples of `unit` (a Winograd tile row, a block of channels)."""
    k = max(1, min(-(-total // unit), int(seconds / PIECE_S)))
    edges = sorted({min(total, round(total * j / k / unit) * unit) for j in range(k)} | {total})
    edges = [0] + [e for e in edges if e > 0]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]
