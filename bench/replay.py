"""Recorded runs against normal runs (npurun/backends/cpu/replay.py) on corpus models, with ONNX
Runtime beside them: three runners alternating in one process, each call after 100 ms idle (the
corpus table's protocol), medians. The normal runner is the same model compiled by a second
Executor whose program has replays turned off.

    python bench/replay.py --only mlp_tiny,lenet,silero_vad --threads 1 --time 1

Prints per model the three medians, the ratios, the largest difference between the two npurun
outputs (a replayed program may take another kernel for a small product: a few ulps) and how the
model was recorded (or why not).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="comma-separated corpus model names")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--time", type=float, default=1.0, help="seconds of alternating rounds per model")
    a = ap.parse_args(argv)
    import npurun
    from npurun.backends.cpu import replay
    from npurun.commands.bench import alternate, machine
    print(f"# {machine()}; threads {a.threads}; 100 ms idle before each call; medians")
    for spec in corpus.selected(a.only):
        p, feeds = corpus.path(spec.name), spec.feeds()
        g = npurun.load(p)
        rec, normal = npurun.Executor("cpu", parallelism=a.threads), npurun.Executor("cpu", parallelism=a.threads)
        normal.planned(g, feeds)[0]._replays = None  # (the program the Executor runs for these shapes)
        for _ in range(replay.WARM + 3):  # warm-up, the run on a replay's kernels, the recording
            rec.run_sync(g, feeds)
            normal.run_sync(g, feeds)
        sigs = rec.planned(g, feeds)[0]._replays
        s = next(iter(sigs.signatures.values())) if sigs and sigs.signatures else None
        how = "replays off" if s is None else (s.recording.summary() if s.recording else s.never)
        sess = corpus.ort_session(p, a.threads)
        x, y = rec.run_sync(g, feeds), normal.run_sync(g, feeds)
        diff = max((float(np.max(np.abs(x[k] - y[k]))) for k in x if x[k].size and x[k].dtype.kind == "f"), default=0.0)
        times = alternate({"replayed": lambda: rec.run_sync(g, feeds), "normal": lambda: normal.run_sync(g, feeds),
                           "ort": lambda: sess.run(None, feeds)}, a.time, 5)
        m = {k: 1e3 * sorted(v)[len(v) // 2] for k, v in times.items()}
        print(f"{spec.name:24s} replayed {m['replayed']:.3f} normal {m['normal']:.3f} ORT {m['ort']:.3f} ms | "
              f"replayed/ORT {m['replayed'] / m['ort']:.2f} normal/ORT {m['normal'] / m['ort']:.2f} "
              f"replayed/normal {m['replayed'] / m['normal']:.2f} | max diff {diff:.1e} | {how}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
