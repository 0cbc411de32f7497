"""ESPCN x3, 720p -> 4K on the cpu backend: the unsplit graph vs the same graph cascaded in row
bands (passes/split_bands.py) at several workspace sizes, run alternately in one process.

    python bench/espcn_cascade.py [--repeat 7] [--workspaces 4,8,16,32,64] [--threads 2]

For each variant: the band count, median seconds per frame, the ratio to the unsplit run
(< 1 is faster), the peak bytes the run allocates (tracemalloc, one extra run), and the
largest output difference to the unsplit output relative to its largest value. Timings are
printed, never asserted. The numbers in docs/memory.md come from this script.
"""
from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np

import npurun
from npurun import Executor

MODEL = Path(npurun.__file__).parent / "zoo" / "espcn_x3.onnx"
MB = 2 ** 20


def peak_mb(exe, g, feeds) -> float:
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    exe.run_sync(g, feeds)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak / MB


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--workspaces", default="4,8,16,32,64", help="workspace sizes in MB, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--width", type=int, default=1280)
    a = ap.parse_args(argv)
    g = npurun.load(MODEL)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.random((1, 1, a.height, a.width), dtype=np.float32)}
    variants = {"unsplit": Executor("cpu", parallelism=a.threads, cascade=False)}
    for ws in [float(w) for w in a.workspaces.split(",")]:
        variants[f"ws={ws:g}MB"] = Executor("cpu", parallelism=a.threads, workspace_mb=ws)
    ref = variants["unsplit"].run_sync(g, feeds)["output"]
    scale = float(np.abs(ref).max())
    diffs, bands = {}, {}
    for name, exe in variants.items():  # warm up: compile, plan, pack weights
        out = exe.run_sync(g, feeds)["output"]
        diffs[name] = float(np.abs(out - ref).max()) / scale
        _, plan = exe.planned(g, feeds)
        bands[name] = (plan.split or [{"bands": 1}])[0]["bands"] if plan else 1
    times = {k: [] for k in variants}
    for _ in range(a.repeat):  # alternate the variants so drift hits them all alike
        for name, exe in variants.items():
            t = time.perf_counter()
            exe.run_sync(g, feeds)
            times[name].append(time.perf_counter() - t)
    peaks = {name: peak_mb(exe, g, feeds) for name, exe in variants.items()}
    base = statistics.median(times["unsplit"])
    print(f"ESPCN x3 {a.width}x{a.height} -> {3 * a.width}x{3 * a.height}, cpu backend, {a.threads} threads, "
          f"median of {a.repeat}")
    print(f"{'variant':<12} {'bands':>5} {'s/frame':>8} {'ratio':>6} {'peak MB':>8} {'max rel diff':>12}")
    for name in variants:
        med = statistics.median(times[name])
        print(f"{name:<12} {bands[name]:>5} {med:>8.3f} {med / base:>6.2f} {peaks[name]:>8.1f} {diffs[name]:>12.2e}")
    for e in variants.values():
        e.close()


if __name__ == "__main__":
    main()
