"""Attention as ONNX Runtime's transformer optimizer and quantizer emit it: Attention (BERT's
fused QKV projection + multi-head attention, with its mask forms and past state), QAttention
(the same on a uint8/int8 projection, from `quantize_dynamic`), MultiHeadAttention (separate,
packed or pre-split Q/K/V with key padding mask and KV cache) and RotaryEmbedding.

Masks follow ONNX Runtime: a key a mask hides gets `mask_filter_value` (default -10000) added
to its score, never -inf, so a row with every key masked still averages over them as ORT does;
keys after the query (unidirectional) are excluded outright.
The mask forms of `mask_index`/`key_padding_mask`: (B) lengths of right-padded rows, (2B) end
then start positions, (B, T) and (B, S, T) 0/1 masks. The reference core computes in float64;
the cpu core in float32 on BLAS.
"""
from __future__ import annotations

import numpy as np

from ..backends.reference.kernels import KERNELS as REF
from ..ir.ops import _fail
from ..ir.shapes import dim_add
from ..registry import REQUIRED
from ._common import F32, cpu_int_matmul, int_matmul, ms_op, scalar

FLOATS = ("f32", "f16", "bf16")
DEFAULT_FILTER = -10000.0


# ------------------------------------------------------------------ the shared core

def core(q, k, v, bias, scale, work=np.float64):
    """softmax(q k^T * scale + bias) v: q (B, N, S, H), k (B, N, T, H), v (B, N, T, Hv),
    bias broadcastable to (B, N, S, T) or None -> (B, S, N*Hv) in `work` precision."""
    q, k, v = (np.asarray(t, work) for t in (q, k, v))
    s = (q @ np.swapaxes(k, -1, -2)) * work(scale)
    if bias is not None:
        s = s + np.asarray(bias, work)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    y = p @ v
    b, n, sq, hv = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, sq, n * hv)


def key_mask(mask, batch, sq, total):
    """Which keys an ORT mask_index / key_padding_mask hides, as a (B, 1, S|1, T) boolean, or None."""
    if mask is None:
        return None
    j = np.arange(total)
    if mask.ndim == 1 and mask.shape[0] == batch:  # right padding: keys >= length are padding
        keep = (j[None, :] < mask.astype(np.int64)[:, None])[:, None, None, :]
    elif mask.ndim == 1 and mask.shape[0] == 2 * batch:  # left padding: [end..., start...]
        end, start = mask[:batch].astype(np.int64), mask[batch:].astype(np.int64)
        keep = ((j[None, :] < end[:, None]) & (j[None, :] >= start[:, None]))[:, None, None, :]
    elif mask.ndim == 2:
        keep = (mask > 0)[:, None, None, :]
    elif mask.ndim == 3:
        keep = (mask > 0)[:, None, :, :]
    else:
        raise ValueError(f"a mask of shape {list(mask.shape)}: expected (B), (2B), (B, T) or (B, S, T)")
    return ~keep


def causal_mask(sq, total, past):
    """Keys query s (absolute position past + s) may not see: j > past + s, as (1, 1, S, T)."""
    return (np.arange(total)[None, :] > past + np.arange(sq)[:, None])[None, None]


def mask_bias(key_hidden, causal, filter_value, attention_bias, work):
    """The scores' offset: a key a mask hides gets mask_filter_value (ONNX Runtime's CPU
    kernels), attention_bias is added, and a key after the query (unidirectional) is excluded
    outright (-inf: ORT fills those with the lowest float, after the rest)."""
    bias = None if key_hidden is None else np.where(key_hidden, work(filter_value), work(0))
    if attention_bias is not None:
        ab = np.asarray(attention_bias, work)
        bias = ab if bias is None else bias + ab
    if causal is not None:
        bias = np.where(causal, work(-np.inf), work(0) if bias is None else bias)
    return bias


def heads(x, n):
    """(B, S, N*H) -> (B, N, S, H)."""
    b, s, d = x.shape
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


# ------------------------------------------------------------------ Attention and QAttention

def _attend(qkv, sizes, mask_index, past, attention_bias, num_heads, scale, unidirectional, mask_filter_value,
            work):
    """The part of Attention after the projection: qkv (B, S, hq + hk + hv)."""
    hq, hk, hv = sizes
    q, k, v = qkv[..., :hq], qkv[..., hq:hq + hk], qkv[..., hq + hk:]
    q, k, v = heads(q, num_heads), heads(k, num_heads), heads(v, num_heads)
    p = 0
    if past is not None:  # (2, B, N, P, H): the cache grows along the sequence
        p = past.shape[3]
        k = np.concatenate([past[0].astype(k.dtype), k], axis=2)
        v = np.concatenate([past[1].astype(v.dtype), v], axis=2)
    batch, _, sq, head = q.shape
    total = k.shape[2]
    filt = DEFAULT_FILTER if mask_filter_value is None else mask_filter_value
    bias = mask_bias(key_mask(mask_index, batch, sq, total), causal_mask(sq, total, p) if unidirectional else None,
                     filt, attention_bias, work)
    y = core(q, k, v, bias, 1.0 / np.sqrt(head) if scale is None else scale, work)
    # present (2, B, N, T, H) exists only where K and V heads have one size
    return y, (np.stack([k, v]) if k.shape == v.shape else None)


def _sizes(qkv_hidden_sizes, width):
    if qkv_hidden_sizes:
        return tuple(int(s) for s in qkv_hidden_sizes)
    return (width // 3,) * 3


def attention_with(mm, work, x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
                   past_sequence_length=None, *, num_heads, qkv_hidden_sizes, scale, unidirectional,
                   mask_filter_value, do_rotary, past_present_share_buffer, rotary_embedding_dim):
    qkv = mm(x.astype(work), weights.astype(work))
    if bias is not None:
        qkv = qkv + bias.astype(work)
    y, present = _attend(qkv, _sizes(qkv_hidden_sizes, weights.shape[1]), mask_index, past, attention_bias,
                         num_heads, scale, unidirectional, mask_filter_value, work)
    return y.astype(x.dtype), (None if present is None else present.astype(x.dtype))


def _attention_rule(ins, a, node):
    x, w = ins[0], ins[1]
    if a["do_rotary"] or a["past_present_share_buffer"]:
        _fail(node, "do_rotary and past_present_share_buffer are not supported (ONNX Runtime's CUDA options)")
    if len(x.shape) != 3 or len(w.shape) != 2:
        _fail(node, f"input must be (B, S, H_in) and weights (H_in, 3H), got {list(x.shape)} and {list(w.shape)}")
    width = w.shape[1]
    sizes = a["qkv_hidden_sizes"]
    if sizes and len(sizes) != 3 or sizes and isinstance(width, int) and sum(sizes) != width:
        _fail(node, f"qkv_hidden_sizes {sizes} must be 3 sizes adding up to the weights' {width} columns")
    if not sizes and isinstance(width, int) and width % 3:
        _fail(node, f"weights have {width} columns, not divisible into Q, K and V")
    hq, hk, hv = _sizes(sizes, width) if isinstance(width, int) else ("?",) * 3
    n = a["num_heads"]
    if any(isinstance(h, int) and h % n for h in (hq, hk, hv)):
        _fail(node, f"hidden sizes {hq}, {hk}, {hv} are not multiples of num_heads {n}")
    b, s = x.shape[0], x.shape[1]
    past = ins[4] if len(ins) > 4 else None
    total = dim_add(past.shape[3], s) if past is not None else s
    head = hk // n if isinstance(hk, int) else "?"
    return [((b, s, hv), x.dtype), ((2, b, n, total, head), x.dtype)]


def _attention_macs(a, ins, outs):
    # projection x W, then Q K^T and P V: (B, S, H_in) (H_in, 3H), (B, N, S, T) twice
    b, s, hin = ins[0]
    width = ins[1][1]
    total = outs[1][3] if len(outs) > 1 else s + (ins[4][3] if len(ins) > 4 and ins[4] else 0)
    hq, hk, hv = _sizes(a["qkv_hidden_sizes"], width)
    return b * s * hin * width + b * s * total * (hq + hv)


_ATTN_ATTRS = {"num_heads": REQUIRED, "qkv_hidden_sizes": None, "scale": None, "unidirectional": 0,
               "mask_filter_value": None, "do_rotary": 0, "past_present_share_buffer": 0,
               "rotary_embedding_dim": None}


def _float_mm(a, b):
    return a @ b


ms_op("attention", "Attention",
      inputs=["input", "weights", "bias?", "mask_index?", "past?", "attention_bias?", "past_sequence_length?"],
      outputs=["output", "present?"], attrs=_ATTN_ATTRS, groups={"attention", "mac"},
      dtypes={"input": FLOATS, "mask_index": ("i32",)}, shape=_attention_rule, macs=_attention_macs,
      unit="matrix", reference=lambda *args, **at: attention_with(_float_mm, np.float64, *args, **at),
      cpu=lambda *args, **at: attention_with(_float_mm, F32, *args, **at))


def qattention_with(mm, work, x, weight, bias, input_scale, weight_scale, mask_index=None, input_zp=None,
                    weight_zp=None, past=None, *, num_heads, scale, unidirectional, mask_filter_value, do_rotary,
                    past_present_share_buffer):
    # the projection exactly in integers, scaled to float32 as ORT does, then Attention
    izp = None if input_zp is None else input_zp.reshape(())
    wzp = None if weight_zp is None else (weight_zp.reshape(()) if weight_zp.size == 1 else weight_zp.reshape(-1))
    acc = mm(x, weight, izp, wzp)
    ws = weight_scale.astype(F32).reshape(()) if weight_scale.size == 1 else weight_scale.astype(F32).reshape(-1)
    qkv = acc.astype(F32) * (F32(scalar(input_scale)) * ws) + bias.astype(F32)
    y, present = _attend(qkv.astype(work), _sizes(None, weight.shape[1]), mask_index, past, None, num_heads,
                         scale, unidirectional, mask_filter_value, work)
    return y.astype(F32), (None if present is None else present.astype(F32))


def _qattention_rule(ins, a, node):
    x, w = ins[0], ins[1]
    if a["do_rotary"] or a["past_present_share_buffer"]:
        _fail(node, "do_rotary and past_present_share_buffer are not supported")
    if len(x.shape) != 3 or len(w.shape) != 2:
        _fail(node, f"input must be (B, S, H_in) and weight (H_in, 3H), got {list(x.shape)} and {list(w.shape)}")
    width, n = w.shape[1], a["num_heads"]
    if isinstance(width, int) and (width % 3 or (width // 3) % n):
        _fail(node, f"weight has {width} columns: not 3 blocks of a multiple of num_heads {n}")
    h = width // 3 if isinstance(width, int) else "?"
    b, s = x.shape[0], x.shape[1]
    past = ins[8] if len(ins) > 8 else None
    total = dim_add(past.shape[3], s) if past is not None else s
    return [((b, s, h), "f32"), ((2, b, n, total, h // n if isinstance(h, int) else "?"), "f32")]


_QATTN_ATTRS = {k: v for k, v in _ATTN_ATTRS.items() if k not in ("qkv_hidden_sizes", "rotary_embedding_dim")}
ms_op("qattention", "QAttention",
      inputs=["input", "weight", "bias", "input_scale", "weight_scale", "mask_index?", "input_zero_point?",
              "weight_zero_point?", "past?"], outputs=["output", "present?"], attrs=_QATTN_ATTRS,
      groups={"attention", "mac", "quant"}, dtypes={"input": ("u8", "i8"), "weight": ("u8", "i8"), "mask_index": ("i32",)},
      shape=_qattention_rule, macs=lambda a, ins, outs: _attention_macs({"qkv_hidden_sizes": None}, ins, outs),
      unit="matrix", reference=lambda *args, **at: qattention_with(int_matmul, np.float64, *args, **at),
      cpu_factory=lambda program: (lambda *args, **at: qattention_with(cpu_int_matmul(program), F32, *args, **at)))


# ------------------------------------------------------------------ MultiHeadAttention

def _mha_qkv(query, key, value, bias, n):
    """q, k, v as (B, N, S|L, H) from MHA's input forms, the bias added where it applies."""
    if query.ndim == 5:  # packed QKV (B, S, N, 3, H)
        q, k, v = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        if bias is not None:
            bq, bk, bv = np.split(bias, 3)
            q, k, v = q + heads(bq[None, None], n)[0], k + heads(bk[None, None], n)[0], v + heads(bv[None, None], n)[0]
        return q, k, v
    d = query.shape[2]
    bq = bk = bv = None
    if bias is not None:
        bq, bk, bv = bias[:d], bias[d:2 * d], bias[2 * d:]
    q = heads(query if bq is None else query + bq, n)
    if key.ndim == 5:  # packed KV (B, L, N, 2, H)
        k, v = key[:, :, :, 0].transpose(0, 2, 1, 3), key[:, :, :, 1].transpose(0, 2, 1, 3)
        if bk is not None:
            k, v = k + heads(bk[None, None], n)[0], v + heads(bv[None, None], n)[0]
        return q, k, v
    if key.ndim == 4:  # already (B, N, L, H): no bias for them
        return q, key, value
    return q, heads(key if bk is None else key + bk, n), heads(value if bv is None else value + bv, n)


def mha_with(work, query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
             past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None, *, num_heads,
             scale, unidirectional, mask_filter_value):
    q, k, v = _mha_qkv(np.asarray(query, work), None if key is None else np.asarray(key, work),
                       None if value is None else np.asarray(value, work),
                       None if bias is None else np.asarray(bias, work), num_heads)
    p = 0
    if past_key is not None:
        p = past_key.shape[2]
        k = np.concatenate([np.asarray(past_key, work), k], axis=2)
        v = np.concatenate([np.asarray(past_value, work), v], axis=2)
    batch, _, sq, head = q.shape
    total = k.shape[2]
    filt = DEFAULT_FILTER if mask_filter_value is None else mask_filter_value
    sc = 1.0 / np.sqrt(head) if scale is None else scale
    b = mask_bias(key_mask(key_padding_mask, batch, sq, total), causal_mask(sq, total, p) if unidirectional else None,
                  filt, attention_bias, work)
    y = core(q, k, v, b, sc, work)
    qk = (q @ np.swapaxes(k, -1, -2)) * work(sc)
    dt = query.dtype
    return y.astype(dt), k.astype(dt), v.astype(dt), qk.astype(dt)


def _mha_rule(ins, a, node):
    q, k, v = ins[0], ins[1] if len(ins) > 1 else None, ins[2] if len(ins) > 2 else None
    n = a["num_heads"]
    if len(ins) > 9 and ins[9] is not None:
        _fail(node, "cache_indirection (beam search) is not supported")
    if len(q.shape) == 5:
        b, s, _, _, h = q.shape
        l, hv = s, h
    elif len(q.shape) == 3 and k is not None and len(k.shape) == 5:
        b, s = q.shape[0], q.shape[1]
        l, h = k.shape[1], k.shape[4]
        hv = h
    elif len(q.shape) == 3 and k is not None and v is not None and len(k.shape) in (3, 4):
        b, s = q.shape[0], q.shape[1]
        if len(k.shape) == 4:
            l, h, hv = k.shape[2], k.shape[3], v.shape[3]
        else:
            l = k.shape[1]
            h = q.shape[2] // n if isinstance(q.shape[2], int) else "?"
            hv = v.shape[2] // n if isinstance(v.shape[2], int) else "?"
    else:
        _fail(node, f"query {list(q.shape)} with key {None if k is None else list(k.shape)}: expected (B, S, D) "
                    f"with (B, L, D)/(B, N, L, H) key and value, a packed (B, L, N, 2, H) key, or a packed "
                    f"(B, S, N, 3, H) query")
    past = ins[6] if len(ins) > 6 else None
    total = dim_add(past.shape[2], l) if past is not None else l
    dt = q.dtype
    return [((b, s, n * hv if isinstance(hv, int) else "?"), dt), ((b, n, total, h), dt), ((b, n, total, hv), dt),
            ((b, n, s, total), dt)]


def _mha_macs(a, ins, outs):
    y, qk = outs[0], (outs[3] if len(outs) > 3 else None)
    b, s, d = y
    total = outs[1][2] if len(outs) > 1 else (ins[1][1] if len(ins) > 1 and ins[1] else s)
    return 2 * b * s * total * d


ms_op("multi_head_attention", "MultiHeadAttention",
      inputs=["query", "key?", "value?", "bias?", "key_padding_mask?", "attention_bias?", "past_key?", "past_value?",
              "past_sequence_length?", "cache_indirection?"], outputs=["output", "present_key?", "present_value?", "qk?"],
      attrs={"num_heads": REQUIRED, "scale": None, "unidirectional": 0, "mask_filter_value": None},
      groups={"attention", "mac"}, dtypes={"query": FLOATS}, shape=_mha_rule, macs=_mha_macs, unit="matrix",
      reference=lambda *args, **at: mha_with(np.float64, *args, **at),
      cpu=lambda *args, **at: mha_with(F32, *args, **at))


# ------------------------------------------------------------------ RotaryEmbedding (com.microsoft)

def rotary_embedding(x, position_ids, cos_cache, sin_cache, *, interleaved, num_heads, rotary_embedding_dim,
                     is_packed_batching, scale):
    # x (B, S, N*H) or (B, N, S, H); position_ids (B, S), or (1,): the first position, then + s
    b, s = (x.shape[0], x.shape[1]) if x.ndim == 3 else (x.shape[0], x.shape[2])
    pos = position_ids.astype(np.int64)
    pos = pos.reshape(1) + np.arange(s)[None, :] if pos.size == 1 and pos.ndim <= 1 else pos
    pos = np.broadcast_to(pos, (b, s))
    heads_ = num_heads
    if x.ndim == 3 and not heads_:
        heads_ = x.shape[2] // (rotary_embedding_dim or 2 * cos_cache.shape[1])
    return REF["rotary_embedding"](x, cos_cache, sin_cache, pos, interleaved=interleaved, num_heads=heads_,
                                   rotary_embedding_dim=rotary_embedding_dim or 0)


def _rotary_rule(ins, a, node):
    x, cos = ins[0], ins[2]
    if a["is_packed_batching"]:
        _fail(node, "is_packed_batching (ragged batches) is not supported")
    if len(x.shape) not in (3, 4) or len(cos.shape) != 2:
        _fail(node, f"input must be 3-D or 4-D and cos_cache 2-D, got {list(x.shape)} and {list(cos.shape)}")
    return [(x.shape, x.dtype)]


ms_op("rotary_embedding", "RotaryEmbedding", inputs=["input", "position_ids", "cos_cache", "sin_cache"],
      outputs=["output"], attrs={"interleaved": 0, "num_heads": 0, "rotary_embedding_dim": 0, "is_packed_batching": 0,
                                 "scale": 1.0},
      groups={"attention"}, dtypes={"input": FLOATS, "position_ids": ("i64",)}, shape=_rotary_rule, vector_ops=3,
      reference=rotary_embedding)
