"""Convolution for the cpu backend: banded im2col + one GEMM per band, with the bias and an
activation applied in the same pass (the epilogue), bands spread over the compute threads.

    x (N, C, H, W) --pad--> xp;  for each band of output rows [r0, r1):
        col (C*kh*kw, rows*Wo) <- kh*kw strided copies of xp   (never the whole image)
        y[n, :, r0:r1, :] = W (M, C*kh*kw) @ col ; += bias ; act(in place)

Each band's buffer stays a few MB, so the im2col matrix of a 4K image never exists whole, and
the GEMM, copies and activation of different bands run on different cores (NumPy releases the
GIL in all three). BLAS itself is held to one thread meanwhile, so cores are not oversubscribed.
Grouped/depthwise convolutions, and anything not 2-D, take the reference kernel.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from ..reference.kernels import _window_pads

BAND_BYTES = 4 << 20  # target size of one band's im2col buffer

# In-place activations the epilogue can apply: name -> fn(array) writing into the array.
EPILOGUES = {
    "relu": lambda a, attrs: np.maximum(a, 0, out=a),
    "tanh": lambda a, attrs: np.tanh(a, out=a),
    "sigmoid": lambda a, attrs: np.reciprocal(np.add(np.exp(np.negative(a, out=a), out=a), 1, out=a), out=a),
    "leaky_relu": lambda a, attrs: np.multiply(a, np.where(a < 0, np.float32(attrs["alpha"]), np.float32(1)), out=a),
}


def fast_conv_applies(x, w, attrs) -> bool:
    return (x.ndim == 4 and attrs["group"] == 1 and x.dtype == np.float32 and w.dtype == np.float32)


def conv2d(x, w, b, attrs, act=None, act_attrs=None, pool: ThreadPoolExecutor | None = None, threads: int = 1):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    begin, end, out, strides, dil = _window_pads(x.shape, [kh, kw], attrs["strides"], attrs["dilations"],
                                                 attrs["pads"], attrs["auto_pad"])
    ho, wo = out
    xp = np.pad(x, [(0, 0), (0, 0), (begin[0], end[0]), (begin[1], end[1])]) if any(begin + end) else x
    k = c * kh * kw
    wmat = np.ascontiguousarray(w.reshape(m, k))
    bias = None if b is None else b.reshape(m, 1).astype(np.float32)
    y = np.empty((n, m, ho, wo), np.float32)
    rows = max(1, min(ho, BAND_BYTES // (k * wo * 4)))
    if threads > 1:  # enough bands for every thread
        rows = max(1, min(rows, math.ceil(ho / (2 * threads))))
    pointwise = kh == kw == 1 and strides == [1, 1]
    (sh, sw), (dh, dw) = strides, dil

    def band(job):
        i, r0 = job
        r1 = min(ho, r0 + rows)
        if pointwise:
            col = xp[i, :, r0:r1, :].reshape(c, -1)  # a view when the input is contiguous
        else:
            col = np.empty((c, kh, kw, r1 - r0, wo), np.float32)
            for ky in range(kh):
                for kx in range(kw):
                    ys = r0 * sh + ky * dh
                    col[:, ky, kx] = xp[i, :, ys: ys + (r1 - r0 - 1) * sh + 1: sh,
                                        kx * dw: kx * dw + (wo - 1) * sw + 1: sw]
            col = col.reshape(k, -1)
        yb = y[i, :, r0:r1, :].reshape(m, -1)  # a view: rows of one band are contiguous
        np.matmul(wmat, col, out=yb)
        if bias is not None:
            yb += bias
        if act is not None:
            EPILOGUES[act](yb, act_attrs)

    jobs = [(i, r0) for i in range(n) for r0 in range(0, ho, rows)]
    with threadpool_limits(limits=1, user_api="blas"):
        if pool is None or threads == 1:
            for j in jobs:
                band(j)
        else:
            list(pool.map(band, jobs))
    return y
