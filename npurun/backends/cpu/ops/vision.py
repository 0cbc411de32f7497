"""Pooling and resizing on the cpu backend: `max_pool` and nearest `resize` (YOLOv8n's SPPF
and FPN upsampling) in NumPy with the work of the reference kernels' inner loops removed,
`average_pool` on the compiled depthwise kernel, `global_average_pool` on csrc/pool.c.

- **max_pool** (2-D, no dilation): float32 on the compiled kernel (csrc/pool.c: the window's
  rows first, contiguous, then the taps along that one row; planes on the pool at 2+
  threads), against the NumPy passes below (`python bench/cpu_ops_ab.py`, 1 thread): a ResNet
  stem's 3x3 stride-2 (1, 64, 112, 112) 0.79 -> 0.27 ms, Inception's (1, 64, 147, 147) 1.08
  -> 0.44, (1, 192, 71, 71) 0.66 -> 0.35, SPPF's 5x5 stride 1 at (1, 128, 40, 40) 0.39 ->
  0.31. Stride 1 on rows of <= 24 stays in NumPy at 1 thread. Other dtypes, or without the
  library, in NumPy: a k x k window's max is the max over kw columns, then over
  kh rows of that, so 2*(k-1) `np.maximum` passes over the tensor instead of k*k (the
  reference's taps), each in place; -inf padding is added only where pads or ceil_mode need
  it. Exact (max is associative), so the result equals the reference's bit for bit, NaNs
  included. Stride 1 runs the passes on the padded block flattened (one long np.maximum per
  shift). YOLOv8n's SPPF (3 x 5x5 s1 pools on (1, 128, 10, 10)): 0.28 -> 0.05 ms each.
- **average_pool** (2-D float32, no dilation): a depthwise conv whose weights are all 1 (the
  compiled kernel of nativeconv.py, zero padding included), then one multiply by the
  reciprocal of each window's count; the counts depend on the shape and attributes only, so
  they are the reference kernel's own divisor, computed once on a probe of ones (with or
  without count_include_pad, ceil_mode's extra end padding never counted) and cached.
  PoolFormer's 3x3 stride-1 pools: ~2.3 -> ~0.5 ms each. A window larger than the padded
  input is cropped to it first (the cells it loses are padding, which sums to 0). Where every
  window has the same count its reciprocal is in the weights (no second pass); a 1x1 window
  without padding is a strided copy (NASNet's). The weights, the counts and the conv's plan are
  kept per shape and attributes.
- **resize, modes linear and cubic** (batch and channel axes kept): separable, each resized
  axis at a time as a sum of k taps (2 for linear, 4 for cubic, more with antialias) whose
  source indices and weights are the reference kernel's own (`_filter_taps`), computed once
  per shape and attributes and cached, summed in float32 by csrc/resize.c (the reference sums
  in float64: within a few ulp). SegFormer's decode head (256 channels, 8/16/32 -> 64): the
  three resizes 38 -> ~1.5 ms.
- **resize, mode nearest**: each output pixel copies one input pixel, and which one depends
  only on the spatial shape and the attributes. The map is found once per (shape, attributes,
  scales/sizes) by running the reference kernel on a probe holding each pixel's own index
  (so every coordinate mode and rounding rule is the reference's own), and cached; a run is
  then one `np.take` (for YOLOv8n's 2x upsampling faster than `repeat` or a broadcast copy:
  54 / 82 / 130 us on (1, 256, 10, 10)). Resizes of the batch or channel axes,
  tf_crop_and_resize and the interpolating modes go to the reference kernel.
"""
from __future__ import annotations

import functools

import numpy as np

from ... import pieces
from ...reference.kernels import KERNELS as REF
from ...reference.kernels.nn import _window_pads
from ...reference.kernels.shape import resize_plan
from .. import native

CACHE = 64  # nearest-resize maps kept (per shape and attributes)
BIG = 1 << 14  # output elements; a smaller pool is not worth a second thread
_maps: dict = {}


def _max_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, threads=1):
    if (x.ndim != 4 or x.dtype.kind != "f" or len(kernel_shape) != 2
            or (dilations and any(d != 1 for d in dilations))):
        return REF["max_pool"](x, kernel_shape=kernel_shape, strides=strides, pads=pads, dilations=dilations,
                               ceil_mode=ceil_mode, auto_pad=auto_pad)
    begin, end, (ho, wo), (sh, sw), _ = _window_pads(x.shape, kernel_shape, strides, dilations, pads,
                                                     auto_pad, ceil_mode)
    if min(*begin, *end) < 0:
        return REF["max_pool"](x, kernel_shape=kernel_shape, strides=strides, pads=pads, dilations=dilations,
                               ceil_mode=ceil_mode, auto_pad=auto_pad)
    kh, kw = kernel_shape
    n, c, h, w = x.shape
    # (stride 1 runs as two flat passes over each padded plane in C, as _max_pool_s1 below in
    # NumPy: SPPF's 5x5 on (1, 256, 20, 20), 1 thread, 0.24 ms NumPy, 0.10 C, ORT 0.09)
    if native.LIB is not None and x.dtype == np.float32:
        x = native.contiguous(x)
        y = np.empty((n, c, ho, wo), np.float32)
        if threads > 1 and y.size >= BIG and n * c > 1:  # planes in parts on the library's pool
            rc = native.LIB.npr_maxpool2d_mt(native.ptr(x), native.ptr(y), n * c, h, w, ho, wo, kh, kw, sh, sw,
                                             begin[0], begin[1], threads, min(n * c, 2 * threads))
        else:
            rc = native.LIB.npr_maxpool2d(native.ptr(x), native.ptr(y), 0, n * c, h, w, ho, wo, kh, kw, sh, sw,
                                          begin[0], begin[1])
        if rc:
            raise MemoryError(f"max_pool: no memory for a row buffer of {w} floats")
        return y
    if any(begin) or any(end):
        xp = np.full((n, c, h + begin[0] + end[0], w + begin[1] + end[1]), -np.inf, x.dtype)
        xp[:, :, begin[0]:begin[0] + h, begin[1]:begin[1] + w] = x
    else:
        xp = x
    if sh == sw == 1:
        return _max_pool_s1(xp, kh, kw, ho, wo)
    cols = (wo - 1) * sw + 1
    t = xp[..., 0:cols:sw].copy()  # (n, c, Hp, wo): max over the kw columns of each window
    for kx in range(1, kw):
        np.maximum(t, xp[..., kx:kx + cols:sw], out=t)
    rows = (ho - 1) * sh + 1
    y = t[:, :, 0:rows:sh].copy()  # (n, c, ho, wo): then over its kh rows
    for ky in range(1, kh):
        np.maximum(y, t[:, :, ky:ky + rows:sh], out=y)
    return y


def _max_pool_s1(xp, kh, kw, ho, wo):
    """Stride 1 on the padded block flattened: column and row shifts are shifts of one
    contiguous array (kx and ky*Wp), so each pass is one long np.maximum instead of one short
    inner loop per row (SPPF's 10-wide rows: 77 -> ~25 us). Windows that wrap past a row end
    or the block's end are computed and never read."""
    n, c, hp, wp = xp.shape
    flat = np.ascontiguousarray(xp).reshape(-1)
    L = flat.size
    t = flat[:L - (kw - 1)].copy()
    for kx in range(1, kw):
        np.maximum(t, flat[kx:L - (kw - 1) + kx], out=t)
    span = (kh - 1) * wp
    v = t[:t.size - span].copy()
    for ky in range(1, kh):
        np.maximum(v, t[ky * wp:ky * wp + v.size], out=v)
    # pixel (i, j) of image-channel b sits at b*hp*wp + i*wp + j of the flat block
    full = np.empty(n * c * hp * wp, xp.dtype)
    full[:v.size] = v
    return full.reshape(n, c, hp, wp)[:, :, :ho, :wo].copy()


_pools: dict = {}  # (shape, threads, attributes) -> _pool_plan's answer


def _average_pool(program):
    from .. import native, nativeconv

    def average_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, count_include_pad):
        # The depthwise conv's weights, attributes and plan are kept per shape and attributes:
        # made on every call, packing and planning cost more than the pool itself (PoolFormer's
        # 3x3 pools on (1, 64, 56, 56): ~400 us a call, ~230 planned once).
        key = (x.shape, x.dtype, program.threads, tuple(kernel_shape), strides and tuple(strides),
               pads and tuple(pads), dilations and tuple(dilations), ceil_mode, auto_pad, count_include_pad)
        hit = _pools.get(key)
        if hit is None:
            a = dict(kernel_shape=kernel_shape, strides=strides, pads=pads, dilations=dilations,
                     ceil_mode=ceil_mode, auto_pad=auto_pad, count_include_pad=count_include_pad)
            hit = _pool_plan(x, a, native.LIB is not None)
            if len(_pools) >= CACHE:
                _pools.clear()
            _pools[key] = hit
        if hit is None:
            return REF["average_pool"](x, kernel_shape=kernel_shape, strides=strides, pads=pads, dilations=dilations,
                                       ceil_mode=ceil_mode, auto_pad=auto_pad, count_include_pad=count_include_pad)
        w, attrs, cache, inv = hit
        if w is None:  # a 1x1 window without padding: every average is one pixel (attrs: the strides)
            return x[:, :, ::attrs[0], ::attrs[1]].copy()
        x = native.contiguous(x)
        plan = cache.get(("memo", x.shape))
        y = plan(x) if plan is not None else nativeconv.conv2d(x, w, None, attrs, None, None, program.threads, cache,
                                                              memo=True)
        return y if inv is None else np.multiply(y, inv, out=y)
    return average_pool


def _pool_plan(x, a, compiled: bool):
    """How the cpu backend runs an average pool of x's shape and attributes `a`: None for the
    reference kernel (no compiled kernels, not 2-D float32, a dilation, a negative pad, an empty
    input), else (weights, conv attributes, conv cache, 1 / count per output pixel or None)
    for a depthwise conv, or (None, strides, None, None) for a 1x1 window with no padding."""
    from .. import nativeconv
    ks = a["kernel_shape"]
    if not compiled or x.ndim != 4 or x.dtype != np.float32 or len(ks) != 2 or x.size == 0 \
            or (a["dilations"] and any(d != 1 for d in a["dilations"])):
        # (an empty input too: its per-channel weights would be allocated for nothing, and
        # a (0, 2^31 - 1, 28, 28) input asked for 72 GiB of them; found by `make fuzz`)
        return None
    begin, end, (ho, wo), st, _ = _window_pads(x.shape, ks, a["strides"], a["dilations"], a["pads"],
                                               a["auto_pad"], a["ceil_mode"])
    if min(*begin, *end) < 0:
        return None
    if tuple(ks) == (1, 1) and max(*begin, *end) == 0 and x[0, 0, ::st[0], ::st[1]].shape == (ho, wo):
        return None, tuple(st), None, None  # (NASNet's 1x1 stride-2 pools: 0.46 ms as a conv, ORT 0.05)
    # A window reaching past the input's far edge sums only zeros there, so the kernel is
    # cropped to what the first window can see (HF EfficientNet's head pools a 7x7 map
    # with a 1280x1280 ceil_mode window: 4 GFLOP uncropped, 63 kFLOP cropped).
    ks, end = list(ks), list(end)
    for i, n in enumerate(x.shape[2:]):
        if ks[i] > n + begin[i]:
            ks[i] = n + begin[i]
            end[i] = max(0, ((ho, wo)[i] - 1) * st[i] + ks[i] - begin[i] - n)
    # the reference's own divisor: the average of ones times the window size
    ones = np.ones((1, 1) + x.shape[2:], np.float32)
    cnt = REF["average_pool"](ones, **a)  # = count / count
    total = nativeconv.conv2d(ones, np.ones((1, 1, *ks), np.float32), None, _conv_attrs(begin, end, st),
                              None, None, 1, {})
    # 1 / count; a window wholly in the padding sums nothing (total 0): its average is the
    # reference's there (0 where padding counts, NaN where its count is 0), not 0 / 0
    with np.errstate(invalid="ignore", divide="ignore"):
        inv = np.where(total != 0, cnt / total, cnt).astype(np.float32)
    c = x.shape[1]
    w = np.ones((c, 1, *ks), np.float32)
    if (inv == inv.flat[0]).all():  # one count everywhere: the weights hold its reciprocal, no second pass
        w *= inv.flat[0]
        inv = None
    return w, {**_conv_attrs(begin, end, st), "group": c}, {}, inv


def _conv_attrs(begin, end, strides):
    return {"strides": list(strides), "pads": [begin[0], begin[1], end[0], end[1]], "dilations": [1, 1],
            "group": 1, "kernel_shape": None, "auto_pad": "NOTSET"}


def _resize(x, roi=None, scales=None, sizes=None, threads=1, **a):
    if a.get("mode") in ("linear", "cubic"):
        y = _interpolate(x, roi, scales, sizes, a, threads)
        return REF["resize"](x, roi, scales, sizes, **a) if y is None else y
    m = _nearest_map(x, roi, scales, sizes, a)
    if m is None:
        return REF["resize"](x, roi, scales, sizes, **a)
    idx, out = m
    n, c = x.shape[:2]
    x3 = x.reshape(n, c, -1)
    secs = n * c * len(idx) * RESIZE_S_PER_ELEMENT
    cal = _cal(_RESIZE_CAL, (x.shape, out))
    if n * c * len(idx) < PIECE_MIN or c < 2 or not pieces.wanted(secs, cal):
        return np.take(x3, idx, axis=2).reshape(n, c, *out)
    # Pieces on a contended device (backends/pieces.py): channel ranges, each the same gather
    # (copies: bit-identical); an FPN's nearest x2 of (1, 96, 160, 160) is a 10 MB write.
    y = np.empty((n, c, len(idx)), x.dtype)
    # (mode="clip": with the default "raise" np.take writes `out` through a temporary, a second
    # copy of the piece; the indices are in range, so clipping changes nothing)
    for c0, c1 in pieces.each(pieces.split(c, secs, cal=cal)):
        np.take(x3[:, c0:c1], idx, axis=2, out=y[:, c0:c1], mode="clip")
    return y.reshape(n, c, *out)


PIECE_MIN = 1 << 20           # output elements: a smaller resize is well under a piece
RESIZE_MT_MIN = 1 << 15       # output elements per thread below which an axis pass stays on one
RESIZE_S_PER_ELEMENT = 1e-9   # a gathered copy per output element (pieces.split learns the real rate)
_RESIZE_CAL: dict = {}  # (input shape, output size) -> that resize's calibration (pieces.split)
_INTERP_CAL: dict = {}


def _cal(table: dict, key) -> dict:
    """The pieces' calibration of one resize shape: a x8 resize writes each input element 64
    times, a x2 one 4 times, so one dict for all of them sized each one's pieces by another's
    speed (SegFormer's x8 decoder resize, 0.46 ms whole, ran 0.76 ms in pieces)."""
    cal = table.get(key)
    if cal is None:
        if len(table) > 256:
            table.clear()
        cal = table[key] = {}
    return cal


_taps: dict = {}  # (axis length, plan entry, attributes) -> (indices (n_out, k), weights float32)


def _interpolate(x, roi, scales, sizes, a, threads=1):
    """Linear/cubic resize of the spatial axes, an axis at a time (slices of the outer axes on
    the pool's threads for a big map: each slice's sums are the one call's); None where the
    reference must run (other dtypes, tf_crop_and_resize, a resized batch or channel axis)."""
    from ...reference.kernels.shape import _filter_taps, _source_coords
    from .. import native
    if native.LIB is None or x.dtype != np.float32 or x.ndim < 3 \
            or a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return None
    given = sizes if sizes is not None and sizes.size else None
    plan = resize_plan(x.shape, None if given is not None else scales, given, a["axes"], a["keep_aspect_ratio_policy"])
    passes = []  # (axis, n_out, taps, weights), the last axis first: its taps are scalar
    n_in = list(x.shape)  # gathers, cheapest while the other axes are small
    written = 0
    for axis, n_out, sc in sorted(plan, key=lambda e: -e[0]):
        if n_out == n_in[axis] and sc == 1.0:
            continue
        if axis < 2:
            return None
        key = (n_in[axis], n_out, float(sc), repr(sorted(a.items())))
        hit = _taps.get(key)
        if hit is None:
            src = _source_coords(n_out, n_in[axis], sc, a["coordinate_transformation_mode"], (0.0, 1.0))
            idx, w = _filter_taps(src, n_in[axis], sc, a)
            hit = (np.ascontiguousarray(idx, np.int64), np.ascontiguousarray(w, np.float32))
            if len(_taps) >= CACHE:
                _taps.clear()
            _taps[key] = hit
        passes.append((axis, n_out, *hit))
        n_in[axis] = n_out
        written += int(np.prod(n_in)) * hit[0].shape[1]  # the pass's outputs times its taps
    if not passes:
        return x.copy()
    size = int(np.prod(n_in))
    nc = x.shape[0] * x.shape[1]
    # (each output of a pass is its taps' weighted sum, the threads sharing them; it had been
    # every pass at the final size, 4 ns an element: SegFormer's x8 decoder resize, 0.34 ms,
    # was predicted at 33 ms and cut into eight pieces)
    secs = written * RESIZE_S_PER_ELEMENT / max(1, threads)
    cal = _cal(_INTERP_CAL, (x.shape, tuple(n_in)))
    if size < PIECE_MIN or nc < 2 or not pieces.wanted(secs, cal):
        return _axis_passes(x, passes, threads)
    # Pieces (backends/pieces.py): ranges of (image, channel) planes, each through the same
    # passes (every output row is the one call's: bit-identical).
    y = np.empty(n_in, np.float32)
    xs, ys = x.reshape((nc, 1) + x.shape[2:]), y.reshape((nc, 1) + y.shape[2:])
    for c0, c1 in pieces.each(pieces.split(nc, secs, cal=cal)):
        # (the last pass straight into the output's planes: a piece computed aside and copied
        # in ran SegFormer's decoder resizes at 1.35-2x their whole time)
        _axis_passes(xs[c0:c1], passes, threads, dest=ys[c0:c1])
    return y


def _axis_passes(x, passes, threads, dest=None):
    """x through each (axis, n_out, taps, weights) pass of csrc/resize.c, on the pool's threads;
    the last pass writes into `dest` where given (C-contiguous, the result's shape)."""
    from .. import native
    y = x
    for k, (axis, n_out, idx, w) in enumerate(passes):
        y = np.ascontiguousarray(y)
        outer, inner = int(np.prod(y.shape[:axis])), int(np.prod(y.shape[axis + 1:]))
        out = dest if dest is not None and k == len(passes) - 1 else \
            np.empty(y.shape[:axis] + (n_out,) + y.shape[axis + 1:], np.float32)
        chunks = max(1, min(threads, outer, out.size // RESIZE_MT_MIN))
        native.LIB.npr_resize_axis_mt(native.ptr(y), native.ptr(out), outer, y.shape[axis], inner, n_out,
                                      native.ptr(idx), native.ptr(w), idx.shape[1], threads, chunks)
        y = out
    return y


def _nearest_map(x, roi, scales, sizes, a):
    """(flat source index per output pixel, output spatial shape), or None where the reference
    kernel must run."""
    if a.get("mode") != "nearest" or x.ndim < 3 or a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return None
    given = sizes if sizes is not None and sizes.size else None
    sc = None if given is not None else scales
    if sc is None and given is None:
        return None
    key = (x.shape, repr(sorted(a.items())), None if sc is None else sc.tobytes(),
           None if given is None else given.tobytes(), None if roi is None else roi.tobytes())
    if key in _maps:
        return _maps[key]
    plan = resize_plan(x.shape, sc, given, a["axes"], a["keep_aspect_ratio_policy"])
    if any(ax < 2 and (n_out != x.shape[ax] or s != 1.0) for ax, n_out, s in plan):
        m = None  # the batch or channel axis resized
    else:
        probe = np.arange(int(np.prod(x.shape[2:])), dtype=np.float64).reshape((1, 1) + x.shape[2:])
        if given is not None and not a["axes"]:  # sizes name every axis: the probe's first two are 1
            given = given.copy()
            given[:2] = 1
        y = REF["resize"](probe, roi, None if given is not None else sc, given, **a)
        m = (y.reshape(-1).astype(np.intp), y.shape[2:])
    if len(_maps) >= CACHE:
        _maps.clear()
    _maps[key] = m
    return m


def _global_average_pool(x, *, threads=1):
    """float32 on the compiled kernel (csrc/pool.c: each plane summed in float32 with 32 lanes
    of partial sums; the reference sums in float64: within a few ulp), planes on the pool when
    there are enough of them; else the reference."""
    if native.LIB is None or x.dtype != np.float32 or x.ndim < 3 or x.size == 0:
        return REF["global_average_pool"](x)
    planes = x.shape[0] * x.shape[1]
    return plane_means(native.contiguous(x), planes, x.size // planes, threads) \
        .reshape(x.shape[:2] + (1,) * (x.ndim - 2))


def plane_means(x, planes: int, hw: int, threads: int) -> np.ndarray:
    """(planes,) float32 means of the contiguous float32 x's runs of hw (csrc/pool.c), the
    planes on the pool when there are enough elements."""
    y = np.empty(planes, np.float32)
    chunks = min(threads, planes) if threads > 1 and x.size >= BIG else 1
    native.LIB.npr_plane_means_mt(native.ptr(x), native.ptr(y), planes, hw, threads, chunks)
    return y


KERNELS = {
    "max_pool": lambda program: functools.partial(_max_pool, threads=program.threads),
    "global_average_pool": lambda program: functools.partial(_global_average_pool, threads=program.threads),
    "average_pool": _average_pool,
    "resize": lambda program: functools.partial(_resize, threads=program.threads),
}
