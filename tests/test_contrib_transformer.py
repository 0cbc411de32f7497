"""com.microsoft transformer ops (GELU family, bias adds, normalizations, embeddings) against
ONNX Runtime on the reference and cpu backends, fresh random inputs each run."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import nonzero_normal
from contrib_util import check, check_like, node_model, quantized, scale


@pytest.mark.parametrize("op, extra, attrs", [
    ("Gelu", [], {}), ("BiasGelu", ["b"], {}), ("FastGelu", [], {}), ("FastGelu", ["b"], {}),
    ("QuickGelu", [], {}), ("QuickGelu", [], {"alpha": 1.3}),
])
def test_gelu_family(rng, tmp_path, op, extra, attrs):
    x = nonzero_normal(rng, (2, 5, 24)) * 2
    ins = [("x", x)] + [("b", nonzero_normal(rng, (24,)))] * len(extra)
    m = node_model(op, ins, attrs=attrs, consts={"b"})
    check(m, {"x": x}, tmp_path, rtol=1e-5, atol=2e-6)


def _graph(nodes, inputs, outputs, inits):
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph(nodes, "o", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape))
                                       for n, a in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                          initializer=[numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def test_bias_add_and_split_gelu(rng, tmp_path):
    # ONNX Runtime has these two for CUDA only: the oracle is the same math in standard ops.
    from onnx import helper
    x, skip, b = nonzero_normal(rng, (2, 6, 16)), nonzero_normal(rng, (2, 6, 16)), nonzero_normal(rng, (16,))
    m = node_model("BiasAdd", [("x", x), ("b", b), ("skip", skip)], consts={"b"})
    oracle = _graph([helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node("Add", ["t", "skip"], ["y0"])],
                    [("x", x), ("skip", skip)], ["y0"], [("b", b)])
    check_like(m, oracle, {"x": x, "skip": skip}, tmp_path)
    x, b = nonzero_normal(rng, (2, 9, 64)) * 2, nonzero_normal(rng, (64,))
    m = node_model("BiasSplitGelu", [("x", x), ("b", b)], consts={"b"})
    oracle = _graph([helper.make_node("Add", ["x", "b"], ["t"]),
                     helper.make_node("Split", ["t"], ["l", "r"], axis=-1, num_outputs=2),
                     helper.make_node("Gelu", ["r"], ["gr"]), helper.make_node("Mul", ["l", "gr"], ["y0"])],
                    [("x", x)], ["y0"], [("b", b)])
    check_like(m, oracle, {"x": x}, tmp_path, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("skip_shape", [(2, 7, 32), (1, 7, 32)])
def test_skip_layer_norms(rng, tmp_path, op, with_bias, skip_shape):
    x, skip = nonzero_normal(rng, (2, 7, 32)), nonzero_normal(rng, skip_shape)
    ins = [("x", x), ("skip", skip), ("g", nonzero_normal(rng, (32,)))]
    if op == "SkipLayerNormalization":
        ins.append(("beta", nonzero_normal(rng, (32,))))
    if with_bias:
        ins.append(("bias", nonzero_normal(rng, (32,))))
    outs = ["y", "", "inv", "sum"] if op == "SkipSimplifiedLayerNormalization" else ["y", "mean", "inv", "sum"]
    m = node_model(op, ins, attrs={"epsilon": 1e-5}, consts={"g", "beta", "bias"}, out_names=outs)
    check(m, {"x": x, "skip": skip}, tmp_path, rtol=1e-5, atol=1e-5)


def test_simplified_layer_normalization(rng, tmp_path):
    x = nonzero_normal(rng, (3, 4, 20))
    m = node_model("SimplifiedLayerNormalization", [("x", x), ("s", nonzero_normal(rng, (20,)))],
                   n_out=2, attrs={"epsilon": 1e-6}, domain="", consts={"s"})
    check(m, {"x": x}, tmp_path, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("segments, mask, pos", [(True, True, None), (False, False, None), (True, True, "broadcast"),
                                                 (True, False, "full")])
def test_embed_layer_normalization(rng, tmp_path, segments, mask, pos):
    b, s, h, vocab = 2, 7, 16, 30
    ids = rng.integers(0, vocab, (b, s)).astype(np.int32)
    seg = rng.integers(0, 2, (b, s)).astype(np.int32)
    msk = (np.arange(s)[None, :] < np.array([[7], [4]])).astype(np.int32)
    ins = [("ids", ids), ("seg", seg) if segments else None, ("word", nonzero_normal(rng, (vocab, h))),
           ("posemb", nonzero_normal(rng, (12, h))), ("segemb", nonzero_normal(rng, (2, h))) if segments else None,
           ("g", nonzero_normal(rng, (h,))), ("beta", nonzero_normal(rng, (h,))), ("mask", msk) if mask else None]
    feeds = {"ids": ids, **({"seg": seg} if segments else {}), **({"mask": msk} if mask else {})}
    if pos is not None:
        pids = rng.permutation(12)[:s].astype(np.int32)[None, :] if pos == "broadcast" else \
            rng.integers(0, 12, (b, s)).astype(np.int32)
        ins.append(("pids", pids))
        feeds["pids"] = pids
    m = node_model("EmbedLayerNormalization", ins, n_out=3, attrs={"epsilon": 1e-6},
                   consts={"word", "posemb", "segemb", "g", "beta"})
    want = check(m, feeds, tmp_path, rtol=1e-5, atol=1e-5)
    if mask:
        assert want["y1"].tolist() == [7, 4]


def test_embed_ids_out_of_range_is_an_npurun_error(rng, tmp_path):
    import onnx

    import npurun
    ids = np.array([[1, 40]], np.int32)
    m = node_model("EmbedLayerNormalization", [("ids", ids), None, ("word", nonzero_normal(rng, (30, 8))),
                                               ("posemb", nonzero_normal(rng, (4, 8))), None,
                                               ("g", nonzero_normal(rng, (8,))), ("beta", nonzero_normal(rng, (8,)))],
                   consts={"word", "posemb", "g", "beta"})
    onnx.save(m, tmp_path / "e.onnx")
    sess = npurun.InferenceSession(tmp_path / "e.onnx", device="cpu")
    with pytest.raises(npurun.NpurunError, match="input_ids out of range: values from 1 to 40, the table has 30 rows"):
        sess.run(None, {"ids": ids})


def test_qembed_layer_normalization(rng, tmp_path):
    b, s, h, vocab = 2, 6, 16, 25
    ids = rng.integers(0, vocab, (b, s)).astype(np.int32)
    seg = rng.integers(0, 2, (b, s)).astype(np.int32)
    msk = np.ones((b, s), np.int32)
    tables = {n: quantized(rng, shape) for n, shape in
              (("word", (vocab, h)), ("pos", (s, h)), ("segt", (2, h)), ("g", (h,)), ("beta", (h,)))}
    ins = [("ids", ids), ("seg", seg), ("word", tables["word"]), ("pos", tables["pos"]), ("segt", tables["segt"]),
           ("g", tables["g"]), ("beta", tables["beta"]), ("mask", msk)]
    ins += [(f"{n}_s", scale(rng)) for n in ("word", "pos", "segt", "g", "beta")]
    ins += [(f"{n}_z", np.array(rng.integers(100, 156), np.uint8)) for n in ("word", "pos", "segt", "g", "beta")]
    consts = {n for n, _ in ins} - {"ids", "seg", "mask"}
    m = node_model("QEmbedLayerNormalization", ins, n_out=2, attrs={"epsilon": 1e-6}, consts=consts)
    check(m, {"ids": ids, "seg": seg, "mask": msk}, tmp_path, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ ORT's fused float ops

@pytest.mark.parametrize("sa, sb, attrs", [
    ((4, 6), (6, 5), {"alpha": 0.5}),
    ((6, 4), (5, 6), {"transA": 1, "transB": 1}),
    ((2, 3, 4, 6), (2, 3, 5, 6), {"transB": 1, "alpha": 0.125}),
    ((3, 6), (2, 6, 5), {}),
    ((4, 2, 6), (2, 6, 5), {"transBatchA": 1}),
    ((2, 4, 6), (5, 2, 6), {"transBatchB": 1, "transB": 1}),
    ((6, 2, 4), (2, 6, 5), {"transBatchA": 1, "transA": 1}),
])
def test_fused_matmul(rng, tmp_path, sa, sb, attrs):
    a, b = nonzero_normal(rng, sa), nonzero_normal(rng, sb)
    m = node_model("FusedMatMul", [("a", a), ("b", b)], attrs=attrs)
    check(m, {"a": a, "b": b}, tmp_path, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation, params", [("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.2]),
                                                ("Clip", [-0.5, 0.7]), ("HardSigmoid", [0.3, 0.4])])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(rng, tmp_path, activation, params, with_z):
    x = nonzero_normal(rng, (1, 6, 9, 8))
    w, b = nonzero_normal(rng, (8, 6, 3, 3)) * 0.3, nonzero_normal(rng, (8,))
    ins = [("x", x), ("w", w), ("b", b)] + ([("z", nonzero_normal(rng, (1, 8, 9, 8)))] if with_z else [])
    attrs = {"activation": activation, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    if params:
        attrs["activation_params"] = params
    m = node_model("FusedConv", ins, attrs=attrs, consts={"w", "b"})
    feeds = {"x": x, **({"z": ins[3][1]} if with_z else {})}
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_fused_conv_strided_grouped(rng, tmp_path):
    x = nonzero_normal(rng, (2, 8, 11, 10))
    w, b = nonzero_normal(rng, (8, 2, 3, 3)) * 0.3, nonzero_normal(rng, (8,))
    m = node_model("FusedConv", [("x", x), ("w", w), ("b", b)],
                   attrs={"activation": "Relu", "strides": [2, 2], "pads": [1, 1, 1, 1], "group": 4},
                   consts={"w", "b"})
    check(m, {"x": x}, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("activation, attrs", [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.1}),
                                               ("Tanh", {}), ("Sigmoid", {})])
def test_fused_gemm(rng, tmp_path, activation, attrs):
    a, b, c = nonzero_normal(rng, (5, 7)), nonzero_normal(rng, (9, 7)), nonzero_normal(rng, (9,))
    m = node_model("FusedGemm", [("a", a), ("b", b), ("c", c)],
                   attrs={"activation": activation, "transB": 1, "alpha": 0.5, "beta": 2.0, **attrs}, consts={"b", "c"})
    check(m, {"a": a}, tmp_path, rtol=1e-5, atol=1e-5)


def test_fused_conv_unknown_activation_is_named(rng, tmp_path):
    import onnx

    import npurun
    x, w = nonzero_normal(rng, (1, 2, 4, 4)), nonzero_normal(rng, (2, 2, 1, 1))
    m = node_model("FusedConv", [("x", x), ("w", w)], attrs={"activation": "Swish"}, consts={"w"})
    onnx.save(m, tmp_path / "c.onnx")
    with pytest.raises(npurun.NpurunError, match=r"com.microsoft.fused_conv\): activation 'Swish': expected one of Relu"):
        npurun.load(tmp_path / "c.onnx")
