"""HardSwish from its spellings: exporters write x * relu6(x + 3) / 6 out in ops.

    x * clip(x + 3, 0, 6) / 6        (add -> clip -> mul -> div, or mul by 1/6)
    x * (clip(x + 3, 0, 6) / 6)      (add -> clip -> div -> mul)
    x * hard_sigmoid(x)              (alpha 1/6, beta 0.5)
                                      -> hard_swish(x)

PP-OCR, PP-LCNet, MobileNetV3 and their Keras exports spend a pass over memory on each of
those nodes; as one op the activation can then go into the conv before it
(fuse_activation.py). The clip may also be written min(max(., 0), 6) by some exporters; that
form is left as it is.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions

SIXTH = 1 / 6


def _is(v: float | None, want: float) -> bool:
    return v is not None and abs(v - want) <= 1e-6 * abs(want)


def _clip06(c: Chains, n: Node | None, x: str) -> bool:
    return n is not None and n.op == "clip" and len(n.inputs) == 3 and n.inputs[0] == x \
        and c.scalar(n.inputs[1]) == 0.0 and _is(c.scalar(n.inputs[2]), 6.0)


def _over6(c: Chains, n: Node | None, v: str) -> bool:
    """n is v / 6 or v * (1/6)."""
    if n is None or len(n.inputs) != 2 or v not in n.inputs:
        return False
    if n.op == "div":
        return n.inputs[0] == v and _is(c.scalar(n.inputs[1]), 6.0)
    return n.op == "mul" and _is(c.scalar(c.other(n, v)), SIXTH)


def _match(c: Chains, first: Node) -> list[Node] | None:
    """The chain starting at `first` (an add x + 3 or a hard_sigmoid of x), or None."""
    x = next((i for i in first.inputs if c.const(i) is None), None)
    if x is None:
        return None
    if first.op == "hard_sigmoid":
        a = OPS["hard_sigmoid"].attrs_of(first)
        m = c.sole(first.outputs[0], "mul")
        if _is(a["alpha"], SIXTH) and _is(a["beta"], 0.5) and m is not None and c.other(m, first.outputs[0]) == x:
            return [first, m]
        return None
    if first.op != "add" or not _is(c.scalar(c.other(first, x) or ""), 3.0):
        return None
    clip = c.sole(first.outputs[0], "clip")
    if not _clip06(c, clip, first.outputs[0]):
        return None
    nxt = c.sole(clip.outputs[0])
    if nxt is None:
        return None
    if nxt.op == "mul" and c.other(nxt, clip.outputs[0]) == x:  # (x * clip) / 6
        last = c.sole(nxt.outputs[0])
        return [first, clip, nxt, last] if _over6(c, last, nxt.outputs[0]) else None
    if _over6(c, nxt, clip.outputs[0]):  # x * (clip / 6)
        last = c.sole(nxt.outputs[0], "mul")
        return [first, clip, nxt, last] if last is not None and c.other(last, nxt.outputs[0]) == x else None
    return None


def fuse_hard_swish(g: Graph) -> Graph:
    in_regions(fuse_hard_swish, g)
    c = Chains(g)
    for n in list(g.nodes):
        if n.op not in ("add", "hard_sigmoid") or id(n) in c.taken:
            continue
        chain = _match(c, n)
        if chain is None or not c.free(*chain) or c.dtype(chain[-1].outputs[0]) not in ("f32", "f16", "f64"):
            continue
        x = next(i for i in n.inputs if c.const(i) is None)
        c.replace(chain, Node("hard_swish", [x], list(chain[-1].outputs), name=chain[-1].name or n.name))
    return c.commit()
