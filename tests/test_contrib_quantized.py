"""com.microsoft QLinear* elementwise, pooling, concat and softmax ops against ONNX Runtime, on
the reference and cpu backends (fresh random quantized inputs; at most one quantization step
apart, where a float32 rounding of ORT's lookup tables lands on a .5)."""
from __future__ import annotations

import numpy as np
import pytest
from contrib_util import check, node_model, quantized, scale

U8, I8 = np.uint8, np.int8
STEPS = 1  # ORT computes the same float32 values (its lookup tables); a .5 may round apart


def _zp(rng, dtype):
    info = np.iinfo(dtype)
    return np.array(rng.integers(info.min // 2, info.max // 2 + 1), dtype)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (3, 1, 1)), ((1, 4), (3, 1))])
def test_qlinear_binary(rng, tmp_path, op, dtype, shapes):
    a, b = quantized(rng, shapes[0], dtype), quantized(rng, shapes[1], dtype)
    c_scale = scale(rng, 0.02, 0.2) if op == "QLinearAdd" else scale(rng, 0.002, 0.01)
    ins = [("a", a), ("as", scale(rng)), ("az", _zp(rng, dtype)), ("b", b), ("bs", scale(rng)),
           ("bz", _zp(rng, dtype)), ("cs", c_scale), ("cz", _zp(rng, dtype))]
    m = node_model(op, ins, consts={"as", "az", "bs", "bz", "cs", "cz"})
    check(m, {"a": a, "b": b}, tmp_path, steps=STEPS)


def test_qlinear_add_without_output_zero_point(rng, tmp_path):
    # (ONNX Runtime refuses a model without A's or B's zero point, which its schema allows)
    a, b = quantized(rng, (3, 7)), quantized(rng, (3, 7))
    m = node_model("QLinearAdd", [("a", a), ("as", scale(rng)), ("az", _zp(rng, U8)), ("b", b), ("bs", scale(rng)),
                                  ("bz", _zp(rng, U8)), ("cs", scale(rng, 0.05, 0.1))], consts={"as", "az", "bs", "bz", "cs"})
    check(m, {"a": a, "b": b}, tmp_path, steps=STEPS)


@pytest.mark.parametrize("op, attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.13})])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_unary(rng, tmp_path, op, attrs, dtype):
    x = quantized(rng, (2, 8, 5, 5), dtype)
    ys = scale(rng, 0.002, 0.005) if op == "QLinearSigmoid" else scale(rng)
    m = node_model(op, [("x", x), ("xs", scale(rng, 0.02, 0.08)), ("xz", _zp(rng, dtype)), ("ys", ys),
                        ("yz", _zp(rng, dtype))], attrs=attrs, consts={"xs", "xz", "ys", "yz"})
    check(m, {"x": x}, tmp_path, steps=STEPS)


@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 1), (11, 1)])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_softmax(rng, tmp_path, opset, axis, dtype):
    x = quantized(rng, (2, 6, 9), dtype)
    yz = np.array(0 if dtype is U8 else -128, dtype)  # what the quantizer gives softmax
    m = node_model("QLinearSoftmax", [("x", x), ("xs", scale(rng, 0.02, 0.1)), ("xz", _zp(rng, dtype)),
                                      ("ys", np.array(1 / 256, np.float32)), ("yz", yz)],
                   attrs={"axis": axis, "opset": opset}, consts={"xs", "xz", "ys", "yz"})
    check(m, {"x": x}, tmp_path, steps=STEPS)


@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_concat(rng, tmp_path, dtype):
    xs = [quantized(rng, (2, c, 4, 3), dtype) for c in (3, 5, 2)]
    ins = [("ys", scale(rng, 0.03, 0.06)), ("yz", _zp(rng, dtype))]
    consts = {"ys", "yz"}
    for i, x in enumerate(xs):
        ins += [(f"x{i}", x), (f"s{i}", scale(rng)), (f"z{i}", _zp(rng, dtype))]
        consts |= {f"s{i}", f"z{i}"}
    m = node_model("QLinearConcat", ins, attrs={"axis": 1}, consts=consts)
    check(m, {f"x{i}": x for i, x in enumerate(xs)}, tmp_path, steps=STEPS)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "channels_last": 1},
])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_average_pool(rng, tmp_path, attrs, dtype):
    x = quantized(rng, (2, 3, 7, 6), dtype)
    m = node_model("QLinearAveragePool", [("x", x), ("xs", scale(rng)), ("xz", _zp(rng, dtype)),
                                          ("ys", scale(rng)), ("yz", _zp(rng, dtype))],
                   attrs=attrs, consts={"xs", "xz", "ys", "yz"})
    check(m, {"x": x}, tmp_path, steps=STEPS)


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_global_average_pool(rng, tmp_path, channels_last, dtype):
    x = quantized(rng, (2, 5, 6, 4), dtype)
    m = node_model("QLinearGlobalAveragePool", [("x", x), ("xs", scale(rng)), ("xz", _zp(rng, dtype)),
                                                ("ys", scale(rng, 0.001, 0.01)), ("yz", _zp(rng, dtype))],
                   attrs={"channels_last": channels_last}, consts={"xs", "xz", "ys", "yz"})
    check(m, {"x": x}, tmp_path, steps=STEPS)


def test_bad_operands_are_named(rng, tmp_path):
    import onnx

    import npurun
    a, b = quantized(rng, (2, 3)), quantized(rng, (4, 5))
    m = node_model("QLinearAdd", [("a", a), ("as", scale(rng)), None, ("b", b), ("bs", scale(rng)), None,
                                  ("cs", scale(rng))], consts={"as", "bs", "cs"})
    onnx.save(m, tmp_path / "bad.onnx")
    with pytest.raises(npurun.NpurunError, match=r"node 'n0' \(com.microsoft.qlinear_add\): A \[2, 3\] and B "
                                                 r"\[4, 5\] do not broadcast"):
        npurun.load(tmp_path / "bad.onnx")
    f = rng.standard_normal((2, 3)).astype(np.float32)
    m = node_model("QLinearSigmoid", [("x", f), ("xs", scale(rng)), None, ("ys", scale(rng))], consts={"xs", "ys"})
    onnx.save(m, tmp_path / "bad2.onnx")
    with pytest.raises(npurun.NpurunError, match=r"operand X \('x'\) has dtype f32; com.microsoft.qlinear_sigmoid "
                                                 r"expects u8 or i8"):
        npurun.load(tmp_path / "bad2.onnx")
