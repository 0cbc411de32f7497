"""Control flow (if, loop, scan, sequence_map), sequences and optionals.

Control-flow ops own regions: subgraphs held in `node.regions` that read the enclosing graph's
values by name. At run time a region is a callable the kernel invokes (see Program).
Sequences are lists of tensors; an optional is a value or None.
"""
from __future__ import annotations

from ..shapes import UNKNOWN, merge_shapes
from . import REQUIRED, _axis, _fail, op


def _types(region, names):
    return [(region.values[n].shape, region.values[n].dtype, region.values[n].kind) for n in names]


# Branches of different ranks: True gives the If an output of unknown rank (shape None), the
# honest type; the passes leave values of unknown rank alone (passes/match.py `Chains.free`),
# and the planner, npusim and the ort export take them. (False: the then-branch's rank with
# unknown dims, what the IR did before it had unknown rank.)
UNRANKED_IF = True


def _merge(a, b):
    """The type both branches agree on: dims that differ become unknown (and the rank where
    the ranks differ: see UNRANKED_IF)."""
    (sa, da, ka), (sb, _, _) = a, b
    if not UNRANKED_IF and sa is not None and sb is not None and len(sa) != len(sb):
        return (tuple(UNKNOWN for _ in sa), da, ka)
    return (merge_shapes(sa, sb), da, ka)


@op("if", ["cond"], outputs=("y*",), regions=("then_branch", "else_branch"), groups={"control"},
    any_rank=True)
def _if(node, a, ins):
    then, other = node.regions["then_branch"], node.regions["else_branch"]
    if len(then.outputs) != len(other.outputs) or len(then.outputs) != len(node.outputs):
        _fail(node, f"branches produce {len(then.outputs)} and {len(other.outputs)} values, "
                    f"the node has {len(node.outputs)} outputs")
    return [_merge(x, y) for x, y in zip(_types(then, then.outputs), _types(other, other.outputs))]


@op("loop", ["max_trip_count?", "cond?", "v_initial*"], outputs=("v_final_and_scan_outputs*",),
    regions=("body",), groups={"control"}, any_rank=True)
def _loop(node, a, ins):
    body = node.regions["body"]
    n_carried = len(node.inputs) - 2
    outs = _types(body, body.outputs)
    if len(body.inputs) != n_carried + 2 or len(outs) != len(node.outputs) + 1:
        _fail(node, f"body takes {len(body.inputs)} inputs and gives {len(outs)} outputs; the loop "
                    f"carries {n_carried} values and has {len(node.outputs)} outputs")
    carried = outs[1:1 + n_carried]
    scans = [(None if s is None else (UNKNOWN,) + tuple(s), d, k) for s, d, k in outs[1 + n_carried:]]
    return carried + scans


@op("scan", ["initial_state_and_scan_inputs*"], outputs=("final_state_and_scan_outputs*",),
    attrs={"num_scan_inputs": REQUIRED, "scan_input_axes": None, "scan_input_directions": None,
           "scan_output_axes": None, "scan_output_directions": None},
    regions=("body",), groups={"control"})
def _scan(node, a, ins):
    body = node.regions["body"]
    m = a["num_scan_inputs"]
    n = len(ins) - m
    axes = a["scan_input_axes"] or [0] * m
    length = UNKNOWN
    if m:
        x = ins[n]
        length = x.shape[_axis(axes[0], len(x.shape), node)]
    outs = _types(body, body.outputs)
    states, scans = outs[:n], outs[n:]
    out_axes = a["scan_output_axes"] or [0] * len(scans)
    result = list(states)
    for (s, d, k), ax in zip(scans, out_axes):
        if s is None:
            result.append((None, d, k))
            continue
        s = list(s)
        s.insert(ax % (len(s) + 1), length)
        result.append((tuple(s), d, k))
    return result


@op("sequence_map", ["input_sequence", "additional_inputs*"], outputs=("out_sequence*",),
    regions=("body",), groups={"control"}, any_rank=True)
def _sequence_map(node, a, ins):
    body = node.regions["body"]
    return [(s, d, "seq") for s, d, _ in _types(body, body.outputs)]


# ---------------------------------------------------------------- sequences

@op("sequence_empty", [], attrs={"dtype": "f32"}, groups={"sequence"})
def _seq_empty(node, a, ins):
    return [((UNKNOWN,), a["dtype"], "seq")]


@op("sequence_construct", ["inputs*"], groups={"sequence"}, any_rank=True)
def _seq_construct(node, a, ins):
    shape = ins[0].shape
    for v in ins[1:]:
        shape = merge_shapes(shape, v.shape)
    return [(shape, ins[0].dtype, "seq")]


def _seq_same(node, a, ins):
    return [(ins[0].shape, ins[0].dtype, "seq")]


op("sequence_insert", ["input_sequence", "tensor", "position?"], groups={"sequence"}, any_rank=True)(_seq_same)
op("sequence_erase", ["input_sequence", "position?"], groups={"sequence"}, any_rank=True)(_seq_same)


@op("sequence_at", ["input_sequence", "position"], groups={"sequence"}, any_rank=True)
def _seq_at(node, a, ins):
    return [(ins[0].shape, ins[0].dtype, "tensor")]


@op("sequence_length", ["input_sequence"], groups={"sequence"}, any_rank=True)
def _seq_len(node, a, ins):
    return [((), "i64", "tensor")]


@op("split_to_sequence", ["input", "split?"], attrs={"axis": 0, "keepdims": 1}, groups={"sequence"})
def _split_to_seq(node, a, ins):
    x = ins[0]
    ax = _axis(a["axis"], len(x.shape), node)
    shape = list(x.shape)
    if len(ins) < 2 or ins[1] is None:
        if a["keepdims"]:
            shape[ax] = 1
        else:
            shape.pop(ax)
    else:
        shape[ax] = UNKNOWN
    return [(tuple(shape), x.dtype, "seq")]


@op("concat_from_sequence", ["input_sequence"], attrs={"axis": REQUIRED, "new_axis": 0}, groups={"sequence"},
    any_rank=True)
def _concat_from_seq(node, a, ins):
    if ins[0].shape is None:
        return [(None, ins[0].dtype, "tensor")]
    rank = len(ins[0].shape) + (1 if a["new_axis"] else 0)
    return [((UNKNOWN,) * rank, ins[0].dtype, "tensor")]


# ---------------------------------------------------------------- optionals

@op("optional", ["input?"], attrs={"dtype": None, "seq": 0}, groups={"optional"}, any_rank=True)
def _optional(node, a, ins):
    if ins and ins[0] is not None:
        v = ins[0]
        return [(v.shape, v.dtype, "opt seq" if v.kind == "seq" else "opt")]
    if a["dtype"] is None:
        _fail(node, "an empty optional needs its element dtype")
    return [((UNKNOWN,), a["dtype"], "opt seq" if a["seq"] else "opt")]


@op("optional_has_element", ["input?"], groups={"optional"}, any_rank=True)
def _opt_has(node, a, ins):
    return [((), "bool", "tensor")]


@op("optional_get_element", ["input"], groups={"optional"}, any_rank=True)
def _opt_get(node, a, ins):
    v = ins[0]
    return [(v.shape, v.dtype, "seq" if v.kind in ("seq", "opt seq") else "tensor")]
