"""Reference kernels: one small, readable NumPy function per op, following the ONNX operator
definitions. They are the oracle every other backend is checked against, so clarity and exact
semantics win over speed; memory is kept sane (no whole-image im2col).

A kernel takes the node's operands positionally (None for an absent optional one) and its
attributes (defaults merged in) as keywords; it returns one array or a tuple of arrays.
"""
from __future__ import annotations

from math import prod  # (not `import math`: kernels/math.py takes that name in this package)

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


def empty_reduction_fits(x, axes, keepdims) -> None:
    """A reduction's result is never larger than its input, except an empty input's: a
    (2^31, 0, 4) reduced over axis 1 keeping dims is 32 GiB of identities. That one is
    checked before NumPy allocates it (an InputError when the process cannot have it)."""
    if x.size:
        return
    from ....util import check_fits
    keep = set(range(x.ndim)) if axes is None else {int(a) % max(x.ndim, 1) for a in axes}
    n = prod(1 if i in keep else d for i, d in enumerate(x.shape) if keepdims or i not in keep)
    check_fits(n * x.dtype.itemsize, f"the reduction of an empty {list(x.shape)} over axes {sorted(keep)}")



from ....ir.ops import _register_families  # noqa: E402

_register_families(__name__, __path__)
