"""Reading a server's scheduler back from its Prometheus /metrics (`npurun top --url`).

A server's scheduler lives in the server's process; what it exports (npurun.serve.metrics,
npurun.runtime.metrics) is scraped here (`scrape`) and two scrapes become what a frame shows
(`view`): per device the rates between them, the live tasks, and one row per served model.

Quantiles come from the histograms' buckets, interpolated inside a bucket as Prometheus's
histogram_quantile does, over everything since the server started (a window of half a second
holds too few requests for a p99).
"""
from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from ..errors import InputError


def metrics_url(url: str) -> str:
    """The /metrics address of a server given as host:port, http://host:port or a full URL."""
    if "://" not in url:
        url = "http://" + url
    p = urllib.parse.urlsplit(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise InputError(f"--url {url}: expected http://HOST:PORT of an npurun server")
    return urllib.parse.urlunsplit((p.scheme, p.netloc, p.path if p.path not in ("", "/") else "/metrics", "", ""))


def scrape(url: str, token: str | None = None, timeout: float = 5.0) -> dict:
    """{(sample name, sorted label items): value} of one GET of `url` (Prometheus text)."""
    from prometheus_client.parser import text_string_to_metric_families
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        hint = " (it wants a bearer token: --token-file)" if e.code == 401 else ""
        raise InputError(f"{url}: the server answered {e.code} {e.reason}{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        raise InputError(f"{url}: cannot read the metrics ({getattr(e, 'reason', e)})") from None
    try:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}
    except ValueError as e:
        raise InputError(f"{url}: expected Prometheus text metrics ({e})") from None


def _get(m: dict, name: str, **labels) -> dict:
    """{labels dict as a tuple of the other labels: value} of the samples of `name` matching `labels`."""
    out = {}
    for (n, lab), v in m.items():
        d = dict(lab)
        if n == name and all(d.get(k) == x for k, x in labels.items()):
            out[tuple((k, x) for k, x in lab if k not in labels)] = v
    return out


def _one(m: dict, name: str, **labels):
    vals = list(_get(m, name, **labels).values())
    return sum(vals) if vals else None


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram [(upper bound, count)], linear in a bucket
    (Prometheus's histogram_quantile); None when it is empty. Above the last finite bound it
    answers that bound (all that is known)."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lo_b, lo_c = 0.0, 0.0
    for b, c in buckets:
        if c >= rank:
            if b == float("inf"):
                return lo_b
            return lo_b + (b - lo_b) * ((rank - lo_c) / (c - lo_c) if c > lo_c else 1.0)
        lo_b, lo_c = b, c
    return lo_b


def _hist(m: dict, name: str, **labels) -> list[tuple[float, float]]:
    got: dict[float, float] = {}
    for lab, v in _get(m, name + "_bucket", **labels).items():
        le = dict(lab).get("le")
        if le is not None:
            b = float(le)
            got[b] = got.get(b, 0.0) + v
    return sorted(got.items())


def view(prev: dict | None, cur: dict, dt: float) -> dict:
    """What a frame shows, from two scrapes `dt` seconds apart (prev None: the first)."""
    prev = prev or {}
    devices = []
    for lab in _get(cur, "npurun_device_units"):
        dev = dict(lab)["device"]

        def delta(name, **lb):
            return (_one(cur, name, device=dev, **lb) or 0.0) - (_one(prev, name, device=dev, **lb) or 0.0)
        units = int(_one(cur, "npurun_device_units", device=dev) or 0)
        busy = [delta("npurun_device_busy_seconds_total", unit=str(u)) for u in range(units)]
        lat = _hist(cur, "npurun_device_preemption_latency_seconds", device=dev)
        devices.append({
            "name": dev, "units": units, "active_units": int(_one(cur, "npurun_device_active_units", device=dev) or 0),
            "duty": _one(cur, "npurun_device_duty_cycle", device=dev) or 0.0,
            "unit_utilization": [min(1.0, max(0.0, b / dt)) for b in busy] if prev else [],
            "macs_per_s": delta("npurun_device_macs_total") / dt if prev else None,
            "temperature_c": _one(cur, "npurun_device_temperature_celsius", device=dev),
            "frequency_mhz": _one(cur, "npurun_device_frequency_mhz", device=dev),
            "operating_point": _one(cur, "npurun_device_operating_point", device=dev),
            "running": int(_one(cur, "npurun_tasks_running", device=dev) or 0),
            "waiting": int(_one(cur, "npurun_tasks_waiting", device=dev) or 0),
            "slices": delta("npurun_device_slices_total"), "preemptions": delta("npurun_device_preemptions_total"),
            "admission_holds": _one(cur, "npurun_device_admission_holds_total", device=dev) or 0,
            "latency_count": _one(cur, "npurun_device_preemption_latency_seconds_count", device=dev) or 0,
            "latency_p50": quantile(0.5, lat), "latency_p99": quantile(0.99, lat),
            "tasks": sorted(((dict(lab)["task"], int(dict(lab)["priority"]), v,
                              _one(cur, "npurun_task_queue_wait_seconds", device=dev, **dict(lab)) or 0.0)
                             for lab, v in _get(cur, "npurun_task_macs_per_second", device=dev).items()),
                            key=lambda t: (t[1], t[0]))})
    models = []
    for lab, n in sorted(_get(cur, "npurun_serve_requests_total").items()):
        model = dict(lab)["model"]
        if not model:
            continue  # requests for unknown models
        req = _hist(cur, "npurun_serve_request_duration_seconds", model=model)
        models.append({
            "model": model, "requests": n,
            "requests_per_s": (n - (_one(prev, "npurun_serve_requests_total", model=model) or 0.0)) / dt if prev else None,
            "failures": _one(cur, "npurun_serve_request_failures_total", model=model) or 0,
            "inferences": _one(cur, "npurun_serve_inferences_total", model=model) or 0,
            "executions": _one(cur, "npurun_serve_executions_total", model=model) or 0,
            "p50": quantile(0.5, req), "p99": quantile(0.99, req),
            "queue_p99": {int(dict(lb)["priority"]): quantile(0.99, _hist(cur, "npurun_serve_queue_duration_seconds",
                                                                          model=model, priority=dict(lb)["priority"]))
                          for lb in _get(cur, "npurun_serve_queue_duration_seconds_count", model=model)}})
    return {"devices": devices, "models": models}
