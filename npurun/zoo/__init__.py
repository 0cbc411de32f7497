"""Bundled models and their recipes (pre- and post-processing).

`espcn_x3.onnx` is a real ESPCN (Shi et al., 2016) trained by `scripts/train_espcn.py` on the
photos that ship inside scikit-image; `espcn_x3.json` records the split and the PSNR it reached.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

_HERE = Path(str(resources.files(__package__)))


def path(name: str) -> Path:
    """Path of a bundled file (`espcn_x3.onnx`, `sample.jpg`, ...)."""
    p = _HERE / name
    if not p.exists():
        from ..errors import NpurunError
        raise NpurunError(f"no bundled file {name!r} in {_HERE}")
    return p


def espcn_info() -> dict:
    return json.loads(path("espcn_x3.json").read_text())
