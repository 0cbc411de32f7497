"""Unary float ops in a replayed program (replay.py): sqrt, reciprocal, neg, abs, exp, log, sin,
cos, floor, ceil as one recorded call of csrc/chain.c's npr_unary (native.unary); elsewhere,
and in every normal run of a program that is not replayed, the reference kernel (NumPy's)."""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import native


def _make(op):
    ref = REF[op]

    def run(x):
        if native.CALLS.cheap and type(x) is np.ndarray and x.dtype == np.float32:
            return native.unary(op, x)
        return ref(x)
    return run


KERNELS = {op: (lambda op: lambda program: _make(op))(op) for op in native.UNARY}
