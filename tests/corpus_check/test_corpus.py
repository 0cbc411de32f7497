"""Every corpus model (bench/corpus_models.py: PyTorch, dynamo, tf2onnx and PyPI-shipped
exports) runs on npurun's cpu backend and matches ONNX Runtime on the same inputs.

Slow (exports and large models): `make test-all` runs it. Building the PyTorch exports needs
`pip install -e '.[corpus]'` (test-all installs it); a model that cannot be built fails here,
it is never skipped.
"""
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import npurun
from npurun.backends.cpu import replay

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import corpus  # noqa: E402
from corpus_models import SPECS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.models]


def _ort(path, feeds):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corpus.ort_session(path, 1).run(None, feeds)


def assert_matches(got, want, name):
    assert got.shape == want.shape, f"{name}: shape {got.shape} != ORT's {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != ORT's {want.dtype}"
    if want.dtype.kind in "fc":
        scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4 * scale, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_matches_onnxruntime(spec):
    path = corpus.path(spec.name)
    feeds = spec.feeds()
    want = _ort(path, feeds)
    exe, g = npurun.Executor("cpu", parallelism=2), npurun.load(path)
    got = list(exe.run_sync(g, feeds).values())
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_matches(a, b, f"{spec.name} output {i}")
    # A short model's later runs are replays of a recorded one (backends/cpu/replay.py): those too.
    for _ in range(replay.WARM + 2):
        exe.run_sync(g, feeds)
    for i, (a, b) in enumerate(zip(exe.run_sync(g, feeds).values(), want)):
        assert_matches(a, b, f"{spec.name} output {i}, a later run")
