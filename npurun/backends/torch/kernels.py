"""PyTorch lowerings of NPU-IR ops: one small function per op, the reference kernel's
signature with torch tensors in place of arrays.

A kernel takes the node's operands positionally and its attributes as keywords, like the
reference kernels. Operands listed in `HOST_OPERANDS` (shapes, axes, pads, sizes) arrive as
NumPy arrays on the host instead, so no kernel ever reads device memory back to decide a
shape (which would stall the device and make a CUDA graph capture impossible). Kernels in
`NEEDS_DEVICE` also get `_device=`, the device they create their results on.

Kernels never write into their operands (an operand may be the caller's own input buffer).
Results may be views; the program casts each result to its declared dtype.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...ir.dtypes import to_numpy
from ...ir.ops.vision import conv_transpose_pads
from ..reference.kernels.nn import _window_pads
from ..reference.kernels.shape import _filter_taps, _source_coords, resize_plan

KERNELS: dict = {}

# op -> operand positions read on the host as NumPy arrays.
HOST_OPERANDS = {
    "reshape": (1,), "expand": (1,), "unsqueeze": (1,), "squeeze": (1,), "tile": (1,),
    "slice": (1, 2, 3, 4), "pad": (1, 2, 3), "split": (1,), "constant_of_shape": (0,),
    "range": (0, 1, 2), "resize": (1, 2, 3), "cum_sum": (1,), "trilu": (1,), "clip": (1, 2),
    **{r: (1,) for r in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod",
                         "reduce_l1", "reduce_l2", "reduce_sum_square", "reduce_log_sum",
                         "reduce_log_sum_exp")},
}
NEEDS_DEVICE = {"constant_of_shape", "range"}

TORCH_DTYPES = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
    "i8": torch.int8, "u8": torch.uint8, "i16": torch.int16, "i32": torch.int32,
    "i64": torch.int64, "bool": torch.bool,
}


def kernel(*names):
    def register(fn):
        for n in names:
            KERNELS[n] = fn
        return fn
    return register


def _ints(a) -> list[int]:
    return [int(v) for v in np.ravel(a)]


def _is_float(x) -> bool:
    return x.dtype.is_floating_point


# ---------------------------------------------------------------- elementwise

_UNARY = {
    "abs": torch.abs, "acos": torch.acos, "acosh": torch.acosh, "asin": torch.asin,
    "asinh": torch.asinh, "atan": torch.atan, "atanh": torch.atanh, "ceil": torch.ceil,
    "cos": torch.cos, "cosh": torch.cosh, "erf": torch.erf, "exp": torch.exp, "floor": torch.floor,
    "log": torch.log, "neg": torch.neg, "reciprocal": torch.reciprocal, "round": torch.round,
    "sigmoid": torch.sigmoid, "sign": torch.sign, "sin": torch.sin, "sinh": torch.sinh,
    "sqrt": torch.sqrt, "tan": torch.tan, "tanh": torch.tanh, "relu": torch.relu,
    "not": torch.logical_not, "bitwise_not": torch.bitwise_not, "is_nan": torch.isnan,
    "identity": lambda x: x, "softsign": lambda x: x / (1 + x.abs()),
    "softplus": lambda x: torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20)))),
    "mish": lambda x: x * torch.tanh(F.softplus(x)),
    "hard_swish": lambda x: x * torch.clamp(x / 6 + 0.5, 0, 1),
}
for _n, _f in _UNARY.items():
    KERNELS[_n] = _f


@kernel("elu")
def elu(x, *, alpha):
    return torch.where(x > 0, x, alpha * torch.expm1(x))


@kernel("celu")
def celu(x, *, alpha):
    return torch.clamp(x, min=0) + torch.clamp(alpha * torch.expm1(x / alpha), max=0)


@kernel("selu")
def selu(x, *, alpha, gamma):
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


@kernel("leaky_relu")
def leaky_relu(x, *, alpha):
    return torch.where(x >= 0, x, alpha * x)


@kernel("hard_sigmoid")
def hard_sigmoid(x, *, alpha, beta):
    return torch.clamp(alpha * x + beta, 0, 1)


@kernel("gelu")
def gelu(x, *, approximate):
    return F.gelu(x, approximate="tanh" if approximate == "tanh" else "none")


@kernel("swish")
def swish(x, *, alpha):
    return x * torch.sigmoid(alpha * x)


@kernel("thresholded_relu")
def thresholded_relu(x, *, alpha):
    return torch.where(x > alpha, x, torch.zeros_like(x))


@kernel("shrink")
def shrink(x, *, bias, lambd):
    zero = torch.zeros_like(x)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero))


@kernel("is_inf")
def is_inf(x, *, detect_negative, detect_positive):
    return (torch.isposinf(x) & bool(detect_positive)) | (torch.isneginf(x) & bool(detect_negative))


def _div(a, b):
    if _is_float(a):
        return a / b
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _div,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow,
    "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "equal": torch.eq, "greater": torch.gt, "less": torch.lt, "greater_or_equal": torch.ge,
    "less_or_equal": torch.le, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "prelu": lambda x, s: torch.where(x < 0, s * x, x),
}
for _n, _f in _BINARY.items():
    KERNELS[_n] = _f


@kernel("mod")
def mod(a, b, *, fmod):
    return torch.fmod(a, b) if fmod else torch.remainder(a, b)


@kernel("bit_shift")
def bit_shift(x, s, *, direction):
    return torch.bitwise_left_shift(x, s) if direction == "LEFT" else torch.bitwise_right_shift(x, s)


@kernel("where")
def where(c, x, y):
    return torch.where(c, x, y)


@kernel("clip")
def clip(x, lo=None, hi=None):
    # lo/hi are host arrays: a bound is a number, not a tensor to read back.
    lo = None if lo is None or lo.size == 0 else lo.item()
    hi = None if hi is None or hi.size == 0 else hi.item()
    if lo is None and hi is None:
        return x
    return torch.clamp(x, min=lo, max=hi)


@kernel("cast")
def cast(x, *, to, saturate=1, round_mode="up"):
    return x.to(TORCH_DTYPES[to])


# ---------------------------------------------------------------- windows

def _conv_fn(nd, transpose=False):
    table = {1: (F.conv1d, F.conv_transpose1d), 2: (F.conv2d, F.conv_transpose2d),
             3: (F.conv3d, F.conv_transpose3d)}
    return table[nd][transpose]


@kernel("conv")
def conv(x, w, b=None, *, strides, pads, dilations, group, kernel_shape, auto_pad, activation="",
         activation_params=()):
    # x is (N, C, *S); w is (M, C/group, *K). Asymmetric padding pads x first.
    ks = list(kernel_shape or w.shape[2:])
    begin, end, _, strides, dilations = _window_pads(tuple(x.shape), ks, strides, dilations, pads, auto_pad)
    if begin != end:
        x = F.pad(x, [p for i in reversed(range(len(ks))) for p in (begin[i], end[i])])
        begin = [0] * len(ks)
    y = _conv_fn(len(ks))(x, w, b, stride=strides, padding=begin, dilation=dilations, groups=group)
    return activate(y, activation, activation_params)


def activate(y, activation: str, params):
    """A conv's fused activation (ir/ops/elementwise.FUSABLE_ACTIVATIONS) by its own kernel."""
    if not activation:
        return y
    from ...ir.ops.elementwise import FUSABLE_ACTIVATIONS
    if activation == "clip":
        return torch.clamp(y, params[0], params[1])
    return KERNELS[activation](y, **dict(zip(FUSABLE_ACTIVATIONS[activation], params)))


@kernel("conv_transpose")
def conv_transpose(x, w, b=None, *, strides, pads, dilations, group, kernel_shape, auto_pad,
                   output_padding, output_shape):
    # The un-cropped output, then the window [begin, begin + out) of it per axis (zeros where
    # that window reaches past it: output_padding, negative pads).
    ks = list(kernel_shape or w.shape[2:])
    nd = len(ks)
    a = {"strides": strides, "pads": pads, "dilations": dilations, "auto_pad": auto_pad,
         "output_padding": output_padding, "output_shape": output_shape}
    begin, _, out = conv_transpose_pads(a, list(x.shape[2:]), ks)
    y = _conv_fn(nd, True)(x, w, None, stride=strides or 1, padding=0, dilation=dilations or 1, groups=group)
    full = y.shape[2:]
    widths = []
    for i in reversed(range(nd)):
        widths += [max(0, -begin[i]), max(0, begin[i] + out[i] - full[i])]
    if any(widths):
        y = F.pad(y, widths)
    idx = tuple(slice(max(0, begin[i]), max(0, begin[i]) + out[i]) for i in range(nd))
    y = y[(slice(None), slice(None)) + idx]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y


def _pool_pads(x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad):
    begin, end, out, strides, dilations = _window_pads(
        tuple(x.shape), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return [p for i in reversed(range(len(kernel_shape))) for p in (begin[i], end[i])], strides, dilations


@kernel("max_pool")
def max_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad):
    widths, strides, dilations = _pool_pads(x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad)
    xp = F.pad(x, widths, value=-math.inf) if any(widths) else x
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[len(kernel_shape)]
    return fn(xp, kernel_shape, strides, 0, dilations)


@kernel("average_pool")
def average_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, count_include_pad):
    # Window sums over zero padding, divided by the count of elements each window covers:
    # real ones, plus explicit padding if count_include_pad (never ceil_mode's extra end).
    nd = len(kernel_shape)
    begin, end, out, strides, _ = _window_pads(tuple(x.shape), kernel_shape, strides, dilations,
                                               pads, auto_pad, ceil_mode)
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
    widths = [p for i in reversed(range(nd)) for p in (begin[i], end[i])]
    k = math.prod(kernel_shape)
    total = fn(F.pad(x, widths), kernel_shape, strides, 0) * k
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
    if count_include_pad:
        explicit = list((pads or [0] * (2 * nd))[nd:]) if auto_pad == "NOTSET" else [0] * nd
        ones = F.pad(ones, [p for i in reversed(range(nd)) for p in (begin[i], explicit[i])], value=1.0)
        ones = F.pad(ones, [p for i in reversed(range(nd)) for p in (0, end[i] - explicit[i])])
    else:
        ones = F.pad(ones, widths)
    count = fn(ones, kernel_shape, strides, 0) * k
    return total / count


@kernel("global_average_pool")
def global_average_pool(x):
    return x.mean(dim=tuple(range(2, x.ndim)), keepdim=True)


@kernel("global_max_pool")
def global_max_pool(x):
    return x.amax(dim=tuple(range(2, x.ndim)), keepdim=True)


# ---------------------------------------------------------------- linear algebra, normalization

def _int_matmul(a, b):
    """Integer matmul: CUDA has no integer GEMM for these types; exact in float64 there."""
    if a.is_cuda:
        return torch.matmul(a.double(), b.double()).round().to(torch.int64)
    return torch.matmul(a.to(torch.int64), b.to(torch.int64))


@kernel("matmul")
def matmul(a, b):
    if not _is_float(a):
        return _int_matmul(a, b)
    return torch.matmul(a, b)


@kernel("gemm")
def gemm(a, b, c=None, *, alpha, beta, trans_a, trans_b):
    a = a.t() if trans_a else a
    b = b.t() if trans_b else b
    y = alpha * (torch.matmul(a, b) if _is_float(a) else _int_matmul(a, b))
    return y if c is None else y + beta * c


@kernel("batch_normalization")
def batch_normalization(x, scale, bias, mean, var, *, epsilon):
    t = x.dtype
    return F.batch_norm(x, mean.to(t), var.to(t), scale.to(t), bias.to(t), False, 0.0, epsilon)


@kernel("instance_normalization")
def instance_normalization(x, scale, bias, *, epsilon):
    return F.instance_norm(x, weight=scale, bias=bias, eps=epsilon)


@kernel("layer_normalization")
def layer_normalization(x, scale, bias=None, *, axis, epsilon, stash_type):
    # Statistics in stash_type, back to x's type before scale and bias (ONNX's order).
    xs = x.to(TORCH_DTYPES[stash_type])
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = xs.mean(dim=axes, keepdim=True)
    inv_std = torch.rsqrt(((xs - mean) ** 2).mean(dim=axes, keepdim=True) + epsilon)
    y = ((xs - mean) * inv_std).to(x.dtype) * scale
    return (y if bias is None else y + bias), mean, inv_std


def layer_normalization_fast(x, scale, bias=None, *, axis, epsilon, stash_type):
    """One fused kernel, where the node's statistics outputs are not used."""
    shape = tuple(x.shape[axis % x.ndim:])
    if x.dtype != TORCH_DTYPES[stash_type]:
        return layer_normalization(x, scale, bias, axis=axis, epsilon=epsilon, stash_type=stash_type)[0]
    return F.layer_norm(x, shape, scale.expand(shape), None if bias is None else bias.expand(shape), epsilon)


@kernel("mean_variance_normalization")
def mean_variance_normalization(x, *, axes):
    mean = x.mean(dim=tuple(axes), keepdim=True)
    var = ((x - mean) ** 2).mean(dim=tuple(axes), keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-9)


@kernel("softmax")
def softmax(x, *, axis):
    return torch.softmax(x, axis)


@kernel("log_softmax")
def log_softmax(x, *, axis):
    return torch.log_softmax(x, axis)


def _reducer(fn, identity=None):
    def reduce(x, axes=None, *, keepdims, noop_with_empty_axes):
        if axes is None or axes.size == 0:
            if noop_with_empty_axes:
                return x
            dims = tuple(range(x.ndim))
        else:
            dims = tuple(sorted(a % x.ndim for a in _ints(axes)))
        if x.numel() == 0 and identity is not None:  # an empty set reduces to the identity
            shape = [1 if d in dims else s for d, s in enumerate(x.shape)] if keepdims else \
                [s for d, s in enumerate(x.shape) if d not in dims]
            return torch.full(shape, identity(x.dtype), dtype=x.dtype, device=x.device)
        if not dims:
            return x
        return fn(x, dims, bool(keepdims))
    return reduce


def _lowest(dt):
    return -math.inf if dt.is_floating_point else (False if dt == torch.bool else torch.iinfo(dt).min)


def _highest(dt):
    return math.inf if dt.is_floating_point else (True if dt == torch.bool else torch.iinfo(dt).max)


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keep)
    return x


KERNELS["reduce_sum"] = _reducer(lambda x, d, k: torch.sum(x, dim=d, keepdim=k))
KERNELS["reduce_mean"] = _reducer(lambda x, d, k: torch.mean(x, dim=d, keepdim=k))
KERNELS["reduce_max"] = _reducer(lambda x, d, k: torch.amax(x, dim=d, keepdim=k), _lowest)
KERNELS["reduce_min"] = _reducer(lambda x, d, k: torch.amin(x, dim=d, keepdim=k), _highest)
KERNELS["reduce_prod"] = _reducer(_prod)
KERNELS["reduce_l1"] = _reducer(lambda x, d, k: torch.sum(x.abs(), dim=d, keepdim=k))
KERNELS["reduce_l2"] = _reducer(lambda x, d, k: torch.sqrt(torch.sum(x * x, dim=d, keepdim=k)))
KERNELS["reduce_sum_square"] = _reducer(lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k))
KERNELS["reduce_log_sum"] = _reducer(lambda x, d, k: torch.log(torch.sum(x, dim=d, keepdim=k)))
KERNELS["reduce_log_sum_exp"] = _reducer(lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k))


def _arg(fn):
    def arg(x, *, axis, keepdims, select_last_index):
        if select_last_index:  # the last of equal extremes: search the reversed axis
            n = x.shape[axis]
            return n - 1 - fn(torch.flip(x, (axis,)), dim=axis, keepdim=bool(keepdims))
        return fn(x, dim=axis, keepdim=bool(keepdims))
    return arg


KERNELS["arg_max"] = _arg(torch.argmax)
KERNELS["arg_min"] = _arg(torch.argmin)


@kernel("einsum")
def einsum(*xs, equation):
    return torch.einsum(equation, *xs)


@kernel("cum_sum")
def cum_sum(x, axis, *, exclusive, reverse):
    ax = int(np.ravel(axis)[0]) % x.ndim
    if reverse:
        x = torch.flip(x, (ax,))
    y = torch.cumsum(x, dim=ax)
    if exclusive:
        y = y - x
    return torch.flip(y, (ax,)) if reverse else y


@kernel("trilu")
def trilu(x, k=None, *, upper):
    d = 0 if k is None else int(np.ravel(k)[0])
    return torch.triu(x, d) if upper else torch.tril(x, d)


# ---------------------------------------------------------------- data movement

@kernel("reshape")
def reshape(x, shape, *, allowzero):
    target = _ints(shape)
    if not allowzero:
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    return x.reshape(target)


@kernel("transpose")
def transpose(x, *, perm):
    return x.permute(list(perm) if perm is not None else list(reversed(range(x.ndim))))


@kernel("flatten")
def flatten(x, *, axis):
    ax = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))


@kernel("squeeze")
def squeeze(x, axes=None):
    if axes is None:
        return x.squeeze()
    return x.squeeze(tuple(a % x.ndim for a in _ints(axes))) if x.ndim else x


@kernel("unsqueeze")
def unsqueeze(x, axes):
    axes = _ints(axes)
    for a in sorted(a % (x.ndim + len(axes)) for a in axes):
        x = x.unsqueeze(a)
    return x


@kernel("concat")
def concat(*xs, axis):
    return torch.cat(xs, dim=axis)


@kernel("split")
def split(x, sizes=None, *, axis, num_outputs):
    if sizes is None:
        n = num_outputs or 1
        step = -(-x.shape[axis] // n)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(n)]
    return tuple(torch.split(x, _ints(sizes), dim=axis))


@kernel("slice")
def slice_(x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = range(len(starts)) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax %= x.ndim
        lo, hi, step = slice(st, en, sp).indices(x.shape[ax])  # clamps like ONNX
        if step > 0:
            x = x[(slice(None),) * ax + (slice(lo, hi, step),)]
        else:  # torch slices take positive steps only
            x = x.index_select(ax, torch.arange(lo, hi, step, device=x.device))
    return x


@kernel("gather")
def gather(x, indices, *, axis):
    ax = axis % x.ndim
    idx = torch.where(indices < 0, indices + x.shape[ax], indices)
    y = x.index_select(ax, idx.reshape(-1))
    return y.reshape(tuple(x.shape[:ax]) + tuple(indices.shape) + tuple(x.shape[ax + 1:]))


@kernel("gather_elements")
def gather_elements(x, idx, *, axis):
    ax = axis % x.ndim
    idx = torch.where(idx < 0, idx + x.shape[ax], idx)
    return torch.gather(x, ax, idx.to(torch.int64))


@kernel("gather_nd")
def gather_nd(x, idx, *, batch_dims):
    # x is (*B, *rest), idx is (*B, ..., k): flatten the batch dims into one, then index.
    b, k = batch_dims, idx.shape[-1]
    nb = math.prod(x.shape[:b])
    xr = x.reshape((nb,) + tuple(x.shape[b:]))
    ir = idx.reshape(nb, -1, k).to(torch.int64)
    bi = torch.arange(nb, device=x.device).reshape(nb, 1)
    y = xr[(bi,) + tuple(ir[..., j] for j in range(k))]
    return y.reshape(tuple(idx.shape[:-1]) + tuple(x.shape[b + k:]))


@kernel("shape")
def shape(x, *, start, end):
    return torch.tensor(list(x.shape)[start:end], dtype=torch.int64)  # on the host, by design


@kernel("size")
def size(x):
    return torch.tensor(x.numel(), dtype=torch.int64)


@kernel("expand")
def expand(x, shape):
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(_ints(shape))))


@kernel("tile")
def tile(x, repeats):
    return x.repeat(_ints(repeats))


def _edge_index(n, lo, hi, mode, device):
    """Source indices along an axis of length n padded by lo before and hi after."""
    i = torch.arange(-lo, n + hi, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return torch.remainder(i, n)
    period = 2 * (n - 1)  # reflect: mirror around the first and last element
    m = torch.remainder(i, period) if period else torch.zeros_like(i)
    return torch.where(m > n - 1, period - m, m)


@kernel("pad")
def pad(x, pads, value=None, axes=None, *, mode):
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in _ints(axes)]
    pads = _ints(pads)
    widths = [(0, 0)] * x.ndim
    for j, ax in enumerate(axes):
        widths[ax] = (pads[j], pads[j + len(axes)])
    if mode == "constant":
        v = 0 if value is None or value.size == 0 else value.item()
        return F.pad(x, [p for b, e in reversed(widths) for p in (b, e)], value=v)
    x = x[tuple(slice(-b if b < 0 else None, e if e < 0 else None) for b, e in widths)]  # crop
    for ax, (b, e) in enumerate(widths):
        if b > 0 or e > 0:
            x = x.index_select(ax, _edge_index(x.shape[ax], max(b, 0), max(e, 0), mode, x.device))
    return x


@kernel("depth_to_space")
def depth_to_space(x, *, blocksize, mode):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:  # CRD: PyTorch's pixel_shuffle
        return F.pixel_shuffle(x, b)
    return y.reshape(n, c // (b * b), h * b, w * b)


@kernel("space_to_depth")
def space_to_depth(x, *, blocksize, mode):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@kernel("constant_of_shape")
def constant_of_shape(shape, *, value, dtype, _device):
    return torch.full(_ints(shape), value, dtype=TORCH_DTYPES[dtype], device=_device)


@kernel("range")
def range_(start, limit, delta, *, _device):
    # ONNX: max(ceil((limit - start) / delta), 0) elements start + i * delta, in start's type.
    dt = start.dtype
    s, lim, d = start.item(), limit.item(), delta.item()
    n = max(int(math.ceil((lim - s) / d)), 0)
    t = TORCH_DTYPES[_ir_dtype(dt)]
    if dt.kind == "f":
        return (torch.arange(n, dtype=torch.float64, device=_device) * d + s).to(t)
    return torch.arange(s, s + n * d, d, dtype=t, device=_device)[:n]


def _ir_dtype(np_dtype) -> str:
    return next(k for k in TORCH_DTYPES if to_numpy(k) == np_dtype)


# ---------------------------------------------------------------- resize

# (device, axis length in, out, scale, roi, attributes) -> (indices, weights) on the device.
# Taps depend on shapes only; cached so a run (and a CUDA graph capture) makes none.
_TAPS: dict = {}


def _taps(device, n_in, n_out, scale, roi, a):
    key = (str(device), n_in, n_out, scale, tuple(roi), tuple(sorted((k, str(v)) for k, v in a.items())))
    hit = _TAPS.get(key)
    if hit is None:
        src = _source_coords(n_out, n_in, scale, a["coordinate_transformation_mode"], roi)
        if a["mode"] == "nearest":
            rnd = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
                   "floor": np.floor, "ceil": np.ceil}[a["nearest_mode"]]
            idx, w = np.clip(rnd(src), 0, n_in - 1).astype(np.int64), None
        else:
            idx, w = _filter_taps(src, n_in, scale, a)
        outside = None
        if a["coordinate_transformation_mode"] == "tf_crop_and_resize":
            outside = torch.from_numpy((src < 0) | (src > n_in - 1)).to(device)
        hit = (torch.from_numpy(idx).to(device), None if w is None else torch.from_numpy(w).to(device), outside)
        if len(_TAPS) > 4096:
            _TAPS.clear()
        _TAPS[key] = hit
    return hit


@kernel("resize")
def resize(x, roi=None, scales=None, sizes=None, **a):
    given = sizes if sizes is not None and sizes.size else None
    plan = resize_plan(tuple(x.shape), None if given is not None else scales, given, a["axes"],
                       a["keep_aspect_ratio_policy"])
    bounds = roi.astype(np.float64).reshape(2, -1).T if roi is not None and roi.size else None
    for k, (axis, n_out, s) in enumerate(plan):
        if n_out == x.shape[axis] and s == 1.0 and a["coordinate_transformation_mode"] != "tf_crop_and_resize":
            continue
        r = tuple(bounds[k]) if bounds is not None else (0.0, 1.0)
        idx, w, outside = _taps(x.device, x.shape[axis], n_out, s, r, a)
        if w is None:
            y = x.index_select(axis, idx)
        else:  # (…, n_in) gathered to (…, n_out, taps), weighted and summed
            xt = x.movedim(axis, -1)
            y = (xt[..., idx] * w.to(x.dtype)).sum(-1).movedim(-1, axis)
        if outside is not None:
            shape = [1] * x.ndim
            shape[axis] = n_out
            y = torch.where(outside.reshape(shape), torch.full_like(y, a["extrapolation_value"]), y)
        x = y
    return x


# ---------------------------------------------------------------- quantization

@kernel("dequantize_linear")
def dequantize_linear(x, scale, zp=None, *, axis, block_size, output_dtype):
    shape = [1] * x.ndim
    if scale.ndim == 1 and x.ndim:
        shape[axis % x.ndim] = -1
    s = scale.reshape(shape) if scale.numel() > 1 else scale.reshape(())
    xf = x.to(torch.float32)
    if zp is not None:
        xf = xf - zp.reshape(s.shape).to(torch.float32)
    y = xf * s.to(torch.float32)
    return y.to(TORCH_DTYPES[output_dtype] if output_dtype else scale.dtype)


_QRANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int16: (-32768, 32767),
           torch.int32: (-2 ** 31, 2 ** 31 - 1)}


@kernel("quantize_linear")
def quantize_linear(x, scale, zp=None, *, axis, block_size, output_dtype, saturate, precision):
    shape = [1] * x.ndim
    if scale.ndim == 1 and x.ndim:
        shape[axis % x.ndim] = -1
    s = scale.reshape(shape) if scale.numel() > 1 else scale.reshape(())
    out = zp.dtype if zp is not None else (TORCH_DTYPES[output_dtype] if output_dtype else torch.uint8)
    q = torch.round(x.to(torch.float32) / s.to(torch.float32))
    if zp is not None:
        q = q + zp.reshape(s.shape).to(torch.float32)
    lo, hi = _QRANGE[out]
    return torch.clamp(q, lo, hi).to(out)


@kernel("dynamic_quantize_linear")
def dynamic_quantize_linear(x):
    lo = torch.clamp(x.min(), max=0)
    hi = torch.clamp(x.max(), min=0)
    scale = (hi - lo) / 255
    zp = torch.clamp(torch.round(-lo / scale), 0, 255)
    y = torch.clamp(torch.round(x / scale) + zp, 0, 255)
    return y.to(torch.uint8), scale.to(torch.float32), zp.to(torch.uint8)


@kernel("matmul_integer")
def matmul_integer(a, b, azp=None, bzp=None):
    a = a.to(torch.int32)
    b = b.to(torch.int32)
    if azp is not None:
        a = a - (azp.to(torch.int32).reshape(-1, 1) if azp.ndim == 1 and azp.numel() > 1 else azp.to(torch.int32))
    if bzp is not None:
        b = b - bzp.to(torch.int32)
    return _int_matmul(a, b).to(torch.int32)


# ---------------------------------------------------------------- reduced-precision MAC kernels

def _pad_to(t, dim, multiple, minimum=0):
    n = t.shape[dim]
    want = max(minimum, -(-n // multiple) * multiple)
    if want == n:
        return t
    widths = [0, 0] * (t.ndim - 1 - dim) + [0, want - n]
    return F.pad(t, widths)


def int8_mm(qa, qb):
    """(M, K) int8 @ (K, N) int8 -> (M, N) int32 through torch._int_mm, zero-padding to the
    shapes its CUDA kernel takes (M > 16, K and N multiples of 8; exact: zeros add nothing)."""
    m, n = qa.shape[0], qb.shape[1]
    qa = _pad_to(_pad_to(qa, 0, 1, 17), 1, 8)
    qb = _pad_to(_pad_to(qb, 0, 8), 1, 8)
    return torch._int_mm(qa.contiguous(), qb)[:m, :n]


def quantize_sym(x, dim=None):
    """Symmetric int8: x ~= q * s, s = max|x| / 127 (per tensor, or per slice along `dim`)."""
    if dim is None:
        amax = x.abs().amax()
    else:
        amax = x.abs().amax(dim=[d for d in range(x.ndim) if d != dim], keepdim=True)
    s = torch.clamp(amax.to(torch.float32), min=1e-12) / 127.0
    return torch.clamp(torch.round(x.to(torch.float32) / s), -127, 127).to(torch.int8), s


def matmul_i8(qw, sw):
    """matmul with the (K, N) weight pre-quantized per output column: activations per tensor."""
    def run(a, b=None):
        qa, sa = quantize_sym(a)
        lead = a.shape[:-1]
        y = int8_mm(qa.reshape(-1, a.shape[-1]), qw).to(torch.float32) * (sa * sw.reshape(1, -1))
        return y.reshape(tuple(lead) + (qw.shape[1],)).to(a.dtype)
    return run


def conv_i8(qw_t, sw, group):
    """2-D conv as im2col + int8 GEMM: x (N, C, H, W) per tensor, w (M, C, kh, kw) per output
    channel, pre-quantized as qw_t (C*kh*kw, M)."""
    def run(x, w=None, b=None, *, strides, pads, dilations, group, kernel_shape, auto_pad, activation="",
            activation_params=()):
        ks = list(kernel_shape or w.shape[2:])
        begin, end, out, strides, dilations = _window_pads(tuple(x.shape), ks, strides, dilations, pads, auto_pad)
        qx, sx = quantize_sym(x)
        # int8 values are exact in f16; unfold works on floats on every device.
        xf = F.pad(qx.to(torch.float16 if x.is_cuda else torch.float32),
                   [begin[1], end[1], begin[0], end[0]])
        cols = F.unfold(xf, ks, dilation=dilations, stride=strides)  # (N, C*kh*kw, L)
        n, kk, L = cols.shape
        a = cols.transpose(1, 2).reshape(n * L, kk).to(torch.int8)
        y = int8_mm(a, qw_t).to(torch.float32) * (sx * sw.reshape(1, -1))  # (N*L, M)
        y = y.reshape(n, L, -1).transpose(1, 2).reshape(n, -1, *out)
        if b is not None:
            y = y + b.to(torch.float32).reshape(1, -1, 1, 1)
        return activate(y.to(x.dtype), activation, activation_params)
    return run
