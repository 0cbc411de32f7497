"""Before/after of two commits on corpus models, in alternating processes.

    python bench/ab_commits.py --base 067445a --only deepcut_thai,mobilenet_v2 --threads 2 [--idle 0.1]

The base commit is checked out in a temporary git worktree and its C kernels are built there;
then, for each model, `--rounds` rounds each run one process of the base and one of the
working tree (alternating, so both see the same machine minute), and each process loads the
model, runs it three times untimed and times `--runs` runs (after `--idle` seconds of sleep
each, the corpus table's protocol when 0.1). Prints the median of each side's medians and
their ratio. Both sides read the same corpus files and conv-tuning cache (~/.cache/npurun).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _child(root: str, name: str, threads: int, idle: float, runs: int) -> None:
    sys.path[:0] = [root, str(Path(root) / "bench")]
    import corpus

    import npurun
    spec = corpus.BY_NAME[name]
    feeds = spec.feeds()
    g = npurun.load(corpus.path(name))
    exe = npurun.Executor("cpu", parallelism=threads)
    for _ in range(3):
        exe.run_sync(g, feeds)
    ts = []
    for _ in range(runs):
        if idle:
            time.sleep(idle)
        t0 = time.perf_counter()
        exe.run_sync(g, feeds)
        ts.append(time.perf_counter() - t0)
    print(1e3 * statistics.median(ts))


def _measure(root: Path, name: str, a) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", str(root), name, str(a.threads), str(a.idle),
                          str(a.runs)], cwd=root, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "PYTHONPATH": str(root)})
    if out.returncode:
        raise SystemExit(f"{root}: {name} failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    ap.add_argument("--only", required=True, help="comma-separated corpus model names")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--idle", type=float, default=0.0, help="seconds of sleep before each timed run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=25)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), a.base], cwd=HERE, check=True)
        try:
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=base, check=True,
                           capture_output=True)
            print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {a.base} (before) against the working "
                  f"tree (after), {a.threads} thread(s), {a.idle} s idle before each run, {a.rounds} rounds")
            for name in a.only.split(","):
                before, after = [], []
                for _ in range(a.rounds):
                    before.append(_measure(base, name, a))
                    after.append(_measure(HERE, name, a))
                b, f = statistics.median(before), statistics.median(after)
                print(f"{name}: before {b:.3g} ms, after {f:.3g} ms, after/before {f / b:.2f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=HERE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
