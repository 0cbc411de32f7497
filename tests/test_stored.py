"""Weights that stay in their model file (ir/stored.py): a cpu program that runs a weight only
through its packed copy lets the float32 array go, and anyone asking for it later reads it
again. Results are checked against the reference backend on fresh random inputs."""
import gc
import os
import weakref
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from npurun.backends.cpu import native
from npurun.backends.cpu.ops import fused
from npurun.errors import ModelError
from npurun.ir import stored as stored_mod
from npurun.ir.stored import Stored

from conftest import nonzero_normal

pytestmark = pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")

K, N = 512, 1024  # 2 MB: RELEASE_MIN


def _save(tmp_path, nodes, inits, outputs=("y",), name="m.onnx"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, K])
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    g = helper.make_graph(nodes, "m", [x], outs, inits)
    p = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), p)
    return p


def _weights(rng, n=1):
    return [nonzero_normal(rng, (K, N)) * 0.05 for _ in range(n)]


def _run(g, rng, threads=1):
    """(the cpu program, a check against the reference to call later: the reference reads
    every weight, so a released one is read again)."""
    x = nonzero_normal(rng, (5, K))
    exe = npurun.Executor("cpu", parallelism=threads)
    got, again = exe.run_sync(g, {"x": x}), exe.run_sync(g, {"x": x})

    def check():
        want = npurun.Executor("reference").run_sync(g, {"x": x})
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)
            np.testing.assert_array_equal(got[k], again[k])
    return exe.compile(g), check


def _check(g, rng, threads=1):
    prog, check = _run(g, rng, threads)
    check()
    return prog


@pytest.mark.parametrize("threads", [1, 2])
def test_a_packed_weight_is_let_go_and_read_again_on_demand(tmp_path, rng, threads):
    w, = _weights(rng)
    b = nonzero_normal(rng, (N,))
    p = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    g = npurun.load(p)
    s = g.values["w"].stored
    assert isinstance(s, Stored) and s.resident
    held = weakref.ref(s.array())
    prog, check = _run(g, rng, threads)
    assert prog._released == 1 and not s.resident
    gc.collect()
    assert held() is None  # nothing holds the float32 array any more
    check()
    np.testing.assert_array_equal(g.values["w"].data, w)  # asked for: read again, the same bytes
    assert s.resident
    # a second program (another executor) packs from the array read again, and lets it go too
    prog2, check = _run(g, rng, threads)
    assert prog2 is not prog and prog2._released == 1 and not s.resident
    check()


def test_kept_where_something_else_reads_it(tmp_path, rng):
    """A weight that a MatMul also reads as its first operand, one that is a graph output
    (under another name), and a small one keep their arrays (each is still right)."""
    w1, w2 = _weights(rng, 2)
    small = nonzero_normal(rng, (K, 8))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["y"]),
             helper.make_node("Transpose", ["y"], ["yt"]),
             helper.make_node("MatMul", ["w1", "yt"], ["z"]),
             helper.make_node("MatMul", ["x", "w2"], ["u"]),
             helper.make_node("Identity", ["w2"], ["w2_out"]),
             helper.make_node("MatMul", ["x", "small"], ["s"])]
    p = _save(tmp_path, nodes, [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (small, "small"))],
              outputs=("y", "z", "u", "w2_out", "s"))
    g = npurun.load(p)
    prog = _check(g, rng)
    assert prog._released == 0
    assert all(g.values[n].stored.resident for n in ("w1", "w2", "small"))


@pytest.mark.parametrize("rows", [5, "n"])
def test_a_smaller_weight_is_let_go_where_its_products_are_known_to_be_large(tmp_path, rng, rows):
    """Under RELEASE_MIN a weight goes too when every product reads it with a known row count
    too large for NumPy's dot (5 x 512 x 512: 2.6 MFLOP), so nothing reads its array again
    (ELECTRA-small's 1 MB matrices); with the rows unknown it stays."""
    w = nonzero_normal(rng, (K, K // 2)) * 0.05  # 0.5 MB
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m", [x], [y], [numpy_helper.from_array(w, "w")])
    p = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), p)
    g = npurun.load(p)
    prog, check = _run(g, rng)
    assert prog._released == (1 if rows == 5 else 0)
    assert g.values["w"].stored.resident == (rows != 5)
    check()


def test_one_weight_under_two_names_is_packed_once(tmp_path, rng):
    """Identity of a weight (ALBERT's shared layers) imports as the same Stored: one packed
    copy for both MatMuls, and the array let go."""
    w, = _weights(rng)
    nodes = [helper.make_node("Identity", ["w"], ["w_again"]),
             helper.make_node("MatMul", ["x", "w"], ["t"]),
             helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("MatMul", ["x", "w_again"], ["t3"]),
             helper.make_node("Add", ["r", "t3"], ["y"])]
    p = _save(tmp_path, nodes, [numpy_helper.from_array(w, "w")])
    g = npurun.load(p)
    stored = {id(v.stored) for v in g.values.values() if isinstance(v.stored, Stored)}
    assert len(stored) == 1  # w and its alias share one Stored
    prog = _check(g, rng)
    assert len(prog._packs) == 1 and prog._released == 2


def test_a_file_replaced_reads_as_loaded_one_changed_in_place_is_refused(tmp_path, rng):
    """A model file of HOLD_OPEN_MIN bytes or more is held open: replaced or deleted under its
    name, its weights still read as loaded. Changed in place, it is refused (the program runs on:
    its packs are all it needs)."""
    w, = _weights(rng)
    p = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")])
    assert p.stat().st_size >= stored_mod.HOLD_OPEN_MIN
    g = npurun.load(p)
    exe = npurun.Executor("cpu")
    x = nonzero_normal(rng, (5, K))
    y0 = exe.run_sync(g, {"x": x})["y"]
    assert not g.values["w"].stored.resident
    _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w * 2, "w")],
          name="other.onnx")
    os.replace(tmp_path / "other.onnx", p)  # a new version saved atomically under the same name
    np.testing.assert_array_equal(g.values["w"].data, w)  # the loaded bytes
    g.values["w"].stored.release()
    g2 = npurun.load(p)  # the new file, for a file changed in place
    exe2 = npurun.Executor("cpu")
    exe2.run_sync(g2, {"x": x})
    with open(p, "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x00" * 8)
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    with pytest.raises(ModelError, match="m.onnx: the file changed since the model was loaded"):
        g2.values["w"].data
    np.testing.assert_allclose(exe2.run_sync(g2, {"x": x})["y"], 2 * y0, rtol=1e-4, atol=1e-4)


def test_the_kernel_falls_back_on_the_weight_read_again(tmp_path, rng):
    """What the packed sgemm does not take (here a float64 operand) runs the fallback on the
    weight, read from the file."""
    w, = _weights(rng)
    p = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")])
    s = npurun.load(p).values["w"].stored
    seen = []

    def fallback(a, b, *adds):
        seen.append(b)
        return a @ b
    kernel, standin = fused.packed_linear_kernel(npurun.Executor("cpu").compile(npurun.load(p)), fallback, {}, s)
    assert not s.resident and standin.shape == (K, N) and standin.strides == (0, 0)
    a = nonzero_normal(rng, (3, K))
    np.testing.assert_allclose(kernel(a, standin), a @ w, rtol=1e-4, atol=1e-4)
    assert not seen
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(kernel(a64, standin), a64 @ w, rtol=1e-6)
    np.testing.assert_array_equal(seen[0], w)


def test_copies_share_the_stored(tmp_path, rng):
    w, = _weights(rng)
    p = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")])
    g = npurun.load(p)
    v = g.values["w"]
    assert g.copy().values["w"].stored is v.stored
    assert replace(v, space="NPU_SRAM").stored is v.stored
    gone = replace(v, data=None)
    assert not gone.is_const and v.is_const


def test_weights_the_passes_replaced_are_let_go(tmp_path, rng):
    """A BatchNorm folded into its conv gives the conv new weights: the original ones (and the
    BatchNorm's) are not held beside them once the program is compiled; asked for, they are
    read again, and a file gone by then is a clear error."""
    w = nonzero_normal(rng, (32, 16, 3, 3))
    bn = [nonzero_normal(rng, (32,)) for _ in range(3)] + [np.abs(nonzero_normal(rng, (32,))) + 0.5]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for a, n in zip([w] + bn, ["w", "s", "b", "m", "v"])]
    p = tmp_path / "bn.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "m", [x], [y], inits),
                                opset_imports=[helper.make_opsetid("", 17)], ir_version=8), p)
    g = npurun.load(p)
    xv = nonzero_normal(rng, (1, 16, 12, 12))
    got = npurun.Executor("cpu").run_sync(g, {"x": xv})["y"]
    assert not g.values["w"].stored.resident and not g.values["s"].stored.resident
    want = npurun.Executor("reference").run_sync(g, {"x": xv})["y"]
    # (this 3x3 conv may run Winograd, AVX2-only CPUs: its test's bound, 3e-5 of the largest)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=3e-5 * float(np.abs(want).max()))
    np.testing.assert_array_equal(g.values["w"].data, w)  # read again by the reference run
    g.values["w"].stored.release()
    p.unlink()
    with pytest.raises(ModelError, match="bn.onnx: cannot read the model's weights again"):
        g.values["w"].data


@pytest.mark.parametrize("kind", ["folded", "int8"])
def test_a_weight_the_passes_made_comes_back_from_its_panels(tmp_path, rng, kind):
    """A weight no file holds (a scale folded into a MatMul's weight by a pass; int8 weights
    dequantized at import) lives in its packed panels alone, and reads back from them exactly:
    float32 panels, or int8 panels times their column scales."""
    from npurun.passes.pipeline import prepare
    w, = _weights(rng)
    if kind == "folded":
        s = np.abs(nonzero_normal(rng, (N,))) + 0.5
        nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Mul", ["t", "s"], ["y"])]
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(s.astype(np.float32), "s")]
    else:
        q = rng.integers(-127, 128, size=(K, N), dtype=np.int8)
        q[0] = 127  # (each column's scale is then max |w| / 127, as int8_columns finds it)
        scale = (np.abs(nonzero_normal(rng, (N,))) * 0.01).astype(np.float32)
        nodes = [helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["wd"], axis=1),
                 helper.make_node("MatMul", ["x", "wd"], ["y"])]
        inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "scale"),
                 numpy_helper.from_array(np.zeros(N, np.int8), "zp")]
    g = npurun.load(_save(tmp_path, nodes, inits))
    exe = npurun.Executor("cpu")
    prog, check = _run(g, rng)
    made = [v for v in prog.graph.values.values()
            if isinstance(v.stored, Stored) and isinstance(v.stored.source, fused.PackedSource)]
    assert len(made) == 1 and not made[0].stored.resident and prog._released == 1
    if kind == "int8":
        assert prog._packs[(made[0].stored, 0, 1.0)]["bq"] is not None  # packed as int8 panels
    again = prepare(g, exe.device, None)  # the same passes: the weight made afresh
    want = again.values[next(n for n in again.nodes if n.op in ("matmul", "matmul_add", "gemm")).inputs[1]].data
    got = made[0].data
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    check()


def test_a_weight_folded_into_a_new_one_is_let_go_by_the_pass(tmp_path, rng):
    """fold_affine makes a new weight of a MatMul's weight times the per-column Mul after it;
    the original, read by nothing else, is let go right then (not only when the compile ends:
    both were resident at once, ConvNeXt-T's compile peak), and the folded weight is the
    float64 product rounded once, block by block as whole."""
    from npurun.passes.pipeline import prepare
    w, = _weights(rng)
    s = nonzero_normal(rng, (N,))
    p = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Mul", ["t", "s"], ["y"])],
              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(s, "s")])
    g = npurun.load(p)
    folded = prepare(g, "cpu")
    assert not g.values["w"].stored.resident
    (mm,) = [n for n in folded.nodes if n.op in ("matmul", "matmul_add")]
    np.testing.assert_array_equal(folded.values[mm.inputs[1]].data,
                                  (w.astype(np.float64) * s.astype(np.float64)).astype(np.float32))
    _check(g, rng)
