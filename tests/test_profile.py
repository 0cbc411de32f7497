"""`npurun profile` (table, Chrome trace, PNG), `npurun top --once` and Prometheus metrics."""
import json

import numpy as np
from PIL import Image

import npurun
from npurun import zoo
from npurun.cli import main
from npurun.ir.cost import node_costs


def test_profile_writes_table_trace_and_png(tmp_path, capsys):
    model = zoo.path("espcn_x3.onnx")
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["profile", str(model), "--shape", "input=1x1x20x20", "--trace", str(trace), "--png", str(png),
                 "--runs", "2", "--concurrent", "2", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "conv2" in out and "GFLOP/s" in out and "DRAM0" in out and "f32" in out
    g = npurun.load(model)
    want = sum(c.macs for c in node_costs(g, {"input": (1, 1, 20, 20)}))
    assert f"{want / 1e9:.3f} GMACs" in out
    data = json.loads(trace.read_text())
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    # Which units the two concurrent copies land on is the scheduler's timing (a copy that
    # finds a unit free runs at once), so only the naming is checked here.
    assert "compute unit 0" in names and names <= {"compute unit 0", "compute unit 1"}
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    width = npurun.Executor("cpu", parallelism=2).scheduler.width  # units one slice holds
    assert len(spans) == 4 * 2 * 2 * width  # 4 steps (conv+tanh fused) x 2 runs x 2 copies, per unit held
    conv2 = next(e for e in spans if e["name"] == "conv2")
    assert conv2["args"]["op"] == "conv+tanh" and conv2["args"]["inputs"][0] == [1, 64, 20, 20]
    assert conv2["args"]["precision"] == "f32" and conv2["args"]["memory"] == "DRAM0"
    assert {e["tid"] for e in spans} <= {0, 1} and all(e["dur"] >= 0 for e in spans)
    assert Image.open(png).size[0] == 1600


def test_profile_asks_for_symbolic_dims(tmp_path, capsys):
    assert main(["profile", str(zoo.path("espcn_x3.onnx")), "--trace", str(tmp_path / "t.json")]) == 1
    assert "give its dims with --shape input=1x1xNxN" in capsys.readouterr().err


def test_top_once_shows_tasks_priorities_and_the_device(capsys):
    m = str(zoo.path("espcn_x3.onnx"))
    assert main(["top", f"{m}@0", f"{m}@3", "--shape", "input=1x1x12x12", "--once", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    for word in ("units", "util", "MAC/s", "temp", "freq", "prio", "preempt", "espcn_x3"):
        assert word in out
    assert main(["top", f"{m}@9"]) == 1


def test_prometheus_metrics_and_monitor_rates(rng):
    from npurun.runtime.metrics import Monitor, prometheus_text
    exe = npurun.Executor("cpu", parallelism=2)
    g = npurun.load(zoo.path("espcn_x3.onnx"))
    mon = Monitor(exe.dev)
    mon.sample()
    x = rng.random((1, 1, 16, 16), dtype=np.float32)
    for p in (0, 3):
        exe.run_sync(g, x, priority=p)
    v = mon.sample()
    want = sum(c.macs for c in node_costs(g, {"input": x.shape}))
    assert v["macs_per_s"] * v["window_s"] >= 2 * want - 1
    assert 0 <= v["utilization"] <= 1 and len(v["unit_utilization"]) == exe.dev.scheduler.units
    text = prometheus_text([exe.dev])
    for name in ("npurun_device_macs_total", "npurun_device_busy_seconds_total", "npurun_tasks_total",
                 "npurun_device_units", "npurun_device_preemptions_total"):
        assert name in text
    assert 'outcome="ok"' in text
    if exe.stats()["temperature_c"] is None:  # unknown is absent, never 0
        assert "npurun_device_temperature_celsius{" not in text


def test_top_shows_the_preemption_latency():
    from npurun.commands.top import _latency
    assert _latency({"count": 0}) == ""
    assert _latency({"count": 3, "p50_s": 0.0012, "p99_s": 0.061}) == "  preempt latency p50 1.2 ms p99 61.0 ms"


def test_profile_follows_the_planned_program_when_bands_split_a_chain():
    """A chain split into bands to fit the workspace runs more steps than the compiled graph
    has nodes: profile's rows are the planned program's steps (they were the compiled graph's,
    so times were pinned on the wrong nodes and chrome_trace raised IndexError)."""
    import numpy as np

    from npurun.commands.profile import chrome_trace, profile
    from npurun.frontend import load
    from npurun.runtime import Executor
    g = load(zoo.path("espcn_x3.onnx"))
    x = np.random.default_rng(0).random((1, 1, 96, 96), dtype=np.float32)
    with Executor("cpu", parallelism=1, workspace_mb=1) as exe:
        rows, traces = profile(exe, g, {"input": x}, runs=1)
    assert len(rows) > len(exe.compile(g, {"input": x.shape}).steps)  # split into bands
    assert any(r["node"].endswith(".b0") for r in rows)
    assert all(len(tr) == len(rows) for _, tr in traces)
    assert len(chrome_trace(rows, traces, 1, "espcn")["traceEvents"]) > len(rows)
