"""Neural-network ops: convolution, matrix products, normalization, softmax, pooling, reductions."""
from __future__ import annotations

import math

from ..graph import Value
from ..shapes import UNKNOWN, affine, broadcast, numel
from . import REQUIRED, _axis, _fail, _same, op
from .elementwise import check_activation


def _conv_out(size, k, stride, dil, pad_total):
    return affine(size, add=pad_total - dil * (k - 1) - 1 + stride, div=stride) if stride != 1 \
        else affine(size, add=pad_total - dil * (k - 1))


def _spatial(node, a, x_shape, kernel):
    """Output spatial dims of a conv/pool window over `x_shape[2:]`."""
    nd = len(kernel)
    strides = a.get("strides") or [1] * nd
    dils = a.get("dilations") or [1] * nd
    pads = a.get("pads") or [0] * (2 * nd)
    # Checked here, so that no rule below indexes past a list or divides by a zero stride.
    if nd != len(x_shape) - 2:
        _fail(node, f"kernel_shape {list(kernel)} has {nd} dims, the input has {len(x_shape) - 2} spatial dims")
    for what, vals, n in (("strides", strides, nd), ("dilations", dils, nd), ("pads", pads, 2 * nd)):
        if len(vals) != n or not all(isinstance(v, int) for v in vals):
            _fail(node, f"{what} {list(vals)} must be {n} integers")
    if min(strides, default=1) < 1 or min(dils, default=1) < 1 or any(isinstance(k, int) and k < 1 for k in kernel):
        _fail(node, f"strides {list(strides)}, dilations {list(dils)} and kernel {list(kernel)} must be >= 1")
    out = []
    for i in range(nd):
        size = x_shape[2 + i]
        auto = a.get("auto_pad", "NOTSET")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out.append(affine(size, add=strides[i] - 1, div=strides[i]) if isinstance(size, int)
                       or strides[i] == 1 else UNKNOWN)
        elif auto == "VALID":
            out.append(_conv_out(size, kernel[i], strides[i], dils[i], 0))
        elif a.get("ceil_mode") and isinstance(size, int):
            eff = dils[i] * (kernel[i] - 1) + 1
            out.append(math.ceil((size + pads[i] + pads[i + nd] - eff) / strides[i]) + 1)
        else:
            out.append(_conv_out(size, kernel[i], strides[i], dils[i], pads[i] + pads[i + nd]))
    return out


def _conv_macs(a, ins, outs):
    w = ins[1]
    return numel(outs[0]) * math.prod(w[1:])


_CONV_ATTRS = {"strides": None, "pads": None, "dilations": None, "group": 1,
               "kernel_shape": None, "auto_pad": "NOTSET"}
# conv only: an activation applied to the result in the conv's own epilogue (set by
# passes/fuse_activation.py; names and params: elementwise.FUSABLE_ACTIVATIONS).
_FUSED_ATTRS = {"activation": "", "activation_params": []}


@op("conv", ["x", "w", "b?"], attrs={**_CONV_ATTRS, **_FUSED_ATTRS}, groups={"conv", "mac"}, macs=_conv_macs,
    any_rank=True)
def _conv(node, a, ins):
    check_activation(node, a)
    x, w = ins[0], ins[1]
    if w.shape is None:
        _fail(node, f"weight {w.name!r} has unknown rank")
    if x.shape is None:  # x has w's rank by definition (the kernel checks it at run time)
        x = Value(x.name, (UNKNOWN,) * len(w.shape), x.dtype)
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        _fail(node, f"input rank {len(x.shape)} and weight rank {len(w.shape)} must match and be >= 3")
    cin, g = x.shape[1], a["group"]
    if isinstance(cin, int) and isinstance(w.shape[1], int) and cin != w.shape[1] * g:
        _fail(node, f"input has {cin} channels, weight expects {w.shape[1]} x group {g}")
    spatial = _spatial(node, a, x.shape, a["kernel_shape"] or list(w.shape[2:]))
    return [((x.shape[0], w.shape[0], *spatial), x.dtype)]


def _matmul_shape(node, sa, sb):
    if len(sa) == 0 or len(sb) == 0:
        _fail(node, "matmul operands must have rank >= 1")
    a2 = sa if len(sa) > 1 else (1, sa[0])
    b2 = sb if len(sb) > 1 else (sb[0], 1)
    k1, k2 = a2[-1], b2[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        _fail(node, f"inner dimensions differ: {list(sa)} @ {list(sb)}")
    batch = broadcast(tuple(a2[:-2]), tuple(b2[:-2]))
    if batch is None:
        _fail(node, f"batch dimensions do not broadcast: {list(sa)} @ {list(sb)}")
    out = list(batch) + [a2[-2], b2[-1]]
    if len(sa) == 1:
        out.pop(-2)
    if len(sb) == 1:
        out.pop(-1)
    return tuple(out)


def _matmul_macs(a, ins, outs):
    return numel(outs[0]) * (ins[0][-1])


@op("matmul", ["a", "b"], groups={"matmul", "mac"}, macs=_matmul_macs, any_rank=True)
def _matmul(node, a, ins):
    if ins[0].shape is None or ins[1].shape is None:
        return [(None, ins[0].dtype)]
    return [(_matmul_shape(node, ins[0].shape, ins[1].shape), ins[0].dtype)]


@op("gemm", ["a", "b", "c?"], attrs={"alpha": 1.0, "beta": 1.0, "trans_a": 0, "trans_b": 0},
    groups={"matmul", "mac"},
    macs=lambda a, ins, outs: numel(outs[0]) * ins[0][0 if a["trans_a"] else 1])
def _gemm(node, a, ins):
    sa, sb = ins[0].shape, ins[1].shape
    if len(sa) != 2 or len(sb) != 2:
        _fail(node, f"gemm operands must be 2-D, got {list(sa)} and {list(sb)}")
    m = sa[1] if a["trans_a"] else sa[0]
    n = sb[0] if a["trans_b"] else sb[1]
    return [((m, n), ins[0].dtype)]


@op("batch_normalization", ["x", "scale", "bias", "mean", "var"], attrs={"epsilon": 1e-5},
    groups={"norm"})
def _bn(node, a, ins):
    return _same(node, a, ins)


@op("batch_normalization_training", ["x", "scale", "bias", "input_mean", "input_var"],
    ["y", "running_mean?", "running_var?"], attrs={"epsilon": 1e-5, "momentum": 0.9}, groups={"norm"})
def _bn_training(node, a, ins):
    # Training mode: y normalizes x by the batch's own mean and (population) variance per
    # channel (axis 1); running_* = input_* * momentum + batch statistic * (1 - momentum).
    x, mean = ins[0], ins[3]
    if len(x.shape) < 2:
        _fail(node, f"x must have rank >= 2 (N, C, ...), got {list(x.shape)}")
    stats = (mean.shape, mean.dtype)
    return [(x.shape, x.dtype), stats, stats][:len(node.outputs)]


@op("layer_normalization", ["x", "scale", "bias?"], ["y", "mean?", "inv_std_dev?"],
    attrs={"axis": -1, "epsilon": 1e-5, "stash_type": "f32"}, groups={"norm"})
def _ln(node, a, ins):
    # Mean and InvStdDev keep x's leading dims and 1 for each normalized one, in stash_type.
    x = ins[0]
    axis = _axis(a["axis"], len(x.shape), node)
    stats = (tuple(x.shape[:axis]) + (1,) * (len(x.shape) - axis), a["stash_type"])
    return [(x.shape, x.dtype), stats, stats][:len(node.outputs)]


for _n in ("softmax", "log_softmax"):
    op(_n, ["x"], attrs={"axis": -1}, groups={"normalizing"})(_same)


_POOL_ATTRS = {"kernel_shape": REQUIRED, "strides": None, "pads": None, "dilations": None,
               "ceil_mode": 0, "auto_pad": "NOTSET"}


@op("max_pool", ["x"], attrs=_POOL_ATTRS, groups={"pool"})
def _maxpool(node, a, ins):
    x = ins[0]
    return [((x.shape[0], x.shape[1], *_spatial(node, a, x.shape, a["kernel_shape"])), x.dtype)]


@op("max_pool_with_indices", ["x"], ["y", "indices"], attrs={**_POOL_ATTRS, "storage_order": 0},
    groups={"pool"})
def _maxpool_indices(node, a, ins):
    # indices: where each maximum is in x, as a flat index over all of x (N, C and the spatial
    # dims; row-major, or column-major over the spatial dims with storage_order=1).
    if a["storage_order"] not in (0, 1):
        _fail(node, f"storage_order {a['storage_order']!r} must be 0 (row-major) or 1 (column-major)")
    y, dtype = _maxpool(node, a, ins)[0]
    return [(y, dtype), (y, "i64")]


@op("average_pool", ["x"], attrs={**_POOL_ATTRS, "count_include_pad": 0}, groups={"pool"})
def _avgpool(node, a, ins):
    return _maxpool(node, a, ins)


for _n in ("global_average_pool", "global_max_pool"):
    op(_n, ["x"], groups={"pool"})(
        lambda node, a, ins: [((*ins[0].shape[:2], *[1] * (len(ins[0].shape) - 2)), ins[0].dtype)])


