"""onnx2npu on good and bad models: every failure is one clear NpurunError."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from npurun.errors import ModelError, NpurunError
from npurun.frontend.onnx import import_model


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] +
                             [helper.make_opsetid(d, 1) for d in domains], ir_version=8)


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def test_all_unsupported_ops_reported_at_once():
    m = _model([helper.make_node("Relu", ["x"], ["a"]),
                helper.make_node("NoSuchOp", ["a"], ["b"], name="n1"),
                helper.make_node("NoSuchOp", ["b"], ["c"], name="n2"),
                helper.make_node("NoSuchContribOp", ["c"], ["d"], name="ms1", domain="com.microsoft"),
                helper.make_node("TreeEnsemble", ["d"], ["y"], name="hm", domain="ai.onnx.ml")],
               [X], [Y], domains=["com.microsoft", "ai.onnx.ml"])
    with pytest.raises(ModelError) as e:
        import_model(m)
    msg = str(e.value)
    assert "3 unsupported op kind(s)" in msg
    assert "NoSuchOp (domain ai.onnx, opset 17) x2" in msg and "n1, n2" in msg
    assert "NoSuchContribOp (domain com.microsoft, opset 1) x1: no converter (npurun.register_op" in msg and "ms1" in msg
    assert "TreeEnsemble (domain ai.onnx.ml, opset 1) x1" in msg and "[nodes: hm]" in msg


def test_declared_output_shapes_are_hints_not_truth(rng):
    wrong = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])
    m = _model([helper.make_node("Unsqueeze", ["x", "ax"], ["y"])], [X], [wrong],
               [numpy_helper.from_array(np.array([0, 3], np.int64), "ax")])
    g = import_model(m)
    assert g.values["y"].shape == (1, 1, 3, 1)
    out = npurun.Executor("reference").run_sync(g, {"x": rng.standard_normal((1, 3)).astype(np.float32)})
    assert out["y"].shape == (1, 1, 3, 1)


def test_constant_nodes_become_weights(rng):
    c = numpy_helper.from_array(rng.standard_normal((1, 3)).astype(np.float32))
    m = _model([helper.make_node("Constant", [], ["c"], value=c), helper.make_node("Add", ["x", "c"], ["y"])], [X], [Y])
    g = import_model(m)
    assert g.values["c"].is_const
    x = rng.standard_normal((1, 3)).astype(np.float32)
    np.testing.assert_allclose(npurun.Executor("reference").run_sync(g, {"x": x})["y"], x + numpy_helper.to_array(c))


def test_graph_output_that_is_an_input_gets_an_identity(rng):
    m = _model([], [X], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])])
    g = import_model(m)
    x = rng.standard_normal((1, 3)).astype(np.float32)
    (y,) = npurun.Executor("reference").run_sync(g, {"x": x}).values()
    np.testing.assert_array_equal(y, x)


def test_unsorted_nodes_are_ordered(rng):
    m = _model([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])], [X], [Y])
    g = import_model(m)
    assert [n.op for n in g.nodes] == ["neg", "relu"]


def test_cycle_is_reported():
    m = _model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                helper.make_node("Relu", ["a"], ["b"], name="second"),
                helper.make_node("Relu", ["a"], ["y"])], [X], [Y])
    with pytest.raises(ModelError, match="cycle through nodes .*first.*second|cycle through nodes .*second.*first"):
        import_model(m)


def test_dangling_input_is_reported():
    m = _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [X], [Y])
    with pytest.raises(ModelError, match=r"dangling inputs.*'ghost' \(read by adder\)"):
        import_model(m)


def test_truncated_and_corrupt_files(tmp_path, rng):
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [Y],
               [numpy_helper.from_array(rng.standard_normal((3, 64)).astype(np.float32), "w")])
    data = m.SerializeToString()
    for name, blob in (("trunc.onnx", data[: len(data) // 2]), ("junk.onnx", b"\x00\xff" * 50),
                       ("empty.onnx", b""), ("text.onnx", b"hello world, not a model")):
        p = tmp_path / name
        p.write_bytes(blob)
        with pytest.raises(ModelError, match=f"{name}: not a valid ONNX model"):
            npurun.load(p)


def test_tensor_claiming_more_bytes_than_it_has(tmp_path):
    t = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    t.dims[:] = [400, 400]
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [Y], [t])
    p = tmp_path / "liar.onnx"
    onnx.save(m, p)
    with pytest.raises(ModelError, match=r"'w' claims shape \[400, 400\] \(640000 bytes\) but holds 64 bytes"):
        npurun.load(p)


def test_absurd_shape_is_refused_without_allocating(tmp_path):
    t = numpy_helper.from_array(np.ones(4, np.float32), "w")
    t.dims[:] = [1 << 20, 1 << 20]
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [Y], [t])
    p = tmp_path / "huge.onnx"
    onnx.save(m, p)
    with pytest.raises(ModelError, match="refusing to allocate"):
        npurun.load(p)


def test_external_data_loads(tmp_path, rng):
    w = rng.standard_normal((3, 300)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [X], [Y], [numpy_helper.from_array(w, "w")])
    onnx.save(m, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    g = npurun.load(tmp_path / "ext.onnx")
    x = rng.standard_normal((1, 3)).astype(np.float32)
    np.testing.assert_allclose(npurun.Executor("reference").run_sync(g, {"x": x})["y"], x @ w, rtol=1e-5)
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(ModelError, match="external"):
        npurun.load(tmp_path / "ext.onnx")


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(NpurunError, match="no such file"):
        npurun.load(tmp_path / "nope.onnx")
    with pytest.raises(NpurunError, match="is a folder"):
        npurun.load(tmp_path)


def test_shape_error_in_model_names_node():
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], [X], [Y],
               [numpy_helper.from_array(np.ones((4, 2), np.float32), "w")])
    with pytest.raises(ModelError, match=r"node 'proj' \(matmul\): inner dimensions differ"):
        import_model(m)
