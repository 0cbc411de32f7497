"""Data-aware int8 weight rounding (GPTQ / OBQ) for the integer nodes of a compiled graph.

    refine_weights(g, feeds)   # after select_precision: g's i8 / i16 / i8acc16 conv & matmul nodes

Plain rounding (`quantize.weight_params`) makes each weight the nearest point of its channel's
int8 grid. What matters is the layer's *output*: GPTQ (Frantar et al. 2022, after Optimal
Brain Quantization) rounds the weights of a layer one input column at a time and spreads each
column's rounding error onto the columns not yet rounded, so that `W_q x` stays close to `W x`
on the calibration inputs x. Per layer (K = C/group * kh * kw for conv, the K of the (K, N)
weight for matmul/gemm):

  H = sum over calibration positions of x x^T               (K, K), x the im2col column
                                                             of the *quantized* input, as the
                                                             integer kernel sees it
  H += 1% of mean(diag H) * I                               (damping: H is often singular)
  U = upper Cholesky factor of H^-1
  for k in 0..K-1:   q_k = clip(rint(w_k / s), -127, 127)    (w_k: column k, all channels)
                     e_k = (w_k - s q_k) / U[k, k]
                     w_j -= e_k U[k, j]   for j > k

The per-channel scales s are `weight_params`'s (MSE-optimal thresholds). Everything is
deterministic: fixed feeds, float64 arithmetic, no random choices.

The result is stored in the graph so that the .npuir and every backend use the same integers:
the weight constant's data becomes the dequantized weights `s * q` (float32; `rint(data / s)`
recovers q exactly, |q| <= 127) and its `calib` records `w8=[s_0, s_1, ...]`, the channel
scales, which `quantize.recorded_scale` reads back; the node's `why` says "GPTQ-rounded".
Skipped (plain rounding stays): a weight constant shared with another node, a grouped conv,
gemm with trans_a, K > `K_MAX` (H would be too large), fewer than `MIN_POSITIONS * K`
calibration positions (H would fit the few samples; the `why` says so), and an i8acc16 node
whose refined weights no longer pass the 16-bit accumulation proof.
"""
from __future__ import annotations

import math

import numpy as np

from ..backends.base import Program, check_inputs
from ..backends.reference.kernels import KERNELS
from ..backends.reference.kernels.nn import _taps, _window_pads
from ..ir.graph import Graph
from . import quantize as q

K_MAX = 2304          # H is K x K float64: 42 MB at this K
DAMP = 0.01
MIN_POSITIONS = 8     # calibration positions per weight of a channel: below, H over-fits them
_INT = {"i8": 8, "i8acc16": 8, "i16": 16}
_CHUNK = 1 << 14      # positions per H update (bounds the float64 im2col copy)


def candidates(g: Graph) -> list:
    """The integer conv/matmul/gemm nodes whose weights GPTQ can refine."""
    readers = g.consumers()
    out = []
    for n in g.nodes:
        if _INT.get(n.precision) is None or n.op not in ("conv", "matmul", "gemm"):
            continue
        w = g.values[n.inputs[1]]
        if len(readers.get(w.name, [])) != 1 or "w8" in w.calib:
            continue
        if n.op == "conv" and n.attrs.get("group", 1) != 1:
            continue
        if n.op == "gemm" and n.attrs.get("trans_a", 0):
            continue
        if _k(n, w.data) > K_MAX:
            continue
        out.append(n)
    return out


def _k(n, w) -> int:
    if n.op == "conv":
        return math.prod(w.shape[1:])
    return w.shape[1] if n.op == "gemm" and n.attrs.get("trans_b", 0) else w.shape[0]


def refine_weights(g: Graph, feeds: list[dict]) -> list[str]:
    """GPTQ-round the weights of every candidate node (see the module docstring) on `feeds`.
    Returns the names of the nodes refined."""
    nodes = candidates(g)
    if not nodes:
        return []
    hess = _hessians(g, nodes, feeds)
    done = []
    for n in nodes:
        h, positions = hess[id(n)]
        if positions < MIN_POSITIONS * len(h):
            n.why += (f"; weights plainly rounded (GPTQ needs {MIN_POSITIONS}x as many calibration positions "
                      f"as the {len(h)} weights per channel, got {positions})")
            continue
        if _refine(g, n, h):
            n.why += "; weights GPTQ-rounded on the calibration inputs"
            done.append(n.name or n.op)
    return done


def _hessians(g: Graph, nodes, feeds) -> dict:
    """id(node) -> H (K, K) float64, summed over every position of every feed."""
    from .calibrate import _float_copy
    by_input: dict[str, list] = {}
    for n in nodes:
        by_input.setdefault(n.inputs[0], []).append(n)
    hess = {id(n): np.zeros((_k(n, g.values[n.inputs[1]].data),) * 2) for n in nodes}
    count = {id(n): 0 for n in nodes}

    def add(name, x):
        for n in by_input.get(name, []):
            bits = _INT[n.precision]
            s, z = q.act_params(g.values[name].calib, bits)
            xd = q.dequantize(q.quantize_act(x, s, z, bits), s, z)  # what the integer kernel sees
            for cols in _columns(n, xd, g.values[n.inputs[1]].data.shape):  # (K, P) chunks
                c = cols.astype(np.float64)
                hess[id(n)] += c @ c.T
                count[id(n)] += c.shape[1]

    def observing(n, fn):
        def run(*args, **kw):
            if n.inputs and n.inputs[0] in by_input:
                add(n.inputs[0], args[0])
            return fn(*args, **kw)
        return run

    prog = Program(_float_copy(g), KERNELS, "reference")
    prog.steps = [(n, observing(n, fn), attrs, dead) for n, fn, attrs, dead in prog.steps]
    for f in feeds:
        prog.run(check_inputs(g, f))
    return {k: (h, count[k]) for k, h in hess.items()}


def _columns(n, x, wshape):
    """The node's input as (K, P) columns in the weight's reduction order, in chunks."""
    if n.op == "conv":
        return _conv_columns(n, x, list(n.attrs.get("kernel_shape") or wshape[2:]))
    a = x.reshape(-1, x.shape[-1])  # (positions, K)
    return (a[i:i + _CHUNK].T for i in range(0, len(a), _CHUNK))


def _conv_columns(n, x, ks):
    attrs = n.attrs
    begin, end, out, strides, dilations = _window_pads(x.shape, ks, attrs.get("strides"), attrs.get("dilations"),
                                                       attrs.get("pads"), attrs.get("auto_pad", "NOTSET"))
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
    b, c = x.shape[:2]
    p = math.prod(out)
    # (N, C, taps, P) -> (N, C * taps, P): the weight's (C, kh, kw) order
    cols = np.stack([xs.reshape(b, c, p) for _, xs in _taps(xp, ks, strides, dilations, out)], axis=2)
    cols = cols.reshape(b, c * cols.shape[2], p)
    for i in range(b):
        for a in range(0, p, _CHUNK):
            yield cols[i, :, a:a + _CHUNK]


def _refine(g: Graph, n, h: np.ndarray) -> bool:
    wv = g.values[n.inputs[1]]
    w = wv.data
    if n.op == "conv":
        wmk = w.reshape(w.shape[0], -1)                      # (M, K)
    elif n.op == "gemm" and n.attrs.get("trans_b", 0):
        wmk = w                                              # (N, K)
    else:
        wmk = w.T                                            # (K, N) -> (N, K)
    _, scale = q.weight_params(wmk, axis=0)
    wq = gptq(wmk, scale, h)
    if n.precision == "i8acc16" and q.acc16_overflow(wq) is not None:
        return False
    deq = (wq.astype(np.float32) * scale[:, None]).astype(np.float32)
    if n.op == "conv":
        new = deq.reshape(w.shape)
    elif n.op == "gemm" and n.attrs.get("trans_b", 0):
        new = deq
    else:
        new = np.ascontiguousarray(deq.T)
    wv.data = new.astype(w.dtype)
    wv.calib = {**wv.calib, "w8": [float(s) for s in scale]}
    return True


def gptq(w: np.ndarray, scale: np.ndarray, h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """Int weights (M, K) int64 for float weights w (M, K) and channel scales (M,), minimising
    || (w - scale * q) x ||^2 over inputs with second moment h (K, K), greedily (GPTQ)."""
    w = w.astype(np.float64).copy()
    s = scale.astype(np.float64)[:, None]
    h = h.astype(np.float64).copy()
    dead = np.diag(h) == 0          # inputs never non-zero: their weights cannot matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h[np.diag_indices_from(h)] += damp * float(np.mean(np.diag(h)))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: h^-1 = u^T u
    out = np.empty(w.shape, np.int64)
    for k in range(w.shape[1]):
        col = w[:, k]
        qk = np.clip(np.rint(col / s[:, 0]), -q.W_QMAX, q.W_QMAX)
        out[:, k] = qk
        err = (col - qk * s[:, 0]) / u[k, k]
        w[:, k + 1:] -= np.outer(err, u[k, k + 1:])
    return out
