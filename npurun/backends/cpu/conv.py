"""Convolution for the cpu backend where its compiled kernels are not built (or cannot run on
this CPU): band by band over output rows, with the bias and an activation applied in the
same pass (the epilogue).
Two algorithms, chosen per shape by what each copies per output pixel:

- **im2col** (kh*kw*C floats copied per pixel; best when C is small, e.g. ESPCN's first layer):
      col (C*kh*kw, rows*Wo) <- kh*kw strided copies of the padded input   (one band, never the image)
      y[n, :, r0:r1, :] = W (M, C*kh*kw) @ col
- **shifted taps** (stride 1; kh*kw*M floats accumulated per pixel; best when M < C): with the
  padded input flattened per channel (row pitch Wp), the input of tap (ky, kx) for a band is
  the *contiguous* slice starting at (r0+ky)*Wp+kx, so each tap is one GEMM on a view, with no
  copy: acc (M, rows*Wp) += W[:, :, ky, kx] (M, C) @ xflat[:, off:off+rows*Wp]. The Wp-Wo
  columns that wrap around a row end are computed and dropped.

Bands keep buffers to a few MB and run one after another; the GEMMs run on BLAS's own
threads (the program holds BLAS at its thread count): without the compiled library there is
no thread pool of npurun's own. Grouped/depthwise convolutions, and anything not 2-D, take the
reference kernel.
"""
from __future__ import annotations

import numpy as np

from ..reference.kernels.nn import _window_pads

BAND_BYTES = 4 << 20  # target size of one band's im2col buffer

# In-place activations the epilogue can apply: name -> fn(array) writing into the array.
EPILOGUES = {
    "relu": lambda a, attrs: np.maximum(a, 0, out=a),
    "tanh": lambda a, attrs: np.tanh(a, out=a),
    "sigmoid": lambda a, attrs: np.reciprocal(np.add(np.exp(np.negative(a, out=a), out=a), 1, out=a), out=a),
    "leaky_relu": lambda a, attrs: np.multiply(a, np.where(a < 0, np.float32(attrs["alpha"]), np.float32(1)), out=a),
}


def fast_conv_applies(x, w, attrs) -> bool:
    """Dense float32 2-D convs with something to sum (no input channels or no taps: the bias
    alone, the reference kernel's job, as in nativeconv.applies)."""
    return (x.ndim == 4 and attrs["group"] == 1 and x.dtype == np.float32 and w.dtype == np.float32
            and w.ndim == 4 and 0 not in w.shape[1:])


def conv2d(x, w, b, attrs, act=None, act_attrs=None):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    begin, end, out, strides, dil = _window_pads(x.shape, [kh, kw], attrs["strides"], attrs["dilations"],
                                                 attrs["pads"], attrs["auto_pad"])
    ho, wo = out
    (sh, sw), (dh, dw) = strides, dil
    pointwise = kh == kw == 1 and strides == [1, 1] and not any(begin + end)
    taps = not pointwise and strides == [1, 1] and m < c
    # One extra zero row at the bottom keeps the last band's wrapped tap slices in bounds.
    xp = _pad(x, begin, [end[0] + (1 if taps else 0), end[1]]) if any(begin + end) or taps else x
    hp, wp = xp.shape[2:]
    k = c * kh * kw
    wmat = np.ascontiguousarray(w.reshape(m, k))
    wtaps = [np.ascontiguousarray(w[:, :, ky, kx]) for ky in range(kh) for kx in range(kw)]
    bias = None if b is None else b.reshape(m, 1).astype(np.float32)
    y = np.empty((n, m, ho, wo), np.float32)
    per_row = (m * 2 * wp) if taps else (k * wo)
    rows = max(1, min(ho, BAND_BYTES // (per_row * 4)))

    def band(job):
        i, r0 = job
        r1 = min(ho, r0 + rows)
        if taps:
            xflat = xp[i].reshape(c, -1)
            span = (r1 - r0) * wp
            acc = np.empty((m, span), np.float32)
            tmp = np.empty((m, span), np.float32)
            for t, (ky, kx) in enumerate((ky, kx) for ky in range(kh) for kx in range(kw)):
                off = (r0 + ky * dh) * wp + kx * dw
                np.matmul(wtaps[t], xflat[:, off: off + span], out=tmp if t else acc)
                if t:
                    acc += tmp
            yb = y[i, :, r0:r1, :]
            yb[...] = acc.reshape(m, r1 - r0, wp)[:, :, :wo]
            yb = yb.reshape(m, -1)
            if bias is not None:
                yb += bias
            if act is not None:
                EPILOGUES[act](yb, act_attrs)
            return
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

    for i in range(n):
        for r0 in range(0, ho, rows):
            band((i, r0))
    return y


def _pad(x, begin, end):
    """Zero-pad the two spatial axes."""
    n, c, h, w = x.shape
    xp = np.zeros((n, c, h + begin[0] + end[0], w + begin[1] + end[1]), x.dtype)
    xp[:, :, begin[0]:begin[0] + h, begin[1]:begin[1] + w] = x
    return xp
