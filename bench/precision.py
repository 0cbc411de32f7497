"""What each precision plan costs on the `cpu` backend, side by side in one process.

    python bench/precision.py [--rounds 5] [--size 256] [--model ppocr_cls]

For ESPCN (a SIZExSIZE luma input) and one real model (PP-OCR cls by default, fetched by
tests/models/fetch.py), every plan — fp32, fp16, bf16, auto, int8, int16 — is compiled
once, then all plans run in turn, round after round (so they share the machine's state), and
the median time per plan is printed with its ratio to fp32 and its largest difference from
fp32's output.

Honest reading: on a CPU this is *emulation*. fp16/bf16 add rounding passes around fp32
kernels, and int8/int16 quantize, run an exact integer convolution through float BLAS and
dequantize, usually slower than fp32 here. On an NPU the same plans are the fast ones (npusim
and `npurun estimate --precision` model that); this table shows what checking them costs on
the host. Never asserts.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))

import npurun  # noqa: E402
from npurun import zoo  # noqa: E402
from npurun.compiler import compile  # noqa: E402

PLANS = ["fp32", "fp16", "bf16", "auto", "int8", "int16"]


def _models(args, rng):
    x = rng.random((1, 1, args.size, args.size), dtype=np.float32)
    out = [(f"ESPCN {args.size}x{args.size}", zoo.path("espcn_x3.onnx"), {"input": x},
            [{"input": rng.random((1, 1, args.size, args.size), dtype=np.float32)}])]
    if args.model:
        try:
            from fetch import fetch
            from inputs import RANDOM_FEEDS
            feed = RANDOM_FEEDS[args.model](rng)
            out.append((args.model, fetch(args.model), feed, [RANDOM_FEEDS[args.model](rng)]))
        except Exception as e:  # no network and no cache: say so, keep ESPCN
            print(f"skipping {args.model}: {e}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--model", default="ppocr_cls", help="a model of tests/models/fetch.py ('' for none)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    exe = npurun.Executor("cpu", parallelism=args.threads)
    print(f"cpu backend, {args.threads} thread(s), {args.rounds} rounds, median per plan")
    for title, path, feed, cal in _models(args, rng):
        graphs = {p: compile(path, precision=p, calibration=cal) for p in PLANS}
        ref = list(exe.run_sync(graphs["fp32"], feed).values())[0]
        times = {p: [] for p in PLANS}
        diffs = {}
        for _ in range(args.rounds):
            for p in PLANS:  # peers alternate within each round
                t0 = time.perf_counter()
                out = list(exe.run_sync(graphs[p], feed).values())[0]
                times[p].append(time.perf_counter() - t0)
                diffs[p] = float(np.abs(out.astype(np.float64) - ref).max())
        base = statistics.median(times["fp32"])
        print(f"\n{title}")
        print(f"{'plan':8s} {'median ms':>10s} {'x fp32':>8s} {'max |diff| vs fp32':>20s}  nodes lowered")
        for p in PLANS:
            m = statistics.median(times[p])
            low = sum(1 for n in graphs[p].nodes if n.precision)
            print(f"{p:8s} {m * 1e3:10.1f} {m / base:8.2f} {diffs[p]:20.3g}  {low}/{len(graphs[p].nodes)}")
    exe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
