"""Exact emulation of a node's precision, for every backend built on `Program`.

`emulating(node, fn, graph)` returns the kernel a step runs instead of `fn`:

* `f16` / `bf16`: float operands are rounded to the storage type, the backend's own fp32
  kernel computes (fp32 accumulation), results are rounded to the storage type again. Values
  stay float32 arrays holding exactly representable fp16/bf16 numbers.
* `i8`, `i8acc16`, `i16` on conv / matmul / gemm with constant weights: the node computes
  DequantizeLinear(QLinearConv(QuantizeLinear(x), w_q, b_q)) — see quantize.py for the
  conventions. Weights refined by gptq.py carry their scales (`w8`) and lie on that grid.
  With a fused epilogue (a tanh / sigmoid / relu reader at an integer suffix, set by
  select_precision) the node skips its requantization and hands on the accumulator's real
  value `acc * x_scale * w_scale` (float32); the activation node applies itself in float64 and
  requantizes once to its own result's parameters. Integer sums are formed in floating point only where that is exact: float32
  BLAS in runs of input channels whose sums stay below 2**24, float64 otherwise (every
  partial sum is an integer below 2**53: |x_q| <= 65535, |w_q| <= 127).
  A node whose input has no calibrated range (hand-written `conv_i8` in .npuir, or a graph
  given a precision without `npurun.compile`) is quantized dynamically, per run, as ONNX's
  DynamicQuantizeLinear -> ConvInteger/MatMulInteger -> scale does (the ort and torch
  backends export such nodes that way): activation range from the tensor itself, result
  left real (not requantized) when the result has no range either.
  `i8acc16` saturates each pair sum to int16 (vpmaddubsw); where the weights prove that no
  pair can overflow (quantize.acc16_overflow) the saturation cannot trigger and the exact
  int32 path runs; a node forced to i8acc16 against the proof takes the saturating path and
  shows its errors.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ..errors import BackendError
from . import quantize as q

INT_PRECISIONS = ("i8", "i8acc16", "i16")
# Activations a conv/matmul/gemm can apply to its accumulator before requantizing (float64).
EPILOGUE_OPS = {"tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
                "relu": lambda x: np.maximum(x, 0.0)}
_STORE = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def emulating(node, fn, graph):
    """The kernel that runs `node` at `node.precision` (fn itself for f32 / no precision)."""
    p = node.precision
    if p in (None, "f32"):
        return fn
    if p in _STORE:
        return _rounding(fn, _STORE[p])
    if p in INT_PRECISIONS:
        if node.op == "conv":
            return _IntConv(node, graph)
        if node.op in ("matmul", "gemm"):
            return _IntMatmul(node, graph)
        if node.op in EPILOGUE_OPS:
            return _Epilogue(node, graph)
    raise BackendError(f"{graph.source}: {node.label()}: no emulation of precision {p} for op "
                       f"{node.op}; integer precisions apply to conv, matmul and gemm (and tanh, "
                       f"sigmoid, relu fused as their epilogue) only")


def _round(a, store):
    if isinstance(a, np.ndarray) and a.dtype == np.float32:
        return a.astype(store).astype(np.float32)
    return a


def _rounding(fn, store):
    def run(*args, **kw):
        res = fn(*[_round(a, store) for a in args], **kw)
        return tuple(_round(r, store) for r in res) if isinstance(res, tuple) else _round(res, store)
    return run


def _params(graph, node, name, bits):
    """(scale, zero point) from the value's calibrated range, or (None, None): no range, so the
    value is quantized dynamically (see _dynamic)."""
    v = graph.values[name]
    if not v.calib:
        return None, None
    return q.act_params(v.calib, bits)


def _dynamic(x: np.ndarray, bits: int) -> tuple[np.float32, int]:
    """Run-time (scale, zero point) of an uncalibrated activation, as ONNX's
    DynamicQuantizeLinear defines them (range widened to include 0; what the ort and torch
    backends export for such a node): scale = (max - min) / qmax, zp = rint(-min / scale)."""
    # float32 throughout, as the operator's definition computes it
    lo = np.minimum(np.float32(0), x.min(initial=np.float32(0)).astype(np.float32))
    hi = np.maximum(np.float32(0), x.max(initial=np.float32(0)).astype(np.float32))
    qmax = q.ACT_QMAX[bits]
    scale = np.float32((hi - lo) / np.float32(qmax)) if hi > lo else np.float32(1.0)
    zp = int(np.clip(np.rint(np.float32(0) - lo / scale), 0, qmax))
    return scale, zp


def _const(graph, node, name, role):
    v = graph.values.get(name) if name else None
    if v is None or not v.is_const:
        raise BackendError(f"{graph.source}: {node.label()} runs {node.precision} but its {role} "
                           f"{name!r} is not a constant; integer precisions need constant weights")
    return v.data


def _epilogue_of(node, graph):
    """The activation node fused into `node`'s epilogue (select_precision.py), or None."""
    readers = [r for r in graph.nodes if node.outputs[0] in r.inputs]
    if len(readers) == 1 and readers[0].op in EPILOGUE_OPS and readers[0].precision in INT_PRECISIONS:
        return readers[0]
    return None


class _IntKernel:
    """Shared set-up: activation and output parameters, quantized weights, the proof."""

    def __init__(self, node, graph, wk):
        self.node, self.source = node, graph.source
        self.bits = 16 if node.precision == "i16" else 8
        self.xs, self.xz = _params(graph, node, node.inputs[0], self.bits)
        # fused: the result is the accumulator's real value, `acc * x_scale * w_scale` as
        # float32, and the activation node reading it requantizes (class _Epilogue)
        self.fused = _epilogue_of(node, graph) is not None
        if not self.fused:  # ys None: no calibrated range, so the result stays real (dynamic)
            self.ys, self.yz = _params(graph, node, node.outputs[0], self.bits)
        # wk: (M, K) quantized weights in accumulation order, for the 16-bit proof
        self.saturate = node.precision == "i8acc16" and q.acc16_overflow(wk) is not None

    def _out(self, acc, acc_scale):
        """acc: integer accumulators (float64 holding integers); acc_scale: x_scale * w_scale,
        broadcastable. Requantized and dequantized, or, fused, the real value for the epilogue."""
        if self.fused or self.ys is None:
            return (acc * acc_scale).astype(np.float32)
        yq = q.requantize(acc, acc_scale / np.float64(self.ys), self.yz, self.bits)
        return q.dequantize(yq, self.ys, self.yz)


class _Epilogue:
    """A tanh / sigmoid / relu fused into the integer conv/matmul/gemm that produces its input:
    x is that node's accumulator as a real number (`acc * x_scale * w_scale`, float32); the
    activation is computed in float64 and requantized once, ONNX-style (`rint(y / y_scale) +
    y_zp`, saturated), to this node's own result parameters; the result is dequantized."""

    def __init__(self, node, graph):
        prod = next((p for p in graph.nodes if node.inputs[0] in p.outputs), None)
        if prod is None or prod.precision not in INT_PRECISIONS or prod.op not in ("conv", "matmul", "gemm") \
                or _epilogue_of(prod, graph) is not node:
            raise BackendError(f"{graph.source}: {node.label()}: {node.op} at {node.precision} is only valid as "
                               f"the fused epilogue of an integer conv/matmul/gemm that it alone reads")
        self.fn = EPILOGUE_OPS[node.op]
        self.bits = 16 if node.precision == "i16" else 8
        self.ys, self.yz = _params(graph, node, node.outputs[0], self.bits)

    def __call__(self, x, **attrs):
        y = self.fn(x.astype(np.float64))
        if self.ys is None:  # no calibrated range: the result stays real (dynamic)
            return y.astype(np.float32)
        yq = np.clip(np.rint(y / np.float64(self.ys)) + self.yz, 0, q.ACT_QMAX[self.bits]).astype(np.int64)
        return q.dequantize(yq, self.ys, self.yz)


F32_EXACT = 1 << 24  # float32 holds every integer up to 2**24: integer sums below it are exact


def _exact_chunks(bound: int, parts: int) -> list[tuple[int, int]]:
    """Split `parts` input channels, each adding at most `bound` in magnitude, into runs whose
    float32 sums stay exact; [] if even one channel cannot."""
    step = F32_EXACT // max(1, bound)
    if step < 1:
        return []
    return [(a, min(parts, a + step)) for a in range(0, parts, step)]


class _IntConv(_IntKernel):
    def __init__(self, node, graph):
        w = _const(graph, node, node.inputs[1], "weight")
        self.wq, self.ws = q.weight_params(w, 0, q.recorded_scale(graph.values[node.inputs[1]]))  # (M, C/g, *K), (M,)
        super().__init__(node, graph, self.wq.reshape(self.wq.shape[0], -1))
        b = node.inputs[2] if len(node.inputs) > 2 else ""
        bias = _const(graph, node, b, "bias") if b else None
        self.bias = None if bias is None else bias.astype(np.float64)
        if self.xs is not None:
            self.acc_scale, self.bq = self._scales(self.xs)

    def _scales(self, xs):
        acc_scale = np.float64(xs) * self.ws.astype(np.float64)  # (M,)
        return acc_scale, None if self.bias is None else np.rint(self.bias / acc_scale).astype(np.int64)

    def __call__(self, x, w, b=None, **attrs):
        from ..backends.reference.kernels.nn import conv
        attrs = {k: v for k, v in attrs.items() if not k.startswith("_")}
        xs, xz, acc_scale, bq = (self.xs, self.xz, self.acc_scale, self.bq) if self.xs is not None \
            else (*_dynamic(x, self.bits), *self._scales(_dynamic(x, self.bits)[0]))
        xq = q.quantize_act(x, xs, xz, self.bits)
        if self.saturate:
            acc = _saturating_conv(xq, xz, self.wq, attrs)
        else:  # exact: (x_q - zp) padded with 0 equals x_q padded with zp, minus zp * sum(w)
            acc = self._exact_conv(xq - xz, attrs, conv)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if bq is not None:
            acc = acc + bq.reshape(shape)
        return self._out(acc, acc_scale.reshape(shape))


    def _exact_conv(self, xc, attrs, conv):
        """Integer conv of centred activations: float32 BLAS (the reference kernel) in runs of
        input channels whose partial sums provably stay below 2**24, added in float64; else
        float64. (Not the cpu backend's compiled conv: its float32 arithmetic is not exact on
        integers.)"""
        wq = self.wq
        taps = math.prod(wq.shape[2:])
        bound = q.ACT_QMAX[self.bits] * q.W_QMAX * taps  # per input channel
        runs = _exact_chunks(bound, wq.shape[1]) if attrs.get("group", 1) == 1 else []
        if not runs:
            return conv(xc.astype(np.float64), wq.astype(np.float64), None, **attrs)
        acc = None
        for a, b in runs:
            part = conv(np.ascontiguousarray(xc[:, a:b], np.float32),
                        np.ascontiguousarray(wq[:, a:b], np.float32), None, **attrs).astype(np.float64)
            acc = part if acc is None else acc + part
        return acc


class _IntMatmul(_IntKernel):
    """matmul (a @ b) and gemm (alpha * a' @ b' + beta * c) with a constant b."""

    def __init__(self, node, graph):
        b = _const(graph, node, node.inputs[1], "weight")
        a = graph.values[node.inputs[0]]
        self.gemm = node.op == "gemm"
        attrs = {**{"alpha": 1.0, "beta": 1.0, "trans_a": 0, "trans_b": 0}, **node.attrs} if self.gemm else {}
        if b.ndim != 2 or (not self.gemm and len(a.shape) < 2):
            raise BackendError(f"{graph.source}: {node.label()}: integer matmul needs a 2-D constant "
                               f"weight and an activation of rank >= 2")
        wkn = b.T if attrs.get("trans_b") else b  # (K, N)
        self.wq, self.ws = q.weight_params(wkn, 1, q.recorded_scale(graph.values[node.inputs[1]]))
        super().__init__(node, graph, self.wq.T)
        self.alpha, self.beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        self.trans_a = bool(attrs.get("trans_a"))
        c = node.inputs[2] if self.gemm and len(node.inputs) > 2 else ""
        cv = graph.values[c] if c else None
        self.c_const = cv.data.astype(np.float64) if cv is not None and cv.is_const else None
        if self.xs is not None:
            self.acc_scale, self.cq = self._scales(self.xs)

    def _scales(self, xs):
        acc_scale = np.float64(xs) * self.ws.astype(np.float64) * self.alpha  # (N,)
        cq = None if self.c_const is None else np.rint(self.beta * self.c_const / acc_scale).astype(np.int64)
        return acc_scale, cq

    def __call__(self, a, b, c=None, **attrs):
        if self.trans_a:
            a = a.T
        xs, xz, acc_scale, cq = (self.xs, self.xz, self.acc_scale, self.cq) if self.xs is not None \
            else (*_dynamic(a, self.bits), *self._scales(_dynamic(a, self.bits)[0]))
        aq = q.quantize_act(a, xs, xz, self.bits)
        if self.saturate:
            acc = _saturating_matmul(aq, xz, self.wq)
        else:
            acc = np.matmul((aq - xz).astype(np.float64), self.wq.astype(np.float64))
        if cq is not None:
            acc = acc + cq
        elif c is not None:  # a computed addend joins in real numbers before requantization
            real = acc * acc_scale + self.beta * c.astype(np.float64)
            if self.fused or self.ys is None:
                return real.astype(np.float32)
            yq = np.clip(np.rint(real / np.float64(self.ys)) + self.yz, 0, q.ACT_QMAX[self.bits]).astype(np.int64)
            return q.dequantize(yq, self.ys, self.yz)
        return self._out(acc, acc_scale)


def _pair_sums(x_pairs_even, x_pairs_odd, w_even, w_odd):
    """sat16(x_2j * w_2j + x_2j+1 * w_2j+1), summed over j exactly (int64)."""
    s = x_pairs_even * w_even + x_pairs_odd * w_odd
    return np.clip(s, q.INT16_MIN, q.INT16_MAX).sum(axis=-2)


def _saturating_conv(xq, zp, wq, attrs):
    """Conv of u8 activations (padded with zp) and s8 weights with vpmaddubsw pair saturation,
    minus zp * sum(w). xq is (N, C, *S); wq is (M, C/g, *K). Returns float64 (N, M, *out)."""
    from ..backends.reference.kernels.nn import _taps, _window_pads
    ks = list(attrs.get("kernel_shape") or wq.shape[2:])
    begin, end, out, strides, dilations = _window_pads(xq.shape, ks, attrs.get("strides"), attrs.get("dilations"),
                                                       attrs.get("pads"), attrs.get("auto_pad", "NOTSET"))
    xp = np.pad(xq, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=zp)
    n, c = xq.shape[:2]
    m, g = wq.shape[0], attrs.get("group", 1)
    cg, p = c // g, math.prod(out)
    # cols is (N, g, C/g * taps, P) in the weight's (channel, tap) order
    taps = [xs.reshape(n, g, cg, p) for _, xs in _taps(xp, ks, strides, dilations, out)]
    cols = np.stack(taps, axis=3).reshape(n, g, cg * len(taps), p)
    wk = wq.reshape(g, m // g, -1)
    if wk.shape[-1] % 2:
        cols = np.concatenate([cols, np.zeros_like(cols[:, :, :1])], axis=2)
        wk = np.concatenate([wk, np.zeros_like(wk[..., :1])], axis=-1)
    we, wo = wk[..., 0::2, None], wk[..., 1::2, None]          # (g, M/g, K/2, 1)
    acc = np.empty((n, g, m // g, p), np.int64)
    step = max(1, (1 << 22) // max(1, wk.size))
    for a in range(0, p, step):
        xe, xo = cols[:, :, None, 0::2, a:a + step], cols[:, :, None, 1::2, a:a + step]  # (N, g, 1, K/2, p)
        acc[..., a:a + step] = _pair_sums(xe, xo, we, wo)
    acc -= zp * wq.reshape(g, m // g, -1).sum(-1)[None, :, :, None]
    return acc.reshape(n, m, *out).astype(np.float64)


def _saturating_matmul(aq, zp, wq):
    """(..., M, K) u8 @ (K, N) s8 with pair saturation along K, minus zp * sum(w)."""
    k = wq.shape[0]
    if k % 2:
        aq = np.concatenate([aq, np.zeros_like(aq[..., :1])], axis=-1)
        wq = np.concatenate([wq, np.zeros_like(wq[:1])], axis=0)
    lead, m = aq.shape[:-2], aq.shape[-2]
    a2 = aq.reshape(-1, m, aq.shape[-1])
    out = np.empty((a2.shape[0], m, wq.shape[1]), np.int64)
    step = max(1, (1 << 22) // max(1, wq.size))
    for r in range(0, m, step):
        xe, xo = a2[:, r:r + step, 0::2, None], a2[:, r:r + step, 1::2, None]  # (B, m, K/2, 1)
        out[:, r:r + step] = _pair_sums(xe, xo, wq[0::2], wq[1::2])
    out -= zp * wq.sum(0)
    return out.reshape(*lead, m, wq.shape[1]).astype(np.float64)
