"""Reference kernels: windows (conv, pool), linear algebra, normalization, reductions."""
from __future__ import annotations

import itertools
import math

import numpy as np

from ....ir.dtypes import to_numpy
from ....util import check_fits
from . import KERNELS, _like, empty_reduction_fits, kernel
from .elementwise import activate


def _window_pads(x_shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode=0):
    """Begin/end padding per spatial axis, resolving auto_pad and ceil_mode."""
    nd = len(kernel_shape)
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            size = x_shape[2 + i]
            total = max(0, (math.ceil(size / strides[i]) - 1) * strides[i]
                        + (kernel_shape[i] - 1) * dilations[i] + 1 - size)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
    elif auto_pad == "VALID":
        begin, end = [0] * nd, [0] * nd
    else:
        pads = pads or [0] * (2 * nd)
        begin, end = list(pads[:nd]), list(pads[nd:])
    out = []
    for i in range(nd):
        eff = dilations[i] * (kernel_shape[i] - 1) + 1
        span = x_shape[2 + i] + begin[i] + end[i] - eff
        n = (math.ceil(span / strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (n - 1) * strides[i] >= x_shape[2 + i] + begin[i]:
            n -= 1  # a window may not start in the end padding
        out.append(n)
        extra = (n - 1) * strides[i] + eff - (x_shape[2 + i] + begin[i] + end[i])
        end[i] += max(0, extra)
    return begin, end, out, strides, dilations


def _taps(xp, kernel_shape, strides, dilations, out):
    """Yield (tap index, strided view of the padded input for that tap): x is (N, C, *S)."""
    for tap in itertools.product(*[range(k) for k in kernel_shape]):
        # (an empty output axis takes an empty slice: (o - 1) * s + 1 would not be empty)
        idx = tuple(slice(t * d, t * d + (o - 1) * s + 1 if o > 0 else t * d, s)
                    for t, d, s, o in zip(tap, dilations, strides, out))
        yield tap, xp[(slice(None), slice(None)) + idx]


@kernel("conv")
def conv(x, w, b=None, *, strides, pads, dilations, group, kernel_shape, auto_pad, activation="",
         activation_params=()):
    # x is (N, C, *S); w is (M, C/group, *K). Accumulate one matmul per kernel tap, so memory
    # stays at one shifted copy of the input rather than a whole im2col matrix.
    ks = list(kernel_shape or w.shape[2:])
    begin, end, out, strides, dilations = _window_pads(x.shape, ks, strides, dilations, pads, auto_pad)
    # f16/bf16 accumulate in float32 and round once at the end (as a half-precision GEMM and
    # ONNX's reference do); summing the taps in the storage type would round after each tap.
    acc = np.result_type(x, w)
    if acc.kind in "fV" and acc.itemsize < 4:
        acc = np.dtype(np.float32)
    # the padded input is allocated whole: an empty input with a huge batch (found by `make
    # fuzz`: (2^31-1, 1, 0, 2) padded to 192 GiB) is said before the allocation
    padded = [s + bg + e for s, bg, e in zip(x.shape[2:], begin, end)]
    check_fits(math.prod(x.shape[:2]) * math.prod(padded) * acc.itemsize,
               lambda: f"the conv's padded input {list(x.shape[:2]) + padded}")
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end))).astype(acc, copy=False)
    n, c = x.shape[:2]
    m, g = w.shape[0], group
    y = np.zeros((n, g, m // g, math.prod(out)), dtype=acc)
    wg = w.astype(acc, copy=False).reshape(g, m // g, c // g, *w.shape[2:])
    for tap, xs in _taps(xp, ks, strides, dilations, out):
        y += wg[(slice(None),) * 3 + tap] @ xs.reshape(n, g, c // g, math.prod(out))
    y = y.reshape(n, m, *out)
    if b is not None:
        y += b.astype(acc, copy=False).reshape((1, m) + (1,) * len(out))
    return activate(y.astype(x.dtype, copy=False), activation, activation_params)


@kernel("max_pool")
def max_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad):
    begin, end, out, strides, dilations = _window_pads(
        x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=low)
    y = None
    for _, xs in _taps(xp, kernel_shape, strides, dilations, out):
        y = xs.copy() if y is None else np.maximum(y, xs)
    return y


@kernel("max_pool_with_indices")
def max_pool_with_indices(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, storage_order):
    # The first maximum of each window in scan order (as ONNX Runtime): a later tap replaces
    # it only when strictly greater. A tap's input position is out * stride - pad + t * dilation.
    begin, end, out, strides, dilations = _window_pads(
        x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
    order = range(len(sizes)) if storage_order else reversed(range(len(sizes)))
    step, mul = 1, [0] * len(sizes)
    for i in order:  # flat-index multiplier of each spatial axis
        mul[i], step = step, step * sizes[i]
    planes = (np.arange(n * c, dtype=np.int64) * math.prod(sizes)).reshape(n, c, *[1] * len(sizes))
    y = np.zeros((n, c, *out), dtype=x.dtype)
    idx = np.full((n, c, *out), -1, dtype=np.int64)
    for tap, xs in _taps(xp, kernel_shape, strides, dilations, out):
        flat, valid = np.zeros(out, np.int64), np.ones(out, bool)
        for i, (t, o) in enumerate(zip(tap, out)):
            pos = np.arange(o) * strides[i] - begin[i] + t * dilations[i]
            shape = [1] * len(out)
            shape[i] = o
            flat = flat + (pos * mul[i]).reshape(shape)
            valid = valid & ((pos >= 0) & (pos < sizes[i])).reshape(shape)
        take = valid & ((idx < 0) | (xs > y))
        y = np.where(take, xs, y)
        idx = np.where(take, planes + flat, idx)
    return y, idx


@kernel("average_pool")
def average_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, count_include_pad):
    begin, end, out, strides, dilations = _window_pads(
        x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    explicit_end = list((pads or [0] * (2 * len(kernel_shape)))[len(kernel_shape):]) \
        if auto_pad == "NOTSET" else [0] * len(kernel_shape)
    if all(d == 1 for d in dilations):
        return _box_average(x, kernel_shape, strides, begin, explicit_end, out, count_include_pad)
    widths = [(0, 0), (0, 0)] + list(zip(begin, end))
    xp = np.pad(x.astype(np.float64), widths)
    # The divisor counts real elements, plus explicit padding if count_include_pad (never the
    # extra end padding ceil_mode adds).
    ones = np.ones((1, 1) + x.shape[2:])
    if count_include_pad:
        ones = np.pad(ones, [(0, 0), (0, 0)] + list(zip(begin, explicit_end)), constant_values=1)
        cp = np.pad(ones, [(0, 0), (0, 0)] + [(0, e - pe) for e, pe in zip(end, explicit_end)])
    else:
        cp = np.pad(ones, widths)
    total = np.zeros(x.shape[:2] + tuple(out))
    count = np.zeros((1, 1) + tuple(out))
    for (_, xs), (_, cs) in zip(_taps(xp, kernel_shape, strides, dilations, out),
                                _taps(cp, kernel_shape, strides, dilations, out)):
        total += xs
        count += cs
    return (total / count).astype(x.dtype)


def _box_average(x, kernel_shape, strides, begin, explicit_end, out, count_include_pad):
    """Average pooling with contiguous windows, one spatial axis at a time: each window's sum is
    a difference of prefix sums over its part inside the input, its count that part's length
    (or, with count_include_pad, the part inside input + explicit padding; never the extra end
    padding ceil_mode adds). Memory stays at the input's size whatever the window: a pool
    whose window is far larger than its input (EfficientNet's head as transformers writes
    it: 1280 x 1280 over 7 x 7) is as cheap as any."""
    acc = x.astype(np.float64)
    count = np.ones((1, 1) + (1,) * len(out))
    for i, (k, s, b, e, o) in enumerate(zip(kernel_shape, strides, begin, explicit_end, out)):
        axis, size = 2 + i, x.shape[2 + i]
        lo = np.arange(o) * s - b  # window [lo, lo + k) in input coordinates
        hi = lo + k
        a, z = np.clip(lo, 0, size), np.clip(hi, 0, size)
        cs = np.concatenate([np.zeros_like(np.take(acc, [0], axis=axis)), np.cumsum(acc, axis=axis)], axis=axis)
        acc = np.take(cs, z, axis=axis) - np.take(cs, a, axis=axis)
        n = (np.clip(hi, -b, size + e) - np.clip(lo, -b, size + e)) if count_include_pad else (z - a)
        count = count * n.reshape((1, 1) + tuple(o if j == i else 1 for j in range(len(out))))
    return (acc / count).astype(x.dtype)


@kernel("global_average_pool")
def global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@kernel("global_max_pool")
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


# ---------------------------------------------------------------- linear algebra, normalization

@kernel("matmul")
def matmul(a, b):
    # NumPy multiplies bfloat16 matrices into float32 (ml_dtypes' loop): round the product
    # back to the operand type, as every other float type's product is.
    return _like(a, np.matmul(a, b))


@kernel("gemm")
def gemm(a, b, c=None, *, alpha, beta, trans_a, trans_b):
    y = alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b))
    if c is not None:
        y = y + beta * c
    return y.astype(a.dtype, copy=False)


@kernel("batch_normalization")
def batch_normalization(x, scale, bias, mean, var, *, epsilon):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + epsilon)
    return _like(x, (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape))


@kernel("batch_normalization_training")
def batch_normalization_training(x, scale, bias, input_mean, input_var, *, epsilon, momentum):
    # Batch statistics per channel (axis 1) in float64; the variance is the population one.
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xs = x.astype(np.float64)
    mean, var = xs.mean(axis=axes), xs.var(axis=axes)
    y = (xs - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
    y = y * scale.astype(np.float64).reshape(shape) + bias.astype(np.float64).reshape(shape)
    running_mean = input_mean.astype(np.float64) * momentum + mean * (1 - momentum)
    running_var = input_var.astype(np.float64) * momentum + var * (1 - momentum)
    return y.astype(x.dtype), running_mean.astype(input_mean.dtype), running_var.astype(input_var.dtype)


@kernel("layer_normalization")
def layer_normalization(x, scale, bias=None, *, axis, epsilon, stash_type):
    # Statistics and normalization run in stash_type precision; the normalized value goes
    # back to x's type before scale and bias apply (the ONNX function body's order).
    xs = x.astype(to_numpy(stash_type))
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = xs.mean(axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt(((xs - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon)
    y = ((xs - mean) * inv_std).astype(x.dtype) * scale
    return _like(x, y if bias is None else y + bias), mean, inv_std


@kernel("softmax")
def softmax(x, *, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@kernel("log_softmax")
def log_softmax(x, *, axis):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def _lowest(dt):
    return -np.inf if dt.kind == "f" else (False if dt.kind == "b" else np.iinfo(dt).min)


def _highest(dt):
    return np.inf if dt.kind == "f" else (True if dt.kind == "b" else np.iinfo(dt).max)


def _reducer(fn, identity=None):
    def reduce(x, axes=None, *, keepdims, noop_with_empty_axes):
        if axes is None or axes.size == 0:
            if noop_with_empty_axes:
                return x
            ax = None
        else:
            ax = tuple(int(a) for a in axes.reshape(-1))
        empty_reduction_fits(x, ax, keepdims)
        # Reducing an empty set gives the operation's identity (-inf for max, +inf for min).
        extra = {"initial": identity(x.dtype)} if identity and x.size == 0 else {}
        return _like(x, fn(x, axis=ax, keepdims=bool(keepdims), **extra))
    return reduce


KERNELS["reduce_mean"] = _reducer(np.mean)
KERNELS["reduce_sum"] = _reducer(np.sum)
KERNELS["reduce_max"] = _reducer(np.max, _lowest)
KERNELS["reduce_min"] = _reducer(np.min, _highest)


