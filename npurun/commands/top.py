"""`npurun top MODEL[@PRIORITY] ...`: run models side by side on one device and watch the
scheduler live: tasks, priorities, MAC density, utilization, temperature, frequency.

The view is redrawn in place on a terminal (rich Live); `--once` prints a single frame once
every model has finished a run (for scripts and tests). The scheduler lives in the process
that runs the models, so top runs the workload itself; the inference server (issue I) will
serve the same numbers as Prometheus metrics (npurun.runtime.metrics).
"""
from __future__ import annotations

import threading
import time


def add_parser(sub):
    p = sub.add_parser("top", help="run models side by side and watch the scheduler live")
    p.add_argument("workload", nargs="+", metavar="MODEL[@PRIORITY]",
                   help="a model to run over and over, with its priority (0 = highest; default 2)")
    p.add_argument("--shape", action="append", metavar="INPUT=DxDx..", help="shape of a symbolic input")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between redraws")
    p.add_argument("--once", action="store_true", help="print one frame after every model ran once, then stop")
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
