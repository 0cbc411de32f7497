"""Normalizations ONNX Runtime's transformer optimizer and the GenAI model builder emit:
SkipLayerNormalization (residual + bias + LayerNorm), SkipSimplifiedLayerNormalization (the
same with RMS normalization), SimplifiedLayerNormalization (RMSNorm; ONNX Runtime registers it
in the ai.onnx domain), EmbedLayerNormalization (BERT's word + position + segment embeddings,
LayerNorm, and the mask's lengths) and QEmbedLayerNormalization (its uint8/int8 form).

Statistics are computed in float64 and results rounded once to the operand type; mean and
inverse standard deviation outputs are float32 with the normalized axes kept as 1.
"""
from __future__ import annotations

import numpy as np

from ..ir.ops import _fail
from ..ir.shapes import broadcast
from ._common import dequantize, ms_op, scalar
from ..registry import register_op

FLOATS = ("f32", "f16", "bf16", "f64")


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _stats_shape(shape, axis=-1):
    axis %= len(shape)
    return tuple(shape[:axis]) + (1,) * (len(shape) - axis)


# ------------------------------------------------------------------ skip (+ bias) + layer norm

def _skip_sum(x, skip, bias):
    s = _f64(x) + _f64(skip)
    return s if bias is None else s + _f64(bias)


def skip_layer_normalization(x, skip, gamma, beta=None, bias=None, *, epsilon):
    s = _skip_sum(x, skip, bias)
    mean = s.mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(((s - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon)
    y = (s - mean) * inv * _f64(gamma) + (0.0 if beta is None else _f64(beta))
    return y.astype(x.dtype), mean.astype(np.float32), inv.astype(np.float32), s.astype(x.dtype)


def skip_simplified_layer_normalization(x, skip, gamma, bias=None, *, epsilon):
    # RMS: y = s / sqrt(mean(s^2) + eps) * gamma; `mean` is an output ORT leaves unset (0s)
    s = _skip_sum(x, skip, bias)
    inv = 1.0 / np.sqrt((s * s).mean(axis=-1, keepdims=True) + epsilon)
    y = s * inv * _f64(gamma)
    return (y.astype(x.dtype), np.zeros(inv.shape, np.float32), inv.astype(np.float32), s.astype(x.dtype))


def _skip_rule(ins, a, node):
    x, skip, gamma = ins[0], ins[1], ins[2]
    if len(x.shape) not in (2, 3):
        _fail(node, f"input must be (B, S, H) or (N, H), got {list(x.shape)}")
    shape = broadcast(tuple(x.shape), tuple(skip.shape))  # (skip may know dims the input does not)
    if shape is None or len(shape) != len(x.shape):
        _fail(node, f"skip {list(skip.shape)} does not broadcast to the input {list(x.shape)}")
    h = x.shape[-1]
    for v, role in ((gamma, "gamma"), *((w, r) for w, r in zip(ins[3:], ("beta", "bias")) if w is not None)):
        if len(v.shape) != 1 or isinstance(h, int) and isinstance(v.shape[0], int) and v.shape[0] != h:
            _fail(node, f"{role} must be ({h},), got {list(v.shape)}")
    stats = (_stats_shape(shape), "f32")
    return [(shape, x.dtype), stats, stats, (shape, x.dtype)]


_SKIP_OUT = ["output", "mean?", "inv_std_var?", "input_skip_bias_sum?"]
ms_op("skip_layer_normalization", "SkipLayerNormalization", inputs=["input", "skip", "gamma", "beta?", "bias?"],
      outputs=_SKIP_OUT, attrs={"epsilon": 1e-12}, groups={"norm"}, dtypes={"input": FLOATS},
      shape=_skip_rule, vector_ops=8, reference=skip_layer_normalization)
def _cpu_skip_simplified(program):
    """csrc/transformer.c's RMS norm with the skip (and bias) sum in the same pass."""
    from ..backends.cpu.ops.transformer import rms_call

    def kernel(x, skip, gamma, bias=None, *, epsilon):
        r = rms_call(x, gamma, skip, bias, epsilon, want_sum=True)
        if r is None:
            return skip_simplified_layer_normalization(x, skip, gamma, bias, epsilon=epsilon)
        y, inv, s = r
        return y, np.zeros(inv.shape, np.float32), inv, s
    return kernel


ms_op("skip_simplified_layer_normalization", "SkipSimplifiedLayerNormalization",
      inputs=["input", "skip", "gamma", "bias?"], outputs=_SKIP_OUT, attrs={"epsilon": 1e-12}, groups={"norm"},
      dtypes={"input": FLOATS}, shape=lambda ins, a, node: _skip_rule(ins[:3] + [None, (ins + [None])[3]], a, node),
      vector_ops=6, reference=skip_simplified_layer_normalization, cpu_factory=_cpu_skip_simplified)


# ------------------------------------------------------------------ RMS norm (ai.onnx domain in ORT)

def simplified_layer_normalization(x, scale, *, axis, epsilon, stash_type):
    axes = tuple(range(axis % x.ndim, x.ndim))
    xs = _f64(x)
    inv = 1.0 / np.sqrt((xs * xs).mean(axis=axes, keepdims=True) + epsilon)
    return (xs * inv * _f64(scale)).astype(x.dtype), inv.astype(np.float32)


def _simplified_rule(ins, a, node):
    x = ins[0]
    rank = len(x.shape)
    if not -rank <= a["axis"] < rank:
        _fail(node, f"axis {a['axis']} out of range for rank {rank}")
    return [(x.shape, x.dtype), (_stats_shape(x.shape, a["axis"]), "f32")]


def _cpu_simplified(program):
    from ..backends.cpu.ops.transformer import rms_call

    def kernel(x, scale, *, axis, epsilon, stash_type):
        r = rms_call(x, scale, epsilon=epsilon) if x.ndim and axis % x.ndim == x.ndim - 1 else None
        if r is None:
            return simplified_layer_normalization(x, scale, axis=axis, epsilon=epsilon, stash_type=stash_type)
        return r[0], r[1]
    return kernel


register_op("simplified_layer_normalization", onnx_op="SimplifiedLayerNormalization", since=1,
            inputs=["X", "scale"], outputs=["Y", "inv_std_var?"], attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1},
            groups={"norm"}, dtypes={"X": FLOATS}, shape=_simplified_rule, vector_ops=5,
            reference=simplified_layer_normalization, cpu_factory=_cpu_simplified)


# ------------------------------------------------------------------ embeddings + layer norm

def _embed(ids, table, what, dequant=None):
    """The table's rows at ids, as float64 (gathered first: a vocabulary is large), through
    `dequant` when the table is quantized."""
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise ValueError(f"{what} out of range: values from {ids.min()} to {ids.max()}, the table has "
                         f"{table.shape[0]} rows")
    rows = table[ids]
    return _f64(rows if dequant is None else dequant(rows))


def embed_layer_normalization(input_ids, segment_ids, word_embedding, position_embedding,
                              segment_embedding=None, gamma=None, beta=None, mask=None, position_ids=None,
                              *, epsilon, mask_index_type, _dequant=(None, None, None), _dtype=None):
    # input_ids (B, S) -> (B, S, H): word + position (+ segment) embeddings, then LayerNorm;
    # mask_index (B,) counts each row's mask == 1 (the lengths Attention reads), 0 without mask
    b, s = input_ids.shape
    pos = np.broadcast_to(np.arange(s), (b, s)) if position_ids is None else np.broadcast_to(position_ids, (b, s))
    dw, dp, ds = _dequant  # QEmbedLayerNormalization's per-table dequantization
    total = _embed(input_ids, word_embedding, "input_ids", dw) + _embed(pos, position_embedding, "position ids", dp)
    if segment_embedding is not None:
        total = total + _embed(segment_ids, segment_embedding, "segment_ids", ds)
    mean = total.mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(((total - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon)
    dtype = _dtype or word_embedding.dtype
    y = ((total - mean) * inv * _f64(gamma) + _f64(beta)).astype(dtype)
    mask_index = (mask == 1).sum(axis=1).astype(np.int32) if mask is not None else np.zeros(b, np.int32)
    return y, mask_index, total.astype(dtype)


def _embed_rule(ins, a, node):
    ids, word = ins[0], ins[2]
    if len(ids.shape) != 2 or len(word.shape) != 2:
        _fail(node, f"input_ids must be (B, S) and word_embedding (V, H), got {list(ids.shape)} and {list(word.shape)}")
    if (ins[1] is None) != (ins[4] is None):
        _fail(node, "segment_ids and segment_embedding come together")
    b, s, h = ids.shape[0], ids.shape[1], word.shape[1]
    return [((b, s, h), word.dtype), ((b,), "i32"), ((b, s, h), word.dtype)]


def _embed_bytes(a, ins, outs):
    # a lookup reads the rows it gathers (B*S per table), not the tables
    b, s, h = outs[0][0]
    rows = 2 + (ins[4] is not None)
    item = 4 if outs[0][1] == "f32" else 2
    return (rows + 2) * b * s * h * item + 4 * b * s * (1 + (ins[1] is not None) + (ins[7] is not None))


ms_op("embed_layer_normalization", "EmbedLayerNormalization",
      inputs=["input_ids", "segment_ids?", "word_embedding", "position_embedding", "segment_embedding?", "gamma",
              "beta", "mask?", "position_ids?"], outputs=["output", "mask_index?", "embedding_sum?"],
      attrs={"epsilon": 1e-12, "mask_index_type": None}, groups={"norm"},
      dtypes={"input_ids": ("i32",), "segment_ids": ("i32",), "mask": ("i32",), "position_ids": ("i32",)},
      shape=_embed_rule, bytes=_embed_bytes, vector_ops=8, reference=embed_layer_normalization)


def qembed_layer_normalization(input_ids, segment_ids, word_q, position_q, segment_q, gamma_q, beta_q, mask,
                               word_scale, position_scale, segment_scale, gamma_scale, beta_scale,
                               word_zp, position_zp, segment_zp, gamma_zp, beta_zp, *, epsilon):
    # the tables, gamma and beta dequantized (float32, per tensor), then EmbedLayerNormalization
    def dq(s, z):
        return lambda q: dequantize(q, scalar(s), scalar(z, 0))
    y, mask_index, _ = embed_layer_normalization(
        input_ids, segment_ids, word_q, position_q, segment_q, dq(gamma_scale, gamma_zp)(gamma_q),
        dq(beta_scale, beta_zp)(beta_q), mask, epsilon=epsilon, mask_index_type=None,
        _dequant=(dq(word_scale, word_zp), dq(position_scale, position_zp),
                  None if segment_q is None else dq(segment_scale, segment_zp)), _dtype=np.float32)
    return y, mask_index


def _qembed_rule(ins, a, node):
    ids, word = ins[0], ins[2]
    if len(ids.shape) != 2 or len(word.shape) != 2:
        _fail(node, f"input_ids must be (B, S) and word_embedding (V, H), got {list(ids.shape)} and {list(word.shape)}")
    b, s, h = ids.shape[0], ids.shape[1], word.shape[1]
    return [((b, s, h), "f32"), ((b,), "i32")]


ms_op("qembed_layer_normalization", "QEmbedLayerNormalization",
      inputs=["input_ids", "segment_ids?", "word_embedding_quant", "position_embedding_quant", "segment_embedding?",
              "gamma_quant", "beta_quant", "mask?", "word_embedding_scale", "position_embedding_scale",
              "segment_embedding_scale?", "gamma_scale", "beta_scale", "word_embedding_zero_point",
              "position_embedding_zero_point", "segment_embedding_zero_point?", "gamma_zero_point", "beta_zero_point"],
      outputs=["layernorm_out", "mask_index_out"], attrs={"epsilon": 1e-12}, groups={"norm", "quant"},
      dtypes={"input_ids": ("i32",)}, shape=_qembed_rule, vector_ops=8, reference=qembed_layer_normalization)
