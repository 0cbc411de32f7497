"""A/B of measured conv kernels (npurun/backends/cpu/convtune.py) against the rule alone, on
corpus models (docs/cpu.md, "Measured, not ruled"): one compiled program per model, each run
alternating the rule (every conv forced to algo="rule") and the measured choice, 100 ms idle
before each run, medians. Also prints the first run's time (when the measuring happens) and
what was picked. Needs the corpus (`python bench/corpus.py --build`).

    python bench/convtune_ab.py --threads 2 --only resnet50,yolov8n [--runs 7]

Prints times, never asserts.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus  # noqa: E402
import npurun  # noqa: E402
from corpus_models import BY_NAME  # noqa: E402
from npurun.backends.cpu import convtune, nativeconv  # noqa: E402

_conv2d = nativeconv.conv2d
RULE = {"on": False}


def _conv2d_switch(x, w, b, attrs, act, act_attrs, threads, cache, isa=None, algo=None):
    if algo is None and RULE["on"]:
        algo = "rule"
    return _conv2d(x, w, b, attrs, act, act_attrs, threads, cache, isa, algo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="comma-separated corpus model names")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    nativeconv.conv2d = _conv2d_switch  # (the cpu backend calls it through the module)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.threads} thread(s)")
    for name in args.only.split(","):
        g = npurun.load(corpus.path(name))
        exe = npurun.Executor("cpu", parallelism=args.threads)
        feeds = BY_NAME[name].feeds()
        RULE["on"] = True
        exe.run_sync(g, feeds)
        RULE["on"] = False
        before = len(convtune.choices())
        t0 = time.perf_counter()
        exe.run_sync(g, feeds)
        first = time.perf_counter() - t0
        picked = Counter(list(convtune.choices().values())[before:])
        ts = {"rule": [], "measured": []}
        for _ in range(args.runs):
            for k in ts:
                RULE["on"] = k == "rule"
                time.sleep(0.1)
                t0 = time.perf_counter()
                exe.run_sync(g, feeds)
                ts[k].append(time.perf_counter() - t0)
        r = {k: 1e3 * float(np.median(v)) for k, v in ts.items()}
        print(f"{name:26s} rule {r['rule']:8.1f} ms  measured {r['measured']:8.1f} ms  "
              f"x{r['measured'] / r['rule']:.2f}  first run {first:.2f} s  new shapes: "
              + (", ".join(f"{a} {n}" for a, n in sorted(picked.items())) or "none"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
