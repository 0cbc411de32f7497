"""Reference kernels: one small, readable NumPy function per op, following the ONNX operator
definitions. They are the oracle every other backend is checked against, so clarity and exact
semantics win over speed; memory is kept sane (no whole-image im2col).

A kernel takes the node's operands positionally (None for an absent optional one) and its
attributes (defaults merged in) as keywords; it returns one array or a tuple of arrays.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...ir.dtypes import to_numpy

KERNELS: dict = {}


def kernel(*names):
    def register(fn):
        for n in names:
            KERNELS[n] = fn
        return fn
    return register


def _like(x, y):
    return np.asarray(y).astype(x.dtype, copy=False)


# ---------------------------------------------------------------- elementwise

_UNARY = {
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "neg": np.negative,
    "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.round, "sin": np.sin,
    "cos": np.cos, "sign": np.sign, "not": np.logical_not, "reciprocal": lambda x: 1 / x,
    "sigmoid": lambda x: np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))),
                                  np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x)))),
    "softplus": lambda x: np.logaddexp(0, x),
    "softsign": lambda x: x / (1 + np.abs(x)),
    "identity": lambda x: x,
    "hard_swish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
}
for _n, _f in _UNARY.items():
    KERNELS[_n] = (lambda f: lambda x: _like(x, f(x)))(_f)

_erf = np.frompyfunc(math.erf, 1, 1)


@kernel("erf")
def erf(x):
    # math.erf is exact in double precision; NumPy has no erf of its own.
    return _erf(x.astype(np.float64)).astype(x.dtype)


@kernel("gelu")
def gelu(x, *, approximate):
    if approximate == "tanh":
        return _like(x, 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))))
    return _like(x, 0.5 * x * (1 + erf(x / np.sqrt(2).astype(x.dtype))))


@kernel("leaky_relu")
def leaky_relu(x, *, alpha):
    return _like(x, np.where(x < 0, alpha * x, x))


@kernel("elu")
def elu(x, *, alpha):
    return _like(x, np.where(x < 0, alpha * np.expm1(np.minimum(x, 0)), x))


@kernel("celu")
def celu(x, *, alpha):
    return _like(x, np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(np.minimum(x, 0) / alpha)))


@kernel("selu")
def selu(x, *, alpha, gamma):
    return _like(x, gamma * np.where(x <= 0, alpha * np.expm1(np.minimum(x, 0)), x))


@kernel("hard_sigmoid")
def hard_sigmoid(x, *, alpha, beta):
    return _like(x, np.clip(alpha * x + beta, 0, 1))


@kernel("clip")
def clip(x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo.astype(x.dtype))
    if hi is not None:
        x = np.minimum(x, hi.astype(x.dtype))
    return x


@kernel("cast")
def cast(x, *, to, saturate):
    dt = to_numpy(to)
    if x.dtype.kind == "f" and dt.kind in "iu":
        x = np.trunc(x)  # ONNX casts float -> int by truncation toward zero
    return x.astype(dt)


def _div(a, b):
    if a.dtype.kind in "iu":  # ONNX integer division truncates toward zero
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return (q + fix).astype(a.dtype)
    return a / b


_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div,
    "max": np.maximum, "min": np.minimum, "bitwise_and": np.bitwise_and,
    "pow": lambda a, b: np.power(a.astype(np.float64) if a.dtype.kind == "f" else a, b),
    "prelu": lambda x, s: np.where(x < 0, s * x, x),
    "equal": np.equal, "less": np.less, "greater": np.greater, "less_or_equal": np.less_equal,
    "greater_or_equal": np.greater_equal, "and": np.logical_and, "or": np.logical_or,
    "xor": np.logical_xor,
}
for _n, _f in _BINARY.items():
    KERNELS[_n] = (lambda f, logical: lambda a, b: f(a, b) if logical else _like(a, f(a, b)))(
        _f, _n in ("equal", "less", "greater", "less_or_equal", "greater_or_equal", "and", "or", "xor"))


@kernel("mod")
def mod(a, b, *, fmod):
    return _like(a, np.fmod(a, b) if fmod else np.mod(a, b))


@kernel("where")
def where(c, x, y):
    return np.where(c, x, y)


# ---------------------------------------------------------------- windows (conv, pool)

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
        idx = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                    for t, d, s, o in zip(tap, dilations, strides, out))
        yield tap, xp[(slice(None), slice(None)) + idx]


@kernel("conv")
def conv(x, w, b=None, *, strides, pads, dilations, group, kernel_shape, auto_pad):
    # x is (N, C, *S); w is (M, C/group, *K). Accumulate one matmul per kernel tap, so memory
    # stays at one shifted copy of the input rather than a whole im2col matrix.
    ks = list(kernel_shape or w.shape[2:])
    begin, end, out, strides, dilations = _window_pads(x.shape, ks, strides, dilations, pads, auto_pad)
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
    n, c = x.shape[:2]
    m, g = w.shape[0], group
    y = np.zeros((n, g, m // g, math.prod(out)), dtype=np.result_type(x, w))
    wg = w.reshape(g, m // g, c // g, *w.shape[2:])
    for tap, xs in _taps(xp, ks, strides, dilations, out):
        y += wg[(slice(None),) * 3 + tap] @ xs.reshape(n, g, c // g, -1)
    y = y.reshape(n, m, *out)
    if b is not None:
        y += b.reshape((1, m) + (1,) * len(out))
    return y.astype(x.dtype, copy=False)


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


@kernel("average_pool")
def average_pool(x, *, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, count_include_pad):
    begin, end, out, strides, dilations = _window_pads(
        x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    explicit_end = list((pads or [0] * (2 * len(kernel_shape)))[len(kernel_shape):]) \
        if auto_pad == "NOTSET" else [0] * len(kernel_shape)
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


@kernel("global_average_pool")
def global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@kernel("global_max_pool")
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


# ---------------------------------------------------------------- linear algebra, normalization

@kernel("matmul")
def matmul(a, b):
    return np.matmul(a, b)


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


@kernel("layer_normalization")
def layer_normalization(x, scale, bias=None, *, axis, epsilon):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + epsilon) * scale
    return _like(x, y if bias is None else y + bias)


@kernel("softmax")
def softmax(x, *, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@kernel("log_softmax")
def log_softmax(x, *, axis):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def _reducer(fn):
    def reduce(x, axes=None, *, keepdims, noop_with_empty_axes):
        if axes is None or axes.size == 0:
            if noop_with_empty_axes:
                return x
            ax = None
        else:
            ax = tuple(int(a) for a in axes.reshape(-1))
        return _like(x, fn(x, axis=ax, keepdims=bool(keepdims)))
    return reduce


KERNELS["reduce_mean"] = _reducer(np.mean)
KERNELS["reduce_sum"] = _reducer(np.sum)
KERNELS["reduce_max"] = _reducer(np.max)
KERNELS["reduce_min"] = _reducer(np.min)


# ---------------------------------------------------------------- data movement

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
    ax = axis % (x.ndim + 1) if x.ndim else 0
    return x.reshape(math.prod(x.shape[:ax]), -1)


@kernel("squeeze")
def squeeze(x, axes=None):
    return np.squeeze(x, axis=None if axes is None else tuple(int(a) for a in axes))


@kernel("unsqueeze")
def unsqueeze(x, axes):
    return np.expand_dims(x, tuple(int(a) % (x.ndim + len(axes)) for a in axes))


@kernel("slice")
def slice_(x, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * x.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        idx[int(ax)] = slice(*slice(int(st), int(en), int(sp)).indices(x.shape[int(ax)]))
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
def space_to_depth(x, *, blocksize):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@kernel("constant_of_shape")
def constant_of_shape(shape, *, value, dtype):
    return np.full([int(s) for s in shape], value, dtype=to_numpy(dtype))


# ---------------------------------------------------------------- resize

def _source_coords(n_out, n_in, scale, mode):
    i = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":
        return i * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adj = n_out / (scale * n_in)
        return n_in / 2 * (1 - adj) + (i + 0.5) / scale - 0.5
    raise ValueError(f"coordinate_transformation_mode {mode!r} is not supported")


def _cubic_weights(t, a):
    t = t[:, None] + np.array([1.0, 0.0, -1.0, -2.0])  # distances to the 4 taps
    d = np.abs(t)
    return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                    np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))


def _resize_axis(x, axis, n_out, scale, a):
    n_in = x.shape[axis]
    src = _source_coords(n_out, n_in, scale, a["coordinate_transformation_mode"])
    mode = a["mode"]
    if mode == "nearest":
        rnd = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
               "floor": np.floor, "ceil": np.ceil}[a["nearest_mode"]]
        idx = np.clip(rnd(src), 0, n_in - 1).astype(np.int64)
        return np.take(x, idx, axis=axis)
    xt = np.moveaxis(x, axis, -1).astype(np.float64)
    if mode == "linear":
        s = np.clip(src, 0, n_in - 1)
        i0 = np.floor(s).astype(np.int64)
        i1 = np.minimum(i0 + 1, n_in - 1)
        w = s - i0
        y = xt[..., i0] * (1 - w) + xt[..., i1] * w
    elif mode == "cubic":
        base = np.floor(src).astype(np.int64)
        idx = base[:, None] + np.arange(-1, 3)
        w = _cubic_weights(src - base, a["cubic_coeff_a"])
        if a["exclude_outside"]:
            w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
            w = w / w.sum(axis=1, keepdims=True)
        y = (xt[..., np.clip(idx, 0, n_in - 1)] * w).sum(axis=-1)
    else:
        raise ValueError(f"resize mode {mode!r} is not supported")
    return np.moveaxis(y, -1, axis).astype(x.dtype)


@kernel("resize")
def resize(x, roi=None, scales=None, sizes=None, **a):
    if sizes is not None and sizes.size:
        out = [int(s) for s in sizes]
        sc = [o / i for o, i in zip(out, x.shape)]
    else:
        sc = [float(s) for s in scales]
        out = [int(math.floor(d * s)) for d, s in zip(x.shape, sc)]
    for axis, (n_out, s) in enumerate(zip(out, sc)):
        if n_out != x.shape[axis] or s != 1.0:
            x = _resize_axis(x, axis, n_out, s, a)
    return x
