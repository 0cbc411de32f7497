"""Stable Diffusion 1.5's UNet and VAE decoder at 512x512 (latents 4 x 64 x 64), as diffusers
defines them (UNet2DConditionModel / AutoencoderKL of stable-diffusion-v1-5) and AI Hub
exports them (batch 1: classifier-free guidance runs the UNet twice per step). Random,
lazily broadcast weights (860M parameters would be 3.4 GB as float32).

UNet: conv_in, a sinusoidal timestep embedding and its MLP, four down blocks (320, 640, 1280
with cross-attention transformers, 1280 without), a middle block, four up blocks over the
concatenated skips, GroupNorm + SiLU + conv_out. A ResNet block: GroupNorm, SiLU, 3x3 conv,
plus the projected time embedding, GroupNorm, SiLU, 3x3 conv, a 1x1 shortcut where the width
changes. A transformer: GroupNorm, 1x1 conv in, self-attention, cross-attention over the 77
text tokens, a GEGLU MLP, each after a LayerNorm, 1x1 conv out. VAE decoder: conv_in to 512,
a middle block with one single-head attention over 64x64 positions, four up blocks of three
ResNet blocks (512, 512, 256, 128), nearest 2x upsampling between them, conv_out to RGB.
"""
from __future__ import annotations

import numpy as np

from .builder import Builder
from .transformer import attend, heads, keys, merge


def _silu(b: Builder, x):
    return b.mul(x, b.node("sigmoid", [x]))


def _resnet(b: Builder, x, cout, temb=None, eps_groups=32):
    y = b.conv(_silu(b, b.group_norm(x, eps_groups)), cout, 3)
    if temb is not None:
        t = b.linear(_silu(b, temb), cout)                                  # (1, cout)
        y = b.add(y, b.reshape(t, [1, cout, 1, 1]))
    y = b.conv(_silu(b, b.group_norm(y, eps_groups)), cout, 3)
    sc = b.conv(x, cout, 1) if b.shape(x)[1] != cout else x
    return b.add(sc, y)


def _transformer(b: Builder, x, ctx, n_heads=8):
    _, c, hh, ww = b.shape(x)
    res = x
    y = b.conv(b.group_norm(x), c, 1)
    y = b.transpose(b.reshape(y, [1, c, hh * ww]), [0, 2, 1])             # (1, HW, C)
    z = b.layer_norm(y)
    q, k, v = (heads(b, b.linear(z, c, bias=False), n_heads), keys(b, b.linear(z, c, bias=False), n_heads),
               heads(b, b.linear(z, c, bias=False), n_heads))
    y = b.add(y, b.linear(merge(b, attend(b, q, k, v)), c))
    z = b.layer_norm(y)
    q = heads(b, b.linear(z, c, bias=False), n_heads)
    k, v = keys(b, b.linear(ctx, c, bias=False), n_heads), heads(b, b.linear(ctx, c, bias=False), n_heads)
    y = b.add(y, b.linear(merge(b, attend(b, q, k, v)), c))
    z = b.linear(b.layer_norm(y), 8 * c)                                    # GEGLU: value, gate
    val, gate = b.node("split", [z, b.ints([4 * c, 4 * c])], n_out=2, axis=-1)
    y = b.add(y, b.linear(b.mul(val, b.node("gelu", [gate])), c))
    y = b.reshape(b.transpose(y, [0, 2, 1]), [1, c, hh, ww])
    return b.add(res, b.conv(y, c, 1))


def sd15_unet(name="sd15_unet"):
    b = Builder(name, lazy=True)
    x = b.input("latent", (1, 4, 64, 64))
    ts = b.input("timestep", (1, 1))
    ctx = b.input("text_emb", (1, 77, 768))
    freqs = b.floats(np.exp(-np.log(10000) * np.arange(160, dtype=np.float32) / 160)[None])
    arg = b.mul(ts, freqs)                                                   # (1, 160)
    temb = b.concat([b.node("cos", [arg]), b.node("sin", [arg])], axis=-1)   # flip_sin_to_cos
    temb = b.linear(_silu(b, b.linear(temb, 1280)), 1280)
    x = b.conv(x, 320, 3)
    skips = [x]
    for i, (c, attn) in enumerate([(320, True), (640, True), (1280, True), (1280, False)]):
        for _ in range(2):
            x = _resnet(b, x, c, temb)
            if attn:
                x = _transformer(b, x, ctx)
            skips.append(x)
        if i < 3:
            x = b.conv(x, c, 3, s=2)
            skips.append(x)
    x = _resnet(b, _transformer(b, _resnet(b, x, 1280, temb), ctx), 1280, temb)
    for i, (c, attn) in enumerate([(1280, False), (1280, True), (640, True), (320, True)]):
        for _ in range(3):
            x = _resnet(b, b.concat([x, skips.pop()]), c, temb)
            if attn:
                x = _transformer(b, x, ctx)
        if i < 3:
            x = b.conv(b.upsample(x, 2), c, 3)
    return b.output(b.conv(_silu(b, b.group_norm(x)), 4, 3))


def sd15_vae_decoder(name="sd15_vae_decoder"):
    b = Builder(name, lazy=True)
    z = b.input("latent", (1, 4, 64, 64))
    x = b.conv(b.conv(b.mul(z, b.floats(1 / 0.18215)), 4, 1), 512, 3)
    x = _resnet(b, x, 512)
    _, c, hh, ww = b.shape(x)                                               # single-head attention
    y = b.transpose(b.reshape(b.group_norm(x), [1, c, hh * ww]), [0, 2, 1])
    q, k, v = heads(b, b.linear(y, c), 1), keys(b, b.linear(y, c), 1), heads(b, b.linear(y, c), 1)
    y = b.linear(merge(b, attend(b, q, k, v)), c)
    x = b.add(x, b.reshape(b.transpose(y, [0, 2, 1]), [1, c, hh, ww]))
    x = _resnet(b, x, 512)
    for i, c in enumerate([512, 512, 256, 128]):
        for _ in range(3):
            x = _resnet(b, x, c)
        if i < 3:
            x = b.conv(b.upsample(x, 2), c, 3)
    return b.output(b.conv(_silu(b, b.group_norm(x)), 3, 3))
