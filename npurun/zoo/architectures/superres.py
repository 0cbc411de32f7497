"""Super-resolution networks at the AI Hub export shapes (x4 unless stated; input 128x128)."""
from __future__ import annotations

from .builder import Builder


def _anchor(b, x, scale):
    """The input repeated scale^2 times along channels, added before depth-to-space: the
    nearest-neighbour residual QuickSRNet and XLSR use."""
    return b.concat([x] * (scale * scale))


def quicksrnet(size="small", scale=4, h=128, w=128):
    """QuickSRNet: conv 3x3 3->C, n x (conv 3x3 C->C, ReLU), conv 3x3 C->3*s^2, anchor add,
    depth-to-space. Small: C=32, n=2; medium: C=32, n=5; large: C=64, n=11."""
    ch, n = {"small": (32, 2), "medium": (32, 5), "large": (64, 11)}[size]
    b = Builder(f"quicksrnet{size}")
    x = b.input("image", (1, 3, h, w))
    y = b.conv(x, ch, 3, act="relu")
    for _ in range(n):
        y = b.conv(y, ch, 3, act="relu")
    y = b.conv(y, 3 * scale * scale, 3)
    y = b.add(y, _anchor(b, x, scale))
    y = b.d2s(y, scale)
    return b.output(b.node("clip", [y, b.floats(0.0), b.floats(1.0)]))


def xlsr(scale=4, h=128, w=128):
    """XLSR (Ayazoglu 2021): 4 parallel 3x3 convs 3->8 plus a 1x1 3->8 residual branch, three
    blocks of (grouped 3x3 conv, 4 groups; 1x1 conv; ReLU) on 32 channels, concat with the
    residual branch, 3x3 conv to 3*s^2, depth-to-space, clipped ReLU."""
    b = Builder("xlsr")
    x = b.input("image", (1, 3, h, w))
    y = b.concat([b.conv(x, 8, 3) for _ in range(4)])
    res = b.conv(x, 8, 1, act="relu")
    for _ in range(3):
        y = b.conv(b.conv(y, 32, 3, groups=4), 32, 1, act="relu")
    y = b.conv(b.concat([y, res]), 3 * scale * scale, 3)
    y = b.d2s(y, scale)
    return b.output(b.node("clip", [y, b.floats(0.0), b.floats(1.0)]))


def sesr_m5(scale=4, h=128, w=128, expand=256):
    """SESR-M5 as AI Hub exports it: the training-time form, each collapsible linear block
    still expanded (kxk conv to 256 channels, 1x1 back), 16 features, 5 middle blocks."""
    b = Builder("sesr_m5")
    x = b.input("image", (1, 3, h, w))
    f = b.conv(b.conv(x, expand, 5), 16, 1, act="prelu")
    y = f
    for _ in range(5):
        y = b.add(b.conv(b.conv(y, expand, 3), 16, 1), y)
        y = b.act(y, "prelu")
    y = b.add(y, f)
    y = b.conv(b.conv(y, expand, 5), 3 * scale * scale, 1)
    y = b.add(y, _anchor(b, x, scale))
    return b.output(b.d2s(y, scale))


def srvgg_compact(scale=4, h=128, w=128, feat=64, n_conv=32):
    """Real-ESRGAN general x4v3 (SRVGGNetCompact): conv+PReLU stack, pixel shuffle, plus the
    nearest-upsampled input."""
    b = Builder("real_esrgan_general_x4v3")
    x = b.input("image", (1, 3, h, w))
    y = b.conv(x, feat, 3, act="prelu")
    for _ in range(n_conv):
        y = b.conv(y, feat, 3, act="prelu")
    y = b.d2s(b.conv(y, 3 * scale * scale, 3), scale)
    return b.output(b.add(y, b.upsample(x, scale)))


def rrdbnet(h=128, w=128, nf=64, gc=32, n_blocks=23, name="real_esrgan_x4plus"):
    """ESRGAN / Real-ESRGAN x4plus (RRDBNet): 23 residual-in-residual dense blocks, two nearest
    x2 upsampling + conv stages."""
    b = Builder(name)
    x = b.input("image", (1, 3, h, w))
    fea = b.conv(x, nf, 3)

    def rdb(x):
        feats = [x]
        for i in range(4):
            feats.append(b.conv(b.concat(feats) if len(feats) > 1 else x, gc, 3, act="lrelu"))
        y = b.conv(b.concat(feats), nf, 3)
        return b.add(b.mul(y, b.floats(0.2)), x)

    y = fea
    for _ in range(n_blocks):
        z = rdb(rdb(rdb(y)))
        y = b.add(b.mul(z, b.floats(0.2)), y)
    y = b.add(b.conv(y, nf, 3), fea)
    y = b.conv(b.upsample(y, 2), nf, 3, act="lrelu")
    y = b.conv(b.upsample(y, 2), nf, 3, act="lrelu")
    y = b.conv(b.conv(y, nf, 3, act="lrelu"), 3, 3)
    return b.output(y)
