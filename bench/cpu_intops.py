"""Integer matmul/conv on the cpu backend (cpu/ops/intops.py: float BLAS, exact) against the
reference kernels (int64 NumPy), alternating in one process; prints medians and ratios.

    python bench/cpu_intops.py [--reps 5]
"""
from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np
from threadpoolctl import threadpool_limits

from npurun.backends.cpu.ops import FACTORIES
from npurun.backends.reference.kernels import KERNELS as REF


def _program(*consts):
    g = SimpleNamespace(constants=lambda: [SimpleNamespace(data=c) for c in consts], nodes=[])
    return SimpleNamespace(graph=g, threads=1, pool=None)


def cases(rng):
    a = rng.integers(0, 256, (128, 384)).astype(np.uint8)
    b = rng.integers(-128, 128, (384, 1536)).astype(np.int8)
    azp, bzp = np.array(131, np.uint8), rng.integers(-3, 4, 1536).astype(np.int8)
    yield "matmul_integer u8 128x384 @ s8 384x1536", (a, b, azp, bzp), {}, (b, bzp)
    yield "qlinear_matmul u8 128x384 @ s8 384x1536", (a, np.array(0.02, np.float32), azp, b,
                                                      np.full(1536, 0.01, np.float32), bzp,
                                                      np.array(1.5, np.float32), np.array(128, np.uint8)), {}, (b, bzp)
    x = rng.integers(0, 256, (1, 64, 56, 56)).astype(np.uint8)
    w = rng.integers(-128, 128, (64, 64, 3, 3)).astype(np.int8)
    win = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1],
           "group": 1, "auto_pad": "NOTSET"}
    yield "conv_integer u8 1x64x56x56 * s8 64x64x3x3", (x, w, np.array(128, np.uint8), None), win, (w,)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with threadpool_limits(1):
        for name, ins, attrs, const in cases(rng):
            op = name.split()[0]
            fast, ref = FACTORIES[op](_program(*const)), REF[op]
            assert np.array_equal(fast(*ins, **attrs), ref(*ins, **attrs))
            t = {"npurun cpu": [], "reference": []}
            for _ in range(args.reps):
                for k, fn in (("npurun cpu", fast), ("reference", ref)):
                    t0 = time.perf_counter()
                    fn(*ins, **attrs)
                    t[k].append((time.perf_counter() - t0) * 1e3)
            med = {k: float(np.median(v)) for k, v in t.items()}
            print(f"{name}: cpu {med['npurun cpu']:.2f} ms, reference {med['reference']:.2f} ms, "
                  f"speed-up {med['reference'] / med['npurun cpu']:.0f}x (1 thread, median of {args.reps})")


if __name__ == "__main__":
    main()
