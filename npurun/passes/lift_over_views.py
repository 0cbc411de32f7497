"""Elementwise ops after a view of a conv's result move before the view, so that they meet
the conv and fold into it (fold_affine: the bias; fuse_activation: the epilogue):

    y = relu(squeeze(conv(x, w)) + b)  ->  y = squeeze(relu(conv(x, w) + b'))

A Keras Conv1D, as tf2onnx writes it, is ExpandDims -> Conv -> Squeeze -> BiasAdd -> ReLU:
the bias and the activation ran as two more passes over the result (deepcut's twelve convs:
2.6 ms of adds and 1.2 ms of ReLUs in a 23 ms run). The views are reshape, flatten,
squeeze and unsqueeze (each a free relabelling of the same elements); the ops are the
activations fuse_activation takes and add / sub / mul / div by a constant that is a scalar or
varies along one axis of the view's output which is also an axis of its input (the same
elements before it: b' is that constant laid along the input's axis). Only where the view
alone reads the conv's result, each op alone reads the one before, and nothing changes
shape. Linear layers need none of this: fold_affine follows views after them itself.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops.elementwise import FUSABLE_ACTIVATIONS
from .fold_affine import AFFINE, VIEWS  # (the ops it folds, and the relabelling views)
from .match import Chains, in_regions
from .rewrite import new_const, new_value


def _size(dims) -> tuple:
    """The number of elements of `dims` as (product of the known dims, the named ones sorted):
    equal for two lists of dims that surely hold as many elements (a batch dim may be named)."""
    return math.prod(d for d in dims if isinstance(d, int)), tuple(sorted(str(d) for d in dims if not isinstance(d, int)))


def _lifted_const(c: Chains, name: str, before: tuple, after: tuple):
    """The constant `name`, broadcast against a value of shape `after`, re-laid for the same
    elements in shape `before`; None where it does not map (it varies along more than one
    axis, or along one the view splits or merges)."""
    d = c.const(name)
    if d is None or d.ndim > len(after):
        return None
    if d.size == 1:  # (one of more dims than the input's)
        return d.reshape((1,) * len(before))
    full = d.reshape((1,) * (len(after) - d.ndim) + d.shape)
    axes = [i for i, s in enumerate(full.shape) if s != 1]
    if len(axes) != 1 or full.shape[axes[0]] != after[axes[0]]:
        return None
    a = axes[0]
    lead = _size(after[:a])
    for j, s in enumerate(before):  # the input's axis holding the same elements
        if s == after[a] and _size(before[:j]) == lead:
            shape = [1] * len(before)
            shape[j] = s
            return d.reshape(shape)
    return None


def _step(c: Chains, n: Node, v: str, before: tuple, after: tuple):
    """If n (reading v) can move before the view: the constants it then reads instead, {name:
    re-laid array} (empty when none changes); else None."""
    if n.op in FUSABLE_ACTIVATIONS and n.inputs[0] == v and v not in n.inputs[1:]:
        if any(i and c.const(i) is None for i in n.inputs[1:]):  # (clip's bounds: constants)
            return None
        return {}
    other = c.other(n, v) if n.op in AFFINE else None
    if other is None or c.dtype(other) != c.dtype(v):
        return None
    d = c.const(other)
    if d is not None and d.size == 1 and d.ndim <= len(before):
        return {}  # a scalar broadcasts the same on either side
    k = _lifted_const(c, other, before, after)
    return None if k is None else {other: k}


def lift_over_views(g: Graph) -> Graph:
    in_regions(lift_over_views, g)
    c = Chains(g)
    for conv in list(g.nodes):
        if conv.op != "conv" or len(conv.outputs) != 1:
            continue
        u = conv.outputs[0]
        view = c.sole(u)
        if view is None or view.op not in VIEWS or view.inputs[0] != u or not c.free(view):
            continue
        v = view.outputs[0]
        if g.values[u].shape is None or g.values[v].shape is None:
            continue
        before, after = tuple(g.values[u].shape), tuple(g.values[v].shape)
        chain, steps, cur = [view], [], v
        while (n := c.sole(cur)) is not None and c.free(n) and len(n.outputs) == 1 \
                and tuple(g.values[n.outputs[0]].shape or ()) == after:
            consts = _step(c, n, cur, before, after)
            if consts is None:
                break
            chain.append(n)
            steps.append((n, cur, consts))
            cur = n.outputs[0]
        if not steps:
            continue
        nodes, x = [], u
        for n, read, consts in steps:  # (read: the value n read after the view; x: its twin before)
            out = g.values[n.outputs[0]]
            y = new_value(g, f"{n.outputs[0]}.unviewed", before, out.dtype, out.space)
            new = {nm: new_const(g, f"{nm}.unviewed", np.ascontiguousarray(k), like=g.values[nm])
                   for nm, k in consts.items()}
            ins = [x if i == read else new.get(i, i) for i in n.inputs]
            nodes.append(Node(n.op, ins, [y], dict(n.attrs), dict(n.hints), n.name, n.precision))
            x = y
        nodes.append(Node(view.op, [x] + list(view.inputs[1:]), [cur], dict(view.attrs), dict(view.hints),
                          view.name, view.precision))
        c.replace(chain, nodes)
    return c.commit()
