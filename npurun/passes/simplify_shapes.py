"""Shape simplification: work out, before any input arrives, what the shape arithmetic of a
graph computes, and put the answer in the graph.

Exporters compute reshape targets at run time:

    s = shape(x)            # x is [batch, 128, 384]: s holds [batch, 128, 384]
    b = gather(s, 0)        # [batch]
    t = concat(b, [128, 12, 32])
    y = reshape(x, t)       # y was [?, ?, ?, ?]

The pass tracks the *contents* of small integer tensors as dims (ints, symbols, or "dim i
of value v" for a `?` dim), through shape, gather, slice, concat, squeeze, unsqueeze, reshape, cast, identity, add/sub/mul by an
integer constant, and equal/where (torch's expand target `where(shape == -1, 1, shape)`: a
dim is never -1). Then:

1. a node whose contents are all integers becomes a constant (dead-code removal drops what
   computed it);
2. a reshape target that is known up to dims copied from the input becomes a constant, with
   0 ("copy this dim", allowzero=0) for those and -1 for at most one other symbolic dim:
   `reshape(x, t)` above becomes `reshape(x, [0, 128, 12, 32])`; an expand target likewise,
   with 1 ("keep x's dim") where the target repeats x's own dim;
3. every value's declared shape is re-inferred in order, so a `?` becomes the int or symbol
   inference now knows.
"""
from __future__ import annotations

import numpy as np

from ..ir.dtypes import INT_TYPES, to_numpy
from ..ir.graph import Graph, Node
from ..ir.ops import OPS, infer_node
from ..ir.shapes import UNKNOWN, affine
from .rewrite import const_data, new_const

MAX_TRACKED = 16  # elements: shape vectors, not data


def _contents(g: Graph, n: Node, known: dict) -> list | None:
    """The (1-D or scalar) contents of n's output as dims, or None if not known."""
    a = OPS[n.op].attrs_of(n)

    def get(i):
        nm = n.inputs[i] if i < len(n.inputs) else ""
        if not nm:
            return None
        if nm in known:
            return known[nm]
        d = const_data(g, nm)
        if d is not None and d.dtype.kind in "iub" and d.ndim <= 1 and d.size <= MAX_TRACKED:
            return [int(v) for v in d.reshape(-1)]
        return None

    if n.op == "shape":
        if g.values[n.inputs[0]].kind != "tensor":
            return None
        x = g.values[n.inputs[0]]
        # A `?` dim is still known as "dim i of x": a reshape of x itself may copy it.
        if x.shape is None:  # (unknown rank: nothing to track)
            return None
        dims = [(x.name, i) if d == UNKNOWN else d for i, d in enumerate(x.shape)]
        return dims[a["start"]:a["end"]]
    x = get(0)
    if x is None:
        return None
    if n.op in ("identity", "cast", "squeeze", "unsqueeze", "reshape"):  # (1-D and scalar values only)
        return x if n.op != "cast" or a["to"] in INT_TYPES else None
    if n.op == "concat":
        parts = [get(i) for i in range(len(n.inputs))]
        return None if any(p is None for p in parts) else [d for p in parts for d in p]
    if n.op == "gather" and a["axis"] == 0:
        idx = const_data(g, n.inputs[1])
        if idx is None or idx.ndim > 1:
            return None
        return [x[int(i)] for i in idx.reshape(-1)]
    if n.op == "slice":
        st, en = const_data(g, n.inputs[1]), const_data(g, n.inputs[2])
        steps = const_data(g, n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else np.array([1])
        if st is None or en is None or steps is None or st.size != 1 or en.size != 1:
            return None
        return x[slice(int(st[0]), int(en[0]), int(steps.reshape(-1)[0]))]
    if n.op == "equal":  # an exporter's where(shape == -1, 1, shape) before an expand
        y = get(1)
        if y is None or len(y) not in (1, len(x)) and len(x) != 1:
            return None
        out = []
        for a_, b_ in zip(x * (len(y) if len(x) == 1 else 1), y * (len(x) if len(y) == 1 else 1)):
            if isinstance(a_, int) and isinstance(b_, int):
                out.append(int(a_ == b_))
            elif (isinstance(a_, int) and a_ < 0) or (isinstance(b_, int) and b_ < 0):
                out.append(0)  # a dim (a symbol, or `?`) is never negative
            else:
                return None
        return out
    if n.op == "where":
        a_, b_ = get(1), get(2)
        if a_ is None or b_ is None or not all(isinstance(c_, int) for c_ in x):
            return None
        size = max(len(x), len(a_), len(b_))
        if any(len(v) not in (1, size) for v in (x, a_, b_)):
            return None
        pick = lambda v, i: v[0] if len(v) == 1 else v[i]  # noqa: E731
        return [pick(a_, i) if pick(x, i) else pick(b_, i) for i in range(size)]
    if n.op in ("add", "sub", "mul") and len(x) == 1:
        c = get(1)
        if c is None or len(c) != 1 or not isinstance(c[0], int) or isinstance(x[0], tuple):
            return None
        if n.op == "mul":
            return [affine(x[0], mul=c[0])]
        return [affine(x[0], add=c[0] if n.op == "add" else -c[0])]
    return None


def _reshape_target(x_name, x_shape, target, allowzero) -> list[int] | None:
    """A constant reshape target equal to `target` (dims) for an input of shape x_shape:
    a symbolic dim becomes 0 (copy x's dim i) where x has that very dim at i, else -1,
    which may appear once."""
    out = []
    for i, t in enumerate(target):
        if isinstance(t, int):
            out.append(t)
        elif not allowzero and i < len(x_shape) and (x_shape[i] == t or t == (x_name, i)):
            out.append(0)
        else:
            out.append(-1)
    return out if out.count(-1) <= 1 else None


def _expand_target(x_name, x_shape, target) -> list[int] | None:
    out = []
    off = len(target) - len(x_shape)
    for i, t in enumerate(target):
        if isinstance(t, int):
            out.append(t)
        elif i >= off and (x_shape[i - off] == t or t == (x_name, i - off)):
            out.append(1)  # 1 keeps x's own dim
        else:
            return None
    return out


def _refine_node(g: Graph, n: Node) -> None:
    """Re-infer n's outputs; a declared `?` takes what inference now knows, and a declared
    symbol the int it now knows (the exporter's `batch_size` of an intermediate value, once
    the inputs are bound to concrete shapes)."""
    if n.regions:
        return
    try:
        inferred = infer_node(n, g.values)
    except Exception:  # noqa: BLE001 - a node inference cannot judge keeps its declaration
        return
    for nm, (shape, dtype, kind) in zip(n.outputs, inferred):
        v = g.values[nm]
        if shape is None or dtype != v.dtype or kind != v.kind:
            continue
        if v.shape is None:  # the rank is known now
            v.shape = tuple(shape)
            continue
        if len(shape) != len(v.shape):
            continue
        v.shape = tuple(s if (d == UNKNOWN and s != UNKNOWN) or (isinstance(d, str) and isinstance(s, int)) else d
                        for d, s in zip(v.shape, shape))


def simplify_shapes(g: Graph) -> Graph:
    known: dict[str, list] = {}
    kept = []
    for n in g.nodes:
        out = n.outputs[0] if len(n.outputs) == 1 else None
        v = g.values.get(out) if out else None
        if v is not None and not n.regions and v.kind == "tensor" and (v.dtype in INT_TYPES or v.dtype == "bool") \
                and v.shape is not None and len(v.shape) <= 1:
            try:
                c = _contents(g, n, known)
            except IndexError:  # an index out of range fails at run time, as it should
                c = None
            if c is not None and _fits(v.shape, c):
                known[out] = c
                if all(isinstance(d, int) for d in c) and out not in g.outputs:
                    v.data = np.array(c if v.shape else c[0], dtype=to_numpy(v.dtype))
                    v.shape = tuple(v.data.shape)
                    continue  # now a constant: the node goes
        if n.op in ("reshape", "expand") and n.inputs[1] in known and const_data(g, n.inputs[1]) is None \
                and g.values[n.inputs[0]].shape is not None:
            x = g.values[n.inputs[0]]
            t = known[n.inputs[1]]
            new = (_reshape_target(x.name, x.shape, t, OPS["reshape"].attrs_of(n)["allowzero"])
                   if n.op == "reshape" else _expand_target(x.name, x.shape, t))
            if new is not None:
                n.inputs[1] = new_const(g, f"{n.outputs[0]}.shape", np.array(new, np.int64),
                                        like=g.values[n.inputs[1]])
            elif n.op == "expand":
                _expand_dims(g.values[n.outputs[0]], x.shape, t)
        _refine_node(g, n)  # (in order: what the next nodes read is as known as it gets)
        kept.append(n)
    g.nodes = kept
    return g


def _expand_dims(v, x_shape, target) -> None:
    """An expand whose target is known only in part still has dims it surely gives: an int
    target dim above 1 (x's is 1 or the same), x's int dim where the target's is 1. (A causal
    mask expanded to (batch 1, 1, 1 query, T keys) keeps its leading 1s, so the scores and
    everything after them keep theirs.)"""
    if v.shape is None or len(v.shape) != len(target) or len(x_shape) > len(target):
        return
    xs = (1,) * (len(target) - len(x_shape)) + tuple(x_shape)
    dims = []
    for d, xd, t in zip(v.shape, xs, target):
        sure = t if isinstance(t, int) and t > 1 else xd if t == 1 and isinstance(xd, int) else None
        dims.append(sure if d == UNKNOWN and sure is not None else d)
    v.shape = tuple(dims)


def _fits(shape, contents) -> bool:
    """Do `contents` have the length the value's declared shape says?"""
    if not shape:
        return len(contents) == 1
    return len(contents) == shape[0] if isinstance(shape[0], int) else True
