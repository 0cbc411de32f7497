"""Einsum of two operands on the cpu backend as one batched matmul (BLAS): the indices sort
into batch (in both operands and the result), contracted (in both, not in the result) and
free ones (in one operand and the result); each operand is transposed to (batch, free,
contracted) / (batch, contracted, free), the product taken by matmul.py's batched product on
the program's threads (np.matmul where that does not apply), and the result
reshaped and transposed to the equation's order. NumPy's own einsum runs such an equation
(CvT's attention, 'bhlk,bhtk->bhlt') in its C loops, ~30x slower than BLAS.

What this does not take (one operand, three or more, an index twice in one operand, an
ellipsis, an index summed away within one operand, other dtypes than float32) runs the
reference kernel. The plan of an equation and operand shapes is computed once.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ...reference.kernels import KERNELS as REF
from . import matmul as MM


@lru_cache(maxsize=256)
def _plan(equation: str, sa: tuple, sb: tuple):
    """(perm_a, shape_a3, perm_b, shape_b3, out_shape_in_matmul_order, perm_out) or None."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return None
    a, b = parts
    if len(set(a)) != len(a) or len(set(b)) != len(b) or len(set(out)) != len(out) \
            or len(a) != len(sa) or len(b) != len(sb):
        return None
    if any(c not in a and c not in b for c in out):
        return None
    dims = {}
    for labels, shape in ((a, sa), (b, sb)):
        for c, d in zip(labels, shape):
            if dims.setdefault(c, d) != d:
                return None  # (broadcast dims of size 1: the reference's business)
    batch = [c for c in out if c in a and c in b]
    contracted = [c for c in a if c in b and c not in out]
    free_a = [c for c in a if c not in b]
    free_b = [c for c in b if c not in a]
    if any(c not in out for c in free_a + free_b):
        return None  # an index summed within one operand
    perm_a = [a.index(c) for c in batch + free_a + contracted]
    perm_b = [b.index(c) for c in batch + contracted + free_b]
    nb = math.prod(dims[c] for c in batch)
    na, nk, nf = (math.prod(dims[c] for c in cs) for cs in (free_a, contracted, free_b))
    order = batch + free_a + free_b  # the matmul result's index order
    return (tuple(perm_a), (nb, na, nk), tuple(perm_b), (nb, nk, nf), tuple(dims[c] for c in order),
            tuple(order.index(c) for c in out))


def make_einsum(program):
    def einsum(*xs, equation):
        if len(xs) != 2 or any(x.dtype != np.float32 for x in xs):
            return REF["einsum"](*xs, equation=equation)
        plan = _plan(equation, xs[0].shape, xs[1].shape)
        if plan is None:
            return REF["einsum"](*xs, equation=equation)
        pa, sa3, pb, sb3, mshape, pout = plan
        a3 = xs[0].transpose(pa).reshape(sa3)
        b3 = xs[1].transpose(pb).reshape(sb3)
        # the product on the program's threads (matmul.py: bands or heads on the library's pool;
        # BLAS itself runs at one thread inside a program)
        y = MM.matmul_add(program, a3, b3)
        y = (np.matmul(a3, b3) if y is None else y).reshape(mshape)
        return np.ascontiguousarray(y.transpose(pout)) if pout != tuple(range(len(pout))) else y
    return einsum


KERNELS = {"einsum": make_einsum}
