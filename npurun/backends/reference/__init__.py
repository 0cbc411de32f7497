"""The reference backend: the readable NumPy kernels, the oracle for every other backend."""
from ..base import Backend, Program
from .kernels import KERNELS


class ReferenceBackend(Backend):
    """One NumPy function per op, exact ONNX semantics, single-threaded intent."""

    name = "reference"

    def supports(self, node):
        if node.op in KERNELS:
            return True, ""
        return False, f"no reference kernel for {node.op}"

    def compile(self, graph):
        return Program(graph, KERNELS, self.name)
