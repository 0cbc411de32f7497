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

A kernel sizes its pieces from a model of its own speed (FLOP/s, elements per second), and a
model errs: on a shared 2-core VM a 3-input-channel stride-2 conv or a large add after the cache
was flushed runs 2-5x slower than the model says, so "1 ms" pieces took 2-5 ms. So `split`
takes a calibration dict (`cal`, the node's kernel cache or one per op), `each` times the
pieces it hands out against what `split` predicted (the waits at boundaries excluded), and the
next `split` with that dict scales its prediction by the measured ratio.
"""
from __future__ import annotations

import math
import threading
import time

PIECE_S = 0.001          # a piece's target duration
CONTENDED_S = 1.0        # a device stays contended this long after two tasks were live on it
SCALE = "_piece_scale"   # the key of the measured / predicted ratio in a calibration dict
LEARN = 0.3              # weight of a new measurement (in log space)
_now = time.perf_counter

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


class Cut(list):
    """`split`'s ranges, with what they were predicted to take (for `each` to learn from)."""
    __slots__ = ("cal", "per_unit")


def each(parts):
    """The items of `parts`, with a preemption point between two of them (not before the
    first: the node boundary before it was one; not after the last: the next one is). For a
    `Cut` with a calibration dict, each range's time is measured against its prediction."""
    cal = getattr(parts, "cal", None)
    if cal is None:
        for k, p in enumerate(parts):
            if k:
                boundary()
            yield p
        return
    per, t0, prev = parts.per_unit, 0.0, None
    for p in parts:
        if prev is not None:
            _learn(cal, _now() - t0, per * (prev[1] - prev[0]))
            boundary()
        t0, prev = _now(), p  # after the boundary: a wait there is not the piece's time
        yield p
    if prev is not None:
        _learn(cal, _now() - t0, per * (prev[1] - prev[0]))


def _learn(cal: dict, took: float, predicted: float) -> None:
    if predicted <= 0.0:
        return
    r = min(16.0, max(0.25, took / predicted))
    old = cal.get(SCALE)
    cal[SCALE] = r if old is None else math.exp((1 - LEARN) * math.log(old) + LEARN * math.log(r))


def split(total: int, seconds: float, unit: int = 1, cal: dict | None = None) -> list[tuple[int, int]]:
    """[0, total) cut into ranges of about PIECE_S each, given `seconds` predicted for the
    whole (scaled by what `cal` measured so far); edges at multiples of `unit` (a Winograd
    tile row, a block of channels)."""
    scale = cal.get(SCALE, 1.0) if cal is not None else 1.0
    # (rounded up: pieces of at most PIECE_S; rounded down they reached 2 x PIECE_S, and a
    # better task's wait is up to one piece)
    k = max(1, min(-(-total // unit), math.ceil(seconds * scale / PIECE_S - 1e-6)))
    edges = sorted({min(total, round(total * j / k / unit) * unit) for j in range(k)} | {total})
    edges = [0] + [e for e in edges if e > 0]
    out = Cut((a, b) for a, b in zip(edges, edges[1:]) if b > a)
    out.cal, out.per_unit = cal, seconds / max(total, 1)
    return out
