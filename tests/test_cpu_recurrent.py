"""The cpu backend's LSTM/GRU/RNN kernels (cpu/ops/recurrent.py) and 1-D convs
(cpu/ops/conv1d.py) against the reference kernels, on fresh random non-zero inputs."""
import numpy as np
import pytest

from npurun.backends.cpu.ops import conv1d, recurrent
from npurun.backends.reference.kernels import KERNELS

from conftest import nonzero_normal

GATES = {"lstm": 4, "gru": 3, "rnn": 1}
FAST = {"lstm": recurrent._lstm, "gru": recurrent._gru, "rnn": recurrent._rnn}

# (seq, batch, input, hidden). The float32 LSTM with even H runs csrc/recurrent.c: 4H off its
# 64-column slab (6, 20) and H off its 8-float vector (6, 20), silero's one 128-wide step.
SIZES = [(1, 1, 16, 8), (5, 3, 7, 6), (4, 2, 12, 33), (3, 2, 10, 20), (1, 1, 128, 128)]


def _inputs(rng, op, seq, batch, size, hid, dirs, layout, *, bias=True, init=True, peep=False, dtype=np.float32):
    g = GATES[op]
    xs = (batch, seq, size) if layout else (seq, batch, size)
    st = (batch, dirs, hid) if layout else (dirs, batch, hid)
    ins = [nonzero_normal(rng, xs, dtype), nonzero_normal(rng, (dirs, g * hid, size), dtype) * 0.4,
           nonzero_normal(rng, (dirs, g * hid, hid), dtype) * 0.4,
           nonzero_normal(rng, (dirs, 2 * g * hid), dtype) * 0.3 if bias else None, None,
           nonzero_normal(rng, st, dtype) * 0.5 if init else None]
    if op == "lstm":
        ins += [nonzero_normal(rng, st, dtype) * 0.5 if init else None,
                nonzero_normal(rng, (dirs, 3 * hid), dtype) * 0.3 if peep else None]
    return ins


def _attrs(op, hid, direction, layout, **kw):
    a = {"hidden_size": hid, "direction": direction, "activations": None, "activation_alpha": None,
         "activation_beta": None, "clip": None, "layout": layout}
    a.update({"lstm": {"input_forget": 0}, "gru": {"linear_before_reset": 0}, "rnn": {}}[op])
    a.update(kw)
    return a


def _check(op, ins, attrs, tol=2e-5):
    want = KERNELS[op](*ins, **attrs)
    got = FAST[op](*ins, **attrs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("size", range(len(SIZES)))
def test_cells_match_reference(op, direction, layout, size, rng):
    seq, batch, inp, hid = SIZES[size]
    dirs = 2 if direction == "bidirectional" else 1
    _check(op, _inputs(rng, op, seq, batch, inp, hid, dirs, layout), _attrs(op, hid, direction, layout))


@pytest.mark.parametrize("op", ["lstm", "gru", "rnn"])
def test_no_bias_no_initial_state_float64(op, rng):
    ins = _inputs(rng, op, 3, 2, 5, 4, 2, 0, bias=False, init=False, dtype=np.float64)
    _check(op, ins, _attrs(op, 4, "bidirectional", 0), tol=1e-12)


@pytest.mark.parametrize("variant", [
    {"clip": 0.7},
    {"activations": ["HardSigmoid", "LeakyRelu", "Softsign"], "activation_alpha": [0.3, 0.05],
     "activation_beta": [0.4]},
    {"activations": ["Sigmoid", "ScaledTanh", "Tanh", "Sigmoid", "Tanh", "Elu"],
     "activation_alpha": [1.5, 0.8], "activation_beta": [0.7]},
    {"input_forget": 1},
])
@pytest.mark.parametrize("peep", [False, True])
def test_lstm_variants(variant, peep, rng):
    direction = "bidirectional" if len(variant.get("activations") or []) == 6 else "forward"
    dirs = 2 if direction == "bidirectional" else 1
    ins = _inputs(rng, "lstm", 4, 2, 6, 5, dirs, 0, peep=peep)
    _check("lstm", ins, _attrs("lstm", 5, direction, 0, **variant))


@pytest.mark.skipif(recurrent._LIB is None, reason="compiled kernels not built")
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("hid,bias,init", [(8, True, True), (16, False, True), (64, True, False), (72, True, True)])
def test_gru_recurrence_in_c_matches_reference(lbr, direction, hid, bias, init, rng):
    """H a multiple of 8: csrc/recurrent.c's npr_gru_f32 (both reset forms, with and without
    biases and initial state, 64 columns a slab and a ragged last slab)."""
    dirs = 2 if direction == "bidirectional" else 1
    ins = _inputs(rng, "gru", 5, 3, 7, hid, dirs, 0, bias=bias, init=init)
    _check("gru", ins, _attrs("gru", hid, direction, 0, linear_before_reset=lbr))


@pytest.mark.parametrize("op,extra", [("lstm", {}), ("gru", {"linear_before_reset": 0}),
                                      ("gru", {"linear_before_reset": 1})])
@pytest.mark.parametrize("layout", [0, 1])
def test_bidirectional_recurrence_on_two_threads(op, extra, layout, rng):
    """Both directions at once (csrc/recurrent.c npr_recurrent2_mt, one per thread of the pool):
    the same bits as one after the other, and the reference's values."""
    ins = _inputs(rng, op, 6, 3, 10, 24, 2, layout)
    attrs = _attrs(op, 24, "bidirectional", layout, **extra)
    one = FAST[op](*ins, **attrs)
    two = FAST[op](*ins, **attrs, threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(b, a)
    _check(op, ins, attrs)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("variant", [{}, {"clip": 0.5}, {"activations": ["HardSigmoid", "Softsign"]}])
def test_gru_variants(lbr, variant, rng):
    ins = _inputs(rng, "gru", 4, 3, 6, 7, 1, 0)
    _check("gru", ins, _attrs("gru", 7, "reverse", 0, linear_before_reset=lbr, **variant))


def test_rnn_relu_clip(rng):
    ins = _inputs(rng, "rnn", 6, 2, 4, 5, 1, 1)
    _check("rnn", ins, _attrs("rnn", 5, "forward", 1, activations=["Relu"], clip=1.5))


@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_sequence_lens(op, rng):
    """Equal lengths take the fast path; rows that stop early take the reference kernel."""
    for lens in ([4, 4], [4, 2]):
        ins = _inputs(rng, op, 4, 2, 3, 5, 1, 0)
        ins[4] = np.array(lens, np.int32)
        _check(op, ins, _attrs(op, 5, "forward", 0))


# ------------------------------------------------------------------ 1-D convolutions

CONV1D = [  # (N, C, L), (M, K), attrs
    ((1, 1, 640), (258, 256), {"strides": [128]}),  # silero's STFT
    ((1, 129, 4), (128, 3), {"pads": [1, 1]}),
    ((2, 8, 37), (5, 3), {"pads": [2, 0], "strides": [2], "dilations": [2]}),
    ((1, 6, 20), (4, 4), {"auto_pad": "SAME_UPPER", "strides": [3]}),
    ((1, 8, 19), (8, 3), {"pads": [1, 1], "group": 4}),  # grouped: the compiled 2-D kernel
    ((1, 16, 3000), (32, 5), {"pads": [2, 2]}),  # over SMALL_MACS: the compiled 2-D kernel
]


class _Prog:
    threads = 1


@pytest.mark.parametrize("case", range(len(CONV1D)))
@pytest.mark.parametrize("bias", [True, False])
def test_conv1d_matches_reference(case, bias, rng):
    from npurun.backends.cpu import CpuProgram
    xs, (m, k), a = CONV1D[case]
    attrs = {"strides": None, "pads": None, "dilations": None, "group": 1, "kernel_shape": None,
             "auto_pad": "NOTSET", **a}
    x = nonzero_normal(rng, xs)
    w = nonzero_normal(rng, (m, xs[1] // attrs["group"], k)) * 0.3
    b = nonzero_normal(rng, (m,)) if bias else None
    prog = _Prog()
    prog._conv = CpuProgram._conv.__get__(prog)
    run = conv1d.make(prog)
    want = KERNELS["conv"](x, w, b, **attrs)
    for _ in range(2):  # the second call reuses the packed weights
        got = run(x, w, b, **attrs)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_conv1d_weights_shared_by_nodes_with_other_attributes(rng):
    """Region convs keep their plans per weight array: the same weights run again with other
    strides and pads (another node sharing them) must not reuse the first node's plan."""
    from npurun.backends.cpu import CpuProgram
    x = nonzero_normal(rng, (1, 6, 23))
    w, b = nonzero_normal(rng, (5, 6, 3)) * 0.3, nonzero_normal(rng, (5,))
    prog = _Prog()
    prog._conv = CpuProgram._conv.__get__(prog)
    run = conv1d.make(prog)
    base = {"dilations": None, "group": 1, "kernel_shape": None, "auto_pad": "NOTSET"}
    for a in ({"strides": [1], "pads": [1, 1]}, {"strides": [2], "pads": [0, 2]}, {"strides": [1], "pads": [1, 1]}):
        attrs = {**base, **a}
        want = KERNELS["conv"](x, w, b, **attrs)
        got = run(x, w, b, **attrs)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ------------------------------------------------------------------ pad

PADS = [  # shape, pads, axes
    ((1, 512), [0, 64, 0, 64], None),  # silero's reflect pad of its chunk
    ((2, 3, 5, 6), [1, 0, 2, 3, 0, 1, 4, 2], None),
    ((3, 7, 4), [2, 1], [-1]),
    ((4, 5), [3, 0, 1, 4], [1, 0]),
    ((2, 3), [0, 0, 0, 0], None),
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("case", range(len(PADS)))
def test_pad_matches_reference(mode, case, rng):
    from npurun.backends.cpu.ops import pad
    shape, pads, axes = PADS[case]
    x = nonzero_normal(rng, shape)
    args = (x, np.array(pads, np.int64), np.array(1.5, np.float32) if mode == "constant" else None,
            None if axes is None else np.array(axes, np.int64))
    want = KERNELS["pad"](*args, mode=mode)
    got = pad._pad(*args, mode=mode)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_pad_falls_back_for_crops_and_wide_reflects(rng):
    from npurun.backends.cpu.ops import pad
    x = nonzero_normal(rng, (3, 4))
    for pads, mode in (([-1, 1, 0, 2], "constant"), ([0, 5, 0, 0], "reflect")):
        want = KERNELS["pad"](x, np.array(pads), None, None, mode=mode)
        np.testing.assert_array_equal(pad._pad(x, np.array(pads), None, None, mode=mode), want)


# ------------------------------------------------------------------ unsqueeze / squeeze

@pytest.mark.parametrize("shape,axes", [((3, 4), [0]), ((3, 4), [-1, 0]), ((2,), [1, 0, 3]), ((), [0]),
                                        ((5, 1, 2), [2, -5])])
def test_unsqueeze_matches_reference(shape, axes, rng):
    from npurun.backends.cpu.ops import unsqueeze
    x = nonzero_normal(rng, shape)
    want = KERNELS["unsqueeze"](x, np.array(axes, np.int64))
    got = unsqueeze._unsqueeze(x, np.array(axes, np.int64))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,axes", [((1, 4, 1), [0]), ((1, 4, 1), [-1, 0]), ((1, 4, 1), None),
                                        ((2, 1), [1]), ((1,), [0])])
def test_squeeze_matches_reference(shape, axes, rng):
    from npurun.backends.cpu.ops import unsqueeze
    x = nonzero_normal(rng, shape)
    a = None if axes is None else np.array(axes, np.int64)
    want = KERNELS["squeeze"](x, a)
    got = unsqueeze._squeeze(x, a)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_squeeze_of_a_dim_that_is_not_one_fails_like_the_reference(rng):
    from npurun.backends.cpu.ops import unsqueeze
    with pytest.raises(ValueError):
        unsqueeze._squeeze(nonzero_normal(rng, (2, 3)), np.array([0]))
