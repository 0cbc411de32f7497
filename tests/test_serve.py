"""`npurun serve`: the real Triton client (binary default, JSON mode, shared memory) against
the server in this process (uvicorn in a thread), outputs checked against the reference
backend; bad requests get the right 4xx with a JSON error and the server keeps serving;
/metrics parsed with prometheus_client's parser."""
import asyncio
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("uvicorn")
httpclient = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

import npurun  # noqa: E402
from npurun.serve import Settings, build  # noqa: E402
from npurun.serve.protocol import ServeError, _priority  # noqa: E402

from conftest import nonzero_normal  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "t0k3n-" + uuid.uuid4().hex


def _mlp(path, seed=0):
    """x: [N, 8] f32 -> p: [N, 4] (MatMul, Relu, MatMul, Softmax), a symbolic batch dim."""
    r = np.random.default_rng(seed)
    w1, w2 = r.standard_normal((8, 16)).astype(np.float32), r.standard_normal((16, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"], axis=-1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def _addint(path):
    """a, b: [3] i64 -> s: [3] i64 and gt: [3] bool (other datatypes than FP32)."""
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Greater", ["a", "b"], ["gt"])]
    g = helper.make_graph(nodes, "addint", [helper.make_tensor_value_info(n, TensorProto.INT64, [3]) for n in "ab"],
                          [helper.make_tensor_value_info("s", TensorProto.INT64, [3]),
                           helper.make_tensor_value_info("gt", TensorProto.BOOL, [3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    (d / "espcn_x3.onnx").write_bytes((ROOT / "npurun/zoo/espcn_x3.onnx").read_bytes())
    _mlp(d / "mlp.onnx")
    _addint(d / "addint.onnx")
    return d


class _Uvicorn:
    """uvicorn serving `app` in a thread on a free loopback port."""

    def __init__(self, app):
        import uvicorn

        from npurun.commands.serve import listen_socket
        self.sock = listen_socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                break
            time.sleep(0.01)
        assert self.server.started, "the server did not start"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def server(model_dir):
    app = build(model_dir, "cpu", threads=2,
                settings=Settings(max_body_bytes=1 << 20, max_tensor_bytes=256 << 10))
    s = _Uvicorn(app)
    s.app = app
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


def reference(model_dir, name, feeds):
    return npurun.Executor("reference").run_sync(npurun.load(model_dir / f"{name}.onnx"), feeds)


def _post(url, path, body: bytes, headers=None):
    """(status, parsed JSON) of a raw POST."""
    host, port = url.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        c.request("POST", path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, json.loads(data) if r.getheader("content-type", "").startswith("application/json") else data
    finally:
        c.close()


def _get(url, path, headers=None):
    host, port = url.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


# ---------------------------------------------------------------- protocol through tritonclient

def test_health_and_metadata(client, server):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "npurun" and "binary_tensor_data" in meta["extensions"]
    assert "system_shared_memory" in meta["extensions"]
    assert client.is_model_ready("espcn_x3") and client.is_model_ready("mlp", "1")
    m = client.get_model_metadata("espcn_x3")
    assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 1, -1, -1]}]
    assert m["outputs"][0]["name"] == "output" and m["versions"] == ["1"]
    assert client.get_model_metadata("addint")["outputs"][1] == {"name": "gt", "datatype": "BOOL", "shape": [3]}
    assert client.get_model_config("mlp")["input"][0]["data_type"] == "TYPE_FP32"
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert e.value.status() == "404" and "unknown model 'nope'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("mlp", "2")
    assert e.value.status() == "404"
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert index == {"addint": "READY", "espcn_x3": "READY", "mlp": "READY"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_matches_reference(client, model_dir, rng, binary):
    x = nonzero_normal(rng, (1, 1, 13, 17))
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    # binary: tritonclient's defaults (binary in, no outputs named -> binary_data_output)
    outs = None if binary else [httpclient.InferRequestedOutput("output", binary_data=False)]
    r = client.infer("espcn_x3", [inp], outputs=outs, request_id="r1")
    resp = r.get_response()
    assert resp["id"] == "r1" and resp["model_name"] == "espcn_x3"
    assert ("data" in resp["outputs"][0]) is not binary
    want = reference(model_dir, "espcn_x3", {"input": x})["output"]
    got = r.as_numpy("output")
    assert got.shape == (1, 1, 39, 51)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    xm = nonzero_normal(rng, (3, 8))
    inp = httpclient.InferInput("x", [3, 8], "FP32")
    inp.set_data_from_numpy(xm, binary_data=binary)
    r = client.infer("mlp", [inp], priority=1, timeout=10_000_000)
    np.testing.assert_allclose(r.as_numpy("p"), reference(model_dir, "mlp", {"x": xm})["p"], rtol=1e-5, atol=1e-6)
    r = client.infer("mlp", [inp], request_compression_algorithm="gzip")
    np.testing.assert_allclose(r.as_numpy("p"), reference(model_dir, "mlp", {"x": xm})["p"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_integer_and_bool_tensors(client, model_dir, rng, binary):
    a, b = rng.integers(-1000, 1000, 3), rng.integers(-1000, 1000, 3)
    ins = [httpclient.InferInput(n, [3], "INT64") for n in "ab"]
    for i, v in zip(ins, (a, b)):
        i.set_data_from_numpy(v.astype(np.int64), binary_data=binary)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("gt", "s")]
    r = client.infer("addint", ins, outputs=outs)
    assert [o["name"] for o in r.get_response()["outputs"]] == ["gt", "s"]
    np.testing.assert_array_equal(r.as_numpy("s"), a + b)
    np.testing.assert_array_equal(r.as_numpy("gt"), a > b)


def test_shared_memory(client, server, model_dir, rng):
    x = nonzero_normal(rng, (2, 8))
    tag = uuid.uuid4().hex[:8]
    h_in = shm.create_shared_memory_region(f"in_{tag}", f"/npurun_test_in_{tag}", 64 + x.nbytes)
    h_out = shm.create_shared_memory_region(f"out_{tag}", f"/npurun_test_out_{tag}", 2 * 4 * 4)
    try:
        shm.set_shared_memory_region(h_in, [x], offset=64)
        client.register_system_shared_memory(f"in_{tag}", f"/npurun_test_in_{tag}", 64 + x.nbytes)
        client.register_system_shared_memory(f"out_{tag}", f"/npurun_test_out_{tag}", 32)
        status = {r["name"]: r for r in client.get_system_shared_memory_status()}
        assert status[f"in_{tag}"]["byte_size"] == 64 + x.nbytes
        inp = httpclient.InferInput("x", [2, 8], "FP32")
        inp.set_shared_memory(f"in_{tag}", x.nbytes, offset=64)
        out = httpclient.InferRequestedOutput("p")
        out.set_shared_memory(f"out_{tag}", 32)
        r = client.infer("mlp", [inp], outputs=[out])
        o = r.get_output("p")
        assert o["parameters"]["shared_memory_region"] == f"out_{tag}" and o["shape"] == [2, 4]
        got = shm.get_contents_as_numpy(h_out, np.float32, [2, 4])
        np.testing.assert_allclose(got, reference(model_dir, "mlp", {"x": x})["p"], rtol=1e-5, atol=1e-6)

        # bounds are the registered size, not the object's: 64 + nbytes + 4 is past it
        inp.set_shared_memory(f"in_{tag}", x.nbytes, offset=68)
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", [inp])
        assert e.value.status() == "400" and "past its registered byte_size" in e.value.message()
        # an output that does not fit its slot
        inp.set_shared_memory(f"in_{tag}", x.nbytes, offset=64)
        out.set_shared_memory(f"out_{tag}", 16)
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", [inp], outputs=[out])
        assert e.value.status() == "400" and "32 bytes" in e.value.message()
        # registering past the object's end, twice, or a key that is no plain shm name
        for args, words in [((f"big_{tag}", f"/npurun_test_in_{tag}", 1 << 20), "past the end"),
                            ((f"in_{tag}", f"/npurun_test_in_{tag}", 8), "already registered"),
                            ((f"esc_{tag}", "/../etc/passwd", 8), "must be one POSIX shm name"),
                            ((f"none_{tag}", f"/npurun_no_such_{tag}", 8), "no shared-memory object")]:
            with pytest.raises(InferenceServerException) as e:
                client.register_system_shared_memory(*args)
            assert e.value.status() == "400" and words in e.value.message(), e.value.message()
        client.unregister_system_shared_memory(f"in_{tag}")
        inp.set_shared_memory(f"in_{tag}", x.nbytes, offset=64)
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", [inp])
        assert e.value.status() == "400" and "is not registered" in e.value.message()
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
    assert client.get_system_shared_memory_status() == []


# ---------------------------------------------------------------- bad requests

def _infer_body(x, name="input", datatype="FP32", shape=None):
    head = json.dumps({"inputs": [{"name": name, "shape": list(shape or x.shape), "datatype": datatype,
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


def test_bad_requests_get_4xx_and_the_server_goes_on(server, client, model_dir, rng):
    x = nonzero_normal(rng, (1, 1, 8, 8))
    good, gh = _infer_body(x)
    cases = [
        ("/v2/models/nope/infer", good, gh, 404, "unknown model 'nope'"),
        ("/v2/models/espcn_x3/versions/7/infer", good, gh, 404, "no version '7'"),
        ("/v2/models/espcn_x3/infer", *_infer_body(x, name="image"), 400, "has no input 'image'"),
        ("/v2/models/espcn_x3/infer", *_infer_body(x, datatype="FP64"), 400, "datatype 'FP64', expected 'FP32'"),
        ("/v2/models/espcn_x3/infer", *_infer_body(x[0], shape=[1, 8, 8]), 400, "has shape [1, 8, 8]"),
        ("/v2/models/espcn_x3/infer", *_infer_body(x, shape=[1, 1, 8, 9]), 400, "needs 288"),
        ("/v2/models/espcn_x3/infer", good[:-10], gh, 400, "truncated"),
        ("/v2/models/espcn_x3/infer", good + b"junk", gh, 400, "beyond what the inputs"),
        ("/v2/models/espcn_x3/infer", b"{not json", {}, 400, "not valid JSON"),
        ("/v2/models/espcn_x3/infer", good, {"Inference-Header-Content-Length": "99999"}, 400, "outside the body"),
        ("/v2/models/espcn_x3/infer", b'{"inputs": [{"name": "input", "shape": [1, 1, 2, 2], "datatype": "FP32", '
                                      b'"data": [1, 2, 3]}]}', {}, 400, "has 3 elements"),
        ("/v2/models/espcn_x3/infer", b'{"inputs": [{"name": "input", "shape": [1, 1, 1, 1], "datatype": "FP32", '
                                      b'"data": [1]}], "parameters": {"priority": 9}}', {}, 400, "priority"),
        ("/v2/models/mlp/infer", b'{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": '
                                 b'[1,2,3,4,5,6,7,8]}], "outputs": [{"name": "q"}]}', {}, 400, "no output 'q'"),
        ("/v2/models/addint/infer", b'{"inputs": [{"name": "a", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]}]}',
         {}, 400, "missing input(s) 'b'"),
        # over the limits: a tensor over 256 KiB, a body over 1 MiB
        ("/v2/models/espcn_x3/infer", *_infer_body(np.ones((1, 1, 256, 257), np.float32)), 413, "per tensor"),
        ("/v2/models/espcn_x3/infer", b"{" + b" " * (1 << 20) + b"}", {}, 413, "limit of 1048576 bytes"),
    ]
    for path, body, headers, status, words in cases:
        got, err = _post(server.url, path, body, headers)
        assert (got, words in err.get("error", "")) == (status, True), (path, words, err)
    assert _get(server.url, "/v2/models/..%2F..%2Fetc/ready")[0] == 404
    assert _get(server.url, "/v2/nothing/here")[0] == 404
    # still serving, and the answer is right
    r = client.infer("espcn_x3", [httpclient.InferInput("input", [1, 1, 8, 8], "FP32").set_data_from_numpy(x)])
    np.testing.assert_allclose(r.as_numpy("output"), reference(model_dir, "espcn_x3", {"input": x})["output"],
                               rtol=1e-4, atol=1e-5)


def test_timeout_is_503_and_the_server_goes_on(client, rng):
    x = nonzero_normal(rng, (1, 1, 64, 64))
    inp = httpclient.InferInput("input", list(x.shape), "FP32").set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as e:
        client.infer("espcn_x3", [inp], timeout=1)  # 1 microsecond: fails at its first slice boundary
    assert e.value.status() == "503" and "timeout expired" in e.value.message()
    assert client.infer("espcn_x3", [inp]).as_numpy("output").shape == (1, 1, 192, 192)


def test_priority_follows_triton():
    assert [_priority({"priority": p}) for p in (0, 1, 2, 3, 4)] == [None, 0, 1, 2, 3]
    assert _priority({}) is None
    for bad in (5, -1, 1.5, True, "1"):
        with pytest.raises(ServeError):
            _priority({"priority": bad})


def test_metrics_are_scraped(server, client, rng):
    from prometheus_client.parser import text_string_to_metric_families
    x = nonzero_normal(rng, (2, 8))
    for _ in range(3):
        client.infer("mlp", [httpclient.InferInput("x", [2, 8], "FP32").set_data_from_numpy(x)])
    _post(server.url, "/v2/models/mlp/infer", b"{}")  # one 400
    status, text = _get(server.url, "/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}

    def value(fam, sample, **labels):
        return sum(s.value for s in fams[fam].samples
                   if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))
    assert value("npurun_serve_requests", "npurun_serve_requests_total", model="mlp") >= 4
    assert value("npurun_serve_request_failures", "npurun_serve_request_failures_total", model="mlp", code="400") >= 1
    assert value("npurun_serve_inferences", "npurun_serve_inferences_total", model="mlp") >= 3
    assert value("npurun_serve_queue_duration_seconds", "npurun_serve_queue_duration_seconds_count", model="mlp") >= 3
    assert value("npurun_serve_compute_duration_seconds", "npurun_serve_compute_duration_seconds_sum", model="mlp") > 0
    assert value("npurun_device_busy_seconds", "npurun_device_busy_seconds_total", device="cpu") > 0
    assert 0 <= value("npurun_device_utilization", "npurun_device_utilization", device="cpu") <= 1
    for fam in ("npurun_device_temperature_celsius", "npurun_device_frequency_mhz", "npurun_tasks"):
        assert fam in fams  # temperature and frequency carry samples only where known


def test_top_watches_a_server_through_its_metrics(server, client, rng, capsys):
    """`npurun top --url` reads the server's /metrics: the device line, and per model the
    requests counted and their latency quantiles from the histogram's buckets."""
    from npurun.cli import main
    from npurun.runtime.scrape import metrics_url, quantile, scrape, view
    x = nonzero_normal(rng, (2, 8))
    before = view(None, scrape(metrics_url(server.url)), 1.0)
    n0 = next((m["requests"] for m in before["models"] if m["model"] == "mlp"), 0)
    for _ in range(4):
        client.infer("mlp", [httpclient.InferInput("x", [2, 8], "FP32").set_data_from_numpy(x)], priority=1)
    v = view(None, scrape(metrics_url(server.url)), 1.0)
    mlp = next(m for m in v["models"] if m["model"] == "mlp")
    assert mlp["requests"] == n0 + 4 and 0 < mlp["p50"] <= mlp["p99"]
    assert 0 in mlp["queue_p99"]  # Triton's priority 1 is npurun's 0
    assert [d["name"] for d in v["devices"]] == ["cpu"] and v["devices"][0]["units"] >= 1
    assert main(["top", "--url", f"http://{server.url}", "--once", "--interval", "0.05"]) == 0
    out = capsys.readouterr().out
    for word in ("units", "duty", "mlp", "req/s", "p99 ms"):
        assert word in out
    # Prometheus's interpolation inside a bucket; past the last finite bound, that bound
    assert quantile(0.5, [(0.001, 0.0), (0.002, 10.0), (float("inf"), 10.0)]) == pytest.approx(0.0015)
    assert quantile(0.99, [(0.001, 0.0), (float("inf"), 5.0)]) == 0.001
    assert quantile(0.5, [(float("inf"), 0.0)]) is None


def test_top_url_errors_name_the_address(capsys):
    from npurun.cli import main
    from npurun.commands.serve import listen_socket
    sock = listen_socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    assert main(["top", "--url", f"127.0.0.1:{port}", "--once"]) == 1
    err = capsys.readouterr().err
    assert f"http://127.0.0.1:{port}/metrics: cannot read the metrics" in err and "Traceback" not in err
    assert main(["top", "--url", "ftp://x", "--once"]) == 1
    assert "expected http://HOST:PORT" in capsys.readouterr().err
    assert main(["top", "--once"]) == 1
    assert "give a model to run" in capsys.readouterr().err


# ---------------------------------------------------------------- safety, repository, batching

def test_bearer_token(model_dir, rng):
    s = _Uvicorn(build(model_dir, "cpu", settings=Settings(token=TOKEN)))
    try:
        assert _get(s.url, "/v2/health/live")[0] == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            status, body = _get(s.url, "/v2/health/ready", headers)
            assert status == 401 and "bearer token" in json.loads(body)["error"]
        for path in ("/metrics", "/v2", "/v2/models/mlp", "/v2/systemsharedmemory/status"):
            assert _get(s.url, path)[0] == 401
        assert _post(s.url, "/v2/models/mlp/infer", b"{}")[0] == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        c = httpclient.InferenceServerClient(s.url)
        x = nonzero_normal(rng, (1, 8))
        r = c.infer("mlp", [httpclient.InferInput("x", [1, 8], "FP32").set_data_from_numpy(x)], headers=auth)
        np.testing.assert_allclose(r.as_numpy("p"), reference(model_dir, "mlp", {"x": x})["p"], rtol=1e-5, atol=1e-6)
        assert not c.is_server_ready()  # tritonclient's is_* calls answer False on errors
        with pytest.raises(InferenceServerException) as e:
            c.get_server_metadata()
        assert e.value.status() == "401"
        c.close()
    finally:
        s.stop()


def test_model_names_stay_inside_model_dir(tmp_path, model_dir):
    from npurun.serve.models import ModelRepository
    outside = tmp_path / "outside.onnx"
    _mlp(outside)
    d = tmp_path / "repo"
    (d / "sub").mkdir(parents=True)
    _mlp(d / "sub" / "deep.onnx")
    _mlp(d / ".hidden.onnx")
    _mlp(d / "bad name.onnx")
    _mlp(d / "twin.onnx")
    (d / "twin.npuir").write_text("# not read\n")
    (d / "escape.onnx").symlink_to(outside)
    (d / "broken.onnx").write_bytes(b"\x08\x07garbage")
    _mlp(d / "ok.onnx")
    repo = ModelRepository(d, npurun.Executor("cpu"))
    assert sorted(repo.models) == ["broken", "ok", "twin"]
    assert repo.models["ok"].ready and not repo.ready
    assert "both twin.npuir and twin.onnx are named 'twin'" in repo.models["twin"].reason
    assert repo.models["broken"].state == "UNAVAILABLE" and repo.models["broken"].reason
    for name in ("../outside", "sub/deep", "deep", ".hidden", "escape", "outside"):
        with pytest.raises(ServeError) as e:
            repo.get(name)
        assert e.value.status == 404
    with pytest.raises(ServeError) as e:
        repo.get("broken")
    assert e.value.status == 503


def test_plan_is_cached_next_to_the_model(tmp_path, rng):
    from npurun.serve.models import CACHE_DIR, ModelRepository
    _mlp(tmp_path / "m.onnx", seed=1)
    exe = npurun.Executor("cpu")
    first = ModelRepository(tmp_path, exe).models["m"]
    assert first.plan is not None and first.plan.parent == tmp_path / CACHE_DIR and first.plan.exists()
    again = ModelRepository(tmp_path, exe).models["m"]
    assert again.plan == first.plan
    _mlp(tmp_path / "m.onnx", seed=2)  # a new model under the same name: a new plan, the old one gone
    changed = ModelRepository(tmp_path, exe).models["m"]
    assert changed.plan != first.plan and not first.plan.exists()
    x = nonzero_normal(rng, (2, 8))
    want = reference(tmp_path, "m", {"x": x})["p"]
    np.testing.assert_allclose(exe.run_sync(changed.graph, {"x": x})["p"], want, rtol=1e-5, atol=1e-6)


def test_dynamic_batching_runs_one_task_and_splits_rows(model_dir, rng):
    from npurun.serve.batching import Batcher, batch_dim
    app = build(model_dir, "cpu", max_batch=6, max_delay=30.0)  # a full queue runs at once
    srv = app.state.server
    assert set(srv.batchers) == {"mlp"} and batch_dim(app.state.repo.models["mlp"].graph) == "N"
    b: Batcher = srv.batchers["mlp"]
    xs = [nonzero_normal(rng, (k, 8)) for k in (1, 2, 3)]

    async def go():
        return await asyncio.gather(*[b.submit({"x": x}, 1, None) for x in xs])
    outs = asyncio.run(go())
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o["p"], reference(model_dir, "mlp", {"x": x})["p"], rtol=1e-5, atol=1e-6)
    assert srv.metrics.executions.labels("mlp")._value.get() == 1
    assert srv.metrics.inferences.labels("mlp")._value.get() == 6
    # the same path behind HTTP: a lone request runs after the queue delay
    srv.batchers["mlp"].max_delay = 0.001
    s = _Uvicorn(app)
    try:
        c = httpclient.InferenceServerClient(s.url)
        assert c.get_model_config("mlp")["max_batch_size"] == 6
        x = nonzero_normal(rng, (2, 8))
        r = c.infer("mlp", [httpclient.InferInput("x", [2, 8], "FP32").set_data_from_numpy(x)], priority=2)
        np.testing.assert_allclose(r.as_numpy("p"), reference(model_dir, "mlp", {"x": x})["p"], rtol=1e-5, atol=1e-6)
        with pytest.raises(InferenceServerException) as e:  # checked before it may join a batch
            c.infer("mlp", [httpclient.InferInput("x", [2, 7], "FP32").set_data_from_numpy(x[:, :7].copy())])
        assert e.value.status() == "400" and "has shape [2, 7]" in e.value.message()
        c.close()
    finally:
        s.stop()


def test_dynamic_batching_keeps_priorities_apart(model_dir, rng):
    """Requests of different priorities never share a batch, and each batch's device task runs
    at its requests' priority (issue L: priorities survive dynamic batching)."""
    app = build(model_dir, "cpu", max_batch=6, max_delay=0.05)
    srv = app.state.server
    b = srv.batchers["mlp"]
    reqs = [(nonzero_normal(rng, (1, 8)), 0), (nonzero_normal(rng, (2, 8)), 0), (nonzero_normal(rng, (3, 8)), 3)]

    async def go():
        return await asyncio.gather(*[b.submit({"x": x}, p, None) for x, p in reqs])
    before = max((t["id"] for t in b.executor.tasks()), default=0)  # (the device is shared by the tests)
    outs = asyncio.run(go())
    ran = [t for t in b.executor.tasks() if t["id"] > before]
    for (x, _), o in zip(reqs, outs):
        np.testing.assert_allclose(o["p"], reference(model_dir, "mlp", {"x": x})["p"], rtol=1e-5, atol=1e-6)
    assert srv.metrics.executions.labels("mlp")._value.get() == 2  # one batch per priority
    for prio in ("0", "3"):  # one run waited at each priority
        assert srv.metrics.registry.get_sample_value(
            "npurun_serve_queue_duration_seconds_count", {"model": "mlp", "priority": prio}) == 1
    assert sorted(t["priority"] for t in ran) == [0, 3]


# ---------------------------------------------------------------- the command

def test_npurun_serve_command(model_dir, tmp_path):
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "npurun", "serve", str(model_dir), "--port", "0",
                          "--token-file", str(tok)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = []
        for line in p.stdout:
            lines.append(line)
            if "models ready on" in line:
                break
        assert "3/3 models ready on http://127.0.0.1:" in lines[-1], lines
        url = lines[-1].split("http://")[1].split()[0]
        assert _get(url, "/v2/health/live")[0] == 200
        assert _get(url, "/v2/health/ready")[0] == 401
        assert _get(url, "/v2/health/ready", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    finally:
        p.terminate()
        p.wait(10)


def test_a_stalled_body_gets_408_and_frees_the_connection(model_dir):
    """A client that sends less body than its Content-Length says, then stalls, is answered
    408 once body_timeout_s has passed; the server serves the next request."""
    import socket
    s = _Uvicorn(build(model_dir, "cpu", settings=Settings(body_timeout_s=0.5)))
    try:
        host, port = s.url.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as c:
            c.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"inputs\": [")
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                chunk = c.recv(4096)
                if not chunk:
                    break
                reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), reply
        assert "did not arrive within 0.5 s" in json.loads(body)["error"]
        assert _get(s.url, "/v2/health/ready")[0] == 200
    finally:
        s.stop()
