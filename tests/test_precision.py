"""Precision modes: each emulation against an independent computation (ONNX Runtime's
QLinearConv on the same quantized tensors, or direct NumPy int64 arithmetic), the 16-bit
accumulation proof on a constructed overflow, overrides, bad input, and the .npuir text."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import npurun
from conftest import nonzero_normal
from npurun.compiler import compile
from npurun.precision import PrecisionError
from npurun.precision import quantize as q
from npurun.precision.calibrate import calibrate
from npurun.precision.overrides import parse_overrides
from ort_exact import u8_weights


def conv_graph(rng, cin=6, cout=8, k=3, group=1, w=None):
    g = npurun.Graph(name="c")
    g.add_value(npurun.ir.graph.Value("x", (1, cin, "H", "W"), "f32"))
    g.const("w", w if w is not None else nonzero_normal(rng, (cout, cin // group, k, k)) * 0.3)
    g.const("b", nonzero_normal(rng, (cout,)) * 0.1)
    g.add_value(npurun.ir.graph.Value("y", (1, cout, "H", "W"), "f32"))
    g.nodes.append(npurun.ir.graph.Node("conv", ["x", "w", "b"], ["y"], name="conv0",
                                        attrs={"pads": [1, 1, 1, 1], "group": group}))
    g.inputs, g.outputs = ["x"], ["y"]
    return g


def matmul_graph(rng, m=16, k=24, n=12, w=None):
    g = npurun.parse(f"""
        op matmul @mm (a: [B, {m}, {k}] f32, w: [{k}, {n}] f32 -> y: [B, {m}, {n}] f32)
    """)
    g.values["w"].data = w if w is not None else nonzero_normal(rng, (k, n)) * 0.2
    g.inputs = ["a"]
    return g


def feeds(rng, shape, n=2):
    return [{"x": nonzero_normal(rng, shape)} for _ in range(n)]


def run(g, feed, device="reference"):
    return list(npurun.Executor(device, parallelism=1).run_sync(g, feed).values())[0]


# ------------------------------------------------------------------ int8 vs ONNX Runtime

@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_int8_conv_is_qlinearconv(rng, group, device):
    g = compile(conv_graph(rng, group=group), precision="int8", calibration=feeds(rng, (1, 6, 16, 16)))
    assert g.nodes[0].full_op == "conv_i8"
    assert ("w8" in g.values["w"].calib) == (group == 1)  # GPTQ-rounded weights (not for grouped convs)
    x = nonzero_normal(rng, (1, 6, 9, 11)) * 1.2  # beyond the calibrated range too: saturates
    got = run(g, {"x": x}, device)
    # The same quantized tensors through ORT's QLinearConv (u8 activations, per-channel s8
    # weights, handed to ORT as u8: exact on every x86, tests/ort_exact.py).
    xs, xz = g.values["x"].calib["q8"]
    ys, yz = g.values["y"].calib["q8"]
    wq, ws = _weight_grid(g.values["w"], 0)
    bq = np.rint(g.values["b"].data.astype(np.float64) / (np.float64(np.float32(xs)) * ws)).astype(np.int32)
    xq = np.clip(np.rint(x / np.float32(xs)) + xz, 0, 255).astype(np.uint8)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (np.array(xs, np.float32), "xs"), (np.array(xz, np.uint8), "xz"), (wq.astype(np.int8), "w"),
        (ws, "ws"), (np.zeros(len(ws), np.int8), "wz"), (np.array(ys, np.float32), "ys"),
        (np.array(yz, np.uint8), "yz"), (bq, "b")]]
    node = helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                            pads=[1, 1, 1, 1], group=group)
    model = helper.make_model(helper.make_graph(
        [node], "q", [helper.make_tensor_value_info("xq", T.UINT8, xq.shape)],
        [helper.make_tensor_value_info("yq", T.UINT8, None)], inits),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    model, _ = u8_weights(model)
    yq = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"xq": xq})[0]
    want = (yq.astype(np.int64) - yz).astype(np.float32) * np.float32(ys)
    np.testing.assert_array_equal(got, want)


def _weight_grid(wv, axis):
    """(int weights, channel scales) of a weight constant: GPTQ-refined weights record their
    scales (`w8`) and lie on that grid (docs/precision.md); others take weight_params'."""
    if "w8" not in wv.calib:
        return q.weight_params(wv.data, axis)
    ws = np.asarray(wv.calib["w8"], np.float32)
    shape = [1] * wv.data.ndim
    shape[axis] = -1
    wq = np.rint(wv.data / ws.reshape(shape))
    assert np.abs(wq).max() <= 127 and np.array_equal(wq * ws.reshape(shape), wv.data)  # exactly on the grid
    return wq.astype(np.int64), ws


def _np_int_matmul(a, wv, calib_a, calib_y, bits, pair_saturate=False):
    """Direct int64 computation, written independently of npurun.precision.emulate."""
    qmax = 255 if bits == 8 else 65535
    xs, xz = calib_a[f"q{bits}"]
    ys, yz = calib_y[f"q{bits}"]
    w = wv.data
    if "w8" in wv.calib:
        wq, ws = _weight_grid(wv, 1)
    else:
        ws = np.abs(w).max(0) / np.float32(127)
        wq = np.clip(np.rint(w / ws), -127, 127).astype(np.int64)
    aq = np.clip(np.rint(a / np.float32(xs)).astype(np.int64) + xz, 0, qmax)
    if pair_saturate:  # loop over pairs: sat16(a_2j w_2j + a_2j+1 w_2j+1), summed in int64
        acc = np.zeros(a.shape[:-1] + (w.shape[1],), np.int64)
        for j in range(0, w.shape[0], 2):
            s = aq[..., j, None] * wq[j] + (aq[..., j + 1, None] * wq[j + 1] if j + 1 < w.shape[0] else 0)
            acc += np.clip(s, -32768, 32767)
        acc -= xz * wq.sum(0)
    else:
        acc = (aq - xz) @ wq
    mult = np.float64(np.float32(xs)) * ws.astype(np.float64) / np.float64(np.float32(ys))
    yq = np.clip(np.rint(acc * mult) + yz, 0, qmax)
    return (yq - yz).astype(np.float32) * np.float32(ys)


@pytest.mark.parametrize("mode,bits", [("int8", 8), ("int16", 16)])
def test_int_matmul_matches_int64_numpy(rng, mode, bits):
    a = nonzero_normal(rng, (8, 16, 24))  # 256 calibration rows: enough for GPTQ (8 * K)
    g = compile(matmul_graph(rng), precision=mode, calibration=[{"a": a}, {"a": nonzero_normal(rng, a.shape)}])
    assert g.nodes[0].precision == {"int8": "i8", "int16": "i16"}[mode] and "w8" in g.values["w"].calib
    got = run(g, {"a": a})
    want = _np_int_matmul(a, g.values["w"], g.values["a"].calib, g.values["y"].calib, bits)
    np.testing.assert_array_equal(got, want)
    f32 = a @ g.values["w"].data
    err = np.abs(got - f32).max() / np.abs(f32).max()
    assert err < (0.03 if bits == 8 else 0.01), err  # w8a16 is closer to float than w8a8


def test_int16_beats_int8_on_espcn_conv(rng):
    from npurun import zoo
    x = rng.random((1, 1, 24, 30), dtype=np.float32)
    ref = run(npurun.load(zoo.path("espcn_x3.onnx")), {"input": x})
    errs = {}
    for mode in ("int8", "int16", "fp16"):
        g = compile(zoo.path("espcn_x3.onnx"), precision=mode, calibration=[{"input": x}])
        errs[mode] = float(np.sqrt(np.mean((run(g, {"input": x}) - ref) ** 2)))
    # RMS error: w8a16 keeps int8's weight error but not its activation error.
    assert 0 < errs["fp16"] < errs["int16"] < errs["int8"] < 0.02, errs


# ------------------------------------------------------------------ GPTQ weights, fused epilogues

def conv_act_graph(rng, act, **kw):
    """conv0 (conv_graph) followed by `act` (act0): y -> z."""
    g = conv_graph(rng, **kw)
    g.add_value(npurun.ir.graph.Value("z", g.values["y"].shape, "f32"))
    g.nodes.append(npurun.ir.graph.Node(act, ["y"], ["z"], name="act0"))
    g.outputs = ["z"]
    return g


def _correlated(rng, mix, shape):
    """Inputs whose channels are correlated (mixed by `mix`): what trained layers see."""
    return np.einsum("ij,njhw->nihw", mix, nonzero_normal(rng, shape)).astype(np.float32)


def test_gptq_weights_lie_on_the_grid_and_beat_plain_rounding(rng):
    mix = nonzero_normal(rng, (16, 16))
    cal = [{"x": _correlated(rng, mix, (1, 16, 24, 24))} for _ in range(3)]  # >= 8 * K positions
    g0 = conv_graph(rng, cin=16, cout=16)
    g = compile(g0, precision="int8", calibration=cal)
    assert "GPTQ-rounded" in g.nodes[0].why and "w8" in g.values["w"].calib
    wq, ws = _weight_grid(g.values["w"], 0)  # asserts the stored weights are s * q exactly
    plain, plain_s = q.weight_params(g0.values["w"].data, 0)
    assert np.array_equal(ws, plain_s) and not np.array_equal(wq, plain)
    again = compile(g0, precision="int8", calibration=cal)  # deterministic
    assert again.values["w"].data.tobytes() == g.values["w"].data.tobytes()
    # Weight error alone, through a float conv on fresh inputs of the same distribution.
    x = {"x": _correlated(rng, mix, (1, 16, 16, 16))}
    ref = run(g0, x)

    def err(wdeq):
        g1 = conv_graph(rng, cin=16, cout=16, w=wdeq.astype(np.float32))
        g1.values["b"].data = g0.values["b"].data
        return float(np.sqrt(np.mean((run(g1, x) - ref) ** 2)))
    e_gptq, e_plain = err(wq * ws[:, None, None, None]), err(plain * plain_s[:, None, None, None])
    # measured ratio 0.66-0.83 over 40 seeds
    assert e_gptq < 0.92 * e_plain, (e_gptq, e_plain)


def test_gptq_needs_enough_positions_and_keeps_off_unsafe_acc16(rng):
    few = compile(conv_graph(rng), precision="int8", calibration=feeds(rng, (1, 6, 5, 5)))
    assert "w8" not in few.values["w"].calib and "plainly rounded (GPTQ needs" in few.nodes[0].why
    cal = [{"a": rng.random((1, 256, 256), dtype=np.float32)}]
    g = compile(_big_matmul(rng, True), precision="auto", calibration=cal, overrides="mm=int8_acc16")
    assert "w8" not in g.values["w"].calib  # the proof failed before: weights left as they were
    cal8 = [{"a": rng.random((1, 256, 256), dtype=np.float32)} for _ in range(8)]  # 8 * K rows
    safe = compile(_big_matmul(rng, False), precision="auto", calibration=cal8)
    n = safe.nodes[0]
    assert n.precision == "i8acc16"
    if "w8" in safe.values["w"].calib:       # refined weights must still pass the 16-bit proof
        assert q.acc16_overflow(_weight_grid(safe.values["w"], 1)[0].T) is None and "GPTQ-rounded" in n.why
    else:                                    # or they were put back, and the reason is unchanged
        assert "GPTQ" not in n.why


def _conv_integer(xq, xz, wq, pads, group=1):
    """ONNX Runtime's ConvInteger: u8 activations (zero point xz), s8 weights -> int32."""
    inits = [numpy_helper.from_array(wq.astype(np.int8), "w"), numpy_helper.from_array(np.array(xz, np.uint8), "xz"),
             numpy_helper.from_array(np.array(0, np.int8), "wz")]
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=pads, group=group)
    model = helper.make_model(helper.make_graph(
        [node], "q", [helper.make_tensor_value_info("x", T.UINT8, xq.shape)],
        [helper.make_tensor_value_info("y", T.INT32, None)], inits),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": xq.astype(np.uint8)})[0].astype(np.int64)


@pytest.mark.parametrize("act,fn", [("tanh", np.tanh), ("sigmoid", lambda v: 1 / (1 + np.exp(-v))),
                                    ("relu", lambda v: np.maximum(v, 0))])
@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_fused_epilogue_is_convinteger_then_activation(rng, act, fn, device):
    g = compile(conv_act_graph(rng, act), precision="int8", calibration=feeds(rng, (1, 6, 9, 11)))
    assert [n.full_op for n in g.nodes] == ["conv_i8", f"{act}_i8"]
    assert "epilogue" in g.nodes[0].why and "fused into conv0" in g.nodes[1].why
    assert "q8" not in g.values["y"].calib and "q8" in g.values["z"].calib  # one requantization
    x = nonzero_normal(rng, (1, 6, 9, 11)) * 1.2
    got = run(g, {"x": x}, device)
    xs, xz = g.values["x"].calib["q8"]
    zs, zz = g.values["z"].calib["q8"]
    wq, ws = _weight_grid(g.values["w"], 0)
    acc_scale = np.float64(np.float32(xs)) * ws.astype(np.float64)
    bq = np.rint(g.values["b"].data.astype(np.float64) / acc_scale).astype(np.int64)
    xq = np.clip(np.rint(x / np.float32(xs)) + xz, 0, 255)
    acc = _conv_integer(xq, xz, wq, [1, 1, 1, 1]) + bq[None, :, None, None]
    # the epilogue: the accumulator's real value (float32), the activation in float64, one rounding
    real = (acc * acc_scale[None, :, None, None]).astype(np.float32).astype(np.float64)
    zq = np.clip(np.rint(fn(real) / np.float64(np.float32(zs))) + zz, 0, 255)
    np.testing.assert_array_equal(got, (zq - zz).astype(np.float32) * np.float32(zs))


def test_forced_activation_is_not_fused_and_round_trips(rng, tmp_path):
    cal = feeds(rng, (1, 6, 16, 16))
    g = compile(conv_act_graph(rng, "tanh"), precision="int8", calibration=cal, overrides="act0=fp16")
    assert [n.full_op for n in g.nodes] == ["conv_i8", "tanh_f16"] and "q8" in g.values["y"].calib
    fused = compile(conv_act_graph(rng, "tanh"), precision="int8", calibration=cal)
    npurun.save(fused, tmp_path / "f.npuir")
    text = (tmp_path / "f.npuir").read_text()
    assert "op tanh_i8 @act0" in text and "w8=[" in text
    g2 = npurun.load(tmp_path / "f.npuir")
    x = nonzero_normal(rng, (1, 6, 7, 7))
    np.testing.assert_array_equal(run(g2, {"x": x}), run(fused, {"x": x}))
    # an integer activation that is not its producer's epilogue is refused, not run as float
    g2.nodes[0].precision = "f16"
    with pytest.raises(npurun.NpurunError, match="only valid as the fused epilogue"):
        npurun.Executor("reference").compile(g2)


# ------------------------------------------------------------------ fp16 / bf16

def test_fp16_is_fp16_storage_fp32_accumulation(rng):
    g = compile(matmul_graph(rng, k=300), precision="fp16", calibration="random:1")
    assert g.nodes[0].precision == "f16"
    a = nonzero_normal(rng, (1, 16, 300))
    got = run(g, {"a": a})
    w = g.values["w"].data
    a16, w16 = a.astype(np.float16).astype(np.float64), w.astype(np.float16).astype(np.float64)
    exact = a16 @ w16
    want = exact.astype(np.float16)
    assert np.array_equal(got, got.astype(np.float16).astype(np.float32))  # stored as fp16
    # fp32 sums of the fp16 products: within the fp32 summation bound (300 roundings of at most
    # 2^-24 of the running magnitude) of the exact sum, plus the final rounding to fp16 (half an
    # fp16 step). Where the sum cancels, the fp32 error can exceed one fp16 step of the small
    # result (2 steps: found on a replay), so a bound in fp16 steps alone is not a law.
    step = np.spacing(np.maximum(np.abs(want), np.abs(got).astype(np.float16))).astype(np.float64)
    bound = 0.5 * step + 300 * 2.0 ** -24 * (np.abs(a16) @ np.abs(w16))
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound * (1 + 1e-9))
    assert (got.astype(np.float16) == want).mean() > 0.9  # and nearly all round as the exact sum does
    assert not np.array_equal(got, a @ w)  # and it really is not fp32


def test_bf16_rounds_to_bfloat16(rng):
    import ml_dtypes
    g = compile(matmul_graph(rng), precision="bf16")
    a = nonzero_normal(rng, (1, 16, 24))
    got = run(g, {"a": a})
    assert np.array_equal(got, got.astype(ml_dtypes.bfloat16).astype(np.float32))


# ------------------------------------------------------------------ int8 with 16-bit accumulation

def _big_matmul(rng, pairs_overflow: bool):
    # (256, 256) @ (256, 256): 85 MACs per byte at int8, above the analyzer's 50.
    w = nonzero_normal(rng, (256, 256)) * 0.01
    if pairs_overflow:
        w[10, :] = w[11, :] = 1.0  # rows 10 and 11 form one pair: 255 * (127 + 127) > 32767
    else:
        w[1::2] = 0.0  # every pair has one weight at most: |pair sum| <= 255 * 127
    return matmul_graph(rng, m=256, k=256, n=256, w=w.astype(np.float32))


def test_acc16_never_chosen_where_a_pair_can_overflow(rng):
    cal = [{"a": rng.random((1, 256, 256), dtype=np.float32)}]
    unsafe = compile(_big_matmul(rng, True), precision="auto", calibration=cal)
    n = unsafe.nodes[0]
    assert n.precision != "i8acc16" and "could overflow" in n.why and "weight pair 5" in n.why, n.why
    safe = compile(_big_matmul(rng, False), precision="auto", calibration=cal)
    assert safe.nodes[0].precision == "i8acc16" and "proven safe" in safe.nodes[0].why
    # Where it is proven safe, 16-bit accumulation gives the int32 answer exactly.
    a = rng.random((1, 256, 256), dtype=np.float32)
    want = _np_int_matmul(a, safe.values["w"], safe.values["a"].calib, safe.values["y"].calib, 8)
    np.testing.assert_array_equal(run(safe, {"a": a}), want)


def test_forced_acc16_on_unsafe_node_shows_saturation(rng):
    cal = [{"a": rng.random((1, 256, 256), dtype=np.float32)}]
    g = compile(_big_matmul(rng, True), precision="auto", calibration=cal, overrides="mm=int8_acc16")
    assert g.nodes[0].precision == "i8acc16" and "WARNING" in g.nodes[0].why
    a = rng.random((1, 256, 256), dtype=np.float32)
    a[0, :, 10:12] = 1.0  # the activations that drive the bad pair to its bound
    got = run(g, {"a": a})
    args = (a, g.values["w"], g.values["a"].calib, g.values["y"].calib, 8)
    np.testing.assert_array_equal(got, _np_int_matmul(*args, pair_saturate=True))
    assert not np.array_equal(got, _np_int_matmul(*args))  # the saturation changed the answer


def test_acc16_saturating_conv_matches_loop(rng):
    w = nonzero_normal(rng, (4, 3, 3, 3)) * 0.05
    w[:, 0, 0, 0] = w[:, 0, 0, 1] = 0.5  # taps 0 and 1 (one pair) overflow
    g = conv_graph(rng, cin=3, cout=4, w=w.astype(np.float32))
    g = compile(g, precision="fp32", calibration=feeds(rng, (1, 3, 5, 6)), overrides="Conv=int8_acc16")
    x = np.abs(nonzero_normal(rng, (1, 3, 5, 6))) + 1.0
    got = run(g, {"x": x})
    xs, xz = g.values["x"].calib["q8"]
    ys, yz = g.values["y"].calib["q8"]
    wq, ws = _weight_grid(g.values["w"], 0)
    xq = np.clip(np.rint(x / np.float32(xs)).astype(np.int64) + xz, 0, 255)
    xp = np.pad(xq, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=xz)
    acc = np.zeros((1, 4, 5, 6), np.int64)
    bq = np.rint(g.values["b"].data.astype(np.float64) / (np.float64(np.float32(xs)) * ws)).astype(np.int64)
    for m in range(4):
        wk = wq[m].reshape(-1)
        for i in range(5):
            for j in range(6):
                xk = xp[0, :, i:i + 3, j:j + 3].reshape(-1)
                s = sum(int(np.clip(xk[t] * wk[t] + (xk[t + 1] * wk[t + 1] if t + 1 < 27 else 0), -32768, 32767))
                        for t in range(0, 27, 2))
                acc[0, m, i, j] = s - xz * wk.sum() + bq[m]
    mult = np.float64(np.float32(xs)) * ws.astype(np.float64) / np.float64(np.float32(ys))
    yq = np.clip(np.rint(acc * mult.reshape(1, -1, 1, 1)) + yz, 0, 255)
    np.testing.assert_array_equal(got, (yq - yz).astype(np.float32) * np.float32(ys))


# ------------------------------------------------------------------ the analyzer

def test_auto_keeps_sensitive_ops_in_fp32(rng):
    g = npurun.parse("""
        op softmax (x: [4, 300] f32 -> s: [4, 300] f32)
        op reduce_sum (s: [4, 300] f32 -> r: [1, 1] f32)
        op tanh (r: [1, 1] f32 -> t: [1, 1] f32)
    """)
    g = compile(g, precision="auto", calibration=[{"x": nonzero_normal(rng, (4, 300))}])
    assert [n.precision for n in g.nodes] == [None, None, "f16"]
    assert "sensitive" in g.nodes[0].why and "reduces 1200" in g.nodes[1].why
    forced = compile(g, precision="auto", calibration="random:1", overrides="Softmax=fp16")
    assert forced.nodes[0].precision == "f16" and "forced by Softmax=fp16" in forced.nodes[0].why


def test_range_beyond_fp16_stays_fp32(rng):
    g = npurun.parse("op exp (x: [8] f32 -> y: [8] f32)")
    big = {"x": np.linspace(1, 12, 8, dtype=np.float32)}  # e^12 = 162755 > 65504
    for policy in ("auto", "fp16"):
        n = compile(g, precision=policy, calibration=[big]).nodes[0]
        assert n.precision is None and "does not fit fp16" in n.why, n.why
    small = compile(g, precision="auto", calibration=[{"x": big["x"] / 4}]).nodes[0]
    assert small.precision == "f16"


def test_every_node_states_a_reason(rng):
    from npurun import zoo
    for policy in ("auto", "fp32", "fp16", "int8", "int8_acc16", "int16", "bf16"):
        g = compile(zoo.path("espcn_x3.onnx"), precision=policy, calibration="random:1")
        assert all(n.why for n in g.nodes), policy


# ------------------------------------------------------------------ overrides

def test_override_parsing_and_matching(rng):
    assert parse_overrides("Conv=int8, /blocks.3/*=fp16") == [("Conv", "i8"), ("/blocks.3/*", "f16")]
    g = conv_graph(rng)
    g2 = compile(g, precision="fp32", calibration=feeds(rng, (1, 6, 5, 5)), overrides="conv=int16")
    assert g2.nodes[0].precision == "i16"
    g3 = compile(g, precision="fp32", calibration=feeds(rng, (1, 6, 5, 5)), overrides="conv*=fp16")
    assert g3.nodes[0].precision == "f16"
    with pytest.raises(PrecisionError, match="'Gemm'.*no node matches"):
        compile(g, precision="auto", overrides="Gemm=int8")
    with pytest.raises(PrecisionError, match="'/blocks.9/\\*'.*no node matches"):
        compile(g, precision="auto", overrides="/blocks.9/*=fp16")
    with pytest.raises(PrecisionError, match="unknown precision 'int7'"):
        compile(g, precision="auto", overrides="Conv=int7")
    with pytest.raises(PrecisionError, match="expected KEY=PRECISION"):
        parse_overrides("Conv")


def test_integer_forced_on_non_mac_node_falls_back_and_says_so(rng):
    g = compile(npurun.load(npurun.zoo.path("espcn_x3.onnx")), calibration="random:1", overrides="Tanh=int8")
    n = g.nodes[1]
    assert n.precision == "f16" and "no integer kernel" in n.why and "fallback" in n.why


# ------------------------------------------------------------------ bad input

def test_calibration_folder_with_wrong_shapes(tmp_path, rng):
    from npurun import zoo
    np.save(tmp_path / "a.npy", rng.random((1, 1, 8, 8), dtype=np.float32))
    np.save(tmp_path / "b.npy", rng.random((1, 3, 8, 8), dtype=np.float32))
    with pytest.raises(PrecisionError, match=r"b\.npy.*shape \[1, 3, 8, 8\]"):
        compile(zoo.path("espcn_x3.onnx"), calibration=str(tmp_path))
    with pytest.raises(PrecisionError, match="not a folder"):
        compile(zoo.path("espcn_x3.onnx"), calibration=str(tmp_path / "nope"))
    with pytest.raises(PrecisionError, match="random:N"):
        compile(zoo.path("espcn_x3.onnx"), calibration="random:0")


def test_non_finite_ranges_are_an_error(rng):
    g = npurun.parse("op exp (x: [4] f32 -> y: [4] f32)")
    with pytest.raises(PrecisionError, match="'y' holds inf or NaN"):
        calibrate(g, [{"x": np.array([1, 2, 100, 3], np.float32)}])


def _dynamic_quantize(x):
    """ONNX Runtime's DynamicQuantizeLinear: (x_q u8, scale, zero point)."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])
    model = helper.make_model(helper.make_graph(
        [node], "d", [helper.make_tensor_value_info("x", T.FLOAT, x.shape)],
        [helper.make_tensor_value_info(n, t, None) for n, t in (("q", T.UINT8), ("s", T.FLOAT), ("z", T.UINT8))]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xq, xs, xz = sess.run(None, {"x": x})
    return xq.astype(np.int64), np.float32(xs), int(xz)


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_uncalibrated_integer_node_is_quantized_dynamically(rng, device):
    """A hand-written conv_i8 with no ranges runs as DynamicQuantizeLinear -> ConvInteger ->
    scale (what the ort and torch backends export): checked against ONNX Runtime's ops."""
    g = conv_graph(rng)
    g.nodes[0].precision = "i8"
    x = nonzero_normal(rng, (1, 6, 7, 9))
    got = run(g, {"x": x}, device)
    xq, xs, xz = _dynamic_quantize(x)
    wq, ws = q.weight_params(g.values["w"].data, 0)
    acc_scale = np.float64(xs) * ws.astype(np.float64)
    bq = np.rint(g.values["b"].data.astype(np.float64) / acc_scale).astype(np.int64)
    acc = _conv_integer(xq, xz, wq, [1, 1, 1, 1]) + bq[None, :, None, None]
    want = (acc * acc_scale[None, :, None, None]).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    g.nodes[0].precision = None  # and it really is not the float result
    assert not np.array_equal(got, run(g, {"x": x}))


# ------------------------------------------------------------------ the .npuir text

def test_ranges_and_reasons_round_trip(rng, tmp_path):
    g = compile(conv_graph(rng), precision="int8", calibration=feeds(rng, (1, 6, 7, 7)))
    npurun.save(g, tmp_path / "c.npuir")
    text = (tmp_path / "c.npuir").read_text()
    assert 'op conv_i8 @conv0' in text and 'why="int8 requested' in text
    assert "range x min=" in text and "q8=[" in text and "mse_min=" in text and "pmax=" in text
    g2 = npurun.load(tmp_path / "c.npuir")
    assert g2 == g and npurun.print_graph(g2) == npurun.print_graph(g)
    x = nonzero_normal(rng, (1, 6, 7, 7))
    np.testing.assert_array_equal(run(g2, {"x": x}), run(g, {"x": x}))


def test_range_statement_errors():
    with pytest.raises(npurun.errors.ParseError, match="range of 'z': no such value"):
        npurun.parse("op relu (x: [2] f32 -> y: [2] f32)\nrange z min=0.0 max=1.0\n")
    with pytest.raises(npurun.errors.ParseError, match="why= takes a string"):
        npurun.parse("op relu (x: [2] f32 -> y: [2] f32) why=3\n")


# ------------------------------------------------------------------ a QDQ model keeps its own scales

def test_qdq_model_keeps_its_scales(rng, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    w1, w2 = nonzero_normal(rng, (8, 3, 3, 3)) * 0.3, nonzero_normal(rng, (4, 8, 3, 3)) * 0.2
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 10, 12])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 10, 12])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    import onnx
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "f.onnx")
    samples = [{"x": nonzero_normal(rng, (1, 3, 10, 12))} for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)
    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    qmodel = onnx.load(tmp_path / "q.onnx")
    scales = {i.name: numpy_helper.to_array(i) for i in qmodel.graph.initializer if "scale" in i.name or "zero_point" in i.name}
    assert len(scales) >= 6
    g = compile(str(tmp_path / "q.onnx"), precision="auto", calibration=samples)
    # Activation scales and zero points exactly as the model has them; weight DequantizeLinear
    # nodes are folded at import into float weights equal to (w_q - zp) * scale bit for bit.
    kept = [k for k in scales if k in g.values]
    assert len(kept) >= 4 and any(k.startswith("x") for k in kept), kept
    for name in kept:
        assert g.values[name].is_const and g.values[name].data.tobytes() == scales[name].tobytes(), name
    inits = {i.name: numpy_helper.to_array(i) for i in qmodel.graph.initializer}
    conv_ws = [g.values[n.inputs[1]].data for n in g.nodes if n.op == "conv"]
    for w, k in zip(conv_ws, ("w1", "w2")):
        deq = ((inits[f"{k}_quantized"].astype(np.int32) - inits[f"{k}_zero_point"].astype(np.int32)
                ).astype(np.float32) * inits[f"{k}_scale"].reshape(-1, 1, 1, 1))
        assert w.tobytes() == deq.astype(np.float32).tobytes()
    for n in g.nodes:
        assert n.precision is None and ("own" in n.why or "exact" in n.why), (n.label(), n.why)
    x = nonzero_normal(rng, (1, 3, 10, 12))
    # ORT runs the model as written (its optimizer would fuse DQ-Conv-Q into an integer conv,
    # u8 x s8, which saturates on x86 without VNNI: tests/ort_exact.py); npurun runs the float
    # conv between them too, in another summation order: the results may round to
    # neighbouring steps of the output's own grid, never further.
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(tmp_path / "q.onnx"), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run(g, {"x": x}, "cpu")
    step = float(scales[next(k for k in scales if k.startswith("y") and "scale" in k)])
    assert np.abs(got - want).max() <= step * 1.01 and (np.abs(got - want) < step / 2).mean() > 0.95
