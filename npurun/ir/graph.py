"""The in-memory NPU-IR: `Graph`, `Node`, `Value`.

Nodes refer to values by name; the graph owns the values. A value with `data` is a constant
(a weight); all others are computed at run time or fed as graph inputs. An empty string in a
node's inputs marks an optional operand that is absent.

Most values are tensors. A value's `kind` may also be `seq` (a sequence of tensors whose
element type `shape`/`dtype` describe), `opt` (an optional tensor) or `opt seq`. Control-flow
nodes (`if`, `loop`, `scan`) own *regions*: subgraphs that read the enclosing graph's values by
name (captures) besides their own inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dtypes import to_numpy
from .shapes import Dim, format_shape, numel
from .stored import Stored

DEFAULT_SPACE = "DRAM0"
# Memory spaces a value may live in. Later layers (memory planning, devices) register more.
MEMORY_SPACES = {"DRAM0": "off-chip DRAM", "NPU_SRAM": "on-chip SRAM", "NPU_CACHE": "cache tier (DMA-fed)"}


def register_memory_space(name: str, description: str) -> None:
    MEMORY_SPACES[name] = description


KINDS = ("tensor", "seq", "opt", "opt seq")


_UNSET = object()


@dataclass(eq=False, init=False)
class Value:
    name: str
    shape: tuple[Dim, ...] | None  # None: rank unknown (see shapes.py)
    dtype: str
    space: str = DEFAULT_SPACE
    # A constant's array (`data`, below), or a Stored (ir/stored.py): an array read from the
    # model file that a program holding a packed copy may let go, read again when asked for.
    # (A field of its own, so copies of the value share the Stored rather than its array.)
    stored: object = None
    kind: str = "tensor"  # one of KINDS; shape and dtype are the (element) tensor's
    # Calibrated range and quantization parameters (npurun/precision): min, max, percentile
    # and MSE-optimal bounds, the chosen scale and zero point. Printed as a `range` statement.
    calib: dict = field(default_factory=dict)

    def __init__(self, name, shape, dtype, space=DEFAULT_SPACE, data=_UNSET, kind="tensor", calib=None, *,
                 stored=None):
        self.name, self.shape, self.dtype, self.space, self.kind = name, shape, dtype, space, kind
        self.stored = stored if data is _UNSET else data  # (replace(v, data=...) sets it anew)
        self.calib = {} if calib is None else calib

    @property
    def data(self) -> np.ndarray | None:
        """The constant's array (None for a computed value)."""
        s = self.stored
        return s.array() if isinstance(s, Stored) else s

    @data.setter
    def data(self, array) -> None:
        self.stored = array

    @property
    def is_const(self) -> bool:
        return self.stored is not None

    @property
    def nbytes(self) -> int | None:
        n = numel(self.shape)
        return None if n is None else n * to_numpy(self.dtype).itemsize

    def type_str(self) -> str:
        kind = "" if self.kind == "tensor" else self.kind + " "
        return f"{kind}{format_shape(self.shape)} {self.dtype} {self.space}"

    def same_as(self, other: Value) -> bool:
        def shape(v):
            return None if v.shape is None else tuple(v.shape)
        if (self.name, shape(self), self.dtype, self.space, self.kind) != (
                other.name, shape(other), other.dtype, other.space, other.kind):
            return False
        if (self.data is None) != (other.data is None) or self.calib != other.calib:
            return False
        if self.data is None:
            return True
        if self.data.dtype != other.data.dtype or self.data.shape != other.data.shape:
            return False
        if self.data.dtype == object:  # strings
            return self.data.tolist() == other.data.tolist()
        # Compare bit patterns, so NaNs (and every ml_dtypes type) compare exactly.
        return self.data.tobytes() == other.data.tobytes()


@dataclass(eq=False)
class Node:
    op: str  # a name from the op vocabulary (npurun.ir.ops), e.g. "conv"
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)  # semantics: pads, strides, ...
    hints: dict = field(default_factory=dict)  # schedule hints: pipeline=3 burst=256 ...
    name: str = ""
    precision: str | None = None  # from the op name's suffix: matmul_f16 -> "f16"
    regions: dict = field(default_factory=dict)  # attribute name -> Graph (control flow)
    why: str = ""  # why the node runs at its precision (select_precision); printed as why="..."

    @property
    def full_op(self) -> str:
        return f"{self.op}_{self.precision}" if self.precision else self.op

    def label(self) -> str:
        return f"node {self.name!r} ({self.full_op})" if self.name else f"node {self.full_op}"

    def key(self):
        return (self.op, self.precision, self.name, list(self.inputs), list(self.outputs),
                self.attrs, self.hints, self.regions, self.why)


@dataclass(eq=False)
class Graph:
    name: str = "main"
    values: dict[str, Value] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    source: str = "<memory>"  # the file it came from, for error messages

    def add_value(self, v: Value) -> Value:
        self.values[v.name] = v
        return v

    def const(self, name: str, array: np.ndarray | Stored, space: str = DEFAULT_SPACE) -> Value:
        from .dtypes import from_numpy
        if isinstance(array, Stored):
            return self.add_value(Value(name, array.shape, from_numpy(array.dtype), space, stored=array))
        arr = np.asarray(array, order="C")  # (ascontiguousarray would make a scalar 1-D)
        return self.add_value(Value(name, tuple(arr.shape), from_numpy(arr.dtype), space, arr))

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def constants(self) -> list[Value]:
        return [v for v in self.values.values() if v.is_const]

    def captures(self) -> list[str]:
        """Names this graph (a region) reads from its enclosing graphs: used here or in nested
        regions, but neither its inputs, its constants, nor produced by its nodes."""
        own = set(self.inputs) | {v.name for v in self.constants()} | {o for n in self.nodes for o in n.outputs}
        seen: dict[str, None] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in own:
                    seen[i] = None
            for r in n.regions.values():
                for i in r.captures():
                    if i not in own:
                        seen[i] = None
        for o in self.outputs:
            if o not in own:
                seen[o] = None
        return list(seen)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        if (self.name, self.inputs, self.outputs) != (other.name, other.inputs, other.outputs):
            return False
        if [n.key() for n in self.nodes] != [n.key() for n in other.nodes]:
            return False
        if self.values.keys() != other.values.keys():
            return False
        return all(v.same_as(other.values[k]) for k, v in self.values.items())

    __hash__ = None

    def copy(self) -> "Graph":
        """A copy whose nodes and values can be rewritten freely; constants' arrays are shared
        (passes replace a constant, they never write into its array), so copying a model with
        100 MB of weights costs no weights."""
        from dataclasses import replace
        values = {k: replace(v, calib=dict(v.calib)) for k, v in self.values.items()}
        nodes = [replace(n, inputs=list(n.inputs), outputs=list(n.outputs), attrs=dict(n.attrs),
                         hints=dict(n.hints), regions={k: r.copy() for k, r in n.regions.items()})
                 for n in self.nodes]
        return Graph(self.name, values, nodes, list(self.inputs), list(self.outputs), self.source)

    def __str__(self) -> str:
        from .text import print_graph
        return print_graph(self)
