"""`npurun serve MODEL_DIR`: serve the folder's .onnx/.npuir models over the Open Inference
Protocol (KServe v2, as Triton speaks it) on uvicorn; see docs/serve.md.

The socket is bound here (so `--port 0` picks a free port and the line printed at start
names the real one), then handed to uvicorn. Without --token-file on an address other than
loopback the server warns: anyone who can reach the port can run models and read shared
memory the server can open.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys


def add_parser(sub):
    p = sub.add_parser("serve", help="serve a folder of models over KServe v2 / Triton's HTTP protocol")
    p.add_argument("model_dir", metavar="MODEL_DIR",
                   help="folder of .onnx / .npuir models (name = file name) and of generative model folders "
                        "(name = folder name; OpenAI-compatible routes)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 = any free port)")
    p.add_argument("--device", default="cpu", help="BACKEND[:TARGET] the models run on (default: cpu)")
    p.add_argument("--threads", type=int, default=None, help="compute units (default: all cores)")
    p.add_argument("--token-file", help="file holding a bearer token every request but liveness must send")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body (default: 64 MB)")
    p.add_argument("--max-tensor-mb", type=float, default=64.0, help="largest input tensor (default: 64 MB)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a request body not fully received by then is refused with 408 (default: 30)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="timeout of requests that give none (default: none)")
    p.add_argument("--max-batch", type=int, default=1,
                   help="dynamic batching: most rows per batch for models with a symbolic first dim (default: 1, off)")
    p.add_argument("--max-queue-delay-ms", type=float, default=2.0,
                   help="dynamic batching: longest a request waits for others (default: 2 ms)")
    p.add_argument("--no-cache", action="store_true", help="do not cache imported plans in MODEL_DIR/.npurun-cache")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="serve as a Ray Serve deployment: no ADDRESS or `local` starts Ray here, `auto` or "
                        "HOST:PORT joins a cluster (pip install 'npurun[ray]'; docs/scale-out.md)")
    p.add_argument("--replicas", default="1", metavar="N|auto",
                   help="with --ray: replicas, each with its own copy of the models and scheduler (default: 1)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(fn=run)


def read_token(path: str) -> str:
    from ..errors import InputError
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--token-file {path}: cannot read it ({e})") from None
    if not token or any(c.isspace() for c in token):
        raise InputError(f"--token-file {path}: expected one token, no spaces (got {'nothing' if not token else 'spaces'})")
    return token


def _bind(host: str, port: int) -> socket.socket:
    from ..errors import NpurunError
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        sock = listen_socket(family, kind, proto)
        sock.bind(addr)
    except OSError as e:
        raise NpurunError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def listen_socket(family=socket.AF_INET, kind=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP) -> socket.socket:
    """A TCP socket for uvicorn. The protocol must be given: asyncio sets TCP_NODELAY only on
    sockets whose proto is IPPROTO_TCP, and without it every response whose headers and body
    go out in two writes waits ~40 ms for the client's delayed ACK (Nagle). Set on the
    listening socket too, which accepted sockets inherit on Linux."""
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args) -> int:
    import logging

    from ..errors import InputError
    try:
        import uvicorn
    except ImportError:
        raise InputError("npurun serve needs uvicorn and starlette: pip install 'npurun[serve]'") from None
    from ..backends.cpu.native import cap_malloc_arenas, trim_malloc_every
    from ..serve import Settings, build
    cap_malloc_arenas(max(2, (os.cpu_count() or 2) // 2))  # before the worker threads allocate
    trim_malloc_every(2.0)
    logging.basicConfig(level=args.log_level.upper(), format="npurun serve: %(message)s")
    for flag, v in (("--max-body-mb", args.max_body_mb), ("--max-tensor-mb", args.max_tensor_mb),
                    ("--body-timeout", args.body_timeout)):
        if not v > 0:
            raise InputError(f"{flag} must be positive, got {v}")
    token = read_token(args.token_file) if args.token_file else None
    settings = Settings(token=token, max_body_bytes=int(args.max_body_mb * 2**20), body_timeout_s=args.body_timeout,
                        max_tensor_bytes=int(args.max_tensor_mb * 2**20), default_timeout_s=args.timeout)
    if not token and not _loopback(args.host):
        print(f"npurun serve: warning: listening on {args.host} without --token-file; anyone who reaches "
              f"the port can run models", file=sys.stderr)
    if args.ray is not None:
        return _run_ray(args, settings)
    if args.replicas != "1":
        raise InputError("--replicas goes with --ray")
    sock = _bind(args.host, args.port)
    app = build(args.model_dir, device=args.device, threads=args.threads, settings=settings,
                max_batch=args.max_batch, max_delay=args.max_queue_delay_ms / 1000, cache=not args.no_cache)
    repo = app.state.repo
    host, port = sock.getsockname()[:2]
    for m in repo.models.values():
        print(f"  {m.name}: {m.state.lower()}" + (f" ({m.reason})" if m.reason else "")
              + (f"  plan {m.plan}" if m.plan else ""))
    for g in repo.generators.values():
        print(f"  {g.name}: {g.state.lower()}, generative (OpenAI routes /v1)" + (f" ({g.reason})" if g.reason else ""))
    every = list(repo.models.values()) + list(repo.generators.values())
    print(f"npurun serve: {sum(m.ready for m in every)}/{len(every)} models ready on "
          f"http://{host}:{port} ({app.state.executor.device}, {app.state.executor.parallelism} units)", flush=True)
    config = uvicorn.Config(app, log_level=args.log_level, access_log=args.log_level == "debug",
                            timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
    app.state.server.shm.close()
    return 0


def _run_ray(args, settings) -> int:
    """Deploy on Ray Serve and wait for Ctrl-C; the deployment goes with this process."""
    import time

    from ..batch.ray_job import init
    from ..serve import ray_serve
    replicas = ray_serve.replicas_arg(args.replicas)
    started = init(args.ray)
    import ray
    try:
        port = ray_serve.deploy(args.model_dir, replicas=replicas, host=args.host, port=args.port,
                                device=args.device, threads=args.threads, settings=settings,
                                max_batch=args.max_batch, max_delay=args.max_queue_delay_ms / 1000,
                                cache=not args.no_cache)
        print(f"npurun serve: {args.model_dir} on http://{args.host}:{port} (Ray Serve, {replicas} replicas "
              f"on {args.device})", flush=True)
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    except ray.exceptions.RayError as e:
        from ..errors import NpurunError
        raise NpurunError(f"Ray Serve: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    finally:
        try:
            ray_serve.shutdown()
        finally:
            if started:
                ray.shutdown()
