"""Transformer and recurrent ops (Attention, RotaryEmbedding, RMS/Layer normalization,
TensorScatter, CausalConvWithState, RNN, GRU, LSTM) against ONNX Runtime on fresh random
inputs; LinearAttention and FlexAttention, which ONNX Runtime lacks, against the ONNX node
suite's expected outputs."""
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import npurun
from conftest import nonzero_normal
from npurun.frontend.onnx import import_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "conformance"))
from runner import all_cases, run_case  # noqa: E402

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
         np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
         np.dtype(np.bool_): TensorProto.BOOL}


def _model(op, inputs, attrs, opset, outputs):
    """One-node model. `inputs` is a list of (name, array) in operand order, None for an
    absent optional operand; `outputs` names the outputs, "" for a skipped optional one."""
    names = [n if a is not None else "" for n, a in inputs]
    node = helper.make_node(op, names, outputs, **attrs)
    g = helper.make_graph([node], f"case_{op}",
                          [helper.make_tensor_value_info(n, _ELEM[a.dtype], list(a.shape))
                           for n, a in inputs if a is not None],
                          [helper.make_empty_tensor_value_info(o) for o in outputs if o])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _ort(op, inputs, attrs, opset, outputs):
    model = _model(op, inputs, attrs, opset, list(outputs))
    feeds = {n: a for n, a in inputs if a is not None}
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def check(op, inputs, attrs=None, opset=23, outputs=("y",), rtol=1e-4, atol=1e-5, want=None):
    """npurun against ORT (or against `want`, when ORT cannot run this form itself)."""
    model = _model(op, inputs, attrs or {}, opset, list(outputs))
    feeds = {n: a for n, a in inputs if a is not None}
    want = want or _ort(op, inputs, attrs or {}, opset, outputs)
    got = npurun.Executor("reference").run_sync(import_model(model), feeds)
    assert list(got) == [o for o in outputs if o]
    for name, g, w in zip(got, got.values(), want):
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
        # A masked score is -inf by the ONNX definition; ORT writes the lowest finite float.
        low = np.finfo(w.dtype).min
        np.testing.assert_allclose(np.maximum(g, low), np.maximum(w, low), rtol=rtol, atol=atol,
                                   err_msg=name)


# ---------------------------------------------------------------------------------- attention

@pytest.mark.parametrize("heads,kv_heads,sq,skv,d,dv", [(2, 2, 3, 3, 4, 4), (4, 2, 5, 7, 8, 6),
                                                        (3, 1, 1, 6, 4, 5)])
@pytest.mark.parametrize("attrs", [{}, {"scale": 0.3}, {"softcap": 2.0}, {"is_causal": 1}])
def test_attention_4d(rng, heads, kv_heads, sq, skv, d, dv, attrs):
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    check("Attention", [("q", f(2, heads, sq, d)), ("k", f(2, kv_heads, skv, d)),
                        ("v", f(2, kv_heads, skv, dv))], attrs)


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (4, 1)])
def test_attention_3d_masks(rng, heads, kv_heads):
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    q, k, v = f(2, 4, heads * 3), f(2, 6, kv_heads * 3), f(2, 6, kv_heads * 5)
    attrs = {"q_num_heads": heads, "kv_num_heads": kv_heads}
    check("Attention", [("q", q), ("k", k), ("v", v), ("m", f(4, 6))], attrs)
    check("Attention", [("q", q), ("k", k), ("v", v), ("m", rng.random((2, 1, 4, 6)) > 0.3)],
          {**attrs, "is_causal": 1})


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("mask", ["none", "float", "bool"])
def test_attention_past_present_and_qk_output(rng, mode, mask):
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    b, hq, hkv, sq, skv, past, d = 2, 4, 2, 3, 2, 5, 4
    m = {"none": None, "float": f(b, 1, sq, past + skv),
         "bool": rng.random((sq, past + skv)) > 0.3}[mask]
    check("Attention", [("q", f(b, hq, sq, d)), ("k", f(b, hkv, skv, d)), ("v", f(b, hkv, skv, d)),
                        ("m", m), ("pk", f(b, hkv, past, d)), ("pv", f(b, hkv, past, d))],
          {"is_causal": 1, "softcap": 3.0, "qk_matmul_output_mode": mode},
          outputs=("y", "present_k", "present_v", "qk"))


def test_attention_skipped_optional_outputs(rng):
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    check("Attention", [("q", f(1, 2, 3, 4)), ("k", f(1, 2, 3, 4)), ("v", f(1, 2, 3, 4))],
          {"qk_matmul_output_mode": 3}, outputs=("y", "", "", "qk"))


def test_attention_nonpad_kv_seqlen(rng):
    # Opset 24: an external cache of 7 slots, of which each batch row fills its own count.
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    for causal in (0, 1):
        check("Attention", [("q", f(2, 2, 2, 4)), ("k", f(2, 2, 7, 4)), ("v", f(2, 2, 7, 4)),
                            ("m", None), ("pk", None), ("pv", None),
                            ("n", np.array([5, 3], np.int64))],
              {"is_causal": causal}, opset=24)


def test_attention_fp16(rng):
    f = lambda *s: nonzero_normal(rng, s, np.float16)  # noqa: E731
    check("Attention", [("q", f(1, 2, 4, 8)), ("k", f(1, 2, 4, 8)), ("v", f(1, 2, 4, 8))],
          {"is_causal": 1}, rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------- rotary, normalizations

@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
def test_rotary_embedding(rng, interleaved, rot_dim):
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    half = (rot_dim or 8) // 2
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}
    pos = rng.integers(0, 10, (2, 3)).astype(np.int64)
    check("RotaryEmbedding", [("x", f(2, 4, 3, 8)), ("c", f(10, half)), ("s", f(10, half)),
                              ("p", pos)], attrs)
    check("RotaryEmbedding", [("x", f(2, 3, 4 * 8)), ("c", f(2, 3, half)), ("s", f(2, 3, half))],
          {**attrs, "num_heads": 4})


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((2, 3, 5), 1), ((2, 3, 4, 5), -2), ((3, 4), 0)])
def test_rms_normalization(rng, shape, axis):
    x = nonzero_normal(rng, shape)
    scale = nonzero_normal(rng, shape[axis:] if axis >= 0 else shape[axis:])
    check("RMSNormalization", [("x", x), ("s", scale)], {"axis": axis, "epsilon": 1e-3})


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((2, 3, 5), 1), ((2, 3, 4, 5), -2), ((3, 4), 0)])
def test_layer_normalization_statistics(rng, shape, axis):
    x = nonzero_normal(rng, shape)
    s, b = nonzero_normal(rng, shape[axis:]), nonzero_normal(rng, shape[axis:])
    check("LayerNormalization", [("x", x), ("s", s), ("b", b)], {"axis": axis},
          opset=17, outputs=("y", "mean", "inv_std"))
    check("LayerNormalization", [("x", x), ("s", s)], {"axis": axis, "epsilon": 0.1},
          opset=17, outputs=("y", "", "inv_std"))


# -------------------------------------------------------------------- cache, causal conv

@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2])
def test_tensor_scatter(rng, mode, axis):
    cache = nonzero_normal(rng, (3, 4, 6, 5))
    upd_shape = list(cache.shape)
    upd_shape[axis] = 2
    hi = cache.shape[axis] + (3 if mode == "circular" else -1)
    idx = rng.integers(0, hi, 3).astype(np.int64)
    check("TensorScatter", [("c", cache), ("u", nonzero_normal(rng, upd_shape)), ("i", idx)],
          {"mode": mode, "axis": axis}, opset=24)


@pytest.mark.parametrize("k,length", [(4, 6), (3, 1), (1, 5), (5, 2)])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state(rng, k, length, activation):
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    check("CausalConvWithState", [("x", f(2, 3, length)), ("w", f(3, 1, k)), ("b", f(3)),
                                  ("p", f(2, 3, k - 1))],
          {"activation": activation}, opset=27, outputs=("y", "state"))
    check("CausalConvWithState", [("x", f(2, 3, length)), ("w", f(3, 1, k))],
          {"activation": activation}, opset=27, outputs=("y", "state"))


# ---------------------------------------------------------------------------- recurrent cells

def _recurrent_inputs(rng, op, gates, direction, layout, seq, batch, inp, hid, full):
    f = lambda *s: nonzero_normal(rng, s) * 0.5  # noqa: E731
    d = 2 if direction == "bidirectional" else 1
    x = f(batch, seq, inp) if layout else f(seq, batch, inp)
    state = (lambda: f(batch, d, hid)) if layout else (lambda: f(d, batch, hid))
    ins = [("x", x), ("w", f(d, gates * hid, inp)), ("r", f(d, gates * hid, hid))]
    if full:
        lens = rng.integers(1, seq + 1, batch).astype(np.int32)
        ins += [("b", f(d, 2 * gates * hid)), ("lens", lens), ("h0", state())]
        if op == "LSTM":
            ins += [("c0", state()), ("p", f(d, 3 * hid))]
    return ins


@pytest.mark.parametrize("op,gates", [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("full", [False, True])
def test_recurrent(rng, op, gates, direction, layout, full):
    ins = _recurrent_inputs(rng, op, gates, direction, layout, 5, 3, 4, 6, full)
    outs = ("y", "y_h", "y_c") if op == "LSTM" else ("y", "y_h")
    attrs = {"hidden_size": 6, "direction": direction}
    want = None
    if layout:
        # ORT runs only layout 0: give it x and states with batch and sequence/direction
        # swapped, and swap its outputs back.
        swap = {"x", "h0", "c0"}
        want = _ort(op, [(n, a.transpose(1, 0, 2) if n in swap else a) for n, a in ins], attrs, 22, outs)
        want = [want[0].transpose(2, 0, 1, 3)] + [w.transpose(1, 0, 2) for w in want[1:]]
    check(op, ins, {**attrs, "layout": layout}, opset=22, outputs=outs, want=want)


@pytest.mark.parametrize("op,gates,attrs", [
    ("RNN", 1, {"activations": ["Relu"], "clip": 1.5}),
    ("RNN", 1, {"activations": ["LeakyRelu", "HardSigmoid"], "activation_alpha": [0.3, 0.4],
                "activation_beta": [0.6], "direction": "bidirectional"}),
    ("GRU", 3, {"linear_before_reset": 1}),
    ("GRU", 3, {"activations": ["HardSigmoid", "Softsign"], "activation_alpha": [0.3],
                "activation_beta": [0.4], "clip": 0.8}),
    ("LSTM", 4, {"input_forget": 1}),
    ("LSTM", 4, {"activations": ["Sigmoid", "Elu", "ScaledTanh"], "activation_alpha": [0.7, 1.2],
                 "activation_beta": [0.9], "clip": 2.0}),
])
def test_recurrent_attributes(rng, op, gates, attrs):
    direction = attrs.get("direction", "forward")
    ins = _recurrent_inputs(rng, op, gates, direction, 0, 4, 2, 3, 5, True)
    check(op, ins, {"hidden_size": 5, **attrs}, opset=22, outputs=("", "y_h"))


# ------------------------------------------------------------ against the node suite's outputs

_SUITE = [c for c in all_cases() if c.name.startswith(("test_linear_attention", "test_flexattention"))
          and "expanded" not in c.name]


@pytest.mark.parametrize("case", _SUITE, ids=[c.name for c in _SUITE])
def test_node_suite_case(case):
    assert run_case(case) is None


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_initial_state_without_sequence_lens(rng, direction):
    # The silero-vad form: bias and initial states given, sequence_lens skipped ("").
    ins = _recurrent_inputs(rng, "LSTM", 4, direction, 0, 6, 2, 5, 4, True)
    ins = [(n, None if n in ("lens", "p") else a) for n, a in ins]
    check("LSTM", ins, {"hidden_size": 4, "direction": direction}, opset=14,
          outputs=("y", "y_h", "y_c"))
