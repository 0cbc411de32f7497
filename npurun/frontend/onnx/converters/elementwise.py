"""Elementwise ONNX ops: unary, binary, comparisons, activations, Clip, Cast, variadic Max/Min/Sum.
(Dropout, identity in inference, is with the random ops: random.py.)"""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import to_numpy
from ..context import ConvertError, Ctx
from ..dtypes import ir_dtype
from . import converter

# ONNX op -> IR op, for ops whose operands and attributes carry over unchanged.
_SAME = {
    "Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Exp": "exp", "Log": "log",
    "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Erf": "erf", "Reciprocal": "reciprocal",
    "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sin": "sin", "Cos": "cos",
    "Sign": "sign", "Softplus": "softplus", "Softsign": "softsign", "Identity": "identity",
    "HardSwish": "hard_swish", "Not": "not", "LeakyRelu": "leaky_relu", "Elu": "elu",
    "Selu": "selu", "HardSigmoid": "hard_sigmoid", "Gelu": "gelu", "Celu": "celu",
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Mod": "mod",
    "PRelu": "prelu", "Equal": "equal", "Less": "less", "Greater": "greater",
    "LessOrEqual": "less_or_equal", "GreaterOrEqual": "greater_or_equal",
    "And": "and", "Or": "or", "Xor": "xor", "Where": "where",
}


def _same(ir_op):
    def convert(ctx: Ctx):
        # Opset < 7 binary ops had explicit `broadcast`/`axis`; NumPy broadcasting covers the
        # common case (axis absent); a legacy axis is not supported.
        if "axis" in ctx.attrs and ir_op in ("add", "sub", "mul", "div", "pow"):
            raise ConvertError("legacy broadcast with axis (opset < 7) is not supported")
        attrs = {k: v for k, v in ctx.attrs.items() if k in ("alpha", "beta", "gamma", "approximate", "fmod")}
        ctx.emit(ir_op, ctx.inputs(), list(ctx.node.output), **attrs)
    convert.__name__ = convert.__qualname__ = ir_op
    return convert


for _onnx, _ir in _SAME.items():
    converter(_onnx)(_same(_ir))


@converter("Clip")
def Clip(ctx: Ctx):
    """Opset < 11: bounds are attributes; make them constant operands."""
    dt = to_numpy(ctx.graph.values[ctx.input(0)].dtype)
    lo = ctx.const(np.array(ctx.attrs.get("min", -3.4028234663852886e38), dt), "min")
    hi = ctx.const(np.array(ctx.attrs.get("max", 3.4028234663852886e38), dt), "max")
    ctx.emit("clip", [ctx.input(0), lo, hi], [ctx.output(0)])


@converter("Clip", since=11)
def Clip_11(ctx: Ctx):
    ctx.emit("clip", ctx.inputs(), [ctx.output(0)])


@converter("Cast")
def Cast(ctx: Ctx):
    to = ctx.attrs["to"]
    if isinstance(to, str):  # opset < 6 names the type ("FLOAT")
        from onnx import TensorProto
        to = TensorProto.DataType.Value(to.upper())
    ctx.emit("cast", [ctx.input(0)], [ctx.output(0)], to=ir_dtype(to, ctx.name), **_cast_attrs(ctx))


@converter("CastLike")
def CastLike(ctx: Ctx):
    """Cast to the element type of the second operand (whose values are not read)."""
    to = ctx.graph.values[ctx.input(1)].dtype
    ctx.emit("cast", [ctx.input(0)], [ctx.output(0)], to=to, **_cast_attrs(ctx))


def _cast_attrs(ctx: Ctx) -> dict:
    """saturate (opset 19 on) and round_mode (opset 25 on), only where the node sets them."""
    return {k: ctx.attrs[k] for k in ("saturate", "round_mode") if k in ctx.attrs}


def _variadic(ir_op):
    def convert(ctx: Ctx):
        ins = [i for i in ctx.inputs() if i]
        acc = ins[0]
        if len(ins) == 1:
            ctx.emit("identity", [acc], [ctx.output(0)])
            return
        for k, nxt in enumerate(ins[1:]):
            last = k == len(ins) - 2
            acc = ctx.emit(ir_op, [acc, nxt], [ctx.output(0)] if last else None)[0]
    return convert


converter("Max")(_variadic("max"))
converter("Min")(_variadic("min"))
converter("Sum")(_variadic("add"))


@converter("Mean")
def Mean(ctx: Ctx):
    ins = [i for i in ctx.inputs() if i]
    acc = ins[0]
    for nxt in ins[1:]:
        acc = ctx.emit("add", [acc, nxt])[0]
    dt = to_numpy(ctx.graph.values[acc].dtype)
    ctx.emit("div", [acc, ctx.const(np.array(len(ins), dt), "count")], [ctx.output(0)])
