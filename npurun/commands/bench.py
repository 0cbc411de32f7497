"""`npurun bench MODEL`: latency and throughput of a model, side by side with a peer.

After one warm-up run each, npurun and the peer (ONNX Runtime's CPU provider) run
alternately in this one process, so machine noise hits both alike. The report is the one
OpenVINO's benchmark_app prints (Count, Duration, Latency median/average/min/max, p90/p99,
Throughput) for each, then the ratio npurun/peer (lower is better), the achieved GFLOP/s and
its fraction of this machine's single-precision GEMM peak, measured here with NumPy's BLAS
at the same thread count. `--json PATH` writes the same numbers. Nothing is asserted.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..util import cpu_model


def add_parser(sub):
    p = sub.add_parser("bench", help="latency/throughput of a model, side by side with ONNX Runtime")
    p.add_argument("model")
    p.add_argument("--device", default="cpu", help="npurun device (default: cpu)")
    p.add_argument("--threads", type=int, default=None, help="threads for both runtimes (default: all cores)")
    p.add_argument("--vs", choices=["onnxruntime", "none"], default="onnxruntime", help="the peer (default: onnxruntime)")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input (default: random)")
    p.add_argument("--shape", action="append", metavar="NAME=1x3x224x224", help="shape of a random input")
    p.add_argument("-t", "--time", type=float, default=10.0, help="seconds of alternating runs (default: 10)")
    p.add_argument("--min-runs", type=int, default=5, help="at least this many runs each (default: 5)")
    p.add_argument("--json", metavar="PATH", help="write the numbers as JSON")
    p.set_defaults(fn=cmd_bench)


# ---------------------------------------------------------------- the measurement (also used by bench/)

def sgemm_peak(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """Measured single-precision GEMM peak of this machine, GFLOP/s: best of `repeats` square
    n x n float32 matmuls through NumPy's BLAS limited to `threads` threads."""
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(0)
    a, b = (rng.random((n, n), dtype=np.float32) for _ in range(2))
    with threadpool_limits(limits=threads, user_api="blas"):
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# Pause after every timed call: ONNX Runtime's worker threads keep spinning after a run
# (npurun's conv pool for 0.3 ms), and on a 2-core machine the next runtime's call would
# otherwise start with a core taken by the previous one's spinners. 30 ms was not enough for
# a 2-thread ORT session: npurun's 2-thread MobileNetV2 (Keras) took 21-25 ms run 30 ms after
# an ORT run, 12-13 ms after 60 or 100 ms, 12.1 ms with no ORT run between (2026-12-01).
SETTLE_S = 0.1


def alternate(runners: dict, seconds: float, min_runs: int, settle_s: float = SETTLE_S) -> dict[str, list[float]]:
    """One warm-up call each, then rounds of one call each (each followed by `settle_s` of
    idle time, not timed) until `seconds` have passed and every runner has `min_runs` times.
    Returns seconds per call."""
    for f in runners.values():
        f()
    times = {k: [] for k in runners}
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or min(len(v) for v in times.values()) < min_runs:
        for k, f in runners.items():
            times[k].append(_timed(f))
            if settle_s:
                time.sleep(settle_s)
    return times


def summary(ts: list[float], flops: float, peak: float) -> dict:
    ms = sorted(t * 1e3 for t in ts)
    pct = lambda q: float(np.percentile(ms, q))  # noqa: E731
    med = statistics.median(ms)
    return {"count": len(ms), "duration_ms": sum(ms), "median_ms": med, "average_ms": statistics.fmean(ms),
            "min_ms": ms[0], "max_ms": ms[-1], "p90_ms": pct(90), "p99_ms": pct(99),
            "throughput_fps": 1e3 / med if med else 0.0,
            "gflops": flops / med / 1e6 if med else 0.0,
            "fraction_of_sgemm_peak": flops / med / 1e6 / peak if med and peak else 0.0}


def report(name: str, s: dict) -> str:
    return "\n".join([
        f"[ {name} ]",
        f"  Count:          {s['count']} iterations",
        f"  Duration:       {s['duration_ms']:.2f} ms",
        "  Latency:",
        f"     Median:      {s['median_ms']:.2f} ms",
        f"     Average:     {s['average_ms']:.2f} ms",
        f"     Min:         {s['min_ms']:.2f} ms",
        f"     Max:         {s['max_ms']:.2f} ms",
        f"     p90:         {s['p90_ms']:.2f} ms",
        f"     p99:         {s['p99_ms']:.2f} ms",
        f"  Throughput:     {s['throughput_fps']:.2f} FPS",
        f"  Compute:        {s['gflops']:.1f} GFLOP/s ({100 * s['fraction_of_sgemm_peak']:.0f}% of measured sgemm peak)",
    ])


def ort_session(model, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def compare(model, graph, feeds: dict, device: str, threads: int, vs: str | None, seconds: float,
            min_runs: int, runners_extra: dict | None = None) -> dict:
    """Benchmark npurun (and the peer) on `feeds`; the numbers as a dict (see --json)."""
    from .. import __version__
    from ..ir.cost import node_costs
    from ..runtime import Executor
    exe = Executor(device, parallelism=threads)
    exe.compile(graph)
    runners = {"npurun": lambda: exe.run_sync(graph, feeds)}
    versions = {"npurun": __version__, "numpy": np.__version__}
    if vs == "onnxruntime":
        import onnxruntime as ort
        sess = ort_session(model, threads)
        ort_feeds = {k: v for k, v in feeds.items()}
        runners["onnxruntime"] = lambda: sess.run(None, ort_feeds)
        versions["onnxruntime"] = ort.__version__
    runners.update(runners_extra or {})
    shapes = {k: np.shape(v) for k, v in feeds.items()}
    flops = 2.0 * sum(c.macs for c in node_costs(graph, shapes))
    peak = sgemm_peak(threads)
    times = alternate(runners, seconds, min_runs)
    res = {"model": str(model), "device": device, "threads": threads, "date": time.strftime("%Y-%m-%d"),
           "machine": machine(), "versions": versions, "gflop_per_run": flops / 1e9,
           "sgemm_peak_gflops": peak, "results": {k: summary(v, flops, peak) for k, v in times.items()}}
    if "onnxruntime" in res["results"]:
        r = res["results"]
        res["ratio_npurun_over_peer"] = r["npurun"]["median_ms"] / r["onnxruntime"]["median_ms"]
    return res


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()}"


# ---------------------------------------------------------------- the command

def random_feeds(graph, shapes: dict[str, tuple], given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fresh random inputs (never zeros) for the inputs not given: floats ~ N(0, 1), integers in
    [1, 100) (0/1 for an input named like a mask), booleans random."""
    from ..ir.dtypes import to_numpy
    rng = np.random.default_rng(0)
    feeds = dict(given)
    for name in graph.inputs:
        if name in feeds:
            continue
        v = graph.values[name]
        shape = shapes.get(name) or tuple(d if isinstance(d, int) else None for d in v.shape)
        if None in shape:
            raise InputError(f"{graph.source}: input {name!r} has symbolic shape {list(v.shape)}; "
                             f"give it with --shape {name}=" + "x".join(str(d) if isinstance(d, int) else "N" for d in v.shape))
        dt = to_numpy(v.dtype)
        if dt.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        elif dt.kind in "iu":
            feeds[name] = (np.ones(shape) if "mask" in name else rng.integers(1, 100, shape)).astype(dt)
        else:
            raise InputError(f"{graph.source}: input {name!r} ({v.dtype}): give it with --input {name}=FILE.npy")
    return feeds


def _parse_shape(spec: str) -> tuple[str, tuple]:
    name, sep, dims = spec.partition("=")
    try:
        return name, tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise InputError(f"--shape {spec!r}: expected NAME=D0xD1x...") from None


def cmd_bench(args) -> int:
    from ..cli import _load_array
    from ..frontend import load
    path = Path(args.model)
    if args.vs == "onnxruntime" and path.suffix != ".onnx":
        raise InputError(f"{path}: --vs onnxruntime needs an .onnx model (or pass --vs none)")
    graph = load(path)
    threads = args.threads or os.cpu_count() or 1
    given = dict(_load_array(s) for s in args.input or [])
    shapes = dict(_parse_shape(s) for s in args.shape or [])
    feeds = random_feeds(graph, shapes, given)
    res = compare(path, graph, feeds, args.device, threads, None if args.vs == "none" else args.vs,
                  args.time, args.min_runs)
    print(f"# {path.name}: {res['gflop_per_run']:.2f} GFLOP per run; {res['machine']}; threads={threads}; "
          f"sgemm peak {res['sgemm_peak_gflops']:.0f} GFLOP/s; " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()))
    for name, s in res["results"].items():
        print(report(name, s))
    if "ratio_npurun_over_peer" in res:
        print(f"ratio npurun/onnxruntime (median latency, lower is better): {res['ratio_npurun_over_peer']:.2f}")
    if args.json:
        from ..util import atomic_write
        atomic_write(Path(args.json), json.dumps(res, indent=2).encode())
        print(f"wrote {args.json}")
    return 0
