"""The one interface every backend implements, and the program they compile to.

A backend answers `available()` (can it run on this machine, and if not why),
`supports(node)` (can it take this node, and if not why) and `compile(graph)` (a `Program`
that runs the graph). A `Program` honours each node's precision (`node.precision`: f16, i8,
...) by running the node through npurun/precision/emulate.py, so every backend built on it
computes the numbers a device at that precision would. Device strings are
`BACKEND[:TARGET]`: `cpu`, `reference`, later `torch:cuda`, `npusim:x-elite-hexagon`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import BackendError, InputError, NpurunError
from ..ir.dtypes import as_strings, to_numpy
from ..ir.graph import Graph
from ..ir.ops import OPS
from ..ir.shapes import bind, format_shape

Progress = Callable[[int, int, str], None]  # (nodes done, nodes in all, node label)


class Backend:
    name = "?"
    # Rules a node must pass for this backend to take it: rule(node, graph) -> bool. The
    # docstring of the first rule that says no is the reason `npurun ops-report` shows.
    rules: tuple = ()
    fallback: str | None = None  # the backend that takes what this one refuses

    def __init__(self, target: str | None = None, parallelism: int = 1):
        self.target, self.parallelism = target, parallelism

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    def supports(self, node, graph=None) -> tuple[bool, str]:
        for rule in self.rules:
            if not rule(node, graph):
                return False, " ".join((rule.__doc__ or rule.__name__).split())
        return True, ""

    def compile(self, graph: Graph) -> "Program":
        raise NotImplementedError


def check_inputs(graph: Graph, feeds: dict) -> dict[str, np.ndarray]:
    """Validate a run's inputs against the graph; return them as arrays, copying only what
    must be copied (a C-contiguous array of the right dtype is passed through as is)."""
    where = graph.source
    unknown = [k for k in feeds if k not in graph.inputs]
    if unknown:
        raise InputError(f"{where}: unknown input name(s) {', '.join(map(repr, unknown))}; "
                         f"the model's inputs are {', '.join(map(repr, graph.inputs))}")
    missing = [k for k in graph.inputs if k not in feeds]
    if missing:
        raise InputError(f"{where}: missing input(s) {', '.join(map(repr, missing))}")
    env: dict[str, int] = {}
    out = {}
    for name in graph.inputs:
        v = graph.values[name]
        arr = feeds[name]
        if v.kind != "tensor":
            out[name] = _check_container(where, name, v, arr)
            continue
        if not isinstance(arr, np.ndarray):
            arr = np.asarray(arr)
        want = to_numpy(v.dtype)
        if want == object and arr.dtype.kind in "OUS":
            arr = as_strings(arr)  # str/bytes arrays run as object arrays of Python str
        if arr.dtype != want:
            raise InputError(f"{where}: input {name!r} has dtype {arr.dtype}, expected {want} ({v.dtype})")
        if not bind(v.shape, arr.shape, env):
            raise InputError(f"{where}: input {name!r} has shape {list(arr.shape)}, expected "
                             f"{format_shape(v.shape)}" + (f" with {env}" if env else ""))
        out[name] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return out


def _check_container(where: str, name: str, v, x):
    """A sequence input is a list of arrays; an optional one is None or its element."""
    if v.kind.startswith("opt") and x is None:
        return None
    if v.kind.endswith("seq"):
        if not isinstance(x, (list, tuple)) or not all(isinstance(a, np.ndarray) for a in x):
            raise InputError(f"{where}: input {name!r} is a sequence: expected a list of arrays")
        return list(x)
    if not isinstance(x, np.ndarray):
        raise InputError(f"{where}: input {name!r} is an optional tensor: expected an array or None")
    return x


class Program:
    """A compiled graph: a flat list of kernel calls in topological order, with each value
    released right after its last reader, so a run holds only the values still needed.
    A control-flow node's regions compile to sub-programs; its kernel gets them as callables
    (`_regions`) that run the subgraph with the current run's values in scope."""

    def __init__(self, graph: Graph, kernels: dict, backend: str):
        self.graph = graph
        self.backend = backend
        self.kernels = kernels
        # A node reads its inputs and whatever its regions capture from this graph.
        reads = [list(n.inputs) + [c for r in n.regions.values() for c in r.captures()] for n in graph.nodes]
        last_use: dict[str, int] = {}
        for i, names in enumerate(reads):
            for nm in names:
                if nm:
                    last_use[nm] = i
        keep = set(graph.outputs) | set(graph.inputs)
        self.steps = []
        self.subprograms: dict[int, dict[str, Program]] = {}
        for i, n in enumerate(graph.nodes):
            fn = kernels.get(n.op)
            if fn is None:
                raise BackendError(f"{graph.source}: {n.label()}: backend {backend} has no kernel for {n.op}")
            if n.precision not in (None, "f32"):  # fp16 rounding, int8 arithmetic, ... exactly
                from ..precision.emulate import emulating
                fn = emulating(n, fn, graph)
            attrs = OPS[n.op].attrs_of(n)
            dead = [nm for nm in dict.fromkeys(reads[i]) if nm and last_use.get(nm) == i
                    and nm not in keep and nm in graph.values and not graph.values[nm].is_const]
            dead += [o for o in n.outputs if o not in last_use and o not in keep]
            self.steps.append((n, fn, attrs, dead))
            if n.regions:
                for r in n.regions.values():
                    r.source = graph.source
                self.subprograms[id(n)] = {k: Program(r, kernels, backend) for k, r in n.regions.items()}
        self.consts = {v.name: v.data for v in graph.constants()}
        self.captured = graph.captures()

    def run(self, feeds: dict[str, np.ndarray], progress: Progress | None = None) -> dict[str, np.ndarray]:
        env = dict(self.consts)
        env.update(check_inputs(self.graph, feeds))
        self._execute(env, progress)
        return {nm: env[nm] for nm in self.graph.outputs}

    def call(self, inputs: list, outer: dict) -> list:
        """Run this program as a region: positional inputs, captures read from `outer`."""
        env = {nm: outer[nm] for nm in self.captured if nm in outer}
        env.update(self.consts)
        env.update(zip(self.graph.inputs, inputs))
        self._execute(env, None)
        return [env[nm] for nm in self.graph.outputs]

    def _execute(self, env: dict, progress: Progress | None) -> None:
        total = len(self.steps)
        for i, (n, fn, attrs, dead) in enumerate(self.steps):
            args = [env[nm] if nm else None for nm in n.inputs]
            subs = self.subprograms.get(id(n))
            if subs:
                attrs = {**attrs, "_regions": {k: (lambda ins, p=p: p.call(ins, env)) for k, p in subs.items()}}
            try:
                res = fn(*args, **attrs)
            except NpurunError:
                raise
            except Exception as e:  # a kernel failure names the node, never a bare traceback
                raise NpurunError(f"{self.graph.source}: {n.label()} failed on inputs ({_describe(args)}): "
                                  f"{e.__class__.__name__}: {e}") from e
            res = res if isinstance(res, tuple) else (res,)
            for nm, arr in zip(n.outputs, res):
                env[nm] = arr
            for nm in dead:
                env.pop(nm, None)
            if progress:
                progress(i + 1, total, n.label())


def _describe(args) -> str:
    def one(a):
        if isinstance(a, np.ndarray):
            return f"{a.dtype}{list(a.shape)}"
        if isinstance(a, list):
            return f"sequence of {len(a)}"
        return "none" if a is None else type(a).__name__
    return ", ".join(one(a) for a in args if a is not None)
