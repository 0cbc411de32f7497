"""Fuzz target: the KServe v2 routes of `npurun serve` over real HTTP (uvicorn in the child).
Three kinds of case:

- schemathesis against the server's Open Inference Protocol description
  (docs/openapi/open_inference_v2.yaml), valid and invalid requests for every operation,
  model names drawn from the served ones half the time;
- binary tensor requests: the JSON header and the bytes after it split by a lying
  `Inference-Header-Content-Length` (negative, 0, off by one, 2^64, not a number),
  `binary_data_size`s that do not add up, truncated or extended bodies, gzip/deflate bodies
  (corrupt too), Content-Length lies, tiny timeouts and odd priorities;
- JSON nested 10^3 to 1.5x10^5 deep (the issue's 500).

Pass: a 2xx whose body parses, or a 4xx with a JSON {"error": "..."}; a 503 only for a
request whose own `parameters.timeout` expired (Triton's answer). Never a 5xx otherwise, a
dropped connection or a hang. The OpenAI-compatible routes (issue M) do not exist yet.
"""
from __future__ import annotations

import gzip
import json
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzzkit
import served
from mutate import INTERESTING_INTS

SPEC = served.ROOT / "docs/openapi/open_inference_v2.yaml"
DTYPES = ["FP32", "INT64", "BOOL", "FP16", "BYTES", "BF16", "UINT8", "INT8", "FP64", "X"]
INPUTS = {"espcn_x3": [("input", [1, 1, 3, 3], "FP32")], "mlp": [("x", [2, 8], "FP32")],
          "addint": [("a", [3], "INT64"), ("b", [3], "INT64")]}


# ---------------------------------------------------------------- binary requests

@st.composite
def binary_request(draw):
    model = draw(st.sampled_from(sorted(INPUTS)))
    tensors, blobs = [], []
    for name, shape, dt in INPUTS[model]:
        dt = draw(st.sampled_from([dt] * 4 + DTYPES))
        shape = draw(st.sampled_from([shape] * 4 + [[], [0], [2**31, 2**31], [-1, 8], [1, 1, 2**20, 2**20], [3, 8]]))
        n = int(np.prod(shape)) if shape and all(d >= 0 for d in shape) and np.prod(shape, dtype=float) < 1e6 else 3
        raw = np.random.default_rng(draw(st.integers(0, 99))).standard_normal(n).astype(np.float32).tobytes()
        if dt == "INT64":
            raw = np.arange(n, dtype=np.int64).tobytes()
        raw = raw[:draw(st.sampled_from([len(raw)] * 3 + [0, 1, max(0, len(raw) - 1)]))]
        size = draw(st.sampled_from([len(raw)] * 3 + INTERESTING_INTS + [len(raw) + 1]))
        t = {"name": draw(st.sampled_from([name] * 4 + ["nope", "", name * 100])), "shape": shape, "datatype": dt,
             "parameters": {"binary_data_size": size}}
        if draw(st.integers(0, 9)) == 0:
            t["data"] = [1.0] * 3
        tensors.append(t)
        blobs.append(raw)
    params = draw(st.fixed_dictionaries({}, optional={
        "priority": st.sampled_from([0, 1, 4, 5, -1, 2**63, 1.5, "1", None]),
        "timeout": st.sampled_from([0, 1, 10, 10**6, -1, 2**64, 1e308, "x"]),
        "binary_data_output": st.sampled_from([True, False, 1, "yes"])}))
    head = {"inputs": tensors, "parameters": params}
    if draw(st.booleans()):
        head["outputs"] = [{"name": draw(st.sampled_from(["p", "output", "s", "gt", "nope"])),
                            "parameters": {"binary_data": draw(st.booleans())}}]
    text = json.dumps(head).encode()
    body = text + b"".join(blobs) + draw(st.sampled_from([b"", b"", b"x", b"\x00" * 7]))
    ihcl = draw(st.sampled_from([str(len(text))] * 4 + [str(len(text) + d) for d in (-1, 1, -len(text))]
                                + ["-1", "abc", str(2**64), " 12", "1e3", "", None]))
    headers = {} if ihcl is None else {"Inference-Header-Content-Length": ihcl}
    enc = draw(st.sampled_from([None] * 6 + ["gzip", "deflate", "gzip-corrupt", "br", "identity"]))
    if enc == "gzip":
        body = gzip.compress(body)
    elif enc == "deflate":
        body = zlib.compress(body)
    elif enc == "gzip-corrupt":
        body, enc = gzip.compress(body)[:-9] + b"\xff" * 9, "gzip"
    if enc:
        headers["Content-Encoding"] = enc
    cl = draw(st.sampled_from([None] * 8 + ["-5", "abc", str(len(body) - 1)]))
    if cl is not None:
        headers["Content-Length"] = cl
    path = f"/v2/models/{model}" + draw(st.sampled_from(["", "", "/versions/1", "/versions/2"])) + "/infer"
    return path, body, headers, "timeout" in params


def deep_json(kind: str, depth: int) -> bytes:
    if kind == "data":
        inner = "[" * depth + "1" + "]" * depth
        return ('{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": ' + inner + "}]}").encode()
    if kind == "object":
        return ('{"a": ' * depth + "1" + "}" * depth).encode()
    return ("[" * depth + "]" * depth).encode()


DEEP = st.tuples(st.sampled_from(["data", "object", "array"]),
                 st.sampled_from([1000, 3000, 10_000, 100_000, 150_000]),
                 st.sampled_from(["/v2/models/mlp/infer", "/v2/systemsharedmemory/region/r/register",
                                  "/v2/repository/index"]))


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    import requests
    import schemathesis
    from schemathesis import GenerationMode
    srv = served.start(Path(tempfile.mkdtemp(prefix="npurun-fuzz-serve-")), body_timeout_s=0.3)
    schema = schemathesis.openapi.from_path(str(SPEC))
    ops = [o.ok() for o in schema.get_all_operations()]
    session = requests.Session()
    api = st.one_of(*[op.as_strategy(generation_mode=m) for op in ops
                      for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)])

    def call_api(case, model):
        if model and "model_name" in (case.path_parameters or {}):
            case.path_parameters["model_name"] = model
            if "model_version" in case.path_parameters:
                case.path_parameters["model_version"] = "1"
        try:
            r = case.call(base_url=srv.url, session=session, timeout=30)
        except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, UnicodeError, ValueError) as e:
            stats.notes["not sendable by the client (skipped)"] += 1  # requests refused to send it
            return type(e).__name__
        # (schemathesis's response holds each header as a list of values)
        served.check_answer(r.status_code, {k.lower(): v[0] if isinstance(v, list) else v for k, v in r.headers.items()},
                     r.content, stats, False)
        stats.notes["schemathesis"] += 1

    def call_binary(path, body, headers, timeout_asked):
        try:
            status, h, data = served.post(srv, path, body, headers)
        except (ConnectionResetError, BrokenPipeError):
            # uvicorn answers a non-numeric Content-Length with 400 and closes at once; the
            # body still in flight makes the kernel reset the connection before we read it.
            assert not headers.get("Content-Length", "0").isdigit(), "the server dropped a well-formed request"
            assert served.post(srv, "/v2/health/live", b"", method="GET")[0] == 200
            stats.notes["400 from uvicorn (not HTTP)"] += 1
            return
        served.check_answer(status, h, data, stats, timeout_asked)
        stats.notes["binary"] += 1

    def call_deep(kind, depth, path):
        status, h, data = served.post(srv, path, deep_json(kind, depth), {"Content-Type": "application/json"})
        served.check_answer(status, h, data, stats, False)
        assert status in (400, 413) or depth < 1000 or path.endswith("index"), (status, data[:200])  # (index reads no body)
        stats.notes["deep JSON"] += 1

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(st.one_of(st.tuples(st.just("api"), api, st.sampled_from(list(served.MODELS) + [None] * 3)),
                     st.tuples(st.just("binary"), binary_request()),
                     st.tuples(st.just("deep"), DEEP)))
    def case(c):
        if c[0] == "api":
            stats.case(call_api, c[1], c[2])
        elif c[0] == "binary":
            stats.case(call_binary, *c[1])
        else:
            stats.case(call_deep, *c[1])

    try:
        case()
    finally:
        srv.stop()


@pytest.mark.fuzz
def test_fuzz_kserve_routes():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_serve"))


# ---------------------------------------------------------------- what it found (fixed)

@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = served.start(tmp_path_factory.mktemp("serve"), max_body_bytes=4 << 20)
    yield s
    s.stop()


@pytest.mark.parametrize("kind", ["data", "object", "array"])
@pytest.mark.parametrize("path, depth", [("/v2/models/mlp/infer", 150_000),
                                         ("/v2/systemsharedmemory/region/r/register", 5000)])  # (64 KB limit)
def test_json_nested_150000_deep_is_a_400(srv, kind, path, depth):
    """The issue's first finding: a body nested 100,000 deep got a 500 (RecursionError)."""
    status, _, body = served.post(srv, path, deep_json(kind, depth))
    assert status == 400 and "nested too deep" in json.loads(body)["error"], (status, body[:200])
    assert served.post(srv, "/v2/models/mlp/infer", json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}]}).encode())[0] == 200


def test_a_client_gone_mid_body_is_counted_499_not_500(srv):
    """A client that closes the connection halfway through its body was answered (to nobody)
    and counted as a 500 internal error; it is a 499 now."""
    import socket
    import time
    m = srv.app.state.server.metrics
    before = m.failures.labels("mlp", "500")._value.get()
    gone = m.failures.labels("mlp", "499")._value.get()
    with socket.create_connection((srv.host, srv.port)) as c:
        c.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\": [")
        time.sleep(0.2)
    for _ in range(100):
        if m.failures.labels("mlp", "499")._value.get() > gone:
            break
        time.sleep(0.05)
    assert m.failures.labels("mlp", "499")._value.get() == gone + 1
    assert m.failures.labels("mlp", "500")._value.get() == before
