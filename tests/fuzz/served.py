"""A real `npurun serve` app on uvicorn in a thread, for the HTTP fuzz targets: a folder with
the bundled ESPCN, an MLP (x: [N, 8] f32 -> p: [N, 4]) and an integer model (a, b: [3] i64
-> s, gt), tight limits so the limit paths are reached often."""
from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("espcn_x3", "mlp", "addint")


def model_dir(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "espcn_x3.onnx").write_bytes((ROOT / "npurun/zoo/espcn_x3.onnx").read_bytes())
    r = np.random.default_rng(0)
    vi = helper.make_tensor_value_info
    mlp = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["l"]), helper.make_node("Softmax", ["l"], ["p"], axis=-1)],
        "mlp", [vi("x", TensorProto.FLOAT, ["N", 8])], [vi("p", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(r.standard_normal((8, 16)).astype(np.float32), "w1"),
         numpy_helper.from_array(r.standard_normal((16, 4)).astype(np.float32), "w2")])
    addint = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Greater", ["a", "b"], ["gt"])], "addint",
        [vi(n, TensorProto.INT64, [3]) for n in "ab"], [vi("s", TensorProto.INT64, [3]), vi("gt", TensorProto.BOOL, [3])])
    for name, g in (("mlp", mlp), ("addint", addint)):
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), d / f"{name}.onnx")
    return d


class Server:
    """uvicorn serving `app` on a free loopback port, in a daemon thread."""

    def __init__(self, app):
        import uvicorn

        from npurun.commands.serve import listen_socket
        self.app = app
        self.sock = listen_socket()
        self.sock.bind(("127.0.0.1", 0))
        self.host, self.port = self.sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="critical", timeout_keep_alive=30))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        for _ in range(1000):
            if self.server.started:
                return
            time.sleep(0.01)
        raise RuntimeError("the server did not start")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def start(tmp: Path, **settings):
    from npurun.serve import Settings, build
    s = dict(max_body_bytes=1 << 20, max_tensor_bytes=256 << 10, body_timeout_s=1.0)
    s.update(settings)
    app = build(model_dir(tmp / "models"), "cpu", threads=1, settings=Settings(**s))
    return Server(app)


def post(srv: Server, path: str, body: bytes, headers: dict | None = None, timeout: float = 30, method="POST"):
    """(status, headers, body bytes) of one request (a POST unless `method`) on a fresh connection."""
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def check_answer(status: int, headers: dict, body: bytes, stats, timeout_asked: bool) -> None:
    """The pass rule of one HTTP answer: a 2xx whose body parses, or a 4xx with a JSON
    {"error": "..."}; a 503 only for a request whose own parameters.timeout expired."""
    ctype = headers.get("content-type", "")
    if status == 400 and body == b"Invalid HTTP request received.":
        stats.notes["400 from uvicorn (not HTTP)"] += 1  # below the app: no JSON body to give
        return
    if status >= 400:
        assert ctype.startswith("application/json"), (status, ctype, body[:300])
        err = json.loads(body)
        assert isinstance(err, dict) and isinstance(err.get("error"), str) and err["error"], (status, body[:300])
        if status == 503 and timeout_asked and "timeout expired" in err["error"]:
            stats.notes["503 for an expired request timeout"] += 1
            return
        assert status < 500, f"a {status}: {err['error']}"
        stats.notes[f"{status}"] += 1
        return
    assert 200 <= status < 300, (status, body[:300])
    stats.notes["2xx"] += 1
    n = headers.get("inference-header-content-length")
    if n is not None:
        json.loads(body[:int(n)])
    elif ctype.startswith("application/json"):
        json.loads(body)
