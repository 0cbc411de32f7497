"""The cpu backend's transformer kernels (csrc/transformer.c through cpu/ops/transformer.py,
cpu/ops/matmul.py and cpu/ops/fused.py) and the pipeline's fusions (passes/fuse_gelu.py,
fuse_masked_softmax.py, fuse_matmul_add.py, sink_gather.py) against the reference kernels, on
fresh random non-zero inputs: erf and GELU (with saturated and special values), LayerNorm
(ranks, axes, broadcast scale, no bias, 1 and 2 threads), softmax with and without a
broadcast mask and the NaN-row fix, the packed-weight sgemm with bias/residual epilogues
on every ISA the CPU runs, banded BLAS matmuls, a small encoder graph whose every pattern
fuses, and MiniLM-int8 through the fused program against ONNX Runtime."""
from types import SimpleNamespace

import numpy as np
import pytest

import npurun
from npurun.backends import pieces
from npurun.backends.cpu import native
from npurun.backends.cpu.ops import fused as F
from npurun.backends.cpu.ops import matmul as MM
from npurun.backends.cpu.ops import transformer as T
from npurun.backends.reference.kernels import KERNELS
from npurun.ir import parse

from conftest import nonzero_normal

pytestmark = pytest.mark.skipif(T.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")



def prog(threads):
    """What a kernel factory gets from the CpuProgram: its thread count."""
    return SimpleNamespace(threads=threads)


def compile_fused(g, threads=1):
    """A cpu program as every entry point compiles it: the graph through the cpu pipeline."""
    return npurun.Executor("cpu", parallelism=threads).compile(g)


def masked_softmax(p, nan_to, x, mask):
    return F.KERNELS["masked_softmax"](p)(x, mask, axis=-1, nan_fix=int(nan_to is not None),
                                           nan_value=0.0 if nan_to is None else nan_to)


@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 128, 96), (1, 17, 1, 9)])
def test_erf_matches_reference_to_2_ulp(rng, shape):
    x = nonzero_normal(rng, shape) * 2.5
    got = T.KERNELS["erf"](prog(1))(x)
    want = KERNELS["erf"](x)
    ulp = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert got.dtype == np.float32 and got.shape == shape and ulp.max() <= 2


def test_erf_on_a_dense_sweep_tiny_values_and_specials():
    x = np.concatenate([np.linspace(-5, 5, 200_001), np.geomspace(1e-30, 4.5, 20_000),
                        -np.geomspace(1e-30, 4.5, 20_000)]).astype(np.float32)
    got = T.KERNELS["erf"](prog(2))(x)  # big enough to be split over 2 threads
    want = KERNELS["erf"](x)
    ulp = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulp.max() <= 2
    s = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 7.0, -30.0], np.float32)
    got = T.KERNELS["erf"](prog(1))(s)
    np.testing.assert_array_equal(got, [0.0, -0.0, 1.0, -1.0, np.nan, 1.0, -1.0])
    assert np.signbit(got[1])


@pytest.mark.parametrize("threads", [1, 2])
def test_gelu_op_matches_reference(rng, threads):
    x = nonzero_normal(rng, (3, 300, 97)) * 3  # 87k elements: the 2-thread split runs
    got = T.KERNELS["gelu"](prog(threads))(x, approximate="none")
    want = KERNELS["gelu"](x, approximate="none")
    # For x << 0, 1 + erf(x / sqrt 2) cancels: erf's 2 ulp (1.2e-7) become that much of x.
    assert np.all(np.abs(got - want) <= 1e-6 * np.abs(want) + 1.5e-7 * np.abs(x))
    tanh = T.KERNELS["gelu"](prog(1))(x, approximate="tanh")  # csrc/transformer.c's mode 2
    np.testing.assert_allclose(tanh, KERNELS["gelu"](x, approximate="tanh"), rtol=1e-5, atol=2e-6)


LN_CASES = [  # x shape, axis, scale shape, with bias
    ((2, 5, 384), -1, (384,), True),
    ((3, 4, 7), 1, (4, 7), True),
    ((3, 4, 7), 1, (7,), False),      # scale broadcast over the normalized (4, 7)
    ((13,), 0, (13,), True),
    ((6, 1), -1, (1,), True),
    ((300, 257), -1, (257,), True),   # 77k elements: 2 bands at 2 threads
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", LN_CASES)
def test_layer_normalization_matches_reference(rng, case, threads):
    shape, axis, sshape, with_bias = case
    x = nonzero_normal(rng, shape) * 2 + 0.7
    scale = nonzero_normal(rng, sshape)
    bias = nonzero_normal(rng, sshape) if with_bias else None
    attrs = {"axis": axis, "epsilon": 1e-5, "stash_type": "f32"}
    got = T.KERNELS["layer_normalization"](prog(threads))(x, scale, bias, **attrs)
    want = KERNELS["layer_normalization"](x, scale, bias, **attrs)
    for g_, w_ in zip(got, want):
        assert g_.shape == w_.shape and g_.dtype == w_.dtype
        np.testing.assert_allclose(g_, w_, rtol=2e-5, atol=2e-5)


SOFTMAX_MASKS = [  # scores shape, mask shape (None: plain softmax)
    ((1, 12, 16, 16), None),
    ((2, 3, 5, 13), (2, 1, 1, 13)),   # a mask per batch, broadcast over heads and queries
    ((1, 4, 9, 9), (1, 1, 9, 9)),     # one per query, shared by the heads
    ((1, 4, 9, 9), (4, 1, 9)),        # one per head, lower rank
    ((2, 3, 5, 7), (2, 3, 5, 7)),     # full
    ((3, 5, 7), (7,)),
    ((2, 3, 5, 7), (2, 1, 5, 7)),     # batch and query axes, not one run: reference path
    ((120, 600), (600,)),             # 72k elements: 2 bands
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shapes", SOFTMAX_MASKS)
def test_masked_softmax_matches_reference(rng, shapes, threads):
    xs, ms = shapes
    x = nonzero_normal(rng, xs) * 4
    mask = None if ms is None else nonzero_normal(rng, ms) * 3
    if mask is not None:  # masked-out keys, and (for one query) every key masked
        mask.reshape(-1, ms[-1])[:, :2] = -np.inf
        mask.reshape(-1)[: ms[-1]] = -np.inf
    p = prog(threads)
    with np.errstate(invalid="ignore"):
        want = KERNELS["softmax"](x if mask is None else x + mask, axis=-1)
        got = masked_softmax(p, None, x, mask)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
        fixed = masked_softmax(p, 0.25, x, mask)
    np.testing.assert_allclose(fixed, np.where(np.isnan(want), np.float32(0.25), want), rtol=2e-6, atol=1e-7)
    assert fixed.dtype == np.float32
    if mask is not None:  # the add is commutative: the mask may come first
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(masked_softmax(p, None, mask, x), want, rtol=2e-6, atol=1e-7)


def test_softmax_rows_with_nan_or_inf_come_out_nan_like_the_reference():
    x = np.array([[1, 2, np.nan] * 3, [-np.inf] * 9, [np.inf, 1, 2] * 3, [-np.inf, 0, 1] * 3], np.float32)
    with np.errstate(invalid="ignore"):
        got, want = T.KERNELS["softmax"](prog(1))(x, axis=-1), KERNELS["softmax"](x, axis=-1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # rows 0-2 all NaN
    np.testing.assert_allclose(got[3], want[3], rtol=2e-7)
    y = nonzero_normal(np.random.default_rng(1), (3, 4, 5))
    np.testing.assert_array_equal(T.KERNELS["softmax"](prog(1))(y, axis=1), KERNELS["softmax"](y, axis=1))


@pytest.mark.skipif("avx512" not in native.conv_isas(), reason="this CPU has no AVX-512")
def test_softmax_avx512_is_the_avx2_kernel_bit_for_bit(rng):
    """transformer.c's AVX-512 softmax (exp on 16 lanes, 2^n by vscalefps, a 16-lane sum that is
    the AVX2 loop's two 8-lane ones) gives the AVX2 kernel's bits: rows of 1 to 700 (every tail),
    masked and not, scores down to exp's cut-off, NaN / inf rows with and without the fix."""
    from npurun.backends.cpu.native import ptr
    for n in list(range(1, 40)) + [64, 127, 128, 197, 677]:
        rows = 5
        x = nonzero_normal(rng, (rows, n)) * float(rng.choice([1, 10, 40]))
        x[0, : n // 2] -= 95  # near and past exp's cut-off (-87.3 from the row's max)
        if n > 2:
            x[1, 1], x[2, 0] = np.nan, np.inf
        mask = nonzero_normal(rng, (n,)) * 3
        for m in (None, mask):
            for fix, val in ((0, 0.0), (1, 0.5)):
                out = []
                for fn in (T.LIB.npr_softmax, T.LIB.npr_softmax_avx512):
                    y = np.full_like(x, 7.0)
                    fn(ptr(x), ptr(m), ptr(y), 0, rows, n, 1, 1, fix, val)
                    out.append(y)
                np.testing.assert_array_equal(out[1], out[0], err_msg=f"n={n} mask={m is not None} fix={fix}")
                with np.errstate(invalid="ignore", over="ignore"):
                    want = KERNELS["softmax"](x[3:] if m is None else x[3:] + m, axis=-1)
                np.testing.assert_allclose(out[1][3:], want, rtol=2e-6, atol=1e-7)


@pytest.mark.skipif("avx512" not in native.conv_isas(), reason="this CPU has no AVX-512")
def test_gelu_avx512_is_the_avx2_kernel_bit_for_bit(rng):
    """GELU's AVX-512 kernel (mode | 4: erf on 16 lanes, the tables read by 16-lane permutes)
    gives the AVX2 kernel's bits in each form (x / d, x * d, tanh), lengths 1 to 100 (every
    tail), values over erf's every interval and the special ones."""
    from npurun.backends.cpu.native import ptr
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, -3.9, 4.0, 0.5, -0.5, 7.99], np.float32)
    for n in list(range(1, 40)) + [64, 100]:
        x = (nonzero_normal(rng, (n,)) * float(rng.choice([0.3, 2, 6]))).astype(np.float32)
        x[: min(n, special.size)] = special[: min(n, special.size)] if n > 20 else x[: min(n, special.size)]
        for d, a, m, mode in ((float(np.float32(np.sqrt(2))), 1.0, 0.5, 0), (float(np.float32(1 / np.sqrt(2))), 0.0, 0.0, 1),
                              (0.0, 0.0, 0.0, 2)):
            out = []
            for wide in (0, 4):
                y = np.full_like(x, 7.0)
                T.LIB.npr_gelu(ptr(x), ptr(y), n, d, a, m, mode | wide)
                out.append(y)
            np.testing.assert_array_equal(out[1], out[0], err_msg=f"n={n} mode={mode}")


def test_mask_rows_rule():
    assert T.mask_rows((1, 12, 128, 128), (1, 1, 1, 128)) == (1, 1)
    assert T.mask_rows((1, 12, 128, 128), (1, 1, 128, 128)) == (1, 128)
    assert T.mask_rows((2, 12, 128, 128), (2, 1, 1, 128)) == (12 * 128, 2)
    assert T.mask_rows((1, 12, 128, 128), (12, 1, 128)) == (128, 12)
    assert T.mask_rows((2, 3, 5, 7), (2, 1, 5, 7)) is None
    assert T.mask_rows((2, 3, 5, 7), (2, 3, 5, 1)) is None


MATMULS = [  # a shape, b shape, adds: "b" bias (N,), "r" residual (full), "c" bias (1, 1, N)
    ((1, 128, 384), (384, 384), "br"),
    ((1, 128, 384), (384, 96), ""),
    ((1, 100, 200), (200, 330), "br"),  # 13 MFLOP, a ragged last panel: split over the C pool
    ((7, 13), (13, 5), "b"),
    ((2, 3, 40), (40, 33), "r"),
    ((1, 9, 70), (70, 47), "cr"),
    ((1, 1, 3), (3, 70), "b"),
]


def _adds(rng, a_shape, b_shape, spec):
    out = a_shape[:-1] + b_shape[-1:]
    shapes = {"b": b_shape[-1:], "r": out, "c": (1, 1, b_shape[-1])}
    return [nonzero_normal(rng, shapes[c]) for c in spec]


def _want(a, b, adds):
    y = KERNELS["matmul"](a, b)
    for c in adds:
        y = KERNELS["add"](y, c)
    return y


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", MATMULS)
def test_packed_sgemm_with_bias_and_residual(rng, monkeypatch, case, threads, isa):
    monkeypatch.setattr(native, "ISA", isa)
    a_shape, b_shape, spec = case
    a, b = nonzero_normal(rng, a_shape), nonzero_normal(rng, b_shape)
    adds = _adds(rng, a_shape, b_shape, spec)
    cache = {}
    for _ in range(2):  # the second call reuses the packed weights
        got = MM.linear(prog(threads), a, b, cache, adds)
        np.testing.assert_allclose(got, _want(a, b, adds), rtol=1e-5, atol=2e-5 * np.sqrt(a_shape[-1]))
    assert cache["isa"] == isa


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("m,k,n", [(700, 80, 24), (1001, 64, 16), (257, 200, 40)])
def test_threads_split_the_rows_of_a_narrow_product_with_the_same_bits(rng, monkeypatch, m, k, n, isa):
    """A product of few columns (fewer than two panels a thread) and many rows splits its rows
    over the threads (matmul.rows_split, npr_gemm_rows_mt): the reference's values, and the
    bits of one thread, with the bias and the residual; in pieces too (ranges of panels, every
    row band in each)."""
    monkeypatch.setattr(native, "ISA", isa)
    a, b = nonzero_normal(rng, (1, m, k)), nonzero_normal(rng, (k, n))
    adds = [nonzero_normal(rng, (n,)), nonzero_normal(rng, (1, m, n))]
    split = []
    real = MM.rows_split
    monkeypatch.setattr(MM, "rows_split", lambda *x: split.append(real(*x)) or split[-1])
    one = MM.linear(prog(1), a, b, {}, adds)
    two = MM.linear(prog(2), a, b, {}, adds)
    assert split == [False, True]
    np.testing.assert_allclose(two, _want(a, b, adds), rtol=1e-5, atol=2e-5 * np.sqrt(k))
    np.testing.assert_array_equal(two, one)
    monkeypatch.setattr(pieces, "cut", lambda total, *x, **kw: [(i, i + 1) for i in range(total)])
    np.testing.assert_array_equal(MM.linear(prog(2), a, b, {}, adds), one)


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k,n", [(1, 3), (70, 47), (64, 200), (300, 1000)])
def test_a_row_alone_gives_its_bits_in_a_block(rng, monkeypatch, k, n, threads, isa):
    """One row (a matrix-vector product: tr_gemm_tpl.h's GEMV_PANELS, several panels at once)
    sums each output as the block's tiles do: every row of a 7-row product, run alone, gives
    the same floats, with the bias and the residual; the reference's values too."""
    monkeypatch.setattr(native, "ISA", isa)
    a, b = nonzero_normal(rng, (7, k)), nonzero_normal(rng, (k, n))
    bias, res = nonzero_normal(rng, (n,)), nonzero_normal(rng, (7, n))
    cache = {}
    block = MM.linear(prog(threads), a, b, cache, [bias, res])
    np.testing.assert_allclose(block, _want(a, b, [bias, res]), rtol=1e-5, atol=2e-5 * np.sqrt(k))
    for i in range(7):
        alone = MM.linear(prog(threads), a[i:i + 1], b, cache, [bias, res[i:i + 1]])
        np.testing.assert_array_equal(alone, block[i:i + 1])


@pytest.mark.parametrize("isa", native.conv_isas())
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", MATMULS)
def test_int8_weights_run_packed_as_int8_with_the_same_result(rng, case, threads, isa, monkeypatch):
    monkeypatch.setattr(native, "ISA", isa)
    a_shape, b_shape, spec = case
    q = rng.integers(-127, 128, b_shape).astype(np.int8)
    q[0] = 127  # (a column's largest |q| is 127, as a max-abs quantizer leaves it)
    s = (rng.random((1, b_shape[1])) * 0.02 + 1e-4).astype(np.float32)
    b = q.astype(np.float32) * s  # what import leaves of cast(q) * scale
    a = nonzero_normal(rng, a_shape)
    adds = _adds(rng, a_shape, b_shape, spec)
    cache = {}
    got = MM.linear(prog(threads), a, b, cache, adds)
    assert cache["bq"] is not None  # packed as int8
    f32 = {"b": b, "isa": isa, "nr": cache["nr"], "bp": MM.pack(b, isa), "bq": None, "scale": None}
    np.testing.assert_array_equal(got, MM.linear(prog(threads), a, b, f32, adds))  # same floats in
    np.testing.assert_allclose(got, _want(a, b, adds), rtol=1e-5, atol=2e-5 * np.sqrt(a_shape[-1]))


def test_int8_columns_finds_exact_int8_weights_only(rng):
    q = rng.integers(-127, 128, (50, 9)).astype(np.int8)
    q[3] = -127
    q[:, 4] = 0  # an all-zero column
    s = (rng.random(9) * 0.05 + 1e-3).astype(np.float32)
    b = q.astype(np.float32) * s
    q2, s2 = MM.int8_columns(b)
    assert np.array_equal((q2.astype(np.float32) * s2).view(np.int32), b.view(np.int32))
    assert MM.int8_columns(nonzero_normal(rng, (50, 9))) is None
    b[7, 2] = np.nextafter(b[7, 2], np.float32(1))  # one element off the grid
    assert MM.int8_columns(b) is None
    b[7, 2] = np.nan
    assert MM.int8_columns(b) is None


def test_packed_sgemm_declines_adds_it_would_reorder(rng):
    a, b = nonzero_normal(rng, (4, 8)), nonzero_normal(rng, (8, 6))
    res, bias = nonzero_normal(rng, (4, 6)), nonzero_normal(rng, (6,))
    assert MM.linear(prog(1), a, b, {}, [res, bias]) is None  # (a @ b + res) + bias: not its order
    assert MM.linear(prog(1), a.astype(np.float64), b, {}, []) is None


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shapes", [((1, 128, 384), (384, 384)), ((1, 12, 128, 32), (1, 12, 32, 128)),
                                    ((1, 12, 128, 128), (1, 12, 128, 32)),  # attention's P @ V
                                    ((3, 70, 33), (3, 33, 150)),  # N off the packed panel, K odd
                                    ((5, 3), (3, 4)), ((2, 1, 4, 3), (1, 2, 3, 5))])
def test_banded_blas_matmul(rng, shapes, threads):
    a, b = nonzero_normal(rng, shapes[0]), nonzero_normal(rng, shapes[1])
    got = MM.KERNELS["matmul"](prog(threads))(a, b)
    np.testing.assert_allclose(got, KERNELS["matmul"](a, b), rtol=1e-5, atol=1e-4)
    res = nonzero_normal(rng, got.shape)
    y = MM.matmul_add(prog(threads), a, b, [res])
    if y is not None:  # (the broadcast batch declines)
        np.testing.assert_allclose(y, _want(a, b, [res]), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_matmul_reads_head_views_in_place_with_the_same_bits(rng, threads):
    """Attention's products on views of heads side by side (keys and values split from one
    projection, (1, T, H, D) transposed to heads): K^T packed straight from the keys (tb), the
    values' rows read a head's width apart, no contiguous copy; the same floats as the product
    of contiguous copies (the panels hold the same values), and the reference's values; K both
    side of OWN_MIN_K, a last panel off the 32 columns, rows off the 8-row tile."""
    for t, h, d in [(200, 3, 64), (150, 2, 160), (130, 4, 32)]:
        x = nonzero_normal(rng, (1, t, 3 * h * d))
        q, k, v = (x[..., i * h * d:(i + 1) * h * d].reshape(1, t, h, d).transpose(0, 2, 1, 3) for i in range(3))
        kt = k.transpose(0, 1, 3, 2)
        assert MM._b_items(kt)[1] == 1 and MM._b_items(v)[1] == 0 and MM._b_items(v)[3] == 3 * h * d
        q = np.ascontiguousarray(q)
        scores = MM.matmul_add(prog(threads), q, kt)
        p = nonzero_normal(rng, (1, h, t, t))
        out = MM.matmul_add(prog(threads), p, v)
        # (where NumPy's sgemm takes a product, at one thread and K < OWN_MIN_K, its kernels for
        # a view and for a copy round differently: values only)
        if threads > 1 or d >= MM.OWN_MIN_K:
            np.testing.assert_array_equal(scores, MM.matmul_add(prog(threads), q, np.ascontiguousarray(kt)))
        if threads > 1 or t >= MM.OWN_MIN_K:
            np.testing.assert_array_equal(out, MM.matmul_add(prog(threads), p, np.ascontiguousarray(v)))
        np.testing.assert_allclose(scores, KERNELS["matmul"](q, kt), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(out, KERNELS["matmul"](p, v), rtol=1e-5, atol=1e-4)
    odd = np.zeros((4, 6, 5, 7), np.float32)[::2, ::3]  # batch dims that do not merge
    assert MM._item_stride(odd) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_by_a_transposed_operand(rng, threads):
    """b a transposed view (MatMulNBits' dequantized weights, W.T): packed from a copy that
    must outlive the packing call (it was freed first, and 2 threads gave garbage rows)."""
    for rows in (1, 5, 29, 64, 64):
        a, w = nonzero_normal(rng, (1, rows, 256)), nonzero_normal(rng, (300, 256))
        got = MM.KERNELS["matmul"](prog(threads))(a, w.T)
        np.testing.assert_allclose(got, KERNELS["matmul"](a, w.T), rtol=1e-5, atol=1e-4)


ENCODER = """
op gather @emb (w: [50, 24] f32, ids: [1, 6] i64 -> e: [1, 6, 24] f32) axis=0
op layer_normalization @ln0 (e: [1, 6, 24] f32, g0: [24] f32, b0: [24] f32 -> h: [1, 6, 24] f32) axis=-1 epsilon=1e-12
op matmul @q (h: [1, 6, 24] f32, wq: [24, 24] f32 -> q0: [1, 6, 24] f32)
op add @qb (q0: [1, 6, 24] f32, bq: [24] f32 -> q: [1, 6, 24] f32)
op reshape @qr (q: [1, 6, 24] f32, s4: [4] i64 -> q4: [1, 6, 2, 12] f32)
op transpose @qt (q4: [1, 6, 2, 12] f32 -> qh: [1, 2, 6, 12] f32) perm=[0, 2, 1, 3]
op transpose @kt (q4: [1, 6, 2, 12] f32 -> kh: [1, 2, 12, 6] f32) perm=[0, 2, 3, 1]
op matmul @qk (qh: [1, 2, 6, 12] f32, kh: [1, 2, 12, 6] f32 -> sc: [1, 2, 6, 6] f32)
op add @mk (sc: [1, 2, 6, 6] f32, mask: [1, 1, 1, 6] f32 -> sm: [1, 2, 6, 6] f32)
op softmax @sx (sm: [1, 2, 6, 6] f32 -> p: [1, 2, 6, 6] f32) axis=-1
op is_nan @nn (p: [1, 2, 6, 6] f32 -> pn: [1, 2, 6, 6] bool)
op where @wh (pn: [1, 2, 6, 6] bool, zero: [] f32, p: [1, 2, 6, 6] f32 -> pf: [1, 2, 6, 6] f32)
op matmul @pv (pf: [1, 2, 6, 6] f32, qh: [1, 2, 6, 12] f32 -> o: [1, 2, 6, 12] f32)
op transpose @ot (o: [1, 2, 6, 12] f32 -> o4: [1, 6, 2, 12] f32) perm=[0, 2, 1, 3]
op reshape @orr (o4: [1, 6, 2, 12] f32, s3: [3] i64 -> o3: [1, 6, 24] f32)
op matmul @fc1 (o3: [1, 6, 24] f32, w1: [24, 40] f32 -> f0: [1, 6, 40] f32)
op add @fb1 (f0: [1, 6, 40] f32, b1: [40] f32 -> f: [1, 6, 40] f32)
op div @gd (f: [1, 6, 40] f32, sqrt2: [] f32 -> t: [1, 6, 40] f32)
op erf @ge (t: [1, 6, 40] f32 -> er: [1, 6, 40] f32)
op add @ga (er: [1, 6, 40] f32, one: [] f32 -> er1: [1, 6, 40] f32)
op mul @gm (half: [] f32, er1: [1, 6, 40] f32 -> hh: [1, 6, 40] f32)
op mul @gx (f: [1, 6, 40] f32, hh: [1, 6, 40] f32 -> gl: [1, 6, 40] f32)
op matmul @fc2 (gl: [1, 6, 40] f32, w2: [40, 24] f32 -> z0: [1, 6, 24] f32)
op add @fb2 (z0: [1, 6, 24] f32, b2: [24] f32 -> z1: [1, 6, 24] f32)
op add @res (z1: [1, 6, 24] f32, h: [1, 6, 24] f32 -> z: [1, 6, 24] f32)
op layer_normalization @ln1 (z: [1, 6, 24] f32, g1: [24] f32, b1n: [24] f32 -> out: [1, 6, 24] f32) axis=-1
"""


def _encoder(rng):
    g = parse(ENCODER)
    for nm, shape in (("g0", (24,)), ("b0", (24,)), ("wq", (24, 24)), ("bq", (24,)), ("w1", (24, 40)),
                      ("b1", (40,)), ("w2", (40, 24)), ("b2", (24,)), ("g1", (24,)), ("b1n", (24,))):
        g.values[nm].data = nonzero_normal(rng, shape)
    for nm, v in (("sqrt2", np.sqrt(2)), ("one", 1.0), ("half", 0.5), ("zero", 0.0)):
        g.values[nm].data = np.array(v, np.float32)
    g.values["s4"].data = np.array([1, 6, 2, 12], np.int64)
    g.values["s3"].data = np.array([1, 6, 24], np.int64)
    return g


def _dequant_embedding(g, rng):
    """w = cast(wq) * scale with int8 wq and a scale per row, as MiniLM-int8 stores it; the
    table is bigger than constant folding takes (1 << 20 elements), so it stays in the graph."""
    from npurun.ir.graph import Node, Value
    rows = (1 << 20) // 24 + 1
    g.values["w"] = Value("w", (rows, 24), "f32")
    g.values["embq"] = Value("embq", (rows, 24), "i8", data=rng.integers(-127, 128, (rows, 24)).astype(np.int8))
    g.values["embf"] = Value("embf", (rows, 24), "f32")
    g.values["embs"] = Value("embs", (rows, 1), "f32", data=(rng.random((rows, 1)) * 0.02 + 0.001).astype(np.float32))
    g.nodes[:0] = [Node("cast", ["embq"], ["embf"], {"to": "f32"}, name="dq_cast"),
                   Node("mul", ["embf", "embs"], ["w"], {}, name="dq_mul")]
    return rows


@pytest.mark.parametrize("threads", [1, 2])
def test_encoder_graph_fuses_every_pattern_and_matches_reference(rng, threads):
    g = _encoder(rng)
    rows = _dequant_embedding(g, rng)
    g.inputs = ["ids", "mask"]
    p = compile_fused(g, threads)
    names = {n.name: n.op for n in p.graph.nodes}
    assert names.get("ge") == "gelu" and names.get("sx") == "masked_softmax" and names.get("emb") == "gather"
    assert not {"gd", "ga", "gm", "gx", "mk", "nn", "wh", "fb1", "fb2", "res", "qb"} & set(names)
    # the int8 table is gathered first, then dequantized: the cast reads the gathered rows
    assert [n.inputs[0] for n in p.graph.nodes if n.op == "cast"] == [next(n.outputs[0] for n in p.graph.nodes
                                                                           if n.op == "gather" and n.inputs[0] == "embq")]
    ids = rng.integers(-rows, rows, (1, 6)).astype(np.int64)  # (negative: counted from the end)
    mask = np.where(rng.random((1, 1, 1, 6)) < 0.3, -np.inf, 0.0).astype(np.float32)
    want = npurun.Executor("reference").run_sync(g, {"ids": ids, "mask": mask})["out"]
    for _ in range(2):
        np.testing.assert_allclose(p.run({"ids": ids, "mask": mask})["out"], want, rtol=1e-4, atol=1e-4)
    from npurun.passes.pipeline import prepare
    again = prepare(p.graph, "cpu")  # a second pipeline finds nothing left to fuse
    assert npurun.print_graph(again) == npurun.print_graph(p.graph)


def test_chains_with_other_readers_or_constants_do_not_fuse(rng):
    g = _encoder(rng)
    g.values["w"].data = nonzero_normal(rng, (50, 24))
    g.values["half"].data = np.array(0.5, np.float64)  # not f32: the chain keeps its own steps
    g.outputs = ["out", "sm"]  # the masked scores are an output: the add stays
    g.inputs = ["ids", "mask"]
    p = compile_fused(g)
    steps = {n.name: n for n in p.graph.nodes}
    assert steps["ge"].op == "erf" and steps["sx"].op == "masked_softmax" and steps["sx"].inputs == ["sm"]  # (the add went with QKᵀ)
    feeds = {"ids": rng.integers(0, 50, (1, 6)).astype(np.int64), "mask": nonzero_normal(rng, (1, 1, 1, 6))}
    want = npurun.Executor("reference").run_sync(g, feeds)
    got = p.run(feeds)
    for k in ("out", "sm"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)


@pytest.mark.models
@pytest.mark.parametrize("threads", [1, 2])
def test_minilm_int8_fused_matches_onnxruntime(threads):
    ort = pytest.importorskip("onnxruntime")
    from models.fetch import fetch
    path = fetch("minilm_int8")
    rng = np.random.default_rng()
    ids = rng.integers(1000, 30000, (1, 128)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": (rng.random((1, 128)) < 0.9).astype(np.int64),
             "token_type_ids": np.zeros((1, 128), np.int64)}
    p = compile_fused(npurun.load(path), threads)
    p.run(feeds)  # (packs the weights: all 36 are int8 per column, dequantized at import)
    caches = [s[1].cache for s in p.steps if hasattr(s[1], "cache")]
    assert len(caches) == 36 and all(c["bq"] is not None for c in caches)
    assert sum(n.op == "gelu" for n in p.graph.nodes) == 6
    assert sum(n.op == "masked_softmax" and len(n.inputs) == 2 for n in p.graph.nodes) == 6
    assert not any(n.op == "cast" and n.inputs[0].endswith("word_embeddings.weight_q") for n in p.graph.nodes)
    got = p.run(feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g_, w_ in zip(got.values(), want):
        np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-4 * np.abs(w_).max())


@pytest.mark.parametrize("shape", [(1, 1, 768), (2, 5, 20), (3, 64)])
def test_rms_normalization_matches_reference(rng, shape):
    """csrc/transformer.c's RMS norm (RMSNormalization, and the contrib Simplified/Skip
    forms through rms_call) against the float64 reference, with and without a skip sum."""
    x, scale = nonzero_normal(rng, shape), nonzero_normal(rng, shape[-1:])
    got = T.KERNELS["rms_normalization"](prog(1))(x, scale, axis=-1, epsilon=1e-6, stash_type="f32")
    want = KERNELS["rms_normalization"](x, scale, axis=-1, epsilon=1e-6, stash_type="f32")
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    skip, bias = nonzero_normal(rng, shape), nonzero_normal(rng, shape[-1:])
    y, inv, s = T.rms_call(x, scale, skip, bias, 1e-6, want_sum=True)
    s64 = x.astype(np.float64) + skip + bias
    np.testing.assert_allclose(s, s64, rtol=1e-6, atol=1e-6)
    ref = s64 / np.sqrt((s64 ** 2).mean(-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(inv[..., 0], 1 / np.sqrt((s64 ** 2).mean(-1) + 1e-6), rtol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hq, hkv, s, t, mask", [(4, 2, 1, 37, "float"), (4, 4, 6, 6, "bool"), (6, 2, 5, 9, None),
                                                 (2, 1, 64, 64, "float")])
def test_attention_kernel_matches_reference(rng, threads, hq, hkv, s, t, mask):
    """The fused attention's cpu kernel (ops/attention.py) against the reference: grouped heads,
    additive and boolean masks, keys and values of its own and as views of a larger cache
    buffer (the decode case, read in place)."""
    from npurun.backends.cpu.ops import attention as A
    q = nonzero_normal(rng, (1, hq, s, 16))
    buf_k, buf_v = nonzero_normal(rng, (1, hkv, t + 20, 16)), nonzero_normal(rng, (1, hkv, t + 20, 16))
    m = None
    if mask == "float":
        m = np.where(rng.random((1, 1, s, t)) < 0.8, 0, -np.inf).astype(np.float32)
        m[..., 0] = 0  # every query sees a key
    elif mask == "bool":
        m = rng.random((1, 1, s, t)) < 0.8
        m[..., 0] = True
    attrs = dict(is_causal=0, q_num_heads=0, kv_num_heads=0, qk_matmul_output_mode=0, scale=0.3, softcap=0.0,
                 softmax_precision=None, left_window_size=-1, right_window_size=-1)
    kern = A.KERNELS["attention"](prog(threads))
    for k, v in ((buf_k[:, :, :t].copy(), buf_v[:, :, :t].copy()), (buf_k[:, :, :t], buf_v[:, :, :t])):
        want = KERNELS["attention"](q, k, v, m, **attrs)[0]
        np.testing.assert_allclose(kern(q, k, v, m, **attrs), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_nodes_reading_one_weight_share_its_packed_copy(rng, threads):
    """ALBERT's layers read one set of weights: one packed copy per weight, not per node (the
    12 copies made its peak RSS 2.9x ORT's), with each node's result unchanged."""
    g = parse("""
    op matmul @m1 (x: [64, 192] f32, w: [192, 160] f32 -> h: [64, 160] f32)
    op tanh @t (h: [64, 160] f32 -> u: [64, 160] f32)
    op matmul @m2 (u: [64, 160] f32, v: [160, 192] f32 -> z: [64, 192] f32)
    op matmul @m3 (z: [64, 192] f32, w2: [192, 160] f32 -> y: [64, 160] f32)
    """)
    for nm, shape in (("w", (192, 160)), ("v", (160, 192))):
        g.values[nm].data = nonzero_normal(rng, shape) * 0.2
    g.values["w2"].data = g.values["w"].data  # the same array under another name (an Identity's)
    g.inputs = ["x"]
    x = nonzero_normal(rng, (64, 192))  # (big enough for the packed sgemm)
    p = compile_fused(g, threads)
    got = p.run({"x": x})["y"]
    caches = [s[1].cache for s in p.steps if hasattr(s[1], "cache")]
    assert len(caches) == 3 and caches[0] is caches[2] and caches[1] is not caches[0]
    assert caches[0]["bp"] is not None and caches[1]["bp"] is not None
    want = npurun.Executor("reference").run_sync(g, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("k,n", [(7, 33), (64, 32), (5, 100), (300, 17)])
def test_packing_a_transposed_view_equals_packing_its_copy(rng, k, n):
    """The packed sgemm's panels made straight from a strided view (a Gemm's w.T) are the
    panels of its contiguous copy, padding included."""
    w = nonzero_normal(rng, (n, k))
    for isa in ("avx2",) + (("avx512",) if native.ISA == "avx512" else ()):
        np.testing.assert_array_equal(MM.pack(w.T, isa), MM.pack(np.ascontiguousarray(w.T), isa))
