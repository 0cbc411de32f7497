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

A conv inside a region (an `if` branch) has no per-node `_cache` (CpuProgram gives one only
to its top-level steps), so its weights would be packed on every run; this kernel keeps the
packing per weight array instead (keyed by identity, the constants being the same arrays on
every run), bounded to PACKS entries.
"""
from __future__ import annotations

import numpy as np

from ...reference.kernels.nn import _window_pads

SMALL_MACS = 8 << 20
PACKS = 64


def make(program):
    conv = program._conv  # the CpuProgram's conv: compiled kernels, epilogues, packing
    packs: dict = {}  # id(w) -> (w, b, cache) for convs without a per-node cache

    def run(x, w, b=None, *, _act=None, _act_attrs=None, _cache=None, **attrs):
        if _cache is None:
            hit = packs.get(id(w))
            if hit is None or hit[0] is not w or hit[1] is not b:
                if len(packs) >= PACKS:
                    packs.pop(next(iter(packs)))
                hit = packs[id(w)] = (w, b, {})
            _cache = hit[2]
        if x.ndim != 3 or x.dtype != np.float32 or w.dtype != np.float32:
            return conv(x, w, b, _act=_act, _act_attrs=_act_attrs, _cache=_cache, **attrs)
        ks = list(attrs.get("kernel_shape") or w.shape[2:])
        (p0,), (p1,), (lo,), (s,), (d,) = _window_pads(x.shape, ks, attrs.get("strides"), attrs.get("dilations"),
                                                      attrs.get("pads"), attrs.get("auto_pad", "NOTSET"))
        n, c, length = x.shape
        m, cg, k = w.shape
        group = attrs.get("group", 1)
        if group == 1 and n * m * lo * c * k <= SMALL_MACS and lo > 0:
            y = _im2col(x, w, b, p0, p1, s, d, lo)
            # A fused activation (region convs are fused too) runs as its unfused step would:
            # the compiled kernel's ~20-45 us fixed cost is what the small path avoids.
            return y if _act is None else _reference_act(y, _act, _act_attrs)
        a4 = {**attrs, "kernel_shape": [1, k], "strides": [1, s], "dilations": [1, d],
              "pads": [0, p0, 0, p1], "auto_pad": "NOTSET"}
        y = conv(x[:, :, None, :], w[:, :, None, :], b, _act=_act, _act_attrs=_act_attrs, _cache=_cache, **a4)
        return y[:, :, 0, :]
    return run


def _im2col(x, w, b, p0, p1, s, d, lo):
    """y (N, M, Lout) = w (M, C*K) @ taps (N, C*K, Lout); pads (p0, p1) may include the extra
    end padding _window_pads adds so the last window fits."""
    n, c, length = x.shape
    m, _, k = w.shape
    if p0 or p1:
        xp = np.zeros((n, c, length + p0 + p1), np.float32)
        xp[:, :, p0:p0 + length] = x
    else:
        xp = np.ascontiguousarray(x)
    st = xp.strides
    # the taps as a strided view of xp; np.ndarray over the buffer costs ~1 us where
    # as_strided costs ~5 us (silero runs 6 of these a chunk)
    cols = np.ndarray((n, c, k, lo), xp.dtype, xp, 0, (st[0], st[1], st[2] * d, st[2] * s)).reshape(n, c * k, lo)
    y = np.matmul(w.reshape(m, c * k), cols)
    if b is not None:
        y += b.reshape(m, 1)
    return y


def _reference_act(y, act, act_attrs):
    from .. import _reference_act as ref_act  # the cpu package imports this module
    return ref_act(y, act, act_attrs)


KERNELS = {"conv": make}
