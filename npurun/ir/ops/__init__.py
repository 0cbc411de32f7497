"""The op vocabulary: every op is declared once, in the family module of this package.

A declaration gives the op's operands (roles; `?` marks an optional one, `*` a variadic tail),
its attributes with their defaults, group tags that passes ask about
(`"elementwise" in OPS[n.op].groups`), shape/dtype inference and cost (multiply-accumulates;
bytes moved are derived from the operand types).

Op names are lowercase snake case (`matmul`, `depth_to_space`); an op name in text may carry a
precision suffix (`matmul_f16`), kept on the node as `precision`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...errors import VerifyError
from ..dtypes import FLOAT_TYPES
from ..shapes import numel

REQUIRED = object()  # an attribute without a default
PRECISIONS = ("f32", "f16", "bf16", "i8", "i8acc16", "i16")
# Schedule hints any node may carry; they do not change what a node computes.
HINT_KEYS = {"pipeline": "stages of software pipelining (double buffering is 2)",
             "burst": "DMA burst size in bytes",
             "unit": "compute unit the node is pinned to",
             "tile": "tile shape the node is split into"}


@dataclass(frozen=True)
class OpDef:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] = ("y",)
    attrs: dict = field(default_factory=dict)
    groups: frozenset = frozenset()
    infer: Callable | None = None  # (node, attrs, [Value|None]) -> [(shape, dtype[, kind])]
    macs: Callable | None = None  # (attrs, in_shapes, out_shapes) -> int
    regions: tuple[str, ...] = ()  # attributes that hold subgraphs (control flow)
    # The inference takes operands of unknown rank (shape None, shapes.py); other ops refuse them.
    any_rank: bool = False
    # Ops registered through npurun.register_op (npurun/registry.py) may also say:
    domain: str = ""  # the ONNX domain they come from ("" for ai.onnx and npurun's own)
    bytes: Callable | None = None  # (attrs, [(shape, dtype)|None] in, out) -> bytes moved;
    # None: every operand read and every result written once
    unit: str = ""  # npusim compute unit: "matrix" (MACs on the MAC array) or "vector"; "": built-in rule
    vector_ops: float = 0.0  # vector-unit work per output element (MAC-equivalents); 0: the built-in table

    @property
    def min_inputs(self) -> int:
        return sum(1 for r in self.inputs if not r.endswith(("?", "*")))

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    def attrs_of(self, node) -> dict:
        return {**self.attrs, **node.attrs}


OPS: dict[str, OpDef] = {}


def op(name, inputs, outputs=("y",), attrs=None, groups=(), macs=None, regions=(), **extra):
    """Declare an op; `infer` is the decorated function. `extra` sets the other OpDef fields:
    any_rank, and those ops registered through npurun.register_op carry (domain, bytes,
    unit, vector_ops)."""
    def register(infer):
        OPS[name] = OpDef(name, tuple(inputs), tuple(outputs), dict(attrs or {}),
                          frozenset(groups), infer, macs, tuple(regions), **extra)
        return infer
    return register


def split_precision(full: str) -> tuple[str, str | None]:
    """`"matmul_f16"` -> ("matmul", "f16"); an unknown name comes back unchanged."""
    if full in OPS:
        return full, None
    base, _, suffix = full.rpartition("_")
    if base in OPS and suffix in PRECISIONS:
        return base, suffix
    return full, None


def _fail(node, msg):
    raise VerifyError(f"{node.label()}: {msg}")


def _const_ints(v, node, role):
    """Integer contents of a constant operand (shape, axes, pads), or None if computed."""
    if v is None or v.data is None:
        return None
    return [int(x) for x in v.data.reshape(-1)]


def _same(node, a, ins):
    """Result has the first operand's type (unary math, normalization, ...)."""
    return [(ins[0].shape, ins[0].dtype, ins[0].kind)]


def _axis(a, rank, node):
    if not -rank <= a < max(rank, 1):
        _fail(node, f"axis {a} out of range for rank {rank}")
    return a % rank if rank else 0


def _register_families(package: str, path) -> None:
    """Import every module of this package: each op family registers itself on import, so a
    new family is a new file and nothing else changes."""
    import importlib
    import pkgutil
    for m in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        importlib.import_module(f"{package}.{m.name}")


_register_families(__name__, __path__)
from .elementwise import ACTIVATIONS  # noqa: E402,F401  (re-export)

FLOAT_ONLY = frozenset({"conv", "matmul", "gemm", "softmax", "log_softmax", "tanh", "sigmoid",
                        "erf", "batch_normalization", "layer_normalization"})


def operand_problem(node, d: OpDef) -> str | None:
    """What is wrong with a node's operand list for op `d` (too few, too many, a required one
    absent), or None. The shape rules index their operands by role and rely on this."""
    lo, hi = d.min_inputs, (None if d.variadic else len(d.inputs))
    if len(node.inputs) < lo or (hi is not None and len(node.inputs) > hi):
        takes = str(lo) if hi == lo else f"{lo} to {'any number' if hi is None else hi}"
        return f"has {len(node.inputs)} inputs, {node.op} takes {takes} ({', '.join(d.inputs)})"
    for i, nm in enumerate(node.inputs):
        # A required role may follow optional ones (com.microsoft ops have such).
        if not nm and i < len(d.inputs) and not d.inputs[i].endswith(("?", "*")):
            return f"required operand {i} ({d.inputs[i]}) is absent"
    return None


def infer_node(node, values: dict) -> list[tuple]:
    """Inference for one node, given the graph's values by name: [(shape, dtype, kind)]."""
    d = OPS.get(node.op)
    if d is None:
        raise VerifyError(f"{node.label()}: unknown op {node.op!r}")
    bad = operand_problem(node, d)
    if bad:
        _fail(node, bad)
    for k, v in d.attrs.items():
        if v is REQUIRED and k not in node.attrs:
            _fail(node, f"missing required attribute {k!r}")
    ins = [values[i] if i else None for i in node.inputs]
    if not d.any_rank:
        for i, v in enumerate(ins):
            if v is not None and v.shape is None:
                _fail(node, f"operand {i} {v.name!r} has unknown rank; {node.op} needs to know it")
    if node.op in FLOAT_ONLY and ins[0] is not None and ins[0].dtype not in FLOAT_TYPES:
        _fail(node, f"operand {node.inputs[0]!r} has dtype {ins[0].dtype}; {node.op} expects a float type")
    try:
        out = d.infer(node, d.attrs_of(node), ins)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError, OverflowError) as e:
        # An attribute of a type the rule did not foresee (a .npuir text can say perm=["a", 1]):
        # named, as the importer names a node it cannot convert, never a bare traceback.
        _fail(node, f"its attributes {node.attrs} do not fit {node.op} (internal error {type(e).__name__}: {e})")
    return [r if len(r) == 3 else (r[0], r[1], "tensor") for r in out]


def macs(node, in_shapes, out_shapes) -> int:
    """Multiply-accumulates of one node for concrete shapes (0 for ops without MACs)."""
    d = OPS[node.op]
    if d.macs is None or any(numel(s) is None for s in list(in_shapes) + list(out_shapes) if s is not None):
        return 0
    return int(d.macs(d.attrs_of(node), in_shapes, out_shapes))
