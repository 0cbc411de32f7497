"""Reference kernels: control flow, sequences, optionals.

A control-flow kernel gets its regions as `_regions`: name -> callable(list of inputs) ->
list of outputs, which runs the subgraph with the enclosing run's values in scope.
"""
from __future__ import annotations

import numpy as np

from . import kernel


@kernel("if")
def if_(cond, *, _regions):
    branch = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
    return tuple(_regions[branch]([]))


@kernel("loop")
def loop(max_trip_count=None, cond=None, *carried, _regions):
    # Runs while i < M and cond; body(i, cond, v...) -> (cond, v..., scan outputs...).
    body = _regions["body"]
    limit = None if max_trip_count is None else int(np.asarray(max_trip_count).reshape(-1)[0])
    go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    values, scans, i = list(carried), None, 0
    while go and (limit is None or i < limit):
        outs = body([np.array(i, np.int64), np.array(go), *values])
        go = bool(np.asarray(outs[0]).reshape(-1)[0])
        values = list(outs[1:1 + len(carried)])
        step = outs[1 + len(carried):]
        scans = [[] for _ in step] if scans is None else scans
        for acc, v in zip(scans, step):
            acc.append(v)
        i += 1
    stacked = [np.stack(s) for s in scans] if scans else []
    return tuple(values + stacked)


@kernel("scan")
def scan(*inputs, num_scan_inputs, scan_input_axes, scan_input_directions, scan_output_axes,
         scan_output_directions, _regions):
    m = num_scan_inputs
    states, xs = list(inputs[:len(inputs) - m]), inputs[len(inputs) - m:]
    in_axes = [a % x.ndim for a, x in zip(scan_input_axes or [0] * m, xs)]
    in_dirs = scan_input_directions or [0] * m
    length = xs[0].shape[in_axes[0]] if m else 0
    outs_per_step = []
    for t in range(length):
        slices = [np.take(x, length - 1 - t if d else t, axis=ax) for x, ax, d in zip(xs, in_axes, in_dirs)]
        outs = _regions["body"]([*states, *slices])
        states = list(outs[:len(states)])
        outs_per_step.append(outs[len(states):])
    k = len(outs_per_step[0]) if outs_per_step else 0
    out_axes = scan_output_axes or [0] * k
    out_dirs = scan_output_directions or [0] * k
    scans = []
    for j in range(k):
        seq = [o[j] for o in outs_per_step]
        if out_dirs[j]:
            seq = seq[::-1]
        scans.append(np.stack(seq, axis=out_axes[j] % (seq[0].ndim + 1)))
    return tuple(states + scans)


@kernel("sequence_map")
def sequence_map(seq, *extra, _regions):
    results = None
    for i, item in enumerate(seq):
        args = [item] + [e[i] if isinstance(e, list) else e for e in extra]
        outs = _regions["body"](args)
        results = [[] for _ in outs] if results is None else results
        for acc, o in zip(results, outs):
            acc.append(o)
    return tuple(results or [])


# ---------------------------------------------------------------- sequences

def _pos(position, n, insert=False):
    p = int(np.asarray(position).reshape(-1)[0])
    if not (-n <= p <= n if insert else -n <= p < n):
        raise IndexError(f"position {p} is out of range for a sequence of {n}")
    return p + n if p < 0 else p


@kernel("sequence_empty")
def sequence_empty(*, dtype):
    return []


@kernel("sequence_construct")
def sequence_construct(*xs):
    return list(xs)


@kernel("sequence_insert")
def sequence_insert(seq, x, position=None):
    out = list(seq)
    out.insert(len(out) if position is None else _pos(position, len(out), insert=True), x)
    return out


@kernel("sequence_erase")
def sequence_erase(seq, position=None):
    out = list(seq)
    del out[len(out) - 1 if position is None else _pos(position, len(out))]
    return out


@kernel("sequence_at")
def sequence_at(seq, position):
    return seq[_pos(position, len(seq))]


@kernel("sequence_length")
def sequence_length(seq):
    return np.array(len(seq), np.int64)


@kernel("split_to_sequence")
def split_to_sequence(x, split=None, *, axis, keepdims):
    if split is None:
        parts = np.split(x, x.shape[axis], axis=axis)
        return [p if keepdims else np.squeeze(p, axis=axis) for p in parts]
    sizes = [int(split)] * (-(-x.shape[axis] // int(split))) if np.ndim(split) == 0 else [int(s) for s in split]
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


@kernel("concat_from_sequence")
def concat_from_sequence(seq, *, axis, new_axis):
    return np.stack(seq, axis=axis) if new_axis else np.concatenate(seq, axis=axis)


# ---------------------------------------------------------------- optionals

@kernel("optional")
def optional(x=None, *, dtype, seq):
    return x


@kernel("optional_has_element")
def optional_has_element(x=None):
    return np.array(x is not None)


@kernel("optional_get_element")
def optional_get_element(x):
    if x is None:
        raise ValueError("the optional is empty")
    return x


