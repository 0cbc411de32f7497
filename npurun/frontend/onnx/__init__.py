"""onnx2npu: ONNX models in, NPU-IR graphs out."""
from .importer import import_model, load_onnx

__all__ = ["import_model", "load_onnx"]
