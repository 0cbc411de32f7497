"""GELU family and bias adds that ONNX Runtime's transformer optimizer fuses: Gelu, BiasGelu
(BERT, ViT), FastGelu (GPT-2's tanh form), QuickGelu (CLIP's x * sigmoid(1.702 x)), BiasAdd
and BiasSplitGelu (diffusion UNets).

The reference kernels compute in float64 and round once to the operand type. The cpu kernels
run the cpu backend's own compiled GELU where it is built (backends/cpu/ops/transformer.py),
else the reference.
"""
from __future__ import annotations

import math

import numpy as np

from ..backends.reference.kernels import KERNELS as REF
from ..ir.ops import _fail
from ..ir.shapes import broadcast
from ._common import ms_op

FLOATS = ("f32", "f16", "bf16", "f64")
_SQRT_2_PI = math.sqrt(2 / math.pi)


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _erf_gelu(x):
    return REF["gelu"](x, approximate="none")


def gelu(x):
    return _erf_gelu(x)


def bias_gelu(a, b):
    return _erf_gelu((_f64(a) + _f64(b)).astype(a.dtype))


def fast_gelu(x, bias=None):
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x with the bias added first
    v = _f64(x) if bias is None else _f64(x) + _f64(bias)
    return (0.5 * v * (1.0 + np.tanh(_SQRT_2_PI * (v + 0.044715 * v ** 3)))).astype(x.dtype)


def quick_gelu(x, *, alpha):
    v = _f64(x)
    return (v / (1.0 + np.exp(-alpha * v))).astype(x.dtype)


def bias_add(x, bias, skip):
    return (_f64(x) + _f64(bias) + _f64(skip)).astype(x.dtype)


def bias_split_gelu(x, bias):
    # x (N, S, D) + bias (D), split in halves along D: left * gelu(right) -> (N, S, D/2)
    v = (_f64(x) + _f64(bias))
    left, right = np.split(v, 2, axis=-1)
    return (left * _f64(_erf_gelu(right.astype(x.dtype)))).astype(x.dtype)


def _cpu_gelu(program, approximate, prep):
    """The cpu backend's compiled GELU on `prep(args)` (the biased input), if it has one."""
    from ..backends.cpu.ops import FACTORIES
    make = FACTORIES.get("gelu")
    fast = make(program) if make is not None else REF["gelu"]

    def run(*args):
        return fast(prep(*args), approximate=approximate)
    return run


def _add(a, b):
    return (a + b).astype(a.dtype, copy=False)


def _bias_rule(ins, a, node):
    x, b = ins[0], ins[1]
    shape = broadcast(tuple(x.shape), tuple(b.shape))
    for extra in ins[2:]:  # BiasAdd's skip
        shape = None if shape is None or extra is None else broadcast(shape, tuple(extra.shape))
    if shape is None or len(shape) != len(x.shape):
        _fail(node, f"bias {list(b.shape)} does not broadcast to the input {list(x.shape)}")
    return [(shape, x.dtype)]


def _split_rule(ins, a, node):
    x, b = ins[0], ins[1]
    if len(x.shape) != 3 or len(b.shape) != 1:
        _fail(node, f"X must be (N, S, D) and bias (D,), got {list(x.shape)} and {list(b.shape)}")
    d = x.shape[2]
    if isinstance(d, int) and d % 2:
        _fail(node, f"the last axis {d} of X does not split in halves")
    return [((x.shape[0], x.shape[1], d // 2 if isinstance(d, int) else "?"), x.dtype)]


_ELEM = {"elementwise", "unary"}
ms_op("gelu", "Gelu", inputs=["X"], outputs=["Y"], groups=_ELEM, dtypes={"X": FLOATS},
      vector_ops=6, reference=gelu, cpu_factory=lambda p: _cpu_gelu(p, "none", lambda x: x))
ms_op("bias_gelu", "BiasGelu", inputs=["A", "B"], outputs=["C"], groups={"elementwise", "binary"},
      dtypes={"A": FLOATS}, shape=_bias_rule, vector_ops=7, reference=bias_gelu,
      cpu_factory=lambda p: _cpu_gelu(p, "none", _add))
ms_op("fast_gelu", "FastGelu", inputs=["X", "bias?"], outputs=["Y"], groups=_ELEM,
      dtypes={"X": FLOATS}, shape=lambda ins, a: [(ins[0].shape, ins[0].dtype)], vector_ops=7,
      reference=fast_gelu,
      cpu_factory=lambda p: _cpu_gelu(p, "tanh", lambda x, b=None: x if b is None else _add(x, b)))
ms_op("quick_gelu", "QuickGelu", inputs=["X"], outputs=["Y"], attrs={"alpha": 1.702},
      groups=_ELEM, dtypes={"X": FLOATS}, vector_ops=5, reference=quick_gelu)
ms_op("bias_add", "BiasAdd", inputs=["X", "bias", "skip"], outputs=["Y"], groups={"elementwise"},
      dtypes={"X": FLOATS}, shape=_bias_rule, macs=2, reference=bias_add)
ms_op("bias_split_gelu", "BiasSplitGelu", inputs=["X", "bias"], outputs=["Y"], groups=set(),
      dtypes={"X": FLOATS}, shape=_split_rule, vector_ops=8, reference=bias_split_gelu)
