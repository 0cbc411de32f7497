"""The README's cpu benchmark table: npurun's `cpu` backend vs ONNX Runtime's CPU provider on
five models at 1 and 2 threads, side by side in one process (see `npurun bench`), plus the
peak resident memory of each runtime alone in a child process. Prints a Markdown table;
never asserts.

    python bench/cpu_table.py [--time 6] [--threads 1 2] [--only espcn,yolov8n] [--profile]
        [--json out.json]

The third-party models are fetched by tests/models/fetch.py (cached in ~/.cache/npurun/models).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))

import npurun  # noqa: E402
from npurun import zoo  # noqa: E402
from npurun.commands.bench import compare, machine  # noqa: E402

GOALS = {"espcn": 0.8, "ppocr_det": 1.0, "yolov8n": 1.0, "minilm_int8": 1.0, "silero_vad": 1.5}
TITLES = {"espcn": "ESPCN 720p -> 4K (x3)", "ppocr_det": "PP-OCRv4 det 640x640", "yolov8n": "YOLOv8n 320x320 (nudenet)",
          "minilm_int8": "MiniLM-int8, 128 tokens", "silero_vad": "silero-vad, one 512-sample chunk"}


def model_path(name: str) -> Path:
    if name == "espcn":
        return zoo.path("espcn_x3.onnx")
    from fetch import fetch
    return fetch(name)


def feeds(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "espcn":
        return {"input": rng.random((1, 1, 720, 1280), dtype=np.float32)}
    if name == "ppocr_det":
        return {"x": rng.random((1, 3, 640, 640), dtype=np.float32)}
    if name == "yolov8n":
        return {"images": rng.random((1, 3, 320, 320), dtype=np.float32)}
    if name == "minilm_int8":
        ids = rng.integers(1000, 30000, (1, 128)).astype(np.int64)
        ids[0, 0], ids[0, -1] = 101, 102
        return {"input_ids": ids, "attention_mask": np.ones((1, 128), np.int64),
                "token_type_ids": np.zeros((1, 128), np.int64)}
    if name == "silero_vad":
        return {"input": (rng.standard_normal((1, 512)) * 0.1).astype(np.float32),
                "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    raise KeyError(name)


def peak_rss_mb(name: str, runtime: str, threads: int) -> float:
    """Peak resident memory of a fresh process that loads the model and runs it 3 times."""
    out = subprocess.run([sys.executable, __file__, "--rss-child", name, runtime, str(threads)],
                         capture_output=True, text=True, timeout=900)
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return float("nan")


def _rss_child(name: str, runtime: str, threads: int):
    f = feeds(name)
    if runtime == "npurun":
        g = npurun.load(model_path(name))
        exe = npurun.Executor("cpu", parallelism=threads)
        run = lambda: exe.run_sync(g, f)  # noqa: E731
    else:
        from npurun.commands.bench import ort_session
        sess = ort_session(model_path(name), threads)
        run = lambda: sess.run(None, f)  # noqa: E731
    for _ in range(3):
        run()
    # VmHWM is this process image's own high-water mark; ru_maxrss would carry the parent's
    # peak across fork+exec on Linux.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            print(int(line.split()[1]) / 1024)
            return
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", type=float, default=6.0, help="seconds of alternating runs per model and thread count")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", default=",".join(GOALS), help="comma-separated subset of " + ",".join(GOALS))
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-memory child processes")
    ap.add_argument("--profile", action="store_true", help="also print where npurun's time goes, by op")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--rss-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child[0], args.rss_child[1], int(args.rss_child[2]))
        return

    import onnxruntime as ort
    from npurun.backends.cpu import native
    names = args.only.split(",")
    all_res, rows = {}, []
    for name in names:
        path, f = model_path(name), feeds(name)
        graph = npurun.load(path)
        row = {"name": name}
        for t in args.threads:
            r = compare(path, graph, f, "cpu", t, "onnxruntime", args.time, 5)
            all_res[f"{name}@{t}"] = r
            row[t] = r
            print(f"# {name} threads={t}: npurun {r['results']['npurun']['median_ms']:.2f} ms, "
                  f"ORT {r['results']['onnxruntime']['median_ms']:.2f} ms, ratio {r['ratio_npurun_over_peer']:.2f}",
                  file=sys.stderr)
            if args.profile:
                _print_profile(graph, f, t)
        if not args.no_rss:
            t = max(args.threads)
            row["rss"] = (peak_rss_mb(name, "npurun", t), peak_rss_mb(name, "ort", t))
        rows.append(row)

    print(f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; npurun {npurun.__version__} "
          f"(cpu kernels: {native.ISA if native.LIB else 'NumPy: ' + native.REASON}), onnxruntime {ort.__version__}, "
          f"NumPy {np.__version__}, Python {sys.version.split()[0]}. Command: `python bench/cpu_table.py`.\n")
    head = "| model | goal |" + "".join(f" npurun ms ({t}T) | ORT ms ({t}T) | ratio ({t}T) |" for t in args.threads)
    head += " GFLOP/s (% sgemm peak) |" + (" peak RSS MB npurun / ORT |" if not args.no_rss else "")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for row in rows:
        cells = [TITLES[row["name"]], f"≤ {GOALS[row['name']]}"]
        for t in args.threads:
            r = row[t]
            cells += [f"{r['results']['npurun']['median_ms']:.1f}", f"{r['results']['onnxruntime']['median_ms']:.1f}",
                      f"**{r['ratio_npurun_over_peer']:.2f}**"]
        r = row[max(args.threads)]
        s = r["results"]["npurun"]
        cells.append(f"{s['gflops']:.0f} ({100 * s['fraction_of_sgemm_peak']:.0f}% of {r['sgemm_peak_gflops']:.0f})")
        if "rss" in row:
            cells.append(f"{row['rss'][0]:.0f} / {row['rss'][1]:.0f}")
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": all_res, "rss": {r["name"]: r.get("rss") for r in rows}}, indent=2))


def _print_profile(graph, f, threads):
    from npurun.backends.cpu.profile import by_op, profile
    prog = npurun.Executor("cpu", parallelism=threads).compile(graph)
    rows, whole = profile(prog, f, 3)
    print(f"## profile, {threads} threads: whole run {whole:.2f} ms, sum of steps "
          f"{sum(r[2] for r in rows):.2f} ms, {len(rows)} steps", file=sys.stderr)
    for op, count, ms in by_op(rows)[:12]:
        print(f"   {op:28s} x{count:<4d} {ms:9.2f} ms", file=sys.stderr)


if __name__ == "__main__":
    main()
