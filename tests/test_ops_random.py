"""Random ops (ir/ops/random.py): ONNX's seed semantics and the distributions of the draws.

A random op's values are never compared bit for bit with another runtime (ONNX leaves the
generator to the implementation). What is checked: a seeded node gives the same values on
every run and every backend, an unseeded one fresh values each run, and the draws follow
their distribution — moments, a Kolmogorov-Smirnov test against the exact CDF (scipy), a
chi-square test for the discrete ones. Model seeds come from the test's fresh generator.
"""
import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from scipy import stats

import npurun
from conftest import nonzero_normal
from npurun.frontend.onnx import import_model
from npurun.ir import parse, print_graph, verify

P_MIN = 1e-6  # a test of a correct sampler fails this rarely; a wrong one (scale, shift) fails at p ~ 0
N = 20000


def _model(op, inputs=None, attrs=None, consts=None, opset=22, n_out=1):
    inputs, consts = inputs or {}, consts or {}
    node = helper.make_node(op, list(inputs) + list(consts), [f"y{i}" for i in range(n_out)],
                            name=f"the_{op.lower()}", **(attrs or {}))
    g = helper.make_graph(
        [node], f"case_{op}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _run(model_or_graph, feeds=None, device="reference"):
    g = model_or_graph if isinstance(model_or_graph, npurun.Graph) else import_model(model_or_graph)
    out = npurun.Executor(device, parallelism=1).run_sync(g, feeds or {})
    return [out[n] for n in g.outputs]


def _seed(rng):
    return float(rng.integers(0, 1 << 20))


# ------------------------------------------------------------------ seed semantics

@pytest.mark.parametrize("op,attrs", [("RandomNormal", {"shape": [300]}), ("RandomUniform", {"shape": [300]}),
                                      ("RandomNormalLike", {}), ("RandomUniformLike", {}),
                                      ("Bernoulli", {}), ("Multinomial", {"sample_size": 50})])
def test_seeded_nodes_repeat_and_unseeded_ones_do_not(rng, op, attrs):
    inputs = {}
    if op.endswith("Like"):
        inputs = {"x": nonzero_normal(rng, (300,))}
    elif op == "Bernoulli":
        inputs = {"x": rng.uniform(0.2, 0.8, 300).astype(np.float32)}
    elif op == "Multinomial":
        inputs = {"x": nonzero_normal(rng, (6, 40))}
    seed = _seed(rng)
    seeded = import_model(_model(op, inputs, {**attrs, "seed": seed}))
    a, b = _run(seeded, inputs)[0], _run(seeded, inputs)[0]
    np.testing.assert_array_equal(a, b)  # the same values on every run
    other = _run(_model(op, inputs, {**attrs, "seed": seed + 1}), inputs)[0]
    assert not np.array_equal(a, other)
    unseeded = import_model(_model(op, inputs, attrs))
    assert not np.array_equal(_run(unseeded, inputs)[0], _run(unseeded, inputs)[0])


@pytest.mark.parametrize("device", ["cpu", "torch:cpu", "npusim", "ort:cpu"])
def test_a_seed_gives_the_same_values_on_every_backend(rng, device):
    """Every backend runs the random ops on their reference kernels (none claims them), so a
    seeded graph draws one stream everywhere."""
    if device == "torch:cpu":
        pytest.importorskip("torch", reason="the torch backend needs PyTorch")
    x = nonzero_normal(rng, (4, 50))
    seed = _seed(rng)
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["n"], seed=seed),
             helper.make_node("Add", ["x", "n"], ["y"]),
             helper.make_node("Dropout", ["y", "r", "t"], ["z", "mask"], seed=int(seed) + 7)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 50])],
                          [helper.make_empty_tensor_value_info("z"), helper.make_empty_tensor_value_info("mask")],
                          [numpy_helper.from_array(np.array(0.3, np.float32), "r"),
                           numpy_helper.from_array(np.array(True), "t")])
    graph = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)], ir_version=10))
    want = _run(graph, {"x": x})
    got = _run(graph, {"x": x}, device=device)
    for w, o in zip(want, got):
        np.testing.assert_array_equal(o, w)


def test_seed_values():
    from npurun.backends.reference.kernels.random import seed_value
    assert seed_value(3) == seed_value(3.0) == 3
    assert seed_value(-1) == (1 << 64) - 1
    assert seed_value(0.5) != seed_value(0.25)


def test_draws_of_constant_operands_stay_nodes():
    """Folding would freeze an unseeded draw into one constant for every run."""
    m = _model("RandomUniformLike", consts={"x": np.ones((3, 4), np.float32)})
    g = import_model(m)
    assert [n.op for n in g.nodes] == ["random_uniform_like"]


# ------------------------------------------------------------------ distributions

@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_random_normal_distribution(rng, dtype):
    mean, scale = float(rng.uniform(-3, 3)), float(rng.uniform(0.5, 2))
    (y,) = _run(_model("RandomNormal", attrs={"shape": [100, N // 100], "mean": mean, "scale": scale,
                                              "dtype": dtype, "seed": _seed(rng)}))
    assert y.shape == (100, N // 100)
    assert y.dtype == helper.tensor_dtype_to_np_dtype(dtype)
    v = y.astype(np.float64).reshape(-1)
    assert abs(v.mean() - mean) < 5 * scale / math.sqrt(N)
    assert abs(v.std() / scale - 1) < 5 * math.sqrt(0.5 / N) + 0.01  # + the rounding of 8-bit mantissas
    if dtype in (TensorProto.FLOAT, TensorProto.DOUBLE):  # the KS test needs a continuous sample
        assert stats.kstest(v, "norm", args=(mean, scale)).pvalue > P_MIN


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_random_uniform_distribution(rng, dtype):
    low = float(rng.uniform(-5, 0))
    high = low + float(rng.uniform(0.5, 4))
    (y,) = _run(_model("RandomUniform", attrs={"shape": [N], "low": low, "high": high, "dtype": dtype,
                                               "seed": _seed(rng)}))
    assert y.dtype == helper.tensor_dtype_to_np_dtype(dtype)
    assert y.min() >= low and y.max() <= high
    assert stats.kstest(y.astype(np.float64), "uniform", args=(low, high - low)).pvalue > P_MIN


def test_like_forms_take_shape_and_type(rng):
    x = nonzero_normal(rng, (7, 3, 5)).astype(np.float16)
    (y,) = _run(_model("RandomNormalLike", {"x": x}), {"x": x})
    assert y.shape == x.shape and y.dtype == np.float16
    (y,) = _run(_model("RandomUniformLike", {"x": x}, {"dtype": TensorProto.DOUBLE, "low": 2.0, "high": 3.0}), {"x": x})
    assert y.shape == x.shape and y.dtype == np.float64 and 2 <= y.min() and y.max() <= 3
    xb = x.astype(ml_dtypes.bfloat16)
    (y,) = _run(_model("RandomNormalLike", {"x": xb}), {"x": xb})
    assert y.dtype == xb.dtype


@pytest.mark.parametrize("dtype", [None, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.BOOL])
def test_bernoulli_distribution(rng, dtype):
    p = rng.uniform(0, 1, N).astype(np.float32)
    p[:10] = [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    attrs = {"seed": _seed(rng)} | ({"dtype": dtype} if dtype else {})
    (y,) = _run(_model("Bernoulli", {"p": p}, attrs), {"p": p})
    assert y.dtype == (np.float32 if dtype is None else helper.tensor_dtype_to_np_dtype(dtype))
    v = y.astype(np.float64)
    assert set(np.unique(v)) <= {0.0, 1.0}
    np.testing.assert_array_equal(v[:10], p[:10])  # p = 0 never, p = 1 always
    # The number of ones is a sum of independent Bernoulli(p_i): its z-score is near N(0, 1).
    z = (v.sum() - p.sum()) / math.sqrt((p * (1 - p)).sum())
    assert abs(z) < 5
    # And per probability bin: ones are as frequent as the bin's mean p.
    bins = np.digitize(p, np.linspace(0, 1, 11)[1:-1])
    for b in range(10):
        sel = bins == b
        pb, n = p[sel].mean(), sel.sum()
        assert abs(v[sel].mean() - pb) < 5 * math.sqrt(pb * (1 - pb) / n) + 1e-9


def test_bernoulli_refuses_probabilities_outside_0_1():
    p = np.array([0.2, 1.5], np.float32)
    with pytest.raises(npurun.NpurunError, match="the_bernoulli.*\\[0, 1\\]"):
        _run(_model("Bernoulli", {"p": p}), {"p": p})


@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64])
def test_multinomial_distribution(rng, dtype):
    logits = nonzero_normal(rng, (3, 6))
    logits[2, 4] = -np.inf  # a class of probability 0
    (y,) = _run(_model("Multinomial", {"x": logits}, {"sample_size": N, "dtype": dtype, "seed": _seed(rng)}),
                {"x": logits})
    assert y.shape == (3, N) and y.dtype == helper.tensor_dtype_to_np_dtype(dtype)
    probs = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    assert not np.any(y[2] == 4)
    for b in range(3):
        counts = np.bincount(y[b], minlength=6)
        live = probs[b] > 0
        assert stats.chisquare(counts[live], N * probs[b][live]).pvalue > P_MIN


def test_multinomial_needs_2d_logits():
    with pytest.raises(npurun.NpurunError, match="the_multinomial.*2-D"):
        import_model(_model("Multinomial", {"x": np.zeros((2, 3, 4), np.float32)}))


# ------------------------------------------------------------------ dropout

def _dropout(x, ratio, training, seed=None, opset=22):
    attrs = {} if seed is None else {"seed": seed}
    consts = {"r": np.array(ratio, np.float32), "t": np.array(training)}
    return _run(_model("Dropout", {"x": x}, attrs, consts, opset=opset, n_out=2), {"x": x})


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.8])
def test_training_dropout_keeps_1_minus_ratio_and_scales(rng, ratio):
    x = nonzero_normal(rng, (40, N // 40))
    seed = int(rng.integers(0, 1 << 30))
    y, mask = _dropout(x, ratio, True, seed)
    assert mask.dtype == np.bool_ and mask.shape == x.shape and y.dtype == x.dtype
    # ONNX: y = x * mask / (1 - ratio)
    np.testing.assert_allclose(y, np.where(mask, x / np.float32(1 - ratio), 0), rtol=1e-6)
    kept = mask.mean()
    assert abs(kept - (1 - ratio)) < 5 * math.sqrt(ratio * (1 - ratio) / mask.size)
    y2, mask2 = _dropout(x, ratio, True, seed)
    np.testing.assert_array_equal(mask, mask2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(_dropout(x, ratio, True)[1], _dropout(x, ratio, True)[1])


@pytest.mark.parametrize("ratio,training", [(0.5, False), (0.0, True)])
def test_dropout_that_drops_nothing_matches_onnx_reference(rng, ratio, training):
    x = nonzero_normal(rng, (3, 4, 5))
    consts = {"r": np.array(ratio, np.float32), "t": np.array(training)}
    model = _model("Dropout", {"x": x}, {"seed": 3}, consts, n_out=2)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for g, w in zip(_run(model, {"x": x}), want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_inference_dropout_is_the_identity_and_its_mask_all_true(rng):
    x = nonzero_normal(rng, (2, 9))
    for opset in (7, 10, 12, 22):
        model = _model("Dropout", {"x": x}, {"ratio": 0.4} if opset < 12 else {}, opset=opset, n_out=2)
        y, mask = _run(model, {"x": x})
        np.testing.assert_array_equal(y, x)
        assert mask.all() and mask.dtype == (x.dtype if opset < 10 else np.bool_)
    g = import_model(_model("Dropout", {"x": x}))
    assert [n.op for n in g.nodes] == ["identity"]  # without the mask, nothing to draw


def test_training_mode_known_only_at_run_time(rng):
    x = nonzero_normal(rng, (50, 40))
    inputs = {"x": x, "t": np.array(True)}
    model = _model("Dropout", inputs, {"seed": 5}, {"r": np.array(0.5, np.float32)}, n_out=2)
    # operands in ONNX order: x, ratio, training_mode
    model.graph.node[0].input[:] = ["x", "r", "t"]
    g = import_model(model)
    y, mask = _run(g, inputs)
    assert 0.4 < mask.mean() < 0.6
    y, mask = _run(g, {"x": x, "t": np.array(False)})
    np.testing.assert_array_equal(y, x)
    assert mask.all()


def test_dropout_ratio_1_is_an_error_naming_the_node(rng):
    x = nonzero_normal(rng, (4,))
    with pytest.raises(npurun.NpurunError, match="the_dropout.*outside \\[0, 1\\)"):
        _dropout(x, 1.0, True, 0)


# ------------------------------------------------------------------ the IR text

def test_random_ops_round_trip_through_npuir():
    text = """npuir 1
graph g
input x: [2, 3] f32 DRAM0
input t: [] bool DRAM0
const r: [] f32 DRAM0 = [0.25]
op random_normal (-> a: [4, 5] f16 DRAM0) shape=[4, 5] dtype="f16" mean=1.5 scale=2.0 seed=3.0
op random_uniform (-> b: [2] f64 DRAM0) shape=[2] dtype="f64" low=-1.0 high=1.0
op random_normal_like (x: [2, 3] f32 DRAM0 -> c: [2, 3] f32 DRAM0) seed=0.5
op random_uniform_like (x: [2, 3] f32 DRAM0 -> d: [2, 3] bf16 DRAM0) dtype="bf16"
op bernoulli (c: [2, 3] f32 DRAM0 -> e: [2, 3] i64 DRAM0) dtype="i64" seed=1.0
op multinomial (x: [2, 3] f32 DRAM0 -> f: [2, 7] i64 DRAM0) dtype="i64" sample_size=7
op dropout (x: [2, 3] f32 DRAM0, r: [] f32 DRAM0, t: [] bool DRAM0 -> y: [2, 3] f32 DRAM0, m: [2, 3] bool DRAM0) seed=-4
output a: [4, 5] f16 DRAM0
"""
    g = verify(parse(text))
    assert print_graph(verify(parse(print_graph(g)))) == print_graph(g)
    assert parse(print_graph(g)) == g
    assert g.nodes[0].attrs["seed"] == 3.0 and g.nodes[-1].attrs["seed"] == -4


def test_random_normal_refuses_an_integer_dtype():
    with pytest.raises(npurun.NpurunError, match="not a float type"):
        import_model(_model("RandomNormal", attrs={"shape": [2], "dtype": TensorProto.INT32}))
