"""The transformer encoder's kernels on the cpu backend: erf, GELU, LayerNormalization and
softmax (with the attention mask added, and the NaN rows of fully masked queries replaced,
in the same pass), compiled in csrc/transformer.c (AVX2 + FMA, float32).

Each kernel takes the reference kernel's arguments and returns its result; anything it does
not handle (another dtype, softmax over an inner axis, a scale that is not one value per
normalized element) runs the reference kernel. Rows (elements) are split over the program's
threads on the library's spinning C pool when the tensor holds at least BIG elements.
The passes make `gelu` and `masked_softmax` ops of the exported chains (passes/fuse_gelu.py,
fuse_masked_softmax.py); ops/fused.py runs the latter through `softmax_call` below.

Shapes in MiniLM (128 tokens): GELU on (1, 128, 1536), LayerNorm over (1, 128, 384) rows of
384, softmax over (1, 12, 128, 128) rows of 128 with a (1, 1, 1, 128) or (1, 1, 128, 128) mask.
"""
from __future__ import annotations

import math

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import native

BIG = 1 << 14  # elements; below this one thread does the whole tensor (a hand-off costs ~1-5 us)

LIB = native.LIB  # (signatures: native.py)


ptr = native.ptr


def _parts(program, size, rows):
    return min(program.threads, rows) if size >= BIG and program.threads > 1 else 1


def _elementwise(program, x, fn, *args):
    """y = fn(x) over a flat float32 array: fn(px, py, n, *args), or its `_mt` twin
    (csrc/gemm_mt.c) in `threads` contiguous parts on the library's spinning pool."""
    x = native.contiguous(x)
    y = np.empty_like(x)
    parts = _parts(program, x.size, x.size)
    if parts > 1:
        getattr(LIB, fn + "_mt")(ptr(x), ptr(y), x.size, *args, program.threads, parts)
    else:
        getattr(LIB, fn)(ptr(x), ptr(y), x.size, *args)
    return y


def make_erf(program):
    def erf(x):
        if x.dtype != np.float32 or x.size == 0:
            return REF["erf"](x)
        return _elementwise(program, x, "npr_erf")
    return erf


def gelu_call(program, x, d, a, m, mode):
    """y = x * (m * (erf(x / d) + a)) (mode 0) or erf(x * d) (mode 1), as the exported chain
    computes it, one rounding per operation, in the same order."""
    # mode | 4: the AVX-512 kernel, the same bits (csrc/transformer.c npr_gelu_avx512)
    return _elementwise(program, x, "npr_gelu", d, a, m, mode | (4 if native.ISA == "avx512" else 0))


def make_gelu(program):
    def gelu(x, *, approximate):
        if x.dtype != np.float32 or approximate not in ("none", "tanh") or x.size == 0:
            return REF["gelu"](x, approximate=approximate)
        if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            return gelu_call(program, x, 0.0, 0.0, 0.0, 2)
        # The reference: 0.5 * x * (1 + erf(x / sqrt 2)); 0.5 * (x * e) == x * (0.5 * e).
        return gelu_call(program, x, float(np.sqrt(2).astype(np.float32)), 1.0, 0.5, 0)
    return gelu


def _per_element(p, inner):
    """p broadcast to the normalized shape, contiguous (one value per normalized element:
    384 in MiniLM); None where it does not broadcast to exactly that shape."""
    if p.shape == inner and p.flags.c_contiguous:
        return p  # the common case, without NumPy's broadcasting machinery (~20 us)
    try:
        if np.broadcast_shapes(p.shape, inner) != inner:
            return None
        return np.ascontiguousarray(np.broadcast_to(p, inner))
    except ValueError:
        return None


def make_layer_normalization(program):
    def layer_normalization(x, scale, bias=None, *, axis, epsilon, stash_type):
        ax = axis % max(x.ndim, 1)
        if x.dtype != np.float32 or stash_type != "f32" or x.ndim == 0 or x.size == 0 \
                or scale.dtype != np.float32 or (bias is not None and bias.dtype != np.float32):
            return REF["layer_normalization"](x, scale, bias, axis=axis, epsilon=epsilon, stash_type=stash_type)
        inner = x.shape[ax:]
        s, b = _per_element(scale, inner), None if bias is None else _per_element(bias, inner)
        if s is None or (bias is not None and b is None):
            return REF["layer_normalization"](x, scale, bias, axis=axis, epsilon=epsilon, stash_type=stash_type)
        x = native.contiguous(x)
        n = math.prod(inner)
        rows = x.size // n
        y = np.empty_like(x)
        stats = x.shape[:ax] + (1,) * len(inner)
        mean, inv = np.empty(stats, np.float32), np.empty(stats, np.float32)
        parts = _parts(program, x.size, rows)
        if parts > 1:
            LIB.npr_layernorm_mt(ptr(x), ptr(s), ptr(b), ptr(y), ptr(mean), ptr(inv), rows, n, epsilon,
                                 program.threads, parts)
        else:
            LIB.npr_layernorm(ptr(x), ptr(s), ptr(b), ptr(y), ptr(mean), ptr(inv), 0, rows, n, epsilon)
        return y, mean, inv
    return layer_normalization


def rms_call(x, scale, skip=None, bias=None, epsilon=1e-6, want_sum=False):
    """csrc/transformer.c's RMS normalization over x's last axis: (y, inv (rows..., 1), s)
    with s = x (+ skip) (+ bias) (None unless want_sum); None where it does not apply
    (another dtype, a skip of another shape, a scale that is not one value per column)."""
    n = x.shape[-1] if x.ndim else 0
    if x.dtype != np.float32 or not n or x.size == 0 or scale.dtype != np.float32 or scale.size != n \
            or (skip is not None and (skip.dtype != np.float32 or skip.shape != x.shape)) \
            or (bias is not None and (bias.dtype != np.float32 or bias.size != n)):
        return None
    x = native.contiguous(x)
    sk = None if skip is None else np.ascontiguousarray(skip)
    sc, bi = np.ascontiguousarray(scale).reshape(n), None if bias is None else np.ascontiguousarray(bias).reshape(n)
    rows = x.size // n
    y = np.empty_like(x)
    s = np.empty_like(x) if want_sum else None
    inv = np.empty(x.shape[:-1] + (1,), np.float32)
    LIB.npr_rmsnorm(ptr(x), ptr(sk), ptr(bi), ptr(sc), ptr(y), ptr(s), ptr(inv), 0, rows, n, epsilon)
    return y, inv, s


def make_rms_normalization(program):
    def rms_normalization(x, scale, *, axis, epsilon, stash_type):
        if x.ndim and axis % x.ndim == x.ndim - 1 and stash_type == "f32":
            r = rms_call(x, scale, epsilon=epsilon)
            if r is not None:
                return r[0]
        return REF["rms_normalization"](x, scale, axis=axis, epsilon=epsilon, stash_type=stash_type)
    return rms_normalization


def mask_rows(x_shape, m_shape):
    """(mask_div, mask_rows) such that row r of x (rows of its last axis) adds row
    r // mask_div % mask_rows of the mask, or None when the mask does not broadcast that way
    (its last axis must be x's, its other non-1 axes one contiguous run of x's axes)."""
    if len(m_shape) > len(x_shape) or not m_shape or m_shape[-1] != x_shape[-1]:
        return None
    m = (1,) * (len(x_shape) - len(m_shape)) + tuple(m_shape)
    lead = [k for k in range(len(x_shape) - 1) if m[k] != 1]
    if not lead:
        return 1, 1
    p, q = lead[0], lead[-1] + 1
    if any(m[k] != x_shape[k] for k in range(p, q)):
        return None
    return math.prod(x_shape[q:-1]), math.prod(x_shape[p:q])


def softmax_call(program, x, mask=None, nan_to=None):
    """softmax(x [+ mask]) along the last axis; rows that come out NaN (a NaN, +inf, or only
    -inf among the scores) become nan_to when given. None where the kernel does not apply."""
    if x.dtype != np.float32 or x.ndim == 0 or x.size == 0 or (mask is not None and mask.dtype != np.float32):
        return None
    div, mrows = 1, 1
    if mask is not None:
        if not native.broadcasts_to(mask.shape, x.shape):
            return None
        rule = mask_rows(x.shape, mask.shape)
        if rule is None:
            return None
        div, mrows = rule
        mask = np.ascontiguousarray(mask)
    x = native.contiguous(x)
    n = x.shape[-1]
    y = np.empty_like(x)
    fix, val = (0, 0.0) if nan_to is None else (1, float(nan_to))
    rows = x.size // n
    parts = _parts(program, x.size, rows)
    wide = native.ISA == "avx512"  # (the same bits: csrc/transformer.c npr_softmax_avx512)
    if parts > 1:
        LIB.npr_softmax_mt(ptr(x), ptr(mask), ptr(y), rows, n, div, mrows, fix, val, program.threads, parts, wide)
    else:
        (LIB.npr_softmax_avx512 if wide else LIB.npr_softmax)(ptr(x), ptr(mask), ptr(y), 0, rows, n, div, mrows, fix, val)
    return y


def make_softmax(program):
    def softmax(x, *, axis):
        if x.ndim and axis % x.ndim == x.ndim - 1:
            y = softmax_call(program, x)
            if y is not None:
                return y
        return REF["softmax"](x, axis=axis)
    return softmax


KERNELS = {} if LIB is None else {
    "erf": make_erf,
    "gelu": make_gelu,
    "layer_normalization": make_layer_normalization,
    "rms_normalization": make_rms_normalization,
    "softmax": make_softmax,
}
