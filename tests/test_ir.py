"""NPU-IR: the text round trip, the founding document's op form, the verifier, dims."""
import numpy as np
import pytest

import npurun
from npurun.errors import ParseError, VerifyError
from npurun.ir import Graph, Node, Value, parse, print_graph, save, verify
from npurun.ir.io import load_npuir
from npurun.ir.shapes import affine, bind, dim_add, dim_mul

FOUNDING = ("op matmul_f16 (input: [1024, 2048] f16 DRAM0, weight: [2048, 4096] f16 NPU_SRAM, "
            "output: [1024, 4096] f16 NPU_SRAM) pipeline=3 burst=256")


def test_founding_op_form_parses_as_one_op_graph():
    g = parse(FOUNDING)
    assert len(g.nodes) == 1
    n = g.nodes[0]
    assert (n.op, n.precision, n.inputs, n.outputs) == ("matmul", "f16", ["input", "weight"], ["output"])
    assert n.hints == {"pipeline": 3, "burst": 256} and n.attrs == {}
    assert g.inputs == ["input", "weight"] and g.outputs == ["output"]
    w = g.values["weight"]
    assert (w.shape, w.dtype, w.space) == ((2048, 4096), "f16", "NPU_SRAM")
    assert g.values["input"].space == "DRAM0"
    verify(g)
    text = print_graph(g)
    assert parse(text) == g and print_graph(parse(text)) == text


def test_founding_form_over_several_lines_as_in_the_document():
    text = """op matmul_f16 (
        input : [1024, 2048] f16 DRAM0,
        weight : [2048, 4096] f16 NPU_SRAM,
        output : [1024, 4096] f16 NPU_SRAM
    ) pipeline=3 burst=256"""
    assert parse(text) == parse(FOUNDING)


def _random_graph(rng):
    g = Graph(name="g")
    g.add_value(Value("x", (1, 3, "H", "W"), "f32"))
    g.inputs = ["x"]
    g.const("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32), space="NPU_SRAM")
    g.const("b", rng.standard_normal(4).astype(np.float16))
    g.const("scale", np.array([1.5, -0.25], np.float32))
    g.const("odd/name:1", np.arange(20, dtype=np.int64))
    import ml_dtypes
    g.const("bf", rng.standard_normal(40).astype(ml_dtypes.bfloat16))
    g.add_value(Value("y", (1, 4, "H", "W"), "f32", "NPU_CACHE"))
    g.add_value(Value("z", (1, 4, "H", "W"), "f32"))
    g.nodes = [Node("conv", ["x", "w", ""], ["y"], {"pads": [1, 1, 1, 1]}, {"pipeline": 2}, name="/conv/Conv 1"),
               Node("leaky_relu", ["y"], ["z"], {"alpha": 0.1 + 0.2}, precision="f16")]
    g.outputs = ["z"]
    return g


def test_round_trip_with_weights_file(tmp_path, rng):
    g = _random_graph(rng)
    verify(g)
    path = save(g, tmp_path / "m.npuir")
    assert (tmp_path / "m.weights.npz").exists()
    g2 = load_npuir(path)
    g2.source = g.source
    assert g2 == g
    assert print_graph(g2) == print_graph(g)
    assert g2.values["bf"].data.dtype == g.values["bf"].data.dtype
    assert g2.nodes[1].attrs["alpha"] == 0.1 + 0.2  # floats print exactly
    assert '"/conv/Conv 1"' in path.read_text() and '"odd/name:1"' in path.read_text()


def test_graph_equality_sees_weight_changes(rng):
    g = _random_graph(rng)
    text = print_graph(g)
    weights = {v.name: v.data for v in g.constants()}
    assert parse(text, weights=weights) == g
    weights["w"] = weights["w"].copy()
    weights["w"][0, 0, 0, 0] += 1
    assert parse(text, weights=weights) != g


def test_symbolic_dims_and_affine_forms():
    assert affine("H", mul=3) == "3*H"
    assert affine("3*H", add=-1) == "3*H-1"
    assert affine("H", add=2, div=2) == "?"
    assert affine(10, add=-2, div=2) == 4
    assert dim_add("H", "2*H") == "3*H" and dim_mul(4, "W") == "4*W"
    env = {}
    assert bind((1, "H", "3*H"), (1, 5, 15), env) and env == {"H": 5}
    assert not bind((1, "H", "H"), (1, 5, 6), {})


@pytest.mark.parametrize("text, line, col, words", [
    ("op matmul (a: [2, 3] f32, b: [3, 4] f32 -> c: [2, 4] f32) bogus=1", 1, 59, "no attribute 'bogus'"),
    ("op nosuchop (a: [2] f32 -> b: [2] f32)", 1, 4, "unknown op 'nosuchop'"),
    ("npuir 1\nop relu (a: [2, x+] f32 -> b: [2] f32)", 2, 17, "bad dimension"),
    ("op relu (a: [2] f33 -> b: [2] f32)", 1, 17, "unknown dtype 'f33'"),
    ("op relu (a: [2] f32 -> b: [2] f32)\nop relu (a: [3] f32 -> c: [3] f32)", 2, 10, "has type [2] f32 DRAM0"),
    ("op relu (a -> b: [2] f32)", 1, 10, "needs a type"),
    ("\n\n  op relu (a: [2] f32 -> b: [2] f32", 3, 11, "'(' is never closed"),
    ("op relu (a: [2] f32 -> b: [2] f32) ]", 1, 36, "unexpected ']' at end of statement"),
    ("const c: [3] i64 = [1, 2]", 1, 20, "has 2 values"),
    ("npuir 7", 1, 7, "unsupported npuir version"),
    ("graph g weights=\"w.npz\"\nconst c: [30] f32", 2, 7, "missing from w.npz"),
    ("op relu (a: [2] f32 -> b: [2] f32) $", 1, 36, "unexpected character"),
    ("hello", 1, 1, "expected a statement"),
])
def test_parse_errors_name_line_and_column(text, line, col, words):
    with pytest.raises(ParseError) as e:
        parse(text, file="bad.npuir")
    assert (e.value.line, e.value.col) == (line, col), str(e.value)
    assert words in str(e.value)
    assert str(e.value).startswith(f"bad.npuir:{line}:{col}: ")


@pytest.mark.parametrize("text, words", [
    ("op relu (a: [2] f32, a2: [2] f32 -> b: [2] f32)", "has 2 inputs, relu takes 1"),
    ("op conv @c1 (x: [1, 3, 8, 8] f32, w: [4, 2, 3, 3] f32 -> y: [1, 4, 6, 6] f32)", "input has 3 channels"),
    ("op conv @c1 (x: [1, 3, 8, 8] f32, w: [4, 3, 3, 3] f32 -> y: [1, 4, 7, 6] f32)",
     "output 'y' declared [1, 4, 7, 6], the op computes [1, 4, 6, 6]"),
    ("op relu (a: [2] f32 -> b: [2] f32 WEIRD_SPACE)", "unknown memory space 'WEIRD_SPACE'"),
    ("op matmul @mm (a: [2, 3] f32, b: [4, 5] f32 -> c: [2, 5] f32)", "inner dimensions differ"),
    ("input a: [2] f32\nop relu @r (q: [2] f32 -> b: [2] f32)", "operand 0 'q' is used before it is produced"),
    ("op relu (a: [2] f32 -> b: [2] i32)", "declared i32, the op computes f32"),
    ("op depth_to_space @d (x: [1, 8, 2, 2] f32 -> y: [1, 2, 4, 4] f32)", "missing required attribute 'blocksize'"),
])
def test_verifier_names_node_and_operand(text, words):
    g = parse(text, file="v.npuir")
    with pytest.raises(VerifyError) as e:
        verify(g)
    assert words in str(e.value)
    assert str(e.value).startswith("v.npuir: ")


def test_verifier_names_the_pass_that_broke_the_graph():
    g = parse("op relu (a: [2] f32 -> b: [2] f32)")
    g.nodes.append(Node("relu", ["missing"], ["c"]))
    g.add_value(Value("missing", (2,), "f32"))
    g.add_value(Value("c", (2,), "f32"))
    with pytest.raises(VerifyError, match="after fold_constants: node relu: operand 0 'missing'"):
        verify(g, where="fold_constants")


def test_every_op_has_inference_and_a_reference_kernel():
    from npurun.backends.reference.kernels import KERNELS
    from npurun.ir.ops import OPS
    assert set(OPS) == set(KERNELS)
    assert all(d.infer is not None for d in OPS.values())


def test_public_api():
    assert issubclass(npurun.errors.ParseError, npurun.NpurunError)
    assert callable(npurun.load) and callable(npurun.Executor) and callable(npurun.InferenceSession)


REGION_TEXT = """input c: [] bool DRAM0
input x: [2] f32 DRAM0
op if @check (c: [] bool DRAM0 -> y: [2] f32 DRAM0) then_branch={
  graph check.then_branch
  op relu (x: [2] f32 DRAM0 -> a: [2] f32 DRAM0)
  output a: [2] f32 DRAM0
} else_branch={
  graph check.else_branch
  op neg (x: [2] f32 DRAM0 -> b: [2] f32 DRAM0)
  output b: [2] f32 DRAM0
}
output y: [2] f32 DRAM0
"""


def test_regions_parse_print_and_run(rng):
    g = parse(REGION_TEXT)
    verify(g)
    assert set(g.nodes[0].regions) == {"then_branch", "else_branch"}
    assert g.nodes[0].regions["then_branch"].captures() == ["x"]
    assert parse(print_graph(g)) == g
    x = rng.standard_normal(2).astype(np.float32)
    exe = npurun.Executor("reference")
    np.testing.assert_array_equal(exe.run_sync(g, {"c": np.array(True), "x": x})["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(exe.run_sync(g, {"c": np.array(False), "x": x})["y"], -x)


def test_region_reading_an_undefined_value_is_refused():
    g = parse(REGION_TEXT.replace("op relu (x:", "op relu (ghost:"))
    with pytest.raises(VerifyError, match="in node 'check' \\(if\\) then_branch: node relu: operand 0 'ghost'"):
        verify(g)
