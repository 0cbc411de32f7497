"""Monitoring: rates between two snapshots of a device, and Prometheus metrics.

    m = Monitor(exe.dev)          # or Monitor(device) for any runtime Device
    view = m.sample()             # utilization, MAC/s, MAC/cycle since the last sample, tasks
    text = prometheus_text([exe.dev])   # the text format a /metrics endpoint serves

Utilization of a compute unit is the share of wall time it held a slice. MAC/s counts the
MACs of the nodes finished in the window (a node's MACs from npurun.ir.cost). MAC/cycle is
given only where the device counts cycles (the simulator); elsewhere it is None.
Prometheus metrics need `prometheus_client` (imported only by the functions that use it).
"""
from __future__ import annotations

import time


class Monitor:
    def __init__(self, device, clock=time.monotonic):
        self.device, self.clock = device, clock
        self._prev = None

    def sample(self) -> dict:
        """Device rates since the previous sample (since the device started, the first time)."""
        cur = self.device.stats()
        prev = self._prev or {"uptime_s": 0.0, "unit_busy_s": [0.0] * len(cur["unit_busy_s"]), "macs_done": 0,
                              "cycles": None, "slices": 0, "preemptions": 0}
        self._prev = cur
        return {**cur, **rates(prev, cur), "task_list": self.device.tasks()}


def rates(prev: dict, cur: dict) -> dict:
    dt = max(1e-9, cur["uptime_s"] - prev["uptime_s"])
    busy = [b - a for a, b in zip(prev["unit_busy_s"], cur["unit_busy_s"])]
    dmacs = cur["macs_done"] - prev["macs_done"]
    cyc = None
    if cur.get("cycles") is not None and prev.get("cycles") is not None and cur["cycles"] > prev["cycles"]:
        cyc = dmacs / (cur["cycles"] - prev["cycles"])
    return {"window_s": dt, "unit_utilization": [min(1.0, b / dt) for b in busy],
            "utilization": min(1.0, sum(busy) / (dt * len(busy))) if busy else 0.0,
            "macs_per_s": dmacs / dt, "macs_per_cycle": cyc,
            "slices_in_window": cur["slices"] - prev["slices"],
            "preemptions_in_window": cur["preemptions"] - prev["preemptions"]}


def collector(devices):
    """A prometheus_client collector over runtime Devices (pass a list, or a callable giving one)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    class NpurunCollector:
        def collect(self):
            devs = devices() if callable(devices) else devices
            g = {k: GaugeMetricFamily(f"npurun_{k}", h, labels=lab) for k, h, lab in [
                ("device_units", "compute units of the device", ["device"]),
                ("device_active_units", "compute units the governor lets the scheduler use", ["device"]),
                ("device_duty_cycle", "fraction of time the units may work (governor)", ["device"]),
                ("device_temperature_celsius", "hottest sensor reading; absent when unknown", ["device"]),
                ("device_operating_point", "index of the operating point, 0 = fastest", ["device"]),
                ("device_frequency_mhz", "frequency of the operating point, where known", ["device"]),
                ("tasks_running", "tasks holding a compute unit", ["device"]),
                ("tasks_waiting", "tasks waiting for a compute unit", ["device"]),
                ("task_macs_per_second", "MACs per second of a live task while it ran", ["device", "task", "priority"]),
                ("task_queue_wait_seconds", "time a live task has waited for a unit", ["device", "task", "priority"])]}
            c = {k: CounterMetricFamily(f"npurun_{k}", h, labels=lab) for k, h, lab in [
                ("device_busy_seconds", "time a compute unit was held by a slice", ["device", "unit"]),
                ("device_macs", "MACs of finished nodes", ["device"]),
                ("device_slices", "slices dispatched", ["device"]),
                ("device_preemptions", "slices ended early for a higher priority", ["device"]),
                ("device_admission_holds", "boundaries where a task waited for a periodic better stream's "
                 "next request instead of starting a stretch predicted to overrun it", ["device"]),
                ("device_admission_held_seconds", "unit time left idle by those holds", ["device"]),
                ("tasks", "tasks by outcome", ["device", "outcome"])]}
            h = HistogramMetricFamily("npurun_device_preemption_latency_seconds",
                                      "from a task's arrival, every unit held and one by a lower priority, "
                                      "to its first slice", labels=["device"])
            for d in devs:
                s = d.stats()
                n = [d.name]
                lat = s.get("preemption_latency")
                if lat is not None:
                    h.add_metric(n, [(repr(float(le)), c) for le, c in lat["buckets"]] + [("+Inf", lat["count"])],
                                 lat["sum_s"])
                g["device_units"].add_metric(n, s["units"])
                g["device_active_units"].add_metric(n, s["active_units"])
                g["device_duty_cycle"].add_metric(n, s["duty"])
                if s["temperature_c"] is not None:
                    g["device_temperature_celsius"].add_metric(n, s["temperature_c"])
                if s["governor"]:
                    g["device_operating_point"].add_metric(n, s["governor"]["level"])
                if s["frequency_mhz"] is not None:
                    g["device_frequency_mhz"].add_metric(n, s["frequency_mhz"])
                g["tasks_running"].add_metric(n, s["running"])
                g["tasks_waiting"].add_metric(n, s["waiting"])
                for t in d.tasks():
                    if t["state"] != "done":
                        lab = [d.name, f"{t['name']}#{t['id']}", str(t["priority"])]
                        g["task_macs_per_second"].add_metric(lab, t["macs_per_s"])
                        g["task_queue_wait_seconds"].add_metric(lab, t["queue_wait_s"])
                for i, b in enumerate(s["unit_busy_s"]):
                    c["device_busy_seconds"].add_metric([d.name, str(i)], b)
                c["device_macs"].add_metric(n, s["macs_done"])
                c["device_slices"].add_metric(n, s["slices"])
                c["device_preemptions"].add_metric(n, s["preemptions"])
                c["device_admission_holds"].add_metric(n, s.get("admission_holds", 0))
                c["device_admission_held_seconds"].add_metric(n, s.get("admission_held_s", 0.0))
                for outcome, k in s["tasks"].items():
                    if outcome != "submitted":
                        c["tasks"].add_metric([d.name, outcome], k)
            yield from g.values()
            yield from c.values()
            yield h

    return NpurunCollector()


def prometheus_text(devices=None) -> str:
    """The Prometheus text exposition of the given Devices (default: every open one)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from .device import Device
    reg = CollectorRegistry()
    reg.register(collector(devices if devices is not None else Device.all))
    return generate_latest(reg).decode()
