"""The `cpu` backend.

Today it runs the reference kernels as a compiled `Program` (values released after their last
use) with NumPy's BLAS limited to the Executor's `parallelism` threads. Issue C replaces the
hot kernels (convolution, matmul, fused epilogues) with fast ones; anything without a fast
kernel keeps falling back to the reference kernel, as it does now.
"""
from __future__ import annotations

from threadpoolctl import threadpool_limits

from ..base import Backend, Program
from ..reference.kernels import KERNELS


class CpuProgram(Program):
    def __init__(self, graph, kernels, backend, threads: int):
        super().__init__(graph, kernels, backend)
        self.threads = threads

    def run(self, feeds, progress=None):
        # BLAS threads are process-wide; limit them for the duration of this run only.
        with threadpool_limits(limits=self.threads, user_api="blas"):
            return super().run(feeds, progress)


class CpuBackend(Backend):
    """Compiled programs on the host CPU, BLAS threads = the Executor's parallelism."""

    name = "cpu"

    def supports(self, node):
        if node.op in KERNELS:
            return True, ""
        return False, f"no CPU kernel for {node.op}"

    def compile(self, graph):
        return CpuProgram(graph, KERNELS, self.name, self.parallelism)
