"""ESPCN 720p -> 4K on the simulated X Elite NPU (npusim) against ONNX Runtime's CPU provider
measured on this machine: does "17.8x over ORT CPU, 76% less power" hold?

    .venv/bin/python bench/npusim_espcn_4k.py [--runs 5] [--threads N] [--cpu-watts W]

The NPU side is npusim's estimate (calibrated on published AI Hub latencies, see
docs/npusim.md); the CPU side is a measurement here. Stated assumptions: the CPU draws
--cpu-watts while ORT runs (default 2.5 W per busy core, an assumed figure for the X Elite's
Oryon cores, not a measurement: this machine has no power sensor); the CPU here is not an X
Elite, so the speedup is "simulated NPU vs this CPU". Prints ratios, asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from npurun import zoo  # noqa: E402
from npurun.backends.npusim.simulate import estimate  # noqa: E402
from npurun.frontend import load  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--cpu-watts", type=float, default=None, help="CPU power while ORT runs (default 2.5 W x threads)")
    ap.add_argument("--device", default="x-elite-hexagon")
    args = ap.parse_args()
    cpu_w = args.cpu_watts if args.cpu_watts is not None else 2.5 * args.threads
    model = zoo.path("espcn_x3.onnx")
    g = load(model)
    shape = {g.inputs[0]: (1, 1, 720, 1280)}
    print(f"ESPCN x3, input {list(shape[g.inputs[0]])} -> [1, 1, 2160, 3840]")
    rows = {}
    for prec in ("int8", "fp16"):
        r = estimate(g, args.device, shape, prec)
        rows[prec] = r
        d = r.to_dict()
        print(f"npusim {args.device} {prec:5s}: {d['latency_ms']:8.3f} ms  {d['effective_tops']:6.2f} TOPS  "
              f"MAC util {d['mac_utilization']:6.1%}  fast-tier hit {d['fast_tier_hit_rate']:6.1%}  "
              f"{d['energy_mj']:7.2f} mJ/image  ({d['energy_mj'] / d['latency_ms']:.2f} W)")
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: no CPU comparison (pip install npurun[bench])")
        return 0
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random(shape[g.inputs[0]], dtype=np.float32)
    sess.run(None, {g.inputs[0]: x})
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        sess.run(None, {g.inputs[0]: x})
        times.append(time.perf_counter() - t)
    ort_s = statistics.median(times)
    ort_j = ort_s * cpu_w
    print(f"ORT CPU ({args.threads} threads, measured here): {ort_s * 1e3:8.1f} ms median of {args.runs}; "
          f"assumed {cpu_w:.1f} W -> {ort_j * 1e3:.0f} mJ/image")
    for prec, r in rows.items():
        speed = ort_s / r.latency_s
        npu_w = r.energy_j / r.latency_s
        print(f"  npusim {prec:5s} vs ORT CPU: {speed:6.1f}x faster (claim: 17.8x); power {npu_w:.2f} W vs {cpu_w:.1f} W "
              f"= {1 - npu_w / cpu_w:.0%} less (claim: 76% less); energy per image {1 - r.energy_j / ort_j:.1%} less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
