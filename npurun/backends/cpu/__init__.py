"""The `cpu` backend: a compiled Program over the host CPU.

Convolutions run the compiled implicit-GEMM / depthwise kernels of `csrc/` (see
`nativeconv.py`; `native.py` loads them) with the bias and a following activation fused
into their epilogue, bands of output rows spread over the Executor's `parallelism` threads of
the library's one thread pool (csrc/par.c; there is no Python thread pool).
Where the compiled kernels are not built or cannot run on this CPU, dense convolutions take
the NumPy banded im2col kernel of `conv.py` and the reason shows in `npurun info`.
Activations on float32 run the compiled elementwise kernel; every other op runs its
reference kernel with NumPy's BLAS held to one thread (to `parallelism` threads where the
compiled kernels are not built: then it is the only threading). Each fast kernel is
checked against the reference kernel in tests/test_cpu_*.py.
"""
from __future__ import annotations

import numpy as np

from .. import register
from ... import util
from ...ir.stored import Stored
from ...passes.rewrite import readers
from ..base import Backend, Program
from ..reference.kernels import KERNELS
from . import blas, conv, native, nativeconv, replay
from .ops import FACTORIES
from .ops import fused as fused_ops
from .ops.conv1d import CHEAP_IN_C

ACTIVATIONS = native.ACTIVATIONS
BIG = 1 << 14  # elements; a smaller activation is not worth a second thread (C pool: ~1-5 us a hand-off)
SMALL = 4096  # elements; a smaller activation runs its NumPy reference kernel
# bytes; a smaller weight keeps its float32 array beside its packs unless every product's rows
# are known to be past NumPy's dot (CpuProgram._worth_releasing): a product under
# fused.SMALL_FLOP (2 * rows * K * N; ~3 us against the packed call's ~17) runs NumPy's dot,
# which reads the array. From this size on, even one row is not.
RELEASE_MIN = 2 * fused_ops.SMALL_FLOP

# Kernels allocate their outputs every run: freed pages are kept for the next one (native.py says why).
native.keep_freed_pages()


class CpuProgram(Program):
    """The graph as the pipeline lowered it (passes/pipeline.py: conv epilogues, fused ops of
    ir/ops/fused.py), one kernel per node picked here (`lower`): nothing is rewritten."""

    def __init__(self, graph, backend: "CpuBackend"):
        self.threads = backend.parallelism
        self._backend = backend
        self.graph = graph  # (Program.__init__ sets it too; the weight scan below reads it)
        self._packs: dict = {}  # weight (its Stored, or its array's id) -> packed copy, shared
        self._readers = readers(graph)  # (a region's captures count as its owner's reads)
        self._aliases: dict = {}  # Stored -> every name it goes by (Identity aliases share it)
        self._flush = native.LIB is not None and native.flush_subnormals()
        plain: dict = {}  # weights the passes made (no file holds them): id -> (array, names)
        for nm, v in graph.values.items():
            if isinstance(v.stored, Stored):
                self._aliases.setdefault(v.stored, []).append(nm)
            elif isinstance(v.stored, np.ndarray) and v.stored.dtype == np.float32 and v.stored.ndim == 2:
                plain.setdefault(id(v.stored), (v.stored, []))[1].append(nm)
        # Such a weight, if only linear nodes read it, is held by a Stored whose bytes come back
        # from its packed panels (fused.PackedSource), so it too lives in its packs alone.
        for a, names in plain.values():
            if self._worth_releasing(names, a.nbytes) and self._linear_only(names, plain=True):
                holder = Stored(fused_ops.PackedSource(), 0, a.dtype, a.shape, a)
                for nm in names:
                    graph.values[nm].stored = holder
                self._aliases[holder] = names
        plain = a = None  # (held here, the arrays would outlive their packing)
        self._released = 0
        kernels = dict(KERNELS)
        kernels["conv"] = self._conv
        if native.LIB is not None:
            for a in ACTIVATIONS:
                kernels[a] = self._activation(a)
            kernels["swish"] = self._swish
        for op, make in FACTORIES.items():  # cpu/ops/: attention, recurrent cells, ...
            kernels[op] = make(self)
        super().__init__(graph, kernels, backend.name)
        self._replays = replay.Replays(self) if replay.enabled() else None
        self._cheap = False  # (set while the program has a recording, or is making one: replay.py)
        if self._released:
            util.trim_malloc()

    def lower(self, node, fn):
        """A conv or a linear layer with constant weights gets a kernel of its own, whose
        cache keeps them packed between runs (weights that are inputs may change from run to
        run: those are packed on each)."""
        if node.op == "conv" and node.precision in (None, "f32") and self._const(node.inputs[1]):
            return nativeconv.conv_step(fn, {})
        if node.op in ("matmul", "matmul_add") and node.precision in (None, "f32") and fn is not None \
                and self._const(node.inputs[1], ndim=2):
            # One packed copy per weight, shared by every node that reads it, under any name
            # (ALBERT's 12 layers read one set of 6 matrices through Identity nodes: packed
            # per node, 12 copies, peak RSS 465 MB against ORT's 161). Keyed by the weight's
            # Stored, or by its array's id where the graph holds the array (so the id stays its).
            v = self.graph.values[node.inputs[1]]
            if self._packed_only(v):
                kernel, standin = fused_ops.packed_linear_kernel(self, fn, self._packs.setdefault((v.stored, 0, 1.0), {}), v.stored)
                self.consts[v.name] = standin  # the float32 array is let go: nothing here holds it
                self._released += 1
                return kernel
            return fused_ops.linear_kernel(self, fn, self._packs.setdefault(id(v.data), {}))
        if node.op == "gemm" and node.precision in (None, "f32") and fn is not None and self._const(node.inputs[1], ndim=2):
            v = self.graph.values[node.inputs[1]]
            if self._packed_only(v):
                kernel, standin = fused_ops.gemm_kernel(self, node, self.graph, fn, self._packs)
                self.consts[v.name] = standin
                self._released += 1
                return kernel
            return fused_ops.gemm_kernel(self, node, self.graph, fn)
        return fn

    def _const(self, name, ndim=None) -> bool:
        v = self.graph.values.get(name)  # (shape, not data: a let-go weight is not read again)
        return v is not None and v.is_const and (ndim is None or v.shape is not None and len(v.shape) == ndim)

    def _packed_only(self, v) -> bool:
        """Whether weight `v` can live in its packed copy alone: a float32 matrix read from the
        model file (a Stored) worth releasing (`_worth_releasing`), that only linear nodes read,
        as their weight operand (matmul, matmul_add, gemm), with the compiled kernels there to
        run them."""
        s = v.stored
        if not isinstance(s, Stored) or s.dtype != np.float32 or len(s.shape) != 2:
            return False
        names = self._aliases.get(s, [])
        return self._worth_releasing(names, s.nbytes) and \
            self._linear_only(names, plain=isinstance(s.source, fused_ops.PackedSource))

    def _worth_releasing(self, names, nbytes: int) -> bool:
        """A weight of RELEASE_MIN bytes or more, or a smaller one that every product reads with
        a known number of rows too large for NumPy's dot (fused.SMALL_FLOP): nothing would read
        its array again. (ELECTRA-small's 1 MB matrices over 128 tokens were held twice, array
        and panels: 15 MB over ORT's peak RSS.) A product whose rows are not known keeps it."""
        if nbytes >= RELEASE_MIN:
            return True
        for nm in names:
            for n in self._readers.get(nm, ()):
                a = self.graph.values.get(n.inputs[0])
                shape = None if a is None else a.shape
                if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
                    return False
                rows = shape[-1] if n.op == "gemm" and n.attrs.get("trans_a") else int(np.prod(shape[:-1]))
                if 2 * rows * nbytes // 4 < fused_ops.SMALL_FLOP:
                    return False
        return True

    def _linear_only(self, names, plain: bool) -> bool:
        """Whether only linear nodes read the weight that goes by `names`, as their weight
        operand, with the compiled kernels there to run them; for one that comes back from its
        panels (`plain`), gemm's alpha is 1 (panels scaled by alpha would not give it back)."""
        if native.LIB is None:
            return False
        nodes = [n for nm in names for n in self._readers.get(nm, ())]
        return bool(nodes) and not set(names) & set(self.graph.outputs) and all(
            n.op in ("matmul", "matmul_add", "gemm") and n.precision in (None, "f32") and not n.regions
            and n.inputs[1] in names and not set(names) & set(n.inputs[:1] + n.inputs[2:])
            and not (plain and n.op == "gemm" and n.attrs.get("alpha", 1.0) != 1.0) for n in nodes)

    def _subprogram(self, region):
        """A control-flow region's program is a cpu program too (its kernels use this one's
        threads and pool)."""
        return CpuProgram(region, self._backend)

    def _conv(self, x, w, b=None, *, activation="", activation_params=(), _cache=None, **attrs):
        act, act_attrs = native_activation(activation, activation_params)
        if nativeconv.applies(x, w, attrs) and act is not False:
            if _cache is None:
                return nativeconv.conv2d(x, w, b, attrs, act, act_attrs, self.threads, {})
            return nativeconv.conv2d(x, w, b, attrs, act, act_attrs, self.threads, _cache, memo=True)
        if act is not False and conv.fast_conv_applies(x, w, attrs) and (act is None or act in conv.EPILOGUES):
            return conv.conv2d(x, w, b, attrs, act, act_attrs)
        return KERNELS["conv"](x, w, b, activation=activation, activation_params=activation_params, **attrs)

    def _activation(self, name):
        ref = KERNELS[name]

        def run(x, *extra, **attrs):
            # A small tensor is cheaper in NumPy than through a ctypes call (~2-3 us), except
            # for the sigmoid family, whose overflow-safe NumPy form costs ~9 us on any size.
            if x.dtype != np.float32 or (native.small(x.size, SMALL) and name not in CHEAP_IN_C) \
                    or (name == "clip" and not _scalar_bounds(extra)):
                return ref(x, *extra, **attrs)
            if name == "clip":
                attrs = {"_min": None if extra[0] is None else float(extra[0]),
                         "_max": None if len(extra) < 2 or extra[1] is None else float(extra[1])}
            return self._native_act(x, *native.act_params(name, attrs))
        return run

    def _swish(self, x, *, alpha):
        """SiLU (alpha 1) through the C activation kernel; other alphas by the reference."""
        if x.dtype != np.float32 or alpha != 1.0:
            return KERNELS["swish"](x, alpha=alpha)
        return self._native_act(x, native.ACTS["silu"], 0.0, 0.0)

    def _native_act(self, x, code, alpha, beta):
        x = np.ascontiguousarray(x)
        y = np.empty_like(x)
        if x.size >= BIG and self.threads > 1:  # parts on the library's spinning pool
            native.LIB.npr_activation_mt(native.ptr(x), native.ptr(y), x.size, code, alpha, beta,
                                         self.threads, self.threads)
        else:
            native.LIB.npr_activation(native.ptr(x), native.ptr(y), x.size, code, alpha, beta)
        return y

    def run(self, feeds, progress=None, attention=None):
        # A short run is replayed from a recording of its kernel calls (replay.py); one with a
        # progress callback only where the scheduler's attention flag says no boundary is due.
        if self._replays is not None and (progress is None or (attention is not None and not attention[0])):
            out = self._replays.run(feeds, progress, attention)
            if out is not None:
                return out
        return self._run(feeds, progress, attention)

    def _run(self, feeds, progress=None, attention=None):
        """A normal run: the step list in Python (Program.run), in the program's run mode (_within)."""
        return self._within(lambda: super(CpuProgram, self).run(feeds, progress, attention))

    def _within(self, fn):
        """fn() with BLAS held and subnormals flushed; in a program that is replayed, with the
        library's calls taken as cheap (native.CALLS: the kernels a normal run picks are then
        those its recording made)."""
        if self._cheap and not native.CALLS.cheap:
            native.CALLS.cheap = True
            try:
                return self._within(fn)
            finally:
                native.CALLS.cheap = False
        # BLAS threads are process-wide: held for the duration of this run only, to one thread
        # where the compiled kernels run (their pool, csrc/par.c, does the threading): OpenBLAS's
        # workers spin long after a product and took the second core from that pool (a
        # bidirectional LSTM's two directions at 2 threads: 10.1 ms with BLAS at 2, 6.4 at 1;
        # PP-OCRv4 det 0.85x, CvT-13 0.74x). Without them, NumPy's BLAS is the only threading.
        n = 1 if native.LIB is not None else self.threads
        if not self._flush:
            return blas.with_threads(n, fn)
        # subnormals flushed to zero for the run, on this thread and the kernels' workers
        # (native.flush_subnormals says why); the caller's mode is back when it returns
        old = native.LIB.npr_fp_enter()
        try:
            return blas.with_threads(n, fn)
        finally:
            native.LIB.npr_fp_leave(old)


_NATIVE_ACTS: dict = {}  # (activation, params) -> native_activation's answer, shared (read-only)


def native_activation(activation: str, params):
    """A conv's fused activation as the compiled epilogue takes it: (None, None) for none,
    (name, attrs) for one the C kernels apply, (False, None) for one they do not (the conv then
    runs the reference kernel, activation included). Answered once per (activation, params):
    every conv step asks (~1.8 us a call worked out, ~0.2 looked up); the attrs dict returned
    is shared, never to be changed, and its identity lets a conv's plan cache skip comparing it."""
    if not activation:
        return None, None
    key = (activation, tuple(params))
    hit = _NATIVE_ACTS.get(key)
    if hit is None:
        hit = _NATIVE_ACTS[key] = _native_activation(activation, params)
    return hit


def _native_activation(activation: str, params):
    if activation == "swish":
        return ("silu", {}) if params[0] == 1.0 else (False, None)
    if activation not in native.ACTS:
        return False, None
    if activation == "clip":
        return "clip", {"_min": params[0], "_max": params[1]}
    from ...ir.ops.elementwise import FUSABLE_ACTIVATIONS
    return activation, dict(zip(FUSABLE_ACTIVATIONS[activation], params))


def _scalar_bounds(extra) -> bool:
    return all(e is None or e.size == 1 for e in extra)


def has_cpu_kernel(node, graph) -> bool:
    """The cpu backend has no kernel of its own for this op; the reference kernel runs it."""
    return node.op in CPU_KERNELS or node.op in FACTORIES  # (FACTORIES: also ops registered later)


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


# (gemm: CpuProgram.lower gives one by a constant weight its own kernel)
CPU_KERNELS = {"conv", "gemm"} | (set(ACTIVATIONS) if native.LIB is not None else set()) | set(FACTORIES)


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

    def compile(self, graph):
        return CpuProgram(graph, self)

