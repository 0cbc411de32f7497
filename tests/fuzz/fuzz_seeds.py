"""Seed inputs of the fuzz targets: real files the project reads, to be mutated.

ONNX: the bundled ESPCN (a real trained model), a few hand-made models that reach control
flow, sequences and integer types, and a fixed sample of the ONNX node suite (built in memory
by onnx, ~8 s; kept as files in ~/.cache/npurun/fuzz-corpus so later runs start at once).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("NPURUN_FUZZ_CORPUS") or Path.home() / ".cache/npurun/fuzz-corpus")
NODE_SAMPLE_EVERY = 6  # every 6th node-suite case: ~310 models, every op family


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "seed", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def handmade() -> list[onnx.ModelProto]:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    vi = helper.make_tensor_value_info
    r = np.random.default_rng(0)
    mlp = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                 [vi("x", f32, ["N", 8])], [vi("y", f32, ["N", 4])],
                 [numpy_helper.from_array(r.standard_normal((8, 4)).astype(np.float32), "w")])
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [vi("t", f32, [3])])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [vi("e", f32, [3])])
    if_m = _model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                   helper.make_node("Greater", ["s", "zero"], ["c"]),
                   helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                  [vi("x", f32, [3])], [vi("y", f32, [3])], [numpy_helper.from_array(np.float32(0), "zero")])
    body = helper.make_graph([helper.make_node("Add", ["acc", "one"], ["acc2"]),
                              helper.make_node("Identity", ["cond"], ["cond2"])], "body",
                             [vi("i", i64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                              vi("acc", f32, [2])],
                             [helper.make_tensor_value_info("cond2", TensorProto.BOOL, []), vi("acc2", f32, [2])],
                             [numpy_helper.from_array(np.ones(2, np.float32), "one")])
    loop = _model([helper.make_node("Loop", ["M", "", "a"], ["y"], body=body)],
                  [vi("a", f32, [2])], [vi("y", f32, [2])], [numpy_helper.from_array(np.int64(5), "M")])
    seq = _model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
                  helper.make_node("SequenceAt", ["s", "k"], ["y"])],
                 [vi("x", f32, [4, 2])], [vi("y", f32, [2])], [numpy_helper.from_array(np.int64(1), "k")])
    shape = _model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "t"], ["y"]),
                    helper.make_node("Expand", ["x", "s"], ["z"])],
                   [vi("x", f32, [2, 3])], [vi("y", f32, [3, 2]), vi("z", f32, [2, 3])],
                   [numpy_helper.from_array(np.array([3, 2], np.int64), "t")])
    conv = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
                   helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2])],
                  [vi("x", f32, [1, 3, 9, 9])], [vi("y", f32, [1, 4, 2, 2])],
                  [numpy_helper.from_array(r.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
                   numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "b")])
    ints = _model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Cast", ["s"], ["y"], to=TensorProto.UINT8),
                   helper.make_node("Gather", ["a", "idx"], ["g"], axis=0)],
                  [vi("a", i64, [3]), vi("b", i64, [3])], [vi("y", TensorProto.UINT8, [3]), vi("g", i64, [2])],
                  [numpy_helper.from_array(np.array([0, 2], np.int64), "idx")])
    return [mlp, if_m, loop, seq, shape, conv, ints]


def _node_suite() -> list[bytes]:
    d = CACHE / f"onnx-{onnx.__version__}-every{NODE_SAMPLE_EVERY}"
    files = sorted(d.glob("*.onnx")) if d.is_dir() else []
    if not files:
        import warnings
        from onnx.backend.test.case.node import collect_testcases
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cases = collect_testcases(None)
        tmp = d.with_name(d.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for c in cases[::NODE_SAMPLE_EVERY]:
            (tmp / f"{c.name}.onnx").write_bytes(c.model.SerializeToString())
        try:
            tmp.rename(d)
        except OSError:  # another run made it first
            pass
        files = sorted(d.glob("*.onnx")) if d.is_dir() else sorted(tmp.glob("*.onnx"))
    return [f.read_bytes() for f in files]


def onnx_seeds() -> list[bytes]:
    """Real (ESPCN), hand-made and node-suite models, as serialized bytes."""
    return ([(ROOT / "npurun/zoo/espcn_x3.onnx").read_bytes()]
            + [m.SerializeToString() for m in handmade()] + _node_suite())


NPUIR_SEEDS = ["tests/passes"]  # the pass tests' before/after graphs


def npuir_seeds() -> list[str]:
    """Every .npuir text in the tree (the pass tests' graphs), plus the printed hand-made and
    ESPCN graphs (regions, sequences, inline constants)."""
    import npurun
    from npurun.frontend.onnx import import_model
    texts = [p.read_text() for p in sorted((ROOT / "tests/passes").glob("*.npuir"))]
    for m in handmade():
        texts.append(npurun.print_graph(import_model(m)))
    return texts
