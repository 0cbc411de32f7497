"""If with a constant condition: the branch it always takes replaces it.

    c = const [True]
    y = if(c) then {t = relu(x); -> t} else {...}      ->      y = relu(x)

The branch's nodes and constants move into the enclosing graph (a name that is taken there
gets a fresh one), and whatever produced a branch output now produces the If's output of
that position (an output the branch reads from outside, or a constant of it, goes through an
identity). Exporters write such Ifs when a flag input is bound: Optimum's legacy merged
decoder chooses between its cached and uncached copies of the decoder on `use_cache_branch`,
which the generator fixes to true (npurun/generate/model.py), after which the decoder's cache
can be kept in place (kv_cache_in_place needs its concatenations at top level).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import drop_unused_values, unique_name


def inline_constant_if(g: Graph) -> Graph:
    for n in g.nodes:
        for r in n.regions.values():
            inline_constant_if(r)
    out, changed = [], False
    for n in g.nodes:
        cond = g.values.get(n.inputs[0]) if n.op == "if" and n.inputs else None
        if cond is None or cond.data is None or cond.data.size != 1:
            out.append(n)
            continue
        branch = n.regions["then_branch" if bool(np.asarray(cond.data).reshape(-1)[0]) else "else_branch"]
        out += _inline(g, n, branch)
        changed = True
    if changed:
        g.nodes = out
        drop_unused_values(g)
    return g


def _inline(g: Graph, node: Node, r: Graph) -> list[Node]:
    """The branch's nodes, renamed into g, computing node's outputs."""
    produced = {o for m in r.nodes for o in m.outputs} | {v.name for v in r.constants()}
    names: dict[str, str] = {}
    for nm in produced:
        names[nm] = nm if nm not in g.values and nm not in names.values() else unique_name(g, nm)
    # a branch output computed by a branch node takes the If's output name instead
    taken = set()
    for ro, io in zip(r.outputs, node.outputs):
        if ro in produced and not r.values[ro].is_const and ro not in taken:
            names[ro] = io
            taken.add(ro)
    for v in r.constants():
        g.add_value(replace(v, name=names[v.name], calib=dict(v.calib)))
    for m in r.nodes:
        for o in m.outputs:
            if o and names[o] not in g.values:
                g.add_value(replace(r.values[o], name=names[o]) if o in r.values else
                            replace(g.values[node.outputs[0]], name=names[o]))
    nodes = []
    for m in r.nodes:
        m2 = replace(m, inputs=[names.get(i, i) for i in m.inputs], outputs=[names.get(o, o) for o in m.outputs],
                     attrs=dict(m.attrs), hints=dict(m.hints), regions={k: x.copy() for k, x in m.regions.items()})
        for sub in m2.regions.values():
            _rename_captures(sub, names)
        nodes.append(m2)
    for ro, io in zip(r.outputs, node.outputs):
        if names.get(ro) != io:  # passed through from outside, or a constant: an identity
            nodes.append(Node("identity", [names.get(ro, ro)], [io], name=f"{node.name}/{io}"))
    return nodes


def _rename_captures(r: Graph, names: dict) -> None:
    """A nested region reads the moved values by their new names."""
    own = set(r.inputs) | {v.name for v in r.constants()} | {o for m in r.nodes for o in m.outputs}
    for old, new in names.items():
        if old not in own and old in r.values and new not in r.values:
            r.values[new] = replace(r.values[old], name=new)
    for m in r.nodes:
        m.inputs = [names.get(i, i) if i not in own else i for i in m.inputs]
        for sub in m.regions.values():
            _rename_captures(sub, {k: v for k, v in names.items() if k not in own})
    r.outputs = [names.get(o, o) if o not in own else o for o in r.outputs]
