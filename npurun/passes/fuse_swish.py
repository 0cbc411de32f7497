"""SiLU / Swish from its spelling: x * sigmoid(x) -> swish(x, alpha=1), and
x * sigmoid(a * x) -> swish(x, alpha=a).

YOLOv8, EfficientNet, SegFormer's and LLaMA-style MLPs write SiLU out; as one op it runs in
one pass over memory, and after a conv it joins the conv's epilogue (fuse_activation.py).
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from .match import Chains, in_regions


def fuse_swish(g: Graph) -> Graph:
    in_regions(fuse_swish, g)
    c = Chains(g)
    for sig in list(g.nodes):
        if sig.op != "sigmoid" or not sig.inputs[0] or c.dtype(sig.inputs[0]) not in ("f32", "f16", "f64"):
            continue
        s, u = sig.outputs[0], sig.inputs[0]
        mul = c.sole(s, "mul")
        other = c.other(mul, s) if mul is not None else None
        if other is None:
            continue
        if other == u:  # x * sigmoid(x)
            chain, x, alpha = [sig, mul], u, 1.0
        else:  # x * sigmoid(a * x), a * x read only by the sigmoid
            scaled = c.producer.get(u)
            if scaled is None or scaled.op != "mul" or c.sole(u) is not sig:
                continue
            a = c.scalar(c.other(scaled, other) or "")
            if a is None:
                continue
            chain, x, alpha = [scaled, sig, mul], other, a
        if not c.free(*chain):
            continue
        c.replace(chain, Node("swish", [x], list(mul.outputs), {"alpha": alpha} if alpha != 1.0 else {},
                              name=mul.name or sig.name))
    return c.commit()
