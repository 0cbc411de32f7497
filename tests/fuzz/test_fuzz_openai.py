"""Fuzz target: the OpenAI-compatible routes of `npurun serve` (issue M) over real HTTP, with
the bundled story model served as a generative sub-folder beside the KServe models. Cases:

- request bodies drawn by hypothesis: the model name, prompts as text (any Unicode) or token
  ids (negative, huge, floats, nested), chat messages of every shape (missing or non-string
  roles and contents, content parts), sampling fields of the wrong type or range (negative,
  NaN, 2^63, strings), stop lists, stream and stream_options, n, unsupported fields, npurun's
  priority and timeout;
- bodies that are not JSON objects: arrays, scalars, invalid UTF-8, truncated JSON, and JSON
  nested up to 150,000 deep.

Pass: a 2xx whose body is a completion (or, streamed, server-sent events that are each JSON
and end in `data: [DONE]`), or a 4xx with OpenAI's {"error": {"message": ...}}; a 503 (or an
error event in a stream) only for a request that asked for a timeout. Never a 5xx otherwise,
a dropped connection or a hang.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzzkit
import served

WEIRD_NUMBERS = [0, 1, -1, 0.5, 2.5, float("nan"), float("inf"), 2**63, -2**63, 1e308, "1", None, True, [1]]
TOKENS = st.one_of(st.integers(0, 2047), st.sampled_from([-1, 2048, 2**31, 2**63, 1.5, "3", None, True]))


VALID = {"max_tokens": st.integers(0, 12), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
         "top_k": st.integers(0, 50), "repetition_penalty": st.floats(0.5, 2), "seed": st.integers(0, 2**64),
         "stop": st.lists(st.text(max_size=3), max_size=2), "stream": st.booleans(),
         "stream_options": st.just({"include_usage": True}), "ignore_eos": st.booleans(),
         "priority": st.integers(0, 3), "timeout": st.sampled_from([1e-6, 0.5, 30])}


@st.composite
def body(draw):
    """Half the time every field is valid (the request reaches the model), half the time
    each field may be anything."""
    chat = draw(st.booleans())
    if draw(st.booleans()):
        req = {"model": "storyteller"}
        if chat:
            req["messages"] = draw(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                                                   "content": st.text(max_size=40)}),
                                            min_size=1, max_size=3))
        else:
            req["prompt"] = draw(st.one_of(st.text(min_size=1, max_size=60), st.lists(st.integers(0, 2047),
                                                                                     min_size=1, max_size=12)))
        req.update(draw(st.fixed_dictionaries({"max_tokens": VALID["max_tokens"]},
                                               optional={k: v for k, v in VALID.items() if k != "max_tokens"})))
        return ("/v1/chat/completions" if chat else "/v1/completions"), req
    req = {"model": draw(st.sampled_from(["storyteller"] * 6 + ["nope", "", 5, None, ["storyteller"]]))}
    if chat:
        role = st.sampled_from(["user", "system", "assistant", "", 7, None])
        content = st.one_of(st.text(max_size=40), st.sampled_from([None, 3, {"x": 1}]),
                            st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", 1]),
                                                            "text": st.text(max_size=10)}), max_size=3))
        msg = st.fixed_dictionaries({}, optional={"role": role, "content": content})
        req["messages"] = draw(st.one_of(st.lists(msg, max_size=4), st.sampled_from([None, "hi", {}, [[]]])))
    else:
        req["prompt"] = draw(st.one_of(st.text(max_size=60), st.lists(TOKENS, max_size=12),
                                       st.sampled_from([None, [], [[1, 2]], [["a"]], {"a": 1}, 5, ["a", "b"]])))
    fields = {"max_tokens": st.sampled_from([0, 1, 4, 8, -1, 2**63, "8", None, 1.5]),
              "max_completion_tokens": st.sampled_from([1, 4, 0, None]),
              "temperature": st.sampled_from(WEIRD_NUMBERS), "top_p": st.sampled_from(WEIRD_NUMBERS),
              "top_k": st.sampled_from(WEIRD_NUMBERS), "repetition_penalty": st.sampled_from(WEIRD_NUMBERS),
              "seed": st.sampled_from([0, 7, -1, 2**64, 2**200, "1", 1.5, None]),
              "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3),
                                st.sampled_from([None, 1, [1], [None]])),
              "stream": st.sampled_from([True, False, None, 1, "yes"]),
              "stream_options": st.sampled_from([{"include_usage": True}, {}, None, "x", {"include_usage": 2}]),
              "n": st.sampled_from([1, 2, 0, None, "1"]), "logprobs": st.sampled_from([None, True, 3]),
              "ignore_eos": st.sampled_from([True, False, None, "x"]),
              "priority": st.sampled_from([0, 1, 3, 4, -1, 2**63, 1.5, "1", None]),
              "timeout": st.sampled_from([1e-6, 0.001, 10, 0, -1, "x", 2**64, None])}
    req.update(draw(st.fixed_dictionaries({}, optional=fields)))
    if req.get("max_tokens") == 2**63 or req.get("max_completion_tokens") is None and req.get("max_tokens") is None:
        req["max_tokens"] = 8  # (the rest of the context would be a long run, not a fuzz case)
    return ("/v1/chat/completions" if chat else "/v1/completions"), req


RAW = st.sampled_from([b"", b"[]", b"1", b'"x"', b"null", b"{", b'{"model": "storyteller", "prompt": "a"',
                       b"\xff\xfe\x00", b'{"model": "storyteller", "prompt": "\\ud800"}',
                       b"[" * 150_000 + b"]" * 150_000, b'{"a": ' * 3000 + b"1" + b"}" * 3000])


def check(status: int, headers: dict, data: bytes, stats, timeout_asked: bool) -> None:
    ctype = headers.get("content-type", "")
    if status >= 400:
        assert ctype.startswith("application/json"), (status, ctype, data[:300])
        err = json.loads(data)["error"]
        assert isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"], (status, data[:300])
        if status == 503 and timeout_asked:
            stats.notes["503 for an expired request timeout"] += 1
            return
        assert status < 500, f"a {status}: {err['message']}"
        stats.notes[str(status)] += 1
        return
    assert status == 200, (status, data[:300])
    if ctype.startswith("text/event-stream"):
        events = [e for e in data.decode().split("\n\n") if e]
        assert events and events[-1] == "data: [DONE]", events[-3:]
        for e in events[:-1]:
            assert e.startswith("data: "), e[:200]
            chunk = json.loads(e[6:])
            if "error" in chunk:  # after the headers an error can only be an event
                assert timeout_asked, chunk
                stats.notes["stream ended by its timeout"] += 1
        stats.notes["200 streamed"] += 1
        return
    out = json.loads(data)
    assert out["choices"] and out["usage"]["completion_tokens"] >= 0, out
    stats.notes["200"] += 1


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="npurun-fuzz-openai-"))
    served.model_dir(tmp / "models")
    shutil.copytree(served.ROOT / "npurun/zoo/storyteller", tmp / "models" / "storyteller")
    from npurun.serve import Settings, build
    app = build(tmp / "models", "cpu", threads=1, settings=Settings(max_body_bytes=1 << 20, body_timeout_s=1.0))
    srv = served.Server(app)

    def call(path, payload, timeout_asked):
        status, h, data = served.post(srv, path, payload, {"Content-Type": "application/json"})
        check(status, h, data, stats, timeout_asked)

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(st.one_of(body().map(lambda b: ("json", b)), RAW.map(lambda r: ("raw", r))),
           st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    def case(c, raw_path):
        if c[0] == "json":
            path, req = c[1]
            stats.case(call, path, json.dumps(req).encode(), req.get("timeout") is not None)
        else:
            stats.case(call, raw_path, c[1], False)
            stats.notes["not a JSON object"] += 1

    try:
        case()
        assert served.post(srv, "/v2/health/live", b"", method="GET")[0] == 200
    finally:
        srv.stop()


@pytest.mark.fuzz
def test_fuzz_openai_routes():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_openai"))
