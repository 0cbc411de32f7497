"""GPU evidence in one run: the torch backend on an NVIDIA GPU, checked, timed and compared.

    python bench/gpu.py            # on a machine with an NVIDIA GPU (about 1-2 minutes)
    python bench/gpu.py --dry      # CPU only: the correctness part through torch:cpu (CI)

1. Correctness: `torch:cuda` (CUDA graphs) against the reference backend on fresh random
   inputs, for ESPCN x3, PP-OCRv4 det, YOLOv8n and MiniLM (fp32; TF32 off).
2. Timing with CUDA graphs (captured once, replayed; median of many replays after warm-up,
   CUDA events): ESPCN 720p -> 4K in fp32, fp16 and int8, PP-OCRv4 det, YOLOv8n, MiniLM.
3. Peers and ceilings measured in the same run: ONNX Runtime's CPU provider on the same
   models and inputs; a large fp16 matmul (TFLOP/s) and a large device-to-device copy (GB/s).
4. A short table, printed last.

Needs the project, PyTorch with CUDA and ONNX Runtime; no network. The third-party models
must be in npurun's model cache beforehand (tests/models/fetch.py; run
`python -c "from tests.models.fetch import fetch; [fetch(m) for m in ('ppocr_det', 'yolov8n', 'minilm_int8')]"`
on a machine with the network and copy ~/.cache/npurun/models); a model not found is skipped,
saying so. Timings are printed, never asserted.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import npurun  # noqa: E402
from npurun.backends.torch import with_precision  # noqa: E402
from npurun.ir.cost import node_costs  # noqa: E402


# ---------------------------------------------------------------- models and inputs

def model_path(name: str) -> Path | None:
    """The model file, from the repo (ESPCN) or npurun's model cache; never downloads."""
    if name == "espcn":
        return ROOT / "npurun" / "zoo" / "espcn_x3.onnx"
    from tests.models.fetch import MODELS, cache_dir
    req, member = MODELS[name]
    p = cache_dir() / req.replace("==", "-") / member
    return p if p.exists() else None


def feeds_for(name: str, rng, size: str):
    """Fresh random inputs; `size` is "check" (small, for the reference) or "time"."""
    if name == "espcn":
        h, w = {"check": (96, 128), "dry": (48, 64), "time": (720, 1280)}[size]
        return {"input": rng.random((1, 1, h, w), dtype=np.float32)}
    if name == "ppocr_det":
        s = {"check": 320, "dry": 160, "time": 960}[size]
        return {"x": rng.standard_normal((1, 3, s, s)).astype(np.float32)}
    if name == "yolov8n":
        return {"images": rng.random((1, 3, 320, 320), dtype=np.float32)}
    if name == "minilm_int8":
        n = {"check": 128, "dry": 32, "time": 128}[size]
        ids = rng.integers(1000, 30000, (1, n)).astype(np.int64)
        ids[0, 0], ids[0, -1] = 101, 102
        return {"input_ids": ids, "attention_mask": np.ones((1, n), np.int64),
                "token_type_ids": np.zeros((1, n), np.int64)}
    raise KeyError(name)


MODELS = ["espcn", "ppocr_det", "yolov8n", "minilm_int8"]
LABEL = {"espcn": "ESPCN x3", "ppocr_det": "PP-OCRv4 det", "yolov8n": "YOLOv8n", "minilm_int8": "MiniLM (int8 w.)"}


def describe(feeds) -> str:
    return " ".join("x".join(map(str, a.shape)) for a in feeds.values())


def as_f16(graph):
    """The model in fp16 end to end: f32 values and constants become f16 (inputs too)."""
    import copy
    g = copy.copy(graph)
    g.values = {}
    for k, v in graph.values.items():
        v2 = copy.copy(v)
        if v.dtype == "f32":
            v2.dtype = "f16"
            if v.data is not None:
                v2.data = v.data.astype(np.float16)
        g.values[k] = v2
    return g


# ---------------------------------------------------------------- correctness

def check(name, device, rng, size, results):
    path = model_path(name)
    if path is None:
        print(f"  {LABEL[name]}: skipped, not in the model cache (fetch it beforehand)")
        return
    g = npurun.load(path)
    feeds = feeds_for(name, rng, size)
    ref = npurun.Executor("reference").run_sync(g, feeds)
    exe = npurun.Executor(device)
    got = exe.run_sync(g, feeds)
    prog = exe.compile(g)
    worst = 0.0
    for k in ref:
        r, o = ref[k].astype(np.float64), got[k].astype(np.float64)
        assert r.shape == o.shape, (name, k, r.shape, o.shape)
        worst = max(worst, float(np.abs(r - o).max() / max(1.0, np.abs(r).max())))
    ok = worst < 1e-3
    results.append((name, ok))
    print(f"  {LABEL[name]:18s} {describe(feeds):22s} max |err| / max(1, |ref|) = {worst:.2e}  "
          f"{'ok' if ok else 'MISMATCH'}  (fallback nodes: {len(prog.fallbacks)}; "
          f"CUDA graph: {prog.cuda_graph_status})")


# ---------------------------------------------------------------- timing

def time_replays(cap, budget_s=2.0, warmup=5):
    import torch
    for _ in range(warmup):
        cap.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    cap.replay()
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-5)
    n = int(min(200, max(10, budget_s / est)))
    times = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        cap.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times), n


def time_ort(path, feeds, budget_s=3.0):
    import onnxruntime as ort
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    times = []
    t_end = time.perf_counter() + budget_s
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def gmacs(g, feeds):
    return sum(c.macs for c in node_costs(g, {k: v.shape for k, v in feeds.items()})) / 1e9


def timing(rng, rows, device):
    from npurun.backends import get_backend
    backend = get_backend(device)
    ort_cache = {}
    for name in MODELS:
        path = model_path(name)
        if path is None:
            print(f"  {LABEL[name]}: skipped, not in the model cache")
            continue
        g = npurun.load(path)
        feeds = feeds_for(name, rng, "time")
        variants = [("fp32", g, feeds)]
        if name == "espcn":
            variants += [("fp16", as_f16(g), {k: v.astype(np.float16) for k, v in feeds.items()}),
                         ("int8", with_precision(g, "i8", ops=("conv",)), feeds)]
        for prec, graph, f in variants:
            try:
                prog = backend.compile(graph)
                cap = prog.capture(f)
                ms, n = time_replays(cap)
            except Exception as e:  # one variant failing must not lose the others' numbers
                print(f"  {LABEL[name]} {prec}: failed: {e.__class__.__name__}: {str(e).splitlines()[0][:200]}")
                continue
            key = (name, describe(feeds))
            if key not in ort_cache:
                ort_cache[key] = time_ort(path, feeds)
            ort_ms = ort_cache[key]
            macs = gmacs(g, feeds)
            rows.append((LABEL[name], describe(feeds), prec, ms, ort_ms, macs))
            print(f"  {LABEL[name]:18s} {prec:5s} {describe(feeds):20s} torch:cuda {ms:9.3f} ms (median of {n})  "
                  f"ORT CPU {ort_ms:9.2f} ms  {2 * macs / ms:8.1f} GFLOP/ms")


def ceilings(device):
    import torch
    dev = torch.device(device.split(":", 1)[1])
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.float16)
    b = torch.randn(n, n, device=dev, dtype=torch.float16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    s.record()
    for _ in range(reps):
        a @ b
    e.record()
    e.synchronize()
    mm_ms = s.elapsed_time(e) / reps
    tflops = 2 * n ** 3 / (mm_ms / 1000) / 1e12
    del a, b
    nbytes = 4 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    s.record()
    for _ in range(10):
        dst.copy_(src)
    e.record()
    e.synchronize()
    cp_ms = s.elapsed_time(e) / 10
    gbs = 2 * nbytes / (cp_ms / 1000) / 1e9  # read + write
    del src, dst
    torch.cuda.empty_cache()
    return tflops, gbs


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="CPU only: the correctness part through torch:cpu")
    ap.add_argument("--device", default=None, help="torch device (default torch:cuda, or torch:cpu with --dry)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    seed = args.seed if args.seed is not None else int(time.time_ns() % 2 ** 31)
    rng = np.random.default_rng(seed)
    import torch
    device = args.device or ("torch:cpu" if args.dry else "torch:cuda")
    if not args.dry:
        if not torch.cuda.is_available():
            print(f"bench/gpu.py: PyTorch {torch.__version__} sees no CUDA device; run with --dry on a CPU")
            return 2
        torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32 (TF32 would be a precision of its own)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        print(f"device: {torch.cuda.get_device_name()} ({device}), PyTorch {torch.__version__}, seed {seed}")
    else:
        print(f"dry run on {device} (correctness only), PyTorch {torch.__version__}, seed {seed}")

    print("1. correctness: torch backend vs reference backend, fresh random inputs")
    results: list = []
    for name in MODELS:
        check(name, device, rng, "dry" if args.dry else "check", results)
    bad = [n for n, ok in results if not ok]
    if args.dry:
        print(f"dry run: {len(results)} models checked, {len(bad)} mismatched "
              f"({time.perf_counter() - t_start:.1f} s)")
        return 1 if bad else 0

    print("2. timing with CUDA graphs (and ONNX Runtime CPU on the same inputs)")
    rows: list = []
    timing(rng, rows, device)
    print("3. device ceilings")
    tflops, gbs = ceilings(device)
    print(f"  fp16 matmul 8192^3: {tflops:.1f} TFLOP/s;  device-to-device copy 4 GiB: {gbs:.0f} GB/s (read+write)")

    print()
    print(f"{'model':18s} {'input':20s} {'prec':5s} {'torch:cuda ms':>13s} {'ORT CPU ms':>11s} {'speed-up':>9s} "
          f"{'TFLOP/s':>8s} {'% of mm':>8s}")
    for label, shape, prec, ms, ort_ms, macs in rows:
        tf = 2 * macs / (ms / 1000) / 1e3
        print(f"{label:18s} {shape:20s} {prec:5s} {ms:13.3f} {ort_ms:11.2f} {ort_ms / ms:8.1f}x "
              f"{tf:8.2f} {100 * tf / tflops:7.1f}%")
    print(f"ceilings: fp16 matmul {tflops:.1f} TFLOP/s, copy {gbs:.0f} GB/s; correctness: "
          f"{len(results) - len(bad)}/{len(results)} ok; {time.perf_counter() - t_start:.0f} s in all")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
