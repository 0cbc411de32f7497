"""Executor and InferenceSession: the API, zero-copy inputs, errors on bad inputs."""
import asyncio

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from npurun.errors import BackendError, InputError, NpurunError

from conftest import nonzero_normal
from npurun.frontend.onnx import import_model
from npurun.ir import parse


def _mlp(rng, path=None):
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"], axis=-1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if path:
        import onnx
        onnx.save(m, path)
    return m


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_run_sync_and_async_agree_with_onnxruntime(device, rng):
    m = _mlp(rng)
    g = import_model(m)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exe = npurun.Executor(device, parallelism=2, workspace_mb=64)
    np.testing.assert_allclose(exe.run_sync(g, {"x": x})["p"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(exe.run_sync(g, x)["p"], want, rtol=1e-5, atol=1e-6)  # one input: bare array

    async def many():
        return await asyncio.gather(*[exe.run(g, {"x": x}) for _ in range(8)])
    for out in asyncio.run(many()):
        np.testing.assert_allclose(out["p"], want, rtol=1e-5, atol=1e-6)


def test_contiguous_input_is_not_copied(rng):
    g = parse("op reshape (x: [2, 6] f32, s: [2] i64 -> y: [3, 4] f32)")
    g.values["s"].data = np.array([3, 4], np.int64)
    g.inputs = ["x"]
    x = rng.standard_normal((2, 6)).astype(np.float32)
    y = npurun.Executor("cpu").run_sync(g, {"x": x})["y"]
    assert np.shares_memory(x, y)  # the kernel saw the caller's buffer itself
    xt = np.asfortranarray(rng.standard_normal((2, 6)).astype(np.float32))
    y2 = npurun.Executor("cpu").run_sync(g, {"x": xt})["y"]
    assert not np.shares_memory(xt, y2)
    np.testing.assert_array_equal(y2, np.ascontiguousarray(xt).reshape(3, 4))


@pytest.mark.parametrize("feeds, words", [
    ({"nope": np.ones((2, 8), np.float32)}, "unknown input name(s) 'nope'; the model's inputs are 'x'"),
    ({}, "missing input(s) 'x'"),
    ({"x": np.ones((2, 7), np.float32)}, "input 'x' has shape [2, 7], expected [N, 8]"),
    ({"x": np.ones((2, 8), np.float64)}, "input 'x' has dtype float64, expected float32 (f32)"),
    ({"x": np.ones((8,), np.float32)}, "input 'x' has shape [8], expected [N, 8]"),
])
def test_bad_inputs_are_clear_errors(tmp_path, rng, feeds, words):
    path = tmp_path / "mlp.onnx"
    _mlp(rng, path)
    g = npurun.load(path)
    with pytest.raises(InputError) as e:
        npurun.Executor("cpu").run_sync(g, feeds)
    assert words in str(e.value) and str(path) in str(e.value)


def test_kernel_failure_names_the_node_and_executor_survives(rng):
    g = parse("op reshape @shaper (x: [?] f32, s: [2] i64 -> y: [?, ?] f32)")
    g.values["s"].data = np.array([3, 5], np.int64)
    g.inputs = ["x"]
    exe = npurun.Executor("cpu")
    with pytest.raises(NpurunError, match=r"node 'shaper' \(reshape\) failed on inputs \(float32\[7\]"):
        exe.run_sync(g, {"x": rng.standard_normal(7).astype(np.float32)})
    assert exe.run_sync(g, {"x": rng.standard_normal(15).astype(np.float32)})["y"].shape == (3, 5)


def test_unknown_device_and_bad_settings():
    with pytest.raises(BackendError, match="unknown device 'tpu'.*reference, cpu"):
        npurun.Executor("tpu")
    with pytest.raises(BackendError, match="takes no target"):
        npurun.Executor("cpu:7")
    with pytest.raises(NpurunError, match="parallelism"):
        npurun.Executor("cpu", parallelism=0)
    with pytest.raises(NpurunError, match="workspace_mb"):
        npurun.Executor("cpu", workspace_mb=-1)


def test_inference_session_is_shaped_like_onnxruntime(tmp_path, rng):
    path = tmp_path / "mlp.onnx"
    _mlp(rng, path)
    ours = npurun.InferenceSession(str(path), device="cpu")
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for a, b in zip(ours.get_inputs(), theirs.get_inputs()):
        assert (a.name, a.shape, a.type) == (b.name, b.shape, b.type)
    assert [o.name for o in ours.get_outputs()] == [o.name for o in theirs.get_outputs()]
    x = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.run(["p"], {"x": x})[0], theirs.run(["p"], {"x": x})[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="unknown output name"):
        ours.run(["nope"], {"x": x})


def test_npuir_file_runs_like_the_onnx_it_came_from(tmp_path, rng):
    path = tmp_path / "mlp.onnx"
    _mlp(rng, path)
    npurun.save(npurun.load(path), tmp_path / "mlp.npuir")
    x = rng.standard_normal((4, 8)).astype(np.float32)
    a = npurun.InferenceSession(path).run(None, {"x": x})[0]
    b = npurun.InferenceSession(tmp_path / "mlp.npuir").run(None, {"x": x})[0]
    np.testing.assert_array_equal(a, b)


def test_a_scalar_input_may_come_as_one_element_of_any_rank(rng):
    """ONNX Runtime's leniency: [1] or [1, 1] for a declared scalar runs as that scalar; a
    scalar for a declared [1] and two elements for a scalar stay InputErrors."""
    import npurun
    from npurun.errors import InputError
    g = npurun.parse("""input s: [] f32
input v: [3] f32
op mul (v: [3] f32, s: [] f32 -> y: [3] f32)
output y: [3] f32
""")
    v = nonzero_normal(rng, (3,))
    exe = npurun.Executor("cpu")
    for given in (np.array([2.5], np.float32), np.array([[2.5]], np.float32)):
        np.testing.assert_array_equal(exe.run_sync(g, {"s": given, "v": v})["y"], v * np.float32(2.5))
    with pytest.raises(InputError, match="'s' has shape \\[2\\]"):
        exe.run_sync(g, {"s": np.ones(2, np.float32), "v": v})
    g1 = npurun.parse("""input s: [1] f32
op neg (s: [1] f32 -> y: [1] f32)
output y: [1] f32
""")
    with pytest.raises(InputError, match="'s' has shape \\[\\]"):
        exe.run_sync(g1, {"s": np.array(2.0, np.float32)})
