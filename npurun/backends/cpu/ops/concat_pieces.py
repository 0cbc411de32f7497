"""Concat of large tensors as pieces (backends/pieces.py, issue L): on a contended device the
output is allocated once and each input copied into its place, with a preemption point
between inputs (PP-OCR det concatenates four 24x160x160 maps: 2.5-4 ms in one NumPy call).
A copy is exact, so the result is bit-identical; small or uncontended concats (and mixed
dtypes, which NumPy promotes) are the reference kernel itself. A transposed float32 input
(SegFormer's head concatenates three upsampled maps and one token map seen as channels) is
made contiguous first by the blocked transpose (native.untranspose; other views are left to
NumPy, which copies them once): NumPy's concatenate copies
it one float per cache line (18 ms of a 65 ms run)."""
from __future__ import annotations

import functools

import numpy as np

from ... import pieces
from ...reference.kernels import KERNELS as REF
from .. import native

PIECE_MIN = 1 << 20  # output elements below which one call is under ~1 ms


def _concat(*xs, axis, threads=1):
    xs = [native.untranspose(x, threads) if type(x) is np.ndarray else x for x in xs]
    cheap = native.CALLS.cheap  # (in a replayed program each part is one recorded copy)
    if len(xs) < 2 or any(type(x) is not np.ndarray for x in xs) or len({x.dtype for x in xs}) != 1 \
            or not (cheap or (sum(x.size for x in xs) >= PIECE_MIN and pieces.wanted())):
        return REF["concat"](*xs, axis=axis)
    ax = axis % xs[0].ndim
    shape = list(xs[0].shape)
    shape[ax] = sum(x.shape[ax] for x in xs)
    if any(x.ndim != len(shape) or x.shape[:ax] + x.shape[ax + 1:] != tuple(shape[:ax] + shape[ax + 1:]) for x in xs):
        return REF["concat"](*xs, axis=axis)  # (the reference raises the error that names them)
    out = np.empty(shape, xs[0].dtype)
    at = 0
    for x in pieces.each(xs):
        part = out[(slice(None),) * ax + (slice(at, at + x.shape[ax]),)]
        if not (cheap and native.copy_into(part, x)):
            part[...] = x
        at += x.shape[ax]
    return out


KERNELS = {"concat": lambda program: functools.partial(_concat, threads=program.threads)}
