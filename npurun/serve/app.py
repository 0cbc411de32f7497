"""The Starlette app of `npurun serve`: Open Inference Protocol (KServe v2) endpoints over
one Executor, so every request becomes a task of the device's scheduler.

    app = create_app(repo, executor, Settings(token="..."))
    uvicorn.run(app, host="127.0.0.1", port=8000)

Endpoints (Triton's spelling; `/versions/{v}` may follow a model name, v = "1"):

    GET  /v2/health/live | /v2/health/ready          200 or 503 (ready: every model loaded)
    GET  /v2                                         server metadata
    GET  /v2/models/{m}  | /v2/models/{m}/ready      model metadata, readiness
    GET  /v2/models/{m}/config                       a Triton-style model config (tritonclient, perf_analyzer)
    POST /v2/models/{m}/infer                        inference (JSON, binary tensors, shared memory)
    POST /v2/repository/index                        every model, its state and why it is not ready
    GET  /v2/systemsharedmemory[/region/{r}]/status
    POST /v2/systemsharedmemory/region/{r}/register | unregister;  /v2/systemsharedmemory/unregister
    GET  /metrics                                    Prometheus text format
    GET  /v1/models, POST /v1/completions | /v1/chat/completions   OpenAI-compatible, for the
                                                     generative models (openai.py)

Errors are JSON `{"error": "..."}`; the status follows Triton: 400 bad request (bad JSON,
wrong input name, shape or datatype, truncated body, unknown region), 401 missing or wrong
bearer token, 404 unknown model, version or path, 408 a body not fully arrived within
`body_timeout_s`, 413 body or tensor over the limits, 503
model not ready or request timed out (Triton answers "Request timeout expired" with 503), 500
a model that failed while running. Nothing a client sends stops the server: every handler
turns its failures into one of these answers.

Safety: a bearer token (when set) is checked before any body is read, on every endpoint but
/v2/health/live; the body is read in chunks and refused at `max_body_bytes` (Content-Length
is checked first); a request whose client disconnects is cancelled on the device.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
import zlib
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import InputError, NpurunError
from ..runtime.scheduler import TaskCancelled, TaskTimeout
from .metrics import ServeMetrics
from .protocol import Limits, ServeError, encode_response, loads_json, parse_infer
from .shm import SharedMemory

log = logging.getLogger("npurun.serve")
EXTENSIONS = ["binary_tensor_data", "system_shared_memory", "model_repository"]


@dataclass
class Settings:
    token: str | None = None
    max_body_bytes: int = 64 << 20
    max_tensor_bytes: int = 64 << 20
    max_shm_regions: int = 64
    default_timeout_s: float | None = None  # for requests that give none
    body_timeout_s: float = 30.0  # a body that has not fully arrived by then is refused (408)


class BearerAuth:
    """Pure ASGI middleware: refuse a request without `Authorization: Bearer <token>` before
    its body is read. Liveness stays open so orchestrators can probe without the secret."""

    OPEN = ("/v2/health/live",)

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token.encode() if token else None

    async def __call__(self, scope, receive, send):
        if self.token is not None and scope["type"] == "http" and scope["path"] not in self.OPEN:
            got = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, cred = got.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(cred.strip(), self.token):
                why = "missing bearer token" if not got else "wrong bearer token"
                resp = JSONResponse({"error": f"{why}; send 'Authorization: Bearer <token>'"}, 401,
                                    headers={"www-authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Server:
    """The state behind the routes: model repository, executor, shared memory, metrics."""

    def __init__(self, repo, executor, settings: Settings, batchers=None):
        self.repo, self.executor, self.settings = repo, executor, settings
        self.shm = SharedMemory(max_regions=settings.max_shm_regions)
        self.metrics = ServeMetrics(lambda: [executor.dev])
        self.limits = Limits(max_tensor_bytes=settings.max_tensor_bytes)
        self.batchers = batchers or {}

    # --- health and metadata
    async def live(self, request):
        return JSONResponse({"live": True})

    async def ready(self, request):
        ok = self.repo.ready
        return JSONResponse({"ready": ok}, 200 if ok else 503)

    async def server_metadata(self, request):
        return JSONResponse({"name": "npurun", "version": __version__, "extensions": EXTENSIONS})

    def _model(self, request, ready=True):
        p = request.path_params
        return self.repo.get(p["model"], p.get("version"), ready=ready)

    async def model_metadata(self, request):
        return JSONResponse(self._model(request, ready=False).metadata())

    async def model_ready(self, request):
        m = self._model(request, ready=False)
        return JSONResponse({"name": m.name, "ready": m.ready}, 200 if m.ready else 503)

    async def model_config(self, request):
        m = self._model(request)
        b = self.batchers.get(m.name)

        def dims(t):
            # Triton's config leaves the batch dim out when max_batch_size > 0.
            return t["shape"][1:] if b else t["shape"]
        cfg = {"name": m.name, "platform": m.metadata()["platform"], "backend": "npurun",
               "max_batch_size": b.max_batch if b else 0,
               "input": [{"name": t["name"], "data_type": _config_type(t["datatype"]), "dims": dims(t)}
                         for t in m.tensors(m.graph.inputs)],
               "output": [{"name": t["name"], "data_type": _config_type(t["datatype"]), "dims": dims(t)}
                          for t in m.tensors(m.graph.outputs)]}
        if b:
            cfg["dynamic_batching"] = {"max_queue_delay_microseconds": int(b.max_delay * 1e6)}
        return JSONResponse(cfg)

    async def repository_index(self, request):
        await read_body(request, 1 << 16, self.settings.body_timeout_s)
        return JSONResponse(self.repo.index())

    # --- shared memory
    async def shm_status(self, request):
        return JSONResponse(self.shm.status(request.path_params.get("region")))

    async def shm_register(self, request):
        body = _json(await read_body(request, 1 << 16, self.settings.body_timeout_s))
        if not isinstance(body, dict):
            raise ServeError(400, "register takes a JSON object {key, offset, byte_size}")
        self.shm.register(request.path_params["region"], body.get("key"), body.get("offset", 0), body.get("byte_size"))
        return JSONResponse({})

    async def shm_unregister(self, request):
        await read_body(request, 1 << 16, self.settings.body_timeout_s)
        self.shm.unregister(request.path_params.get("region"))
        return JSONResponse({})

    # --- metrics
    async def prometheus(self, request):
        return Response(self.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # --- inference
    async def infer(self, request: Request):
        t0 = time.perf_counter()
        name = request.path_params["model"]
        label = name if name in self.repo.models else ""
        self.metrics.requests.labels(label).inc()
        try:
            m = self._model(request)
            body = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
            # Inflating, parsing, encoding and submitting (which may plan the model for a new
            # shape) run on worker threads: a big request never stalls the event loop.
            req = await run_in_threadpool(self._parse, body, request.headers, m)
            timeout = req.timeout if req.timeout is not None else self.settings.default_timeout_s
            outs = await self._run(request, m, req.feeds, req.priority, timeout)
            data, headers = await run_in_threadpool(encode_response, m, req, outs, self.shm)
        except ServeError as e:
            self.metrics.failures.labels(label, str(e.status)).inc()
            raise
        except Exception:
            self.metrics.failures.labels(label, "500").inc()
            raise
        self.metrics.latency.labels(label).observe(time.perf_counter() - t0)
        return Response(data, headers=headers)

    def _parse(self, body: bytes, headers, m):
        body = _decode(body, headers.get("content-encoding"), self.settings.max_body_bytes)
        return parse_infer(body, headers.get("inference-header-content-length"), m, self.shm, self.limits)

    async def _run(self, request, m, feeds, priority, timeout):
        b = self.batchers.get(m.name)
        try:
            if b is not None:
                work = asyncio.ensure_future(b.submit(feeds, priority, timeout))
                cancel = work.cancel
            else:
                fut = await run_in_threadpool(self.executor.submit, m.graph, feeds, priority=priority,
                                              timeout=timeout, name=m.name)
                work, cancel = asyncio.wrap_future(fut), fut.cancel
            gone = asyncio.ensure_future(disconnected(request))
            try:
                await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not work.done():  # the client left: free the device and the inputs
                cancel()
                raise ServeError(499, "the client closed the connection before the result was ready")
            outs = work.result()
            if b is None:
                self.metrics.observe_run(m.name, fut.task)
            return outs
        except TaskTimeout as e:
            raise ServeError(503, f"model {m.name!r}: request timeout expired ({e})") from None
        except TaskCancelled as e:
            raise ServeError(503, f"model {m.name!r}: request cancelled ({e})") from None
        except InputError as e:
            raise ServeError(400, str(e)) from None
        except ServeError:
            raise
        except NpurunError as e:
            raise ServeError(500, f"model {m.name!r} failed: {e}") from None


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


async def disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so the next ASGI message
    is the disconnect)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def read_body(request: Request, limit: int, timeout_s: float = 30.0) -> bytes:
    """The request body, refused past `limit` bytes (413), or when it has not fully arrived
    within `timeout_s` (408: a slow or stalled client cannot hold a request open)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit)
    except TimeoutError:
        raise ServeError(408, f"the request body did not arrive within {timeout_s:g} s") from None


async def _read_body(request: Request, limit: int) -> bytes:
    n = request.headers.get("content-length")
    if n is not None:
        if not n.isdigit():
            raise ServeError(400, f"Content-Length {n!r} is not a number")
        if int(n) > limit:
            raise ServeError(413, f"the request body is {int(n)} bytes, over the server's limit of {limit} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ServeError(413, f"the request body is over the server's limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # a client gone mid-body is no server error (it was counted a 500)
        raise ServeError(499, "the client closed the connection before sending the whole body") from None
    body = b"".join(chunks)
    if n is not None and len(body) != int(n):
        raise ServeError(400, f"the body has {len(body)} bytes, Content-Length said {n}")
    return body


def _decode(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo gzip/deflate request compression (tritonclient's request_compression_algorithm),
    never inflating past the body limit."""
    if encoding in (None, "", "identity"):
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding.lower())
    if wbits is None:
        raise ServeError(400, f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise ServeError(400, f"the {encoding} body is corrupt ({e})") from None
    if len(out) > limit:
        raise ServeError(413, f"the {encoding} body inflates past the server's limit of {limit} bytes")
    if not d.eof:
        raise ServeError(400, f"the {encoding} body is truncated")
    return out


def _json(body: bytes):
    return loads_json(body or b"{}", "the body")


async def _serve_error(request, exc: ServeError):
    return JSONResponse({"error": str(exc)}, exc.status)


async def _http_error(request, exc: HTTPException):
    msg = {404: f"no endpoint {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    return JSONResponse({"error": msg.get(exc.status_code, exc.detail)}, exc.status_code, headers=exc.headers)


async def _internal_error(request, exc: Exception):
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse({"error": f"internal server error: {type(exc).__name__}: {exc}"}, 500)


def create_app(repo, executor, settings: Settings | None = None, batchers=None) -> Starlette:
    s = Server(repo, executor, settings or Settings(), batchers)
    V = "/versions/{version}"
    routes = [Route("/v2/health/live", s.live), Route("/v2/health/ready", s.ready),
              Route("/v2", s.server_metadata), Route("/metrics", s.prometheus),
              Route("/v2/repository/index", s.repository_index, methods=["POST"]),
              Route("/v2/systemsharedmemory/status", s.shm_status),
              Route("/v2/systemsharedmemory/region/{region}/status", s.shm_status),
              Route("/v2/systemsharedmemory/region/{region}/register", s.shm_register, methods=["POST"]),
              Route("/v2/systemsharedmemory/region/{region}/unregister", s.shm_unregister, methods=["POST"]),
              Route("/v2/systemsharedmemory/unregister", s.shm_unregister, methods=["POST"])]
    from .openai import OpenAIRoutes
    oa = OpenAIRoutes(s)
    routes += [Route("/v1/models", oa.models), Route("/v1/completions", oa.completions, methods=["POST"]),
               Route("/v1/chat/completions", oa.chat, methods=["POST"])]
    for v in ("", V):
        routes += [Route(f"/v2/models/{{model}}{v}", s.model_metadata),
                   Route(f"/v2/models/{{model}}{v}/ready", s.model_ready),
                   Route(f"/v2/models/{{model}}{v}/config", s.model_config),
                   Route(f"/v2/models/{{model}}{v}/infer", s.infer, methods=["POST"])]
    app = Starlette(routes=routes, middleware=[Middleware(BearerAuth, token=settings.token if settings else None)],
                    exception_handlers={ServeError: _serve_error, HTTPException: _http_error,
                                        Exception: _internal_error})
    app.state.server = s
    return app
