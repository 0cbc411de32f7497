"""Math, reduction and indexing ONNX ops: trigonometric and bitwise ops, ArgMax/ArgMin, the
Reduce* family beyond Sum/Mean/Max/Min, CumSum/CumProd, TopK, Unique, Hardmax, Einsum,
Gather/Scatter by element and by index tuple, OneHot, Range, Trilu, NonZero, Compress, Det,
Size, EyeLike, the losses."""
from __future__ import annotations

import numpy as np

from ..context import Ctx
from ..dtypes import ir_dtype
from . import converter

# ONNX op -> IR op, for ops whose operands and attributes carry over unchanged.
_SAME = {
    "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
    "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Mish": "mish", "Swish": "swish",
    "ThresholdedRelu": "thresholded_relu", "Shrink": "shrink", "IsNaN": "is_nan", "IsInf": "is_inf",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
    "BitwiseNot": "bitwise_not", "BitShift": "bit_shift",
    "ArgMax": "arg_max", "ArgMin": "arg_min", "CumSum": "cum_sum", "CumProd": "cum_prod",
    "Einsum": "einsum", "GatherElements": "gather_elements", "GatherND": "gather_nd",
    "ScatterND": "scatter_nd", "OneHot": "one_hot", "Compress": "compress", "NonZero": "non_zero",
    "ReverseSequence": "reverse_sequence", "Range": "range", "Trilu": "trilu", "Det": "det",
    "Size": "size", "NegativeLogLikelihoodLoss": "negative_log_likelihood_loss",
}


def _same(ir_op):
    def convert(ctx: Ctx):
        ctx.emit(ir_op, ctx.inputs(), [ctx.output(0)], **ctx.attrs)
    convert.__name__ = convert.__qualname__ = ir_op
    return convert


for _onnx, _ir in _SAME.items():
    converter(_onnx)(_same(_ir))


def _outputs(ctx: Ctx, n: int) -> list[str]:
    """All n outputs of the node, with fresh names for the ones the model leaves out."""
    return [ctx.output(i) or ctx.fresh("unused") for i in range(n)]


# ---------------------------------------------------------------- reductions

def _reduce(ir_op, axes_input: bool):
    def convert(ctx: Ctx):
        ins = [ctx.input(0)]
        if axes_input:
            if ctx.input(1):
                ins.append(ctx.input(1))
        elif "axes" in ctx.attrs:
            ins.append(ctx.const(np.array(ctx.attrs["axes"], np.int64), "axes"))
        ctx.emit(ir_op, ins, [ctx.output(0)], keepdims=ctx.attrs.get("keepdims"),
                 noop_with_empty_axes=ctx.attrs.get("noop_with_empty_axes"))
    return convert


# `axes` moved from an attribute to an input at opset 18 (ReduceSum's at 13).
for _onnx, _ir, _since in (("ReduceMean", "reduce_mean", 18), ("ReduceSum", "reduce_sum", 13),
                           ("ReduceMax", "reduce_max", 18), ("ReduceMin", "reduce_min", 18),
                           ("ReduceProd", "reduce_prod", 18), ("ReduceSumSquare", "reduce_sum_square", 18),
                           ("ReduceL1", "reduce_l1", 18), ("ReduceL2", "reduce_l2", 18),
                           ("ReduceLogSum", "reduce_log_sum", 18), ("ReduceLogSumExp", "reduce_log_sum_exp", 18)):
    converter(_onnx)(_reduce(_ir, False))
    converter(_onnx, since=_since)(_reduce(_ir, True))


@converter("Hardmax")
def Hardmax(ctx: Ctx):
    """Opset < 13: hardmax over the input flattened to 2-D at `axis` (default 1)."""
    x = ctx.input(0)
    flat = ctx.emit("flatten", [x], axis=ctx.attrs.get("axis", 1))[0]
    y = ctx.emit("hardmax", [flat], axis=-1)[0]
    shape = ctx.emit("shape", [x])[0]
    ctx.emit("reshape", [y, shape], [ctx.output(0)])


@converter("Hardmax", since=13)
def Hardmax_13(ctx: Ctx):
    ctx.emit("hardmax", [ctx.input(0)], [ctx.output(0)], axis=ctx.attrs.get("axis", -1))


@converter("TopK")
def TopK(ctx: Ctx):
    """Opset 1: k is an attribute; make it a constant operand."""
    k = ctx.const(np.array([ctx.attrs["k"]], np.int64), "k")
    ctx.emit("top_k", [ctx.input(0), k], _outputs(ctx, 2), axis=ctx.attrs.get("axis"))


@converter("TopK", since=10)
def TopK_10(ctx: Ctx):
    # largest and sorted arrived at opset 11; before, TopK always gave the largest, sorted.
    ctx.emit("top_k", ctx.inputs()[:2], _outputs(ctx, 2), **ctx.attrs)


@converter("Unique")
def Unique(ctx: Ctx):
    ctx.emit("unique", [ctx.input(0)], _outputs(ctx, 4), **ctx.attrs)


# ---------------------------------------------------------------- scatter

@converter("Scatter")
def Scatter(ctx: Ctx):
    """Scatter (opsets 9-10) is ScatterElements without a reduction."""
    ctx.emit("scatter_elements", ctx.inputs(), [ctx.output(0)], axis=ctx.attrs.get("axis"))


@converter("ScatterElements")
def ScatterElements(ctx: Ctx):
    ctx.emit("scatter_elements", ctx.inputs(), [ctx.output(0)], **ctx.attrs)


# ---------------------------------------------------------------- generators

@converter("EyeLike")
def EyeLike(ctx: Ctx):
    dtype = ctx.attrs.get("dtype")
    ctx.emit("eye_like", [ctx.input(0)], [ctx.output(0)], k=ctx.attrs.get("k"),
             dtype=None if dtype is None else ir_dtype(dtype, ctx.name))


# ---------------------------------------------------------------- losses

@converter("SoftmaxCrossEntropyLoss")
def SoftmaxCrossEntropyLoss(ctx: Ctx):
    ctx.emit("softmax_cross_entropy_loss", ctx.inputs(), _outputs(ctx, 2), **ctx.attrs)

