"""Constant folding: a node whose result is known before any input arrives is replaced by
that result.

Known means: every operand is a constant, or the node asks only for a static shape
(`shape` of a value whose dims are all integers, `size` of one). The result comes from the
reference kernel, so folding computes exactly what running the node would. Exporters emit
long `Shape -> Gather -> Unsqueeze -> Concat -> Reshape` chains and `If`s on ranks; folding
them gives later inference (and the backends) static shapes and plain graphs.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.shapes import numel

MAX_FOLD_ELEMENTS = 1 << 20  # larger results stay computed at run time (but see try_fold)
MAX_TRANSFORM_ELEMENTS = 1 << 26


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def try_fold(node: Node, values: dict, out_shapes: list, strict: bool = False) -> list[np.ndarray] | None:
    """The node's results if they can be known now, else None. A kernel that fails on the
    constants is left to fail at run time, naming the node (`strict`: the failure is raised,
    as the importer wants it: a node that can only fail is a bad model)."""
    groups = OPS[node.op].groups
    # (a random op draws anew on every run: never a constant, whatever its operands)
    if node.regions or groups & {"control", "sequence", "optional", "random"}:
        return None
    ins = [values[i] if i else None for i in node.inputs]
    if any(v is not None and v.kind != "tensor" for v in ins):
        return None
    if node.op in ("shape", "size") and ins[0] is not None and _static(ins[0].shape):
        shape = np.array(ins[0].shape, dtype=np.int64)
        if node.op == "size":
            return [np.array(math.prod(ins[0].shape), dtype=np.int64)]
        a = OPS["shape"].attrs_of(node)
        return [shape[a["start"]:a["end"]]]
    if not all(v is None or v.is_const for v in ins) or not any(v is not None for v in ins):
        return None
    # A result bigger than MAX_FOLD_ELEMENTS stays computed, unless it takes no more bytes
    # than an operand (checked on the result below): a transform of weights the model holds
    # anyway (BiT's weight standardization, a transpose of a weight) costs no memory folded
    # and a run each not. (A dequantization widens its bytes: MiniLM-int8's int8 embedding
    # table stays int8.)
    if any(numel(s) is None or numel(s) > MAX_TRANSFORM_ELEMENTS for s in out_shapes):
        return None
    from ..backends.reference.kernels import KERNELS
    from ..errors import NpurunError
    try:
        with np.errstate(all="ignore"):
            res = KERNELS[node.op](*[None if v is None else v.data for v in ins], **OPS[node.op].attrs_of(node))
    except NpurunError:
        raise
    except Exception:  # noqa: BLE001 -- left to run: the run reports the failure, naming the node
        if strict:
            raise
        return None
    res = res if isinstance(res, tuple) else (res,)
    if not all(isinstance(r, np.ndarray | np.generic) for r in res):
        return None
    res = [np.asarray(r) for r in res]
    biggest = max(v.data.nbytes for v in ins if v is not None)
    if any(r.size > MAX_FOLD_ELEMENTS and r.nbytes > biggest for r in res):
        return None
    return res


def fold_constants(g: Graph, outer: dict | None = None) -> Graph:
    """The pass: fold every foldable node, in order (a fold may enable the next). Regions
    (if/loop/scan bodies) fold too, knowing the constants of the graphs around them that they
    capture (`outer`: name -> Value): silero-vad's branches slice captured LSTM weights into
    gates on every run, which folds here once."""
    values = g.values if not outer else _Scope(g, outer)
    kept = []
    for n in g.nodes:
        if n.regions:
            scope = {**(outer or {}), **{v.name: v for v in g.constants()}}
            for r in n.regions.values():
                fold_constants(r, scope)
        shapes = [g.values[o].shape for o in n.outputs]
        res = try_fold(n, values, shapes) if all(_static(s) for s in shapes) or n.op in ("shape", "size") else None
        if res is None:
            kept.append(n)
            continue
        for name, arr in zip(n.outputs, res):
            g.values[name].data = arr.astype(np.dtype(arr.dtype), copy=False)
    g.nodes = kept
    return g


class _Scope(dict):
    """A region's values, where a name it captures (neither its input nor computed by its
    nodes) reads the enclosing graphs' constant."""

    def __init__(self, region: Graph, outer: dict):
        super().__init__(region.values)
        self.outer = outer
        self.defined = set(region.inputs) | {o for n in region.nodes for o in n.outputs}

    def __getitem__(self, name):
        v = dict.get(self, name)
        if (v is None or not v.is_const) and name not in self.defined and name in self.outer:
            return self.outer[name]
        if v is None:
            raise KeyError(name)
        return v
