"""Blocked layouts: packing a tensor into the tiles a kernel wants, and the ops that read
packed operands.

    layout_pack  layout="block4x4"  (K, N)       -> (ceil(K/4), N, 4)         w[4k+i, n] at [k, n, i]
    layout_pack  layout="nchwc"     (N, C, H, W) -> (N, ceil(C/c), H, W, c)   x[n, c*j+i] at [n, j, .., i]
    layout_unpack (the inverse; `size` is the K or C that padding rounded up)
    matmul_block4x4 (a: (..., K), b: (ceil(K/4), N, 4)) -> (..., N)
    conv_nchwc (x: (N, C/c, H, W, c), w: (M, C, kh, kw), b?) -> (N, M/c, Ho, Wo, c)

Packing pads the blocked axis with zeros to a whole block. Weights are packed once, when the
layout passes rewrite the graph (they become constants of the blocked shape); activations
are packed at run time where a chain of blocked ops begins (passes/layout_nchwc.py).
"""
from __future__ import annotations

from ..shapes import affine, numel
from . import REQUIRED, _fail
from . import op
from .nn import _CONV_ATTRS, _spatial

LAYOUTS = ("block4x4", "nchwc")


def _blocks(d, b):
    return affine(d, add=b - 1, div=b) if not isinstance(d, int) or d >= 0 else d


@op("layout_pack", ["x"], attrs={"layout": REQUIRED, "block": 4}, groups={"layout"})
def _pack(node, a, ins):
    x, b = ins[0], a["block"]
    if a["layout"] == "block4x4":
        if len(x.shape) != 2 or b != 4:
            _fail(node, f"block4x4 packs a 2-D (K, N) weight in blocks of 4, got {list(x.shape)} block {b}")
        k, n = x.shape
        return [((_blocks(k, 4), n, 4), x.dtype)]
    if a["layout"] == "nchwc":
        if len(x.shape) != 4:
            _fail(node, f"nchwc packs a 4-D (N, C, H, W) tensor, got {list(x.shape)}")
        n, c, h, w = x.shape
        return [((n, _blocks(c, b), h, w, b), x.dtype)]
    _fail(node, f"unknown layout {a['layout']!r}; expected one of {', '.join(LAYOUTS)}")


@op("layout_unpack", ["x"], attrs={"layout": REQUIRED, "block": 4, "size": REQUIRED}, groups={"layout"})
def _unpack(node, a, ins):
    x, b, size = ins[0], a["block"], a["size"]
    if a["layout"] == "block4x4":
        if len(x.shape) != 3 or x.shape[2] != 4:
            _fail(node, f"block4x4 unpacks a (K/4, N, 4) weight, got {list(x.shape)}")
        return [((size, x.shape[1]), x.dtype)]
    if a["layout"] == "nchwc":
        if len(x.shape) != 5 or x.shape[4] != b:
            _fail(node, f"nchwc unpacks a (N, C/{b}, H, W, {b}) tensor, got {list(x.shape)}")
        return [((x.shape[0], size, x.shape[2], x.shape[3]), x.dtype)]
    _fail(node, f"unknown layout {a['layout']!r}; expected one of {', '.join(LAYOUTS)}")


def _mm_block_macs(a, ins, outs):
    return numel(outs[0]) * ins[0][-1]


@op("matmul_block4x4", ["a", "b"], groups={"layout", "mac"}, macs=_mm_block_macs)
def _matmul_block4x4(node, a, ins):
    x, w = ins
    if len(w.shape) != 3 or w.shape[2] != 4:
        _fail(node, f"operand b must be a block4x4 weight (K/4, N, 4), got {list(w.shape)}")
    if len(x.shape) < 1:
        _fail(node, "operand a must have rank >= 1")
    k = x.shape[-1]
    if isinstance(k, int) and isinstance(w.shape[0], int) and -(-k // 4) != w.shape[0]:
        _fail(node, f"a has K={k}, b holds {w.shape[0]} blocks of 4 (expected {-(-k // 4)})")
    return [(tuple(x.shape[:-1]) + (w.shape[1],), x.dtype)]


def _conv_nchwc_macs(a, ins, outs):
    w = ins[1]
    return numel(outs[0]) * numel(w[1:])


@op("conv_nchwc", ["x", "w", "b?"], attrs={**_CONV_ATTRS, "block": 4}, groups={"layout", "mac"},
    macs=_conv_nchwc_macs)
def _conv_nchwc(node, a, ins):
    x, w, b = ins[0], ins[1], a["block"]
    if len(x.shape) != 5 or x.shape[4] != b or len(w.shape) != 4:
        _fail(node, f"conv_nchwc takes x (N, C/{b}, H, W, {b}) and w (M, C, kh, kw), "
                    f"got {list(x.shape)} and {list(w.shape)}")
    if a["group"] != 1:
        _fail(node, "conv_nchwc takes group=1 only")
    m, c = w.shape[0], w.shape[1]
    if isinstance(m, int) and m % b or isinstance(c, int) and c % b:
        _fail(node, f"weight channels M={m}, C={c} must be multiples of the block {b}")
    if isinstance(x.shape[1], int) and isinstance(c, int) and x.shape[1] * b != c:
        _fail(node, f"input has {x.shape[1]} blocks of {b} channels, weight expects {c} channels")
    plain = (x.shape[0], c, x.shape[2], x.shape[3])
    ho, wo = _spatial(node, a, plain, a["kernel_shape"] or list(w.shape[2:]))
    return [((x.shape[0], m // b, ho, wo, b), x.dtype)]
