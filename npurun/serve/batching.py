"""Dynamic batching of one model: requests that arrive close together run as one task.

    b = Batcher(model, executor, metrics, max_batch=8, max_delay=0.002)
    outs = await b.submit(feeds, priority=0, timeout=None)   # this request's own outputs

A model can be batched when every input and every output has the same plain symbol as its
first dim (`x: [N, 8] -> p: [N, 4]`); other models run one request per task (the server
says so at start). Requests join a queue per (priority, shapes after the first dim, dtypes),
so a batch never mixes priorities or shapes and a malformed request never shares a batch
with good ones (inputs are checked before they queue). A queue is run when it holds
`max_batch` items or its oldest request has waited `max_delay` seconds, whichever is first;
a request bigger than what is left in the queue starts a new one. The batch is one scheduler
task at the queue's priority, concatenated on axis 0, and its outputs are split back by
each request's row count.

Timeouts: the batch's timeout is the shortest one left among its requests (a batch that
times out fails all of them with the timeout error). A request whose client leaves while
queued is dropped from its queue; once running, its batch goes on for the others.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
from starlette.concurrency import run_in_threadpool

from ..backends.base import check_inputs
from ..ir.shapes import SYMBOL
from ..runtime.scheduler import TaskCancelled


@dataclass(eq=False)
class _Item:
    feeds: dict
    rows: int
    future: asyncio.Future
    deadline: float | None


@dataclass
class _Queue:
    items: list = field(default_factory=list)
    rows: int = 0
    timer: asyncio.TimerHandle | None = None


def batch_dim(graph) -> str | None:
    """The symbol all inputs and outputs share as their first dim, or None."""
    dims = {graph.values[n].shape[0] if graph.values[n].shape and graph.values[n].kind == "tensor" else None
            for n in graph.inputs + graph.outputs}
    d = dims.pop() if len(dims) == 1 else None
    return d if isinstance(d, str) and SYMBOL.match(d) else None


class Batcher:
    def __init__(self, model, executor, metrics, max_batch: int, max_delay: float):
        self.model, self.executor, self.metrics = model, executor, metrics
        self.max_batch, self.max_delay = max_batch, max_delay
        self._queues: dict[tuple, _Queue] = {}
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, feeds: dict, priority: int | None, timeout: float | None) -> dict:
        g = self.model.graph
        feeds = check_inputs(g, feeds)  # InputError -> 400 before it can join a batch
        rows = feeds[g.inputs[0]].shape[0]
        if priority is None:
            priority = self.executor.dev.config.get("scheduler", "default_priority")
        loop = asyncio.get_running_loop()
        item = _Item(feeds, rows, loop.create_future(), loop.time() + timeout if timeout else None)
        if rows == 0 or rows > self.max_batch:  # runs alone, through the same path
            self._run([item], priority)
            return await item.future
        key = (priority, tuple((k, v.shape[1:], v.dtype.str) for k, v in feeds.items()))
        q = self._queues.get(key)
        if q is not None and q.rows + rows > self.max_batch:
            self._flush(key)
            q = None
        if q is None:
            q = self._queues[key] = _Queue()
            q.timer = loop.call_later(self.max_delay, self._flush, key)
        q.items.append(item)
        q.rows += rows
        if q.rows >= self.max_batch:
            self._flush(key)
        try:
            return await asyncio.shield(item.future)
        except asyncio.CancelledError:
            q = self._queues.get(key)
            if q is not None and item in q.items:  # still queued: leave the queue
                q.items.remove(item)
                q.rows -= rows
            item.future.cancel()
            raise

    def _flush(self, key) -> None:
        q = self._queues.pop(key, None)
        if q is None:
            return
        if q.timer is not None:
            q.timer.cancel()
        items = [it for it in q.items if not it.future.done()]
        if items:
            self._run(items, key[0])

    def _run(self, items: list[_Item], priority: int) -> None:
        g = self.model.graph
        loop = asyncio.get_running_loop()
        feeds = items[0].feeds if len(items) == 1 else {
            k: np.concatenate([it.feeds[k] for it in items], axis=0) for k in g.inputs}
        deadlines = [it.deadline for it in items if it.deadline is not None]
        timeout = max(1e-6, min(deadlines) - loop.time()) if deadlines else None
        task = loop.create_task(self._submit(items, feeds, priority, timeout))
        self._tasks.add(task)  # asyncio keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, items, feeds, priority, timeout) -> None:
        # On a worker thread: submitting may plan the model for a new batch shape.
        loop = asyncio.get_running_loop()
        try:
            fut = await run_in_threadpool(self.executor.submit, self.model.graph, feeds, priority=priority,
                                          timeout=timeout, name=self.model.name)
        except Exception as e:  # noqa: BLE001 -- handed to every request of the batch
            self._fail(items, e)
            return
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._done, f, items))

    def _done(self, fut, items: list[_Item]) -> None:
        if fut.cancelled():
            self._fail(items, TaskCancelled(f"model {self.model.name!r}: the batch was cancelled"))
            return
        err = fut.exception()
        if err is not None:
            self._fail(items, err)
            return
        outs = fut.result()
        total = sum(it.rows for it in items)
        self.metrics.observe_run(self.model.name, fut.task, items=total)
        start = 0
        for it in items:
            if not it.future.done():
                it.future.set_result({k: v[start:start + it.rows] for k, v in outs.items()})
            start += it.rows

    @staticmethod
    def _fail(items, err) -> None:
        for it in items:
            if not it.future.done():
                it.future.set_exception(err)
