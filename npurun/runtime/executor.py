"""The Executor: owns a device, compiles models for it once, and runs them as tasks.

    exe = Executor(device="cpu", parallelism=2, workspace_mb=64)
    out = await exe.run("espcn.npuir", {"input": x}, priority=0, timeout=0.5)   # asyncio
    fut = exe.submit(model, x, priority=3)                                      # a Future
    out = exe.run_sync(model, x)                                                # blocking

Every run is a task of the device's scheduler (scheduler.py), shared by all Executors that
name the same device: priorities 0 (highest) .. 3, slices at node boundaries, round-robin
among equals, aging, timeouts and cancellation. `parallelism` is the number of compute
units (on cpu: the kernel threads; the scheduler runs up to that many slices at once).

`workspace_mb` is the fast tier's size (npurun.memory): each run's graph is planned for the
run's concrete input shapes (plans cached per graph and shapes, so a model with symbolic
shapes is planned once per shape it meets); a conv chain whose working set exceeds the
workspace is split into row bands (passes/split_bands.py) and the split graph is what the
backend compiles and runs. A workspace too small for even one band is a WorkspaceError naming
the smallest workspace that works. Without `workspace_mb`, the `cpu` backend still cascades
conv chains bigger than CPU_CASCADE_MB (bench/espcn_cascade.py: ESPCN 720p -> 4K runs 2-4x
faster in 8-16 MB bands than unsplit, see docs/memory.md), falling back to the plain graph if
planning fails; `cascade=False` turns that off. Other backends run unplanned.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import wait as wait_futures
from pathlib import Path

import numpy as np

from ..backends import Program, get_backend
from ..errors import InputError, NpurunError
from ..frontend import load
from ..ir.graph import Graph
from ..ir.stored import release_unused
from ..util import trim_malloc
from .device import Device
from .scheduler import NOT_IDLE, TaskFuture


PLAN_CACHE = 32  # plans kept per Executor (one per graph and input shapes)
# The cpu backend's default workspace for cascading, chosen by bench/espcn_cascade.py.
CPU_CASCADE_MB = 16


def refuse_oversized(graph: Graph) -> None:
    """A value whose known shape needs more bytes than the process can have is refused
    before anything runs: its kernel would only fail to allocate it, or first allocate others
    as large (an average pool padded by 2^31 wanted 16 GB of window indices before its
    720 GB output; found by `make fuzz`)."""
    from ..ir.dtypes import to_numpy
    from ..ir.shapes import format_shape, numel
    from ..util import check_fits
    for v in graph.values.values():
        n = numel(v.shape)
        if v.is_const or n is None or n < (1 << 24):  # (16M elements: fine anywhere)
            continue
        try:
            nbytes = n * to_numpy(v.dtype).itemsize
        except Exception:  # noqa: BLE001 -- a dtype without a NumPy form: nothing to judge
            continue
        check_fits(nbytes, lambda v=v: "{}: {}: its output {!r} ({}{})".format(
            graph.source, next((nd.label() for nd in graph.nodes if v.name in nd.outputs), f"input {v.name!r}"),
            v.name, v.dtype, format_shape(v.shape)))


def _task_name(program: Program) -> str:
    """The model file's stem, else the graph's name (computed once per program: a stream of
    small runs pays for `Path` on every run otherwise)."""
    name = getattr(program, "_task_name", None)
    if name is None:
        src = program.graph.source
        name = Path(src).stem if src and not src.startswith("<") else program.graph.name
        program._task_name = name
    return name


class Executor:
    def __init__(self, device: str = "cpu", parallelism: int | None = None, workspace_mb: int | None = None,
                 *, config=None, cascade: bool | None = None):
        if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
            raise NpurunError(f"parallelism must be a positive integer, got {parallelism!r}")
        if workspace_mb is not None and (not isinstance(workspace_mb, (int, float)) or workspace_mb <= 0):
            raise NpurunError(f"workspace_mb must be a positive number, got {workspace_mb!r}")
        from .. import config as cfgmod
        cfg = config if config is not None else cfgmod.load()
        self.device = device
        self.parallelism = parallelism or cfg.get("device", "threads") or os.cpu_count() or 1
        # The fast tier's size for the memory planner; None runs graphs unplanned.
        self.workspace_mb = workspace_mb
        # The workspace plans use: the given one, else the cpu default (cascade=None or True).
        default = CPU_CASCADE_MB if device.split(":")[0] == "cpu" and cascade is not False else None
        self._plan_mb = workspace_mb if workspace_mb is not None else default
        self.backend = get_backend(device, self.parallelism)
        self.dev = Device.open(device, self.backend, self.parallelism, cfg)
        self.scheduler = self.dev.scheduler
        self._programs: dict[int, tuple[Graph, Program]] = {}
        # (id(program), input shapes) -> per-step MACs; bounded like the plans (a server meets
        # many shapes)
        self._costs: OrderedDict[tuple, list[int]] = OrderedDict()
        # (id(graph), input shapes) -> (graph, Program, MemoryPlan): one plan per shape met
        self._plans: OrderedDict[tuple, tuple] = OrderedDict()
        # (id(model), input shapes) -> (model, Program, step MACs, task name): run_sync's lookup
        # of everything submit derives from a model and its inputs' shapes, in one dict read.
        self._runs: dict[tuple, tuple] = {}
        self._default_priority = cfg.get("scheduler", "default_priority")
        self._lock = threading.Lock()
        self._inflight: set[TaskFuture] = set()
        self._closed = False

    def __repr__(self):
        return f"Executor(device={self.device!r}, parallelism={self.parallelism}, workspace_mb={self.workspace_mb})"

    # --- models
    def compile(self, model, shapes: dict | None = None) -> Program:
        """The Program for `model` (a Graph or a path): the graph through the device's pass
        pipeline (passes/pipeline.py `prepare`), then the backend's compile; once per graph,
        and, for a graph with symbolic input dims, once per concrete input shapes (`shapes`,
        name -> shape) so that shape arithmetic folds for the shapes a run has."""
        if isinstance(model, Program):
            return model
        graph = load(model) if isinstance(model, (str, os.PathLike, Path)) else model
        if not isinstance(graph, Graph):
            raise NpurunError(f"expected a model path or an npurun Graph, got {type(model).__name__}")
        key = (id(graph), _shape_key(graph, shapes) if self.backend.specializes else ())
        with self._lock:
            hit = self._programs.get(key)
            if hit is not None and hit[0] is graph:
                return hit[1]
        from ..passes.pipeline import prepare
        prepared = prepare(graph, self.device, dict(key[1]) if key[1] else None)
        refuse_oversized(prepared)
        program = self.backend.compile(prepared)
        # the weights the passes replaced (a BatchNorm folded into its conv's new weights)
        # stay in the model file until asked for again: not resident beside their successors
        if release_unused(graph, prepared):
            trim_malloc()
        with self._lock:
            self._programs[key] = (graph, program)
            while len(self._programs) > PLAN_CACHE:
                del self._programs[next(iter(self._programs))]  # the oldest entry
        return program

    def planned(self, model, inputs) -> tuple[Program, object]:
        """(the Program a run of `model` on `inputs` executes, its MemoryPlan): planned for the
        inputs' shapes within `workspace_mb`, split where a chain does not fit; cached per
        graph and shapes. Unplanned (no workspace, or the cpu default found nothing to
        cascade): the plain Program and None."""
        graph = load(model) if isinstance(model, (str, os.PathLike, Path)) else model
        if isinstance(graph, Program):
            program, graph = graph, graph.graph
        else:
            first = self.compile(graph) if not isinstance(inputs, dict) else None
            feeds = self._feeds(first, inputs) if first is not None else inputs
            shapes = {k: tuple(np.shape(v)) for k, v in feeds.items() if isinstance(v, np.ndarray)}
            program = self.compile(graph, shapes)
        if self._plan_mb is None:
            return program, None
        feeds = self._feeds(program, inputs)
        lowered = program.graph
        shapes = {k: tuple(np.shape(v)) for k, v in feeds.items() if isinstance(v, np.ndarray)}
        key = (id(lowered), tuple(sorted(shapes.items())))
        with self._lock:
            hit = self._plans.get(key)
            if hit is not None and hit[0] is lowered:
                self._plans.move_to_end(key)
                return hit[1], hit[2]
        from ..memory import prepare
        try:
            # The default cascade is an optimization: no search for the smallest workspace.
            split_graph, plan = prepare(lowered, shapes, device=self.device, workspace_mb=self._plan_mb,
                                        find_smallest=self.workspace_mb is not None)
        except InputError:
            return program, None  # shapes that do not fit the model: the run reports them
        except Exception:  # noqa: BLE001
            if self.workspace_mb is not None:
                raise  # the user's workspace: a plan that cannot be made is their error
            split_graph, plan = lowered, None  # the default cascade is an optimization only
        if plan is not None and not plan.split and self.workspace_mb is None:
            plan = None  # nothing to cascade: the default runs the graph as it is
        # the split graph comes from the lowered one by a pass (split_bands): compiled as it is
        run = self.backend.compile(split_graph) if plan is not None and plan.split else program
        with self._lock:
            self._plans[key] = (lowered, run, plan)
            while len(self._plans) > PLAN_CACHE:
                self._plans.popitem(last=False)
        return run, plan

    @staticmethod
    def _feeds(program: Program, inputs) -> dict:
        if isinstance(inputs, dict):
            return inputs
        if isinstance(inputs, np.ndarray):
            if len(program.graph.inputs) != 1:
                raise InputError(f"{program.graph.source}: the model has inputs "
                                 f"{program.graph.inputs}; pass a dict name -> array")
            return {program.graph.inputs[0]: inputs}
        raise InputError(f"inputs must be a dict of arrays or one array, got {type(inputs).__name__}")

    def step_macs(self, program: Program, feeds: dict) -> list[int]:
        """MACs of each step of `program` for these inputs (0 where shapes are data-dependent)."""
        try:
            shapes = {k: tuple(np.shape(v)) for k, v in feeds.items() if isinstance(v, np.ndarray)}
            key = (id(program), tuple(sorted(shapes.items())))
            hit = self._costs.get(key)
            if hit is None:
                hit = self._costs[key] = program_step_macs(program, shapes)
                while len(self._costs) > PLAN_CACHE:
                    self._costs.popitem(last=False)
            return hit
        except Exception:  # bad inputs fail in the run itself, with the run's message  # noqa: BLE001
            return [0] * len(program.steps)

    # --- running
    def submit(self, model, inputs, progress=None, *, priority: int | None = None,
               timeout: float | None = None, name: str | None = None, profile: bool = False,
               group: str | None = None, inline: bool = False) -> TaskFuture:
        """Queue a run; returns a Future of its outputs (`fut.task` holds its counters).
        `inline`: when the device is free the run happens on this thread before submit
        returns (what run_sync does: no thread handoff for a small model's run)."""
        if self._closed:
            raise NpurunError(f"{self!r} is closed")
        return self._submit(self._prepared(model, inputs), progress=progress, priority=priority, timeout=timeout,
                            name=name, profile=profile, group=group, inline=inline)

    def _submit(self, prepared, *, progress, priority, timeout, name=None, profile=False, group=None,
                inline=False) -> TaskFuture:
        """submit's queueing of a run `_prepared` has looked up."""
        program, feeds, macs, task_name = prepared
        fut = self.scheduler.submit(program, feeds, priority=self._default_priority if priority is None else priority,
                                    timeout=timeout, progress=progress, name=name or task_name, step_macs=macs,
                                    profile=profile, owner=self, group=group, inline=inline)
        if fut.done():  # ran inline: nothing in flight for close() to wait for
            return fut
        with self._lock:
            self._inflight.add(fut)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, fut):
        with self._lock:
            self._inflight.discard(fut)

    def run_sync(self, model, inputs, progress=None, *, priority: int | None = None,
                 timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run and wait (`_run_now`)."""
        if self._closed:
            raise NpurunError(f"{self!r} is closed")
        return self._run_now(self._prepared(model, inputs), progress=progress, priority=priority, timeout=timeout)

    def run_program(self, program: Program, feeds: dict, *, priority: int | None = None,
                    timeout: float | None = None, name: str = "", step_macs: list | None = None,
                    group: str | None = None) -> dict[str, np.ndarray]:
        """Run a Program the caller compiled (`compile`) as it is: no memory plan and no lookup
        per input shapes, for runs whose shapes change every call (a generator's decode steps,
        npurun/generate: one program for every cache length). A task of the device like any
        other run (`_run_now`)."""
        if self._closed:
            raise NpurunError(f"{self!r} is closed")
        macs = step_macs if step_macs is not None else [0] * len(program.steps)
        return self._run_now((program, feeds, macs, name or _task_name(program)), priority=priority,
                             timeout=timeout, group=group)

    def _run_now(self, prepared, *, progress=None, priority, timeout, group=None) -> dict[str, np.ndarray]:
        """On an idle device the run happens on this thread with no Future
        (Scheduler.run_inline); otherwise it is queued like submit's and waited for."""
        program, feeds, macs, name = prepared
        out = self.scheduler.run_inline(program, feeds, priority=self._default_priority if priority is None else priority,
                                        timeout=timeout, progress=progress, name=name, step_macs=macs, owner=self,
                                        group=group)
        if out is not NOT_IDLE:
            return out
        return self._submit(prepared, progress=progress, priority=priority, timeout=timeout, group=group,
                            inline=True).result()

    def _prepared(self, model, inputs) -> tuple:
        """(Program, feeds, step MACs, task name) for a run: for an in-memory model from a
        cache keyed by the model and the inputs' shapes (one dict read a run); a model given
        as a path is loaded and looked up again each time."""
        if not isinstance(model, (Graph, Program)):
            program, _ = self.planned(model, inputs)
            feeds = self._feeds(program, inputs)
            return program, feeds, self.step_macs(program, feeds), _task_name(program)
        feeds = inputs if isinstance(inputs, dict) else self._feeds(self.compile(model), inputs)
        key = (id(model), tuple([(k, v.shape) for k, v in feeds.items() if isinstance(v, np.ndarray)]))
        hit = self._runs.get(key)
        if hit is not None and hit[0] is model:
            return hit[1], feeds, hit[2], hit[3]
        program, _ = self.planned(model, feeds)
        hit = (model, program, self.step_macs(program, feeds), _task_name(program))
        with self._lock:
            self._runs[key] = hit
            while len(self._runs) > PLAN_CACHE:
                del self._runs[next(iter(self._runs))]  # the oldest entry
        return hit[1], feeds, hit[2], hit[3]

    async def run(self, model, inputs, progress=None, *, priority: int | None = None,
                  timeout: float | None = None) -> dict[str, np.ndarray]:
        import asyncio  # here, not at the top: asyncio (and the ssl it loads) is ~6 MB of a process's RSS
        fut = self.submit(model, inputs, progress, priority=priority, timeout=timeout)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()  # the task leaves the device at its next slice boundary
            raise

    # --- monitoring
    def stats(self) -> dict:
        """Device counters (units, utilization inputs, MACs, slices, preemptions, temperature)."""
        return self.dev.stats()

    def tasks(self) -> list[dict]:
        """Per-task counters: live tasks first, then recently finished ones."""
        return self.dev.tasks()

    def close(self):
        """Wait for this Executor's tasks, then refuse new ones."""
        self._closed = True
        with self._lock:
            pending = list(self._inflight)
        wait_futures(pending)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shape_key(graph: Graph, shapes: dict | None) -> tuple:
    """The input shapes a compiled program is specialized to: () for a graph whose inputs are
    all static (one program serves every run), else the given concrete shapes of its
    symbolic inputs."""
    if not shapes:
        return ()
    out = []
    for name in graph.inputs:
        v = graph.values[name]
        if v.kind == "tensor" and not all(isinstance(d, int) for d in v.shape) and name in shapes:
            out.append((name, tuple(None if d is None else int(d) for d in shapes[name])))
    return tuple(out)


def program_step_macs(program: Program, shapes: dict) -> list[int]:
    """Per-step MACs: each step is a node of the program's (lowered) graph."""
    g = program.graph
    by_id = dict(zip(map(id, g.nodes), concrete_macs(g, shapes)))
    return [by_id.get(id(step[0]), 0) for step in program.steps]


def concrete_macs(g: Graph, shapes: dict) -> list[int]:
    """MACs per node of `g` for concrete input shapes (see npurun.ir.cost)."""
    from ..ir.cost import node_costs
    return [c.macs for c in node_costs(g, shapes)]
