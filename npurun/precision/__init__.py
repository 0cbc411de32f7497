"""Precision selection, calibration and exact emulation of reduced-precision arithmetic.

    g = npurun.compile("model.onnx", precision="auto", calibration="random:8")

* `calibrate.py` runs sample inputs through the model and records each value's range (min/max,
  percentiles, the MSE-minimising clipping range) in `Value.calib`;
* `analyze.py` is the founding document's rule: per node, the cheapest precision that keeps
  the answer right, with the reason (`Node.why`);
* `overrides.py` parses `Conv=int8,/blocks.3/*=fp16`;
* `gptq.py` rounds integer nodes' weights for their outputs on the calibration inputs (GPTQ)
  and records the result in the graph (weights on the int8 grid, scales as `w8`);
* `quantize.py` holds the quantization arithmetic (scales, zero points, the 16-bit
  accumulation proof) and `emulate.py` turns a node's precision into a kernel that computes
  exactly what a device would (every `Program`-based backend applies it).

Modes (user spelling -> IR suffix): fp32 -> (none), fp16 -> f16, bf16 -> bf16, int8 -> i8,
int8_acc16 -> i8acc16, int16 -> i16 (int16 activations, int8 weights). See docs/precision.md.
"""
from __future__ import annotations

from ..errors import NpurunError

# User-facing names (and the IR's own) -> IR precision suffix; "f32" is the unsuffixed default.
MODES = {"fp32": "f32", "f32": "f32", "float32": "f32",
         "fp16": "f16", "f16": "f16", "float16": "f16",
         "bf16": "bf16", "bfloat16": "bf16",
         "int8": "i8", "i8": "i8", "w8a8": "i8",
         "int8_acc16": "i8acc16", "i8acc16": "i8acc16",
         "int16": "i16", "i16": "i16", "w8a16": "i16"}
USER_NAME = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "i8": "int8", "i8acc16": "int8_acc16",
             "i16": "int16"}
POLICIES = ("auto", "fp32", "fp16", "bf16", "int8", "int8_acc16", "int16")


class PrecisionError(NpurunError):
    """A precision request that cannot be honoured: unknown mode, override matching no node,
    calibration data that does not fit the model, ranges no mode can represent."""


def ir_precision(name: str, where: str = "precision") -> str:
    """`int8` -> `i8`, ...; an unknown name is an error listing the known ones."""
    p = MODES.get(str(name).strip().lower())
    if p is None:
        raise PrecisionError(f"{where}: unknown precision {name!r}; expected one of "
                             f"{', '.join(USER_NAME.values())}")
    return p
