"""The cpu kernels of fused and per-channel ops (cpu/ops/fused.py, cpu/ops/channelwise.py)
against their reference kernels on fresh random non-zero inputs: affine_activation with each
activation the C pass takes (and one it does not), per-channel PRelu and standalone
BatchNorm over several layouts, and the shapes that must fall back to the reference."""
from types import SimpleNamespace

import numpy as np
import pytest

from npurun.backends.cpu import native
from npurun.backends.cpu.ops import channelwise, fused
from npurun.backends.reference.kernels import KERNELS as REF

from conftest import nonzero_normal

pytestmark = pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")
PROG = SimpleNamespace(threads=1)


@pytest.mark.parametrize("act,params", [("", []), ("relu", []), ("hard_swish", []), ("leaky_relu", [0.2]),
                                        ("clip", [-0.5, 1.5]), ("swish", [1.0]), ("elu", [0.7])])
def test_affine_activation_matches_reference(rng, act, params):
    x = nonzero_normal(rng, (3, 1001)) * 3
    a = {"s0": 0.75, "t0": -0.25, "activation": act, "activation_params": params, "s1": -1.5, "t1": 0.125}
    got = fused.KERNELS["affine_activation"](PROG)(x, **a)
    want = REF["affine_activation"](x, **a)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("act", ["", "relu"])
def test_affine_activation_rounds_as_its_mul_and_add_nodes(rng, act):
    """Each multiply and add of the fused affine rounded on its own, as the Mul and Add nodes it
    replaced are (an FMA's one rounding was an ulp off now and then, and a dynamically quantized
    PP-OCRv5 det carried such ulps across quantization steps: 0.99 off ORT on some pixels):
    the same bits as float32 NumPy op by op, whose relu is exact."""
    x = nonzero_normal(rng, (3, 1001)) * 3
    s0, t0, s1, t1 = (np.float32(v) for v in rng.standard_normal(4))
    a = {"s0": float(s0), "t0": float(t0), "activation": act, "activation_params": [], "s1": float(s1), "t1": float(t1)}
    got = fused.KERNELS["affine_activation"](PROG)(x, **a)
    u = x * s0 + t0
    want = (np.maximum(u, np.float32(0)) if act else u) * s1 + t1
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act,params", [("relu", []), ("clip", [0.0, 6.0]), ("leaky_relu", [0.1]), ("swish", [1.0]), ("hard_swish", []),
                                        ("elu", [1.0])])
@pytest.mark.parametrize("shape", [(1, 64, 56, 56), (2, 3, 1001), (5, 7)])
def test_add_activation_matches_reference(rng, act, params, shape, threads):
    """act(a + b) of a residual add (passes/fuse_add_activation.py): chain.c's one pass, split
    over the pool at 2 threads (the same bits as 1), NumPy's add and the activation where the C
    pass does not take it (a small map, elu); against the reference's add then activation."""
    a, b = nonzero_normal(rng, shape), nonzero_normal(rng, shape)
    kw = {"activation": act, "activation_params": params}
    got = fused.KERNELS["add_activation"](SimpleNamespace(threads=threads))(a, b, **kw)
    want = REF["add_activation"](a, b, **kw)
    assert got.dtype == np.float32 and got.shape == want.shape
    if act in ("relu", "clip", "leaky_relu"):  # a sum, then max/min/one multiply: exact
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert np.array_equal(got, fused.KERNELS["add_activation"](PROG)(a, b, **kw))
    bc = nonzero_normal(rng, shape[-1:])  # a broadcast operand: the reference's way
    np.testing.assert_array_equal(fused.KERNELS["add_activation"](PROG)(a, bc, **kw),
                                  REF["add_activation"](a, bc, **kw))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act,params", [("relu", []), ("clip", [0.0, 6.0]), ("", []), ("hard_swish", [])])
@pytest.mark.parametrize("shape,parts", [((1, 64, 28, 28), "st"), ((2, 24, 13, 17), "s"), ((3, 40, 37), "t"),
                                         ((1, 4, 3, 3), "st")])
def test_channel_affine_matches_reference(rng, act, params, shape, parts, threads):
    """act(x * s[c] + t[c]) (passes/fuse_channel_affine.py): chain.c's one pass with the product
    and the sum rounded each, so the reference's floats (relu, clip, none: exact), whole channel
    runs over the pool at 2 threads; a small map the reference's way."""
    x = nonzero_normal(rng, shape)
    s = nonzero_normal(rng, shape[1:2]) if "s" in parts else None
    t = nonzero_normal(rng, shape[1:2]) if "t" in parts else None
    kw = {"activation": act, "activation_params": params}
    got = fused.KERNELS["channel_affine"](SimpleNamespace(threads=threads))(x, s, t, **kw)
    want = REF["channel_affine"](x, s, t, **kw)
    assert got.dtype == np.float32 and got.shape == want.shape
    if act in ("relu", "clip", ""):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("xshape,sshape", [((2, 16, 30, 40), (16, 1, 1)), ((1, 8, 60, 61), (1, 8, 1, 1)),
                                           ((700, 32), (32,)), ((1, 5, 70, 70), (1,)), ((1, 4, 3, 3), (4, 1, 1))])
def test_prelu_per_channel_matches_reference(rng, xshape, sshape):
    x, s = nonzero_normal(rng, xshape), nonzero_normal(rng, sshape) * 0.3
    got = channelwise.KERNELS["prelu"](PROG)(x, s)
    np.testing.assert_array_equal(got, REF["prelu"](x, s))  # one multiply per element either way


def test_prelu_broadcast_another_way_falls_back(rng):
    x, s = nonzero_normal(rng, (2, 8, 40, 40)), nonzero_normal(rng, (40,))  # a slope per column
    np.testing.assert_array_equal(channelwise.KERNELS["prelu"](PROG)(x, s), REF["prelu"](x, s))


@pytest.mark.parametrize("xshape", [(2, 24, 33, 17), (1, 64, 128), (3, 16, 40, 40, 2)])
def test_standalone_batch_norm_matches_reference(rng, xshape):
    c = xshape[1]
    x = nonzero_normal(rng, xshape)
    g, b, m = nonzero_normal(rng, (c,)), nonzero_normal(rng, (c,)), nonzero_normal(rng, (c,))
    v = (rng.random(c) + 0.1).astype(np.float32)
    got = channelwise.KERNELS["batch_normalization"](PROG)(x, g, b, m, v, epsilon=1e-3)
    want = REF["batch_normalization"](x, g, b, m, v, epsilon=1e-3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("e", [2.0, 3.0, 0.5, 1.0, -1.0, 2.5])
def test_pow_by_a_constant_matches_reference_within_2_ulp(rng, e):
    from npurun.backends.cpu.ops import power
    x = nonzero_normal(rng, (7, 333)) * 3
    if e in (0.5, 2.5):
        x = np.abs(x)
    b = np.array(e, np.float32)
    got, want = power.KERNELS["pow"](PROG)(x, b), REF["pow"](x, b)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    ulp = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulp.max() <= 2


def test_gelu_tanh_form_matches_reference(rng):
    from npurun.backends.cpu.ops import transformer as T
    x = nonzero_normal(rng, (3, 1000)) * 4
    got = T.KERNELS["gelu"](PROG)(x, approximate="tanh")
    want = REF["gelu"](x, approximate="tanh")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("m,k,n", [(1, 64, 256), (3, 17, 5), (200, 384, 384)])  # NumPy path, NumPy, packed sgemm
@pytest.mark.parametrize("trans_a,trans_b,alpha,beta", [(0, 0, 1.0, 1.0), (0, 1, 1.0, 1.0), (1, 0, 0.5, 2.0),
                                                        (1, 1, -1.5, 0.0)])
@pytest.mark.parametrize("bias", ["const", "input", None])
def test_gemm_by_a_constant_weight_matches_reference(rng, m, k, n, trans_a, trans_b, alpha, beta, bias):
    from types import SimpleNamespace as NS
    from npurun.ir.graph import Node, Value
    w = nonzero_normal(rng, (n, k) if trans_b else (k, n))
    c = nonzero_normal(rng, (n,))
    vals = {"w": Value("w", w.shape, "f32", data=w), "c": Value("c", c.shape, "f32", data=c if bias == "const" else None)}
    node = Node("gemm", ["a", "w"] + (["c"] if bias else []), ["y"],
                {"trans_a": trans_a, "trans_b": trans_b, "alpha": alpha, "beta": beta})
    a = nonzero_normal(rng, (k, m) if trans_a else (m, k))
    attrs = {"trans_a": trans_a, "trans_b": trans_b, "alpha": alpha, "beta": beta}
    kern = fused.gemm_kernel(PROG, node, NS(values=vals), REF["gemm"])
    args = (a, w) + ((c,) if bias else ())
    got, want = kern(*args, **attrs), REF["gemm"](*args, **attrs)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(want).max())))
    if alpha == 1.0 and m == 200:  # packed: from the graph's weight (a view), no transposed copy kept
        assert np.shares_memory(kern.cache["b"], w)


@pytest.mark.parametrize("eq,sa,sb", [
    ("bhlk,bhtk->bhlt", (2, 3, 5, 4), (2, 3, 6, 4)),    # CvT's attention scores
    ("bhlt,bhtv->bhlv", (2, 3, 5, 6), (2, 3, 6, 7)),
    ("ij,jk->ik", (4, 5), (5, 3)),
    ("ij,kj->ki", (4, 5), (3, 5)),                      # a transposed result
    ("bij,bjk->bik", (3, 2, 4), (3, 4, 5)),
    ("i,i->", (7,), (7,)),                              # a dot product
    ("i,j->ij", (3,), (4,)),                            # an outer product
    ("abc,cd->abd", (2, 3, 4), (4, 5)),
    ("ii,i->i", (3, 3), (3,)),                          # a repeated index: the reference
    ("ij,jk", (4, 5), (5, 3)),                          # no output given: the reference
])
def test_einsum_as_batched_matmul_matches_reference(rng, eq, sa, sb):
    from npurun.backends.cpu.ops import einsum
    a, b = nonzero_normal(rng, sa), nonzero_normal(rng, sb)
    got, want = einsum.KERNELS["einsum"](PROG)(a, b, equation=eq), REF["einsum"](a, b, equation=eq)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xshape", [(2, 6, 40, 41), (1, 8, 3000), (1, 4, 30, 30, 20)])
def test_instance_normalization_matches_reference(rng, xshape):
    c = xshape[1]
    x = nonzero_normal(rng, xshape) * 2 + 0.5
    s, b = nonzero_normal(rng, (c,)), nonzero_normal(rng, (c,))
    got = channelwise.KERNELS["instance_normalization"](PROG)(x, s, b, epsilon=1e-5)
    want = REF["instance_normalization"](x, s, b, epsilon=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xshape,groups", [((2, 12, 30, 31), 3), ((1, 64, 56, 56), 1), ((1, 8, 20, 20), 8)])
def test_group_normalization_matches_reference(rng, xshape, groups):
    c = xshape[1]
    x = nonzero_normal(rng, xshape) - 0.3
    s, b = nonzero_normal(rng, (c,)), nonzero_normal(rng, (c,))
    got = channelwise.KERNELS["group_normalization"](PROG)(x, s, b, num_groups=groups, epsilon=1e-5)
    want = REF["group_normalization"](x, s, b, num_groups=groups, epsilon=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xshape,attrs", [
    ((1, 6, 20, 21), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
    ((2, 4, 20, 21), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((1, 3, 17, 17), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": None, "count_include_pad": 0,
                      "ceil_mode": 1}),
    ((1, 5, 14, 9), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 1, 0], "count_include_pad": 0}),
    ((1, 8, 7, 7), {"kernel_shape": [7, 7], "strides": [1, 1], "pads": None, "count_include_pad": 0}),
    # windows far larger than the input (HF EfficientNet's head: kernel = hidden size, ceil_mode)
    ((1, 16, 7, 7), {"kernel_shape": [300, 300], "strides": [300, 300], "pads": None, "count_include_pad": 1,
                     "ceil_mode": 1}),
    ((1, 4, 9, 8), {"kernel_shape": [12, 5], "strides": [4, 3], "pads": [1, 0, 1, 2], "count_include_pad": 0,
                    "ceil_mode": 1}),
    # one count everywhere (its reciprocal in the weights): no padding, or padding counted
    ((1, 11, 113, 113), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": None, "count_include_pad": 0}),
    ((1, 6, 12, 12), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    # 1x1 windows: strided copies (NASNet's stride-2 pools), or padded ones, which the conv runs
    ((1, 32, 111, 111), {"kernel_shape": [1, 1], "strides": [2, 2], "pads": None, "count_include_pad": 0}),
    ((1, 3, 10, 9), {"kernel_shape": [1, 1], "strides": [3, 2], "pads": None, "count_include_pad": 0, "ceil_mode": 1}),
    ((1, 3, 10, 9), {"kernel_shape": [1, 1], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
])
def test_average_pool_on_the_depthwise_kernel_matches_reference(rng, xshape, attrs):
    """Three calls each on 1 and 2 threads: the first plans, the later ones run the kept plan."""
    from npurun.backends.cpu.ops import vision
    a = {"dilations": None, "ceil_mode": 0, "auto_pad": "NOTSET", **attrs}
    for threads in (1, 2):
        prog = type("P", (), {"threads": threads})()
        kernel = vision._average_pool(prog)
        for _ in range(3):
            x = nonzero_normal(rng, xshape)
            got = kernel(x, **a)
            want = REF["average_pool"](x, **a)
            assert got.shape == want.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,ctm,shape,size", [
    ("linear", "half_pixel", (1, 3, 8, 8), (32, 32)),           # SegFormer's 4x upsampling
    ("linear", "align_corners", (2, 2, 5, 7), (11, 3)),         # up one axis, down the other
    ("linear", "pytorch_half_pixel", (1, 4, 1, 9), (1, 20)),
    ("cubic", "half_pixel", (1, 2, 6, 6), (13, 9)),
    ("linear", "asymmetric", (1, 2, 10, 10), (4, 4)),           # downsampling
    ("linear", "half_pixel", (1, 7, 40, 48), (160, 192)),       # big enough for the pool's threads
    ("cubic", "align_corners", (2, 3, 30, 31), (90, 93)),
])
def test_interpolating_resize_matches_reference(rng, mode, ctm, shape, size):
    """csrc/resize.c, an axis at a time; at 2 threads the outer slices split over the pool
    (the same bits as one thread); against the reference."""
    from npurun.backends.cpu.ops import vision
    from npurun.ir.ops import OPS
    a = {**OPS["resize"].attrs, "mode": mode, "coordinate_transformation_mode": ctm}
    x = nonzero_normal(rng, shape)
    sizes = np.array(shape[:2] + size, np.int64)
    got = vision._resize(x, None, None, sizes, **a)
    want = REF["resize"](x, None, None, sizes, **a)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vision._resize(x, None, None, sizes, threads=2, **a), got)


def test_plain_add_on_two_threads_is_numpys(rng):
    """cpu/ops/elementwise_pieces.py: on two threads an add of two same-shaped float32 maps runs
    as chain.c's add on the pool (a transposed operand made contiguous first): NumPy's sums
    bit for bit; a broadcast or another dtype stays NumPy's."""
    from npurun.backends.cpu.ops import elementwise_pieces as ep
    add = ep.KERNELS["add"](SimpleNamespace(threads=2))
    a = rng.standard_normal((1, 64, 40, 40)).astype(np.float32)
    b = rng.standard_normal((1, 64, 40, 40)).astype(np.float32)
    np.testing.assert_array_equal(add(a, b), a + b)
    t = rng.standard_normal((1, 128, 300)).astype(np.float32).transpose(0, 2, 1)
    u = rng.standard_normal((1, 300, 128)).astype(np.float32)
    np.testing.assert_array_equal(add(u, t), u + t)
    c = rng.standard_normal((64, 1, 1)).astype(np.float32)
    np.testing.assert_array_equal(add(a, c), a + c)
    i = rng.integers(-5, 5, (1, 64, 40, 40)).astype(np.int32)
    np.testing.assert_array_equal(add(i, i), i + i)
