"""Admission by predicted duration (issue L item 2, runtime/admission.py): a background task does
not start a node predicted to run past a periodic better-priority stream's next request. The
scheduler runs on a fake clock that the nodes advance; assertions are about order, holds and
counters, never about wall-clock time."""
import time

import pytest

from npurun.runtime.admission import GRACE, MARGIN, RESUME_S, Admission
from npurun.runtime.scheduler import Scheduler

from test_scheduler import X, Chain, FakeClock, names


def periodic(adm, group="cam", priority=0, period=0.05, n=5, t0=0.0):
    for k in range(n):
        adm.arrived(group, priority, t0 + k * period)
    return t0 + (n - 1) * period


def test_a_regular_stream_predicts_its_next_request():
    adm = Admission()
    last = periodic(adm)
    s = adm.streams["cam"]
    assert s.period == pytest.approx(0.05) and s.next_at == pytest.approx(last + 0.05)
    due = last + 0.05
    # a 4 ms stretch starting 1 ms before the request is held until the grace runs out
    assert adm.hold_until(3, due - 0.001, 0.004, set()) == pytest.approx(due + GRACE * 0.05)
    # one that ends before it, with the margin, is admitted
    assert adm.hold_until(3, due - 0.010, 0.004, set()) is None
    assert adm.hold_until(3, due - 0.004 * MARGIN - 0.0001, 0.004, set()) is not None
    # never for an equal or better level, a stretch not yet learned, a request already live,
    # or once the request is overdue beyond the grace
    assert adm.hold_until(0, due - 0.001, 0.004, set()) is None
    assert adm.hold_until(3, due - 0.001, 0.0, set()) is None
    assert adm.hold_until(3, due - 0.001, 0.004, {"cam"}) is None
    assert adm.hold_until(3, due + GRACE * 0.05 + 1e-6, 0.004, set()) is None


def test_irregular_or_too_few_arrivals_are_not_a_stream():
    adm = Admission()
    periodic(adm, n=4)
    assert not adm.streams["cam"].period and adm.hold_until(3, 0.149, 0.004, set()) is None
    adm2 = Admission()
    for t in (0.0, 0.05, 0.10, 0.19, 0.24):  # one interval 80% long
        adm2.arrived("cam", 0, t)
    assert not adm2.streams["cam"].period
    # a late request of a stream regular lately: its next is expected a period after it
    last = periodic(adm)
    assert adm.streams["cam"].period
    adm.arrived("cam", 0, last + 0.2)
    s = adm.streams["cam"]
    assert s.period == pytest.approx(0.05) and s.next_at == pytest.approx(last + 0.25)
    # ... for RESUME_S after it was last regular, then no longer
    adm.arrived("cam", 0, last + 0.2 + RESUME_S)
    assert not adm.streams["cam"].period


def test_a_stream_resuming_at_its_period_is_expected_at_it():
    adm = Admission()
    last = periodic(adm)                      # 0 .. 0.2, period 0.05
    adm.arrived("cam", 0, last + 4.0)         # after a pause: expected back a period on
    s = adm.streams["cam"]
    assert s.next_at == pytest.approx(last + 4.05)
    assert adm.hold_until(3, last + 4.049, 0.004, set()) is not None
    adm.arrived("cam", 0, last + 4.052)       # one interval at the old period (within JITTER)
    assert s.period == pytest.approx(0.05) and s.next_at == pytest.approx(last + 4.102)
    assert adm.hold_until(3, last + 4.101, 0.004, set()) is not None
    adm.arrived("cam", 0, last + 4.052 + RESUME_S + 1)  # irregular for RESUME_S: not expected
    assert not adm.streams["cam"].period
    fresh = Admission()                       # a group never periodic needs PERIODIC_N arrivals
    for t in (0.0, 0.05):
        fresh.arrived("mic", 0, t)
    assert not fresh.streams["mic"].period


def test_learned_stretches_follow_the_steps_and_resist_outliers():
    segs = [0.0]
    Admission.learn(segs, 0, 0.004)
    assert segs[0] == 0.004  # the first observation is taken as it is
    Admission.learn(segs, 0, 0.040)  # a 10x outlier (a descheduled thread) moves it <= 30%
    assert 0.004 < segs[0] <= 0.004 * 1.3 + 1e-12
    for _ in range(30):
        Admission.learn(segs, 0, 0.002)
    assert segs[0] == pytest.approx(0.002, rel=0.01)


class Uneven(Chain):
    """A Chain whose node i advances the clock by dts[i]."""

    def __init__(self, name, dts, log, clock):
        self.dts = dts
        super().__init__(name, len(dts), log, clock)

    def kernel(self, x):
        self.dt = self.dts[self.calls % len(self.dts)]
        return super().kernel(x)


def _stream_of(s, clock, log, period=10.0, n=5):
    """n requests of a 1-node priority-0 task, `period` fake seconds apart."""
    for k in range(n):
        clock.t = k * period
        s.submit(Chain("cam", 1, log, clock, dt=0.5).program, X, priority=0, name="cam").result(timeout=10)
    return (n - 1) * period + period  # the next request's due time


def _wait_for(pred, what):
    end = time.monotonic() + 10
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


@pytest.mark.parametrize("request_comes", [True, False])
def test_a_background_node_that_would_overrun_the_next_request_waits_for_it(request_comes):
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    due = _stream_of(s, clock, log)                       # requests at 0, 10, .., 40: next at 50
    bg = Uneven("bg", [1.0, 6.0, 1.0], log, clock)       # node 1 is long
    # A first run learns the node times (starts at 40.5: ends at 48.5, before the request).
    clock.t = 40.5
    s.submit(bg.program, X, priority=3, name="bg").result(timeout=10)
    assert s.stats()["admission_holds"] == 0
    clock.t = due                                          # the request of 50 comes on time
    s.submit(Chain("cam", 1, log, clock, dt=0.5).program, X, priority=0, name="cam").result(timeout=10)
    due += 10.0                                            # next at 60
    # Second run from 53: node 0 ends at 54; node 1 (6 s, x MARGIN) would end after 60: held.
    log.clear()
    clock.t = 53.0
    fut = s.submit(bg.program, X, priority=3, name="bg")
    _wait_for(lambda: s.stats()["admission_holds"] == 1, "the hold")
    assert [n for n, _ in log] == ["bg"] and s.stats()["running"] == 0
    if request_comes:
        clock.t = due
        cam = s.submit(Chain("cam", 1, log, clock, dt=0.5).program, X, priority=0, name="cam")
        cam.result(timeout=10)
        assert cam.task.preempt_wait is None  # it found the unit free: no preemption wait
        fut.result(timeout=10)
        assert [n for n, _ in log] == ["bg", "cam", "bg", "bg"]
        assert s.stats()["admission_held_s"] == pytest.approx(due - 54.0)  # from the hold to the request
    else:  # the hold lapses GRACE periods after the request was due, and the node runs
        clock.t = due + GRACE * 10.0 + 0.01
        fut.result(timeout=10)
        assert [n for n, _ in log] == ["bg", "bg", "bg"]
        assert s.stats()["admission_held_s"] == pytest.approx(due + GRACE * 10.0 - 54.0)
    assert fut.task.holds == 1 and s.stats()["admission_holds"] == 1


def test_the_gap_before_a_request_goes_to_a_task_whose_stretch_fits():
    """A held task leaves the unit free before the request; another background task is handed
    it only where its next stretch fits before the request is due (one that does not is held at
    dispatch too, as it would be at a boundary), so the gap is filled and the request still
    finds the unit free."""
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)

    def cam_at(t):
        clock.t = t
        return s.submit(Chain("cam", 1, log, clock, dt=0.5).program, X, priority=0, name="cam").result(timeout=10)
    _stream_of(s, clock, log)                               # requests at 0, 10, .., 40
    slow = Uneven("slow", [1.0, 6.0, 1.0], log, clock)     # its node 1 is long
    short = Chain("short", 2, log, clock, dt=1.0)
    big = Chain("big", 1, log, clock, dt=8.0)
    # first runs learn the stretches, each in a gap after a request
    for t, bg, nm in ((40.5, slow, "slow"), (50.5, short, "short"), (60.5, big, "big")):
        if t > 41:
            cam_at(t - 0.5)
        clock.t = t
        s.submit(bg.program, X, priority=3, name=nm).result(timeout=10)
    cam_at(70.0)                                            # the next request is due at 80
    assert s.stats()["admission_holds"] == 0
    log.clear()
    clock.t = 73.0
    f_slow = s.submit(slow.program, X, priority=3, name="slow")  # node 0 ends at 74; node 1 would overrun
    _wait_for(lambda: s.stats()["admission_holds"] == 1, "the first hold")
    f_big = s.submit(big.program, X, priority=3, name="big")      # 8 s from 74: held at dispatch
    _wait_for(lambda: s.stats()["admission_holds"] == 2, "the second hold")
    f_short = s.submit(short.program, X, priority=3, name="short")  # 2 x 1 s: fits, runs in the gap
    f_short.result(timeout=10)
    assert names(log) == ["slow", "short", "short"] and clock.t == 76.0
    assert f_big.task.holds == 1 and f_short.task.holds == 0
    clock.t = 80.0
    cam = s.submit(Chain("cam", 1, log, clock, dt=0.5).program, X, priority=0, name="cam")
    cam.result(timeout=10)
    assert cam.task.preempt_wait is None  # the unit was free when it came
    f_slow.result(timeout=10), f_big.result(timeout=10)
    assert names(log)[3] == "cam" and sorted(names(log)[4:]) == ["big", "slow", "slow"]
    assert s.stats()["admission_holds"] == 2


def test_without_a_periodic_stream_nothing_is_held():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    for t in (0.0, 3.0, 11.0, 30.0, 31.0):  # requests, but no period
        clock.t = t
        s.submit(Chain("cam", 1, log, clock, dt=0.5).program, X, priority=0, name="cam").result(timeout=10)
    bg = Chain("bg", 4, log, clock, dt=5.0)
    for _ in range(2):
        s.submit(bg.program, X, priority=3, name="bg").result(timeout=10)
    assert s.stats()["admission_holds"] == 0


def test_admission_off_never_holds():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock, admission=False)
    _stream_of(s, clock, log)
    clock.t = 49.0
    bg = Chain("bg", 3, log, clock, dt=3.0)
    for _ in range(2):
        s.submit(bg.program, X, priority=3, name="bg").result(timeout=10)
    assert s.stats()["admission_holds"] == 0 and s.admission is None


def test_admission_counters_reach_prometheus():
    import npurun
    from npurun.runtime.metrics import prometheus_text
    exe = npurun.Executor("reference", parallelism=1)
    exe.scheduler.holds, exe.scheduler.held_s = 3, 0.25
    text = prometheus_text([exe.dev])
    assert 'npurun_device_admission_holds_total{device="reference"} 3.0' in text
    assert 'npurun_device_admission_held_seconds_total{device="reference"} 0.25' in text


def test_the_last_programs_records_are_their_own():
    """Pace and Admission keep the last program's record beside their weak dictionaries: runs
    of two programs in turn, and a program created where a collected one lived (same id),
    each get their own (runtime/fairshare.py, runtime/admission.py)."""
    import gc

    from npurun.runtime.fairshare import Pace

    class Prog:  # (weakly referable, as Programs are)
        pass

    pace, adm = Pace(), Admission()
    a, b = Prog(), Prog()
    for _ in range(3):
        pace.observe(a, 1.0, alone=True)
        pace.observe(b, 2.0, alone=True)
        pace.observe(a, 4.0, alone=False)
    assert pace.rate(a) == pytest.approx(0.25)  # 1 s alone, 4 s sharing
    assert pace.rate(b) == 1.0  # never seen sharing
    sa, sb = adm.segments(a, 3), adm.segments(b, 3)
    sa[0] = 0.5
    assert adm.segments(a, 3) is sa and adm.segments(b, 3) is sb and sb[0] == 0.0
    assert adm.segments(a, 4) is not sa  # another step count: a fresh list
    del b, sb
    gc.collect()
    c = Prog()  # (may take b's address)
    assert pace.rate(c) == 1.0 and adm.segments(c, 3) == [0.0, 0.0, 0.0]
