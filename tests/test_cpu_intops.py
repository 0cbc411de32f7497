"""The cpu backend's integer matmul/conv kernels (cpu/ops/intops.py: MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv through float BLAS) against the reference kernels,
bit for bit, on fresh random integer inputs: u8/s8 operands, zero points absent, per tensor,
per row / per column / per output channel, reductions long enough to be split into float32
runs, and sums that wrap int32 (as the reference's int64 -> int32 cast does)."""
from types import SimpleNamespace

import numpy as np
import pytest

from npurun.backends.cpu.ops import FACTORIES, intops
from npurun.backends.reference.kernels import KERNELS as REF
from ort_exact import u8_weights

U8, S8 = np.uint8, np.int8


class _Graph:
    def __init__(self, consts=()):
        self.consts, self.nodes = [SimpleNamespace(data=c) for c in consts], []

    def constants(self):
        return self.consts


def _program(*consts):
    return SimpleNamespace(graph=_Graph(consts), threads=1)


def _ints(rng, shape, dt):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape).astype(dt)


def _zp(rng, kind, n, dt):
    """A zero point: None, per tensor (scalar) or one per row/column/channel (n,), never all 0."""
    if kind is None:
        return None
    z = _ints(rng, () if kind == "tensor" else (n,), dt)
    return np.where(z == 0, np.array(3, dt), z).astype(dt)


MM_CASES = [  # (a shape, b shape, a dtype, b dtype, a zp kind, b zp kind)
    ((7, 5), (5, 9), U8, S8, "tensor", "tensor"),
    ((128, 384), (384, 96), U8, S8, "tensor", "vector"),  # K=384 at bound 255*255: 2 runs
    ((3, 4, 33), (33, 17), S8, S8, None, "tensor"),
    ((2, 6, 700), (2, 700, 5), U8, U8, "vector", "vector"),  # batched, per-row a zp, 3 runs
    ((16, 300), (300, 8), S8, U8, "tensor", None),
    ((1, 1), (1, 4), U8, S8, None, None),
]


@pytest.mark.parametrize("ash,bsh,adt,bdt,azk,bzk", MM_CASES)
def test_matmul_integer_matches_reference(rng, ash, bsh, adt, bdt, azk, bzk):
    a, b = _ints(rng, ash, adt), _ints(rng, bsh, bdt)
    azp, bzp = _zp(rng, azk, ash[-2], adt), _zp(rng, bzk, bsh[-1], bdt)
    fast = FACTORIES["matmul_integer"](_program(b, bzp))
    want = REF["matmul_integer"](a, b, azp, bzp)
    for _ in range(2):  # the second run reads the cached float copy of the constant b
        got = fast(a, b, azp, bzp)
        assert got.dtype == np.int32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_matmul_integer_wraps_like_reference(rng):
    # ~228**2 * 60000 > 2**31: the int32 result wraps; 233 float32 runs added in float64
    a = rng.integers(200, 256, (2, 60000)).astype(U8)
    b = rng.integers(200, 256, (60000, 3)).astype(U8)
    want = REF["matmul_integer"](a, b)
    got = intops._matmul_integer(intops._Consts(_program()))(a, b)
    assert (np.abs(a.astype(np.int64) @ b.astype(np.int64)) > 2**31).any()
    np.testing.assert_array_equal(got, want)


def test_matmul_integer_other_dtypes_use_reference(rng):
    a = rng.integers(-9, 9, (4, 6)).astype(np.int32)  # not int8/u8: the reference kernel
    b = rng.integers(-9, 9, (6, 3)).astype(np.int32)
    got = FACTORIES["matmul_integer"](_program())(a, b)
    np.testing.assert_array_equal(got, REF["matmul_integer"](a, b))


@pytest.mark.parametrize("ash,bsh,adt,bdt,azk,bzk", MM_CASES[:4])
def test_qlinear_matmul_matches_reference(rng, ash, bsh, adt, bdt, azk, bzk):
    a, b = _ints(rng, ash, adt), _ints(rng, bsh, bdt)
    azp = _zp(rng, azk or "tensor", ash[-2], adt)
    bzp = _zp(rng, bzk or "tensor", bsh[-1], bdt)
    a_s = np.float32(rng.uniform(0.01, 0.05, azp.shape))
    b_s = np.float32(rng.uniform(0.01, 0.05, bzp.shape))
    y_s = np.array(rng.uniform(0.5, 2.0), np.float32) * np.float32(ash[-1] ** 0.5)
    y_zp = np.array(rng.integers(1, 200), U8)
    ins = (a, np.asarray(a_s, np.float32), azp, b, np.asarray(b_s, np.float32), bzp, y_s, y_zp)
    got = FACTORIES["qlinear_matmul"](_program(b))(*ins)
    want = REF["qlinear_matmul"](*ins)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def _window(ks, strides=None, pads=None, group=1, dilations=None):
    n = len(ks)
    return {"kernel_shape": list(ks), "strides": strides or [1] * n, "pads": pads or [0] * (2 * n),
            "dilations": dilations or [1] * n, "group": group, "auto_pad": "NOTSET"}


CONV_CASES = [  # (x shape, w shape, x dtype, w dtype, w zp kind, window)
    ((1, 3, 9, 11), (8, 3, 3, 3), U8, S8, "vector", _window([3, 3], pads=[1, 1, 1, 1])),
    ((2, 64, 7, 6), (16, 64, 3, 3), U8, U8, "tensor", _window([3, 3], strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 300, 5, 5), (4, 300, 1, 1), S8, S8, None, _window([1, 1])),  # 300 channels: 2 runs
    ((1, 8, 6, 6), (8, 2, 3, 3), U8, S8, "vector", _window([3, 3], pads=[1, 1, 1, 1], group=4)),
    ((1, 4, 20), (6, 4, 5), U8, S8, "tensor", _window([5], dilations=[2], pads=[2, 3])),
]


@pytest.mark.parametrize("xsh,wsh,xdt,wdt,wzk,window", CONV_CASES)
def test_conv_integer_matches_reference(rng, xsh, wsh, xdt, wdt, wzk, window):
    x, w = _ints(rng, xsh, xdt), _ints(rng, wsh, wdt)
    xzp, wzp = _zp(rng, "tensor", 1, xdt), _zp(rng, wzk, wsh[0], wdt)
    got = FACTORIES["conv_integer"](_program())(x, w, xzp, wzp, **window)
    want = REF["conv_integer"](x, w, xzp, wzp, **window)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("xsh,wsh,xdt,wdt,wzk,window", CONV_CASES[:4])
def test_qlinear_conv_matches_reference(rng, xsh, wsh, xdt, wdt, wzk, window):
    x, w = _ints(rng, xsh, xdt), _ints(rng, wsh, wdt)
    xzp, wzp = _zp(rng, "tensor", 1, xdt), _zp(rng, wzk or "tensor", wsh[0], wdt)
    w_s = np.asarray(rng.uniform(0.005, 0.02, wzp.shape), np.float32)
    bias = rng.integers(-5000, 5000, wsh[0]).astype(np.int32)
    taps = int(np.prod(wsh[1:]))
    ins = (x, np.array(0.02, np.float32), xzp, w, w_s, wzp,
           np.array(0.05 * taps ** 0.5, np.float32), np.array(rng.integers(-20, 20), S8), bias)
    got = FACTORIES["qlinear_conv"](_program(w))(*ins, **window)
    want = REF["qlinear_conv"](*ins, **window)
    assert got.dtype == want.dtype == np.int8
    np.testing.assert_array_equal(got, want)


def _onnx(op, inputs, consts, attrs, out_type, opset):
    from onnx import helper, numpy_helper
    names = list(inputs) + list(consts)
    g = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], f"case_{op}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_cpu_backend_runs_integer_models_like_onnxruntime(rng):
    # Whole models on the cpu backend (the kernels of intops.py, constant weights cached)
    # against ONNX Runtime, bit for bit, over several runs.
    import onnxruntime as ort
    from onnx import TensorProto

    import npurun
    from npurun.frontend.onnx import import_model
    mm_consts = {"b": _ints(rng, (300, 40), S8), "za": np.array(131, U8), "zb": _zp(rng, "vector", 40, S8)}
    qc_consts = {"xs": np.array(0.02, np.float32), "xz": np.array(117, U8), "w": _ints(rng, (9, 6, 3, 3), S8),
                 "ws": np.asarray(rng.uniform(0.001, 0.003, 9), np.float32), "wz": np.zeros(9, S8),
                 "ys": np.array(0.2, np.float32), "yz": np.array(100, U8),
                 "bias": rng.integers(-5000, 5000, 9).astype(np.int32)}
    cases = [("MatMulInteger", {"a": (2, 8, 300)}, mm_consts, {}, TensorProto.INT32, 10),
             ("QLinearConv", {"x": (1, 6, 10, 9)}, qc_consts, {"pads": [1, 1, 1, 1], "strides": [2, 1]},
              TensorProto.UINT8, 10)]
    exe = npurun.Executor("cpu", parallelism=1)
    for op, shapes, consts, attrs, out, opset in cases:
        model = _onnx(op, {k: np.zeros(s, U8) for k, s in shapes.items()}, consts, attrs, out, opset)
        oracle, _ = u8_weights(model)  # int8 weights as uint8 for ORT: exact on every x86 (tests/ort_exact.py)
        sess = ort.InferenceSession(oracle.SerializeToString(), providers=["CPUExecutionProvider"])
        graph = import_model(model)
        (step,) = exe.compile(graph).steps
        assert step[1] is not REF[step[0].op]  # the cpu kernel, not the reference
        for _ in range(3):
            feeds = {k: _ints(rng, s, U8) for k, s in shapes.items()}
            want = sess.run(None, feeds)[0]
            got = exe.run_sync(graph, feeds)["y"]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_only_constant_weights_are_cached(rng):
    # b an input (not a graph constant): changed in place between runs, the result follows it
    a, b = _ints(rng, (6, 20), U8), _ints(rng, (20, 7), S8)
    fast = FACTORIES["matmul_integer"](_program())
    np.testing.assert_array_equal(fast(a, b), REF["matmul_integer"](a, b))
    b[:] = _ints(rng, b.shape, S8)
    np.testing.assert_array_equal(fast(a, b), REF["matmul_integer"](a, b))
