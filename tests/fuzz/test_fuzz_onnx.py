"""Fuzz target: ONNX bytes -> import -> run. Seeds are real and corpus models (fuzz_seeds.py);
half the cases mutate their bytes (mutate.py), half edit the parsed protobuf where the
importer must judge a value (dims, element types, attributes, names, opsets, raw data,
nodes removed or repeated), then serialize. A case that imports runs on random inputs on the
cpu or reference backend. Pass: outputs, or an NpurunError (fuzzkit.Stats.case)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_seeds
import fuzzkit
from mutate import INTERESTING_INTS, mutated

I64 = (-(2**63), 2**63 - 1)
ELEM_TYPES = list(range(0, 27))  # every TensorProto.DataType code and a few past the last


def _clamp(v: int) -> int:
    return max(I64[0], min(I64[1], v))


# Edits on the parsed model: (what, index, value); indices are taken modulo the list's length.
_PROTO_EDIT = st.one_of(
    st.tuples(st.just("init_dim"), st.integers(0, 999), st.sampled_from(INTERESTING_INTS)),
    st.tuples(st.just("init_type"), st.integers(0, 999), st.sampled_from(ELEM_TYPES)),
    st.tuples(st.just("init_raw"), st.integers(0, 999), st.integers(0, 64)),
    st.tuples(st.just("input_dim"), st.integers(0, 999), st.sampled_from(INTERESTING_INTS + [None])),
    st.tuples(st.just("input_type"), st.integers(0, 999), st.sampled_from(ELEM_TYPES)),
    st.tuples(st.just("attr_int"), st.integers(0, 999), st.sampled_from(INTERESTING_INTS)),
    st.tuples(st.just("attr_ints"), st.integers(0, 999), st.lists(st.sampled_from(INTERESTING_INTS), max_size=6)),
    st.tuples(st.just("attr_float"), st.integers(0, 999), st.sampled_from([0.0, -1.0, 1e38, -1e38, float("nan"),
                                                                          float("inf"), 1e-45])),
    st.tuples(st.just("op_type"), st.integers(0, 999), st.sampled_from(
        ["Conv", "Loop", "If", "Reshape", "Expand", "Gather", "Tile", "Resize", "Pad", "Slice", "Range",
         "ConstantOfShape", "Einsum", "TopK", "NonZero", "Unknown", "Scan", "Split", "Concat", "Cast"])),
    st.tuples(st.just("node_input"), st.integers(0, 999), st.sampled_from(["", "x", "nope", "y"])),
    st.tuples(st.just("drop_node"), st.integers(0, 999), st.just(0)),
    st.tuples(st.just("dup_node"), st.integers(0, 999), st.just(0)),
    st.tuples(st.just("opset"), st.integers(0, 999), st.sampled_from([0, 1, 6, 9, 11, 13, 17, 21, 23, 99, -1])),
)


def _pick(seq, i):
    return seq[i % len(seq)] if len(seq) else None


def edit_proto(m: onnx.ModelProto, edits) -> bytes:
    g = m.graph
    for what, i, v in edits:
        if what == "init_dim" and (t := _pick(g.initializer, i)) is not None and t.dims:
            t.dims[i % len(t.dims)] = _clamp(v)
        elif what == "init_type" and (t := _pick(g.initializer, i)) is not None:
            t.data_type = v
        elif what == "init_raw" and (t := _pick(g.initializer, i)) is not None and t.raw_data:
            t.raw_data = t.raw_data[:v]
        elif what == "input_dim" and (x := _pick(g.input, i)) is not None:
            dims = x.type.tensor_type.shape.dim
            if dims:
                d = dims[i % len(dims)]
                if v is None:
                    d.dim_param = "batch size"
                else:
                    d.dim_value = _clamp(v)
        elif what == "input_type" and (x := _pick(g.input, i)) is not None:
            x.type.tensor_type.elem_type = v
        elif what in ("attr_int", "attr_ints", "attr_float"):
            n = _pick([n for n in g.node if n.attribute], i)
            if n is not None:
                a = n.attribute[i % len(n.attribute)]
                if what == "attr_int":
                    a.ClearField("ints")
                    a.type, a.i = onnx.AttributeProto.INT, _clamp(v)
                elif what == "attr_ints":
                    del a.ints[:]
                    a.type = onnx.AttributeProto.INTS
                    a.ints.extend(_clamp(x) for x in v)
                else:
                    a.type, a.f = onnx.AttributeProto.FLOAT, v
        elif what == "op_type" and (n := _pick(g.node, i)) is not None:
            n.op_type = v
        elif what == "node_input" and (n := _pick(g.node, i)) is not None and n.input:
            n.input[i % len(n.input)] = v
        elif what == "drop_node" and len(g.node):
            del g.node[i % len(g.node)]
        elif what == "dup_node" and len(g.node):
            g.node.append(g.node[i % len(g.node)])
        elif what == "opset" and len(m.opset_import):
            m.opset_import[i % len(m.opset_import)].version = v
    return m.SerializeToString()


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    import npurun
    from npurun.frontend.onnx import import_model
    seeds = fuzz_seeds.onnx_seeds()
    exes = {d: npurun.Executor(d, parallelism=1) for d in ("cpu", "reference")}
    tmp = Path(tempfile.mkdtemp(prefix="npurun-fuzz-onnx-"))
    path = tmp / "model.onnx"

    def one(data: bytes, device: str, seed: int):
        path.write_bytes(data)
        g = import_model(path)
        stats.notes["imported"] += 1
        return fuzzkit.run_graph(exes[device], g, np.random.default_rng(seed), stats)

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(st.one_of(mutated(seeds).map(lambda t: t[1]),
                     st.tuples(st.integers(0, len(seeds) - 1), st.lists(_PROTO_EDIT, min_size=1, max_size=4))
                     .map(lambda t: edit_proto(onnx.load_from_string(seeds[t[0]]), t[1]))),
           st.sampled_from(sorted(exes)), st.integers(0, 2**32 - 1))
    def case(data, device, seed):
        stats.case(one, data, device, seed)

    case()


@pytest.mark.fuzz
def test_fuzz_onnx_import_and_run():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_onnx"))


LOOP_TIMEOUT = """
import time, numpy as np, onnx, npurun
from onnx import TensorProto, helper
from npurun.errors import NpurunError
vi = helper.make_tensor_value_info
body = helper.make_graph([helper.make_node("Add", ["a", "one"], ["a2"]), helper.make_node("Identity", ["c"], ["c2"])],
    "body", [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []), vi("a", TensorProto.FLOAT, [1])],
    [vi("c2", TensorProto.BOOL, []), vi("a2", TensorProto.FLOAT, [1])],
    [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
g = helper.make_graph([helper.make_node("Loop", ["M", "", "a"], ["y"], body=body)], "g",
    [vi("M", TensorProto.INT64, []), vi("a", TensorProto.FLOAT, [1])], [vi("y", TensorProto.FLOAT, [1])])
m = npurun.load_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
from npurun.frontend.onnx import import_model
graph = import_model(m)
t = time.perf_counter()
try:
    npurun.Executor("DEVICE").run_sync(graph, {"M": np.array(10**12), "a": np.zeros(1, np.float32)}, timeout=0.5)
except NpurunError as e:
    print("ended", type(e).__name__, round(time.perf_counter() - t, 2))
"""


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_loop_honours_the_run_timeout(device):
    """A Loop whose trip count is a model input (10^12) under a 0.5 s timeout ends with
    TaskTimeout within a few seconds (it ran on: a client could hold the device for ever); the
    body's steps check the run's stop (base.Program.call, the scheduler's boundary)."""
    import subprocess
    import sys
    try:
        p = subprocess.run([sys.executable, "-c", LOOP_TIMEOUT.replace("DEVICE", device)],
                           capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        pytest.fail("the run went on past 5 s under a 0.5 s timeout")
    assert "ended TaskTimeout" in p.stdout, p.stdout + p.stderr


# ---------------------------------------------------------------- what the fuzzer found (fixed)

def _one_node(node, inputs, outputs, inits=(), opset=17):
    g = onnx.helper.make_graph([node], "g", inputs, outputs, list(inits))
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, t=onnx.TensorProto.FLOAT):
    return onnx.helper.make_tensor_value_info(name, t, shape)


def _found_cases():
    from onnx import helper, numpy_helper
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    conv = lambda **a: _one_node(helper.make_node("Conv", ["x", "w"], ["y"], **a),  # noqa: E731
                                 [_vi("x", [1, 1, 5, 5])], [_vi("y", None)], [w])
    int_pads = conv()
    int_pads.graph.node[0].attribute.append(helper.make_attribute("pads", 1))  # an INT, not INTS
    bad_name = conv()
    bad_name.graph.node[0].name = "conv"
    raw = bad_name.SerializeToString().replace(b"conv", b"\x80onv")
    untyped = conv()
    untyped.graph.initializer[0].data_type = 0
    return [
        ("pads given as one INT", int_pads, "attribute 'pads' is INT, ONNX declares INTS"),
        ("node name not UTF-8", onnx.load_from_string(raw), "is not valid UTF-8"),
        ("initializer of element type 0", untyped, "element type 0 is not an ONNX tensor type"),
        ("attribute Conv does not have", conv(alpha=1.0), "attribute 'alpha' is not one of Conv-17's"),
        ("pads of the wrong length", conv(pads=[1, 1]), "pads [1, 1] must be 4 integers"),
        ("stride 0", conv(strides=[0, 1]), "must be >= 1"),
        ("kernel rank unlike the input's", conv(kernel_shape=[3]), "kernel_shape [3] has 1 dims"),
        ("ConvTranspose without its weight",
         _one_node(helper.make_node("ConvTranspose", ["x", ""], ["y"]), [_vi("x", [1, 1, 4, 4])], [_vi("y", None)]),
         "has 1 inputs, conv_transpose takes 2 to 3"),
        ("Einsum without its equation",
         _one_node(helper.make_node("Einsum", ["x"], ["y"]), [_vi("x", [2, 2])], [_vi("y", None)]),
         "missing required attribute(s) 'equation'"),
        ("Pad-2 without pads",
         _one_node(helper.make_node("Pad", ["x"], ["y"]), [_vi("x", [2, 2])], [_vi("y", None)], opset=2),
         "missing required attribute(s) 'pads'"),
        ("Reshape to a shape 2^30 long (a tuple of 2^30 dims was built)",
         _one_node(helper.make_node("Reshape", ["x", "s"], ["y"]), [_vi("x", [2]), _vi("s", [2**30], onnx.TensorProto.INT64)],
                   [_vi("y", None)]), "result would have rank 1073741824; at most 64"),
        ("Split of a scalar",
         _one_node(helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2), [_vi("x", [])],
                   [_vi("a", None), _vi("b", None)], opset=18), "cannot split a scalar"),
        ("a tensor attribute whose data does not fill its dims (found by the atheris target)",
         _one_node(helper.make_node("Constant", [], ["y"], value=_bad_tensor()),
                   [], [_vi("y", None)]), "attribute 'value' holds a tensor that cannot be read"),
        ("a dimension name that is not UTF-8 (found by the 100,000-case atheris run)",
         _one_node(helper.make_node("Relu", ["x"], ["y"]), [_bad_dim_param()], [_vi("y", None)]),
         "input 'x': dimension name b'\\xc3' is not valid UTF-8"),
    ]


def _bad_dim_param():
    """Input x: [N] whose dim_param is the lone byte 0xC3 (not UTF-8): serialized by hand,
    since protobuf refuses to set such a string."""
    vi = _vi("x", ["N"])
    raw = vi.SerializeToString().replace(b"\x12\x01N", b"\x12\x01\xc3")
    out = onnx.ValueInfoProto()
    out.ParseFromString(raw)
    return out


def _bad_tensor():
    """A float tensor of dims [1] holding three values (make_tensor would refuse to build it)."""
    t = onnx.TensorProto(name="v", data_type=onnx.TensorProto.FLOAT, dims=[1])
    t.float_data.extend([1.0, 2.0, 3.0])
    return t


@pytest.mark.parametrize("what, model, words", _found_cases(), ids=[c[0] for c in _found_cases()])
def test_malformed_nodes_are_model_errors(tmp_path, what, model, words):
    from npurun.errors import ModelError
    from npurun.frontend.onnx import import_model
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError) as e:
        import_model(path)
    assert words in str(e.value) and str(path) in str(e.value), str(e.value)


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_a_scan_over_nothing_is_an_error_naming_its_node(tmp_path, device, rng):
    """Found by `make fuzz` (10,000 cases): a Scan whose scan input is 0 long has no scan
    outputs to stack; the run ended in KeyError for the missing output. It is an NpurunError
    naming the node and the outputs it could not give (ONNX Runtime refuses such a model at
    load)."""
    from onnx import helper

    import npurun
    from conftest import nonzero_normal
    from npurun.errors import NpurunError
    vi = lambda nm, shape: helper.make_tensor_value_info(nm, onnx.TensorProto.FLOAT, shape)  # noqa: E731
    body = helper.make_graph([helper.make_node("Add", ["s", "x"], ["s2"]), helper.make_node("Identity", ["s2"], ["o"])],
                             "body", [vi("s", [2]), vi("x", [2])], [vi("s2", [2]), vi("o", [2])])
    scan = helper.make_node("Scan", ["init", "xs"], ["final", "ys"], body=body, num_scan_inputs=1, name="sc")
    m = helper.make_model(helper.make_graph([scan], "g", [vi("init", [2]), vi("xs", ["n", 2])],
                                            [vi("final", [2]), vi("ys", ["n", 2])]),
                          opset_imports=[helper.make_opsetid("", 16)])
    onnx.save(m, tmp_path / "m.onnx")
    g = npurun.load(tmp_path / "m.onnx")
    exe = npurun.Executor(device, parallelism=1)
    init = nonzero_normal(rng, (2,))
    out = exe.run_sync(g, {"init": init, "xs": nonzero_normal(rng, (3, 2))})  # (the model is fine)
    assert out["ys"].shape == (3, 2)
    with pytest.raises(NpurunError, match=r"node 'sc' \(scan\) gave 1 of its 2 outputs \(ys missing\)"):
        exe.run_sync(g, {"init": init, "xs": np.zeros((0, 2), np.float32)})


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_an_output_larger_than_memory_is_refused_before_the_run(tmp_path, device, rng):
    """Found by `make fuzz` (10,000 cases): an AveragePool padded by 2^31 - 1 on one side has
    an output of 2^31 columns (hundreds of GiB); its kernel first asked for 16 GiB of window
    indices. A value whose known shape needs more than the process can have is an InputError
    naming the node, before anything runs."""
    from onnx import helper

    import npurun
    from conftest import nonzero_normal
    from npurun.errors import InputError
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 28, 28])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    pool = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[0, 0, 0, 2**31 - 1], name="ap")
    onnx.save(helper.make_model(helper.make_graph([pool], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m.onnx")
    with pytest.raises(InputError, match=r"node 'ap' \(average_pool\): its output 'y' \(f32\[1, 3, 26, 2147483673\]\) "
                                         r"would take 624\.0 GiB; this process can have at most"):
        npurun.Executor(device, parallelism=1).run_sync(npurun.load(tmp_path / "m.onnx"),
                                                        {"x": nonzero_normal(rng, (1, 3, 28, 28))})


@pytest.mark.parametrize("device", ["cpu", "reference"])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceSum", "ReduceL2"])
def test_an_empty_reduction_larger_than_memory_is_refused(tmp_path, device, op):
    """Found by `make fuzz`: a (2^31 - 1, 0, 4) input reduced over axis 1 with keepdims is
    32 GiB of identities, its axes a run-time input (no shape to check ahead). The reduction
    checks it before NumPy allocates: an InputError naming the node. Small ones still run."""
    from onnx import helper

    import npurun
    from npurun.errors import InputError
    vi = lambda nm, t, shape: helper.make_tensor_value_info(nm, t, shape)  # noqa: E731
    g = helper.make_graph([helper.make_node(op, ["x", "axes"], ["y"], keepdims=1, name="r")], "g",
                          [vi("x", onnx.TensorProto.FLOAT, ["a", 0, 4]), vi("axes", onnx.TensorProto.INT64, [1])],
                          [vi("y", onnx.TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    model, exe = npurun.load(tmp_path / "m.onnx"), npurun.Executor(device, parallelism=1)
    assert exe.run_sync(model, {"x": np.zeros((5, 0, 4), np.float32), "axes": np.array([1])})["y"].shape == (5, 1, 4)
    with pytest.raises(InputError, match=r"node 'r' \(reduce_\w+\): the reduction of an empty \[2147483647, 0, 4\] "
                                         r"over axes \[1\] would take 32\.0 GiB"):
        exe.run_sync(model, {"x": np.zeros((2**31 - 1, 0, 4), np.float32), "axes": np.array([1])})


def test_a_padded_conv_input_larger_than_memory_is_refused():
    """Found by `make test`'s fuzz run: an empty (2^31 - 1, 1, 0, 2) input of a padded 5x5 conv
    has an empty output, but the reference kernel pads its input whole first (192 GiB there;
    12 TiB here, with 64 channels: more than any machine has). Said before the allocation (an
    InputError naming the padded input), not a MemoryError."""
    from npurun.backends.reference.kernels import KERNELS
    from npurun.errors import InputError
    x, w = np.zeros((2**31 - 1, 64, 0, 2), np.float32), np.ones((64, 64, 5, 5), np.float32)
    attrs = {"strides": None, "pads": [2, 2, 2, 2], "dilations": None, "group": 1, "kernel_shape": None,
             "auto_pad": "NOTSET"}
    with pytest.raises(InputError, match=r"the conv's padded input \[2147483647, 64, 4, 6\] would take 12288\.0 GiB"):
        KERNELS["conv"](x, w, None, **attrs)
    assert KERNELS["conv"](np.ones((2, 64, 0, 2), np.float32), w, None, **attrs).shape == (2, 64, 0, 2)
