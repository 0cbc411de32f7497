"""Fitting the device model's free parameters to published latencies.

The free parameters are the calibrated ones of a device file: the matrix unit's efficiency
per precision family (share of peak on full tiles), the vector units' efficiency, and the
per-op and per-graph overheads per precision family. Everything else (MACs per cycle, tiles,
bandwidths, placement, fusion) is fixed by the device description and the graph.

A node's time is max(c, m) + min(c, m) / p + o with c = c1 / efficiency (c1: compute time at
efficiency 1), m the transfer time, p the pipeline depth and o the op overhead; so each
architecture is decomposed once into arrays (c1, m, p, which efficiency, which overhead) and a
fit evaluates the whole calibration set in microseconds. `predict` here and
`model.node_timings` compute the same thing (tests/test_npusim.py checks they agree).
"""
from __future__ import annotations

import copy
import csv
import math
from dataclasses import dataclass

import numpy as np

from ...devices import Device
from .model import graph_overhead_s, io_bytes, node_timings, resolve_shapes, choose_precision
from .placement import place

PARAMS = ("matrix_eff_int8", "matrix_eff_fp16", "vector_eff", "op_us_int8", "op_us_fp16",
          "graph_us_int8", "graph_us_fp16", "io_gbps")
PREC = {"float": "fp16", "w8a8": "int8"}


@dataclass
class Decomposed:
    name: str
    precision: str  # device precision family: int8 | fp16
    c1: np.ndarray
    m: np.ndarray
    p: np.ndarray
    kind: np.ndarray  # 0 matrix, 1 vector
    macs: int
    n_ops: int
    io_bytes: int


def unit_device(dev: Device) -> Device:
    """A copy of `dev` with efficiencies 1 and no overheads: node times then give c1 and m."""
    d = copy.deepcopy(dev)
    d.calibration["matrix_efficiency"] = {k: 1.0 for k in d.calibration["matrix_efficiency"]}
    d.calibration["vector_efficiency"] = 1.0
    d.op_us = d.graph_us = 0.0
    return d


def decompose(g, dev: Device, precision: str, name: str = "") -> Decomposed:
    d1 = unit_device(dev)
    shapes = resolve_shapes(g, {})
    precs = [choose_precision(n, g, precision) for n in g.nodes]
    placement, _ = place(g, shapes, precs, dev.sram.size_bytes)
    f = dev.dvfs[-1].freq_mhz * 1e6
    timed = node_timings(g, d1, shapes, placement, precision, f)
    nodes = [n for n in timed if n.unit]
    pipe = [int(gn.hints.get("pipeline", dev.pipeline)) for gn, n in zip(g.nodes, timed) if n.unit]
    mat = dev.unit("matrix").name
    return Decomposed(name or g.name, "fp16" if precision == "fp16" else "int8",
                      np.array([n.compute_s for n in nodes]), np.array([n.transfer_s for n in nodes]),
                      np.array(pipe, dtype=float), np.array([0 if n.unit == mat else 1 for n in nodes]),
                      sum(n.macs for n in nodes), len(nodes), io_bytes(g, shapes))


def params_of(dev: Device) -> dict:
    c = dev.calibration
    return {"matrix_eff_int8": c["matrix_efficiency"]["int8"], "matrix_eff_fp16": c["matrix_efficiency"]["fp16"],
            "vector_eff": c["vector_efficiency"],
            "op_us_int8": dev.op_us * c["op_us_scale"]["int8"], "op_us_fp16": dev.op_us * c["op_us_scale"]["fp16"],
            "graph_us_int8": dev.graph_us * c["graph_us_scale"]["int8"],
            "graph_us_fp16": dev.graph_us * c["graph_us_scale"]["fp16"], "io_gbps": c["io_gbps"]}


def apply_params(dev: Device, prm: dict) -> Device:
    d = copy.deepcopy(dev)
    c = d.calibration
    c["matrix_efficiency"]["int8"] = prm["matrix_eff_int8"]
    c["matrix_efficiency"]["fp16"] = prm["matrix_eff_fp16"]
    c["vector_efficiency"] = prm["vector_eff"]
    c["op_us_scale"] = {"int8": prm["op_us_int8"] / d.op_us, "fp16": prm["op_us_fp16"] / d.op_us}
    c["graph_us_scale"] = {"int8": prm["graph_us_int8"] / d.graph_us, "fp16": prm["graph_us_fp16"] / d.graph_us}
    c["io_gbps"] = prm["io_gbps"]
    return d


def predict(prm: dict, d: Decomposed) -> float:
    fam = d.precision
    eff = np.where(d.kind == 0, prm[f"matrix_eff_{fam}"], prm["vector_eff"])
    c = d.c1 / eff
    busy = np.where(d.p >= 2, np.maximum(c, d.m) + np.minimum(c, d.m) / d.p, c + d.m)
    return float(busy.sum() + d.n_ops * prm[f"op_us_{fam}"] * 1e-6 + prm[f"graph_us_{fam}"] * 1e-6
                 + d.io_bytes / (prm["io_gbps"] * 1e9))


def nelder_mead(f, x0, steps, iters=2000, tol=1e-10):
    """Plain Nelder-Mead minimization (no SciPy dependency for one small fit)."""
    n = len(x0)
    pts = [np.array(x0, float)] + [np.array(x0, float) + np.eye(n)[i] * steps[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        cen = np.mean(pts[:-1], axis=0)
        xr = cen + (cen - pts[-1]); fr = f(xr)  # noqa: E702
        if fr < vals[0]:
            xe = cen + 2 * (cen - pts[-1]); fe = f(xe)  # noqa: E702
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = cen + 0.5 * (pts[-1] - cen); fc = f(xc)  # noqa: E702
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def _loss(pred, y):
    r = np.log(np.asarray(pred) / np.asarray(y))
    return float(np.mean(r * r))


def fit(rows: list[tuple[Decomposed, float]], start: dict) -> dict:
    """Least squares on log latency; efficiencies kept in (0, 1], overheads >= 0."""
    def unpack(x):
        prm = dict(zip(PARAMS, np.exp(x)))
        return prm

    def f(x):
        prm = unpack(x)
        pen = sum(max(0.0, math.log(prm[k])) ** 2 * 100 for k in PARAMS[:3])
        return _loss([predict(prm, d) for d, _ in rows], [y for _, y in rows]) + pen

    x0 = np.log([max(start[k], 1e-3) for k in PARAMS])
    x, _ = nelder_mead(f, x0, [0.5] * len(PARAMS))
    x, _ = nelder_mead(f, x, [0.2] * len(PARAMS))  # a restart escapes a collapsed simplex
    prm = unpack(x)
    for k in PARAMS[:3]:
        prm[k] = min(prm[k], 1.0)
    return prm


def fit_roofline(rows: list[tuple[int, str, float]]) -> dict:
    """The baseline: latency = a + MACs / rate, one (a, rate) pair per precision, fitted on the
    same log loss."""
    out = {}
    for fam in ("int8", "fp16"):
        sub = [(m, y) for m, p, y in rows if p == fam]
        if not sub:
            continue
        macs = np.array([m for m, _ in sub], float)
        y = np.array([v for _, v in sub])

        def f(x):
            return _loss(np.exp(x[0]) + macs / np.exp(x[1]), y)
        x, _ = nelder_mead(f, [math.log(1e-4), math.log(5e12)], [1.0, 1.0])
        out[fam] = (math.exp(x[0]), math.exp(x[1]))
    return out


def load_rows(csv_path, names: dict) -> list[dict]:
    """Calibration rows of the AI Hub CSV: models in `names`, precision float or w8a8, the
    qnn_dlc runtime (torchscript_onnx_qnn where a model has no qnn_dlc row)."""
    pref = {"qnn_dlc": 0, "torchscript_onnx_qnn": 1}
    best: dict = {}
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            model = r["model"].removesuffix("_quantized")
            if model not in names or r["precision"] not in PREC or r["runtime"] not in pref:
                continue
            key = (model, r["precision"])
            if key not in best or pref[r["runtime"]] < pref[best[key]["runtime"]]:
                best[key] = {**r, "model": model}
    return [best[k] for k in sorted(best)]


__all__ = ["Decomposed", "decompose", "fit", "fit_roofline", "predict", "params_of", "apply_params",
           "load_rows", "PARAMS", "PREC", "graph_overhead_s"]
