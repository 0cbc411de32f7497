"""The one interface every backend implements, and the program they compile to.

A backend answers `available()` (can it run on this machine, and if not why),
`supports(node)` (can it take this node, and if not why) and `compile(graph)` (a `Program`
that runs the graph). A `Program` honours each node's precision (`node.precision`: f16, i8,
...) by running the node through npurun/precision/emulate.py, so every backend built on it
computes the numbers a device at that precision would. Device strings are
`BACKEND[:TARGET]`: `cpu`, `reference`, later `torch:cuda`, `npusim:x-elite-hexagon`.
"""
from __future__ import annotations

import operator
from typing import Callable, NamedTuple

import numpy as np

from ..errors import BackendError, InputError, NpurunError
from ..ir.dtypes import as_strings, to_numpy
from ..ir.graph import Graph
from ..ir.ops import OPS
from ..ir.shapes import bind, format_shape

# (nodes done, nodes in all, node label); nodes done is None inside a control-flow node (after
# each step of a Loop/Scan/If body), where only a stop (timeout, cancellation) can happen: a
# Loop of 10^12 trips must still end at its run's timeout.
Progress = Callable[[int | None, int, str], None]


class Step(NamedTuple):
    """One step of a Program: the node it runs, the kernel the backend chose for it (with
    whatever it keeps between runs, e.g. packed weights, in the kernel itself), the node's
    attributes (defaults merged in) and the values that die after it."""
    node: object
    kernel: Callable
    attrs: dict
    dead: list


class Backend:
    name = "?"
    # Rules a node must pass for this backend to take it: rule(node, graph) -> bool. The
    # docstring of the first rule that says no is the reason `npurun ops-report` shows.
    rules: tuple = ()
    fallback: str | None = None  # the backend that takes what this one refuses
    # Compile a graph with symbolic input dims once per concrete input shapes met, so its
    # shape arithmetic folds (the Executor's cache, passes/pipeline.py `prepare`). The ort
    # backend does not: ONNX Runtime checks every If branch against static shapes, even a
    # branch no run takes (silero-vad's 8 kHz path fails for 512 samples at 16 kHz).
    specializes: bool = True

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
        if v.shape == () and arr.ndim and arr.size == 1:
            # ONNX Runtime's leniency: a scalar input given as one element of any rank ([1],
            # [1, 1]) runs as the scalar the model declares (docs/onnx.md)
            arr = arr.reshape(())
        if v.shape is not None and not bind(v.shape, arr.shape, env):
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
    (`_regions`) that run the subgraph with the current run's values in scope.

    `steps` is the public form, a `Step` (node, kernel, attrs, values dead after it) each, which
    tools wrap (profiling, calibration observers); the graph itself is never rewritten here. A
    run executes a *plan* derived from it once (`_plan`): input and output names as tuples, the
    node's label, and a kind per step, so the loop does no dict lookups beyond the run's values:

    - a plain kernel call;
    - `identity` (the reference kernel, which returns its input): an alias, no call;
    - `if` (the reference kernel): the chosen branch's sub-program runs directly (no closures
      per run), other control flow gets its `_regions` callables as the kernel contract says.

    The plan is rebuilt whenever `steps` is replaced or any of its entries changes.

    A Program runs the graph it is given as it is: folding, fusion and every other rewrite
    are passes (npurun/passes), which every entry point runs before compiling. A graph output
    that is a constant is copied on each run (a caller may write into what it gets).
    """

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
        self.consts = {v.name: v.data for v in graph.constants()}
        captures = graph.captures()
        self.steps = []
        self.subprograms: dict[int, dict[str, Program]] = {}
        for i, n in enumerate(graph.nodes):
            fn = self.lower(n, kernels.get(n.op))
            if fn is None:
                raise BackendError(f"{graph.source}: {n.label()}: backend {backend} has no kernel for {n.op}")
            if n.precision not in (None, "f32"):  # fp16 rounding, int8 arithmetic, ... exactly
                from ..precision.emulate import emulating
                fn = emulating(n, fn, graph)
            attrs = OPS[n.op].attrs_of(n)
            dead = [nm for nm in dict.fromkeys(reads[i]) if nm and last_use.get(nm) == i
                    and nm not in keep and nm in graph.values and not graph.values[nm].is_const]
            dead += [o for o in n.outputs if o not in last_use and o not in keep]
            self.steps.append(Step(n, fn, attrs, dead))
            if n.regions:
                for r in n.regions.values():
                    r.source = graph.source
                self.subprograms[id(n)] = {k: self._subprogram(r) for k, r in n.regions.items()}
        self.captured = [nm for nm in captures if nm not in self.consts]
        self._const_outputs = [nm for nm in graph.outputs if nm in self.consts]
        self._plan_src: tuple = ()
        self._plan: list = []
        self._checked: dict = {}  # input signatures check_inputs passed through unchanged

    def lower(self, node, fn):
        """The kernel this program runs for `node` (the op's kernel `fn` by default): where a
        backend picks a kernel per node once, at compile time (its own caches, a variant
        chosen by the node's constant operands)."""
        return fn

    def _subprogram(self, region: Graph) -> "Program":
        return Program(region, self.kernels, self.backend)

    def run(self, feeds: dict[str, np.ndarray], progress: Progress | None = None,
            attention: list | None = None) -> dict[str, np.ndarray]:
        """`progress` is called after each step; with `attention` (a one-element list, the
        scheduler's flag) only at the steps where attention[0] is set."""
        env = dict(self.consts)
        env.update(self._check(feeds))
        self._execute(env, progress, attention)
        for nm in self._const_outputs:  # (folded away: a fresh array per run all the same)
            env[nm] = np.array(env[nm], copy=True)
        return {nm: env[nm] for nm in self.graph.outputs}

    def _check(self, feeds: dict) -> dict:
        """check_inputs, skipped for a signature (names, dtypes, shapes of C-contiguous arrays)
        it has already passed through unchanged: a stream of same-shaped runs checks once."""
        try:
            sig = tuple((k, a.dtype, a.shape) for k, a in feeds.items() if a.flags.c_contiguous)
        except AttributeError:  # not all arrays
            sig = None
        if sig is not None and len(sig) == len(feeds) and sig in self._checked:
            return feeds
        out = check_inputs(self.graph, feeds)
        if sig is not None and len(sig) == len(feeds) and len(self._checked) < 64 \
                and all(out[k] is v for k, v in feeds.items()):
            self._checked[sig] = True
        return out

    def call(self, inputs: list, outer: dict, progress: Progress | None = None,
             attention: list | None = None) -> list:
        """Run this program as a region: positional inputs, captures read from `outer`;
        `progress` (the enclosing run's) is told after each step, as inside a node."""
        # consts first, as one copy of the dict (silero's branches hold ~50: inserting them
        # one by one into a fresh dict resized it four times a call); captured names are
        # never consts (see __init__), so the order does not change what a name holds
        env = self.consts.copy()
        env.update({nm: outer[nm] for nm in self.captured if nm in outer})
        env.update(zip(self.graph.inputs, inputs))
        self._execute(env, None if progress is None else (lambda i, n, label: progress(None, n, label)), attention)
        return [env[nm] for nm in self.graph.outputs]

    def _plan_steps(self) -> list:
        """The plan of the current `steps` (see the class docstring), cached."""
        steps = self.steps
        src = self._plan_src
        if len(src) == len(steps) and all(map(operator.is_, src, steps)):
            return self._plan
        from .reference.kernels import KERNELS as REF
        plan = []
        for n, fn, attrs, dead in steps:
            subs = self.subprograms.get(id(n))
            ins, outs = tuple(n.inputs), tuple(n.outputs)
            if subs and fn is REF.get("if") and set(subs) == {"then_branch", "else_branch"} and len(ins) == 1:
                kind = _IF
            elif subs:
                kind = _REGIONS
            elif fn is REF.get("identity") and len(ins) == 1 and ins[0] and len(outs) == 1:
                kind = _ALIAS
            else:
                kind = _CALL
            plan.append((kind, fn, ins, outs, attrs, tuple(dead), subs, n.label()))
        self._plan, self._plan_src = plan, tuple(steps)
        return plan

    def _execute(self, env: dict, progress: Progress | None, attention: list | None = None) -> None:
        plan = self._plan_steps()
        total = len(plan)
        env[""] = None  # an omitted optional input reads as None
        get = env.__getitem__
        i = 0
        for kind, fn, ins, outs, attrs, dead, subs, label in plan:
            i += 1
            if kind == _ALIAS:
                env[outs[0]] = env[ins[0]]
            else:
                try:
                    if kind == _CALL:
                        res = fn(*map(get, ins), **attrs)
                    elif kind == _IF:
                        c = env[ins[0]]
                        res = tuple(subs["then_branch" if bool(np.asarray(c).reshape(-1)[0]) else "else_branch"]
                                    .call([], env, progress, attention))
                    else:
                        regions = {k: (lambda xs, p=p: p.call(xs, env, progress, attention)) for k, p in subs.items()}
                        res = fn(*map(get, ins), **attrs, _regions=regions)
                except InputError as e:
                    if str(e).startswith(self.graph.source):
                        raise
                    # a kernel's own check (a size the process cannot have): named like a failure
                    raise InputError(f"{self.graph.source}: {label}: {e}") from e
                except NpurunError:
                    raise
                except Exception as e:  # a kernel failure names the node, never a bare traceback
                    args = [env.get(nm) for nm in ins]
                    raise NpurunError(f"{self.graph.source}: {label} failed on inputs ({_describe(args)}): "
                                      f"{e.__class__.__name__}: {e}") from e
                if isinstance(res, tuple):
                    if len(res) < len(outs) and any(outs[len(res):]):
                        # (a Loop or Scan that ran no iteration has no scan outputs to stack)
                        raise NpurunError(f"{self.graph.source}: {label} gave {len(res)} of its {len(outs)} "
                                          f"outputs ({', '.join(outs[len(res):])} missing)")
                    for nm, arr in zip(outs, res):
                        env[nm] = arr
                elif outs:
                    env[outs[0]] = res
            for nm in dead:
                env.pop(nm, None)
            if progress and (attention is None or attention[0]):
                progress(i, total, label)
        del env[""]


_CALL, _ALIAS, _IF, _REGIONS = range(4)


def _describe(args) -> str:
    def one(a):
        if isinstance(a, np.ndarray):
            return f"{a.dtype}{list(a.shape)}"
        if isinstance(a, list):
            return f"sequence of {len(a)}"
        return "none" if a is None else type(a).__name__
    return ", ".join(one(a) for a in args if a is not None)
