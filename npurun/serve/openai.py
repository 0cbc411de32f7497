"""OpenAI-compatible routes of `npurun serve` for the generative models of MODEL_DIR (its
sub-folders holding a decoder: models.py), beside the KServe v2 routes:

    GET  /v1/models                 the generative models
    POST /v1/completions            {"model", "prompt": text | [ids], "max_tokens", "stream", ...}
    POST /v1/chat/completions       {"model", "messages": [{"role", "content"}], ...}

Sampling fields as OpenAI names them (temperature, default 1; top_p; max_tokens, also
max_completion_tokens; stop; seed; n = 1 only), plus top_k, repetition_penalty and
ignore_eos as vLLM takes them, and npurun's `priority` (0 highest .. 3) and `timeout` (seconds): each decode step
is a task of the device's scheduler at that priority, so a chat that must feel live shares the
device with background jobs. `stream: true` answers with server-sent events, one
`data: {chunk}` per token, ending in `data: [DONE]`; `stream_options: {"include_usage": true}`
adds a last chunk with the usage block. The chat prompt is the model's chat template
(tokenizer_config.json or chat_template.jinja), rendered in a sandbox.

Errors are OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for a bad
request, 404 for an unknown model, 503 for a model that is not ready or a timeout.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, StreamingResponse

from ..errors import InputError, NpurunError
from ..runtime.scheduler import TaskCancelled, TaskTimeout
from .app import disconnected, read_body
from .protocol import ServeError, loads_json

OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "invalid_request_error", 503: "server_error"}
IGNORED_IF_DEFAULT = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": None, "logit_bias": None,
                      "echo": False, "best_of": 1, "suffix": None, "top_logprobs": None, "tools": None}


def error(status: int, msg: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": msg, "type": OPENAI_TYPES.get(status, "server_error"),
                                   "param": param, "code": status}}, status)


class OpenAIRoutes:
    def __init__(self, server):
        self.server = server

    @property
    def repo(self):
        return self.server.repo

    async def models(self, request):
        data = [{"id": g.name, "object": "model", "created": g.created, "owned_by": "npurun",
                 "ready": g.ready, **({"reason": g.reason} if g.reason else {})}
                for g in self.repo.generators.values()]
        return JSONResponse({"object": "list", "data": data})

    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat(self, request):
        return await self._handle(request, chat=True)

    async def _handle(self, request, chat: bool):
        s = self.server
        t0 = time.perf_counter()
        label = ""  # the model's name once known: a request for no known model counts under ""
        try:
            body = await read_body(request, s.settings.max_body_bytes, s.settings.body_timeout_s)
            req = loads_json(body, "the body")
            if not isinstance(req, dict):
                raise ServeError(400, "the body must be a JSON object")
            if not isinstance(req.get("stream_options") or {}, dict):  # (a string gave a 500; found by fuzzing)
                raise ServeError(400, "'stream_options' must be an object such as {\"include_usage\": true}")
            g = self.repo.generator(req.get("model"))
            label = g.name
            gen = g.generator
            prompt = _prompt(gen, req, chat)
            kw = _sampling(req, s.settings.default_timeout_s, gen.max_length if chat else 16)
            ids = await run_in_threadpool(gen.encode, prompt)
            stream = gen.stream(ids, **kw)
        except ServeError as e:
            s.metrics.failures.labels(label, str(e.status)).inc()
            return error(e.status, str(e))
        except InputError as e:
            s.metrics.failures.labels(label, "400").inc()
            return error(400, str(e))
        finally:
            s.metrics.requests.labels(label).inc()
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        meta = {"id": rid, "created": int(time.time()), "model": g.name}
        if req.get("stream"):
            include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._events(stream, meta, chat, include_usage, label, t0),
                                     media_type="text/event-stream", headers={"cache-control": "no-cache"})
        try:
            await _drain(request, stream)
        except (NpurunError, ServeError) as e:
            status = _status(e)
            s.metrics.failures.labels(label, str(status)).inc()
            return error(status, f"model {g.name!r}: {e}")
        r = stream.result
        s.metrics.latency.labels(label).observe(time.perf_counter() - t0)
        choice = {"index": 0, "finish_reason": r.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": r.text if r.text is not None else ""}
        else:
            choice["text"] = r.text if r.text is not None else " ".join(map(str, r.ids))
        return JSONResponse({**meta, "object": "chat.completion" if chat else "text_completion",
                             "choices": [choice], "usage": _usage(r)})

    async def _events(self, stream, meta, chat, include_usage, label, t0):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_or_text, finish=None, usage=None):
            if chat:
                c = {"index": 0, "delta": delta_or_text, "finish_reason": finish, "logprobs": None}
            else:
                c = {"index": 0, "text": delta_or_text, "finish_reason": finish, "logprobs": None}
            d = {**meta, "object": obj, "choices": [] if usage else [c]}
            if usage:
                d["usage"] = usage
            return f"data: {json.dumps(d)}\n\n"

        it = iter(stream)
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                piece = await run_in_threadpool(next, it, None)
                if piece is None:
                    break
                text = piece.text if piece.text is not None else f" {piece.id}"
                if text:
                    yield chunk({"content": text} if chat else text)
            r = stream.result
            yield chunk({} if chat else "", finish=r.finish_reason)
            if include_usage:
                yield chunk(None, usage=_usage(r))
            self.server.metrics.latency.labels(label).observe(time.perf_counter() - t0)
        except (NpurunError, ServeError) as e:  # headers are sent: the error goes in the stream
            self.server.metrics.failures.labels(label, str(_status(e))).inc()
            yield f"data: {json.dumps({'error': {'message': str(e), 'type': 'server_error', 'code': _status(e)}})}\n\n"
        except (asyncio.CancelledError, GeneratorExit):  # the client left mid-stream
            self.server.metrics.failures.labels(label, "499").inc()
            raise
        finally:
            it.close()  # a client that left stops the generation here
        yield "data: [DONE]\n\n"


async def _drain(request, stream) -> None:
    """Run a generation to its end on a worker thread; a client that disconnects stops it at
    the next token (499), as an infer request's run is cancelled (app.py)."""
    left = threading.Event()
    gone = asyncio.ensure_future(disconnected(request))
    gone.add_done_callback(lambda f: f.cancelled() or left.set())
    try:
        await run_in_threadpool(_drain_until, stream, left)
    finally:
        gone.cancel()
    if left.is_set():
        raise ServeError(499, "the client closed the connection before the generation ended")


def _drain_until(stream, left: threading.Event) -> None:
    it = iter(stream)
    for _ in it:
        if left.is_set():
            it.close()
            return


def _status(e) -> int:
    if isinstance(e, ServeError):
        return e.status
    if isinstance(e, (TaskTimeout, TaskCancelled)):
        return 503
    if isinstance(e, InputError):
        return 400
    return 500


def _usage(r) -> dict:
    return {"prompt_tokens": len(r.prompt_ids), "completion_tokens": len(r.ids),
            "total_tokens": len(r.prompt_ids) + len(r.ids)}


def _prompt(gen, req: dict, chat: bool):
    if chat:
        msgs = req.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ServeError(400, "'messages' must be a non-empty list of {role, content}")
        if gen.tokenizer is None:
            raise ServeError(400, f"model {gen.name!r} has no tokenizer.json: use /v1/completions with token ids")
        msgs = [dict(m, content=_content(m)) if isinstance(m, dict) else m for m in msgs]
        return gen.tokenizer.apply_chat_template(msgs)
    p = req.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool)
                                                                for i in p)):
        return p
    raise ServeError(400, "'prompt' must be a string or a list of token ids (one prompt per request)")


def _content(m: dict):
    """A message's content: a string, or OpenAI's list of text parts joined."""
    c = m.get("content")
    if isinstance(c, list):
        parts = [p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(c):
            raise ServeError(400, "only text content parts are supported")
        return "".join(parts)
    return c


def _number(req, key, default, kind=float):
    v = req.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise ServeError(400, f"'{key}' must be a{'n integer' if kind is int else ' number'}, got {v!r}")
    return kind(v)


def _sampling(req: dict, default_timeout, default_max: int) -> dict:
    """Generator.stream's keywords from an OpenAI request (max_tokens defaults to 16 for a
    completion, as OpenAI's does, and to the rest of the context for a chat)."""
    if req.get("n", 1) not in (1, None):
        raise ServeError(400, "'n' must be 1 (one completion per request)")
    for k, default in IGNORED_IF_DEFAULT.items():
        if req.get(k, default) not in (default, None):
            raise ServeError(400, f"'{k}' is not supported")
    stop = req.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(x, str) for x in stop)):
        raise ServeError(400, "'stop' must be a string or a list of strings")
    key = "max_completion_tokens" if req.get("max_completion_tokens") is not None else "max_tokens"
    prio = req.get("priority")
    if prio is not None and prio not in (0, 1, 2, 3):
        raise ServeError(400, f"'priority' must be 0 (highest), 1, 2 or 3, got {prio!r}")
    seed = req.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ServeError(400, f"'seed' must be an integer, got {seed!r}")
    return dict(max_new_tokens=_number(req, key, default_max, int),
                temperature=_number(req, "temperature", 1.0), top_p=_number(req, "top_p", 1.0),
                top_k=_number(req, "top_k", 0, int), repetition_penalty=_number(req, "repetition_penalty", 1.0),
                seed=seed, stop=tuple(stop or ()), priority=prio, timeout=_number(req, "timeout", default_timeout),
                ignore_eos=bool(req.get("ignore_eos", False)))
