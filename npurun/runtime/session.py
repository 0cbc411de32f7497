"""`InferenceSession`, shaped like ONNX Runtime's, so code written for ORT runs on npurun:

    sess = npurun.InferenceSession("model.onnx", device="cpu")
    name = sess.get_inputs()[0].name
    (y,) = sess.run(None, {name: x})
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..frontend import load
from ..ir.graph import Graph
from .executor import Executor

_ORT_TYPE = {"f32": "float", "f16": "float16", "bf16": "bfloat16", "f64": "double", "i8": "int8",
             "u8": "uint8", "i16": "int16", "u16": "uint16", "i32": "int32", "u32": "uint32",
             "i64": "int64", "u64": "uint64", "bool": "bool"}


@dataclass(frozen=True)
class NodeArg:
    name: str
    shape: list  # ints for static dims, strings for symbolic ones (as ORT reports dim_params)
    type: str  # "tensor(float)", ...


class InferenceSession:
    def __init__(self, path_or_graph, device: str = "cpu", parallelism: int | None = None,
                 workspace_mb: int | None = None, executor: Executor | None = None):
        self.graph: Graph = path_or_graph if isinstance(path_or_graph, Graph) else load(path_or_graph)
        self.executor = executor or Executor(device, parallelism=parallelism, workspace_mb=workspace_mb)
        self.executor.compile(self.graph)

    def _args(self, names):
        return [NodeArg(n, [d if isinstance(d, int) else str(d) for d in self.graph.values[n].shape],
                        f"tensor({_ORT_TYPE[self.graph.values[n].dtype]})") for n in names]

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.graph.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.graph.outputs)

    def run(self, output_names, input_feed: dict, run_options=None) -> list:
        outs = self.executor.run_sync(self.graph, input_feed)
        names = output_names or self.graph.outputs
        bad = [n for n in names if n not in outs]
        if bad:
            raise InputError(f"{self.graph.source}: unknown output name(s) {bad}; outputs are {self.graph.outputs}")
        return [outs[n] for n in names]
