"""The storage-only element types (8/4-bit floats, 4/2-bit integers) and strings: their ONNX
mapping, and their round trip through .npuir text (inline) and the weights file (raw bytes)."""
import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from npurun.errors import ParseError
from npurun.frontend.onnx import import_model
from npurun.frontend.onnx.dtypes import TO_ONNX, ir_dtype
from npurun.ir.dtypes import DTYPES, from_numpy, to_numpy
from npurun.ir.graph import Graph, Node, Value
from npurun.ir.io import load_npuir, save
from npurun.ir.text import parse, print_graph

NEW = ["f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz", "f8e8m0", "f4e2m1", "i4", "u4", "i2", "u2"]


def _random(rng, dtype, shape):
    """Random values of every encoding of a small type (NaNs included), or random words."""
    if dtype == "str":
        words = ["", "a", "héllo wörld", '"quoted"\\', "tab\there", "日本語"]
        return np.array([words[i] for i in rng.integers(0, len(words), int(np.prod(shape)))],
                        dtype=object).reshape(shape)
    dt = to_numpy(dtype)
    if dtype in ("i4", "u4", "i2", "u2"):
        info = ml_dtypes.iinfo(dt)
        return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dt)
    bits = rng.integers(0, 256 if dtype != "f4e2m1" else 16, shape).astype(np.uint8)
    return bits.view(dt)


def _same(a, b):
    """Equal bit for bit (NaN encodings included), or equal strings."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == object:
        assert a.tolist() == b.tolist()
    else:
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("dtype", NEW + ["str"])
def test_onnx_mapping_and_numpy_types(dtype):
    assert dtype in DTYPES
    assert ir_dtype(TO_ONNX[dtype], "x") == dtype
    assert helper.tensor_dtype_to_np_dtype(TO_ONNX[dtype]) == to_numpy(dtype)
    assert from_numpy(to_numpy(dtype)) == dtype
    assert from_numpy(np.array(["a"]).dtype) == "str"


def _graph(rng, dtype, n):
    g = Graph(name="g")
    g.add_value(Value("x", (n,), dtype))
    g.const("c", _random(rng, dtype, (n,)))
    g.add_value(Value("y", (n,), dtype))
    op = "string_concat" if dtype == "str" else "identity"
    g.nodes = [Node(op, ["x", "c"] if dtype == "str" else ["c"], ["y"])]
    g.inputs, g.outputs = ["x"], ["y"]
    return g


@pytest.mark.parametrize("dtype", NEW + ["str"])
@pytest.mark.parametrize("n", [5, 40])  # inline literal / weights file
def test_round_trip_through_text_and_weights(tmp_path, rng, dtype, n):
    g = _graph(rng, dtype, n)
    npurun.verify(g)
    path = save(g, tmp_path / "m.npuir")
    assert (tmp_path / "m.weights.npz").exists() == (n > 16)
    g2 = load_npuir(path)
    a, b = g2.values["c"].data, g.values["c"].data
    if n > 16 or dtype in ("str", "i4", "u4", "i2", "u2"):
        _same(a, b)  # the weights file keeps the raw bytes
    else:  # inline text keeps every value; NaN is written as nan, whatever its encoding
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))
    assert print_graph(g2) == print_graph(g)
    if n > 16:
        text = path.read_text()
        assert f"const c: [{n}] {dtype} DRAM0\n" in text


@pytest.mark.parametrize("dtype", ["f8e4m3fn", "i4", "str"])
def test_inline_values_are_exact(rng, dtype):
    g = _graph(rng, dtype, 6)
    text = print_graph(g)
    g2 = parse(text)
    if dtype == "str":
        _same(g2.values["c"].data, g.values["c"].data)
    else:  # NaN encodings may differ inline; values agree
        a, b = g2.values["c"].data.astype(np.float32), g.values["c"].data.astype(np.float32)
        np.testing.assert_array_equal(a, b)


def test_bad_inline_values_name_the_constant():
    with pytest.raises(ParseError, match="'c'.*str"):
        parse('const c: [2] str DRAM0 = [1, 2]\n')
    with pytest.raises(ParseError, match="weights file holds"):
        parse('graph g weights="w.npz"\nconst c: [20] str DRAM0\n', weights={"c": np.zeros(20, np.int64)})


@pytest.mark.parametrize("elem,dt,vals", [
    (TensorProto.INT4, ml_dtypes.int4, [-8, 7, 3, -1, 0]),
    (TensorProto.UINT2, ml_dtypes.uint2, [0, 1, 2, 3, 3]),
    (TensorProto.FLOAT4E2M1, ml_dtypes.float4_e2m1fn, [0.5, -6.0, 1.5, 0.0, 3.0]),
    (TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2, [1.0, -57344.0, 0.25, 3.0, 0.0]),
])
def test_packed_initializers_import(elem, dt, vals):
    """Sub-byte initializers are packed in ONNX; they arrive one value per element."""
    arr = np.array(vals, np.float32).astype(dt)
    init = numpy_helper.from_array(arr, "c")
    node = helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT)
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])], [init])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    graph = import_model(model)
    out, = npurun.Executor("reference").run_sync(graph, {}).values()
    np.testing.assert_array_equal(out, np.array(vals, np.float32))


def test_string_inputs_accept_str_arrays():
    node = helper.make_node("StringConcat", ["a", "b"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.STRING, [2]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    graph = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]))
    out = npurun.Executor("reference").run_sync(graph, {"a": np.array(["x", "y"]), "b": np.array([b"1", b"2"], object)})
    assert out["y"].dtype == object and out["y"].tolist() == ["x1", "y2"]
