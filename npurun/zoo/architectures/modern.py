"""Vision backbones of the transformer era, as torchvision writes them (AI Hub exports those):
ConvNeXt-T (7x7 depthwise convolutions, LayerNorm over channels, GELU MLPs, layer scale) and
Swin-T (shifted-window attention with a relative position bias). Channels-last stretches are
written with the NCHW <-> NHWC transposes the export has; npusim treats those two
permutations as the layout change they are on an NHWC device (free)."""
from __future__ import annotations

import numpy as np

from .builder import Builder


def convnext_tiny(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), h=224, w=224, name="convnext_tiny"):
    b = Builder(name)
    x = b.input("image", (1, 3, h, w))

    def ln2d(x):  # LayerNorm over the channels of an NCHW tensor
        return b.transpose(b.layer_norm(b.transpose(x, [0, 2, 3, 1])), [0, 3, 1, 2])

    x = ln2d(b.conv(x, dims[0], 4, s=4, p=0))
    for i, (n, d) in enumerate(zip(depths, dims)):
        if i:
            x = b.conv(ln2d(x), d, 2, s=2, p=0)
        for _ in range(n):
            y = b.transpose(b.conv(x, d, 7, groups=d), [0, 2, 3, 1])          # (1, H, W, d)
            y = b.linear(b.node("gelu", [b.linear(b.layer_norm(y), 4 * d)]), d)
            y = b.mul(y, b.weight((d,), 0.1, "gamma"))                      # layer scale
            x = b.add(x, b.transpose(y, [0, 3, 1, 2]))
    x = b.layer_norm(b.flatten(b.gap(x)))
    return b.output(b.linear(x, 1000))


def _windows(b: Builder, x, ws):
    """(1, H, W, C) -> (nW, ws*ws, C)."""
    _, hh, ww, c = b.shape(x)
    y = b.reshape(x, [1, hh // ws, ws, ww // ws, ws, c])
    return b.reshape(b.transpose(y, [0, 1, 3, 2, 4, 5]), [(hh // ws) * (ww // ws), ws * ws, c])


def _unwindows(b: Builder, y, hh, ww, ws):
    c = b.shape(y)[-1]
    y = b.reshape(y, [1, hh // ws, ww // ws, ws, ws, c])
    return b.reshape(b.transpose(y, [0, 1, 3, 2, 4, 5]), [1, hh, ww, c])


def _roll(b: Builder, x, shift, axes=(1, 2)):
    """torch.roll as the exporter writes it: two slices and a concat per axis."""
    for ax in axes:
        n = b.shape(x)[ax]
        s = shift % n
        tail = b.node("slice", [x, b.ints([n - s]), b.ints([n]), b.ints([ax])])
        head = b.node("slice", [x, b.ints([0]), b.ints([n - s]), b.ints([ax])])
        x = b.concat([tail, head], axis=ax)
    return x


def _swin_block(b: Builder, x, heads, ws, shift):
    _, hh, ww, c = b.shape(x)
    hd = c // heads
    y = b.layer_norm(x)
    if shift:
        y = _roll(b, y, -shift)
    y = _windows(b, y, ws)                                                   # (nW, 49, C)
    nw, t = b.shape(y)[:2]

    def split(z, perm):
        return b.transpose(b.reshape(z, [nw, t, heads, hd]), perm)
    q = split(b.linear(y, c), [0, 2, 1, 3])
    k = split(b.linear(y, c), [0, 2, 3, 1])
    v = split(b.linear(y, c), [0, 2, 1, 3])
    s = b.node("matmul", [b.mul(q, b.floats(hd ** -0.5)), k])               # (nW, heads, 49, 49)
    s = b.add(s, b.weight((1, heads, t, t), 0.02, "relpos"))
    if shift:
        s = b.add(s, b.floats(np.zeros((nw, 1, t, t), np.float32) - 100.0 * (np.arange(nw) % 2)[:, None, None, None]))
    o = b.node("matmul", [b.node("softmax", [s], axis=-1), v])
    o = b.linear(b.reshape(b.transpose(o, [0, 2, 1, 3]), [nw, t, c]), c)
    o = _unwindows(b, o, hh, ww, ws)
    if shift:
        o = _roll(b, o, shift)
    x = b.add(x, o)
    return b.add(x, b.linear(b.node("gelu", [b.linear(b.layer_norm(x), 4 * c)]), c))


def swin_tiny(depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), dim=96, ws=7, h=224, w=224, name="swin_tiny"):
    b = Builder(name)
    x = b.input("image", (1, 3, h, w))
    x = b.layer_norm(b.transpose(b.conv(x, dim, 4, s=4, p=0), [0, 2, 3, 1]))  # (1, 56, 56, 96)
    for i, (n, nh) in enumerate(zip(depths, heads)):
        if i:  # patch merging: the four 2x2 phases side by side, LayerNorm, 4C -> 2C
            _, hh, ww, c = b.shape(x)
            parts = [b.node("slice", [x, b.ints([r, s_]), b.ints([hh, ww]), b.ints([1, 2]), b.ints([2, 2])])
                     for r, s_ in ((0, 0), (1, 0), (0, 1), (1, 1))]
            x = b.linear(b.layer_norm(b.concat(parts, axis=-1)), 2 * c, bias=False)
        side = b.shape(x)[1]
        for j in range(n):
            x = _swin_block(b, x, nh, min(ws, side), ws // 2 if j % 2 and side > ws else 0)
    x = b.layer_norm(x)
    x = b.node("reduce_mean", [x, b.ints([1, 2])], keepdims=0)
    return b.output(b.linear(x, 1000))
