"""wire.py, the ONNX reader that takes weights straight from the file: the same arrays as
onnx's own reader, on every element type it takes and every tensor it leaves to onnx."""
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from npurun.errors import ModelError
from npurun.frontend.onnx import import_model, load_onnx, wire
from npurun.frontend.onnx.importer import _read

PLAIN = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16, np.int32,
         np.uint32, np.int64, np.uint64, np.bool_, ml_dtypes.bfloat16]


def _random(rng, dtype, shape):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def _model(inits, nodes=(), opset=21):
    outs = [helper.make_tensor_value_info(f"o{k}", TensorProto.UNDEFINED, None) for k in range(len(inits))]
    nodes = list(nodes) or [helper.make_node("Identity", [t.name], [f"o{k}"]) for k, t in enumerate(inits)]
    g = helper.make_graph(nodes, "m", [], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_every_plain_type_reads_as_onnx_reads_it(tmp_path, rng):
    inits = [numpy_helper.from_array(_random(rng, dt, (3, 5 + k)), f"w{k}") for k, dt in enumerate(PLAIN)]
    inits.append(numpy_helper.from_array(np.array(2.5, np.float32), "scalar"))
    inits.append(numpy_helper.from_array(np.zeros((0, 4), np.float32), "empty"))
    p = tmp_path / "m.onnx"
    onnx.save(_model(inits), p)
    model, arrays = wire.read(p)
    assert sorted(arrays) == list(range(len(inits)))  # every one read from the file
    assert all(not t.HasField("raw_data") for t in model.graph.initializer)
    for k, t in enumerate(inits):
        want = numpy_helper.to_array(t)
        got = arrays[k].array()
        assert got.dtype == want.dtype and got.shape == want.shape and got.flags.aligned
        assert got.dtype.isbuiltin == want.dtype.isbuiltin  # (a "<f4" made by newbyteorder is not builtin: torch refused it)
        assert got.tobytes() == want.tobytes(), t.name
    # the rest of the model is untouched
    full = load_onnx(p)
    assert model.graph.node == full.graph.node and model.opset_import == full.opset_import
    assert [t.name for t in model.graph.initializer] == [t.name for t in full.graph.initializer]


def test_tensors_it_does_not_take_stay_with_onnx(tmp_path, rng):
    """Typed fields (float_data), strings, 4-bit weights: left in the message, converted by
    numpy_helper as before; the plain ones around them still come from the file."""
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [4], rng.standard_normal(4).tolist())
    strings = numpy_helper.from_array(np.array(["a", "bc"], dtype=object), "s")
    q4 = helper.make_tensor("q4", TensorProto.INT4, [5], [1, -2, 3, -4, 7])
    plain = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "plain")
    inits = [typed, strings, q4, plain]
    p = tmp_path / "m.onnx"
    onnx.save(_model(inits), p)
    model, arrays = wire.read(p)
    assert sorted(arrays) == [3]
    out = npurun.Executor("reference").run_sync(npurun.load(p), {})
    for k, t in enumerate(inits):
        want, got = numpy_helper.to_array(t), out[f"o{k}"]
        assert got.shape == want.shape and got.tolist() == want.tolist(), t.name


def test_graph_equals_the_onnx_parse(tmp_path, rng):
    """A real graph (Conv + MatMul + a Loop region with its own initializer) imports to the same
    NPU-IR whichever reader parsed it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    m2 = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "m2")
    body_c = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bc")
    body = helper.make_graph([helper.make_node("Add", ["v_in", "bc"], ["v_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)], [body_c])
    n_it = numpy_helper.from_array(np.array(3, np.int64), "n")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "m2"], ["mm"]),
             helper.make_node("Loop", ["n", "", "mm"], ["y"], body=body)]
    g = helper.make_graph(nodes, "m", [x], [y], [w, m2, n_it])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    a, b = npurun.load(p), import_model(onnx.load(p))
    assert str(a) == str(b)
    assert sorted(a.values) == sorted(b.values)
    for k, v in a.values.items():
        assert v.same_as(b.values[k]), k
    xv = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(npurun.Executor("reference").run_sync(a, {"x": xv})["y"],
                                  npurun.Executor("reference").run_sync(b, {"x": xv})["y"])


def test_external_data_and_fallbacks(tmp_path, rng):
    """External tensors are onnx's to load; a file wire.py cannot walk goes to onnx's parser."""
    w = rng.standard_normal((3, 300)).astype(np.float32)
    v = rng.standard_normal((3,)).astype(np.float32)
    m = _model([numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    onnx.save(m, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.bin", size_threshold=1000)
    model, arrays = wire.read(tmp_path / "ext.onnx")
    assert sorted(arrays) == [0, 1]  # w from the external file, v embedded
    assert arrays[0].path == str(tmp_path / "ext.bin") and arrays[1].path == str(tmp_path / "ext.onnx")
    assert not model.graph.initializer[0].external_data  # (onnx's loader leaves it alone)
    out = npurun.Executor("reference").run_sync(npurun.load(tmp_path / "ext.onnx"), {})
    np.testing.assert_array_equal(out["o0"], w)
    np.testing.assert_array_equal(out["o1"], v)
    for blob in (b"", b"\x0b" * 8, b"\x3a\xff\xff\xff\xff\x0f"):  # empty, group wire type, runaway length
        (tmp_path / "bad.onnx").write_bytes(blob)
        with pytest.raises(wire.WireError):
            wire.read(tmp_path / "bad.onnx")


def test_external_data_outside_the_folder_is_left_to_onnx(tmp_path, rng):
    """A location that leaves the model's folder is not read here; onnx's loader refuses it."""
    w = rng.standard_normal((3, 300)).astype(np.float32)
    (tmp_path / "outside.bin").write_bytes(w.tobytes())
    (tmp_path / "m").mkdir()
    t = numpy_helper.from_array(np.zeros((3, 300), np.float32), "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../outside.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        t.external_data.add(key=k, value=v)
    onnx.save(_model([t]), tmp_path / "m" / "m.onnx")
    model, arrays = wire.read(tmp_path / "m" / "m.onnx")
    assert arrays == {} and model.graph.initializer[0].external_data
    with pytest.raises(ModelError, match="cannot load external weights"):
        npurun.load(tmp_path / "m" / "m.onnx")


def test_reads_weights_without_a_protobuf_copy(tmp_path, rng):
    """The message wire.py hands protobuf holds none of the weight bytes."""
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    p = tmp_path / "m.onnx"
    onnx.save(_model([numpy_helper.from_array(w, "w")]), p)
    model, arrays = _read(p, weights=True)
    assert model.ByteSize() < 1000 < w.nbytes
    np.testing.assert_array_equal(arrays[0].array(), w)
