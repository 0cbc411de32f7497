"""Small-image vision kernels of the cpu backend against the reference kernels, on fresh random
non-zero inputs: the im2col + sgemm conv path (nativeconv._gemm, chosen by gemm_chosen for
strided convs and small images at one thread; strides, asymmetric and SAME padding, dilation,
1x1, no bias, batch 2, every epilogue), and cpu/ops/vision.py's separable max_pool (bit-exact:
max is associative) and cached nearest-resize map. conv_gemm.c: tests/test_cpu_native.py."""
from __future__ import annotations

import numpy as np
import pytest

from npurun.backends.cpu import native, nativeconv
from npurun.backends.cpu.ops import vision
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
        got = nativeconv.conv2d(x, w, b, attrs, act, ACT_ATTRS.get(act, {}), 1, cache, algo="gemm")
        np.testing.assert_allclose(got, _ref(want, act), rtol=1e-4, atol=3e-5, err_msg=f"act={act}")
    assert "gemm" in cache


def test_gemm_rule():
    s2 = (3, 3, 2, 2, 1, 1, 1, 1)
    assert nativeconv.gemm_chosen(64, 128, 1, s2, 20, 20)       # strided: the gather is scalar
    assert nativeconv.gemm_chosen(128, 128, 1, (3, 3, 1, 1, 1, 1, 1, 1), 10, 10)  # small image
    assert not nativeconv.gemm_chosen(64, 64, 1, (3, 3, 1, 1, 1, 1, 1, 1), 40, 40)  # Winograd's
    assert not nativeconv.gemm_chosen(32, 32, 1, (1, 1, 1, 1, 1, 1, 0, 0), 80, 80)
    assert not nativeconv.gemm_chosen(64, 64, 4, s2, 20, 20)    # grouped


POOLS = [  # x shape, attrs
    ((1, 16, 10, 10), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),                # YOLOv8n's SPPF
    ((2, 3, 13, 17), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((1, 4, 12, 9), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    ((1, 5, 11, 11), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 9, 14), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ((2, 3, 8, 11), {"kernel_shape": [2, 4], "pads": [1, 0, 0, 2]}),                   # stride 1, flat passes
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "ceil_mode": 1}),
    ((1, 6, 40, 57), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),  # a TF stem's
    ((1, 3, 20, 45), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    ((2, 2, 33, 50), {"kernel_shape": [3, 3], "strides": [3, 3], "ceil_mode": 1}),
    ((1, 2, 5, 41), {"kernel_shape": [7, 7], "strides": [4, 4], "pads": [3, 3, 3, 3]}),  # window > image
    ((1, 17, 70, 70), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # big enough for two threads
    ((1, 8, 28, 31), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # a ResNet stem's
    ((1, 4, 23, 23), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),       # Caffe's (MTCNN)
]


def _pool_attrs(a):
    return {"strides": None, "pads": None, "dilations": None, "ceil_mode": 0, "auto_pad": "NOTSET", **a}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("special", [None, np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("case", range(len(POOLS)))
def test_max_pool_matches_reference(case, compiled, special, threads, rng, monkeypatch):
    """Both the compiled kernel (csrc/pool.c) and the NumPy passes, bit for bit: NaNs
    propagate as in the reference, infinities are values (the C kernel's fast pass notices
    both and does the plane again)."""
    shape, a = POOLS[case]
    x = nonzero_normal(rng, shape)
    if special is not None:
        x.reshape(-1)[rng.integers(0, x.size, 3)] = special
    if not compiled:
        monkeypatch.setattr(vision.native, "LIB", None)
    elif vision.native.LIB is None:
        pytest.fail(f"the compiled kernels are not built here ({vision.native.REASON})")
    got = vision._max_pool(x, **_pool_attrs(a), threads=threads)
    want = KERNELS["max_pool"](x, **_pool_attrs(a))
    np.testing.assert_array_equal(got, want)


def test_max_pool_with_dilation_falls_back(rng):
    x = nonzero_normal(rng, (1, 3, 12, 12))
    a = _pool_attrs({"kernel_shape": [3, 3], "dilations": [2, 2]})
    np.testing.assert_array_equal(vision._max_pool(x, **a), KERNELS["max_pool"](x, **a))


RESIZES = [  # x shape, scales or sizes, attrs
    ((1, 8, 10, 10), np.array([1, 1, 2, 2], np.float32), None, {}),                  # YOLOv8n's upsample
    ((2, 3, 7, 5), np.array([1, 1, 2.5, 1.5], np.float32), None,
     {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ((1, 2, 9, 6), None, np.array([1, 2, 4, 13], np.int64), {"coordinate_transformation_mode": "align_corners"}),
    ((1, 2, 6, 8), None, np.array([5, 3], np.int64), {"axes": [2, 3], "nearest_mode": "ceil"}),
    ((1, 3, 6, 6), np.array([1, 1, 0.5, 0.7], np.float32), None,
     {"coordinate_transformation_mode": "pytorch_half_pixel"}),
]


@pytest.mark.parametrize("case", range(len(RESIZES)))
def test_nearest_resize_matches_reference(case, rng):
    shape, scales, sizes, extra = RESIZES[case]
    a = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor",
         "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0, "antialias": 0, "axes": None,
         "keep_aspect_ratio_policy": "stretch", **extra}
    for _ in range(2):  # the second call takes the cached map
        x = nonzero_normal(rng, shape)
        got = vision._resize(x, None, scales, sizes, **a)
        np.testing.assert_array_equal(got, KERNELS["resize"](x, None, scales, sizes, **a))


def test_linear_resize_and_channel_resize_fall_back(rng):
    """A float64 linear resize and a nearest resize of the channel axis run the reference."""
    x = nonzero_normal(rng, (1, 2, 5, 6)).astype(np.float64)
    a = {"mode": "linear", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor",
         "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0, "antialias": 0, "axes": None,
         "keep_aspect_ratio_policy": "stretch"}
    s = np.array([1, 1, 2, 2], np.float32)
    np.testing.assert_array_equal(vision._resize(x, None, s, None, **a), KERNELS["resize"](x, None, s, None, **a))
    x = x.astype(np.float32)
    a["mode"] = "nearest"
    s = np.array([1, 2, 1, 1], np.float32)
    np.testing.assert_array_equal(vision._resize(x, None, s, None, **a), KERNELS["resize"](x, None, s, None, **a))


@pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 96, 112, 112), (2, 144, 13, 11), (1, 1152, 7, 7), (3, 5, 9), (1, 7, 3, 3, 3),
                                   (2, 3, 1, 1)])
def test_global_average_pool_and_trailing_mean_match_reference(shape, threads, rng):
    """csrc/pool.c's plane means (float32, 32 lanes of partial sums; the planes on the pool at 2
    threads) against the reference's float64 mean; the same bits on 1 and 2 threads. A big
    ReduceMean over the trailing axes takes the same kernel (shape_fast.py)."""
    from npurun.backends.cpu.ops import shape_fast
    x = nonzero_normal(rng, shape) + 0.5  # (a mean far from 0: a relative bound means something)
    want = KERNELS["global_average_pool"](x)
    got = vision._global_average_pool(x, threads=threads)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * float(np.abs(x).mean()))
    assert np.array_equal(got, vision._global_average_pool(x, threads=1))
    axes = np.array(list(range(2, len(shape)))[::-1])
    for keep in (0, 1):
        m = shape_fast._reduce_mean(x, axes, keepdims=keep, noop_with_empty_axes=0, threads=threads)
        ref = KERNELS["reduce_mean"](x, axes, keepdims=keep, noop_with_empty_axes=0)
        assert m.shape == ref.shape
        np.testing.assert_allclose(m, ref, rtol=2e-6, atol=2e-6 * float(np.abs(x).mean()))
