"""MobileSAM (Zhang et al. 2023) as AI Hub exports it: the TinyViT-5M image encoder at
1024x1024 and SAM's prompt encoder + mask decoder for two points, one mask out.

Encoder (mobile_sam's TinyViT, `vit_t`): the normalisation the model does itself, a two-conv
stem to 256x256x64, two MBConv blocks, then three stages of TinyViT blocks (windowed attention
with a learned bias per head and offset, a 3x3 depthwise conv, a GELU MLP) at 128 / 160 / 320
channels on 128x128 / 64x64 / 64x64 (the last merge keeps the resolution, as MobileSAM changes
it to), windows of 7 / 14 / 7 with the map zero-padded to a multiple; every conv's BatchNorm
folded into it (the exporter does); a neck of two convs and SAM's LayerNorm2d, which is written
out op by op (mean, centred square, mean, sqrt, divide, scale, shift).

Decoder (AI Hub's MobileSAMDecoder): the two points' Fourier features, the image's dense
position encoding and the no-mask embedding as constants (they depend on nothing the caller
passes), a two-layer two-way transformer over 4096 image tokens and 7 prompt tokens whose
attentions AI Hub splits into one projection chain per head ("SplitHeadSAMDecoderAttention"),
two transposed convs upscaling to 256x256, four hypernetwork MLPs and the IoU head; AI Hub's
Linear-as-1x1-conv rewrite is written as the matrix products it computes.
"""
from __future__ import annotations

import numpy as np

from .builder import Builder


def _layer_norm_2d(b: Builder, x):
    """SAM's LayerNorm2d over the channels of an NCHW map, as its forward writes it."""
    c = b.shape(x)[1]
    ax = b.ints([1])
    u = b.node("reduce_mean", [x, ax], keepdims=1)
    d = b.node("sub", [x, u])
    s = b.node("reduce_mean", [b.mul(d, d), ax], keepdims=1)
    y = b.node("div", [d, b.node("sqrt", [b.add(s, b.floats(1e-6))])])
    return b.add(b.mul(y, b.weight((c, 1, 1), 0.1, "ln")), b.weight((c, 1, 1), 0.1, "ln"))


def _mbconv(b: Builder, x, expand=4):
    c = b.shape(x)[1]
    y = b.conv(x, c * expand, 1, act="gelu")
    y = b.conv(y, c * expand, 3, groups=c * expand, act="gelu")
    return b.node("gelu", [b.add(b.conv(y, c, 1), x)])


def _merge(b: Builder, x, cout, stride):
    """TinyViT's PatchMerging on an NCHW map: 1x1, GELU, 3x3 depthwise (stride), GELU, 1x1."""
    y = b.conv(x, cout, 1, act="gelu")
    y = b.conv(y, cout, 3, s=stride, groups=cout, act="gelu")
    return b.conv(y, cout, 1)


def _tokens(b: Builder, x):
    """(1, C, H, W) -> (1, H*W, C)."""
    _, c, h, w = b.shape(x)
    return b.transpose(b.reshape(x, [1, c, h * w]), [0, 2, 1])


def _window_attention(b: Builder, x, hw, nh, ws):
    """TinyViT's Attention over ws x ws windows of x (1, H*W, C); pads H, W up to multiples of ws."""
    h, w = hw
    c = b.shape(x)[-1]
    hd = c // nh
    ph, pw = -h % ws, -w % ws
    y = b.reshape(x, [1, h, w, c])
    if ph or pw:
        y = b.node("pad", [y, b.ints([0, 0, 0, 0, 0, ph, pw, 0])])
    hh, ww = h + ph, w + pw
    nw, t = (hh // ws) * (ww // ws), ws * ws
    y = b.reshape(b.transpose(b.reshape(y, [1, hh // ws, ws, ww // ws, ws, c]), [0, 1, 3, 2, 4, 5]), [nw, t, c])
    qkv = b.linear(b.layer_norm(y), 3 * c)
    q, k, v = b.node("split", [b.reshape(qkv, [nw, t, nh, 3 * hd]), b.ints([hd, hd, hd])], n_out=3, axis=3)
    q, k, v = (b.transpose(z, p) for z, p in ((q, [0, 2, 1, 3]), (k, [0, 2, 3, 1]), (v, [0, 2, 1, 3])))
    s = b.mul(b.node("matmul", [q, k]), b.floats(hd ** -0.5))
    s = b.add(s, b.weight((nh, t, t), 0.02, "bias"))                     # the gathered per-offset bias
    o = b.node("matmul", [b.node("softmax", [s], axis=-1), v])            # (nW, nh, t, hd)
    o = b.linear(b.reshape(b.transpose(o, [0, 2, 1, 3]), [nw, t, c]), c)
    o = b.reshape(b.transpose(b.reshape(o, [1, hh // ws, ww // ws, ws, ws, c]), [0, 1, 3, 2, 4, 5]), [1, hh, ww, c])
    if ph or pw:
        o = b.node("slice", [o, b.ints([0, 0]), b.ints([h, w]), b.ints([1, 2])])
    return b.reshape(o, [1, h * w, c])


def _tinyvit_block(b: Builder, x, hw, nh, ws):
    h, w = hw
    c = b.shape(x)[-1]
    x = b.add(x, _window_attention(b, x, hw, nh, ws))
    y = b.reshape(b.transpose(x, [0, 2, 1]), [1, c, h, w])
    x = _tokens(b, b.conv(y, c, 3, groups=c))                               # local conv (+ folded BN)
    return b.add(x, b.linear(b.node("gelu", [b.linear(b.layer_norm(x), 4 * c)]), c))


def mobilesam_encoder(size=1024, dims=(64, 128, 160, 320), depths=(2, 2, 6, 2), nheads=(2, 4, 5, 10),
                      windows=(7, 7, 14, 7), name="mobilesam_encoder"):
    b = Builder(name)
    x = b.input("image", (1, 3, size, size))
    x = b.add(b.mul(x, b.floats(np.full((1, 3, 1, 1), 4.4, np.float32))), b.floats(np.full((1, 3, 1, 1), -2.0, np.float32)))
    x = b.conv(b.conv(x, dims[0] // 2, 3, s=2, act="gelu"), dims[0], 3, s=2)   # (1, 64, 256, 256)
    for _ in range(depths[0]):
        x = _mbconv(b, x)
    x = _tokens(b, _merge(b, x, dims[1], 2))                                     # (1, 128*128, 128)
    side = size // 8
    for i in range(1, len(dims)):
        for _ in range(depths[i]):
            x = _tinyvit_block(b, x, (side, side), nheads[i], windows[i])
        if i + 1 < len(dims):
            stride = 1 if dims[i + 1] == 320 else 2                              # MobileSAM's last merge keeps 64x64
            y = b.reshape(b.transpose(x, [0, 2, 1]), [1, dims[i], side, side])
            x = _tokens(b, _merge(b, y, dims[i + 1], stride))
            side //= stride
    y = b.reshape(b.transpose(x, [0, 2, 1]), [1, dims[-1], side, side])
    y = _layer_norm_2d(b, b.conv(y, 256, 1, bias=False))
    return b.output(_layer_norm_2d(b, b.conv(y, 256, 3, bias=False)))


def _split_head_attention(b: Builder, q_in, k_in, v_in, nh=8, internal=None):
    """AI Hub's SplitHeadSAMDecoderAttention: per head its own q/k/v projections on (1, T, d)
    tokens (no head axis), softmax(q k^T / sqrt(hd)) v, the heads concatenated, then the output
    projection."""
    d = b.shape(q_in)[-1]
    hd = (internal or d) // nh
    outs = []
    for _ in range(nh):
        q, k, v = b.linear(q_in, hd), b.linear(k_in, hd), b.linear(v_in, hd)
        s = b.node("div", [b.node("matmul", [q, b.transpose(k, [0, 2, 1])]), b.floats(np.sqrt(hd))])
        outs.append(b.node("matmul", [b.node("softmax", [s], axis=-1), v]))
    return b.linear(b.concat(outs, axis=-1), d)


def _mlp(b: Builder, x, hidden, out, layers=3):
    for i in range(layers - 1):
        x = b.node("relu", [b.linear(x, hidden)])
    return b.linear(x, out)


def mobilesam_decoder(points=2, d=256, grid=64, depth=2, mlp_dim=2048, masks=4, name="mobilesam_decoder"):
    b = Builder(name)
    emb = b.input("image_embeddings", (1, d, grid, grid))
    coords = b.input("point_coords", (1, points, 2))
    labels = b.input("point_labels", (1, points))
    # prompt encoder: Fourier features of the points, the label's embedding added per point
    c = b.add(b.mul(b.add(coords, b.floats(0.5)), b.floats(np.full(2, 1 / 1024, np.float32))), b.floats(0.0))
    c = b.mul(b.node("matmul", [b.add(b.mul(c, b.floats(2.0)), b.floats(-1.0)), b.weight((2, d // 2), 1.0, "gauss")]),
              b.floats(2 * np.pi))
    pts = b.concat([b.node("sin", [c]), b.node("cos", [c])], axis=-1)                # (1, P, d)
    lab = b.node("unsqueeze", [labels, b.ints([2])])
    for label in (-1.0, 0.0, 1.0, 2.0, 3.0):   # not-a-point and the four point embeddings, each where its label is
        sel = b.node("cast", [b.node("equal", [lab, b.floats(label)])], to="f32")
        pts = b.add(pts, b.mul(sel, b.weight((d,), 0.1, "label")))
    tokens = b.concat([b.weight((1, 1 + masks, d), 0.1, "tokens"), pts], axis=1)    # (1, 5 + P, d)
    src = _tokens(b, b.add(emb, b.weight((1, d, 1, 1), 0.1, "no_mask")))            # (1, 4096, d)
    pos = b.weight((1, grid * grid, d), 0.5, "dense_pe")

    q, k = tokens, src
    for i in range(depth):
        if i == 0:
            q = _split_head_attention(b, q, q, q)
        else:
            qp = b.add(q, tokens)
            q = b.add(q, _split_head_attention(b, qp, qp, q))
        q = b.layer_norm(q)
        kp = b.add(k, pos)
        q = b.layer_norm(b.add(q, _split_head_attention(b, b.add(q, tokens), kp, k, internal=d // 2)))
        q = b.layer_norm(b.add(q, _mlp(b, q, mlp_dim, d, layers=2)))
        qp = b.add(q, tokens)
        k = b.layer_norm(b.add(k, _split_head_attention(b, b.add(k, pos), qp, q, internal=d // 2)))
    q = b.layer_norm(b.add(q, _split_head_attention(b, b.add(q, tokens), b.add(k, pos), k, internal=d // 2)))

    up = b.reshape(b.transpose(k, [0, 2, 1]), [1, d, grid, grid])
    up = b.node("conv_transpose", [up, b.weight((d, d // 4, 2, 2)), b.weight((d // 4,), 0.1, "b")],
                strides=[2, 2], kernel_shape=[2, 2])
    up = b.node("gelu", [_layer_norm_2d(b, up)])
    up = b.node("gelu", [b.node("conv_transpose", [up, b.weight((d // 4, d // 8, 2, 2)), b.weight((d // 8,), 0.1, "b")],
                                strides=[2, 2], kernel_shape=[2, 2])])                # (1, 32, 256, 256)
    side = 4 * grid
    hyper = [_mlp(b, b.node("slice", [q, b.ints([1 + i]), b.ints([2 + i]), b.ints([1])]), d, d // 8)
             for i in range(masks)]
    mask = b.node("matmul", [b.concat(hyper, axis=1), b.reshape(up, [1, d // 8, side * side])])
    iou = _mlp(b, b.node("slice", [q, b.ints([0]), b.ints([1]), b.ints([1])]), d, masks)
    # single-mask mode: the first mask and its score
    mask = b.reshape(b.node("slice", [mask, b.ints([0]), b.ints([1]), b.ints([1])]), [1, 1, side, side])
    return b.output(mask, b.node("slice", [iou, b.ints([0]), b.ints([1]), b.ints([2])]))
