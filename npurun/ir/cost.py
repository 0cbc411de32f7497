"""Cost of a graph for concrete input shapes: MACs and bytes per node.

The graph's own inference is run again from the concrete input shapes, so dims the graph keeps
symbolic or unknown ('?', e.g. after strided convolutions or shape arithmetic on symbols)
become numbers. A node whose shapes stay unknown (they depend on input *values*) counts 0.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError, NpurunError
from .dtypes import to_numpy
from .graph import Graph
from .ops import OPS, infer_node, macs
from .shapes import bind, numel


@dataclass
class NodeCost:
    node: str
    op: str
    macs: int
    bytes: int  # operands read + results written, counted once each


def concrete_values(g: Graph, input_shapes: dict[str, tuple]) -> dict:
    """The graph's values with shapes inferred again from concrete input shapes."""
    env: dict[str, int] = {}
    vals = dict(g.values)
    for name in g.inputs:
        if name not in input_shapes:
            continue
        shape = tuple(input_shapes[name])
        if not bind(g.values[name].shape, shape, env):
            raise InputError(f"{g.source}: input {name!r} cannot have shape {list(shape)}")
        vals[name] = replace(g.values[name], shape=shape)
    from ..passes.fold_constants import try_fold
    for n in g.nodes:
        try:
            for nm, (shape, dtype, kind) in zip(n.outputs, infer_node(n, vals)):
                vals[nm] = replace(g.values[nm], shape=None if shape is None else tuple(shape), dtype=dtype,
                                   kind=kind)
        except NpurunError:  # inference needs computed values: keep the graph's own types
            continue
        # Shape arithmetic (shape -> gather -> concat -> reshape) becomes known once the
        # input shapes are: fold it, so the values downstream get concrete shapes too.
        shapes = [vals[o].shape for o in n.outputs]
        if any(vals[i].shape is None for i in n.inputs if i):
            continue  # an operand of unknown rank is neither a constant nor a known shape
        if n.op in ("shape", "size") or all(_static(s) for s in shapes):
            try:
                res = try_fold(n, vals, shapes)
            except Exception:  # noqa: BLE001 - a node that cannot fold is simply computed later
                res = None
            if res is not None:
                for nm, arr in zip(n.outputs, res):
                    vals[nm] = replace(vals[nm], shape=tuple(arr.shape), data=arr)
    return vals


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def node_costs(g: Graph, input_shapes: dict[str, tuple]) -> list[NodeCost]:
    """Per-node MACs and bytes for the given input shapes."""
    vals = concrete_values(g, input_shapes)
    out = []
    for n in g.nodes:
        names = [i for i in n.inputs if i] + list(n.outputs)
        shapes = {nm: None if vals[nm].shape is None else tuple(vals[nm].shape)
                  for nm in names if vals[nm].kind == "tensor"}
        nbytes = sum(numel(s) * to_numpy(vals[nm].dtype).itemsize for nm, s in shapes.items() if _static(s))
        ins = [shapes.get(i) if i else None for i in n.inputs]
        outs = [shapes.get(o) for o in n.outputs]
        known = all(_static(s) for s in ins + outs if s is not None) and None not in outs
        if known and OPS[n.op].bytes is not None:  # an op registered with its own traffic rule
            nbytes = op_bytes(n, vals)
        out.append(NodeCost(n.name or n.full_op, n.op, macs(n, ins, outs) if known else 0, nbytes))
    return out


def op_bytes(n, vals: dict) -> int:
    """Bytes an op registered with a `bytes` rule (npurun.register_op) moves, from its operand
    and result types: the rule gets (shape, dtype) pairs, None for an absent operand."""
    d = OPS[n.op]
    pair = lambda nm: (tuple(vals[nm].shape), vals[nm].dtype) if nm else None  # noqa: E731
    return int(d.bytes(d.attrs_of(n), [pair(i) for i in n.inputs], [pair(o) for o in n.outputs]))
