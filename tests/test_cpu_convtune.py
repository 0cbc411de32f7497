"""Conv kernels chosen by measurement (npurun/backends/cpu/convtune.py), and the im2col + packed
sgemm kernel that is one of the candidates, against the reference conv on fresh random inputs.
Timings are never asserted: the choice is driven by a fake clock where a test needs a given one."""

import json
import time

import numpy as np
import pytest

from npurun.backends import pieces
from npurun.errors import BackendError
from npurun.backends.cpu import convtune, native, nativeconv
from npurun.backends.reference.kernels import KERNELS

from conftest import nonzero_normal
from test_cpu_native import FLAT_CONVS, _attrs, check_conv

pytestmark = pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")

# im2col reads a zero-padded copy: convs with negative pads (crops) are not its job
GEMM_CONVS = [c for c in FLAT_CONVS if min(c[2].get("pads", [0])) >= 0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(GEMM_CONVS)))
def test_gemm_conv_matches_reference(case, threads, rng):
    """algo="gemm": NumPy's BLAS at 1 thread; at 2 the packed sgemm on the library's pool, the
    im2col matrix packed into its panels each call, then the activation."""
    xs, ws, a = GEMM_CONVS[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.3
    b = nonzero_normal(rng, ws[:1])
    check_conv("gemm", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, None,
               acts=(None, "relu", "silu", "clip"))



BATCHED = [  # several small images: a panel of output pixels spans images
    ((64, 32, 1, 21), (150, 32, 1, 10), {}),                                    # Keras Conv1D, deepcut
    ((7, 5, 9, 11), (6, 5, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((5, 4, 6, 6), (8, 4, 3, 3), {"pads": [0, 1, 2, 1], "dilations": [1, 2]}),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(BATCHED)))
def test_gemm_conv_on_a_batch_of_small_images(case, threads, rng):
    """algo="gemm" on a batch whose images are smaller than a panel (the pixels of all images
    are one run of panels): the reference's result, and bit for bit one image at a time."""
    xs, ws, a = BATCHED[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.3
    b = nonzero_normal(rng, ws[:1])
    check_conv("gemm", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, None, acts=(None, "relu", "silu"))
    whole = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, {}, None, "gemm")
    one = [nativeconv.conv2d(x[i:i + 1], w, b, _attrs(a), "relu", {}, threads, {}, None, "gemm") for i in range(len(x))]
    assert np.array_equal(whole, np.concatenate(one))


GROUPED = [  # pointwise convs' panels packed and multiplied in groups (im2col_gemm.c, pw_group)
    ((1, 300, 28, 28), (37, 300, 1, 1), {}),    # 49 panels in groups of 13: ends mid-row
    ((3, 40, 7, 9), (24, 40, 1, 1), {}),        # 189 pixels over 3 images: runs cut at image ends
    ((1, 4200, 3, 5), (9, 4200, 1, 1), {}),     # K1 x 16 floats > 256 KB: one panel a group
    ((2, 8, 1, 1), (70, 8, 1, 1), {}),          # fewer pixels than a panel
    ((1, 64, 29, 27), (20, 64, 3, 3), {"pads": [1, 1, 1, 1]}),                    # 3x3: a panel at a time
    ((2, 48, 23, 25), (16, 48, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),  # stride 2, 2 images
    # whole panels in one image go straight to the output (the input read in place where
    # pointwise), the others through the tile: groups of 4 panels over two 96-pixel images
    # (the middle group straddles them), and 3x3 panels straddling two 35-pixel images
    ((2, 1023, 8, 12), (20, 1023, 1, 1), {}),
    ((2, 6, 5, 7), (16, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(GROUPED)))
def test_gemm_conv_in_groups_of_panels(case, threads, rng):
    """A pointwise conv's panels are packed and multiplied a group at a time (others' one at a
    time), or read in place where a group's panels are whole and in one image: the reference's
    result with every epilogue, and the very bits of one image at a time and of the other
    thread count (each panel is the same product whatever group, chunk or path it falls in)."""
    xs, ws, a = GROUPED[case]
    x = nativeconv.empty(xs)  # on a cache line, as a conv's output is (the in-place read needs it)
    x[...] = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.1
    b = nonzero_normal(rng, ws[:1])
    check_conv("gemm", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, None,
               acts=(None, "relu", "silu", "clip"))
    whole = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, {}, None, "gemm")
    one = [nativeconv.conv2d(x[i:i + 1], w, b, _attrs(a), "relu", {}, threads, {}, None, "gemm") for i in range(len(x))]
    assert np.array_equal(whole, np.concatenate(one))
    other = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, 3 - threads, {}, None, "gemm")
    assert np.array_equal(whole, other)


@pytest.mark.parametrize("width", [16, 17, 23, 31, 32, 33, 47])
@pytest.mark.parametrize("k,pad,dil", [(3, 1, 1), (3, 0, 1), (5, 2, 1), (3, 2, 2), (1, 0, 1)])
def test_stride_2_im2col_gathers_match_reference(width, k, pad, dil, rng):
    """im2col_gemm.c's columns of a stride-2 conv: rows of every parity and length, padding on
    either side, dilations, a batch."""
    x = nonzero_normal(rng, (2, 5, 9, width))
    w = nonzero_normal(rng, (12, 5, k, k)) * 0.3
    b = nonzero_normal(rng, (12,))
    a = {"strides": [2, 2], "pads": [pad] * 4, "dilations": [dil, dil]}
    want = KERNELS["conv"](x, w, b, **_attrs(a))
    got = nativeconv.conv2d(x, w, b, _attrs(a), None, None, 1, {}, None, "gemm")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


TGEMM = [  # pointwise convs as the transposed product: pixels off the 6-row block, channels off the panel
    ((1, 300, 7, 7), (37, 300, 1, 1)),
    ((3, 40, 7, 9), (24, 40, 1, 1)),
    ((2, 8, 1, 1), (70, 8, 1, 1)),
    ((1, 64, 14, 14), (160, 64, 1, 1)),
    ((1, 17, 5, 3), (33, 17, 1, 1)),
    ((2, 33, 5, 5), (70, 33, 1, 1)),  # 5 panels: pixels packed (25: a ragged last block)
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(TGEMM)))
def test_transposed_pointwise_conv_matches_reference(case, threads, rng):
    """algo="tgemm": output channels in the vectors, the input read in place, each tile written
    back into the planes; the reference's result with every epilogue, and the same bits at
    either thread count (each panel of channels is the same product in any band: at 2 threads
    a band of fewer than 4 panels reads the input in place, 4 or more pack it first)."""
    xs, ws = TGEMM[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.1
    b = nonzero_normal(rng, ws[:1])
    check_conv("tgemm", x, w, b, {}, KERNELS["conv"](x, w, b, **_attrs({})), threads, None,
               acts=(None, "relu", "silu", "clip", "hard_swish"))
    whole = nativeconv.conv2d(x, w, b, _attrs({}), "relu", {}, threads, {}, None, "tgemm")
    other = nativeconv.conv2d(x, w, b, _attrs({}), "relu", {}, 3 - threads, {}, None, "tgemm")
    assert np.array_equal(whole, other)
    with pytest.raises(BackendError, match="algo='tgemm' needs pads >= 0"):
        nativeconv.conv2d(nonzero_normal(rng, (1, xs[1], 5, 5)), w, b, _attrs({"pads": [-1, 0, 0, 0]}), None, None,
                          threads, {}, None, "tgemm")


TGEMM_K = [  # any other dense conv as the transposed product over im2col^T (gemm_mt.c npr_tconvk_range_mt)
    ((1, 256, 7, 7), (64, 256, 3, 3), {"pads": [1, 1, 1, 1]}),                     # ResNet's last stage
    ((2, 24, 14, 13), (40, 24, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),  # stride 2, a batch
    ((1, 3, 90, 90), (20, 3, 7, 7), {"strides": [1, 1], "pads": [3, 3, 3, 3]}),    # 8,100 pixels: 5 groups
    ((1, 9, 11, 10), (17, 9, 5, 3), {"pads": [2, 0, 1, 2], "dilations": [2, 1]}),  # dilated, uneven pads
    ((1, 16, 9, 9), (33, 16, 1, 1), {"strides": [2, 2]}),                          # strided 1x1
    ((1, 5, 6, 7), (7, 5, 2, 2), {}),                                              # fewer pixels than 2 blocks
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(TGEMM_K)))
def test_transposed_conv_over_im2col_matches_reference(case, threads, rng):
    """algo="tgemm" on convs that are not pointwise: the padded input copied, im2col^T packed a
    group of pixel blocks at a time; the reference's result with every epilogue, and the same
    bits at either thread count (pieces: tests/test_pieces.py)."""
    xs, ws, a = TGEMM_K[case]
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, ws) * 0.1
    b = nonzero_normal(rng, ws[:1])
    check_conv("tgemm", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, None,
               acts=(None, "relu", "silu", "clip", "hard_swish"))
    whole = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, {}, None, "tgemm")
    other = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, 3 - threads, {}, None, "tgemm")
    assert np.array_equal(whole, other)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_rule_runs_one_row_convs_as_the_transposed_product(threads, rng, monkeypatch):
    """Where convtune does not measure, a conv of one output row with a window wider than a
    pixel (a 1-D conv) runs as the transposed product, which splits channels over the threads
    (the implicit GEMM splits rows: it had one); the reference's result. A 2-D conv and a
    pointwise row keep the other kernels."""
    monkeypatch.setenv("NPURUN_CONV_TUNE", "0")
    cases = [((1, 12, 1, 50), (16, 12, 1, 3), {"strides": [1, 2]}, True),
             ((2, 5, 1, 40), (8, 5, 1, 4), {"pads": [0, 1, 0, 2], "dilations": [1, 2]}, True),
             ((1, 12, 5, 50), (16, 12, 1, 3), {}, False), ((1, 12, 1, 50), (16, 12, 1, 1), {}, False)]
    for xs, ws, a, one_row in cases:
        x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
        cache = {}
        got = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, cache)
        want = KERNELS["conv"](x, w, b, activation="relu", activation_params=(), **_attrs(a))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert ("tgemm" in cache) == one_row, (xs, ws, a)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_rule_runs_grouped_convs_on_small_maps_as_the_transposed_product(threads, rng, monkeypatch):
    """Where convtune does not measure, a grouped conv (not depthwise) with at most
    TGEMM_MAX_PIXELS outputs runs each group as the transposed product, whole groups on the
    threads; on a bigger map wide groups keep their own dense convs. The reference's result."""
    monkeypatch.setenv("NPURUN_CONV_TUNE", "0")
    cases = [((1, 64, 14, 14), (64, 8, 3, 3), 8, {"pads": [1, 1, 1, 1]}, "tgemm"),
             ((1, 48, 1, 49), (48, 12, 1, 9), 4, {"pads": [0, 4, 0, 4]}, "tgemm"),
             ((1, 64, 24, 25), (64, 32, 3, 3), 2, {"pads": [1, 1, 1, 1]}, "groups")]
    for xs, ws, g, a, kind in cases:
        a = {**a, "group": g}
        x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
        cache = {}
        got = nativeconv.conv2d(x, w, b, _attrs(a), None, {}, threads, cache)
        want = KERNELS["conv"](x, w, b, **_attrs(a))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=3e-5 * float(np.abs(want).max()))
        assert kind in cache and ({"tgemm", "groups"} - {kind}).isdisjoint(cache), (xs, ws, g, kind)


TGEMM_GROUPED = [  # input, weights, group, attributes: each group as the transposed product
    ((1, 16, 9, 11), (24, 4, 3, 3), 4, {"pads": [1, 1, 1, 1]}),
    ((2, 12, 7, 6), (12, 4, 1, 1), 3, {}),
    ((1, 8, 10, 10), (16, 1, 3, 3), 8, {"strides": [2, 2], "pads": [1, 0, 2, 1]}),  # 2 outputs a channel
    ((1, 64, 14, 14), (64, 8, 3, 3), 8, {"pads": [1, 1, 1, 1], "dilations": [2, 1]}),
    ((3, 20, 1, 30), (20, 5, 1, 5), 4, {"pads": [0, 2, 0, 2], "dilations": [1, 2]}),  # 1-D
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(TGEMM_GROUPED)))
def test_grouped_conv_as_the_transposed_product_matches_reference(case, threads, rng):
    """A grouped conv with algo="tgemm" (gemm_mt.c npr_tconvk_groups_mt: whole groups on the
    threads): the reference's result with every epilogue, and the same bits at 1, 2 and 3
    threads."""
    xs, ws, g, a = TGEMM_GROUPED[case]
    a = {**a, "group": g}
    x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
    check_conv("tgemm", x, w, b, a, KERNELS["conv"](x, w, b, **_attrs(a)), threads, None,
               acts=(None, "relu", "silu", "clip", "hard_swish"))
    outs = [nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, t, {}, None, "tgemm") for t in (1, 2, 3)]
    assert all(np.array_equal(outs[0], o) for o in outs)


PLANNED = [  # algo, input, weights, attributes: each plan's bound calls (one image: direct, Winograd)
    ("gemm", (2, 24, 6, 5), (40, 24, 1, 1), {}), ("tgemm", (2, 24, 6, 5), (40, 24, 1, 1), {}),
    ("gemm", (1, 8, 9, 11), (12, 8, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("direct", (1, 8, 9, 11), (12, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("direct", (1, 16, 20, 20), (24, 16, 1, 1), {}),  # a pointwise conv's flat row
    ("winograd", (1, 16, 13, 10), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(PLANNED)))
def test_a_planned_conv_reads_each_calls_own_arrays(case, threads, rng, monkeypatch):
    """Plans bind their kernel calls once (native.bound): later calls through a node's memo
    (conv_step) must read their own input and write a fresh output."""
    algo, xs, ws, a = PLANNED[case]
    monkeypatch.setattr(nativeconv, "MIN_FLOPS_PER_BAND", 1)  # several bands even for these small convs
    w, b = nonzero_normal(rng, ws) * 0.1, nonzero_normal(rng, ws[:1])
    cache, outs = {}, []
    for _ in range(4):
        x = nonzero_normal(rng, xs)
        y = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, cache, None, algo, memo=True)
        np.testing.assert_allclose(y, np.maximum(KERNELS["conv"](x, w, b, **_attrs(a)), 0), rtol=1e-4, atol=1e-4)
        assert all(not np.shares_memory(y, o) for o in outs)
        outs.append(y)
    assert ("memo", xs) in cache


TUNED = [  # big enough to be measured, each with several candidates
    ((1, 32, 20, 20), (48, 32, 3, 3), {"pads": [1, 1, 1, 1]}),   # 3x3: + winograd
    ((1, 64, 14, 14), (96, 64, 1, 1), {}),                        # 1x1
    ((1, 16, 41, 39), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty table of choices in a file of its own, tuning on, the device not contended."""
    monkeypatch.setattr(convtune, "_choices", {})
    monkeypatch.setattr(convtune, "_loaded", [])
    monkeypatch.setenv("NPURUN_CONV_TUNE_FILE", str(tmp_path / "tune.json"))
    monkeypatch.delenv("NPURUN_CONV_TUNE", raising=False)
    monkeypatch.setattr(pieces, "wanted", lambda *a: False)
    return tmp_path / "tune.json"


def new_process(monkeypatch):
    """What another process sees: nothing in memory, the file on disk."""
    monkeypatch.setattr(convtune, "_choices", {})
    monkeypatch.setattr(convtune, "_loaded", [])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(TUNED)))
def test_tuned_conv_measures_once_and_runs_its_pick(case, threads, rng, fresh, monkeypatch):
    xs, ws, a = TUNED[case]
    x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
    timed = []
    real = convtune._time
    monkeypatch.setattr(convtune, "_time", lambda run, algo: timed.append(algo) or real(run, algo))
    cache = {}
    y1 = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, cache)
    (key, pick), = convtune.choices().items()
    assert timed[:len(set(timed))] == list(dict.fromkeys(timed)) and len(set(timed)) >= 3  # every candidate, once first
    assert pick in timed
    n = len(timed)
    y2 = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, {})  # another node of the shape
    assert len(timed) == n  # no second measurement
    forced = nativeconv.conv2d(x, w, b, _attrs(a), "relu", {}, threads, {}, algo=pick)
    np.testing.assert_array_equal(y1, forced)
    np.testing.assert_array_equal(y2, forced)
    want = np.maximum(KERNELS["conv"](x, w, b, **_attrs(a)), 0)
    # (Winograd's transforms round more than a direct sum: its test's bound, 3e-5 of the largest)
    np.testing.assert_allclose(y1, want, rtol=1e-4, atol=3e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("fastest", ["gemm", "flat", "direct", "winograd"])
def test_the_fastest_candidate_is_picked(fastest, rng, fresh, monkeypatch):
    """A fake clock: `fastest` takes 1, the rule's pick 1.4 (timed ROUNDS more times in turn:
    within 1.5x), the rest 5 (not timed again)."""
    xs, ws, a = TUNED[0]
    x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
    seen = []

    def fake(run, algo):
        seen.append(algo)
        return 1.0 if algo == fastest else 1.4 if algo == "rule" else 5.0
    monkeypatch.setattr(convtune, "_time", fake)
    cache = {}
    y = nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, cache)
    assert list(convtune.choices().values()) == [fastest]
    again = 1 + convtune.ROUNDS
    assert seen.count("direct") == (again if fastest == "direct" else 1)  # 5 > 1.5 x 1: not again
    assert seen.count("rule") == again and seen.count(fastest) == again
    np.testing.assert_array_equal(y, nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, {}, algo=fastest))
    if fastest == "gemm":
        assert "gemm" in cache  # the node's later calls run it (its packed weights are there)


def test_a_burst_in_one_call_does_not_decide(rng, fresh, monkeypatch):
    """A fake clock where "flat" takes 1.0 but one of its calls is caught in a neighbour's
    burst (1.6) and the rule's pick takes 1.2 every time: the fastest call of each decides."""
    xs, ws, a = TUNED[0]
    x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
    flat_calls = []

    def fake(run, algo):
        if algo == "flat":
            flat_calls.append(1)
            return 1.6 if len(flat_calls) == 2 else 1.0
        return 1.2 if algo == "rule" else 5.0
    monkeypatch.setattr(convtune, "_time", fake)
    nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, {})
    assert list(convtune.choices().values()) == ["flat"]


@pytest.mark.parametrize("fastest", ["gemm", "flat", "winograd"])
def test_only_the_pick_keeps_its_packed_weights(fastest, rng, fresh, monkeypatch):
    """Every candidate runs (and packs its weights) while measured; the node's cache keeps the
    winner's packs only, and its later calls are the winner's."""
    xs, ws, a = TUNED[0]
    x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
    ran = []

    def fake(run, algo):
        run(algo)
        ran.append(algo)
        return 1.0 if algo == fastest else 1.4 if algo == "rule" else 5.0
    monkeypatch.setattr(convtune, "_time", fake)
    cache = {}
    y = nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, cache)
    assert {"gemm", "flat", "winograd"} <= set(ran)
    packs = {k if isinstance(k, str) else k[0] for k in cache if k[0] not in ("plan", "tuned")}
    assert packs == {{"gemm": "gemm", "flat": "flat", "winograd": "wino"}[fastest]}
    np.testing.assert_array_equal(y, nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, {}, algo=fastest))
    np.testing.assert_array_equal(y, nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, cache))


def test_each_candidate_runs_once_untimed_before_it_is_timed(fresh, monkeypatch):
    """A candidate's first call packs its weights (and may start the pool): never timed."""
    events = []

    def fake(run, algo):
        events.append(("timed", algo))
        return {"rule": 3.0, "direct": 1.0, "flat": 2.0}[algo]
    monkeypatch.setattr(convtune, "_time", fake)
    pick, final = convtune.choose(("k",), 1e7, ["rule", "direct", "flat"], lambda a: events.append(("ran", a)))
    assert (pick, final) == ("direct", True)
    assert events[:6] == [("ran", "rule"), ("timed", "rule"), ("ran", "direct"), ("timed", "direct"),
                          ("ran", "flat"), ("timed", "flat")]


def test_not_measured_when_off_contended_or_out_of_range(rng, fresh, monkeypatch):
    xs, ws, a = TUNED[1]
    x, w, b = nonzero_normal(rng, xs), nonzero_normal(rng, ws) * 0.3, nonzero_normal(rng, ws[:1])
    rule = nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, {}, algo="rule")
    monkeypatch.setenv("NPURUN_CONV_TUNE", "0")
    np.testing.assert_array_equal(nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, {}), rule)
    assert convtune.choices() == {}
    monkeypatch.delenv("NPURUN_CONV_TUNE")
    monkeypatch.setattr(pieces, "wanted", lambda *a: True)  # another task on the device
    cache = {}
    np.testing.assert_array_equal(nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, cache), rule)
    assert convtune.choices() == {} and not any(k[0] == "tuned" for k in cache if isinstance(k, tuple))
    monkeypatch.setattr(pieces, "wanted", lambda *a: False)  # ... gone: measured on the next call
    nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, cache)
    assert len(convtune.choices()) == 1
    new_process(monkeypatch)
    fresh.unlink()
    monkeypatch.setattr(convtune, "TUNE_MIN_FLOPS", 1e12)  # too small to matter: the rule, for good
    cache = {}
    np.testing.assert_array_equal(nativeconv.conv2d(x, w, b, _attrs(a), None, {}, 1, cache), rule)
    assert convtune.choices() == {} and cache[("tuned", xs, 1, None)] == "rule"


def test_depthwise_convs_choose_between_their_kernels_grouped_ones_between_the_rule_and_tgemm(rng, fresh, monkeypatch):
    monkeypatch.setattr(convtune, "TUNE_MIN_FLOPS", 0)
    xs, ws, a = ((1, 32, 20, 20), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]})
    x, w = nonzero_normal(rng, xs), nonzero_normal(rng, ws)
    want = KERNELS["conv"](x, w, None, **_attrs(a))
    kernels = {"rule", "direct", "dw_lanes"} | ({"dw_flat"} if native.ISA == "avx512" else set())  # (20x20 fits it)
    for fastest in sorted(kernels - {"rule"}):
        new_process(monkeypatch)
        fresh.unlink(missing_ok=True)
        seen = fake_clock(monkeypatch, {"rule": 1.0, fastest: 0.5})
        y = nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 1, {})
        assert set(seen) == kernels and list(convtune.choices().values()) == [fastest]
        np.testing.assert_array_equal(y, nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 1, {}, algo=fastest))
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=2e-5)
    new_process(monkeypatch)
    fresh.unlink()
    xs, ws, a = ((1, 16, 20, 20), (16, 4, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]})
    x, w = nonzero_normal(rng, xs), nonzero_normal(rng, ws)
    for fastest in ("tgemm", "rule"):
        new_process(monkeypatch)
        fresh.unlink(missing_ok=True)
        seen = fake_clock(monkeypatch, {"rule": 1.0, "tgemm": 0.5 if fastest == "tgemm" else 2.0})
        y = nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 1, {})
        assert set(seen) == {"rule", "tgemm"} and list(convtune.choices().values()) == [fastest]
        np.testing.assert_allclose(y, KERNELS["conv"](x, w, None, **_attrs(a)), rtol=1e-4, atol=2e-5)


def test_candidates_follow_each_kernels_preconditions():
    g3 = (3, 3, 1, 1, 1, 1, 1, 1)
    assert convtune.candidates(32, 32, 1, g3, 20, 20, [1, 1], [1, 1]) == ["rule", "direct", "flat", "gemm", "winograd",
                                                                         "tgemm"]
    assert convtune.candidates(32, 32, 1, g3, 20, 20, [-1, 1], [1, 1]) == ["rule", "direct", "winograd"]  # a crop
    assert "winograd" not in convtune.candidates(32, 32, 1, (3, 3, 2, 2, 1, 1, 1, 1), 10, 10, [1, 1], [0, 0])
    assert convtune.candidates(32, 32, 2, g3, 20, 20, [1, 1], [1, 1]) == ["rule", "tgemm"]  # grouped
    assert convtune.candidates(32, 32, 2, g3, 20, 20, [-1, 1], [1, 1]) == []  # grouped, a crop
    g1 = (1, 1, 1, 1, 1, 1, 0, 0)
    assert convtune.candidates(64, 96, 1, g1, 14, 14, [0, 0], [0, 0]) == ["rule", "direct", "flat", "gemm", "tgemm"]
    assert "tgemm" not in convtune.candidates(64, 96, 1, g1, 28, 28, [0, 0], [0, 0])  # pointwise, 784 pixels
    assert "tgemm" in convtune.candidates(64, 96, 1, (1, 1, 2, 2, 1, 1, 0, 0), 7, 7, [0, 0], [0, 0])  # strided: im2col^T
    big = convtune.candidates(512, 64, 1, g3, 400, 400, [1, 1], [1, 1])  # im2col of 2.9 GB, padded input 330 MB
    assert "gemm" not in big and "tgemm" not in big and "flat" in big
    assert convtune.dw_candidates([1, 1]) == ["rule", "direct", "dw_lanes"]
    assert convtune.dw_candidates([0, -1]) == []  # a crop: the per-channel kernel alone
    assert convtune.dw_candidates([1, 1], flat=True) == ["rule", "direct", "dw_lanes", "dw_flat"]
    assert convtune.dw_candidates([-1, 1], flat=True) == ["rule", "direct", "dw_flat"]


def fake_clock(monkeypatch, times: dict):
    seen = []
    monkeypatch.setattr(convtune, "_time", lambda run, algo: seen.append(algo) or times.get(algo, 5.0))
    return seen


def test_a_near_tie_keeps_the_rule(rng, fresh, monkeypatch):
    xs, ws, a = TUNED[0]
    x, w = nonzero_normal(rng, xs), nonzero_normal(rng, ws)
    fake_clock(monkeypatch, {"rule": 1.0, "gemm": 0.95})  # 5% faster: within MARGIN
    nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 1, {})
    assert list(convtune.choices().values()) == ["rule"]


def test_a_choice_another_process_wrote_after_this_one_read_the_file_is_used(rng, fresh, monkeypatch, tmp_path):
    """Two processes of one machine (a Ray worker and its driver): this one has read the file
    and measured shape A; the other then writes its pick for shape B (and another for A). This
    one's first call of B runs the other's pick, unmeasured, so both give the same bits; its
    own choice for A stays as it was."""
    (xa, wa, aa), (xb, wb, ab) = [(nonzero_normal(rng, xs), nonzero_normal(rng, ws), a) for xs, ws, a in TUNED[:2]]
    fake_clock(monkeypatch, {"rule": 1.0, "gemm": 0.5})
    nativeconv.conv2d(xa, wa, None, _attrs(aa), None, {}, 1, {})
    (key_a, pick_a), = convtune.choices().items()
    # B's key, as the other process would write it (measured against a file of its own)
    monkeypatch.setattr(convtune, "_choices", {})
    monkeypatch.setattr(convtune, "_loaded", [])
    monkeypatch.setenv("NPURUN_CONV_TUNE_FILE", str(tmp_path / "other.json"))
    nativeconv.conv2d(xb, wb, None, _attrs(ab), None, {}, 1, {})
    (key_b, _), = convtune.choices().items()
    # back to this process as it was (A measured, the file read), then the other one's write
    monkeypatch.setattr(convtune, "_choices", {key_a: pick_a})
    monkeypatch.setattr(convtune, "_loaded", [fresh, convtune._stamp(fresh)])
    monkeypatch.setenv("NPURUN_CONV_TUNE_FILE", str(fresh))
    other = {key_a: "flat" if pick_a != "flat" else "direct", key_b: "flat"}
    time.sleep(0.01)  # (a new mtime on coarse clocks)
    fresh.write_text(json.dumps({"machines": {convtune.machine(): other}}))
    seen = fake_clock(monkeypatch, {"rule": 1.0, "direct": 0.4})
    y = nativeconv.conv2d(xb, wb, None, _attrs(ab), None, {}, 1, {})
    assert seen == [] and convtune.choices()[key_b] == "flat"  # the other's pick, not measured again
    np.testing.assert_array_equal(y, nativeconv.conv2d(xb, wb, None, _attrs(ab), None, {}, 1, {}, algo="flat"))
    assert convtune.choices()[key_a] == pick_a  # this process's own: unchanged


def test_choices_persist_for_later_processes(rng, fresh, monkeypatch):
    """The same kernel in every later process of this machine (no rounding that changes from
    one run to the next), without measuring again; another machine's entries are not used."""
    xs, ws, a = TUNED[1]
    x, w = nonzero_normal(rng, xs), nonzero_normal(rng, ws)
    fake_clock(monkeypatch, {"rule": 1.0, "flat": 0.5})
    y = nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 2, {})
    data = json.loads(fresh.read_text())
    assert list(data["machines"][convtune.machine()].values()) == ["flat"]
    new_process(monkeypatch)
    seen = fake_clock(monkeypatch, {"rule": 1.0, "gemm": 0.1})  # would pick gemm if it measured
    np.testing.assert_array_equal(nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 2, {}), y)
    assert seen == []
    data["machines"] = {"another CPU": data["machines"][convtune.machine()]}
    fresh.write_text(json.dumps(data))
    new_process(monkeypatch)
    nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 2, {})
    assert seen and list(convtune.choices().values()) == ["gemm"]
    assert set(json.loads(fresh.read_text())["machines"]) == {"another CPU", convtune.machine()}


@pytest.mark.parametrize("junk", ["", "{", "[1, 2]", '{"machines": 3}', '{"machines": {"%s": {"k": 1}}}'])
def test_a_damaged_file_is_measured_afresh_and_rewritten(junk, rng, fresh, monkeypatch):
    fresh.write_text(junk.replace("%s", convtune.machine()))
    xs, ws, a = TUNED[1]
    x, w = nonzero_normal(rng, xs), nonzero_normal(rng, ws)
    fake_clock(monkeypatch, {"rule": 1.0, "direct": 0.5})
    nativeconv.conv2d(x, w, None, _attrs(a), None, {}, 1, {})
    assert list(json.loads(fresh.read_text())["machines"][convtune.machine()].values()) == ["direct"]
