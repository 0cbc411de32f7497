"""The reference backend: the readable NumPy kernels, the oracle for every other backend."""
from .. import register
from ..base import Backend, Program
from .kernels import KERNELS


def has_reference_kernel(node, graph) -> bool:
    """npurun has no kernel for this op yet."""
    return node.op in KERNELS


@register
class ReferenceBackend(Backend):
    """One NumPy function per op, exact ONNX semantics, single-threaded intent."""

    name = "reference"
    rules = (has_reference_kernel,)

    def compile(self, graph):
        return Program(graph, KERNELS, self.name)
