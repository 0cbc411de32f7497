"""MaxPool's Indices output (max_pool_with_indices) against ONNX Runtime, and training-mode
BatchNormalization (batch_normalization_training) against ONNX's reference evaluator (ONNX
Runtime's inference build has no training mode), on fresh random inputs."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import npurun
from conftest import nonzero_normal
from npurun.frontend.onnx import import_model
from npurun.ir import parse, print_graph, verify


def _model(op, inputs: dict, attrs, n_out, opset=22):
    node = helper.make_node(op, list(inputs), [f"y{i}" for i in range(n_out)], name=f"the_{op.lower()}", **attrs)
    g = helper.make_graph(
        [node], f"case_{op}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _run(model, feeds):
    g = import_model(model)
    out = npurun.Executor("reference", parallelism=1).run_sync(g, feeds)
    again = verify(parse(print_graph(g)))  # the new ops and attributes round-trip as text
    again.source = g.source
    assert again == g
    return [out[n] for n in g.outputs], g


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 9, 8), {"kernel_shape": [3, 3]}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 10, 7), {"kernel_shape": [2, 3], "strides": [2, 1], "storage_order": 1}),
    ((1, 3, 11, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1]}),
    ((2, 2, 8, 9), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 10, 10), {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ((2, 3, 15), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 2, 2], "storage_order": 1, "pads": [0, 1, 1, 1, 0, 1]}),
])
def test_max_pool_indices_match_onnxruntime(rng, shape, attrs):
    x = nonzero_normal(rng, shape)
    model = _model("MaxPool", {"x": x}, attrs, 2)
    (y, idx), g = _run(model, {"x": x})
    assert [n.op for n in g.nodes] == ["max_pool_with_indices"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, want[0])
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, want[1])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_indices_of_integers_with_ties(rng, dtype):
    """Few distinct values: windows hold ties; the first maximum in scan order is the one."""
    x = rng.integers(0, 4, (2, 2, 7, 7)).astype(dtype)
    model = _model("MaxPool", {"x": x}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 2)
    (y, idx), _ = _run(model, {"x": x})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, want[0])
    np.testing.assert_array_equal(idx, want[1])
    np.testing.assert_array_equal(x.reshape(-1)[idx], y)  # each index points at its maximum


def test_storage_order_without_indices_is_plain_max_pool(rng):
    x = nonzero_normal(rng, (1, 2, 6, 6))
    model = _model("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "storage_order": 1}, 1)
    (y,), g = _run(model, {"x": x})
    assert [n.op for n in g.nodes] == ["max_pool"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, want[0])


@pytest.mark.parametrize("shape,attrs,n_out", [
    ((4, 3, 5, 6), {"training_mode": 1}, 3),
    ((3, 5, 7), {"training_mode": 1, "epsilon": 1e-2, "momentum": 0.7}, 3),
    ((6, 2), {"training_mode": 1, "momentum": 0.5}, 3),
    ((2, 4, 3, 3, 2), {"training_mode": 1}, 1),
])
def test_batch_normalization_training_mode(rng, shape, attrs, n_out):
    c = shape[1]
    feeds = {"x": nonzero_normal(rng, shape) * 2 + 1, "s": nonzero_normal(rng, (c,)), "b": nonzero_normal(rng, (c,)),
             "mean": nonzero_normal(rng, (c,)), "var": np.abs(nonzero_normal(rng, (c,))) + 0.5}
    model = _model("BatchNormalization", feeds, attrs, n_out, opset=15)
    got, g = _run(model, feeds)
    assert g.nodes[0].op == "batch_normalization_training"
    want = ReferenceEvaluator(model).run(None, feeds)
    for o, w in zip(got, want):
        assert o.dtype == w.dtype and o.shape == w.shape
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5)


def test_batch_normalization_running_stats_need_training_mode():
    c = 3
    feeds = {k: np.ones(s, np.float32) for k, s in
             (("x", (2, c, 4)), ("s", (c,)), ("b", (c,)), ("mean", (c,)), ("var", (c,)))}
    with pytest.raises(npurun.NpurunError, match="training_mode=1"):
        import_model(_model("BatchNormalization", feeds, {}, 3, opset=15))
