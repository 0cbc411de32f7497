"""Memory planning (npurun.memory) and the band split (passes/split_bands.py).

Every plan made here is proved by the verifier (plan_memory runs it; some tests call it again
after breaking a plan on purpose). Split graphs are compared with the unsplit graph on the
reference backend (the oracle) and on the cpu backend, on fresh random images of several
sizes, odd ones included."""
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import npurun
from npurun import Executor, parse, print_graph, verify
from npurun.backends import get_backend
from npurun.memory import (FAST, SLOW, PlanError, WorkspaceError, live_ranges, memory_report, plan_memory,
                           verify_plan)
from npurun.passes.split_bands import find_chains, split_bands, split_bands_info
from npurun.ir.cost import concrete_values
from tests.conftest import nonzero_normal

ESPCN = Path(npurun.__file__).parent / "zoo" / "espcn_x3.onnx"
MB = 2 ** 20


@pytest.fixture(scope="module")
def espcn():
    return npurun.load(ESPCN)


def run(backend, g, feeds):
    return get_backend(backend).compile(g).run(feeds)


def rel_diff(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# A band of a split conv is a conv of another shape, and the cpu backend measures which kernel
# each shape runs (convtune.py): split and unsplit (and the reference) may differ by the
# rounding of two kernels (Winograd against a direct sum), which test_cpu_winograd bounds at
# 3e-5 of the largest output (a split ESPCN 4K met 1.02e-5 against 1e-5).
KERNEL_REL = 3e-5


def parse_w(text: str, rng=None) -> npurun.Graph:
    """Parse .npuir text, giving every constant without an inline value random weights."""
    rng = rng or np.random.default_rng(0)
    weights = {m[1]: nonzero_normal(rng, tuple(int(d) for d in m[2].split(",")))
               for m in re.finditer(r"^const (\S+): \[([0-9, ]+)\]", text, re.MULTILINE)}
    return parse(text, weights=weights)


def traced_peak(fn) -> int:
    """Bytes `fn` allocates at its peak, over what was allocated before it started."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------ liveness and arenas

CHAIN = """npuir 1
graph chain
input x: [1, 8, 16, 16] f32 DRAM0
const w1: [16, 8, 3, 3] f32 DRAM0
const w2: [8, 16, 1, 1] f32 DRAM0
op conv @c1 (x, w1 -> a: [1, 16, 16, 16] f32 DRAM0) pads=[1, 1, 1, 1]
op relu @r1 (a -> b: [1, 16, 16, 16] f32 DRAM0)
op conv @c2 (b, w2 -> c: [1, 8, 16, 16] f32 DRAM0)
op add @skip (c, x -> d: [1, 8, 16, 16] f32 DRAM0)
op tanh @t (d -> y: [1, 8, 16, 16] f32 DRAM0)
output y
"""


def test_live_ranges_follow_the_schedule():
    r = live_ranges(parse_w(CHAIN))
    assert (r["x"].start, r["x"].end, r["x"].kind) == (-1, 3, "input")  # read last by the skip add
    assert (r["a"].start, r["a"].end) == (0, 1)
    assert (r["d"].start, r["d"].end) == (3, 4)
    assert (r["y"].kind, r["y"].end) == ("output", 4)
    assert r["w1"].kind == "const" and r["a"].bytes == 16 * 16 * 16 * 4


def test_inplace_reuse_and_plan_verified():
    plan = plan_memory(parse_w(CHAIN), workspace_mb=1)
    # relu over a dying conv result, tanh over the dying sum: computed in place
    assert plan.inplace == {"b": "a", "y": "d"} or plan.inplace.get("b") == "a"
    slots = {s.name: s for ss in plan.slots_by_space().values() for s in ss}
    assert slots["a"].offset == slots["b"].offset and slots["a"].space == slots["b"].space
    assert plan.space_of["x"] == SLOW and plan.space_of["y"] == SLOW  # host-visible
    assert plan.space_of["a"] == FAST
    verify_plan(plan)


def test_verifier_names_both_overlapping_values():
    plan = plan_memory(parse_w(CHAIN), workspace_mb=1)
    fast = plan.arenas[FAST]
    a = next(b for b in fast.placed if "a" in b.values)
    c = next(b for b in fast.placed if "c" in b.values)
    c.offset = a.offset  # b (in a's buffer) is live while c is written: a broken plan
    with pytest.raises(PlanError, match=r"'b'.*'c'|'c'.*'b'"):
        verify_plan(plan)


def test_verifier_catches_a_value_outside_its_arena():
    plan = plan_memory(parse_w(CHAIN), workspace_mb=1)
    b = next(b for b in plan.arenas[FAST].placed if "a" in b.values)
    b.offset = MB - 64
    with pytest.raises(PlanError, match="outside"):
        verify_plan(plan)


def _random_graph(rng, n_nodes: int) -> str:
    """A random DAG of elementwise ops, matmuls and reshapes over [4, 64] f32 values."""
    lines = ["npuir 1", "graph rand", "input x: [4, 64] f32 DRAM0", "const w: [64, 64] f32 DRAM0"]
    names = ["x"]
    for i in range(n_nodes):
        kind = rng.integers(4)
        a = names[rng.integers(len(names))]
        out = f"v{i}"
        if kind == 0:
            lines.append(f"op tanh ({a} -> {out}: [4, 64] f32 DRAM0)")
        elif kind == 1:
            b = names[rng.integers(len(names))]
            lines.append(f"op add ({a}, {b} -> {out}: [4, 64] f32 DRAM0)")
        elif kind == 2:
            lines.append(f"op matmul ({a}, w -> {out}: [4, 64] f32 DRAM0)")
        else:
            lines.append(f"op relu ({a} -> {out}: [4, 64] f32 DRAM0)")
        names.append(out)
    lines.append(f"output {names[-1]}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("ws_kb", [2, 4, 8, 64])
def test_random_graphs_plans_verified_and_runs_within_them(rng, ws_kb):
    for _ in range(5):
        g = parse_w(_random_graph(rng, int(rng.integers(3, 30))), rng)
        plan = plan_memory(g, workspace_mb=ws_kb / 1024)
        verify_plan(plan)
        assert plan.peak(FAST) <= ws_kb * 1024
        # every value is somewhere, and a space's arena holds all its values
        assert all(r.name in plan.space_of for r in plan.ranges.values() if r.bytes)


# ------------------------------------------------------------------ split bands

@pytest.mark.parametrize("hw,rows", [((37, 53), 6), ((64, 48), 9), ((61, 97), 15), ((20, 31), 3)])
def test_split_espcn_equals_unsplit(espcn, rng, hw, rows):
    x = nonzero_normal(rng, (1, 1, *hw))
    shapes = {"input": x.shape}
    g2, infos = split_bands_info(espcn, budget_bytes=1, shapes=shapes, rows=rows)
    assert infos and infos[0]["bands"] == -(-3 * hw[0] // rows)
    verify(g2)
    assert parse(print_graph(g2), weights={v.name: v.data for v in g2.constants()}) == g2
    ref = run("reference", espcn, {"input": x})["output"]
    for backend in ("reference", "cpu"):
        out = run(backend, g2, {"input": x})["output"]
        assert out.shape == ref.shape
        assert rel_diff(out, ref) <= KERNEL_REL, backend
    # no band value is a whole feature map
    conv1 = [v for v in g2.values.values() if v.name.startswith("conv1_out")]
    assert conv1 and all(v.shape[2] < hw[0] for v in conv1)


GENERIC = """npuir 1
graph generic
input x: [1, 3, H, W] f32 DRAM0
const w1: [8, 3, 3, 3] f32 DRAM0
const w2: [8, 8, 3, 3] f32 DRAM0
const w3: [4, 8, 1, 1] f32 DRAM0
const bias: [1, 8, 1, 1] f32 DRAM0
const s: [8] f32 DRAM0
const bb: [8] f32 DRAM0
const m: [8] f32 DRAM0
const var: [8] f32 DRAM0
op conv @c1 (x, w1 -> a: [1, 8, ?, ?] f32 DRAM0) pads=[1, 1, 1, 1] strides=[2, 2]
op relu @r1 (a -> b: [1, 8, ?, ?] f32 DRAM0)
op conv @c2 (b, w2 -> c: [1, 8, ?, ?] f32 DRAM0) pads=[2, 2, 2, 2] dilations=[2, 2]
op add @bias (c, bias -> d: [1, 8, ?, ?] f32 DRAM0)
op batch_normalization @bn (d, s, bb, m, var -> e: [1, 8, ?, ?] f32 DRAM0)
op conv @c3 (e, w3 -> y: [1, 4, ?, ?] f32 DRAM0)
output y
"""


@pytest.mark.parametrize("hw,rows", [((33, 40), 2), ((50, 17), 5), ((9, 9), 1)])
def test_split_strided_dilated_chain_equals_unsplit(rng, hw, rows):
    g = parse_w(GENERIC, rng)
    g.values["var"].data = np.abs(g.values["var"].data) + 0.5  # a variance is positive
    x = nonzero_normal(rng, (1, 3, *hw))
    g2 = split_bands(g, budget_bytes=1, shapes={"x": x.shape}, rows=rows)
    assert [n.op for n in g2.nodes].count("slice") > 1
    verify(g2)
    ref = run("reference", g, {"x": x})["y"]
    for backend in ("reference", "cpu"):
        assert rel_diff(run(backend, g2, {"x": x})["y"], ref) <= KERNEL_REL


def test_chain_stops_at_branches_and_outputs():
    g = parse_w(CHAIN)
    chains = find_chains(g, concrete_values(g, {}))
    # c1 -> r1 -> c2 is a chain; the add reads x again (a skip), which ends nothing but is
    # band-local only if its other operand is constant: it is not, so the chain stops at c2
    assert [[n.name for n in c.nodes] for c in chains] == [["c1", "r1", "c2"]]


# ------------------------------------------------------------------ the executor

def test_executor_splits_espcn_in_a_small_workspace(espcn, rng):
    """The headline case at a size the default test run affords: 240x320 -> 720x960 in 4 MB."""
    x = rng.random((1, 1, 240, 320), dtype=np.float32)
    ref = Executor("cpu", cascade=False).run_sync(espcn, {"input": x})["output"]
    exe = Executor("cpu", workspace_mb=4)
    program, plan = exe.planned(espcn, {"input": x})
    assert plan.split and plan.split[0]["bands"] > 1
    assert plan.peak(FAST) <= 4 * MB
    verify_plan(plan)
    assert rel_diff(exe.run_sync(espcn, {"input": x})["output"], ref) <= KERNEL_REL
    peak = traced_peak(lambda: exe.run_sync(espcn, {"input": x}))
    # a run holds no more than its plan says (+ the kernels' packed weights)...
    assert peak <= plan.run_peak_bytes() + MB // 2
    # ... which is input + output + the band results the concat joins + the workspace
    assert peak <= x.nbytes + 2 * ref.nbytes + 4 * MB
    unsplit_peak = traced_peak(lambda: Executor("cpu", cascade=False).run_sync(espcn, {"input": x}))
    assert peak < unsplit_peak / 2


def test_espcn_720p_to_4k_in_64mb(espcn, rng):  # the headline case: ~2 s, so CI runs it
    x = rng.random((1, 1, 720, 1280), dtype=np.float32)
    ref = Executor("cpu", cascade=False).run_sync(espcn, {"input": x})["output"]
    exe = Executor("cpu", workspace_mb=64)
    _, plan = exe.planned(espcn, {"input": x})
    assert plan.split and plan.peak(FAST) <= 64 * MB
    out = exe.run_sync(espcn, {"input": x})["output"]
    assert rel_diff(out, ref) <= KERNEL_REL
    peak = traced_peak(lambda: exe.run_sync(espcn, {"input": x}))
    unsplit = traced_peak(lambda: Executor("cpu", cascade=False).run_sync(espcn, {"input": x}))
    print(f"peak allocated: split {peak / MB:.1f} MB, unsplit {unsplit / MB:.1f} MB")
    assert peak <= x.nbytes + ref.nbytes + 64 * MB  # input + output + workspace
    assert peak <= plan.run_peak_bytes() + MB // 2
    assert unsplit > 3 * peak


def test_workspace_too_small_names_the_smallest_that_works(espcn, rng):
    x = rng.random((1, 1, 60, 80), dtype=np.float32)
    with pytest.raises(WorkspaceError, match=r"smallest workspace that works is workspace_mb=[0-9.]+") as e:
        Executor("cpu", workspace_mb=0.01).run_sync(espcn, {"input": x})
    need = float(re.search(r"workspace_mb=([0-9.]+)", str(e.value)).group(1))
    ref = Executor("cpu", cascade=False).run_sync(espcn, {"input": x})["output"]
    out = Executor("cpu", workspace_mb=need).run_sync(espcn, {"input": x})["output"]
    assert rel_diff(out, ref) <= KERNEL_REL
    with pytest.raises(WorkspaceError):
        Executor("cpu", workspace_mb=max(need - 0.2, 0.01)).run_sync(espcn, {"input": x})


def test_symbolic_shapes_planned_per_run_shape_and_cached(espcn, rng):
    exe = Executor("cpu", workspace_mb=1)
    a = rng.random((1, 1, 40, 64), dtype=np.float32)
    b = rng.random((1, 1, 30, 50), dtype=np.float32)
    for x in (a, b, a):
        out = exe.run_sync(espcn, {"input": x})["output"]
        assert out.shape == (1, 1, 3 * x.shape[2], 3 * x.shape[3])
        assert rel_diff(out, run("reference", espcn, {"input": x})["output"]) <= KERNEL_REL
    assert len(exe._plans) == 2  # one plan per shape met; the third run hit the cache
    p1, plan1 = exe.planned(espcn, {"input": a})
    p2, _ = exe.planned(espcn, {"input": a})
    assert p1 is p2 and plan1.shapes == {"input": a.shape}


def test_no_workspace_runs_unplanned(espcn):
    for exe in (Executor("cpu", cascade=False), Executor("reference"), Executor("cpu")):
        # (the cpu default cascades only chains bigger than its workspace; 8x8 is not)
        program, plan = exe.planned(espcn, {"input": np.ones((1, 1, 8, 8), np.float32)})
        assert plan is None and program is exe.compile(espcn, {"input": (1, 1, 8, 8)})


def test_cpu_default_cascades_big_chains(espcn, rng):
    from npurun.runtime.executor import CPU_CASCADE_MB
    x = rng.random((1, 1, 240, 320), dtype=np.float32)  # conv1's map alone is 19.7 MB
    exe = Executor("cpu")
    assert exe.workspace_mb is None
    _, plan = exe.planned(espcn, {"input": x})
    assert plan.split and plan.peak(FAST) <= CPU_CASCADE_MB * MB
    ref = Executor("cpu", cascade=False).run_sync(espcn, {"input": x})["output"]
    assert rel_diff(exe.run_sync(espcn, {"input": x})["output"], ref) <= KERNEL_REL


# ------------------------------------------------------------------ the report

def test_memory_report_espcn(espcn):
    rep = memory_report(espcn, workspace_mb=4, device="cpu", shapes={"input": (1, 1, 240, 320)})
    text = rep.format()
    for s in ("NPU_SRAM", "DRAM0", "fast-tier hit rate", "split: chain conv1..pixel_shuffle", "unsplit:"):
        assert s in text
    d = rep.to_dict()
    assert d["tiers"][FAST]["peak"] <= 4 * MB and 0 < d["hit_rate"] <= 1
    assert d["hit_rate"] > d["unsplit"]["hit_rate"]
    # the compiled IR shows placements and the split
    ir = print_graph(rep.graph)
    assert "NPU_SRAM" in ir and "op slice" in ir and "tile=" in ir and "op concat" in ir


def test_memory_report_npusim_and_symbolic(espcn):
    rep = memory_report(espcn, device="npusim:x-elite-hexagon", shapes={"input": (1, 1, 720, 1280)})
    assert rep.plan.tiers.fast.size == 128 * MB and "NPU_CACHE" in rep.format()
    sym = memory_report(espcn, workspace_mb=64)
    assert sym.plan is None and "symbolic" in sym.format() and sym.to_dict()["planned"] == "at run time"


@pytest.mark.models
@pytest.mark.parametrize("name", ["ppocr_det", "minilm_int8"])
def test_real_models_plans_verified(name, rng):
    from tests.models.fetch import fetch
    from tests.models.inputs import RANDOM_FEEDS
    g = npurun.load(fetch(name))
    feeds = RANDOM_FEEDS[name](rng)
    shapes = {k: v.shape for k, v in feeds.items()}
    for ws in (0.5, 4, 64):
        rep = memory_report(g, workspace_mb=ws, device="cpu", shapes=shapes)
        verify_plan(rep.plan)
        assert rep.plan.peak(FAST) <= ws * MB
        assert "fast-tier hit rate" in rep.format()
    exe = Executor("cpu", workspace_mb=0.5)
    ref = Executor("cpu", cascade=False).run_sync(g, feeds)
    out = exe.run_sync(g, feeds)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-4, atol=1e-5)
