"""Reference kernels: more unary math, bitwise ops, reductions, top-k/unique, einsum,
gather/scatter, generators and losses."""
from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import to_numpy
from . import KERNELS, _like, empty_reduction_fits, kernel


def _softplus(x):
    return np.logaddexp(0, x)


_UNARY = {
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "bitwise_not": np.invert,
}
for _n, _f in _UNARY.items():
    KERNELS[_n] = (lambda f: lambda x: _like(x, f(x)))(_f)

KERNELS["bitwise_or"] = np.bitwise_or
KERNELS["bitwise_xor"] = np.bitwise_xor


@kernel("swish")
def swish(x, *, alpha):
    # x * sigmoid(alpha * x), with the sigmoid written so exp never overflows
    z = np.exp(-np.abs(alpha * x))
    return _like(x, x * np.where(alpha * x >= 0, 1 / (1 + z), z / (1 + z)))


@kernel("thresholded_relu")
def thresholded_relu(x, *, alpha):
    return _like(x, np.where(x > alpha, x, 0))


@kernel("shrink")
def shrink(x, *, bias, lambd):
    return _like(x, np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)))


@kernel("is_nan")
def is_nan(x):
    return np.isnan(x)


@kernel("is_inf")
def is_inf(x, *, detect_negative, detect_positive):
    return (np.isposinf(x) & bool(detect_positive)) | (np.isneginf(x) & bool(detect_negative))


@kernel("bit_shift")
def bit_shift(x, s, *, direction):
    # Shifts of `bits` or more (or negative ones) leave only the sign fill: 0, or -1 for a
    # right shift of a negative signed value. NumPy's own shifts are undefined there.
    bits = x.dtype.itemsize * 8
    x, s = np.broadcast_arrays(x, s.astype(x.dtype))
    in_range = (s >= 0) & (s < bits)
    safe = np.where(in_range, s, 0).astype(x.dtype)
    if direction == "LEFT":
        return np.where(in_range, np.left_shift(x, safe), 0).astype(x.dtype)
    fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
    return np.where(in_range, np.right_shift(x, safe), fill).astype(x.dtype)


# ---------------------------------------------------------------- reductions

def _log(x):
    with np.errstate(divide="ignore"):  # log(0) is -inf, e.g. the log-sum of an empty set
        return np.log(x)


def _log_sum_exp(x, axis, keepdims):
    # Shift by the largest element so exp cannot overflow; an empty or all -inf set gives -inf.
    if x.size == 0:
        return np.full(np.sum(x, axis=axis, keepdims=keepdims).shape, -np.inf)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    s = _log(np.sum(np.exp(x - m), axis=axis, keepdims=keepdims))
    return s + (m if keepdims else np.squeeze(m, axis=axis))


_REDUCE = {
    "reduce_prod": lambda x, axis, keepdims: np.prod(x, axis=axis, keepdims=keepdims),
    "reduce_sum_square": lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims),
    "reduce_l1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "reduce_l2": lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)),
    "reduce_log_sum": lambda x, axis, keepdims: _log(np.sum(x, axis=axis, keepdims=keepdims)),
    "reduce_log_sum_exp": _log_sum_exp,
}


def _reducer(fn):
    def reduce(x, axes=None, *, keepdims, noop_with_empty_axes):
        if axes is None or axes.size == 0:
            # No axes: all of them, or none (the reduction of each element alone, e.g. |x|).
            ax = () if noop_with_empty_axes else tuple(range(x.ndim))
        else:
            ax = tuple(int(a) % x.ndim for a in axes.reshape(-1))
        empty_reduction_fits(x, ax, keepdims)
        return _like(x, fn(x, ax, bool(keepdims)))
    return reduce


for _n, _f in _REDUCE.items():
    KERNELS[_n] = _reducer(_f)


def _arg(pick):
    def arg(x, *, axis, keepdims, select_last_index):
        # Ties go to the first index, or the last with select_last_index: take the first in
        # the reversed array and map it back.
        if select_last_index:
            i = x.shape[axis] - 1 - pick(np.flip(x, axis), axis=axis)
        else:
            i = pick(x, axis=axis)
        i = np.asarray(i, np.int64)
        return np.expand_dims(i, axis) if keepdims else i
    return arg


KERNELS["arg_max"] = _arg(np.argmax)
KERNELS["arg_min"] = _arg(np.argmin)


def _cumulative(fn, identity):
    def cumulative(x, axis, *, exclusive, reverse):
        ax = int(axis.reshape(-1)[0]) % x.ndim
        y = np.flip(x, ax) if reverse else x
        y = fn(y, axis=ax, dtype=x.dtype)
        if exclusive:  # shift one step along the axis, starting from the identity
            first = np.full_like(np.take(y, [0], axis=ax), identity)
            y = np.concatenate([first, np.take(y, np.arange(y.shape[ax] - 1), axis=ax)], axis=ax)
        return np.flip(y, ax) if reverse else y
    return cumulative


KERNELS["cum_sum"] = _cumulative(np.cumsum, 0)
KERNELS["cum_prod"] = _cumulative(np.cumprod, 1)


@kernel("hardmax")
def hardmax(x, *, axis):
    # 1 at the first largest element along the axis, 0 elsewhere
    first = np.expand_dims(np.argmax(x, axis=axis), axis)
    return _like(x, np.arange(x.shape[axis]).reshape([-1 if d == axis % x.ndim else 1
                                                       for d in range(x.ndim)]) == first)


@kernel("top_k")
def top_k(x, k, *, axis, largest, sorted):
    # Equal values keep index order (the lower index first) for both largest and smallest:
    # a stable ascending sort does that directly; for largest, sort the reversed array
    # ascending and read the result backwards.
    k = int(k.reshape(-1)[0])
    n = x.shape[axis]
    if largest:
        order = np.flip(n - 1 - np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return np.take_along_axis(x, idx, axis=axis), idx


@kernel("unique")
def unique(x, *, axis, sorted):
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not sorted:  # order of first occurrence instead
        order = np.argsort(first, kind="stable")
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts = first[order], counts[order]
        inverse = np.argsort(order)[inverse]
    return y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)


@kernel("einsum")
def einsum(*xs, equation):
    # NumPy's einsum takes only its own types: compute bfloat16 in float32
    ys = [x.astype(np.float32) if x.dtype.kind == "V" else x for x in xs]
    return _like(xs[0], np.einsum(equation.replace(" ", ""), *ys))


# ---------------------------------------------------------------- gather / scatter

def _positive(idx, size):
    """Negative indices count from the end."""
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + size, idx)


def _element_index(idx, axis, size):
    """Full index tuple for element-wise gather/scatter: `idx` along `axis`, the position
    itself along every other axis."""
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = _positive(idx, size)
    return tuple(grid)


@kernel("gather_elements")
def gather_elements(x, idx, *, axis):
    return x[_element_index(idx, axis % x.ndim, x.shape[axis])]


@kernel("gather_nd")
def gather_nd(x, idx, *, batch_dims):
    # x is (*B, *D); idx is (*B, *I, m): each index row picks x[b][i1, .., im] (a slice of D).
    b, m = batch_dims, idx.shape[-1]
    batch = x.shape[:b]
    xb = x.reshape((-1,) + x.shape[b:])
    ib = idx.reshape((xb.shape[0], -1, m))
    out = [xb[j][tuple(_positive(ib[j][:, t], x.shape[b + t]) for t in range(m))]
           for j in range(xb.shape[0])]
    return np.stack(out).reshape(batch + idx.shape[b:-1] + x.shape[b + m:])


_SCATTER = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(x, where, updates, reduction):
    """Copy of x with updates written at `where` (an index tuple), or combined into it."""
    y = x.copy()
    if reduction == "none":
        y[where] = updates
    else:  # ufunc.at applies repeated indices one after another
        _SCATTER[reduction].at(y, where, updates)
    return y


@kernel("scatter_elements")
def scatter_elements(x, idx, updates, *, axis, reduction):
    return _scatter(x, _element_index(idx, axis % x.ndim, x.shape[axis]), updates, reduction)


@kernel("scatter_nd")
def scatter_nd(x, idx, updates, *, reduction):
    # idx is (*I, m); updates is (*I, *x.shape[m:]): one slice of x per index row.
    m = idx.shape[-1]
    rows = idx.reshape(-1, m)
    where = tuple(_positive(rows[:, t], x.shape[t]) for t in range(m))
    return _scatter(x, where, updates.reshape((-1,) + x.shape[m:]), reduction)


@kernel("one_hot")
def one_hot(indices, depth, values, *, axis):
    depth = int(depth.reshape(-1)[0])
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)  # out-of-range indices match no position
    ax = axis % (indices.ndim + 1)
    hot = np.expand_dims(idx, ax) == np.arange(depth).reshape([-1 if d == ax else 1
                                                               for d in range(indices.ndim + 1)])
    off, on = values.reshape(-1)[:2]
    return np.where(hot, on, off).astype(values.dtype)


@kernel("compress")
def compress(x, condition, *, axis):
    # A condition shorter than the axis drops the elements past its end.
    return np.compress(condition.astype(bool), x, axis=axis)


@kernel("non_zero")
def non_zero(x):
    if x.ndim == 0:  # a scalar has no coordinates: (0, 1) if it is non-zero, else (0, 0)
        return np.zeros((0, int(x != 0)), np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@kernel("reverse_sequence")
def reverse_sequence(x, lens, *, batch_axis, time_axis):
    # Reverse the first lens[b] steps along the time axis of each batch entry.
    y = x.copy()
    for b, n in enumerate(lens.reshape(-1)):
        src = [slice(None)] * x.ndim
        src[batch_axis], src[time_axis] = b, slice(0, int(n))
        y[tuple(src)] = np.flip(x[tuple(src)], time_axis - (batch_axis < time_axis))
    return y


# ---------------------------------------------------------------- generators, matrices

@kernel("range")
def range_(start, limit, delta):
    # output[i] = start + i * delta, as many as stay short of limit
    s, lim, d = start.item(), limit.item(), delta.item()
    n = max(math.ceil((lim - s) / d), 0)
    return (s + np.arange(n) * d).astype(start.dtype)


@kernel("trilu")
def trilu(x, k=None, *, upper):
    # Keep j - i >= k (upper) or j - i <= k (lower) in the last two axes.
    k = 0 if k is None else int(k.reshape(-1)[0])
    return np.triu(x, k) if upper else np.tril(x, k)


@kernel("eye_like")
def eye_like(x, *, dtype, k):
    return np.eye(x.shape[0], x.shape[1], k, dtype=to_numpy(dtype) if dtype else x.dtype)


@kernel("det")
def det(x):
    return _like(x, np.linalg.det(x.astype(np.float64)))


@kernel("size")
def size(x):
    return np.array(x.size, dtype=np.int64)


# ---------------------------------------------------------------- losses

def _nll(logp, target, weight, reduction, ignore_index):
    # logp is (N, C, *D), target (N, *D): loss = -logp[n, target, d] * weight[target], with
    # ignored targets contributing neither loss nor weight. Mean divides by the weight summed
    # over the targets that count.
    t = target.astype(np.int64)
    keep = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    t = np.where(keep, t, 0)  # an ignored target may name no class at all
    picked = np.take_along_axis(logp, np.expand_dims(t, 1), axis=1).squeeze(1)
    w = (np.ones(logp.shape[1], logp.dtype) if weight is None else weight)[t] * keep
    loss = -picked * w
    if reduction == "none":
        return loss.astype(logp.dtype)
    if reduction == "sum":
        return np.array(loss.sum(), logp.dtype)
    return np.array(loss.sum() / w.sum(), logp.dtype)


@kernel("negative_log_likelihood_loss")
def negative_log_likelihood_loss(x, target, weight=None, *, reduction, ignore_index):
    return _nll(x, target, weight, reduction, ignore_index)


@kernel("softmax_cross_entropy_loss")
def softmax_cross_entropy_loss(scores, labels, weights=None, *, reduction, ignore_index):
    # log-softmax over the class axis (1), then the negative log-likelihood of the labels
    z = scores - scores.max(axis=1, keepdims=True)
    logp = (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype(scores.dtype)
    return _nll(logp, labels, weights, reduction, ignore_index), logp
