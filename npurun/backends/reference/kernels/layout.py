"""Reference kernels of the blocked layouts (npurun/ir/ops/layout.py): pack, unpack, and the
ops on packed operands computed as unpack -> plain kernel (-> pack), which is obviously
right; bench/layouts.py times kernels that work on the blocked form directly."""
from __future__ import annotations

import numpy as np

from . import kernel
from .nn import conv


def pack_block4x4(w):
    """(K, N) -> (ceil(K/4), N, 4): w[4k + i, n] lands at [k, n, i]; K is zero-padded."""
    k, n = w.shape
    kp = -(-k // 4) * 4
    wp = np.zeros((kp, n), w.dtype)
    wp[:k] = w
    return np.ascontiguousarray(wp.reshape(kp // 4, 4, n).transpose(0, 2, 1))


def unpack_block4x4(wb, k):
    return np.ascontiguousarray(wb.transpose(0, 2, 1).reshape(-1, wb.shape[1])[:k])


def pack_nchwc(x, c):
    """(N, C, H, W) -> (N, ceil(C/c), H, W, c); C is zero-padded."""
    n, ch, h, w = x.shape
    cp = -(-ch // c) * c
    xp = np.zeros((n, cp, h, w), x.dtype)
    xp[:, :ch] = x
    return np.ascontiguousarray(xp.reshape(n, cp // c, c, h, w).transpose(0, 1, 3, 4, 2))


def unpack_nchwc(xb, size):
    n, cb, h, w, c = xb.shape
    return np.ascontiguousarray(xb.transpose(0, 1, 4, 2, 3).reshape(n, cb * c, h, w)[:, :size])


@kernel("layout_pack")
def layout_pack(x, *, layout, block):
    return pack_block4x4(x) if layout == "block4x4" else pack_nchwc(x, block)


@kernel("layout_unpack")
def layout_unpack(x, *, layout, block, size):
    return unpack_block4x4(x, size) if layout == "block4x4" else unpack_nchwc(x, size)


@kernel("matmul_block4x4")
def matmul_block4x4(a, b):
    return np.matmul(a, unpack_block4x4(b, a.shape[-1]))


@kernel("conv_nchwc")
def conv_nchwc(x, w, b=None, *, block, **attrs):
    y = conv(unpack_nchwc(x, w.shape[1]), w, b, **attrs)
    return pack_nchwc(y, block)
