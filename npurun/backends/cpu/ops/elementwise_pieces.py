"""Binary elementwise ops on large float32 maps as pieces (backends/pieces.py, issue L).

A DBNet-class detector adds and scales 96x160x160 maps (2.5 M elements, 3-10 ms here) in
NumPy's one call; on a contended device that call is a stretch no better task can enter. Here
the output is written in pieces along its first axis longer than 1 (channels, for one image),
each the whole call's kernel (the pool's npr_binary on more than one thread, NumPy's ufunc on
one) on the operands' matching slices (an operand broadcast along that axis is passed whole),
with a preemption point between pieces. Elementwise, so the result is
bit-identical to the whole call's; alone on the device (or below PIECE_MIN elements, or other
dtypes), it is the reference kernel itself.
"""
from __future__ import annotations

import numpy as np

from ... import pieces
from ...reference.kernels import KERNELS as REF
from .. import native

PIECE_MIN = 1 << 20       # elements: a smaller map is under ~1 ms anyway
MT_MIN = 1 << 15          # elements: a smaller op stays on one thread (NumPy's)
SECONDS_PER_ELEMENT = 1e-9  # NumPy's float32 add/mul here, read + write (errs long: pieces err short)
# Each piece writes its slice of the output in place (`out=`): a piece computed into a fresh
# array and then copied made a contended add 2x the whole call's time (PP-OCR det's 96x160x160
# adds, 1.1 -> 2.3 ms). The ufuncs are the reference kernels' own for float32 operands.
OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
       "max": np.maximum, "min": np.minimum}


def _make(op, program):
    ref, ufunc = REF[op], OPS[op]
    cal: dict = {}  # the measured speed of this op's pieces (pieces.split)
    # On more than one thread a large float32 op runs as csrc/chain.c's npr_binary on the
    # pool's threads, broadcasting as NumPy does (NumPy's ufuncs run on one): each element one
    # IEEE operation, the same bits. SqueezeBERT's residual adds at 2 threads took longer than
    # at 1; FocalNet's modulation products, ConvNeXt-V2's GRN scalings did not speed up.
    threads = getattr(program, "threads", 1) if native.LIB is not None else 1

    def run(a, b):
        # (cheapest tests first: a model's many small adds must not pay for this wrapper)
        if type(a) is not np.ndarray or type(b) is not np.ndarray:
            return ref(a, b)
        if threads > 1 and max(a.size, b.size) >= MT_MIN and a.dtype == np.float32 and b.dtype == np.float32 \
                and not pieces.wanted():
            y = native.binary(op, a, b, threads)
            if y is not None:
                return y
        if native.CALLS.cheap and a.dtype == np.float32 and b.dtype == np.float32 \
                and (max(a.size, b.size) < PIECE_MIN or not pieces.wanted()):
            y = native.binary(op, a, b)  # (in a replayed program: one recorded call)
            if y is not None:
                return y
        if max(a.size, b.size) < PIECE_MIN or a.dtype != np.float32 or b.dtype != np.float32 or not pieces.wanted():
            return ref(a, b)
        shape = np.broadcast_shapes(a.shape, b.shape)
        size = int(np.prod(shape))
        axis = next((k for k, d in enumerate(shape) if d > 1), None)
        if axis is None:
            return ref(a, b)
        out = np.empty(shape, np.float32)

        def part(x, i0, i1):  # x's slice [i0, i1) along the output's `axis` (right-aligned ranks)
            k = axis - (len(shape) - x.ndim)
            if k < 0 or x.shape[k] == 1:
                return x
            return x[(slice(None),) * k + (slice(i0, i1),)]
        for i0, i1 in pieces.each(pieces.split(shape[axis], size * SECONDS_PER_ELEMENT, cal=cal)):
            # (every axis before `axis` has length 1: the output's slice is contiguous)
            o = out[(slice(None),) * axis + (slice(i0, i1),)]
            if threads == 1 or native.binary(op, part(a, i0, i1), part(b, i0, i1), threads, out=o) is None:
                ufunc(part(a, i0, i1), part(b, i0, i1), out=o)
        return out
    return run


KERNELS = {op: (lambda op: lambda program: _make(op, program))(op) for op in OPS}
