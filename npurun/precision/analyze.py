"""The precision analyzer: per node, the cheapest precision that keeps the answer right, and why.

The founding document's rule (policy `auto`):

1. a conv / matmul / gemm with constant weights whose arithmetic intensity (MACs per byte
   moved, bytes counted at int8: one per activation, weight and result element) exceeds 50
   runs INT8_ACC16 — if the quantized weights prove that no 16-bit pair sum can overflow for
   any int8 activation (quantize.acc16_overflow);
2. else a node whose values (calibrated inputs and results, constant operands) stay below
   65504 / 16 in magnitude (fp16's largest number, with 16x headroom) runs FP16;
3. else FP32.

Sensitive ops — softmax / log-softmax / hardmax, normalizations, losses, and reductions or
global pools with a fan-in above 256 — stay FP32 unless forced. Ops that compute nothing in
floating point (shape arithmetic, integer ops, data movement such as reshape/transpose/
depth_to_space, which are exact at any precision) and the model's own quantization (QDQ
pairs, QLinear / integer ops) get no precision. Other policies force one mode on every node
that can take it (see `decide`); a node that cannot falls back, and its reason says why.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..ir.cost import concrete_values
from ..ir.graph import Graph
from ..ir.ops import OPS
from ..ir.shapes import numel
from . import quantize as q

INTENSITY_MIN = 50.0
FP16_MAX = 65504.0
HEADROOM = 16.0
FAN_IN_MAX = 256
_FLOAT = ("f32",)
_SENSITIVE_GROUPS = {"normalizing", "norm", "loss"}
_GLOBAL_POOLS = {"global_average_pool", "global_max_pool", "global_lp_pool"}
_INT_OPS = {"conv", "matmul", "gemm"}


@dataclass
class Decision:
    precision: str | None  # IR suffix, or None for the unsuffixed (fp32 / not applicable)
    why: str


def _fmt(x: float) -> str:
    return f"{x:.4g}"


class Analyzer:
    """Facts about one graph that decisions need: concrete shapes, readers and writers."""

    def __init__(self, g: Graph, value_shapes: dict | None):
        self.g = g
        value_shapes = value_shapes or {}
        shapes = {n: value_shapes.get(n) or _concrete(g.values[n].shape) for n in g.inputs
                  if g.values[n].kind == "tensor"}
        self.vals = concrete_values(g, shapes)
        for nm, shape in value_shapes.items():  # what a real run saw beats inference
            if nm in self.vals:
                self.vals[nm] = replace(self.vals[nm], shape=tuple(shape))
        self.producer = g.producers()
        self.readers = g.consumers()

    # --- facts
    def numel(self, name) -> int | None:
        v = self.vals.get(name)
        return None if v is None or v.kind != "tensor" else numel(v.shape)

    def is_float_compute(self, n) -> bool:
        return any(self.g.values[o].dtype in _FLOAT and self.g.values[o].kind == "tensor" for o in n.outputs)

    def in_qdq(self, n) -> bool:
        ins = any(self.producer.get(i) is not None and self.producer[i].op == "dequantize_linear"
                  for i in n.inputs if i)
        outs = any(r.op == "quantize_linear" for o in n.outputs for r in self.readers.get(o, []))
        return ins or outs

    def fan_in(self, n) -> int:
        a, b = self.numel(n.inputs[0]), self.numel(n.outputs[0])
        return a // max(b, 1) if a and b else 0

    def sensitive(self, n) -> str | None:
        groups = OPS[n.op].groups
        if groups & _SENSITIVE_GROUPS:
            return f"{n.op} is precision-sensitive (normalization/softmax)"
        if ("reduce" in groups or n.op in _GLOBAL_POOLS) and self.fan_in(n) > FAN_IN_MAX:
            return f"{n.op} reduces {self.fan_in(n)} values per result (> {FAN_IN_MAX})"
        return None

    def max_abs(self, n) -> float | None:
        """Largest magnitude of the node's float operands and results; None if one is not calibrated."""
        m = 0.0
        for nm in [i for i in n.inputs if i] + list(n.outputs):
            v = self.g.values[nm]
            if v.kind != "tensor" or v.dtype not in _FLOAT:
                continue
            if v.is_const:
                m = max(m, float(np.abs(v.data).max()) if v.data.size else 0.0)
            elif v.calib:
                m = max(m, abs(float(v.calib["min"])), abs(float(v.calib["max"])))
            else:
                return None
        return m

    def integer_ok(self, n) -> str | None:
        """None if the node can run an integer mode, else why not."""
        if n.op not in _INT_OPS:
            return f"{n.op} has no integer kernel (only conv, matmul, gemm)"
        x, w = self.g.values[n.inputs[0]], self.g.values.get(n.inputs[1])
        if w is None or not w.is_const:
            return "its weights are computed at run time (integer modes need constant weights)"
        if x.is_const or x.dtype not in _FLOAT or w.dtype not in _FLOAT:
            return "its operands are not a float activation and float weights"
        if n.op == "matmul" and (w.data.ndim != 2 or len(x.shape) < 2):
            return "integer matmul needs a 2-D weight and an activation of rank >= 2"
        if n.op == "conv" and len(n.inputs) > 2 and n.inputs[2] and not self.g.values[n.inputs[2]].is_const:
            return "its bias is computed at run time"
        for nm in (n.inputs[0], n.outputs[0]):
            if not self.g.values[nm].calib:
                return f"value {nm!r} has no calibrated range (calibrate first)"
        return None

    def weight_matrix(self, n) -> np.ndarray:
        """Quantized weights (M, K) in accumulation order (see quantize.py)."""
        wv = self.g.values[n.inputs[1]]
        w, s = wv.data, q.recorded_scale(wv)
        if n.op == "conv":
            wq, _ = q.weight_params(w, 0, s)
            return wq.reshape(wq.shape[0], -1)
        trans_b = n.op == "gemm" and n.attrs.get("trans_b", 0)
        wq, _ = q.weight_params(w.T if trans_b else w, 1, s)
        return wq.T

    def intensity(self, n) -> float | None:
        """MACs per byte moved at int8 (one byte per operand and result element); None when
        the shapes are not known (they depend on values and no calibration run saw them)."""
        from ..ir.ops import macs
        names = [i for i in n.inputs if i] + list(n.outputs)
        elems = [self.numel(nm) for nm in names]
        if any(e is None for e in elems):
            return None
        shapes = [tuple(self.vals[i].shape) if i else None for i in n.inputs]
        m = macs(n, shapes, [tuple(self.vals[o].shape) for o in n.outputs])
        return m / max(1, sum(elems))


def _concrete(shape) -> tuple:
    return tuple(d if isinstance(d, int) else (1 if i == 0 else 64) for i, d in enumerate(shape))


# ------------------------------------------------------------------ the rule

def decide(a: Analyzer, n, policy: str, forced: tuple[str, str] | None) -> Decision:
    """The precision of node `n` under `policy` (auto, fp32, fp16, bf16, int8, int8_acc16,
    int16), or under a forced precision (IR suffix, rule text) from an override."""
    if n.regions:
        return Decision(None, "control flow: its regions run at full precision")
    if OPS[n.op].groups & {"quant"}:
        return Decision(None, "the model's own quantization op: its scales are kept as they are")
    if not a.is_float_compute(n):
        return Decision(None, "no floating-point result: exact at any precision")
    if a.in_qdq(n):
        return Decision(None, "between the model's own DequantizeLinear/QuantizeLinear: its scales are kept")
    if "view" in OPS[n.op].groups:
        return Decision(None, "data movement: exact at any precision")
    if forced is not None:
        return _forced(a, n, *forced)
    if policy == "fp32":
        return Decision(None, "fp32 requested")
    if policy == "bf16":
        return Decision("bf16", "bf16 requested (fp32's exponent range: no overflow check needed)")
    if policy == "fp16":
        return _float16(a, n, "fp16 requested", strict=False)
    if policy in ("int8", "int16", "int8_acc16"):
        return _integer(a, n, policy)
    return _auto(a, n)


def _auto(a: Analyzer, n) -> Decision:
    sens = a.sensitive(n)
    if sens:
        return Decision(None, f"fp32: {sens}")
    note = ""
    if n.op in _INT_OPS:
        bad = a.integer_ok(n)
        if bad:
            note = f"no int8: {bad}"
        else:
            inten = a.intensity(n)
            if inten is None or inten == 0:
                note = "no int8: its shapes (and so its intensity) are unknown without a calibration run"
            elif inten <= INTENSITY_MIN:
                note = f"intensity {inten:.1f} MAC/B <= {INTENSITY_MIN:.0f}: int8 not worth it"
            else:
                wk = a.weight_matrix(n)
                ov = q.acc16_overflow(wk)
                if ov is None:
                    return Decision("i8acc16", f"intensity {inten:.1f} MAC/B > {INTENSITY_MIN:.0f} and 16-bit "
                                               f"accumulation proven safe (largest pair sum {q.acc16_headroom(wk)} "
                                               f"<= 32767)")
                c, j, s = ov
                note = (f"intensity {inten:.1f} MAC/B > {INTENSITY_MIN:.0f} but int8_acc16 could overflow "
                        f"(channel {c}, weight pair {j}: pair sum up to {s})")
    return _float16(a, n, note, strict=True)


def _float16(a: Analyzer, n, note: str, strict: bool) -> Decision:
    """fp16 if the node's range fits (with headroom when the analyzer chose it), else fp32."""
    limit = FP16_MAX / HEADROOM if strict else FP16_MAX
    m = a.max_abs(n)
    pre = f"{note}; " if note else ""
    if m is None:
        if strict:
            return Decision(None, f"{pre}fp32: a value of this node has no calibrated range")
        return Decision("f16", f"{pre}range not calibrated (unchecked)")
    if m < limit:
        how = f"< {_fmt(limit)} = 65504/{HEADROOM:.0f}" if strict else "< 65504"
        return Decision("f16", f"{pre}range max|x| {_fmt(m)} fits fp16 ({how})")
    return Decision(None, f"{pre}fp32: range max|x| {_fmt(m)} does not fit fp16 (limit {_fmt(limit)})")


def _integer(a: Analyzer, n, policy: str) -> Decision:
    if n.op in _INT_OPS:
        bad = a.integer_ok(n)
        if bad is None:
            if policy == "int16":
                return Decision("i16", "int16 requested: int16 activations, int8 weights (w8a16)")
            if policy == "int8_acc16":
                ov = q.acc16_overflow(a.weight_matrix(n))
                if ov is None:
                    return Decision("i8acc16", "int8_acc16 requested, 16-bit accumulation proven safe")
                return Decision("i8", f"int8_acc16 requested but could overflow (channel {ov[0]}, "
                                      f"weight pair {ov[1]}: pair sum up to {ov[2]}): int8, 32-bit accumulation")
            return Decision("i8", "int8 requested: w8a8, 32-bit accumulation")
        return _auto_float(a, n, f"{policy} requested but {bad}")
    return _auto_float(a, n, "")


def _auto_float(a: Analyzer, n, note: str) -> Decision:
    sens = a.sensitive(n)
    if sens:
        return Decision(None, (f"{note}; " if note else "") + f"fp32: {sens}")
    return _float16(a, n, note, strict=True)


def _forced(a: Analyzer, n, prec: str, rule: str) -> Decision:
    by = f"forced by {rule}"
    if prec == "f32":
        return Decision(None, by)
    if prec == "bf16":
        return Decision("bf16", by)
    if prec == "f16":
        d = _float16(a, n, by, strict=False)
        return d if d.precision else Decision(None, d.why + " (fallback)")
    bad = a.integer_ok(n)
    if bad:
        return _auto_float(a, n, f"{by}, but {bad} (fallback)")
    if prec == "i8acc16":
        ov = q.acc16_overflow(a.weight_matrix(n))
        if ov is not None:
            return Decision("i8acc16", f"{by}; WARNING: 16-bit overflow possible (channel {ov[0]}, weight "
                                       f"pair {ov[1]}: pair sum up to {ov[2]}), saturation emulated")
        return Decision("i8acc16", f"{by}; 16-bit accumulation proven safe")
    return Decision(prec, by)
