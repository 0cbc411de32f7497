"""What a slice of device time is worth, for fair share among equal priorities (issue L).

The scheduler shares a level among groups by the device time each has had (virtual time). But
a second of device time is not the same work for every task when tasks interleave: each switch
refills the caches, and a model that streams large maps loses far more to that than a small
one. Measured on a 2-core VM, PP-OCR det beside ESPCN 128x128, both back to back at equal
priority: each got ~50% of the device time, and PP-OCR ran 0.55 of its solo speed in its share
against ESPCN's 0.76, so their normalized throughputs came out 27% and 38% (Jain 0.97).

So a group is charged for its slices in *solo-equivalent* seconds: device time x (its program's
run time alone / its run time while sharing), both learned from its own finished runs. Equal
charges then mean equal progress, each at the same slowdown against running alone (the fairness
of the equal-slowdown schedulers: STFM, MICRO'07; the normalized throughput the bench's Jain
index is taken over). A program never seen alone, or not slower when sharing, is charged its
device time as before.
"""
from __future__ import annotations

import math
import weakref

LEARN = 0.2        # weight of a new run (in log space)
FLOOR = 0.25       # a slice is charged at least this share of its device time


class Pace:
    """Per program: the run time alone and while sharing (moving averages of finished runs)."""

    def __init__(self):
        self._runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # program -> [alone, shared]
        # The last program's record: a WeakKeyDictionary lookup builds a weak reference each
        # call (~1-2 us; every run asks twice), and a stream of runs asks about one program.
        self._last: tuple | None = None  # (weak reference to the program, its record)

    def _record(self, program) -> list | None:
        last = self._last
        if last is not None and last[0]() is program:
            return last[1]
        try:
            rec = self._runs.setdefault(program, [None, None])
            self._last = (weakref.ref(program), rec)
        except TypeError:  # (not weakly referable: nothing learned, charged at device time)
            return None
        return rec

    def observe(self, program, run_time: float, alone: bool) -> None:
        if run_time <= 0.0:
            return
        rec = self._record(program)
        if rec is None:
            return
        k = 0 if alone else 1
        old = rec[k]
        rec[k] = run_time if old is None else math.exp((1 - LEARN) * math.log(old) + LEARN * math.log(run_time))

    def rate(self, program) -> float:
        """Solo-equivalent seconds per device second for `program` (1.0 until known)."""
        rec = self._record(program)
        if rec is None or rec[0] is None or rec[1] is None:
            return 1.0
        return max(FLOOR, min(1.0, rec[0] / rec[1]))
