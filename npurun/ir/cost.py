"""Cost of a graph for concrete input shapes: MACs and bytes per node."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .dtypes import to_numpy
from .graph import Graph
from .ops import macs
from .shapes import UNKNOWN, bind, numel, parse_affine


@dataclass
class NodeCost:
    node: str
    op: str
    macs: int
    bytes: int  # operands read + results written, counted once each


def _resolve(shape, env):
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif d != UNKNOWN and (p := parse_affine(d)) and p[1] in env:
            out.append(p[0] * env[p[1]] + p[2])
        else:
            out.append(None)
    return tuple(out) if None not in out else None


def node_costs(g: Graph, input_shapes: dict[str, tuple]) -> list[NodeCost]:
    """Per-node MACs and bytes, binding the graph's symbolic dims to `input_shapes`.
    A node whose shapes stay unknown (data-dependent) counts 0."""
    env: dict[str, int] = {}
    for name in g.inputs:
        if not bind(g.values[name].shape, tuple(input_shapes[name]), env):
            raise InputError(f"{g.source}: input {name!r} cannot have shape {list(input_shapes[name])}")
    out = []
    for n in g.nodes:
        ins = [_resolve(g.values[i].shape, env) if i else None for i in n.inputs]
        outs = [_resolve(g.values[o].shape, env) for o in n.outputs]
        names = list(n.inputs) + list(n.outputs)
        shapes = ins + outs
        nbytes = sum(numel(s) * to_numpy(g.values[nm].dtype).itemsize
                     for nm, s in zip(names, shapes) if nm and s is not None)
        all_known = all(s is not None for nm, s in zip(names, shapes) if nm)
        m = macs(n, ins, outs) if all_known else 0
        out.append(NodeCost(n.name or n.full_op, n.op, m, nbytes))
    return out
