"""The pipeline one worker runs over its items: loads run ahead of the device in a thread pool,
stores (encode + atomic write) run behind it in another, and COMPUTES items compute at once in
a third — so Pillow's decode and zlib's deflate overlap the compute (both release the GIL)
instead of adding to it.

The I/O threads run at the lowest CPU priority (nice 19, Linux): they use the cores the
compute leaves idle (its single-threaded parts, its waits) instead of preempting its threads
mid-kernel — the parallel kernels wait for their slowest thread, so one preempted thread
stalls them all. Measured on 2 cores, 720p -> 4K PNG: 0.59 s a photo at equal priority, 0.48
niced, against 0.39-0.46 for the compute alone (bench/batch.py).

Bounded both ways: at most `depth` decoded inputs wait for the device and at most `depth`
results wait for their encoder (a 4K frame is 25 MB), so memory stays flat on any folder.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from ..errors import NpurunError
from .job import Item, row

# Items computing at once on the worker's one Executor (its scheduler shares the device
# between them): one item's single-threaded phases (ESPCN's chroma resize and merge) then
# overlap the other's parallel kernels. Measured in bench/batch.py.
COMPUTES = 2


def message(e: BaseException) -> str:
    """An item's error for its status row: an NpurunError's message names the file and what was
    expected; anything else is npurun's bug, named by its type so a report can say which."""
    return str(e) if isinstance(e, NpurunError) else f"internal error ({type(e).__name__}: {e})"


def _background() -> None:
    """Lower the calling thread's CPU priority to the least (a thread's own nice, on Linux)."""
    if sys.platform == "linux":
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


def run_items(worker, items: list[Item], on_result, *, io_threads: int = 2, computes: int = COMPUTES,
              who: str = "") -> None:
    """Run `items` through `worker`'s stages; `on_result(row)` once per item, as each ends."""
    depth = io_threads + computes
    stores: deque = deque()
    computing: deque = deque()

    def finish(item, fut):
        try:
            on_result(row(item, "ok", sha256=fut.result(), worker=who))
        except Exception as e:  # noqa: BLE001 - an item's failure is its row, never the batch's end
            on_result(row(item, "error", error=message(e), worker=who))

    def compute(item, loaded):
        return worker.compute(item, loaded.result())

    with ThreadPoolExecutor(max(1, io_threads // 2), thread_name_prefix="npurun-load",
                            initializer=_background) as loader, \
            ThreadPoolExecutor(computes, thread_name_prefix="npurun-compute") as computer, \
            ThreadPoolExecutor(io_threads, thread_name_prefix="npurun-store", initializer=_background) as storer:
        todo = iter(items)
        pending: deque = deque()

        def fill():
            while len(pending) < depth:
                item = next(todo, None)
                if item is None:
                    break
                pending.append((item, loader.submit(worker.load, item)))
            while pending and len(computing) < computes:
                item, loaded = pending.popleft()
                computing.append((item, computer.submit(compute, item, loaded)))

        fill()
        while computing:
            item, fut = computing.popleft()
            try:
                result = fut.result()
            except Exception as e:  # noqa: BLE001
                on_result(row(item, "error", error=message(e), worker=who))
                fill()
                continue
            fill()
            while len(stores) >= depth:
                finish(*stores.popleft())
            stores.append((item, storer.submit(worker.store, item, result)))
            del result
            while stores and stores[0][1].done():
                finish(*stores.popleft())
        while stores:
            finish(*stores.popleft())
