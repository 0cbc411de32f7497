"""Dead-code removal: drop every node whose results reach no graph output, then every value
and constant nothing mentions any more.

All ops of the vocabulary are pure (no op writes state a later run sees), so "reaches an
output" is the only reason to keep a node. Walking the nodes backwards once is enough because
they are in topological order. Regions (if/loop/scan bodies) are cleaned the same way with
their own outputs as roots; what a region reads from outside keeps its producer alive.
Graph inputs stay even when unread: they are the model's interface.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import drop_unused_values


def eliminate_dead_code(g: Graph) -> Graph:
    live = set(g.outputs)
    kept = []
    for n in reversed(g.nodes):
        if not any(o in live for o in n.outputs):
            continue
        for r in n.regions.values():
            eliminate_dead_code(r)
            live.update(r.captures())
        live.update(i for i in n.inputs if i)
        kept.append(n)
    g.nodes = kept[::-1]
    drop_unused_values(g)
    return g
