"""Control flow (If, Loop, Scan, SequenceMap), sequences and optionals.

A subgraph attribute becomes a region of the IR node: converted like any graph, it may read
values of the graphs around it by name. The converter tells the region the types of its inputs
where the model leaves them out (loop bodies often do).
"""
from __future__ import annotations

import numpy as np

from ....ir.graph import Graph, Value
from ..context import ConvertError, Ctx
from ..dtypes import ir_dtype
from . import converter


def _type(ctx: Ctx, name: str):
    v = ctx.value(name)
    return v.shape, v.dtype, v.kind


def _elem(t):
    shape, dtype, kind = t
    return shape, dtype, "tensor" if kind in ("seq", "opt", "opt seq") else kind


@converter("If")
def If(ctx: Ctx):
    cond = ctx.const_input(0)
    if cond is not None:  # the branch is known now: inline it, drop the other
        _inline(ctx, ctx.region("then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"))
        return
    regions = {"then_branch": ctx.region("then_branch"), "else_branch": ctx.region("else_branch")}
    ctx.emit("if", [ctx.input(0)], list(ctx.node.output), regions=regions)


def _inline(ctx: Ctx, region):
    """Splice a region's values and nodes into the current graph; its outputs become the
    node's outputs."""
    g = ctx.graph
    for name, v in region.values.items():
        if name not in g.values:
            g.add_value(v)
    g.nodes.extend(region.nodes)
    for src, dst in zip(region.outputs, ctx.node.output):
        ctx.emit("identity", [src], [dst])


@converter("Loop")
def Loop(ctx: Ctx):
    ins = ctx.inputs() + [""] * max(0, 2 - len(ctx.inputs()))
    carried = [_type(ctx, i) for i in ins[2:]]
    body = ctx.region("body", [((), "i64", "tensor"), ((), "bool", "tensor")] + carried)
    ctx.emit("loop", ins, list(ctx.node.output), regions={"body": body})


@converter("Scan", since=8)
def Scan_8(ctx: Ctx):
    """Scan-8 scans a batch: every operand has a leading batch axis, scan inputs then their
    sequence axis. It becomes a `loop` over the batch whose body runs the (opset 9) `scan` on
    one batch element; the loop stacks the per-element results along a new axis 0, which is
    Scan-8's batch axis. sequence_lens (per-element lengths) is supported where it is absent
    or a constant equal to the full length."""
    a = ctx.attrs
    m = a["num_scan_inputs"]
    ins = ctx.inputs()
    lens, states, xs = ins[0], ins[1:len(ins) - m], ins[len(ins) - m:]
    if not xs:
        raise ConvertError("Scan-8 without scan inputs")
    x0 = ctx.value(xs[0])
    if x0.shape is None or len(x0.shape) < 2:
        raise ConvertError(f"scan input {xs[0]!r} must be (batch, sequence, ...), got {x0.type_str()}")
    if lens:
        known = ctx.const_input(0)
        if known is None or not isinstance(x0.shape[1], int) or np.any(known != x0.shape[1]):
            raise ConvertError("sequence_lens shorter than the sequence is not supported")
    types = [(ctx.value(v).shape[1:], ctx.value(v).dtype, "tensor") for v in states]
    types += [(ctx.value(v).shape[2:], ctx.value(v).dtype, "tensor") for v in xs]
    scan_body = ctx.region("body", types)

    # The loop body: element i of every operand (read from the enclosing graph), one scan.
    loop_body = Graph(name=f"{ctx.name or 'Scan'}.batch", source=ctx.graph.source)
    sub = Ctx(loop_body, ctx.opset)
    sub.node, sub.fold = ctx.node, False
    i, cond = sub.fresh("i"), sub.fresh("cond")
    loop_body.add_value(Value(i, (), "i64"))
    loop_body.add_value(Value(cond, (), "bool"))
    loop_body.inputs = [i, cond]
    for name in states + xs:
        v = ctx.value(name)
        loop_body.add_value(Value(v.name, v.shape, v.dtype, v.space, kind=v.kind))
    elems = [sub.emit("gather", [name, i], axis=0)[0] for name in states + xs]
    outs = sub.emit("scan", elems, n_out=len(ctx.node.output), regions={"body": scan_body},
                    num_scan_inputs=m, scan_input_directions=a.get("directions"))
    loop_body.outputs = sub.emit("identity", [cond]) + outs

    batch = x0.shape[0]
    trip = ctx.const(np.array(batch, np.int64), "batch") if isinstance(batch, int) else \
        ctx.emit("shape", [xs[0]], start=0, end=1)[0]
    ctx.emit("loop", [trip, ctx.const(np.array(True), "true")], list(ctx.node.output),
             regions={"body": loop_body})


@converter("Scan", since=9)
def Scan(ctx: Ctx):
    a = ctx.attrs
    m = a["num_scan_inputs"]
    ins = ctx.inputs()
    n = len(ins) - m
    axes = a.get("scan_input_axes") or [0] * m
    types = [_type(ctx, i) for i in ins[:n]]
    for name, ax in zip(ins[n:], axes):
        shape, dtype, kind = _type(ctx, name)
        shape = list(shape)
        shape.pop(ax % len(shape))
        types.append((tuple(shape), dtype, kind))
    body = ctx.region("body", types)
    ctx.emit("scan", ins, list(ctx.node.output), regions={"body": body}, num_scan_inputs=m,
             scan_input_axes=a.get("scan_input_axes"), scan_input_directions=a.get("scan_input_directions"),
             scan_output_axes=a.get("scan_output_axes"), scan_output_directions=a.get("scan_output_directions"))


@converter("SequenceMap")
def SequenceMap(ctx: Ctx):
    types = [_elem(_type(ctx, i)) if ctx.value(i).kind == "seq" else _type(ctx, i) for i in ctx.inputs()]
    ctx.emit("sequence_map", ctx.inputs(), list(ctx.node.output), regions={"body": ctx.region("body", types)})


# ---------------------------------------------------------------- sequences

@converter("SequenceEmpty")
def SequenceEmpty(ctx: Ctx):
    ctx.emit("sequence_empty", [], [ctx.output(0)], dtype=ir_dtype(ctx.attrs.get("dtype", 1), ctx.name))


def _plain(ir_op, **fixed):
    def convert(ctx: Ctx):
        ctx.emit(ir_op, ctx.inputs(), list(ctx.node.output), **fixed)
    return convert


converter("SequenceConstruct")(_plain("sequence_construct"))
converter("SequenceInsert")(_plain("sequence_insert"))
converter("SequenceErase")(_plain("sequence_erase"))
converter("SequenceAt")(_plain("sequence_at"))
converter("SequenceLength")(_plain("sequence_length"))
converter("OptionalHasElement")(_plain("optional_has_element"))
converter("OptionalGetElement")(_plain("optional_get_element"))


@converter("SplitToSequence")
def SplitToSequence(ctx: Ctx):
    ctx.emit("split_to_sequence", ctx.inputs(), [ctx.output(0)], axis=ctx.attrs.get("axis", 0),
             keepdims=ctx.attrs.get("keepdims", 1))


@converter("ConcatFromSequence")
def ConcatFromSequence(ctx: Ctx):
    ctx.emit("concat_from_sequence", ctx.inputs(), [ctx.output(0)], axis=ctx.attrs["axis"],
             new_axis=ctx.attrs.get("new_axis", 0))


@converter("Optional")
def Optional(ctx: Ctx):
    t = ctx.attrs.get("type")
    dtype, seq = None, 0
    if t is not None:
        if t.HasField("sequence_type"):
            t, seq = t.sequence_type.elem_type, 1
        if not t.HasField("tensor_type"):
            raise ConvertError("optionals of maps are not supported")
        dtype = ir_dtype(t.tensor_type.elem_type, ctx.name)
    ctx.emit("optional", ctx.inputs(), [ctx.output(0)], dtype=dtype, seq=seq)
