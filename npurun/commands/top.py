"""`npurun top MODEL[@PRIORITY] ...`: run models side by side on one device and watch the
scheduler live: tasks, priorities, MAC density, utilization, temperature, frequency.

The view is redrawn in place on a terminal (rich Live); `--once` prints a single frame once
every model has finished a run (for scripts and tests). The scheduler lives in the process
that runs the models, so top runs the workload itself; `npurun top --url HOST:PORT` instead
watches a running server's scheduler through its /metrics (npurun.runtime.scrape).
"""
from __future__ import annotations

import threading
import time


def add_parser(sub):
    p = sub.add_parser("top", help="run models side by side and watch the scheduler live (or a server's: --url)")
    p.add_argument("workload", nargs="*", metavar="MODEL[@PRIORITY]",
                   help="a model to run over and over, with its priority (0 = highest; default 2)")
    p.add_argument("--url", help="watch the server at HOST:PORT (its /metrics) instead of running models")
    p.add_argument("--token-file", help="with --url: file holding the server's bearer token")
    p.add_argument("--shape", action="append", metavar="INPUT=DxDx..", help="shape of a symbolic input")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between redraws")
    p.add_argument("--once", action="store_true",
                   help="print one frame after every model ran once (with --url: after one interval), then stop")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="compute units (default: all cores)")
    p.set_defaults(fn=run)


def _workloads(specs):
    from ..errors import InputError
    out = []
    for spec in specs:
        model, _, prio = spec.rpartition("@") if "@" in spec else (spec, "", "2")
        if prio not in ("0", "1", "2", "3"):
            raise InputError(f"{spec}: the priority after @ must be 0, 1, 2 or 3")
        out.append((model, int(prio)))
    return out


def run(args) -> int:
    from ..errors import InputError
    if args.url:
        if args.workload:
            raise InputError("top: give models to run or --url of a server to watch, not both")
        return watch(args)
    if not args.workload:
        raise InputError("top: give a model to run (MODEL[@PRIORITY] ...) or --url HOST:PORT of a server")
    import numpy as np

    from ..frontend import load
    from ..runtime import Executor
    from ..runtime.metrics import Monitor
    from .profile import parse_shapes, random_inputs
    work = _workloads(args.workload)
    shapes = parse_shapes(args.shape)
    exe = Executor(args.device, parallelism=args.threads)
    rng = np.random.default_rng(0)
    jobs = []
    for model, prio in work:
        g = load(model)
        jobs.append((g, random_inputs(g, shapes, rng), prio))
        exe.compile(g)
    stop = threading.Event()
    runs = [0] * len(jobs)
    errors: list[str] = []

    def loop(k):
        g, feeds, prio = jobs[k]
        while not stop.is_set():
            try:
                exe.run_sync(g, feeds, priority=prio)
                runs[k] += 1
            except Exception as e:  # noqa: BLE001 -- shown in the view; the others go on
                errors.append(f"{g.name}: {e}")
                stop.set()
    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(len(jobs))]
    mon = Monitor(exe.dev)
    mon.sample()
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        if args.once:
            while min(runs) == 0 and not errors:
                time.sleep(0.02)
            _print(render(mon.sample(), runs, [g.name for g, _, _ in jobs], errors))
        else:
            from rich.live import Live
            with Live(render(mon.sample(), runs, [], errors), refresh_per_second=8, transient=False) as live:
                while not stop.is_set() and (args.duration is None or time.monotonic() - t0 < args.duration):
                    time.sleep(args.interval)
                    live.update(render(mon.sample(), runs, [g.name for g, _, _ in jobs], errors))
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for t in threads:
            t.join()
    return 1 if errors else 0


def _print(renderable):
    from rich.console import Console
    Console(width=120).print(renderable)


def _fmt_macs(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} "


def _latency(lat) -> str:
    """The device's preemption latency (the last 1024 waits of a better task for a unit)."""
    if not lat or not lat["count"]:
        return ""
    return f"  preempt latency p50 {lat['p50_s'] * 1e3:.1f} ms p99 {lat['p99_s'] * 1e3:.1f} ms"


def render(view: dict, runs=(), names=(), errors=()):
    """One frame: the device line, per-unit utilization, then one row per task."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    temp = view.get("temperature_c")
    freq = view.get("frequency_mhz")
    head = Text(
        f"{view['name']}  units {view['active_units']}/{view['units']}  duty {view['duty']:.0%}  "
        f"util {view['utilization']:.0%} [" + " ".join(f"{u:.0%}" for u in view["unit_utilization"]) + "]  "
        f"{_fmt_macs(view['macs_per_s'])}MAC/s"
        + (f" {view['macs_per_cycle']:.1f} MAC/cycle" if view.get("macs_per_cycle") else "")
        + f"  temp {'unknown' if temp is None else f'{temp:.1f} C'}"
        + f"  freq {'n/a' if freq is None else f'{freq:.0f} MHz'}"
        + f"  point {view.get('operating_point') or 'n/a'}"
        + f"  slices {view['slices_in_window']}  preemptions {view['preemptions_in_window']}"
        + _latency(view.get("preemption_latency")))
    t = Table(box=None, pad_edge=False)
    for col in ("id", "task", "prio", "state", "unit", "nodes", "MAC/s", "run s", "wait s", "slices", "preempt"):
        t.add_column(col, justify="left" if col in ("task", "state") else "right")
    live = [x for x in view["task_list"] if x["state"] != "done"]
    done = [x for x in view["task_list"] if x["state"] == "done"][:max(0, 12 - len(live))]
    for x in live + done:
        t.add_row(str(x["id"]), x["name"], str(x["priority"]), x["state"] if x["state"] != "done" else x["outcome"],
                  "-" if x["lane"] is None else str(x["lane"]), f"{x['steps_done']}/{x['steps_total']}",
                  _fmt_macs(x["macs_per_s"]), f"{x['run_s']:.3f}", f"{x['queue_wait_s']:.3f}",
                  str(x["slices"]), str(x["preemptions"]))
    parts = [head, t]
    if names:
        parts.append(Text("runs: " + ", ".join(f"{n} {r}" for n, r in zip(names, runs))))
    parts += [Text(f"error: {e}", style="red") for e in errors[:3]]
    gov = view.get("governor") or {}
    parts += [Text(f"governor: {e}", style="yellow") for e in gov.get("events", [])[-2:]]
    return Group(*parts)


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def render_remote(url: str, v: dict):
    """One frame of a server's view (npurun.runtime.scrape.view): a line per device, its live
    tasks, then a row per served model."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts = [Text(f"{url}")]
    for d in v["devices"]:
        util, temp, freq = d["unit_utilization"], d["temperature_c"], d["frequency_mhz"]
        parts.append(Text(
            f"{d['name']}  units {d['active_units']}/{d['units']}  duty {d['duty']:.0%}  "
            + (f"util {sum(util) / max(1, len(util)):.0%} [" + " ".join(f"{u:.0%}" for u in util) + "]  " if util else "")
            + (f"{_fmt_macs(d['macs_per_s'])}MAC/s  " if d["macs_per_s"] is not None else "")
            + f"temp {'unknown' if temp is None else f'{temp:.1f} C'}  "
            + f"freq {'n/a' if freq is None else f'{freq:.0f} MHz'}  "
            + f"running {d['running']} waiting {d['waiting']}  slices {d['slices']:.0f} preemptions "
            f"{d['preemptions']:.0f}  holds {d['admission_holds']:.0f}"
            + (f"  preempt latency p50 {_ms(d['latency_p50'])} ms p99 {_ms(d['latency_p99'])} ms "
               f"({d['latency_count']:.0f} since start)" if d["latency_count"] else "")))
        if d["tasks"]:
            t = Table(box=None, pad_edge=False)
            for col in ("task", "prio", "MAC/s", "wait s"):
                t.add_column(col, justify="left" if col == "task" else "right")
            for name, prio, macs, wait in d["tasks"]:
                t.add_row(name, str(prio), _fmt_macs(macs), f"{wait:.3f}")
            parts.append(t)
    if v["models"]:
        t = Table(box=None, pad_edge=False)
        for col in ("model", "req/s", "requests", "failed", "inferences", "runs", "p50 ms", "p99 ms", "queue p99 ms by prio"):
            t.add_column(col, justify="left" if col in ("model", "queue p99 ms by prio") else "right")
        for x in v["models"]:
            t.add_row(x["model"], "-" if x["requests_per_s"] is None else f"{x['requests_per_s']:.1f}",
                      f"{x['requests']:.0f}", f"{x['failures']:.0f}", f"{x['inferences']:.0f}", f"{x['executions']:.0f}",
                      _ms(x["p50"]), _ms(x["p99"]),
                      " ".join(f"{p}:{_ms(q)}" for p, q in sorted(x["queue_p99"].items())))
        parts.append(t)
    elif not v["devices"]:
        parts.append(Text("no npurun metrics at this address", style="yellow"))
    return Group(*parts)


def watch(args) -> int:
    """`npurun top --url`: a frame every --interval from two scrapes of the server's /metrics."""
    from ..runtime.scrape import metrics_url, scrape, view
    from .serve import read_token
    url = metrics_url(args.url)
    token = read_token(args.token_file) if args.token_file else None
    prev, t_prev = scrape(url, token), time.monotonic()
    if args.once:
        time.sleep(args.interval)
        cur, t = scrape(url, token), time.monotonic()
        _print(render_remote(url, view(prev, cur, t - t_prev)))
        return 0
    from rich.live import Live
    t0 = t_prev
    try:
        with Live(render_remote(url, view(None, prev, 1.0)), refresh_per_second=8, transient=False) as live:
            while args.duration is None or time.monotonic() - t0 < args.duration:
                time.sleep(args.interval)
                cur, t = scrape(url, token), time.monotonic()
                live.update(render_remote(url, view(prev, cur, t - t_prev)))
                prev, t_prev = cur, t
    except KeyboardInterrupt:
        pass
    return 0
