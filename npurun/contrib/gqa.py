"""GroupQueryAttention, the attention of ONNX Runtime GenAI's model builder (Llama, Phi, Qwen,
Mistral...): grouped heads (Nq query heads read Nkv key/value heads), a KV cache of per-row
lengths, rotary embeddings applied inside, a causal mask with an optional sliding window,
softcap, and softmax sinks (smooth_softmax, head_sink).

Per batch row b, T_b = seqlens_k[b] + 1 tokens are valid after this step; with a past cache
the new S tokens sit at positions P_b = T_b - S .. T_b - 1 (P_b = 0 for a first prompt, no
past), are appended to the cache there, and query s (position P_b + s) sees keys
max(0, P_b + s - window + 1) .. P_b + s. present_key/value are (B, Nkv, max(past length,
total_sequence_length), H), zeros past each row's T_b.

Not taken (a clear error at import): quantized KV caches, query_seqlens (chunked prefill),
sliding_window_cache, per-head Q/K norms and the QK output, which are CUDA-side options.
"""
from __future__ import annotations

import numpy as np

from ..ir.ops import _fail
from ..registry import REQUIRED
from ._common import F32, ms_op

FLOATS = ("f32", "f16", "bf16")


def _rope(x, cos, sin, pos, interleaved):
    """x (B, N, S, H) rotated by the caches' rows at pos (B, S); the rotary dim is 2*cos.shape[1]."""
    dim = 2 * cos.shape[1]
    c, s_ = cos[pos][:, None], sin[pos][:, None]  # (B, 1, S, dim/2)
    rot = x[..., :dim]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else np.split(rot, 2, axis=-1)
    real, imag = c * x1 - s_ * x2, s_ * x1 + c * x2
    rot = np.stack([real, imag], axis=-1).reshape(rot.shape) if interleaved else np.concatenate([real, imag], -1)
    return np.concatenate([rot, x[..., dim:]], axis=-1)


def gqa_with(work, query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
             total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None,
             head_sink=None, *rest, num_heads, kv_num_heads, scale, softcap, local_window_size, do_rotary,
             rotary_interleaved, smooth_softmax, causal, **unused):
    b, s = query.shape[0], query.shape[1]
    nq, nkv = num_heads, kv_num_heads
    if key is None:  # packed (B, S, (Nq + 2 Nkv) H)
        h = query.shape[2] // (nq + 2 * nkv)
        query, key, value = np.split(query, [nq * h, (nq + nkv) * h], axis=2)
    h = query.shape[2] // nq
    q = np.asarray(query, work).reshape(b, s, nq, h).transpose(0, 2, 1, 3)
    k = np.asarray(key, work).reshape(b, s, nkv, h).transpose(0, 2, 1, 3)
    v = np.asarray(value, work).reshape(b, s, nkv, h).transpose(0, 2, 1, 3)
    total = seqlens_k.astype(np.int64) + 1  # valid tokens per row after this step
    p_len = 0 if past_key is None else past_key.shape[2]
    first = p_len == 0
    start = np.zeros(b, np.int64) if first else total - s  # where the new tokens go
    if do_rotary:
        pos = position_ids.astype(np.int64) if position_ids is not None else start[:, None] + np.arange(s)[None, :]
        cos, sin = np.asarray(cos_cache, work), np.asarray(sin_cache, work)
        q, k = _rope(q, cos, sin, pos, rotary_interleaved), _rope(k, cos, sin, pos, rotary_interleaved)
    cap = max(p_len, int(np.asarray(total_sequence_length).reshape(-1)[0]))
    shared = _shares(past_key, past_value, cap, query.dtype)
    if shared:
        # The past buffers have room for every row's new tokens (ONNX Runtime GenAI's
        # past_present_share_buffer): the new rows are written into them and they are the
        # present; nothing else of the cache is copied (rows past a row's tokens keep what
        # they held: zeros, in a buffer a generator allocates).
        pk, pv = past_key, past_value
    else:
        pk = np.zeros((b, nkv, cap, h), work)
        pv = np.zeros((b, nkv, cap, h), work)
        if past_key is not None:
            for r in range(b):  # the row's past up to its new tokens; zeros after
                pk[r, :, :start[r]], pv[r, :, :start[r]] = past_key[r, :, :start[r]], past_value[r, :, :start[r]]
    for r in range(b):  # then its new tokens
        n_new = min(s, cap - int(start[r]))
        pk[r, :, start[r]:start[r] + n_new] = k[r, :, :n_new]
        pv[r, :, start[r]:start[r] + n_new] = v[r, :, :n_new]
    present_k, present_v = (pk, pv) if shared else (pk.astype(query.dtype, copy=False),
                                                    pv.astype(query.dtype, copy=False))
    # Keys past the longest row's tokens are never attended: the products stop there.
    t = min(cap, int(total.max()))
    kx, vx = np.asarray(pk[:, :, :t], work), np.asarray(pv[:, :, :t], work)
    group = nq // nkv
    sc = 1.0 / np.sqrt(h) if scale in (None, 0.0) else scale
    # Each key/value head with its group of query heads stacked as rows: no repeated keys.
    qg = q.reshape(b, nkv, group * s, h)
    scores = (qg @ np.swapaxes(kx, -1, -2)).reshape(b, nq, s, t) * sc  # (B, Nq, S, T)
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    if attention_bias is not None:
        scores = scores + np.asarray(attention_bias, work)[..., :t]
    j = np.arange(t)[None, None, :]
    qpos = start[:, None, None] + np.arange(s)[None, :, None]  # (B, S, 1)
    allowed = (j < total[:, None, None]) & np.ones((1, s, 1), bool)
    if causal:
        allowed = allowed & (j <= qpos)
    if local_window_size >= 0:
        allowed = allowed & (j > qpos - local_window_size)
    scores = np.where(allowed[:, None], scores, -np.inf)
    # Softmax with a sink logit in the denominator: 0 (smooth_softmax) or head_sink[h].
    m = scores.max(axis=-1, keepdims=True)
    sink = None
    if head_sink is not None:
        sink = np.asarray(head_sink, work).reshape(1, nq, 1, 1)
    elif smooth_softmax == 1:
        sink = np.zeros((1, 1, 1, 1), work)
    if sink is not None:
        m = np.maximum(m, sink)
    e = np.exp(scores - m)
    den = e.sum(axis=-1, keepdims=True) + (0 if sink is None else np.exp(sink - m))
    y = ((e / den).reshape(b, nkv, group * s, t) @ vx).reshape(b, nq, s, h)
    y = y.transpose(0, 2, 1, 3).reshape(b, s, nq * h).astype(query.dtype)
    return y, present_k, present_v


def _shares(past_key, past_value, cap, dtype) -> bool:
    """Do the past buffers take the present in place (room for every new row, writable, of
    the query's type)?"""
    return (past_key is not None and past_value is not None and past_key.shape[2] >= cap
            and past_value.shape[2] >= cap and past_key.dtype == past_value.dtype == dtype
            and past_key.flags.writeable and past_value.flags.writeable)


def _fast_ok(query, key, past_key, past_value, cos_cache, position_ids, attention_bias, head_sink,
             rest, a) -> bool:
    """The case a generator's decode and prefill steps are: one sequence, packed or separate
    q/k/v in float32, a shared past buffer with room, rotary from the caches, causal, nothing
    else (no softcap, bias, sinks, window, extra operands)."""
    return (query.dtype == F32 and query.shape[0] == 1 and past_key is not None and past_value is not None
            and past_key.dtype == past_value.dtype == F32 and past_key.flags.writeable
            and past_value.flags.writeable and a["causal"] and not a["softcap"] and a["local_window_size"] < 0
            and a["smooth_softmax"] != 1 and attention_bias is None and head_sink is None and position_ids is None
            and not any(x is not None for x in rest) and (not a["do_rotary"] or cos_cache is not None)
            and (key is None or key.dtype == F32))


def _rope1(x, c, s, interleaved):
    """x (S, N, H) float32 rotated by c, s (S, 1, dim/2)."""
    dim = 2 * c.shape[-1]
    rot = x[..., :dim]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., :dim // 2], rot[..., dim // 2:])
    real, imag = c * x1 - s * x2, s * x1 + c * x2
    out = np.empty_like(x)
    if interleaved:
        out[..., :dim:2], out[..., 1:dim:2] = real, imag
    else:
        out[..., :dim // 2], out[..., dim // 2:dim] = real, imag
    out[..., dim:] = x[..., dim:]
    return out


def _cpu_factory(program):
    """The cpu kernel: `_fast_ok`'s case in one call of csrc/attend.c (the new rows written into
    the buffer, rotary, each query head against its key/value head's rows, softmax), or in
    NumPy where the shapes do not suit it (each key/value head multiplied by its group of query
    heads stacked as rows); anything else through gqa_with."""
    from ..backends.cpu.ops import transformer as T

    def gqa(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
            total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None,
            head_sink=None, *rest, **a):
        cap = max(past_key.shape[2] if past_key is not None else 0,
                  int(np.asarray(total_sequence_length).reshape(-1)[0]))
        if T.LIB is None or not _fast_ok(query, key, past_key, past_value, cos_cache, position_ids,
                                         attention_bias, head_sink, rest, a) or past_key.shape[2] < cap:
            return gqa_with(F32, query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                            cos_cache, sin_cache, position_ids, attention_bias, head_sink, *rest, **a)
        s, nq, nkv = query.shape[1], a["num_heads"], a["kv_num_heads"]
        packed = key is None
        h = query.shape[2] // (nq + 2 * nkv) if packed else query.shape[2] // nq
        t = int(seqlens_k.reshape(-1)[0]) + 1  # tokens after this step
        p = t - s
        rd = 2 * cos_cache.shape[1] if a["do_rotary"] else 0
        scale = 1.0 / np.sqrt(h) if a["scale"] in (None, 0.0) else a["scale"]
        if h <= 512 and rd <= h and past_key.flags.c_contiguous and past_value.flags.c_contiguous:
            # csrc/attend.c: rows written, rotary, grouped heads, softmax in one call
            query = np.ascontiguousarray(query)
            if packed:
                kv, qs = query, query.shape[2]
                ko, vo, kvs = nq * h * 4, (nq + nkv) * h * 4, qs
            else:
                key, value = np.ascontiguousarray(key, F32), np.ascontiguousarray(value, F32)
                kv, qs, ko, vo, kvs = None, nq * h, 0, 0, nkv * h
            c = np.ascontiguousarray(cos_cache[p:t], F32) if rd else None
            sn = np.ascontiguousarray(sin_cache[p:t], F32) if rd else None
            y = np.empty((1, s, nq * h), F32)
            work = np.empty(t, F32)
            kp = T.ptr(kv) + ko if packed else T.ptr(key)
            vp = T.ptr(kv) + vo if packed else T.ptr(value)
            T.LIB.npr_gqa_step(T.ptr(query), qs, kp, vp, kvs, T.ptr(past_key), T.ptr(past_value),
                               past_key.shape[2], p, s, nq, nkv, h, T.ptr(c),
                               T.ptr(sn), rd, a["rotary_interleaved"], scale,
                               T.ptr(y), T.ptr(work))
            return y, past_key, past_value
        if packed:
            query, key, value = query[0, :, :nq * h], query[0, :, nq * h:(nq + nkv) * h], query[0, :, (nq + nkv) * h:]
        else:
            query, key, value = query[0], key[0], value[0]
        q, k = query.reshape(s, nq, h), key.reshape(s, nkv, h)
        if a["do_rotary"]:
            c, sn = cos_cache[p:t, None, :], sin_cache[p:t, None, :]  # (S, 1, dim/2)
            q, k = _rope1(q, c, sn, a["rotary_interleaved"]), _rope1(k, c, sn, a["rotary_interleaved"])
        past_key[0, :, p:t] = k.transpose(1, 0, 2)
        past_value[0, :, p:t] = value.reshape(s, nkv, h).transpose(1, 0, 2)
        g = nq // nkv
        qg = q.reshape(s, nkv, g, h).transpose(1, 2, 0, 3).reshape(nkv, g * s, h)  # (Nkv, G*S, H)
        scores = np.matmul(qg, past_key[0, :, :t].transpose(0, 2, 1))  # (Nkv, G*S, T)
        scores *= F32(scale)
        mask = None
        if s > 1:  # query i (position p + i) sees keys 0 .. p + i
            mask = np.where(np.arange(t)[None, :] <= p + np.arange(s)[:, None], F32(0), F32(-np.inf))
        probs = T.softmax_call(program, scores.reshape(nkv, g, s, t), mask, 0.0)
        y = np.matmul(probs.reshape(nkv, g * s, t), past_value[0, :, :t])  # (Nkv, G*S, H)
        y = y.reshape(nkv, g, s, h).transpose(2, 0, 1, 3).reshape(1, s, nq * h)
        return y.astype(F32, copy=False), past_key, past_value
    return gqa


def _gqa_rule(ins, a, node):
    q = ins[0]
    key = ins[1] if len(ins) > 1 else None
    nq, nkv = a["num_heads"], a["kv_num_heads"]
    for opt in ("k_quant_type", "v_quant_type"):
        if a[opt] not in ("NONE", ""):
            _fail(node, f"{opt}={a[opt]}: quantized KV caches are not supported")
    if a["kv_cache_bit_width"] or a["sliding_window_cache"] or a["qk_output"]:
        _fail(node, "kv_cache_bit_width, sliding_window_cache and qk_output are not supported")
    if len(ins) > 16 and ins[16] is not None or any(len(ins) > i and ins[i] is not None for i in (12, 13, 14, 15)):
        _fail(node, "k_scale/v_scale, q_norm_weight/k_norm_weight and query_seqlens are not supported")
    if nkv <= 0 or nq % nkv:
        _fail(node, f"num_heads {nq} must be a multiple of kv_num_heads {nkv}")
    if len(q.shape) != 3:
        _fail(node, f"query must be (B, S, D), got {list(q.shape)}")
    if a["do_rotary"] and (len(ins) < 9 or ins[7] is None or ins[8] is None):
        _fail(node, "do_rotary needs cos_cache and sin_cache")
    width = q.shape[2]
    packed = key is None
    heads_ = nq + 2 * nkv if packed else nq
    h = width // heads_ if isinstance(width, int) else "?"
    b, s = q.shape[0], q.shape[1]
    past = ins[3] if len(ins) > 3 else None
    total = ins[6]
    cap = "?"
    if total is not None and total.data is not None:
        t = int(np.asarray(total.data).reshape(-1)[0])
        cap = max(t, past.shape[2]) if past is not None and isinstance(past.shape[2], int) else t
    return [((b, s, nq * h if isinstance(h, int) else "?"), q.dtype), ((b, nkv, cap, h), q.dtype),
            ((b, nkv, cap, h), q.dtype)]


def _gqa_macs(a, ins, outs):
    b, s, d = outs[0]
    cap = outs[1][2] if len(outs) > 1 else s
    return 2 * b * s * cap * d


ms_op("group_query_attention", "GroupQueryAttention",
      inputs=["query", "key?", "value?", "past_key?", "past_value?", "seqlens_k", "total_sequence_length",
              "cos_cache?", "sin_cache?", "position_ids?", "attention_bias?", "head_sink?", "k_scale?", "v_scale?",
              "q_norm_weight?", "k_norm_weight?", "query_seqlens?"],
      outputs=["output", "present_key?", "present_value?"],
      attrs={"num_heads": REQUIRED, "kv_num_heads": REQUIRED, "scale": None, "softcap": 0.0, "local_window_size": -1,
             "do_rotary": 0, "rotary_interleaved": 0, "smooth_softmax": -1, "causal": 1, "qk_output": 0,
             "k_quant_type": "NONE", "v_quant_type": "NONE", "kv_cache_bit_width": 0, "sliding_window_cache": 0,
             "qk_norm_epsilon": 1e-6, "q_norm_epsilon": None, "k_norm_epsilon": None},
      groups={"attention", "mac"}, dtypes={"query": FLOATS, "seqlens_k": ("i32",), "total_sequence_length": ("i32",)},
      shape=_gqa_rule, macs=_gqa_macs, unit="matrix",
      reference=lambda *args, **at: gqa_with(np.float64, *args, **at),
      cpu_factory=_cpu_factory)
