"""The multi-task scheduler: priorities, preemption at node boundaries, round-robin, aging,
timeouts, cancellation and faults. Programs here are chains of tiny nodes whose kernels log
their order and advance a fake clock, so every assertion is about order and counters, never
about wall-clock time."""
import asyncio
import gc
import threading
import weakref

import numpy as np
import pytest

import npurun
from npurun.backends.base import Program
from npurun.errors import NpurunError
from npurun.ir import parse
from npurun.runtime.scheduler import NOT_IDLE, Scheduler, TaskCancelled, TaskTimeout


class FakeClock:
    def __init__(self):
        self.t = 0.0
        self.lock = threading.Lock()

    def __call__(self):
        return self.t

    def advance(self, dt):
        with self.lock:
            self.t += dt


class Chain:
    """A program of `n` nodes; node i logs (name, i), advances the clock by `dt`, runs hooks[i]
    (if any) and returns a fresh array, remembered by a weak reference."""

    def __init__(self, name, n, log, clock=None, dt=1.0, hooks=None):
        text = "\n".join(f"op relu @{name}{i} ({'x' if i == 0 else f'v{i - 1}'}: [256] f32 -> v{i}: [256] f32)"
                         for i in range(n))
        g = parse(text)
        g.name = name
        self.name, self.log, self.clock, self.dt, self.hooks = name, log, clock, dt, hooks or {}
        self.refs = []
        self.calls = 0
        self.program = Program(g, {"relu": self.kernel}, "test")

    def kernel(self, x):
        i = self.calls
        self.calls += 1
        self.log.append((self.name, i))
        if self.clock is not None:
            self.clock.advance(self.dt)
        if i in self.hooks:
            self.hooks[i]()
        y = x + 1
        self.refs.append(weakref.ref(y))
        return y


X = {"x": np.zeros(256, np.float32)}


def names(log):
    return [n for n, _ in log]


def test_priorities_order_waiting_tasks():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    s.pause()
    futs = [s.submit(Chain(nm, 2, log, clock).program, X, priority=p) for nm, p in [("low", 3), ("mid", 1), ("high", 0)]]
    s.resume()
    for f in futs:
        np.testing.assert_array_equal(f.result(timeout=10)["v1"], np.full(256, 2, np.float32))
    assert names(log) == ["high", "high", "mid", "mid", "low", "low"]


@pytest.mark.parametrize("inline", [False, True], ids=["submit", "run_inline"])
def test_higher_priority_arrival_preempts_at_the_next_node(inline):
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    hi = Chain("hi", 3, log, clock)
    box = {}
    lo = Chain("lo", 6, log, clock, hooks={2: lambda: box.setdefault("hi", s.submit(hi.program, X, priority=0))})
    if inline:  # run_sync's path: the preempted task waits on the calling thread
        out = s.run_inline(lo.program, X, priority=3)
    else:
        out = s.submit(lo.program, X, priority=3).result(timeout=10)
    box["hi"].result(timeout=10)
    assert log == [("lo", 0), ("lo", 1), ("lo", 2), ("hi", 0), ("hi", 1), ("hi", 2),
                   ("lo", 3), ("lo", 4), ("lo", 5)]
    assert out["v5"][0] == 6
    lo_t, hi_t = s.tasks()  # newest first: lo finished last
    assert (lo_t["name"], lo_t["preemptions"], lo_t["slices"]) == ("lo", 1, 2)
    assert (hi_t["name"], hi_t["preemptions"], hi_t["slices"]) == ("hi", 0, 1)
    assert s.stats()["preemptions"] == 1


def test_equal_priorities_share_by_round_robin_with_the_quantum():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=2.0, aging=1000, clock=clock)  # 2 nodes of 1 fake second each
    s.pause()
    fa = s.submit(Chain("a", 6, log, clock).program, X, priority=2)
    fb = s.submit(Chain("b", 6, log, clock).program, X, priority=2)
    s.resume()
    fa.result(timeout=10), fb.result(timeout=10)
    assert names(log) == ["a", "a", "b", "b"] * 3
    assert fa.task.slices == fb.task.slices == 3
    assert fa.task.preemptions == 0  # turns at the quantum are not preemptions


def _stream(s, log, clock, count, priority=0):
    """A saturating stream: each 2-node task submits the next one from its last node."""
    futs = []

    def next_task():
        if len(futs) < count:
            futs.append(s.submit(Chain(f"hi{len(futs)}", 2, log, clock, hooks={1: next_task}).program, X,
                                 priority=priority))
    next_task()
    return futs


def test_aging_bounds_the_wait_of_a_low_priority_task_under_a_saturating_stream():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=1.0, aging=5.0, clock=clock)
    s.pause()
    low = s.submit(Chain("low", 4, log, clock).program, X, priority=3)
    stream = _stream(s, log, clock, 60)
    s.resume()
    low.result(timeout=10)
    while len(stream) < 60:
        stream[-1].result(timeout=10)
    for f in stream:
        f.result(timeout=10)
    done_at = names(log).index("low") if "low" in names(log) else None
    assert done_at is not None
    # low finished long before the stream did: it was not starved
    last_low = max(i for i, n in enumerate(names(log)) if n == "low")
    assert last_low < len(log) - 20
    # and each of its waits stayed within the stated bound (fake seconds: nodes take 1.0)
    bound = s.wait_bound(3, ahead=1, longest_node=1.0)
    assert low.task.max_wait <= bound, (low.task.max_wait, bound)


def test_without_aging_the_low_priority_task_waits_for_the_whole_stream():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=1.0, aging=1e9, clock=clock)
    s.pause()
    low = s.submit(Chain("low", 4, log, clock).program, X, priority=3)
    stream = _stream(s, log, clock, 10)
    s.resume()
    low.result(timeout=10)
    assert names(log)[-4:] == ["low"] * 4 and len(stream) == 10


def test_timeout_of_a_running_task_acts_at_the_next_node_and_frees_its_values():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    c = Chain("slow", 8, log, clock)
    f = s.submit(c.program, X, priority=1, timeout=2.5)
    with pytest.raises(TaskTimeout, match=r"within its timeout of 2.5 s \(3 of 8 nodes done\)"):
        f.result(timeout=10)
    f.task.finished.wait(10)
    gc.collect()
    assert len(log) == 3 and all(r() is None for r in c.refs)
    assert f.task.outcome == "timeout" and s.stats()["tasks"]["timeout"] == 1


def test_timeout_of_a_task_that_never_started():
    go, inside = threading.Event(), threading.Event()
    log = []
    s = Scheduler(1, quantum=100, aging=1000)  # real clock: only outcomes are checked

    def block():
        inside.set()
        go.wait(10)
    blocker = s.submit(Chain("blocker", 2, log, hooks={0: block}).program, X, priority=0)
    inside.wait(10)
    late = s.submit(Chain("late", 2, log).program, X, priority=0, timeout=0.01)
    with pytest.raises(TaskTimeout, match="never started"):
        late.result(timeout=10)
    go.set()
    blocker.result(timeout=10)
    assert "late" not in names(log)


def test_cancelling_a_task_that_holds_the_device_frees_its_values_and_others_continue():
    go, inside = threading.Event(), threading.Event()
    log = []
    s = Scheduler(1, quantum=100, aging=1000)

    def block():
        inside.set()
        go.wait(10)
    victim = Chain("victim", 6, log, hooks={1: block})
    other = Chain("other", 3, log)
    fv = s.submit(victim.program, X, priority=1)
    fo = s.submit(other.program, X, priority=1)
    inside.wait(10)
    assert fv.task.state == "running"
    assert fv.cancel()  # resolves now; the task leaves at its next node boundary
    go.set()
    fv.task.finished.wait(10)
    np.testing.assert_array_equal(fo.result(timeout=10)["v2"], np.full(256, 3, np.float32))
    gc.collect()
    assert names(log).count("victim") == 2 and all(r() is None for r in victim.refs)
    assert fv.task.outcome == "cancelled" and fv.cancelled()


def test_a_kernel_that_raises_fails_its_task_only_and_keeps_no_values():
    log = []
    s = Scheduler(1, quantum=100, aging=1000)

    def boom():
        raise ValueError("bad tile")
    bad = Chain("bad", 5, log, hooks={2: boom})
    good = Chain("good", 3, log)
    fb = s.submit(bad.program, X, priority=0)
    fg = s.submit(good.program, X, priority=1)
    with pytest.raises(NpurunError, match=r"node 'bad2' \(relu\) failed on inputs \(float32\[256\]\): ValueError: bad tile"):
        fb.result(timeout=10)
    fb.task.finished.wait(10)
    fg.result(timeout=10)
    err = fb.exception()
    gc.collect()
    assert all(r() is None for r in bad.refs), "the failed task's intermediate values are still alive"
    assert err is not None and fb.task.outcome == "failed"
    assert s.stats()["tasks"] == {"submitted": 2, "ok": 1, "failed": 1, "cancelled": 0, "timeout": 0}


def test_equal_priorities_run_side_by_side_on_two_units():
    barrier = threading.Barrier(2, timeout=10)
    log = []
    s = Scheduler(2, quantum=100, aging=1000)
    fa = s.submit(Chain("a", 2, log, hooks={0: barrier.wait}).program, X, priority=2)
    fb = s.submit(Chain("b", 2, log, hooks={0: barrier.wait}).program, X, priority=2)
    fa.result(timeout=20), fb.result(timeout=20)  # a broken barrier would fail both


def test_a_lower_priority_task_never_runs_beside_a_higher_one():
    go, inside = threading.Event(), threading.Event()
    log = []
    s = Scheduler(2, quantum=100, aging=1000)

    def block():
        inside.set()
        go.wait(10)
    fh = s.submit(Chain("hi", 2, log, hooks={0: block}).program, X, priority=0)
    inside.wait(10)
    fl = s.submit(Chain("lo", 2, log).program, X, priority=3)
    assert fl.task.state == "waiting" and s.stats()["running"] == 1  # a unit is free, yet lo waits
    go.set()
    fh.result(timeout=10), fl.result(timeout=10)
    assert names(log) == ["hi", "hi", "lo", "lo"]


def test_duty_cycle_and_units_in_use_are_obeyed():
    clock, log = FakeClock(), []
    s = Scheduler(2, quantum=1.0, aging=1000, clock=clock)
    s.set_operating(active_units=1, duty=0.5)
    f = s.submit(Chain("a", 4, log, clock).program, X, priority=2)
    # with a fake clock the rests never end by themselves: advance time from here
    while not f.done():
        clock.advance(1.0)
        f.task.finished.wait(0.01)
    f.result()
    assert f.task.slices == 4  # one quantum (one node) per slice, a rest after each
    assert s.stats()["lane_busy_s"][1] == 0.0  # the second unit was never used


def test_bad_priority_and_timeout_are_clear_errors():
    s = Scheduler(1)
    p = Chain("a", 1, []).program
    with pytest.raises(NpurunError, match=r"priority must be one of 0 \(highest\), 1, 2, 3, got 7"):
        s.submit(p, X, priority=7)
    with pytest.raises(NpurunError, match="timeout must be a positive number of seconds, got -1"):
        s.submit(p, X, timeout=-1)


# ---------------------------------------------------------------- through the Executor

def _espcn():
    return npurun.load(npurun.zoo.path("espcn_x3.onnx")) if hasattr(npurun, "zoo") else None


def test_executors_of_one_device_share_its_scheduler_and_count_macs(rng):
    from npurun import zoo
    from npurun.ir.cost import node_costs
    g = npurun.load(zoo.path("espcn_x3.onnx"))
    a, b = npurun.Executor("cpu", parallelism=2), npurun.Executor("cpu", parallelism=2)
    assert a.scheduler is b.scheduler
    x = rng.random((1, 1, 24, 24), dtype=np.float32)
    solo = a.run_sync(g, x)["output"]
    futs = [ex.submit(g, x, priority=p) for ex, p in [(a, 3), (b, 0), (a, 1), (b, 2)]]
    for f in futs:
        np.testing.assert_array_equal(f.result(timeout=60)["output"], solo)
    want = sum(c.macs for c in node_costs(g, {"input": x.shape}))
    assert all(f.task.macs_done == f.task.macs_total == want for f in futs)
    assert a.stats()["macs_done"] >= 5 * want


def test_async_runs_with_priorities_and_asyncio_cancellation(rng):
    go, inside = threading.Event(), threading.Event()

    def block():
        inside.set()
        go.wait(10)
    log = []
    victim = Chain("victim", 4, log, hooks={1: block})
    exe = npurun.Executor("cpu", parallelism=2)

    async def main():
        t = asyncio.ensure_future(exe.run(victim.program, X, priority=1))
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 10)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        go.set()
        outs = await asyncio.gather(*[exe.run(Chain(f"ok{i}", 2, log).program, X, priority=i % 4, timeout=30)
                                      for i in range(6)])
        return outs
    outs = asyncio.run(main())
    assert all(o["v1"][0] == 2 for o in outs)
    done = [t for t in exe.tasks() if t["name"] == "victim"]
    assert done and done[0]["outcome"] in ("cancelled", "")
    assert names(log).count("victim") == 2


def test_submissions_from_many_threads_all_complete(rng):
    exe = npurun.Executor("cpu", parallelism=2)
    results = {}

    def worker(k):
        c = Chain(f"t{k}", 3, [])
        results[k] = exe.submit(c.program, X, priority=k % 4).result(timeout=60)["v2"][0]
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: 3.0 for k in range(8)}


def test_closed_executor_refuses_new_runs():
    exe = npurun.Executor("cpu", parallelism=1)
    exe.close()
    with pytest.raises(NpurunError, match="is closed"):
        exe.submit(Chain("a", 1, []).program, X)


def test_cancelled_before_start_never_runs():
    s = Scheduler(1)
    s.pause()
    log = []
    f = s.submit(Chain("a", 2, log).program, X)
    assert f.cancel()
    s.resume()
    f.task.finished.wait(10)
    assert log == [] and f.task.outcome == "cancelled" and isinstance(TaskCancelled("x"), NpurunError)


def test_fair_share_between_a_long_task_and_a_stream_of_short_ones():
    """Equal priorities: one task with 3 s nodes against a stream of 2-node tasks with 1 s
    nodes; device time is shared by group (the model's name), not by turns."""
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=1.0, aging=1000, clock=clock)
    s.pause()
    big = Chain("big", 40, log, clock, dt=3.0)
    fb = s.submit(big.program, X, priority=2)
    futs = []

    def next_short():
        if len(futs) < 30:
            futs.append(s.submit(Chain("short", 2, log, clock, hooks={1: next_short}).program, X, priority=2))
    next_short()
    s.resume()
    fb.result(timeout=10)
    while len(futs) < 30 or not futs[-1].done():
        futs[-1].result(timeout=10)
    last_short = max(i for i, (n, _) in enumerate(log) if n == "short")
    served_big = 3.0 * sum(1 for n, _ in log[:last_short + 1] if n == "big")
    served_short = 1.0 * sum(1 for n, _ in log[:last_short + 1] if n == "short")
    assert abs(served_big - served_short) <= 3.0 + 1.0, (served_big, served_short)


@pytest.mark.parametrize("away", [0.5, 3.0])
def test_a_group_back_after_long_away_gets_no_bonus(away):
    """A group rejoining fair share keeps up to `aging` of credit if it left within AWAY_S (a
    client looping on a model), at most two quanta if it was away longer: it is owed nothing
    for the time another group ran alone."""
    from npurun.runtime.scheduler import AWAY_S
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=0.01, aging=0.2, clock=clock)
    s.submit(Chain("b", 1, log, clock, dt=0.01).program, X, priority=2).result(timeout=10)  # b seen
    left_at = clock.t
    a = Chain("a", 1, log, clock, dt=0.5)
    while clock.t < left_at + away:  # a alone meanwhile: its service grows, b's does not
        s.submit(a.program, X, priority=2).result(timeout=10)
    s.pause()
    s.submit(Chain("a", 1, log, clock, dt=0.5).program, X, priority=2)
    s.submit(Chain("b", 1, log, clock, dt=0.01).program, X, priority=2)
    behind = s._vtime["a"] - s._vtime["b"]
    s.resume()
    if clock.t - left_at > AWAY_S:
        assert behind == pytest.approx(2 * s.quantum)
    else:
        assert behind == pytest.approx(s.aging)


def test_run_inline_runs_on_the_calling_thread_and_counts_like_a_task():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    threads = []
    c = Chain("solo", 3, log, clock, hooks={1: lambda: threads.append(threading.get_ident())})
    out = s.run_inline(c.program, X, priority=1, name="solo", step_macs=[5, 6, 7])
    np.testing.assert_array_equal(out["v2"], np.full(256, 3, np.float32))
    assert threads == [threading.get_ident()] and names(log) == ["solo"] * 3
    st = s.stats()
    assert (st["tasks"]["submitted"], st["tasks"]["ok"], st["slices"], st["steps_done"], st["macs_done"]) == (1, 1, 1, 3, 18)
    assert st["running"] == st["waiting"] == 0 and st["lane_busy_s"] == [3.0]
    (t,) = s.tasks()
    assert (t["name"], t["outcome"], t["priority"], t["steps_done"], t["macs_done"], t["run_s"]) == ("solo", "ok", 1, 3, 18, 3.0)


def _history(s, programs):
    """Everything a quiet run's deferred bookkeeping touches, as plain values (the pace learned
    for `programs`: the records of programs already collected come and go with the collector)."""
    st = s.stats()  # (takes the lock: accounts what was deferred)
    adm = {g: (v.priority, v.period, v.next_at, list(v.arrivals)) for g, v in s.admission.streams.items()}
    pace = [s.pace._runs.get(p) for p in programs]
    return (st, s.tasks(), dict(s._vtime), dict(s._recent), adm, s.admission.active_until,
            s.admission.holding_priority, pace)


def test_quiet_runs_accounted_later_leave_what_accounting_at_once_leaves(monkeypatch):
    """Inline runs on an idle device are accounted when the lock is next taken (Scheduler.
    _defer): the counters, listings, fair-share times, admission's streams and pace learned
    are those of accounting each run at once, through periodic streams, a switch of priority
    and group, a failure, a submitted task and more runs than BACKLOG."""
    from npurun.runtime import scheduler as sched_mod

    def history(defer: bool):
        clock, log = FakeClock(), []
        s = Scheduler(1, quantum=100, aging=1000, clock=clock)
        if not defer:
            monkeypatch.setattr(s, "_defer", lambda task, now: False)
        a, b = Chain("a", 2, log, clock, dt=0.001), Chain("b", 3, log, clock, dt=0.002)
        for i in range(sched_mod.BACKLOG + 5):  # a periodic stream of a, then of b, then a again
            clock.advance(0.005)
            s.run_inline(a.program, X, priority=2, step_macs=[3, 4])
        for i in range(9):
            clock.advance(0.004)
            s.run_inline(b.program, X, priority=1, step_macs=[1, 1, 1])

        def boom():
            raise ValueError("bad")
        with pytest.raises(NpurunError):
            s.run_inline(Chain("a", 2, log, clock, hooks={0: boom}).program, X, priority=2, name="a")
        for i in range(5):
            clock.advance(0.005)
            s.run_inline(a.program, X, priority=2)
        s.submit(b.program, X, priority=1).result(timeout=10)
        # a task submitted during a quiet run (which is then accounted at once): the device
        # was shared, so the quiet runs right after it are not its pace's runs alone
        later = []
        c = Chain("c", 2, log, clock, dt=0.001, hooks={0: lambda: later.append(s.submit(b.program, X, priority=3))})
        s.run_inline(c.program, X, priority=2)
        later[0].result(timeout=10)
        for i in range(4):
            clock.advance(0.005)
            s.run_inline(a.program, X, priority=2)
        for i in range(3):
            clock.advance(0.005)
            s.run_inline(a.program, X, priority=3)
        return _history(s, [a.program, b.program, c.program]), a.calls + b.calls

    deferred, at_once = history(True), history(False)
    assert deferred[1] == at_once[1] > 0
    for got, want in zip(deferred[0], at_once[0]):
        assert got == want


def test_run_inline_declines_a_busy_or_paused_device_and_changes_nothing():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    box = {}
    inner = Chain("inner", 2, log, clock)
    outer = Chain("outer", 3, log, clock, hooks={1: lambda: box.setdefault("r", s.run_inline(inner.program, X))})
    s.submit(outer.program, X).result(timeout=10)
    assert box["r"] is NOT_IDLE and names(log) == ["outer"] * 3
    s.pause()
    assert s.run_inline(inner.program, X) is NOT_IDLE
    s.resume()
    assert s.stats()["tasks"]["submitted"] == 1 and inner.calls == 0
    assert s.run_inline(inner.program, X)["v1"][0] == 2  # idle again: runs


def test_run_inline_raises_the_failure_and_timeouts_and_frees_the_device():
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)

    def boom():
        raise ValueError("bad node")
    with pytest.raises(NpurunError, match=r"node '@?bad1' .*ValueError: bad node"):
        s.run_inline(Chain("bad", 3, log, clock, hooks={1: boom}).program, X)
    with pytest.raises(TaskTimeout, match="did not finish within its timeout of 1.5 s"):
        s.run_inline(Chain("slow", 4, log, clock).program, X, timeout=1.5)
    st = s.stats()
    assert (st["tasks"]["failed"], st["tasks"]["timeout"], st["running"]) == (1, 1, 0)
    assert [t["outcome"] for t in s.tasks()] == ["timeout", "failed"]
    assert s.run_inline(Chain("ok", 1, log, clock).program, X)["v0"][0] == 1


def test_preemption_latency_is_measured_from_arrival_to_first_slice():
    """A better task arriving 60 ms (fake clock) before the running node ends waits those 60 ms
    for its unit: the latency the scheduler records, per task and in the device histogram.
    Arrivals that need no preemption (a free unit, an equal priority) are not counted."""
    from npurun.runtime.metrics import prometheus_text  # noqa: F401 - the exposition is checked below
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    hi = Chain("hi", 2, log, clock)
    box = {}

    def arrive():
        box["hi"] = s.submit(hi.program, X, priority=0)
        clock.advance(0.06)  # the rest of the node the better task must wait for

    lo = Chain("lo", 4, log, clock, hooks={1: arrive})
    s.submit(lo.program, X, priority=3).result(timeout=10)
    box["hi"].result(timeout=10)
    same = Chain("same", 2, log, clock, hooks={0: lambda: box.setdefault("eq", s.submit(Chain("eq", 1, log, clock).program, X, priority=3))})
    s.submit(same.program, X, priority=3).result(timeout=10)
    box["eq"].result(timeout=10)
    by_name = {t["name"]: t for t in s.tasks()}
    assert by_name["hi"]["preempt_wait_s"] == pytest.approx(0.06)
    assert by_name["lo"]["preempt_wait_s"] is None and by_name["eq"]["preempt_wait_s"] is None
    lat = s.stats()["preemption_latency"]
    assert lat["count"] == 1 and lat["p99_s"] == pytest.approx(0.06) and lat["sum_s"] == pytest.approx(0.06)
    buckets = dict(lat["buckets"])
    assert buckets[0.05] == 0 and buckets[0.1] == 1 and buckets[5.0] == 1


def test_preemption_latency_reaches_prometheus(rng):
    import npurun
    from npurun.runtime.metrics import prometheus_text
    exe = npurun.Executor("reference", parallelism=1)
    text = prometheus_text([exe.dev])
    assert "# TYPE npurun_device_preemption_latency_seconds histogram" in text
    assert 'npurun_device_preemption_latency_seconds_bucket{device="reference",le="0.002"}' in text


def _hi_at_first_piece(monkeypatch, s, lo, x, hi, log, entry):
    """Run `lo` at priority 3 on `s`, logging entry(scheduler, task) at each of its piece
    boundaries and submitting `hi` at priority 0 at the first; lo's output once both are done."""
    from npurun.runtime import scheduler as sched
    box = {}
    real_piece = sched.Scheduler._piece

    def piece(self, task):
        log.append(entry(self, task))
        if "hi" not in box:
            box["hi"] = self.submit(hi.program, X, priority=0, name="hi")
        real_piece(self, task)
    monkeypatch.setattr(sched.Scheduler, "_piece", piece)
    out = s.submit(lo, x, priority=3, name="lo").result(timeout=60)["y"]
    box["hi"].result(timeout=10)
    return out


def _conv_program(rng, threads=2):
    """A cpu-backend program of one 3x3 conv (Winograd) and one 5x5 conv (direct) on 64x64."""
    from onnx import TensorProto, helper, numpy_helper

    from npurun.backends import get_backend
    from npurun.frontend.onnx import import_model
    from npurun.passes.pipeline import prepare
    w1 = numpy_helper.from_array(rng.standard_normal((24, 8, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 24, 5, 5)).astype(np.float32), "w2")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4),
                           helper.make_node("Conv", ["a", "w2"], ["y"], pads=[2] * 4)], "convs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64, 64])], [w1, w2])
    graph = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    return get_backend("cpu", threads).compile(prepare(graph, "cpu"))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_better_task_arriving_inside_a_long_conv_starts_within_one_piece(rng, monkeypatch, threads):
    """Issue L: long convs run as pieces with a preemption point between them on a contended
    device. A high-priority task that arrives during the first piece runs at the next piece
    boundary (counted in pieces, never timed), and the conv's result is bit-identical to the
    whole node's."""
    from npurun.backends.cpu import nativeconv
    # (before the first run: a conv's plan, made on its first call, keeps its predicted time)
    monkeypatch.setattr(nativeconv, "PIECE_FLOPS", 2e7)  # pieces of ~10 rows here
    lo = _conv_program(rng, threads)
    x = {"x": rng.standard_normal((1, 8, 64, 64)).astype(np.float32)}
    whole = lo.run(x)["y"]  # no hook on this thread: every node whole
    log = []
    hi = Chain("hi", 2, log)
    s = Scheduler(1, quantum=100, aging=1000)
    s._contended_until = float("inf")  # as after two tasks shared the device,
    s._recent[0, "hi"] = float("inf")  # one of them a better one (so the worse one runs pieces)
    out = _hi_at_first_piece(monkeypatch, s, lo, x, hi, log, lambda self, task: ("piece", task.name))
    assert log[:3] == [("piece", "lo"), ("hi", 0), ("hi", 1)], log[:6]
    assert log.count(("piece", "lo")) >= 8
    np.testing.assert_array_equal(out, whole)
    lo_t = next(t for t in s.tasks() if t["name"] == "lo")
    assert lo_t["pieces_yielded"] == 1 and lo_t["preemptions"] == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_a_better_task_arriving_after_a_quiet_spell_waits_one_long_piece(rng, monkeypatch, threads):
    """On a device no longer contended, a task that had a better one beside it within
    SPARSE_S runs a node predicted longer than pieces.LONG_S as pieces of about that: the better
    task's next request, the first in seconds, starts at the next piece boundary, not at the end
    of the node (counted in pieces, never timed); the result is the whole node's. A task that
    never had company runs the node whole."""
    from npurun.backends.cpu import nativeconv
    # (before the first run: a conv's plan, made on its first call, keeps its predicted time;
    # set after it, the test passed or failed with the kernel convtune picked for the convs)
    monkeypatch.setattr(nativeconv, "PIECE_FLOPS", 2e7)  # each conv predicted at 0.1-1 s: long
    lo = _conv_program(rng, threads)
    x = {"x": rng.standard_normal((1, 8, 64, 64)).astype(np.float32)}
    whole = lo.run(x)["y"]
    log = []
    hi = Chain("hi", 2, log)
    clock = FakeClock()
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    alone = s.submit(lo, x, priority=3, name="lo")
    np.testing.assert_array_equal(alone.result(timeout=60)["y"], whole)
    assert alone.task.pieces_yielded == 0 and not s._had_company(alone.task)
    s.submit(hi.program, X, priority=0, name="hi").result(timeout=10)  # a request, then quiet
    assert not s._had_company(alone.task)  # one after the other: no company
    s._contended_until = clock()  # (as if the two had shared the device until now)
    clock.advance(5.0)
    del log[:]
    assert not s._contended()
    out = _hi_at_first_piece(monkeypatch, s, lo, x, hi, log,
                             lambda self, task: ("piece", task.name, self._contended()))
    assert log[0] == ("piece", "lo", False)  # a piece of the first conv, the device quiet
    assert log[1:3] == [("hi", 2), ("hi", 3)], log[:6]  # (hi's third and fourth node calls)
    np.testing.assert_array_equal(out, whole)


def test_pieces_only_on_a_contended_device(rng):
    """A task alone runs its nodes whole; the device is contended once two tasks were live."""
    clock = FakeClock()
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    s.submit(Chain("a", 1, []).program, X).result(timeout=10)
    assert not s._contended()
    s.pause()
    f1, f2 = s.submit(Chain("b", 1, []).program, X), s.submit(Chain("c", 1, []).program, X)
    s.resume()
    f1.result(timeout=10), f2.result(timeout=10)
    assert s._contended()
    clock.advance(1.5)
    assert not s._contended()


def test_pieces_only_where_another_task_could_enter_between_them():
    """On a contended device a task runs pieces when another group's task of the same or a
    better priority is live or was lately; the best task of all runs its nodes whole."""
    clock = FakeClock()
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    s.pause()
    f1 = s.submit(Chain("stream", 1, []).program, X, priority=0, group="stream")
    f2 = s.submit(Chain("batch", 1, []).program, X, priority=3, group="batch")
    hi, lo = f1.task, f2.task
    assert s._wants_pieces(lo) and not s._wants_pieces(hi)
    s.resume()
    f1.result(timeout=10), f2.result(timeout=10)
    assert s._wants_pieces(lo)  # the stream was live lately: its next request is likely
    peer = s.submit(Chain("peer", 1, []).program, X, priority=3, group="peer")
    assert s._wants_pieces(lo) and not s._wants_pieces(hi)
    peer.result(timeout=10)
    clock.advance(1.5)
    assert not s._wants_pieces(lo)  # nobody lately: not contended


def test_a_new_equal_priority_task_behind_in_service_enters_at_the_next_boundary():
    """Fair share at equal priority (issue L): a task that arrives during a long task's slice,
    its group behind in device time, runs at the next boundary instead of waiting out the
    long task's quantum; tasks already waiting when the slice began still wait for it."""
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=100, aging=1000, clock=clock)
    short = Chain("short", 2, log, clock)
    box = {}
    long = Chain("long", 8, log, clock, hooks={2: lambda: box.setdefault("s", s.submit(short.program, X, priority=2))})
    s.submit(long.program, X, priority=2).result(timeout=10)
    box["s"].result(timeout=10)
    assert names(log) == ["long"] * 3 + ["short"] * 2 + ["long"] * 5


@pytest.mark.parametrize("inline", [False, True])
def test_a_finished_tasks_outputs_are_freed_without_the_cyclic_collector(inline):
    """Dropping the future and its outputs frees them at once, by reference counting: task and
    future do not hold each other once the task is done. (They did: fut.task <-> task.future,
    so each run's outputs — a generation's whole KV cache — waited for the cyclic collector,
    and `npurun serve` sat ~100 MB above its working set at rest.)"""
    log = []
    s = Scheduler(1, quantum=100, aging=1000)
    c = Chain("run", 3, log)
    was = gc.isenabled()
    gc.disable()
    try:
        if inline:
            out = s.run_inline(c.program, X, priority=1)
            assert out is not NOT_IDLE
            task = None
        else:
            f = s.submit(c.program, X, priority=1)
            out = f.result(timeout=10)
            f.task.finished.wait(10)
            task = weakref.ref(f.task)
            del f
        del out

        def freed():
            return all(r() is None for r in c.refs) and (task is None or task() is None)
        for _ in range(1000):  # the task thread lets go of its locals just after `finished`
            if freed():
                break
            threading.Event().wait(0.01)
        assert c.refs and all(r() is None for r in c.refs), "outputs outlive the run without gc"
        assert task is None or task() is None, "the finished task is kept alive by a reference cycle"
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("progress", [True, False], ids=["by-progress", "by-device-time"])
def test_equal_priorities_share_by_progress_when_sharing_slows_one(progress):
    """Fair share among equals (runtime/fairshare.py): two programs take 4 s a run alone, and
    beside each other one of them runs at half speed (its caches refilled at every switch).
    Charged its solo-equivalent time, it gets twice the device time and both make the same
    progress (nodes per second of the shared run); charged device time, it makes half."""
    clock, log = FakeClock(), []
    s = Scheduler(1, quantum=1.0, aging=1000, clock=clock, fair_progress=progress)
    a, b = Chain("a", 4, log, clock), Chain("b", 4, log, clock)
    s.submit(a.program, X, priority=2).result(timeout=10)  # each alone once: 4 s
    s.submit(b.program, X, priority=2).result(timeout=10)
    a.dt = 2.0  # beside b, a's nodes take twice as long
    del log[:]
    futs, lock = [], threading.Lock()

    def again(chain):
        def resubmit(_f):
            with lock:
                if len(log) < 120:
                    futs.append(s.submit(chain.program, X, priority=2))
                    futs[-1].add_done_callback(resubmit)
        return resubmit
    s.pause()
    for c in (a, b):
        futs.append(s.submit(c.program, X, priority=2))
        futs[-1].add_done_callback(again(c))
    s.resume()
    while True:
        with lock:
            pending = [f for f in futs if not f.done()]
        if not pending:
            break
        pending[0].result(timeout=10)
    tail = names(log[40:120])  # after each has finished a shared run (its pace is known)
    ratio = tail.count("a") / tail.count("b")
    if progress:
        assert 0.8 <= ratio <= 1.25, tail
    else:
        assert 0.4 <= ratio <= 0.62, tail
