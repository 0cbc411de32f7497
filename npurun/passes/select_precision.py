"""Precision selection: set every node's precision (`node.precision`) and the reason (`node.why`).

    g = select_precision(g, policy="auto", overrides="Conv=int8,/blocks.3/*=fp16")

The rule and the policies are npurun/precision/analyze.py's; ranges come from calibration
(npurun/precision/calibrate.py, already run on `g`). For every node given an integer
precision, the scale and zero point of its activation and result are recorded in their
`calib` (`q8=[scale, zp]`, `q16=[...]`), so the compiled .npuir carries the exact
quantization the emulation (and a device) uses.

Fused epilogues: an integer conv/matmul/gemm whose result only a tanh, sigmoid or relu reads
applies that activation to its int32 accumulator and requantizes once, to the activation's
output range (as NPUs' post-processing units do). The activation node then carries the integer
suffix (`tanh_i8`, its `why` says it is fused), the conv's result gets no `q8` (it is never
stored as 8-bit), and the activation's result does. One rounding instead of two, and the one
kept is at the activation's output, where tanh/sigmoid have compressed the range.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..precision import POLICIES, PrecisionError
from ..precision.analyze import Analyzer, decide
from ..precision.overrides import parse_overrides, resolve
from ..precision.emulate import EPILOGUE_OPS
from ..precision.quantize import ACT_QMAX, act_params, bounds

import math

_BITS = {"i8": 8, "i8acc16": 8, "i16": 16}
_MAC_OPS = ("conv", "matmul", "gemm")


def select_precision(g: Graph, policy: str = "auto", overrides=None, value_shapes: dict | None = None) -> Graph:
    """`value_shapes`: concrete shapes of the values (as calibration saw them), for the cost
    of each node; without them symbolic dims count 1 (leading) or 64."""
    if policy not in POLICIES:
        raise PrecisionError(f"precision {policy!r}: expected one of {', '.join(POLICIES)}")
    forced = resolve(parse_overrides(overrides), g.nodes)
    a = Analyzer(g, value_shapes)
    for n in g.nodes:
        d = decide(a, n, policy, forced.get(id(n)))
        n.precision, n.why = d.precision, d.why
    fused = _fuse_epilogues(g, a, forced)
    for n in g.nodes:
        bits = _BITS.get(n.precision)
        if not bits:
            continue
        if n.op in EPILOGUE_OPS:  # a fused activation: it requantizes its producer's accumulator
            names = [n.outputs[0]]
        elif id(n) in fused:      # its result stays an int32 accumulator
            names = [n.inputs[0]]
        else:
            names = [n.inputs[0], n.outputs[0]]
        for nm in names:
            calib = g.values[nm].calib
            if f"q{bits}" in calib:
                continue
            lim = _saturation(a.readers.get(nm, []), bits) if nm == n.outputs[0] else None
            if lim is not None:
                lo, hi = bounds(calib)
                if lo < lim[0] or hi > lim[1]:
                    calib = {**calib, "min": max(lo, lim[0]), "max": min(hi, lim[1]), "method": "minmax"}
                    n.why += f"; result range clipped to [{lim[0]:.3g}, {lim[1]:.3g}] where {lim[2]} saturates"
            s, z = act_params(calib, bits)
            g.values[nm].calib[f"q{bits}"] = [float(s), int(z)]
    return g


def _fuse_epilogues(g: Graph, a: Analyzer, forced: dict) -> set:
    """Give each integer conv/matmul/gemm whose result only a tanh / sigmoid / relu reads that
    activation as its epilogue: the activation takes the node's integer precision (its
    suffix: `tanh_i8`) and is applied to the int32 accumulator before the one requantization,
    to the activation's own output range. Not when an override forces the activation, or the
    result is a graph output. Returns the ids of the fused conv/matmul/gemm nodes."""
    fused = set()
    for n in g.nodes:
        if n.precision not in _BITS or n.op not in _MAC_OPS or n.outputs[0] in g.outputs:
            continue
        readers = a.readers.get(n.outputs[0], [])
        if len(readers) != 1 or readers[0].op not in EPILOGUE_OPS or id(readers[0]) in forced:
            continue
        act = readers[0]
        if not g.values[act.outputs[0]].calib:
            continue
        act.precision = "i16" if n.precision == "i16" else "i8"
        bits = _BITS[act.precision]
        act.why = (f"fused into {n.name or n.op}'s integer epilogue: {act.op} of its int32 accumulator, "
                   f"then one requantization to {bits}-bit (this node's result range)")
        n.why += (f"; result not requantized: {act.op} {act.name or ''} applies to the int32 accumulator "
                  f"in this node's epilogue").replace("  ", " ")
        fused.add(id(n))
    return fused


def _saturation(readers, bits):
    """(lo, hi, op) beyond which the value's only reader, a saturating activation, no longer
    changes its own quantized result by half a step: quantizing past it wastes resolution."""
    if len(readers) != 1 or readers[0].op not in ("tanh", "sigmoid"):
        return None
    step = (2.0 if readers[0].op == "tanh" else 1.0) / ACT_QMAX[bits]
    # tanh(x) = 1 - step/2  <=>  x = atanh(1 - step/2);  sigmoid(x) = 1 - step/2 <=> x = ln(2/step - 1)
    x = math.atanh(1 - step / 2) if readers[0].op == "tanh" else math.log(2 / step - 1)
    return -x, x, readers[0].op
