"""The `npusim` backend: a calibrated model of a Hexagon-class NPU (device `npusim:DEVICE`,
DEVICE a name from npurun/devices or a path to a device .toml; default x-elite-hexagon).

A run computes the outputs functionally with the reference kernels (so they equal the
reference backend's) and accounts for what the device would spend: per-node cycles, transfers,
overheads, energy and temperature (`Program.last_report`, a `simulate.Report`). Precision
emulation: values are computed at the graph's own dtypes; with `emulate_fp16=True` every
float32 result of a node that runs at fp16 is rounded to fp16 storage, as the device keeps it.
Nodes that carry a precision (`conv_i8`, `matmul_f16`, ... as `npurun.compile` sets them) are
computed exactly at that precision by `Program` (npurun/precision/emulate.py); a plain float
graph estimated with `--precision int8` is timed as int8 but computed in float.
"""
from __future__ import annotations

import numpy as np

from ...devices import DEFAULT_DEVICE, load_device
from .. import register
from ..base import Backend, Program, Step
from ..reference.kernels import KERNELS
from .model import choose_precision
from .simulate import Report, estimate


def has_kernel(node, graph) -> bool:
    """npurun has no kernel for this op yet."""
    return node.op in KERNELS


class NpusimProgram(Program):
    def __init__(self, graph, backend: "NpusimBackend"):
        super().__init__(graph, KERNELS, backend.name)
        self.device = backend.device
        self.precision = backend.precision
        self.last_report: Report | None = None
        if backend.emulate_fp16:
            self._round_fp16()

    def _round_fp16(self):
        steps = []
        for n, fn, attrs, dead in self.steps:
            if choose_precision(n, self.graph, self.precision) == "fp16":
                fn = _rounding(fn)
            steps.append(Step(n, fn, attrs, dead))
        self.steps = steps

    def run(self, feeds, progress=None, attention=None):
        out = super().run(feeds, progress, attention)
        shapes = {k: np.shape(v) for k, v in feeds.items()}
        self.last_report = estimate(self.graph, self.device, shapes, self.precision)
        return out


def _rounding(fn):
    def run(*args, **kw):
        res = fn(*args, **kw)
        if isinstance(res, tuple):
            return tuple(_r16(r) for r in res)
        return _r16(res)
    return run


def _r16(a):
    if isinstance(a, np.ndarray) and a.dtype == np.float32:
        return a.astype(np.float16).astype(np.float32)
    return a


@register
class NpusimBackend(Backend):
    """Reference kernels for the outputs, a calibrated NPU model for time, energy, temperature."""

    name = "npusim"
    rules = (has_kernel,)

    def __init__(self, target=None, parallelism=1, precision: str = "auto", emulate_fp16: bool = False):
        super().__init__(target, parallelism)
        self.device = load_device(target or DEFAULT_DEVICE)
        self.precision = precision
        self.emulate_fp16 = emulate_fp16

    def compile(self, graph):
        return NpusimProgram(graph, self)


__all__ = ["NpusimBackend", "NpusimProgram", "estimate", "Report"]
