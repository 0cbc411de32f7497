"""No-op removal: a node that hands its input through unchanged is dropped and its readers
read the input directly.

    reshape x -> same shape          transpose with the identity perm
    cast to the dtype x already has  expand / squeeze / unsqueeze that change no dim
    pad with all-zero pads           slice that keeps every element, in order
    concat / identity of one input   x + 0, x - 0, x * 1, x / 1 (constant of x's shape or smaller)
    resize to the size x has         (every mode samples each pixel at its own centre then;
                                      not tf_crop_and_resize, whose roi moves the samples)

"Same shape" means the same dims, with no `?` among them (two `?` may differ at run time).
A no-op whose result is a graph output is removed only if its input is an intermediate
value nothing else reads: then the input's producer writes the output's name directly. A
"no-op" between two memory spaces is a transfer and stays (see rewrite.can_forward).
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.shapes import UNKNOWN
from .rewrite import can_forward, const_data, drop_unused_values, readers, rename_uses

# value-preserving binary ops and their neutral right operand
_NEUTRAL = {"add": 0, "sub": 0, "mul": 1, "div": 1}


def _same_shape(a, b) -> bool:
    return a is not None and b is not None and tuple(a) == tuple(b) and UNKNOWN not in tuple(a)


def is_noop(g: Graph, n: Node) -> bool:
    """Does `n` return its first operand unchanged (same data, shape and dtype)?"""
    if n.regions or len(n.outputs) != 1 or not n.inputs or not n.inputs[0]:
        return False
    x, y = g.values[n.inputs[0]], g.values[n.outputs[0]]
    if x.kind != "tensor" or y.kind != "tensor" or x.dtype != y.dtype:
        return False
    if n.op in ("identity", "cast"):  # the same shape by definition, known or not
        return True
    if not _same_shape(x.shape, y.shape):
        return False
    a = OPS[n.op].attrs_of(n)
    if n.op in ("identity", "cast", "reshape", "expand", "squeeze", "unsqueeze", "flatten"):
        return True  # same dims and dtype: nothing moved (flatten of a 2-D (a, b) at axis 1)
    if n.op == "concat":
        return len(n.inputs) == 1
    if n.op == "resize":  # (SegFormer's decode head "upsamples" its finest map to its own size)
        return a.get("coordinate_transformation_mode") != "tf_crop_and_resize" and all(isinstance(d, int) for d in x.shape)
    if n.op == "transpose":
        perm = a["perm"] or list(reversed(range(len(x.shape))))
        return list(perm) == list(range(len(x.shape)))
    if n.op == "pad":
        pads = const_data(g, n.inputs[1])
        return pads is not None and not np.any(pads)
    if n.op == "slice":
        steps = const_data(g, n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else None
        ok_steps = (len(n.inputs) <= 4 or not n.inputs[4]) or (steps is not None and np.all(steps == 1))
        return ok_steps and all(isinstance(d, int) for d in x.shape)  # static and same size: all kept
    if n.op in _NEUTRAL and len(n.inputs) == 2:
        c = const_data(g, n.inputs[1])
        return c is not None and c.dtype.kind in "fiu" and c.size > 0 and bool(np.all(c == _NEUTRAL[n.op]))
    return False


def remove_noops(g: Graph) -> Graph:
    for r in (r for n in g.nodes for r in n.regions.values()):
        remove_noops(r)
    kept = []
    for k, n in enumerate(g.nodes):
        if not is_noop(g, n):
            kept.append(n)
            continue
        x, y = n.inputs[0], n.outputs[0]
        if can_forward(g, y, x):
            rename_uses(g, y, x)
            continue
        # y is a graph output: let x's producer write y, if x is an intermediate only n reads.
        current = Graph(nodes=kept + g.nodes[k + 1:], outputs=g.outputs)
        p = current.producers().get(x)
        if (p is not None and x not in g.outputs and not readers(current).get(x)
                and not p.regions and g.values[x].space == g.values[y].space):
            p.outputs = [y if o == x else o for o in p.outputs]
            continue
        kept.append(n)
    g.nodes = kept
    drop_unused_values(g)
    return g
