"""Reference kernels: fused ops (ir/ops/fused.py), as the compositions they stand for."""
from __future__ import annotations

import numpy as np

from . import KERNELS, kernel
from .elementwise import activate


@kernel("masked_softmax")
def masked_softmax(x, mask=None, *, axis, nan_fix, nan_value):
    y = KERNELS["softmax"](x if mask is None else KERNELS["add"](x, mask), axis=axis)
    if nan_fix:
        y = np.where(np.isnan(y), np.array(nan_value, y.dtype), y)
    return y


@kernel("matmul_add")
def matmul_add(a, b, *cs):
    y = KERNELS["matmul"](a, b)
    for c in cs:
        y = KERNELS["add"](y, c)
    return y


@kernel("affine_activation")
def affine_activation(x, *, s0, t0, activation, activation_params, s1, t1):
    dt = x.dtype
    y = x * dt.type(s0) + dt.type(t0) if (s0, t0) != (1.0, 0.0) else x
    y = activate(y, activation, activation_params)
    return y * dt.type(s1) + dt.type(t1) if (s1, t1) != (1.0, 0.0) else y


@kernel("add_activation")
def add_activation(a, b, *, activation, activation_params):
    return activate(KERNELS["add"](a, b), activation, activation_params)


@kernel("channel_affine")
def channel_affine(x, scale=None, shift=None, *, activation, activation_params):
    per = (1, -1) + (1,) * (x.ndim - 2)  # one value per channel, along axis 1
    y = x if scale is None else KERNELS["mul"](x, scale.reshape(per))
    y = y if shift is None else KERNELS["add"](y, shift.reshape(per))
    return activate(y, activation, activation_params)


@kernel("rope_half")
def rope_half(x, cos, sin):
    # exactly the chain it replaces: x * cos + concat(-x2, x1) * sin
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin
