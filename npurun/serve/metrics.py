"""The server's Prometheus metrics (`GET /metrics`, text format), one registry per app.

Per model (only names of the repository: a request for an unknown model is counted under
model="", so clients cannot grow the label set):

    npurun_serve_requests_total{model}                  infer requests received
    npurun_serve_request_failures_total{model,code}     requests answered with an error, by HTTP status
    npurun_serve_inferences_total{model}                inferences run (batch items: a batch of 4 is 4)
    npurun_serve_executions_total{model}                model runs on the device (a batch is one)
    npurun_serve_queue_duration_seconds{model,priority} time a run waited for the device (histogram)
    npurun_serve_compute_duration_seconds{model}        time a run held the device (histogram)
    npurun_serve_request_duration_seconds{model}        request received -> response ready (histogram)

Per device, from the runtime (npurun.runtime.metrics.collector, reused as is): busy seconds per
unit, MACs, slices, preemptions, tasks by outcome, temperature and frequency (absent while
unknown), operating point, active units, duty. Added here: `npurun_device_utilization`, the
share of time the device's units were busy since the previous scrape (since the device
started, on the first one).
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..runtime.metrics import Monitor, collector

# Seconds: 0.5 ms .. 30 s.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServeMetrics:
    def __init__(self, devices):
        """`devices`: a callable giving the runtime Devices the server uses."""
        self.registry = r = CollectorRegistry()
        self.requests = Counter("npurun_serve_requests", "infer requests received", ["model"], registry=r)
        self.failures = Counter("npurun_serve_request_failures", "infer requests answered with an error",
                                ["model", "code"], registry=r)
        self.inferences = Counter("npurun_serve_inferences", "inferences run (batch items)", ["model"], registry=r)
        self.executions = Counter("npurun_serve_executions", "model runs on the device (a batch is one)",
                                  ["model"], registry=r)
        self.queue = Histogram("npurun_serve_queue_duration_seconds", "time a run waited for the device",
                               ["model", "priority"], buckets=BUCKETS, registry=r)
        self.compute = Histogram("npurun_serve_compute_duration_seconds", "time a run held the device",
                                 ["model"], buckets=BUCKETS, registry=r)
        self.latency = Histogram("npurun_serve_request_duration_seconds", "request received to response ready",
                                 ["model"], buckets=BUCKETS, registry=r)
        r.register(collector(devices))
        r.register(_Utilization(devices))

    def observe_run(self, model: str, task, items: int = 1) -> None:
        """Counters of one finished device run (a scheduler Task)."""
        self.executions.labels(model).inc()
        self.inferences.labels(model).inc(items)
        self.queue.labels(model, str(task.priority)).observe(task.queue_wait)
        self.compute.labels(model).observe(task.run_time)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _Utilization:
    """npurun_device_utilization: busy share of the units between two scrapes."""

    def __init__(self, devices):
        self.devices = devices
        self._monitors: dict[str, Monitor] = {}
        self._lock = threading.Lock()

    def collect(self):
        g = GaugeMetricFamily("npurun_device_utilization",
                              "share of time the compute units were busy since the previous scrape", labels=["device"])
        with self._lock:
            for d in self.devices():
                mon = self._monitors.setdefault(d.name, Monitor(d))
                g.add_metric([d.name], mon.sample()["utilization"])
        yield g
