"""Reference kernels: vision and signal ops (transposed/deformable convolution, normalizations,
Lp pooling, unpooling, region pooling, box suppression, grid sampling, folding, cropping,
Fourier transforms, windows, image decoding)."""
from __future__ import annotations

import io
import itertools
import math

import numpy as np

from ....ir.dtypes import to_numpy
from ....ir.ops.vision import conv_transpose_pads
from ... import pieces
from . import _like, kernel
from .nn import _taps, _window_pads


# ---------------------------------------------------------------- convolutions

@kernel("conv_transpose")
def conv_transpose(x, w, b=None, *, strides, pads, dilations, group, kernel_shape, auto_pad,
                   output_padding, output_shape):
    # x is (N, C, *S); w is (C, M/group, *K). Each input pixel scatters w * x into the output:
    # one matmul per kernel tap, added into a strided view of an un-cropped canvas.
    ks = list(kernel_shape or w.shape[2:])
    nd = len(ks)
    a = {"strides": strides, "pads": pads, "dilations": dilations, "auto_pad": auto_pad,
         "output_padding": output_padding, "output_shape": output_shape}
    begin, end, out = conv_transpose_pads(a, list(x.shape[2:]), ks)
    strides, dilations = strides or [1] * nd, dilations or [1] * nd
    n, c = x.shape[:2]
    g = group
    m = w.shape[1] * g
    # The canvas holds positions from min(0, begin) to max(full, begin + out) of the un-cropped output.
    full = [strides[i] * (x.shape[2 + i] - 1) + dilations[i] * (ks[i] - 1) + 1 for i in range(nd)]
    shift = [max(0, -bg) for bg in begin]
    canvas = np.zeros((n, m, *[shift[i] + max(full[i], begin[i] + out[i]) for i in range(nd)]),
                      dtype=np.result_type(x, w))
    xg = x.reshape(n, g, c // g, -1)
    wg = w.reshape(g, c // g, m // g, *w.shape[2:])
    # (a preemption point between taps: backends/pieces.py; nothing off a task thread)
    for tap in pieces.each(itertools.product(*[range(k) for k in ks])):
        part = np.swapaxes(wg[(slice(None),) * 3 + tap], 1, 2) @ xg  # (N, g, M/g, prod S)
        idx = tuple(slice(shift[i] + t * dilations[i], shift[i] + t * dilations[i]
                          + (x.shape[2 + i] - 1) * strides[i] + 1, strides[i]) for i, t in enumerate(tap))
        canvas[(slice(None), slice(None)) + idx] += part.reshape(n, m, *x.shape[2:])
    y = canvas[(slice(None), slice(None)) + tuple(slice(shift[i] + begin[i], shift[i] + begin[i] + out[i])
                                                  for i in range(nd))]
    if b is not None:
        y = y + b.reshape((1, m) + (1,) * nd)
    return y.astype(x.dtype, copy=False)


def _bilinear_taps(pos, size):
    """The two taps (index, weight, in-bounds) of linear interpolation at `pos` along an axis
    of `size`; out-of-bounds taps read 0."""
    lo = np.floor(pos)
    frac = pos - lo
    lo = lo.astype(np.int64)
    return [(lo, 1 - frac, (lo >= 0) & (lo < size)), (lo + 1, frac, (lo + 1 >= 0) & (lo + 1 < size))]


@kernel("deform_conv")
def deform_conv(x, w, offset, b=None, mask=None, *, strides, pads, dilations, group, kernel_shape,
                offset_group):
    # x is (N, C, H, W), w is (M, C/group, kh, kw), offset is (N, og * kh * kw * 2, oh, ow) with
    # (dy, dx) per tap, mask (N, og * kh * kw, oh, ow). Each tap reads x at its regular position
    # plus its offset, bilinearly (zero outside), times its mask; then an ordinary conv sum.
    n, c, h, wd = x.shape
    m = w.shape[0]
    kh, kw = kernel_shape or w.shape[2:]
    sh, sw = strides or [1, 1]
    dh, dw = dilations or [1, 1]
    pt, pl = (pads or [0, 0, 0, 0])[:2]
    oh, ow = offset.shape[2:]
    og, k = offset_group, kh * kw
    off = offset.reshape(n, og, k, 2, oh, ow).astype(np.float64)
    msk = np.ones((n, og, k, oh, ow)) if mask is None else mask.reshape(n, og, k, oh, ow)
    xg = x.reshape(n, og, c // og, h, wd).astype(np.float64)
    cols = np.zeros((n, og, c // og, k, oh, ow))
    bn = np.arange(n)[:, None, None]
    for t, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
        for g in range(og):
            py = (np.arange(oh) * sh - pt + i * dh)[:, None] + off[:, g, t, 0]  # (N, oh, ow)
            px = (np.arange(ow) * sw - pl + j * dw)[None, :] + off[:, g, t, 1]
            acc = 0
            for (yi, wy, vy), (xi, wx, vx) in itertools.product(_bilinear_taps(py, h), _bilinear_taps(px, wd)):
                val = xg[bn, g, :, np.clip(yi, 0, h - 1), np.clip(xi, 0, wd - 1)]  # (N, oh, ow, C/og)
                acc = acc + val * (wy * wx * (vy & vx))[..., None]
            cols[:, g, :, t] = np.moveaxis(acc, -1, 1) * msk[:, g, t][:, None]
    cols = cols.reshape(n, group, c // group * k, oh * ow)
    y = w.reshape(group, m // group, -1) @ cols  # (N, group, M/group, oh*ow)
    y = y.reshape(n, m, oh, ow)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return y.astype(x.dtype)


# ---------------------------------------------------------------- normalizations

def _normalize(x, axes, epsilon):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x64 - mean) / np.sqrt(var + epsilon)


@kernel("instance_normalization")
def instance_normalization(x, scale, bias, *, epsilon):
    # x is (N, C, *S): each (sample, channel) is normalized over its spatial positions.
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = _normalize(x, tuple(range(2, x.ndim)), epsilon)
    return _like(x, y * scale.reshape(shape) + bias.reshape(shape))


@kernel("group_normalization")
def group_normalization(x, scale, bias, *, num_groups, epsilon):
    # x is (N, C, *S); each group of C/num_groups channels is normalized together. scale and
    # bias are per channel, or per group (GroupNormalization-18), then shared by its channels.
    n, c = x.shape[:2]
    y = _normalize(x.reshape(n, num_groups, -1), (2,), epsilon).reshape(x.shape)
    per = c // scale.size
    shape = (1, c) + (1,) * (x.ndim - 2)
    return _like(x, y * np.repeat(scale, per).reshape(shape) + np.repeat(bias, per).reshape(shape))


@kernel("lrn")
def lrn(x, *, size, alpha, beta, bias):
    # Sum of squares over a window of channels [c - (size-1)//2, c + ceil((size-1)/2)].
    sq = np.square(x.astype(np.float64))
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    total = sum(padded[:, i:i + x.shape[1]] for i in range(size))
    return _like(x, x / (bias + alpha / size * total) ** beta)


@kernel("mean_variance_normalization")
def mean_variance_normalization(x, *, axes):
    # (x - E[x]) / sqrt(E[(x - E[x])^2]), over `axes`; the ONNX function adds 1e-9 to the
    # deviation so a constant slice gives 0 rather than NaN.
    ax = tuple(a % x.ndim for a in axes)
    x64 = x.astype(np.float64)
    centered = x64 - x64.mean(axis=ax, keepdims=True)
    return _like(x, centered / (np.sqrt((centered ** 2).mean(axis=ax, keepdims=True)) + 1e-9))


@kernel("lp_normalization")
def lp_normalization(x, *, axis, p):
    x64 = x.astype(np.float64)
    norm = np.abs(x64).sum(axis=axis, keepdims=True) if p == 1 else \
        np.sqrt((x64 ** 2).sum(axis=axis, keepdims=True))
    # An all-zero slice stays zero rather than 0/0.
    return _like(x, np.divide(x64, norm, out=np.zeros_like(x64), where=norm != 0))


# ---------------------------------------------------------------- pooling and unpooling

@kernel("lp_pool")
def lp_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, p):
    # (sum over the window of |x|^p)^(1/p); padding contributes zeros.
    begin, end, out, strides, dilations = _window_pads(
        x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xp = np.pad(np.abs(x.astype(np.float64)) ** p, [(0, 0), (0, 0)] + list(zip(begin, end)))
    total = sum(xs for _, xs in _taps(xp, kernel_shape, strides, dilations, out))
    return _like(x, total ** (1.0 / p))


@kernel("global_lp_pool")
def global_lp_pool(x, *, p):
    s = (np.abs(x.astype(np.float64)) ** p).sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    return _like(x, s ** (1.0 / p))


@kernel("max_unpool")
def max_unpool(x, indices, output_shape=None, *, kernel_shape, strides, pads):
    # indices are MaxPool's: flat positions in the whole (N, C, *S) tensor, S the size the
    # pooling inverts to. An output_shape larger than that only pads the ends of the spatial
    # axes (the ONNX tests read indices this way), so the positions keep their coordinates.
    nd = len(kernel_shape)
    strides, pads = strides or [1] * nd, pads or [0] * (2 * nd)
    shape = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] + kernel_shape[i]
                                 - pads[i] - pads[i + nd] for i in range(nd)]
    y = np.zeros(math.prod(shape), dtype=x.dtype)
    y[indices.reshape(-1)] = x.reshape(-1)
    y = y.reshape(shape)
    if output_shape is not None:
        want = [int(s) for s in output_shape]
        y = np.pad(y, [(0, max(0, t - d)) for t, d in zip(want, shape)])
        y = y[tuple(slice(0, t) for t in want)]
    return y


def _round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


@kernel("max_roi_pool")
def max_roi_pool(x, rois, *, pooled_shape, spatial_scale):
    # rois is (R, 5): [batch, x1, y1, x2, y2] in input coordinates (scaled, rounded, inclusive);
    # each roi is split into pooled_shape bins of ceil/floor edges, each bin's max (0 if empty).
    ph, pw = pooled_shape
    y = np.zeros((rois.shape[0], x.shape[1], ph, pw), dtype=x.dtype)
    h, w = x.shape[2:]
    for r, roi in enumerate(rois.astype(np.float64)):
        x1, y1, x2, y2 = (int(v) for v in _round_half_away(roi[1:] * spatial_scale))
        bin_h, bin_w = max(y2 - y1 + 1, 1) / ph, max(x2 - x1 + 1, 1) / pw
        for i, j in itertools.product(range(ph), range(pw)):
            hs = min(max(math.floor(i * bin_h) + y1, 0), h)
            he = min(max(math.ceil((i + 1) * bin_h) + y1, 0), h)
            ws = min(max(math.floor(j * bin_w) + x1, 0), w)
            we = min(max(math.ceil((j + 1) * bin_w) + x1, 0), w)
            if he > hs and we > ws:
                y[r, :, i, j] = x[int(roi[0]), :, hs:he, ws:we].max(axis=(1, 2))
    return y


def _roi_axis_samples(start, length, bins, grid, size):
    """Sample positions along one roi axis (bins * grid of them, at the centres of a grid of
    sub-cells) as two interpolation taps (low index, high index, weights) and a validity mask."""
    pos = start + (np.arange(bins * grid) + 0.5) * (length / bins / grid)
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    lo = np.floor(pos).astype(np.int64)
    at_end = lo >= size - 1
    lo = np.where(at_end, size - 1, lo)
    hi = np.where(at_end, size - 1, lo + 1)
    frac = np.where(at_end, 0.0, pos - lo)
    return lo, hi, 1 - frac, frac, valid


@kernel("roi_align")
def roi_align(x, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio,
              spatial_scale, coordinate_transformation_mode):
    # rois is (R, 4): [x1, y1, x2, y2]. Each output bin averages (or maxes) a grid of bilinear
    # samples; samples more than one pixel outside the image count as 0.
    oh, ow = output_height, output_width
    h, w = x.shape[2:]
    half = coordinate_transformation_mode == "half_pixel"
    y = np.zeros((rois.shape[0], x.shape[1], oh, ow), dtype=np.float64)
    for r, roi in enumerate(rois.astype(np.float64)):
        x1, y1, x2, y2 = roi * spatial_scale - (0.5 if half else 0.0)
        rh, rw = y2 - y1, x2 - x1
        if not half:  # the legacy mode forces a roi at least one pixel wide
            rh, rw = max(rh, 1.0), max(rw, 1.0)
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(rh / oh)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(rw / ow)
        ylo, yhi, wy0, wy1, vy = _roi_axis_samples(y1, rh, oh, gh, h)
        xlo, xhi, wx0, wx1, vx = _roi_axis_samples(x1, rw, ow, gw, w)
        img = x[int(batch_indices[r])].astype(np.float64)  # (C, H, W)
        valid = np.outer(vy, vx)
        corners = [img[:, yi][:, :, xi] * (np.outer(wy, wx) * valid)
                   for (yi, wy), (xi, wx) in itertools.product([(ylo, wy0), (yhi, wy1)],
                                                              [(xlo, wx0), (xhi, wx1)])]
        c = x.shape[1]
        if mode == "avg":
            s = sum(corners).reshape(c, oh, gh, ow, gw)
            y[r] = s.sum(axis=(2, 4)) / max(gh * gw, 1)
        else:  # ONNX's max mode takes the largest weighted corner of each sample, then the bin's max
            s = np.maximum.reduce(corners).reshape(c, oh, gh, ow, gw)
            y[r] = s.max(axis=(2, 4))
    return y.astype(x.dtype)


def _iou_above(box, others, threshold):
    """Whether each of `others` (k, 4 as y1, x1, y2, x2, corners in order) overlaps `box` by
    IoU > threshold; boxes of zero area never suppress."""
    iy = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    ix = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = iy * ix
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where((area > 0) & (areas > 0) & (union > 0), inter / union, 0.0)
    return iou > threshold


@kernel("non_max_suppression")
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box):
    # boxes is (B, n, 4), scores (B, classes, n). Per batch and class: take boxes by falling
    # score (ties by index), drop those overlapping a taken one, stop at the per-class limit.
    limit = int(max_output_boxes_per_class.reshape(-1)[0]) if max_output_boxes_per_class is not None \
        and max_output_boxes_per_class.size else 0
    iou_t = float(iou_threshold.reshape(-1)[0]) if iou_threshold is not None and iou_threshold.size else 0.0
    b = boxes.astype(np.float64)
    if center_point_box:  # [x_center, y_center, width, height]
        xc, yc, bw, bh = np.moveaxis(b, -1, 0)
        b = np.stack([yc - bh / 2, xc - bw / 2, yc + bh / 2, xc + bw / 2], axis=-1)
    else:  # [y1, x1, y2, x2] with either corner first
        b = np.concatenate([np.minimum(b[..., :2], b[..., 2:]), np.maximum(b[..., :2], b[..., 2:])], axis=-1)
    selected = []
    for n, c in itertools.product(range(scores.shape[0]), range(scores.shape[1])):
        s = scores[n, c].astype(np.float64)
        order = np.argsort(-s, kind="stable")
        if score_threshold is not None and score_threshold.size:
            order = order[s[order] > float(score_threshold.reshape(-1)[0])]
        kept = []
        while order.size and len(kept) < limit:
            top, order = order[0], order[1:]
            kept.append(top)
            order = order[~_iou_above(b[n, top], b[n, order], iou_t)]
        selected += [(n, c, k) for k in kept]
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


# ---------------------------------------------------------------- grid sampling

def _reflect(v, lo, hi):
    """Fold coordinates into [lo, hi] by mirroring at its ends, as often as needed."""
    span = hi - lo
    if span <= 0:
        return np.zeros_like(v)
    d = np.abs(v - lo)
    flips = np.floor(d / span)
    r = d - flips * span
    return np.where(flips % 2 == 0, lo + r, hi - r)


def _grid_taps(coord, size, mode, padding_mode, align_corners):
    """[(index, weight, in-bounds)] along one spatial axis for sample coordinates in pixels."""
    lo_b, hi_b = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
    if mode != "cubic":  # the coordinate itself is padded; cubic pads each tap instead
        if padding_mode == "border":
            coord = np.clip(coord, 0, size - 1)
        elif padding_mode == "reflection":
            coord = np.clip(_reflect(coord, lo_b, hi_b), 0, size - 1)
    if mode == "nearest":
        idx = [np.rint(coord)]  # halves to even, as the ONNX and PyTorch definitions do
        weights = [np.ones_like(coord)]
    elif mode == "linear":
        base = np.floor(coord)
        idx, weights = [base, base + 1], [1 - (coord - base), coord - base]
    else:
        base = np.floor(coord)
        t = coord - base
        idx = [base - 1, base, base + 1, base + 2]
        weights = list(np.moveaxis(_cubic(t[..., None] - np.array([-1.0, 0.0, 1.0, 2.0]), -0.75), -1, 0))
    taps = []
    for i, wt in zip(idx, weights):
        if mode == "cubic" and padding_mode == "border":
            i = np.clip(i, 0, size - 1)
        elif mode == "cubic" and padding_mode == "reflection":
            i = np.clip(np.rint(_reflect(i, lo_b, hi_b)), 0, size - 1)
        inside = (i >= 0) & (i <= size - 1)
        taps.append((np.clip(i, 0, size - 1).astype(np.int64), wt, inside))
    return taps


def _cubic(t, a):
    """The cubic convolution kernel (Keys) with coefficient a, at distances t."""
    d = np.abs(t)
    return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                    np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))


@kernel("grid_sample")
def grid_sample(x, grid, *, mode, padding_mode, align_corners):
    # x is (N, C, *D); grid is (N, *Dout, nd) of coordinates in [-1, 1], innermost axis first
    # (grid[..., 0] runs along the last spatial axis). The result is (N, C, *Dout).
    nd = x.ndim - 2
    g = grid.astype(np.float64)
    taps = []
    for k in range(nd):
        size = x.shape[2 + k]
        v = g[..., nd - 1 - k]
        coord = (v + 1) / 2 * (size - 1) if align_corners else ((v + 1) * size - 1) / 2
        taps.append(_grid_taps(coord, size, mode, padding_mode, align_corners))
    n_idx = np.arange(x.shape[0]).reshape((-1,) + (1,) * nd)
    x64 = x.astype(np.float64)
    y = 0
    for combo in itertools.product(*taps):
        weight = math.prod(t[1] * t[2] for t in combo)
        vals = x64[(n_idx, slice(None)) + tuple(t[0] for t in combo)]  # (N, *Dout, C)
        y = y + vals * weight[..., None]
    return np.moveaxis(np.asarray(y), -1, 1).astype(x.dtype)


@kernel("affine_grid")
def affine_grid(theta, size, *, align_corners):
    # theta is (N, nd, nd+1); size is (N, C, *D). Each output point is theta @ [x, y, (z,) 1],
    # where (x, y, z) are the normalized coordinates of the output pixel, x along the last axis.
    dims = [int(s) for s in size][2:]
    nd = len(dims)

    def axis_coords(s):
        if align_corners:
            return np.linspace(-1.0, 1.0, s) if s > 1 else np.zeros(s)
        return (np.arange(s) * 2.0 + 1.0) / s - 1.0
    mesh = np.meshgrid(*[axis_coords(s) for s in dims], indexing="ij")  # each (*D)
    base = np.stack(list(mesh)[::-1] + [np.ones(dims)], axis=-1)  # (*D, nd+1): x first
    out = np.einsum("...j,nij->n...i", base, theta.astype(np.float64))
    return out.astype(theta.dtype).reshape(theta.shape[0], *dims, nd)


# ---------------------------------------------------------------- folding, cropping

@kernel("col2im")
def col2im(x, image_shape, block_shape, *, dilations, pads, strides):
    # x is (N, C * prod(block), L), L the sliding positions of the block over the padded image;
    # each column is added back at its position (overlaps sum), then the padding is cut off.
    image, block = [int(s) for s in image_shape], [int(s) for s in block_shape]
    nd = len(image)
    dilations, strides = dilations or [1] * nd, strides or [1] * nd
    pads = pads or [0] * (2 * nd)
    padded = [image[i] + pads[i] + pads[i + nd] for i in range(nd)]
    counts = [(padded[i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    n = x.shape[0]
    c = x.shape[1] // math.prod(block)
    cols = x.reshape(n, c, *block, *counts)
    canvas = np.zeros((n, c, *padded), dtype=x.dtype)
    for tap in itertools.product(*[range(k) for k in block]):
        idx = tuple(slice(t * dilations[i], t * dilations[i] + (counts[i] - 1) * strides[i] + 1, strides[i])
                    for i, t in enumerate(tap))
        canvas[(slice(None), slice(None)) + idx] += cols[(slice(None), slice(None)) + tap]
    return canvas[(slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))]


@kernel("center_crop_pad")
def center_crop_pad(x, shape, *, axes):
    # Per axis: crop a centred window, or pad with zeros around the input (the odd element of
    # a crop or pad goes to the end).
    axes = [a % x.ndim for a in (axes or range(x.ndim))]
    src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
    out = list(x.shape)
    for a, t in zip(axes, [int(s) for s in shape]):
        d = x.shape[a]
        out[a] = t
        if t < d:
            src[a] = slice((d - t) // 2, (d - t) // 2 + t)
        elif t > d:
            dst[a] = slice((t - d) // 2, (t - d) // 2 + d)
    y = np.zeros(out, dtype=x.dtype)
    y[tuple(dst)] = x[tuple(src)]
    return y


# ---------------------------------------------------------------- signal processing

def _scalar(a):
    """A scalar operand (a length, a step), given as a 0-d or one-element array."""
    return a.reshape(-1)[0].item()


def _complex(x):
    """(..., 1) real or (..., 2) [re, im] -> complex (...), at the input's precision."""
    z = x[..., 0].astype(np.result_type(x.dtype, np.complex64))
    return z if x.shape[-1] == 1 else z + 1j * x[..., 1]


def _fit(z, axis, n):
    """Zero-pad or truncate `z` along `axis` to length n."""
    if z.shape[axis] >= n:
        return np.take(z, np.arange(n), axis=axis)
    widths = [(0, 0)] * z.ndim
    widths[axis] = (0, n - z.shape[axis])
    return np.pad(z, widths)


@kernel("dft")
def dft(x, dft_length=None, axis=None, *, inverse, onesided):
    # The transform runs along `axis` of the signal (the input minus its [re, im] axis):
    # X[k] = sum_n x[n] e^(-2 pi i k n / N), the inverse with +i and a 1/N factor. It is
    # computed at the input's precision, as the ONNX definition's float outputs are.
    ax = (-2 if axis is None else int(_scalar(axis))) % x.ndim
    z = _complex(x)
    if inverse and onesided:
        # The input holds bins 0..N/2 of a real signal's spectrum: rebuild the rest by
        # conjugate symmetry, transform back and keep the real part.
        n = int(_scalar(dft_length)) if dft_length is not None else 2 * (z.shape[ax] - 1)
        half = _fit(z, ax, n // 2 + 1)
        rest = np.conj(np.flip(np.take(half, np.arange(1, n - n // 2), axis=ax), axis=ax))
        y = np.fft.ifft(np.concatenate([half, rest], axis=ax), axis=ax)
        return y.real[..., None].astype(x.dtype)
    n = int(_scalar(dft_length)) if dft_length is not None else z.shape[ax]
    y = (np.fft.ifft if inverse else np.fft.fft)(_fit(z, ax, n), axis=ax)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=ax)
    return np.stack([y.real, y.imag], axis=-1).astype(x.dtype)


@kernel("stft")
def stft(signal, frame_step, window=None, frame_length=None, *, onesided):
    # signal is (B, L, 1 or 2); frames of frame_length start every frame_step samples, are
    # multiplied by the window and transformed: the result is (B, frames, bins, 2).
    step = int(_scalar(frame_step))
    length = int(_scalar(frame_length)) if frame_length is not None else window.shape[0]
    z = _complex(signal)
    frames = (z.shape[1] - length) // step + 1
    starts = np.arange(frames)[:, None] * step + np.arange(length)
    chunks = z[:, starts]  # (B, frames, length)
    if window is not None:
        chunks = chunks * window.astype(np.float64)
    y = np.fft.fft(chunks, axis=-1)
    if onesided:
        y = y[..., : length // 2 + 1]
    return np.stack([y.real, y.imag], axis=-1).astype(signal.dtype)


def _window(terms):
    """A cosine-sum window: sum_k terms[k] * cos(2 pi k n / D), D = size (periodic) or size - 1."""
    def compute(size, *, periodic, dtype):
        n = int(_scalar(size))
        d = n if periodic else n - 1
        t = 2 * np.pi * np.arange(n) / d if d > 0 else np.zeros(n)
        y = sum(c * np.cos(k * t) for k, c in enumerate(terms))
        return np.asarray(y, dtype=np.float64).astype(to_numpy(dtype))
    return compute


kernel("hann_window")(_window([0.5, -0.5]))
kernel("hamming_window")(_window([25 / 46, -21 / 46]))
kernel("blackman_window")(_window([0.42, -0.5, 0.08]))


@kernel("mel_weight_matrix")
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *, dtype):
    # (dft_length // 2 + 1, num_mel_bins): triangular filters whose edges are num_mel_bins + 2
    # points on the mel scale (2595 log10(1 + f / 700)), a step of (mel(upper) - mel(lower)) /
    # (num_mel_bins + 2) apart from mel(lower) (as ONNX Runtime and the ONNX tests have it),
    # each mapped to a spectrogram bin floor((dft_length + 1) f / sample_rate).
    bins, length, rate = int(_scalar(num_mel_bins)), int(_scalar(dft_length)), float(_scalar(sample_rate))
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    low, high = mel(float(_scalar(lower_edge_hertz))), mel(float(_scalar(upper_edge_hertz)))
    points = low + np.arange(bins + 2) * ((high - low) / (bins + 2))
    hertz = 700 * (10 ** (points / 2595) - 1)
    edge = np.floor((length + 1) * hertz / rate).astype(np.int64)
    y = np.zeros((length // 2 + 1, bins))
    for i in range(bins):
        lo, mid, hi = edge[i:i + 3]
        if mid == lo:
            y[mid, i] = 1
        else:
            y[lo:mid + 1, i] = (np.arange(lo, mid + 1) - lo) / (mid - lo)
        if hi > mid:
            y[mid:hi, i] = (hi - np.arange(mid, hi)) / (hi - mid)
    return y.astype(to_numpy(dtype))


# ---------------------------------------------------------------- images

@kernel("image_decoder")
def image_decoder(encoded, *, pixel_format):
    # Any format Pillow reads (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000); (H, W, 3) or (H, W, 1).
    import warnings

    from PIL import Image
    with warnings.catch_warnings():  # a decompression bomb is refused, not just warned about
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        img = Image.open(io.BytesIO(encoded.tobytes()))
        if pixel_format == "Grayscale":
            return np.asarray(img.convert("L"), dtype=np.uint8)[..., None]
        rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    return np.ascontiguousarray(rgb[..., ::-1]) if pixel_format == "BGR" else rgb
