"""Reference kernels: one small, readable NumPy function per op, following the ONNX operator
definitions. They are the oracle every other backend is checked against, so clarity and exact
semantics win over speed; memory is kept sane (no whole-image im2col).

A kernel takes the node's operands positionally (None for an absent optional one) and its
attributes (defaults merged in) as keywords; it returns one array or a tuple of arrays.
"""
from __future__ import annotations

import numpy as np

KERNELS: dict = {}


def kernel(*names):
    def register(fn):
        for n in names:
            KERNELS[n] = fn
        return fn
    return register


def _like(x, y):
    return np.asarray(y).astype(x.dtype, copy=False)



from ....ir.ops import _register_families  # noqa: E402

_register_families(__name__, __path__)
