"""Pow by a constant small integer or a half on the cpu backend: x^2 as x * x, x^3 as
(x * x) * x, x^0.5 as sqrt(x), x^1 as x, x^-1 as 1 / x (what ONNX Runtime's Pow does for
those exponents). The reference computes float64 pow per element (~80 ns each): GPT-2's
exported GELU spent 380 ms of an 800 ms run in pow(x, 3). Float32 only; other exponents
and types run the reference kernel. Within 2 ulp of the reference's correctly rounded pow
(tests/test_cpu_fused.py)."""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import native


def make_pow(program):
    def pow_(a, b):
        if a.dtype != np.float32 or b.size != 1 or b.dtype.kind not in "fi":
            return REF["pow"](a, b)
        e = float(b.reshape(()))
        if not native.broadcasts_to(b.shape, a.shape):
            return REF["pow"](a, b)
        if native.CALLS.cheap and e in (2.0, 3.0, 0.5, -1.0):  # (the same operations as recorded calls)
            if e == 0.5 or e == -1.0:
                return native.unary("sqrt" if e == 0.5 else "reciprocal", a)
            y = native.binary("mul", a, a)
            y = y if y is None or e == 2.0 else native.binary("mul", y, a)
            if y is not None:
                return y
        if e == 2.0:
            return np.multiply(a, a)
        if e == 3.0:
            y = np.multiply(a, a)
            return np.multiply(y, a, out=y)
        if e == 0.5:
            with np.errstate(invalid="ignore"):
                return np.sqrt(a)
        if e == 1.0:
            return a.copy()
        if e == -1.0:
            with np.errstate(divide="ignore"):
                return np.divide(np.float32(1), a)
        return REF["pow"](a, b)
    return pow_


KERNELS = {"pow": make_pow}
