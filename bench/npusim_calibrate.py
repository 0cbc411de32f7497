"""Calibrate npusim's x-elite-hexagon model against published AI Hub latencies and validate it
leave-one-architecture-out, beside the MACs-only roofline baseline.

    .venv/bin/python bench/npusim_calibrate.py [--write]

Rows: every AI Hub row (npurun/backends/npusim/data/aihub_x_elite.csv; float, w8a8, w8a16)
of a model whose architecture npurun/zoo/architectures builds, and the LLM table
(aihub_x_elite_llm.csv): a model's decode rate as the latency of its 1-token graph
(1 / tokens_per_s) and its time to first token as the latency of its 128-token prompt graph
(ttft_min_ms), both at w4a16. Rows that copy one measurement under several names (the
Llama-3-8B fine-tunes) count once.

For every architecture A (ESRGAN and Real-ESRGAN x4plus are one, BERT and its 6-layer DistilBERT
are one, the LLM rows group by configuration), both models are fitted on the rows of all other
architectures and predict A's rows; every figure printed is such a held-out prediction. --write
stores the fit on all rows in the device file's [calibration] section.
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from npurun.backends.npusim.calibrate import (PARAMS, PREC, apply_params, decompose, default_params,  # noqa: E402
                                              dram_share_cap, fit, fit_roofline, load_rows, predict)
from npurun.backends.npusim.data import AIHUB, AIHUB_LLM, data_path  # noqa: E402
from npurun.backends.npusim.view import npusim_view  # noqa: E402
from npurun.devices import load_device  # noqa: E402
from npurun.zoo.architectures import CALIBRATION, build  # noqa: E402
from npurun.zoo.architectures import llm as L  # noqa: E402

SAME_ARCH = {"esrgan": "rrdbnet", "real_esrgan_x4plus": "rrdbnet", "distil_bert_base": "bert_base"}
# Families for the report (each is a set of architectures; the figures stay held-out per architecture).
FAMILIES = [("resnet", ("resnet", "wideresnet", "resnext")), ("mobile cnn", ("mobilenet", "squeezenet", "shufflenet", "googlenet")),
            ("super-res", ("quicksrnet", "xlsr", "sesr", "real_esrgan", "esrgan", "rrdbnet")), ("yolo", ("yolov8",)),
            ("bert", ("bert",)), ("vit/clip", ("vit", "openai_clip")), ("convnext", ("convnext",)), ("swin", ("swin",)),
            ("detr", ("detr",)), ("whisper encoder", ("whisper_tiny_encoder", "whisper_base_encoder")),
            ("whisper decoder", ("whisper_tiny_decoder", "whisper_base_decoder")), ("stable diffusion", ("sd15",)),
            ("mobilesam", ("mobilesam",)),
            ("llm", ("llm:",))]


def family_of(arch: str) -> str:
    return next((f for f, keys in FAMILIES if arch.startswith(keys)), arch)


def llm_rows() -> list[dict]:
    """One row per distinct (configuration, measurement) of the LLM table."""
    seen, out = set(), []
    with data_path(AIHUB_LLM).open(newline="") as f:
        for r in csv.DictReader(f):
            model = r["model"].removesuffix("_quantized")
            cfg = L.LLMS[model]
            key = (L.arch_key(cfg), r["tokens_per_second"], r["ttft_min_ms"])
            if key in seen:
                continue
            seen.add(key)
            group = "llm:" + "x".join(map(str, L.arch_key(cfg)))
            out.append({"model": model, "metric": "tokens/s", "arch": f"{model}_token", "group": group,
                        "latency_s": 1 / float(r["tokens_per_second"])})
            out.append({"model": model, "metric": "ttft", "arch": f"{model}_prompt", "group": group,
                        "latency_s": float(r["ttft_min_ms"]) * 1e-3})
    return out


def collect(dev):
    """[(decomposed, published seconds, LOAO group, label, precision, metric)]"""
    graphs: dict = {}

    def graph(arch):
        if arch not in graphs:
            graphs[arch] = npusim_view(build(arch))
        return graphs[arch]
    data = []
    for r in load_rows(data_path(AIHUB), CALIBRATION):
        arch = CALIBRATION[r["model"]]
        d = decompose(graph(arch), dev, PREC[r["precision"]], r["model"])
        data.append((d, float(r["latency_ms"]) * 1e-3, SAME_ARCH.get(arch, arch), r["model"], r["precision"], "latency"))
    for r in llm_rows():
        d = decompose(graph(r["arch"]), dev, "w4a16", r["model"])
        data.append((d, r["latency_s"], r["group"], r["model"], "w4a16", r["metric"]))
        graphs.pop(r["arch"])  # an LLM graph is large: keep only its arrays
    return data


_JOB: tuple = ()  # (rows, start, dram cap), set before the worker processes fork


def _held_out(arch: str) -> tuple[dict, dict]:
    """Fits both models on every row but `arch`'s; returns their predictions of `arch`'s rows."""
    data, start, cap = _JOB
    train = [(d, y) for d, y, g, *_ in data if g != arch]
    prm = fit(train, start, cap)
    rl = fit_roofline([(d.macs, d.precision, y) for d, y in train])
    pred, base = {}, {}
    for i, (d, y, g, *_) in enumerate(data):
        if g == arch:
            pred[i] = predict(prm, d)
            aa, rate = rl[d.precision]
            base[i] = aa + d.macs / rate
    return pred, base


def _fit_all() -> dict:
    data, start, cap = _JOB
    return fit([(d, y) for d, y, *_ in data], start, cap)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--device", default="x-elite-hexagon")
    ap.add_argument("--write", action="store_true", help="store the all-rows fit in the device file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    dev = load_device(args.device)
    data = collect(dev)
    groups = sorted({g for _, _, g, *_ in data})
    print(f"{len(data)} rows of {len(groups)} architectures; decomposed in {time.perf_counter() - t0:.1f} s")
    start, cap = default_params(dev), dram_share_cap(dev)
    global _JOB
    _JOB = (data, start, cap)
    pred, base = {}, {}
    # One process per core (forked: the decomposed rows are inherited, not pickled); each
    # held-out fit takes ~10 s; progress on stderr.
    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("fork")) as pool:
        full_job = pool.submit(_fit_all)
        jobs = [pool.submit(_held_out, a) for a in groups]
        for k, job in enumerate(as_completed(jobs), 1):
            p, b = job.result()
            pred.update(p)
            base.update(b)
            print(f"\rheld-out fits: {k}/{len(groups)} ({time.perf_counter() - t0:.0f} s)", end="",
                  file=sys.stderr, flush=True)
        full = full_job.result()
    print(file=sys.stderr)
    print(f"\n{'model':44s} {'prec':6s} {'metric':8s} {'GMACs':>9s} {'ops':>5s} {'published':>11s} {'npusim':>11s} "
          f"{'err':>7s} {'roofline':>11s} {'err':>7s}")
    rec = []
    for i, (d, y, g, label, prec, metric) in enumerate(data):
        e, be = pred[i] / y - 1, base[i] / y - 1
        rec.append((prec, metric, family_of(g), abs(e), abs(be)))
        print(f"{label[:44]:44s} {prec:6s} {metric:8s} {d.macs / 1e9:9.3f} {d.n_ops:5d} {y * 1e3:9.3f}ms "
              f"{pred[i] * 1e3:9.3f}ms {e:+7.1%} {base[i] * 1e3:9.3f}ms {be:+7.1%}")

    def med(sel):
        v = [(x, b) for p, m, f, x, b in rec if sel(p, m, f)]
        return (float(np.median([x for x, _ in v])), float(np.median([b for _, b in v])), len(v)) if v else (np.nan, np.nan, 0)
    print("\nleave-one-architecture-out median absolute percentage error (goal in brackets)")
    print(f"  {'rows':34s} {'n':>4s} {'npusim':>8s} {'roofline':>9s}")
    lines = [("all rows [<= 12%]", lambda p, m, f: True),
             ("  float [<= 15%]", lambda p, m, f: p == "float"),
             ("  w8a8 [<= 15%]", lambda p, m, f: p == "w8a8"),
             ("  w8a16 [<= 15%]", lambda p, m, f: p == "w8a16"),
             ("  LLM tokens/s, w4a16 [<= 20%]", lambda p, m, f: m == "tokens/s"),
             ("  LLM TTFT, w4a16 [<= 20%]", lambda p, m, f: m == "ttft"),
             ("SD + Whisper components [<= 20%]", lambda p, m, f: f in ("stable diffusion", "whisper encoder", "whisper decoder"))]
    for label, sel in lines:
        a, b, n = med(sel)
        print(f"  {label:34s} {n:4d} {a:8.1%} {b:9.1%}")
    print("\nby architecture family (median over its held-out rows) [worst <= 35%]")
    fams = sorted({f for _, _, f, _, _ in rec}, key=lambda f: -med(lambda p, m, ff: ff == f)[0])
    for f in fams:
        a, b, n = med(lambda p, m, ff: ff == f)
        print(f"  {f:34s} {n:4d} {a:8.1%} {b:9.1%}")
    fe = [abs(predict(full, d) / y - 1) for d, y, *_ in data]
    print("\nfit on all rows (the shipped calibration): " + ", ".join(f"{k}={full[k]:.4g}" for k in PARAMS)
          + f"; in-sample median APE {np.median(fe):.1%}")
    if args.write:
        write_calibration(Path(dev.source), apply_params(dev, full))
        print(f"wrote [calibration] of {dev.source}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


def write_calibration(path: Path, dev) -> None:
    c = dev.calibration

    def tbl(d):
        return "{ " + ", ".join(f"{k} = {v:.4g}" for k, v in d.items()) + " }"
    text = ("[calibration]\n# Fitted by bench/npusim_calibrate.py --write; see docs/npusim.md.\n"
            f"matrix_efficiency = {tbl(c['matrix_efficiency'])}\n"
            f"dynamic_matmul_efficiency = {c['dynamic_matmul_efficiency']:.4g}\n"
            f"vector_efficiency = {c['vector_efficiency']:.4g}\n"
            f"depthwise_efficiency = {c['depthwise_efficiency']:.4g}\n"
            f"softmax_efficiency = {c['softmax_efficiency']:.4g}\n"
            f"op_us_scale = {tbl(c['op_us_scale'])}\n"
            f"graph_us_scale = {tbl(c['graph_us_scale'])}\n"
            f"dram_share = {c['dram_share']:.4g}\n"
            f"io_gbps = {c['io_gbps']:.4g}\n")
    src = path.read_text()
    src = re.sub(r"^\[calibration\].*\Z", text, src, flags=re.S | re.M)
    path.write_text(src)


if __name__ == "__main__":
    sys.exit(main())
