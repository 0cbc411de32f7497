"""Soak (issue P): `npurun serve` in a child process under 32 clients for NPURUN_SOAK_S
seconds (60 in `make test`, 600 under `make soak`), KServe v2 requests with faults injected:

- clients that send half a body and vanish (the server counts a 499);
- clients that send a whole ESPCN request and leave before the answer (the run is cancelled);
- per-request timeouts too short for ESPCN (503);
- a model whose kernel fails on the values it is sent (a Reshape to a size that does not fit:
  the failure is the model's, 500, and must not touch the other models);
- a shared-memory input region unregistered while requests read it (200 or 400, never more);
- the served model file replaced, atomically, every few seconds (the loaded plan keeps serving);
- unknown models, malformed JSON (404, 400);
- generation on the OpenAI routes with the bundled storyteller: greedy completions, streamed
  and not (their text checked against the library's), chats, clients that leave mid-stream
  or before a long completion ends (the generation stops: 499), timeouts too short (503),
  bad sampling fields (400).

Asserted at the end: every request the clients sent is in the server's own count; per status,
what the clients saw is what the server counted (a client that left is the server's 499 or a
success nobody read); no 5xx but the faulting model's; MLP answers equal NumPy's; the server's
RSS at rest grew by at most 50 MB after warm-up, its file descriptors and shared-memory mappings are
back to the warm-up's; it left no temporary files; it is still live. The figures go into the
run's summary (and NPURUN_SOAK_FIGURES, one JSON line)."""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
SOAK_S = float(os.environ.get("NPURUN_SOAK_S", "60"))
CLIENTS = 32
RSS_GROWTH_MB = 50
# RSS growth: the server's RSS at rest after the warm-up (the first tenth of the soak, at
# least 10 s, by when every kind of request has run at full concurrency) against its RSS at
# rest at the end. At rest: the clients pause, the server's last requests end, and its malloc
# trimmer (every 2 s) runs. RSS under load swings by ~100 MB with the requests in flight
# (400-token generations, 4K ESPCN bodies), so a sample under load says little about growth;
# those samples are kept as the trend in the figures.
WARMUP_S = max(10.0, SOAK_S / 10)
REST_S = 3.0

pytest.importorskip("uvicorn")


def _save(g, path):
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def _mlp_weights(seed):
    r = np.random.default_rng(seed)
    return r.standard_normal((8, 16)).astype(np.float32), r.standard_normal((16, 4)).astype(np.float32)


def write_mlp(path: Path, seed: int) -> None:
    vi = helper.make_tensor_value_info
    w1, w2 = _mlp_weights(seed)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["p"])],
        "mlp", [vi("x", TensorProto.FLOAT, ["N", 8])], [vi("p", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    _save(g, tmp)
    os.replace(tmp, path)  # atomic: the server never sees half a file


def model_dir(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "espcn_x3.onnx").write_bytes((ROOT / "npurun/zoo/espcn_x3.onnx").read_bytes())
    shutil.copytree(ROOT / "npurun/zoo/storyteller", d / "storyteller")
    write_mlp(d / "mlp.onnx", 0)
    vi = helper.make_tensor_value_info
    # faulty: y = Reshape(x, s), s sent by the client: a size that does not fit fails in the kernel
    _save(helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "faulty",
                            [vi("x", TensorProto.FLOAT, [12]), vi("s", TensorProto.INT64, [2])],
                            [vi("y", TensorProto.FLOAT, None)]), d / "faulty.onnx")
    return d


PROMPTS = ("Once upon a time", "The old man said", "In the morning the")


class Greedy:
    """The library's greedy completion of each (prompt, max_tokens), computed once on demand:
    what the server's answers are checked against."""

    def __init__(self, folder: Path):
        import npurun
        self.gen = npurun.Generator(folder, device="cpu", parallelism=1)
        self.lock = threading.Lock()
        self.done: dict = {}

    def __call__(self, prompt: str, n: int) -> str:
        with self.lock:
            if (prompt, n) not in self.done:
                self.done[prompt, n] = self.gen.generate(prompt, max_new_tokens=n, temperature=0).text
            return self.done[prompt, n]


def _sse(body: bytes) -> tuple[str, bool, int | None]:
    """A streamed completion's text, whether it ended in [DONE], and an error event's code."""
    text, done, code = [], False, None
    for line in body.decode().splitlines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        d = json.loads(line[6:])
        if "error" in d:
            code = d["error"]["code"]
        for c in d.get("choices", []):
            text.append(c["text"] if "text" in c else c["delta"].get("content", ""))
    return "".join(text), done, code


def _pid_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _pid_rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _pid_threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def _pid_shm_maps(pid):
    return sorted({ln.split()[-1] for ln in Path(f"/proc/{pid}/maps").read_text().splitlines()
                   if "/dev/shm/" in ln})


class Client:
    def __init__(self, port):
        self.port = port
        self.conn = None

    def request(self, method, path, body=b"", headers=None, timeout=60):
        for attempt in range(2):  # a keep-alive connection the server closed: one retry, fresh
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise

    def openai(self, route, req, timeout=60):
        return self.request("POST", f"/v1/{route}", json.dumps(req).encode(),
                            {"Content-Type": "application/json"}, timeout)

    def infer(self, model, req, timeout=60):
        return self.request("POST", f"/v2/models/{model}/infer", json.dumps(req).encode(),
                            {"Content-Type": "application/json"}, timeout)


def _raw(port, data: bytes, wait: float = 0.0):
    """A client that sends `data` and leaves (after `wait` s), reading nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    time.sleep(wait)  # (a plain close, FIN: a reset could drop what was sent before the server read it)
    s.close()


def _post_head(model, n, path=None):
    return (f"POST {path or f'/v2/models/{model}/infer'} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {n}\r\n\r\n").encode()


def _leave_stream(port, req: dict) -> bool:
    """Send a streamed generation request, read its first event, and leave. True when an
    event arrived (the server had answered 200)."""
    body = json.dumps(req).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(_post_head("", len(body), "/v1/completions") + body)
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got.startswith(b"HTTP/1.1 200")
    finally:
        s.close()


def _metrics(client) -> tuple[Counter, Counter]:
    status, text = client.request("GET", "/metrics")
    assert status == 200
    req, fail = Counter(), Counter()
    for line in text.decode().splitlines():
        m = re.match(r'npurun_serve_requests_total\{model="([^"]*)"\} (\S+)', line)
        if m:
            req[m[1]] += int(float(m[2]))
        m = re.match(r'npurun_serve_request_failures_total\{code="(\d+)",model="([^"]*)"\} (\S+)', line) or \
            re.match(r'npurun_serve_request_failures_total\{model="([^"]*)",code="(\d+)"\} (\S+)', line)
        if m:
            a, b, v = m.groups()
            code = a if a.isdigit() else b
            fail[int(code)] += int(float(v))
    return req, fail


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = 0
        self.seen = Counter()    # status -> responses the clients read
        self.left = Counter()    # kind -> requests whose client left before the answer
        self.by_kind = Counter()
        self.bad = []            # what must not happen, with the evidence

    def add(self, kind, status=None, left=False):
        with self.lock:
            self.sent += 1
            self.by_kind[kind] += 1
            if left:
                self.left[kind] += 1
            else:
                self.seen[status] += 1

    def fail(self, msg):
        with self.lock:
            self.bad.append(msg)


def _generation(c, port, kind, rng, tally, greedy):
    """One request of the OpenAI routes (the storyteller model)."""
    prompt = str(rng.choice(PROMPTS))
    n = int(rng.integers(1, 13))
    base = {"model": "storyteller", "prompt": prompt, "max_tokens": n, "temperature": 0}
    if kind == "complete":
        status, body = c.openai("completions", base)
        tally.add(kind, status)
        if status != 200:
            tally.fail(f"completion: {status} {body[:200]!r}")
        elif (got := json.loads(body)["choices"][0]["text"]) != (want := greedy(prompt, n)):
            tally.fail(f"completion of {prompt!r} ({n} tokens): {got!r}, the library says {want!r}")
    elif kind == "complete_stream":
        status, body = c.openai("completions", {**base, "stream": True})
        text, done, code = _sse(body) if status == 200 else ("", False, None)
        tally.add(kind, code or status)
        if status != 200 or code is not None or not done:
            tally.fail(f"streamed completion: {status} {body[-200:]!r}")
        elif text != (want := greedy(prompt, n)):
            tally.fail(f"streamed completion of {prompt!r} ({n} tokens): {text!r}, the library says {want!r}")
    elif kind == "chat":
        status, body = c.openai("chat/completions", {"model": "storyteller", "max_tokens": n, "seed": int(rng.integers(1 << 30)),
                                                     "messages": [{"role": "user", "content": prompt}]})
        tally.add(kind, status)
        if status != 200 or not isinstance(json.loads(body)["choices"][0]["message"]["content"], str):
            tally.fail(f"chat: {status} {body[:200]!r}")
    elif kind == "gen_leave":  # a long generation its client leaves: mid-stream or before the answer
        req = {**base, "max_tokens": 400, "ignore_eos": True}
        if rng.integers(0, 2):
            _leave_stream(port, {**req, "stream": True})
        else:
            body = json.dumps(req).encode()
            _raw(port, _post_head("", len(body), "/v1/completions") + body, wait=0.02)
        tally.add(kind, left=True)
    elif kind == "gen_timeout":
        status, body = c.openai("completions", {**base, "max_tokens": 400, "ignore_eos": True, "timeout": 0.005})
        tally.add(kind, status)
        if status != 503:
            tally.fail(f"generation timeout: {status} {body[:200]!r}")
    elif kind == "gen_bad":
        bad = [({**base, "max_tokens": -1}, 400), ({**base, "top_p": "x"}, 400), ({**base, "model": "nope"}, 404)]
        req, want = bad[int(rng.integers(0, len(bad)))]
        status, body = c.openai("completions", req)
        tally.add(kind, status)
        if status != want:
            tally.fail(f"bad generation request {req}: {status}, expected {want}: {body[:200]!r}")


GENERATION = ("complete", "complete_stream", "chat", "gen_leave", "gen_timeout", "gen_bad")


def _worker(port, k, stop, tally, shm_x, greedy, go):
    rng = np.random.default_rng(1000 + k)
    c = Client(port)
    w1, w2 = _mlp_weights(0)  # every mlp.onnx written has the same weights: answers stay checkable
    while not stop.is_set():
        go.wait()
        kind = rng.choice(["mlp", "mlp", "mlp", "mlp", "espcn", "faulty", "bad", "halfbody", "leave",
                           "timeout", "shm", "complete", "complete", "complete_stream", "complete_stream",
                           "chat", "gen_leave", "gen_timeout", "gen_bad"])
        try:
            if kind in GENERATION:
                _generation(c, port, kind, rng, tally, greedy)
                continue
            if kind == "mlp":
                n = int(rng.integers(1, 5))
                x = rng.standard_normal((n, 8)).astype(np.float32)
                status, body = c.infer("mlp", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [n, 8],
                                                           "data": x.ravel().tolist()}]})
                tally.add(kind, status)
                if status != 200:
                    tally.fail(f"mlp: {status} {body[:200]!r}")
                    continue
                got = np.array(json.loads(body)["outputs"][0]["data"], np.float32).reshape(n, 4)
                want = np.maximum(x @ w1, 0) @ w2
                if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                    tally.fail(f"mlp answered {got.tolist()}, NumPy says {want.tolist()}")
            elif kind == "espcn":
                x = rng.random((1, 1, 24, 32), np.float32)
                status, body = c.infer("espcn_x3", {"inputs": [{"name": "input", "datatype": "FP32",
                                                                "shape": [1, 1, 24, 32], "data": x.ravel().tolist()}]})
                tally.add(kind, status)
                if status != 200:
                    tally.fail(f"espcn: {status} {body[:200]!r}")
            elif kind == "faulty":
                fits = bool(rng.integers(0, 2))
                s = [3, 4] if fits else [5, 5]
                status, body = c.infer("faulty", {"inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [12], "data": rng.random(12).tolist()},
                    {"name": "s", "datatype": "INT64", "shape": [2], "data": s}]})
                tally.add(kind, status)
                if status != (200 if fits else 500):
                    tally.fail(f"faulty with shape {s}: {status} {body[:200]!r}")
            elif kind == "bad":
                if rng.integers(0, 2):
                    status, body = c.request("POST", "/v2/models/mlp/infer", b'{"inputs": [', {})
                    want = 400
                else:
                    status, body = c.infer("no_such_model", {"inputs": []})
                    want = 404
                tally.add(kind, status)
                if status != want:
                    tally.fail(f"bad request: {status}, expected {want}: {body[:200]!r}")
            elif kind == "halfbody":
                _raw(port, _post_head("mlp", 1000) + b'{"inputs": [{"name"', wait=0.01)
                tally.add(kind, left=True)
            elif kind == "leave":
                x = rng.random((1, 1, 120, 160), np.float32)
                body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 120, 160],
                                               "data": x.ravel().tolist()}]}).encode()
                _raw(port, _post_head("espcn_x3", len(body)) + body, wait=0.005)
                tally.add(kind, left=True)
            elif kind == "timeout":
                x = rng.random((1, 1, 120, 160), np.float32)
                status, body = c.infer("espcn_x3", {"parameters": {"timeout": 1},  # 1 us
                                                    "inputs": [{"name": "input", "datatype": "FP32",
                                                                "shape": [1, 1, 120, 160],
                                                                "data": x.ravel().tolist()}]})
                tally.add(kind, status)
                if status not in (200, 503):
                    tally.fail(f"timeout: {status} {body[:200]!r}")
            elif kind == "shm":  # the region may be unregistered at any moment (the shm thread)
                status, body = c.infer("mlp", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8],
                                                           "parameters": {"shared_memory_region": "soak_in",
                                                                          "shared_memory_byte_size": 64}}]})
                tally.add(kind, status)
                if status == 200:
                    got = np.array(json.loads(body)["outputs"][0]["data"], np.float32).reshape(2, 4)
                    if not np.allclose(got, np.maximum(shm_x @ w1, 0) @ w2, rtol=1e-4, atol=1e-4):
                        tally.fail(f"shm input answered {got.tolist()}")
                elif status != 400:
                    tally.fail(f"shm: {status} {body[:200]!r}")
        except Exception as e:  # noqa: BLE001 -- a client-side failure is a soak failure, with its cause
            tally.fail(f"{kind}: {type(e).__name__}: {e}")
            c = Client(port)


def _shm_churn(port, stop, key, tally, go):
    """Register and unregister the input region over and over, racing the workers' reads."""
    c = Client(port)
    body = json.dumps({"key": key, "offset": 0, "byte_size": 64}).encode()
    while not stop.is_set():
        go.wait()
        for path, data in (("register", body), ("unregister", b"")):
            status, text = c.request("POST", f"/v2/systemsharedmemory/region/soak_in/{path}", data,
                                     {"Content-Type": "application/json"})
            if status != 200:
                tally.fail(f"shm {path}: {status} {text[:200]!r}")
            time.sleep(0.02)


def _replace_model(d: Path, stop):
    while not stop.wait(3.0):
        write_mlp(d / "mlp.onnx", 0)


@pytest.mark.soak
def test_soak(tmp_path):
    from conftest import SUMMARY
    d = model_dir(tmp_path / "models")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    key = f"/npurun-soak-{uuid.uuid4().hex[:8]}"
    shm_file = Path("/dev/shm") / key[1:]
    shm_x = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)
    shm_file.write_bytes(shm_x.tobytes())
    env = {**os.environ, "TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "npurun.cli", "serve", str(d), "--port", "0", "--threads", "1",
                          "--log-level", "error", "--body-timeout", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        port = None
        for line in p.stdout:
            m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m[1])
                break
        assert port, f"the server did not start: {p.stderr.read()[-3000:]}"
        threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()  # drain
        tally, stop, go = Tally(), threading.Event(), threading.Event()
        go.set()
        greedy = Greedy(d / "storyteller")
        threads = [threading.Thread(target=_worker, args=(port, k, stop, tally, shm_x, greedy, go), daemon=True)
                   for k in range(CLIENTS)]
        threads += [threading.Thread(target=_shm_churn, args=(port, stop, key, tally, go), daemon=True),
                    threading.Thread(target=_replace_model, args=(d, stop), daemon=True)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(WARMUP_S)
        go.clear()  # at rest: RSS and fds once the requests in flight have ended
        time.sleep(REST_S)
        rss0, fds0 = _pid_rss_mb(p.pid), _pid_fds(p.pid)
        go.set()
        trend = [round(rss0)]  # RSS every tenth of the soak after warm-up (under load)
        threads_trend = [_pid_threads(p.pid)]
        while time.monotonic() - t0 < SOAK_S:
            time.sleep(min((SOAK_S - WARMUP_S) / 10, max(0.0, SOAK_S - (time.monotonic() - t0))))
            trend.append(round(_pid_rss_mb(p.pid)))
            threads_trend.append(_pid_threads(p.pid))
        stop.set()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - t0
        assert not any(t.is_alive() for t in threads), "a client thread is stuck"
        c = Client(port)
        c.request("POST", "/v2/systemsharedmemory/unregister")
        # The server counts a vanished client when it notices (its body read or its run ends).
        deadline = time.monotonic() + 30
        while True:
            req, fail = _metrics(c)
            if sum(req.values()) >= tally.sent or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(REST_S)
        req, fail = _metrics(c)
        rss1, fds1 = _pid_rss_mb(p.pid), _pid_fds(p.pid)
        live = c.request("GET", "/v2/health/live")[0]
        maps = _pid_shm_maps(p.pid)
        c.conn.close()
        alive = p.poll() is None
    finally:
        p.terminate()
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        shm_file.unlink(missing_ok=True)

    ok = tally.seen[200]
    server_ok = sum(req.values()) - sum(fail.values())
    fig = {"target": "soak", "seconds": round(elapsed, 1), "clients": CLIENTS, "sent": tally.sent,
           "kinds": dict(tally.by_kind), "client_saw": {str(k): v for k, v in sorted(tally.seen.items())},
           "client_left": sum(tally.left.values()), "server_counted": sum(req.values()),
           "server_failures": {str(k): v for k, v in sorted(fail.items())},
           "rss_warm_mb": round(rss0, 1), "rss_end_mb": round(rss1, 1), "rss_trend_mb": trend, "threads_trend": threads_trend, "fds_warm": fds0, "fds_end": fds1}
    SUMMARY.append(f"soak: {elapsed:.0f} s, {CLIENTS} clients, {tally.sent} requests ({ok} 2xx; "
                   + ", ".join(f"{k} {v}" for k, v in sorted(tally.seen.items()) if k != 200)
                   + f"; {fig['client_left']} clients left mid-request); server counted {sum(req.values())}, "
                   f"failures {dict(sorted(fail.items()))}; RSS at rest {rss0:.0f} MB after warm-up, {rss1:.0f} MB at "
                   f"the end (under load: {' '.join(map(str, trend[1:]))}); threads {' '.join(map(str, threads_trend))}; "
                   f"fds {fds0} -> {fds1}")
    if os.environ.get("NPURUN_SOAK_FIGURES"):
        with open(os.environ["NPURUN_SOAK_FIGURES"], "a") as f:
            f.write(json.dumps(fig) + "\n")

    assert not tally.bad, f"{len(tally.bad)} bad answers, first: {tally.bad[:5]}"
    assert alive and live == 200, f"the server is not live at the end: {err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    assert sum(req.values()) == tally.sent, (req, tally.sent)
    # per status, what clients read is what the server counted; a client that left is a 499 or
    # a success nobody read
    for code, n in fail.items():
        if code != 499:
            assert tally.seen[code] == n, (code, tally.seen, fail)
    assert server_ok - ok + fail[499] == sum(tally.left.values()), (server_ok, ok, fail, tally.left)
    assert set(fail) <= {400, 404, 499, 500, 503}, fail
    assert fail[500] == tally.seen[500] <= tally.by_kind["faulty"], "a 5xx from a model that does not fault"
    assert rss1 - rss0 <= RSS_GROWTH_MB, f"RSS grew {rss1 - rss0:.0f} MB after warm-up ({rss0:.0f} -> {rss1:.0f})"
    assert fds1 <= fds0 + 2, f"file descriptors {fds0} at warm-up, {fds1} at the end"
    assert not maps, f"shared memory still mapped after unregistering everything: {maps}"
    assert not list(tmpdir.iterdir()), f"temporary files left: {list(tmpdir.iterdir())}"
    assert not [f for f in d.iterdir() if f.name.startswith(".mlp.onnx.")], "a half-written model file"
