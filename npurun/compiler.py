"""`npurun.compile`: a model in, a compiled graph out — standard passes, calibration, precision.

    g = npurun.compile("espcn_x3.onnx", precision="auto", calibration="random:8")
    npurun.save(g, "espcn.npuir")          # ranges, scales and each node's reason are in the text
    npurun.Executor("cpu").run_sync(g, x)  # runs with exact emulation of each node's precision

`precision` is a policy (npurun/precision/analyze.py): auto, fp32, fp16, bf16, int8,
int8_acc16, int16. `calibration` is `random:N`, a folder, or a list of feed dicts; policies
that need ranges (all but fp32 and bf16) calibrate on `random:4` when none is given (the CLI
says so). `overrides` forces precisions per op type or node name.
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

from .errors import NpurunError
from .ir.graph import Graph
from .passes.pipeline import run_pipeline, standard_pipeline
from .passes.select_precision import select_precision
from .precision import POLICIES, PrecisionError
from .precision.calibrate import calibrate, feeds_from
from .precision.gptq import refine_weights

DEFAULT_CALIBRATION = "random:4"
_NO_RANGES = ("fp32", "bf16")


def compile(model, precision: str = "auto", calibration=None, overrides=None, target: str = "cpu",
            *, method: str = "minmax", verify_each: bool = False) -> Graph:
    """The compiled graph of `model` (a path or a Graph, which is not modified)."""
    from .frontend import load
    if precision not in POLICIES:
        raise PrecisionError(f"precision {precision!r}: expected one of {', '.join(POLICIES)}")
    if isinstance(model, (str, os.PathLike, Path)):
        g = load(model)
    elif isinstance(model, Graph):
        g = copy.deepcopy(model)
    else:
        raise NpurunError(f"npurun.compile: expected a model path or a Graph, got {type(model).__name__}")
    g = run_pipeline(g, standard_pipeline(), verify_each=verify_each)
    shapes: dict = {}  # every tensor's shape on the first calibration input
    if calibration is None and precision not in _NO_RANGES:
        calibration = DEFAULT_CALIBRATION
    feeds = None
    if calibration is not None:
        feeds = feeds_from(calibration, g)
        calibrate(g, feeds, method, shapes)
    passes = [functools.partial(select_precision, policy=precision, overrides=overrides,
                                value_shapes=shapes or None)]
    if feeds:  # integer nodes' weights rounded for their outputs on the same inputs (GPTQ)
        passes.append(functools.partial(_refine, feeds=feeds))
    return run_pipeline(g, passes, verify_each=verify_each)


def with_precision(graph: Graph, precision: str, calibrate=None, target: str = "cpu", default_feeds=None) -> Graph:
    """`graph` compiled at `precision` (returned unchanged for fp32), calibrated on `calibrate`
    (a folder, `random:N` or feeds) or else on `default_feeds()`: what the CLI's --precision and
    --calibrate do, shared by `npurun upscale`, `run` and `batch`."""
    if precision == "fp32":
        return graph
    cal = calibrate if calibrate else (None if precision == "bf16" or default_feeds is None else default_feeds())
    return compile(graph, precision=precision, calibration=cal, target=target)


def _refine(g: Graph, feeds) -> Graph:
    refine_weights(g, feeds)
    return g
