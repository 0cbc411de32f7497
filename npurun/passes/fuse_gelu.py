"""GELU from its exported spelling (torch's and Keras's exact GELU):

    y = x * (0.5 * (erf(x / sqrt 2) + 1))     and the orders (x * s) * 0.5, (x * 0.5) * s,
                                              x * (1/sqrt 2) for the division
                                              -> gelu(x)               (approximate "none")

The constants must be the ones GELU has (sqrt 2 within float rounding, 1, 0.5): a chain
with other constants is some other function and stays as written. ConvNeXt, ViT, BERT and
wav2vec2 spend five passes over memory per GELU; as one op it is one.
"""
from __future__ import annotations

import math

from ..ir.graph import Graph, Node
from .match import Chains, in_regions


def _near(v, want) -> bool:
    return v is not None and abs(v - want) <= 2e-6 * abs(want)


def _scaled_input(c: Chains, t: Node | None) -> str | None:
    """x when t computes x / sqrt 2 or x * (1/sqrt 2)."""
    if t is None or len(t.inputs) != 2:
        return None
    if t.op == "div" and _near(c.scalar(t.inputs[1], like=t.inputs[0]), math.sqrt(2)):
        return t.inputs[0]
    if t.op == "mul":
        for k in (0, 1):
            if _near(c.scalar(t.inputs[k], like=t.inputs[1 - k]), 1 / math.sqrt(2)):
                return t.inputs[1 - k]
    return None


def _tail(c: Chains, s: str, x: str) -> list[Node] | None:
    """The two muls that finish y = 0.5 * x * s (any association), s = erf(.) + 1."""
    m1 = c.sole(s, "mul")
    if m1 is None:
        return None
    other = c.other(m1, s)
    if _near(c.scalar(other or "", like=x), 0.5):  # (0.5 * s) * x
        m2 = c.sole(m1.outputs[0], "mul")
        return [m1, m2] if m2 is not None and c.other(m2, m1.outputs[0]) == x else None
    if other == x:  # (x * s) * 0.5
        m2 = c.sole(m1.outputs[0], "mul")
        return [m1, m2] if m2 is not None and _near(c.scalar(c.other(m2, m1.outputs[0]) or "", like=x), 0.5) else None
    h = c.producer.get(other or "")  # (x * 0.5) * s, x * 0.5 read only here
    if h is not None and h.op == "mul" and c.other(h, x) is not None and _near(c.scalar(c.other(h, x), like=x), 0.5) \
            and c.sole(h.outputs[0]) is m1:
        return [h, m1]
    return None


def fuse_gelu(g: Graph) -> Graph:
    in_regions(fuse_gelu, g)
    c = Chains(g)
    for e in list(g.nodes):
        if e.op != "erf":
            continue
        t = c.producer.get(e.inputs[0])
        x = _scaled_input(c, t)
        if x is None or c.sole(t.outputs[0]) is not e or c.dtype(x) not in ("f32", "f16", "f64"):
            continue
        add = c.sole(e.outputs[0], "add")
        if add is None or not _near(c.scalar(c.other(add, e.outputs[0]) or "", like=x), 1.0):
            continue
        tail = _tail(c, add.outputs[0], x)
        if tail is None:
            continue
        chain = sorted([t, e, add] + tail, key=g.nodes.index)
        if not c.free(*chain):
            continue
        c.replace(chain, Node("gelu", [x], list(chain[-1].outputs), name=e.name or chain[-1].name))
    return c.commit()
