"""Fitting the device model's free parameters to published latencies.

The free parameters are the calibrated ones of a device file: the matrix unit's efficiency
per precision family (share of peak on full tiles), the vector units' efficiency, and the
per-op and per-graph overheads (one per precision family in a device file; the fit ties them:
one graph overhead, and an op overhead per byte of activation, see ACT_BYTES). Everything else
(MACs per cycle, tiles, bandwidths, placement, fusion) is fixed by the device description and
the graph.

A node's time is max(c, m) + min(c, m) / p + o with c = c1 / efficiency (c1: compute time at
efficiency 1), m the transfer time, p the pipeline depth and o the node's share of the op
overhead (model.dispatch_shares: independent ops overlap theirs); so each
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

from ...devices import CALIBRATION_DEFAULTS, FAMILY, Device
from .model import (SOFTMAX_OPS, dispatch_shares, graph_overhead_s, io_bytes, node_timings, resolve_shapes, choose_precision,
                    is_dynamic_matmul)
from .placement import place

FAMILIES = ("int8", "fp16", "a16")
PARAMS = ("matrix_eff_int8", "matrix_eff_fp16", "matrix_eff_a16", "dynamic_eff", "vector_eff", "depthwise_eff",
          "softmax_eff", "op_us_int8", "op_us_fp16", "op_us_a16", "graph_us_int8", "graph_us_fp16", "graph_us_a16",
          "dram_share")
# Parameters that are shares of a peak: kept in (0, 1] (dram_share in (0, dram_share_cap]).
SHARES = ("matrix_eff_int8", "matrix_eff_fp16", "matrix_eff_a16", "dynamic_eff", "vector_eff", "depthwise_eff",
          "softmax_eff", "dram_share")
# The fit ties the overheads across families (the device model keeps one per family): a graph's
# launch and sync cost one `graph_us` at every precision, and an op's dispatch costs `op_us`
# per byte of its activations (ACT_BYTES). Fitted freely per family the overheads came out at
# that shape by themselves (op 4.6 / 8.6 / 9.5 us for int8 / fp16 / a16, graph 235 / 255 / 266
# us), but the a16 family's were pinned by its few rows; tied, held out, all rows 11.6 -> 8.9%
# and w8a16 15.3 -> 7.6% (docs/npusim.md, "Night of 2026-12-05").
ACT_BYTES = {"int8": 1, "fp16": 2, "a16": 2}
FIT_PARAMS = ("matrix_eff_int8", "matrix_eff_fp16", "matrix_eff_a16", "dynamic_eff", "vector_eff", "depthwise_eff",
              "softmax_eff", "op_us_per_byte", "graph_us", "dram_share")
# AI Hub precision name -> the device precision npusim times it at.
PREC = {"float": "fp16", "w8a8": "int8", "w8a16": "w8a16", "w4a16": "w4a16"}


@dataclass
class Decomposed:
    name: str
    precision: str  # device precision family: int8 | fp16 | a16
    c1: np.ndarray      # compute time at efficiency 1
    m_dram: np.ndarray  # DRAM transfer time at dram_share 1
    m_sram: np.ndarray
    p: np.ndarray
    kind: np.ndarray  # 0 matrix (weights), 1 vector, 2 matrix (two activations), 3 depthwise, 4 softmax on vectors
    macs: int
    n_ops: int
    io_bytes: int
    n_dispatch: float  # per-op overheads paid: n_ops less those overlapped (model.dispatch_shares)
    io_s: float = 0.0  # graph I/O at the device's host rate (not fitted)

    @property
    def m(self) -> np.ndarray:
        return self.m_dram + self.m_sram


def unit_device(dev: Device) -> Device:
    """A copy of `dev` with efficiencies 1 and no overheads: node times then give c1 and m."""
    d = copy.deepcopy(dev)
    c = d.calibration
    c["matrix_efficiency"] = {k: 1.0 for k in c["matrix_efficiency"]}
    c["vector_efficiency"] = c["dynamic_matmul_efficiency"] = c["depthwise_efficiency"] = 1.0
    c["softmax_efficiency"] = c["dram_share"] = 1.0
    d.op_us = d.graph_us = 0.0
    return d


def decompose(g, dev: Device, precision: str, name: str = "") -> Decomposed:
    d1 = unit_device(dev)
    shapes = resolve_shapes(g, {})
    precs = [choose_precision(n, g, precision) for n in g.nodes]
    placement, _ = place(g, shapes, precs, dev.sram.size_bytes)
    f = dev.dvfs[-1].freq_mhz * 1e6
    timed = node_timings(g, d1, shapes, placement, precision, f)
    keep = [(gn, n) for gn, n in zip(g.nodes, timed) if n.unit]
    n_dispatch = sum(dispatch_shares(g, [bool(n.unit) for n in timed], dev.dispatch_width))
    mat = dev.unit("matrix").name
    kind = [(3 if gn.op in ("conv", "conv_integer") else 4 if gn.op in SOFTMAX_OPS else 1) if n.unit != mat
            else (2 if is_dynamic_matmul(gn, g) else 0) for gn, n in keep]
    fam = FAMILY[precision]
    iob = io_bytes(g, shapes)
    return Decomposed(name or g.name, fam,
                      np.array([n.compute_s for _, n in keep]), np.array([n.dram_s for _, n in keep]),
                      np.array([n.transfer_s - n.dram_s for _, n in keep]),
                      np.array([int(gn.hints.get("pipeline", dev.pipeline)) for gn, _ in keep], dtype=float),
                      np.array(kind), sum(n.macs for _, n in keep), len(keep), iob, n_dispatch,
                      iob / (dev.calibration["io_gbps"] * 1e9))


def params_of(dev: Device) -> dict:
    c = dev.calibration
    out = {f"matrix_eff_{f}": c["matrix_efficiency"][f] for f in FAMILIES}
    out.update({f"op_us_{f}": dev.op_us * c["op_us_scale"][f] for f in FAMILIES})
    out.update({f"graph_us_{f}": dev.graph_us * c["graph_us_scale"][f] for f in FAMILIES})
    out.update(dynamic_eff=c["dynamic_matmul_efficiency"], vector_eff=c["vector_efficiency"],
               depthwise_eff=c["depthwise_efficiency"], softmax_eff=c["softmax_efficiency"], dram_share=c["dram_share"])
    return out


def default_params(dev: Device) -> dict:
    """The fit's starting point: the calibration defaults, not the device file's fitted values,
    so that a held-out fit never starts from a fit that saw its rows."""
    d = copy.deepcopy(dev)
    d.calibration = {**copy.deepcopy(CALIBRATION_DEFAULTS), "io_gbps": dev.calibration["io_gbps"]}
    return params_of(d)


def apply_params(dev: Device, prm: dict) -> Device:
    d = copy.deepcopy(dev)
    c = d.calibration
    c["matrix_efficiency"] = {f: prm[f"matrix_eff_{f}"] for f in FAMILIES}
    c["op_us_scale"] = {f: prm[f"op_us_{f}"] / d.op_us for f in FAMILIES}
    c["graph_us_scale"] = {f: prm[f"graph_us_{f}"] / d.graph_us for f in FAMILIES}
    c["dynamic_matmul_efficiency"] = prm["dynamic_eff"]
    c["vector_efficiency"] = prm["vector_eff"]
    c["depthwise_efficiency"] = prm["depthwise_eff"]
    c["softmax_efficiency"] = prm["softmax_eff"]
    c["dram_share"] = prm["dram_share"]
    return d


def predict(prm: dict, d: Decomposed) -> float:
    fam = d.precision
    me = prm[f"matrix_eff_{fam}"]
    eff = np.select([d.kind == 0, d.kind == 2, d.kind == 3, d.kind == 4],
                    [me, me * prm["dynamic_eff"], prm["depthwise_eff"], prm["softmax_eff"]], prm["vector_eff"])
    c = d.c1 / eff
    m = d.m_dram / prm["dram_share"] + d.m_sram
    busy = np.where(d.p >= 2, np.maximum(c, m) + np.minimum(c, m) / d.p, c + m)
    return float(busy.sum() + d.n_dispatch * prm[f"op_us_{fam}"] * 1e-6 + prm[f"graph_us_{fam}"] * 1e-6 + d.io_s)


class Stack:
    """Many decomposed graphs as one set of arrays, so that a fit evaluates every row of the
    calibration set in a few vectorized operations (`predict` for all rows at once)."""

    def __init__(self, rows: list[Decomposed]):
        self.n = len(rows)
        self.row = np.concatenate([np.full(len(d.c1), i) for i, d in enumerate(rows)]).astype(int)
        cat = lambda f: np.concatenate([getattr(d, f) for d in rows])  # noqa: E731
        self.c1, self.m_dram, self.m_sram, self.p, self.kind = (cat(k) for k in ("c1", "m_dram", "m_sram", "p", "kind"))
        fams = np.array([FAMILIES.index(d.precision) for d in rows])
        self.node_fam = fams[self.row]
        self.fam = fams
        self.n_dispatch = np.array([d.n_dispatch for d in rows], float)
        self.io_s = np.array([d.io_s for d in rows])

    def predict(self, prm: dict) -> np.ndarray:
        me = np.array([prm[f"matrix_eff_{f}"] for f in FAMILIES])[self.node_fam]
        eff = np.select([self.kind == 0, self.kind == 2, self.kind == 3, self.kind == 4],
                        [me, me * prm["dynamic_eff"], prm["depthwise_eff"], prm["softmax_eff"]], prm["vector_eff"])
        c = self.c1 / eff
        m = self.m_dram / prm["dram_share"] + self.m_sram
        busy = np.where(self.p >= 2, np.maximum(c, m) + np.minimum(c, m) / self.p, c + m)
        op = np.array([prm[f"op_us_{f}"] for f in FAMILIES])[self.fam]
        gr = np.array([prm[f"graph_us_{f}"] for f in FAMILIES])[self.fam]
        return np.bincount(self.row, busy, self.n) + (self.n_dispatch * op + gr) * 1e-6 + self.io_s


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
    """Mean absolute log error. Its minimizer is a median fit: a row no model explains (an
    outlier measurement, a toolchain the other rows do not share) moves it no more than any
    other row, where squared errors let such rows pull every parameter towards them. (On the
    calibration set, leave-one-architecture-out, this change alone: 18.1% -> 15.7% median error;
    docs/npusim.md.)"""
    r = np.log(np.asarray(pred) / np.asarray(y))
    return float(np.mean(np.abs(r)))


def dram_share_cap(dev: Device) -> float:
    """The largest dram_share: the one at which a stream reaches the bus peak, its per-burst
    setups entirely overlapped (the model's stream time is bytes / bandwidth plus a setup per
    burst, both divided by dram_share)."""
    f = dev.dvfs[-1].freq_mhz * 1e6
    return 1 + dev.dram.bandwidth_gbps * 1e9 * dev.setup_cycles / (dev.burst_bytes * f * dev.dma_engines)


def tied(prm: dict) -> dict:
    """The per-family overheads of the fit's two tied ones (FIT_PARAMS)."""
    out = {k: v for k, v in prm.items() if k not in ("op_us_per_byte", "graph_us")}
    for f in FAMILIES:
        out[f"op_us_{f}"] = prm["op_us_per_byte"] * ACT_BYTES[f]
        out[f"graph_us_{f}"] = prm["graph_us"]
    return out


def fit(rows: list[tuple[Decomposed, float]], start: dict, dram_cap: float = 1.0) -> dict:
    """Minimizes `_loss` over the rows with the overheads tied (FIT_PARAMS); shares kept in
    (0, 1] (dram_share in (0, dram_cap]), overheads >= 0. The matrix efficiency of a precision
    family no row has, and the efficiency of a kind of node no row has, keep their start values;
    the tied overheads start from the int8 family's."""
    stack = Stack([d for d, _ in rows])
    y = np.array([t for _, t in rows])
    have = {d.precision for d, _ in rows}
    start = {**start, "op_us_per_byte": start["op_us_int8"] / ACT_BYTES["int8"], "graph_us": start["graph_us_int8"]}
    free = [k for k in FIT_PARAMS if not k.startswith("matrix_eff_") or k.rsplit("_", 1)[1] in have]
    for key, kind in (("dynamic_eff", 2), ("depthwise_eff", 3), ("softmax_eff", 4)):
        if not any((d.kind == kind).any() for d, _ in rows):  # no attention / depthwise / softmax
            free.remove(key)
    if not any((d.m_dram > 0).any() for d, _ in rows):  # nothing streams from DRAM
        free.remove("dram_share")
    cap = {k: dram_cap if k == "dram_share" else 1.0 for k in SHARES}

    def unpack(x):
        prm = dict(start)
        prm.update(zip(free, np.exp(x)))
        return tied(prm)

    def f(x):
        prm = unpack(x)
        pen = sum(max(0.0, math.log(prm[k] / cap[k])) ** 2 * 100 for k in SHARES if k in free)
        return _loss(stack.predict(prm), y) + pen

    x0 = np.log([max(min(start[k], cap.get(k, math.inf)), 1e-3) for k in free])
    x, v = nelder_mead(f, x0, [0.5] * len(free), iters=3000)
    for step in (0.3, 0.1, 0.3, 0.1, 0.3, 0.1):  # restarts escape a collapsed simplex (the loss has kinks)
        was = v
        x, v = nelder_mead(f, x, [step] * len(free), iters=3000)
        if was - v < 1e-6:
            break
    prm = unpack(x)
    for k in SHARES:
        prm[k] = min(prm[k], cap[k])
    return prm


def fit_roofline(rows: list[tuple[int, str, float]]) -> dict:
    """The baseline: latency = a + MACs / rate, one (a, rate) pair per precision, fitted on the
    same loss."""
    out = {}
    for fam in FAMILIES:
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


# Runtimes whose rows measure the model on the NPU through QNN, most preferred first: the
# current qnn_dlc / qnn_context_binary rows, then the older names of the same path; "onnx"
# (ONNX Runtime's QNN provider) only where a model has nothing else (Swin).
RUNTIMES = {"qnn_dlc": 0, "qnn_context_binary": 0, "qnn": 1, "torchscript_onnx_qnn": 2, "onnx": 3}


def load_rows(csv_path, names: dict, precisions=("float", "w8a8", "w8a16")) -> list[dict]:
    """Calibration rows of the AI Hub CSV: models in `names`, the given precisions, the most
    preferred runtime each (model, precision) has (RUNTIMES). A float or w8a8 row through
    ONNX Runtime is kept; its w8a16 rows are not (they run 10-20x slower than the same model
    through QNN: not an NPU figure)."""
    pref = RUNTIMES
    best: dict = {}
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            model = r["model"].removesuffix("_quantized")
            if model not in names or r["precision"] not in precisions or r["runtime"] not in pref:
                continue
            if r["runtime"] == "onnx" and r["precision"] == "w8a16":
                continue
            key = (model, r["precision"])
            if key not in best or pref[r["runtime"]] < pref[best[key]["runtime"]]:
                best[key] = {**r, "model": model}
    return [best[k] for k in sorted(best)]


__all__ = ["Decomposed", "Stack", "decompose", "dram_share_cap", "fit", "fit_roofline", "predict", "params_of", "apply_params",
           "load_rows", "default_params", "tied", "PARAMS", "FIT_PARAMS", "ACT_BYTES", "PREC", "FAMILIES", "graph_overhead_s"]
