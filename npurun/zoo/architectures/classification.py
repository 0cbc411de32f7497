"""Image classifiers as deployed: batch norm folded into the convolutions (as every NPU
toolchain does), ReLU after the conv it follows. Shapes follow torchvision."""
from __future__ import annotations

from .builder import Builder


def _bottleneck(b, x, width, cout, stride, groups=1, fbn=False):
    y = b.conv(x, width, 1, act="relu", frozen_bn=fbn)
    y = b.conv(y, width, 3, s=stride, groups=groups, act="relu", frozen_bn=fbn)
    y = b.conv(y, cout, 1, frozen_bn=fbn)
    sc = b.conv(x, cout, 1, s=stride, frozen_bn=fbn) if stride != 1 or b.shape(x)[1] != cout else x
    return b.node("relu", [b.add(y, sc)])


def _basic(b, x, cout, stride, fbn=False):
    y = b.conv(x, cout, 3, s=stride, act="relu", frozen_bn=fbn)
    y = b.conv(y, cout, 3, frozen_bn=fbn)
    sc = b.conv(x, cout, 1, s=stride, frozen_bn=fbn) if stride != 1 or b.shape(x)[1] != cout else x
    return b.node("relu", [b.add(y, sc)])


def resnet(depth=50, width_mult=1, groups=1, width_per_group=64, h=224, w=224, name=None):
    """ResNet-18/50/101, Wide-ResNet-50-2 (width_mult=2), ResNeXt-50 32x4d (groups=32, 4)."""
    b = Builder(name or f"resnet{depth}")
    x = resnet_features(b, b.input("image", (1, 3, h, w)), depth, width_mult, groups, width_per_group)
    x = b.flatten(b.gap(x))
    return b.output(b.linear(x, 1000))


def resnet_features(b: Builder, x, depth=50, width_mult=1, groups=1, width_per_group=64, frozen_bn=False):
    """A ResNet's stem and four stages: the stride-32 map (a detector's backbone). `frozen_bn`:
    each BatchNorm a per-channel Mul and Add after its conv (see Builder.conv)."""
    blocks = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3]}[depth]
    x = b.conv(x, 64, 7, s=2, act="relu", frozen_bn=frozen_bn)
    x = b.maxpool(x, 3, 2, 1)
    for stage, n in enumerate(blocks):
        planes = 64 * 2 ** stage
        for i in range(n):
            s = 2 if i == 0 and stage > 0 else 1
            if depth < 50:
                x = _basic(b, x, planes, s, frozen_bn)
            else:
                width = int(planes * width_per_group / 64) * groups * width_mult
                x = _bottleneck(b, x, width, planes * 4, s, groups, frozen_bn)
    return x


def mobilenet_v2(h=224, w=224):
    b = Builder("mobilenet_v2")
    x = b.input("image", (1, 3, h, w))
    x = b.conv(x, 32, 3, s=2, act="relu6")
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hid = cin * t
            y = b.conv(x, hid, 1, act="relu6") if t != 1 else x
            y = b.conv(y, hid, 3, s=stride, groups=hid, act="relu6")
            y = b.conv(y, c, 1)
            x = b.add(x, y) if stride == 1 and cin == c else y
            cin = c
    x = b.conv(x, 1280, 1, act="relu6")
    x = b.flatten(b.gap(x))
    return b.output(b.linear(x, 1000))


def squeezenet1_1(h=224, w=224):
    b = Builder("squeezenet1_1")
    x = b.input("image", (1, 3, h, w))
    x = b.conv(x, 64, 3, s=2, p=0, act="relu")
    x = b.maxpool(x, 3, 2)

    def fire(x, sq, ex):
        s = b.conv(x, sq, 1, act="relu")
        return b.concat([b.conv(s, ex, 1, act="relu"), b.conv(s, ex, 3, act="relu")])
    x = fire(x, 16, 64)
    x = fire(x, 16, 64)
    x = b.maxpool(x, 3, 2)
    x = fire(x, 32, 128)
    x = fire(x, 32, 128)
    x = b.maxpool(x, 3, 2)
    for sq, ex in [(48, 192), (48, 192), (64, 256), (64, 256)]:
        x = fire(x, sq, ex)
    x = b.conv(x, 1000, 1, act="relu")
    return b.output(b.flatten(b.gap(x)))


def shufflenet_v2(width=0.5, h=224, w=224):
    chans = {0.5: [48, 96, 192], 1.0: [116, 232, 464]}[width]
    b = Builder(f"shufflenet_v2_x{width}")
    x = b.input("image", (1, 3, h, w))
    x = b.conv(x, 24, 3, s=2, act="relu")
    x = b.maxpool(x, 3, 2, 1)

    def shuffle(x):
        n, c, hh, ww = b.shape(x)
        y = b.reshape(x, [n, 2, c // 2, hh, ww])
        y = b.transpose(y, [0, 2, 1, 3, 4])
        return b.reshape(y, [n, c, hh, ww])

    def branch(x, cout, s):
        y = b.conv(x, cout, 1, act="relu")
        y = b.conv(y, cout, 3, s=s, groups=cout)
        return b.conv(y, cout, 1, act="relu")

    for c, n in zip(chans, [4, 8, 4]):
        for i in range(n):
            if i == 0:
                left = b.conv(b.conv(x, b.shape(x)[1], 3, s=2, groups=b.shape(x)[1]), c // 2, 1, act="relu")
                x = b.concat([left, branch(x, c // 2, 2)])
            else:
                a, r = b.node("split", [x, b.ints([c // 2, c // 2])], n_out=2, axis=1)
                x = b.concat([a, branch(r, c // 2, 1)])
            x = shuffle(x)
    x = b.conv(x, 1024, 1, act="relu")
    x = b.flatten(b.gap(x))
    return b.output(b.linear(x, 1000))


def googlenet(h=224, w=224):
    b = Builder("googlenet")
    x = b.input("image", (1, 3, h, w))
    x = b.conv(x, 64, 7, s=2, act="relu")
    x = b.maxpool(x, 3, 2, 1)
    x = b.conv(x, 64, 1, act="relu")
    x = b.conv(x, 192, 3, act="relu")
    x = b.maxpool(x, 3, 2, 1)

    def inception(x, c1, c3r, c3, c5r, c5, pp):
        p1 = b.conv(x, c1, 1, act="relu")
        p2 = b.conv(b.conv(x, c3r, 1, act="relu"), c3, 3, act="relu")
        p3 = b.conv(b.conv(x, c5r, 1, act="relu"), c5, 3, act="relu")  # torchvision uses 3x3 here
        p4 = b.conv(b.maxpool(x, 3, 1, 1), pp, 1, act="relu")
        return b.concat([p1, p2, p3, p4])
    x = inception(x, 64, 96, 128, 16, 32, 32)
    x = inception(x, 128, 128, 192, 32, 96, 64)
    x = b.maxpool(x, 3, 2, 1)
    for cfg in [(192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
                (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)]:
        x = inception(x, *cfg)
    x = b.maxpool(x, 2, 2)
    x = inception(x, 256, 160, 320, 32, 128, 128)
    x = inception(x, 384, 192, 384, 48, 128, 128)
    x = b.flatten(b.gap(x))
    return b.output(b.linear(x, 1000))
