"""Sparse better requests beside a batch (issue L): a high-priority ESPCN request every 1.1-1.6 s
(random) beside a low-priority DBNet-class detector back to back. The device is no longer
*contended* when each request comes (pieces.CONTENDED_S has passed), so the batch runs its long
nodes in pieces of pieces.LONG_S only (a task that had company lately); this measures what a
request then waits for the unit, and what the batch pays, for each --long value, the values
alternating request by request in one process.

    python bench/sched_sparse.py --batch ppocr_v4_det --duration 70 --long 0.004 0.002

Prints per value: the requests' preemption waits (p50, p90, max) and the batch's runs per
second over the gaps that value governed. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="ppocr_v4_det")
    ap.add_argument("--duration", type=float, default=70.0)
    ap.add_argument("--long", type=float, nargs="+", default=[0.004, 0.002], help="pieces.LONG_S values, seconds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tile", type=int, default=128)
    args = ap.parse_args()
    from models.fetch import fetch_member
    from sched_mixed import BATCHES

    import npurun
    from npurun.backends import pieces
    from npurun.commands.bench import machine
    exe = npurun.Executor("cpu", parallelism=args.threads)
    hi = npurun.load(ROOT / "npurun" / "zoo" / "espcn_x3.onnx")
    lo = npurun.load(fetch_member(*BATCHES[args.batch]))
    rng = np.random.default_rng(1)
    xhi = rng.random((1, 1, args.tile, args.tile), dtype=np.float32)
    xlo = rng.random((1, 3, 640, 640), dtype=np.float32)
    exe.run_sync(hi, xhi, priority=0), exe.run_sync(lo, xlo, priority=3)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}; ESPCN {args.tile}x{args.tile} "
          f"at priority 0 every 1.1-1.6 s beside {args.batch} 640x640 at priority 3, {args.threads} threads")
    stop, runs = threading.Event(), [0]

    def batch():
        while not stop.is_set():
            exe.run_sync(lo, xlo, priority=3)
            runs[0] += 1
    t = threading.Thread(target=batch)
    t.start()
    waits = {v: [] for v in args.long}
    share = {v: [0, 0.0] for v in args.long}
    saved = pieces.LONG_S
    t0, k = time.perf_counter(), 0
    try:
        while time.perf_counter() - t0 < args.duration:
            v = args.long[k % len(args.long)]
            pieces.LONG_S = v
            r0, g0 = runs[0], time.perf_counter()
            time.sleep(rng.uniform(1.1, 1.6))
            f = exe.submit(hi, xhi, priority=0)
            f.result()
            share[v][0] += runs[0] - r0
            share[v][1] += time.perf_counter() - g0
            waits[v].append(f.task.preempt_wait or 0.0)
            k += 1
    finally:
        stop.set()
        t.join()
        pieces.LONG_S = saved
    for v in args.long:
        w = np.array(waits[v]) * 1e3
        print(f"LONG_S {v * 1e3:4.1f} ms: {len(w)} requests, wait p50 {np.median(w):.2f}  p90 "
              f"{np.percentile(w, 90):.2f}  max {w.max():.2f} ms; batch {share[v][0] / share[v][1]:.2f} runs/s")


if __name__ == "__main__":
    main()
