"""npusim: device files, functional equality with the reference backend, the timing model's
consistency, thermal governor, Chrome trace structure and the estimate command."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npurun.backends import get_backend
from npurun.backends.npusim.calibrate import (apply_params, decompose, default_params, dram_share_cap, fit,
                                              params_of, predict)
from npurun.backends.npusim.simulate import estimate
from npurun.backends.npusim.thermal import SimulatedNpu, run_sustained
from npurun.devices import DeviceError, available_devices, load_device
from npurun.errors import NpurunError
from npurun.frontend import load
from npurun.zoo import path as zoo_path
from npurun.zoo.architectures import build

DEVICE_TOML = Path(__file__).resolve().parent.parent / "npurun" / "devices" / "x-elite-hexagon.toml"


def _random_feeds(g, shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(shapes[k]).astype(np.float32) for k in g.inputs}


# ---------------------------------------------------------------- devices

def test_shipped_devices_load():
    names = available_devices()
    assert {"x-elite-hexagon", "edge-npu-1t"} <= set(names)
    d = load_device("x-elite-hexagon")
    assert 40 <= d.peak_tops_int8 <= 50 and d.sram.size_bytes == 128 * 2**20
    assert [p.freq_mhz for p in d.dvfs] == sorted(p.freq_mhz for p in d.dvfs)


@pytest.mark.parametrize("old,new,key", [
    ('bandwidth_gbps = 136.5', 'bandwidth_gbps = -5.0', "memory.dram.bandwidth_gbps"),
    ('size_mb = 128', 'size_mb = "big"', "memory.sram.size_mb"),
    ('resistance_k_per_w = 12.0', 'resistance_k_per_w = 0', "thermal.resistance_k_per_w"),
    ('int8 = 16384\nint8_acc16', 'int8 = -1\nint8_acc16', "compute_units[0].macs_per_cycle.int8"),
    ('recovery_c = 70.0', 'recovery_c = 90.0', "thermal"),
    ('matrix_efficiency = { int8', 'matrix_efficiency = { int16 = 0.5, int8', "calibration.matrix_efficiency.int16"),
    ('dispatch_width = 6', 'dispatch_width = 0', "overheads.dispatch_width"),
    ('dispatch_width = 6', 'dispatch_width = 2.5', "overheads.dispatch_width"),
])
def test_bad_device_field_names_file_and_key(tmp_path, old, new, key):
    text = DEVICE_TOML.read_text()
    assert old in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(NpurunError) as e:
        load_device(bad)
    assert str(bad) in str(e.value) and key in str(e.value)


def test_device_without_dvfs_point(tmp_path):
    lines = DEVICE_TOML.read_text().split("\n")
    keep, skip = [], False
    for ln in lines:
        if ln.startswith("[[dvfs]]"):
            skip = True
            continue
        if skip and ln.startswith("[") and not ln.startswith("[[dvfs"):
            skip = False
        if not skip:
            keep.append(ln)
    bad = tmp_path / "nodvfs.toml"
    bad.write_text("\n".join(keep))
    with pytest.raises(DeviceError, match=r"nodvfs\.toml: dvfs: missing"):
        load_device(bad)


def test_unknown_device_and_broken_toml(tmp_path):
    with pytest.raises(DeviceError, match="unknown device 'nope'"):
        load_device("nope")
    bad = tmp_path / "broken.toml"
    bad.write_text("[device\nname=")
    with pytest.raises(DeviceError, match="broken.toml: not valid TOML"):
        load_device(bad)


# ---------------------------------------------------------------- functional equality

@pytest.mark.parametrize("arch,kw", [("quicksrnetsmall", dict(h=12, w=10)), ("xlsr", dict(h=8, w=8)),
                                     ("mobilenet_v2", dict(h=32, w=32)), ("sesr_m5", dict(h=8, w=6)),
                                     ("shufflenet_v2", dict(h=32, w=32))])
def test_outputs_equal_reference(arch, kw):
    g = build(arch, **kw)
    shapes = {k: g.values[k].shape for k in g.inputs}
    feeds = _random_feeds(g, shapes)
    got = get_backend("npusim").compile(g)
    want = get_backend("reference").compile(g).run(feeds)
    out = got.run(feeds)
    for k in want:
        assert out[k].dtype == want[k].dtype and np.array_equal(out[k], want[k]), k
    assert got.last_report is not None and got.last_report.latency_s > 0


def test_espcn_equal_reference_and_fp16_emulation():
    from npurun.backends.npusim import NpusimBackend
    g = load(zoo_path("espcn_x3.onnx"))
    feeds = _random_feeds(g, {g.inputs[0]: (1, 1, 24, 20)}, seed=3)
    want = get_backend("reference").compile(g).run(feeds)[g.outputs[0]]
    assert np.array_equal(get_backend("npusim:x-elite-hexagon").compile(g).run(feeds)[g.outputs[0]], want)
    p16 = NpusimBackend("x-elite-hexagon", precision="fp16", emulate_fp16=True).compile(g)
    y = p16.run(feeds)[g.outputs[0]]
    assert np.array_equal(y, y.astype(np.float16).astype(np.float32))  # stored at fp16
    assert np.allclose(y, want, atol=1e-2) and not np.array_equal(y, want)


# ---------------------------------------------------------------- the model

def test_fit_arrays_agree_with_node_model():
    dev = load_device("x-elite-hexagon")
    for arch, prec in (("resnet18", "int8"), ("quicksrnetsmall", "fp16"), ("yolov8_det", "int8"),
                       ("whisper_tiny_decoder", "fp16")):  # per-head chains: overlapped dispatch
        g = build(arch)
        rep = estimate(g, dev, precision=prec)
        fast = predict(params_of(dev), decompose(g, dev, prec))
        assert fast == pytest.approx(rep.latency_s, rel=1e-9)


def _branches(k: int) -> str:
    """x -> k independent chains of two ops each -> their sum."""
    t = "[1, 8, 4, 4] f32 DRAM0"
    lines = ["npuir 1", "graph branches", f"input x: {t}"]
    for i in range(k):
        lines.append(f"op sigmoid @s{i} (x: {t} -> a{i}: {t})")
        lines.append(f"op tanh @t{i} (a{i}: {t} -> b{i}: {t})")
    acc = "b0"
    for i in range(1, k):
        lines.append(f"op add @add{i} ({acc}: {t}, b{i}: {t} -> c{i}: {t})")
        acc = f"c{i}"
    lines.append(f"output {acc}: {t}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("k,width", [(1, 6), (6, 1), (6, 6), (8, 6), (3, 2)])
def test_independent_ops_share_their_dispatch_overhead(k, width):
    """Ops at one depth (k parallel chains) pay ceil(k / width) overheads between them, a
    chain pays one per op; node_timings and the fit's arrays count the same."""
    from dataclasses import replace
    from npurun.backends.npusim.model import dispatch_shares
    from npurun.ir import parse
    g = parse(_branches(k))
    share = dispatch_shares(g, [True] * len(g.nodes), width)
    chains = [s for n, s in zip(g.nodes, share) if n.op in ("sigmoid", "tanh")]
    assert chains == pytest.approx([-(-k // width) / k] * 2 * k)
    assert [s for n, s in zip(g.nodes, share) if n.op == "add"] == [1.0] * (k - 1)  # a chain of adds
    dev = replace(load_device("x-elite-hexagon"), dispatch_width=width)
    rep = estimate(g, dev, precision="fp16")
    assert predict(params_of(dev), decompose(g, dev, "fp16")) == pytest.approx(rep.latency_s, rel=1e-9)
    d = decompose(g, dev, "fp16")
    assert d.n_ops == 3 * k - 1 and d.n_dispatch == pytest.approx(2 * -(-k // width) + k - 1)


def test_fit_follows_the_rows_a_model_explains_not_an_outlier():
    """The calibration's loss is a median fit: rows made by known parameters are recovered
    when one row is off by 5x; the outlier keeps its error instead of spreading it."""
    dev = load_device("x-elite-hexagon")
    truth = params_of(dev)
    rows = [decompose(build(a), dev, p) for a in ("resnet18", "quicksrnetsmall", "mobilenet_v2", "squeezenet1_1",
                                                  "xlsr", "shufflenet_v2") for p in ("int8", "fp16")]
    y = np.array([predict(truth, d) for d in rows])
    y[3] *= 5
    got = fit(list(zip(rows, y)), default_params(dev), dram_share_cap(dev))
    err = np.array([predict(got, d) for d in rows]) / y - 1
    clean = np.delete(np.abs(err), 3)
    assert np.median(clean) < 0.02 and clean.max() < 0.1, err
    assert err[3] < -0.7  # the 5x row is left where the others put it
    # the overheads are tied: one per graph, an op's per byte of activation (calibrate.ACT_BYTES)
    assert got["op_us_fp16"] == pytest.approx(2 * got["op_us_int8"]) and got["op_us_a16"] == got["op_us_fp16"]
    assert got["graph_us_int8"] == got["graph_us_fp16"] == got["graph_us_a16"]


def test_dram_share_cap_is_the_bus_peak():
    """At dram_share_cap a spilled stream's DRAM time is its bytes at the bus bandwidth (each
    node rounds up to whole bursts)."""
    dev = load_device("edge-npu-1t")
    cap = dram_share_cap(dev)
    assert cap > 1
    at_cap = apply_params(dev, {**params_of(dev), "dram_share": cap})
    rep = estimate(build("resnet50"), at_cap, precision="int8")
    spilled = [n for n in rep.nodes if n.dram_bytes]
    assert spilled
    bw = dev.dram.bandwidth_gbps * 1e9
    for n in spilled:
        assert n.dram_bytes / bw <= n.dram_s <= (n.dram_bytes + dev.burst_bytes) / bw


def test_int8_faster_than_fp16_and_bigger_models_slower():
    dev = load_device("x-elite-hexagon")
    r18, r50 = build("resnet18"), build("resnet50")
    assert estimate(r50, dev, precision="int8").latency_s < estimate(r50, dev, precision="fp16").latency_s
    assert estimate(r18, dev, precision="int8").latency_s < estimate(r50, dev, precision="int8").latency_s
    rep = estimate(r50, dev, precision="int8")
    assert 0 < rep.mac_utilization < 1 and 0 < rep.fast_tier_hit_rate <= 1
    assert rep.macs == 4_089_184_256 or abs(rep.macs / 4.089e9 - 1) < 0.01


def test_small_sram_spills_to_dram():
    big = estimate(build("resnet50"), "x-elite-hexagon", precision="int8")
    small = estimate(build("resnet50"), "edge-npu-1t", precision="int8")
    assert small.fast_tier_hit_rate < big.fast_tier_hit_rate
    assert small.dram_bytes > big.dram_bytes
    assert small.sram_peak_bytes <= load_device("edge-npu-1t").sram.size_bytes


# ---------------------------------------------------------------- thermal

def test_rc_model_is_exact_and_governor_holds_the_limit():
    dev = load_device("x-elite-hexagon")
    npu = SimulatedNpu(dev)
    p = 3.0
    npu.advance(p, 1000.0)  # >> R*C: steady state
    assert npu.temperature_c() == pytest.approx(dev.ambient_c + p * dev.thermal_resistance, rel=1e-6)
    # A workload hot enough to cross 85 C at the top point, cool enough below it.
    per_point = [(1e-3, 1e-3 * w) for w in (2.0, 3.0, 4.5, 7.0)]
    res = run_sustained(dev, per_point, 600.0)
    assert res.peak_temp_c <= dev.throttle_c + 1.0
    assert res.peak_temp_c > dev.throttle_c - 1.0
    assert len(res.time_at_point) > 1
    assert res.throughput < 1 / per_point[-1][0]


def test_custom_governor_drives_the_knob():
    dev = load_device("x-elite-hexagon")

    class Lowest:
        def decide(self, npu):
            return 0
    res = run_sustained(dev, [(1e-3, 1e-3)] * len(dev.dvfs), 1.0, governor=Lowest())
    assert res.time_at_point[dev.dvfs[-1].name] == pytest.approx(0.1)  # one period, then svs
    assert res.time_at_point[dev.dvfs[0].name] == pytest.approx(0.9)


def test_sustained_estimate_reports_throttling():
    rep = estimate(build("real_esrgan_general_x4v3"), "x-elite-hexagon", precision="fp16", sustained_s=600)
    d = rep.to_dict()
    s = d["sustained"]
    assert s["inferences_per_s"] <= s["cool_peak_inferences_per_s"] * (1 + 1e-9)
    assert d["peak_temp_c"] >= s["final_temp_c"] - 1e-9


# ---------------------------------------------------------------- trace and CLI

def test_chrome_trace_structure(tmp_path):
    rep = estimate(build("yolov8_det"), "x-elite-hexagon", precision="int8", sustained_s=2)
    path = tmp_path / "t.json"
    rep.write_trace(path)
    tr = json.loads(path.read_text())
    ev = tr["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    dev = rep.device
    assert len(names) == len(dev.units) + dev.dma_engines
    assert sum("DMA queue" in n for n in names.values()) == dev.dma_engines
    for e in ev:
        assert e["ph"] in ("M", "X", "C")
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in names and e["dur"] >= 0 and e["ts"] >= 0 and e["name"]
        if e["ph"] == "C":
            assert isinstance(e["args"], dict) and all(isinstance(v, (int, float)) for v in e["args"].values())
    counters = {e["name"] for e in ev if e["ph"] == "C"}
    assert {"temperature_c", "frequency_mhz", "power_w"} <= counters
    # Compute tracks run one node at a time: no overlap within a track.
    for key in names:
        xs = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["ph"] == "X" and (e["pid"], e["tid"]) == key)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(xs, xs[1:])), names[key]
    unit_events = [e for e in ev if e["ph"] == "X" and e.get("cat") not in ("dma", "overhead")]
    assert len(unit_events) == sum(1 for n in rep.nodes if n.unit and n.time_s > 0)
    end = max(e["ts"] + e["dur"] for e in unit_events)
    assert end == pytest.approx(rep.latency_s * 1e6, rel=1e-6)


def test_estimate_cli(tmp_path, capsys):
    from npurun.cli import main
    j, c = tmp_path / "r.json", tmp_path / "r.csv"
    assert main(["estimate", "resnet18", "--device", "x-elite-hexagon", "--precision", "int8",
                 "--json", str(j), "--csv", str(c), "--trace", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "effective TOPS" in out and "fast-tier hit rate" in out
    d = json.loads(j.read_text())
    for k in ("latency_ms", "energy_mj", "effective_tops", "mac_utilization", "fast_tier_hit_rate", "peak_temp_c"):
        assert isinstance(d[k], float)
    rows = c.read_text().strip().split("\n")
    from npurun.backends.npusim.view import npusim_view
    assert rows[0].startswith("node,op,unit") and len(rows) == 1 + len(npusim_view(build("resnet18")).nodes)


def test_estimate_cli_errors(tmp_path, capsys):
    from npurun.cli import main
    bad = tmp_path / "bad.toml"
    bad.write_text(DEVICE_TOML.read_text().replace("bandwidth_gbps = 1200", "bandwidth_gbps = -1"))
    assert main(["estimate", "resnet18", "--device", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.toml" in err and "memory.sram.bandwidth_gbps" in err
    assert main(["estimate", "no_such_model"]) == 1
