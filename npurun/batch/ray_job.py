"""The same job on Ray Data: the items become a dataset of (input, output) rows, and
`map_batches` sends batches of them to a pool of actors, each holding one Worker (one compiled
model on one Executor) and running the same pipeline as a local job.

Why rows of paths and not `read_binary_files`: the driver has already dropped the items that
are done (a rerun resumes), an actor reads its inputs and writes its outputs itself, so neither
photos nor pixels cross the object store — only paths and status rows do. The inputs and the
output folder must be reachable from every node at the same path (a shared filesystem).

Fault tolerance is Ray Data's: an actor that dies is restarted and its batch replayed
(`max_restarts=-1`, `max_task_retries=-1` are Ray Data's defaults for actor pools). A replay
finds the outputs the dead attempt finished and does not redo them; what it left half-written
is a temporary file, never an output, and the driver removes those at the end. Each batch's
rows reach the driver once, so the manifest has one row per input.
"""
from __future__ import annotations

import logging
import os
import socket

from ..errors import InputError, NpurunError
from .job import Item, Spec, row, sha256_file

BATCH = 4  # items per actor call: little to replay after a kill
_KEYS = ("input", "output", "status", "sha256", "error", "worker")


def init(address: str | None) -> bool:
    """Connect to (or start) Ray; False when the caller had done so already (a test, a notebook)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'npurun[ray]'") from None
    if ray.is_initialized():
        return False
    try:
        ray.init(address="local" if address in (None, "local") else address, include_dashboard=False,
                 logging_level="WARNING", log_to_driver=True)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise NpurunError(f"--ray {address or 'local'}: cannot connect to or start Ray ({e})") from None
    return True


class RayWorker:
    """One actor of the pool: its own Worker, so its own model and scheduler."""

    def __init__(self, spec: Spec):
        from .work import Worker
        self.spec = spec
        self.worker = Worker(spec)
        self.who = f"{os.getpid()}@{socket.gethostname()}"

    def __call__(self, batch: dict) -> dict:
        from .pipeline import run_items
        items = [Item(str(i), str(o), None if int(p) < 0 else int(p))
                 for i, o, p in zip(batch["input"], batch["output"], batch["part"])]
        rows, todo = [], []
        for it in items:
            if os.path.exists(it.output):  # finished by an earlier attempt of this batch (a kill cut it short)
                rows.append(row(it, "ok", sha256=sha256_file(it.output), worker=self.who))
            else:
                todo.append(it)
        run_items(self.worker, todo, rows.append, io_threads=self.spec.io_threads, who=self.who)
        return {k: [r[k] for r in rows] for k in _KEYS}


def run_on_ray(spec: Spec, items: list[Item], on_result, *, address: str | None, workers: int | None = None,
               resource: str | None = None) -> None:
    """Run `items` on Ray; `on_result(row)` on the driver for each, as batches finish."""
    started = init(address)
    import ray
    import ray.data
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # (its INFO lines about plans; errors raise)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False  # npurun draws its own
        threads = spec.threads or 1
        if workers is None:
            res = ray.cluster_resources()
            workers = int(res.get(resource, 0)) if resource else int(res.get("CPU", 1) // threads)
            if workers < 1:
                raise NpurunError(f"the Ray cluster has no {resource or 'CPU'} to give an actor "
                                  f"({threads} CPUs each): {dict(res)}")
        workers = max(1, min(workers, -(-len(items) // BATCH)))
        ds = ray.data.from_items([{"input": it.input, "output": it.output, "part": -1 if it.part is None else it.part}
                                  for it in items], override_num_blocks=max(1, -(-len(items) // BATCH)))
        # Two calls at once in each actor (threads) on its one Worker: one batch's first decode
        # and last encode overlap the other's compute, so the pipeline does not drain every
        # BATCH items (one call at a time cost ~50 ms a 4K photo, 14% of its compute).
        ds = ds.map_batches(RayWorker, fn_constructor_args=(spec,), batch_size=BATCH, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=workers, max_concurrent_calls_per_actor=2,
                                                               enable_true_multi_threading=True),
                            num_cpus=threads,
                            **({"resources": {resource: 1}} if resource else {}))
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            for k in range(len(batch["input"])):
                on_result({key: str(batch[key][k]) for key in _KEYS})
    except ray.exceptions.RayError as e:
        raise NpurunError(f"Ray: the job failed ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    finally:
        if started:
            ray.shutdown()
