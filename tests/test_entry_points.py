"""Every entry point hands its backend the graph through the device's pass pipeline (issue J:
passes are the only graph rewriter, docs/passes.md): a Conv + BatchNormalization + Relu model
reaches the cpu backend as one conv with the BatchNorm folded in and the ReLU as its
epilogue, whichever way it is run: the Executor (sync and async), InferenceSession, the
server's KServe v2 endpoint and the CLI's run, bench, profile and ops-report commands. The
outputs are the reference backend's (which runs the graph as written)."""
import asyncio
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

import npurun
from npurun import cli
from npurun.backends.cpu import CpuBackend

from conftest import nonzero_normal

LOWERED = [("conv", "relu")]  # the whole model after the cpu pipeline


def _model(path, rng):
    c = 4
    inits = [numpy_helper.from_array(nonzero_normal(rng, (c, 3, 3, 3)), "w"),
             numpy_helper.from_array(nonzero_normal(rng, (c,)), "b")]
    inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
              [("scale", rng.uniform(0.5, 1.5, c)), ("shift", rng.normal(size=c)), ("mean", rng.normal(size=c)),
               ("var", rng.uniform(0.5, 2.0, c))]]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    g = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 9, 11])], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture
def case(tmp_path, rng, monkeypatch):
    """(model path, feeds, the reference's output, the graphs the cpu backend was given)."""
    path = _model(tmp_path / "cbr.onnx", rng)
    feeds = {"x": nonzero_normal(rng, (1, 3, 9, 11))}
    want = npurun.Executor("reference").run_sync(npurun.load(path), feeds)["y"]
    given = []
    compile_ = CpuBackend.compile

    def spy(self, graph):
        given.append([(n.op, n.attrs.get("activation", "")) for n in graph.nodes])
        return compile_(self, graph)
    monkeypatch.setattr(CpuBackend, "compile", spy)
    return path, feeds, want, given


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_executor_run_sync(case):
    path, feeds, want, given = case
    _close(npurun.Executor("cpu", parallelism=1).run_sync(npurun.load(path), feeds)["y"], want)
    assert given == [LOWERED]


def test_executor_run_async(case):
    path, feeds, want, given = case
    exe = npurun.Executor("cpu", parallelism=1)
    _close(asyncio.run(exe.run(npurun.load(path), feeds))["y"], want)
    assert given == [LOWERED]


def test_inference_session(case):
    path, feeds, want, given = case
    (y,) = npurun.InferenceSession(str(path), "cpu", parallelism=1).run(None, feeds)
    _close(y, want)
    assert given and all(g == LOWERED for g in given)


def test_server_kserve_infer(case):
    import http.client

    from npurun.serve import build
    from test_serve import _Uvicorn
    path, feeds, want, given = case
    server = _Uvicorn(build(path.parent, "cpu", threads=1))
    try:
        host, port = server.url.split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        x = feeds["x"]
        body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        c.request("POST", "/v2/models/cbr/infer", body=json.dumps(body), headers={"content-type": "application/json"})
        r = c.getresponse()
        out = json.loads(r.read())
        assert r.status == 200, out
    finally:
        server.stop()
    (y,) = [o for o in out["outputs"] if o["name"] == "y"]
    _close(np.asarray(y["data"], np.float32).reshape(y["shape"]), want)
    assert given and all(g == LOWERED for g in given)


def test_cli_run(case, tmp_path):
    path, feeds, want, given = case
    np.save(tmp_path / "x.npy", feeds["x"])
    assert cli.main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path), "-q",
                     "--device", "cpu"]) == 0
    _close(np.load(tmp_path / "y.npy"), want)
    assert given == [LOWERED]


def test_cli_bench(case, tmp_path):
    path, _feeds, _want, given = case
    assert cli.main(["bench", str(path), "--vs", "none", "--time", "0.05", "--min-runs", "1", "--threads", "1",
                     "--json", str(tmp_path / "b.json")]) == 0
    assert given and all(g == LOWERED for g in given)


def test_cli_profile(case, tmp_path):
    path, _feeds, _want, given = case
    assert cli.main(["profile", str(path), "--trace", str(tmp_path / "t.json")]) == 0
    assert given and all(g == LOWERED for g in given)


def test_cli_ops_report(case, capsys):
    path, _feeds, _want, _given = case
    assert cli.main(["ops-report", str(path), "--device", "cpu"]) == 0
    assert "1 after the pass pipeline" in capsys.readouterr().out
