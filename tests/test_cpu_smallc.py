"""The direct conv for few input channels (csrc/smallc.c) against the reference conv, on
fresh random non-zero inputs: ragged widths (not multiples of a tile, one pixel past one),
ragged heights, M off the channel block, 1-4 input channels, odd and even kernels, symmetric,
asymmetric and no padding, with and without bias, every fused activation, 1 and 2 threads
(several bands), every ISA this CPU runs; plus the rule and the error for shapes it lacks."""

import numpy as np
import pytest

from npurun.errors import BackendError
from npurun.backends.cpu import native, nativeconv
from npurun.backends.reference.kernels import KERNELS

from conftest import nonzero_normal
from test_cpu_native import _attrs, check_conv, close

pytestmark = pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")

CONVS = [  # (N, C, H, W), M, (kh, kw), attrs; stride 1
    ((1, 1, 23, 70), 64, (5, 5), {"pads": [2, 2, 2, 2]}),          # ESPCN's first layer, small
    ((2, 3, 9, 49), 13, (3, 3), {"pads": [0, 1, 2, 0]}),           # batch 2, asymmetric pads, M ragged
    ((1, 2, 11, 17), 8, (3, 5), {}),                               # no padding, 3x5 taps
    ((1, 4, 7, 97), 20, (2, 2), {"pads": [1, 1, 0, 0]}),           # even kernel, width 97
    ((1, 1, 5, 8), 9, (7, 7), {"pads": [3, 3, 3, 3]}),             # kernel wider than the row
    ((1, 3, 6, 300), 16, (3, 3), {"auto_pad": "SAME_UPPER"}),      # several tiles across
]


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_smallc_matches_reference(case, threads, isa, rng, monkeypatch):
    xs, m, (kh, kw), a = CONVS[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, (m, xs[1], kh, kw)) * 0.3
    b = nonzero_normal(rng, (m,)) if case % 2 == 0 else None  # with and without bias
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # several bands even here
    if threads == 2:  # non-temporal stores (big outputs only, normally) on the aligned rows
        monkeypatch.setattr(nativeconv, "STREAM_BYTES", 0)
    want = KERNELS["conv"](x.astype(np.float64), w.astype(np.float64),
                           None if b is None else b.astype(np.float64), **_attrs(a))
    check_conv("smallc", x, w, b, a, want, threads, isa, lambda g, wp, act: close(g, wp, act, atol=1e-4))


@pytest.mark.parametrize("isa", native.conv_isas())
def test_the_rule(isa):
    geo5 = (5, 5, 1, 1, 1, 1, 2, 2)
    assert nativeconv.smallc_chosen(1, 64, 1, geo5, isa)  # ESPCN's first conv
    assert nativeconv.smallc_chosen(4, 16, 1, geo5, isa)
    assert not nativeconv.smallc_chosen(5, 64, 1, geo5, isa)  # enough channels for the GEMM
    assert not nativeconv.smallc_chosen(3, 16, 1, (3, 3, 2, 2, 1, 1, 1, 1), isa)  # stride 2
    assert not nativeconv.smallc_chosen(1, 64, 1, (1, 1, 1, 1, 1, 1, 0, 0), isa)  # 1x1


def test_the_rule_picks_it_and_matches_the_forced_direct_kernel(rng):
    x = nonzero_normal(rng, (1, 1, 40, 200))  # > FLAT_MAX_PIXELS out, like ESPCN
    w = nonzero_normal(rng, (64, 1, 5, 5))
    b = nonzero_normal(rng, (64,))
    a = _attrs({"pads": [2, 2, 2, 2]})
    got = nativeconv.conv2d(x, w, b, a, "tanh", {}, 1, {}, None, "rule")
    direct = nativeconv.conv2d(x, w, b, a, "tanh", {}, 1, {}, None, "direct")
    np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-5)


def test_forcing_it_on_a_strided_conv_is_an_error(rng):
    x = nonzero_normal(rng, (1, 1, 10, 10))
    w = nonzero_normal(rng, (8, 1, 3, 3))
    with pytest.raises(BackendError, match="smallc"):
        nativeconv.conv2d(x, w, None, _attrs({"strides": [2, 2]}), None, {}, 1, {}, None, "smallc")


def test_an_espcn_like_program_on_two_threads_matches_reference(rng, monkeypatch):
    """conv1 (smallc) -> tanh -> conv2 (Winograd), both on par.h's shared pool at 2 threads,
    against the reference backend."""
    import npurun
    from npurun.ir import parse
    g = parse("""
    op conv @c1 (x: [1, 1, 37, 150] f32, w: [64, 1, 5, 5] f32, b: [64] f32 -> u: [1, 64, 37, 150] f32) pads=[2,2,2,2]
    op tanh @t1 (u: [1, 64, 37, 150] f32 -> v: [1, 64, 37, 150] f32)
    op conv @c2 (v: [1, 64, 37, 150] f32, w2: [32, 64, 3, 3] f32 -> z: [1, 32, 37, 150] f32) pads=[1,1,1,1]
    """)
    for nm, shape in (("w", (64, 1, 5, 5)), ("b", (64,)), ("w2", (32, 64, 3, 3))):
        g.values[nm].data = nonzero_normal(rng, shape) * 0.2
    g.inputs = ["x"]
    calls = []
    real = nativeconv._smallc
    monkeypatch.setattr(nativeconv, "_smallc", lambda *a: calls.append(a[8]) or real(*a))
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # several bands on the pool
    monkeypatch.setattr(nativeconv, "FLAT_MAX_PIXELS", 0)  # images this small go to conv_gemm.c on AVX-512
    monkeypatch.setenv("NPURUN_CONV_TUNE", "0")  # the rule's pick, not the fastest measured here
    x = nonzero_normal(rng, (1, 1, 37, 150))
    got = npurun.Executor("cpu", parallelism=2).run_sync(g, {"x": x})["z"]
    want = npurun.Executor("reference").run_sync(g, {"x": x})["z"]
    assert calls == [2]  # conv1 went through smallc, on 2 threads
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
