"""The cpu backend's compiled kernels (csrc/, built by `pip install` through setup.py), loaded
with ctypes. ctypes releases the GIL for the length of each call, so Python threads calling
these kernels on different bands of an image run in parallel.

`LIB` is None when the library is missing or cannot run here; `REASON` then says why, and
the backend falls back to its NumPy kernels (`npurun info` shows the reason).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
import threading
import time
from pathlib import Path

import numpy as np

# Activations the compiled elementwise kernel and conv epilogue take (silu only as an epilogue).
ACTIVATIONS = ("relu", "tanh", "sigmoid", "leaky_relu", "clip", "hard_sigmoid", "hard_swish")
# Activation codes of csrc/act.h; (alpha, beta) come from the node's attributes.
ACTS = {"relu": 1, "tanh": 2, "sigmoid": 3, "leaky_relu": 4, "clip": 5, "silu": 6,
        "hard_sigmoid": 7, "hard_swish": 8}


def act_params(act: str | None, attrs: dict | None) -> tuple[int, float, float]:
    """(code, alpha, beta) of an activation for the C epilogue; code 0 is none."""
    if act is None:
        return 0, 0.0, 0.0
    attrs = attrs or {}
    if act == "leaky_relu":
        return ACTS[act], float(attrs.get("alpha", 0.01)), 0.0
    if act == "clip":
        lo, hi = attrs.get("_min"), attrs.get("_max")
        return ACTS[act], float(-np.inf if lo is None else lo), float(np.inf if hi is None else hi)
    if act == "hard_sigmoid":
        return ACTS[act], float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    if act == "hard_swish":
        return ACTS[act], 1 / 6, 0.5
    return ACTS[act], 0.0, 0.0


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _signatures() -> dict:
    """Every entry point of the library: name -> (argtypes, restype). The one place the cpu
    backend declares its C signatures; the modules call native.LIB's functions directly."""
    P, I, F, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long
    conv = [P, I, I, I, P, P, I] + [I] * 8 + [I, F, F, P]  # x, C, H, W, w, bias, M, geometry, act: y
    sig = {
        # conv.c: depthwise, standalone activations
        "npr_dwconv2d": ([P, I, I, I, P, P] + [I] * 8 + [I, F, F, P, I, I, I, I], I),
        "npr_dwconv2d_mt": ([P, I, I, I, P, P] + [I] * 8 + [I, F, F, P, I, I, I, I, I, I, I], I),
        # dwconv_cl.c: depthwise with the channels in the lanes (small maps, strides)
        "npr_dwconv2d_cl": ([P, I, I, I, P, P] + [I] * 8 + [I, F, F, P, I, I, I, I], I),
        "npr_dwconv2d_cl16": ([P, I, I, I, P, P] + [I] * 8 + [I, F, F, P, I, I, I, I], I),
        "npr_dwconv2d_avx512": ([P, I, I, I, P, P] + [I] * 8 + [I, F, F, P, I, I, I, I], I),
        # dwconv_flat.c: depthwise on small maps, a plane as one flat row (AVX-512)
        "npr_dwconv2d_flat": ([P, I, I, I, P, P] + [I] * 8 + [I, F, F, P, I, I, I, I], I),
        "npr_dwconv2d_flat_fits": ([I] * 10, I),
        "npr_activation": ([P, P, L, I, F, F], None),
        # par.c: the floating-point mode of a run (flush_subnormals)
        "npr_fp_enter": ([], ctypes.c_uint),
        "npr_fp_leave": ([ctypes.c_uint], None),
        "npr_activation_mt": ([P, P, L, I, F, F, I, I], None),
        # chain.c: elementwise chains and per-channel ops
        "npr_affine_act": ([P, P, L, F, F, I, F, F, F, F], None),
        "npr_add_act_mt": ([P, P, P, L, I, F, F, I, I], None),
        # transpose.c: a transposed view made contiguous
        "npr_transpose_mt": ([P, P, L, L, L, L, L, I, I], None),
        "npr_channel_affine_act": ([P, P, L, L, L, P, P, I, F, F], None),
        "npr_channel_affine_mt": ([P, P, L, L, L, P, P, I, F, F, I, I], None),
        "npr_prelu_channels": ([P, P, L, L, L, P], None),
        "npr_binary": ([I, P, P, P, I, P, P, P], None),
        "npr_binary_mt": ([I, P, P, P, I, P, P, P, I, I], None),
        "npr_copy": ([P, P, I, P, P, P, L], None),
        "npr_take": ([P, P, P, L, L, L, L], I),
        "npr_unary": ([I, P, P, L], None),
        # resize.c: one axis of an interpolating resize (ops/vision.py)
        "npr_resize_axis": ([P, P, L, L, L, L, P, P, I], None),
        "npr_resize_axis_mt": ([P, P, L, L, L, L, P, P, I, I, I], None),
        # pool.c: max pooling over planes [p0, p1)
        "npr_maxpool2d": ([P, P, L, L] + [I] * 10, I),
        "npr_maxpool2d_mt": ([P, P, L] + [I] * 12, I),
        "npr_plane_means_mt": ([P, P, L, L, I, I], None),  # ... and global average pooling
        # color.c: zoo/espcn.py's YCbCr -> RGB merge
        "npr_ycc_to_rgb": ([P, P, P, P, P, P, L], None),
        # transformer.c and gemm_mt.c: erf, GELU, LayerNorm, softmax, the packed sgemm
        "npr_erf": ([P, P, L], None),
        "npr_erf_mt": ([P, P, L, I, I], None),
        "npr_gelu": ([P, P, L, F, F, F, I], None),
        "npr_gelu_mt": ([P, P, L, F, F, F, I, I, I], None),
        "npr_layernorm": ([P, P, P, P, P, P, L, L, L, F], None),
        "npr_layernorm_mt": ([P, P, P, P, P, P, L, L, F, I, I], None),
        "npr_rmsnorm": ([P, P, P, P, P, P, P, L, L, L, F], None),
        "npr_softmax": ([P, P, P, L, L, L, L, L, I, F], None),
        "npr_softmax_avx512": ([P, P, P, L, L, L, L, L, I, F], None),
        "npr_softmax_mt": ([P, P, P, L, L, L, L, I, F, I, I, I], None),
        # im2col_gemm.c: a dense conv as im2col + the packed sgemm, a panel of pixels at a time
        "npr_im2col_gemm_mt": ([P, L, L, L, L, P, L] + [I] * 8 + [I, F, F, P, L, L, I, I, L, L, I, I], I),
        "npr_gemm_range_mt": ([I, P, P, P, P, P, L, L, L, L, L, I, I], None),
        "npr_gemm_rows_mt": ([I, P, P, P, P, P, L, L, L, L, L, I, I], None),
        "npr_gemm_q8_range_mt": ([I, P, P, P, P, P, P, L, L, L, L, L, P, L, I, I], None),
        # gemm_mt.c: a conv as the transposed product (nativeconv._tgemm)
        "npr_tconvk_range_mt": ([I, P, L, L, L, L] + [I] * 8 + [L, L, P, P, P, L, I, F, F, L, L, I, I], I),
        "npr_tconvk_groups_mt": ([I, P, L, L, L, L, L] + [I] * 8 + [L, L, P, P, P, L, I, F, F, L, L, I], I),
        "npr_bmm_mt": ([I, P, P, P, L, L, L, L, I, I, L, L], I),
        # nbits.c: 4-bit MatMulNBits with int8 activations (contrib/nbits.py)
        "npr_q8_rows": ([P, L, L, L, P, P], None),
        "npr_q4_gemm_mt": ([P, P, P, P, P, P, P, L, L, L, L, I, I], None),
        "npr_q4_prep_a": ([P, L, L, L, L, P, P, P], None),
        "npr_q4_gemm_vnni_mt": ([P, P, P, P, P, P, P, P, L, L, L, I, I], None),
        # attend.c: attention of a few query rows over a KV cache (contrib/gqa.py, ops/attention.py)
        "npr_gqa_step": ([P, L, P, P, L, P, P, L, L, L, I, I, I, P, P, I, I, F, P, P], None),
        "npr_attention_rows": ([P, L, L, L, L, P, L, L, L, P, L, L, L, L, L, L, P, L, L, L, L, F, P, P], None),
        # recurrent.c: the LSTM and GRU recurrences
        "npr_lstm_f32": ([P, P, P, P, P, L, I, I, I, I, I, I], I),
        "npr_gru_f32": ([P, P, P, P, P, L, I, I, I, I, I, I, I], I),
        "npr_recurrent2_mt": ([I] + [P] * 12 + [L, I, I, I, I, I, I, I], I),
    }
    for isa in ("avx2", "avx512"):
        sig.update({
            f"npr_conv2d_{isa}": (conv + [I, I, I, I, L, I], I),            # conv.c: implicit GEMM
            f"npr_conv2d_{isa}_mt": (conv + [I, I, I, I, I, I, I, I], I),   # ... threads, chunks, r0, r1
            f"npr_convg_{isa}": (conv + [I, I, L, L], I),                    # conv_gemm.c: flat pixels
            f"npr_convg_{isa}_mt": (conv + [I, I, I, I, L, L], I),          # ... pixels [lo, hi)
            f"npr_convg_{isa}_mr": ([], I),
            f"npr_convg_{isa}_nr": ([], I),
            f"npr_wino_{isa}": ([P, I, I, I, P, P, I, I, I, I, F, F, P, I, I, I, I, I], I),  # winograd.c
            f"npr_wino_{isa}_mt": ([P, I, I, I, P, P, I, I, I, I, F, F, P, I, I, I, I, I, I, I], I),
            f"npr_wino_mr_{isa}": ([], I),
            f"npr_smallc_{isa}": ([P, I, I, I, P, P, I] + [I] * 4 + [I, F, F, P, I, I, I, I, I], I),  # smallc.c
            f"npr_smallc_{isa}_mt": ([P, I, I, I, P, P, I] + [I] * 4 + [I, F, F, P, I, I, I, I, I, I, I], I),
            f"npr_smallc_mr_{isa}": ([], I),
            f"npr_gemm_pack_{isa}": ([P, P, L, L], None),                     # transformer.c's sgemm
            f"npr_gemm_{isa}": ([P, P, P, P, P, L, L, L, L, L], None),
            f"npr_gemm_nr_{isa}": ([], I),
            f"npr_gemm_q8_{isa}": ([P, P, P, P, P, P, L, L, L, L, L, P], None),
        })
    return sig


def entry_points() -> list[str]:
    """The names of every entry point of the library (its declared signatures)."""
    return list(_signatures())


def _load():
    here = Path(__file__).parent
    files = [here / f"_kernels{s}" for s in importlib.machinery.EXTENSION_SUFFIXES]
    lib_file = next((f for f in files if f.exists()), None)
    if lib_file is None:
        return None, ("the compiled kernels are not built (no C compiler at `pip install`?); "
                      "reinstall with `pip install -e .` where gcc is available")
    missing = {"avx2", "fma"} - _cpu_flags()
    if missing:
        return None, f"this CPU lacks {', '.join(sorted(missing))}, which the compiled kernels need"
    try:
        lib = ctypes.CDLL(str(lib_file))
    except OSError as e:
        return None, f"{lib_file.name} does not load: {e}"
    try:
        for name, (args, res) in _signatures().items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
    except AttributeError as e:
        return None, f"{lib_file.name} lacks an entry point ({e}): rebuild with `pip install -e .`"
    return lib, ""


def conv_isas() -> list[str]:
    """The dense conv kernels this CPU runs, widest first."""
    return (["avx512"] if "avx512f" in _cpu_flags() and "avx512dq" in _cpu_flags() else []) + ["avx2"]


def vnni() -> bool:
    """Does this CPU run the AVX-512 VNNI kernels (nbits.c)?"""
    return {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= _cpu_flags()


LIB, REASON = _load()
# The widest kernel by default; NPURUN_CPU_ISA=avx2 forces the narrower one (tests run both).
ISA = os.environ.get("NPURUN_CPU_ISA") or conv_isas()[0]
if ISA not in conv_isas():
    ISA = conv_isas()[-1]


def conv2d_fn(isa: str | None = None):
    return getattr(LIB, f"npr_conv2d_{isa or ISA}")


def wino_fn(isa: str | None = None):
    """The Winograd F(4x4, 3x3) kernel and the row count its packed weights need."""
    isa = isa or ISA
    return getattr(LIB, f"npr_wino_{isa}"), getattr(LIB, f"npr_wino_mr_{isa}")()


# ptr(a): the address of a's first element for a ctypes call (0, NULL, for None); the
# bindings' only way to take one. The C helper takes ~0.05 us, numpy's `a.ctypes.data` ~1.2
# (csrc/py/addr.c says why that matters).
try:
    from ._addr import addr as ptr
except ImportError:  # pragma: no cover -- setup.py builds it on every platform
    def ptr(a: np.ndarray | None) -> int:
        return 0 if a is None else a.ctypes.data


try:  # bound calls (csrc/py/addr.c): x86-64 System V only, else None
    from ._addr import bind as _bind, call as _call
except ImportError:
    _bind = _call = None


def bound(fn, args: tuple, x_at: int, y_at: int):
    """call(x, y) -> fn's return value: `fn(*args)` with args[x_at] and args[y_at] replaced by
    the addresses of x and y (arrays, or None for NULL; y_at -1: no output slot). Every other
    argument is converted once, here, by fn's declared types (a conv kernel's 22 arguments
    through ctypes: ~2.5 us a call; bound: ~0.3). The caller keeps alive every array whose
    address is in `args`. Where csrc/py/addr.c's bound calls are not built, a ctypes call."""
    types = fn.argtypes
    if _bind is None or len(types) != len(args) or ctypes.c_double in types:
        def call(x, y, _fn=fn, _args=list(args)):
            a = _args.copy()
            a[x_at] = ptr(x)
            if y_at >= 0:
                a[y_at] = ptr(y)
            return _fn(*a)
        return call
    ints, floats, at = [], [], {}
    for k, (t, v) in enumerate(zip(types, args)):
        if t is ctypes.c_float:
            floats.append(float(v))
        else:
            at[k] = len(ints)
            ints.append(0 if v is None or k in (x_at, y_at) else int(v))
    rec = _bind(ctypes.cast(fn, ctypes.c_void_p).value, tuple(ints), tuple(floats), at[x_at],
                at[y_at] if y_at >= 0 else -1)
    return functools.partial(_call, rec)


def flush_subnormals() -> bool:
    """Whether cpu programs run with subnormal float32 values flushed to zero
    (NPURUN_FLUSH_SUBNORMALS=0: they are not). Why flushed: an x86 core takes a microcode
    assist of ~100 cycles for every operation with a subnormal operand or result (below 2^-126).
    Trained weights have them (PP-OCRv4 rec: 31,350 of 2.7 M; its squeeze-excite 480->120 conv
    on a 1x1 map took 545 us against 16 with random weights), and weights that are tiny but
    normal make subnormal products (PP-OCRv5 det: 111 of a 192->384 conv's 384 filters dead at
    ~1e-37, the 20x20 conv 5.4 ms against 0.3). A product below 2^-126 is under float32's last
    bit of any sum it joins with a normal term. So during a run the calling thread's MXCSR has
    flush-to-zero and denormals-are-zero set (par.c's npr_fp_enter; restored after, so the
    caller's own NumPy keeps its semantics), and the kernels' workers copy that mode (par.h):
    the hardware's own mechanism, for weights, activations and products alike."""
    return os.environ.get("NPURUN_FLUSH_SUBNORMALS", "1") != "0"


class _Calls(threading.local):
    """Whether a call into the library is cheap on this thread now: in a program that is
    replayed (replay.py), a recorded call costs ~0.05 us against ~1-3 us through ctypes, so the
    kernels' size limits below which NumPy does the work (a ctypes call costing what it saves)
    do not hold; `small` then says no, and the work goes to the library, whose calls a replay
    makes without Python."""
    cheap = False


CALLS = _Calls()


def small(n: int, limit: int) -> bool:
    """Is work of size n below `limit`, where NumPy beats a ctypes call (never while calls are cheap)?"""
    return n < limit and not CALLS.cheap


TRANSPOSE_MIN = 1 << 14  # elements: a smaller view is NumPy's to copy (a ctypes call costs what it saves)


def _transpose_plan(x: np.ndarray):
    """(batch, rows, cols) when x is a contiguous float32 block seen with two groups of axes
    swapped after leading batch axes: memory (B, Q, P), x (B, P, Q); else None."""
    keep = [(n, s) for n, s in zip(x.shape, x.strides) if n != 1]
    if any(s <= 0 or s % 4 for _, s in keep):
        return None
    keep = [(n, s // 4) for n, s in keep]
    size = lambda axes: int(np.prod([n for n, _ in axes], dtype=np.int64))  # noqa: E731
    for m in range(len(keep) - 1):
        for p in range(m + 1, len(keep)):
            b, pp, q = keep[:m], keep[m:p], keep[p:]
            want = 1  # the strides of a contiguous (B, Q, P) block, innermost first
            for n, st in reversed(b + q + pp):
                if st != want:
                    break
                want *= n
            else:
                return size(b), size(q), size(pp)
    return None


def untranspose(x: np.ndarray, threads: int = 1) -> np.ndarray:
    """A float32 transposed view (token maps seen as channel maps and back) made contiguous by
    csrc/transpose.c's blocked transpose on the pool; any other x as it is."""
    if x.flags.c_contiguous or LIB is None or x.dtype != np.float32 or small(x.size, TRANSPOSE_MIN):
        return x
    plan = _transpose_plan(x)
    if plan is None:
        return x
    batch, rows, cols = plan
    y = np.empty(x.shape, np.float32)
    tiles = batch * -(-rows // 64) * -(-cols // 64)
    LIB.npr_transpose_mt(ptr(x), ptr(y), batch, rows, cols, rows * cols, cols, threads,
                         max(1, min(threads, tiles)))
    return y


def contiguous(x: np.ndarray, threads: int = 1) -> np.ndarray:
    """x as a C-contiguous array: x itself if it is one; a transposed view by `untranspose`;
    while calls are cheap (CALLS) any other view by `copy_into`; else np.ascontiguousarray
    (which copies a transposed view one float per cache line: 8 ms for a (1, 256, 4096) view
    of a (1, 4096, 256) block here)."""
    if CALLS.cheap and not x.flags.c_contiguous and x.size < TRANSPOSE_MIN:
        y = np.empty(x.shape, x.dtype)
        if copy_into(y, x):
            return y
    return np.ascontiguousarray(untranspose(x, threads))


def _strided_dims(shape: tuple, arrays, unit: int):
    """[size, each array's stride in `unit` bytes] per axis of `shape` longer than 1, outermost
    first, the arrays broadcast to `shape` (stride 0 along a broadcast axis), neighbouring axes
    merged where every array runs on contiguously across them; None where a stride is not
    whole units or more than 16 axes remain (csrc's strided loops take 16)."""
    nd = len(shape)
    dims: list = []
    for k, n in enumerate(shape):
        if n == 1:
            continue
        st = []
        for x in arrays:
            j = k - (nd - x.ndim)
            s = 0 if j < 0 or x.shape[j] == 1 else x.strides[j]
            if s % unit:
                return None
            st.append(s // unit)
        if dims and all(p == q * n for p, q in zip(dims[-1][1:], st)):
            dims[-1] = [dims[-1][0] * n, *st]  # (merged with the axis before)
        else:
            dims.append([n, *st])
    dims = dims or [[1] + [0] * len(arrays)]
    return dims if len(dims) <= 16 else None


def copy_into(y: np.ndarray, x) -> bool:
    """y[...] = x (x broadcast to y's shape, of y's dtype) by one call of csrc/transpose.c's
    npr_copy, axes merged where both run on contiguously; False (nothing done) where that call
    cannot (another dtype, object arrays, overlapping or more than 16 axes)."""
    if LIB is None or type(x) is not np.ndarray or x.dtype != y.dtype or y.dtype.hasobject \
            or not y.flags.writeable or np.may_share_memory(x, y):
        return False
    if y.size == 0:
        return True
    dims = _strided_dims(y.shape, (y, x), 1)  # (strides in bytes)
    if dims is None:
        return False
    d = np.array(dims, np.int64).T.copy()
    LIB.npr_copy(ptr(y), ptr(x), len(dims), ptr(d[0]), ptr(d[1]), ptr(d[2]), y.itemsize)
    return True


BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "max": 4, "min": 5}  # csrc/chain.c's npr_binary


def binary(op: str, a: np.ndarray, b: np.ndarray, threads: int = 1, out: np.ndarray | None = None):
    """a op b for float32 arrays of any strides, broadcast as NumPy does, by one call of
    csrc/chain.c's npr_binary (axes merged where both operands run on contiguously), in
    `threads` parts on the pool when more than one; None where a stride is not whole floats or
    there are more than 16 axes. `out`: a C-contiguous float32 array of the broadcast shape to
    write into (a piece of a bigger output)."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    y = np.empty(shape, np.float32) if out is None else out
    if y.size == 0:
        return y
    dims = _strided_dims(shape, (a, b), 4)  # (strides in floats)
    if dims is None:
        return None
    d = np.array(dims, np.int64).T.copy()
    if threads > 1:
        LIB.npr_binary_mt(BINARY[op], ptr(a), ptr(b), ptr(y), len(dims), ptr(d[0]), ptr(d[1]), ptr(d[2]),
                          threads, threads)
    else:
        LIB.npr_binary(BINARY[op], ptr(a), ptr(b), ptr(y), len(dims), ptr(d[0]), ptr(d[1]), ptr(d[2]))
    return y


UNARY = {"sqrt": 0, "reciprocal": 1, "neg": 2, "abs": 3, "exp": 4, "log": 5, "sin": 6, "cos": 7,
         "floor": 8, "ceil": 9}  # csrc/chain.c's npr_unary


def unary(op: str, x: np.ndarray) -> np.ndarray:
    """op(x) for a float32 array by one call of csrc/chain.c's npr_unary."""
    x = contiguous(x)
    y = np.empty(x.shape, np.float32)
    LIB.npr_unary(UNARY[op], ptr(x), ptr(y), x.size)
    return y


def broadcasts_to(small: tuple, shape: tuple) -> bool:
    """Does an array of shape `small` broadcast to `shape` exactly (np.broadcast_shapes(small,
    shape) == shape)? The hot-path check of the kernels: np.broadcast_shapes costs ~3-5 us."""
    if len(small) > len(shape):
        return False
    for a, b in zip(reversed(small), reversed(shape)):
        if a != b and a != 1:
            return False
    return True


M_ARENA_MAX = -8  # glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def keep_freed_pages() -> bool:
    """Let glibc malloc keep the pages of freed arrays up to 32 MB for the next run instead of
    giving them back at each free (mmap'd blocks, a trimmed heap top). A program's kernels
    allocate their outputs every run, and a block handed back is faulted in afresh the next
    time, a zeroed page at a time: PP-OCRv4 det took 5,600-9,400 page faults a run (70 ms a
    run; 63 without them), SegFormer-B0 3,050 (55 -> 50-53 ms), ORT (its own arena) none; peak
    RSS +1-2 MB. Called when the cpu backend loads; the process then keeps what its largest
    run needed, as ORT's arena does (`npurun serve` still hands pages back every few seconds:
    trim_malloc_every). NPURUN_MALLOC_TUNE=0 leaves malloc as it was; so does a MALLOC_MMAP_
    THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ the user set. False where this is not glibc."""
    if os.environ.get("NPURUN_MALLOC_TUNE", "1") == "0" or os.environ.get("MALLOC_MMAP_THRESHOLD_") \
            or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(32 << 20))
                    and libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(1 << 30)))
    except (OSError, AttributeError):
        return False


def cap_malloc_arenas(n: int) -> bool:
    """Hold glibc malloc to `n` arenas in this process (a long-running server calls this at
    start). glibc gives each thread that allocates its own arena, up to 8 per core, and an
    arena's freed pages rarely go back: under `npurun serve`'s thread pool (tests/soak, 32
    clients) RSS climbed 260 -> 348 MB in a minute with no object leaked; at 2 arenas it holds
    at ~160 MB. A MALLOC_ARENA_MAX the user set wins. False where this is not glibc."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(max(1, n))))
    except (OSError, AttributeError):
        return False


def trim_malloc_every(seconds: float) -> bool:
    """Give the pages glibc malloc holds free back to the system every `seconds`, from a
    daemon thread (a long-running server calls this at start). glibc returns memory by itself
    only from the top of a heap, so a server keeps what its busiest moment needed: under
    tests/soak's mix (32 clients, KServe and generation requests) the server at rest held
    160-180 MB without this and 110-112 MB with it (80 s, measured at rest four times). One
    call walks the heaps in well under a millisecond at these sizes. False where this is not
    glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int

    def loop():
        while True:
            time.sleep(seconds)
            trim(0)

    threading.Thread(target=loop, name="npurun-malloc-trim", daemon=True).start()
    return True
