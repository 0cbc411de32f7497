"""LayerNorm and RMSNorm from their written-out forms (exporters before opset 17, Keras and
PyTorch modules that compute them by hand):

    m = mean(x); d = x - m; v = mean(d^2); y = d / sqrt(v + eps) [* g] [+ b]
                                            -> layer_normalization(x, g, b, axis, epsilon)
    v = mean(x^2); y = x / sqrt(v + eps) [* g]   (T5, LLaMA)
                                            -> rms_normalization(x, g, axis, epsilon)

`mean` is reduce_mean over the trailing axes with keepdims (the axes give the op's axis), the
square pow(., 2) or a product with itself, the division also a product by reciprocal(sqrt(.))
or by 1 / sqrt(.);
g and b constants that broadcast over the normalized axes only (a missing g is ones). A
LayerNorm written out is nine passes over memory (openWakeWord's classifier, ConvNeXt's
channel norm); one op is one (the cpu backend's csrc/transformer.c layernorm).
"""
from __future__ import annotations

import numpy as np

from ..ir.dtypes import to_numpy
from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions
from .rewrite import new_const


def _trailing_axes(c: Chains, n: Node) -> int | None:
    """-k when n is reduce_mean(x, keepdims=1) over x's last k axes, else None."""
    if n.op != "reduce_mean" or not OPS["reduce_mean"].attrs_of(n)["keepdims"]:
        return None
    x = c.g.values[n.inputs[0]]
    axes = c.const(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else None
    if axes is None or x.shape is None:
        return None
    rank = len(x.shape)
    ax = sorted(int(a) % rank for a in axes.reshape(-1))
    k = len(ax)
    return -k if k and ax == list(range(rank - k, rank)) else None


def _square_of(c: Chains, n: Node | None) -> str | None:
    """v when n computes v^2 (pow by 2, or v * v)."""
    if n is None:
        return None
    if n.op == "pow" and c.scalar(n.inputs[1], like=n.inputs[0]) == 2.0:
        return n.inputs[0]
    if n.op == "mul" and len(n.inputs) == 2 and n.inputs[0] == n.inputs[1]:
        return n.inputs[0]
    return None


def _normalized(c: Chains, d: str, r_in: str):
    """(nodes, output) of d / sqrt(r_in) or d * reciprocal(sqrt(r_in)), sqrt reading r_in."""
    sq = c.sole(r_in, "sqrt")
    if sq is None:
        return None
    nxt = c.sole(sq.outputs[0])
    if nxt is not None and nxt.op == "div" and nxt.inputs == [d, sq.outputs[0]]:
        return [sq, nxt], nxt.outputs[0]
    one_over = nxt is not None and nxt.op == "div" and nxt.inputs[1] == sq.outputs[0] \
        and c.scalar(nxt.inputs[0], like=d) == 1.0  # 1 / sqrt(.) written as a division (T5)
    if nxt is not None and (nxt.op == "reciprocal" or one_over):
        m = c.sole(nxt.outputs[0], "mul")
        if m is not None and c.other(m, nxt.outputs[0]) == d:
            return [sq, nxt, m], m.outputs[0]
    return None


def _affine_tail(c: Chains, v: str, norm_shape: tuple):
    """The constant scale and shift after the normalized value: (nodes, g, b, output)."""
    nodes, g, b = [], None, None
    m = c.sole(v, "mul")
    if m is not None and c.free(m):
        other = c.other(m, v)
        d = c.const(other) if other else None
        if d is not None and _fits(d.shape, norm_shape) and c.dtype(other) == c.dtype(v):
            nodes.append(m)
            g, v = other, m.outputs[0]
    a = c.sole(v, "add")
    if a is not None and c.free(a):
        other = c.other(a, v)
        d = c.const(other) if other else None
        if d is not None and _fits(d.shape, norm_shape) and c.dtype(other) == c.dtype(v):
            nodes.append(a)
            b, v = other, a.outputs[0]
    return nodes, g, b, v


def _fits(shape, norm_shape) -> bool:
    """Does a constant of `shape` vary along the normalized axes only?"""
    shape = tuple(shape)
    return len(shape) <= len(norm_shape) or all(s == 1 for s in shape[:len(shape) - len(norm_shape)])


def fuse_layer_norm(g: Graph) -> Graph:
    in_regions(fuse_layer_norm, g)
    c = Chains(g)
    for first in list(g.nodes):
        k = _trailing_axes(c, first) if c.free(first) else None
        if k is None or id(first) in c.taken:
            continue
        x = first.inputs[0]
        xs = g.values[x].shape
        if c.dtype(x) not in ("f32", "f16", "f64"):
            continue
        norm_shape = tuple(xs[len(xs) + k:])
        found = _layer_norm(c, first, x, k) or _rms_norm(c, first, k)
        if found is None:
            continue
        op, chain, x, eps = found
        tail, gname, bname, out = _affine_tail(c, chain[-1].outputs[0], norm_shape)
        if op == "rms_normalization" and bname:
            tail, bname = tail[:-1], None  # (RMSNorm has no shift: the add stays after it)
            out = tail[-1].outputs[0] if tail else chain[-1].outputs[0]
        chain = chain + tail
        if not c.free(*chain):
            continue
        if gname is None:  # both ops take a scale: ones
            gname = new_const(g, f"{out}.scale", np.ones(norm_shape, dtype=to_numpy(g.values[x].dtype)))
        ins = [x, gname] + ([bname] if bname else [])
        c.replace(chain, Node(op, ins, [out], {"axis": k, "epsilon": eps}, name=first.name or chain[-1].name))
    return c.commit()


def _layer_norm(c: Chains, m1: Node, x: str, k: int):
    """('layer_normalization', chain, d, the eps add) from the first mean, or None."""
    d_node = None
    for r in c.readers.get(m1.outputs[0], []):
        if r.op == "sub" and r.inputs == [x, m1.outputs[0]]:
            d_node = r
    if d_node is None or not c.only_readers(m1.outputs[0], [d_node]):
        return None
    d = d_node.outputs[0]
    rs = c.readers.get(d, [])
    sq = next((r for r in rs if _square_of(c, r) == d), None)
    if sq is None:
        return None
    m2 = c.sole(sq.outputs[0])
    if m2 is None or _trailing_axes(c, m2) != k:
        return None
    e = c.sole(m2.outputs[0], "add")
    eps = c.scalar(c.other(e, m2.outputs[0]) or "", like=x) if e is not None else None
    if eps is None:
        return None
    norm = _normalized(c, d, e.outputs[0])
    if norm is None:
        return None
    nodes, out = norm
    if not c.only_readers(d, [sq, nodes[-1]]):
        return None
    return "layer_normalization", [m1, d_node, sq, m2, e] + nodes, x, eps


def _rms_norm(c: Chains, m: Node, k: int):
    """('rms_normalization', chain, x, the eps add) when m is the mean of a square of x."""
    sqn = c.producer.get(m.inputs[0])
    x = _square_of(c, sqn)
    if x is None or c.sole(m.inputs[0]) is not m:
        return None
    e = c.sole(m.outputs[0], "add")
    eps = c.scalar(c.other(e, m.outputs[0]) or "", like=x) if e is not None else None
    if eps is None:
        return None
    norm = _normalized(c, x, e.outputs[0])
    if norm is None:
        return None
    nodes, _ = norm
    return "rms_normalization", [sqn, m, e] + nodes, x, eps
