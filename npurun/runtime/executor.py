"""The Executor: owns a device, compiles models for it once, and runs them.

    exe = Executor(device="cpu", parallelism=2, workspace_mb=64)
    out = await exe.run("espcn.npuir", {"input": x})     # under asyncio
    out = exe.run_sync(model, x)                          # or blocking

Runs on one Executor go through one device queue (a single worker thread), so concurrent
callers never run kernels on top of each other; `parallelism` is how many threads the
kernels themselves use. The multi-task scheduler (priorities, slices) grows here (issue F).
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..backends import Program, get_backend
from ..errors import InputError, NpurunError
from ..frontend import load
from ..ir.graph import Graph


class Executor:
    def __init__(self, device: str = "cpu", parallelism: int | None = None, workspace_mb: int | None = None):
        if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
            raise NpurunError(f"parallelism must be a positive integer, got {parallelism!r}")
        if workspace_mb is not None and (not isinstance(workspace_mb, (int, float)) or workspace_mb <= 0):
            raise NpurunError(f"workspace_mb must be a positive number, got {workspace_mb!r}")
        self.device = device
        self.parallelism = parallelism or os.cpu_count() or 1
        # Recorded for the memory planner (issue E); today no plan is limited by it.
        self.workspace_mb = workspace_mb
        self.backend = get_backend(device, self.parallelism)
        self._programs: dict[int, tuple[Graph, Program]] = {}
        self._lock = threading.Lock()
        self._queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"npurun-{device}")

    def __repr__(self):
        return f"Executor(device={self.device!r}, parallelism={self.parallelism}, workspace_mb={self.workspace_mb})"

    # --- models
    def compile(self, model) -> Program:
        """The Program for `model` (a Graph or a path), compiled once per graph."""
        graph = load(model) if isinstance(model, (str, os.PathLike, Path)) else model
        if not isinstance(graph, Graph):
            raise NpurunError(f"expected a model path or an npurun Graph, got {type(model).__name__}")
        with self._lock:
            hit = self._programs.get(id(graph))
            if hit is None or hit[0] is not graph:
                hit = (graph, self.backend.compile(graph))
                self._programs[id(graph)] = hit
            return hit[1]

    @staticmethod
    def _feeds(program: Program, inputs) -> dict:
        if isinstance(inputs, dict):
            return inputs
        if isinstance(inputs, np.ndarray):
            if len(program.graph.inputs) != 1:
                raise InputError(f"{program.graph.source}: the model has inputs "
                                 f"{program.graph.inputs}; pass a dict name -> array")
            return {program.graph.inputs[0]: inputs}
        raise InputError(f"inputs must be a dict of arrays or one array, got {type(inputs).__name__}")

    # --- running
    def run_sync(self, model, inputs, progress=None) -> dict[str, np.ndarray]:
        program = self.compile(model)
        feeds = self._feeds(program, inputs)
        return self._queue.submit(program.run, feeds, progress).result()

    async def run(self, model, inputs, progress=None) -> dict[str, np.ndarray]:
        program = self.compile(model)
        feeds = self._feeds(program, inputs)
        return await asyncio.wrap_future(self._queue.submit(program.run, feeds, progress))

    def close(self):
        self._queue.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
