"""Whisper encoders (Radford et al. 2022): two 1-D convolutions over the log-mel spectrogram,
then pre-norm transformer layers over 1500 positions."""
from __future__ import annotations

import numpy as np

from .builder import Builder


def whisper_encoder(d=384, heads=6, layers=4, n_mels=80, frames=3000, name="whisper_tiny_encoder"):
    b = Builder(name)
    x = b.input("mel", (1, n_mels, frames))
    x = b.node("gelu", [b.conv(x, d, 3)])
    x = b.node("gelu", [b.conv(x, d, 3, s=2)])
    t = frames // 2
    x = b.add(b.transpose(x, [0, 2, 1]), b.weight((t, d), 0.02, "pos"))   # (1, T, d)
    hd = d // heads

    def ln(x):
        return b.node("layer_normalization", [x, b.floats(np.ones(d)), b.floats(np.zeros(d))], axis=-1)

    def heads_of(y):   # (1, T, d) -> (1, H, T, hd)
        return b.transpose(b.reshape(y, [1, t, heads, hd]), [0, 2, 1, 3])

    for _ in range(layers):
        y = ln(x)
        q = heads_of(b.mul(b.linear(y, d), b.floats(hd ** -0.5)))
        k = b.transpose(b.reshape(b.linear(y, d, bias=False), [1, t, heads, hd]), [0, 2, 3, 1])
        v = heads_of(b.linear(y, d))
        att = b.node("softmax", [b.node("matmul", [q, k])], axis=-1)              # (1, H, T, T)
        o = b.reshape(b.transpose(b.node("matmul", [att, v]), [0, 2, 1, 3]), [1, t, d])
        x = b.add(x, b.linear(o, d))
        y = b.linear(b.node("gelu", [b.linear(ln(x), 4 * d)]), d)
        x = b.add(x, y)
    return b.output(ln(x))
