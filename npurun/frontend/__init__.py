"""Frontends: model files in, NPU-IR graphs out. `load` picks the reader by content."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelError
from ..ir.graph import Graph


def load(path: str | os.PathLike) -> Graph:
    """Read a model: `.npuir` text (with its weights file) or an ONNX protobuf."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if path.is_dir():
        raise ModelError(f"{path}: is a folder, expected a .onnx or .npuir file")
    with open(path, "rb") as f:
        head = f.read(64)
    if path.suffix == ".npuir" or head.lstrip().startswith((b"npuir", b"graph", b"op ", b"#")):
        from ..ir.io import load_npuir
        return load_npuir(path)
    from .onnx import import_model
    return import_model(path)
