"""`npurun serve`: an Open Inference Protocol (KServe v2) server that owns one device and
lets any process run models on it (tritonclient, curl, any KServe v2 client).

    from npurun.serve import build
    app = build("models/", device="cpu", settings=Settings(token="s3cret"))   # a Starlette app

Layers: models.py (the folder of models, the plan cache) -> app.py (routes, auth, limits)
-> protocol.py (JSON and binary tensors on the wire) and shm.py (system shared memory);
batching.py (optional dynamic batching); metrics.py (Prometheus). Each request is one task
of the device's scheduler (npurun.runtime), so priorities, timeouts and fair sharing between
models are the scheduler's. Needs the `serve` extra (uvicorn, starlette).
"""
from __future__ import annotations

import logging

from ..errors import NpurunError
from .app import Settings, create_app

__all__ = ["Settings", "build", "create_app"]
log = logging.getLogger("npurun.serve")


def build(model_dir, device: str = "cpu", threads: int | None = None, settings: Settings | None = None,
          max_batch: int = 1, max_delay: float = 0.0, cache: bool = True, executor=None):
    """The app for a folder of models on `device`; loads (and compiles) every model first."""
    from ..runtime import Executor
    from .batching import Batcher, batch_dim
    from .models import ModelRepository
    if max_batch < 1 or max_delay < 0:
        raise NpurunError(f"max batch must be >= 1 and max queue delay >= 0, got {max_batch} and {max_delay}")
    exe = executor or Executor(device, parallelism=threads)
    repo = ModelRepository(model_dir, exe, cache=cache)
    settings = settings or Settings()
    app = create_app(repo, exe, settings)
    server = app.state.server
    if max_batch > 1:
        for m in repo.models.values():
            if m.ready and batch_dim(m.graph):
                server.batchers[m.name] = Batcher(m, exe, server.metrics, max_batch, max_delay)
            elif m.ready:
                log.warning("model %s: not batched (its inputs and outputs do not share a symbolic first dim)", m.name)
    app.state.repo, app.state.executor = repo, exe
    return app
