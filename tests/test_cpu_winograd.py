"""Winograd F(4x4, 3x3) (csrc/winograd.c) against the reference conv, on fresh random non-zero
inputs: ragged images (H, W not multiples of the 4x4 tile nor of a vector of tiles, more than
one block of tiles across), channel counts off the vector width and the GEMM tile, asymmetric
padding, with and without bias, every fused activation, 1 and 2 threads, every ISA this CPU
runs; plus the cost rule and the choice a whole program makes.

Tolerance: F(4x4) is a few bits less precise than a direct conv, so the error is bounded
relative to the largest output (3e-5 of it; measured ~5e-6, the backend allows 1e-4)."""

import numpy as np
import pytest

import npurun
from npurun.errors import BackendError
from npurun.backends.cpu import native, nativeconv, winograd
from npurun.backends.reference.kernels import KERNELS
from npurun.ir import parse

from conftest import nonzero_normal
from test_cpu_native import _attrs, _ref_act, check_conv

pytestmark = pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")

CONVS = [  # (N, C, H, W), M, attrs; every one is 3x3 stride 1
    ((1, 16, 19, 70), 9, {"pads": [1, 1, 1, 1]}),                  # ragged tiles, M < one GEMM tile
    ((2, 20, 13, 9), 17, {"pads": [0, 1, 2, 0]}),                  # batch 2, asymmetric pads
    ((1, 24, 8, 8), 30, {}),                                       # no padding: 6x6 output
    ((1, 17, 21, 300), 13, {"pads": [1, 1, 1, 1]}),                # 75 tiles across: 2 blocks
    ((1, 33, 11, 47), 26, {"auto_pad": "SAME_UPPER"}),
    ((1, 3, 10, 37), 5, {"pads": [2, 2, 2, 2]}),                   # few channels, wide padding
    ((1, 64, 12, 40), 32, {"pads": [1, 1, 1, 1]}),                 # ESPCN's middle layer, small
    ((1, 16, 9, 613), 11, {"pads": [1, 1, 1, 1]}),                 # blocks read in place (AVX-512)
]
REL = 3e-5


def _check(got, want_pre, act):
    np.testing.assert_allclose(got, _ref_act(want_pre, act), rtol=1e-4,
                               atol=REL * float(np.abs(want_pre).max()), err_msg=f"act={act}")


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_winograd_matches_reference(case, threads, isa, rng, monkeypatch):
    xs, m, a = CONVS[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, (m, xs[1], 3, 3)) * 0.3
    b = nonzero_normal(rng, (m,)) if case % 2 == 0 else None  # with and without bias
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # several bands even here
    if threads == 2:  # non-temporal stores (big outputs only, normally) on the aligned rows
        monkeypatch.setattr(nativeconv, "STREAM_BYTES", 0)
    want = KERNELS["conv"](x.astype(np.float64), w.astype(np.float64),
                           None if b is None else b.astype(np.float64), **_attrs(a))
    check_conv("winograd", x, w, b, a, want, threads, isa, _check)


def test_winograd_error_is_small_relative_to_the_output(rng):
    """The accuracy claim of winograd.py: ~5e-6 of the largest output, at ESPCN's widths."""
    x = np.tanh(nonzero_normal(rng, (1, 64, 20, 44)))
    w, b = nonzero_normal(rng, (32, 64, 3, 3)) * 0.05, nonzero_normal(rng, (32,))
    a = _attrs({"pads": [1, 1, 1, 1]})
    want = KERNELS["conv"](x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **a)
    got = nativeconv.conv2d(x, w, b, a, None, {}, 1, {}, None, "winograd")
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_cost_rule(isa):
    espcn = (3, 3, 1, 1, 1, 1, 1, 1)
    assert winograd.chosen(64, 32, 1, espcn, 720, 1280, isa)
    assert winograd.chosen(32, 9, 1, espcn, 720, 1280, isa)
    assert winograd.chosen(64, 64, 1, espcn, 10, 10, isa)              # small, but enough work saved
    assert not winograd.chosen(256, 256, 1, espcn, 5, 5, isa)          # 5x5: mostly padded tiles
    assert not winograd.chosen(4, 32, 1, espcn, 720, 1280, isa)        # too few input channels
    assert not winograd.chosen(64, 32, 2, espcn, 720, 1280, isa)       # grouped
    assert not winograd.chosen(64, 32, 1, (3, 3, 2, 2, 1, 1, 1, 1), 360, 640, isa)  # strided
    assert not winograd.chosen(64, 32, 1, (3, 3, 1, 1, 2, 2, 2, 2), 720, 1280, isa)  # dilated
    assert not winograd.chosen(1, 64, 1, (5, 5, 1, 1, 1, 1, 2, 2), 720, 1280, isa)  # 5x5


def test_padded_tiles_follow_the_kernel_blocks():
    assert winograd.padded_tiles(320, 16) == 320                       # 5 full blocks of 64
    assert winograd.padded_tiles(75, 16) == 64 + 16                    # a block, then 11 -> one vector
    assert winograd.padded_tiles(100, 16) == 64 + 64                   # a block, then 36 -> 2 x 32
    assert winograd.padded_tiles(3, 16) == 16 and winograd.padded_tiles(3, 8) == 8
    assert winograd.work_ratio(720, 1280, 16) == 0.25


def test_forcing_winograd_on_another_shape_is_an_error(rng):
    x, w = nonzero_normal(rng, (1, 16, 9, 9)), nonzero_normal(rng, (8, 16, 3, 3))
    with pytest.raises(BackendError, match="3x3 stride-1 dilation-1 dense conv, got weights .* strides"):
        nativeconv.conv2d(x, w, None, _attrs({"strides": [2, 2]}), None, {}, 1, {}, None, "winograd")


def test_a_program_takes_winograd_where_the_rule_says_and_matches_reference(rng, monkeypatch):
    g = parse("""
    op conv @c1 (x: [1, 16, 30, 41] f32, w: [24, 16, 3, 3] f32, b: [24] f32 -> u: [1, 24, 30, 41] f32) pads=[1,1,1,1]
    op tanh @t1 (u: [1, 24, 30, 41] f32 -> v: [1, 24, 30, 41] f32)
    op conv @c2 (v: [1, 24, 30, 41] f32, w2: [9, 24, 3, 3] f32 -> z: [1, 9, 30, 41] f32) pads=[1,1,1,1]
    """)
    for nm, shape in (("w", (24, 16, 3, 3)), ("b", (24,)), ("w2", (9, 24, 3, 3))):
        g.values[nm].data = nonzero_normal(rng, shape) * 0.2
    g.inputs = ["x"]
    calls = []
    real = native.wino_fn
    monkeypatch.setattr(native, "wino_fn", lambda isa=None: calls.append(isa) or real(isa))
    monkeypatch.setattr(nativeconv, "FLAT_MAX_PIXELS", 0)  # images this small go to conv_gemm.c on AVX-512
    monkeypatch.setenv("NPURUN_CONV_TUNE", "0")  # the rule's pick, not the fastest measured here
    x = nonzero_normal(rng, (1, 16, 30, 41))
    got = npurun.Executor("cpu", parallelism=2).run_sync(g, {"x": x})["z"]
    want = npurun.Executor("reference").run_sync(g, {"x": x})["z"]
    assert len(calls) == 2  # both convs went through Winograd
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=REL * float(np.abs(want).max()) * 4)
