"""Quantized matrix products: QGemm (`quantize_static` QOperator on Gemm), DynamicQuantizeMatMul
and MatMulIntegerToFloat (ONNX Runtime's fusions of `quantize_dynamic`'s DynamicQuantizeLinear
-> MatMulInteger -> Cast -> Mul, saved by its session optimizer), DynamicQuantizeLSTM
(`quantize_dynamic` on LSTM).

The integer products are exact (int32); scaling to float is float32, as ONNX Runtime's MLAS
output processors do it. Every kernel is written `*_with(mm, ...)` over an integer matmul `mm`:
the reference passes MatMulInteger's reference kernel, the cpu backend its float-BLAS one
(backends/cpu/ops/intops.py), so both compute the same integers.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ..backends.reference.kernels.sequence_models import _activations
from ._common import F32, cpu_int_matmul, dynamic_params, int_matmul, matmul_shape, ms_op, quantize, requantize, scalar

Q8 = ("u8", "i8")


class _Transposed:
    """b.T made contiguous once per constant weight (an int8 matmul wants (K, N) rows)."""

    def __init__(self):
        self.cache: dict = {}

    def __call__(self, b):
        hit = self.cache.get(id(b))
        if hit is not None and hit[0] is b:
            return hit[1]
        bt = np.ascontiguousarray(b.T)
        if len(self.cache) < 32:
            self.cache[id(b)] = (b, bt)  # holds b, so its id stays its own
        return bt


def _per_column(p):
    """A scale or zero point: a scalar, or one value per output column (N,)."""
    p = np.asarray(p)
    return p.reshape(()) if p.size == 1 else p.reshape(-1)


# ------------------------------------------------------------------ QGemm

def qgemm_with(mm, transpose, a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None, *,
               alpha, transA, transB):
    # acc = (A - za)(B - zb) + C (C is int32 at scale sa * sb); the result is
    # alpha * sa * sb * acc, in float32, or requantized to y_scale / y_zero_point.
    a = np.ascontiguousarray(a.T) if transA else a
    b = transpose(b) if transB else b
    acc = mm(a, b, a_zp.reshape(()), _per_column(b_zp))
    if c is not None:
        acc = acc + c.astype(np.int32)
    mult = F32(alpha) * F32(scalar(a_scale)) * _per_column(b_scale).astype(F32)
    if y_zp is not None:
        return requantize(acc, mult / F32(scalar(y_scale)), y_zp)
    return acc.astype(F32) * mult


def _qgemm_rule(ins, a):
    sa, sb = ins[0].shape, ins[3].shape
    if len(sa) != 2 or len(sb) != 2:
        raise ValueError(f"A and B must be 2-D, got {list(sa)} and {list(sb)}")
    m, k = (sa[1], sa[0]) if a["transA"] else sa
    kb, n = (sb[1], sb[0]) if a["transB"] else sb
    if isinstance(k, int) and isinstance(kb, int) and k != kb:
        raise ValueError(f"inner dimensions differ: A gives K={k}, B gives K={kb}")
    out = ins[8].dtype if len(ins) > 8 and ins[8] is not None else "f32"
    return [((m, n), out)]


def _gemm_macs(a, ins, outs):
    k = ins[0][0] if a["transA"] else ins[0][1]
    return outs[0][0] * outs[0][1] * k


ms_op("qgemm", "QGemm", inputs=["A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point", "C?",
                                "y_scale?", "y_zero_point?"],
      attrs={"alpha": 1.0, "transA": 0, "transB": 0}, groups={"matmul", "mac", "quant"},
      dtypes={"A": Q8, "B": Q8, "C": ("i32",)}, shape=_qgemm_rule, macs=_gemm_macs, unit="matrix",
      reference=partial(qgemm_with, int_matmul, lambda b: np.ascontiguousarray(b.T)),
      cpu_factory=lambda program: partial(qgemm_with, cpu_int_matmul(program), _Transposed()))


# ------------------------------------------------------------------ dynamic / integer-to-float matmuls

def _matmul_rule(i_b=1):
    def rule(ins, a, node):
        return [(matmul_shape(ins[0].shape, ins[i_b].shape, node), "f32")]
    return rule


def _matmul_macs(a, ins, outs):
    return int(np.prod(outs[0])) * ins[0][-1]


def dynamic_quantize_matmul_with(mm, a, b, b_scale, b_zp=None, bias=None):
    # A is quantized to uint8 on the fly over its whole range (widened to hold 0).
    a_scale, a_zp = dynamic_params(a)
    aq = quantize(a, a_scale, a_zp)
    acc = mm(aq, b, np.asarray(a_zp), None if b_zp is None else _per_column(b_zp))
    y = acc.astype(F32) * (a_scale * _per_column(b_scale).astype(F32))
    return y if bias is None else y + bias.astype(F32)


def matmul_integer_to_float_with(mm, a, b, a_scale, b_scale, a_zp=None, b_zp=None, bias=None):
    acc = mm(a, b, None if a_zp is None else a_zp.reshape(()), None if b_zp is None else _per_column(b_zp))
    y = acc.astype(F32) * (F32(scalar(a_scale)) * _per_column(b_scale).astype(F32))
    return y if bias is None else y + bias.astype(F32)


ms_op("dynamic_quantize_matmul", "DynamicQuantizeMatMul", inputs=["A", "B", "b_scale", "b_zero_point?", "bias?"],
      groups={"matmul", "mac", "quant"}, dtypes={"A": ("f32",), "B": Q8}, shape=_matmul_rule(),
      macs=_matmul_macs, unit="matrix", reference=partial(dynamic_quantize_matmul_with, int_matmul),
      cpu_factory=lambda program: partial(dynamic_quantize_matmul_with, cpu_int_matmul(program)))
ms_op("matmul_integer_to_float", "MatMulIntegerToFloat",
      inputs=["A", "B", "a_scale", "b_scale", "a_zero_point?", "b_zero_point?", "bias?"],
      groups={"matmul", "mac", "quant"}, dtypes={"A": Q8, "B": Q8}, shape=_matmul_rule(),
      macs=_matmul_macs, unit="matrix", reference=partial(matmul_integer_to_float_with, int_matmul),
      cpu_factory=lambda program: partial(matmul_integer_to_float_with, cpu_int_matmul(program)))


# ------------------------------------------------------------------ DynamicQuantizeLSTM

def dq_gemm(mm, x, w, w_scale, w_zp):
    """x (M, K) float @ w (K, N) quantized, the way ONNX Runtime's quantized LSTM does each
    GEMM: x quantized to uint8 over its whole range, w's first zero point, per-column scales."""
    x_scale, x_zp = dynamic_params(x)
    acc = mm(quantize(x, x_scale, x_zp), w, np.asarray(x_zp), np.asarray(w_zp.reshape(-1)[0]))
    return acc.astype(F32) * (x_scale * np.asarray(w_scale, F32))


def dynamic_quantize_lstm_with(mm, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
                               w_scale=None, w_zp=None, r_scale=None, r_zp=None, *, hidden_size, direction,
                               activations, activation_alpha, activation_beta, clip, input_forget):
    # x (S, B, I); w (D, I, 4H) and r (D, H, 4H) quantized (transposed from ONNX LSTM's
    # (D, 4H, I)), scales and zero points (D,) or (D, 4H); gates i, o, f, c as in LSTM.
    seq, batch, _ = x.shape
    dirs, hid = w.shape[0], r.shape[1]
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], dirs)
    lens = np.full(batch, seq) if sequence_lens is None else sequence_lens.astype(np.int64)
    y = np.zeros((seq, dirs, batch, hid), F32)
    hs, cs = [], []
    for d in range(dirs):
        f, g, hact = acts[d]
        reverse = direction == "reverse" or d == 1
        h = np.zeros((batch, hid), F32) if initial_h is None else initial_h[d].astype(F32).copy()
        c = np.zeros((batch, hid), F32) if initial_c is None else initial_c[d].astype(F32).copy()
        bias = np.zeros(8 * hid, F32) if b is None else b[d].astype(F32)
        pi, po, pf = np.split(np.zeros(3 * hid, F32) if p is None else p[d].astype(F32), 3)
        # Row b reads its steps reversed within its own length when going backwards.
        steps = np.array([[lens[k] - 1 - t if reverse and t < lens[k] else t for k in range(batch)]
                          for t in range(seq)])
        xs = x[steps, np.arange(batch)] if reverse else x
        # One GEMM over the steps up to the longest sequence: one quantization range for all.
        top = int(min(seq, lens.max(initial=0)))
        proj = np.zeros((seq, batch, 4 * hid), F32)
        proj[:top] = dq_gemm(mm, xs[:top].reshape(top * batch, -1).astype(F32), w[d], w_scale[d],
                             w_zp[d]).reshape(top, batch, 4 * hid)
        proj += bias[:4 * hid] + bias[4 * hid:]
        for t in range(top):
            live = lens > t
            # ONNX Runtime reads h from the previous step's output, where rows already past
            # their length are zeros: they count as zeros in the quantization range.
            h_in = h if t == 0 else np.where((lens > t - 1)[:, None], h, F32(0))
            gates = proj[t] + dq_gemm(mm, h_in, r[d], r_scale[d], r_zp[d])
            gi, go, gf, gc = np.split(gates, 4, axis=1)
            cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
            i = f(cl(gi + pi * c))
            fg = 1.0 - i if input_forget else f(cl(gf + pf * c))
            c_new = (fg * c + i * g(cl(gc))).astype(F32)
            o = f(cl(go + po * c_new))
            h_new = (o * hact(c_new)).astype(F32)
            h = np.where(live[:, None], h_new, h)
            c = np.where(live[:, None], c_new, c)
            rows = np.nonzero(live)[0]
            y[steps[t, rows], d, rows] = h[rows]
        hs.append(h)
        cs.append(c)
    return y, np.stack(hs), np.stack(cs)


def _lstm_rule(ins, a):
    x, w, r = ins[0], ins[1], ins[2]
    if len(x.shape) != 3 or len(w.shape) != 3 or len(r.shape) != 3:
        raise ValueError(f"X, W and R must be 3-D, got {list(x.shape)}, {list(w.shape)}, {list(r.shape)}")
    if a["direction"] not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"unknown direction {a['direction']!r}")
    d = 2 if a["direction"] == "bidirectional" else 1
    h = a["hidden_size"] or r.shape[1]
    s, b = x.shape[0], x.shape[1]
    return [((s, d, b, h), "f32"), ((d, b, h), "f32"), ((d, b, h), "f32")]


def _lstm_macs(a, ins, outs):
    x, w, r = ins[0], ins[1], ins[2]
    return x[0] * x[1] * w[0] * w[2] * (w[1] + r[1])


ms_op("dynamic_quantize_lstm", "DynamicQuantizeLSTM",
      inputs=["X", "W", "R", "B?", "sequence_lens?", "initial_h?", "initial_c?", "P?", "W_scale", "W_zero_point",
              "R_scale", "R_zero_point"], outputs=["Y?", "Y_h?", "Y_c?"],
      attrs={"hidden_size": None, "direction": "forward", "activations": None, "activation_alpha": None,
             "activation_beta": None, "clip": None, "input_forget": 0},
      groups={"recurrent", "mac", "quant"}, dtypes={"X": ("f32",), "W": Q8, "R": Q8}, shape=_lstm_rule,
      macs=_lstm_macs, unit="matrix", reference=partial(dynamic_quantize_lstm_with, int_matmul),
      cpu_factory=lambda program: partial(dynamic_quantize_lstm_with, cpu_int_matmul(program)))
