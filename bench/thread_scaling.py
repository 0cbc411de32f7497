"""Which nodes of a corpus model do not speed up from 1 to 2 threads (or get slower).

    python bench/thread_scaling.py --only wav2vec2_base,regnet_y [--runs 5] [--all]

Each model runs under the cpu backend's profiler (`cpu/profile.py`: every step timed, medians
of `--runs` runs) with an Executor of 1 and then of 2 threads, in this process; the table
lists, per op type (per node with --all), the time at each thread count and the speedup, for
those taking at least 2% of the 1-thread run and keeping more than 60% of their time at 2
threads. Found this way (2026-12-05): 1-D convs the rule ran on one thread (the implicit GEMM
splits output rows, and a 1-D conv has one) and grouped convs paying a fork-join per group.
Hot runs, one after another: a node's own scaling, not the cold protocol of `corpus.py`.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]


def main() -> int:
    import corpus

    import npurun
    from npurun.backends.cpu.profile import profile
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="comma-separated corpus model names")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--all", action="store_true", help="one line per node, not per op type")
    args = ap.parse_args()
    for name in args.only.split(","):
        spec = corpus.BY_NAME.get(name)
        if spec is None:
            print(f"{name}: not a corpus model (python bench/corpus.py --list)", file=sys.stderr)
            return 2
        feeds, graph = spec.feeds(), npurun.load(corpus.path(name))
        rows, whole = {}, {}
        for t in (1, 2):
            exe = npurun.Executor("cpu", parallelism=t)
            exe.run_sync(graph, feeds)  # (compiled, planned and its convs tuned for these shapes)
            rows[t], whole[t] = profile(exe.planned(graph, feeds)[0], feeds, args.runs)
        print(f"== {name}: 1 thread {whole[1]:.2f} ms, 2 threads {whole[2]:.2f} ms ({whole[1] / whole[2]:.2f}x)")
        acc: dict = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for (label, op, t1), (_, _, t2) in zip(rows[1], rows[2]):
            key = f"{op} {label}" if args.all else op
            acc[key][0] += t1
            acc[key][1] += t2
            acc[key][2] += 1
        for key, (t1, t2, n) in sorted(acc.items(), key=lambda kv: kv[1][0] / 2 - kv[1][1]):
            if t1 >= 0.02 * whole[1] and t2 > 0.6 * t1:
                print(f"   {key[:90]:90s} x{n:<4d} 1T {t1:8.3f} ms  2T {t2:8.3f} ms  ({t1 / t2:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
