"""The `torch` backend: a compiled graph lowered to PyTorch operations on any torch device.

Devices: `torch:cpu` (the default target), `torch:cuda`, `torch:cuda:1`, ... A node runs as
PyTorch calls when it passes every rule below; otherwise it falls back, per node, to the
reference kernels (`npurun ops-report MODEL --device torch:cpu` lists which and why).
Precision suffixes map to torch types: `f32`, `f16`, `bf16`, and `i8` (matmul and 2-D conv:
per-tensor activations, per-channel weights, `torch._int_mm`). On CUDA a whole run is
captured once per input shape in a CUDA graph and replayed (see program.py).

PyTorch is optional: it is imported when a program is compiled or a rule needs it, never
by `import npurun`.
"""
from __future__ import annotations

import importlib.util

from ...errors import BackendError
from ...ir.dtypes import FLOAT_TYPES
from .. import register
from ..base import Backend

# Types PyTorch tensors hold with full operator coverage (no strings, 8/4-bit floats,
# sub-byte ints, or unsigned 16/32/64-bit ints).
TORCH_TYPES = frozenset({"f32", "f16", "bf16", "f64", "i8", "u8", "i16", "i32", "i64", "bool"})
FLOAT_ONLY_WINDOWS = frozenset({"max_pool", "average_pool", "global_average_pool", "global_max_pool"})


def _values(node, graph):
    names = [i for i in node.inputs if i] + list(node.outputs)
    return [graph.values[n] for n in names if n in graph.values]


def has_torch_kernel(node, graph) -> bool:
    """The torch backend has no PyTorch lowering for this op."""
    from .kernels import KERNELS
    return node.op in KERNELS


def torch_types(node, graph) -> bool:
    """An operand or result is of a type PyTorch tensors do not hold (strings, 8/4-bit floats,
    sub-byte or unsigned 16/32/64-bit integers) or is a sequence or optional value."""
    return graph is None or all(v.kind == "tensor" and v.dtype in TORCH_TYPES for v in _values(node, graph))


def precision_supported(node, graph) -> bool:
    """Its precision suffix is not one the torch backend computes in: f32, f16, bf16, and i8 for
    matmul with a constant 2-D weight and dense 2-D conv with a constant weight."""
    p = node.precision
    if p in (None, "f32", "f16", "bf16"):
        return True
    if p != "i8" or graph is None or node.op not in ("matmul", "conv"):
        return False
    w = graph.values.get(node.inputs[1])
    if w is None or not w.is_const or graph.values[node.inputs[0]].dtype not in FLOAT_TYPES:
        return False
    if node.op == "matmul":
        return w.data.ndim == 2
    return w.data.ndim == 4 and node.attrs.get("group", 1) == 1


def float_windows(node, graph) -> bool:
    """Pooling of an integer tensor; PyTorch pools floats only."""
    return node.op not in FLOAT_ONLY_WINDOWS or graph is None or graph.values[node.inputs[0]].dtype in FLOAT_TYPES


def spatial_rank(node, graph) -> bool:
    """A convolution or pooling window over more than 3 (or 0) spatial axes; PyTorch has 1-D, 2-D
    and 3-D ones."""
    if node.op not in ("conv", "conv_transpose", "max_pool", "average_pool") or graph is None:
        return True
    return 3 <= len(graph.values[node.inputs[0]].shape) <= 5


def pool_dilation(node, graph) -> bool:
    """Average pooling with dilations; PyTorch's average pooling has none."""
    return node.op != "average_pool" or all(d == 1 for d in node.attrs.get("dilations") or [1])


def resize_float(node, graph) -> bool:
    """Linear or cubic resize of an integer tensor (the reference rounds it its own way)."""
    return (node.op != "resize" or node.attrs.get("mode", "nearest") == "nearest" or graph is None
            or graph.values[node.inputs[0]].dtype in FLOAT_TYPES)


def quant_layout(node, graph) -> bool:
    """Blocked quantization (block_size > 0); the torch lowering takes per-tensor and per-axis."""
    if node.op not in ("quantize_linear", "dequantize_linear"):
        return True
    return not node.attrs.get("block_size")


RULES = (has_torch_kernel, torch_types, precision_supported, float_windows, spatial_rank,
         pool_dilation, resize_float, quant_layout)


@register
class TorchBackend(Backend):
    """PyTorch operations on a torch device; CUDA graphs on CUDA."""

    name = "torch"
    rules = RULES
    fallback = "reference"

    def __init__(self, target=None, parallelism=1):
        super().__init__(target or "cpu", parallelism)
        self.device = resolve_device(self.target)

    @classmethod
    def available(cls):
        if importlib.util.find_spec("torch") is None:
            return False, "PyTorch is not installed (pip install torch==2.13.0, or the npurun[torch] extra)"
        return True, ""

    def compile(self, graph):
        from .program import TorchProgram
        return TorchProgram(graph, self)


def devices() -> list[str]:
    """The torch devices this machine has, as npurun device strings."""
    import torch
    out = ["torch:cpu"]
    if torch.cuda.is_available():
        out += [f"torch:cuda:{i}" for i in range(torch.cuda.device_count())]
    return out


def resolve_device(target: str):
    import torch
    try:
        dev = torch.device(target)
    except (RuntimeError, ValueError):
        raise BackendError(f"device 'torch:{target}': not a torch device; this machine has "
                           f"{', '.join(devices())}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendError(f"device 'torch:{target}': PyTorch {torch.__version__} has no CUDA device here "
                               f"(a CPU-only build or no GPU); this machine has {', '.join(devices())}")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise BackendError(f"device 'torch:{target}': no such GPU; this machine has {', '.join(devices())}")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        try:
            torch.empty(1, device=dev)
        except Exception as e:
            raise BackendError(f"device 'torch:{target}' is unusable: {e}; this machine has "
                               f"{', '.join(devices())}") from None
    return dev


def with_precision(graph, precision: str, ops=("conv", "matmul", "gemm", "conv_transpose")):
    """A copy of `graph` whose nodes of `ops` compute in `precision` ("f16", "bf16", "i8").
    A stand-in for the precision pass of the compiler (issue D) where that is not run."""
    import copy
    g = copy.copy(graph)
    g.nodes = []
    for n in graph.nodes:
        n2 = copy.copy(n)
        if n.op in ops:
            n2.precision = None if precision == "f32" else precision
        g.nodes.append(n2)
    return g
