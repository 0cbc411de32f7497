"""Where npurun's time differs from ONNX Runtime's, by kind of op, on corpus models.

    python bench/op_gap.py --only resnet50,mobilenet_v2 [--threads 1] [--runs 10]

Both runtimes under their own profilers, hot (runs one after another), in this process:
npurun's `cpu/profile.py` (every step timed) and ORT's `enable_profiling` (its per-node kernel
times, after its own graph optimizations: NCHWc reorders, fused convs). The two graphs do not
match node for node (each fuses differently), so times are summed per kind: conv (any conv,
with whatever activation each fused into it), matmul (MatMul, Gemm, attention products),
depthwise is part of conv; elementwise (unfused activations, adds, muls, casts), layout (ORT's
NCHWc reorders, transposes), norm/softmax, pool, reduce, the rest, and the per-run remainder
(the whole run less its nodes: the program loop, or ORT's executor). Prints ms per kind for
each model and npurun / ORT per kind; never asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

KINDS = ("conv", "matmul", "elementwise", "layout", "norm/softmax", "pool", "reduce", "other", "loop")


def kind(op: str) -> str:
    o = op.lower().split("+")[0]
    if "conv" in o or o in ("winograd",):
        return "conv"
    if any(k in o for k in ("matmul", "gemm", "attention", "attend", "einsum", "linear")):
        return "matmul"
    if any(k in o for k in ("reorder", "transpose", "concat", "split", "slice", "gather", "pad", "resize",
                            "depth_to_space", "space_to_depth", "tile", "expand")):
        return "layout"
    if any(k in o for k in ("norm", "softmax")):
        return "norm/softmax"
    if "pool" in o:
        return "pool"
    if o.startswith("reduce") or o in ("argmax", "argmin", "mean", "topk"):
        return "reduce"
    if o in ("reshape", "flatten", "squeeze", "unsqueeze", "shape", "identity", "constant"):
        return "other"
    return "elementwise"


def npurun_kinds(graph, feeds, threads: int, runs: int) -> dict:
    import npurun
    from npurun.backends.cpu.profile import profile
    # A recorded run replays every kernel in one C call, which no step timer sees: kernels show
    # only without it (as under NPURUN_REPLAY=0).
    saved = os.environ.get("NPURUN_REPLAY")
    os.environ["NPURUN_REPLAY"] = "0"
    try:
        prog = npurun.Executor("cpu", parallelism=threads).compile(graph)
    finally:
        if saved is None:
            del os.environ["NPURUN_REPLAY"]
        else:
            os.environ["NPURUN_REPLAY"] = saved
    for _ in range(3):
        prog.run(feeds)
    rows, whole = profile(prog, feeds, runs)
    out = defaultdict(float)
    for _, op, ms in rows:
        out[kind(op)] += ms
    out["loop"] = max(whole - sum(ms for *_, ms in rows), 0.0)
    out["total"] = whole
    return out


def ort_kinds(p: Path, feeds, threads: int, runs: int) -> dict:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as d:
        so.profile_file_prefix = os.path.join(d, "ort")
        sess = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            sess.run(None, feeds)
        events = json.load(open(sess.end_profiling()))
    per_run = defaultdict(list)  # node -> kernel time per run
    model_runs = [e["dur"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    node_op = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            n = e["name"][:-len("_kernel_time")]
            per_run[n].append(e["dur"])
            node_op[n] = e["args"].get("op_name", "")
    out = defaultdict(float)
    skip = 3  # warm-up runs (the caller's count includes them)
    for n, durs in per_run.items():
        v = sorted(durs[skip:]) or sorted(durs)
        out[kind(node_op[n])] += v[len(v) // 2] / 1e3
    whole = sorted(model_runs[skip:])[len(model_runs[skip:]) // 2] / 1e3
    out["loop"] = max(whole - sum(out[k] for k in KINDS if k != "loop"), 0.0)
    out["total"] = whole
    return out


# What would close an excess of each kind: the remedies docs/cpu.md ("What each model that
# misses lacks") found on the corpus, one line each (corpus.py --why prints them).
REMEDY = {
    "conv": "conv kernels at ORT's speed: its activations stay channel-blocked (NCHWc) from conv to conv",
    "matmul": "the packed sgemm at MLAS's efficiency (103-111 against 112 GFLOP/s on long products; "
              "short products (small K, few rows) several a fork-join)",
    "elementwise": "the op fused into its producer (a residual add in the conv's epilogue: ORT's Conv + Sum)",
    "layout": "views instead of copies (transposes, slices, concats)",
    "norm/softmax": "the normalization's kernel (one pass, on the pool)",
    "pool": "a pooling kernel for this window (stride-1 planes as two flat passes)",
    "reduce": "the reduction on the compiled kernels",
    "other": "reshapes as views",
    "loop": "the per-run cost between kernels (recorded runs: replay.py)",
}


def why(graph, path: Path, feeds, threads: int, runs: int = 10) -> list[tuple[str, float, float, float]]:
    """[(kind, npurun ms, ORT ms, excess ms)] for the kinds where npurun spends more than ORT,
    largest excess first, hot, both under their profilers at `threads`."""
    a = npurun_kinds(graph, feeds, threads, runs)
    b = ort_kinds(path, feeds, threads, runs + 3)
    rows = [(k, a[k], b[k], a[k] - b[k]) for k in KINDS if a[k] > b[k]]
    return sorted(rows, key=lambda r: -r[3])


def main() -> int:
    import corpus

    import npurun
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="comma-separated corpus model names")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    sums = defaultdict(lambda: [0.0, 0.0])
    print(f"ms per run by kind, npurun / ORT, {args.threads} thread(s), hot, medians of {args.runs}")
    print(f"{'model':24s} " + " ".join(f"{k:>17s}" for k in KINDS + ("total",)))
    for name in args.only.split(","):
        spec = corpus.BY_NAME.get(name)
        if spec is None:
            print(f"{name}: not a corpus model (python bench/corpus.py --list)", file=sys.stderr)
            return 2
        p, feeds = corpus.path(name), spec.feeds()
        a = npurun_kinds(npurun.load(p), feeds, args.threads, args.runs)
        b = ort_kinds(p, feeds, args.threads, args.runs + 3)
        for k in KINDS + ("total",):
            sums[k][0] += a[k]
            sums[k][1] += b[k]
        print(f"{name[:24]:24s} " + " ".join(f"{a[k]:8.2f}/{b[k]:<8.2f}" for k in KINDS + ("total",)))
    print(f"{'sum':24s} " + " ".join(f"{s[0]:8.2f}/{s[1]:<8.2f}" for s in (sums[k] for k in KINDS + ("total",))))
    print(f"{'ratio of sums':24s} " + " ".join(f"{(s[0] / s[1] if s[1] else float('nan')):17.2f}"
                                              for s in (sums[k] for k in KINDS + ("total",))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
