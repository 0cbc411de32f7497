"""Chrome trace (JSON trace-event format; Perfetto and chrome://tracing read it) of one
simulated inference: one track per compute unit and per DMA queue, counter tracks for the
temperature, the clock and the power; a sustained run adds its counters on a second process."""
from __future__ import annotations


def chrome_trace(rep) -> dict:
    dev = rep.device
    ev = []
    pid = 1
    ev.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"npusim {dev.name}: {rep.graph}"}})
    tids = {}
    for k, u in enumerate(dev.units):
        tids[u.name] = k + 1
        ev.append({"ph": "M", "pid": pid, "tid": k + 1, "name": "thread_name", "args": {"name": f"{u.kind} unit {u.name}"}})
    dma = [100 + q for q in range(dev.dma_engines)]
    for q, tid in enumerate(dma):
        ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": f"DMA queue {q}"}})
    ev.append({"ph": "X", "pid": pid, "tid": tids[dev.unit("matrix").name], "name": "graph overhead",
               "cat": "overhead", "ts": 0.0, "dur": rep.graph_overhead_s * 1e6})
    q = 0
    for n in rep.nodes:
        if not n.unit or n.time_s <= 0:
            continue
        ev.append({"ph": "X", "pid": pid, "tid": tids[n.unit], "name": n.name, "cat": n.op,
                   "ts": n.start_s * 1e6, "dur": n.time_s * 1e6,
                   "args": {"op": n.op, "precision": n.precision, "macs": n.macs, "bound": n.bound,
                            "utilization": round(n.utilization, 4), "fused": n.fused}})
        if n.transfer_s > 0:
            ev.append({"ph": "X", "pid": pid, "tid": dma[q % len(dma)], "name": f"dma {n.name}", "cat": "dma",
                       "ts": n.start_s * 1e6, "dur": min(n.transfer_s, n.time_s) * 1e6,
                       "args": {"sram_bytes": n.sram_bytes, "dram_bytes": n.dram_bytes}})
            q += 1
    static = next(p for p in dev.dvfs if p.name == rep.dvfs_name).static_power_w
    t_prev = 0.0
    for t, temp in rep.temps:
        ev.append({"ph": "C", "pid": pid, "name": "temperature_c", "ts": t * 1e6, "args": {"temperature_c": round(temp, 4)}})
    for n in rep.nodes:
        if n.time_s > 0 and n.unit:
            ev.append({"ph": "C", "pid": pid, "name": "power_w", "ts": n.start_s * 1e6,
                       "args": {"power_w": round(n.energy_j / n.time_s + static, 4)}})
    ev.append({"ph": "C", "pid": pid, "name": "frequency_mhz", "ts": t_prev, "args": {"frequency_mhz": rep.freq_mhz}})
    ev.append({"ph": "C", "pid": pid, "name": "frequency_mhz", "ts": rep.latency_s * 1e6,
               "args": {"frequency_mhz": rep.freq_mhz}})
    if rep.sustained:
        sp = 2
        ev.append({"ph": "M", "pid": sp, "name": "process_name", "args": {"name": "sustained run (simulated time)"}})
        for t, temp, f, p in rep.sustained.samples:
            ts = t * 1e6
            ev += [{"ph": "C", "pid": sp, "name": "temperature_c", "ts": ts, "args": {"temperature_c": round(temp, 3)}},
                   {"ph": "C", "pid": sp, "name": "frequency_mhz", "ts": ts, "args": {"frequency_mhz": f}},
                   {"ph": "C", "pid": sp, "name": "power_w", "ts": ts, "args": {"power_w": round(p, 4)}}]
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"device": dev.name, "graph": rep.graph, "latency_ms": rep.latency_s * 1e3}}
