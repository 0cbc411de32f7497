"""Exact emulation of a node's precision, for every backend built on `Program`.

`emulating(node, fn, graph)` returns the kernel a step runs instead of `fn`:

* `f16` / `bf16`: float operands are rounded to the storage type, the backend's own fp32
  kernel computes (fp32 accumulation), results are rounded to the storage type again. Values
  stay float32 arrays holding exactly representable fp16/bf16 numbers.
* `i8`, `i8acc16`, `i16` on conv / matmul / gemm with constant weights: the node computes
  DequantizeLinear(QLinearConv(QuantizeLinear(x), w_q, b_q)) — see quantize.py for the
  conventions. Integer sums are formed in floating point only where that is exact: float32
  BLAS in runs of input channels whose sums stay below 2**24, float64 otherwise (every
  partial sum is an integer below 2**53: |x_q| <= 65535, |w_q| <= 127).
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
    raise BackendError(f"{graph.source}: {node.label()}: no emulation of precision {p} for op "
                       f"{node.op}; integer precisions apply to conv, matmul and gemm only")


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
    v = graph.values[name]
    if not v.calib:
        raise BackendError(f"{graph.source}: {node.label()} runs {node.precision} but value {name!r} "
                           f"has no calibrated range; compile it with calibration (npurun compile --calibrate)")
    return q.act_params(v.calib, bits)


def _const(graph, node, name, role):
    v = graph.values.get(name) if name else None
    if v is None or not v.is_const:
        raise BackendError(f"{graph.source}: {node.label()} runs {node.precision} but its {role} "
                           f"{name!r} is not a constant; integer precisions need constant weights")
    return v.data


class _IntKernel:
    """Shared set-up: activation and output parameters, quantized weights, the proof."""

    def __init__(self, node, graph, wk):
        self.node, self.source = node, graph.source
        self.bits = 16 if node.precision == "i16" else 8
        self.xs, self.xz = _params(graph, node, node.inputs[0], self.bits)
        self.ys, self.yz = _params(graph, node, node.outputs[0], self.bits)
        # wk: (M, K) quantized weights in accumulation order, for the 16-bit proof
        self.saturate = node.precision == "i8acc16" and q.acc16_overflow(wk) is not None

    def _out(self, acc, mult):
        yq = q.requantize(acc, mult, self.yz, self.bits)
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
        self.wq, self.ws = q.weight_params(w, axis=0)  # (M, C/g, *K), (M,)
        super().__init__(node, graph, self.wq.reshape(self.wq.shape[0], -1))
        b = node.inputs[2] if len(node.inputs) > 2 else ""
        bias = _const(graph, node, b, "bias") if b else None
        acc_scale = np.float64(self.xs) * self.ws.astype(np.float64)  # (M,)
        self.bq = None if bias is None else np.rint(bias.astype(np.float64) / acc_scale).astype(np.int64)
        self.mult = acc_scale / np.float64(self.ys)

    def __call__(self, x, w, b=None, **attrs):
        from ..backends.reference.kernels.nn import conv
        attrs = {k: v for k, v in attrs.items() if not k.startswith("_")}
        xq = q.quantize_act(x, self.xs, self.xz, self.bits)
        if self.saturate:
            acc = _saturating_conv(xq, self.xz, self.wq, attrs)
        else:  # exact: (x_q - zp) padded with 0 equals x_q padded with zp, minus zp * sum(w)
            acc = self._exact_conv(xq - self.xz, attrs, conv)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if self.bq is not None:
            acc = acc + self.bq.reshape(shape)
        return self._out(acc, self.mult.reshape(shape))


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
        self.wq, self.ws = q.weight_params(wkn, axis=1)
        super().__init__(node, graph, self.wq.T)
        self.alpha, self.beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        self.trans_a = bool(attrs.get("trans_a"))
        acc_scale = np.float64(self.xs) * self.ws.astype(np.float64) * self.alpha  # (N,)
        c = node.inputs[2] if self.gemm and len(node.inputs) > 2 else ""
        cv = graph.values[c] if c else None
        self.cq = None
        if cv is not None and cv.is_const:
            self.cq = np.rint(self.beta * cv.data.astype(np.float64) / acc_scale).astype(np.int64)
        self.acc_scale = acc_scale
        self.mult = acc_scale / np.float64(self.ys)

    def __call__(self, a, b, c=None, **attrs):
        if self.trans_a:
            a = a.T
        aq = q.quantize_act(a, self.xs, self.xz, self.bits)
        if self.saturate:
            acc = _saturating_matmul(aq, self.xz, self.wq)
        else:
            acc = np.matmul((aq - self.xz).astype(np.float64), self.wq.astype(np.float64))
        if self.cq is not None:
            acc = acc + self.cq
        elif c is not None:  # a computed addend joins in real numbers before requantization
            real = acc * self.acc_scale + self.beta * c.astype(np.float64)
            yq = np.clip(np.rint(real / np.float64(self.ys)) + self.yz, 0, q.ACT_QMAX[self.bits]).astype(np.int64)
            return q.dequantize(yq, self.ys, self.yz)
        return self._out(acc, self.mult)


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
