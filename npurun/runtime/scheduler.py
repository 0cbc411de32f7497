"""The multi-task scheduler of one device: priorities, slices, round-robin, aging, timeouts.

A *task* is one run of a compiled Program. It is cut into *slices* at node boundaries: the
Program calls back after every step (its `progress` callback), and there the task either
keeps its compute unit or gives it up and waits until the scheduler hands one back. So a
node is never interrupted; a slice is one or more whole nodes.

Rules, evaluated at every submission, slice boundary and completion:

- **Priorities** 0 (highest) .. 3. A task's *effective* priority while it waits is its
  priority minus one level per `aging` seconds waited (never below 0); while it runs it keeps
  the level it was dispatched at.
- **Dispatch.** A free compute unit takes the waiting task with the best effective priority,
  oldest first. A waiting task is not started beside a running task of a strictly better
  level: lower priorities never share the device with higher ones (they would steal the
  kernel threads the higher task uses).
- **Preemption.** At its next slice boundary a running task gives up its unit when a task of
  a strictly better level waits or runs.
- **Round-robin, fair share.** A task that has held its unit for `quantum` seconds gives it
  up at the next boundary when a task of the same level is waiting whose group (default: the
  model's name) has had no more device time than its own. Among equals, the group with the
  least device time goes first, so a stream of short runs and one long run share evenly
  even when their nodes differ in length.
- **Aging bound.** A task of priority p that waits reaches level 0 after p*aging seconds; from
  then on only tasks that were already waiting at level 0 before it are served first, each
  for at most one quantum plus one node. So its wait for a slice is at most
  p*aging + K*(quantum + longest node)/lanes, K being those tasks (see docs/scheduler.md).
- **Timeouts and cancellation** act at once on a waiting task and at the next slice
  boundary on a running one. The task's intermediate values live only in the frames of its
  run; they are released when it stops (frames cleared from the traceback it fails with).
- **Lanes.** A slice occupies `width` compute units at once (on cpu: all of them, since its
  kernels spread over every thread; a backend whose kernels use one unit has width 1), so
  units // width *lanes* run slices side by side.
- **Admission by predicted duration** (runtime/admission.py): beside a periodic stream of a
  better priority, a task does not start a node (or piece) that is predicted to run past the
  stream's next request; it waits for the request instead, at most once per boundary.
- **Duty cycle** (thermal governor): with duty d < 1 a lane that ran a slice of b seconds
  rests b*(1-d)/d seconds before it takes the next one, and slices end after one quantum.
  `active_units` (<= units) limits how many units (so lanes) are used at all.

Time comes from `clock` (time.monotonic by default) so tests drive it with a fake clock.
"""
from __future__ import annotations

import bisect
import collections
import itertools
import queue
import threading
import time
import traceback
from concurrent.futures import Future, InvalidStateError

from ..backends import pieces
from ..errors import NpurunError
from .admission import Admission
from .fairshare import Pace

PRIORITIES = (0, 1, 2, 3)
DEFAULT_PRIORITY = 2

WAITING, RUNNING, DONE = "waiting", "running", "done"
# A new equal-priority task whose group is this far behind in device time takes the unit at
# the next boundary rather than at the end of the running task's quantum (see _owed).
WAKEUP_S = 0.001
# A group whose last task ended longer ago than this rejoins fair share with at most two quanta
# of credit (Scheduler._join_group); sooner, with up to `aging` (a client looping on a model).
AWAY_S = 1.0
# Seconds an idle task thread or the watchdog waits for work before it exits (real time).
IDLE_S = 2.0
# A task that could take a unit, seen within this, makes long nodes run as pieces (pieces.LONG_S).
SPARSE_S = 60.0
# Longest time between two locked step boundaries of a task running alone (Scheduler._boundary).
SYNC_S = 2e-4
# Quiet runs accounted later (Scheduler._catch_up) at most this many at a time.
BACKLOG = 64


class TaskCancelled(NpurunError):
    """The task was cancelled before it finished."""


class TaskTimeout(NpurunError):
    """The task did not finish within its timeout."""


class TaskFuture(Future):
    """A Future whose `cancel()` also stops a task that is running: it resolves as cancelled at
    once and the task leaves the device at its next slice boundary."""

    task: "Task"

    def cancel(self) -> bool:
        ok = super().cancel()
        if ok:
            self.task.scheduler._cancelled(self.task)
        return ok


class _Resolved:
    """Stands for a future nobody waits on: a run_inline task's, and a finished task's (which
    keeps only whether it was cancelled). Keeping the future itself made task <-> future
    (fut.task) a reference cycle, so the outputs the future holds (a generation's KV cache:
    present shares its buffers) lived until the cyclic collector's next full pass; `npurun
    serve` sat ~100 MB above its working set at rest (tests/soak)."""

    __slots__ = ("_cancelled",)

    def __init__(self, cancelled: bool):
        self._cancelled = cancelled

    def cancelled(self) -> bool:
        return self._cancelled


_NO_FUTURE = _Resolved(False)

NOT_IDLE = object()  # run_inline's answer when the device is busy


class Task:
    """One model run: its program and inputs, its place in the queue, and its counters.

    A plain class whose state and counters start as class attributes: a new task writes only
    what differs (its first instance write of a counter shadows the default). A dataclass of
    all these fields cost ~0.5 ms to construct after an idle gap on a 2-core VM (a 45-field
    __init__ growing the instance dict), a third of a streaming small model's run."""
    # state
    state: str = WAITING
    level: int = 0  # effective priority it was dispatched at
    lane: int | None = None
    started: bool = False
    ready_since: float = 0.0
    seq: int = 0  # order of becoming ready, for FIFO among equals
    slice_start: float = 0.0
    step_start: float = 0.0
    wake: bool = False
    # Set once its frames are gone; None for a run_inline task (nobody holds it to wait on).
    finished: threading.Event | None = None
    # counters
    finished_at: float | None = None
    queue_wait: float = 0.0
    max_wait: float = 0.0
    run_time: float = 0.0
    slices: int = 0
    preemptions: int = 0
    # Preemption latency: set when the task becomes ready while every unit is held and one by
    # a worse level (it must wait for a preemption); the wait when it then gets a unit.
    preempt_from: float | None = None
    preempt_wait: float | None = None
    pieces_yielded: int = 0  # times it gave up its unit inside a node (between pieces)
    # Admission (runtime/admission.py): the learned stretch per step of its program (None: off),
    # where the current stretch began and the longest one of the current step so far, and
    # until when it is held (a hold is decided once per boundary: after it, the step runs).
    segs: list | None = None
    seg_start: float = 0.0
    seg_max: float = 0.0
    hold_until: float = 0.0
    held_since: float | None = None
    holds: int = 0
    admitted: bool = False  # admission has decided at its current boundary (hold or run)
    steps_done: int = 0
    macs_done: int = 0
    # Steps and MACs counted at boundaries that skipped the lock (see Scheduler._boundary),
    # added to the device's counters at the next locked one; and when that last one was.
    unsynced_steps: int = 0
    unsynced_macs: int = 0
    synced_at: float = 0.0
    outcome: str = ""  # ok | failed | cancelled | timeout
    error: str = ""
    alone: bool = False  # a quiet run: no other task was live on the device since it arrived

    def __init__(self, id: int, name: str, priority: int, program, feeds: dict | None, scheduler: "Scheduler",
                 future, *, deadline: float | None, timeout: float | None, user_progress, step_macs: list,
                 trace: list | None, owner, group: str, submitted_at: float, steps_total: int):
        self.id, self.name, self.priority, self.program, self.feeds = id, name, priority, program, feeds
        self.scheduler, self.future, self.deadline, self.timeout = scheduler, future, deadline, timeout
        self.user_progress = user_progress
        self.step_macs = step_macs
        self.trace = trace  # (step, node label, lane, t0, t1) per step, when profiling
        self.owner = owner  # the Executor that submitted it
        self.group = group  # fair-share group among equal priorities (default: the name)
        self.submitted_at, self.steps_total = submitted_at, steps_total

    @property
    def macs_total(self) -> int:
        return sum(self.step_macs)

    def retired(self) -> "Task":
        """A copy of this finished task's counters for `Scheduler.recent`, holding no program,
        arrays or future (a snapshot dict a run cost ~1.6 us; this ~0.5)."""
        t = Task.__new__(Task)
        t.__dict__.update(self.__dict__)
        t.program = t.feeds = t.future = t.scheduler = t.owner = t.user_progress = t.trace = t.segs = None
        return t

    def snapshot(self, now: float) -> dict:
        run = self.run_time + (now - self.slice_start if self.state == RUNNING else 0.0)
        wait = self.queue_wait + (now - self.ready_since if self.state == WAITING else 0.0)
        return {"id": self.id, "name": self.name, "priority": self.priority, "state": self.state,
                "outcome": self.outcome, "error": self.error, "lane": self.lane,
                "steps_done": self.steps_done, "steps_total": self.steps_total,
                "macs_done": self.macs_done, "macs_total": self.macs_total,
                "run_s": run, "queue_wait_s": wait, "max_wait_s": max(self.max_wait, wait if self.state == WAITING else 0.0),
                "slices": self.slices, "preemptions": self.preemptions,
                "preempt_wait_s": self.preempt_wait, "pieces_yielded": self.pieces_yielded,
                "admission_holds": self.holds,
                "macs_per_s": self.macs_done / run if run > 0 else 0.0,
                "age_s": (self.finished_at or now) - self.submitted_at}


class _Accounting(threading.Condition):
    """The scheduler's lock and condition. Entering it accounts first the quiet runs whose
    bookkeeping was deferred (Scheduler._catch_up), so every decision taken under it sees them;
    the quiet path itself and the watchdog take the bare lock (`Scheduler._lock`)."""

    def __init__(self, scheduler: "Scheduler"):
        super().__init__(threading.Lock())
        self._scheduler = scheduler

    def __enter__(self):
        super().__enter__()
        s = self._scheduler
        if s._quiet is not None or s._backlog:
            try:
                s._catch_up()
            except BaseException:
                self.release()
                raise
        return True


class LatencyHistogram:
    """Preemption latencies: cumulative Prometheus-style buckets, and the last RECENT values for
    percentiles (what `npurun top` and stats() show)."""
    BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
    RECENT = 1024

    def __init__(self):
        self.counts = [0] * (len(self.BUCKETS) + 1)  # the last: above every bucket
        self.count, self.sum = 0, 0.0
        self.recent: collections.deque = collections.deque(maxlen=self.RECENT)

    def add(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.BUCKETS, v)] += 1
        self.count += 1
        self.sum += v
        self.recent.append(v)

    def summary(self) -> dict:
        r = sorted(self.recent)

        def pct(q):
            return r[min(len(r) - 1, int(q * len(r)))] if r else None
        return {"count": self.count, "sum_s": self.sum, "p50_s": pct(0.5), "p99_s": pct(0.99),
                "max_s": r[-1] if r else None,
                "buckets": list(zip(self.BUCKETS, itertools.accumulate(self.counts[:-1])))}


class Scheduler:
    """Runs tasks on `units` compute units of one device, `width` units per slice. Shared by
    every Executor of the device; thread-safe. Each started task runs in a thread of its own
    (its run's frames live there between slices): a task thread, or the caller's for an
    inline run (`run_inline`, `submit(inline=True)`). Each active lane is held by at most
    one task at a time."""

    def __init__(self, units: int, quantum: float = 0.010, aging: float = 0.200,
                 clock=time.monotonic, name: str = "device", width: int = 1, admission: bool = True,
                 fair_progress: bool = True):
        if not isinstance(units, int) or units < 1:
            raise NpurunError(f"a device needs at least one compute unit, got {units!r}")
        if quantum <= 0 or aging <= 0:
            raise NpurunError(f"quantum and aging must be positive, got {quantum!r} and {aging!r}")
        self.name = name
        self.units = units
        self.width = max(1, min(units, int(width)))
        self.lanes = units // self.width
        self.active_lanes = self.lanes
        self.quantum = quantum
        self.aging = aging
        self.duty = 1.0
        # Raised when a boundary could decide something (a task waits, a pause, the governor);
        # lowered when the device is idle again. Inline runs look at it before each boundary.
        self.attention = [False]
        self.clock = clock
        self._quiet: Task | None = None  # a quiet run in flight (run_inline), not yet accounted
        self._backlog: list[Task] = []  # quiet runs finished, not yet accounted (oldest first)
        self._cv = _Accounting(self)
        self._lock = self._cv._lock
        # The watchdog sleeps on its own condition (same lock): it polls every <= 50 ms, so the
        # notify_all of every slice boundary and completion need not wake it (a wake-up costs
        # a GIL handoff, which is more than a small model's whole run).
        self._wd_cv = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._seq = itertools.count()
        self._waiting: list[Task] = []
        self._vtime: dict[str, float] = {}  # device seconds served per group (fair share)
        self._left: dict[str, float] = {}   # when each group's last live task ended
        # What a device second is worth per program (runtime/fairshare.py); None: device time
        self.pace = Pace() if fair_progress else None
        self._running: dict[int, Task] = {}  # lane -> task
        self._rest_until = [0.0] * self.lanes  # duty cycling: lane may take work from then on
        self._paused = False
        self._watchdog: threading.Thread | None = None
        self._idle: list[queue.SimpleQueue] = []  # handoff slots of idle task threads
        self._idle_lock = threading.Lock()
        # finished tasks, newest last (bounded): light copies, their snapshots made when asked
        self.recent: collections.deque = collections.deque(maxlen=64)
        self.live: dict[int, Task] = {}
        # device counters
        self.created = clock()
        self.lane_busy = [0.0] * self.lanes
        self.counts = {"submitted": 0, "ok": 0, "failed": 0, "cancelled": 0, "timeout": 0}
        self.slices = 0
        self.preemptions = 0
        self.preempt_latency = LatencyHistogram()
        self._contended_until = float("-inf")  # see _contended
        self._recent: dict = {}  # (priority, group) -> when a task of it was last live
        self.macs_done = 0
        self.steps_done = 0
        self.listeners: list = []  # fn(event, task) for the monitor; called outside the lock
        self.admission = Admission() if admission else None
        self.holds = 0
        self.held_s = 0.0  # unit time left idle by holds: from each hold to its request (or lapse)

    # ------------------------------------------------------------------ public
    def submit(self, program, feeds, *, priority: int = DEFAULT_PRIORITY, timeout: float | None = None,
               name: str = "", progress=None, step_macs=None, profile=False, owner=None,
               group: str | None = None, inline: bool = False) -> TaskFuture:
        """Queue a run of `program`. With `inline`, a task that gets a unit at once runs on the
        calling thread before this returns (the caller is about to block on its future anyway:
        no thread handoff); one that must wait runs on a task thread as usual."""
        if priority not in PRIORITIES:
            raise NpurunError(f"priority must be one of 0 (highest), 1, 2, 3, got {priority!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise NpurunError(f"timeout must be a positive number of seconds, got {timeout!r}")
        fut = TaskFuture()
        task = self._task(program, feeds, fut, priority, timeout, name, progress, step_macs, profile, owner, group)
        task.finished = threading.Event()
        fut.task = task
        now = task.submitted_at
        with self._cv:
            self._arrive(task, now)
            self._enqueue(task, now)
            started = self._dispatch(now)
            self._ensure_watchdog()
        if inline and task in started:
            started.remove(task)
            self._start(started)
            self._task_main(task)
        else:
            self._start(started)
        return fut

    def run_inline(self, program, feeds, *, priority: int = DEFAULT_PRIORITY, timeout: float | None = None,
                   name: str = "", progress=None, step_macs=None, owner=None, group: str | None = None):
        """A blocking run on the calling thread when the device is idle (nothing running or
        waiting, not paused, no rest due, no duty cycling): the run's outputs. Otherwise
        returns NOT_IDLE without doing anything (the caller submits as usual).

        The task is the same as submit's (counted, listed, preempted at its slice boundaries
        by a better task that arrives, timed out there), less what nobody can use: no Future
        (the caller gets the outputs or the error directly, and nobody else holds the task to
        cancel it), no `finished` event, no watchdog (nothing waits). A small model's run is
        then a few dozen Python operations more than `Program.run`: silero-vad's cold run
        (the bench's protocol) paid ~1.5 ms for submit + Future on a 2-core VM, more than its
        kernels."""
        if priority not in PRIORITIES:
            raise NpurunError(f"priority must be one of 0 (highest), 1, 2, 3, got {priority!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise NpurunError(f"timeout must be a positive number of seconds, got {timeout!r}")
        task = self._task(program, feeds, _NO_FUTURE, priority, timeout, name, progress, step_macs, False, owner, group)
        now = task.submitted_at
        # Alone on an idle device, with no deadline, trace or progress to report, no boundary
        # can decide anything until the device's attention flag is raised (a task arrives,
        # the device pauses, the governor turns a knob): the program calls the boundary only
        # then, and the steps run before are accounted at the end. (A 7-node MLP paid ~15 us a
        # run for boundaries that could only say "go on".)
        quiet = task.deadline is None and task.trace is None and progress is None
        with self._lock:  # (the bare lock: see _defer)
            if (self._paused or self._waiting or self._running or self.duty < 1.0
                    or self._rest_until[0] > now):
                return NOT_IDLE
            if not (quiet and self._defer(task, now)):
                self._catch_up()
                self._arrive(task, now)
                self.slices += 1
            # What _dispatch does for the one task it would pick: lane 0, at its own level.
            task.state, task.lane, task.level, task.started = RUNNING, 0, priority, True
            task.slice_start = task.step_start = task.seg_start = task.ready_since = now
            task.seq = next(self._seq)
            task.slices = 1
            self._running[0] = task
        result = error = None
        try:
            prev = pieces.install(self._hook(task))
            try:
                result = program.run(feeds, progress=lambda i, n, label: self._boundary(task, i, label),
                                     **({"attention": self.attention} if quiet else {}))
            finally:
                pieces.install(prev)
        except BaseException as e:  # noqa: BLE001 -- accounted like any task, then re-raised
            error = e
        if quiet and error is None and task.steps_done < task.steps_total:
            skipped = task.step_macs[task.steps_done:]
            task.unsynced_macs += sum(skipped)
            task.unsynced_steps += task.steps_total - task.steps_done
            task.macs_done += sum(skipped)
            task.steps_done = task.steps_total
        task.feeds = None
        if error is None and self._quiet is task and self._retire_later(task):
            return result
        self._start(self._finish(task, error))  # (a quiet run that failed is accounted first)
        if self.listeners:
            self._emit("done", task)
        if error is not None:
            drop_frames(error)
            raise error
        return result

    # A quiet run's bookkeeping, deferred. A run on an idle device that nothing can hold or
    # stop (no timeout, progress or listener; no better periodic stream) is accounted only
    # when someone next takes the scheduler's lock (`_Accounting`: a submit, a boundary that
    # must decide, tasks(), stats(), a run of another priority or group) or when BACKLOG have
    # gathered: arrival (counts, fair-share group, admission's stream), then retirement
    # (device time, pace, `recent`), each with the times it had, in the order they happened.
    # Nothing decides anything between them, so the state every decision sees is the same.
    # The arrival and retirement cost a small model's run ~0.1-0.15 ms after an idle gap (the
    # corpus bench's protocol: each run 100 ms after the last, its Python and data out of the
    # caches) against ~0.2 ms for ONNX Runtime's whole run of a 7-node MLP.

    def _defer(self, task: Task, now: float) -> bool:
        """Whether `task`'s arrival may be accounted later (bare lock held; on an idle device).
        Deferred runs accounted together are of one priority and group: an arrival of another
        may change what admission holds, so it is accounted first."""
        b = self._backlog
        if b and (b[-1].priority != task.priority or b[-1].group != task.group or len(b) >= BACKLOG):
            self._catch_up()
        if self.listeners or self.attention[0] or (
                self.admission is not None and self.admission.may_hold(task.priority, now)):
            return False
        self._quiet = task
        return True

    def _retire_later(self, task: Task) -> bool:
        """End quiet run `task` with its retirement deferred, unless something was accounted
        meanwhile (it is then a task like any other, finished by _finish)."""
        with self._lock:
            if self._quiet is not task or self.listeners:
                return False
            self._quiet = None
            task.finished_at = self.clock()
            task.alone = self._contended_until <= task.submitted_at
            del self._running[task.lane]
            self._backlog.append(task)
            return True

    def _catch_up(self):
        """Account the deferred quiet runs (lock held): each finished one's arrival and
        retirement, then the arrival of the one in flight, which from then on runs as any task."""
        done, self._backlog = self._backlog, []
        for t in done:
            self._arrive(t, t.submitted_at)
            self.slices += 1
            self._retire(t)
        t, self._quiet = self._quiet, None
        if t is not None:
            self._arrive(t, t.submitted_at)
            self.slices += 1

    def _arrive(self, task: Task, now: float):
        """A task's arrival (lock held): counted, live, its group and stream seen."""
        self.counts["submitted"] += 1
        self.live[task.id] = task
        self._join_group(task.group, now)
        self._seen(task, now)
        self._arrived(task, now)

    def _retire(self, task: Task):
        """What _finish does for a quiet run that ended at task.finished_at (lock held): its one
        slice charged (its lane was freed when it ended), then retired, a success."""
        self._charge(task, task.finished_at)
        task.lane = None
        self._retired(task, None, task.finished_at, task.alone)

    def _task(self, program, feeds, fut, priority, timeout, name, progress, step_macs, profile, owner, group) -> Task:
        now = self.clock()
        steps = len(program.steps)
        name = name or getattr(program.graph, "name", "task")
        task = Task(next(self._ids), name, priority, program, feeds, self, fut,
                    deadline=None if timeout is None else now + timeout, timeout=timeout,
                    user_progress=progress, step_macs=step_macs if step_macs is not None else [0] * steps,
                    trace=[] if profile else None, owner=owner, group=group or name, submitted_at=now,
                    steps_total=steps)
        if self.admission is not None:
            task.segs = self.admission.segments(program, steps)
        return task

    def pause(self):
        """Start no new slice until `resume()` (running slices finish their current node)."""
        with self._cv:
            self._paused = True
            self.attention[0] = True

    def resume(self):
        with self._cv:
            self._paused = False
            started = self._dispatch(self.clock())
            self._cv.notify_all()
            self._wd_cv.notify_all()
        self._start(started)

    def set_operating(self, active_units: int | None = None, duty: float | None = None):
        """The knobs the thermal governor turns on a CPU: units in use and duty cycle."""
        with self._cv:
            self.attention[0] = True  # a running inline task looks at its next boundary
            if active_units is not None:
                self.active_lanes = max(1, min(self.lanes, int(active_units) // self.width))
            if duty is not None:
                self.duty = min(1.0, max(0.05, float(duty)))
            started = self._dispatch(self.clock())
            self._cv.notify_all()
            self._wd_cv.notify_all()
        self._start(started)

    def tasks(self) -> list[dict]:
        """Snapshots of live tasks then recently finished ones."""
        with self._cv:
            now = self.clock()
            return [t.snapshot(now) for t in self.live.values()] + [t.snapshot(t.finished_at) for t in reversed(self.recent)]

    def stats(self) -> dict:
        with self._cv:
            now = self.clock()
            busy = list(self.lane_busy)
            for lane, t in self._running.items():
                busy[lane] += now - t.slice_start
            return {"name": self.name, "units": self.units, "width": self.width, "lanes": self.lanes,
                    "active_units": self.active_lanes * self.width,
                    "unit_busy_s": [busy[u // self.width] for u in range(self.lanes * self.width)],
                    "duty": self.duty, "quantum_s": self.quantum, "aging_s": self.aging,
                    "uptime_s": now - self.created, "lane_busy_s": busy,
                    "running": len(self._running), "waiting": len(self._waiting),
                    "tasks": dict(self.counts), "slices": self.slices, "preemptions": self.preemptions,
                    "preemption_latency": self.preempt_latency.summary(), "admission_holds": self.holds,
                    "admission_held_s": self.held_s,
                    "macs_done": self.macs_done, "steps_done": self.steps_done}

    def wait_bound(self, priority: int, ahead: int = 0, longest_node: float = 0.0) -> float:
        """The stated bound on how long a waiting task of `priority` waits for its next slice."""
        return priority * self.aging + ahead * (self.quantum + longest_node) / self.active_lanes

    # ------------------------------------------------------------------ decisions (lock held)
    def _enqueue(self, task: Task, now: float):
        task.state, task.lane = WAITING, None
        task.ready_since = now
        task.seq = next(self._seq)
        # It must wait for a preemption when no unit is free and a worse level holds one.
        full = len(self._running) >= self.active_lanes
        task.preempt_from = now if full and any(t.level > task.priority for t in self._running.values()) else None
        if len(self.live) > 1:
            self._contended_until = now + pieces.CONTENDED_S
        self._waiting.append(task)
        self.attention[0] = True

    def _join_group(self, group: str, now: float):
        """Fair share among equals is kept per group (default: the model's name), so a stream
        of short tasks and one long task get equal device time. A group (re)joining starts at
        the least service of the groups present, keeping at most `aging` of earlier credit if it
        left within AWAY_S (a client looping on a model leaves and rejoins between its runs, and
        keeps the deficit it has while sharing), else at most two quanta (as CFS bounds a waking
        task's bonus): a group back after seconds away is owed nothing for the absence. (Always
        `aging` until 2026-12-06: the bench's detector, back after 4 s of ESPCN alone, started
        0.2 s of charged time behind and took ~7% of a 4 s window from ESPCN.)"""
        live = [self._vtime[t.group] for t in self.live.values() if t.group != group and t.group in self._vtime]
        least = min(live) if live else 0.0
        if group in self._vtime:
            away = now - self._left.get(group, now)
            credit = self.aging if away <= AWAY_S else min(self.aging, 2 * self.quantum)
            self._vtime[group] = max(self._vtime[group], least - credit)
        else:
            self._vtime[group] = least
        if len(self._vtime) > 512:  # forget groups with no live task
            keep = {t.group for t in self.live.values()}
            self._vtime = {g: v for g, v in self._vtime.items() if g in keep}
            self._left = {g: v for g, v in self._left.items() if g in keep}

    def _order(self, task: Task, now: float):
        """Dispatch order: effective level; at a level, aged tasks first (oldest first, which
        is what bounds their wait), then the group with the least device time, then FIFO."""
        eff = self._eff(task, now)
        aged = eff < task.priority
        return (eff, 0 if aged else 1, task.seq if aged else self._vtime.get(task.group, 0.0), task.seq)

    def _eff(self, task: Task, now: float) -> int:
        return max(0, task.priority - int((now - task.ready_since) / self.aging))

    def _best_running_level(self) -> int | None:
        return min((t.level for t in self._running.values()), default=None)

    def _dispatch(self, now: float) -> list[Task]:
        """Give free units to waiting tasks; returns tasks that need a thread started."""
        if self._paused:
            return []
        to_start = []
        while self._waiting:
            free = [ln for ln in range(self.active_lanes) if ln not in self._running and self._rest_until[ln] <= now]
            if not free:
                break
            ready = [t for t in self._waiting if t.hold_until <= now]
            if not ready:
                break
            for t in ready:
                if t.held_since is not None:  # the hold lapsed: no request came
                    self.held_s += t.hold_until - t.held_since
                    t.held_since, t.hold_until = None, 0.0
            best = min(ready, key=lambda t: self._order(t, now))
            level = self._eff(best, now)
            top = self._best_running_level()
            if top is not None and level > top:
                break  # never start a lower level beside a higher one
            best.level = level
            if not best.admitted and self._admit(best, now, best.steps_done, len(free) - 1):
                # Its next stretch would run into a periodic better stream's request: held,
                # and the unit goes to the next task whose stretch fits, if any (filling the
                # gap before the request instead of leaving it idle).
                self._ensure_watchdog()
                continue
            self._waiting.remove(best)
            wait = now - best.ready_since
            best.queue_wait += wait
            best.max_wait = max(best.max_wait, wait)
            best.state, best.lane, best.level = RUNNING, free[0], level
            best.slice_start = best.step_start = best.seg_start = now
            if best.preempt_from is not None:
                best.preempt_wait = now - best.preempt_from
                best.preempt_from = None
                self.preempt_latency.add(best.preempt_wait)
            best.slices += 1
            self.slices += 1
            self._running[best.lane] = best
            if best.started:
                best.wake = True
            else:
                best.started = True
                to_start.append(best)
        if any(t.wake for t in self._running.values()):
            self._cv.notify_all()
        return to_start

    def _should_yield(self, task: Task, now: float) -> str | None:
        """'preempted', 'quantum' or None: whether `task` gives up its unit at this boundary."""
        if task.lane >= self.active_lanes:
            return "quantum"  # the governor took this unit away
        for t in self._running.values():
            if t is not task and t.level < task.level:
                return "preempted"
        waiting = [(self._eff(t, now), t) for t in self._waiting]
        if any(lv < task.level for lv, _ in waiting):
            return "preempted"
        if waiting and self._owed(task, now, waiting):
            return "quantum"
        if now - task.slice_start >= self.quantum:
            mine = self._vtime[task.group] + (now - task.slice_start) * self._rate(task)
            if self.duty < 1.0 or any(lv < task.level or (lv == task.level and (
                    lv < t.priority or self._vtime[t.group] <= mine)) for lv, t in waiting):
                return "quantum"
        return None

    def _owed(self, task: Task, now: float, waiting) -> bool:
        """Whether an equal-level task that arrived during this slice, new (it has never run),
        is owed the unit now: its group has had WAKEUP_S less device time than this one's
        (as Linux's CFS preempts on wake-up). Without it a short task arriving beside a long
        one waited out the long one's quantum every time: ESPCN requests back to back beside
        PP-OCR det got 16-25% of their solo throughput at equal priority (Jain 0.71-0.82)."""
        mine = self._vtime.get(task.group, 0.0) + (now - task.slice_start) * self._rate(task)
        return any(lv == task.level and not t.started and t.ready_since > task.slice_start
                   and self._vtime.get(t.group, 0.0) + WAKEUP_S < mine for lv, t in waiting)

    def _rate(self, task: Task) -> float:
        """Fair-share seconds per device second of `task`'s slices (runtime/fairshare.py)."""
        return 1.0 if self.pace is None else self.pace.rate(task.program)

    def _release(self, task: Task, now: float):
        """Task leaves its unit (lock held)."""
        self._charge(task, now)
        del self._running[task.lane]
        task.lane = None

    def _charge(self, task: Task, now: float):
        """The slice of `task` ending at `now`, charged to its run time, its group's fair share
        and its lane (lock held)."""
        ran = now - task.slice_start
        task.run_time += ran
        self._vtime[task.group] = self._vtime.get(task.group, 0.0) + ran * self._rate(task)
        self.lane_busy[task.lane] += ran
        if self.duty < 1.0:
            self._rest_until[task.lane] = now + ran * (1 - self.duty) / self.duty

    def _check_stop(self, task: Task, now: float) -> NpurunError | None:
        if task.future.cancelled():
            return TaskCancelled(f"task {task.id} ({task.name}) was cancelled")
        if task.deadline is not None and now >= task.deadline:
            return TaskTimeout(f"task {task.id} ({task.name}) did not finish within its timeout of "
                               f"{task.timeout:g} s ({task.steps_done} of {task.steps_total} nodes done)")
        return None

    # ------------------------------------------------------------------ task threads
    def _start(self, tasks: list[Task]):
        """Run each task on a thread of its own: an idle task thread if one waits (starting a
        thread costs ~50-300 us, more than a small model's run), else a new one."""
        for t in tasks:
            with self._idle_lock:
                slot = self._idle.pop() if self._idle else None
            if slot is not None:
                slot.put(t)
            else:
                # (in a list the thread empties: a Thread keeps its args while it lives)
                threading.Thread(target=self._task_thread, args=([t],), name=f"npurun-task-{t.id}", daemon=True).start()

    def _task_thread(self, first: list[Task]):
        """A task thread: runs its task, then waits up to IDLE_S for the next one."""
        me = threading.current_thread()
        task: Task | None = first.pop()
        while task is not None:
            me.name = f"npurun-task-{task.id}"
            self._task_main(task)
            task = None  # no reference to the finished task while idle
            slot: queue.SimpleQueue = queue.SimpleQueue()
            with self._idle_lock:
                self._idle.append(slot)
            try:
                task = slot.get(timeout=IDLE_S)
            except queue.Empty:
                with self._idle_lock:
                    handed = slot not in self._idle
                    if not handed:
                        self._idle.remove(slot)
                if handed:  # _start took the slot just now: its task is on the way
                    task = slot.get()

    def _task_main(self, task: Task):
        result = error = None
        try:
            err = self._check_stop(task, self.clock())
            if err:
                raise err
            prev = pieces.install(self._hook(task))
            try:
                result = task.program.run(task.feeds, progress=lambda i, n, label: self._boundary(task, i, label))
            finally:
                pieces.install(prev)
        except BaseException as e:  # noqa: BLE001 -- every failure goes to the task's future
            error = e
        task.feeds = None
        started = self._finish(task, error)
        self._start(started)
        if error is not None:
            drop_frames(error)
        self._resolve(task, result, error)
        del result, error
        task.finished.set()

    def _boundary(self, task: Task, step: int, label: str):
        """Called by the Program after each step: account, then keep the unit or wait. `step`
        None: inside a control-flow node (a body's step), where only a stop is checked."""
        if step is None:
            err = self._check_stop(task, self.clock())
            if err is not None:
                raise err
            return
        if task.user_progress:
            task.user_progress(step, task.steps_total, label)
        m = task.step_macs[step - 1] if step - 1 < len(task.step_macs) else 0
        now = self.clock()
        adm = self.admission
        admitting = adm is not None and now < adm.active_until
        if admitting and task.segs is not None:
            # learn this step's longest stretch (not after boundaries an inline run skipped)
            seg = max(task.seg_max, now - task.seg_start)
            if task.steps_done == step - 1 and step - 1 < len(task.segs):
                adm.learn(task.segs, step - 1, seg)
            task.seg_max, task.seg_start = 0.0, now
        # Fast path: with this task alone on the device, nobody waiting, no deadline, trace,
        # duty cycle or better periodic stream to be held for, no decision can change at this
        # boundary, so a model of many short steps (YOLOv8n: 209 of ~0.1 ms) pays no lock per
        # step. The lock is still taken at least every SYNC_S, where cancellation and the
        # governor are seen. (Unlocked reads of the queue are hints: a task that arrives
        # meanwhile is seen at the next locked boundary.)
        if (step != task.steps_total and not self._waiting and len(self._running) <= 1
                and task.deadline is None and task.trace is None and self.duty >= 1.0
                and now - task.synced_at < SYNC_S and not (admitting and adm.may_hold(task.level, now))):
            task.macs_done += m
            task.steps_done = step
            task.unsynced_macs += m
            task.unsynced_steps += 1
            return
        with self._cv:
            if task.trace is not None:
                task.trace.append((step - 1, label, task.lane, task.step_start, now))
            task.macs_done += m
            task.steps_done = step
            self.macs_done += m + task.unsynced_macs
            self.steps_done += 1 + task.unsynced_steps
            task.unsynced_macs = task.unsynced_steps = 0
            task.synced_at = now
            err = self._check_stop(task, now)
            if err is not None:
                raise err  # _finish releases the unit
            if step == task.steps_total:
                return
            task.admitted = False  # a new boundary: admission decides again
            why = self._should_yield(task, now) or self._admit(task, now, step, self.active_lanes - len(self._running))
            started = self._give_up(task, why, now) if why else []
        self._start(started)
        if not why:
            task.step_start = now
            return
        self._wait_turn(task)

    def _piece(self, task: Task):
        """A preemption point between two pieces of a node (backends/pieces.py): stop, or
        give the unit to a better task (or an equal one whose turn it is), as at a node
        boundary; the node's remaining pieces run when the task gets a unit back."""
        adm = self.admission
        admitting = False
        if adm is not None:
            now = self.clock()
            admitting = now < adm.active_until
            if admitting:
                task.seg_max = max(task.seg_max, now - task.seg_start)
                task.seg_start = now
        if not self._waiting and task.deadline is None and not task.future.cancelled() \
                and not (admitting and adm.may_hold(task.level, now)):
            return  # (unlocked hints: nobody to give the unit to, nothing to stop, no hold)
        with self._cv:
            now = self.clock()
            err = self._check_stop(task, now)
            if err is not None:
                raise err
            task.admitted = False
            why = self._should_yield(task, now) or \
                self._admit(task, now, task.steps_done, self.active_lanes - len(self._running))
            started = self._give_up(task, why, now) if why else []
        self._start(started)
        if why:
            task.pieces_yielded += 1
            self._wait_turn(task)

    def _arrived(self, task: Task, now: float):
        """A request arrived (lock held): its group's period is learned, and tasks of a worse
        level held for it (admission) may be served again once it is done."""
        if self.admission is None:
            return
        self.admission.arrived(task.group, task.priority, now)
        for t in self._waiting:
            if t.hold_until and t.level > task.priority:
                self.held_s += now - t.held_since
                t.held_since, t.hold_until = None, 0.0
        if self.admission.may_hold(task.priority, now):
            # an inline run of this task calls its boundaries (where it may be held); one that
            # no stream can hold runs without them (a benchmark's loop is a periodic stream
            # of its own, and its boundaries cost ~10 us a step of MobileNetV2)
            self.attention[0] = True

    def _admit(self, task: Task, now: float, step: int, spare: int) -> str | None:
        """'held' when the stretch `task` is about to run (of step index `step`) is predicted
        to end after a periodic better-priority stream's next request (runtime/admission.py);
        the task then waits for that request (or for the hold to lapse). Decided once per
        boundary: at the boundary itself, or where the task was queued there for another
        reason (preempted, its quantum, new), when a unit is about to be handed to it.
        `spare`: lanes that stay free besides the task's. Lock held."""
        task.admitted = True
        adm = self.admission
        if adm is None or task.segs is None or now >= adm.active_until or step >= len(task.segs):
            return None
        if spare > 0:
            return None  # a lane is free for the request anyway
        live = {t.group for t in self.live.values() if t is not task}
        until = adm.hold_until(task.level, now, task.segs[step], live)
        if until is None:
            return None
        task.hold_until, task.held_since = until, now
        task.holds += 1
        self.holds += 1
        return "held"

    def _hook(self, task: Task) -> pieces.Hook:
        """What `task`'s kernels ask between and about pieces (backends/pieces.py)."""
        return pieces.Hook(lambda: self._piece(task), lambda: self._wants_pieces(task),
                           lambda: self._had_company(task))

    def _contended(self) -> bool:
        """Whether another task was live on the device lately."""
        return self.clock() < self._contended_until

    def _seen(self, task: Task, now: float):
        """A task of this priority and group was live now (lock held; for _wants_pieces)."""
        self._recent[task.priority, task.group] = now
        if len(self._recent) > 64:
            self._recent = {k: t for k, t in self._recent.items() if t > now - SPARSE_S}

    def _company(self, task: Task, now: float, within: float) -> bool:
        """Whether another group's task of the same or a better priority is live, or was within
        `within` seconds. (Unlocked reads: hints.)"""
        p, g = task.priority, task.group
        if any(q <= p and h != g and t > now - within for (q, h), t in list(self._recent.items())):
            return True
        return any(t.priority <= p and t.group != g for t in list(self.live.values()))

    def _had_company(self, task: Task) -> bool:
        """Whether `task` runs nodes longer than pieces.LONG_S as pieces on a device that is not
        contended: the device was shared (two tasks live at once) within SPARSE_S, and a task
        that could take its unit was seen meanwhile (pieces.py). Tasks that only ever ran one
        after the other (a benchmark's models, a server's requests one at a time) are no company:
        the corpus bench's wav2vec2, after other models in the same process, ran its long convs
        in such pieces at 6x its time."""
        now = self.clock()
        return now < self._contended_until + SPARSE_S and self._company(task, now, SPARSE_S)

    def _wants_pieces(self, task: Task) -> bool:
        """Whether `task`'s kernels should run long nodes in pieces: the device is contended and
        a task that could take the unit at a piece boundary is live or was lately — another
        group's, of the same or a better priority. A task better than every other (a
        high-priority stream beside a batch) runs its nodes whole: nobody would enter between
        its pieces, and they cost it 5-6% (ESPCN 256x256: 6.1 -> 6.5 ms). (Unlocked reads: hints.)"""
        now = self.clock()
        if now >= self._contended_until:
            return False
        return self._company(task, now, pieces.CONTENDED_S)

    def _give_up(self, task: Task, why: str, now: float) -> list[Task]:
        """Task leaves its unit for the queue (lock held); the tasks to start."""
        if why == "preempted":
            task.preemptions += 1
            self.preemptions += 1
        self._release(task, now)
        self._enqueue(task, now)
        started = self._dispatch(now)
        self._ensure_watchdog()
        return started

    def _wait_turn(self, task: Task):
        """Block the task's thread until the scheduler gives it a unit again."""
        self._emit("yield", task)
        with self._cv:
            while not task.wake:
                now = self.clock()
                err = self._check_stop(task, now)
                if err is not None:
                    if task in self._waiting:
                        self._waiting.remove(task)
                        task.queue_wait += now - task.ready_since
                    raise err
                wait = None if task.deadline is None else max(0.0, task.deadline - now)
                self._cv.wait(timeout=wait if wait is not None else 1.0)
            task.wake = False
            task.step_start = task.seg_start = self.clock()

    def _finish(self, task: Task, error) -> list[Task]:
        with self._cv:
            now = self.clock()
            if task.lane is not None:
                self._release(task, now)
            if task in self._waiting:
                self._waiting.remove(task)
            # alone: one slice, and no other task live on the device since it was submitted
            self._retired(task, error, now, task.slices == 1 and self._contended_until <= task.submitted_at)
            started = self._dispatch(now)
            if not self._waiting and not self._running and not self._paused and self.duty >= 1.0 \
                    and self.active_lanes == self.lanes:
                self.attention[0] = False  # (the next inline run's arrival raises it if it may be held)
            self._cv.notify_all()
        return started

    def _retired(self, task: Task, error, now: float, alone: bool):
        """A task done at `now` (lock held; its unit already left): its counters synced, its
        pace learned (a success), its outcome counted and kept in `recent`."""
        self.macs_done += task.unsynced_macs  # (a run that failed between locked boundaries)
        self.steps_done += task.unsynced_steps
        task.unsynced_macs = task.unsynced_steps = 0
        if error is None and self.pace is not None:
            self.pace.observe(task.program, task.run_time, alone)
        task.state, task.finished_at = DONE, now
        task.outcome = ("ok" if error is None else "cancelled" if isinstance(error, TaskCancelled)
                        else "timeout" if isinstance(error, TaskTimeout) else "failed")
        task.error = "" if error is None else str(error)
        self.counts[task.outcome] += 1
        self.live.pop(task.id, None)
        if not any(t.group == task.group for t in self.live.values()):
            self._left[task.group] = now
        self.recent.append(task.retired())

    def _resolve(self, task: Task, result, error):
        fut = task.future
        try:
            if error is None:
                fut.set_result(result)
            elif not isinstance(error, TaskCancelled):
                fut.set_exception(error)
            elif not fut.cancelled():
                fut.cancel()
        except InvalidStateError:
            pass  # cancelled meanwhile; the result is dropped
        self._emit("done", task)
        task.future = _Resolved(fut.cancelled())

    def _cancelled(self, task: Task):
        """The future was cancelled: a waiting task that never started is dropped now."""
        with self._cv:
            if task.started or task.state == DONE:
                self._cv.notify_all()  # a parked task wakes and stops
                return
            if task in self._waiting:
                self._waiting.remove(task)
        self._finish_unstarted(task, TaskCancelled(f"task {task.id} ({task.name}) was cancelled"))

    def _finish_unstarted(self, task: Task, error):
        task.feeds = None
        self._start(self._finish(task, error))
        self._resolve(task, None, error)
        task.finished.set()

    def _emit(self, event, task):
        for fn in list(self.listeners):
            try:
                fn(event, task)
            except Exception:  # a broken listener never breaks a task  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ watchdog
    def _ensure_watchdog(self):
        """One thread per scheduler: times out waiting tasks that never started, and hands
        out units again when a rest period (duty cycling) ends."""
        if self._watchdog is None or not self._watchdog.is_alive():
            self._watchdog = threading.Thread(target=self._watch, name=f"npurun-sched-{self.name}", daemon=True)
            self._watchdog.start()

    def _watch(self):
        idle_since = None
        while True:
            expired, started = [], []
            # (the bare lock: a quiet run is neither waiting nor due for a timeout, and its
            # accounting can wait for a decision that needs it; polling every 50 ms, this
            # loop would otherwise account each quiet run at once)
            with self._wd_cv:
                now = self.clock()
                for t in list(self._waiting):
                    if not t.started and t.deadline is not None and now >= t.deadline:
                        self._waiting.remove(t)
                        expired.append(t)
                started = self._dispatch(now)
                wakes = [t.deadline for t in self._waiting if t.deadline is not None]
                wakes += [r for r in self._rest_until if r > now]
                wakes += [t.hold_until for t in self._waiting if t.hold_until > now]
                if not self._waiting and not self._running and not expired and not started:
                    # Linger a while: a stream of short runs would start one watchdog per run.
                    idle_since = idle_since if idle_since is not None else time.monotonic()
                    if time.monotonic() - idle_since >= IDLE_S:
                        self._watchdog = None
                        return
                else:
                    idle_since = None
                delay = min((w - now for w in wakes), default=0.05)
                if not expired and not started:
                    self._wd_cv.wait(timeout=min(0.05, max(0.001, delay)))
            for t in expired:
                self._finish_unstarted(t, TaskTimeout(
                    f"task {t.id} ({t.name}) did not finish within its timeout of {t.timeout:g} s "
                    f"(it waited in the queue and never started)"))
            self._start(started)


def drop_frames(error: BaseException):
    """Clear the locals of every frame in the error's tracebacks (and its causes), so the
    failed run's intermediate arrays are freed now, not when the error object dies."""
    seen = set()
    e = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__
