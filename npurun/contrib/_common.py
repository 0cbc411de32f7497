"""What the contrib op modules share: ONNX Runtime's quantization arithmetic, shape rules, and
the way a cpu kernel reuses the cpu backend's own kernels.

ONNX Runtime's CPU kernels for these ops compute in float32: dequantize `(q - zp) * scale`,
quantize `rint(x / scale) + zp` saturated (rint rounds half to even, as MLAS does), integer
products exactly in int32. The reference kernels here follow that, so that they agree with
ONNX Runtime to the last quantization step except where a float32 rounding lands on a .5.
"""
from __future__ import annotations

import numpy as np

from ..backends.reference.kernels import KERNELS as REF
from ..ir.dtypes import from_numpy, int_range
from ..registry import register_op

MS = "com.microsoft"
F32 = np.float32


def ms_op(name: str, onnx_op: str, **spec):
    """register_op in the com.microsoft domain, opset 1 on (every contrib op is version 1)."""
    return register_op(name, domain=MS, onnx_op=onnx_op, since=1, **spec)


def scalar(p, default=0):
    """A scale or zero point given as a scalar or a 1-element tensor, as a NumPy scalar."""
    return p.reshape(-1)[0] if p is not None else default


def dequantize(q, scale, zp=None):
    """(q - zp) * scale in float32; scale/zp scalars or broadcastable arrays."""
    d = q.astype(np.int32) - (np.asarray(zp).astype(np.int32) if zp is not None else 0)
    return d.astype(F32) * np.asarray(scale, dtype=F32)


def quantize(x, scale, zp, dtype=None):
    """rint(x / scale) + zp, saturated to the zero point's type (uint8 without one)."""
    dtype = np.dtype(dtype or (zp.dtype if zp is not None else np.uint8))
    lo, hi = int_range(from_numpy(dtype))
    z = np.asarray(zp).astype(F32) if zp is not None else F32(0)
    r = np.rint(np.asarray(x, dtype=F32) / np.asarray(scale, dtype=F32)) + z
    return np.clip(r, lo, hi).astype(dtype)


def dynamic_params(x):
    """ONNX Runtime's dynamic quantization of an activation to uint8 (GetQuantizationParameter
    of its DynamicQuantizeMatMul and quantized LSTM): the range widened to hold 0, scale 1 for
    a constant-zero range, zero point rounded half to even."""
    lo = F32(min(F32(0), x.min())) if x.size else F32(0)
    hi = F32(max(F32(0), x.max())) if x.size else F32(0)
    scale = F32(1) if hi == lo else F32((hi - lo) / F32(255))
    zp = np.uint8(np.rint(np.clip(F32(0) - lo / scale, 0, 255)))
    return scale, zp


def requantize(acc, multiplier, zp):
    """int32 accumulators -> quantized: rint(acc * multiplier) + zp in float32 (MLAS's
    requantization), saturated to the zero point's type."""
    lo, hi = int_range(from_numpy(zp.dtype))
    r = np.rint(acc.astype(F32) * np.asarray(multiplier, dtype=F32)) + F32(scalar(zp))
    return np.clip(r, lo, hi).astype(zp.dtype)


def int_matmul(a, b, a_zp=None, b_zp=None):
    """(a - a_zp) @ (b - b_zp) exactly, int32: the reference MatMulInteger."""
    return REF["matmul_integer"](a, b, a_zp, b_zp)


def cpu_int_matmul(program):
    """The cpu backend's exact integer matmul (float BLAS on small integers, intops.py)."""
    from ..backends.cpu.ops import FACTORIES
    return FACTORIES["matmul_integer"](program)


# ------------------------------------------------------------------ shape rules

def same_as(i: int = 0, dtype=None):
    """Each result has operand i's shape; its dtype, or `dtype` (a fixed one, or the dtype of
    operand `dtype` when an int)."""
    def rule(ins, a):
        d = dtype if isinstance(dtype, str) else ins[dtype if isinstance(dtype, int) else i].dtype
        return [(ins[i].shape, d)]
    return rule


def matmul_shape(sa, sb, node):
    from ..ir.ops.nn import _matmul_shape
    return _matmul_shape(node, tuple(sa), tuple(sb))


def out_elems(outs, i: int = 0) -> int:
    n = 1
    for d in outs[i]:
        n *= d
    return n
