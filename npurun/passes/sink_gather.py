"""Gather before dequantization: an int8 table dequantized at run time and then gathered
reads only the gathered rows once the gather comes first:

    w = cast(q) * s; y = gather(w, ids)  ->  y = cast(gather(q, ids)) * gather(s, ids)

(s broadcast to q: a scalar or one scale per row/column; where s does not vary along the
gathered axis it is used as it is). The products are the same, on the rows read only:
MiniLM-int8 spent ~40 ms a run dequantizing 30522 x 384 embeddings to read 128 rows. q and s
constants, cast and mul read by nothing else.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions
from .rewrite import new_const, new_value


def sink_gather(g: Graph) -> Graph:
    in_regions(sink_gather, g)
    c = Chains(g)
    for gat in list(g.nodes):
        if gat.op != "gather" or not c.free(gat):
            continue
        mul = c.producer.get(gat.inputs[0])
        if mul is None or mul.op != "mul" or len(mul.inputs) != 2 or c.sole(gat.inputs[0]) is not gat:
            continue
        k = next((j for j in (0, 1) if (p := c.producer.get(mul.inputs[j])) is not None and p.op == "cast"), None)
        if k is None:
            continue
        cast, sname = c.producer[mul.inputs[k]], mul.inputs[1 - k]
        q, s = c.const(cast.inputs[0]), c.const(sname)
        if q is None or s is None or s.ndim > q.ndim or np.broadcast_shapes(q.shape, s.shape) != q.shape \
                or c.sole(cast.outputs[0]) is not mul or not c.free(cast, mul, gat):
            continue
        axis = OPS["gather"].attrs_of(gat)["axis"] % q.ndim
        ids = gat.inputs[1]
        s_full = s.reshape((1,) * (q.ndim - s.ndim) + s.shape)
        out = gat.outputs[0]
        y = g.values[out]
        rows = new_value(g, f"{out}.rows", y.shape, g.values[cast.inputs[0]].dtype, y.space)
        real = new_value(g, f"{out}.real", y.shape, y.dtype, y.space)
        nodes = [Node("gather", [cast.inputs[0], ids], [rows], dict(gat.attrs), name=gat.name),
                 Node("cast", [rows], [real], dict(cast.attrs), name=cast.name)]
        if s_full.shape[axis] == 1:  # the scale does not vary along the gathered rows
            ids_rank = len(g.values[ids].shape)
            sc = new_const(g, f"{sname}.at_rows", s_full.reshape(s_full.shape[:axis] + (1,) * ids_rank
                                                                 + s_full.shape[axis + 1:]), like=g.values[sname])
        else:
            sc = new_value(g, f"{out}.scale", y.shape[:axis] + g.values[ids].shape + s_full.shape[axis + 1:],
                           g.values[sname].dtype, y.space)
            full = sname if s_full.shape == s.shape else new_const(g, f"{sname}.full", s_full, like=g.values[sname])
            nodes.append(Node("gather", [full, ids], [sc], {"axis": axis}, name=f"{gat.name}.scale" if gat.name else ""))
        nodes.append(Node("mul", [real, sc] if k == 0 else [sc, real], [out], name=mul.name))
        c.replace([cast, mul, gat], nodes)
    return c.commit()
