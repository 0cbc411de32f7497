"""Element types of NPU-IR values and their NumPy storage.

The IR names types tersely (`f32`, `i8`, ...) as the founding document does. NumPy has no type
of its own for bf16, the 8-bit floats (`f8e4m3fn` ...), the 4-bit float `f4e2m1` or the 4- and
2-bit integers (`i4`, `u2`, ...); `ml_dtypes` (already a dependency of onnx) provides them, one
element per byte in memory (ONNX packs the sub-byte types in files; `onnx.numpy_helper` unpacks
them). Strings (`str`) are NumPy object arrays of Python `str`.
"""
import ml_dtypes
import numpy as np

from ..errors import NpurunError

# IR name -> NumPy dtype. Order is the order `npurun info` and docs list them in.
_NUMPY = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f64": np.dtype(np.float64),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "i16": np.dtype(np.int16),
    "u16": np.dtype(np.uint16),
    "i32": np.dtype(np.int32),
    "u32": np.dtype(np.uint32),
    "i64": np.dtype(np.int64),
    "u64": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
    "f8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "f8e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "f8e8m0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "f4e2m1": np.dtype(ml_dtypes.float4_e2m1fn),
    "i4": np.dtype(ml_dtypes.int4),
    "u4": np.dtype(ml_dtypes.uint4),
    "i2": np.dtype(ml_dtypes.int2),
    "u2": np.dtype(ml_dtypes.uint2),
    "str": np.dtype(object),
}
DTYPES = tuple(_NUMPY)
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}

FLOAT_TYPES = frozenset({"f32", "f16", "bf16", "f64"})  # types arithmetic is done in
INT_TYPES = frozenset({"i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"})
# Storage-only types: values are converted (cast, dequantized) before arithmetic.
FLOAT8_TYPES = frozenset({"f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz"})
SMALL_FLOAT_TYPES = FLOAT8_TYPES | {"f8e8m0", "f4e2m1"}
SMALL_INT_TYPES = frozenset({"i4", "u4", "i2", "u2"})
STRING_TYPES = frozenset({"str"})


def to_numpy(dtype: str) -> np.dtype:
    try:
        return _NUMPY[dtype]
    except KeyError:
        raise NpurunError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}") from None


def from_numpy(dtype) -> str:
    dt = np.dtype(dtype)
    if dt.kind in "OUS":  # str/bytes arrays are held as object arrays of str
        return "str"
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise NpurunError(f"NumPy dtype {dt} has no NPU-IR equivalent") from None


def int_range(dtype: str) -> tuple[int, int]:
    """Smallest and largest value of an integer type (sub-byte ones included)."""
    info = ml_dtypes.iinfo(to_numpy(dtype)) if dtype in SMALL_INT_TYPES else np.iinfo(to_numpy(dtype))
    return int(info.min), int(info.max)


def as_strings(a) -> np.ndarray:
    """An array of str/bytes/objects as an object array of Python str (bytes decoded as UTF-8)."""
    a = np.asarray(a)
    if a.dtype == object and all(isinstance(s, str) for s in a.flat):
        return a
    out = np.empty(a.shape, dtype=object)
    for i, s in enumerate(a.flat):
        out.flat[i] = s.decode("utf-8") if isinstance(s, bytes) else str(s)
    return out
