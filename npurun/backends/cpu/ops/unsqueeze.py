"""`unsqueeze` and `squeeze` as one reshape (a view, like the reference's np.expand_dims /
np.squeeze), without NumPy's axis normalization helpers: ~1 us instead of ~5 us. Exported
graphs run chains of them on small tensors every step (silero-vad: 8 a chunk). Anything
unusual (a repeated axis, squeezing a dim that is not 1) goes to the reference kernel, which
raises its usual error.
"""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF


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


KERNELS = {"unsqueeze": lambda program: _unsqueeze, "squeeze": lambda program: _squeeze}
