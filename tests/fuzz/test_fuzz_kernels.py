"""Fuzz target: the cpu backend's C kernels (csrc/, through ctypes), by the shapes and strides
their callers pass. Each case is one ONNX node with drawn geometry: Conv (dense, grouped,
depthwise, pointwise; kernels 1-7, strides and dilations 1-4, pads 0-3, auto_pad, batch 1-3,
odd and tiny maps, channel counts around the microkernel's 4/8/16 tiles), MatMul and Gemm
(transposes, 1-row, 1-column, broadcast batches), the activations on lengths around the
vector width, LayerNormalization, Softmax and LSTM; on 1 or 2 compute units. It runs on the
cpu backend and on the reference backend (the oracle) in this child process (a pointwise conv
also with each of its GEMM kernels forced: a program picks them by timing), so a C kernel
that writes out of bounds kills the child (reported with its signal and stack). Pass: an
NpurunError, or cpu outputs equal to the reference within 1e-4 (relative to the largest)."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import fuzzkit


def _model(node, inputs, inits, opset=17):
    g = helper.make_graph([node], "k", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape))
                                        for n, a in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@st.composite
def conv_case(draw):
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise", "pointwise"]))
    n, g = draw(st.integers(1, 3)), 1
    c = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 9, 16, 17, 32]))
    m = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16, 33, 64]))
    if kind == "grouped":
        g = draw(st.sampled_from([d for d in (2, 3, 4) if c % d == 0] or [1]))
        m = g * draw(st.integers(1, 5))
    if kind == "depthwise":
        g = m = c
    kh, kw = (1, 1) if kind == "pointwise" else (draw(st.integers(1, 7)), draw(st.integers(1, 7)))
    h, w = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    attrs = {"group": g, "kernel_shape": [kh, kw]}
    auto = draw(st.sampled_from(["NOTSET"] * 4 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto != "NOTSET":
        attrs["auto_pad"] = auto
    else:
        attrs["pads"] = draw(st.lists(st.integers(0, 3), min_size=4, max_size=4))
    attrs["strides"] = draw(st.lists(st.integers(1, 4), min_size=2, max_size=2))
    if auto == "NOTSET":  # (ONNX leaves SAME_* with dilation unspecified)
        attrs["dilations"] = draw(st.lists(st.integers(1, 4), min_size=2, max_size=2))
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = r.standard_normal((n, c, h, w)).astype(np.float32)
    wt = r.standard_normal((m, c // g, kh, kw)).astype(np.float32)
    ins = ["x", "w"] + (["b"] if draw(st.booleans()) else [])
    inits = [("w", wt)] + ([("b", r.standard_normal(m).astype(np.float32))] if len(ins) == 3 else [])
    return _model(helper.make_node("Conv", ins, ["y"], **attrs), [("x", x)], inits), {"x": x}


@st.composite
def matmul_case(draw):
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mm, k, nn = (draw(st.sampled_from([1, 2, 3, 7, 8, 9, 16, 31, 64, 65])) for _ in range(3))
    if draw(st.booleans()):
        batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        a = r.standard_normal(batch + (mm, k)).astype(np.float32)
        b = r.standard_normal((k, nn)).astype(np.float32)
        return _model(helper.make_node("MatMul", ["a", "b"], ["y"]), [("a", a)], [("b", b)]), {"a": a}
    ta, tb = draw(st.booleans()), draw(st.booleans())
    a = r.standard_normal((k, mm) if ta else (mm, k)).astype(np.float32)
    b = r.standard_normal((nn, k) if tb else (k, nn)).astype(np.float32)
    cvec = r.standard_normal(draw(st.sampled_from([(nn,), (1, nn), (mm, nn), (mm, 1)]))).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=int(ta), transB=int(tb),
                            alpha=draw(st.sampled_from([1.0, 0.5, -2.0])), beta=draw(st.sampled_from([1.0, 0.0, 3.0])))
    return _model(node, [("a", a)], [("b", b), ("c", cvec)]), {"a": a}


@st.composite
def elementwise_case(draw):
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 129]), min_size=1, max_size=4)))
    while np.prod(shape) > 1 << 16:  # (129^4 floats would be 1 GB: the test's memory, not the kernel's)
        shape = shape[1:]
    x = (r.standard_normal(shape) * 4).astype(np.float32)
    op = draw(st.sampled_from(["Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish",
                               "Softmax", "LayerNormalization"]))
    if op == "Clip":
        node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
        return _model(node, [("x", x)], [("lo", np.array(-0.5, np.float32)), ("hi", np.array(1.5, np.float32))]), {"x": x}
    if op == "Softmax":
        node = helper.make_node("Softmax", ["x"], ["y"], axis=draw(st.integers(-len(shape), len(shape) - 1)))
    elif op == "LayerNormalization":
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        scale = r.standard_normal(shape[axis:]).astype(np.float32)
        node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=axis)
        return _model(node, [("x", x)], [("s", scale)]), {"x": x}
    else:
        node = helper.make_node(op, ["x"], ["y"])
    return _model(node, [("x", x)], []), {"x": x}


@st.composite
def lstm_case(draw):
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t, b, i, hs = draw(st.integers(1, 6)), draw(st.integers(1, 4)), draw(st.integers(1, 17)), draw(st.integers(1, 19))
    dirs = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    nd = 2 if dirs == "bidirectional" else 1
    x = r.standard_normal((t, b, i)).astype(np.float32)
    w = r.standard_normal((nd, 4 * hs, i)).astype(np.float32) * 0.3
    rr = r.standard_normal((nd, 4 * hs, hs)).astype(np.float32) * 0.3
    bias = r.standard_normal((nd, 8 * hs)).astype(np.float32) * 0.1
    node = helper.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=hs, direction=dirs)
    return _model(node, [("x", x)], [("w", w), ("r", rr), ("b", bias)]), {"x": x}


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    import npurun
    from npurun.backends.cpu import native, nativeconv
    from npurun.errors import NpurunError
    from npurun.frontend.onnx import import_model
    from npurun.ir.ops import OPS
    assert native.LIB is not None, f"the compiled kernels are not loaded: {native.REASON}"
    cpus = {k: npurun.Executor("cpu", parallelism=k) for k in (1, 2)}
    ref = npurun.Executor("reference", parallelism=1)

    last = os.environ.get("NPURUN_FUZZ_LAST")  # where the case about to run is kept: a crash
    # kills the child before hypothesis can report it, so run_target prints this file instead

    def one(model: onnx.ModelProto, feeds: dict, units: int):
        if last:
            np.savez(last, model=np.frombuffer(model.SerializeToString(), np.uint8), units=units, **feeds)
        g = import_model(model)
        want = ref.run_sync(g, feeds)["y"]  # an NpurunError here: a node ONNX allows but npurun refuses
        try:
            got = cpus[units].run_sync(g, feeds)["y"]
        except NpurunError as e:  # the oracle ran it: the cpu backend must too
            raise AssertionError(f"the reference backend ran it, the cpu backend failed: {e}") from e
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
        scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
        stats.notes[f"{model.graph.node[0].op_type} checked against the reference"] += 1
        node = g.nodes[0]
        attrs = OPS[node.op].attrs_of(node) if node.op == "conv" else {}
        if attrs and attrs["group"] == 1 and tuple(g.values[node.inputs[1]].shape[2:]) == (1, 1) \
                and not any(attrs["pads"] or ()) and attrs["auto_pad"] in ("NOTSET", "VALID"):
            # a program picks a pointwise conv's kernel by rule or by timing: each candidate forced
            w, b = (g.values[nm].data if nm else None for nm in (list(node.inputs) + [""])[1:3])
            attrs = {k: v for k, v in attrs.items() if k not in ("activation", "activation_params")}
            for algo in ("gemm", "tgemm"):
                forced = nativeconv.conv2d(feeds["x"], w, b, attrs, None, None, units, {}, algo=algo)
                np.testing.assert_allclose(forced, want, rtol=1e-4, atol=1e-4 * scale, err_msg=algo)
                stats.notes[f"pointwise conv forced to {algo}"] += 1

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(st.one_of(conv_case(), conv_case(), matmul_case(), elementwise_case(), lstm_case()), st.sampled_from([1, 2]))
    def case(c, units):
        stats.case(one, c[0], c[1], units)

    case()


@pytest.mark.fuzz
def test_fuzz_c_kernels():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_kernels"))


# What it found, fixed: conv_gemm.c's stride-2 phase split looped for ever on a 2-wide row with
# a pad before it; a conv with an empty output died with SIGFPE in C and failed in the reference
# kernel. Their regressions: tests/test_cpu_native.py (FLAT_CONVS, EMPTY_CONVS).
