"""The per-node and per-run overhead cuts of backends/base.py and the scheduler, and the
pipeline's folding that every entry point runs, checked by counting (nodes, steps, kernel
calls, input checks, threads), never by wall-clock time."""
import threading
import time

import numpy as np
import pytest

import npurun
from npurun.backends import base, get_backend
from npurun.backends.cpu import native
from npurun.errors import InputError, NpurunError
from npurun.ir import parse

from conftest import nonzero_normal

# An exporter-style graph: a constant weight sliced into halves and concatenated back on every
# run (foldable), a shape chain on a static shape (foldable), an identity (an alias) and an
# `if` whose branches slice a weight they capture (foldable inside the region).
TEXT = """input x: [2, 6] f32 DRAM0
input c: [] bool DRAM0
const w: [6, 6] f32 DRAM0
const s0: [1] i64 = [0]
const s3: [1] i64 = [3]
const s6: [1] i64 = [6]
const ax: [1] i64 = [0]
const a1: [1] i64 = [1]
op slice @top (w, s0, s3, ax -> wt: [3, 6] f32 DRAM0)
op slice @bottom (w, s3, s6, ax -> wb: [3, 6] f32 DRAM0)
op concat @back (wb, wt -> wc: [6, 6] f32 DRAM0) axis=0
op matmul @mm (x, wc -> h: [2, 6] f32 DRAM0)
op shape @shp (h -> hs: [2] i64 DRAM0)
op identity @same (h -> h2: [2, 6] f32 DRAM0)
op if @pick (c: [] bool DRAM0 -> y: [2, 3] f32 DRAM0) then_branch={
  graph pick.then_branch
  op slice @rt (wc: [6, 6] f32 DRAM0, s0: [1] i64 DRAM0, s3: [1] i64 DRAM0, ax: [1] i64 DRAM0 -> r: [3, 6] f32 DRAM0)
  op transpose @rtt (r -> rT: [6, 3] f32 DRAM0) perm=[1, 0]
  op matmul @rm (h2: [2, 6] f32 DRAM0, rT -> a: [2, 3] f32 DRAM0)
  output a: [2, 3] f32 DRAM0
} else_branch={
  graph pick.else_branch
  op slice @re (h2: [2, 6] f32 DRAM0, s0: [1] i64 DRAM0, s3: [1] i64 DRAM0, ax: [1] i64 DRAM0 -> b0: [2, 6] f32 DRAM0)
  op slice @re2 (b0, s0, s3, a1: [1] i64 DRAM0 -> b: [2, 3] f32 DRAM0)
  output b: [2, 3] f32 DRAM0
}
output y: [2, 3] f32 DRAM0
output hs: [2] i64 DRAM0
"""


def _graph(rng):
    return parse(TEXT, weights={"w": nonzero_normal(rng, (6, 6))})


def _feeds(rng, c):
    return {"x": nonzero_normal(rng, (2, 6)), "c": np.array(c)}


def _raw(g, threads=1):
    """The cpu Program of `g` exactly as written (no pipeline): the loop's own behaviour."""
    return get_backend("cpu", threads).compile(g)


def _if_step(prog):
    return next(s for s in prog.steps if s[0].op == "if")


def test_pipeline_folds_constant_chains_also_in_regions_and_matches_reference(rng):
    g = _graph(rng)
    cpu, ref = npurun.Executor("cpu", parallelism=1), npurun.Executor("reference")
    prog = cpu.compile(g)
    # slice, slice, concat fold; `shape` of a static value folds (an output: copied per run);
    # the identity goes (its readers, the branch included, read h)
    assert [n.op for n in prog.graph.nodes] == ["matmul", "if"]
    then = prog.subprograms[id(_if_step(prog)[0])]["then_branch"]
    assert [s[0].op for s in then.steps] == ["matmul"]  # slice of the captured wc, transpose: folded
    assert len(ref.compile(g).steps) == len(g.nodes)  # the reference runs the graph as written
    assert len(g.nodes) == 7  # and the caller's graph is not modified
    for c in (True, False):
        f = _feeds(rng, c)
        got, want = cpu.run_sync(g, f), ref.run_sync(g, f)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
        assert got["hs"] is not cpu.run_sync(g, f)["hs"]  # outputs are never a shared constant


def test_plan_kinds_alias_identity_and_call_if_branches_directly(rng):
    prog = _raw(_graph(rng))
    kinds = [p[0] for p in prog._plan_steps()]
    assert kinds == [base._CALL] * 5 + [base._ALIAS, base._IF]
    old = prog._plan_steps()
    prog.steps = list(prog.steps)
    assert prog._plan_steps() is old  # cached while the entries of `steps` are the same
    n, fn, attrs, dead = prog.steps[0]
    prog.steps[0] = (n, fn, dict(attrs), dead)  # an entry rewritten in place: a new plan
    assert prog._plan_steps() is not old


def test_each_step_calls_its_kernel_once_and_inputs_are_checked_once_per_signature(rng, monkeypatch):
    prog = _raw(_graph(rng))
    prog._replays = None  # the step loop itself, run after run (not a recording's replays: test_cpu_replay.py)
    calls = {"check": 0, "kernel": 0}
    real_check = base.check_inputs

    def counting_check(graph, feeds):
        calls["check"] += 1
        return real_check(graph, feeds)
    monkeypatch.setattr(base, "check_inputs", counting_check)
    steps = []
    for n, fn, attrs, dead in prog.steps:
        def counted(*a, _fn=fn, **k):
            calls["kernel"] += 1
            return _fn(*a, **k)
        steps.append((n, counted if n.op != "identity" else fn, attrs, dead))
    prog.steps = steps
    for _ in range(5):
        prog.run(_feeds(rng, True))
    assert calls == {"check": 1, "kernel": 5 * 6}  # all but the identity (an alias)
    with pytest.raises(InputError, match="dtype"):  # a new signature is checked, and refused
        prog.run({"x": nonzero_normal(rng, (2, 6)).astype(np.float64), "c": np.array(True)})
    with pytest.raises(InputError, match="dtype"):
        prog.run({"x": nonzero_normal(rng, (2, 6)).astype(np.float64), "c": np.array(True)})
    assert calls["check"] == 3


def test_values_are_freed_after_their_last_reader(rng):
    prog = _raw(_graph(rng))
    live = []  # the run's value names when the `if` starts
    real = prog.subprograms[id(_if_step(prog)[0])]["then_branch"].call

    def spy(inputs, outer, *rest):
        live.append(set(outer))
        return real(inputs, outer, *rest)
    prog.subprograms[id(_if_step(prog)[0])]["then_branch"].call = spy
    prog.run(_feeds(rng, True))
    # h was last read by `shape` and the identity: gone; h2 (captured by the branch) still there.
    assert "h2" in live[0] and "h" not in live[0] and "x" in live[0]


def test_a_failing_kernel_names_its_node(rng):
    prog = npurun.Executor("cpu", parallelism=1).compile(_graph(rng))

    def boom(*a, **k):
        raise ValueError("no")
    prog.steps = [(n, boom if n.op == "matmul" else fn, attrs, dead) for n, fn, attrs, dead in prog.steps]
    with pytest.raises(NpurunError, match=r"node 'mm' \(matmul\) failed on inputs \(float32\[2, 6\], float32\[6, 6\]\): ValueError: no"):
        prog.run(_feeds(rng, True))


def test_run_sync_runs_on_the_calling_thread_and_task_threads_are_reused(rng):
    g = _graph(rng)
    exe = npurun.Executor("cpu", parallelism=1)
    threads = []
    exe.run_sync(g, _feeds(rng, True), progress=lambda i, n, lbl: threads.append(threading.get_ident()))
    assert set(threads) == {threading.get_ident()}  # inline: no handoff to another thread
    sched = exe.scheduler
    idents = []
    for _ in range(3):
        threads.clear()
        exe.submit(g, _feeds(rng, False), progress=lambda i, n, lbl: threads.append(threading.get_ident())).result()
        idents.append(threads[0])
        for _ in range(500):  # the finished task's thread parks itself as idle
            if sched._idle:
                break
            time.sleep(0.002)
    assert threading.get_ident() not in idents and len(set(idents)) == 1


def test_a_failing_kernel_in_a_region_names_its_node(rng):
    prog = npurun.Executor("cpu", parallelism=1).compile(_graph(rng))
    then = prog.subprograms[id(_if_step(prog)[0])]["then_branch"]

    def boom(*a, **k):
        raise ZeroDivisionError("inner")
    then.steps = [(n, boom, attrs, dead) for n, fn, attrs, dead in then.steps]
    with pytest.raises(NpurunError, match=r"node 'rm' \(matmul\) failed on inputs .*ZeroDivisionError: inner"):
        prog.run(_feeds(rng, True))
    prog.run(_feeds(rng, False))  # the other branch still runs


def test_a_cpu_run_holds_blas_at_its_threads_and_restores_them(rng):
    from threadpoolctl import ThreadpoolController
    blas_libs = ThreadpoolController().select(user_api="blas")
    if not blas_libs.lib_controllers:
        pytest.skip("NumPy has no BLAS threadpoolctl can see")
    counts = lambda: {lc.get_num_threads() for lc in blas_libs.lib_controllers}  # noqa: E731
    prog = npurun.Executor("cpu", parallelism=1).compile(_graph(rng))
    seen = []

    def spy(fn):
        def run(*a, **k):
            seen.append(counts())
            return fn(*a, **k)
        return run
    prog.steps = [(n, spy(fn) if n.op == "matmul" else fn, attrs, dead) for n, fn, attrs, dead in prog.steps]
    with blas_libs.limit(limits=2):
        prog.run(_feeds(rng, False))
        assert seen == [{1}] and counts() == {2}  # limited for the run, restored after
        # Two runs at once on two threads (of programs with different parallelism): the one
        # still running keeps its count, and the last to leave restores the original.
        seen.clear()
        inside, leave = threading.Event(), threading.Event()
        prog.steps = [(n, spy(fn) if n.op == "matmul" else fn, attrs, dead) for n, fn, attrs, dead in prog.steps]
        first = prog.steps[0]
        prog.steps[0] = (first[0], lambda *a, **k: (inside.set(), leave.wait(10), first[1](*a, **k))[2]) + first[2:]
        other = threading.Thread(target=prog.run, args=(_feeds(rng, False),))
        other.start()
        assert inside.wait(10)
        prog.steps[0] = first
        two = npurun.Executor("cpu", parallelism=2).compile(_graph(rng))
        two.steps = [(n, spy(fn) if n.op == "matmul" else fn, attrs, dead) for n, fn, attrs, dead in two.steps]
        two.run(_feeds(rng, False))
        # a 2-thread program holds BLAS at one thread too (its threads are the C kernels' pool)
        assert seen[-1] == {1 if native.LIB is not None else 2} and counts() == {1}
        leave.set()
        other.join()
        assert counts() == {2}  # restored when the last run left


def test_a_quiet_inline_run_calls_no_boundary_and_is_still_accounted(rng, monkeypatch):
    """Alone on an idle device, no boundary can decide anything: none is called; the task's
    steps and MACs are counted all the same. A waiting task raises the device's attention."""
    g = _graph(rng)
    exe = npurun.Executor("cpu", parallelism=1)
    sched = exe.scheduler
    calls = []
    real = sched._boundary
    monkeypatch.setattr(sched, "_boundary", lambda task, i, label: (calls.append(i), real(task, i, label)))
    before = sched.stats()["steps_done"]
    exe.run_sync(g, _feeds(rng, True))
    assert calls == [] and sched.attention == [False]
    prog = exe.compile(g)
    assert sched.stats()["steps_done"] - before == len(prog.steps)
    assert exe.tasks()[0]["steps_done"] == exe.tasks()[0]["steps_total"] == len(prog.steps)
    sched.pause()
    assert sched.attention == [True]  # (a run started now would look at every boundary)
    sched.resume()


def test_a_blas_loaded_after_the_first_run_is_held_too():
    """scipy ships its own OpenBLAS; imported after a first run (so after the libraries were
    first looked up), its threads are held to the run's count as well. In a child: which
    libraries a process has loaded is the test."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import numpy as np
        from threadpoolctl import ThreadpoolController
        from npurun.backends.cpu import blas
        blas.with_threads(1, lambda: None)  # the first run: numpy's OpenBLAS only
        import scipy.linalg  # noqa: F401 -- a second OpenBLAS arrives
        libs = ThreadpoolController().select(user_api="blas").lib_controllers
        assert len(libs) >= 2, [lc.filepath for lc in libs]
        with ThreadpoolController().limit(limits=2, user_api="blas"):
            seen = blas.with_threads(1, lambda: sorted(lc.get_num_threads() for lc in libs))
            after = sorted(lc.get_num_threads() for lc in libs)
        print(seen, after)
        assert set(seen) == {1} and set(after) == {2}, (seen, after)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_periodic_stream_of_its_own_level_keeps_an_inline_run_quiet(rng, monkeypatch):
    """run_sync in a loop is a periodic stream of its own: no stream of a better level exists,
    so nothing can hold it and its runs call no boundary (they cost ~10 us a step); a run of a
    worse level than the stream's may be held, so it calls them."""
    g = _graph(rng)
    exe = npurun.Executor("cpu", parallelism=1)
    sched = exe.scheduler
    assert sched.admission is not None
    from npurun.runtime.admission import Admission
    monkeypatch.setattr(sched, "admission", Admission())  # (the device's scheduler is shared: no other test's streams)
    calls = []
    real = sched._boundary
    monkeypatch.setattr(sched, "_boundary", lambda task, i, label: (calls.append(i), real(task, i, label)))
    feeds = _feeds(rng, True)
    now = [sched.clock()]  # (a fake clock from the real one's now: state other tests left stays in the past)
    monkeypatch.setattr(sched, "clock", lambda: now[0])
    exe.run_sync(g, feeds, priority=2)  # (a run on an idle device leaves its attention down)
    calls.clear()
    for _ in range(8):  # regular arrivals, 5 ms apart
        now[0] += 0.005
        exe.run_sync(g, feeds, priority=2)
    sched.stats()  # (quiet runs are accounted when the scheduler's lock is next taken)
    assert sched.admission.streams["main"].period == pytest.approx(0.005) and calls == []
    now[0] += 0.005
    exe.run_sync(g, feeds, priority=3)  # a worse level: the priority-2 stream may hold it
    assert calls
