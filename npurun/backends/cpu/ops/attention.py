"""ONNX Attention on the cpu backend for what the fuse_attention pass makes of an exported
decoder or encoder: 4-D float32 q (B, Hq, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), an
additive or boolean mask, an explicit scale, no cache operands, no causal/window/softcap
attributes (the exporter's mask says all that).

Grouped-query heads are never repeated: the Hq / Hkv query heads of a group are stacked as
rows, (B, Hkv, group * S, D), and multiplied by their key/value head in one product each, so
k and v are read where they are -- in a decoder that keeps its cache in place
(passes/kv_cache_in_place.py) they are views of the cache buffer, which NumPy's matmul hands
to BLAS as they are (rows of D floats; the transposed keys as a transposed operand), with no
copy (tests/test_generate.py counts the bytes a decode step allocates). An encoder's own
keys and values take the cpu matmul instead (heads over the library's pool). The softmax is
csrc/transformer.c's with the mask added and dead rows set to 0 (ONNX's rule for a query that
sees no key). Anything else runs the reference kernel.
"""
from __future__ import annotations

import numpy as np

from ...reference.kernels import KERNELS as REF
from .. import blas
from . import matmul as MM
from . import transformer as T


def _plain(q, k, v, attn_mask, past_key, past_value, nonpad, a) -> bool:
    return (q.dtype == k.dtype == v.dtype == np.float32 and q.ndim == k.ndim == v.ndim == 4
            and past_key is None and past_value is None and nonpad is None and not a["is_causal"]
            and not a["softcap"] and a["scale"] is not None and a["qk_matmul_output_mode"] == 0
            and a["left_window_size"] < 0 and a["right_window_size"] < 0
            and k.shape[1] and q.shape[1] % k.shape[1] == 0 and k.shape[2] == v.shape[2]
            and q.shape[3] == k.shape[3] and k.shape[0] == v.shape[0] and k.shape[1] == v.shape[1]
            and q.shape[0] == k.shape[0]
            and (attn_mask is None or (attn_mask.dtype in (np.float32, np.bool_) and attn_mask.shape[-1] == k.shape[2])))


def make_attention(program):
    def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, **a):
        if not _plain(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, a):
            return REF["attention"](q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, **a)
        b, hq, s, _ = q.shape
        hkv, t = k.shape[1], k.shape[2]
        if s <= ROWS_IN_C and k.strides[3] == v.strides[3] == 4:  # a decode step: csrc/attend.c, one call
            return _rows_in_c(q, k, v, attn_mask, a["scale"])
        rows = hq // hkv * s  # a key/value head's query rows: its group's heads stacked
        qg = q.reshape(b, hkv, rows, q.shape[3])
        products = _products(program, k, v)
        scores = products(qg, k.transpose(0, 1, 3, 2))  # (B, Hkv, rows, T)
        scores *= np.float32(a["scale"])
        scores = scores.reshape(b, hq, s, t)
        p = T.softmax_call(program, scores, _additive(attn_mask), 0.0)
        if p is None:  # a mask that broadcasts some other way
            return REF["attention"](q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, **a)
        y = products(p.reshape(b, hkv, rows, t), v)  # (B, Hkv, rows, Dv)
        return y.reshape(b, hq, s, v.shape[3])
    return attention


ROWS_IN_C = 4  # query rows per head up to which csrc/attend.c beats the batched products


def _additive(mask):
    """A boolean mask (True: attend) as the float32 one the kernels add to the scores."""
    return np.where(mask, np.float32(0), np.float32(-np.inf)) if mask is not None and mask.dtype == np.bool_ else mask


def _rows_in_c(q, k, v, mask, scale):
    q = np.ascontiguousarray(q)
    b, hq, s, d = q.shape
    y = np.empty((b, hq, s, v.shape[3]), np.float32)
    work = np.empty(max(k.shape[2], 1), np.float32)
    ks, vs = [x // 4 for x in k.strides], [x // 4 for x in v.strides]
    mask = _additive(mask)
    if mask is not None:
        m = np.broadcast_to(mask, (b, hq, s, k.shape[2]))
        ms = [x // 4 for x in m.strides]
        mp = T.ptr(m)  # (a broadcast view: the strides say where each row is)
    else:
        ms, mp = [0, 0, 0, 0], None
    T.LIB.npr_attention_rows(T.ptr(q), b, hq, s, d, T.ptr(k), ks[0], ks[1], ks[2], T.ptr(v),
                             vs[0], vs[1], vs[2], k.shape[1], k.shape[2], v.shape[3], mp, ms[0], ms[1], ms[2],
                             ms[3], float(scale), T.ptr(y), T.ptr(work))
    return y


def _products(program, k, v):
    """How the two batched products run: keys and values of their own (an encoder's, C-order)
    through the cpu matmul (heads split over the library's pool, as the unfused graph's
    matmuls ran), views of a cache buffer through NumPy's matmul on one BLAS thread, which
    reads them in place (no copy of the cache)."""
    if k.flags.c_contiguous and v.flags.c_contiguous:
        def mm(a, b):
            y = MM.matmul_add(program, a, b)
            return np.matmul(a, b) if y is None else y
        return mm
    return lambda a, b: blas.with_threads(1, lambda: np.matmul(a, b))


KERNELS = {} if T.LIB is None else {"attention": make_attention}
