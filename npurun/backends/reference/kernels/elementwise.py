"""Reference kernels: elementwise ops."""
from __future__ import annotations

import math

import numpy as np

import ml_dtypes

from ....ir.dtypes import (FLOAT8_TYPES, FLOAT_TYPES, SMALL_FLOAT_TYPES, SMALL_INT_TYPES, as_strings,
                           from_numpy, int_range, to_numpy)
from . import KERNELS, _like, kernel


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
KERNELS["identity"] = lambda x: x  # also passes sequences and optionals through

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


def activate(y, activation: str, params):
    """y through a fused activation (a conv's `activation`, `activation_params`; see
    ir/ops/elementwise.FUSABLE_ACTIVATIONS): the activation's own reference kernel."""
    if not activation:
        return y
    from ....ir.ops.elementwise import FUSABLE_ACTIVATIONS
    if activation == "clip":
        lo, hi = params
        return clip(y, np.array(lo, y.dtype), np.array(hi, y.dtype))
    return KERNELS[activation](y, **dict(zip(FUSABLE_ACTIVATIONS[activation], params)))


@kernel("clip")
def clip(x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo.astype(x.dtype))
    if hi is not None:
        x = np.minimum(x, hi.astype(x.dtype))
    return x


@kernel("cast")
def cast(x, *, to, saturate=1, round_mode="up"):
    return convert(x, to, saturate, round_mode)


def convert(x: np.ndarray, to: str, saturate=1, round_mode="up") -> np.ndarray:
    """x as IR dtype `to`, by ONNX Cast's rules (also used by quantization kernels)."""
    dt = to_numpy(to)
    if to == "str":
        return _to_strings(x)
    if x.dtype == object:
        x = _from_strings(x, to)
    x = _widen(x)
    if x.dtype == dt:
        return x.copy()
    if to in FLOAT8_TYPES:
        f = x.astype(np.float64 if x.dtype.kind in "iub" else np.float32)
        if saturate:  # ±inf and out-of-range values become ±(largest finite value)
            big = float(ml_dtypes.finfo(dt).max)
            f = np.clip(f, -big, big)
        # ml_dtypes rounds to nearest even; without saturation, overflow is NaN (inf for e5m2)
        return f.astype(dt)
    if to == "f8e8m0":
        return _to_e8m0(x.astype(np.float32), saturate, round_mode)
    if to == "f4e2m1":  # no inf/NaN encodings: always saturates to ±6
        return x.astype(np.float32).astype(dt)
    if dt.kind in "iu" or to in SMALL_INT_TYPES:
        if x.dtype.kind == "f" and to not in SMALL_INT_TYPES:
            x = np.trunc(x)  # ONNX casts float -> int by truncation toward zero
        if to in SMALL_INT_TYPES:  # fixed point out of range: keep the low bits (two's complement)
            if x.dtype.kind == "f":  # 4/2-bit targets round half away from zero, as ONNX Runtime does
                x = np.trunc(x + np.copysign(0.5, x))
            lo, hi = int_range(to)
            return ((x.astype(np.int64) - lo) % (hi - lo + 1) + lo).astype(dt)
    return x.astype(dt)


def _widen(x):
    """Storage-only types (bf16, 8/4-bit floats, 4/2-bit ints) as float32 / int8 / uint8,
    exactly, so NumPy arithmetic and casts apply."""
    if x.dtype.isbuiltin != 2:
        return x
    name = from_numpy(x.dtype)
    if name in SMALL_INT_TYPES:
        return x.astype(np.int8 if name.startswith("i") else np.uint8)
    return x.astype(np.float32)


def _to_e8m0(f, saturate, round_mode):
    """float32 -> f8e8m0 (an unsigned power of two 2**(e-127); 0xFF is NaN), rounding the
    mantissa away (up), off (down) or to nearest with ties up, on the float32 bits."""
    bits = np.abs(f).view(np.uint32)
    e = (bits >> 23).astype(np.int64)
    m = bits & 0x7FFFFF
    if round_mode == "up":
        e = e + (m != 0)
    elif round_mode == "nearest":
        e = e + (m >= 0x400000)
    special = e >= 255  # inf, NaN, or rounded past the largest power
    out = np.minimum(e, 254)
    if not saturate:
        out = np.where(special | (f == 0), 255, out)
    out = np.where(np.isnan(f), 255, out)
    out = np.where(np.isinf(f) & ~np.isnan(f), 254 if saturate else 255, out)
    return out.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)


def _to_strings(x):
    """Numbers as decimal text; special floats as ONNX's literals (NaN, INF, -INF)."""
    if x.dtype == object:
        return as_strings(x)
    x = _widen(x)
    def one(v):
        if x.dtype.kind == "f":
            if np.isnan(v) or np.isinf(v):
                return "NaN" if np.isnan(v) else "INF" if v > 0 else "-INF"
            return "%.8g" % v  # 8 significant digits, as ONNX Runtime writes them
        return str(int(v))
    out = np.empty(x.shape, dtype=object)
    for i, v in enumerate(x.flat):
        out.flat[i] = one(v)
    return out


def _from_strings(x, to):
    """Decimal text as numbers: float64 for float targets (INF, +INF, -INF and NaN in any
    case are the special values), int64 for integer ones."""
    def num(s):
        s = s.strip()
        if to in FLOAT_TYPES or to in SMALL_FLOAT_TYPES:
            return float(s)
        try:
            return int(s)
        except ValueError:
            return int(float(s))
    vals = [num(str(s)) for s in x.flat]
    return np.array(vals, dtype=np.float64 if to in FLOAT_TYPES or to in SMALL_FLOAT_TYPES or to == "bool"
                    else np.int64).reshape(x.shape)


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


