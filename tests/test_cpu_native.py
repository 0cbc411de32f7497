"""The cpu backend's compiled kernels (csrc/) against the reference kernels, on fresh random
non-zero inputs: dense/grouped conv as the implicit GEMM (both ISAs this CPU runs), depthwise
conv, the flat-pixel GEMM of conv_gemm.c, the activation kernel, and the epilogue fusions of
whole programs. Winograd: tests/test_cpu_winograd.py."""

import numpy as np
import pytest

import npurun
from npurun.backends.cpu import native, nativeconv
from npurun.errors import BackendError
from npurun.backends.reference.kernels import KERNELS
from npurun.ir import parse

from conftest import nonzero_normal

pytestmark = pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")

CONVS = [  # (N, C, H, W), (M, C/group, kh, kw), attrs
    ((1, 1, 37, 53), (64, 1, 5, 5), {"pads": [2, 2, 2, 2]}),                      # ESPCN's first layer
    ((2, 16, 19, 70), (9, 16, 3, 3), {"pads": [1, 1, 1, 1]}),                     # interior tiles + ragged M
    ((1, 8, 20, 17), (5, 8, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),
    ((1, 6, 15, 40), (4, 6, 3, 3), {"dilations": [2, 2]}),
    ((1, 12, 9, 61), (7, 12, 1, 1), {}),
    ((1, 3, 8, 8), (2, 3, 2, 4), {"auto_pad": "SAME_UPPER", "strides": [1, 2]}),
    ((1, 10, 13, 9), (4, 10, 3, 5), {"pads": [0, 2, 1, 1], "dilations": [1, 2]}),
    ((1, 8, 12, 50), (6, 4, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),           # grouped
    ((1, 6, 33, 35), (6, 1, 5, 5), {"group": 6, "pads": [2, 2, 2, 2]}),           # depthwise
    ((1, 5, 16, 21), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 17, 30), (4, 1, 3, 3), {"group": 4, "pads": [0, 0, 1, 1], "strides": [2, 2]}),  # TF "SAME", stride 2
    ((1, 3, 20, 23), (3, 1, 3, 3), {"group": 3, "pads": [2, 2, 2, 2], "dilations": [2, 2]}),  # dilated depthwise
    ((1, 4, 1, 90), (4, 1, 1, 21), {"group": 4, "pads": [0, 10, 0, 10]}),         # a long 1-D depthwise (FSMN)
    ((1, 2, 19, 19), (2, 1, 9, 9), {"group": 2, "pads": [4, 4, 4, 4]}),           # 81 taps: weights not held
    ((1, 3, 14, 25), (3, 1, 5, 5), {"group": 3, "pads": [1, 2, 2, 1], "strides": [3, 3]}),
    ((1, 12, 1, 40), (5, 12, 1, 3), {"pads": [0, 1, 0, 1]}),                      # one-row image (PP-OCR rec)
    ((1, 7, 1, 300), (6, 7, 1, 1), {}),                                            # flat pointwise, many bands
    ((2, 8, 3, 5), (5, 8, 1, 1), {"pads": [0, 0, 1, 1]}),                         # 1x1 padded at the end only
    ((1, 32, 1, 70), (5, 32, 1, 1), {"pads": [0, 0, 0, 2]}),                      # ... more pixels out than in
]
ACTS = [None, "relu", "tanh", "sigmoid", "leaky_relu", "clip", "hard_sigmoid", "hard_swish", "silu"]


def _attrs(a):
    return {"strides": None, "pads": None, "dilations": None, "group": 1, "kernel_shape": None,
            "auto_pad": "NOTSET", **a}


def _ref_act(y, act):
    if act is None:
        return y
    if act == "silu":
        return y * KERNELS["sigmoid"](y)
    if act == "clip":
        return KERNELS["clip"](y, np.array(-0.5, np.float32), np.array(0.7, np.float32))
    if act == "leaky_relu":
        return KERNELS[act](y, alpha=0.1)
    if act == "hard_sigmoid":
        return KERNELS[act](y, alpha=0.3, beta=0.4)
    return KERNELS[act](y)


ACT_ATTRS = {"leaky_relu": {"alpha": 0.1}, "clip": {"_min": -0.5, "_max": 0.7},
             "hard_sigmoid": {"alpha": 0.3, "beta": 0.4}}


def close(got, want_pre, act, atol=2e-5):
    np.testing.assert_allclose(got, _ref_act(want_pre, act), rtol=1e-4, atol=atol, err_msg=f"act={act}")


def check_conv(algo, x, w, b, attrs, want_pre, threads, isa, check=close, acts=ACTS):
    """nativeconv.conv2d with kernel `algo` forced, for each fused activation in `acts` (one
    weight cache across the calls: packed weights are reused), against the reference conv's
    result before the activation: `check(got, want_pre, act)`."""
    cache = {}
    for act in acts:
        got = nativeconv.conv2d(x, w, b, _attrs(attrs), act, ACT_ATTRS.get(act, {}), threads, cache, isa, algo)
        assert got.dtype == np.float32 and got.shape == want_pre.shape
        check(got, want_pre, act)


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_native_conv_matches_reference(case, threads, isa, rng, monkeypatch):
    xs, ws, a = CONVS[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.3
    b = nonzero_normal(rng, ws[:1])
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # split even these small convs
    if threads == 2:  # non-temporal stores (big outputs only, normally) on the aligned rows
        monkeypatch.setattr(nativeconv, "STREAM_BYTES", 0)
    # Winograd, smallc have their own tests (test_cpu_winograd.py, test_cpu_smallc.py)
    check_conv("direct", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, isa)


DEPTHWISE = [i for i, (xs, ws, a) in enumerate(CONVS) if a.get("group", 1) == xs[1] == ws[0] and ws[1] == 1]
DW_LANES = [  # blocks of 8 channels and a ragged one, 1-wide to 28-wide maps, strides 1-3
    ((1, 24, 7, 7), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),
    ((2, 13, 14, 14), (13, 1, 5, 5), {"group": 13, "pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((1, 9, 28, 9), (9, 1, 7, 7), {"group": 9, "pads": [3, 3, 3, 3]}),
    ((1, 16, 1, 1), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}),
    ((1, 40, 11, 6), (40, 1, 3, 3), {"group": 40, "pads": [0, 1, 1, 0], "strides": [3, 2], "dilations": [1, 2]}),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", [("corpus", i) for i in DEPTHWISE] + [("lanes", i) for i in range(len(DW_LANES))])
def test_depthwise_with_channels_in_lanes_matches_reference(case, threads, rng, monkeypatch):
    """dwconv_cl.c, forced: 8 channels a vector, the input transposed into a padded
    [H][W][8] buffer, eight output pixels at a time, bias and activation in the store."""
    xs, ws, a = (CONVS if case[0] == "corpus" else DW_LANES)[case[1]]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.3
    b = nonzero_normal(rng, ws[:1])
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # channel bands on the pool even here
    check_conv("dw_lanes", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, None)


@pytest.mark.skipif("avx512" not in native.conv_isas(), reason="this CPU has no AVX-512")
@pytest.mark.parametrize("k,s", [(3, 1), (3, 2), (5, 1), (5, 2), (7, 1)])
def test_depthwise_avx512_strips_are_the_avx2_kernel_bit_for_bit(k, s, rng):
    """Maps whose padded planes pass csrc/conv.c's DW_STRIP_BYTES go a strip of output rows at
    a time (rows shared by two strips copied again, padding rows zeroed per strip): the same
    bits as the AVX2 kernel, the reference's values; row counts off the strip and the 4-row
    block, asymmetric pads, odd widths."""
    for _ in range(3):
        c = int(rng.integers(1, 5))
        xs = (1, c, int(rng.integers(60, 131)), int(rng.integers(70, 151)))
        a = {"group": c, "strides": [s, s],
             "pads": [int(rng.integers(0, k)), int(rng.integers(0, k)), int(rng.integers(0, k)), int(rng.integers(0, k))]}
        x = nonzero_normal(rng, xs)
        w = nonzero_normal(rng, (c, 1, k, k)) * 0.3
        b = nonzero_normal(rng, (c,))
        got = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, 1, {}, "avx512", "direct")
        want = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, 1, {}, "avx2", "direct")
        np.testing.assert_array_equal(got, want, err_msg=f"{xs} k={k} {a}")
        close(got, KERNELS["conv"](x, w, b, **_attrs(a)), "relu")


@pytest.mark.skipif("avx512" not in native.conv_isas(), reason="this CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_lanes_16_are_the_8_lane_kernel_bit_for_bit(threads, rng):
    """dwconv_cl.c's kernel with 16 channels in the lanes (AVX-512) gives the 8-lane kernel's
    bits: each lane's bias, taps and activation in the same order; channel counts across block
    edges (1-40: partial blocks of 16 and of 8), strides, dilations, pads, activations."""
    for _ in range(25):
        c = int(rng.integers(1, 41))
        k = int(rng.choice([1, 3, 5, 7]))
        s, d = int(rng.choice([1, 2])), int(rng.choice([1, 1, 2]))
        xs = (int(rng.integers(1, 3)), c, int(rng.integers(k * d, 30)), int(rng.integers(k * d, 30)))
        a = {"group": c, "strides": [s, s], "dilations": [d, d], "pads": [int(p) for p in rng.integers(0, k, 4)]}
        x = nonzero_normal(rng, xs)
        w = nonzero_normal(rng, (c, 1, k, k)) * 0.3
        b = nonzero_normal(rng, (c,))
        for act in ("relu", "hard_swish", None):
            got = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, threads, {}, "avx512", "dw_lanes")
            want = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, threads, {}, "avx2", "dw_lanes")
            np.testing.assert_array_equal(got, want, err_msg=f"{xs} k={k} {a} {act}")
        close(got, KERNELS["conv"](x, w, b, **_attrs(a)), None)


@pytest.mark.skipif("avx512" not in native.conv_isas(), reason="this CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_flat_planes_are_the_per_channel_kernel_bit_for_bit(threads, rng, monkeypatch):
    """dwconv_flat.c (a small plane as one flat row of 16-output vectors, masked taps; stride 2
    through its phase planes): the per-channel AVX-512 kernel's bits and the reference's values;
    random small maps (1 to 32 wide, odd sizes, planes of 1 to 1024 outputs, across vector
    ends), windows 1-7 (3x3, 5x5, 7x7 unrolled, others at run time), asymmetric and negative
    pads, activations, channel bands on the pool; shapes it does not take are refused."""
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # channel bands on the pool even here
    ran = 0
    while ran < 30:
        c = int(rng.integers(1, 40))
        k = int(rng.choice([1, 2, 3, 3, 5, 7]))
        s = int(rng.choice([1, 2]))
        h, wd = int(rng.integers(max(1, k - 2), 33)), int(rng.integers(max(1, k - 2), 33))
        pads = [int(p) for p in rng.integers(-1 if s == 1 else 0, k, 4)]
        if s == 1:  # "same" along the width (what the kernel takes at stride 1)
            pads[1] = int(rng.integers(0, k))
            pads[3] = k - 1 - pads[1]
        a = {"group": c, "strides": [s, s], "pads": pads}
        ho = (h + pads[0] + pads[2] - k) // s + 1
        wo = (wd + pads[1] + pads[3] - k) // s + 1
        if ho < 2 or wo < 2:  # (one output along an axis: conv2d drops that stride, another geometry)
            continue
        # (a stride with one output along its axis is never applied: conv2d drops it)
        geo = (k, k, 1 if ho == 1 else s, 1 if wo == 1 else s, 1, 1, pads[0], pads[1])
        xs = (1, c, h, wd)
        x = nonzero_normal(rng, xs)
        w = nonzero_normal(rng, (c, 1, k, k)) * 0.3
        b = nonzero_normal(rng, (c,))
        if not nativeconv.dw_flat_fits(h, wd, geo, ho, wo):
            with pytest.raises(BackendError, match="dw_flat"):
                nativeconv.conv2d(x, w, b, _attrs(a), None, {}, threads, {}, "avx512", "dw_flat")
            continue
        ran += 1
        for act in ("relu", "hard_swish", None):
            got = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, threads, {}, "avx512", "dw_flat")
            want = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, threads, {}, "avx512", "direct")
            np.testing.assert_array_equal(got, want, err_msg=f"{xs} k={k} {a} {act}")
        if min(pads) >= 0:  # (the reference pads with np.pad: no crops)
            close(got, KERNELS["conv"](x, w, b, **_attrs(a)), None)


def test_depthwise_flat_fits_what_the_kernel_takes():
    """nativeconv.dw_flat_fits and csrc/dwconv_flat.c's own check agree (the Python rule offers
    the kernel, the C one refuses anything else with -2)."""
    for h, wd, k, s, ho, wo in [(7, 7, 3, 1, 7, 7), (7, 8, 3, 1, 7, 7), (28, 28, 3, 2, 14, 14), (28, 28, 3, 2, 13, 13),
                                (40, 40, 3, 1, 40, 40), (14, 14, 9, 1, 14, 14), (10, 10, 3, 3, 4, 4)]:
        geo = (k, k, s, s, 1, 1, 1, 1)
        assert nativeconv.dw_flat_fits(h, wd, geo, ho, wo) == bool(
            native.LIB.npr_dwconv2d_flat_fits(h, wd, k, k, s, s, 1, 1, ho, wo)), (h, wd, k, s, ho, wo)
    assert not nativeconv.dw_flat_fits(7, 7, (3, 3, 1, 1, 2, 2, 2, 2), 7, 7)  # dilated


@pytest.mark.skipif("avx512" not in native.conv_isas(), reason="this CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_avx512_is_the_avx2_kernel_bit_for_bit(threads, rng):
    """conv.c's per-channel depthwise kernel in AVX-512 (16 columns a vector, a masked last one;
    3x3/5x5/7x7 unrolled, any other geometry at run time; its own stride-1 fill): the same
    sums in the same order as the AVX2 one, so the same bits, and the reference's values; random
    shapes, 1- to 70-wide rows, strides 1-3, dilations 1-2, asymmetric pads, fresh inputs."""
    for _ in range(30):
        c = int(rng.integers(1, 40))
        k = int(rng.choice([1, 3, 5, 7, 2]))
        s, d = int(rng.choice([1, 1, 2, 3])), int(rng.choice([1, 1, 1, 2]))
        xs = (int(rng.integers(1, 3)), c, int(rng.integers(k * d, 40)), int(rng.integers(1, 71)))
        kw = min(k, xs[3])
        a = {"group": c, "strides": [s, s], "dilations": [d, d],
             "pads": [int(rng.integers(0, k)), int(rng.integers(0, kw)), int(rng.integers(0, k)), int(rng.integers(0, kw))]}
        if (xs[3] + a["pads"][1] + a["pads"][3] - (kw - 1) * d - 1) < 0:
            continue
        x = nonzero_normal(rng, xs)
        w = nonzero_normal(rng, (c, 1, k, kw)) * 0.3
        b = nonzero_normal(rng, (c,))
        for act in ("relu", None):
            got = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, threads, {}, "avx512", "direct")
            want = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, threads, {}, "avx2", "direct")
            np.testing.assert_array_equal(got, want, err_msg=f"{xs} k={k}x{kw} {a} {act}")
        close(got, KERNELS["conv"](x, w, b, **_attrs(a)), None)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_of_tiny_images(threads, rng):
    """A batch of 1x1..4x4 maps: depthwise convs run the batch as one image of n*c channels
    (each image's outputs the same bits as alone), dense ones as one im2col + sgemm over every
    image's pixels (batch_gemm_chosen), both against the reference."""
    for hw, k in [(1, 3), (2, 3), (4, 5), (3, 1)]:
        n, c, m = int(rng.integers(2, 11)), int(rng.integers(9, 70)), int(rng.integers(60, 200))
        a = {"pads": [k // 2] * 4}
        x = nonzero_normal(rng, (n, c, hw, hw))
        wd, bd = nonzero_normal(rng, (c, 1, k, k)) * 0.3, nonzero_normal(rng, (c,))
        da = {**a, "group": c}
        whole = nativeconv.conv2d(x, wd, bd, _attrs(da), "relu", {}, threads, {})
        for i in range(n):
            one = nativeconv.conv2d(x[i:i + 1], wd, bd, _attrs(da), "relu", {}, threads, {})
            np.testing.assert_array_equal(whole[i:i + 1], one, err_msg=f"depthwise {x.shape} k={k} image {i}")
        close(whole, KERNELS["conv"](x, wd, bd, **_attrs(da)), "relu")
        w, b = nonzero_normal(rng, (m, c, k, k)) * 0.3, nonzero_normal(rng, (m,))
        assert nativeconv.batch_gemm_chosen(n, c, m, 1, (k, k), hw, hw) == (c * m * k * k >= 4096)
        check_conv(None, x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, None)


FLAT_CONVS = [c for c in CONVS if c[2].get("group", 1) == 1] + [  # + YOLOv8n-like small images
    ((1, 24, 20, 20), (21, 24, 3, 3), {"pads": [1, 1, 1, 1]}),                    # many tiles, M % 8 != 0
    ((1, 9, 10, 10), (17, 9, 1, 1), {}),                                           # 1x1: ragged last tile
    ((1, 5, 11, 13), (6, 5, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),    # stride 2, odd sizes
    ((1, 4, 12, 12), (5, 4, 1, 1), {"pads": [1, 0, 2, 1]}),                       # padded 1x1
    ((2, 3, 21, 19), (8, 3, 3, 3), {"strides": [3, 2], "pads": [2, 1, 0, 1]}),    # stride 3, batch 2
    ((1, 16, 100, 101), (9, 16, 3, 3), {"pads": [1, 1, 1, 1]}),                   # planes > 512 KB: row sub-bands
    ((1, 8, 131, 130), (6, 8, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # the same, stride 2
    ((1, 6, 15, 17), (8, 6, 3, 3), {"strides": [2, 2]}),                          # stride 2 unpadded, odd W
    ((1, 4, 19, 38), (8, 4, 5, 5), {"strides": [2, 2], "pads": [2, 2, 2, 2]}),    # stride 2, pad 2, 5x5
    # Rows too narrow for the deinterleaved run of the stride-2 phase split (found by the
    # kernels fuzz target: 2 wide with a pad before it looped for ever; 1 wide read past it).
    ((1, 2, 3, 2), (16, 2, 1, 1), {"strides": [1, 2], "pads": [0, 1, 0, 0]}),
    ((1, 2, 3, 2), (16, 2, 3, 3), {"strides": [1, 2], "pads": [1, 1, 1, 1]}),
    ((1, 3, 4, 1), (8, 3, 1, 1), {"strides": [1, 2]}),
    ((1, 3, 4, 3), (8, 3, 1, 2), {"strides": [2, 2], "pads": [0, 3, 0, 2]}),
]


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(FLAT_CONVS)))
def test_flat_conv_matches_reference(case, threads, isa, rng, monkeypatch):
    """conv_gemm.c, forced: shifted stride-1 tiles (row bands, wrapped columns dropped), im2col
    panels (strided), 1x1 in place, each with bias and the activation in the store."""
    xs, ws, a = FLAT_CONVS[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.3
    b = nonzero_normal(rng, ws[:1])
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # bands even for these small convs
    check_conv("flat", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, isa, acts=(None, "silu", "clip"))


EMPTY_CONVS = [  # no output column / row: ONNX allows it (onnx's reference evaluator: an empty array)
    ((1, 16, 12, 6), (16, 16, 6, 6), {"strides": [4, 1], "dilations": [1, 2], "pads": [0, 2, 0, 2]}),
    ((2, 16, 14, 4), (10, 8, 6, 2), {"group": 2, "strides": [4, 3], "dilations": [4, 3], "pads": [3, 1, 1, 3]}),
]


@pytest.mark.parametrize("algo", [None, "direct", "flat", "gemm"])
@pytest.mark.parametrize("case", range(len(EMPTY_CONVS)))
def test_conv_with_an_empty_output_returns_it(case, algo, rng):
    """The kernels fuzz target found both: the C kernels divide by Ho*Wo (a SIGFPE), so nothing
    reaches them; the reference's tap slices were not empty for an empty axis (a ValueError)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    xs, ws, a = EMPTY_CONVS[case]
    x, w = nonzero_normal(rng, xs), nonzero_normal(rng, ws)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=list(ws[2:]), **a)
    oracle = ReferenceEvaluator(node).run(None, {"x": x, "w": w})[0].shape
    assert 0 in oracle
    assert KERNELS["conv"](x, w, None, **_attrs(a)).shape == oracle
    if a.get("group", 1) == 1 or algo in (None, "direct"):
        assert nativeconv.conv2d(x, w, None, _attrs(a), None, None, 1, {}, algo=algo).shape == oracle


def test_flat_plan_is_rebuilt_for_other_attributes(rng):
    """One cache shared by two convs of the same weights (conv1d.py's per-weight packs): the
    planned call of the first must not run the second's strides and pads."""
    x, w = nonzero_normal(rng, (1, 8, 12, 12)), nonzero_normal(rng, (8, 8, 3, 3))
    cache = {}
    for a in ({"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [0, 0, 2, 2]}, {"pads": [1, 1, 1, 1]}):
        got = nativeconv.conv2d(x, w, None, _attrs(a), "relu", {}, 1, cache, native.conv_isas()[0], "flat")
        np.testing.assert_allclose(got, _ref_act(KERNELS["conv"](x, w, None, **_attrs(a)), "relu"), rtol=1e-4, atol=2e-5)


def test_flat_chosen_keeps_winograd_and_big_images():
    geo3 = (3, 3, 1, 1, 1, 1, 1, 1)
    assert nativeconv.flat_chosen(64, 64, 1, geo3, 20, 20, "avx512")
    assert not nativeconv.flat_chosen(64, 64, 1, geo3, 20, 20, "avx2")        # AVX2: the older kernels win
    assert not nativeconv.flat_chosen(64, 64, 1, geo3, 40, 40, "avx512")      # Winograd wins there
    assert nativeconv.flat_chosen(64, 64, 1, geo3, 40, 40, "avx512", 2)       # not on 2 threads
    assert not nativeconv.flat_chosen(96, 24, 1, geo3, 80, 80, "avx512", 2)
    assert not nativeconv.flat_chosen(16, 16, 1, geo3, 720, 1280, "avx512")   # ESPCN-sized: unchanged
    assert not nativeconv.flat_chosen(8, 8, 2, geo3, 20, 20, "avx512")        # grouped
    # AVX2: small convs only (below convtune's range), not many-to-few pointwise ones
    geo5, geo1 = (5, 5, 1, 1, 1, 1, 2, 2), (1, 1, 1, 1, 1, 1, 0, 0)
    assert nativeconv.flat_chosen(1, 6, 1, geo5, 28, 28, "avx2")               # LeNet's first conv
    assert nativeconv.flat_chosen(576, 24, 1, geo1, 1, 1, "avx2", 2)           # an SE block's
    assert not nativeconv.flat_chosen(256, 4, 1, geo1, 28, 28, "avx2")
    assert not nativeconv.flat_chosen(16, 16, 1, geo3, 720, 1280, "avx2")
    assert not nativeconv.flat_chosen(6, 16, 2, geo5, 10, 10, "avx2")          # grouped


def test_native_conv_of_a_strided_view(rng):
    """Intermediate values can be views (transpose, slice): the kernel must not assume a layout."""
    base = nonzero_normal(rng, (1, 40, 1, 12)).transpose(0, 3, 2, 1)  # (1, 12, 1, 40), not contiguous
    w, a = nonzero_normal(rng, (5, 12, 1, 3)), _attrs({"pads": [0, 1, 0, 1]})
    got = nativeconv.conv2d(base, w, None, a, None, {}, 1, {})
    np.testing.assert_allclose(got, KERNELS["conv"](base, w, None, **a), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("auto_pad", ["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_strided_pointwise_conv_runs_on_its_gathered_pixels(auto_pad, threads, rng):
    """A strided 1x1 conv is the stride-1 conv of the pixels ::s (odd sizes: the last pixel
    of a row or column taken or not; groups; a batch; a fused activation)."""
    for (n, c, m, g, h, wd, sh, sw) in [(1, 16, 24, 1, 14, 14, 2, 2), (2, 8, 12, 4, 9, 7, 3, 2), (1, 5, 3, 1, 1, 11, 1, 3)]:
        x, w, b = nonzero_normal(rng, (n, c, h, wd)), nonzero_normal(rng, (m, c // g, 1, 1)), nonzero_normal(rng, (m,))
        a = _attrs({"strides": [sh, sw], "auto_pad": auto_pad, "group": g, "kernel_shape": [1, 1]})
        got = nativeconv.conv2d(x, w, b, a, "relu", {}, threads, {})
        want = np.maximum(KERNELS["conv"](x, w, b, **a), 0)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


def test_native_conv_without_bias(rng):
    x, w = nonzero_normal(rng, (1, 4, 10, 30)), nonzero_normal(rng, (3, 4, 3, 3))
    got = nativeconv.conv2d(x, w, None, _attrs({"pads": [1, 1, 1, 1]}), None, {}, 1, {})
    np.testing.assert_allclose(got, KERNELS["conv"](x, w, None, **_attrs({"pads": [1, 1, 1, 1]})), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("n", [1, 7, 8, 1003, 70000])
@pytest.mark.parametrize("act", native.ACTIVATIONS)
def test_activation_kernel_matches_reference(act, n, rng):
    x = nonzero_normal(rng, (n,)) * 6  # reaches the saturated ends of tanh/sigmoid
    code, alpha, beta = native.act_params(act, ACT_ATTRS.get(act, {}))
    y = np.empty_like(x)
    native.LIB.npr_activation(native.ptr(x), native.ptr(y), n, code, alpha, beta)
    np.testing.assert_allclose(y, _ref_act(x, act), rtol=1e-5, atol=1e-6)


SILU = """
op conv @c1 (x: [1, 3, 9, 20] f32, w: [8, 3, 3, 3] f32, b: [8] f32 -> u: [1, 8, 7, 18] f32)
op sigmoid @s1 (u: [1, 8, 7, 18] f32 -> s: [1, 8, 7, 18] f32)
op mul @m1 (u: [1, 8, 7, 18] f32, s: [1, 8, 7, 18] f32 -> v: [1, 8, 7, 18] f32)
op conv @c2 (v: [1, 8, 7, 18] f32, w2: [4, 2, 1, 1] f32 -> z: [1, 4, 7, 18] f32) group=4
op clip @k2 (z: [1, 4, 7, 18] f32, lo: [] f32, hi: [] f32 -> out: [1, 4, 7, 18] f32)
"""


def test_silu_and_clip_fuse_into_conv_and_match_reference(rng):
    g = parse(SILU)
    for nm, shape in (("w", (8, 3, 3, 3)), ("b", (8,)), ("w2", (4, 2, 1, 1))):
        g.values[nm].data = nonzero_normal(rng, shape)
    g.values["lo"].data, g.values["hi"].data = np.array(-0.3, np.float32), np.array(0.4, np.float32)
    g.inputs = ["x"]
    prog = npurun.Executor("cpu", parallelism=2).compile(g)
    assert [(n.name, n.attrs.get("activation")) for n in prog.graph.nodes] == [("c1", "swish"), ("c2", "clip")]
    x = nonzero_normal(rng, (1, 3, 9, 20))
    want = npurun.Executor("reference").run_sync(g, {"x": x})["out"]
    for _ in range(2):  # the second run uses the packed weights of the first
        np.testing.assert_allclose(prog.run({"x": x})["out"], want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("rows,threads", [(3, 1), (9, 2), (9, 1)])
def test_unfused_activations_run_the_compiled_kernel(rows, threads, rng):
    g = parse(f"""
    op tanh @t (x: [{rows}, 2001] f32 -> y: [{rows}, 2001] f32)
    op sigmoid @s (y: [{rows}, 2001] f32 -> z: [{rows}, 2001] f32)
    """)  # 6003 elements: above cpu.SMALL, so the compiled kernel runs (smaller ones take NumPy);
    # 18009: above cpu.BIG, so two threads split it (npr_activation_mt), at an odd boundary
    g.inputs = ["x"]
    x = nonzero_normal(rng, (rows, 2001)) * 4
    got = npurun.Executor("cpu", parallelism=threads).run_sync(g, {"x": x})["z"]
    np.testing.assert_allclose(got, KERNELS["sigmoid"](KERNELS["tanh"](x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("xs,ws,a", [
    ((1, 64, 24, 25), (64, 32, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),                   # Winograd-sized groups
    ((2, 48, 44, 42), (96, 16, 3, 3), {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # batch 2: slices copied
    ((1, 32, 21, 20), (32, 16, 1, 1), {"group": 2}),                                          # pointwise groups
])
def test_wide_groups_run_as_dense_convs_and_match_reference(xs, ws, a, rng, monkeypatch):
    """The rule (convtune off): groups >= GROUP_SPLIT_MIN wide on maps of more than
    TGEMM_MAX_PIXELS outputs run as one dense conv per channel slice, each its own algorithm
    (smaller maps: grouped_tgemm_chosen)."""
    monkeypatch.setenv("NPURUN_CONV_TUNE", "0")
    x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
    assert ws[1] >= nativeconv.GROUP_SPLIT_MIN
    cache = {}
    want = KERNELS["conv"](x, w, b, **_attrs(a))
    # a 3x3 group may run Winograd (AVX2 machines pick it for these slices): its error bound is
    # relative to the output's magnitude, as in test_cpu_winograd.py
    atol = 3e-5 * float(np.abs(want).max())
    for act in (None, "relu"):
        for _ in range(2):  # the second run reuses the per-group packing
            got = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, 1, cache)
            close(got, want, act, atol=atol)
    assert len(cache["groups"]) == a["group"]


_THREADS_CHILD = r"""
import ctypes, gc, threading
import numpy as np
import npurun

class MallInfo2(ctypes.Structure):
    _fields_ = [(k, ctypes.c_size_t) for k in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
exe = npurun.Executor("cpu", parallelism=1)
prog = exe.compile(npurun.load("npurun/zoo/espcn_x3.onnx"))
x = np.random.default_rng(0).random((1, 1, 120, 160), np.float32) + 0.1

def on_new_threads(n):
    for _ in range(n):
        t = threading.Thread(target=prog.run, args=({"input": x},))
        t.start()
        t.join()
    gc.collect()
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd

on_new_threads(5)
before = on_new_threads(1)
after = on_new_threads(60)
print(after - before)
"""


def test_conv_scratch_is_freed_when_a_thread_exits():
    """The flat conv's per-thread scratch buffers are freed at thread exit (a pthread key's
    destructor). As _Thread_local pointers they leaked ~100 KB per thread at 160x120, and the
    scheduler's task threads come and go: `npurun serve` grew without bound (tests/soak).
    Counted in malloc's bytes in use (one arena, no mmap: every allocation is counted),
    never in time or RSS."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 30), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _THREADS_CHILD], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    grown = int(p.stdout.split()[-1])
    assert grown < 1 << 20, f"60 threads that ran a conv left {grown / 1e6:.1f} MB allocated"


@pytest.mark.parametrize("x_shape, w_shape", [((1, 0, 1, 9), (4, 0, 1, 3)), ((2, 0, 30), (5, 0, 3)),
                                              ((1, 0, 6, 6), (3, 0, 1, 1))])
def test_a_conv_of_no_input_channels_is_its_bias(x_shape, w_shape, rng, tmp_path):
    """Found by `make fuzz`: a conv whose window holds no input channel (C = 0) died of SIGFPE
    in the flat kernel (and got a MemoryError from the implicit GEMM's empty tile buffer). Its
    output is the bias (then the activation), as the reference computes it."""
    import onnx
    from onnx import TensorProto, helper
    b = nonzero_normal(rng, (w_shape[0],))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("w", TensorProto.FLOAT, list(w_shape), []),
                           helper.make_tensor("b", TensorProto.FLOAT, [w_shape[0]], b.tolist())])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    model, feeds = npurun.load(tmp_path / "m.onnx"), {"x": np.zeros(x_shape, np.float32)}
    got = npurun.Executor("cpu", parallelism=1).run_sync(model, feeds)["y"]
    want = npurun.Executor("reference", parallelism=1).run_sync(model, feeds)["y"]
    np.testing.assert_array_equal(got, want)
    assert got.shape[:2] == (x_shape[0], w_shape[0]) and np.array_equal(got[0, :, 0], np.broadcast_to(
        np.maximum(b, 0).reshape(-1, *[1] * (got.ndim - 3)), got[0, :, 0].shape))


@pytest.mark.parametrize("group", [1, 32])
@pytest.mark.parametrize("strides, pads", [([2**31 - 1, 2**31 - 1], [1, 1, 1, 1]),
                                           ([2**31 - 1, 1], [1, 0, 2**30, 1]),
                                           ([1, 2**31 - 1], [0, 1, 0, 2**30])])
def test_a_stride_or_end_padding_that_is_never_used_costs_nothing(strides, pads, group, rng):
    """Found by `make fuzz`: a stride of 2^31 - 1 (one output row) or an end padding of 2^30
    past the last window made the kernels lay out the padded input in stride phases: tile
    buffers no process has (MemoryError). One output row's stride is never applied and padding
    past the last window never read, so both are dropped; the result is the stride-1 conv's
    first rows/columns."""
    x, w, b = nonzero_normal(rng, (1, 32, 4, 5)), nonzero_normal(rng, (32 if group > 1 else 9, 32 // group, 3, 3)), None
    got = nativeconv.conv2d(x, w, b, _attrs({"strides": strides, "pads": pads, "group": group}), None, {}, 1, {})
    small = [min(p, 2) for p in pads]  # the same windows, with no more padding than they read
    whole = KERNELS["conv"](x, w, b, **_attrs({"pads": small, "group": group, "kernel_shape": [3, 3]}))
    want = whole[:, :, ::strides[0], ::strides[1]][:, :, :got.shape[2], :got.shape[3]]
    assert got.shape[2:] == want.shape[2:]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_convs_along_h_with_one_column_match_reference(rng, threads):
    """(N, C, L, 1) convs with (k, 1) kernels (1-D convs as Keras/TF export them) run with the
    spatial axes swapped by reshapes: dense, grouped, depthwise, strided, dilated, padded,
    auto_pad, against the reference conv on fresh random inputs."""
    for _ in range(12):
        c, group = [(16, 1), (24, 3), (32, 32), (8, 1)][int(rng.integers(4))]
        m = c if group == c else group * int(rng.choice([2, 8]))
        kh, s, d = int(rng.choice([1, 3, 5, 9])), int(rng.choice([1, 2])), int(rng.choice([1, 2]))
        x = nonzero_normal(rng, (int(rng.choice([1, 2])), c, int(rng.integers(20, 300)), 1))
        w = nonzero_normal(rng, (m, c // group, kh, 1)) * 0.3
        b = nonzero_normal(rng, (m,))
        if rng.random() < 0.5:
            a = {"group": group, "strides": [s, 1], "dilations": [d, 1],
                 "pads": [int(rng.integers(0, kh)), 0, int(rng.integers(0, kh)), 0]}
        else:
            a = {"group": group, "strides": [s, 1], "dilations": [d, 1], "auto_pad": str(rng.choice(["SAME_UPPER", "VALID"]))}
        want = KERNELS["conv"](x, w, b, **_attrs(a))
        for act in (None, "relu"):
            got = nativeconv.conv2d(x, w, b, _attrs(a), act, {}, threads, {})
            assert got.shape == want.shape
            close(got, want, act, atol=3e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads", [1, 2])
def test_transposed_views_made_contiguous(threads, rng):
    """native.contiguous: a transposed float32 view (two axis groups swapped after batch axes:
    csrc/transpose.c's blocked transpose, 8x8 blocks in 64x64 tiles, ragged edges) is copied to
    the same values as np.ascontiguousarray gives; other views and small ones are NumPy's."""
    cases = [((1, 4096, 96), (0, 2, 1)), ((2, 30, 33, 40), (0, 3, 1, 2)), ((1, 24, 57, 61), (0, 2, 3, 1)),
             ((130, 201), (1, 0)), ((3, 5, 70, 90), (1, 0, 3, 2)), ((2, 7, 1, 300, 77), (0, 3, 4, 2, 1))]
    for shape, perm in cases:
        a = nonzero_normal(rng, shape)
        v = a.transpose(perm)
        y = native.contiguous(v, threads)
        assert y.flags.c_contiguous and y.shape == v.shape
        np.testing.assert_array_equal(y, np.ascontiguousarray(v), err_msg=f"{shape} {perm}")
    assert native._transpose_plan(nonzero_normal(rng, (1, 64, 300)).transpose(0, 2, 1)) == (1, 64, 300)
    assert native._transpose_plan(nonzero_normal(rng, (3, 5, 70, 90)).transpose(1, 0, 3, 2)) is None
    a = nonzero_normal(rng, (64, 64))
    assert native.contiguous(a) is a  # already contiguous: no copy


@pytest.mark.parametrize("case", [
    ((1, 8, 16, 16), (6, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 8, 16, 16), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 8, 16, 16), (6, 8, 1, 1), {"strides": [2, 2]}),  # gathered first: never memoized
    ((1, 8, 16, 1), (6, 8, 3, 1), {"pads": [1, 0, 1, 0]}),  # a 1-D conv along H: run as (N, C, 1, L)
])
def test_conv_step_calls_its_plan_directly(case, rng):
    """nativeconv.conv_step: a conv step's call of a shape that finds its plan keeps it, and later calls
    of that shape run it without the general path (the first ones may plan twice: untuned,
    then under its tuned choice); any other shape, a non-contiguous input, or
    a conv whose input is reshaped or gathered before it is planned goes through the general
    path every time. Every output is the general path's (fresh cache) bit for bit and the
    reference's."""
    xs, ws, a = case
    w = nonzero_normal(rng, ws) * 0.3
    b = nonzero_normal(rng, ws[:1])
    attrs = _attrs(a)
    calls = []

    def general(x, w, b=None, _cache=None, **attrs):
        calls.append(x.shape)
        return nativeconv.conv2d(x, w, b, attrs, "relu", {}, 1, _cache, memo=True)

    step = nativeconv.conv_step(general, {})
    other = (1, xs[1], 10, 12) if xs[3] != 1 else (1, xs[1], 9, 1)
    for shape in (xs, xs, xs, other, xs):
        x = nonzero_normal(rng, shape)
        got = step(x, w, b, **attrs)
        np.testing.assert_array_equal(got, nativeconv.conv2d(x, w, b, attrs, "relu", {}, 1, {}))
        close(got, KERNELS["conv"](x, w, b, **attrs), "relu")
    gathered = a.get("strides") == [2, 2] and ws[2:] == (1, 1)
    if gathered or xs[3] == 1:
        assert calls == [xs, xs, xs, other, xs]
    else:  # the first shape planned (once per conv2d key: untuned, then its rule) and kept
        assert calls[-1] == other and 2 <= calls.count(xs) <= 3, calls
    n = len(calls)
    xt = nonzero_normal(rng, (xs[0], xs[1], xs[3], xs[2])).transpose(0, 1, 3, 2)  # not contiguous
    got = step(xt, w, b, **attrs)
    assert calls[n:] == [xs]
    np.testing.assert_array_equal(got, nativeconv.conv2d(np.ascontiguousarray(xt), w, b, attrs, "relu", {}, 1, {}))


@pytest.mark.parametrize("binding", ["bound", "ctypes fallback"])
def test_bound_call_is_the_ctypes_call(binding, rng, monkeypatch):
    """native.bound: a kernel's arguments converted once (integer-class and float ones in
    their order, x and y put in their slots on each call) give the ctypes call's outputs bit
    for bit -- here a depthwise conv with a clip (two floats between the ints), the record
    reused for another input -- and return its return value; without csrc/py/addr.c's binder,
    ctypes. (The conv plans' own bound calls are checked by every conv test above.)"""
    if binding == "ctypes fallback":
        monkeypatch.setattr(native, "_bind", None)
    x = nonzero_normal(rng, (1, 8, 9, 11))
    wd = nonzero_normal(rng, (8, 9))
    bd = nonzero_normal(rng, (8,))
    lo, hi = -float(rng.uniform(0.1, 1)), float(rng.uniform(0.1, 1))
    args = (None, 8, 9, 11, native.ptr(wd), native.ptr(bd), 3, 3, 1, 1, 1, 1, 1, 1,
            native.ACTS["clip"], lo, hi, None, 9, 11, 0, 8)
    want, got = np.empty((1, 8, 9, 11), np.float32), np.full((1, 8, 9, 11), np.nan, np.float32)
    a = list(args)
    a[0], a[17] = native.ptr(x), native.ptr(want)
    assert native.LIB.npr_dwconv2d(*a) == 0
    call = native.bound(native.LIB.npr_dwconv2d, args, 0, 17)
    assert call(x, got) == 0
    np.testing.assert_array_equal(got, want)
    assert got.min() == np.float32(lo) and got.max() == np.float32(hi)  # the clip's floats arrived
    x2 = nonzero_normal(rng, (1, 8, 9, 11))  # the same record, another input
    call(x2, got)
    a[0] = native.ptr(x2)
    native.LIB.npr_dwconv2d(*a)
    np.testing.assert_array_equal(got, want)
