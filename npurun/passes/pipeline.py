"""Pass pipelines: a pipeline is a plain list of passes, each a function `Graph -> Graph`.

    g = run_pipeline(g, pipeline_for("cpu"), verify_each=True)

A pass's name is its function's name (a pass with options is bound with functools.partial,
whose name is the wrapped function's). With `verify_each` the IR verifier runs after every
pass, and a broken graph is reported as the fault of the pass that produced it.
"""
from __future__ import annotations

import functools
from typing import Callable

from ..errors import PassError, VerifyError
from ..ir.graph import Graph
from ..ir.verify import verify
from .eliminate_dead_code import eliminate_dead_code
from .fold_batchnorm import fold_batchnorm
from .fold_constants import fold_constants
from .fuse_ops import fuse_ops
from .remove_noops import remove_noops
from .simplify_shapes import simplify_shapes

Pass = Callable[[Graph], Graph]

# Per target: the passes every model gets before its backend compiles it. Precision
# selection, layouts and splitting need options (a device, ranges, a workspace), so the
# callers that know those append them (npurun.compile, the Executor).
#
# Order: folding and shape simplification first (they turn computed shapes into constants,
# which the no-op and fusion patterns need); BatchNorm folding before fusion (a folded conv
# may then take a following bias); dead-code removal last, to drop what the others bypassed.
STANDARD: list[Pass] = [fold_constants, simplify_shapes, remove_noops, fold_batchnorm, fuse_ops,
                        remove_noops, eliminate_dead_code]
PIPELINES: dict[str, list[Pass]] = {
    "default": STANDARD,
    "reference": STANDARD,
    "cpu": STANDARD,  # no layout pass: bench/layouts.py measured no gain on cpu (docs/passes.md)
}


def pass_name(p: Pass) -> str:
    while isinstance(p, functools.partial):
        p = p.func
    return getattr(p, "__name__", repr(p))


def pipeline_for(target: str) -> list[Pass]:
    """The pipeline of a backend name (`cpu`, `npusim`, ...), or the default one."""
    return list(PIPELINES.get(target.split(":")[0], PIPELINES["default"]))


def run_pipeline(g: Graph, passes: list[Pass], *, verify_each: bool = False) -> Graph:
    for p in passes:
        g = p(g)
        if not isinstance(g, Graph):
            raise PassError(f"pass {pass_name(p)} returned {type(g).__name__}, not a Graph")
        if verify_each:
            try:
                verify(g)
            except VerifyError as e:
                raise PassError(f"pass {pass_name(p)} broke the graph: {e}") from e
    return g
