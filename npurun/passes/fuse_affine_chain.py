"""Scalar affine chains: runs of multiplies/adds/subtractions/divisions by constant scalars,
with at most one activation among them, become one node (ir/ops/fused.py
`affine_activation`: y = s1 * act(s0 * x + t0) + t1), one pass over memory instead of one per
node:

    u = x * 0.5; v = u + 1; y = relu(v) * 3     -> affine_activation(x, s0=0.5, t0=1,
                                                                  activation=relu, s1=3)

At least two nodes; the activation is one of ir/ops/elementwise.FUSABLE_ACTIVATIONS (clip
with constant bounds). Run after fold_affine (per-channel affines after a conv go into the
conv) and fuse_activation; what they leave is what this takes: PP-LCNetV3's scalar affine
after conv + hard_swish, input normalizations (x - 0.5) / 0.5, a scale before a sigmoid.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops.elementwise import FUSABLE_ACTIVATIONS
from .fuse_activation import _params
from .match import Chains, in_regions

AFFINE = ("add", "sub", "mul", "div")


def _affine(c: Chains, n: Node, v: str):
    """(a, b) with n = a * v + b for a constant scalar operand, else None."""
    if n.op not in AFFINE or len(n.outputs) != 1:
        return None
    other = c.other(n, v)
    k = c.scalar(other) if other else None
    if k is None or c.dtype(other) != c.dtype(v) or c.g.values[other].data.ndim > len(c.g.values[v].shape):
        return None
    first = n.inputs[0] == v
    if n.op == "add":
        return 1.0, k
    if n.op == "mul":
        return k, 0.0
    if n.op == "sub":
        return (1.0, -k) if first else (-1.0, k)
    return (1.0 / k, 0.0) if first and k != 0 else None


def fuse_affine_chain(g: Graph) -> Graph:
    in_regions(fuse_affine_chain, g)
    c = Chains(g)
    for head in list(g.nodes):
        if id(head) in c.taken or not head.inputs or not head.inputs[0] or not c.free(head):
            continue
        if head.op in FUSABLE_ACTIVATIONS:
            x = head.inputs[0]
        elif head.op in AFFINE:
            x = next((i for i in head.inputs if c.const(i) is None), None)
            if x is None or _affine(c, head, x) is None:
                continue
        else:
            continue
        if c.dtype(x) != "f32" or tuple(g.values[head.outputs[0]].shape) != tuple(g.values[x].shape):
            continue
        s0, t0, act, params, s1, t1 = 1.0, 0.0, "", [], 1.0, 0.0
        chain, v, n = [], x, head
        while n is not None and c.free(n) and g.values[n.outputs[0]].shape == g.values[x].shape:
            ab = _affine(c, n, v)
            if ab is not None:
                a, b = ab
                if act:
                    s1, t1 = a * s1, a * t1 + b
                else:
                    s0, t0 = a * s0, a * t0 + b
            elif not act and n.op in FUSABLE_ACTIVATIONS and n.inputs[0] == v \
                    and (p := _params(c, n)) is not None:
                act, params = n.op, p
            else:
                break
            chain.append(n)
            v = n.outputs[0]
            n = c.sole(v)
        if len(chain) < 2:
            continue
        attrs = {k: val for k, val in (("s0", s0), ("t0", t0), ("s1", s1), ("t1", t1))
                 if val != (1.0 if k[0] == "s" else 0.0)}
        if act:
            attrs.update(activation=act, activation_params=params)
        c.replace(chain, Node("affine_activation", [x], [v], attrs, name=chain[-1].name or head.name))
    return c.commit()
