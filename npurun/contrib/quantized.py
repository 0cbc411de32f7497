"""Quantized elementwise, pooling, concat and softmax ops of ONNX Runtime's QOperator format
(what `quantize_static(..., quant_format=QOperator)` emits around QLinearConv/QLinearMatMul):
QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearConcat,
QLinearAveragePool, QLinearGlobalAveragePool.

Each is `quantize(f(dequantize(x)))` in float32, the way ONNX Runtime's CPU kernels compute
it (its lookup tables hold exactly these values). Tensors are uint8 or int8 with scalar
scales and zero points; a missing zero point is 0 of the tensor's type.
"""
from __future__ import annotations

import numpy as np

from ..backends.reference.kernels import KERNELS as REF
from ..ir.ops.nn import _spatial
from ..ir.shapes import broadcast
from ..registry import REQUIRED
from ._common import F32, dequantize, ms_op, quantize, scalar

Q8 = ("u8", "i8")
_SCALE = ("f32",)


def _zp_like(zp, x):
    """A zero point's value as x's type (ONNX Runtime's default zero point is 0)."""
    return np.asarray(scalar(zp, 0)).astype(x.dtype)


# ------------------------------------------------------------------ binary: add, mul

def _binary_rule(ins, a):
    shape = broadcast(tuple(ins[0].shape), tuple(ins[3].shape))
    if shape is None:
        raise ValueError(f"A {list(ins[0].shape)} and B {list(ins[3].shape)} do not broadcast")
    if ins[0].dtype != ins[3].dtype:
        raise ValueError(f"A is {ins[0].dtype} but B is {ins[3].dtype}")
    return [(shape, ins[0].dtype)]


def qlinear_add(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
    # C = (sa (A - za) + sb (B - zb)) / sc + zc
    s = dequantize(a, scalar(a_scale), scalar(a_zp, 0)) + dequantize(b, scalar(b_scale), scalar(b_zp, 0))
    return quantize(s, scalar(c_scale), _zp_like(c_zp, a))


def qlinear_mul(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
    # C = (A - za)(B - zb) sa sb / sc + zc: the product of integers first, then one scale
    prod = (a.astype(np.int32) - np.int32(scalar(a_zp, 0))) * (b.astype(np.int32) - np.int32(scalar(b_zp, 0)))
    mult = F32(scalar(a_scale)) * F32(scalar(b_scale)) / F32(scalar(c_scale))
    lo, hi = np.iinfo(a.dtype).min, np.iinfo(a.dtype).max
    return np.clip(np.rint(prod.astype(F32) * mult) + F32(scalar(c_zp, 0)), lo, hi).astype(a.dtype)


_BIN_INPUTS = ["A", "A_scale", "A_zero_point?", "B", "B_scale", "B_zero_point?", "C_scale", "C_zero_point?"]
for _name, _onnx, _fn in (("qlinear_add", "QLinearAdd", qlinear_add), ("qlinear_mul", "QLinearMul", qlinear_mul)):
    ms_op(_name, _onnx, inputs=_BIN_INPUTS, outputs=["C"], groups={"elementwise", "binary", "quant"},
          dtypes={"A": Q8, "B": Q8, "A_scale": _SCALE, "B_scale": _SCALE, "C_scale": _SCALE},
          shape=_binary_rule, macs=3, reference=_fn)


# ------------------------------------------------------------------ unary: sigmoid, leaky relu

def _unary(f):
    def kernel(x, x_scale, x_zp=None, y_scale=None, y_zp=None, **attrs):
        return quantize(f(dequantize(x, scalar(x_scale), scalar(x_zp, 0)), **attrs), scalar(y_scale),
                        _zp_like(y_zp, x))
    return kernel


def _sigmoid(x):
    return (F32(1) / (F32(1) + np.exp(-x.astype(np.float64)))).astype(F32)


def _leaky(x, *, alpha):
    return np.where(x >= 0, x, F32(alpha) * x).astype(F32)


_UN_INPUTS = ["X", "X_scale", "X_zero_point?", "Y_scale", "Y_zero_point?"]
ms_op("qlinear_sigmoid", "QLinearSigmoid", inputs=_UN_INPUTS, outputs=["Y"],
      groups={"elementwise", "unary", "quant"}, dtypes={"X": Q8}, macs=4, reference=_unary(_sigmoid))
ms_op("qlinear_leaky_relu", "QLinearLeakyRelu", inputs=_UN_INPUTS, outputs=["Y"], attrs={"alpha": 0.01},
      groups={"elementwise", "unary", "quant"}, dtypes={"X": Q8}, macs=2, reference=_unary(_leaky))


# ------------------------------------------------------------------ softmax

def _softmax_rule(ins, a):
    rank = len(ins[0].shape)
    if not -rank <= a["axis"] < max(rank, 1):
        raise ValueError(f"axis {a['axis']} out of range for rank {rank}")
    return [(ins[0].shape, ins[4].dtype)]


def qlinear_softmax(x, x_scale, x_zp, y_scale, y_zp, *, axis, opset):
    # opset < 13 (Softmax-1/11): the input is coerced to 2-D at `axis`, softmax over the
    # flattened trailing dims; from 13 on, softmax along `axis` alone.
    f = dequantize(x, scalar(x_scale), scalar(x_zp, 0)).astype(np.float64)
    if opset < 13:
        ax = axis % x.ndim
        flat = f.reshape(int(np.prod(x.shape[:ax], dtype=np.int64)), -1)
        p = REF["softmax"](flat, axis=1).reshape(x.shape)
    else:
        p = REF["softmax"](f, axis=axis)
    return quantize(p.astype(F32), scalar(y_scale), np.asarray(scalar(y_zp)).astype(y_zp.dtype))


ms_op("qlinear_softmax", "QLinearSoftmax", inputs=["X", "X_scale", "x_zero_point?", "y_scale", "y_zero_point"],
      outputs=["Y"], attrs={"axis": -1, "opset": 13}, groups={"normalizing", "quant"},
      dtypes={"X": Q8}, shape=_softmax_rule, vector_ops=10, reference=qlinear_softmax)


# ------------------------------------------------------------------ concat

def _concat_rule(ins, a):
    # inputs: y_scale, y_zero_point, then (x, x_scale, x_zero_point) per input
    xs = ins[2:]
    if not xs or len(xs) % 3:
        raise ValueError(f"after Y_scale and Y_zero_point the inputs come in (tensor, scale, zero point) "
                         f"triples; got {len(xs)} more")
    tensors = xs[0::3]
    rank = len(tensors[0].shape)
    if not -rank <= a["axis"] < rank:
        raise ValueError(f"axis {a['axis']} out of range for rank {rank}")
    ax = a["axis"] % rank
    total = 0
    for t in tensors:
        if len(t.shape) != rank or any(d != e and isinstance(d, int) and isinstance(e, int)
                                       for k, (d, e) in enumerate(zip(t.shape, tensors[0].shape)) if k != ax):
            raise ValueError(f"inputs {[list(t.shape) for t in tensors]} differ off axis {ax}")
        total = total + t.shape[ax] if isinstance(total, int) and isinstance(t.shape[ax], int) else "?"
    return [((*tensors[0].shape[:ax], total, *tensors[0].shape[ax + 1:]), ins[1].dtype)]


def qlinear_concat(y_scale, y_zp, *triples, axis):
    parts = [quantize(dequantize(x, scalar(s), scalar(z, 0)), scalar(y_scale), np.asarray(scalar(y_zp)).astype(y_zp.dtype))
             for x, s, z in zip(triples[0::3], triples[1::3], triples[2::3])]
    return np.concatenate(parts, axis=axis)


ms_op("qlinear_concat", "QLinearConcat", inputs=["Y_scale", "Y_zero_point", "inputs*"], outputs=["Y"],
      attrs={"axis": 0}, groups={"quant", "view"}, shape=_concat_rule, reference=qlinear_concat)


# ------------------------------------------------------------------ pooling

_POOL = {"kernel_shape": REQUIRED, "strides": None, "pads": None, "auto_pad": "NOTSET", "ceil_mode": 0,
         "count_include_pad": 0, "channels_last": 0}


def _nchw(shape, channels_last):
    """(N, C, *S) from a shape given channels-last (N, *S, C) when channels_last is set."""
    return (shape[0], shape[-1], *shape[1:-1]) if channels_last else tuple(shape)


def _back(shape, channels_last):
    return (shape[0], *shape[2:], shape[1]) if channels_last else tuple(shape)


def _pool_rule(ins, a):
    x = ins[0]
    if len(x.shape) < 3:
        raise ValueError(f"X must be (N, C, *spatial), got {list(x.shape)}")
    if not a["kernel_shape"] or len(a["kernel_shape"]) != len(x.shape) - 2:
        raise ValueError(f"kernel_shape {a['kernel_shape']} must give one size per spatial axis of {list(x.shape)}")
    s = _nchw(x.shape, a["channels_last"])
    out = (s[0], s[1], *_spatial(None, a, s, a["kernel_shape"]))
    return [(_back(out, a["channels_last"]), x.dtype)]


def _to_nchw(x, channels_last):
    return np.moveaxis(x, -1, 1) if channels_last else x


def _from_nchw(y, channels_last):
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last else y


def qlinear_average_pool(x, x_scale, x_zp=None, y_scale=None, y_zp=None, *, kernel_shape, strides, pads,
                         auto_pad, ceil_mode, count_include_pad, channels_last):
    f = _to_nchw(dequantize(x, scalar(x_scale), scalar(x_zp, 0)), channels_last)
    p = REF["average_pool"](f, kernel_shape=kernel_shape, strides=strides, pads=pads, dilations=None,
                            ceil_mode=ceil_mode, auto_pad=auto_pad, count_include_pad=count_include_pad)
    return _from_nchw(quantize(p, scalar(y_scale), _zp_like(y_zp, x)), channels_last)


def _global_rule(ins, a):
    x = ins[0]
    if len(x.shape) < 3:
        raise ValueError(f"X must be (N, C, *spatial), got {list(x.shape)}")
    s = _nchw(x.shape, a["channels_last"])
    return [(_back((s[0], s[1], *[1] * (len(s) - 2)), a["channels_last"]), x.dtype)]


def qlinear_global_average_pool(x, x_scale, x_zp, y_scale, y_zp, *, channels_last):
    f = _to_nchw(dequantize(x, scalar(x_scale), scalar(x_zp, 0)), channels_last)
    m = f.mean(axis=tuple(range(2, f.ndim)), keepdims=True, dtype=np.float64).astype(F32)
    return _from_nchw(quantize(m, scalar(y_scale), _zp_like(y_zp, x)), channels_last)


def _pool_work(a, ins, outs):
    k = int(np.prod(a["kernel_shape"]))
    return int(np.prod(outs[0])) * k


ms_op("qlinear_average_pool", "QLinearAveragePool", inputs=["X", "x_scale", "x_zero_point?", "y_scale", "y_zero_point?"],
      outputs=["Y"], attrs=_POOL, groups={"pool", "quant"}, dtypes={"X": Q8}, shape=_pool_rule,
      macs=_pool_work, reference=qlinear_average_pool)
ms_op("qlinear_global_average_pool", "QLinearGlobalAveragePool",
      inputs=["X", "x_scale", "x_zero_point", "y_scale", "y_zero_point"], outputs=["Y"],
      attrs={"channels_last": 0}, groups={"pool", "quant"}, dtypes={"X": Q8}, shape=_global_rule,
      macs=lambda a, ins, outs: int(np.prod(ins[0])), reference=qlinear_global_average_pool)
