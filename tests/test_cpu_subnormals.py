"""Subnormal float32 values on the cpu backend (native.flush_subnormals): a run computes with
them flushed to zero, on the calling thread and on the kernels' workers alike; the caller's own
floating-point mode is back after the run; NPURUN_FLUSH_SUBNORMALS=0 keeps them."""

import numpy as np
import pytest

import npurun
from npurun.ir import parse

from conftest import nonzero_normal

TINY = np.finfo(np.float32).tiny

# 5x5: no kernel takes it through Winograd, whose transforms scale the products (a 3x3 conv here
# took Winograd on AVX2-only CPUs: products of these tiny values came out at ~2e-38, normal)
GRAPH = """
op conv @c (x: [1, 16, 24, 24] f32, w: [32, 16, 5, 5] f32, b: [32] f32 -> y: [1, 32, 24, 24] f32) pads=[2, 2, 2, 2]
"""


def _conv(rng, w):
    g = parse(GRAPH)
    g.values["w"].data = w
    g.values["b"].data = np.zeros(32, np.float32)
    g.inputs = ["x"]
    return g


def _subnormal_in_numpy() -> bool:
    """Whether this thread's NumPy still makes subnormal results (its mode is not flushing)."""
    return bool(np.float32(TINY) * np.float32(0.25) != 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_flushes_subnormal_products_on_every_thread(threads, rng, monkeypatch):
    """Weights and inputs near 1e-20 make products near 1e-40, below float32's smallest normal:
    flushed, every output is exactly 0 (on the workers' chunks too, which copy the caller's
    mode); kept (NPURUN_FLUSH_SUBNORMALS=0), they are the reference's subnormal sums."""
    w = (nonzero_normal(rng, (32, 16, 5, 5)) * 1e-20).astype(np.float32)
    x = (nonzero_normal(rng, (1, 16, 24, 24)) * 1e-20).astype(np.float32)
    want = npurun.Executor("reference").run_sync(_conv(rng, w), {"x": x})["y"]
    assert np.count_nonzero(want) > want.size // 2  # the reference keeps them
    assert _subnormal_in_numpy()
    monkeypatch.setenv("NPURUN_FLUSH_SUBNORMALS", "1")
    prog = npurun.Executor("cpu", parallelism=threads).compile(_conv(rng, w))
    got = prog.run({"x": x})["y"]
    assert not np.any(got), f"{np.count_nonzero(got)} subnormal outputs were not flushed"
    assert _subnormal_in_numpy()  # the caller's mode is restored
    monkeypatch.setenv("NPURUN_FLUSH_SUBNORMALS", "0")
    kept = npurun.Executor("cpu", parallelism=threads).compile(_conv(rng, w)).run({"x": x})["y"]
    np.testing.assert_allclose(kept, want, rtol=1e-4, atol=TINY * 1e-3)
    assert np.count_nonzero(kept) > want.size // 2


def test_flushing_leaves_normal_results_as_they_are(rng, monkeypatch):
    """Subnormal weights (a fifth of them) count as zeros: the outputs are the reference's with
    those weights zeroed, and the caller's graph keeps its weights."""
    w = nonzero_normal(rng, (32, 16, 5, 5))
    pick = rng.random(w.shape) < 0.2
    w[pick] = (rng.uniform(1e-44, 0.99, pick.sum()) * TINY).astype(np.float32)
    x = nonzero_normal(rng, (1, 16, 24, 24))
    monkeypatch.setenv("NPURUN_FLUSH_SUBNORMALS", "1")
    g = _conv(rng, w)
    got = npurun.Executor("cpu").compile(g).run({"x": x})["y"]
    zeroed = np.where(pick, np.float32(0), w)
    want = npurun.Executor("reference").run_sync(_conv(rng, zeroed), {"x": x})["y"]
    # (sums of 400 products rounded in another order: the other kernel tests' bound)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * float(np.abs(want).max()))
    assert np.all(g.values["w"].data[pick] != 0)
