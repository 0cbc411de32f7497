"""ONNX Runtime's fused float ops, which its session optimizer writes into a saved model
(`SessionOptions.optimized_model_filepath` at ORT_ENABLE_EXTENDED): FusedMatMul (MatMul with
transposes and a scale folded in), FusedConv (Conv [+ Z] + activation) and FusedGemm (Gemm +
activation).

The cpu kernels run the cpu backend's own matmul and convolution (threads, packed weights),
then the elementwise rest; the reference kernels run the reference matmul, conv and gemm.
"""
from __future__ import annotations

import numpy as np

from ..backends.reference.kernels import KERNELS as REF
from ..ir.graph import Value
from ..ir.ops import _fail
from ..ir.ops.nn import _CONV_ATTRS, _conv_macs, _spatial
from ..ir.shapes import UNKNOWN
from ._common import matmul_shape, ms_op

FLOATS = ("f32", "f16", "f64")

# ONNX Runtime's MLAS activations: name -> (IR op, the parameter names in params order)
ACTIVATIONS = {"Relu": ("relu", ()), "Tanh": ("tanh", ()), "Sigmoid": ("sigmoid", ()),
               "LeakyRelu": ("leaky_relu", ("alpha",)), "Clip": ("clip", ("min", "max")),
               "HardSigmoid": ("hard_sigmoid", ("alpha", "beta"))}


def activate(y, activation, params):
    """y through a fused activation named as ONNX Runtime names them, with its parameters."""
    if not activation:
        return y
    op, names = ACTIVATIONS[activation]
    if op == "clip":
        lo, hi = params
        return REF["clip"](y, np.array(lo, y.dtype), np.array(hi, y.dtype))
    return REF[op](y, **dict(zip(names, params)))


def _check_activation(node, activation, params):
    if not activation:
        return
    if activation not in ACTIVATIONS:
        _fail(node, f"activation {activation!r}: expected one of {', '.join(ACTIVATIONS)}")
    want = ACTIVATIONS[activation][1]
    if len(params) != len(want):
        _fail(node, f"activation {activation} takes {len(want)} parameter(s) ({', '.join(want) or 'none'}), "
                    f"got {list(params)}")


# ------------------------------------------------------------------ FusedMatMul

def _logical(x, trans, trans_batch):
    # transBatch: x is stored (d0, d1, ..., M, K) as [d1, ..., d0, K]: dim 0 moves to rank-2
    if trans_batch and x.ndim >= 3:
        x = np.moveaxis(x, 0, -2)
    return np.swapaxes(x, -1, -2) if trans and x.ndim >= 2 else x


def _logical_shape(shape, trans, trans_batch):
    s = list(shape)
    if trans_batch and len(s) >= 3:
        s = s[1:-1] + [s[0], s[-1]]
    if trans and len(s) >= 2:
        s[-1], s[-2] = s[-2], s[-1]
    return tuple(s)


def fused_matmul_with(mm, a, b, *, alpha, transA, transB, transBatchA, transBatchB):
    y = mm(np.ascontiguousarray(_logical(a, transA, transBatchA)), np.ascontiguousarray(_logical(b, transB, transBatchB)))
    return y if alpha == 1.0 else (y * np.asarray(alpha, y.dtype)).astype(y.dtype)


def _fused_matmul_rule(ins, a, node):
    sa = _logical_shape(ins[0].shape, a["transA"], a["transBatchA"])
    sb = _logical_shape(ins[1].shape, a["transB"], a["transBatchB"])
    return [(matmul_shape(sa, sb, node), ins[0].dtype)]


def _cpu_matmul(program):
    from ..backends.cpu.ops import FACTORIES
    make = FACTORIES.get("matmul")
    return make(program) if make is not None else REF["matmul"]


ms_op("fused_matmul", "FusedMatMul", inputs=["A", "B"], outputs=["Y"],
      attrs={"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0},
      groups={"matmul", "mac"}, dtypes={"A": FLOATS + ("bf16",)}, shape=_fused_matmul_rule,
      macs=lambda a, ins, outs: int(np.prod(outs[0])) * (ins[0][-2] if a["transA"] else ins[0][-1]),
      unit="matrix", reference=lambda a, b, **at: fused_matmul_with(REF["matmul"], a, b, **at),
      cpu_factory=lambda program: (lambda a, b, **at: fused_matmul_with(_cpu_matmul(program), a, b, **at)))


# ------------------------------------------------------------------ FusedConv

_WINDOW = tuple(_CONV_ATTRS)


def fused_conv_with(conv, x, w, b=None, z=None, *, activation, activation_params, **window):
    y = conv(x, w, b, **window)
    if z is not None:
        y = (y + z).astype(y.dtype)
    return activate(y, activation, activation_params or [])


def _fused_conv_rule(ins, a, node):
    x, w = ins[0], ins[1]
    if w.shape is None:
        _fail(node, f"weight {w.name!r} has unknown rank")
    if x.shape is None:  # x has w's rank by definition, as for conv (an If's output, say)
        x = Value(x.name, (UNKNOWN,) * len(w.shape), x.dtype)
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        _fail(node, f"input rank {len(x.shape)} and weight rank {len(w.shape)} must match and be >= 3")
    _check_activation(node, a["activation"], a["activation_params"] or [])
    ks = a["kernel_shape"] or list(w.shape[2:])
    y = (x.shape[0], w.shape[0], *_spatial(node, a, x.shape, ks))
    if len(ins) > 3 and ins[3] is not None and ins[3].shape is not None and len(ins[3].shape) != len(y):
        _fail(node, f"Z {list(ins[3].shape)} must have the result's shape {list(y)}")
    return [(y, x.dtype)]


class _CpuConv:
    """The cpu backend's convolution, with a packed-weight cache per constant weight."""

    def __init__(self, program):
        self.program, self.caches, self.consts = program, {}, None

    def __call__(self, x, w, b=None, **window):
        if self.consts is None:  # the graph's constants (held, so their ids stay theirs)
            self.consts = {id(v.data): v.data for v in self.program.graph.constants() if v.data is not None}
        if self.consts.get(id(w)) is w:
            return self.program._conv(x, w, b, _cache=self.caches.setdefault(id(w), {}), **window)
        return self.program._conv(x, w, b, **window)


def _cpu_fused_conv(program):
    conv = _CpuConv(program)
    return lambda *args, **attrs: fused_conv_with(conv, *args, **attrs)


ms_op("fused_conv", "FusedConv", inputs=["X", "W", "B?", "Z?"], outputs=["Y"],
      attrs={**_CONV_ATTRS, "activation": "", "activation_params": None}, groups={"conv", "mac"},
      dtypes={"X": FLOATS}, shape=_fused_conv_rule, macs=_conv_macs, unit="matrix", any_rank=True,
      reference=lambda *args, **attrs: fused_conv_with(REF["conv"], *args, **attrs), cpu_factory=_cpu_fused_conv)


# ------------------------------------------------------------------ FusedGemm

def fused_gemm(a, b, c=None, *, alpha, beta, transA, transB, activation, activation_alpha, activation_beta,
               activation_gamma):
    y = REF["gemm"](a, b, c, alpha=alpha, beta=beta, trans_a=transA, trans_b=transB)
    params = {"LeakyRelu": [activation_alpha], "HardSigmoid": [activation_alpha, activation_beta],
              "Clip": [activation_alpha, activation_beta]}.get(activation, [])
    return activate(y, activation, params)


def _fused_gemm_rule(ins, a, node):
    arity = {"LeakyRelu": [0], "HardSigmoid": [0, 0], "Clip": [0, 0]}  # params come as attributes here
    _check_activation(node, a["activation"], arity.get(a["activation"], []))
    if a["activation"] in ("LeakyRelu", "HardSigmoid", "Clip") and a["activation_alpha"] is None:
        _fail(node, f"activation {a['activation']} needs activation_alpha")
    sa, sb = ins[0].shape, ins[1].shape
    if len(sa) != 2 or len(sb) != 2:
        _fail(node, f"A and B must be 2-D, got {list(sa)} and {list(sb)}")
    m = sa[1] if a["transA"] else sa[0]
    n = sb[0] if a["transB"] else sb[1]
    return [((m, n), ins[0].dtype)]


ms_op("fused_gemm", "FusedGemm", inputs=["A", "B", "C?"], outputs=["Y"],
      attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, "activation": "", "activation_alpha": None,
             "activation_beta": None, "activation_gamma": None},
      groups={"matmul", "mac"}, dtypes={"A": FLOATS}, shape=_fused_gemm_rule,
      macs=lambda a, ins, outs: outs[0][0] * outs[0][1] * (ins[0][0] if a["transA"] else ins[0][1]),
      unit="matrix", reference=fused_gemm)
