"""Reshape, flatten and expand in a replayed program (replay.py): where the reference kernel
copies (a reshape of a transposed view, every expand), the copy is csrc/transpose.c's
npr_copy (native.copy_into), one call a replay makes without Python; elsewhere, and in every
normal run, the reference kernel itself. A copy is exact: the same result."""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import native


def _reshape(x, shape, *, allowzero):
    if native.CALLS.cheap and type(x) is np.ndarray and not x.flags.c_contiguous:
        x = native.contiguous(x)
    return REF["reshape"](x, shape, allowzero=allowzero)


def _flatten(x, *, axis):
    if native.CALLS.cheap and type(x) is np.ndarray and not x.flags.c_contiguous:
        x = native.contiguous(x)
    return REF["flatten"](x, axis=axis)


def _expand(x, shape):
    if native.CALLS.cheap and type(x) is np.ndarray:
        y = np.empty(np.broadcast_shapes(x.shape, tuple(int(s) for s in shape)), x.dtype)
        if native.copy_into(y, x):
            return y
    return REF["expand"](x, shape)


KERNELS = {"reshape": lambda program: _reshape, "flatten": lambda program: _flatten,
           "expand": lambda program: _expand}
