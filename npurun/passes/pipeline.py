"""Pass pipelines: a pipeline is a plain list of passes, each a function `Graph -> Graph`.

    g = run_pipeline(g, pipeline_for("cpu"), verify_each=True)
    g = prepare(graph, "cpu", {"x": (1, 3, 224, 224)})    # what every entry point runs

Passes are the only graph rewriter: every entry point (Executor, InferenceSession, the
server, every CLI command) hands a backend `prepare(graph, device, input shapes)`, never the
raw import. A pipeline is STANDARD (backend-neutral clean-up: what `npurun.compile` runs
before choosing precisions) followed by the backend's LOWERING passes (fusions into ops
its kernels take whole: ir/ops/fused.py, conv epilogues).

A pass's name is its function's name (a pass with options is bound with functools.partial,
whose name is the wrapped function's). With `verify_each` the IR verifier runs after every
pass, and a broken graph is reported as the fault of the pass that produced it.
"""
from __future__ import annotations

import functools
from typing import Callable

from ..errors import NpurunError, PassError, VerifyError
from ..ir.graph import Graph
from ..ir.verify import verify
from .batch_shared_weights import batch_shared_weights
from .eliminate_dead_code import eliminate_dead_code
from .fold_affine import fold_affine
from .fold_batchnorm import fold_batchnorm
from .fold_constants import fold_constants
from .fuse_activation import fuse_activation
from .fuse_add_activation import fuse_add_activation
from .fuse_attention import fuse_attention
from .fuse_channel_affine import fuse_channel_affine
from .fuse_affine_chain import fuse_affine_chain
from .fuse_gelu import fuse_gelu
from .fuse_hard_swish import fuse_hard_swish
from .fuse_layer_norm import fuse_layer_norm
from .fuse_masked_softmax import fuse_masked_softmax
from .fuse_matmul_add import fuse_matmul_add
from .fuse_ops import fuse_ops
from .fuse_pad import fuse_pad
from .fuse_rotary import fuse_rotary
from .fuse_swish import fuse_swish
from .inline_constant_if import inline_constant_if
from .lift_over_views import lift_over_views
from .push_transposes import push_transposes
from .remove_noops import remove_noops
from .simplify_shapes import simplify_shapes
from .sink_gather import sink_gather

Pass = Callable[[Graph], Graph]

# Per target: the passes every model gets before its backend compiles it. Precision
# selection, layouts and splitting need options (a device, ranges, a workspace), so the
# callers that know those append them (npurun.compile, the Executor).
#
# Order: folding (an If whose condition folded is replaced by its branch) and shape
# simplification first (they turn computed shapes into constants, which the no-op and
# fusion patterns need); transposes pushed down before fusion (fuse_ops
# merges the ones that meet, remove_noops drops identities); BatchNorm folding before fusion
# (a folded conv may then take a following bias); dead-code removal last. Shapes are
# simplified twice: the first round re-infers every value's shape as it goes, which lets the
# second fold what depended on those (a decoder's shape(repeated keys)[3] once their head size
# is known: 18 of a 2-layer Llama step's 193 nodes).
STANDARD: list[Pass] = [fold_constants, inline_constant_if, simplify_shapes, fold_constants, simplify_shapes,
                        fold_constants, remove_noops, push_transposes, fuse_pad, fold_batchnorm, fuse_ops,
                        remove_noops, eliminate_dead_code]
# The cpu backend's lowering: ops after a view of a conv's result moved before the view, then
# affines into convs (a conv + BN + ReLU then takes the ReLU as its epilogue), activations spelled out in ops made single ops before the epilogue
# fusion, the softmax's mask add before the matmul adds (which would take it otherwise), an
# add of two computed values with its activation after those, the per-channel then the scalar
# affine runs last (they take what the others left).
CPU_LOWERING: list[Pass] = [lift_over_views, fold_affine, fuse_layer_norm, fuse_hard_swish, fuse_swish, fuse_gelu, fuse_activation,
                            fuse_masked_softmax, fuse_attention, fuse_rotary, fuse_matmul_add, fuse_add_activation,
                            batch_shared_weights, sink_gather, fuse_channel_affine, fuse_affine_chain, eliminate_dead_code]
PIPELINES: dict[str, list[Pass]] = {
    "default": STANDARD,
    # The oracle runs a graph as it is written: a pass that broke a model must not break the
    # numbers it is checked against.
    "reference": [],
    # no layout pass: bench/layouts.py measured no gain on cpu (docs/passes.md)
    "cpu": STANDARD + CPU_LOWERING,
}


def pass_name(p: Pass) -> str:
    while isinstance(p, functools.partial):
        p = p.func
    return getattr(p, "__name__", repr(p))


def pipeline_for(target: str) -> list[Pass]:
    """The pipeline of a backend name (`cpu`, `npusim`, ...), or the default one."""
    return list(PIPELINES.get(target.split(":")[0], PIPELINES["default"]))


def standard_pipeline() -> list[Pass]:
    """The backend-neutral passes (npurun.compile runs these before choosing precisions)."""
    return list(STANDARD)


def prepare(graph: Graph, device: str, shapes: dict | None = None, *, verify_each: bool = False) -> Graph:
    """The graph a backend compiles: a copy of `graph` (which is not modified; constants'
    arrays are shared), its symbolic input dims bound to `shapes` (name -> concrete shape)
    where given, through `pipeline_for(device)`. Binding shapes lets the shape arithmetic
    exporters emit fold to constants for the shapes a run really has."""
    g = graph.copy()
    if shapes:
        _bind_inputs(g, shapes)
    return run_pipeline(g, pipeline_for(device), verify_each=verify_each)


def _bind_inputs(g: Graph, shapes: dict) -> None:
    """Input values whose dims are symbolic take the concrete dims of `shapes` (a mismatch is
    left for the run's input check to report), and every value's shape is inferred again from
    them in order: a dim inference now knows replaces a symbol or a `?`. A dim given as None
    stays as declared (a generator binds a decode step's batch and token count but not the
    attention mask's growing length)."""
    from ..ir.ops import infer_node
    from ..ir.shapes import bind
    changed = False
    for name in g.inputs:
        v = g.values[name]
        s = shapes.get(name)
        if s is None or v.kind != "tensor" or v.shape is None or len(s) != len(v.shape) \
                or all(isinstance(d, int) for d in v.shape):
            continue
        new = tuple(d if x is None else int(x) for d, x in zip(v.shape, s))
        given = [(d, x) for d, x in zip(v.shape, s) if x is not None]
        if new != tuple(v.shape) and bind(tuple(d for d, _ in given), tuple(x for _, x in given), {}):
            v.shape = new
            changed = True
    if not changed:
        return
    for n in g.nodes:
        try:
            inferred = infer_node(n, g.values)
        except Exception:  # noqa: BLE001 -- a node inference cannot judge keeps its declaration
            continue
        for nm, (shape, _dtype, _kind) in zip(n.outputs, inferred):
            v = g.values[nm]
            if shape is None:
                continue
            if v.shape is None:  # inference now knows the rank
                v.shape = tuple(shape)
            elif len(shape) == len(v.shape):
                v.shape = tuple(s if isinstance(s, int) else d for d, s in zip(v.shape, shape))


def run_pipeline(g: Graph, passes: list[Pass], *, verify_each: bool = False) -> Graph:
    for p in passes:
        try:
            g = p(g)
        except NpurunError:
            raise
        except Exception as e:  # a pass's bug: named, never a bare internal exception
            raise PassError(f"{g.source}: pass {pass_name(p)} failed ({e.__class__.__name__}: {e}); "
                            f"please report it with the model") from e
        if not isinstance(g, Graph):
            raise PassError(f"pass {pass_name(p)} returned {type(g).__name__}, not a Graph")
        if verify_each:
            try:
                verify(g)
            except VerifyError as e:
                raise PassError(f"pass {pass_name(p)} broke the graph: {e}") from e
    return g
