"""Masked softmax: the scores' mask add and the NaN fix of an exported attention join its
softmax (ir/ops/fused.py `masked_softmax`):

    p = softmax(scores + mask, axis=-1)               -> masked_softmax(scores, mask)
    q = where(is_nan(p), c, p)                        -> masked_softmax(..., nan_fix=1, nan_value=c)

(torch's exported scaled_dot_product_attention writes both; BERT-style encoders the add.)
The add and the fix are each optional, but at least one must be there; last axis only.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions


def fuse_masked_softmax(g: Graph) -> Graph:
    in_regions(fuse_masked_softmax, g)
    c = Chains(g)
    for sm in list(g.nodes):
        if sm.op != "softmax" or c.dtype(sm.inputs[0]) != "f32" or not c.free(sm):
            continue
        rank = len(g.values[sm.inputs[0]].shape)
        if OPS["softmax"].attrs_of(sm)["axis"] not in (-1, rank - 1):
            continue
        chain, ins = [sm], list(sm.inputs)
        add = c.producer.get(sm.inputs[0])
        if add is not None and add.op == "add" and c.sole(sm.inputs[0]) is sm and len(add.inputs) == 2 \
                and all(c.dtype(i) == "f32" for i in add.inputs) and c.free(add):
            # the scores are the operand with the result's full shape
            a, b = add.inputs
            full = tuple(g.values[add.outputs[0]].shape)
            ins = [a, b] if tuple(g.values[a].shape) == full else [b, a]
            chain = [add, sm]
        attrs = {"axis": -1}
        p = sm.outputs[0]
        rs = c.readers.get(p, [])
        isnan = next((r for r in rs if r.op == "is_nan" and r.inputs == [p]), None)
        where = next((r for r in rs if r.op == "where"), None)
        if isnan is not None and where is not None and c.free(isnan, where) and c.only_readers(p, [isnan, where]) \
                and where.inputs[0] == isnan.outputs[0] and where.inputs[2] == p \
                and c.sole(isnan.outputs[0]) is where and c.scalar(where.inputs[1]) is not None \
                and tuple(g.values[where.outputs[0]].shape) == tuple(g.values[p].shape):
            chain += [isnan, where]
            attrs.update(nan_fix=1, nan_value=c.scalar(where.inputs[1]))
        if len(chain) == 1 or not c.free(*chain):
            continue
        c.replace(chain, Node("masked_softmax", ins, list(chain[-1].outputs), attrs, name=sm.name))
    return c.commit()
