"""The cpu backend's im2col + BLAS conv path (nativeconv._gemm, chosen by gemm_chosen for
strided convs and small images at one thread) against the reference conv, on fresh random
inputs: strides, asymmetric and SAME padding, dilation, 1x1, no bias, batch 2, every epilogue."""
from __future__ import annotations

import numpy as np
import pytest

from npurun.backends.cpu import native, nativeconv
from npurun.backends.reference.kernels import KERNELS

from conftest import nonzero_normal

pytestmark = pytest.mark.skipif(native.LIB is None, reason="compiled kernels not built")

# (x shape, w shape, strides, pads, dilations, auto_pad)
CASES = [((1, 16, 20, 20), (32, 16, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], "NOTSET"),
         ((2, 8, 11, 9), (12, 8, 3, 3), [2, 1], [1, 0, 0, 2], [1, 1], "NOTSET"),
         ((1, 24, 10, 10), (40, 24, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], "NOTSET"),
         ((1, 40, 10, 10), (24, 40, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], "NOTSET"),
         ((1, 8, 13, 17), (16, 8, 5, 5), [3, 2], [0, 0, 0, 0], [1, 1], "SAME_UPPER"),
         ((1, 8, 12, 12), (16, 8, 3, 3), [1, 1], [2, 2, 2, 2], [2, 2], "NOTSET")]
ACTS = [None, "relu", "silu", "hard_swish", "clip"]
ACT_ATTRS = {"clip": {"_min": -0.3, "_max": 0.4}}


def _ref(y, act):
    if act is None:
        return y
    if act == "silu":
        return y * KERNELS["sigmoid"](y)
    if act == "clip":
        return np.clip(y, -0.3, 0.4)
    return KERNELS[act](y)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("bias", [True, False])
def test_gemm_conv_matches_reference(case, bias, rng):
    xs, ws, st, pads, dil, auto = CASES[case]
    x, w = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3
    b = nonzero_normal(rng, ws[:1]) if bias else None
    attrs = {"group": 1, "strides": st, "pads": pads, "dilations": dil, "auto_pad": auto,
             "kernel_shape": list(ws[2:])}
    want = KERNELS["conv"](x, w, b, **attrs)
    cache = {}
    for act in ACTS:  # one cache: the [W | bias] matrix is built once
        got = nativeconv.conv2d(x, w, b, attrs, act, ACT_ATTRS.get(act, {}), None, 1, cache, algo="gemm")
        np.testing.assert_allclose(got, _ref(want, act), rtol=1e-4, atol=3e-5, err_msg=f"act={act}")
    assert "gemm" in cache


def test_gemm_rule():
    s2 = (3, 3, 2, 2, 1, 1, 1, 1)
    assert nativeconv.gemm_chosen(64, 128, 1, s2, 20, 20)       # strided: the gather is scalar
    assert nativeconv.gemm_chosen(128, 128, 1, (3, 3, 1, 1, 1, 1, 1, 1), 10, 10)  # small image
    assert not nativeconv.gemm_chosen(64, 64, 1, (3, 3, 1, 1, 1, 1, 1, 1), 40, 40)  # Winograd's
    assert not nativeconv.gemm_chosen(32, 32, 1, (1, 1, 1, 1, 1, 1, 0, 0), 80, 80)
    assert not nativeconv.gemm_chosen(64, 64, 4, s2, 20, 20)    # grouped
