"""The KV cache a generator keeps across decode steps (npurun/generate, docs/generate.md).

A decoder exported for ONNX Runtime grows its cache by concatenation: each step reads the
past keys (B, H, P, D), computes S new rows and returns present = concat(past, new) (B, H,
P + S, D), which the caller feeds back as the next past -- a copy of the whole cache per
layer per token. The pass kv_cache_in_place rewrites that into these two ops over one buffer
of C rows (the capacity) allocated once per generation:

    cache_prefix(cache, length)           cache[:, :, :length]: the past, a view (no copy)
    cache_append(cache, update, length)   writes update into cache[:, :, length:length + S]
                                          and returns cache[:, :, :length + S], a view

So the result of cache_append is exactly concat(cache_prefix(cache, length), update) and the
only bytes a step moves into the cache are the S new rows. cache_append writes into its first
operand: it is the one op of the vocabulary with a side effect on an input (group
`writes_input`), which passes must neither fold, duplicate nor reorder across the readers of
that buffer. Axis 2 of rank-4 operands (B, H, rows, D), the layout every exporter uses.
"""
from __future__ import annotations

from ..shapes import UNKNOWN
from . import _fail, op


def _cache_and_length(node, ins):
    cache, length = ins[0], ins[-1]
    if cache.shape is not None and len(cache.shape) != 4:
        _fail(node, f"the cache must be (B, H, rows, D), got {list(cache.shape)}")
    if length.dtype not in ("i64", "i32") or length.shape not in ((), (1,)):
        _fail(node, f"length must be an integer scalar, got {list(length.shape)} {length.dtype}")
    return cache


@op("cache_prefix", ["cache", "length"], groups={"data_movement"})
def _cache_prefix(node, a, ins):
    c = _cache_and_length(node, ins)
    return [((c.shape[0], c.shape[1], UNKNOWN, c.shape[3]), c.dtype)]


@op("cache_append", ["cache", "update", "length"], groups={"data_movement", "writes_input"})
def _cache_append(node, a, ins):
    c = _cache_and_length(node, ins)
    u = ins[1]
    if len(u.shape) != 4 or u.dtype != c.dtype:
        _fail(node, f"update must be a rank-4 {c.dtype} tensor, got {list(u.shape)} {u.dtype}")
    for i in (1, 3):
        if isinstance(u.shape[i], int) and isinstance(c.shape[i], int) and u.shape[i] != c.shape[i]:
            _fail(node, f"update {list(u.shape)} does not fit cache {list(c.shape)} on axis {i}")
    return [((c.shape[0], c.shape[1], UNKNOWN, c.shape[3]), c.dtype)]
