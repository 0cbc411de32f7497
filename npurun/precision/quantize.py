"""Quantization arithmetic shared by the analyzer and the emulation.

Conventions (those of ONNX QuantizeLinear / QLinearConv, and of int8 NPUs):

* activations: per-tensor asymmetric, unsigned: `q = saturate(rint(x / scale) + zp)` with
  q in [0, 255] (int8 modes) or [0, 65535] (int16 activations, w8a16); the calibrated range
  is widened to include 0 so that 0 (zero padding) is exact; `rint` rounds half to even;
* weights: per output channel symmetric, signed, zero point 0: `q = clip(rint(w / s), -127,
  127)` with `s = t_c / 127`, t_c the channel's MSE-optimal clipping threshold (<= max|w_c|);
* bias: int32 (int64 for w8a16) with scale `x_scale * w_scale`, zero point 0;
* requantization: `y_q = saturate(rint(acc * x_scale * w_scale / y_scale) + y_zp)`, the real
  multiplier in float64, as the reference QLinearConv kernel does.

16-bit accumulation (INT8_ACC16) follows x86's vpmaddubsw: along the reduction axis K (for
conv the weight's (C/group, kh, kw) order, for matmul the K of (K, N)), adjacent products
(k = 2j, 2j+1) of an unsigned activation and a signed weight are summed and *saturated* to
int16; those pair sums then accumulate exactly in 32 bits. `acc16_overflow` proves, for
quantized weights and activations anywhere in [0, qmax], whether a pair sum can leave int16.
"""
from __future__ import annotations

import numpy as np

INT16_MIN, INT16_MAX = -32768, 32767
W_QMAX = 127  # symmetric int8 weights: -127..127 (never -128, so negation is exact)
ACT_QMAX = {8: 255, 16: 65535}


def bounds(calib: dict) -> tuple[float, float]:
    """The range a value is quantized over: the calibrated method's bounds, widened to 0."""
    method = calib.get("method", "minmax")
    lo, hi = {"minmax": ("min", "max"), "percentile": ("pmin", "pmax"),
              "mse": ("mse_min", "mse_max")}[method]
    return min(0.0, float(calib[lo])), max(0.0, float(calib[hi]))


def act_params(calib: dict, bits: int = 8) -> tuple[np.float32, int]:
    """(scale, zero point) of an unsigned asymmetric per-tensor quantization of `bits` bits;
    taken from the recorded `q8`/`q16` when the value has them, so a file keeps its scales."""
    key = f"q{bits}"
    if key in calib:
        s, z = calib[key]
        return np.float32(s), int(z)
    lo, hi = bounds(calib)
    qmax = ACT_QMAX[bits]
    scale = np.float32((hi - lo) / qmax) if hi > lo else np.float32(1.0)
    zp = int(np.clip(np.rint(-lo / np.float64(scale)), 0, qmax))
    return scale, zp


def quantize_act(x: np.ndarray, scale, zp: int, bits: int = 8) -> np.ndarray:
    """QuantizeLinear in float32 (x / scale, round half to even, + zp, saturate), as int64."""
    q = np.rint(x.astype(np.float32) / np.float32(scale)).astype(np.int64) + zp
    return np.clip(q, 0, ACT_QMAX[bits])


def weight_params(w: np.ndarray, axis: int = 0, scale=None) -> tuple[np.ndarray, np.ndarray]:
    """(w_q as int64, scale per channel along `axis` as float32): symmetric int8.

    `scale`, when given (a weight refined by gptq.py records its scales as `w8`), is used as
    it is: the weights then lie on its grid and rounding recovers their integers exactly.
    Otherwise each channel's clipping threshold is the one of `max|w| * r`, r in 1.00, 0.98, ..., 0.50,
    whose quantization has the least squared error on that channel's weights: a few large
    weights then cost a little clipping instead of coarser steps for all the others."""
    w = w.astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    if scale is not None:
        scale = np.asarray(scale, np.float32)
        return np.clip(np.rint(w / scale.reshape(shape)), -W_QMAX, W_QMAX).astype(np.int64), scale
    wc = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)  # (channels, weights per channel)
    amax = np.abs(wc).max(axis=1)
    best_err, best = np.full(len(amax), np.inf), amax.copy()
    for r in np.linspace(1.0, 0.5, 26, dtype=np.float32):
        s = np.where(amax > 0, amax * r / np.float32(W_QMAX), np.float32(1.0)).astype(np.float32)
        err = ((np.clip(np.rint(wc / s[:, None]), -W_QMAX, W_QMAX) * s[:, None] - wc) ** 2).sum(1)
        better = err < best_err
        best_err, best = np.where(better, err, best_err), np.where(better, s, best)
    scale = best.astype(np.float32)
    q = np.clip(np.rint(w / scale.reshape(shape)), -W_QMAX, W_QMAX).astype(np.int64)
    return q, scale


def recorded_scale(value):
    """A weight constant's recorded channel scales (`w8`, set by gptq.py), or None."""
    s = value.calib.get("w8") if value is not None else None
    return None if s is None else np.asarray(s, np.float32)


def requantize(acc: np.ndarray, mult: np.ndarray, zp: int, bits: int) -> np.ndarray:
    """Integer accumulators to `bits`-bit unsigned outputs (real multiplier in float64)."""
    return np.clip(np.rint(acc.astype(np.float64) * mult) + zp, 0, ACT_QMAX[bits]).astype(np.int64)


def dequantize(q: np.ndarray, scale, zp: int) -> np.ndarray:
    return (q - zp).astype(np.float32) * np.float32(scale)


def acc16_overflow(wk: np.ndarray, x_qmax: int = 255) -> tuple[int, int, int] | None:
    """None if no pair sum can leave int16, else (channel, pair, worst sum) of the worst pair.

    wk is (M, K): quantized weights per output channel in accumulation order. Activations are
    anywhere in [0, x_qmax]: the largest pair sum is x_qmax times the pair's positive weights,
    the smallest x_qmax times its negative ones."""
    m, k = wk.shape
    if k % 2:
        wk = np.concatenate([wk, np.zeros((m, 1), wk.dtype)], axis=1)
    pairs = wk.reshape(m, -1, 2).astype(np.int64)
    hi = np.clip(pairs, 0, None).sum(-1) * x_qmax   # (M, K/2)
    lo = np.clip(pairs, None, 0).sum(-1) * x_qmax
    worst = np.maximum(hi - INT16_MAX, INT16_MIN - lo)
    if worst.max() <= 0:
        return None
    c, j = np.unravel_index(int(worst.argmax()), worst.shape)
    s = int(hi[c, j]) if hi[c, j] > INT16_MAX else int(lo[c, j])
    return int(c), int(j), s


def acc16_headroom(wk: np.ndarray, x_qmax: int = 255) -> int:
    """The largest |pair sum| the weights allow (for the reason string of a safe node)."""
    m, k = wk.shape
    if k % 2:
        wk = np.concatenate([wk, np.zeros((m, 1), wk.dtype)], axis=1)
    pairs = wk.reshape(m, -1, 2).astype(np.int64)
    return int(max(np.clip(pairs, 0, None).sum(-1).max(), -np.clip(pairs, None, 0).sum(-1).min()) * x_qmax)
