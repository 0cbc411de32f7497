"""Vision and signal ops: transposed and deformable convolution, the normalizations CNNs use,
Lp pooling, unpooling, region pooling, box suppression, grid sampling, column folding,
cropping, Fourier transforms and windows, image decoding."""
from __future__ import annotations

import math

from ..shapes import UNKNOWN, affine, dim_mul, numel
from . import REQUIRED, _axis, _const_ints, _fail, _same, op
from .nn import _CONV_ATTRS, _spatial
from .shape import MAX_RANK


def _operand(ins, i):
    return ins[i] if len(ins) > i else None


def _const_scalar(v):
    """The value of a constant scalar operand (a count, a rate), or None if computed."""
    if v is None or v.data is None or v.data.size != 1:
        return None
    return v.data.reshape(-1)[0].item()


# ---------------------------------------------------------------- convolutions

def conv_transpose_pads(a, in_sizes, kernel):
    """(begin pads, end pads, output sizes) of a transposed convolution, per spatial axis.

    The un-cropped output of axis i is stride * (in - 1) + dilation * (k - 1) + 1; output_padding
    adds to its end and pads crop it. With output_shape (or SAME auto_pad, whose output is
    in * stride) the pads are derived from the wanted size instead."""
    nd = len(kernel)
    strides = a.get("strides") or [1] * nd
    dils = a.get("dilations") or [1] * nd
    opad = a.get("output_padding") or [0] * nd
    full = [strides[i] * (in_sizes[i] - 1) + opad[i] + dils[i] * (kernel[i] - 1) + 1 for i in range(nd)]
    want = a.get("output_shape")
    auto = a.get("auto_pad", "NOTSET")
    if want is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        want = [in_sizes[i] * strides[i] for i in range(nd)]
    if want is not None:
        want = list(want)[-nd:]  # some exporters give the whole (N, C, ...) shape
        total = [full[i] - want[i] for i in range(nd)]
        upper = auto == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        return begin, [t - b for t, b in zip(total, begin)], want
    if auto == "VALID":
        return [0] * nd, [0] * nd, full
    pads = a.get("pads") or [0] * (2 * nd)
    return list(pads[:nd]), list(pads[nd:]), [full[i] - pads[i] - pads[i + nd] for i in range(nd)]


def _conv_transpose_macs(a, ins, outs):
    return numel(ins[0]) * math.prod(ins[1][1:])


@op("conv_transpose", ["x", "w", "b?"],
    attrs={**_CONV_ATTRS, "output_padding": None, "output_shape": None},
    groups={"conv", "mac"}, macs=_conv_transpose_macs)
def _conv_transpose(node, a, ins):
    x, w = ins[0], ins[1]
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        _fail(node, f"input rank {len(x.shape)} and weight rank {len(w.shape)} must match and be >= 3")
    if isinstance(x.shape[1], int) and isinstance(w.shape[0], int) and x.shape[1] != w.shape[0]:
        _fail(node, f"input has {x.shape[1]} channels, weight expects {w.shape[0]}")
    kernel = a["kernel_shape"] or list(w.shape[2:])
    m = dim_mul(w.shape[1], a["group"])
    if all(isinstance(d, int) for d in list(x.shape[2:]) + list(kernel)):
        spatial = conv_transpose_pads(a, list(x.shape[2:]), kernel)[2]
    elif a["output_shape"] is not None:
        spatial = list(a["output_shape"])[-len(kernel):]
    else:
        spatial = [UNKNOWN] * len(kernel)
    return [((x.shape[0], m, *spatial), x.dtype)]


@op("deform_conv", ["x", "w", "offset", "b?", "mask?"],
    attrs={"strides": None, "pads": None, "dilations": None, "group": 1, "kernel_shape": None,
           "offset_group": 1},
    groups={"conv", "mac"}, macs=lambda a, ins, outs: numel(outs[0]) * math.prod(ins[1][1:]))
def _deform_conv(node, a, ins):
    x, w = ins[0], ins[1]
    if len(x.shape) != 4 or len(w.shape) != 4:
        _fail(node, f"deform_conv takes 2-D images: input rank {len(x.shape)}, weight rank {len(w.shape)}")
    spatial = _spatial(node, a, x.shape, a["kernel_shape"] or list(w.shape[2:]))
    return [((x.shape[0], w.shape[0], *spatial), x.dtype)]


# ---------------------------------------------------------------- normalizations

@op("instance_normalization", ["x", "scale", "bias"], attrs={"epsilon": 1e-5}, groups={"norm"})
def _instance_norm(node, a, ins):
    return _same(node, a, ins)


# scale and bias are per channel (C) or, as GroupNormalization-18 has them, per group.
@op("group_normalization", ["x", "scale", "bias"],
    attrs={"num_groups": REQUIRED, "epsilon": 1e-5}, groups={"norm"})
def _group_norm(node, a, ins):
    c = ins[0].shape[1] if len(ins[0].shape) > 1 else UNKNOWN
    if isinstance(c, int) and c % a["num_groups"]:
        _fail(node, f"{c} channels do not split into {a['num_groups']} groups")
    n = ins[1].shape[0] if len(ins[1].shape) == 1 else UNKNOWN
    if isinstance(c, int) and isinstance(n, int) and n not in (c, a["num_groups"]):
        _fail(node, f"scale has {n} entries; expected {c} (per channel) or {a['num_groups']} (per group)")
    return _same(node, a, ins)


@op("lrn", ["x"], attrs={"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}, groups={"norm"})
def _lrn(node, a, ins):
    return _same(node, a, ins)


@op("mean_variance_normalization", ["x"], attrs={"axes": [0, 2, 3]}, groups={"norm"})
def _mvn(node, a, ins):
    for ax in a["axes"]:
        _axis(ax, len(ins[0].shape), node)
    return _same(node, a, ins)


@op("lp_normalization", ["x"], attrs={"axis": -1, "p": 2}, groups={"norm"})
def _lp_norm(node, a, ins):
    _axis(a["axis"], len(ins[0].shape), node)
    if a["p"] not in (1, 2):
        _fail(node, f"p must be 1 or 2, got {a['p']}")
    return _same(node, a, ins)


# ---------------------------------------------------------------- pooling and unpooling

@op("lp_pool", ["x"], attrs={"kernel_shape": REQUIRED, "strides": None, "pads": None,
                             "dilations": None, "ceil_mode": 0, "auto_pad": "NOTSET", "p": 2},
    groups={"pool"})
def _lp_pool(node, a, ins):
    x = ins[0]
    return [((x.shape[0], x.shape[1], *_spatial(node, a, x.shape, a["kernel_shape"])), x.dtype)]


@op("global_lp_pool", ["x"], attrs={"p": 2}, groups={"pool"})
def _global_lp_pool(node, a, ins):
    x = ins[0]
    return [((*x.shape[:2], *[1] * (len(x.shape) - 2)), x.dtype)]


@op("max_unpool", ["x", "indices", "output_shape?"],
    attrs={"kernel_shape": REQUIRED, "strides": None, "pads": None}, groups={"pool"})
def _max_unpool(node, a, ins):
    x = ins[0]
    given = _operand(ins, 2)
    if given is not None:
        target = _const_ints(given, node, "output_shape")
        return [(tuple(target) if target else (UNKNOWN,) * len(x.shape), x.dtype)]
    k = a["kernel_shape"]
    nd = len(k)
    strides = a["strides"] or [1] * nd
    pads = a["pads"] or [0] * (2 * nd)
    # The inverse of a pool's output size: (in - 1) * stride + kernel - pads.
    spatial = [affine(x.shape[2 + i], mul=strides[i], add=k[i] - strides[i] - pads[i] - pads[i + nd])
               for i in range(nd)]
    return [((x.shape[0], x.shape[1], *spatial), x.dtype)]


@op("max_roi_pool", ["x", "rois"], attrs={"pooled_shape": REQUIRED, "spatial_scale": 1.0},
    groups={"pool"})
def _max_roi_pool(node, a, ins):
    x, rois = ins
    return [((rois.shape[0], x.shape[1], *a["pooled_shape"]), x.dtype)]


@op("roi_align", ["x", "rois", "batch_indices"],
    attrs={"mode": "avg", "output_height": 1, "output_width": 1, "sampling_ratio": 0,
           "spatial_scale": 1.0, "coordinate_transformation_mode": "half_pixel"}, groups={"pool"})
def _roi_align(node, a, ins):
    x, rois = ins[0], ins[1]
    if a["mode"] not in ("avg", "max"):
        _fail(node, f"mode must be avg or max, got {a['mode']!r}")
    return [((rois.shape[0], x.shape[1], a["output_height"], a["output_width"]), x.dtype)]


# The number of boxes kept depends on the data: (selected, 3) rows of [batch, class, box].
@op("non_max_suppression", ["boxes", "scores", "max_output_boxes_per_class?", "iou_threshold?",
                            "score_threshold?"], attrs={"center_point_box": 0})
def _nms(node, a, ins):
    return [((UNKNOWN, 3), "i64")]


# ---------------------------------------------------------------- sampling, folding, cropping

@op("grid_sample", ["x", "grid"],
    attrs={"mode": "linear", "padding_mode": "zeros", "align_corners": 0}, groups={"resample"})
def _grid_sample(node, a, ins):
    x, grid = ins
    if a["mode"] not in ("linear", "nearest", "cubic"):
        _fail(node, f"mode must be linear, nearest or cubic, got {a['mode']!r}")
    if a["padding_mode"] not in ("zeros", "border", "reflection"):
        _fail(node, f"padding_mode must be zeros, border or reflection, got {a['padding_mode']!r}")
    if len(grid.shape) != len(x.shape):
        _fail(node, f"grid rank {len(grid.shape)} must equal input rank {len(x.shape)}")
    return [((x.shape[0], x.shape[1], *grid.shape[1:-1]), x.dtype)]


@op("affine_grid", ["theta", "size"], attrs={"align_corners": 0})
def _affine_grid(node, a, ins):
    theta, size = ins
    nd = theta.shape[1] if len(theta.shape) == 3 else UNKNOWN
    if nd not in (2, 3):
        _fail(node, f"theta must be (N, 2, 3) or (N, 3, 4), got {list(theta.shape)}")
    dims = _const_ints(size, node, "size")
    spatial = dims[2:] if dims else [UNKNOWN] * nd
    return [((theta.shape[0], *spatial, nd), theta.dtype)]


@op("col2im", ["x", "image_shape", "block_shape"],
    attrs={"dilations": None, "pads": None, "strides": None})
def _col2im(node, a, ins):
    x = ins[0]
    image = _const_ints(ins[1], node, "image_shape")
    block = _const_ints(ins[2], node, "block_shape")
    c = x.shape[1] // math.prod(block) if block and isinstance(x.shape[1], int) else UNKNOWN
    nd = len(image) if image else (ins[1].shape[0] if isinstance(ins[1].shape[0], int) else 0)
    if nd > MAX_RANK:
        _fail(node, f"image_shape has {nd} dims; at most {MAX_RANK} are supported")
    return [((x.shape[0], c, *(image or [UNKNOWN] * nd)), x.dtype)]


@op("center_crop_pad", ["x", "shape"], attrs={"axes": None}, groups={"view"})
def _center_crop_pad(node, a, ins):
    x = ins[0]
    target = _const_ints(ins[1], node, "shape")
    rank = len(x.shape)
    axes = [_axis(i, rank, node) for i in (a["axes"] or range(rank))]
    if target is None:
        return [(tuple(UNKNOWN if i in axes else d for i, d in enumerate(x.shape)), x.dtype)]
    if len(target) != len(axes):
        _fail(node, f"shape has {len(target)} entries for {len(axes)} axes")
    out = list(x.shape)
    for i, t in zip(axes, target):
        out[i] = t
    return [(tuple(out), x.dtype)]


# ---------------------------------------------------------------- signal processing

@op("dft", ["x", "dft_length?", "axis?"], attrs={"inverse": 0, "onesided": 0})
def _dft(node, a, ins):
    """x is (..., 1) real or (..., 2) complex; the result is complex, except an inverse
    one-sided transform, which gives back the real signal."""
    x = ins[0]
    rank = len(x.shape)
    axis = -2 if _operand(ins, 2) is None else _const_scalar(ins[2])  # -2: the last signal axis
    n = _const_scalar(_operand(ins, 1)) if _operand(ins, 1) is not None else None
    last = 1 if a["inverse"] and a["onesided"] else 2
    out = list(x.shape[:-1])
    if axis is None:  # computed axis: any signal dim may change
        changes = n is not None or a["onesided"] or _operand(ins, 1) is not None
        return [(tuple([UNKNOWN] * len(out) if changes else out) + (last,), x.dtype)]
    ax = axis % rank
    if ax >= rank - 1:
        _fail(node, f"axis {axis} is the complex dimension of a rank-{rank} input")
    if _operand(ins, 1) is not None and n is None:
        out[ax] = UNKNOWN
    elif a["inverse"] and a["onesided"]:
        out[ax] = n if n is not None else affine(out[ax], mul=2, add=-2)
    else:
        size = n if n is not None else out[ax]
        out[ax] = affine(size, div=2, add=2) if a["onesided"] else size
    return [(tuple(out) + (last,), x.dtype)]


@op("stft", ["signal", "frame_step", "window?", "frame_length?"], attrs={"onesided": 1})
def _stft(node, a, ins):
    x = ins[0]
    step = _const_scalar(ins[1])
    window = _operand(ins, 2)
    length = _const_scalar(_operand(ins, 3))
    if length is None and window is not None and isinstance(window.shape[0], int):
        length = window.shape[0]
    frames = UNKNOWN
    if step and length and isinstance(x.shape[1], int):
        frames = (x.shape[1] - length) // step + 1
    bins = UNKNOWN if length is None else (length // 2 + 1 if a["onesided"] else length)
    return [((x.shape[0], frames, bins, 2), x.dtype)]


for _n in ("hann_window", "hamming_window", "blackman_window"):
    @op(_n, ["size"], attrs={"periodic": 1, "dtype": "f32"})
    def _window(node, a, ins):
        n = _const_scalar(ins[0])
        return [((UNKNOWN if n is None else int(n),), a["dtype"])]


@op("mel_weight_matrix", ["num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
                          "upper_edge_hertz"], attrs={"dtype": "f32"})
def _mel(node, a, ins):
    bins, length = _const_scalar(ins[0]), _const_scalar(ins[1])
    rows = UNKNOWN if length is None else int(length) // 2 + 1
    return [((rows, UNKNOWN if bins is None else int(bins)), a["dtype"])]


# ---------------------------------------------------------------- images

@op("image_decoder", ["encoded"], attrs={"pixel_format": "RGB"})
def _image_decoder(node, a, ins):
    if a["pixel_format"] not in ("RGB", "BGR", "Grayscale"):
        _fail(node, f"pixel_format must be RGB, BGR or Grayscale, got {a['pixel_format']!r}")
    return [((UNKNOWN, UNKNOWN, 1 if a["pixel_format"] == "Grayscale" else 3), "u8")]
