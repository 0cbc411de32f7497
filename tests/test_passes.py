"""Compiler passes (npurun/passes/): text in, text out for every pass; the verifier between
passes names a pass that breaks the graph; every pass and the standard pipeline leave the
outputs of ESPCN and real models unchanged on fresh random inputs (the reference backend is
the oracle)."""
import functools
import importlib
from pathlib import Path

import numpy as np
import pytest

import npurun
from npurun.backends import get_backend
from npurun.errors import PassError
from npurun.ir import parse, print_graph, verify
from npurun.ir.dtypes import to_numpy
from npurun.ir.graph import Node
from npurun.passes.pipeline import PIPELINES, pass_name, pipeline_for, run_pipeline, standard_pipeline

from conftest import nonzero_normal

CASES = Path(__file__).parent / "passes"
PASSES = ["eliminate_dead_code", "simplify_shapes", "remove_noops", "fold_batchnorm", "fuse_ops",
          "layout_block4x4", "layout_nchwc", "fold_affine", "fuse_hard_swish", "fuse_swish", "fuse_gelu",
          "fuse_activation", "fuse_masked_softmax", "fuse_matmul_add", "sink_gather", "fuse_affine_chain",
          "fuse_pad", "push_transposes", "fuse_layer_norm", "batch_shared_weights", "fuse_attention",
          "inline_constant_if", "fuse_rotary", "lift_over_views", "fuse_add_activation", "fuse_channel_affine"]
ESPCN = Path(npurun.__file__).parent / "zoo" / "espcn_x3.onnx"


def _pass(name):
    return getattr(importlib.import_module(f"npurun.passes.{name}"), name)


def _run(g, feeds):
    return get_backend("reference", 1).compile(g).run(feeds)


def _feeds(g, rng, sizes=None):
    """Fresh non-zero inputs; symbolic dims take `sizes` (or small defaults)."""
    sizes = {"H": 5, "W": 7, "batch": 3, **(sizes or {})}
    out = {}
    for nm in g.inputs:
        v = g.values[nm]
        shape = tuple(d if isinstance(d, int) else sizes[d] for d in v.shape)
        dt = to_numpy(v.dtype)
        # integers are small and non-negative: indices (a gather's ids) stay in range
        out[nm] = rng.integers(0, 3, shape).astype(dt) if dt.kind in "iu" else nonzero_normal(rng, shape, dt)
    return out


def _assert_same(want, got, rtol):
    assert want.keys() == got.keys()
    for k in want:
        a, b = np.asarray(want[k], np.float64), np.asarray(got[k], np.float64)
        assert a.shape == b.shape, k
        scale = max(float(np.abs(a).max()), 1e-30)
        assert float(np.abs(a - b).max()) <= rtol * scale, (k, float(np.abs(a - b).max()) / scale)


@pytest.mark.parametrize("name", PASSES)
def test_pass_text_in_text_out(name, rng):
    before = (CASES / f"{name}.before.npuir").read_text()
    after = (CASES / f"{name}.after.npuir").read_text()
    g = verify(parse(before))
    want = _run(g, feeds := _feeds(g, rng))
    g2 = _pass(name)(g)
    assert print_graph(g2) == after
    verify(g2)
    _assert_same(want, _run(g2, feeds), 1e-6)  # and it computes what the original did


def test_cases_really_change_something():
    """Each case exercises its pass (so the text test cannot pass by doing nothing)."""
    for name in PASSES:
        assert (CASES / f"{name}.before.npuir").read_text() != (CASES / f"{name}.after.npuir").read_text()


def test_noop_between_memory_spaces_stays():
    g = parse("""npuir 1
graph g
input x: [2] f32 DRAM0
op identity (x: [2] f32 DRAM0 -> y: [2] f32 NPU_SRAM)
op neg (y: [2] f32 NPU_SRAM -> z: [2] f32 DRAM0)
""")
    assert [n.op for n in _pass("remove_noops")(g).nodes] == ["identity", "neg"]


def test_reshape_with_unknown_target_is_left_alone():
    g = parse("""npuir 1
graph g
input x: [?, 4] f32 DRAM0
input t: [2] i64 DRAM0
op reshape (x: [?, 4] f32 DRAM0, t: [2] i64 DRAM0 -> y: [?, ?] f32 DRAM0)
""")
    text = print_graph(g)
    assert print_graph(_pass("simplify_shapes")(g)) == text


def test_batchnorm_folding_on_random_conv(rng):
    """conv (with and without bias, strided, grouped) -> BN folded: same outputs within 1e-5."""
    for bias, group, stride in [(True, 1, 1), (False, 1, 2), (True, 2, 1)]:
        g = npurun.ir.Graph(name="bn")
        from npurun.ir.graph import Value
        g.add_value(Value("x", (2, 4, 9, 8), "f32"))
        g.inputs = ["x"]
        g.const("w", nonzero_normal(rng, (6, 4 // group, 3, 3)))
        ins = ["x", "w"]
        if bias:
            g.const("b", nonzero_normal(rng, (6,)))
            ins.append("b")
        g.const("scale", nonzero_normal(rng, (6,)))
        g.const("shift", nonzero_normal(rng, (6,)))
        g.const("mean", nonzero_normal(rng, (6,)))
        g.const("var", rng.random(6).astype(np.float32) + 0.1)
        ho = (9 + 2 - 3) // stride + 1
        wo = (8 + 2 - 3) // stride + 1
        g.add_value(Value("u", (2, 6, ho, wo), "f32"))
        g.add_value(Value("y", (2, 6, ho, wo), "f32"))
        g.nodes = [Node("conv", ins, ["u"], {"pads": [1, 1, 1, 1], "strides": [stride, stride], "group": group}),
                   Node("batch_normalization", ["u", "scale", "shift", "mean", "var"], ["y"], {"epsilon": 1e-3})]
        g.outputs = ["y"]
        verify(g)
        feeds = {"x": nonzero_normal(rng, (2, 4, 9, 8))}
        want = _run(g, feeds)
        g2 = verify(_pass("fold_batchnorm")(g))
        assert [n.op for n in g2.nodes] == ["conv"]
        _assert_same(want, _run(g2, feeds), 1e-5)


def test_batchnorm_not_folded_when_conv_result_is_read_elsewhere():
    text = (CASES / "fold_batchnorm.before.npuir").read_text().replace(
        "output y:", "op relu (u: [1, 2, 4, 4] f32 DRAM0 -> r: [1, 2, 4, 4] f32 DRAM0)\noutput r: [1, 2, 4, 4] f32 DRAM0\noutput y:")
    g = _pass("fold_batchnorm")(parse(text))
    assert "batch_normalization" in [n.op for n in g.nodes]


# ------------------------------------------------------------------ the verifier between passes

def _break_graph(g):
    """A deliberately broken pass: the last node reads a value nobody produces."""
    g.nodes[-1].inputs[0] = "no_such_value"
    return g


def test_verifier_names_the_pass_that_broke_the_graph():
    g = parse((CASES / "remove_noops.before.npuir").read_text())
    with pytest.raises(PassError, match=r"pass _break_graph broke the graph: .*no_such_value"):
        run_pipeline(g, [_pass("remove_noops"), _break_graph, _pass("eliminate_dead_code")], verify_each=True)


def test_pass_name_of_a_partial_and_a_non_graph_result():
    assert pass_name(functools.partial(_pass("layout_nchwc"), block=8)) == "layout_nchwc"
    with pytest.raises(PassError, match="pass <lambda> returned int"):
        run_pipeline(parse((CASES / "remove_noops.before.npuir").read_text()), [lambda g: 3])


def test_pipelines_are_plain_lists_of_known_passes():
    assert pipeline_for("cpu:0") == PIPELINES["cpu"] and pipeline_for("npusim") == PIPELINES["default"]
    for passes in PIPELINES.values():
        assert all(callable(p) for p in passes)


# ------------------------------------------------------------------ whole models

def _each_pass_then_pipeline(g_loader, feeds, rtol):
    want = _run(g_loader(), feeds)
    for name in PASSES:
        g = _pass(name)(g_loader())
        verify(g)
        _assert_same(want, _run(g, feeds), rtol)
    g = run_pipeline(g_loader(), pipeline_for("cpu"), verify_each=True)
    _assert_same(want, _run(g, feeds), rtol)
    # (the layouts are another lowering: after the standard passes, instead of the cpu's fusions)
    laid_out = run_pipeline(g_loader(), standard_pipeline() + [_pass("layout_block4x4"), _pass("layout_nchwc")],
                            verify_each=True)
    _assert_same(want, _run(laid_out, feeds), rtol)
    return g, laid_out


def test_every_pass_keeps_espcn_outputs(rng):
    _, g = _each_pass_then_pipeline(lambda: npurun.load(ESPCN), {"input": nonzero_normal(rng, (1, 1, 17, 23))}, 1e-5)
    ops = [n.op for n in g.nodes]
    assert ops.count("layout_pack") == 1 and ops.count("layout_unpack") == 1 and "conv_nchwc" in ops


# name -> does the standard pipeline remove nodes? (minilm: no — its matmuls are 3-D, so no
# gemm, and its shape arithmetic reads `?` dims; docs/passes.md)
MODELS = {"ppocr_det": True, "yolov8n": True, "minilm_int8": False}


@pytest.mark.models
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_every_pass_keeps_real_model_outputs(name, rng):
    from models.fetch import fetch
    from models.inputs import RANDOM_FEEDS
    path = fetch(name)
    g, _ = _each_pass_then_pipeline(lambda: npurun.load(path), RANDOM_FEEDS[name](rng), 1e-4)
    n0 = len(npurun.load(path).nodes)
    assert len(g.nodes) < n0 if MODELS[name] else len(g.nodes) <= n0


def test_a_random_op_is_never_folded_even_of_constants():
    """RandomUniformLike of a constant draws anew on every run, through every pipeline."""
    g = parse("""npuir 1
graph r
input x: [4] f32 DRAM0
const c: [3] f32 DRAM0 = [1.0, 2.0, 3.0]
op random_uniform_like (c: [3] f32 DRAM0 -> r: [3] f32 DRAM0)
op neg (x: [4] f32 DRAM0 -> y: [4] f32 DRAM0)
output r: [3] f32 DRAM0
output y: [4] f32 DRAM0
""")
    for target in PIPELINES:
        assert [n.op for n in run_pipeline(parse(print_graph(g)), pipeline_for(target)).nodes
                if n.op != "neg"] == ["random_uniform_like"], target
    exe = npurun.Executor("cpu")
    x = np.ones(4, np.float32)
    assert not np.array_equal(exe.run_sync(g, {"x": x})["r"], exe.run_sync(g, {"x": x})["r"])


def test_batch_shared_weights_with_symbolic_rows(rng):
    """Products whose rows are a symbolic dim stack when all have the same one (split back into
    equal parts); a product whose input comes from another's output stays apart."""
    from npurun.passes.batch_shared_weights import batch_shared_weights
    g = verify(parse("""npuir 1
graph g
input x0: [batch, 4] f32 DRAM0
input x1: [batch, 4] f32 DRAM0
const w: [4, 4] f32 DRAM0 = [0.5, -0.25, 1.0, 0.75, -1.5, 0.125, 0.5, -0.5, 0.25, 1.25, -0.75, 0.375, 1, 2, 3, 4]
op matmul @m0 (x0: [batch, 4] f32 DRAM0, w: [4, 4] f32 DRAM0 -> y0: [batch, 4] f32 DRAM0)
op matmul @m1 (x1: [batch, 4] f32 DRAM0, w: [4, 4] f32 DRAM0 -> y1: [batch, 4] f32 DRAM0)
op matmul @m2 (y0: [batch, 4] f32 DRAM0, w: [4, 4] f32 DRAM0 -> y2: [batch, 4] f32 DRAM0)
op add @s (y1: [batch, 4] f32 DRAM0, y2: [batch, 4] f32 DRAM0 -> z: [batch, 4] f32 DRAM0)
output z: [batch, 4] f32 DRAM0
"""))
    feeds = _feeds(g, rng)
    want = _run(g, feeds)
    g2 = verify(batch_shared_weights(g))
    ops = [n.op for n in g2.nodes]
    assert ops.count("matmul") == 2 and "concat" in ops and "split" in ops, ops  # m0+m1 stacked, m2 apart
    _assert_same(want, _run(g2, feeds), 1e-6)


def test_kv_cache_in_place_text_and_values(rng):
    """The pass takes options (the generator binds them), so it has its own text test: the
    concatenation becomes cache_append on the buffer, other readers of the past read its
    prefix; run on a buffer of 7 rows holding P = 3, it gives what the original gave on the
    3 rows, and the buffer then holds the new rows after them."""
    from npurun.passes.kv_cache_in_place import kv_cache_in_place
    before = (CASES / "kv_cache_in_place.before.npuir").read_text()
    g = verify(parse(before))
    g2 = kv_cache_in_place(parse(before), pairs=[("past", "present")])
    assert print_graph(g2) == (CASES / "kv_cache_in_place.after.npuir").read_text()
    verify(g2)
    x, past = nonzero_normal(rng, (1, 2, 8)), nonzero_normal(rng, (1, 2, 3, 4))
    want = _run(g, {"x": x, "past": past})
    buf = np.zeros((1, 2, 7, 4), np.float32)
    buf[:, :, :3] = past
    for device in ("reference", "cpu"):
        got = get_backend(device, 1).compile(g2).run({"x": x, "past": buf, "past_length": np.array(3)})
        np.testing.assert_allclose(got["present"], want["present"], rtol=1e-6)
        np.testing.assert_array_equal(got["sp"], want["sp"])
        assert np.shares_memory(got["present"], buf)
        np.testing.assert_array_equal(buf[:, :, :5], want["present"])
        assert not buf[:, :, 5:].any()
    with pytest.raises(npurun.NpurunError, match="is not concat"):
        kv_cache_in_place(parse(before), pairs=[("past", "sp")])


def test_rotary_cpu_kernel_is_bit_identical(rng):
    """rope_half on the cpu backend computes the chain's float32 operations in its order."""
    from npurun.backends.cpu.ops import FACTORIES
    from npurun.backends.reference.kernels import KERNELS
    x, c, s = (nonzero_normal(rng, sh) for sh in ((2, 4, 5, 16), (1, 1, 5, 16), (1, 1, 5, 16)))
    h = 8
    chain = x * c + np.concatenate([-x[..., h:], x[..., :h]], -1) * s
    got = FACTORIES["rope_half"](None)(x, c, s)
    assert np.array_equal(got, chain) and np.array_equal(KERNELS["rope_half"](x, c, s), chain)


def test_conv1d_bias_and_activation_after_a_squeeze_fold_into_the_conv(rng):
    """A Keras Conv1D as tf2onnx writes it (conv -> squeeze -> bias add -> relu): through
    lift_over_views the cpu pipeline leaves one conv with the bias and the ReLU in it, and the
    view after it; the second conv's add varies along merged axes and stays."""
    g = verify(parse((CASES / "lift_over_views.before.npuir").read_text()))
    want = _run(g, feeds := _feeds(g, rng))
    g2 = run_pipeline(g, pipeline_for("cpu"), verify_each=True)
    convs = [n for n in g2.nodes if n.op == "conv"]
    assert sorted(n.attrs.get("activation") or "" for n in convs) == ["", "relu"]
    assert [n.op for n in g2.nodes].count("relu") == 0
    assert [n.op for n in g2.nodes].count("add") == 1  # the one across merged axes
    _assert_same(want, _run(g2, feeds), 1e-6)
