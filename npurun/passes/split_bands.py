"""split_bands: run conv chains too big for the fast tier as a cascade of row bands.

A *chain* is a run of band-local nodes, each the only reader of the one before: convolutions,
elementwise ops whose other operands are constants that do not vary along rows (a bias, a
scale), batch normalization, and a trailing depth_to_space. Row r of a band-local node's
result depends only on a window of input rows, so a band of result rows needs a band of input
rows plus a *halo* (the window's overhang) and nothing else.

For a chain x -> ... -> y too big for `budget_bytes`, y's rows are cut into bands; for each
band the rows every node needs are worked out backwards from y (a conv with kernel k, stride
s, dilation d and top pad p maps result rows [o0, o1) to input rows
[o0*s - p, (o1-1)*s - p + d*(k-1) + 1)). Each band becomes ordinary nodes:

    slice(x, rows [a, b) + halo)            # staged one band ahead (ping-pong, pipeline=2)
    conv(pads: top/bottom only where the band touches the image edge) -> act -> ... -> d2s
    ...
    y = concat(band results, axis=2)        # the only whole-size value besides x

so an intermediate feature map never exists whole: at most one band of it (plus the next
band's input) is live. The bands overlap by their halos; the recomputed halo rows are the
price. Slices are emitted one band ahead (slice k+1 before band k's convs), so band k+1's
input is staged while band k computes. The executor runs the result like any graph.

The pass works on concrete shapes (`shapes` binds a symbolic graph's inputs; the result is
specialized to them). A chain whose one band of the smallest height does not fit raises
WorkspaceError with the bytes that band needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import NpurunError
from ..ir.cost import concrete_values
from ..ir.dtypes import to_numpy
from ..ir.graph import Graph, Node, Value
from ..ir.ops import OPS

ROWS = 2      # the rows axis of NCHW
ALIGN = 64    # arena alignment (memory/arena.py), counted per buffer in working sets
MB = 2 ** 20


class WorkspaceError(NpurunError):
    """A fast tier (workspace) too small for even one band of a chain."""

    def __init__(self, msg: str, need_bytes: int = 0):
        super().__init__(msg)
        self.need_bytes = need_bytes


@dataclass
class Chain:
    nodes: list[Node]
    x: str        # the chain's input, (N, C, H, W)
    y: str        # its result
    unit: int     # band edges in y's rows are multiples of this (a trailing depth_to_space's block)

    def label(self) -> str:
        a, b = self.nodes[0], self.nodes[-1]
        return f"{a.name or a.op}..{b.name or b.op}"


def _static4(v) -> bool:
    return v is not None and v.kind == "tensor" and len(v.shape) == 4 and all(isinstance(d, int) for d in v.shape)


def band_local(n: Node, vals: dict) -> bool:
    """Does row r of n's result depend only on a window of rows of its first operand?"""
    if len(n.outputs) != 1 or n.regions or not n.inputs or not n.inputs[0]:
        return False
    if not (_static4(vals.get(n.inputs[0])) and _static4(vals.get(n.outputs[0]))):
        return False
    if n.op == "conv":
        return OPS["conv"].attrs_of(n)["auto_pad"] in ("NOTSET", "VALID") and len(vals[n.inputs[1]].shape) == 4
    if n.op == "depth_to_space":
        return True
    if "elementwise" in OPS[n.op].groups or n.op == "batch_normalization":
        if vals[n.outputs[0]].shape != vals[n.inputs[0]].shape:
            return False
        for o in n.inputs[1:]:  # other operands: constants constant along rows
            if o and (not vals[o].is_const or (len(vals[o].shape) >= 2 and vals[o].shape[-2] != 1)):
                return False
        return True
    return False


def find_chains(g: Graph, vals: dict) -> list[Chain]:
    """Maximal chains of band-local nodes holding at least one conv, in schedule order."""
    readers = g.consumers()
    outputs = set(g.outputs)
    seen: set[int] = set()
    chains = []
    for n in g.nodes:
        if id(n) in seen or not band_local(n, vals):
            continue
        nodes = [n]
        while nodes[-1].op != "depth_to_space":  # an upsampling ends a chain
            y = nodes[-1].outputs[0]
            rs = readers.get(y, [])
            if y in outputs or len(rs) != 1 or id(rs[0]) in seen or not band_local(rs[0], vals) \
                    or rs[0].inputs[0] != y or rs[0].inputs.count(y) != 1:
                break
            nodes.append(rs[0])
        seen.update(map(id, nodes))
        if any(m.op == "conv" for m in nodes):
            last = nodes[-1]
            unit = OPS[last.op].attrs_of(last)["blocksize"] if last.op == "depth_to_space" else 1
            chains.append(Chain(nodes, n.inputs[0], last.outputs[0], unit))
    return chains


def _conv_geometry(n: Node, vals: dict):
    a = OPS["conv"].attrs_of(n)
    kh = vals[n.inputs[1]].shape[2]
    s = (a["strides"] or [1, 1])[0]
    d = (a["dilations"] or [1, 1])[0]
    pads = [0, 0, 0, 0] if a["auto_pad"] == "VALID" else list(a["pads"] or [0, 0, 0, 0])
    return kh, s, d, pads


def rows_needed(n: Node, vals: dict, o0: int, o1: int, clip: bool = True):
    """Input rows [i0, i1) and the (top, bottom) zero pads n needs for result rows [o0, o1)."""
    if n.op == "conv":
        kh, s, d, pads = _conv_geometry(n, vals)
        start, end = o0 * s - pads[0], (o1 - 1) * s - pads[0] + d * (kh - 1) + 1
        if not clip:
            return start, end, 0, 0
        h = vals[n.inputs[0]].shape[ROWS]
        i0, i1 = max(0, start), min(h, end)
        return i0, i1, i0 - start, end - i1
    if n.op == "depth_to_space":
        b = OPS[n.op].attrs_of(n)["blocksize"]
        return o0 // b, o1 // b, 0, 0
    return o0, o1, 0, 0


def band_plan(chain: Chain, vals: dict, r0: int, r1: int, clip: bool = True) -> list[tuple]:
    """Per node (in chain order): (input rows [i0, i1), pads (top, bottom), result rows
    [o0, o1)) for result rows [r0, r1) of the chain."""
    out = []
    o0, o1 = r0, r1
    for n in reversed(chain.nodes):
        i0, i1, pt, pb = rows_needed(n, vals, o0, o1, clip)
        out.append(((i0, i1), (pt, pb), (o0, o1)))
        o0, o1 = i0, i1
    return out[::-1]


def _row_bytes(v) -> int:
    """Bytes of one row of an (N, C, H, W) value."""
    n, c, _, w = v.shape
    return n * c * w * to_numpy(v.dtype).itemsize


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def working_set(chain: Chain, vals: dict, rows: int) -> int:
    """Fast-tier bytes one interior band of `rows` result rows needs at its busiest step: the
    next band's input (staged ahead) plus the step's operand and result (one buffer when the
    result is computed in place over it)."""
    geo = band_plan(chain, vals, 0, rows, clip=False)
    x_bytes = _aligned(_row_bytes(vals[chain.x]) * (geo[0][0][1] - geo[0][0][0]))
    worst = 0
    prev = x_bytes
    for n, ((i0, i1), _, (o0, o1)) in zip(chain.nodes, geo):
        out = _aligned(_row_bytes(vals[n.outputs[0]]) * (o1 - o0))
        inplace = "elementwise" in OPS[n.op].groups and out == prev
        worst = max(worst, max(prev, out) if inplace else prev + out)
        prev = out
    return worst + x_bytes


def _halo(chain: Chain, vals: dict, rows: int) -> int:
    """Extra input rows an interior band reads beyond its share (both sides together)."""
    (i0, i1), _, _ = band_plan(chain, vals, rows, 2 * rows, clip=False)[0]
    return (i1 - i0) - rows * vals[chain.x].shape[ROWS] // vals[chain.y].shape[ROWS]


def _chain_bytes(chain: Chain, vals: dict) -> int:
    """Working set of the chain unsplit: the busiest step's operand plus result."""
    worst = 0
    for n in chain.nodes:
        a, b = vals[n.inputs[0]].nbytes, vals[n.outputs[0]].nbytes
        inplace = "elementwise" in OPS[n.op].groups and a == b
        worst = max(worst, max(a, b) if inplace else a + b)
    return worst


def chain_budget_need(chain: Chain, vals: dict) -> int:
    """Bytes the smallest band of the chain needs."""
    return working_set(chain, vals, chain.unit)


def band_rows(chain: Chain, vals: dict, budget: int) -> int:
    """The tallest band (a multiple of the chain's unit) whose working set fits `budget`,
    evened out so that the bands come out about equal."""
    height = vals[chain.y].shape[ROWS]
    unit = chain.unit
    need = working_set(chain, vals, unit)
    if need > budget:
        raise WorkspaceError(
            f"chain {chain.label()}: a fast tier of {budget / MB:.2f} MB is too small for one band of "
            f"{unit} result row(s) ({need / MB:.2f} MB with its halo and the next band's input)", need)
    lo, hi = 1, height // unit  # in units; working_set grows with rows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if working_set(chain, vals, mid * unit) <= budget:
            lo = mid
        else:
            hi = mid - 1
    bands = math.ceil(height / (lo * unit))
    return math.ceil(height / bands / unit) * unit


class _Names:
    def __init__(self, g: Graph):
        self.used = set(g.values) | {n.name for n in g.nodes}

    def __call__(self, base: str) -> str:
        nm, k = base, 1
        while nm in self.used:
            k += 1
            nm = f"{base}~{k}"
        self.used.add(nm)
        return nm


def _split_chain(g: Graph, vals: dict, chain: Chain, rows: int, names: _Names) -> tuple[list[Node], dict, dict]:
    """The nodes (and new values) that compute `chain` band by band."""
    height = vals[chain.y].shape[ROWS]
    edges = list(range(0, height, rows)) + [height]
    new_vals: dict[str, Value] = {}
    axes = names(f"{chain.x}.rows_axis")
    new_vals[axes] = Value(axes, (1,), "i64", data=np.array([ROWS], np.int64))
    slices, bodies, results = [], [], []
    for k, (r0, r1) in enumerate(zip(edges, edges[1:])):
        geo = band_plan(chain, vals, r0, r1)
        (a, b), _, _ = geo[0]
        st, en, xs = names(f"{chain.x}.b{k}.start"), names(f"{chain.x}.b{k}.end"), names(f"{chain.x}.b{k}")
        new_vals[st] = Value(st, (1,), "i64", data=np.array([a], np.int64))
        new_vals[en] = Value(en, (1,), "i64", data=np.array([b], np.int64))
        xv = vals[chain.x]
        new_vals[xs] = replace(xv, name=xs, shape=(*xv.shape[:2], b - a, xv.shape[3]), data=None)
        slices.append(Node("slice", [chain.x, st, en, axes], [xs], name=names(f"{chain.label()}.slice.b{k}"),
                           hints={"pipeline": 2}))
        body, cur = [], xs
        for n, ((i0, i1), (pt, pb), (o0, o1)) in zip(chain.nodes, geo):
            y = n.outputs[0]
            yv = vals[y]
            out = names(f"{y}.b{k}")
            shape = (*yv.shape[:2], o1 - o0, yv.shape[3])
            new_vals[out] = replace(yv, name=out, shape=shape, data=None)
            attrs = dict(n.attrs)
            if n.op == "conv":
                _, _, _, pads = _conv_geometry(n, vals)
                attrs.update(pads=[pt, pads[1], pb, pads[3]], auto_pad="NOTSET")
            body.append(Node(n.op, [cur] + list(n.inputs[1:]), [out], attrs, {**n.hints, "tile": list(shape)},
                             names(f"{n.name or n.op}.b{k}"), n.precision))
            cur = out
        bodies.append(body)
        results.append(cur)
    # Ping-pong: band k+1's input is sliced (staged) before band k computes.
    nodes = slices[:1]
    for k, body in enumerate(bodies):
        nodes += slices[k + 1:k + 2] + body
    nodes.append(Node("concat", results, [chain.y], {"axis": ROWS}, name=names(f"{chain.label()}.concat")))
    info = {"chain": chain.label(), "bands": len(bodies), "rows": rows, "height": height,
            "halo_rows": _halo(chain, vals, rows),
            "band_bytes": working_set(chain, vals, rows), "whole_bytes": _chain_bytes(chain, vals),
            # what must sit in the fast tier for the cascade to work (band results may go to DRAM)
            "band_values": [m.outputs[0] for body in bodies for m in body[:-1]] + [m.outputs[0] for m in slices]}
    return nodes, new_vals, info


def split_bands_info(g: Graph, *, budget_bytes: int, shapes: dict | None = None,
                     rows: int | None = None) -> tuple[Graph, list[dict]]:
    """The split graph and what was split (one dict per chain); `g` itself when nothing
    needs splitting. `rows` forces the band height (in result rows) of every chain."""
    vals = concrete_values(g, shapes or {})
    chains = [c for c in find_chains(g, vals)
              if (rows is not None and rows < vals[c.y].shape[ROWS]) or _chain_bytes(c, vals) > budget_bytes]
    if not chains:
        return g, []
    names = _Names(g)
    by_first = {}
    drop: set[int] = set()
    infos = []
    for c in chains:
        r = band_rows(c, vals, budget_bytes) if rows is None else max(c.unit, -(-rows // c.unit) * c.unit)
        nodes, new_vals, info = _split_chain(g, vals, c, r, names)
        by_first[id(c.nodes[0])] = (nodes, new_vals, c)
        drop.update(map(id, c.nodes))
        infos.append(info)
    out = Graph(g.name, {}, [], list(g.inputs), list(g.outputs), g.source)
    inner = {o for c in chains for m in c.nodes[:-1] for o in m.outputs}
    out.values = {nm: v for nm, v in vals.items() if nm not in inner}
    for n in g.nodes:
        if id(n) in by_first:
            nodes, new_vals, _ = by_first[id(n)]
            out.nodes += nodes
            out.values.update(new_vals)
        elif id(n) not in drop:
            out.nodes.append(n)
    return out, infos


def split_bands(g: Graph, *, budget_bytes: int, shapes: dict | None = None, rows: int | None = None) -> Graph:
    """The pass: `Graph -> Graph` (bind the options with functools.partial)."""
    return split_bands_info(g, budget_bytes=budget_bytes, shapes=shapes, rows=rows)[0]
