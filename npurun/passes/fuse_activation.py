"""Activation fusion: an activation that alone reads a conv's result becomes the conv's
epilogue (attributes `activation` and `activation_params`, as ONNX Runtime's FusedConv has
them), so the conv's result is never stored and read again.

    y = act(conv(x, w, b))  ->  y = conv(x, w, b, activation="act", activation_params=[...])

Every activation of ir/ops/elementwise.FUSABLE_ACTIVATIONS fuses (relu, clip with constant
bounds, leaky_relu, hard_sigmoid, hard_swish, swish / SiLU, sigmoid, tanh, elu, selu, celu,
softplus); the conv's kernel applies it in its epilogue where it can, else right after.
Run after fuse_hard_swish and fuse_swish, which make single ops of the written-out forms.
"""
from __future__ import annotations

import math

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.ops.elementwise import FUSABLE_ACTIVATIONS
from .match import Chains, in_regions


def _params(c: Chains, act: Node) -> list[float] | None:
    if act.op == "clip":
        lo, hi = (list(act.inputs[1:]) + ["", ""])[:2]
        los = -math.inf if not lo else c.scalar(lo)
        his = math.inf if not hi else c.scalar(hi)
        return None if los is None or his is None else [los, his]
    a = OPS[act.op].attrs_of(act)
    return [float(a[k]) for k in FUSABLE_ACTIVATIONS[act.op]]


def fuse_activation(g: Graph) -> Graph:
    in_regions(fuse_activation, g)
    c = Chains(g)
    for conv in list(g.nodes):
        if conv.op != "conv" or OPS["conv"].attrs_of(conv)["activation"] or len(conv.outputs) != 1:
            continue
        act = c.sole(conv.outputs[0])
        if act is None or act.op not in FUSABLE_ACTIVATIONS or act.inputs[0] != conv.outputs[0] \
                or not c.free(conv, act):
            continue
        params = _params(c, act)
        if params is None:
            continue
        attrs = {**conv.attrs, "activation": act.op, "activation_params": params}
        c.replace([conv, act], Node("conv", list(conv.inputs), list(act.outputs), attrs, dict(conv.hints),
                                    name=conv.name, precision=conv.precision))
    return c.commit()
