"""Models as ONNX Runtime's own tools leave them, each matched against ONNX Runtime on npurun's
reference and cpu backends: small CNNs, LSTMs and transformer encoders built here with random
weights (torch, transformers configs; nothing downloaded, nothing committed), then

- `quantize_static` in QOperator and QDQ formats (a small calibration reader) and
  `quantize_dynamic`: quantized models match within two quantization steps of their output;
- `onnxruntime.transformers.optimizer.optimize_model` (bert, gpt2, vit; opt_level 1 and 2), and
  `quantize_dynamic` of the optimized BERT (QAttention, QEmbedLayerNormalization);
- ONNX Runtime's session optimizer saved to a file (FusedConv, FusedMatMul,
  DynamicQuantizeMatMul, the QOperator fusions);
- `MatMulNBitsQuantizer` (MatMulNBits);
- a decoder layer as the GenAI model builder writes one (SimplifiedLayerNormalization,
  MatMulNBits projections, GroupQueryAttention with rotary embeddings, SkipSimplified-
  LayerNormalization), built with onnx.helper.

Each test checks that the ops the tool was meant to emit are there, so a tool that changes
what it emits fails the test rather than passing on a plain model.
"""
from __future__ import annotations

import collections
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import npurun
from ort_exact import u8_weights

torch = pytest.importorskip("torch", reason="torch is a test dependency (pip install -e '.[test]')")
BACKENDS = ("reference", "cpu")


# ------------------------------------------------------------------ helpers

def _ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def _ort(path, feeds, threads=1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads  # ORT's quantized LSTM quantizes per thread's rows
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the model as saved
    # int8 weights of integer products as uint8: ORT is exact so on every x86 (tests/ort_exact.py)
    model, feeds = u8_weights(onnx.load(str(path)), feeds)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _npurun(path, feeds, device):
    sess = npurun.InferenceSession(str(path), device=device)
    return sess.run(None, feeds)


def _text_and_cost(path, feeds):
    """The imported model prints as .npuir and parses back equal, and npusim costs every
    contrib node (matrix ones with their MACs)."""
    from npurun.backends.npusim.simulate import estimate
    from npurun.ir.ops import OPS
    g = npurun.load(path)
    saved = npurun.save(g, path.with_suffix(".npuir"))
    assert npurun.load(saved) == g
    rep = estimate(g, "x-elite-hexagon", {k: v.shape for k, v in feeds.items()})
    for n, t in zip(g.nodes, rep.nodes):
        if n.op.startswith("com.microsoft.") and OPS[n.op].unit == "matrix":
            assert t.macs > 0 and t.time_s > 0, (n.op, t)


def _check(path, feeds, *, atol, rtol=1e-4):
    _text_and_cost(path, feeds)
    want = _ort(path, feeds)
    for b in BACKENDS:
        got = _npurun(path, feeds, b)
        for w, y in zip(want, got):
            assert y.shape == w.shape and y.dtype == w.dtype, (b, y.shape, w.shape)
            np.testing.assert_allclose(y, w, atol=atol, rtol=rtol, err_msg=f"{path.name} on {b}")
    return want


def _output_scale(path) -> float:
    """The scale of the DequantizeLinear that produces the model's first output."""
    m = onnx.load(str(path))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    out = m.graph.output[0].name
    node = next(n for n in m.graph.node if out in n.output)
    assert node.op_type == "DequantizeLinear", node.op_type
    return float(inits[node.input[1]].reshape(-1)[0])


def _export(model, args, path, names, dynamic=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, str(path), dynamo=False, input_names=names, output_names=["y"],
                          opset_version=17, dynamic_axes=dynamic)
    return path


def _session_optimized(path, out):
    """The model as ONNX Runtime's own session optimizer rewrites it (saved to a file)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return out


# ------------------------------------------------------------------ a small CNN, statically quantized

class _CNN(torch.nn.Module):
    """conv, relu, residual add, mul by a sigmoid gate, leaky relu, concat, pooling, gemm, softmax:
    every QOperator op the static quantizer has for a CNN."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3, self.fc = torch.nn.Conv2d(16, 8, 1), torch.nn.Linear(8, 10)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        b = self.c2(a)
        y = torch.nn.functional.leaky_relu(a + b, 0.1) * torch.sigmoid(b)
        y = self.c3(torch.cat([y, a], 1))
        y = torch.nn.functional.avg_pool2d(y, 2)
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return torch.softmax(self.fc(y), -1)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    torch.manual_seed(0)
    return _export(_CNN(), (torch.randn(1, 3, 16, 16),), tmp_path_factory.mktemp("cnn") / "cnn.onnx", ["x"])


def _reader(shape, n=4, seed=1):
    from onnxruntime.quantization import CalibrationDataReader
    rng = np.random.default_rng(seed)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)])

        def get_next(self):
            return next(self.items, None)
    return Reader()


@pytest.mark.parametrize("fmt, act, per_channel", [("QOperator", "QUInt8", False), ("QOperator", "QInt8", True),
                                                   ("QDQ", "QUInt8", False), ("QDQ", "QInt8", True)])
def test_quantize_static(cnn, tmp_path, rng, fmt, act, per_channel):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    out = tmp_path / f"cnn_{fmt}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_static(str(cnn), str(out), _reader((1, 3, 16, 16)), quant_format=getattr(QuantFormat, fmt),
                        activation_type=getattr(QuantType, act), weight_type=QuantType.QInt8, per_channel=per_channel)
    ops = _ops(out)
    if fmt == "QOperator":
        assert {"QLinearConv", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
                "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"} <= set(ops), ops
    else:
        assert ops["QuantizeLinear"] > 5 and ops["DequantizeLinear"] > 5, ops
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    _check(out, {"x": x}, atol=2 * _output_scale(out) + 1e-7, rtol=0)
    # and what ONNX Runtime's session optimizer makes of it (QDQ -> QLinear* fusions)
    opt = _session_optimized(out, tmp_path / "opt.onnx")
    assert any(op.startswith("QLinear") or op == "QGemm" for op in _ops(opt)), _ops(opt)
    _check(opt, {"x": x}, atol=2 * _output_scale(opt) + 1e-7, rtol=0)


def test_session_optimized_float_cnn(cnn, tmp_path, rng):
    opt = _session_optimized(cnn, tmp_path / "opt.onnx")
    assert "FusedConv" in _ops(opt), _ops(opt)
    _check(opt, {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}, atol=1e-5)


def test_quantize_dynamic_cnn(cnn, tmp_path, rng):
    from onnxruntime.quantization import quantize_dynamic
    out = tmp_path / "cnn_dyn.onnx"
    quantize_dynamic(str(cnn), str(out))
    opt = _session_optimized(out, tmp_path / "opt.onnx")
    assert "DynamicQuantizeMatMul" in _ops(opt), _ops(opt)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    _check(out, {"x": x}, atol=1e-5)
    _check(opt, {"x": x}, atol=1e-5)


# ------------------------------------------------------------------ LSTM and encoder, dynamically quantized

class _LSTM(torch.nn.Module):
    def __init__(self, bidirectional):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True, bidirectional=bidirectional)
        self.fc = torch.nn.Linear(32 if bidirectional else 16, 4)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_quantize_dynamic_lstm(tmp_path, rng, bidirectional):
    from onnxruntime.quantization import quantize_dynamic
    torch.manual_seed(0)
    src = _export(_LSTM(bidirectional), (torch.randn(2, 5, 8),), tmp_path / "lstm.onnx", ["x"],
                  {"x": {0: "b", 1: "s"}})
    out = tmp_path / "lstm_dyn.onnx"
    quantize_dynamic(str(src), str(out))
    assert "DynamicQuantizeLSTM" in _ops(out), _ops(out)
    x = rng.standard_normal((3, 7, 8)).astype(np.float32)
    _check(out, {"x": x}, atol=1e-5)
    opt = _session_optimized(out, tmp_path / "opt.onnx")
    _check(opt, {"x": x}, atol=1e-5)


def test_quantize_dynamic_encoder(tmp_path, rng):
    from onnxruntime.quantization import quantize_dynamic
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2)
    src = _export(enc, (torch.randn(1, 6, 32),), tmp_path / "enc.onnx", ["x"], {"x": {0: "b", 1: "s"}})
    out = tmp_path / "enc_dyn.onnx"
    quantize_dynamic(str(src), str(out))
    assert "MatMulInteger" in _ops(out), _ops(out)
    opt = _session_optimized(out, tmp_path / "opt.onnx")
    assert {"DynamicQuantizeMatMul", "SkipLayerNormalization"} <= set(_ops(opt)), _ops(opt)
    x = rng.standard_normal((1, 6, 32)).astype(np.float32)  # (the TorchScript export fixes the shape)
    _check(out, {"x": x}, atol=2e-5)
    _check(opt, {"x": x}, atol=2e-5)


# ------------------------------------------------------------------ transformers through the optimizer

class _Wrapped(torch.nn.Module):
    """A transformers model with positional inputs and its first output as a plain tensor."""

    def __init__(self, model, names):
        super().__init__()
        self.m, self.names = model, names

    def forward(self, *args):
        return self.m(**dict(zip(self.names, args)), return_dict=False)[0]


def _tiny(kind):
    import transformers as T
    torch.manual_seed(0)
    # eager attention: the optimizer's fusions match its pattern (not the sdpa kernels')
    if kind == "bert":
        cfg = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
        return T.BertModel(cfg, add_pooling_layer=False), ["input_ids", "attention_mask", "token_type_ids"]
    if kind == "gpt2":
        cfg = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32, use_cache=False,
                           attn_implementation="eager")
        return T.GPT2Model(cfg), ["input_ids", "attention_mask"]
    cfg = T.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, attn_implementation="eager")
    return T.ViTModel(cfg, add_pooling_layer=False), ["pixel_values"]


def _feeds(kind, rng, b=2, s=8):
    if kind == "vit":
        return {"pixel_values": rng.standard_normal((b, 3, 16, 16)).astype(np.float32)}
    ids = rng.integers(1, 100, (b, s)).astype(np.int64)
    mask = np.ones((b, s), np.int64)
    mask[1, s - 3:] = 0  # the second row is padded on the right
    feeds = {"input_ids": ids, "attention_mask": mask}
    if kind == "bert":
        feeds["token_type_ids"] = (np.arange(s)[None, :] >= s // 2).astype(np.int64).repeat(b, 0)
    return feeds


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """kind -> the tiny model exported to ONNX (built once per module)."""
    out, rng = {}, np.random.default_rng(0)
    for kind in ("bert", "gpt2", "vit"):
        model, names = _tiny(kind)
        feeds = _feeds(kind, rng)
        args = tuple(torch.from_numpy(feeds[n]) for n in names)
        dyn = None if kind == "vit" else {n: {0: "b", 1: "s"} for n in names}
        out[kind] = _export(_Wrapped(model.eval(), names), args, tmp_path_factory.mktemp(kind) / f"{kind}.onnx",
                            names, dyn)
    return out


EMITS = {"bert": {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
         "gpt2": {"SkipLayerNormalization", "FastGelu"},
         "vit": {"SkipLayerNormalization"}}


@pytest.mark.parametrize("kind", ["bert", "gpt2", "vit"])
@pytest.mark.parametrize("opt_level", [1, 2])
def test_transformer_optimizer(exported, tmp_path, rng, kind, opt_level):
    from onnxruntime.transformers.optimizer import optimize_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimize_model(str(exported[kind]), model_type=kind, num_heads=2, hidden_size=32, opt_level=opt_level)
    path = tmp_path / f"{kind}_opt{opt_level}.onnx"
    opt.save_model_to_file(str(path))
    ops = _ops(path)
    assert EMITS[kind] <= set(ops), ops
    if kind == "vit":
        assert {"Gelu", "BiasGelu"} & set(ops), ops
    _check(path, _feeds(kind, rng), atol=2e-5)


def test_quantized_bert(exported, tmp_path, rng):
    """The optimizer's BERT through quantize_dynamic: QAttention, QEmbedLayerNormalization."""
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimize_model(str(exported["bert"]), model_type="bert", num_heads=2, hidden_size=32, opt_level=1)
    fused = tmp_path / "bert_opt.onnx"
    opt.save_model_to_file(str(fused))
    out = tmp_path / "bert_q.onnx"
    quantize_dynamic(str(fused), str(out), extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    assert {"QAttention", "QEmbedLayerNormalization", "MatMulInteger"} <= set(_ops(out)), _ops(out)
    _check(out, _feeds("bert", rng), atol=5e-5)


# ------------------------------------------------------------------ weight-only 4-bit: MatMulNBits

@pytest.mark.parametrize("block_size, symmetric", [(32, False), (16, True)])
def test_matmul_nbits_quantizer(tmp_path, rng, block_size, symmetric):
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    w1, w2 = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 40)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 40])],
                          initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    q = MatMulNBitsQuantizer(model, bits=4, block_size=block_size, is_symmetric=symmetric)
    q.process()
    path = tmp_path / "mlp4.onnx"
    onnx.save(q.model.model, str(path))
    assert _ops(path)["MatMulNBits"] == 2, _ops(path)
    _check(path, {"x": rng.standard_normal((5, 64)).astype(np.float32)}, atol=1e-4)


# ------------------------------------------------------------------ a GenAI-builder decoder layer

def _decoder_layer(rng, hidden=64, nq=4, nkv=2, inter=96, maxpos=64, block=32):
    """One Llama-style layer as onnxruntime-genai's builder writes it: RMSNorm, 4-bit QKV / O /
    MLP projections, GQA with rotary embeddings and a KV cache, residual RMSNorm."""
    from onnx import TensorProto, helper, numpy_helper
    head = hidden // nq
    inits, nodes = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def nbits(name, x, k, n):
        from test_contrib_nbits import _weights  # random 4-bit blocks, packed as MatMulNBits wants
        b, s, z = _weights(rng, k, n, 4, block, "packed")
        nodes.append(helper.make_node("MatMulNBits", [x, const(f"{name}.b", b), const(f"{name}.s", s),
                                                      const(f"{name}.z", z)], [f"{name}.y"], domain="com.microsoft",
                                      K=k, N=n, bits=4, block_size=block, name=name))
        return f"{name}.y"

    theta = np.outer(np.arange(maxpos), 1.0 / 10000 ** (np.arange(0, head, 2) / head)).astype(np.float32)
    nodes.append(helper.make_node("SimplifiedLayerNormalization", ["x", const("ln1", rng.uniform(0.5, 1.5, hidden)
                                                                             .astype(np.float32))], ["n1"],
                                  epsilon=1e-6, name="ln1"))
    qkv = nbits("qkv", "n1", hidden, (nq + 2 * nkv) * head)
    nodes.append(helper.make_node("GroupQueryAttention", [qkv, "", "", "past_key", "past_value", "seqlens_k",
                                                          "total_len", const("cos", np.cos(theta)),
                                                          const("sin", np.sin(theta))],
                                  ["attn", "present_key", "present_value"], domain="com.microsoft", num_heads=nq,
                                  kv_num_heads=nkv, do_rotary=1, name="gqa"))
    o = nbits("o", "attn", nq * head, hidden)
    nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [o, "x", const("ln2", rng.uniform(0.5, 1.5, hidden)
                                                                                     .astype(np.float32))],
                                  ["n2", "", "", "res"], domain="com.microsoft", epsilon=1e-6, name="ln2"))
    up = nbits("up", "n2", hidden, inter)
    nodes.append(helper.make_node("QuickGelu", [up], ["act"], domain="com.microsoft", name="act"))
    down = nbits("down", "act", inter, hidden)
    nodes.append(helper.make_node("Add", [down, "res"], ["y"], name="residual"))
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "decoder_layer",
                          [helper.make_tensor_value_info("x", f, ["b", "s", hidden]),
                           helper.make_tensor_value_info("past_key", f, ["b", nkv, "p", head]),
                           helper.make_tensor_value_info("past_value", f, ["b", nkv, "p", head]),
                           helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
                           helper.make_tensor_value_info("total_len", TensorProto.INT32, [1])],
                          [helper.make_tensor_value_info("y", f, ["b", "s", hidden]),
                           helper.make_tensor_value_info("present_key", f, ["b", nkv, "t", head]),
                           helper.make_tensor_value_info("present_value", f, ["b", nkv, "t", head])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def test_genai_decoder_layer(tmp_path, rng):
    path = tmp_path / "layer.onnx"
    onnx.save(_decoder_layer(rng), str(path))
    hidden, nkv, head = 64, 2, 16
    # a prompt of 6 tokens (empty cache), then one decode step on its present cache
    x = rng.standard_normal((2, 6, hidden)).astype(np.float32)
    empty = np.zeros((2, nkv, 0, head), np.float32)
    prompt = {"x": x, "past_key": empty, "past_value": empty, "seqlens_k": np.array([5, 5], np.int32),
              "total_len": np.array([6], np.int32)}
    y, pk, pv = _check(path, prompt, atol=1e-4)
    step = {"x": rng.standard_normal((2, 1, hidden)).astype(np.float32), "past_key": pk, "past_value": pv,
            "seqlens_k": np.array([6, 6], np.int32), "total_len": np.array([7], np.int32)}
    _check(path, step, atol=1e-4)
