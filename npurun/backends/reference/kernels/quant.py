"""Reference kernels: quantization, integer products, bitcast, string ops.

Integer products are exact: operands minus their zero points are int64, products accumulate
in int64 and wrap to int32 as ONNX allows ("accumulation may overflow iff in 32 bits").
Requantization (`real / y_scale`) is done in float64 and rounds half to even (np.rint).
"""
from __future__ import annotations

import re

import numpy as np

from ....ir.dtypes import SMALL_FLOAT_TYPES, as_strings, from_numpy, int_range, to_numpy
from . import kernel
from .elementwise import _widen, convert
from .nn import conv


def _along(p, shape, axis, block_size):
    """A scale or zero point broadcast to x's `shape`: scalar (per tensor), 1-D (per axis) or
    blocked (`block_size` copies of each value along `axis`)."""
    if p.ndim == 0 or p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    rank = len(shape)
    axis %= rank
    if block_size:
        return np.repeat(p, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    return p.reshape([-1 if i == axis else 1 for i in range(rank)])


def _exact(q):
    """Quantized values as exact arithmetic types: int64 for integers, float64 for floats."""
    q = _widen(q)
    return q.astype(np.float64 if q.dtype.kind == "f" else np.int64)


def _saturate_int(r, to):
    lo, hi = int_range(to)
    return np.clip(r, lo, hi).astype(to_numpy(to))


@kernel("quantize_linear")
def quantize_linear(x, scale, zp=None, *, axis, block_size, output_dtype, saturate, precision):
    to = output_dtype or (from_numpy(zp.dtype) if zp is not None else "u8")
    work = np.float64 if np.float64 in (x.dtype, scale.dtype) or precision == "f64" else np.float32
    q = _widen(x).astype(work) / _along(_widen(scale).astype(work), x.shape, axis, block_size)
    z = _along(_exact(zp), x.shape, axis, block_size) if zp is not None else 0
    if to in SMALL_FLOAT_TYPES:  # 8/4-bit floats: add the zero point, then cast's rounding rules
        return convert(np.asarray(q + z, dtype=work), to, saturate)
    return _saturate_int(np.rint(q) + z, to)  # np.rint rounds half to even


@kernel("dequantize_linear")
def dequantize_linear(x, scale, zp=None, *, axis, block_size, output_dtype):
    to = output_dtype or from_numpy(scale.dtype)
    d = _exact(x) - (_along(_exact(zp), x.shape, axis, block_size) if zp is not None else 0)
    s = _along(_widen(scale).astype(np.float32), x.shape, axis, block_size)
    return (d.astype(np.float32) * s).astype(to_numpy(to))


@kernel("dynamic_quantize_linear")
def dynamic_quantize_linear(x):
    # The range [min(x), max(x)] widened to include 0 maps onto [0, 255].
    x = x.astype(np.float32)
    lo = np.float32(min(0.0, x.min())) if x.size else np.float32(0)
    hi = np.float32(max(0.0, x.max())) if x.size else np.float32(0)
    scale = np.float32((hi - lo) / np.float32(255))
    if scale == 0:  # x is all zeros
        return np.zeros(x.shape, np.uint8), np.array(scale, np.float32), np.array(0, np.uint8)
    zp = np.uint8(np.clip(np.rint(0 - lo / scale), 0, 255))
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.array(scale, np.float32), np.array(zp, np.uint8)


def _per_row(p, a):
    """A matmul zero point/scale for `a`: a 1-D vector is per row (one value per M)."""
    p = _exact(p) if p.dtype.kind != "f" else p.astype(np.float64)
    if p.ndim == 1 and p.size > 1 and a.ndim >= 2:
        return p.reshape(-1, 1)
    return p


def _int_matmul(a, b):
    return np.matmul(a, b).astype(np.int32)  # int64 products, wrapped to int32


@kernel("matmul_integer")
def matmul_integer(a, b, a_zp=None, b_zp=None):
    a_ = _exact(a) - (_per_row(a_zp, a) if a_zp is not None else 0)
    b_ = _exact(b) - (_exact(b_zp) if b_zp is not None else 0)  # 1-D: one per column (N)
    return _int_matmul(a_, b_)


def _requantize(acc, multiplier, y_zp):
    """int32 accumulators times a real multiplier, rounded half to even, plus the output zero
    point, saturated to its type."""
    r = np.rint(acc.astype(np.float64) * multiplier) + _exact(y_zp)
    return _saturate_int(r, from_numpy(y_zp.dtype))


@kernel("qlinear_matmul")
def qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    return qlinear_matmul_with(matmul_integer, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)


def qlinear_matmul_with(mm, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """QLinearMatMul with `mm` as its MatMulInteger (the cpu backend passes a faster one)."""
    acc = mm(a, b, a_zp, b_zp)
    mult = _per_row(a_scale, a) * b_scale.astype(np.float64) / y_scale.astype(np.float64)
    return _requantize(acc, mult, y_zp)


def _per_channel(p, rank):
    """A conv weight zero point/scale: scalar, or one per output channel (axis 0 of w)."""
    return p.reshape([-1] + [1] * (rank - 1)) if p.ndim == 1 and p.size > 1 else p.reshape(())


@kernel("conv_integer")
def conv_integer(x, w, x_zp=None, w_zp=None, **window):
    # Padding is with the zero point: padded taps contribute (x_zp - x_zp) = 0.
    x_ = _exact(x) - (_exact(x_zp).reshape(()) if x_zp is not None else 0)
    w_ = _exact(w) - (_per_channel(_exact(w_zp), w.ndim) if w_zp is not None else 0)
    return conv(x_, w_, **window).astype(np.int32)


@kernel("qlinear_conv")
def qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b=None, **window):
    return qlinear_conv_with(conv_integer, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b, **window)


def qlinear_conv_with(ci, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b=None, **window):
    """QLinearConv with `ci` as its ConvInteger (the cpu backend passes a faster one)."""
    acc = ci(x, w, x_zp, w_zp, **window).astype(np.int64)
    if b is not None:
        acc = acc + b.astype(np.int64).reshape([-1] + [1] * (x.ndim - 2))
    mult = x_scale.astype(np.float64).reshape(()) * w_scale.astype(np.float64).reshape(-1) / \
        y_scale.astype(np.float64).reshape(())
    mult = mult.reshape([-1] + [1] * (x.ndim - 2)) if mult.size > 1 else mult.reshape(())
    return _requantize(acc.astype(np.int32), mult, y_zp)


@kernel("bitcast")
def bitcast(x, *, to):
    dt = to_numpy(to)
    x = np.array(x, order="C")  # a copy; NumPy's byte order is the machine's (little endian here)
    return x.view(np.uint8).view(dt) if np.bool_ in (x.dtype, dt) else x.view(dt)


# ------------------------------------------------------------------ strings

@kernel("string_normalizer")
def string_normalizer(x, *, case_change_action, is_case_sensitive, locale, stopwords):
    x = as_strings(x)
    row = list(x.reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            row = [s for s in row if s not in stop]
        else:
            stop = {w.casefold() for w in stopwords}
            row = [s for s in row if s.casefold() not in stop]
    if case_change_action == "LOWER":
        row = [s.lower() for s in row]
    elif case_change_action == "UPPER":
        row = [s.upper() for s in row]
    if not row:  # everything was a stopword: one empty string
        row = [""]
    out = np.empty(len(row), dtype=object)
    out[:] = row
    return out.reshape(*x.shape[:-1], len(row))


@kernel("string_concat")
def string_concat(a, b):
    a, b = np.broadcast_arrays(as_strings(a), as_strings(b))
    out = np.empty(a.shape, dtype=object)
    for i, (s, t) in enumerate(zip(a.flat, b.flat)):
        out.flat[i] = s + t
    return out


@kernel("string_split")
def string_split(x, *, delimiter, maxsplit):
    # An empty delimiter splits on runs of whitespace (dropping leading/trailing ones), as
    # Python's str.split() does; maxsplit < 0 means no limit. An empty string has no pieces.
    x = as_strings(x)
    limit = maxsplit if maxsplit is not None and maxsplit >= 0 else -1
    pieces = [s.split(delimiter or None, limit) if s else [] for s in x.flat]
    width = max((len(p) for p in pieces), default=0)
    y = np.full((len(pieces), width), "", dtype=object)
    for i, p in enumerate(pieces):
        y[i, :len(p)] = p
    counts = np.array([len(p) for p in pieces], dtype=np.int64).reshape(x.shape)
    return y.reshape(*x.shape, width), counts


@kernel("regex_full_match")
def regex_full_match(x, *, pattern):
    rx = re.compile(pattern)
    return np.vectorize(lambda s: rx.fullmatch(s) is not None, otypes=[bool])(as_strings(x)) \
        if x.size else np.zeros(x.shape, bool)


@kernel("tfidf_vectorizer")
def tfidf_vectorizer(x, *, max_gram_length, min_gram_length, max_skip_count, mode, ngram_counts,
                     ngram_indexes, pool_int64s, pool_strings, weights):
    # The pool lists n-grams by length: ngram_counts[n-1] is where the n-grams start. An n-gram
    # of row tokens is taken with a fixed gap of 0..max_skip_count tokens between its items.
    pool = list(pool_strings) if pool_strings else [int(v) for v in pool_int64s]
    starts = list(ngram_counts) + [len(pool)]
    index, k = {}, 0  # n-gram -> output column; k numbers the pool's n-grams in order
    for n in range(1, len(ngram_counts) + 1):
        for j in range(starts[n - 1], starts[n], n):
            index[tuple(pool[j:j + n])] = ngram_indexes[k]
            k += 1
    n_out = max(ngram_indexes, default=-1) + 1
    rows = x.reshape(-1, x.shape[-1]) if x.ndim == 2 else x.reshape(1, -1)
    out = np.zeros((rows.shape[0], n_out), dtype=np.float32)
    for r, row in enumerate(rows):
        toks = [str(t) for t in row] if pool_strings else [int(t) for t in row]
        for n in range(min_gram_length, max_gram_length + 1):
            for skip in range(max_skip_count + 1 if n > 1 else 1):  # unigrams have no gaps
                step = skip + 1
                for start in range(len(toks) - (n - 1) * step):
                    key = tuple(toks[start + i * step] for i in range(n))
                    if key in index:
                        out[r, index[key]] += 1
    if mode == "IDF":
        out = (out > 0).astype(np.float32) * (np.asarray(weights, np.float32) if weights else 1)
    elif mode == "TFIDF" and weights:
        out = out * np.asarray(weights, np.float32)
    return out.reshape(n_out) if x.ndim == 1 else out

