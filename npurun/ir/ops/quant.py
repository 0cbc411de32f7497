"""Quantization and reinterpretation ops: quantize/dequantize, integer and quantized-linear
matrix products and convolutions, bitcast; and the string ops (normalize, concat, split,
regex match, TF-IDF n-gram counts).

Quantized values are integers (or 8/4-bit floats) with a scale and a zero point:
`real = (q - zero_point) * scale`. Integer products accumulate exactly in 32 bits.
"""
from __future__ import annotations

from ..dtypes import DTYPES, INT_TYPES, SMALL_FLOAT_TYPES, SMALL_INT_TYPES, to_numpy
from ..shapes import UNKNOWN, broadcast, numel
from . import _axis, _fail, op
from .nn import _CONV_ATTRS, _conv, _conv_macs, _matmul_macs, _matmul_shape

QUANT_TYPES = INT_TYPES | SMALL_INT_TYPES | SMALL_FLOAT_TYPES  # what quantize_linear produces


def _check_granularity(node, a, x, scale, role):
    """Scale (and zero point) shapes: scalar (per tensor), 1-D along `axis` (per axis), or
    x's shape with `ceil(d / block_size)` along `axis` (blocked)."""
    rank = len(x.shape)
    if len(scale.shape) == 0 or numel(scale.shape) == 1 and len(scale.shape) <= 1:
        return
    ax = _axis(a["axis"], rank, node)
    if a["block_size"]:
        if len(scale.shape) != rank:
            _fail(node, f"blocked {role} must have x's rank {rank}, got {list(scale.shape)}")
        d, s = x.shape[ax], scale.shape[ax]
        if isinstance(d, int) and isinstance(s, int) and s != -(-d // a["block_size"]):
            _fail(node, f"{role} has {s} blocks along axis {ax}; {d} / block_size "
                        f"{a['block_size']} needs {-(-d // a['block_size'])}")
    elif len(scale.shape) != 1:
        _fail(node, f"per-axis {role} must be 1-D, got {list(scale.shape)}")
    elif isinstance(x.shape[ax], int) and isinstance(scale.shape[0], int) and x.shape[ax] != scale.shape[0]:
        _fail(node, f"{role} has {scale.shape[0]} values, axis {ax} of x has {x.shape[ax]}")


@op("quantize_linear", ["x", "scale", "zero_point?"],
    attrs={"axis": 1, "block_size": 0, "output_dtype": "", "saturate": 1, "precision": ""},
    groups={"quant"})
def _quantize(node, a, ins):
    # y = saturate(round_half_even(x / scale) + zero_point); the type is output_dtype, else the
    # zero point's, else u8.
    x, scale, zp = (ins + [None])[:3]
    to = a["output_dtype"] or (zp.dtype if zp is not None else "u8")
    if to not in QUANT_TYPES:
        _fail(node, f"cannot quantize to {to}; expected one of {', '.join(sorted(QUANT_TYPES))}")
    if zp is not None and zp.dtype != to:
        _fail(node, f"zero point is {zp.dtype} but the output is {to}")
    _check_granularity(node, a, x, scale, "scale")
    return [(x.shape, to)]


@op("dequantize_linear", ["x", "scale", "zero_point?"],
    attrs={"axis": 1, "block_size": 0, "output_dtype": ""}, groups={"quant"})
def _dequantize(node, a, ins):
    # y = (x - zero_point) * scale, of output_dtype, else the scale's type.
    x, scale, zp = (ins + [None])[:3]
    if zp is not None and zp.dtype != x.dtype:
        _fail(node, f"zero point is {zp.dtype} but x is {x.dtype}")
    _check_granularity(node, a, x, scale, "scale")
    return [(x.shape, a["output_dtype"] or scale.dtype)]


@op("dynamic_quantize_linear", ["x"], ["y", "scale", "zero_point"], groups={"quant"})
def _dynamic_quantize(node, a, ins):
    return [(ins[0].shape, "u8"), ((), "f32"), ((), "u8")]


@op("matmul_integer", ["a", "b", "a_zero_point?", "b_zero_point?"], groups={"matmul", "mac", "quant"},
    macs=_matmul_macs)
def _matmul_integer(node, a, ins):
    return [(_matmul_shape(node, ins[0].shape, ins[1].shape), "i32")]


@op("qlinear_matmul", ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point",
                       "y_scale", "y_zero_point"], groups={"matmul", "mac", "quant"},
    macs=lambda a, ins, outs: numel(outs[0]) * ins[0][-1])
def _qlinear_matmul(node, a, ins):
    return [(_matmul_shape(node, ins[0].shape, ins[3].shape), ins[7].dtype)]


@op("conv_integer", ["x", "w", "x_zero_point?", "w_zero_point?"], attrs=_CONV_ATTRS,
    groups={"conv", "mac", "quant"}, macs=_conv_macs)
def _conv_integer(node, a, ins):
    (shape, _), = _conv(node, a, ins[:2])
    return [(shape, "i32")]


@op("qlinear_conv", ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point",
                     "y_scale", "y_zero_point", "b?"], attrs=_CONV_ATTRS,
    groups={"conv", "mac", "quant"},
    macs=lambda a, ins, outs: _conv_macs(a, [ins[0], ins[3]], outs))
def _qlinear_conv(node, a, ins):
    (shape, _), = _conv(node, a, [ins[0], ins[3]])
    return [(shape, ins[7].dtype)]


@op("bitcast", ["x"], attrs={"to": None}, groups={"elementwise", "unary", "view"})
def _bitcast(node, a, ins):
    # The same bits read as another type of the same width (little endian).
    x, to = ins[0], a["to"]
    if to not in DTYPES or to == "str" or x.dtype == "str":
        _fail(node, f"cannot bitcast {x.dtype} to {to!r}")
    if _bits(x.dtype) != _bits(to):
        _fail(node, f"bitcast needs equal widths: {x.dtype} is {_bits(x.dtype)} bits, {to} is {_bits(to)}")
    return [(x.shape, to)]


def _bits(dtype: str) -> int:
    return {"i4": 4, "u4": 4, "f4e2m1": 4, "i2": 2, "u2": 2}.get(dtype, 8 * to_numpy(dtype).itemsize)


# ------------------------------------------------------------------ strings

@op("string_normalizer", ["x"], attrs={"case_change_action": "NONE", "is_case_sensitive": 0,
                                       "locale": "", "stopwords": []}, groups={"string"})
def _string_normalizer(node, a, ins):
    # x is (C,) or (1, C); stopwords are dropped, so C is known only at run time.
    x = ins[0]
    if x.dtype != "str" or len(x.shape) not in (1, 2):
        _fail(node, f"expects a 1-D or (1, C) str tensor, got {list(x.shape)} {x.dtype}")
    if a["case_change_action"] not in ("NONE", "LOWER", "UPPER"):
        _fail(node, f"case_change_action {a['case_change_action']!r}; expected NONE, LOWER or UPPER")
    return [((*x.shape[:-1], UNKNOWN) if a["stopwords"] else x.shape, "str")]


@op("string_concat", ["a", "b"], groups={"string", "elementwise", "binary"})
def _string_concat(node, a, ins):
    shape = broadcast(ins[0].shape, ins[1].shape)
    if shape is None:
        _fail(node, f"operand shapes {list(ins[0].shape)} and {list(ins[1].shape)} do not broadcast")
    return [(shape, "str")]


@op("string_split", ["x"], ["y", "count"], attrs={"delimiter": "", "maxsplit": -1}, groups={"string"})
def _string_split(node, a, ins):
    # y pads every row of pieces with "" to the longest; count holds each string's piece count.
    x = ins[0]
    return [((*x.shape, UNKNOWN), "str"), (x.shape, "i64")]


@op("regex_full_match", ["x"], attrs={"pattern": ""}, groups={"string", "elementwise", "unary"})
def _regex_full_match(node, a, ins):
    return [(ins[0].shape, "bool")]


@op("tfidf_vectorizer", ["x"], attrs={"max_gram_length": 1, "min_gram_length": 1, "max_skip_count": 0,
                                      "mode": "TF", "ngram_counts": [], "ngram_indexes": [],
                                      "pool_int64s": [], "pool_strings": [], "weights": []},
    groups={"string"})
def _tfidf(node, a, ins):
    # x is (C,) or (N, C) tokens; y counts each pooled n-gram: (n_out,) or (N, n_out).
    x = ins[0]
    if len(x.shape) not in (1, 2):
        _fail(node, f"expects a 1-D or 2-D input, got rank {len(x.shape)}")
    if a["mode"] not in ("TF", "IDF", "TFIDF"):
        _fail(node, f"mode {a['mode']!r}; expected TF, IDF or TFIDF")
    n_out = max(a["ngram_indexes"], default=-1) + 1
    return [((*x.shape[:-1], n_out), "f32")]

