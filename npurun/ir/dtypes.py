"""Element types of NPU-IR values and their NumPy storage.

The IR names types tersely (`f32`, `i8`, ...) as the founding document does. bf16 has no NumPy
type of its own; `ml_dtypes` (already a dependency of onnx) provides one.
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
}
DTYPES = tuple(_NUMPY)
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}

FLOAT_TYPES = frozenset({"f32", "f16", "bf16", "f64"})
INT_TYPES = frozenset({"i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"})


def to_numpy(dtype: str) -> np.dtype:
    try:
        return _NUMPY[dtype]
    except KeyError:
        raise NpurunError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}") from None


def from_numpy(dtype) -> str:
    dt = np.dtype(dtype)
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise NpurunError(f"NumPy dtype {dt} has no NPU-IR equivalent") from None
