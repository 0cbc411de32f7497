"""NPU-IR: graphs of ops over typed values (shape, dtype, memory space)."""
from .graph import MEMORY_SPACES, Graph, Node, Value, register_memory_space
from .io import load_npuir, save
from .ops import OPS
from .text import parse, print_graph
from .verify import verify

__all__ = ["Graph", "Node", "Value", "OPS", "MEMORY_SPACES", "register_memory_space",
           "parse", "print_graph", "verify", "save", "load_npuir"]
