"""YOLOv8 detection (ultralytics layout; n = depth 0.33, width 0.25) with the DFL box decode of
its exported head. SiLU is one `swish` op, as NPU toolchains fuse it."""
from __future__ import annotations

import numpy as np

from .builder import Builder


def yolov8(h=640, w=640, width=0.25, depth=0.33, max_ch=1024, nc=80):
    b = Builder("yolov8_det")

    def ch(c):
        return int(min(c, max_ch) * width)

    def nrep(n):
        return max(round(n * depth), 1)

    def conv(x, c, k=1, s=1):
        return b.conv(x, c, k, s=s, act="swish")

    def c2f(x, c2, n, shortcut):
        c = c2 // 2
        y = conv(x, 2 * c, 1)
        parts = list(b.node("split", [y, b.ints([c, c])], n_out=2, axis=1))
        for _ in range(n):
            z = conv(conv(parts[-1], c, 3), c, 3)
            parts.append(b.add(parts[-1], z) if shortcut else z)
        return conv(b.concat(parts), c2, 1)

    x = b.input("image", (1, 3, h, w))
    x = conv(x, ch(64), 3, 2)
    x = conv(x, ch(128), 3, 2)
    x = c2f(x, ch(128), nrep(3), True)
    x = conv(x, ch(256), 3, 2)
    p3 = c2f(x, ch(256), nrep(6), True)
    x = conv(p3, ch(512), 3, 2)
    p4 = c2f(x, ch(512), nrep(6), True)
    x = conv(p4, ch(1024), 3, 2)
    x = c2f(x, ch(1024), nrep(3), True)
    y = conv(x, ch(1024) // 2, 1)                      # SPPF
    pools = [y]
    for _ in range(3):
        pools.append(b.maxpool(pools[-1], 5, 1, 2))
    p5 = conv(b.concat(pools), ch(1024), 1)
    h4 = c2f(b.concat([b.upsample(p5, 2), p4]), ch(512), nrep(3), False)
    o3 = c2f(b.concat([b.upsample(h4, 2), p3]), ch(256), nrep(3), False)
    o4 = c2f(b.concat([conv(o3, ch(256), 3, 2), h4]), ch(512), nrep(3), False)
    o5 = c2f(b.concat([conv(o4, ch(512), 3, 2), p5]), ch(1024), nrep(3), False)
    c2, c3 = max(16, ch(256) // 4, 64), max(ch(256), min(nc, 100))
    outs = []
    for o in (o3, o4, o5):
        box = b.conv(conv(conv(o, c2, 3), c2, 3), 64, 1)
        cls = b.conv(conv(conv(o, c3, 3), c3, 3), nc, 1)
        n_anchor = b.shape(o)[2] * b.shape(o)[3]
        outs.append(b.reshape(b.concat([box, cls]), [1, 64 + nc, n_anchor]))
    y = b.concat(outs, axis=2)
    box, cls = b.node("split", [y, b.ints([64, nc])], n_out=2, axis=1)
    a = b.shape(box)[2]
    dfl = b.node("softmax", [b.transpose(b.reshape(box, [1, 4, 16, a]), [0, 2, 1, 3])], axis=1)
    proj = b.g.const("dfl.weight", np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1)).name
    dist = b.reshape(b.node("conv", [dfl, proj]), [1, 4, a])
    return b.output(dist, b.node("sigmoid", [cls]))
