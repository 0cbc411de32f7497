"""A/B of the cpu backend's changes of 2026-12-03 (docs/cpu.md, "This round"), each toggled at
run time in one process, alternating, medians; outputs compared before timing.

    python bench/cpu_ops_ab.py [--runs 40]

- `ptr`: an array's address for a ctypes call, native.ptr (csrc/py/addr.c) against numpy's
  `a.ctypes.data`.
- `max_pool`: the compiled kernel (csrc/pool.c) against the NumPy passes (native.LIB off for
  the call), 1 and 2 threads, on pools of real models (a ResNet stem, Inception, YOLO's SPPF).
- `strided 1x1`: a strided pointwise conv on its gathered pixels against the same conv on the
  strided kernels (nativeconv.GATHER_STRIDED_1X1), 1 thread, ResNet v1 shortcut shapes.
Prints times, never asserts.
"""
from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npurun.backends.cpu import blas, native, nativeconv  # noqa: E402
from npurun.backends.cpu.ops import vision  # noqa: E402

POOLS = [((1, 64, 112, 112), 3, 2, [0, 0, 1, 1]), ((1, 64, 147, 147), 3, 2, [0, 0, 0, 0]),
         ((1, 192, 71, 71), 3, 2, [0, 0, 0, 0]), ((1, 256, 20, 20), 5, 1, [2, 2, 2, 2]),
         ((1, 128, 40, 40), 5, 1, [2, 2, 2, 2]), ((1, 256, 27, 27), 3, 2, [0, 0, 0, 0])]
POINTWISE = [(512, 14, 1024), (1024, 14, 2048), (256, 28, 512), (128, 56, 256), (64, 56, 256)]


def alternate(a, b, runs: int) -> tuple[float, float]:
    """Median seconds of a() and b(), called in turns."""
    a(), b()
    ta, tb = [], []
    for _ in range(runs):
        for f, ts in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return sorted(ta)[runs // 2], sorted(tb)[runs // 2]


def without_library(fn):
    def run():
        lib, native.LIB = native.LIB, None
        try:
            return fn()
        finally:
            native.LIB = lib
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    if native.LIB is None:
        print(f"the compiled kernels are not built here: {native.REASON}")
        return 1
    rng = np.random.default_rng(0)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, cpu kernels: {native.ISA}")

    a = rng.standard_normal(128).astype(np.float32)
    n = 200_000
    t_new = timeit.timeit(lambda: native.ptr(a), number=n) / n
    t_old = timeit.timeit(lambda: a.ctypes.data, number=n) / n
    print(f"ptr: native.ptr {t_new * 1e6:.3f} us, a.ctypes.data {t_old * 1e6:.3f} us")

    for shape, k, s, pads in POOLS:
        x = rng.standard_normal(shape).astype(np.float32)
        attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=None, ceil_mode=0, auto_pad="NOTSET")
        for threads in (1, 2):
            c = lambda: vision._max_pool(x, **attrs, threads=threads)  # noqa: E731
            p = without_library(lambda: vision._max_pool(x, **attrs))
            assert np.array_equal(c(), p())
            tc, tp = alternate(c, p, args.runs)
            print(f"max_pool {shape} {k}x{k} s{s}, {threads}T: NumPy {tp * 1e3:.3f} ms, compiled {tc * 1e3:.3f} ms "
                  f"({tp / tc:.2f}x)")

    for c, h, m in POINTWISE:
        x = rng.standard_normal((1, c, h, h)).astype(np.float32)
        w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
        b = rng.standard_normal(m).astype(np.float32)
        attrs = dict(strides=[2, 2], dilations=[1, 1], pads=None, auto_pad="NOTSET", group=1)
        caches = ({}, {})

        def run(gather, cache):
            def f():
                nativeconv.GATHER_STRIDED_1X1 = gather
                try:
                    return blas.with_threads(1, lambda: nativeconv.conv2d(x, w, b, attrs, None, None, 1, cache))
                finally:
                    nativeconv.GATHER_STRIDED_1X1 = True
            return f
        new, old = run(True, caches[0]), run(False, caches[1])
        np.testing.assert_allclose(new(), old(), rtol=1e-4, atol=1e-3)
        tn, to = alternate(new, old, args.runs)
        print(f"strided 1x1 {c}->{m} on {h}x{h}, 1T: strided {to * 1e3:.3f} ms, gathered {tn * 1e3:.3f} ms "
              f"({to / tn:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
