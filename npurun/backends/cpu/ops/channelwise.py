"""Per-channel elementwise ops on the cpu backend, one pass over memory (csrc/chain.c):

- `prelu` with one slope per channel (shape (C,1,1), (1,C,1,1), (C,) on a 2-D input, or a
  scalar): MTCNN puts one after every conv; NumPy's np.where(x < 0, s * x, x) makes three
  passes and two temporaries;
- `batch_normalization` in inference form standing alone (DenseNet's after each concat,
  pre-activation ResNets'; one after a conv is folded into it by the passes): y = x * s + t
  per channel, s and t computed once per node from constant parameters;
- `instance_normalization` and `group_normalization` (BiT's and PoolFormer's GroupNorm, which
  exporters write as an InstanceNorm over reshaped groups): the rows (a channel's or a
  group's elements) normalized by csrc/transformer.c's layernorm (statistics in float32, two
  passes), then the per-channel scale and shift in one pass.

Anything else (other dtypes, other broadcasts, parameters computed at run time) runs the
reference kernel. Checked against it in tests/test_cpu_fused.py.
"""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import native

BIG = 1 << 14  # (a smaller tensor: NumPy is as fast as a ctypes call)


def _channels(x, p):
    """(outer, C, inner) of x when p holds one value per channel (axis 1) or one in all."""
    if x.dtype != np.float32 or p.dtype != np.float32 or x.ndim < 2:
        return None
    c = x.shape[1]
    if p.size == 1:
        return None if p.ndim > x.ndim else (1, 1, x.size)
    shape = (1,) * (x.ndim - p.ndim) + p.shape
    if shape[1] != c or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return x.shape[0], c, int(np.prod(x.shape[2:], dtype=np.int64))


def make_prelu(program):
    def prelu(x, slope):
        dims = _channels(x, slope) if not native.small(x.size, BIG) else None
        if dims is None:
            return REF["prelu"](x, slope)
        x = native.contiguous(x)
        s = np.ascontiguousarray(slope, np.float32).reshape(-1)
        y = np.empty_like(x)
        native.LIB.npr_prelu_channels(native.ptr(x), native.ptr(y), *dims, native.ptr(s))
        return y
    return prelu


def make_batch_normalization(program):
    def batch_normalization(x, scale, bias, mean, var, *, epsilon, **attrs):
        if x.dtype != np.float32 or x.ndim < 2 or native.small(x.size, BIG) or attrs.get("training_mode") \
                or any(p.shape != (x.shape[1],) for p in (scale, bias, mean, var)):
            return REF["batch_normalization"](x, scale, bias, mean, var, epsilon=epsilon, **attrs)
        s64 = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
        s, t = s64.astype(np.float32), (bias - mean * s64).astype(np.float32)
        x = native.contiguous(x)
        y = np.empty_like(x)
        inner = int(np.prod(x.shape[2:], dtype=np.int64))
        native.LIB.npr_channel_affine_act(native.ptr(x), native.ptr(y), x.shape[0], x.shape[1], inner,
                                          native.ptr(s), native.ptr(t), 0, 0.0, 0.0)
        return y
    return batch_normalization


_ONES: dict = {}  # row length -> ones (the layernorm kernel's scale)


def _normalize_rows(x, rows: int, n: int, epsilon: float):
    """x (contiguous float32) as `rows` rows of n, each normalized: (x - mean) / sqrt(var + eps)."""
    from . import transformer as T
    ones = _ONES.get(n)
    if ones is None:
        ones = _ONES.setdefault(n, np.ones(n, np.float32)) if len(_ONES) < 64 else np.ones(n, np.float32)
    y = np.empty_like(x)
    mean, inv = np.empty(rows, np.float32), np.empty(rows, np.float32)
    T.LIB.npr_layernorm(native.ptr(x), native.ptr(ones), None, native.ptr(y), native.ptr(mean), native.ptr(inv),
                        0, rows, n, epsilon)
    return y


def _scale_shift(y, c: int, scale, bias):
    """y (N, C, ...) times scale[c] plus bias[c], in place."""
    s = np.ascontiguousarray(scale, np.float32).reshape(c)
    t = np.ascontiguousarray(bias, np.float32).reshape(c)
    inner = y.size // (y.shape[0] * c)
    native.LIB.npr_channel_affine_act(native.ptr(y), native.ptr(y), y.shape[0], c, inner, native.ptr(s),
                                      native.ptr(t), 0, 0.0, 0.0)
    return y


def _norm_ok(x, scale, bias, c) -> bool:
    from . import transformer as T
    return T.LIB is not None and x.dtype == np.float32 and x.ndim >= 3 and x.size >= BIG \
        and scale.size == c and bias.size == c and scale.dtype == bias.dtype == np.float32


def make_instance_normalization(program):
    def instance_normalization(x, scale, bias, *, epsilon):
        c = x.shape[1] if x.ndim >= 2 else 0
        if not _norm_ok(x, scale, bias, c):
            return REF["instance_normalization"](x, scale, bias, epsilon=epsilon)
        x = native.contiguous(x)
        y = _normalize_rows(x, x.shape[0] * c, x.size // (x.shape[0] * c), epsilon)
        return _scale_shift(y, c, scale, bias)
    return instance_normalization


def make_group_normalization(program):
    def group_normalization(x, scale, bias, *, num_groups, epsilon, **attrs):
        c = x.shape[1] if x.ndim >= 2 else 0
        if attrs.get("stash_type", 1) not in (1, "f32") or not _norm_ok(x, scale, bias, c) or c % num_groups:
            return REF["group_normalization"](x, scale, bias, num_groups=num_groups, epsilon=epsilon, **attrs)
        x = native.contiguous(x)
        rows = x.shape[0] * num_groups
        y = _normalize_rows(x, rows, x.size // rows, epsilon)
        return _scale_shift(y, c, scale, bias)
    return group_normalization


KERNELS = {} if native.LIB is None else {
    "prelu": make_prelu, "batch_normalization": make_batch_normalization,
    "instance_normalization": make_instance_normalization, "group_normalization": make_group_normalization,
}
