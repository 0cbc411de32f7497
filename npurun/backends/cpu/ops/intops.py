"""Integer matmul and conv (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv) through
float BLAS, bit-exact with the reference kernels.

The reference kernels compute in int64 (NumPy's integer matmul: no BLAS, ~100x slower than
sgemm) and wrap to int32. Here the operands minus their zero points are small integers held
exactly in float32, and the products run through float32 BLAS (sgemm), which is exact while
every partial sum is an integer below 2**24 in magnitude: whatever order BLAS adds in, each
partial sum is bounded by K * max|a - a_zp| * max|b - b_zp| (the argument of
npurun/precision/emulate.py). The bound per operand comes from its dtype's range and its zero
points (u8 with zp 128: 128; s8 with zp 0: 128; no zp: the dtype's largest magnitude), not
from the data. When K * bound_a * bound_b reaches 2**24, the reduction axis is split into
runs whose sums stay below it, each run one sgemm, the runs added in float64 (exact below
2**53); grouped convs run in float64 BLAS. The float64 total becomes int64 and then int32,
which wraps exactly as the reference's int64 -> int32 cast does.

QLinear* requantize the int32 accumulators with the reference's own code (`_requantize`,
`_per_row`), so the only difference from the reference kernels is how the integer products
are summed. Anything else (other dtypes, bounds beyond 2**53, a failure of the fast path on
an odd shape) runs the reference kernel.

A constant `b` (a weight matrix; the same array object every run) is converted to float32
once and kept (keyed by identity, holding the array), bounded to CACHE entries.

Measured (1 thread, u8 a (128, 384) with zp, s8 b (384, 1536) with per-column zp; see
docs/cpu.md "Integer ops"): reference ~100+ ms, this ~2-3 ms.
"""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF
from ...reference.kernels.nn import conv as _fconv
from ...reference.kernels.quant import _per_channel, _per_row, qlinear_conv_with, qlinear_matmul_with

F32_EXACT = 1 << 24  # every integer up to 2**24 is a float32
F64_EXACT = 1 << 53
INT8 = (np.dtype(np.uint8), np.dtype(np.int8))
CACHE = 32


def _bound(x, zp) -> int | None:
    """Largest |x - zp| over x's dtype range and the zero point values; None if not int8/u8."""
    if x.dtype not in INT8 or (zp is not None and zp.dtype not in INT8):
        return None
    info = np.iinfo(x.dtype)
    if zp is None or zp.size == 0:
        return max(-info.min, info.max)
    z = zp.astype(np.int64)
    return int(max(np.abs(info.min - z).max(), np.abs(info.max - z).max()))


def _runs(k: int, bound: int) -> list[tuple[int, int]] | None:
    """Split k reduction terms, each at most `bound` in magnitude, into runs whose float32
    sums are exact; None if their total could pass 2**53 (then float64 is not exact either)."""
    if k * bound >= F64_EXACT:
        return None
    step = max(1, F32_EXACT // max(1, bound)) if bound < F32_EXACT else 0
    if step == 0:
        return []  # one product alone may not fit float32: float64 throughout
    return [(a, min(k, a + step)) for a in range(0, k, step)] or [(0, 0)]


def _to_int32(acc: np.ndarray, total: int) -> np.ndarray:
    """Exact integers held as floats, each at most `total` in magnitude -> int32, wrapping like
    the reference's int64 -> int32 cast where they may not fit (~6x slower than direct)."""
    return acc.astype(np.int32) if total < 1 << 31 else acc.astype(np.int64).astype(np.int32)


class _Consts:
    """Identity-keyed float32 copies of constant operands (weights), bounded."""

    def __init__(self, program):
        self.program = program
        self.consts: dict | None = None  # id -> the graph's constant arrays (held: ids stay theirs)
        self.cache: dict = {}

    def _is_const(self, a) -> bool:
        if self.consts is None:
            consts, stack = {}, [self.program.graph]
            while stack:
                g = stack.pop()
                consts.update((id(v.data), v.data) for v in g.constants() if v.data is not None)
                stack.extend(r for n in g.nodes for r in n.regions.values())
            self.consts = consts
        return self.consts.get(id(a)) is a

    def centred(self, b, zp):
        """b - zp as float32 (zp broadcast over b's last axis if 1-D), cached for constants."""
        hit = self.cache.get(id(b))
        if hit is not None and hit[0] is b and hit[1] is zp:
            return hit[2]
        bf = b.astype(np.float32)
        if zp is not None:
            bf -= zp.astype(np.float32)
        if self._is_const(b) and (zp is None or self._is_const(zp)):
            if len(self.cache) >= CACHE:
                self.cache.pop(next(iter(self.cache)))
            self.cache[id(b)] = (b, zp, bf)
        return bf


def _matmul_integer(consts: _Consts):
    def run(a, b, a_zp=None, b_zp=None):
        ba, bb = _bound(a, a_zp), _bound(b, b_zp)
        if ba is None or bb is None or a.ndim < 2 or b.ndim < 2:
            return REF["matmul_integer"](a, b, a_zp, b_zp)
        total = a.shape[-1] * ba * bb
        runs = _runs(a.shape[-1], ba * bb)
        if runs is None:
            return REF["matmul_integer"](a, b, a_zp, b_zp)
        af = a.astype(np.float32)
        if a_zp is not None:  # per tensor, or one per row of a (M): the reference's broadcast
            af -= _per_row(a_zp, a).astype(np.float32)
        bf = consts.centred(b, b_zp) if b_zp is None or b_zp.ndim <= 1 else None
        if bf is None:
            return REF["matmul_integer"](a, b, a_zp, b_zp)
        if not runs:
            return _to_int32(np.matmul(af.astype(np.float64), bf.astype(np.float64)), total)
        if len(runs) == 1:
            return _to_int32(np.matmul(af, bf), total)
        acc = None
        for k0, k1 in runs:
            part = np.matmul(af[..., k0:k1], bf[..., k0:k1, :]).astype(np.float64)
            acc = part if acc is None else acc + part
        return _to_int32(acc, total)
    return run


def _conv_integer(x, w, x_zp=None, w_zp=None, **window):
    """conv_integer in float BLAS (the reference conv's per-tap matmuls on float operands):
    float32 in runs of input channels whose sums stay below 2**24, float64 if grouped."""
    bx, bw = _bound(x, x_zp), _bound(w, w_zp)
    if bx is None or bw is None or (x_zp is not None and x_zp.size != 1):
        return REF["conv_integer"](x, w, x_zp, w_zp, **window)
    taps = int(np.prod(w.shape[2:]))
    total = w.shape[1] * bx * bw * taps
    runs = _runs(w.shape[1], bx * bw * taps)
    if runs is None:
        return REF["conv_integer"](x, w, x_zp, w_zp, **window)
    xf = x.astype(np.float32)
    if x_zp is not None:  # padding with 0 after centring = padding with the zero point
        xf -= np.float32(x_zp.reshape(()))
    wf = w.astype(np.float32)
    if w_zp is not None:
        wf -= _per_channel(w_zp, w.ndim).astype(np.float32)
    if window.get("group", 1) != 1 or not runs:
        return _to_int32(_fconv(xf.astype(np.float64), wf.astype(np.float64), **window), total)
    if len(runs) == 1:
        return _to_int32(_fconv(xf, wf, **window), total)
    acc = None
    for c0, c1 in runs:
        part = _fconv(np.ascontiguousarray(xf[:, c0:c1]), np.ascontiguousarray(wf[:, c0:c1]), **window)
        acc = part.astype(np.float64) if acc is None else acc + part
    return _to_int32(acc, total)


def _qlinear_matmul(mm):
    return lambda *args: qlinear_matmul_with(mm, *args)


def _qlinear_conv(*args, **window):
    return qlinear_conv_with(_conv_integer, *args, **window)


def _mm_factory(program):
    return _matmul_integer(_Consts(program))


KERNELS = {
    "matmul_integer": _mm_factory,
    "qlinear_matmul": lambda program: _qlinear_matmul(_mm_factory(program)),
    "conv_integer": lambda program: _conv_integer,
    "qlinear_conv": lambda program: _qlinear_conv,
}
