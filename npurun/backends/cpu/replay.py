"""Recorded runs: a short program's kernel calls made once, then replayed in one C call a run.

A small model's run is mostly Python: a 10-node LeNet spends ~140 us of its ~190 us (2 threads
of a 2-core VM, hot; ~330 of ~540 after an idle gap) in the step loop and the kernels' Python
glue (shapes, plans, allocation, ctypes), against ~3-5 us of arithmetic a node. ONNX Runtime's
whole run is ~75 us. What a run does, though, is the same every time for one input signature:
the same kernels, with the same arguments, on buffers that could be the same. So, as CUDA
graphs do for GPU launches, a program whose run is short records one run's calls and replays
them:

1. **Warm-up.** A signature (input names, dtypes, shapes) runs normally WARM times, so every
   per-shape choice has been made (convtune's measurements, plans, packed weights), then once
   with the kernels a replay takes (native.CALLS), their own first-call work not recorded. A
   signature whose fastest run took over MAX_SECONDS, or whose values exceed MAX_BYTES, is
   never recorded.
2. **Recording.** One run on private copies of the inputs, as a flat trace (`_walk`: an `if`
   whose branch brings only new names becomes a guard, the branch's steps and aliases), with
   no value let go, while the library's entry points note every call: a ctypes call through
   `errcheck` (set on each of native.LIB's functions for the run), a bound call
   (csrc/py/addr.c) by the module itself, which also keeps every array whose address is taken
   (`addr`), so the addresses in the calls stay valid. Each entry is then **c** (it made calls:
   they become bound records), a **view** (no calls, outputs inside its inputs' memory),
   **const** (deterministic, on constants and shapes alone), a **guard**, or **py** (anything
   else: its kernel runs again at replay and its outputs are copied into the recorded buffers,
   which later calls read).
3. **Checking.** What a step does outside its recorded calls (NumPy arithmetic, a copy, a
   scale read from the data) is not replayed. So the recording is checked: with the inputs
   perturbed (float values with noise around them; ids and other whole numbers shuffled), a
   normal run and a replay must give every value of the program bit for bit. The first step
   whose values differ runs as Python from then on and the check is repeated; twice, with two
   perturbations that take the recorded branches (up to PATH_TRIES are drawn; if fewer take
   them, the `if` they leave is recorded again as one Python step). An input no shuffle changes (a sample rate, a mask of ones, not float) is
   required equal to the recorded one instead (otherwise the run is a normal one). Runs that
   write into their inputs or constants are not recorded.
4. **Kept if faster** (`_slower`): alternating normal runs and replays, medians.
5. **Replay.** Inputs copied into the recorded buffers, the C segments each one
   `_addr.replay` (the GIL let go once), Python steps and guards in between, the scheduler's
   boundary between segments where its attention flag is up, outputs copied out (a caller may
   keep or write what it gets).
6. **Other ways through the model.** A replay whose guard finds the other branch taken stops
   there; the run goes on as a replay of the signature's recording of that way, made the
   first time a run takes it (up to PATHS recordings a signature). openWakeWord's models run a
   verifier MLP only when the first one fires: both ways are replays.

A recording holds every value of the run at once (no buffer reused). Runs with a progress
callback (a profile, a scheduler boundary that must decide at every step) and programs whose
steps were wrapped (profiling, calibration) run normally; NPURUN_REPLAY=0 turns replays off.
Two threads running one program at once: one replays, the other runs normally (the recorded
buffers are one set).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
import zlib

import numpy as np

from ...errors import NpurunError
from ..base import _ALIAS, _CALL, _IF, _REGIONS
from . import blas, native

WARM = 2  # normal runs of a signature before it is recorded
MAX_SECONDS = 20e-3  # a signature whose fastest warm-up run took longer is never recorded
MAX_BYTES = 32 << 20  # values and kept arrays of a recording
MAX_SIGNATURES = 8  # per program
PIECE_SECONDS = 1e-3  # recorded time of a segment, between two of which the scheduler may switch tasks
CHECKS = 2  # perturbed inputs a recording must replay bit for bit
PATH_TRIES = 6  # perturbations tried to find CHECKS that take the recorded branches
PATHS = 4  # recordings per signature: one per way through its data-dependent ifs

try:
    from ._addr import record as _record_calls, replay as _replay, bind as _bind
except ImportError:  # pragma: no cover -- built everywhere setup.py builds; bound calls need x86-64 SysV
    _record_calls = _replay = _bind = None

_RECORDING = threading.Lock()  # one recording at a time in the process (the hooks are global)
_INTS = {ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_uint, ctypes.c_size_t, ctypes.c_ulong}
_SKIP = {"npr_fp_enter", "npr_fp_leave"}  # the run's floating-point mode, set around every run


def enabled() -> bool:
    return native.LIB is not None and _replay is not None and os.environ.get("NPURUN_REPLAY", "1") != "0"


class _Signature:
    __slots__ = ("times", "recording", "others", "tried", "never")

    def __init__(self):
        self.times: list = []
        self.recording: Recording | None = None
        self.others: list = []  # recordings of the other ways through data-dependent ifs
        self.tried = 0  # recordings of other ways tried (kept or not)
        self.never = ""  # why this signature is not replayed


class Replays:
    """The recordings of one CpuProgram, per input signature (see the module docstring)."""

    def __init__(self, program):
        self.program = program
        self.signatures: dict = {}
        self.lock = threading.Lock()

    def run(self, feeds: dict, progress=None, attention=None):
        """The run's outputs by replay (or by the runs that warm up and record it); None where
        this run must be a normal one (the caller runs it)."""
        program = self.program
        feeds = program._check(feeds)
        try:
            sig = tuple([(k, a.dtype, a.shape) for k, a in feeds.items()])
        except AttributeError:
            return None
        s = self.signatures.get(sig)
        if s is None:
            if len(self.signatures) >= MAX_SIGNATURES:
                return None
            s = self.signatures[sig] = _Signature()
        if s.never:
            return None
        if not self.lock.acquire(blocking=False):
            return None
        try:
            rec = s.recording
            if rec is not None:
                if rec.outer is not program._plan_steps():
                    s.recording, s.others, s.never = None, [], "the program's steps were replaced"
                    return None
                out = rec.run(feeds, progress, attention)
                if out is None and rec.failed:
                    s.recording, s.others, s.never = None, [], rec.failed
                if out is None and rec.diverged:
                    return self._other_path(s, feeds, progress, attention)
                return out
            if len(s.times) < WARM:
                t0 = time.perf_counter()
                out = program._run(feeds, progress, attention)
                s.times.append(time.perf_counter() - t0)
                return out
            if min(s.times) > MAX_SECONDS:
                s.never = f"runs of {1e3 * min(s.times):.1f} ms (recorded below {1e3 * MAX_SECONDS:.0f} ms)"
                return None
            size = _values_bytes(program.graph)
            if size > MAX_BYTES:  # (known before recording where the graph's shapes are)
                s.never = f"its values take {size >> 20} MB (recorded up to {MAX_BYTES >> 20} MB)"
                return None
            if len(s.times) == WARM:  # one run with the kernels a replay will take: their own
                s.times.append(0.0)   # first-call work (a measured choice, a packing) not recorded
                program._cheap, cheap = True, program._cheap
                try:
                    return program._run(feeds, progress, attention)
                finally:
                    program._cheap = cheap
            recorded = self._record(feeds, attention)
            if recorded is None:
                return None
            out, s.recording, s.never = recorded
            if s.never == _STOPPED:
                s.never = ""
            return out
        finally:
            self.lock.release()

    def _record(self, feeds, attention):
        """(outputs, recording or None, why not) of recording this run (a normal run, checked
        and timed: kept only if faster); None if it cannot be recorded now (a better task
        waiting, another recording under way)."""
        program = self.program
        if (attention is not None and attention[0]) or not _RECORDING.acquire(blocking=False):
            return None
        # A recording and its checks run a few normal runs and replays with no boundary: a
        # better task arriving meanwhile (the scheduler's flag) ends it, to be tried again.
        stop = (lambda: False) if attention is None else (lambda: attention[0])
        program._cheap = True  # (the recording and its checks pick the kernels replays will run)
        try:
            out, rec, why = record(program, feeds, stop)
            if rec is not None:
                why = _slower(program, rec, feeds, stop)
                rec = None if why else rec
            return out, rec, why
        finally:
            _RECORDING.release()
            program._cheap = any(x.recording is not None for x in self.signatures.values())

    def _other_path(self, s: _Signature, feeds, progress, attention):
        """A run whose data took another branch than the signature's recording: the recording
        of that way through the model, as a recording of its own (each made when its way is
        first taken; up to PATHS); None (a normal run) where there is none yet and this run
        cannot record it. A replay that reaches its guard's other branch stops there, so a run
        may replay the steps before the if more than once."""
        for i, rec in enumerate(s.others):
            out = rec.run(feeds, progress, attention)
            if out is not None:
                if i:  # (the way taken last is tried first next time)
                    s.others.insert(0, s.others.pop(i))
                return out
            if rec.failed:
                s.others.remove(rec)
                return None
        if s.tried + 1 >= PATHS:
            return None
        recorded = self._record(feeds, attention)
        if recorded is None:
            return None
        out, rec, why = recorded
        if why != _STOPPED:
            s.tried += 1
        if rec is not None:
            s.others.insert(0, rec)
        return out


class Recording:
    """One signature's run as recorded: `env` every value's buffer, `kinds` a class per step
    ("c", "view", "py"), `calls` each step's bound records."""

    def __init__(self, program, outer, plan, done, env, calls, kinds, exact, taken, times):
        self.program = program
        self.outer = outer  # the program's plan when recorded (a replaced one: not replayed)
        self.plan = plan  # the run as a flat trace (_walk): `if`s as a guard and their branch's steps
        self.done = done  # per trace entry: the program's steps done after it
        self.env = env
        env[""] = None  # an omitted optional input reads as None
        self.calls = calls
        self.kinds = kinds
        self.taken = taken  # arrays whose addresses the records hold
        self.times = times  # each step's time in the recording run
        self.inputs = [(nm, env[nm]) for nm in program.graph.inputs if nm not in exact]
        self.exact = [(nm, exact[nm]) for nm in program.graph.inputs if nm in exact]
        self.outputs = list(program.graph.outputs)
        self.failed = ""
        self.diverged = False  # the last replay reached a guard whose condition took the other branch
        self.speedup = 1.0  # normal run / replay, as measured when recorded
        self.whole: frozenset = frozenset()  # labels of the ifs recorded as one step
        self.data_if = ""  # an if the check found taking another branch
        self.segments: list = []
        self.blas = False
        self.build()

    def build(self):
        """The replay's segments from `kinds`: ("c", records, labels, steps done, label) for a run
        of C and view entries of about PIECE_SECONDS (as recorded) at most, ("py", trace entry,
        steps done, label) for a Python step, ("if", condition, branch, index) for a guard (a
        replay whose condition picks the other branch stops there: a normal run follows)."""
        segs, blob, where, spent = [], [], [], 0.0

        def cut(end):
            nonlocal blob, where, spent
            if blob:
                segs.append(("c", b"".join(blob), where, self.done[end - 1], self.plan[end - 1][7]))
            blob, where, spent = [], [], 0.0
        for i, (entry, kind) in enumerate(zip(self.plan, self.kinds)):
            if kind == "c":
                blob += self.calls[i]
                where += [entry[7]] * len(self.calls[i])
                spent += self.times[i]
                if spent >= PIECE_SECONDS:
                    cut(i + 1)
            elif kind == "py":
                cut(i)
                segs.append(("py", entry, self.done[i], entry[7]))
            elif kind == "guard":
                cut(i)
                segs.append(("if", entry[2][0], entry[6], i))
            else:
                spent += self.times[i]
        cut(len(self.plan))
        self.segments = segs
        self.blas = "py" in self.kinds

    def summary(self) -> str:
        n = {k: self.kinds.count(k) for k in ("c", "view", "const", "py", "guard")}
        calls = sum(len(self.calls[i]) for i, k in enumerate(self.kinds) if k == "c")
        return (f"{len(self.kinds)} steps: {n['c']} as {calls} C calls, {n['view']} views, {n['const']} "
                f"fixed, {n['py']} in Python, {n['guard']} branches; {len(self.segments)} segments; "
                f"{self.speedup:.1f}x a normal run")

    def run(self, feeds: dict, progress=None, attention=None):
        """Replay with `feeds` (checked by the program): the outputs, or None for a normal run
        (non-float inputs other than the recorded ones, another branch: `diverged`; `failed`
        says so if the replay broke). `progress` is called between segments where attention[0] is set
        (the scheduler's boundary: a better task may go first)."""
        self.diverged = False
        for nm, want in self.exact:
            got = feeds[nm]
            if got is not want and not np.array_equal(got, want):
                return None
        for nm, buf in self.inputs:
            np.copyto(buf, feeds[nm])
        program = self.program
        if len(self.segments) == 1 and self.segments[0][0] == "c":  # (one piece, all C)
            bad, rc = _replay(self.segments[0][1], program._flush)
            if bad >= 0:
                self.failed = f"a replay failed ({self.segments[0][2][bad]}: its kernel returned {rc})"
                return None
            env = self.env
            return {nm: _copy_out(env[nm]) for nm in self.outputs}
        segments = lambda: self._segments(progress, attention)  # noqa: E731
        run = segments if not self.blas else (lambda: blas.with_threads(1, segments))
        cheap = native.CALLS.cheap
        native.CALLS.cheap = True  # (Python steps pick the kernels they picked when recorded)
        try:
            if program._flush:
                old = native.LIB.npr_fp_enter()
                try:
                    run()
                finally:
                    native.LIB.npr_fp_leave(old)
            else:
                run()
        except _Boundary as e:  # (the scheduler's: a timeout, a cancellation)
            raise e.args[0] from None
        except _Diverged:
            self.diverged = True
            return None
        except Exception as e:  # noqa: BLE001 -- the normal run that follows names any real error
            self.failed = f"a replay failed ({type(e).__name__}: {e})"
            return None
        finally:
            native.CALLS.cheap = cheap
        env = self.env
        return {nm: _copy_out(env[nm]) for nm in self.outputs}

    def _segments(self, progress, attention):
        env = self.env
        total = len(self.outer)
        for seg in self.segments:
            tag = seg[0]
            if tag == "c":
                bad, rc = _replay(seg[1], False)  # (the run's mode is set around all segments)
                if bad >= 0:
                    raise NpurunError(f"{seg[2][bad]}: its kernel returned {rc}")
            elif tag == "if":
                if _truth(env[seg[1]]) != seg[2]:
                    raise _Diverged
                continue
            else:
                self._python(seg[1])
            if progress is not None and attention is not None and attention[0]:
                try:
                    progress(seg[-2], total, seg[-1])
                except BaseException as e:
                    raise _Boundary(e) from None

    def _python(self, entry):
        env = self.env
        for nm, arr in zip(entry[3], _results(entry, env)):
            if nm:
                buf = env[nm]
                if type(buf) is np.ndarray:  # (later calls may read its address)
                    np.copyto(buf, arr, casting="no")
                else:
                    env[nm] = arr


def _results(entry, env) -> tuple:
    """What one plan entry's kernel gives on the values of `env` (as Program._execute runs it)."""
    kind, fn, ins, outs, attrs, dead, subs, label = entry
    if kind == _CALL:
        res = fn(*map(env.__getitem__, ins), **attrs)
    elif kind == _IF:
        res = tuple(subs["then_branch" if _truth(env[ins[0]]) else "else_branch"].call([], env, None, None))
    elif kind == _REGIONS:
        regions = {k: (lambda xs, p=p: p.call(xs, env, None, None)) for k, p in subs.items()}
        res = fn(*map(env.__getitem__, ins), **attrs, _regions=regions)
    else:  # _ALIAS
        res = env[ins[0]]
    return res if isinstance(res, tuple) else (res,)


_GUARD = -1  # a trace entry (_GUARD, None, (condition,), (), {}, (), branch taken, label)


def _walk(program, feeds: dict, mark, whole: frozenset = frozenset()) -> tuple:
    """(env, trace, done): a normal run of `program` (every value kept) as a flat trace. Each
    `if` whose chosen branch brings only new names becomes a guard on its condition, then the
    branch's own entries (recursively), then aliases from the branch's outputs to the if's: the
    branch's steps are recorded one by one, not as one Python step. `mark()` after each entry
    (a recording's boundary between entries); the ifs labelled in `whole` stay one step. Run
    inside the program's run mode (_within)."""
    env = dict(program.consts)
    env.update(program._check(feeds))
    env[""] = None
    trace, done, ops = [], [], []
    consts = set(program.consts)
    _walk_plan(program, program._plan_steps(), env, trace, done, ops, consts, mark, None, whole)
    return env, trace, done, ops, consts


def _walk_plan(prog, plan, env, trace, done, ops, consts, mark, at, whole):
    for j, entry in enumerate(plan):
        op = prog.steps[j][0].op
        here = j if at is None else at  # (the program's step this entry belongs to)
        after = j + 1 if at is None else at
        kind, fn, ins, outs, attrs, dead, subs, label = entry
        if kind == _IF:
            truth = _truth(env[ins[0]])
            branch = subs["then_branch" if truth else "else_branch"]
            if label not in whole and _inlinable(branch, outs, env):
                trace.append((_GUARD, None, ins, (), {}, (), truth, label))
                done.append(here)
                ops.append("if")
                mark()
                env.update(branch.consts)
                consts.update(branch.consts)
                _walk_plan(branch, branch._plan_steps(), env, trace, done, ops, consts, mark, here, whole)
                for o, bo in zip(outs, branch.graph.outputs):
                    if o:
                        env[o] = env[bo]
                        trace.append((_ALIAS, None, (bo,), (o,), {}, (), None, label))
                        done.append(after)
                        ops.append("identity")
                        mark()
                continue
        try:
            res = _results(entry, env)
        except NpurunError:
            raise
        except Exception as e:  # (named as Program._execute names a kernel's failure)
            raise NpurunError(f"{prog.graph.source}: {label} failed: {type(e).__name__}: {e}") from e
        for nm, arr in zip(outs, res):
            if nm:
                env[nm] = arr
        trace.append(entry)
        done.append(after)
        ops.append(op)
        mark()


def _inlinable(branch, outs, env) -> bool:
    """Whether a branch's steps can run in the enclosing run's namespace: no inputs, an output per
    output of the if, and none of its names already there (a constant copied in from outside, the
    same array, excepted)."""
    if branch.graph.inputs or len(branch.graph.outputs) != len(outs):
        return False
    for nm, a in branch.consts.items():
        if nm in env and not (env[nm] is a or (isinstance(a, np.ndarray) and _same(a, env[nm]))):
            return False
    return not any(o in env for e in branch._plan_steps() for o in e[3] if o)


class _Diverged(Exception):
    """A replay reached an `if` whose condition now picks the other branch."""


class _Boundary(Exception):
    """What the scheduler's boundary raised (a timeout, a cancellation), carried out unchanged."""


def _copy_out(v):
    """An output as a caller gets it, a copy where it is an array (the recorded buffers are
    written again by the next replay); a sequence's arrays copied, anything else as it is."""
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_copy_out(a) for a in v)
    return v


def _truth(c) -> bool:
    return bool(np.asarray(c).reshape(-1)[0])


_STOPPED = "stopped for a better task"


def record(program, feeds: dict, stop=lambda: False):
    """(outputs of a normal run, Recording or None, why not): the recording of this run, checked.
    An `if` whose branch the check finds depending on the data is recorded again as one Python
    step (its branch then runs normally at replay, whichever it is)."""
    whole: set = set()
    while True:
        out, rec, why = _record(program, feeds, frozenset(whole), stop)
        label = rec.data_if if rec is not None and why else ""
        if not label or label in whole or len(whole) >= 4:
            return out, (None if why else rec), why
        whole.add(label)


def _record(program, feeds: dict, whole: frozenset, stop):
    own = {k: np.array(a, copy=True) for k, a in feeds.items()}
    calls: list = []
    taken: list = []
    tid = threading.get_ident()

    def errcheck(result, func, args):
        if threading.get_ident() == tid:
            calls.append((func, args))
        return result

    times: list = []

    def mark():
        calls.append(len(times))  # (an int: a boundary between entries in the calls' order)
        times.append(time.perf_counter())

    # (not the calls that only ask a constant, such as a kernel's tile rows: they take no arguments)
    fns = [f for f in (getattr(native.LIB, nm) for nm in native.entry_points() if nm not in _SKIP) if f.argtypes]
    for f in fns:
        f.errcheck = errcheck
    _record_calls(taken, calls)
    times.append(time.perf_counter())
    try:
        env, trace, done, ops, consts = program._within(lambda: _walk(program, own, mark, whole))
    finally:
        _record_calls(None, None)
        for f in fns:
            del f.errcheck
    out = {nm: _copy_out(env[nm]) for nm in program.graph.outputs}
    for k, a in feeds.items():  # a kernel that wrote into its input wrote into the copy: passed on
        if a.flags.writeable and not _same(a, own[k]):  # (such a run is then not replayed: _check)
            np.copyto(a, own[k])
    try:
        rec = _classify(program, trace, done, ops, consts, own, env, calls, taken, tid,
                        [b - a for a, b in zip(times, times[1:])])
        rec.whole = whole
        why = _check(rec, own, stop)
    except _NotReplayable as e:
        return out, None, str(e)
    except Exception as e:  # noqa: BLE001 -- this run's outputs stand; the program just runs normally
        return out, None, f"recording failed ({type(e).__name__}: {e})"
    return out, rec, why


TIMINGS = 3  # rounds of a normal run and a replay, alternating, before a recording is kept
KEEP = 0.95  # ... if its replays' median is below this share of the normal runs' (a gain beyond noise)


def _slower(program, rec, feeds, stop=lambda: False) -> str:
    """'' if replays of `rec` take less than KEEP of normal runs' time (medians of TIMINGS rounds,
    alternating, on the recorded inputs); else why the recording is dropped. A replay whose
    steps are mostly Python (a data-dependent branch holding the model) is no faster, and the
    library's calls that replace NumPy's small-size paths there cost what they save."""
    normal, replayed = [], []
    for _ in range(TIMINGS):
        if stop():
            return _STOPPED
        program._cheap = False
        t0 = time.perf_counter()
        program._run(feeds, None, None)
        normal.append(time.perf_counter() - t0)
        program._cheap = True
        t0 = time.perf_counter()
        if rec.run(feeds) is None:
            return rec.failed or "a replay was refused"
        replayed.append(time.perf_counter() - t0)
    a, b = sorted(replayed)[TIMINGS // 2], sorted(normal)[TIMINGS // 2]
    rec.speedup = b / a
    if a >= KEEP * b:
        return f"replays took {1e6 * a:.0f} us against {1e6 * b:.0f} us for normal runs"
    return ""


def _values_bytes(graph) -> int:
    """The bytes of the graph's computed values where their shapes are known (0 for the rest)."""
    total = 0
    for v in graph.values.values():
        if not v.is_const and v.kind == "tensor":
            try:
                total += v.nbytes or 0
            except Exception:  # noqa: BLE001 -- a dtype with no fixed size: counted when recorded
                pass
    return total


class _NotReplayable(Exception):
    pass


SHAPE_ONLY = {"shape", "size"}  # ops whose output depends only on their input's shape


def _classify(program, plan, done, ops, consts, own, env, calls, taken, tid, times) -> Recording:
    per_step: list = [[]]
    for c in calls:
        if isinstance(c, int):
            per_step.append([])
        else:
            per_step[-1].append(c)
    per_step = per_step[:len(plan)]
    kinds, recs = [], []
    # Values the same in every run of this signature: constants, shapes (fixed by the signature)
    # and what deterministic steps make of only those (a shape chain: Shape -> Gather -> Equal
    # -> an if's condition). Their steps are not replayed ("const"): their recorded values
    # stand. (Nothing computed from an input's values: a replay is never a stored answer.)
    fixed = set(consts) | {""}
    for entry, made, op in zip(plan, per_step, ops):
        kind, fn, ins, outs = entry[:4]
        records = None if kind in (_REGIONS, _IF, _GUARD) else _records(made, tid)
        if kind not in (_GUARD, _REGIONS) and "random" not in _groups(op) and (
                op in SHAPE_ONLY or all(nm in fixed for nm in ins)):
            fixed.update(nm for nm in outs if nm)
            kinds.append("const")
        elif kind == _GUARD:
            kinds.append("guard")
        elif records:
            kinds.append("c")
        elif kind == _ALIAS or (records is not None and _views(env, ins, outs)):
            kinds.append("view")
        else:
            kinds.append("py")
        recs.append(records or [])
    consts = {id(a) for a in program.consts.values()}
    seen, size = set(), 0
    for a in list(env.values()) + taken:
        if isinstance(a, np.ndarray) and id(a) not in consts:
            base = a if a.base is None else a.base
            if id(base) not in seen and id(base) not in consts:
                seen.add(id(base))
                size += getattr(base, "nbytes", a.nbytes)
    if size > MAX_BYTES:
        raise _NotReplayable(f"its values take {size >> 20} MB (recorded up to {MAX_BYTES >> 20} MB)")
    exact = {k: np.array(a, copy=True) for k, a in own.items() if a.dtype.kind not in "fc" and _constant(a)}
    keep = list({id(a): a for a in taken if a is not None}.values())
    return Recording(program, program._plan_steps(), plan, done, env, recs, kinds, exact, keep, times)


def _groups(op: str) -> frozenset:
    from ...ir.ops import OPS
    spec = OPS.get(op)
    return spec.groups if spec is not None else frozenset({"random"})  # (unknown: not assumed pure)


def _records(made: list, tid: int) -> list | None:
    """A step's calls as bound records; None if one of them cannot be bound (the step then
    runs as Python), [] if it made none."""
    out = []
    for c in made:
        if len(c) == 2 and isinstance(c[0], bytes):  # a bound call, recorded by _addr
            if c[1] != tid:
                continue
            out.append(c[0])
            continue
        func, args = c
        types = func.argtypes or ()
        if len(types) != len(args):
            return None
        ints, floats = [], []
        for t, v in zip(types, args):
            if t is ctypes.c_float:
                floats.append(float(v))
            elif t in _INTS and (v is None or isinstance(v, (int, np.integer))):
                ints.append(0 if v is None else int(v))
            else:
                return None
        if len(ints) > 32 or len(floats) > 8:
            return None
        addr = ctypes.cast(func, ctypes.c_void_p).value
        out.append(_bind(addr, tuple(ints), tuple(floats), -1, -1, func.restype is ctypes.c_int))
    return out


def _views(env: dict, ins, outs) -> bool:
    """Is every output of a step that made no call a view into one of its inputs' memory?"""
    arrays = [env.get(nm) for nm in ins if nm]
    arrays = [a for a in arrays if isinstance(a, np.ndarray)]
    for nm in outs:
        o = env.get(nm) if nm else None
        if o is None:
            continue
        if not any(np.may_share_memory(o, a) for a in arrays):
            return False
    return True


def _perturbed(feeds: dict, exact: set, rng) -> dict:
    """Other inputs of the same kinds: float values with noise around them, except values that
    are all whole numbers (ids or counts in a float tensor: Keras embeddings), which are shuffled,
    as other dtypes' values are (the same values, valid as before); `exact` inputs (a dtype other
    than float whose values are all one: a sample rate, a mask of ones) as they are."""
    out = {}
    for k, a in feeds.items():
        if not a.size or k in exact:
            out[k] = a
        elif a.dtype.kind not in "fc" or (np.all(np.isfinite(a)) and np.all(a == np.round(a)) and not _constant(a)):
            out[k] = rng.permutation(a.reshape(-1)).reshape(a.shape)
        else:
            scale = float(np.std(a.astype(np.float64))) or 1.0
            out[k] = (a + rng.standard_normal(a.shape) * (0.5 * scale)).astype(a.dtype)
    return out


def _constant(a) -> bool:
    """Whether every value of `a` is the same (a shuffle would change nothing)."""
    flat = a.reshape(-1)
    return flat.size <= 1 or bool(np.all(flat == flat[0]))


def _same(a, b) -> bool:
    if not isinstance(a, (np.ndarray, np.generic)) or not isinstance(b, (np.ndarray, np.generic)):
        return type(a) is type(b) and (a is b or _same_seq(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_seq(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _check(rec: Recording, feeds: dict, stop=lambda: False) -> str:
    """'' if `rec` replays bit for bit what normal runs give on perturbed inputs (steps that
    do not are made Python steps on the way); else why not."""
    if not rec.inputs and not rec.exact:
        return "the program has no inputs"
    rng = np.random.default_rng(0x5EED)
    program = rec.program
    consts = _digest(program.consts)
    if consts is None:
        return f"its constants are over {MAX_CONST_BYTES >> 20} MB (not checked for writes)"
    checked, other_way = 0, ""
    for _ in range(PATH_TRIES):
        if checked == CHECKS:
            break
        if stop():
            return _STOPPED
        pert = _perturbed(feeds, {nm for nm, _ in rec.exact}, rng)
        sent = {k: np.array(a, copy=True) for k, a in pert.items()}
        try:
            want, trace = program._within(lambda: _walk(program, pert, lambda: None, rec.whole))[:2]
        except Exception as e:  # noqa: BLE001 -- inputs the model rejects: no recording
            return f"a normal run on perturbed inputs failed ({type(e).__name__}: {str(e)[-120:]})"
        got = [e for e in trace if e[0] == _GUARD]
        way = next((b[7] for a, b in zip(got, [e for e in rec.plan if e[0] == _GUARD])
                    if a[2] != b[2] or a[6] != b[6]), "")
        if way:  # another way through the model: a replay stops at that guard (not checkable here)
            other_way = other_way or way
            continue
        checked += 1
        if len(trace) != len(rec.plan):
            return "the run's steps depend on the data"
        # A kernel that writes into its operands (a cache updated in place) writes, in a
        # replay, into the recorded copies: the caller's arrays would not change.
        if not all(_same(sent[k], pert[k]) for k in sent):
            return "a run writes into its inputs"
        for _ in range(len(rec.plan) + 1):
            if rec.run(pert) is None:
                return rec.failed or "a replay was refused"
            bad = next((i for i, e in enumerate(rec.plan)
                        if not all(_same(want.get(nm), rec.env.get(nm)) for nm in e[3] if nm)), None)
            if bad is None:
                break
            if rec.kinds[bad] == "py":
                return f"{rec.plan[bad][7]} differs between runs of its own kernel"
            rec.kinds[bad] = "py"
            rec.build()
    if checked < CHECKS:  # (the perturbations kept taking another branch)
        rec.data_if = other_way
        return f"{other_way}: its branch depends on the data"
    if _digest(program.consts) != consts:
        return "a run writes into its constants"
    return ""


MAX_CONST_BYTES = 256 << 20  # constants of a program that is recorded (hashed before and after its checks)


def _digest(consts: dict):
    """CRC-32 and Adler-32 of every constant's bytes: a check that a run wrote into its
    constants, not a defence against anyone (zlib, already loaded; hashlib would load OpenSSL's
    libcrypto, 3.5 MB of every process's RSS)."""
    crc, adler = 0, 1
    total = 0
    for nm in sorted(consts):
        a = consts[nm]
        if isinstance(a, np.ndarray) and 0 not in a.strides:  # (not a let-go weight's stand-in)
            total += a.nbytes
            if total > MAX_CONST_BYTES:
                return None
            b = np.ascontiguousarray(a).view(np.uint8).reshape(-1) if a.size else b""
            crc, adler = zlib.crc32(b, crc), zlib.adler32(b, adler)
    return crc, adler
