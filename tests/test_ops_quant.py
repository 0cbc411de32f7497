"""Cast, quantization, integer products, BitCast and the string ops against ONNX Runtime, on
fresh random inputs. Integer (and 8-bit float bit pattern) results are compared exactly.

ORT takes 8/4/2-bit typed tensors only as initializers and returns 8-bit floats as their raw
bytes, so such operands are initializers here and results of those types are compared bit for
bit; 4/2-bit and e8m0 results go through a second, exact Cast to a type ORT can return.
"""
import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from conftest import nonzero_normal
from ort_exact import u8_weights
from npurun.frontend.onnx import import_model

T = TensorProto


def _model(op, inputs, consts, attrs, opset, out_types, then_cast=None, domain=""):
    names = [k for k in list(inputs) + list(consts)]
    outs = [f"y{i}" for i in range(len(out_types))]
    nodes = [helper.make_node(op, [n if not n.startswith("_absent") else "" for n in names],
                              outs if then_cast is None else ["t"], **attrs)]
    if then_cast is not None:  # an exact second cast to a type ORT can hand back
        nodes.append(helper.make_node("Cast", ["t"], outs, to=then_cast))
        out_types = [then_cast]
    g = helper.make_graph(
        nodes, f"case_{op}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if not k.startswith("_absent")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid(domain, opset)], ir_version=10)


def check(op, inputs, consts=None, attrs=None, opset=21, out_types=(T.FLOAT,), then_cast=None):
    """npurun's reference backend against ONNX Runtime on a one-node model (int8 weights of
    integer products given to ORT as uint8: exact on every x86, tests/ort_exact.py)."""
    consts = consts or {}
    model = _model(op, inputs, consts, attrs or {}, opset, list(out_types), then_cast)
    oracle, ofeeds = u8_weights(model, inputs)
    want = ort.InferenceSession(oracle.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, ofeeds)
    got = npurun.Executor("reference", parallelism=1).run_sync(import_model(model), inputs)
    assert len(got) == len(want)
    for g, w in zip(got.values(), want):
        if g.dtype.isbuiltin == 2 and w.dtype == np.uint8:  # ORT: 8-bit floats as raw bytes
            g = g.view(np.uint8)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=0)
        else:
            np.testing.assert_array_equal(g, w)
    return got


def _wide(rng, shape):
    """Values over several binades, signs mixed, some beyond the 8-bit floats' range."""
    x = nonzero_normal(rng, shape) * np.float32(2.0) ** rng.integers(-12, 18, shape)
    return x.astype(np.float32)


# ------------------------------------------------------------------ Cast / CastLike

F8 = [T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ]


def _f8_out(to):
    """(out_types, then_cast): ORT hands back e4m3fn as bytes, the other 8-bit floats not at all."""
    return ([to], None) if to == T.FLOAT8E4M3FN else ([T.FLOAT], T.FLOAT)


@pytest.mark.parametrize("to", F8)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", [np.float32, np.float16])
def test_cast_to_float8(rng, to, saturate, src):
    x = _wide(rng, (4, 37)).astype(src)
    x.flat[:4] = [np.inf, -np.inf, np.nan, -0.0]
    if not saturate:
        # Just past the largest value ORT strays from the ONNX table (e4m3fn: 480 -> 448, the
        # table says NaN; e5m2: 63520 -> NaN, the table says inf). npurun follows the table
        # (the node suite checks that); keep random inputs clear of that band.
        big = float(ml_dtypes.finfo(helper.tensor_dtype_to_np_dtype(to)).max)
        x = np.where((np.abs(x) > big) & (np.abs(x) <= 2 * big), x / 4, x).astype(src)
    outs, back = _f8_out(to)
    check("Cast", {"x": x}, attrs={"to": to, "saturate": saturate}, opset=19, out_types=outs, then_cast=back)


@pytest.mark.parametrize("to", F8)
def test_castlike_to_float8(rng, to):
    like = np.zeros(1, helper.tensor_dtype_to_np_dtype(to))
    outs, back = _f8_out(to)
    check("CastLike", {"x": _wide(rng, (3, 11))}, {"like": like}, opset=19, out_types=outs, then_cast=back)


@pytest.mark.parametrize("src", F8)
@pytest.mark.parametrize("to", [T.FLOAT, T.FLOAT16])
def test_cast_from_float8(rng, src, to):
    bits = rng.integers(0, 256, (5, 9)).astype(np.uint8)
    c = bits.view(helper.tensor_dtype_to_np_dtype(src))
    check("Cast", {}, {"c": c}, {"to": to}, opset=19, out_types=[to])


@pytest.mark.parametrize("src,dt", [(T.INT4, ml_dtypes.int4), (T.UINT4, ml_dtypes.uint4)])
@pytest.mark.parametrize("to", [T.FLOAT, T.INT8, T.INT32])
def test_cast_from_int4(rng, src, dt, to):
    lo, hi = (-8, 8) if src == T.INT4 else (0, 16)
    c = rng.integers(lo, hi, (3, 7)).astype(dt)
    check("Cast", {}, {"c": c}, {"to": to}, opset=21, out_types=[to])


@pytest.mark.parametrize("to", [T.INT4, T.UINT4])
def test_cast_to_int4_wraps(rng, to):
    x = (rng.integers(-40, 40, (4, 9)) + rng.random((4, 9)) * 0.9).astype(np.float32)
    back = T.INT8 if to == T.INT4 else T.UINT8
    check("Cast", {"x": x}, attrs={"to": to}, opset=21, out_types=[back], then_cast=back)


def test_cast_to_int4_from_ints(rng):
    x = rng.integers(-1000, 1000, (5, 6)).astype(np.int32)
    check("Cast", {"x": x}, attrs={"to": T.INT4}, opset=21, out_types=[T.INT8], then_cast=T.INT8)


@pytest.mark.parametrize("src,to", [(np.float32, T.INT8), (np.float64, T.INT32), (np.float32, T.UINT8),
                                    (np.int64, T.INT8), (np.int32, T.UINT16), (np.int64, T.FLOAT16),
                                    (np.float32, T.BFLOAT16), (np.float32, T.BOOL), (np.uint8, T.INT8)])
def test_cast_standard_types(rng, src, to):
    x = (nonzero_normal(rng, (3, 8)) * 100).astype(np.float64)
    if np.dtype(src).kind != "f" or to in (T.UINT8,):
        x = np.abs(x) if to == T.UINT8 or np.dtype(src).kind == "u" else x
        x = np.trunc(x).astype(src) if np.dtype(src).kind != "f" else x.astype(src)
    else:
        x = x.astype(src)
    if to in (T.INT8, T.UINT8) and np.dtype(src).kind == "f":  # float -> int is defined in range only
        x = np.clip(x, 0 if to == T.UINT8 else -128, 127).astype(src)
    back = T.FLOAT if to == T.BFLOAT16 else None  # ORT cannot hand back bf16
    check("Cast", {"x": x}, attrs={"to": to}, opset=19, out_types=[back or to], then_cast=back)


@pytest.mark.parametrize("src", [np.float32, np.float64, np.int64, np.int32, np.int8])
def test_cast_to_string(rng, src):
    x = (nonzero_normal(rng, (2, 9)) * 1000).astype(src)
    check("Cast", {"x": x}, attrs={"to": T.STRING}, opset=19, out_types=[T.STRING])


@pytest.mark.parametrize("to", [T.FLOAT, T.DOUBLE, T.INT64, T.INT32])
def test_cast_from_string(rng, to):
    v = rng.integers(-10 ** 6, 10 ** 6, (3, 5))
    x = np.array([str(int(i)) for i in v.flat], dtype=object).reshape(v.shape)
    if to in (T.FLOAT, T.DOUBLE):
        x.flat[0], x.flat[1], x.flat[2], x.flat[3] = "1.5e-3", "-INF", "NaN", "inf"
    check("Cast", {"x": x}, attrs={"to": to}, opset=19, out_types=[to])


# ------------------------------------------------------------------ Quantize / Dequantize

def _scale(rng, shape, dtype=np.float32):
    return (np.abs(nonzero_normal(rng, shape)) * 0.05 + 0.01).astype(dtype)


@pytest.mark.parametrize("qt,dt", [(T.UINT8, np.uint8), (T.INT8, np.int8), (T.INT16, np.int16),
                                   (T.UINT16, np.uint16)])
@pytest.mark.parametrize("opset", [13, 19, 21])
def test_quantize_per_tensor(rng, qt, dt, opset):
    if opset < 21 and dt in (np.int16, np.uint16):
        pytest.skip("16-bit quantization arrived in opset 21")
    x = nonzero_normal(rng, (3, 4, 5)) * 4
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    zp = np.array(rng.integers(max(lo, -20), min(hi, 20) + 1 if lo < 0 else 40), dt)
    s = np.array(_scale(rng, ()))
    x.flat[:3] = [np.float32(s * 2.5), np.float32(s * -1.5), np.float32(s * 1e6)]  # ties, saturation
    check("QuantizeLinear", {"x": x}, {"s": s, "z": zp}, opset=opset, out_types=[qt])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis(rng, axis):
    x = nonzero_normal(rng, (4, 6, 5)) * 3
    n = x.shape[axis]
    check("QuantizeLinear", {"x": x}, {"s": _scale(rng, (n,)), "z": rng.integers(-10, 10, n).astype(np.int8)},
          {"axis": axis}, opset=13, out_types=[T.INT8])


@pytest.mark.parametrize("axis,block", [(1, 2), (0, 3), (-1, 4)])
def test_quantize_blocked(rng, axis, block):
    x = nonzero_normal(rng, (6, 8, 7)) * 3
    sshape = list(x.shape)
    sshape[axis] = -(-x.shape[axis] // block)
    check("QuantizeLinear", {"x": x}, {"s": _scale(rng, sshape), "z": rng.integers(0, 30, sshape).astype(np.uint8)},
          {"axis": axis, "block_size": block}, opset=21, out_types=[T.UINT8])


def test_quantize_without_zero_point_is_uint8(rng):
    check("QuantizeLinear", {"x": np.abs(nonzero_normal(rng, (5, 6)))}, {"s": np.array(0.02, np.float32)},
          opset=13, out_types=[T.UINT8])


@pytest.mark.parametrize("qt", [T.FLOAT8E4M3FN, T.FLOAT8E5M2])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(rng, qt, saturate):
    x = _wide(rng, (4, 9))
    if not saturate:  # see test_cast_to_float8: scale 0.5 doubles x
        big = float(ml_dtypes.finfo(helper.tensor_dtype_to_np_dtype(qt)).max) / 2
        x = np.where((np.abs(x) > big) & (np.abs(x) <= 2 * big), x / 4, x).astype(np.float32)
    zp = np.zeros((), helper.tensor_dtype_to_np_dtype(qt))
    outs, back = _f8_out(qt)
    check("QuantizeLinear", {"x": x}, {"s": np.array(0.5, np.float32), "z": zp}, {"saturate": saturate},
          opset=19, out_types=outs, then_cast=back)


@pytest.mark.parametrize("qt,dt,back", [(T.INT4, ml_dtypes.int4, T.INT8), (T.UINT4, ml_dtypes.uint4, T.UINT8)])
def test_quantize_int4(rng, qt, dt, back):
    x = nonzero_normal(rng, (4, 6)) * 2
    zp = np.array(rng.integers(-3, 3) if qt == T.INT4 else rng.integers(2, 9)).astype(dt)
    check("QuantizeLinear", {"x": x}, {"s": np.array(0.3, np.float32), "z": zp}, opset=21,
          out_types=[back], then_cast=back)


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.int32, np.int16])
@pytest.mark.parametrize("axis", [None, 1])
def test_dequantize(rng, dt, axis):
    info = np.iinfo(dt)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000), (3, 5, 4)).astype(dt)
    n = () if axis is None else (x.shape[axis],)
    consts = {"s": _scale(rng, n)}
    if dt != np.int32:
        consts["z"] = rng.integers(max(info.min, -50), min(info.max, 50), n).astype(dt)
    check("DequantizeLinear", {"x": x}, consts, {} if axis is None else {"axis": axis}, opset=21)


def test_dequantize_blocked(rng):
    x = rng.integers(0, 256, (4, 10)).astype(np.uint8)
    check("DequantizeLinear", {"x": x}, {"s": _scale(rng, (4, 3)), "z": rng.integers(0, 255, (4, 3)).astype(np.uint8)},
          {"axis": 1, "block_size": 4}, opset=21)


@pytest.mark.parametrize("src", [T.FLOAT8E4M3FN, T.FLOAT8E5M2, T.INT4, T.UINT4])
def test_dequantize_small_types(rng, src):
    dt = helper.tensor_dtype_to_np_dtype(src)
    if src in (T.INT4, T.UINT4):
        lo, hi = (-8, 8) if src == T.INT4 else (0, 16)
        x, zp = rng.integers(lo, hi, (3, 6)).astype(dt), np.array(rng.integers(lo, hi)).astype(dt)
    else:
        x = (rng.integers(0, 256, (3, 6)).astype(np.uint8) & 0x7E | 0x10).view(dt)  # finite values
        zp = np.zeros((), dt)
    check("DequantizeLinear", {}, {"x": x, "s": np.array(0.37, np.float32), "z": zp}, opset=21)


def test_dynamic_quantize(rng):
    for shape in [(7,), (3, 4), (2, 3, 5)]:
        x = nonzero_normal(rng, shape) * 3
        check("DynamicQuantizeLinear", {"x": x}, opset=11, out_types=[T.UINT8, T.FLOAT, T.UINT8])
    check("DynamicQuantizeLinear", {"x": np.abs(nonzero_normal(rng, (9,)))}, opset=11,
          out_types=[T.UINT8, T.FLOAT, T.UINT8])


# ------------------------------------------------------------------ integer products

@pytest.mark.parametrize("adt,bdt", [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)])
@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((2, 4, 6), (6, 5)), ((6,), (6, 4))])
def test_matmul_integer(rng, adt, bdt, shapes):
    ia, ib = np.iinfo(adt), np.iinfo(bdt)
    a = rng.integers(ia.min, ia.max + 1, shapes[0]).astype(adt)
    b = rng.integers(ib.min, ib.max + 1, shapes[1]).astype(bdt)
    za = np.array(rng.integers(ia.min, ia.max + 1), adt)
    zb = rng.integers(ib.min, ib.max + 1, (shapes[1][-1],)).astype(bdt)  # per column
    check("MatMulInteger", {"a": a, "b": b}, {"za": za, "zb": zb}, opset=10, out_types=[T.INT32])
    check("MatMulInteger", {"a": a, "b": b}, opset=10, out_types=[T.INT32])


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("shapes", [((4, 9), (9, 5)), ((2, 3, 4, 6), (6, 7))])
def test_qlinear_matmul(rng, dt, shapes):
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max + 1, shapes[0]).astype(dt)
    b = rng.integers(info.min, info.max + 1, shapes[1]).astype(dt)
    z = lambda: np.array(rng.integers(info.min // 4, info.max // 4), dt)  # noqa: E731
    consts = {"as": _scale(rng, ()), "az": z(), "b": b, "bs": _scale(rng, ()), "bz": z(),
              "ys": np.array(rng.uniform(0.5, 3), np.float32), "yz": z()}
    qt = T.UINT8 if dt == np.uint8 else T.INT8
    check("QLinearMatMul", {"a": a}, consts, opset=21, out_types=[qt])


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 1, 1, 1]}, {"strides": [2, 1], "pads": [0, 1, 1, 0]},
                                   {"group": 2, "dilations": [2, 2]}])
def test_conv_integer(rng, attrs):
    x = rng.integers(0, 256, (2, 4, 9, 8)).astype(np.uint8)
    w = rng.integers(0, 256, (6, 4 // attrs.get("group", 1), 3, 3)).astype(np.uint8)
    consts = {"w": w, "xz": np.array(rng.integers(0, 256), np.uint8), "wz": np.array(rng.integers(0, 256), np.uint8)}
    check("ConvInteger", {"x": x}, consts, attrs, opset=10, out_types=[T.INT32])


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, {"group": 3}])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_qlinear_conv(rng, attrs, per_channel, bias):
    x = rng.integers(0, 256, (1, 6, 8, 7)).astype(np.uint8)
    w = rng.integers(-128, 128, (9, 6 // attrs.get("group", 1), 3, 3)).astype(np.int8)
    ws = _scale(rng, (9,) if per_channel else ()) * 0.1
    consts = {"xs": np.array(0.02, np.float32), "xz": np.array(rng.integers(0, 256), np.uint8),
              "w": w, "ws": ws, "wz": np.zeros((9,) if per_channel else (), np.int8),
              "ys": np.array(rng.uniform(0.05, 0.3), np.float32), "yz": np.array(rng.integers(0, 256), np.uint8)}
    if bias:
        consts["b"] = rng.integers(-5000, 5000, 9).astype(np.int32)
    check("QLinearConv", {"x": x}, consts, attrs, opset=10, out_types=[T.UINT8])


# ------------------------------------------------------------------ BitCast

@pytest.mark.parametrize("src,to", [(np.float32, T.INT32), (np.int32, T.FLOAT), (np.float64, T.UINT64),
                                    (np.uint16, T.FLOAT16), (np.int8, T.UINT8)])
def test_bitcast(rng, src, to):  # ORT has no bool BitCast; the node suite covers it
    x = (nonzero_normal(rng, (3, 5)) * 1000).astype(np.float64)
    x = (x > 0) if src == np.bool_ else x.astype(src)
    check("BitCast", {"x": x}, attrs={"to": to}, opset=26, out_types=[to])
    check("BitCast", {"x": np.array(x[0, 0])}, attrs={"to": to}, opset=26, out_types=[to])  # 0-d


# ------------------------------------------------------------------ strings

WORDS = ["monday", "Tuesday", "MONDAY", "wed", "", "Ünïcode", "sun day", "a-b"]


def _words(rng, shape):
    return np.array([WORDS[i] for i in rng.integers(0, len(WORDS), int(np.prod(shape)))],
                    dtype=object).reshape(shape)


@pytest.mark.parametrize("attrs", [{}, {"case_change_action": "LOWER"}, {"case_change_action": "UPPER"},
                                   {"stopwords": ["monday"], "is_case_sensitive": 1},
                                   {"stopwords": ["monday", "wed"], "case_change_action": "UPPER"}])
@pytest.mark.parametrize("shape", [(7,), (1, 6)])
def test_string_normalizer(rng, attrs, shape):
    attrs = {**attrs, "locale": "C.UTF-8"}  # ORT's default locale, en_US, is not installed here
    check("StringNormalizer", {"x": _words(rng, shape)}, attrs=attrs, opset=10, out_types=[T.STRING])


def test_string_normalizer_drops_everything(rng):
    got = check("StringNormalizer", {"x": np.array([["wed", "WED"]], dtype=object)},
                attrs={"stopwords": ["wed"], "locale": "C.UTF-8"}, opset=10, out_types=[T.STRING])
    assert list(got.values())[0].shape == (1, 1)


def test_string_concat(rng):
    check("StringConcat", {"a": _words(rng, (3, 4)), "b": _words(rng, (4,))}, opset=20, out_types=[T.STRING])


@pytest.mark.parametrize("attrs", [{}, {"delimiter": "-"}, {"delimiter": " ", "maxsplit": 1}, {"maxsplit": 1}])
def test_string_split(rng, attrs):
    x = np.array(["a b  c", " lead", "x-y--z", "", "one"], dtype=object)[rng.permutation(5)].reshape(5)
    check("StringSplit", {"x": x}, attrs=attrs, opset=20, out_types=[T.STRING, T.INT64])


@pytest.mark.parametrize("pattern", [r"[a-z]+", r".*day", r"\w+ \w+", r"(?i)monday"])
def test_regex_full_match(rng, pattern):
    check("RegexFullMatch", {"x": _words(rng, (3, 5))}, attrs={"pattern": pattern}, opset=20, out_types=[T.BOOL])


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("grams", [(1, 1, 0), (2, 2, 0), (1, 2, 3)])
@pytest.mark.parametrize("shape", [(12,), (2, 9)])
def test_tfidf_vectorizer(rng, mode, grams, shape):
    lo, hi, skip = grams
    x = rng.integers(0, 6, shape).astype(np.int32)
    attrs = {"min_gram_length": lo, "max_gram_length": hi, "max_skip_count": skip, "mode": mode,
             "ngram_counts": [0, 4], "ngram_indexes": list(range(7)),
             "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7], "weights": list(rng.uniform(0.5, 2, 7))}
    check("TfIdfVectorizer", {"x": x}, attrs=attrs, opset=9)
