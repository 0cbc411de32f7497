"""Reshape, flatten and expand in a replayed program (replay.py): where the reference kernel
copies (a reshape of a transposed view, every expand), the copy is csrc/transpose.c's
npr_copy (native.copy_into), one call a replay makes without Python; elsewhere, and in every
normal run, the reference kernel itself. A copy is exact: the same result."""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import native


def _dense(x):
    """x, made contiguous by a recorded copy in a replayed program (NumPy's reshape copies a
    view it cannot reshape in place)."""
    return native.contiguous(x) if native.CALLS.cheap and type(x) is np.ndarray else x


def _reshape(x, shape, *, allowzero):
    return REF["reshape"](_dense(x), shape, allowzero=allowzero)


def _flatten(x, *, axis):
    return REF["flatten"](_dense(x), axis=axis)


def _expand(x, shape):
    if native.CALLS.cheap and type(x) is np.ndarray:
        y = np.empty(np.broadcast_shapes(x.shape, tuple(int(s) for s in shape)), x.dtype)
        if native.copy_into(y, x):
            return y
    return REF["expand"](x, shape)


KERNELS = {"reshape": lambda program: _reshape, "flatten": lambda program: _flatten,
           "expand": lambda program: _expand}
