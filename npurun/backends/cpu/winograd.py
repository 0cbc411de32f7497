"""Winograd F(4x4, 3x3) convolution for the cpu backend: when it is chosen, and its weights.

A 3x3 stride-1 dilation-1 dense conv computes each 4x4 output tile from a 6x6 input window
with 36 multiplies per (output channel, input channel) instead of 144 (csrc/winograd.c has
the algorithm). The transforms cost about C + M vector operations per pixel whatever the
channel counts, and the kernel computes whole vectors of tiles, so on a small image most of
the work can be padding; `chosen` weighs both, with thresholds set by measurement (docs/cpu.md,
"Winograd").

Accuracy: the transforms scale by up to 8, so F(4x4) loses about 5 bits: the error is
~5e-6 of the output's largest value on random inputs (F(2x2) would be ~3e-7 and the direct
kernel ~1e-7). That is within the 1e-4 relative error the backend allows; the tests check it.
"""
from __future__ import annotations

import numpy as np

# G of F(4x4, 3x3) with interpolation points 0, 1, -1, 2, -2, inf (Lavin & Gray, 2016).
G = np.array([[1 / 4, 0, 0],
              [-1 / 6, -1 / 6, -1 / 6],
              [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6],
              [1 / 24, -1 / 12, 1 / 6],
              [0, 0, 1]])

MIN_CHANNELS = 8   # C or M below this: the transforms outweigh the saved multiplies
MAX_WORK = 2.0     # Winograd's GEMM multiplies (padded tiles) over the direct conv's, at most
TILES_PER_VECTOR = {"avx2": 8, "avx512": 16}  # csrc/winograd.c: VL; a block is 4 vectors


def padded_tiles(tw: int, vl: int) -> int:
    """Tiles a row of `tw` 4x4 tiles costs in csrc/winograd.c: blocks of 4*vl tiles, the last
    one rounded up to 2*vl (the GEMM tile's width) or to vl (macro BLOCK)."""
    n = 0
    while tw > 0:
        b = 4 * vl if tw >= 4 * vl else vl if tw <= vl else -(-tw // (2 * vl)) * 2 * vl
        n, tw = n + b, tw - b
    return n


def work_ratio(ho: int, wo: int, vl: int) -> float:
    """Multiplies of Winograd's GEMMs (36 per 4x4 tile, padded tiles included) over the
    direct conv's (9 per pixel): 0.25 on a big image, more on a small one."""
    return 36 * -(-ho // 4) * padded_tiles(-(-wo // 4), vl) / (9 * ho * wo)


def chosen(c: int, m: int, group: int, geo: tuple, ho: int, wo: int, isa: str) -> bool:
    """The cost rule: Winograd for 3x3 stride-1 dilation-1 dense convs with C, M >= 8 whose
    padded work is at most MAX_WORK x the direct conv's (geo = kh, kw, sh, sw, dh, dw, pad
    top, pad left). Measured break-even (docs/cpu.md): work ratio ~2.5, C ~6."""
    return (geo[:6] == (3, 3, 1, 1, 1, 1) and group == 1 and min(c, m) >= MIN_CHANNELS
            and work_ratio(ho, wo, TILES_PER_VECTOR[isa]) <= MAX_WORK)


def pack(w: np.ndarray, b: np.ndarray | None, mr: int) -> tuple[np.ndarray, np.ndarray]:
    """U = G g G^T in float64, rounded once to float32 and packed as the kernel's GEMM
    reads it: (36 points, ceil(M/mr) blocks, C, mr), zero-padded; and the bias (M,)."""
    m, c = w.shape[:2]
    u = np.einsum("ik,mckl,jl->ijmc", G, w.astype(np.float64), G).reshape(36, m, c)
    mb = -(-m // mr)
    up = np.zeros((36, mb * mr, c), np.float64)
    up[:, :m] = u
    packed = np.ascontiguousarray(up.reshape(36, mb, mr, c).transpose(0, 1, 3, 2), np.float32)
    bias = np.zeros(m, np.float32) if b is None else np.ascontiguousarray(b, np.float32)
    return packed, bias
