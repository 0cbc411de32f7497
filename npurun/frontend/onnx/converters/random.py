"""Random ONNX ops: RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike, Bernoulli,
Multinomial, and Dropout (identity in inference, random masks in training mode).

Random draws are never folded into constants at import, even of constant operands: an
unseeded node draws fresh values on every run (ir/ops/random.py).
"""
from __future__ import annotations

from ..context import ConvertError, Ctx
from ..dtypes import ir_dtype
from . import converter


def _draw(ctx: Ctx, op: str, inputs: list[str], outputs: list[str], **attrs) -> list[str]:
    saved, ctx.fold = ctx.fold, False
    try:
        return ctx.emit(op, inputs, outputs, **attrs)
    finally:
        ctx.fold = saved


def _dtype(ctx: Ctx, default=None):
    """The `dtype` attribute as an IR type; absent (or 0, UNDEFINED) gives `default`."""
    t = ctx.attrs.get("dtype")
    return ir_dtype(t, ctx.name) if t else default


def _seed(ctx: Ctx):
    return ctx.attrs.get("seed")


@converter("RandomNormal")
def RandomNormal(ctx: Ctx):
    _draw(ctx, "random_normal", [], [ctx.output(0)], shape=list(ctx.attrs["shape"]),
          dtype=_dtype(ctx, "f32"), mean=ctx.attrs.get("mean"), scale=ctx.attrs.get("scale"), seed=_seed(ctx))


@converter("RandomUniform")
def RandomUniform(ctx: Ctx):
    _draw(ctx, "random_uniform", [], [ctx.output(0)], shape=list(ctx.attrs["shape"]),
          dtype=_dtype(ctx, "f32"), low=ctx.attrs.get("low"), high=ctx.attrs.get("high"), seed=_seed(ctx))


@converter("RandomNormalLike")
def RandomNormalLike(ctx: Ctx):
    _draw(ctx, "random_normal_like", [ctx.input(0)], [ctx.output(0)], dtype=_dtype(ctx),
          mean=ctx.attrs.get("mean"), scale=ctx.attrs.get("scale"), seed=_seed(ctx))


@converter("RandomUniformLike")
def RandomUniformLike(ctx: Ctx):
    _draw(ctx, "random_uniform_like", [ctx.input(0)], [ctx.output(0)], dtype=_dtype(ctx),
          low=ctx.attrs.get("low"), high=ctx.attrs.get("high"), seed=_seed(ctx))


@converter("Bernoulli", since=15)
def Bernoulli(ctx: Ctx):
    _draw(ctx, "bernoulli", [ctx.input(0)], [ctx.output(0)], dtype=_dtype(ctx), seed=_seed(ctx))


@converter("Multinomial", since=7)
def Multinomial(ctx: Ctx):
    _draw(ctx, "multinomial", [ctx.input(0)], [ctx.output(0)], dtype=_dtype(ctx, "i32"),
          sample_size=ctx.attrs.get("sample_size"), seed=_seed(ctx))


def _mask_wanted(ctx: Ctx) -> bool:
    return len(ctx.node.output) > 1 and bool(ctx.node.output[1])


@converter("Dropout")
def Dropout(ctx: Ctx):
    """Opset < 12: `ratio` is an attribute and Dropout runs as in inference (the identity);
    its mask is all true (bool from opset 10, x's type before)."""
    ctx.emit("identity", [ctx.input(0)], [ctx.output(0)])
    if _mask_wanted(ctx):
        mask = ctx.output(1) if ctx.opset >= 10 else ctx.fresh("mask")
        _draw(ctx, "dropout", [ctx.input(0)], [ctx.fresh("unused"), mask], seed=_seed(ctx))
        if ctx.opset < 10:
            ctx.emit("cast", [mask], [ctx.output(1)], to=ctx.value(ctx.input(0)).dtype)


@converter("Dropout", since=12)
def Dropout_12(ctx: Ctx):
    """ratio and training_mode are operands. Inference (training_mode absent or a constant
    false) without the mask is the identity; otherwise a `dropout` node, whose kernel draws
    the mask when training_mode is true at run time."""
    training = ctx.const_input(2) if ctx.input(2) else None
    inference = not ctx.input(2) or (training is not None and training.size == 1 and not bool(training.reshape(-1)[0]))
    if inference and not _mask_wanted(ctx):
        ctx.emit("identity", [ctx.input(0)], [ctx.output(0)])
        return
    if training is not None and training.size != 1:
        raise ConvertError(f"training_mode must be a scalar, got shape {list(training.shape)}")
    outs = [ctx.output(0) or ctx.fresh("unused")] + ([ctx.output(1)] if _mask_wanted(ctx) else [])
    _draw(ctx, "dropout", ctx.inputs()[:3], outs, seed=_seed(ctx))
