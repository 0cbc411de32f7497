"""Data movement: reshapes, transposes, slicing, gathering, padding, resampling, constants."""
from __future__ import annotations

import math

from ..shapes import UNKNOWN, affine, broadcast, dim_add, dim_mul, numel
from . import REQUIRED, _axis, _const_ints, _fail, op


def _length(v):
    """The static length of a 1-D operand (a shape, axes), or None (the rank that follows from
    it is then unknown)."""
    return v.shape[0] if v.shape and len(v.shape) == 1 and isinstance(v.shape[0], int) else None


MAX_RANK = 64  # NumPy's limit, so every backend's: a larger rank cannot run anywhere


def _ranked(n, node):
    """A shape of n unknown dims (None: rank unknown too)."""
    if n is not None and n > MAX_RANK:
        _fail(node, f"its result would have rank {n}; at most {MAX_RANK} dims are supported")
    return None if n is None else (UNKNOWN,) * n


@op("reshape", ["x", "shape"], attrs={"allowzero": 0}, groups={"view"}, any_rank=True)
def _reshape(node, a, ins):
    x, target = ins[0], _const_ints(ins[1], node, "shape")
    if target is None:
        return [(_ranked(_length(ins[1]), node), x.dtype)]
    if x.shape is not None and not a["allowzero"] and any(t == 0 and i >= len(x.shape) for i, t in enumerate(target)):
        _fail(node, f"shape {target} copies (0) a dim beyond x's rank {len(x.shape)}")
    out = [(x.shape[i] if x.shape is not None else UNKNOWN) if t == 0 and not a["allowzero"] else t
           for i, t in enumerate(target)]
    if out.count(-1) > 1:
        _fail(node, f"shape {target} has more than one -1")
    if -1 in out:
        known = numel([d for d in out if d != -1])
        total = numel(x.shape)
        if total is not None and known:
            if total % known:
                _fail(node, f"cannot reshape {list(x.shape)} to {target}")
            out[out.index(-1)] = total // known
        else:
            out[out.index(-1)] = UNKNOWN
    total, new = numel(x.shape), numel(out)
    if total is not None and new is not None and total != new:
        _fail(node, f"cannot reshape {list(x.shape)} ({total} elements) to {out} ({new})")
    return [(tuple(out), x.dtype)]


@op("transpose", ["x"], attrs={"perm": None}, groups={"view"}, any_rank=True)
def _transpose(node, a, ins):
    x = ins[0]
    if x.shape is None:  # the perm gives the rank
        if a["perm"] and sorted(a["perm"]) != list(range(len(a["perm"]))):
            _fail(node, f"perm {a['perm']} is not a permutation")
        return [(_ranked(len(a["perm"]), node) if a["perm"] else None, x.dtype)]
    perm = a["perm"] or list(reversed(range(len(x.shape))))
    if sorted(perm) != list(range(len(x.shape))):
        _fail(node, f"perm {perm} is not a permutation of rank {len(x.shape)}")
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


@op("concat", ["x*"], attrs={"axis": REQUIRED}, groups={"view"}, any_rank=True)
def _concat(node, a, ins):
    ranked = [v for v in ins if v.shape is not None]
    if not ranked:
        return [(None, ins[0].dtype)]
    rank = len(ranked[0].shape)
    ax = _axis(a["axis"], rank, node)
    size = 0
    for v in ins:
        if v.shape is None:  # of the same rank as the others, its length along axis unknown
            size = UNKNOWN
            continue
        if len(v.shape) != rank:
            _fail(node, f"operand {v.name!r} has rank {len(v.shape)}, expected {rank}")
        size = dim_add(size, v.shape[ax])
    shape = list(ranked[0].shape)
    shape[ax] = size
    return [(tuple(shape), ins[0].dtype)]


@op("split", ["x", "split?"], outputs=("y*",), attrs={"axis": 0, "num_outputs": None}, groups={"view"},
    any_rank=True)
def _split(node, a, ins):
    x = ins[0]
    if x.shape is None:
        return [(None, x.dtype)] * len(node.outputs)
    if not x.shape:
        _fail(node, "cannot split a scalar")
    ax = _axis(a["axis"], len(x.shape), node)
    n = len(node.outputs)
    sizes = _const_ints(ins[1] if len(ins) > 1 else None, node, "split")
    if sizes is not None and len(sizes) != n:
        _fail(node, f"split {sizes} gives {len(sizes)} parts for {n} outputs")
    if sizes is None:
        d = x.shape[ax]
        sizes = [-(-d // n)] * (n - 1) + [d - -(-d // n) * (n - 1)] if isinstance(d, int) else [UNKNOWN] * n
    return [(tuple(s if i == ax else d for i, d in enumerate(x.shape)), x.dtype) for s in sizes]


@op("flatten", ["x"], attrs={"axis": 1}, groups={"view"})
def _flatten(node, a, ins):
    s = ins[0].shape
    ax = a["axis"] + len(s) if a["axis"] < 0 else a["axis"]
    left = 1
    for d in s[:ax]:
        left = dim_mul(left, d)
    right = 1
    for d in s[ax:]:
        right = dim_mul(right, d)
    return [((left, right), ins[0].dtype)]


@op("squeeze", ["x", "axes?"], groups={"view"}, any_rank=True)
def _squeeze(node, a, ins):
    s = ins[0].shape
    given = len(ins) > 1 and ins[1] is not None
    axes = _const_ints(ins[1] if given else None, node, "axes")
    if s is None:
        return [(None, ins[0].dtype)]
    if given and axes is None:  # computed axes: the rank is known if their count is
        n = 1 if ins[1].shape == () else _length(ins[1])
        return [(None if n is None else _ranked(len(s) - n, node), ins[0].dtype)]
    if axes is None:
        # Without axes every dim of 1 goes: an unknown dim ('?') may be one, so the rank is
        # unknown then; a named symbol is taken to be > 1 (a batch, a sequence length).
        if UNKNOWN in s:
            return [(None, ins[0].dtype)]
        axes = [i for i, d in enumerate(s) if d == 1]
    axes = {_axis(i, len(s), node) for i in axes}
    for i in axes:
        if isinstance(s[i], int) and s[i] != 1:
            _fail(node, f"cannot squeeze axis {i} of size {s[i]}")
    return [(tuple(d for i, d in enumerate(s) if i not in axes), ins[0].dtype)]


@op("unsqueeze", ["x", "axes"], groups={"view"}, any_rank=True)
def _unsqueeze(node, a, ins):
    if ins[0].shape is None:
        return [(None, ins[0].dtype)]
    s = list(ins[0].shape)
    axes = _const_ints(ins[1], node, "axes")
    if axes is None:  # computed axes: the rank is known (if their count is), the dims are not
        n = 1 if ins[1].shape == () else _length(ins[1])
        return [(None if n is None else _ranked(len(s) + n, node), ins[0].dtype)]
    rank = len(s) + len(axes)
    for ax in sorted(_axis(i, rank, node) for i in axes):
        s.insert(ax, 1)
    return [(tuple(s), ins[0].dtype)]


@op("slice", ["x", "starts", "ends", "axes?", "steps?"], groups={"view"})
def _slice(node, a, ins):
    x = ins[0]
    starts, ends = _const_ints(ins[1], node, "starts"), _const_ints(ins[2], node, "ends")
    axes = _const_ints(ins[3] if len(ins) > 3 else None, node, "axes")
    steps = _const_ints(ins[4] if len(ins) > 4 else None, node, "steps")
    if starts is None or ends is None or (len(ins) > 3 and ins[3] is not None and axes is None):
        return [((UNKNOWN,) * len(x.shape), x.dtype)]
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    out = list(x.shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = _axis(ax, len(out), node)
        d = out[ax]
        out[ax] = len(range(*slice(st, en, sp).indices(d))) if isinstance(d, int) else UNKNOWN
    return [(tuple(out), x.dtype)]


@op("gather", ["x", "indices"], attrs={"axis": 0}, groups={"view"})
def _gather(node, a, ins):
    x, idx = ins
    ax = _axis(a["axis"], len(x.shape), node)
    return [(tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1:]), x.dtype)]


@op("shape", ["x"], attrs={"start": 0, "end": None}, groups={"view"}, any_rank=True)
def _shape(node, a, ins):
    if ins[0].shape is None:
        return [((UNKNOWN,), "i64")]
    r = len(ins[0].shape)
    return [((len(range(r)[a["start"]:a["end"]]),), "i64")]


@op("expand", ["x", "shape"], groups={"view"}, any_rank=True)
def _expand(node, a, ins):
    target = _const_ints(ins[1], node, "shape")
    x = ins[0]
    if target is None or x.shape is None:  # the rank is the larger of x's and the shape's
        n = len(target) if target is not None else _length(ins[1])
        return [(None if n is None or x.shape is None else _ranked(max(n, len(x.shape)), node), x.dtype)]
    return [(broadcast(ins[0].shape, tuple(target)) or _fail(node, "shapes do not broadcast"), ins[0].dtype)]


@op("tile", ["x", "repeats"], groups={"view"})
def _tile(node, a, ins):
    reps = _const_ints(ins[1], node, "repeats")
    if reps is None:
        return [((UNKNOWN,) * len(ins[0].shape), ins[0].dtype)]
    return [(tuple(dim_mul(d, r) for d, r in zip(ins[0].shape, reps)), ins[0].dtype)]


@op("pad", ["x", "pads", "value?", "axes?"], attrs={"mode": "constant"}, groups={"view"})
def _pad(node, a, ins):
    x = ins[0]
    pads = _const_ints(ins[1], node, "pads")
    axes = _const_ints(ins[3] if len(ins) > 3 else None, node, "axes")
    if pads is None:
        return [((UNKNOWN,) * len(x.shape), x.dtype)]
    axes = [_axis(i, len(x.shape), node) for i in axes] if axes else list(range(len(x.shape)))
    if len(pads) != 2 * len(axes):
        _fail(node, f"pads has {len(pads)} entries, expected {2 * len(axes)}")
    out = list(x.shape)
    for j, ax in enumerate(axes):
        out[ax] = dim_add(out[ax], pads[j] + pads[j + len(axes)])
    return [(tuple(out), x.dtype)]


@op("depth_to_space", ["x"], attrs={"blocksize": REQUIRED, "mode": "DCR"}, groups={"view"})
def _d2s(node, a, ins):
    n, c, h, w = ins[0].shape
    b = a["blocksize"]
    if isinstance(c, int) and c % (b * b):
        _fail(node, f"{c} channels are not divisible by blocksize^2 = {b * b}")
    return [((n, affine(c, div=b * b), dim_mul(h, b), dim_mul(w, b)), ins[0].dtype)]


@op("space_to_depth", ["x"], attrs={"blocksize": REQUIRED, "mode": "DCR"}, groups={"view"})
def _s2d(node, a, ins):
    n, c, h, w = ins[0].shape
    b = a["blocksize"]
    return [((n, dim_mul(c, b * b), affine(h, div=b), affine(w, div=b)), ins[0].dtype)]


_RESIZE_ATTRS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                 "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75,
                 "exclude_outside": 0, "extrapolation_value": 0.0, "antialias": 0, "axes": None,
                 "keep_aspect_ratio_policy": "stretch"}


@op("resize", ["x", "roi?", "scales?", "sizes?"], attrs=_RESIZE_ATTRS, groups={"resample"})
def _resize(node, a, ins):
    """scales / sizes cover `axes` (all axes when absent); other axes keep their size."""
    x = ins[0]
    rank = len(x.shape)
    axes = [_axis(i, rank, node) for i in a["axes"]] if a["axes"] else list(range(rank))
    out = list(x.shape)
    sizes = _const_ints(ins[3] if len(ins) > 3 else None, node, "sizes")
    scales = ins[2] if len(ins) > 2 else None
    if sizes:
        if len(sizes) != len(axes):
            _fail(node, f"sizes has {len(sizes)} entries for {len(axes)} axes")
        if a["keep_aspect_ratio_policy"] == "stretch":
            for ax, s in zip(axes, sizes):
                out[ax] = s
        elif all(isinstance(x.shape[ax], int) for ax in axes):
            ratios = [s / x.shape[ax] for ax, s in zip(axes, sizes)]
            one = min(ratios) if a["keep_aspect_ratio_policy"] == "not_larger" else max(ratios)
            for ax in axes:
                out[ax] = int(math.floor(one * x.shape[ax] + 0.5))
        else:
            for ax in axes:
                out[ax] = UNKNOWN
    elif scales is not None and scales.data is not None and scales.data.size:
        for ax, s in zip(axes, scales.data.reshape(-1).tolist()):
            d = x.shape[ax]
            out[ax] = int(math.floor(d * s)) if isinstance(d, int) else \
                (affine(d, mul=int(s)) if float(s).is_integer() else UNKNOWN)
    else:
        for ax in axes:
            out[ax] = UNKNOWN
    return [(tuple(out), x.dtype)]


@op("constant_of_shape", ["shape"], attrs={"value": 0.0, "dtype": "f32"}, any_rank=True)
def _cos(node, a, ins):
    target = _const_ints(ins[0], node, "shape")
    if target is None:
        return [(_ranked(_length(ins[0]), node), a["dtype"])]
    return [(tuple(target), a["dtype"])]


