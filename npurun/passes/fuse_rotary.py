"""Rotary embeddings as exporters write transformers' `apply_rotary_pos_emb` become one
`rope_half` node (ir/ops/fused.py):

    x1 = slice(x, 0, d/2, axis=-1); x2 = slice(x, d/2, end, axis=-1)
    y = x * cos + concat(-x2, x1, axis=-1) * sin                 ->   y = rope_half(x, cos, sin)

(d, x's last dim, known and even.) Seven nodes per query or key projection and layer become
one, which a decode step -- a few microseconds of work per node -- feels: a 4-layer model's
step loses 48 of its ~250 nodes. The cpu kernel computes the same float32 operations in the
same order, so the result is bit-identical (tests/test_passes.py).
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions


def fuse_rotary(g: Graph) -> Graph:
    in_regions(fuse_rotary, g)
    c = Chains(g)
    for add in list(g.nodes):
        if add.op != "add" or len(add.inputs) != 2:
            continue
        m = [c.producer.get(i) for i in add.inputs]
        if any(n is None or n.op != "mul" or len(n.inputs) != 2 for n in m):
            continue
        for rot_mul, x_mul in ((m[0], m[1]), (m[1], m[0])):
            found = _match(c, add, x_mul, rot_mul)
            if found is not None:
                chain, x, cos, sin = found
                if c.free(*chain):
                    c.replace(chain, Node("rope_half", [x, cos, sin], list(add.outputs), name=add.name))
                break
    return c.commit()


def _match(c: Chains, add: Node, x_mul: Node, rot_mul: Node):
    """(chain, x, cos, sin) when rot_mul = concat(-x2, x1) * sin and x_mul = x * cos."""
    for r_name in rot_mul.inputs:
        cat = c.producer.get(r_name)
        if cat is None or cat.op != "concat" or len(cat.inputs) != 2 or c.sole(r_name) is not rot_mul:
            continue
        sin = c.other(rot_mul, r_name)
        neg, x1s = c.producer.get(cat.inputs[0]), c.producer.get(cat.inputs[1])
        if neg is None or neg.op != "neg" or x1s is None or x1s.op != "slice" or c.sole(cat.inputs[0]) is not cat:
            continue
        x2s = c.producer.get(neg.inputs[0])
        if x2s is None or x2s.op != "slice" or c.sole(neg.inputs[0]) is not neg or c.sole(cat.inputs[1]) is not cat:
            continue
        x = x1s.inputs[0]
        v = c.g.values.get(x)
        if x2s.inputs[0] != x or v is None or not v.shape or not isinstance(v.shape[-1], int) or v.shape[-1] % 2:
            continue
        d, rank = v.shape[-1], len(v.shape)
        axis = OPS["concat"].attrs_of(cat)["axis"]
        if axis not in (-1, rank - 1) or not _half(c, x1s, 0, d // 2, rank) or not _half(c, x2s, d // 2, d, rank):
            continue
        if x not in x_mul.inputs or x_mul.inputs.count(x) != 1:
            continue
        cos = c.other(x_mul, x)
        for nm in (x_mul.outputs[0], rot_mul.outputs[0]):
            if c.sole(nm) is not add:
                return None
        return [x2s, neg, x1s, cat, rot_mul, x_mul, add], x, cos, sin
    return None


def _half(c: Chains, s: Node, lo: int, hi: int, rank: int) -> bool:
    """Is slice node s x[..., lo:hi] on the last axis (an end past the dim counts as hi)?"""
    ins = s.inputs + [""] * (5 - len(s.inputs))
    st, en = c.const(ins[1]), c.const(ins[2])
    ax = c.const(ins[3]) if ins[3] else None
    step = c.const(ins[4]) if ins[4] else None
    if st is None or en is None or st.size != 1 or en.size != 1:
        return False
    if ins[3] and (ax is None or ax.size != 1 or int(ax.reshape(-1)[0]) not in (-1, rank - 1)):
        return False
    if not ins[3] and rank != 1:
        return False
    if ins[4] and (step is None or step.size != 1 or int(step.reshape(-1)[0]) != 1):
        return False
    a, b = int(st.reshape(-1)[0]), int(en.reshape(-1)[0])
    return a == lo and (b == hi or (hi == 2 * lo and lo > 0 and b >= hi))
