"""Elementwise chains through the cpu pipeline (passes/fuse_hard_swish.py, fold_affine.py,
fuse_activation.py, fuse_affine_chain.py) and the cpu kernels of what they make: hard-swish
spellings become one op (fused into a conv where it reads only the conv), affines and batch
norms after a conv fold into its weights, leftover affine/activation runs become one
affine_activation (one C pass); every program is checked against the reference backend on
the unlowered graph, on fresh random inputs."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import npurun
from npurun.backends.cpu.ops import fused
from npurun.ir import parse

from conftest import nonzero_normal

pytestmark = pytest.mark.skipif(fused.AFFINE_ACT is None, reason="compiled kernels not built")

T = "[1, 8, 6, 11] f32"
HEAD = f"op conv @c (x: [1, 3, 8, 13] f32, w: [8, 3, 3, 3] f32, b: [8] f32 -> u0: {T})\n"
# PP-LCNetV3's block: conv -> s1 * . + t1 -> hard-swish (add, clip, mul, div) -> s2 * . + t2
LCNET = HEAD + f"""
op mul @m0 (s1: [1] f32, u0: {T} -> u1: {T})
op add @a0 (u1: {T}, t1: [1] f32 -> u: {T})
op add @h0 (u: {T}, three: [] f32 -> h1: {T})
op clip @h1 (h1: {T}, zero: [] f32, six: [] f32 -> h2: {T})
op mul @h2 (u: {T}, h2: {T} -> h3: {T})
op div @h3 (h3: {T}, six: [] f32 -> h: {T})
op mul @m1 (h: {T}, s2: [1] f32 -> v1: {T})
op add @a1 (v1: {T}, t2: [1] f32 -> out: {T})
"""
# the other spelling: clip / 6 first, then times u; and a per-channel scale and a BN before it
SPELL2 = HEAD + f"""
op mul @m0 (u0: {T}, sc: [8, 1, 1] f32 -> u1: {T})
op batch_normalization @bn (u1: {T}, g: [8] f32, be: [8] f32, mu: [8] f32, var: [8] f32 -> u: {T})
op add @h0 (three: [] f32, u: {T} -> h1: {T})
op clip @h1 (h1: {T}, zero: [] f32, six: [] f32 -> h2: {T})
op div @h2 (h2: {T}, six: [] f32 -> h3: {T})
op mul @h3 (h3: {T}, u: {T} -> out: {T})
"""
# x * hard_sigmoid(x), on a graph input (nothing to fold into), then an affine: one C pass
HSIG = f"""
op hard_sigmoid @h0 (x: {T} -> h: {T}) alpha=0.16666666666666666 beta=0.5
op mul @h1 (x: {T}, h: {T} -> y: {T})
op sub @h2 (y: {T}, t1: [1] f32 -> z: {T})
op mul @h3 (z: {T}, s2: [1] f32 -> out: {T})
"""
# u0 has other readers and is a graph output: the hard-swish of it is one op (u0 is its
# input, not an intermediate), but it cannot join the conv's epilogue
SHARED = HEAD + f"""
op add @h0 (u0: {T}, three: [] f32 -> h1: {T})
op clip @h1 (h1: {T}, zero: [] f32, six: [] f32 -> h2: {T})
op mul @h2 (u0: {T}, h2: {T} -> h3: {T})
op div @h3 (h3: {T}, six: [] f32 -> out: {T})
"""
CONSTS = {"three": 3.0, "zero": 0.0, "six": 6.0}


def _graph(text, rng, inputs=("x",), outputs=None):
    g = parse(text)
    for nm, v in g.values.items():
        if nm in CONSTS:
            v.data = np.array(CONSTS[nm], np.float32)
        elif nm == "var":
            v.data = (np.abs(nonzero_normal(rng, (8,))) + 0.5).astype(np.float32)
        elif nm not in inputs and not any(nm in n.outputs for n in g.nodes):
            v.data = nonzero_normal(rng, [d for d in v.shape])
    g.inputs = list(inputs)
    if outputs:
        g.outputs = list(outputs)
    return g


def _check(g, rng, threads=1):
    prog = npurun.Executor("cpu", parallelism=threads).compile(g)
    x = nonzero_normal(rng, g.values["x"].shape) * 3  # reaches both ends of the clip
    keep = x.copy()
    want = npurun.Executor("reference").run_sync(g, {"x": x})
    for _ in range(2):  # the second run uses the packed (folded) weights of the first
        got = prog.run({"x": x})
        for k in g.outputs:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=3e-5, err_msg=k)
    np.testing.assert_array_equal(x, keep)  # an input is never written in place
    return Counter(n.op + ("+" + n.attrs["activation"] if n.attrs.get("activation") else "") for n in prog.graph.nodes)


@pytest.mark.parametrize("threads", [1, 2])
def test_lcnet_block_is_one_conv_and_one_chain(threads, rng):
    steps = _check(_graph(LCNET, rng), rng, threads)
    assert steps == Counter({"conv+hard_swish": 1, "affine_activation": 1})


def test_per_channel_scale_and_batch_norm_fold_into_the_conv(rng):
    assert _check(_graph(SPELL2, rng), rng) == Counter({"conv+hard_swish": 1})


def test_hard_sigmoid_spelling_and_affine_on_a_graph_input(rng):
    assert _check(_graph(HSIG, rng), rng) == Counter({"affine_activation+hard_swish": 1})


def test_a_value_with_another_reader_is_not_fused_across(rng):
    g = _graph(SHARED, rng, outputs=["out", "u0"])
    steps = _check(g, rng)
    assert steps == Counter({"conv": 1, "hard_swish": 1})


def test_affine_kernel_tails(rng):
    for n in (1, 7, 8, 17, 1003):
        x = nonzero_normal(rng, (n,)) * 4
        y = np.empty_like(x)
        fused.AFFINE_ACT(x.ctypes.data, y.ctypes.data, n, 1.5, 0.25, 8, 1 / 6, 0.5, 0.7, -0.3)
        u = 1.5 * x.astype(np.float64) + 0.25
        np.testing.assert_allclose(y, 0.7 * u * np.clip(u / 6 + 0.5, 0, 1) - 0.3, rtol=1e-5, atol=1e-5)


def test_a_node_reading_a_value_twice_is_left_alone(rng):
    g = _graph(HEAD + f"op mul @sq (u0: {T}, u0: {T} -> out: {T})\n", rng)
    assert _check(g, rng) == Counter({"conv": 1, "mul": 1})
