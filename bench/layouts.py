"""What each blocked layout costs or saves on the CPU, next to the plain layout.

    .venv/bin/python bench/layouts.py [--reps 15]

1. Block4x4 weights, matmul shapes of MiniLM (tokens x 384 @ 384 x {384, 1536}, 1536 x 384):
   plain `a @ w` (NumPy's BLAS) vs the blocked weight used directly (`tensordot` over the
   (K/4, N, 4) array) vs the reference kernel of `matmul_block4x4` (unpack, then matmul).
2. NCHWc activations, conv shapes of ESPCN's middle layer (64 -> 32, 3x3) and a 1x1 conv:
   the cpu backend's conv on NCHW vs a NumPy per-tap conv on NCHWc (the best a kernel
   without NCHWc support in csrc/ can do) and the same per-tap conv on NCHW, for a fair pair.
3. Whole ESPCN on the cpu backend: the standard pipeline vs + layout_nchwc.

Peers run alternately in one process; the table gives medians and ratios (layout / plain).
Every blocked result is checked against the plain one before it is timed.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

import npurun
from npurun.backends import get_backend
from npurun.backends.reference.kernels.layout import (matmul_block4x4, pack_block4x4, pack_nchwc,
                                                      unpack_nchwc)
from npurun.passes.layout_nchwc import layout_nchwc
from npurun.passes.pipeline import pipeline_for, run_pipeline


def alternate(peers: dict, reps: int) -> dict:
    times = {k: [] for k in peers}
    for fn in peers.values():
        fn()  # warm up
    for _ in range(reps):
        for k, fn in peers.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def report(title: str, med: dict, base: str) -> None:
    cells = "  ".join(f"{k} {v * 1e3:8.3f} ms ({v / med[base]:.2f}x)" for k, v in med.items())
    print(f"{title:34s} {cells}")


def blocked_matmul_direct(a, wb):
    # a (M, K) as (M, K/4, 4) against wb (K/4, N, 4): contract both block axes
    m, k = a.shape
    return np.tensordot(a.reshape(m, k // 4, 4), wb, axes=([1, 2], [0, 2]))


def conv_per_tap_nchw(x, w, pad):
    # y (N, M, H*W) += w[:, :, i, j] (M, C) @ shifted x (C, H*W), one GEMM per tap
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((n, m, h * wd), np.float32)
    for i in range(kh):
        for j in range(kw):
            y += w[:, :, i, j] @ xp[:, :, i:i + h, j:j + wd].reshape(n, c, h * wd)
    return y.reshape(n, m, h, wd)


def conv_per_tap_nchwc(xb, w, pad, c=4):
    # xb (N, C/c, H, W, c); w as (M/c, c_out, C/c, c_in, kh, kw); y (N, M/c, H, W, c)
    n, cb, h, wd, _ = xb.shape
    m, ci, kh, kw = w.shape
    wb = w.reshape(m // c, c, cb, c, kh, kw)
    xp = np.pad(xb, ((0, 0), (0, 0), (pad, pad), (pad, pad), (0, 0)))
    y = np.zeros((n, m // c, h, wd, c), np.float32)
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("nbhwi,oabi->nohwa", xp[:, :, i:i + h, j:j + wd, :], wb[..., i, j], optimize=True)
    return y


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    with threadpool_limits(limits=1, user_api="blas"):  # one thread each: a fair, quiet pair
        run(args)


def run(args):
    rng = np.random.default_rng(0)
    print("1. Block4x4 weights (NumPy BLAS, 1 thread)")
    for m, k, n in [(32, 384, 384), (32, 384, 1536), (32, 1536, 384), (512, 384, 1536)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        wb = pack_block4x4(w)
        want = a @ w
        for got in (blocked_matmul_direct(a, wb), matmul_block4x4(a, wb)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        med = alternate({"plain": lambda: a @ w, "block4x4 direct": lambda: blocked_matmul_direct(a, wb),
                         "block4x4 ref": lambda: matmul_block4x4(a, wb)}, args.reps)
        report(f"  matmul {m}x{k} @ {k}x{n}", med, "plain")

    print("2. NCHWc activations (conv 3x3 pad 1 / 1x1)")
    cpu = get_backend("cpu", 1)
    for c_in, c_out, ks, h, wd in [(64, 32, 3, 120, 160), (64, 64, 1, 120, 160)]:
        x = rng.standard_normal((1, c_in, h, wd)).astype(np.float32)
        w = rng.standard_normal((c_out, c_in, ks, ks)).astype(np.float32)
        pad = ks // 2
        g = npurun.parse(f"""npuir 1
graph c
input x: [1, {c_in}, {h}, {wd}] f32 DRAM0
input w: [{c_out}, {c_in}, {ks}, {ks}] f32 DRAM0
op conv (x: [1, {c_in}, {h}, {wd}] f32 DRAM0, w: [{c_out}, {c_in}, {ks}, {ks}] f32 DRAM0 -> y: [1, {c_out}, {h}, {wd}] f32 DRAM0) pads=[{pad}, {pad}, {pad}, {pad}]
""")
        prog = cpu.compile(g)
        xb = pack_nchwc(x, 4)
        want = prog.run({"x": x, "w": w})["y"]
        np.testing.assert_allclose(conv_per_tap_nchw(x, w, pad), want, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(unpack_nchwc(conv_per_tap_nchwc(xb, w, pad), c_out), want, rtol=1e-3, atol=1e-3)
        med = alternate({"cpu backend NCHW": lambda: prog.run({"x": x, "w": w}),
                         "numpy NCHW": lambda: conv_per_tap_nchw(x, w, pad),
                         "numpy NCHWc": lambda: conv_per_tap_nchwc(xb, w, pad),
                         "pack+unpack": lambda: unpack_nchwc(pack_nchwc(x, 4), c_in)}, args.reps)
        report(f"  conv {c_in}->{c_out} {ks}x{ks} {h}x{wd}", med, "numpy NCHW")

    print("3. ESPCN 160x120 on the cpu backend")
    espcn = Path(npurun.__file__).parent / "zoo" / "espcn_x3.onnx"
    plain = run_pipeline(npurun.load(espcn), pipeline_for("cpu"), verify_each=True)
    blocked = run_pipeline(npurun.load(espcn), pipeline_for("cpu") + [layout_nchwc], verify_each=True)
    x = rng.standard_normal((1, 1, 120, 160)).astype(np.float32)
    p1, p2 = cpu.compile(plain), cpu.compile(blocked)
    np.testing.assert_allclose(p2.run({"input": x})["output"], p1.run({"input": x})["output"], rtol=1e-4, atol=1e-4)
    med = alternate({"plain": lambda: p1.run({"input": x}), "nchwc": lambda: p2.run({"input": x})}, args.reps)
    report("  espcn_x3", med, "plain")


if __name__ == "__main__":
    main()
