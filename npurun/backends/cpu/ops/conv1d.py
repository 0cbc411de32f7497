"""1-D convolutions (audio models: silero-vad's STFT and encoder), and weight packing for the
convs of control-flow regions.

A 1-D conv (x (N, C, L), w (M, C/g, K)) used to fall to the reference kernel (one matmul
per tap plus `np.pad`: ~1 ms for silero's STFT conv, 1 -> 258 channels, K = 256, stride 128).
Here:

- small ones (MACs <= SMALL_MACS, group 1) are one im2col matmul: the padded input's taps
  as a strided view (N, C*K, Lout), copied once by the reshape, times the weights (M, C*K)
  through BLAS; silero's convs take 6-14 us instead of 30-1080 us, where the compiled
  kernel's fixed cost is ~20-45 us; a fused activation (relu, sigmoid: epilogue fusion
  applies to region steps too) follows as its reference kernel, as the unfused step would;
- larger or grouped ones run the compiled 2-D kernels as (N, C, 1, L) images with a (1, K)
  kernel.

Timings (1 thread, median of 300, the reference kernel / im2col / compiled 2-D, us):
1->258 K256 L640 s128: 1079 / 12.5 / 46; 129->128 K3 L4: 70 / 14 / 45; 64->64 K3 L1000:
285 / 211 / 198 (the crossover: ~8M MACs).

A conv with constant weights gets a cache of its own from CpuProgram.lower (regions' convs
too); one whose weights are an input packs them on each run.
"""
from __future__ import annotations

import numpy as np

from ...reference.kernels.elementwise import activate
from ...reference.kernels.nn import _window_pads
from .. import native

SMALL_MACS = 8 << 20


def make(program):
    conv = program._conv  # the CpuProgram's conv: compiled kernels, epilogues, packing

    def run(x, w, b=None, *, activation="", activation_params=(), _cache=None, **attrs):
        act = {"activation": activation, "activation_params": activation_params}
        _cache = {} if _cache is None else _cache
        if x.ndim != 3 or x.dtype != np.float32 or w.dtype != np.float32:
            return conv(x, w, b, _cache=_cache, **act, **attrs)
        # The window and the path, planned once per input shape (checked against the
        # attributes: a weight shared by two nodes may come with others)
        hit = _cache.get(("c1d", x.shape))
        if hit is None or hit[0] != attrs:
            hit = _cache[("c1d", x.shape)] = (dict(attrs), _plan(x.shape, w, attrs))
        plan = hit[1]
        if plan[0] == "im2col" and not native.CALLS.cheap:  # (in a replayed program: the compiled kernels')
            _, p0, p1, s, d, lo, k, _ = plan
            wt = _cache.get("im2col")
            if wt is None:
                wt = _cache["im2col"] = np.ascontiguousarray(w.reshape(w.shape[0], -1).T)
            y = _im2col(x, wt, b, p0, p1, s, d, lo, k)
            # A fused activation runs as its unfused step would: the compiled kernel's
            # ~20-45 us fixed cost is what the small path avoids.
            return y if not activation else _activate(y, activation, activation_params)
        y = conv(x[:, :, None, :], w[:, :, None, :], b, _cache=_cache, **act, **plan[-1])
        return y[:, :, 0, :]
    return run


def _plan(xshape, w, attrs):
    """("im2col", p0, p1, s, d, Lout, K, ...) for a small dense conv, else ("2d", ...); last,
    the attributes of the same conv on (N, C, 1, L) images (the compiled kernels' path)."""
    ks = list(attrs.get("kernel_shape") or w.shape[2:])
    (p0,), (p1,), (lo,), (s,), (d,) = _window_pads(xshape, ks, attrs.get("strides"), attrs.get("dilations"),
                                                  attrs.get("pads"), attrs.get("auto_pad", "NOTSET"))
    n, c, _ = xshape
    m, _, k = w.shape
    as_2d = {**attrs, "kernel_shape": [1, k], "strides": [1, s], "dilations": [1, d],
             "pads": [0, p0, 0, p1], "auto_pad": "NOTSET"}
    if attrs.get("group", 1) == 1 and n * m * lo * c * k <= SMALL_MACS and lo > 0:
        return ("im2col", p0, p1, s, d, lo, k, as_2d)
    return ("2d", as_2d)


def _im2col(x, wt, b, p0, p1, s, d, lo, k):
    """y (N, M, Lout) from taps (N, Lout, C*K) @ wt (C*K, M), wt the weights transposed once;
    pads (p0, p1) may include the extra end padding _window_pads adds so the last window fits.
    The product runs with the few output positions as rows: OpenBLAS takes (4, 387) @ (387, 128)
    in ~4 us where (128, 387) @ (387, 4) takes ~10 (silero's first encoder conv)."""
    n, c, length = x.shape
    if p0 or p1:
        xp = np.zeros((n, c, length + p0 + p1), np.float32)
        xp[:, :, p0:p0 + length] = x
    else:
        xp = np.ascontiguousarray(x)
    st = xp.strides
    # the taps as a strided view of xp; np.ndarray over the buffer costs ~1 us where
    # as_strided costs ~5 us (silero runs 6 of these a chunk)
    cols = np.ndarray((n, lo, c, k), xp.dtype, xp, 0, (st[0], st[2] * s, st[1], st[2] * d)).reshape(n, lo, c * k)
    y = np.matmul(cols, wt)
    if b is not None:
        y += b
    return y.transpose(0, 2, 1) if lo == 1 else np.ascontiguousarray(y.transpose(0, 2, 1))


def _activate(y, activation, params):
    from .. import native_activation  # (the cpu package imports this module)
    act, act_attrs = native_activation(activation, params)
    if act in CHEAP_IN_C and y.dtype == np.float32:  # NumPy's overflow-safe sigmoid: ~9 us
        code, alpha, beta = native.act_params(act, act_attrs)
        y = np.ascontiguousarray(y)
        native.LIB.npr_activation(native.ptr(y), native.ptr(y), y.size, code, alpha, beta)
        return y
    return activate(y, activation, params)


# activations whose C kernel (~2 us a call) beats the reference's NumPy even on a few elements
CHEAP_IN_C = {"sigmoid", "silu", "hard_sigmoid", "hard_swish"} if native.LIB is not None else set()


KERNELS = {"conv": make}
