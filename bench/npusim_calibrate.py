"""Calibrate npusim's x-elite-hexagon model against published AI Hub latencies and validate it
leave-one-architecture-out, beside the MACs-only roofline baseline.

    .venv/bin/python bench/npusim_calibrate.py [--csv /work/shared/data/aihub_x_elite.csv] [--write]

For every architecture A of npurun/zoo/architectures (ESRGAN and Real-ESRGAN x4plus are one
architecture), both models are fitted on the rows of all other architectures and predict A's
rows; the table shows those held-out predictions. --write stores the fit on all rows in the
device file's [calibration] section.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from npurun.backends.npusim.calibrate import (PARAMS, PREC, apply_params, decompose, fit,  # noqa: E402
                                              fit_roofline, load_rows, params_of, predict)
from npurun.devices import HERE, load_device  # noqa: E402
from npurun.zoo.architectures import CALIBRATION, build  # noqa: E402

SAME_ARCH = {"esrgan": "rrdbnet", "real_esrgan_x4plus": "rrdbnet"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--csv", default="/work/shared/data/aihub_x_elite.csv")
    ap.add_argument("--device", default="x-elite-hexagon")
    ap.add_argument("--write", action="store_true", help="store the all-rows fit in the device file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    dev = load_device(args.device)
    rows = load_rows(args.csv, CALIBRATION)
    graphs = {}
    data = []
    for r in rows:
        arch = CALIBRATION[r["model"]]
        g = graphs.get(arch) or graphs.setdefault(arch, build(arch))
        d = decompose(g, dev, PREC[r["precision"]], r["model"])
        data.append((d, float(r["latency_ms"]) * 1e-3, SAME_ARCH.get(arch, arch), r))
    groups = sorted({a for _, _, a, _ in data})
    print(f"{len(data)} rows ({sum(1 for d in data if d[0].precision == 'fp16')} float, "
          f"{sum(1 for d in data if d[0].precision == 'int8')} w8a8) of {len(groups)} architectures; "
          f"decomposed in {time.perf_counter() - t0:.1f} s")
    start = params_of(dev)
    pred, base = {}, {}
    for a in groups:
        train = [(d, y) for d, y, g, _ in data if g != a]
        prm = fit(train, start)
        rl = fit_roofline([(d.macs, d.precision, y) for d, y in train])
        for i, (d, y, g, _) in enumerate(data):
            if g == a:
                pred[i] = predict(prm, d)
                aa, rate = rl[d.precision]
                base[i] = aa + d.macs / rate
    print(f"\n{'model':34s} {'prec':5s} {'GMACs':>8s} {'ops':>5s} {'published':>10s} {'npusim':>9s} {'err':>7s} "
          f"{'roofline':>9s} {'err':>7s}")
    errs, berrs = [], []
    for i, (d, y, g, r) in enumerate(data):
        e, be = pred[i] / y - 1, base[i] / y - 1
        errs.append((d.precision, abs(e)))
        berrs.append((d.precision, abs(be)))
        print(f"{r['model'][:34]:34s} {r['precision']:5s} {d.macs / 1e9:8.3f} {d.n_ops:5d} {y * 1e3:9.3f}ms "
              f"{pred[i] * 1e3:7.3f}ms {e:+7.1%} {base[i] * 1e3:7.3f}ms {be:+7.1%}")

    def med(xs, fam=None):
        v = [x for p, x in xs if fam is None or p == fam]
        return float(np.median(v)) if v else float("nan")
    print("\nleave-one-architecture-out median absolute percentage error")
    print(f"  {'':10s} {'npusim':>8s} {'MACs-only roofline':>20s}")
    for label, fam in (("all", None), ("float", "fp16"), ("w8a8", "int8")):
        print(f"  {label:10s} {med(errs, fam):8.1%} {med(berrs, fam):20.1%}")
    full = fit([(d, y) for d, y, _, _ in data], start)
    fe = [abs(predict(full, d) / y - 1) for d, y, _, _ in data]
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
            f"vector_efficiency = {c['vector_efficiency']:.4g}\n"
            f"op_us_scale = {tbl(c['op_us_scale'])}\n"
            f"graph_us_scale = {tbl(c['graph_us_scale'])}\n"
            f"io_gbps = {c['io_gbps']:.4g}\n")
    src = path.read_text()
    src = re.sub(r"^\[calibration\].*\Z", text, src, flags=re.S | re.M)
    path.write_text(src)


if __name__ == "__main__":
    sys.exit(main())
