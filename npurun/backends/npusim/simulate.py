"""One inference (and optionally a sustained run) of a graph on a device, as a `Report`: the
numbers `npurun estimate` prints, its JSON, per-node CSV and Chrome trace."""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field

from ...devices import FAMILY, Device, load_device
from ...errors import NpurunError
from ...ir.graph import Graph
from ...util import atomic_write
from .model import (NodeTiming, choose_precision, graph_overhead_s, io_bytes, node_energy, node_timings,
                    resolve_shapes)
from .placement import place
from .thermal import SimulatedNpu, SustainedResult, run_sustained


@dataclass
class Report:
    graph: str
    device: Device
    precision: str
    nodes: list[NodeTiming]
    latency_s: float
    graph_overhead_s: float
    energy_j: float
    sram_peak_bytes: int
    dvfs_name: str
    freq_mhz: float
    main_precision: str
    peak_macs_per_s: float
    temps: list = field(default_factory=list)  # (t, temp) over the single inference
    sustained: SustainedResult | None = None
    cool_throughput: float = 0.0

    # ---- totals
    @property
    def macs(self) -> int:
        return sum(n.macs for n in self.nodes)

    @property
    def dram_bytes(self) -> int:
        return sum(n.dram_bytes for n in self.nodes)

    @property
    def sram_bytes(self) -> int:
        return sum(n.sram_bytes for n in self.nodes)

    @property
    def fast_tier_hit_rate(self) -> float:
        tot = self.sram_bytes + self.dram_bytes
        return self.sram_bytes / tot if tot else 1.0

    @property
    def effective_tops(self) -> float:
        return 2 * self.macs / self.latency_s / 1e12

    @property
    def mac_utilization(self) -> float:
        return self.macs / self.latency_s / self.peak_macs_per_s

    def bound_time(self, kind: str) -> float:
        return sum(n.time_s for n in self.nodes if n.unit and n.bound == kind)

    @property
    def peak_temp_c(self) -> float:
        peak = max(t for _, t in self.temps) if self.temps else self.device.ambient_c
        return max(peak, self.sustained.peak_temp_c) if self.sustained else peak

    def to_dict(self) -> dict:
        d = {"graph": self.graph, "device": self.device.name, "precision": self.precision,
             "main_precision": self.main_precision, "dvfs": self.dvfs_name, "freq_mhz": self.freq_mhz,
             "latency_ms": self.latency_s * 1e3, "energy_mj": self.energy_j * 1e3,
             "macs": self.macs, "effective_tops": self.effective_tops,
             "mac_utilization": self.mac_utilization, "fast_tier_hit_rate": self.fast_tier_hit_rate,
             "sram_used_bytes": self.sram_peak_bytes, "dram_bytes": self.dram_bytes,
             "compute_bound_ms": self.bound_time("compute") * 1e3,
             "memory_bound_ms": self.bound_time("memory") * 1e3,
             "overhead_bound_ms": self.bound_time("overhead") * 1e3,
             "graph_overhead_ms": self.graph_overhead_s * 1e3,
             "inferences_per_s": 1 / self.latency_s, "inferences_per_j": 1 / self.energy_j,
             "peak_temp_c": self.peak_temp_c}
        if self.sustained:
            s = self.sustained
            d["sustained"] = {"seconds": s.seconds, "inferences_per_s": s.throughput,
                              "cool_peak_inferences_per_s": self.cool_throughput,
                              "peak_temp_c": s.peak_temp_c, "final_temp_c": s.final_temp_c,
                              "time_at_dvfs_s": s.time_at_point}
        return d

    def summary(self) -> str:
        d = self.to_dict()
        gb = lambda b: f"{b / 1e6:.2f} MB"  # noqa: E731
        lines = [
            f"npusim estimate: {self.graph} on {self.device.name} ({self.device.description})",
            f"  precision          {self.precision} (MACs mostly {self.main_precision}); DVFS {self.dvfs_name} {self.freq_mhz:.0f} MHz",
            f"  MACs               {self.macs / 1e9:.3f} G",
            f"  cycles             {self.latency_s * self.freq_mhz * 1e6:,.0f}",
            f"  latency            {d['latency_ms']:.3f} ms  (compute-bound {d['compute_bound_ms']:.3f}, memory-bound "
            f"{d['memory_bound_ms']:.3f}, overhead-bound {d['overhead_bound_ms']:.3f}, per-graph {d['graph_overhead_ms']:.3f})",
            f"  SRAM used          {gb(self.sram_peak_bytes)} of {gb(self.device.sram.size_bytes)}",
            f"  DRAM traffic       {gb(self.dram_bytes)}",
            f"  fast-tier hit rate {self.fast_tier_hit_rate:.1%}",
            f"  MAC utilization    {self.mac_utilization:.1%}",
            f"  effective TOPS     {self.effective_tops:.2f}",
            f"  inferences/s       {d['inferences_per_s']:.1f}",
            f"  energy/inference   {d['energy_mj']:.3f} mJ  ({d['inferences_per_j']:.1f} inferences/J)",
            f"  peak temperature   {self.peak_temp_c:.1f} C",
        ]
        if self.sustained:
            s = d["sustained"]
            share = ", ".join(f"{k} {v:.0f}s" for k, v in s["time_at_dvfs_s"].items())
            lines += [f"  sustained {s['seconds']:.0f} s    {s['inferences_per_s']:.1f} inferences/s vs cool peak "
                      f"{s['cool_peak_inferences_per_s']:.1f} ({s['inferences_per_s'] / s['cool_peak_inferences_per_s']:.0%}); "
                      f"peak {s['peak_temp_c']:.1f} C, final {s['final_temp_c']:.1f} C; time at DVFS: {share}"]
        return "\n".join(lines)

    def write_json(self, path) -> None:
        atomic_write(path, json.dumps(self.to_dict(), indent=2).encode())

    def write_csv(self, path) -> None:
        import io
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["node", "op", "unit", "precision", "macs", "utilization", "sram_bytes", "dram_bytes",
                    "compute_us", "transfer_us", "overhead_us", "time_us", "start_us", "bound", "energy_uj", "fused"])
        for n in self.nodes:
            w.writerow([n.name, n.op, n.unit or "-", n.precision, n.macs, f"{n.utilization:.4f}", n.sram_bytes,
                        n.dram_bytes, f"{n.compute_s * 1e6:.3f}", f"{n.transfer_s * 1e6:.3f}",
                        f"{n.overhead_s * 1e6:.3f}", f"{n.time_s * 1e6:.3f}", f"{n.start_s * 1e6:.3f}",
                        n.bound, f"{n.energy_j * 1e6:.4f}", " ".join(n.fused)])
        atomic_write(path, buf.getvalue().encode())

    def write_trace(self, path) -> None:
        from .trace import chrome_trace
        atomic_write(path, json.dumps(chrome_trace(self)).encode())


def main_precision(nodes) -> str:
    by: dict[str, int] = {}
    for n in nodes:
        by[n.precision] = by.get(n.precision, 0) + n.macs
    return max(by, key=by.get) if by else "fp16"


def _one(g, dev, shapes, placement, precision, idx):
    p = dev.dvfs[idx]
    nodes = node_timings(g, dev, shapes, placement, precision, p.freq_mhz * 1e6)
    over = graph_overhead_s(dev, FAMILY[main_precision(nodes)], io_bytes(g, shapes))
    for n in nodes:
        n.start_s += over
        n.energy_j = node_energy(n, dev, p.voltage_v) if n.unit else 0.0
    lat = over + sum(n.time_s for n in nodes)
    energy = sum(n.energy_j for n in nodes) + p.static_power_w * lat
    return nodes, lat, over, energy


def trace_shapes(graph: Graph, shapes: dict, inputs: dict | None = None) -> dict:
    """Concrete shapes the static rules could not give (data-dependent dims), by running the
    graph once on the reference kernels with synthetic inputs of the given shapes: small
    random floats, ones for integers, unless `inputs` gives values. (Control-flow bodies are
    not looked into.)"""
    import numpy as np

    from ...backends.reference import ReferenceBackend
    from ...ir.dtypes import to_numpy
    from ...ir.graph import Graph as G
    rng = np.random.default_rng(0)
    feeds = dict(inputs or {})
    for nm in [n for n in graph.inputs if n not in feeds]:
        v = graph.values[nm]
        dt = to_numpy(v.dtype)
        feeds[nm] = (rng.standard_normal(shapes[nm]) * 0.1).astype(dt) if dt.kind == "f" \
            else np.ones(shapes[nm], dt)
    probe = G(graph.name, graph.values, graph.nodes, graph.inputs,
              [o for n in graph.nodes for o in n.outputs if graph.values[o].kind == "tensor"], graph.source)
    try:
        outs = ReferenceBackend().compile(probe).run(feeds)
    except NpurunError as e:
        raise NpurunError(f"{graph.source}: the model's intermediate shapes depend on its input "
                          f"values, and a run on synthetic inputs failed ({e})") from None
    return {k: tuple(a.shape) for k, a in outs.items() if hasattr(a, "shape")}


def estimate(graph: Graph, device: Device | str, input_shapes: dict | None = None, precision: str = "auto",
             sustained_s: float = 0.0, dvfs_index: int | None = None, governor=None,
             inputs: dict | None = None, resident_weights: bool = True) -> Report:
    """`inputs`: real values for inputs whose values steer shapes (used only to find shapes);
    `resident_weights=False`: weights are not kept in SRAM between inferences (placement.place)."""
    dev = device if isinstance(device, Device) else load_device(device)
    if sustained_s < 0:
        raise NpurunError(f"--sustained {sustained_s}: expected a number of seconds >= 0")
    shapes = resolve_shapes(graph, input_shapes or {})
    missing = [nm for nm in graph.inputs if shapes.get(nm) is None]
    if missing:
        raise NpurunError(f"{graph.source}: input {missing[0]!r} has symbolic dims "
                          f"{list(graph.values[missing[0]].shape)}; give its shape (--shape {missing[0]}=1x3x224x224)")
    if any(shapes.get(o) is None for n in graph.nodes for o in n.outputs):
        shapes.update(trace_shapes(graph, shapes, inputs))
    precs = [choose_precision(n, graph, precision) for n in graph.nodes]
    placement, sram_peak = place(graph, shapes, precs, dev.sram.size_bytes, resident_weights)
    idx = len(dev.dvfs) - 1 if dvfs_index is None else dvfs_index
    nodes, lat, over, energy = _one(graph, dev, shapes, placement, precision, idx)
    mp = main_precision(nodes)
    mat = dev.unit("matrix")
    peak = mat.count * max(mat.macs_per_cycle.get(mp, 0), 1) * dev.dvfs[idx].freq_mhz * 1e6
    rep = Report(graph.name, dev, precision, nodes, lat, over, energy, sram_peak, dev.dvfs[idx].name,
                 dev.dvfs[idx].freq_mhz, mp, peak)
    # Temperature over one inference from ambient, node by node (power = node energy / time).
    npu = SimulatedNpu(dev, idx)
    static = dev.dvfs[idx].static_power_w
    rep.temps = [(0.0, npu.advance(static, over))]
    for n in nodes:
        if n.time_s > 0:
            rep.temps.append((n.start_s + n.time_s, npu.advance(n.energy_j / n.time_s + static, n.time_s)))
    if sustained_s > 0:
        per_point = []
        for i in range(len(dev.dvfs)):
            _, l_i, _, e_i = _one(graph, dev, shapes, placement, precision, i)
            per_point.append((l_i, e_i))
        rep.cool_throughput = 1 / per_point[idx][0]
        rep.sustained = run_sustained(dev, per_point, sustained_s, governor, npu=SimulatedNpu(dev, idx))
    return rep


def input_shapes_of(graph: Graph, spec: list[str] | None) -> dict:
    """`name=1x3x224x224` strings -> {name: shape}; a lone `1x3x224x224` is the first input."""
    out = {}
    for s in spec or []:
        name, _, dims = s.rpartition("=")
        name = name or graph.inputs[0]
        if name not in graph.inputs:
            raise NpurunError(f"--shape {s}: the model has no input {name!r}; inputs: {', '.join(graph.inputs)}")
        try:
            out[name] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise NpurunError(f"--shape {s}: expected NAME=DxDxD..., e.g. {graph.inputs[0]}=1x3x224x224") from None
    return out


__all__ = ["Report", "estimate", "input_shapes_of", "os"]
