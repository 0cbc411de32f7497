"""Small graph-editing helpers the passes share (not a pass itself).

Passes rewrite a graph in place and return it. Three rules keep every rewrite safe:

* a graph input or output keeps its name, so forwarding `y = noop(x)` never renames `y` when
  `y` is a graph output;
* a value keeps its memory space: a "no-op" between two spaces is a transfer, not a no-op;
* a node with regions (control flow) may read values by capture, so renames reach into
  regions (unless a region defines the same name itself).
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value


def rename_uses(g: Graph, old: str, new: str) -> None:
    """Every read of value `old` (in nodes and in regions' captures) reads `new` instead.
    Graph outputs are not renamed (see `can_forward`)."""
    for n in g.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
        for r in n.regions.values():
            if old not in _defined(r):
                if old in r.values and new not in r.values:  # the region declares what it captures
                    from dataclasses import replace
                    r.values[new] = replace(r.values[old], name=new)
                rename_uses(r, old, new)
                r.outputs = [new if o == old else o for o in r.outputs]


def _defined(g: Graph) -> set[str]:
    return set(g.inputs) | {v.name for v in g.constants()} | {o for n in g.nodes for o in n.outputs}


def can_forward(g: Graph, y: str, x: str) -> bool:
    """May readers of `y` read `x` instead (they hold the same data)? Not when `y` is a graph
    output (its name is part of the model's interface) or when they live in different
    memory spaces or differ in dtype/kind."""
    if y in g.outputs:
        return False
    a, b = g.values[y], g.values[x]
    return (a.space, a.dtype, a.kind) == (b.space, b.dtype, b.kind)


def unique_name(g: Graph, base: str) -> str:
    if base not in g.values:
        return base
    k = 1
    while f"{base}.{k}" in g.values:
        k += 1
    return f"{base}.{k}"


def new_const(g: Graph, base: str, array, like: Value | None = None) -> str:
    """A fresh constant named after `base`, in `like`'s memory space."""
    name = unique_name(g, base)
    g.const(name, array, space=like.space if like is not None else "DRAM0")
    return name


def scaled(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """w * scale (scale broadcasts to w, its first axis 1 or w's) computed in float64 and
    rounded once to w's dtype, a block of w's first axis at a time: the float64 temporaries of
    a whole 9 MB weight were 19 MB each, beside the original and the result."""
    out = np.empty(w.shape, w.dtype)
    step = max(1, (1 << 17) // max(1, w[0].size if w.ndim else 1))
    for i in range(0, w.shape[0], step):
        sc = scale if scale.shape[0] == 1 else scale[i:i + step]
        out[i:i + step] = w[i:i + step].astype(np.float64) * sc
    return out


def new_value(g: Graph, base: str, shape, dtype: str, space: str) -> str:
    name = unique_name(g, base)
    g.add_value(Value(name, tuple(shape), dtype, space))
    return name


def const_data(g: Graph, name: str):
    """The array of constant `name`, or None (absent operand, or computed at run time)."""
    if not name:
        return None
    v = g.values.get(name)
    return None if v is None else v.data


def readers(g: Graph) -> dict[str, list[Node]]:
    """Value name -> nodes reading it, counting reads by regions' captures."""
    out: dict[str, list[Node]] = {}
    for n in g.nodes:
        for i in n.inputs:
            if i:
                out.setdefault(i, []).append(n)
        for r in n.regions.values():
            for c in r.captures():
                out.setdefault(c, []).append(n)
    return out


def sole_reader(g: Graph, name: str, rd: dict | None = None) -> Node | None:
    """The one node reading `name`, if exactly one does (once) and it is not a graph output."""
    rd = readers(g) if rd is None else rd
    rs = rd.get(name, [])
    if len(rs) != 1 or name in g.outputs or rs[0].inputs.count(name) != 1:
        return None
    return rs[0]


def drop_unused_values(g: Graph) -> None:
    """Forget values (and constants) nothing mentions any more."""
    used = set(g.inputs) | set(g.outputs)
    for n in g.nodes:
        used.update(i for i in n.inputs if i)
        used.update(n.outputs)
        for r in n.regions.values():
            used.update(r.captures())
    for nm in [nm for nm in g.values if nm not in used]:
        del g.values[nm]
