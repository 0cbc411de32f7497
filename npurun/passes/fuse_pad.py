"""Pad fusion: a zero padding of a conv's input becomes the conv's own padding.

    y = conv(pad(x, p))            ->  y = conv(x, pads=conv's pads + p's spatial pads)
    y = conv(transpose(pad(x, p))) ->  y = conv(transpose(x), pads=...)  (an NHWC input padded
                                                                       before its transpose)

TensorFlow's "SAME" padding with strides, exported by tf2onnx, keras2onnx or a PyTorch port
(MobileNet, EfficientNet), is an explicit Pad before the conv; the conv kernels pad as they
read, so the padded copy is never made. Only constant-mode pads whose value is 0 (or absent),
with constant non-negative pads on the spatial axes only, before a conv whose auto_pad is
NOTSET or VALID (no padding of its own: Hugging Face's EfficientNet writes its TF "same" padding
as a ZeroPad2d before a "valid" conv) and which alone reads the padded value.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions


def _spatial_pads(c: Chains, pad: Node, rank: int) -> list[int] | None:
    """The pad's [begin..., end...] over the rank's axes, when it pads only axes >= 2 with
    zeros; else None."""
    if OPS["pad"].attrs_of(pad)["mode"] != "constant":
        return None
    p = c.const(pad.inputs[1])
    value = pad.inputs[2] if len(pad.inputs) > 2 else ""
    v = c.const(value) if value else np.zeros(1)
    axes_in = pad.inputs[3] if len(pad.inputs) > 3 else ""
    axes = c.const(axes_in) if axes_in else np.arange(rank)
    if p is None or v is None or axes is None or v.size != 1 or float(v.reshape(-1)[0]) != 0.0:
        return None
    axes = [int(a) % rank for a in axes.reshape(-1)]
    p = [int(q) for q in p.reshape(-1)]
    full = [0] * (2 * rank)
    for j, a in enumerate(axes):
        full[a], full[a + rank] = p[j], p[j + len(axes)]
    if min(full) < 0:
        return None
    return full


def fuse_pad(g: Graph) -> Graph:
    in_regions(fuse_pad, g)
    c = Chains(g)
    for pad in list(g.nodes):
        if pad.op != "pad" or not c.free(pad):
            continue  # (free: also every value of known rank)
        x = pad.inputs[0]
        rank = len(g.values[x].shape)
        full = _spatial_pads(c, pad, rank)
        nxt = c.sole(pad.outputs[0])
        if full is None or nxt is None or not c.free(nxt):
            continue
        chain, perm = [pad], list(range(rank))
        if nxt.op == "transpose":
            perm = list(OPS["transpose"].attrs_of(nxt)["perm"] or reversed(range(rank)))
            chain.append(nxt)
            nxt = c.sole(nxt.outputs[0])
            if nxt is None or not c.free(nxt):
                continue
        # the pads as the conv sees its input (after the transpose)
        seen = [full[perm[i]] for i in range(rank)] + [full[perm[i] + rank] for i in range(rank)]
        if nxt.op != "conv" or nxt.inputs[0] != chain[-1].outputs[0] or any(seen[i] or seen[i + rank] for i in (0, 1)):
            continue
        a = OPS["conv"].attrs_of(nxt)
        if a["auto_pad"] not in ("NOTSET", "VALID"):  # (VALID: no padding of its own)
            continue
        nd = rank - 2
        old = list(a["pads"] or [0] * (2 * nd))
        pads = [old[i] + seen[2 + i] for i in range(nd)] + [old[nd + i] + seen[rank + 2 + i] for i in range(nd)]
        nodes = []
        src = x
        if len(chain) == 2:  # the transpose now reads the unpadded input
            t = chain[1]
            out = f"{t.outputs[0]}.unpadded"
            from .rewrite import new_value
            tv = g.values[t.outputs[0]]
            out = new_value(g, out, [g.values[x].shape[p] for p in perm], tv.dtype, tv.space)
            nodes.append(Node("transpose", [x], [out], dict(t.attrs), dict(t.hints), t.name, t.precision))
            src = out
        attrs = {k: v for k, v in nxt.attrs.items() if k != "auto_pad"}  # (NOTSET: the pads say it all)
        nodes.append(Node("conv", [src] + list(nxt.inputs[1:]), list(nxt.outputs), {**attrs, "pads": pads},
                          dict(nxt.hints), nxt.name, nxt.precision))
        c.replace(chain + [nxt], nodes)
    return c.commit()
