"""`npurun profile MODEL [--device D] --trace out.json [--png out.png]`: where the time goes.

Runs the model through the Executor's scheduler with per-node timing (each node's time is
the gap between two slice boundaries, so it is the node's wall time on its compute unit),
then prints a per-node table (time, share, MACs, GFLOP/s, precision, memory space), writes a
Chrome trace (chrome://tracing or ui.perfetto.dev: one track per compute unit, slices named
by node, args with op, shapes, precision) and optionally a timeline picture (Pillow).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("profile", help="per-node profile table, Chrome trace and timeline picture")
    p.add_argument("model")
    p.add_argument("--trace", required=True, metavar="OUT.json", help="Chrome trace output")
    p.add_argument("--png", metavar="OUT.png", help="timeline picture output")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input (default: random)")
    p.add_argument("--shape", action="append", metavar="INPUT=DxDx..", help="shape of a random input (for symbolic dims)")
    p.add_argument("--runs", type=int, default=3, help="timed runs after one warm-up (default 3)")
    p.add_argument("--concurrent", type=int, default=1, help="copies run at once (shows several compute units)")
    p.add_argument("--top", type=int, default=25, help="rows of the table, slowest first (0: all)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="compute units (default: all cores)")
    p.set_defaults(fn=run)


# ---------------------------------------------------------------- inputs (shared with top)

def parse_shapes(items) -> dict[str, tuple]:
    from ..errors import InputError
    out = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            out[name] = tuple(int(d) for d in dims.lower().replace(",", "x").split("x"))
        except ValueError:
            raise InputError(f"--shape {item!r}: expected INPUT=DxDx.., e.g. x=1x3x640x640") from None
        if not sep or not name or any(d < 0 for d in out[name]):
            raise InputError(f"--shape {item!r}: expected INPUT=DxDx.., e.g. x=1x3x640x640")
    return out


def random_inputs(graph, shapes: dict, rng) -> dict:
    """Random inputs of the graph's dtypes; symbolic dims come from `shapes`."""
    import numpy as np

    from ..errors import InputError
    from ..ir.dtypes import to_numpy
    from ..ir.shapes import format_shape
    feeds = {}
    for name in graph.inputs:
        v = graph.values[name]
        shape = shapes.get(name) or tuple(v.shape)
        if any(not isinstance(d, int) for d in shape):
            raise InputError(f"{graph.source}: input {name!r} has shape {format_shape(v.shape)}; "
                             f"give its dims with --shape {name}=" + "x".join(
                                 str(d) if isinstance(d, int) else "N" for d in v.shape))
        dt = to_numpy(v.dtype)
        if dt.kind == "f":
            feeds[name] = rng.random(shape, dtype=np.float32).astype(dt)
        elif dt.kind in "iu":
            feeds[name] = rng.integers(0, 8, shape).astype(dt)
        elif dt.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        else:
            raise InputError(f"{graph.source}: input {name!r} ({v.dtype}): pass it with --input {name}=FILE.npy")
    return feeds


# ---------------------------------------------------------------- profile

def profile(exe, graph, feeds, runs=3, concurrent=1):
    """Per-step rows and trace events of `runs` timed runs (after one warm-up)."""
    import numpy as np

    from ..ir.cost import concrete_values
    shapes = {k: a.shape for k, a in feeds.items() if isinstance(a, np.ndarray)}
    # The program the runs execute: planned for these shapes, which may split a chain into
    # bands (more steps than the compiled graph; rows were misattributed, then an IndexError).
    program, _plan = exe.planned(graph, feeds)
    exe.run_sync(graph, feeds)
    traces = []
    for _ in range(runs):
        futs = [exe.submit(graph, feeds, profile=True) for _ in range(concurrent)]
        for f in futs:
            f.result()
            traces.append((f.task.id, f.task.trace))
    macs = exe.step_macs(program, feeds)
    lowered = program.graph
    vals = concrete_values(lowered, shapes)
    rows = []
    for i, (n, _fn, _attrs, _dead) in enumerate(program.steps):
        op = n.full_op + (f"+{n.attrs['activation']}" if n.attrs.get("activation") else "")

        def shp(nm):
            v = vals.get(nm) if nm else None
            if v is None:
                return None
            return [d if isinstance(d, int) else str(d) for d in v.shape]
        times = [tr[i][4] - tr[i][3] for _, tr in traces if i < len(tr)]
        outv = lowered.values.get(n.outputs[0]) if n.outputs else None
        rows.append({"step": i, "node": n.name or f"#{i}", "op": op,
                     "time_s": statistics.median(times) if times else 0.0, "macs": macs[i],
                     "precision": n.precision or (outv.dtype if outv is not None else "?"),
                     "space": outv.space if outv is not None else "?",
                     "inputs": [shp(x) for x in n.inputs], "outputs": [shp(x) for x in n.outputs]})
    return rows, traces


def chrome_trace(rows, traces, units: int, name: str, width: int = 1) -> dict:
    """A slice on lane L holds units L*width .. L*width+width-1: it is drawn on each of their tracks."""
    t0 = min((tr[0][3] for _, tr in traces if tr), default=0.0)
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": f"npurun {name}"}}]
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": u, "args": {"name": f"compute unit {u}"}}
               for u in range(units)]
    for task_id, tr in traces:
        for step, label, lane, a, b in tr:
            r = rows[step]
            for unit in range(lane * width, lane * width + width):
                events.append({"ph": "X", "name": r["node"], "cat": r["op"], "pid": 1, "tid": unit,
                               "ts": (a - t0) * 1e6, "dur": (b - a) * 1e6,
                               "args": {"op": r["op"], "task": task_id, "inputs": r["inputs"], "outputs": r["outputs"],
                                        "precision": r["precision"], "memory": r["space"], "macs": r["macs"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def timeline_png(rows, traces, units: int, path: Path, title: str, width_units: int = 1):
    """Compute units as rows, nodes as boxes coloured by op, a time axis and a legend."""
    import colorsys
    import zlib

    from PIL import Image, ImageDraw
    spans = [(unit, a, b, rows[step]["op"]) for _, tr in traces for step, _l, lane, a, b in tr
             for unit in range(lane * width_units, lane * width_units + width_units)]
    t0 = min((s[1] for s in spans), default=0.0)
    t1 = max((s[2] for s in spans), default=1.0)
    width, left, row_h, top = 1600, 110, 46, 40
    ops = sorted({s[3] for s in spans}, key=lambda o: -sum(b - a for _, a, b, op in spans if op == o))
    legend_rows = (len(ops[:16]) + 3) // 4
    height = top + units * row_h + 50 + legend_rows * 22
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)

    def colour(op):
        h = (zlib.crc32(op.encode()) % 360) / 360
        r, g, b = colorsys.hsv_to_rgb(h, 0.55, 0.9)
        return int(r * 255), int(g * 255), int(b * 255)
    scale = (width - left - 20) / max(1e-9, t1 - t0)
    d.text((10, 10), f"{title}  ({(t1 - t0) * 1000:.1f} ms)", fill="black")
    for u in range(units):
        y = top + u * row_h
        d.text((10, y + 14), f"unit {u}", fill="black")
        d.line([(left, y + row_h - 4), (width - 20, y + row_h - 4)], fill=(220, 220, 220))
    for lane, a, b, op in spans:
        x0, x1 = left + (a - t0) * scale, left + (b - t0) * scale
        y = top + lane * row_h
        d.rectangle([x0, y + 4, max(x0 + 1, x1), y + row_h - 8], fill=colour(op), outline="white")
    axis_y = top + units * row_h + 4
    d.line([(left, axis_y), (width - 20, axis_y)], fill="black")
    for k in range(11):
        x = left + k * (width - left - 20) / 10
        d.line([(x, axis_y), (x, axis_y + 5)], fill="black")
        d.text((x - 12, axis_y + 8), f"{(t1 - t0) * 1000 * k / 10:.1f}", fill="black")
    d.text((width - 60, axis_y + 22), "ms", fill="black")
    for k, op in enumerate(ops[:16]):
        x, y = 10 + (k % 4) * 380, axis_y + 40 + (k // 4) * 22
        d.rectangle([x, y, x + 14, y + 14], fill=colour(op))
        d.text((x + 20, y + 2), op, fill="black")
    img.save(path)


def run(args) -> int:
    import numpy as np

    from ..cli import _load_array
    from ..errors import InputError
    from ..frontend import load
    from ..runtime import Executor
    from ..util import atomic_write
    if args.runs < 1 or args.concurrent < 1:
        raise InputError("--runs and --concurrent must be at least 1")
    graph = load(args.model)
    feeds = random_inputs(graph, parse_shapes(args.shape), np.random.default_rng(0)) \
        if not args.input else {}
    feeds.update(dict(_load_array(s) for s in args.input or []))
    exe = Executor(args.device, parallelism=args.threads)
    rows, traces = profile(exe, graph, feeds, args.runs, args.concurrent)
    total = sum(r["time_s"] for r in rows) or 1e-12
    shown = sorted(rows, key=lambda r: -r["time_s"])
    shown = shown[:args.top] if args.top else shown
    hdr = ("node", "op", "ms", "share", "MMACs", "GFLOP/s", "prec", "memory")
    table = [(r["node"], r["op"], f"{r['time_s'] * 1e3:.3f}", f"{r['time_s'] / total:.1%}", f"{r['macs'] / 1e6:.2f}",
              f"{2 * r['macs'] / r['time_s'] / 1e9:.2f}" if r["time_s"] > 0 else "-", r["precision"], r["space"])
             for r in shown]
    w = [max(len(x[k]) for x in table + [hdr]) for k in range(len(hdr))]
    print("  ".join(h.ljust(w[k]) if k < 2 else h.rjust(w[k]) for k, h in enumerate(hdr)))
    for x in table:
        print("  ".join(c.ljust(w[k]) if k < 2 else c.rjust(w[k]) for k, c in enumerate(x)))
    macs = sum(r["macs"] for r in rows)
    print(f"{len(rows)} nodes ({len(shown)} shown), {total * 1e3:.2f} ms per run (median per node over "
          f"{args.runs} runs), {macs / 1e9:.3f} GMACs, {2 * macs / total / 1e9:.2f} GFLOP/s on {exe.device} "
          f"({exe.parallelism} units)")
    sch = exe.scheduler
    trace = chrome_trace(rows, traces, sch.units, Path(args.model).name, sch.width)
    atomic_write(Path(args.trace), json.dumps(trace).encode())
    print(f"trace: {args.trace} ({len(trace['traceEvents'])} events; open in ui.perfetto.dev or chrome://tracing)")
    if args.png:
        timeline_png(rows, traces, sch.units, Path(args.png), Path(args.model).name, sch.width)
        print(f"timeline: {args.png}")
    return 0
