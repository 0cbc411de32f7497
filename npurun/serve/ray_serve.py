"""`npurun serve MODEL_DIR --ray`: the same Starlette app as a Ray Serve deployment.

Each replica is a Ray actor that builds the whole app itself (`serve.ingress` with a builder,
run on the replica): its own model repository, Executor and scheduler, so priorities, timeouts
and dynamic batching work within a replica as they do in a plain `npurun serve`. Ray Serve's
proxy listens on HOST:PORT and spreads requests over the replicas; the KServe v2 routes,
tritonclient and /metrics are unchanged. What does not carry over: system shared memory (a
region registered through one replica is unknown to the others, and a replica on another node
cannot open it), so clients should send tensors in the request body with --ray.
"""
from __future__ import annotations

import socket
from pathlib import Path

from ..errors import InputError

APP = "npurun"


def replicas_arg(v: str):
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"--replicas {v}: expected a positive number or `auto`")
    return n


def deploy(model_dir, *, replicas=1, host="127.0.0.1", port=8000, device="cpu", threads=None, settings=None,
           max_batch=1, max_delay=0.0, cache=True) -> int:
    """Deploy MODEL_DIR on the Ray instance this process is connected to; the HTTP port."""
    from ray import serve
    model_dir = str(Path(model_dir).resolve())
    if not Path(model_dir).is_dir():
        raise InputError(f"{model_dir}: no such folder")
    if port == 0:  # Ray Serve needs a number: take one the kernel says is free now
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]

    def builder():  # runs on each replica
        from . import build
        return build(model_dir, device=device, threads=threads, settings=settings, max_batch=max_batch,
                     max_delay=max_delay, cache=cache)

    @serve.ingress(builder)
    class NpurunReplica:
        """One replica: the app `builder` makes (Ray Serve calls it on the replica)."""

    options = {"ray_actor_options": {"num_cpus": threads or 1}}
    if replicas == "auto":
        options["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 2}
    else:
        options["num_replicas"] = replicas
    serve.start(http_options={"host": host, "port": port})
    serve.run(serve.deployment(NpurunReplica, name=APP, **options).bind(), name=APP, route_prefix="/",
              blocking=False)
    return port


def shutdown() -> None:
    from ray import serve
    serve.delete(APP)
