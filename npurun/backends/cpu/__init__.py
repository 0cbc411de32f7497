"""The `cpu` backend: a compiled Program over the host CPU.

Convolutions run the banded im2col + GEMM kernel of `conv.py` with the bias and a following
activation fused into it (when the activation is the convolution's only reader), spread over
the Executor's `parallelism` threads. Every other op runs its reference kernel with NumPy's
BLAS limited to `parallelism` threads. Issue C widens the set of fast kernels; the rule stays:
each fast kernel is checked against the reference kernel in tests.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from threadpoolctl import threadpool_limits

from ...ir.graph import Node
from ...ir.ops import OPS
from .. import register
from ..base import Backend, Program
from ..reference.kernels import KERNELS
from . import conv


class CpuProgram(Program):
    def __init__(self, graph, backend: "CpuBackend"):
        self.threads = backend.parallelism
        self.pool = backend.pool
        kernels = dict(KERNELS)
        kernels["conv"] = self._conv
        super().__init__(graph, kernels, backend.name)
        self._fuse_activations()

    def _conv(self, x, w, b=None, *, _act=None, _act_attrs=None, **attrs):
        if not conv.fast_conv_applies(x, w, attrs):
            y = KERNELS["conv"](x, w, b, **attrs)
            return y if _act is None else KERNELS[_act](y, **_act_attrs)
        return conv.conv2d(x, w, b, attrs, _act, _act_attrs, self.pool, self.threads)

    def _fuse_activations(self):
        """conv -> activation, where the conv runs the banded kernel, the activation is its only
        reader and its result is not a graph output, becomes one step writing the activation's
        result."""
        readers = self.graph.consumers()
        fused, drop = [], set()
        self.fused: dict[int, Node] = {}  # id(activation node) -> the conv it was fused into
        for k, (n, fn, attrs, dead) in enumerate(self.steps):
            if k in drop:
                continue
            nxt = self.steps[k + 1] if k + 1 < len(self.steps) else None
            if (n.op == "conv" and all(rule(n, self.graph) for rule in CpuBackend.rules)
                    and nxt is not None and nxt[0].op in conv.EPILOGUES
                    and nxt[0].inputs == [n.outputs[0]] and len(readers.get(n.outputs[0], [])) == 1
                    and n.outputs[0] not in self.graph.outputs):
                act = nxt[0]
                self.fused[id(act)] = n
                n2 = Node(n.op, n.inputs, act.outputs, n.attrs, n.hints, n.name, n.precision)
                attrs = {**attrs, "_act": act.op, "_act_attrs": OPS[act.op].attrs_of(act)}
                fused.append((n2, fn, attrs, [d for d in dead + nxt[3] if d != n.outputs[0]]))
                drop.add(k + 1)
            else:
                fused.append((n, fn, attrs, dead))
        self.steps = fused

    def run(self, feeds, progress=None):
        # BLAS threads are process-wide; limit them for the duration of this run only.
        with threadpool_limits(limits=self.threads, user_api="blas"):
            return super().run(feeds, progress)


def has_cpu_kernel(node, graph) -> bool:
    """The cpu backend has no kernel of its own for this op; the reference kernel runs it."""
    return node.op in CPU_KERNELS


def conv_is_2d(node, graph) -> bool:
    """Not a 2-D convolution; the banded GEMM kernel takes NCHW images only."""
    return node.op != "conv" or graph is None or len(graph.values[node.inputs[0]].shape) == 4


def conv_is_dense(node, graph) -> bool:
    """A grouped or depthwise convolution; the banded GEMM kernel takes group=1 only."""
    return node.op != "conv" or node.attrs.get("group", 1) == 1


def conv_is_float32(node, graph) -> bool:
    """Not float32; the banded GEMM kernel computes in float32."""
    return node.op != "conv" or graph is None or graph.values[node.inputs[0]].dtype == "f32"


CPU_KERNELS = {"conv"}  # ops with a kernel of the cpu backend's own


@register
class CpuBackend(Backend):
    """Compiled programs on the host CPU: banded conv with fused epilogues, threads = parallelism."""

    name = "cpu"
    rules = (has_cpu_kernel, conv_is_2d, conv_is_dense, conv_is_float32)
    fallback = "reference"

    def __init__(self, target=None, parallelism=1):
        super().__init__(target, parallelism)
        self.pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="npurun-cpu") \
            if parallelism > 1 else None


    def compile(self, graph):
        return CpuProgram(graph, self)
