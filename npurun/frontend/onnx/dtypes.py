"""ONNX element types <-> NPU-IR dtypes."""
from onnx import TensorProto

from ...errors import ModelError

_TO_IR = {
    TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16", TensorProto.BFLOAT16: "bf16",
    TensorProto.DOUBLE: "f64", TensorProto.INT8: "i8", TensorProto.UINT8: "u8",
    TensorProto.INT16: "i16", TensorProto.UINT16: "u16", TensorProto.INT32: "i32",
    TensorProto.UINT32: "u32", TensorProto.INT64: "i64", TensorProto.UINT64: "u64",
    TensorProto.BOOL: "bool", TensorProto.STRING: "str",
    TensorProto.FLOAT8E4M3FN: "f8e4m3fn", TensorProto.FLOAT8E4M3FNUZ: "f8e4m3fnuz",
    TensorProto.FLOAT8E5M2: "f8e5m2", TensorProto.FLOAT8E5M2FNUZ: "f8e5m2fnuz",
    TensorProto.FLOAT8E8M0: "f8e8m0", TensorProto.FLOAT4E2M1: "f4e2m1",
    TensorProto.INT4: "i4", TensorProto.UINT4: "u4", TensorProto.INT2: "i2", TensorProto.UINT2: "u2",
}
TO_ONNX = {v: k for k, v in _TO_IR.items()}


def ir_dtype(elem_type: int, where: str) -> str:
    try:
        return _TO_IR[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise ModelError(f"{where}: element type {name} is not supported") from None
