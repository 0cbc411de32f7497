"""KV cache in place: a decoder that grows its cache by concatenation reads and writes one
preallocated buffer per cache instead (ir/ops/cache.py).

    input past: [B, H, P, D]                       input past: [B, H, cache_rows, D]   (the buffer)
                                                   input past_length: [] i64
    ... readers of past ...                   ->   rows = cache_prefix(past, past_length)
    present = concat(past, new, axis=2)            ... readers of rows ...
                                                   present = cache_append(past, new, past_length)

The graph computes what it computed before (present is still concat(past rows, new) and the
exporter's own shape arithmetic still sees P rows of past), but a step no longer copies the
cache: the caller allocates the buffer once for the longest generation, feeds it every step
under the past input's name, and present is a view of it (npurun/generate/generator.py).

Options (keywords, as the generator passes them): `pairs`, the (past input, present
output) names; `length` the name of the new scalar input. A pair whose present is not a
concat of its past (through single-input concats and identities, which exporters leave) on
axis 2 is a ModelError naming it: the generator cannot keep that cache in place.
"""
from __future__ import annotations

from ..errors import ModelError
from ..ir.graph import Graph, Node, Value
from ..ir.ops import OPS
from .rewrite import rename_uses, unique_name

CAPACITY = "cache_rows"  # the buffer's row dim: the generation's maximum length


def kv_cache_in_place(g: Graph, pairs=(), length: str = "past_length") -> Graph:
    if not pairs:
        return g
    producer = {o: n for n in g.nodes for o in n.outputs}
    plans = []
    for past, present in pairs:
        if past not in g.inputs or present not in g.outputs:
            raise ModelError(f"{g.source}: {past!r} is not an input or {present!r} not an output of the model")
        v = g.values[past]
        if v.shape is None or len(v.shape) != 4:
            raise ModelError(f"{g.source}: cache input {past!r} must be (batch, heads, rows, head size), "
                             f"got {v.shape}")
        cat = producer.get(present)
        if cat is None or cat.op != "concat" or len(cat.inputs) != 2 \
                or OPS["concat"].attrs_of(cat)["axis"] not in (2, -2) or _source(producer, cat.inputs[0]) != past:
            raise ModelError(f"{g.source}: output {present!r} is not concat({past!r}, new rows) on axis 2, so its "
                             f"cache cannot be kept in place")
        plans.append((past, cat))
    if length in g.values:
        raise ModelError(f"{g.source}: the model already has a value named {length!r}")
    g.add_value(Value(length, (), "i64"))
    g.inputs.append(length)
    heads = []
    for past, cat in plans:
        v = g.values[past]
        rows = unique_name(g, f"{past}.rows")
        g.add_value(Value(rows, v.shape, v.dtype, v.space))  # the old input's type: P rows, symbol and all
        rename_uses(g, past, rows)  # (the concat too: it is rewritten below)
        v.shape = (v.shape[0], v.shape[1], CAPACITY, v.shape[3])
        heads.append(Node("cache_prefix", [past, length], [rows], {}, name=f"{past}/prefix"))
        cat.op, cat.inputs, cat.attrs = "cache_append", [past, cat.inputs[1], length], {}
    g.nodes = heads + g.nodes
    return g


def _source(producer: dict, name: str) -> str:
    """The value `name` forwards: through identities and single-input concats (the exporter
    writes cat([past]) when the cache object starts empty)."""
    n = producer.get(name)
    while n is not None and (n.op == "identity" or (n.op == "concat" and len(n.inputs) == 1)):
        name = n.inputs[0]
        n = producer.get(name)
    return name

