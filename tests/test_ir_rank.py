"""Values of unknown rank (shape None, `[*]` in text): inference, verification, the text round
trip, and running such graphs against ONNX's reference evaluator."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import npurun
from conftest import nonzero_normal
from npurun.errors import ParseError, VerifyError
from npurun.frontend.onnx import import_model
from npurun.ir import parse, print_graph, verify
from npurun.ir.graph import Graph, Node, Value
from npurun.ir.ops import infer_node
from npurun.ir.shapes import bind, format_shape, merge_shapes, numel

UNRANKED = """npuir 1
graph g
input x: [*] f32 DRAM0
input y: [2, 3] f32 DRAM0
const perm: [3] i64 DRAM0 = [2, 0, 1]
op add (x: [*] f32 DRAM0, y: [2, 3] f32 DRAM0 -> s: [*] f32 DRAM0)
op shape (s: [*] f32 DRAM0 -> n: [?] i64 DRAM0)
op transpose (s: [*] f32 DRAM0 -> t: [?, ?, ?] f32 DRAM0) perm=[2, 0, 1]
output t: [?, ?, ?] f32 DRAM0
output n: [?] i64 DRAM0
"""


def test_shape_helpers():
    assert format_shape(None) == "[*]"
    assert numel(None) is None
    assert bind(None, (4, 5, 6), {})
    assert merge_shapes((2, 3), (2, 4)) == (2, "?")
    assert merge_shapes((2, 3), (2, 3, 1)) is None
    assert merge_shapes(None, (2,)) is None


def test_text_round_trip_and_verify():
    g = verify(parse(UNRANKED))
    assert g.values["x"].shape is None and g.values["s"].shape is None
    assert g.values["t"].shape == ("?", "?", "?")
    text = print_graph(g)
    assert "x: [*] f32 DRAM0" in text
    g2 = verify(parse(text))
    assert g2 == g and print_graph(g2) == text


def test_an_unranked_constant_is_refused():
    with pytest.raises(ParseError, match="static shape"):
        parse("npuir 1\ngraph g\nconst c: [*] f32 DRAM0 = [1.0]\n")


def test_declared_ranks_never_conflict_with_an_unknown_one():
    # declared [2, 3] where the op computes an unknown rank, and the reverse
    g = verify(parse("""npuir 1
graph g
input x: [*] f32 DRAM0
input y: [2, 3] f32 DRAM0
op add (x: [*] f32 DRAM0, y: [2, 3] f32 DRAM0 -> s: [2, 3] f32 DRAM0)
op relu (y: [2, 3] f32 DRAM0 -> r: [*] f32 DRAM0)
"""))
    assert g.values["s"].shape == (2, 3) and g.values["r"].shape is None


def test_an_op_that_needs_the_rank_names_the_operand():
    text = """npuir 1
graph g
input x: [*] f32 DRAM0
op softmax @sm (x: [*] f32 DRAM0 -> y: [*] f32 DRAM0) axis=1
"""
    with pytest.raises(VerifyError, match="'sm'.*operand 0 'x' has unknown rank; softmax needs to know it"):
        verify(parse(text))


def _infer(op, ins, **attrs):
    values = {v.name: v for v in ins if v is not None}
    node = Node(op, [v.name if v is not None else "" for v in ins], ["out"], attrs)
    return [r[0] for r in infer_node(node, values)]


def test_inference_of_shape_ops_with_unknown_ranks():
    unranked = Value("u", None, "f32")
    dims = Value("d", ("?", 3, "?"), "f32")
    assert _infer("squeeze", [dims]) == [None]  # a '?' dim may be 1
    assert _infer("squeeze", [Value("e", (1, "B", 3), "f32")]) == [("B", 3)]  # a symbol is taken > 1
    assert _infer("squeeze", [dims, Value("ax", (1,), "i64")]) == [("?", "?")]  # computed axes, counted
    assert _infer("unsqueeze", [unranked, Value("ax", (2,), "i64", data=np.array([0, 1]))]) == [None]
    assert _infer("reshape", [unranked, Value("s", (2,), "i64", data=np.array([0, 6]))]) == [("?", 6)]
    assert _infer("reshape", [dims, Value("s", ("?",), "i64")]) == [None]  # the count of dims unknown
    assert _infer("transpose", [unranked], perm=[1, 0]) == [("?", "?")]
    assert _infer("transpose", [unranked]) == [None]
    assert _infer("concat", [unranked, Value("c", (2, 5), "f32")], axis=1) == [(2, "?")]
    assert _infer("concat", [unranked, unranked], axis=0) == [None]
    assert _infer("split", [unranked], axis=1) == [None]
    assert _infer("shape", [unranked]) == [("?",)]
    assert _infer("size", [unranked]) == [()]
    assert _infer("constant_of_shape", [Value("s", ("?",), "i64")]) == [None]
    assert _infer("expand", [dims, Value("s", (4,), "i64")]) == [("?",) * 4]
    assert _infer("matmul", [unranked, Value("w", (3, 4), "f32")]) == [None]
    assert _infer("add", [unranked, Value("b", (3,), "f32")]) == [None]
    assert _infer("cast", [unranked], to="f16") == [None]


@pytest.fixture
def unranked_if(monkeypatch):
    """If outputs of unknown rank where the branches' ranks differ (control.UNRANKED_IF)."""
    from npurun.ir.ops import control
    monkeypatch.setattr(control, "UNRANKED_IF", True)


def test_if_with_branches_of_different_ranks(unranked_if):
    then = Graph("then_branch", outputs=["a"])
    then.add_value(Value("a", (2, 3), "f32"))
    other = Graph("else_branch", outputs=["b"])
    other.add_value(Value("b", (6,), "f32"))
    node = Node("if", ["c"], ["out"], regions={"then_branch": then, "else_branch": other})
    assert infer_node(node, {"c": Value("c", (), "bool")})[0][0] is None
    other.values["b"].shape = (2, 4)
    assert infer_node(node, {"c": Value("c", (), "bool")})[0][0] == (2, "?")


def _if_model():
    """If(c) gives a (2, 3) tensor or a (6,) one; a Shape and an Add then read it."""
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Reshape", ["x", "flat"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["r"], then_branch=then, else_branch=other),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Mul", ["r", "r"], ["m"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_empty_tensor_value_info("s"), helper.make_empty_tensor_value_info("m")],
                          [numpy_helper.from_array(np.array([6], np.int64), "flat")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_if_with_branches_of_different_ranks_by_default():
    """The passes take shape None: an If whose branches differ in rank has unknown rank."""
    then = Graph("then_branch", outputs=["a"])
    then.add_value(Value("a", (2, 3), "f32"))
    other = Graph("else_branch", outputs=["b"])
    other.add_value(Value("b", (6,), "f32"))
    node = Node("if", ["c"], ["out"], regions={"then_branch": then, "else_branch": other})
    assert infer_node(node, {"c": Value("c", (), "bool")})[0][0] is None


@pytest.mark.parametrize("cond", [True, False])
def test_running_a_graph_with_an_unranked_value(rng, cond, unranked_if):
    model = _if_model()
    g = import_model(model)
    assert g.values["r"].shape is None and g.values["m"].shape is None
    assert g.values["s"].shape == ("?",)
    feeds = {"c": np.array(cond), "x": nonzero_normal(rng, (2, 3))}
    got = npurun.Executor("reference", parallelism=1).run_sync(g, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for name, w in zip(g.outputs, want):
        np.testing.assert_array_equal(got[name], w)
    # and the imported graph round-trips through the text format
    again = verify(parse(print_graph(g), weights={v.name: v.data for v in g.constants()}))
    again.source = g.source
    assert again == g


def test_a_subgraph_input_without_a_shape_has_unknown_rank():
    body = helper.make_graph([helper.make_node("Identity", ["v"], ["v_out"]),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)])
    from npurun.frontend.onnx.importer import _value_type
    assert _value_type(body.input[2], "<m>", {}, top=False) == (None, "f32", "tensor")
