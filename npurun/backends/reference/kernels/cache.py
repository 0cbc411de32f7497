"""Reference kernels of the KV-cache ops (ir/ops/cache.py): views of one buffer, written in
place. Every backend runs these: the point of the ops is that nothing is copied."""
from __future__ import annotations

import numpy as np

from ....errors import InputError
from . import kernel


def _rows(cache, length, extra=0) -> int:
    n = int(np.asarray(length).reshape(-1)[0])
    if n < 0 or n + extra > cache.shape[2]:
        raise InputError(f"the KV cache holds {cache.shape[2]} rows; {n} + {extra} do not fit "
                         f"(give the generator a larger max_length)")
    return n


@kernel("cache_prefix")
def cache_prefix(cache, length):
    return cache[:, :, :_rows(cache, length)]


@kernel("cache_append")
def cache_append(cache, update, length):
    s = update.shape[2]
    n = _rows(cache, length, s)
    if not cache.flags.writeable:
        raise InputError("the KV cache buffer is read-only; cache_append writes into it")
    cache[:, :, n:n + s] = update
    return cache[:, :, :n + s]
