"""What a converter sees: the ONNX node, its attributes and inputs, and `emit` to add IR."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...ir.dtypes import to_numpy
from ...ir.ops import infer_node
from ...ir.stored import Stored
from ...passes.fold_constants import try_fold


class ConvertError(Exception):
    """A converter that cannot take this particular node (collected, reported all at once)."""


class Ctx:
    def __init__(self, graph: Graph, opset: int):
        self.graph = graph
        self.opset = opset
        self.node = None  # the onnx.NodeProto being converted
        self.attrs: dict = {}
        self._n = 0
        self.region_of = None  # set by the importer: (GraphProto, input types, name) -> Graph
        self.fold = True  # fold nodes whose results are known at import (passes/fold_constants.py)
        self._node_names: set[str] = set()

    # --- reading the ONNX node
    @property
    def name(self) -> str:
        return self.node.name

    def input(self, i: int) -> str:
        """Name of input i, or "" when absent."""
        return self.node.input[i] if i < len(self.node.input) else ""

    def inputs(self) -> list[str]:
        return list(self.node.input)

    def const_input(self, i: int) -> np.ndarray | None:
        nm = self.input(i)
        v = self.graph.values.get(nm) if nm else None
        return None if v is None else v.data

    def output(self, i: int = 0) -> str:
        return self.node.output[i] if i < len(self.node.output) else ""

    # --- building IR
    def fresh(self, hint: str) -> str:
        while True:
            self._n += 1
            nm = f"{self.name or self.node.op_type}/{hint}{self._n}"
            if nm not in self.graph.values:
                return nm

    def const(self, array, hint: str = "const") -> str:
        nm = self.fresh(hint)
        self.graph.const(nm, np.asarray(array))
        return nm

    def _stored_as(self, node, arr):
        """A folded result that is an operand's very array (Identity of a weight: ALBERT's
        layers share their matrices so) shares that operand's Stored, so the weight stays one
        weight (ir/stored.py: one packed copy, and the array let go)."""
        for i in node.inputs:
            s = self.graph.values[i].stored if i else None
            if isinstance(s, Stored) and s.resident and s.array() is arr:
                return s
        return arr

    def region(self, attr: str, input_types: list | None = None) -> Graph:
        """The subgraph in attribute `attr`, converted; it may read this graph's values."""
        return self.region_of(self.attrs[attr], input_types, f"{self.name or self.node.op_type}.{attr}")

    def value(self, name: str) -> Value:
        return self.graph.values[name]

    def emit(self, op: str, inputs: list[str], outputs: list[str] | None = None, n_out: int = 1,
             regions: dict | None = None, **attrs) -> list[str]:
        """Add one IR node; its output types come from npurun's own inference. A node whose
        results are already known (constant operands, static shapes) becomes constants."""
        outputs = outputs or [self.fresh(op) for _ in range(n_out)]
        name = self.name
        if name in self._node_names:
            name = f"{name}#{len(self.graph.nodes)}"
        node = Node(op, list(inputs), list(outputs), {k: v for k, v in attrs.items() if v is not None},
                    name=name)
        node.regions = dict(regions or {})
        # Trailing absent optional operands carry no meaning: drop them.
        while node.inputs and not node.inputs[-1]:
            node.inputs.pop()
        types = infer_node(node, self.graph.values)
        # (an operand of unknown rank is neither a constant nor a known shape: nothing to fold)
        ranked = all(self.graph.values[i].shape is not None for i in node.inputs if i)
        folded = try_fold(node, self.graph.values, [t[0] for t in types], strict=True) if self.fold and ranked else None
        if folded is not None and all(a.dtype == to_numpy(t[1]) for a, t in zip(folded, types)):
            for nm, arr in zip(outputs, folded):
                self.graph.const(nm, self._stored_as(node, arr))
            return outputs
        for nm, (shape, dtype, kind) in zip(outputs, types):
            self.graph.add_value(Value(nm, None if shape is None else tuple(shape), dtype, kind=kind))
        self.graph.nodes.append(node)
        if name:
            self._node_names.add(name)
        return outputs
