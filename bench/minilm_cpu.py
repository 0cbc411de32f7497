"""MiniLM-int8 (128 tokens) on the cpu backend against ONNX Runtime, alternating in one
process, medians and ratios per thread count: the transformer kernels alone, and with
cpu/fuse_transformer.py's rewrites run before fuse.py's (the order the backend's compile is to
run them in; where the backend already runs them, both rows are the same program).

    python bench/minilm_cpu.py [--time 10] [--threads 1 2]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_table import feeds, model_path  # noqa: E402

import npurun  # noqa: E402
from npurun.backends.cpu import fuse_transformer  # noqa: E402


def compile_cpu(graph, threads: int, fused: bool):
    """The cpu program as the backend compiles it, or (fused=False) without the transformer
    rewrites of fuse_transformer.py: the kernels alone."""
    if fused:
        return npurun.Executor("cpu", parallelism=threads).compile(graph)
    saved = fuse_transformer.fuse
    fuse_transformer.fuse = lambda prog: {}
    try:
        return npurun.Executor("cpu", parallelism=threads).compile(graph)
    finally:
        fuse_transformer.fuse = saved


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", type=float, default=10.0, help="seconds of alternating runs per thread count")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    import onnxruntime as ort
    path, f = model_path("minilm_int8"), feeds("minilm_int8")
    graph = npurun.load(path)
    for t in args.threads:
        kernels, fused = compile_cpu(graph, t, False), compile_cpu(graph, t, True)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = t, 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        runs = {"kernels": lambda: kernels.run(f), "fused": lambda: fused.run(f), "ort": lambda: sess.run(None, f)}
        times = {k: [] for k in runs}
        for r in runs.values():
            r()
        t0 = time.time()
        while time.time() - t0 < args.time:
            for k, r in runs.items():
                a = time.perf_counter()
                r()
                times[k].append(time.perf_counter() - a)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        ratio = {k: med[k] / med["ort"] for k in med}
        print(f"threads={t} runs={len(times['ort'])}: kernels {med['kernels']:.1f} ms ({ratio['kernels']:.2f}), "
              f"fused {med['fused']:.1f} ms ({ratio['fused']:.2f}), ORT {med['ort']:.1f} ms")


if __name__ == "__main__":
    main()
