"""The ort backend: npurun graphs exported back to ONNX and run by ONNX Runtime (CPU provider
here), checked against ONNX Runtime on the original model and against the reference backend."""
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

import npurun  # noqa: E402
from npurun.backends.torch import with_precision  # noqa: E402
from npurun.errors import BackendError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from models.fetch import fetch  # noqa: E402
from models.inputs import RANDOM_FEEDS as REAL  # noqa: E402

DEVICE = "ort:CPUExecutionProvider"


def _rel_err(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max()))


@pytest.fixture(scope="module")
def espcn():
    from npurun import zoo
    return npurun.load(zoo.path("espcn_x3.onnx"))


@pytest.mark.models
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_model_through_the_cpu_provider(name, rng):
    """The exported graph (one session; control flow exported as ONNX subgraphs) gives what
    ONNX Runtime gives on the original file."""
    path = fetch(name)
    feeds = REAL[name](rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    exe = npurun.Executor(DEVICE, parallelism=2)
    g = npurun.load(path)
    got = list(exe.run_sync(g, feeds).values())
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert _rel_err(a, b) < 1e-4
    prog = exe.compile(g)
    assert not prog.fallbacks and len(prog.sessions) == 1


def test_missing_provider_lists_the_ones_there():
    with pytest.raises(BackendError, match=r"no QNNExecutionProvider; its providers are .*CPUExecutionProvider"):
        npurun.Executor("ort:QNNExecutionProvider")
    r = subprocess.run([sys.executable, "-m", "npurun", "ops-report", "x.onnx", "--device", "ort:cuda"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("precision, tol", [("f16", 5e-3), ("i8", 5e-2)])
def test_precision_exports_as_casts_and_qdq(espcn, rng, precision, tol):
    from npurun.backends.ort.export import export
    g = with_precision(espcn, precision)
    ops = [n.op_type for n in export(g).graph.node]
    if precision == "i8":
        assert ops.count("DynamicQuantizeLinear") == 3 and ops.count("DequantizeLinear") == 6
    else:
        assert ops.count("Cast") == 12  # x, w, b in and y out, per conv
    x = rng.random((1, 1, 24, 40), dtype=np.float32)
    want = npurun.Executor("reference").run_sync(espcn, x)["output"]
    got = npurun.Executor(DEVICE).run_sync(g, x)["output"]
    assert got.dtype == np.float32 and 0 < _rel_err(got, want) < tol


def test_nodes_that_do_not_export_split_the_graph_into_sessions(rng):
    """A node ONNX Runtime cannot take (here: an i16 precision suffix) runs on the reference
    kernels between two sessions."""
    g = npurun.parse("""
input x: [3, 4] f32
const w: [4, 4] f32
op relu (x: [3, 4] f32 -> r: [3, 4] f32)
op matmul_i16 (r: [3, 4] f32, w: [4, 4] f32 -> m: [3, 4] f32)
op tanh (m: [3, 4] f32 -> t: [3, 4] f32)
op add (t: [3, 4] f32, r: [3, 4] f32 -> y: [3, 4] f32)
output y: [3, 4] f32
""", weights={"w": rng.standard_normal((4, 4)).astype(np.float32)})  # integer weights are constants
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32)}
    exe = npurun.Executor(DEVICE)
    prog = exe.compile(g)
    assert [n.full_op for n, _ in prog.fallbacks] == ["matmul_i16"] and len(prog.sessions) == 2
    np.testing.assert_allclose(exe.run_sync(g, feeds)["y"], npurun.Executor("reference").run_sync(g, feeds)["y"],
                               rtol=1e-5, atol=1e-6)


def test_provider_options_pass_through(monkeypatch):
    from npurun.backends.ort import OrtBackend
    monkeypatch.setattr(OrtBackend, "options", {})
    OrtBackend.configure("qnn", backend_path="QnnHtp.dll", htp_performance_mode="burst", vtcm_mb=8)
    assert OrtBackend.options["QNNExecutionProvider"] == {"backend_path": "QnnHtp.dll",
                                                          "htp_performance_mode": "burst", "vtcm_mb": "8"}
    monkeypatch.setenv("NPURUN_ORT_PROVIDER_OPTIONS", "intra_op_spinning=0")
    assert OrtBackend("cpu").provider_options == {"intra_op_spinning": "0"}
    monkeypatch.setenv("NPURUN_ORT_PROVIDER_OPTIONS", "nonsense")
    with pytest.raises(BackendError, match="key=value"):
        OrtBackend("cpu")
