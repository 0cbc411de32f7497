"""csrc/par.c: the C kernels' one pool keeps its sleeping workers off the CPU of the thread that
wakes them (the kernel's wake-affine placement queued them behind the caller: 4-10 ms of
one-thread jobs after an idle gap on a 2-vCPU VM; docs/cpu.md, "Waking the pool")."""
import os
import time

import numpy as np
import pytest

from npurun.backends.cpu import native, nativeconv


def _masks() -> dict[int, set[int]]:
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            out[int(t)] = os.sched_getaffinity(int(t))
        except OSError:  # a thread that ended meanwhile
            pass
    return out


@pytest.mark.skipif(native.LIB is None, reason=f"compiled kernels unavailable: {native.REASON}")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep a worker off one")
def test_woken_workers_are_kept_off_the_callers_cpu(rng):
    x = rng.standard_normal((1, 16, 96, 96)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    attrs = {"group": 1, "strides": [1, 1], "dilations": [1, 1], "auto_pad": "NOTSET", "pads": [1] * 4}
    mine = os.sched_getaffinity(0)
    ref = nativeconv.conv2d(x, w, b, attrs, None, None, 1, {}, algo="gemm")
    for _ in range(3):
        time.sleep(0.01)  # past the workers' 300 us of spinning: they sleep, and this call wakes them
        out = nativeconv.conv2d(x, w, b, attrs, None, None, 2, {}, algo="gemm")
        np.testing.assert_array_equal(out, ref)
    others = {t: m for t, m in _masks().items() if t != os.getpid() and m != mine}
    # a worker's affinity is this thread's less exactly one CPU (the one the waking call ran on)
    assert any(m < mine and len(mine - m) == 1 for m in others.values()), (mine, others)
