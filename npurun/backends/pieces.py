"""Preemption points inside long nodes (issue L).

The scheduler switches tasks at node boundaries; a node of 20-60 ms (a big conv) makes a
better task that arrives meanwhile wait that long. A kernel that can compute its output in
row ranges runs as *pieces* of about PIECE_S each and calls `boundary()` between them; on a
task thread of the scheduler that is a yield point like a node boundary (the scheduler may
hand the unit to a better task there, and stops a cancelled or timed-out run). The output
buffer is the task's own, so the pieces after a switch simply go on filling it: the result is
bit-identical to the whole node's (the same kernels on the same rows; tests check it).

Pieces cost a few microseconds each (one more call into the kernels' thread pool), so a
kernel asks `wanted()` first: true on a task thread whose device is *contended* (another task
that could take the unit was live on it within the last CONTENDED_S; the scheduler says). A task
alone runs its nodes whole — except, where a task that could take its unit was seen within the
last SPARSE_S (the hook's `long()`), a node predicted to run longer than LONG_S
(`wanted(seconds)`), which then runs as pieces of about LONG_S: a sparse better task (an
interactive request every few seconds beside a batch) otherwise waited out a whole node, 20-60
ms, because the device did not count as contended until it arrived. A task that never had
company pays nothing (those pieces cost a long pointwise conv 5-10% at 2 threads).

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

PIECE_S = 0.001          # a piece's target duration on a contended device
# Lately had company: nodes predicted longer than this run as pieces of about this. (4 ms until
# 2026-12-06: a sparse request then waited up to 2.8 ms, against 1.6 ms at 2 ms, and the batch
# beside it lost nothing measurable: bench/sched_sparse.py, docs/scheduler.md.)
LONG_S = 0.002
CONTENDED_S = 1.0        # a device stays contended this long after two tasks were live on it
SCALE = "_piece_scale"   # the key of the measured / predicted ratio in a calibration dict
LEARN = 0.3              # weight of a new measurement (in log space)
_now = time.perf_counter

_local = threading.local()


class Hook:
    """What the scheduler installs on a task thread: `boundary()`, `wanted()` (the device is
    contended) and `long()` (a task that could take the unit was seen lately: long nodes in
    pieces of LONG_S)."""

    def __init__(self, boundary, wanted, long=None):
        self.boundary, self.wanted, self.long = boundary, wanted, long or _never


def _never() -> bool:
    return False


def install(hook: Hook | None) -> Hook | None:
    """Set this thread's hook (None: none); the previous one, to restore."""
    prev = getattr(_local, "hook", None)
    _local.hook = hook
    return prev


def wanted(seconds: float | None = None, cal: dict | None = None) -> bool:
    """Whether a node should run as pieces: on a contended device any node that can; otherwise,
    where the hook's `long()` says so, one predicted (`seconds`, scaled by what `cal` measured)
    to run longer than LONG_S."""
    h = getattr(_local, "hook", None)
    if h is None:
        return False
    if h.wanted():
        return True
    return seconds is not None and seconds * (cal.get(SCALE, 1.0) if cal is not None else 1.0) > LONG_S \
        and h.long()


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
    # (clamped, so that one odd piece cannot swing the scale far; 1/16 below as 16 above: at
    # 1/4 a model 10x pessimistic stayed 2.5x so, and cut short nodes into needless pieces)
    r = min(16.0, max(1.0 / 16.0, took / predicted))
    old = cal.get(SCALE)
    cal[SCALE] = r if old is None else math.exp((1 - LEARN) * math.log(old) + LEARN * math.log(r))


def cut(total: int, seconds: float, unit: int = 1, cal: dict | None = None) -> list[tuple[int, int]]:
    """`split`'s pieces where `wanted(seconds, cal)`, else [(0, total)]: the whole range."""
    return split(total, seconds, unit, cal) if wanted(seconds, cal) else [(0, total)]


def split(total: int, seconds: float, unit: int = 1, cal: dict | None = None) -> list[tuple[int, int]]:
    """[0, total) cut into ranges of about PIECE_S each (LONG_S on a device that is not
    contended), given `seconds` predicted for the whole (scaled by what `cal` measured so far);
    edges at multiples of `unit` (a Winograd tile row, a block of channels)."""
    scale = cal.get(SCALE, 1.0) if cal is not None else 1.0
    h = getattr(_local, "hook", None)
    target = PIECE_S if h is None or h.wanted() else LONG_S
    # (rounded up: pieces of at most the target; rounded down they reached twice it, and a
    # better task's wait is up to one piece)
    k = max(1, min(-(-total // unit), math.ceil(seconds * scale / target - 1e-6)))
    edges = sorted({min(total, round(total * j / k / unit) * unit) for j in range(k)} | {total})
    edges = [0] + [e for e in edges if e > 0]
    out = Cut((a, b) for a, b in zip(edges, edges[1:]) if b > a)
    out.cal, out.per_unit = cal, seconds / max(total, 1)
    return out
