"""bench/gpu.py's dry mode: its correctness part through torch:cpu (the GPU part needs CUDA)."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.models
def test_gpu_bench_dry_run():
    for name in ("ppocr_det", "yolov8n", "minilm_int8"):
        sys.path.insert(0, str(ROOT / "tests"))
        from models.fetch import fetch
        fetch(name)  # the bench never downloads; CI fetches first
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--dry"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 models checked, 0 mismatched" in r.stdout
    assert r.stdout.count(" ok ") == 4
