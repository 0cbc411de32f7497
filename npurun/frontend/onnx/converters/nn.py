"""Neural-network ONNX ops: convolution, matrix products, normalization, pooling, softmax, reductions."""
from __future__ import annotations

from ..context import ConvertError, Ctx
from ..dtypes import ir_dtype
from . import converter

_WINDOW = ("strides", "pads", "dilations", "kernel_shape", "auto_pad", "ceil_mode")


def _window_attrs(ctx: Ctx, extra=()):
    return {k: v for k, v in ctx.attrs.items() if k in _WINDOW + tuple(extra)}


@converter("Conv")
def Conv(ctx: Ctx):
    ctx.emit("conv", ctx.inputs(), [ctx.output(0)], **_window_attrs(ctx, ("group",)))


@converter("MatMul")
def MatMul(ctx: Ctx):
    ctx.emit("matmul", ctx.inputs(), [ctx.output(0)])


@converter("Gemm")
def Gemm(ctx: Ctx):
    a = ctx.attrs
    if ctx.opset < 7 and a.get("broadcast", 0) == 0 and ctx.input(2):
        pass  # pre-7 Gemm without broadcast needs C of shape (M, N), which broadcasting also accepts
    ctx.emit("gemm", ctx.inputs(), [ctx.output(0)], alpha=a.get("alpha"), beta=a.get("beta"),
             trans_a=a.get("transA"), trans_b=a.get("transB"))


@converter("BatchNormalization")
def BatchNormalization(ctx: Ctx):
    if len([o for o in ctx.node.output if o]) > 1:
        raise ConvertError("training-mode outputs (running mean/var) are not supported")
    if ctx.attrs.get("training_mode", 0):
        raise ConvertError("training_mode=1 is not supported")
    ctx.emit("batch_normalization", ctx.inputs()[:5], [ctx.output(0)], epsilon=ctx.attrs.get("epsilon"))


@converter("LayerNormalization")
def LayerNormalization(ctx: Ctx):
    # Mean and InvStdDev are optional outputs; one skipped before a used one gets a fresh name.
    outs = list(ctx.node.output)
    while outs and not outs[-1]:
        outs.pop()
    stash = ctx.attrs.get("stash_type")
    ctx.emit("layer_normalization", ctx.inputs(), [o or ctx.fresh("unused") for o in outs],
             axis=ctx.attrs.get("axis"), epsilon=ctx.attrs.get("epsilon"),
             stash_type=None if stash is None else ir_dtype(stash, ctx.name))


@converter("MaxPool")
def MaxPool(ctx: Ctx):
    if len([o for o in ctx.node.output if o]) > 1:
        raise ConvertError("the Indices output is not supported")
    if ctx.attrs.get("storage_order", 0):
        raise ConvertError("storage_order=1 is not supported")
    ctx.emit("max_pool", [ctx.input(0)], [ctx.output(0)], **_window_attrs(ctx))


@converter("AveragePool")
def AveragePool(ctx: Ctx):
    ctx.emit("average_pool", [ctx.input(0)], [ctx.output(0)],
             **_window_attrs(ctx, ("count_include_pad",)))


@converter("GlobalAveragePool")
def GlobalAveragePool(ctx: Ctx):
    ctx.emit("global_average_pool", [ctx.input(0)], [ctx.output(0)])


@converter("GlobalMaxPool")
def GlobalMaxPool(ctx: Ctx):
    ctx.emit("global_max_pool", [ctx.input(0)], [ctx.output(0)])


def _softmax_legacy(ir_op):
    def convert(ctx: Ctx):
        """Opset < 13: softmax over the input flattened to 2-D at `axis` (default 1)."""
        x = ctx.input(0)
        flat = ctx.emit("flatten", [x], axis=ctx.attrs.get("axis", 1))[0]
        y = ctx.emit(ir_op, [flat], axis=-1)[0]
        shape = ctx.emit("shape", [x])[0]
        ctx.emit("reshape", [y, shape], [ctx.output(0)])
    return convert


def _softmax(ir_op):
    def convert(ctx: Ctx):
        ctx.emit(ir_op, [ctx.input(0)], [ctx.output(0)], axis=ctx.attrs.get("axis", -1))
    return convert


for _onnx, _ir in (("Softmax", "softmax"), ("LogSoftmax", "log_softmax")):
    converter(_onnx)(_softmax_legacy(_ir))
    converter(_onnx, since=13)(_softmax(_ir))
