"""`unsqueeze` and `squeeze` as one reshape (a view, like the reference's np.expand_dims /
np.squeeze), without NumPy's axis normalization helpers: ~1 us instead of ~5 us. Exported
graphs run chains of them on small tensors every step (silero-vad: 8 a chunk). Anything
unusual (a repeated axis, squeezing a dim that is not 1) goes to the reference kernel, which
raises its usual error.

The target shape is cached per (input shape, axes) (bounded to CACHE entries): a stream of
same-shaped runs then costs one dict lookup and the reshape (~0.5 us).
"""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF


CACHE = 256
_shapes: dict = {}


def _cached(op, fn):
    def run(x, axes=None):
        if not isinstance(axes, np.ndarray):
            return fn(x, axes)
        key = (op, x.shape, axes.dtype.char, axes.tobytes())
        shape = _shapes.get(key)
        if shape is not None:
            return x.reshape(shape)
        y = fn(x, axes)
        if y.base is x or y.base is x.base and y.base is not None:  # a view: same data, new shape
            if len(_shapes) >= CACHE:
                _shapes.clear()
            _shapes[key] = y.shape
        return y
    return run


def _unsqueeze(x, axes):
    ax = axes.tolist() if isinstance(axes, np.ndarray) else list(axes)
    ax = ax if isinstance(ax, list) else [ax]
    rank = x.ndim + len(ax)
    pos = sorted(int(a) % rank for a in ax) if all(-rank <= int(a) < rank for a in ax) else None
    if pos is None or len(set(pos)) != len(pos):
        return REF["unsqueeze"](x, axes)
    shape = list(x.shape)
    for p in pos:
        shape.insert(p, 1)
    return x.reshape(shape)


def _squeeze(x, axes=None):
    if axes is None:
        return np.squeeze(x)
    ax = axes.tolist() if isinstance(axes, np.ndarray) else list(axes)
    ax = ax if isinstance(ax, list) else [ax]
    nd = x.ndim
    if not all(-nd <= int(a) < nd for a in ax):
        return REF["squeeze"](x, axes)
    drop = {int(a) % nd for a in ax}
    if len(drop) != len(ax) or any(x.shape[a] != 1 for a in drop):
        return REF["squeeze"](x, axes)
    return x.reshape([s for i, s in enumerate(x.shape) if i not in drop])


_fast_unsqueeze, _fast_squeeze = _cached("unsqueeze", _unsqueeze), _cached("squeeze", _squeeze)
KERNELS = {"unsqueeze": lambda program: _fast_unsqueeze, "squeeze": lambda program: _fast_squeeze}
