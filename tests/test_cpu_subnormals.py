"""Subnormal float32 constants on the cpu backend (native.without_subnormals): zeroed, sign
kept, when a program is built; kept with NPURUN_FLUSH_SUBNORMALS=0; the caller's graph untouched."""

import numpy as np
import pytest

import npurun
from npurun.backends.cpu import native
from npurun.ir import parse

from conftest import nonzero_normal

TINY = np.finfo(np.float32).tiny


def _with_subnormals(rng, shape, share=0.2):
    a = nonzero_normal(rng, shape)
    pick = rng.random(shape) < share
    a[pick] = (rng.uniform(1e-44, 0.99, pick.sum()) * TINY * rng.choice([-1, 1], pick.sum())).astype(np.float32)
    return a, pick


def test_without_subnormals_zeroes_them_with_their_sign(rng, monkeypatch):
    monkeypatch.setattr(native, "FLUSH_CHUNK", 7)  # chunks that split the array
    a, pick = _with_subnormals(rng, (5, 13))
    assert pick.any() and np.all(np.abs(a[pick]) < TINY) and np.all(a[pick] != 0)
    got = native.without_subnormals(a)
    assert np.all(got[pick] == 0) and np.array_equal(np.signbit(got[pick]), np.signbit(a[pick]))
    np.testing.assert_array_equal(got[~pick], a[~pick])
    assert np.all(np.abs(a[pick]) < TINY)  # the argument is not changed
    normal = nonzero_normal(rng, (40,))
    normal[3] = TINY  # the smallest normal number stays
    normal[5] = 0.0
    assert native.without_subnormals(normal) is None


GRAPH = """
op conv @c (x: [1, 16, 6, 6] f32, w: [8, 16, 3, 3] f32, b: [8] f32 -> y: [1, 8, 6, 6] f32) pads=[1, 1, 1, 1]
"""


@pytest.mark.parametrize("flush", ["1", "0"])
def test_a_program_flushes_its_subnormal_weights(flush, rng, monkeypatch):
    """With subnormal weights a cpu program's outputs are the reference's, its own weights
    flushed (or kept with NPURUN_FLUSH_SUBNORMALS=0), the caller's graph unchanged."""
    monkeypatch.setenv("NPURUN_FLUSH_SUBNORMALS", flush)
    g = parse(GRAPH)
    w, pick = _with_subnormals(rng, (8, 16, 3, 3))
    g.values["w"].data = w
    g.values["b"].data = nonzero_normal(rng, (8,))
    g.inputs = ["x"]
    x = nonzero_normal(rng, (1, 16, 6, 6))
    prog = npurun.Executor("cpu").compile(g)
    want = npurun.Executor("reference").run_sync(g, {"x": x})["y"]
    np.testing.assert_allclose(prog.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    held = prog.graph.values["w"].data
    assert np.all((held[pick] == 0) == (flush == "1"))
    assert np.all(g.values["w"].data[pick] != 0)  # the caller's graph keeps its weights
