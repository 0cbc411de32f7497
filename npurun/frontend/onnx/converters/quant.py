"""Quantization ONNX ops (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearConv,
QLinearMatMul, MatMulInteger, ConvInteger), BitCast, and the string ops (StringNormalizer,
StringConcat, StringSplit, RegexFullMatch, TfIdfVectorizer)."""
from __future__ import annotations

from ..context import ConvertError, Ctx
from ..dtypes import ir_dtype
from . import converter
from .nn import _window_attrs


def _quant_attrs(ctx: Ctx, names) -> dict:
    a = {k: ctx.attrs[k] for k in names if k in ctx.attrs}
    if a.get("output_dtype"):
        a["output_dtype"] = ir_dtype(a["output_dtype"], ctx.name)
    else:
        a.pop("output_dtype", None)
    if "precision" in a:
        a["precision"] = ir_dtype(a["precision"], ctx.name) if a["precision"] else ""
    return a


@converter("QuantizeLinear", since=10)
def QuantizeLinear(ctx: Ctx):
    """Opset 10 is per tensor; 13 adds axis; 19 saturate and float8; 21 block_size and
    output_dtype; 23 precision. Absent attributes keep the IR defaults, which match them all."""
    ctx.emit("quantize_linear", ctx.inputs(), [ctx.output(0)],
             **_quant_attrs(ctx, ("axis", "block_size", "output_dtype", "saturate", "precision")))


@converter("DequantizeLinear", since=10)
def DequantizeLinear(ctx: Ctx):
    ctx.emit("dequantize_linear", ctx.inputs(), [ctx.output(0)],
             **_quant_attrs(ctx, ("axis", "block_size", "output_dtype")))


@converter("DynamicQuantizeLinear", since=11)
def DynamicQuantizeLinear(ctx: Ctx):
    ctx.emit("dynamic_quantize_linear", [ctx.input(0)], [ctx.output(i) for i in range(3)])


@converter("MatMulInteger", since=10)
def MatMulInteger(ctx: Ctx):
    ctx.emit("matmul_integer", ctx.inputs(), [ctx.output(0)])


@converter("QLinearMatMul", since=10)
def QLinearMatMul(ctx: Ctx):
    ctx.emit("qlinear_matmul", ctx.inputs(), [ctx.output(0)])


@converter("ConvInteger", since=10)
def ConvInteger(ctx: Ctx):
    ctx.emit("conv_integer", ctx.inputs(), [ctx.output(0)], **_window_attrs(ctx, ("group",)))


@converter("QLinearConv", since=10)
def QLinearConv(ctx: Ctx):
    ctx.emit("qlinear_conv", ctx.inputs(), [ctx.output(0)], **_window_attrs(ctx, ("group",)))


@converter("BitCast", since=26)
def BitCast(ctx: Ctx):
    ctx.emit("bitcast", [ctx.input(0)], [ctx.output(0)], to=ir_dtype(ctx.attrs["to"], ctx.name))


# ------------------------------------------------------------------ strings

@converter("StringNormalizer", since=10)
def StringNormalizer(ctx: Ctx):
    a = {k: ctx.attrs[k] for k in ("case_change_action", "is_case_sensitive", "locale", "stopwords")
         if k in ctx.attrs}
    ctx.emit("string_normalizer", [ctx.input(0)], [ctx.output(0)], **a)


@converter("StringConcat", since=20)
def StringConcat(ctx: Ctx):
    ctx.emit("string_concat", ctx.inputs(), [ctx.output(0)])


@converter("StringSplit", since=20)
def StringSplit(ctx: Ctx):
    a = {k: ctx.attrs[k] for k in ("delimiter", "maxsplit") if k in ctx.attrs}
    outs = [ctx.output(0) or ctx.fresh("pieces"), ctx.output(1) or ctx.fresh("count")]
    ctx.emit("string_split", [ctx.input(0)], outs, **a)


@converter("RegexFullMatch", since=20)
def RegexFullMatch(ctx: Ctx):
    if "pattern" not in ctx.attrs:
        raise ConvertError("RegexFullMatch needs a pattern")
    ctx.emit("regex_full_match", [ctx.input(0)], [ctx.output(0)], pattern=ctx.attrs["pattern"])


@converter("TfIdfVectorizer", since=9)
def TfIdfVectorizer(ctx: Ctx):
    a = {k: ctx.attrs[k] for k in ("max_gram_length", "min_gram_length", "max_skip_count", "mode",
                                   "ngram_counts", "ngram_indexes", "pool_int64s", "pool_strings",
                                   "weights") if k in ctx.attrs}
    for k in ("ngram_counts", "ngram_indexes", "pool_int64s", "pool_strings", "weights"):
        if k in a:
            a[k] = list(a[k])
    ctx.emit("tfidf_vectorizer", [ctx.input(0)], [ctx.output(0)], **a)
