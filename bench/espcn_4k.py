"""ESPCN 1280x720 -> 3840x2160 (x3): npurun vs ONNX Runtime's CPU provider, side by side.

Both run the same bundled ONNX model on the same luma input with the same thread count, in
one process, alternating (npurun, ORT, npurun, ORT, ...) after a warm-up, so machine noise
hits both alike. Prints medians and the ratio npurun/ORT (lower is better). Never asserts.

    python bench/espcn_4k.py [--threads 2] [--runs 5] [--device cpu]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import numpy as np
import onnxruntime as ort

import npurun
from npurun import zoo
from npurun.ir.cost import node_costs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    args = ap.parse_args()

    model = zoo.path("espcn_x3.onnx")
    x = np.random.default_rng(0).random((1, 1, args.height, args.width), dtype=np.float32)
    graph = npurun.load(model)
    exe = npurun.Executor(args.device, parallelism=args.threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])

    runners = {"npurun": lambda: exe.run_sync(graph, {"input": x})["output"],
               "onnxruntime": lambda: sess.run(None, {"input": x})[0]}
    outs = {k: f() for k, f in runners.items()}  # warm-up, and a correctness check
    rel = float(np.abs(outs["npurun"] - outs["onnxruntime"]).max() / np.abs(outs["onnxruntime"]).max())
    times = {k: [] for k in runners}
    for _ in range(args.runs):
        for k, f in runners.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)

    macs = sum(c.macs for c in node_costs(graph, {"input": x.shape}))
    print(f"# ESPCN x3 {args.width}x{args.height} -> {3 * args.width}x{3 * args.height}, "
          f"{datetime.date.today()}, {platform.machine()} {os.cpu_count()} CPUs, threads={args.threads}, "
          f"npurun {npurun.__version__} ({args.device}), onnxruntime {ort.__version__}")
    print(f"# {macs / 1e9:.1f} GMAC per image; max relative difference npurun vs ORT: {rel:.2e}")
    print(f"{'runtime':12s} {'median ms':>10s} {'min ms':>9s} {'GFLOP/s':>8s}")
    med = {}
    for k, ts in times.items():
        med[k] = statistics.median(ts)
        print(f"{k:12s} {med[k] * 1e3:10.1f} {min(ts) * 1e3:9.1f} {2 * macs / med[k] / 1e9:8.1f}")
    print(f"ratio npurun/onnxruntime (median): {med['npurun'] / med['onnxruntime']:.2f}")


if __name__ == "__main__":
    main()
