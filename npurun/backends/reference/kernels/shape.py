"""Reference kernels: data movement and resampling."""
from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import to_numpy
from . import kernel


@kernel("reshape")
def reshape(x, shape, *, allowzero):
    target = [int(s) for s in shape]
    if not allowzero:
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    return x.reshape(target)


@kernel("transpose")
def transpose(x, *, perm):
    return np.transpose(x, perm)


@kernel("concat")
def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


@kernel("split")
def split(x, sizes=None, *, axis, num_outputs):
    if sizes is None:
        n = num_outputs or 1
        step = -(-x.shape[axis] // n)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(n)]
    return tuple(np.split(x, np.cumsum([int(s) for s in sizes])[:-1], axis=axis))


@kernel("flatten")
def flatten(x, *, axis):
    ax = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:ax]), -1)


@kernel("squeeze")
def squeeze(x, axes=None):
    return np.squeeze(x, axis=None if axes is None else tuple(int(a) for a in axes))


@kernel("unsqueeze")
def unsqueeze(x, axes):
    axes = np.ravel(axes)
    return np.expand_dims(x, tuple(int(a) % (x.ndim + len(axes)) for a in axes))


@kernel("slice")
def slice_(x, starts, ends, axes=None, steps=None):
    starts, ends = np.ravel(starts), np.ravel(ends)
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * x.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        idx[int(ax)] = slice(int(st), int(en), int(sp))  # NumPy clamps out-of-range bounds as ONNX does
    return x[tuple(idx)]


@kernel("gather")
def gather(x, indices, *, axis):
    idx = np.where(indices < 0, indices + x.shape[axis], indices)
    return np.take(x, idx, axis=axis)


@kernel("shape")
def shape(x, *, start, end):
    return np.array(x.shape[start:end], dtype=np.int64)


@kernel("expand")
def expand(x, shape):
    return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(s) for s in shape))).copy()


@kernel("tile")
def tile(x, repeats):
    return np.tile(x, [int(r) for r in repeats])


@kernel("pad")
def pad(x, pads, value=None, axes=None, *, mode):
    axes = list(range(x.ndim)) if axes is None else [int(a) % x.ndim for a in axes]
    widths = [(0, 0)] * x.ndim
    for j, ax in enumerate(axes):
        widths[ax] = (int(pads[j]), int(pads[j + len(axes)]))
    # Negative pads crop.
    crop = tuple(slice(-b if b < 0 else None, e if e < 0 else None) for b, e in widths)
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        return np.pad(x, widths, constant_values=0 if value is None else value.item())
    return np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])


@kernel("depth_to_space")
def depth_to_space(x, *, blocksize, mode):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:  # CRD, PyTorch's PixelShuffle
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@kernel("space_to_depth")
def space_to_depth(x, *, blocksize, mode):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@kernel("constant_of_shape")
def constant_of_shape(shape, *, value, dtype):
    return np.full([int(s) for s in shape], value, dtype=to_numpy(dtype))


# ---------------------------------------------------------------- resize

def _source_coords(n_out, n_in, scale, mode, roi):
    # ONNX maps through the unrounded resized length n_in * scale, not the integer n_out.
    i = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":
        return i * (n_in - 1) / (n_in * scale - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adj = n_out / (scale * n_in)
        return n_in / 2 * (1 - adj) + (i + 0.5) / scale - 0.5
    if mode == "tf_crop_and_resize":
        # roi = (start, end) in normalized input coordinates; n_out points span it evenly.
        start, end = roi
        if n_out == 1:
            return np.full(1, (end - start) * (n_in - 1) / 2 + start * (n_in - 1))
        return start * (n_in - 1) + i * (end - start) * (n_in - 1) / (n_out - 1)
    raise ValueError(f"coordinate_transformation_mode {mode!r} is not supported")


def _cubic_kernel(d, a):
    """Keys' cubic convolution kernel with coefficient a, at distances d."""
    d = np.abs(d)
    return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                    np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))


def _filter_taps(src, n_in, scale, a):
    """Input indices and weights, both (n_out, taps), of linear or cubic interpolation at the
    source coordinates `src`. With antialias, a downscale (scale < 1) stretches the filter by
    1 / scale so each output averages all the inputs it covers; weights then sum to 1. Taps
    outside the input read the edge, or are dropped with exclude_outside."""
    support = 2.0 if a["mode"] == "cubic" else 1.0
    stretch = 1.0 / scale if a["antialias"] and scale < 1 else 1.0
    reach = math.ceil(support * stretch)
    base = np.floor(src).astype(np.int64)
    idx = base[:, None] + np.arange(1 - reach, reach + 1)  # every tap within the support
    d = (idx - src[:, None]) / stretch
    w = _cubic_kernel(d, a["cubic_coeff_a"]) if a["mode"] == "cubic" else np.maximum(0.0, 1 - np.abs(d))
    if a["antialias"]:
        w = w / w.sum(axis=1, keepdims=True)
    if a["exclude_outside"]:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        w = w / w.sum(axis=1, keepdims=True)
    return np.clip(idx, 0, n_in - 1), w


def _resize_axis(x, axis, n_out, scale, roi, a):
    n_in = x.shape[axis]
    ctm = a["coordinate_transformation_mode"]
    src = _source_coords(n_out, n_in, scale, ctm, roi)
    mode = a["mode"]
    if mode == "nearest":
        rnd = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
               "floor": np.floor, "ceil": np.ceil}[a["nearest_mode"]]
        idx = np.clip(rnd(src), 0, n_in - 1).astype(np.int64)
        y = np.take(x, idx, axis=axis)
    elif mode in ("linear", "cubic"):
        idx, w = _filter_taps(src, n_in, scale, a)
        xt = np.moveaxis(x, axis, -1).astype(np.float64)
        y = np.moveaxis((xt[..., idx] * w).sum(axis=-1), -1, axis).astype(x.dtype)
    else:
        raise ValueError(f"resize mode {mode!r} is not supported")
    if ctm == "tf_crop_and_resize":  # points outside the input take the extrapolation value
        outside = (src < 0) | (src > n_in - 1)
        shape = [1] * x.ndim
        shape[axis] = n_out
        y = np.where(outside.reshape(shape), np.asarray(a["extrapolation_value"], x.dtype), y)
    return y


def resize_plan(in_shape, scales, sizes, axes, policy):
    """[(axis, output length, scale)] for the resized axes. keep_aspect_ratio_policy
    not_larger / not_smaller replaces per-axis sizes by one scale (the smallest / largest
    ratio) and rounds each output length from it."""
    rank = len(in_shape)
    axes = [ax % rank for ax in axes] if axes else list(range(rank))
    if sizes is not None:
        sizes = [int(s) for s in sizes]
        ratios = [s / in_shape[ax] for ax, s in zip(axes, sizes)]
        if policy in ("not_larger", "not_smaller"):
            one = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [one] * len(axes)
            sizes = [int(math.floor(one * in_shape[ax] + 0.5)) for ax in axes]
        return list(zip(axes, sizes, ratios))
    return [(ax, int(math.floor(in_shape[ax] * float(s))), float(s)) for ax, s in zip(axes, scales)]


@kernel("resize")
def resize(x, roi=None, scales=None, sizes=None, **a):
    given = sizes if sizes is not None and sizes.size else None
    plan = resize_plan(x.shape, None if given is not None else scales, given, a["axes"],
                       a["keep_aspect_ratio_policy"])
    # roi lists the starts of the resized axes (in `axes` order), then their ends.
    bounds = roi.astype(np.float64).reshape(2, -1).T if roi is not None and roi.size else None
    for k, (axis, n_out, s) in enumerate(plan):
        if n_out != x.shape[axis] or s != 1.0 or a["coordinate_transformation_mode"] == "tf_crop_and_resize":
            r = bounds[k] if bounds is not None else (0.0, 1.0)
            x = _resize_axis(x, axis, n_out, s, r, a)
    return x
