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
        raise ConvertError("training-mode outputs before opset 14 (saved mean/var) are not supported")
    ctx.emit("batch_normalization", ctx.inputs()[:5], [ctx.output(0)], epsilon=ctx.attrs.get("epsilon"))


@converter("BatchNormalization", since=14)
def BatchNormalization_14(ctx: Ctx):
    """training_mode=1: normalize by the batch's statistics; outputs 2 and 3 are the updated
    running mean and variance."""
    outs = list(ctx.node.output)
    while outs and not outs[-1]:
        outs.pop()
    if not ctx.attrs.get("training_mode", 0):
        if len(outs) > 1:
            raise ConvertError("running mean/var outputs need training_mode=1")
        BatchNormalization(ctx)
        return
    ctx.emit("batch_normalization_training", ctx.inputs()[:5], [o or ctx.fresh("unused") for o in outs],
             epsilon=ctx.attrs.get("epsilon"), momentum=ctx.attrs.get("momentum"))


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
    """With its Indices output, max_pool_with_indices (storage_order orders the indices, and
    only them)."""
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        ctx.emit("max_pool_with_indices", [ctx.input(0)], [ctx.output(0) or ctx.fresh("unused"), ctx.output(1)],
                 storage_order=ctx.attrs.get("storage_order"), **_window_attrs(ctx))
        return
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
