"""The IR verifier: every invariant a well-formed graph keeps, with errors naming the node
and operand at fault. Passes and importers call it; tests run it between passes."""
from __future__ import annotations

from ..errors import VerifyError
from .dtypes import DTYPES
from .graph import MEMORY_SPACES, Graph
from .ops import OPS, REQUIRED, infer_node, operand_problem
from .shapes import UNKNOWN, format_shape, is_valid_dim


def _dims_conflict(a, b) -> bool:
    if a == b or a == UNKNOWN or b == UNKNOWN:
        return False
    return isinstance(a, int) and isinstance(b, int) or isinstance(a, str) and isinstance(b, str)


def _shapes_conflict(a, b) -> bool:
    """A declared and an inferred shape contradict each other (an unknown rank never does)."""
    if a is None or b is None:
        return False
    return len(a) != len(b) or any(_dims_conflict(x, y) for x, y in zip(a, b))


def verify(g: Graph, *, where: str = "", outer: frozenset = frozenset(), scope: str = "") -> Graph:
    """Raise VerifyError on the first broken invariant; return the graph unchanged otherwise.
    `outer` holds the names a region may read from its enclosing graphs."""
    pre = f"{g.source}: " + (f"after {where}: " if where else "") + (f"in {scope}: " if scope else "")

    def fail(msg):
        raise VerifyError(pre + msg)

    for v in g.values.values():
        if v.dtype not in DTYPES:
            fail(f"value {v.name!r} has unknown dtype {v.dtype!r}")
        if v.space not in MEMORY_SPACES:
            fail(f"value {v.name!r} is in unknown memory space {v.space!r}; known: {', '.join(MEMORY_SPACES)}")
        if v.shape is not None and not all(is_valid_dim(d) for d in v.shape):
            fail(f"value {v.name!r} has an invalid shape {list(v.shape)}")
        if v.is_const and (v.shape is None or tuple(v.data.shape) != tuple(v.shape)):
            fail(f"constant {v.name!r} holds data of shape {list(v.data.shape)}, declared {format_shape(v.shape)}")
    for nm in g.inputs:
        if nm not in g.values:
            fail(f"graph input {nm!r} is not a declared value")
    defined = set(g.inputs) | {v.name for v in g.constants()} | set(outer)
    for n in g.nodes:
        d = OPS.get(n.op)
        if d is None:
            fail(f"{n.label()}: unknown op {n.op!r}")
        bad = operand_problem(n, d)
        if bad:
            fail(f"{n.label()}: {bad}")
        for k, v in d.attrs.items():
            if v is REQUIRED and k not in n.attrs:
                fail(f"{n.label()}: missing required attribute {k!r}")
        for k in n.attrs:
            if k not in d.attrs:
                fail(f"{n.label()}: unknown attribute {k!r}; {n.op} takes {', '.join(d.attrs) or 'none'}")
        if set(n.regions) != set(d.regions):
            fail(f"{n.label()}: has regions {sorted(n.regions)}, {n.op} takes {list(d.regions)}")
        for rname, region in n.regions.items():
            region.source = g.source
            verify(region, where=where, outer=frozenset(defined),
                   scope=(scope + " > " if scope else "") + f"{n.label()} {rname}")
        for i, nm in enumerate(n.inputs):
            if not nm:
                continue  # absent: operand_problem said whether it may be
            if nm not in g.values:
                fail(f"{n.label()}: operand {i} {nm!r} is not a declared value")
            if nm not in defined:
                fail(f"{n.label()}: operand {i} {nm!r} is used before it is produced "
                     f"(dangling input or a cycle)")
        for nm in n.outputs:
            if nm not in g.values:
                fail(f"{n.label()}: output {nm!r} is not a declared value")
            if nm in defined:
                fail(f"{n.label()}: output {nm!r} is already defined (produced twice, or a graph input/constant)")
        try:
            inferred = infer_node(n, g.values)
        except VerifyError as e:
            fail(str(e))
        if len(inferred) != len(n.outputs):
            fail(f"{n.label()}: produces {len(inferred)} outputs, {len(n.outputs)} declared")
        for nm, (shape, dtype, kind) in zip(n.outputs, inferred):
            v = g.values[nm]
            if v.kind != kind:
                fail(f"{n.label()}: output {nm!r} declared {v.kind}, the op computes {kind}")
            if v.dtype != dtype:
                fail(f"{n.label()}: output {nm!r} declared {v.dtype}, the op computes {dtype}")
            if _shapes_conflict(v.shape, shape):
                fail(f"{n.label()}: output {nm!r} declared {format_shape(v.shape)}, the op computes "
                     f"{format_shape(shape)}")
        defined.update(n.outputs)
    for nm in g.outputs:
        if not nm:  # ("" is an omitted optional operand, never a value anyone can read)
            fail("a graph output has an empty name")
        if nm not in defined:
            fail(f"graph output {nm!r} is never produced")
    return g
