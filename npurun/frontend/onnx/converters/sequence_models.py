"""Transformer and recurrent ONNX ops: Attention, RotaryEmbedding, RMSNormalization,
LinearAttention, CausalConvWithState, TensorScatter, SwiGLU, RNN, GRU, LSTM, and FlexAttention
(ai.onnx.preview), whose score/probability modifier subgraphs become regions."""
from __future__ import annotations

import onnx
from onnx import helper

from ....errors import VerifyError
from ..context import ConvertError, Ctx
from ..dtypes import ir_dtype
from . import converter


def _outputs(ctx: Ctx) -> list[str]:
    """The node's outputs up to the last one it uses; an optional output skipped in between
    (ONNX writes "") gets a fresh name nothing reads."""
    outs = list(ctx.node.output)
    while outs and not outs[-1]:
        outs.pop()
    return [o or ctx.fresh("unused") for o in outs]


def _attrs(ctx: Ctx, names) -> dict:
    return {k: ctx.attrs[k] for k in names if k in ctx.attrs}


def _precision(ctx: Ctx, attr: str):
    """An ONNX element-type attribute (stash_type, softmax_precision) as an IR dtype."""
    return ir_dtype(ctx.attrs[attr], ctx.name) if attr in ctx.attrs else None


# Opset 23 Attention lacks nonpad_kv_seqlen (24) and the sliding window (25); the same IR op
# takes every version, their absent inputs and attributes meaning "not used".
@converter("Attention", since=23)
def Attention(ctx: Ctx):
    ctx.emit("attention", ctx.inputs(), _outputs(ctx),
             softmax_precision=_precision(ctx, "softmax_precision"),
             **_attrs(ctx, ("is_causal", "q_num_heads", "kv_num_heads", "qk_matmul_output_mode",
                            "scale", "softcap", "left_window_size", "right_window_size")))


@converter("RotaryEmbedding", since=23)
def RotaryEmbedding(ctx: Ctx):
    ctx.emit("rotary_embedding", ctx.inputs(), [ctx.output(0)],
             **_attrs(ctx, ("interleaved", "num_heads", "rotary_embedding_dim")))


@converter("RMSNormalization", since=23)
def RMSNormalization(ctx: Ctx):
    ctx.emit("rms_normalization", ctx.inputs(), [ctx.output(0)],
             stash_type=_precision(ctx, "stash_type"), **_attrs(ctx, ("axis", "epsilon")))


@converter("LinearAttention", since=27)
def LinearAttention(ctx: Ctx):
    ctx.emit("linear_attention", ctx.inputs(), _outputs(ctx),
             **_attrs(ctx, ("q_num_heads", "kv_num_heads", "scale", "update_rule", "chunk_size")))


@converter("CausalConvWithState", since=27)
def CausalConvWithState(ctx: Ctx):
    ctx.emit("causal_conv_with_state", ctx.inputs(), _outputs(ctx),
             **_attrs(ctx, ("activation",)))


@converter("TensorScatter", since=24)
def TensorScatter(ctx: Ctx):
    ctx.emit("tensor_scatter", ctx.inputs(), [ctx.output(0)], **_attrs(ctx, ("axis", "mode")))


# ------------------------------------------------------------------------- recurrent cells

_RNN_ATTRS = ("hidden_size", "direction", "activations", "activation_alpha", "activation_beta",
              "clip", "layout")


def _recurrent(ir_op, extra=()):
    def convert(ctx: Ctx):
        # Opset 1's output_sequence only said whether Y may be skipped; an absent Y is skipped.
        if not any(ctx.node.output):
            raise ConvertError("the node uses none of its outputs")
        ctx.emit(ir_op, ctx.inputs(), _outputs(ctx), **_attrs(ctx, _RNN_ATTRS + tuple(extra)))
    return convert


converter("RNN")(_recurrent("rnn"))
converter("GRU")(_recurrent("gru", ("linear_before_reset",)))
converter("LSTM")(_recurrent("lstm", ("input_forget",)))


# ------------------------------------------------------------------ attention with subgraphs

@converter("SwiGLU", since=28)
def SwiGLU(ctx: Ctx):
    """Y = Swish_alpha(A) * B, with A and B of one shape (SwiGLU does not broadcast)."""
    a, b = ctx.value(ctx.input(0)), ctx.value(ctx.input(1))
    if a.shape is not None and b.shape is not None and (
            len(a.shape) != len(b.shape) or any(isinstance(x, int) and isinstance(y, int) and x != y
                                                for x, y in zip(a.shape, b.shape))):
        raise VerifyError(f"node {ctx.name or 'SwiGLU'!r} (SwiGLU): A is {list(a.shape)} and B is "
                          f"{list(b.shape)}; SwiGLU takes two tensors of one shape (no broadcasting)")
    gate = ctx.emit("swish", [a.name], alpha=ctx.attrs.get("alpha", 1.0))[0]
    ctx.emit("mul", [gate, b.name], [ctx.output(0)])


def _identity_graph(name: str) -> onnx.GraphProto:
    """What an absent score_mod/prob_mod means: the tensor unchanged (untyped: the owner
    gives the region its input type)."""
    return helper.make_graph([helper.make_node("Identity", ["t"], ["t_out"])], name,
                             [onnx.ValueInfoProto(name="t")], [onnx.ValueInfoProto(name="t_out")])


@converter("FlexAttention", domain="ai.onnx.preview")
def FlexAttention(ctx: Ctx):
    q, k = ctx.value(ctx.input(0)), ctx.value(ctx.input(1))
    # The modifiers see (B, Hq, L, S) tensors in softmax_precision: f32 unless q is f64.
    precision = _precision(ctx, "softmax_precision") or ("f64" if q.dtype == "f64" else "f32")
    types = [((q.shape[0], q.shape[1], q.shape[2], k.shape[2]), precision, "tensor")]
    regions = {}
    for name in ("score_mod", "prob_mod"):
        graph = ctx.attrs[name] if name in ctx.attrs else _identity_graph(name)
        regions[name] = ctx.region_of(graph, types, f"{ctx.name or 'FlexAttention'}.{name}")
    ctx.emit("flex_attention", ctx.inputs()[:3], [ctx.output(0)], regions=regions,
             softmax_precision=precision, scale=ctx.attrs.get("scale"))
