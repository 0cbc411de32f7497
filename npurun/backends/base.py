"""The one interface every backend implements, and the program they compile to.

A backend answers `available()` (can it run on this machine, and if not why),
`supports(node)` (can it take this node, and if not why) and `compile(graph)` (a `Program`
that runs the graph). Device strings are `BACKEND[:TARGET]`: `cpu`, `reference`,
later `torch:cuda`, `npusim:x-elite-hexagon`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import BackendError, InputError, NpurunError
from ..ir.dtypes import to_numpy
from ..ir.graph import Graph
from ..ir.ops import OPS
from ..ir.shapes import bind, format_shape

Progress = Callable[[int, int, str], None]  # (nodes done, nodes in all, node label)


class Backend:
    name = "?"

    def __init__(self, target: str | None = None, parallelism: int = 1):
        self.target, self.parallelism = target, parallelism

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    def supports(self, node) -> tuple[bool, str]:
        raise NotImplementedError

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
        if not isinstance(arr, np.ndarray):
            arr = np.asarray(arr)
        want = to_numpy(v.dtype)
        if arr.dtype != want:
            raise InputError(f"{where}: input {name!r} has dtype {arr.dtype}, expected {want} ({v.dtype})")
        if not bind(v.shape, arr.shape, env):
            raise InputError(f"{where}: input {name!r} has shape {list(arr.shape)}, expected "
                             f"{format_shape(v.shape)}" + (f" with {env}" if env else ""))
        out[name] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return out


class Program:
    """A compiled graph: a flat list of kernel calls in topological order, with each value
    released right after its last reader, so a run holds only the values still needed."""

    def __init__(self, graph: Graph, kernels: dict, backend: str):
        self.graph = graph
        self.backend = backend
        last_use: dict[str, int] = {}
        for i, n in enumerate(graph.nodes):
            for nm in n.inputs:
                if nm:
                    last_use[nm] = i
        keep = set(graph.outputs) | set(graph.inputs)
        self.steps = []
        for i, n in enumerate(graph.nodes):
            fn = kernels.get(n.op)
            if fn is None:
                raise BackendError(f"{graph.source}: {n.label()}: backend {backend} has no kernel for {n.op}")
            attrs = OPS[n.op].attrs_of(n)
            dead = [nm for nm in dict.fromkeys(n.inputs) if nm and last_use.get(nm) == i
                    and nm not in keep and not graph.values[nm].is_const]
            dead += [o for o in n.outputs if o not in last_use and o not in keep]
            self.steps.append((n, fn, attrs, dead))
        self.consts = {v.name: v.data for v in graph.constants()}

    def run(self, feeds: dict[str, np.ndarray], progress: Progress | None = None) -> dict[str, np.ndarray]:
        env = dict(self.consts)
        env.update(check_inputs(self.graph, feeds))
        total = len(self.steps)
        for i, (n, fn, attrs, dead) in enumerate(self.steps):
            args = [env[nm] if nm else None for nm in n.inputs]
            try:
                res = fn(*args, **attrs)
            except NpurunError:
                raise
            except Exception as e:  # a kernel failure names the node, never a bare traceback
                shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in args if a is not None)
                raise NpurunError(f"{self.graph.source}: {n.label()} failed on inputs ({shapes}): "
                                  f"{e.__class__.__name__}: {e}") from e
            res = res if isinstance(res, tuple) else (res,)
            for nm, arr in zip(n.outputs, res):
                env[nm] = arr
            for nm in dead:
                env.pop(nm, None)
            if progress:
                progress(i + 1, total, n.label())
        return {nm: env[nm] for nm in self.graph.outputs}
