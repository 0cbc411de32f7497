"""Admission by predicted duration (issue L item 2): a background task does not start a
stretch of work that would still be running when a periodic better-priority stream's next
request is due.

Preemption acts only at a boundary (between nodes, or between the pieces of a long node), so
a request that arrives while a 5 ms node without pieces runs waits up to 5 ms. Two things
are predictable on a device that many tasks share:

- **How long the next stretch runs.** A node's time depends on its shapes, not its data, so
  the longest uninterrupted stretch of each step (the whole node, or its longest piece) is
  learned from the task's own boundaries, per Program (`learn`: a moving average that an
  outlier moves little).
- **When the next request comes**, for streams that arrive at a regular period (a camera, a
  polled sensor, an audio frame): the last PERIODIC_N arrivals of a group, every interval
  within JITTER of their median, predict the next at the last one plus that median. A group
  that had a period and pauses is periodic again from its first interval within JITTER of
  that period; until then, for RESUME_S after it was last regular, each of its arrivals
  predicts the next a period on.

At a boundary of a task of worse priority than such a stream, whose request is not already
live, the next stretch is admitted only if it ends (stretched by MARGIN, plus SLACK_S) before
the stream's next request; otherwise the task gives up its unit and is *held* until the
request arrives (its arrival ends every hold at once) or, if it does not come, until GRACE
periods after it was due. Each boundary holds at most once, so a stretch longer than the gap
between requests still runs (right after a request, when the whole gap is ahead); a task alone
on the device, or one beside streams that are not periodic, is never held. What a hold costs
the background is the idle gap before the request, at most its predicted stretch.
"""
from __future__ import annotations

import collections
import operator
import weakref

PERIODIC_N = 5   # arrivals (4 intervals) before a group counts as a periodic stream
JITTER = 0.2     # each interval within this share of the median interval
MARGIN = 1.25    # a stretch's predicted time is stretched by this...
SLACK_S = 3e-4   # ...plus this (the boundary's own work, the stream's thread waking up)
GRACE = 0.25     # a hold lasts until this share of a period after the request was due
RESUME_S = 30.0  # a group regular within this long is expected back at its period after a gap
LEARN = 0.3      # weight of a new observation of a step's stretch


class Stream:
    __slots__ = ("arrivals", "priority", "period", "next_at", "known", "regular_at")

    def __init__(self, priority: int):
        self.arrivals: collections.deque = collections.deque(maxlen=PERIODIC_N)
        self.priority = priority
        self.period = 0.0    # 0: not periodic (yet, or any more)
        self.next_at = 0.0
        self.known = 0.0     # the period it last had (0: never periodic)
        self.regular_at = float("-inf")  # when an interval last matched its period


class Admission:
    """The scheduler's predictions (used under its lock): streams by group, and the longest
    stretch of each step of each Program."""

    def __init__(self):
        self.streams: dict[str, Stream] = {}
        self._segs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._last: tuple | None = None  # (weak reference to the last program, its segments)
        # Until when some periodic stream may still hold a task (its next request's due time
        # plus the grace): before then every boundary takes the scheduler's lock.
        self.active_until = float("-inf")
        # The best (lowest) priority of the streams that made it so: only a task of a worse
        # level can be held, so a task at this level or better keeps the scheduler's lock-free
        # boundaries (a benchmark loop's own requests are a periodic stream too, and every
        # step of its model took the lock: ~10 us a step, 14% of MobileNetV2's run).
        self.holding_priority = float("inf")

    def segments(self, program, steps: int) -> list:
        """The learned stretch (seconds) per step of `program`; 0.0 where not yet seen. (The
        last program's list is kept beside the weak dictionary, whose lookup builds a weak
        reference each call: every task asks.)"""
        last = self._last
        if last is not None and last[0]() is program and len(last[1]) == steps:
            return last[1]
        try:
            segs = self._segs.get(program)
            if segs is None or len(segs) != steps:
                segs = self._segs[program] = [0.0] * steps
            self._last = (weakref.ref(program), segs)
        except TypeError:  # not weakly referenceable: this run learns for itself only
            segs = [0.0] * steps
        return segs

    @staticmethod
    def learn(segs: list, i: int, seg: float) -> None:
        """A moving average of step i's stretch, each observation capped at twice the
        estimate: on a shared machine one stretch in twenty runs 3-15x long (the thread was
        descheduled), and an estimate that took those at once held the background before
        nearly every request for nothing (measured on PP-OCR det: medians 2-5 ms, maxima
        7-37 ms)."""
        old = segs[i]
        segs[i] = seg if old <= 0.0 else old + LEARN * (min(seg, 2.0 * old) - old)

    def arrived(self, group: str, priority: int, now: float) -> None:
        s = self.streams.get(group)
        if s is None:
            if len(self.streams) > 512:  # forget groups that stopped being periodic
                self.streams = {g: v for g, v in self.streams.items() if v.period}
            s = self.streams[group] = Stream(priority)
        s.priority = priority
        s.arrivals.append(now)
        s.period = 0.0
        if s.known and len(s.arrivals) >= 2 and abs(now - s.arrivals[-2] - s.known) <= JITTER * s.known:
            # A stream resuming at the period it had (a camera after a pause, speech after
            # silence): periodic again from its first interval, not after PERIODIC_N arrivals,
            # whose wait for a stretch of the background each of its first requests paid.
            self._periodic(s, s.known, now)
            s.regular_at = now
        elif s.known and now - s.regular_at <= RESUME_S:
            # After a gap or a late request of a group regular lately, its next request is
            # expected a period on, as if it had resumed: the request after the first one of a
            # resumed stream otherwise found the background running and waited for a stretch
            # (2.5-3.2 ms on this VM). A wrong guess costs the worse tasks one hold, at most
            # GRACE periods; a group irregular for RESUME_S is no longer expected.
            self._periodic(s, s.known, now)
        elif len(s.arrivals) == PERIODIC_N:
            # (every run of a model calls this: sorted gaps, not statistics.median, ~2 us less)
            a = tuple(s.arrivals)
            gaps = sorted(map(operator.sub, a[1:], a[:-1]))
            h = len(gaps) // 2
            med = gaps[h] if len(gaps) % 2 else 0.5 * (gaps[h - 1] + gaps[h])
            if med > 0 and med - gaps[0] <= JITTER * med and gaps[-1] - med <= JITTER * med:
                self._periodic(s, med, now)
                s.regular_at = now

    def _periodic(self, s: Stream, period: float, now: float) -> None:
        """`s` is a stream of this period: its next request is due a period from now."""
        s.period = s.known = period
        s.next_at = now + period
        if now >= self.active_until:  # (the streams of an earlier spell have lapsed)
            self.holding_priority = float("inf")
        self.holding_priority = min(self.holding_priority, s.priority)
        self.active_until = max(self.active_until, s.next_at + GRACE * period)

    def may_hold(self, level: int, now: float) -> bool:
        """Whether a task of `level` may be held now (a better periodic stream is live)."""
        return now < self.active_until and self.holding_priority < level

    def hold_until(self, level: int, now: float, stretch: float, live_groups) -> float | None:
        """Until when a task of `level` about to run a stretch of `stretch` seconds is held,
        or None to admit it."""
        if stretch <= 0.0:
            return None  # never seen: run it and learn
        end = now + stretch * MARGIN + SLACK_S
        until = None
        for group, s in self.streams.items():
            if not s.period or s.priority >= level or group in live_groups:
                continue
            due_by = s.next_at + GRACE * s.period
            if now < due_by and end > s.next_at:
                until = due_by if until is None else max(until, due_by)
        return until


__all__ = ["Admission", "PERIODIC_N", "JITTER", "MARGIN", "SLACK_S", "GRACE", "LEARN"]
