"""Chain matching for the fusion passes (not a pass itself): who produces and who reads each
value, the small questions patterns ask, and one safe way to replace a chain by a node.

A chain may become one node only when nothing outside it can see its intermediate values:
each is read by the next node of the chain alone (once), is not a graph output and is not
captured by a region. The replacement takes the place of the chain's last node and its
output's name, so graph outputs keep their names and every value the new node reads (the
chain's own inputs) is computed before it. Nodes fuse only at float32 precision (None or
"f32"): a reduced-precision node rounds where the graph says.
"""
from __future__ import annotations

import numpy as np

from ..ir.dtypes import to_numpy
from ..ir.graph import Graph, Node
from .rewrite import drop_unused_values


def f32(*nodes: Node) -> bool:
    return all(n.precision in (None, "f32") for n in nodes)


class Chains:
    def __init__(self, g: Graph):
        self.g = g
        self.producer = {o: n for n in g.nodes for o in n.outputs}
        self.readers: dict[str, list[Node]] = {}
        for n in g.nodes:
            for i in n.inputs:
                if i:
                    self.readers.setdefault(i, []).append(n)
        self.hidden = set(g.outputs) | {c for n in g.nodes for r in n.regions.values() for c in r.captures()}
        self.taken: set[int] = set()
        self._plans: list[tuple[list[Node], Node]] = []

    # -- questions ---------------------------------------------------------------------
    def sole(self, name: str, op: str | None = None) -> Node | None:
        """The one node reading `name` (once), when nothing else can see it; of op `op` if given."""
        rs = self.readers.get(name, [])
        if name in self.hidden or len(rs) != 1 or rs[0].inputs.count(name) != 1 or rs[0].regions:
            return None
        return rs[0] if op is None or rs[0].op == op else None

    def only_readers(self, name: str, nodes: list[Node]) -> bool:
        """Are `nodes` every reader of `name` (and is it invisible outside them)?"""
        rs = self.readers.get(name, [])
        return name not in self.hidden and len(rs) == len(nodes) and {id(r) for r in rs} == {id(n) for n in nodes}

    def const(self, name: str):
        v = self.g.values.get(name) if name else None
        return None if v is None else v.data

    def scalar(self, name: str, like: str | None = None) -> float | None:
        """A constant float scalar (any rank, one element) as a Python float, else None; with
        `like`, only of the dtype of value `like` (a chain of mixed types is left alone)."""
        d = self.const(name)
        if d is None or d.size != 1 or d.dtype.kind != "f":
            return None
        if like is not None and (self.dtype(like) is None or d.dtype != to_numpy(self.dtype(like))):
            return None
        return float(d.reshape(()))

    def dtype(self, name: str) -> str | None:
        v = self.g.values.get(name)
        return None if v is None else v.dtype

    def other(self, n: Node, name: str) -> str | None:
        """The operand of binary node `n` that is not `name` (None unless exactly one is)."""
        if len(n.inputs) != 2 or n.inputs.count(name) != 1:
            return None
        return n.inputs[1] if n.inputs[0] == name else n.inputs[0]

    def free(self, *nodes: Node) -> bool:
        """May these nodes join a fused node? float32, not fused already, no regions, and
        every value they touch of known rank (a pattern reads ranks and shapes)."""
        return f32(*nodes) and not any(id(n) in self.taken or n.regions for n in nodes) \
            and all(self.ranked(nm) for n in nodes for nm in list(n.inputs) + list(n.outputs) if nm)

    def ranked(self, name: str) -> bool:
        v = self.g.values.get(name)
        return v is None or v.shape is not None

    # -- rewriting ---------------------------------------------------------------------
    def replace(self, chain: list[Node], node: Node | list[Node]) -> None:
        """Plan: `chain` becomes `node` (or nodes, in order), at the place of the chain's
        last node, whose output the (last) new node computes."""
        self.taken.update(id(n) for n in chain)
        self._plans.append((chain, node if isinstance(node, list) else [node]))

    def commit(self) -> Graph:
        if not self._plans:
            return self.g
        index = {id(n): k for k, n in enumerate(self.g.nodes)}
        new, drop = {}, set()
        for chain, nodes in self._plans:
            ks = sorted(index[id(n)] for n in chain)
            new[ks[-1]] = nodes
            drop.update(ks[:-1])
        self.g.nodes = [m for k, n in enumerate(self.g.nodes) if k not in drop for m in new.get(k, [n])]
        drop_unused_values(self.g)
        return self.g


def in_regions(pass_fn, g: Graph) -> None:
    """Run a pass on every region of g first (their nodes never fuse with the outer graph's)."""
    for n in g.nodes:
        for r in n.regions.values():
            pass_fn(r)


def as_float(x) -> float:
    return float(np.asarray(x).reshape(()))
