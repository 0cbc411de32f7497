"""What running as pieces costs a model (issue L): each corpus model alone, its nodes whole
against the same runs as on a contended device (every node that can, in pieces of ~1 ms with a
preemption point between them), alternating run by run in one process.

    python bench/pieces_cost.py --only ppocr_v4_det,segformer_b0 [--runs 21] [--threads 2] [--nodes 8]

Prints the median of each side, their ratio (contended / whole: what a background task pays
for letting better tasks in within a piece), and with --nodes the nodes that lose the most
(per-node times from a profiled run of each side, medians). Nothing is asserted.
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", required=True, help="corpus model names, comma-separated")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=0, help="show the N nodes that lose the most")
    args = ap.parse_args()
    import corpus

    import npurun
    from npurun.commands.bench import machine
    from npurun.runtime import scheduler
    # The one thing switched: whether the scheduler tells this task's kernels that the device is
    # contended (Scheduler._wants_pieces, asked by backends/pieces.py). A second task to make it
    # so would share the machine and measure the sharing, not the pieces.
    contended = [False]
    scheduler.Scheduler._wants_pieces = lambda self, task: contended[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}; {args.threads} threads, "
          f"{args.runs} runs a side, alternating")
    exe = npurun.Executor("cpu", parallelism=args.threads)
    for name in args.only.split(","):
        spec = corpus.BY_NAME[name]
        g, feeds = npurun.load(corpus.path(name)), spec.feeds()
        for _ in range(3):
            exe.run_sync(g, feeds)
        times = {False: [], True: []}
        nodes = {False: collections.defaultdict(list), True: collections.defaultdict(list)}
        for _ in range(args.runs):
            for side in (False, True):
                contended[0] = side
                t = time.perf_counter()
                exe.run_sync(g, feeds)
                times[side].append(time.perf_counter() - t)
                if args.nodes:
                    f = exe.submit(g, feeds, profile=True)
                    f.result()
                    for _, label, _, t0, t1 in f.task.trace:
                        nodes[side][label].append(t1 - t0)
        w, c = np.median(times[False]), np.median(times[True])
        print(f"{name:24s} whole {w * 1e3:8.2f} ms  contended {c * 1e3:8.2f} ms  ratio {c / w:.3f}")
        if args.nodes:
            rows = sorted(((np.median(nodes[True][k]) - np.median(v), k, np.median(v), np.median(nodes[True][k]))
                           for k, v in nodes[False].items()), reverse=True)
            for d, label, a, b in rows[:args.nodes]:
                print(f"    {d * 1e3:+6.2f} ms  {a * 1e3:6.2f} -> {b * 1e3:6.2f}  {label}")


if __name__ == "__main__":
    main()
