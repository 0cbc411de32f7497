"""GELU from its exported spellings:

    y = x * (0.5 * (erf(x / sqrt 2) + 1))     and the orders (x * s) * 0.5, (x * 0.5) * s,
                                              x * (1/sqrt 2) for the division
                                              -> gelu(x)               (approximate "none")
    y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (x^3 as pow(x, 3) or x * x * x,
                                              the same orders of the tail; GPT-2's "gelu_new")
                                              -> gelu(x, approximate="tanh")

The constants must be the ones GELU has (sqrt 2 within float rounding, 1, 0.5): a chain
with other constants is some other function and stays as written. ConvNeXt, ViT, BERT and
wav2vec2 spend five passes over memory per GELU (GPT-2 and ALBERT eight, one of them a pow);
as one op it is one.
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


def _cube(c: Chains, n: Node | None) -> tuple[str, list[Node]] | None:
    """(x, nodes) when n computes x^3: pow(x, 3), or (x * x) * x / x * (x * x)."""
    if n is None:
        return None
    if n.op == "pow" and _near(c.scalar(n.inputs[1], like=n.inputs[0]), 3.0):
        return n.inputs[0], [n]
    if n.op == "mul" and len(n.inputs) == 2:
        for k in (0, 1):
            sq = c.producer.get(n.inputs[k])
            x = n.inputs[1 - k]
            if sq is not None and sq.op == "mul" and sq.inputs == [x, x] and c.sole(sq.outputs[0]) is n:
                return x, [sq, n]
    return None


def _tanh_form(c: Chains, th: Node) -> tuple[str, list[Node]] | None:
    """(x, the chain) of the tanh GELU around tanh node `th`, or None."""
    m2 = c.producer.get(th.inputs[0])  # sqrt(2/pi) * (x + 0.044715 x^3)
    if m2 is None or m2.op != "mul" or c.sole(th.inputs[0]) is not th or len(m2.inputs) != 2:
        return None
    inner = next((i for i in m2.inputs if _near(c.scalar(c.other(m2, i) or "", like=i), math.sqrt(2 / math.pi))), None)
    a1 = c.producer.get(inner or "")
    if a1 is None or a1.op != "add" or c.sole(inner) is not m2 or len(a1.inputs) != 2:
        return None
    for k in (0, 1):  # x + 0.044715 * cube(x)
        x, m1 = a1.inputs[k], c.producer.get(a1.inputs[1 - k])
        if m1 is None or m1.op != "mul" or c.sole(a1.inputs[1 - k]) is not a1 or len(m1.inputs) != 2:
            continue
        cube_in = next((i for i in m1.inputs if _near(c.scalar(c.other(m1, i) or "", like=i), 0.044715)), None)
        cube = _cube(c, c.producer.get(cube_in or ""))
        if cube is None or cube[0] != x or c.sole(cube_in) is not m1:
            continue
        add = c.sole(th.outputs[0], "add")
        if add is None or not _near(c.scalar(c.other(add, th.outputs[0]) or "", like=x), 1.0):
            return None
        tail = _tail(c, add.outputs[0], x)
        if tail is None:
            return None
        return x, cube[1] + [m1, a1, m2, th, add] + tail
    return None


def fuse_gelu(g: Graph) -> Graph:
    in_regions(fuse_gelu, g)
    c = Chains(g)
    for th in list(g.nodes):
        if th.op != "tanh" or id(th) in c.taken:
            continue
        found = _tanh_form(c, th)
        if found is None or c.dtype(found[0]) not in ("f32", "f16", "f64"):
            continue
        x, chain = found
        chain = sorted(chain, key=g.nodes.index)
        if c.free(*chain):
            c.replace(chain, Node("gelu", [x], list(chain[-1].outputs), {"approximate": "tanh"},
                                  name=th.name or chain[-1].name))
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
