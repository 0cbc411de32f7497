"""The `cpu` backend: a compiled Program over the host CPU.

Convolutions run the compiled implicit-GEMM / depthwise kernels of `csrc/` (see
`nativeconv.py`; `native.py` loads them) with the bias and a following activation fused
into their epilogue, bands of output rows spread over the Executor's `parallelism` threads.
Where the compiled kernels are not built or cannot run on this CPU, dense convolutions take
the NumPy banded im2col kernel of `conv.py` and the reason shows in `npurun info`.
Activations on float32 run the compiled elementwise kernel; every other op runs its
reference kernel with NumPy's BLAS limited to `parallelism` threads. Each fast kernel is
checked against the reference kernel in tests/test_cpu_*.py.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import register
from ..base import Backend, Program
from ..reference.kernels import KERNELS
from . import blas, conv, fuse, fuse_transformer, native, nativeconv
from .ops import FACTORIES
from .ops.conv1d import CHEAP_IN_C

ACTIVATIONS = native.ACTIVATIONS
BIG = 1 << 14  # elements; a smaller activation is not worth a second thread (C pool: ~1-5 us a hand-off)
SMALL = 4096  # elements; a smaller activation runs its NumPy reference kernel


class CpuProgram(Program):
    def __init__(self, graph, backend: "CpuBackend"):
        self.threads = backend.parallelism
        self.pool = backend.pool
        kernels = dict(KERNELS)
        kernels["conv"] = self._conv
        if native.LIB is not None:
            for a in ACTIVATIONS:
                kernels[a] = self._activation(a)
        for op, make in FACTORIES.items():  # cpu/ops/: attention, recurrent cells, ...
            kernels[op] = make(self)
        # id(fused-away node) -> the conv that now computes it (ops-report shows this); regions
        # add theirs while the base class compiles them
        self.fused: dict = {}
        super().__init__(graph, kernels, backend.name)
        self.fused.update(_optimize(self))

    def _subprogram(self, region, known):
        """A control-flow region (silero's `if` branches run every chunk) gets the same
        epilogue fusion and packed-weight caches as the top-level program."""
        sub = Program(region, self.kernels, self.backend, known)
        self.fused.update(_optimize(sub))
        return sub

    def _conv(self, x, w, b=None, *, _act=None, _act_attrs=None, _cache=None, **attrs):
        if nativeconv.applies(x, w, attrs):
            return nativeconv.conv2d(x, w, b, attrs, _act, _act_attrs, self.pool, self.threads,
                                     {} if _cache is None else _cache)
        if conv.fast_conv_applies(x, w, attrs) and (_act is None or _act in conv.EPILOGUES):
            return conv.conv2d(x, w, b, attrs, _act, _act_attrs, self.pool, self.threads)
        return _reference_act(KERNELS["conv"](x, w, b, **attrs), _act, _act_attrs)

    def _activation(self, name):
        ref = KERNELS[name]

        def run(x, *extra, **attrs):
            # A small tensor is cheaper in NumPy than through a ctypes call (~2-3 us), except
            # for the sigmoid family, whose overflow-safe NumPy form costs ~9 us on any size.
            if x.dtype != np.float32 or (x.size < SMALL and name not in CHEAP_IN_C) \
                    or (name == "clip" and not _scalar_bounds(extra)):
                return ref(x, *extra, **attrs)
            if name == "clip":
                attrs = {"_min": None if extra[0] is None else float(extra[0]),
                         "_max": None if len(extra) < 2 or extra[1] is None else float(extra[1])}
            code, alpha, beta = native.act_params(name, attrs)
            x = np.ascontiguousarray(x)
            y = np.empty_like(x)
            if x.size >= BIG and self.threads > 1:  # parts on the library's spinning pool
                native.LIB.npr_activation_mt(native.ptr(x), native.ptr(y), x.size, code, alpha, beta,
                                             self.threads, self.threads)
            else:
                native.LIB.npr_activation(native.ptr(x), native.ptr(y), x.size, code, alpha, beta)
            return y
        return run

    def run(self, feeds, progress=None):
        # BLAS threads are process-wide: held to ours for the duration of this run only.
        return blas.with_threads(self.threads, lambda: super(CpuProgram, self).run(feeds, progress))


def _optimize(prog: Program) -> dict:
    """Fuse epilogues and chains over `prog`'s steps; give convs with constant weights a cache
    that keeps them packed between runs (weights that are inputs may change from run to run:
    those are packed each time). Returns {id(node fused away): the node that computes it}."""
    # Transformer patterns first (GELU, masked softmax, matmul + bias + residual, gathered
    # embeddings): the chain rules would otherwise take parts of them.
    fused = fuse_transformer.fuse(prog)
    fused.update(fuse.fuse_epilogues(prog, native.LIB is not None))
    for k, (n, fn, attrs, dead) in enumerate(prog.steps):
        w = prog.graph.values.get(n.inputs[1]) if n.op == "conv" else None
        if w is not None and w.is_const:
            prog.steps[k] = (n, fn, {**attrs, "_cache": {}}, dead)
    return fused


def _reference_act(y, act, act_attrs):
    """A fused activation the fast kernels could not take, by the reference kernels."""
    if act is None:
        return y
    if act == "silu":
        return y * KERNELS["sigmoid"](y)
    if act == "clip":
        lo, hi = act_attrs["_min"], act_attrs["_max"]
        return KERNELS["clip"](y, None if lo is None else np.array(lo, y.dtype),
                               None if hi is None else np.array(hi, y.dtype))
    return KERNELS[act](y, **act_attrs)


def _scalar_bounds(extra) -> bool:
    return all(e is None or e.size == 1 for e in extra)


def has_cpu_kernel(node, graph) -> bool:
    """The cpu backend has no kernel of its own for this op; the reference kernel runs it."""
    return node.op in CPU_KERNELS


def conv_is_2d(node, graph) -> bool:
    """Neither a 1-D nor a 2-D convolution; the fast conv kernels take NCL and NCHW only."""
    return node.op != "conv" or graph is None or len(graph.values[node.inputs[0]].shape) in (3, 4)


def conv_is_dense(node, graph) -> bool:
    """A grouped or depthwise convolution, which only the compiled kernels take, and they are
    not in use here (see `npurun info`)."""
    return node.op != "conv" or node.attrs.get("group", 1) == 1 or native.LIB is not None


def is_float32(node, graph) -> bool:
    """Not float32; the fast conv kernels compute in float32."""
    return node.op != "conv" or graph is None or graph.values[node.inputs[0]].dtype == "f32"


CPU_KERNELS = {"conv"} | (set(ACTIVATIONS) if native.LIB is not None else set()) | set(FACTORIES)


def _doc() -> str:
    how = (f"compiled {native.ISA} kernels (csrc/: convs incl. Winograd, chains, transformer, "
           f"integer ops)" if native.LIB is not None else f"NumPy kernels only: {native.REASON}")
    return f"Compiled programs on the host CPU: {how}, fused epilogues, threads = parallelism."


@register
class CpuBackend(Backend):
    __doc__ = _doc()

    name = "cpu"
    rules = (has_cpu_kernel, conv_is_2d, conv_is_dense, is_float32)
    fallback = "reference"

    def __init__(self, target=None, parallelism=1):
        super().__init__(target, parallelism)
        self.pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="npurun-cpu") \
            if parallelism > 1 else None

    def compile(self, graph):
        return CpuProgram(graph, self)

