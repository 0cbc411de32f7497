"""Small-tensor fast paths for shape-bookkeeping ops: `gather`, `slice`, `split`, `reduce_mean`.

Exported graphs run these on tensors of a few elements every step (silero-vad: 5 gathers of
a shape or of the recurrent state, 5 slices of the STFT, one mean per chunk), where the
reference kernel's generic handling costs more than the work: `gather`'s np.where over the
indices (~2.5-3 us against np.take's ~0.8), `slice`'s ravel/zip/list building (~1.9 vs ~0.8),
`reduce_mean`'s np.mean wrapper (~5-6 vs ~3). (`cast` to the same dtype was tried: 0.46 vs
0.40 us, not kept.)

Each returns exactly what the reference kernel returns (same NumPy call on the same operands,
views where the reference gives views), except a float32 mean of 16K elements or more over
trailing axes (a global average pool written as ReduceMean), which csrc/pool.c sums in
float32 (within a few ulp), and hands anything unusual to the reference kernel:
a negative or multi-element gather index (the reference's np.where is needed), slices over
several axes, means of integers, of empty tensors or without axes given.
"""
from __future__ import annotations

import functools

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import native
from . import vision

PLANES_MIN = vision.BIG  # elements: a smaller mean stays NumPy's (the reference's own bits)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _gather(x, indices, *, axis):
    if native.CALLS.cheap and type(x) is np.ndarray and type(indices) is np.ndarray and x.ndim \
            and indices.dtype == np.int64 and not x.dtype.hasobject:
        y = _take(x, indices, axis % x.ndim)
        if y is not None:
            return y
    # One non-negative index: the reference's np.where(indices < 0, ...) leaves it as is.
    if indices.size == 1 and indices.dtype.kind in "iu" and indices.reshape(-1)[0] >= 0:
        if indices.ndim <= 1 and x.ndim > 0 and not x.flags.c_contiguous:
            # np.take copies all of a strided x first (a transposed sequence): an unrolled
            # LSTM's gather of step t from (T, N, 4H) cost ~80 us a step, ORT's ~8. The same
            # element range by basic indexing, copied (what take gives, but only the part read).
            i = int(indices.reshape(-1)[0])
            ax = axis % x.ndim
            if i >= x.shape[ax]:
                return REF["gather"](x, indices, axis=axis)  # (its error)
            return x[(slice(None),) * ax + ((i,) if indices.ndim == 0 else (slice(i, i + 1),))].copy()
        return x.take(indices, axis=axis)  # what np.take calls, without its Python wrapper
    return REF["gather"](x, indices, axis=axis)


def _take(x, indices, ax):
    """Gather along axis `ax` by csrc/transpose.c's npr_take, which reads the indices when it
    runs (in a replayed program: whatever indices this run brings); None for what it does not
    take (an index out of range: the reference's error)."""
    x = native.contiguous(x)
    idx = native.contiguous(indices)
    n, ln = idx.size, x.shape[ax]
    outer = int(np.prod(x.shape[:ax], dtype=np.int64))
    inner = int(np.prod(x.shape[ax + 1:], dtype=np.int64)) * x.itemsize
    y = np.empty(x.shape[:ax] + indices.shape + x.shape[ax + 1:], x.dtype)
    if y.size == 0:
        return y
    if native.LIB.npr_take(native.ptr(y), native.ptr(x), native.ptr(idx), n, outer, ln, inner):
        return None
    return y


def _split(x, sizes=None, *, axis, num_outputs):
    # np.split's own bookkeeping (array_split: swapaxes, a list of slices) cost ~35 us for four
    # parts on a 2-vCPU VM, an unrolled LSTM's gates every step; the same views by basic slicing.
    ax = axis % x.ndim if x.ndim else 0
    if x.ndim == 0 or (sizes is not None and (sizes.ndim != 1 or sizes.dtype.kind not in "iu")):
        return REF["split"](x, sizes, axis=axis, num_outputs=num_outputs)
    n = x.shape[ax]
    if sizes is None:
        k = num_outputs or 1
        step = -(-n // k)
        parts = [min(step, n - i * step) for i in range(k)]
    else:
        parts = sizes.tolist()
    if min(parts, default=0) < 0 or sum(parts) != n:
        return REF["split"](x, sizes, axis=axis, num_outputs=num_outputs)
    head = (slice(None),) * ax
    out, at = [], 0
    for p in parts:
        out.append(x[head + (slice(at, at + p),)])
        at += p
    return tuple(out)


def _slice(x, starts, ends, axes=None, steps=None):
    if starts.size != 1 or ends.size != 1 or (axes is not None and axes.size != 1) \
            or (steps is not None and steps.size != 1):
        return REF["slice"](x, starts, ends, axes, steps)
    idx = [slice(None)] * x.ndim
    ax = 0 if axes is None else int(axes.reshape(-1)[0])  # negative: from the end, as a list index
    idx[ax] = slice(int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0]),
                    1 if steps is None else int(steps.reshape(-1)[0]))
    return x[tuple(idx)]


def _reduce_mean(x, axes=None, *, keepdims, noop_with_empty_axes, threads=1):
    # np.mean on a float array is np.add.reduce, then an in-place true_divide by the count
    # (numpy/_core/_methods.py: _mean); the same two calls without its wrapper.
    if x.dtype not in _FLOATS or x.size == 0 or axes is None or axes.size == 0:
        return REF["reduce_mean"](x, axes, keepdims=keepdims, noop_with_empty_axes=noop_with_empty_axes)
    nd = x.ndim
    ax = tuple(int(a) for a in axes.reshape(-1))
    norm = {a % nd for a in ax if -nd <= a < nd}
    if len(norm) != len(ax):  # out of range or repeated: the reference raises its error
        return REF["reduce_mean"](x, axes, keepdims=keepdims, noop_with_empty_axes=noop_with_empty_axes)
    count = 1
    for a in norm:
        count *= x.shape[a]
    if x.dtype == np.float32 and x.size >= PLANES_MIN and norm == set(range(nd - len(norm), nd)) and nd > len(norm) \
            and vision.native.LIB is not None:
        # a big mean over the trailing axes (a global average pool written as ReduceMean):
        # csrc/pool.c's plane means, in float32 (NumPy's pairwise float32 sum: not the same
        # bits, within a few ulp of either)
        y = vision.plane_means(np.ascontiguousarray(x), x.size // count, count, threads)
        return y.reshape(x.shape[:nd - len(norm)] + ((1,) * len(norm) if keepdims else ()))
    s = np.add.reduce(x, axis=ax, keepdims=bool(keepdims))
    if isinstance(s, np.ndarray):
        return np.true_divide(s, count, out=s, casting="unsafe", subok=False)
    return np.asarray(s.dtype.type(s / count))


KERNELS = {"gather": lambda program: _gather, "slice": lambda program: _slice, "split": lambda program: _split,
           "reduce_mean": lambda program: functools.partial(_reduce_mean, threads=program.threads)}
