"""Reference kernels: elementwise ops."""
from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import to_numpy
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


