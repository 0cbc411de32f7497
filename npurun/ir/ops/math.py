"""Math, reductions and indexing: more unary math, bitwise ops, arg/cumulative/log-sum
reductions, top-k and unique, einsum, gather/scatter by element or index tuple, one-hot,
range, triangles, losses."""
from __future__ import annotations

import math
import re

from ..dtypes import INT_TYPES
from ..shapes import UNKNOWN, broadcast, numel
from . import REQUIRED, _axis, _const_ints, _fail, _same, op
from .elementwise import _bcast


# ---------------------------------------------------------------- elementwise

def _ints(node, ins):
    for v in ins:
        if v.dtype not in INT_TYPES:
            _fail(node, f"operand {v.name!r} has dtype {v.dtype}; {node.op} expects an integer type")


for _n in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "mish"):
    op(_n, ["x"], groups={"elementwise", "unary"}, any_rank=True)(_same)
for _n, _attrs in {"swish": {"alpha": 1.0}, "thresholded_relu": {"alpha": 1.0},
                   "shrink": {"bias": 0.0, "lambd": 0.5}}.items():
    op(_n, ["x"], attrs=_attrs, groups={"elementwise", "unary"}, any_rank=True)(_same)


@op("is_nan", ["x"], groups={"elementwise", "unary"}, any_rank=True)
def _is_nan(node, a, ins):
    return [(ins[0].shape, "bool")]


@op("is_inf", ["x"], attrs={"detect_negative": 1, "detect_positive": 1}, groups={"elementwise", "unary"},
    any_rank=True)
def _is_inf(node, a, ins):
    return [(ins[0].shape, "bool")]


@op("bitwise_not", ["x"], groups={"elementwise", "unary"})
def _bitwise_not(node, a, ins):
    _ints(node, ins)
    return _same(node, a, ins)


for _n in ("bitwise_or", "bitwise_xor"):
    @op(_n, ["a", "b"], groups={"elementwise", "binary"})
    def _bitwise(node, a, ins):
        _ints(node, ins)
        return [(_bcast(node, ins), ins[0].dtype)]


@op("bit_shift", ["x", "shift"], attrs={"direction": REQUIRED}, groups={"elementwise", "binary"})
def _bit_shift(node, a, ins):
    _ints(node, ins)
    if a["direction"] not in ("LEFT", "RIGHT"):
        _fail(node, f"direction {a['direction']!r} is neither LEFT nor RIGHT")
    return [(_bcast(node, ins), ins[0].dtype)]


# ---------------------------------------------------------------- reductions

def _reduced(node, shape, axes, keepdims):
    """Shape of `shape` reduced over `axes` (already a list of ints)."""
    axes = {_axis(i, len(shape), node) for i in axes}
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


for _n in ("reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
           "reduce_sum_square", "reduce_l1", "reduce_l2", "reduce_log_sum", "reduce_log_sum_exp"):
    @op(_n, ["x", "axes?"], attrs={"keepdims": 1, "noop_with_empty_axes": 0}, groups={"reduce"}, any_rank=True)
    def _reduce(node, a, ins):
        x = ins[0]
        given = len(ins) > 1 and ins[1] is not None
        axes = _const_ints(ins[1], node, "axes") if given else []
        if x.shape is None:  # all axes without keepdims leave a scalar; else the rank stays unknown
            every = not axes and not given and not a["noop_with_empty_axes"]
            return [((), x.dtype) if every and not a["keepdims"] else (None, x.dtype)]
        if axes is None:  # computed axes: which dims go is unknown, but not how many
            n = (ins[1].shape[0] if ins[1].shape else 1) if ins[1].shape is not None else None
            if not a["keepdims"] and not isinstance(n, int):
                return [(None, x.dtype)]  # how many dims go is unknown too
            return [((UNKNOWN,) * (len(x.shape) - (0 if a["keepdims"] else n)), x.dtype)]
        if not axes and not a["noop_with_empty_axes"]:
            axes = list(range(len(x.shape)))
        return [(_reduced(node, x.shape, axes, a["keepdims"]), x.dtype)]


for _n in ("arg_max", "arg_min"):
    @op(_n, ["x"], attrs={"axis": 0, "keepdims": 1, "select_last_index": 0}, groups={"reduce"})
    def _arg(node, a, ins):
        return [(_reduced(node, ins[0].shape, [a["axis"]], a["keepdims"]), "i64")]


for _n in ("cum_sum", "cum_prod"):
    op(_n, ["x", "axis"], attrs={"exclusive": 0, "reverse": 0})(_same)


@op("hardmax", ["x"], attrs={"axis": -1}, groups={"normalizing"})
def _hardmax(node, a, ins):
    _axis(a["axis"], len(ins[0].shape), node)
    return _same(node, a, ins)


@op("top_k", ["x", "k"], outputs=("values", "indices"),
    attrs={"axis": -1, "largest": 1, "sorted": 1})
def _top_k(node, a, ins):
    x = ins[0]
    ax = _axis(a["axis"], len(x.shape), node)
    k = _const_ints(ins[1], node, "k")
    if k and isinstance(x.shape[ax], int) and not 0 <= k[0] <= x.shape[ax]:
        _fail(node, f"k={k[0]} is outside [0, {x.shape[ax]}] (the size of axis {a['axis']})")
    shape = list(x.shape)
    shape[ax] = k[0] if k else UNKNOWN
    return [(tuple(shape), x.dtype), (tuple(shape), "i64")]


@op("unique", ["x"], outputs=("y", "indices", "inverse_indices", "counts"),
    attrs={"axis": None, "sorted": 1})
def _unique(node, a, ins):
    # How many unique entries there are is known only at run time; inverse_indices has one
    # entry per input element (or per slice along `axis`).
    x = ins[0]
    if a["axis"] is None:  # unique elements of the flattened input
        y, n_in = (UNKNOWN,), numel(x.shape)
    else:
        ax = _axis(a["axis"], len(x.shape), node)
        y, n_in = tuple(UNKNOWN if i == ax else d for i, d in enumerate(x.shape)), x.shape[ax]
    n_in = UNKNOWN if n_in is None else n_in
    return [(y, x.dtype), ((UNKNOWN,), "i64"), ((n_in,), "i64"), ((UNKNOWN,), "i64")]


# ---------------------------------------------------------------- einsum

def _einsum_terms(node, equation, n_inputs):
    """'ij,jk->ik' -> (['ij', 'jk'], 'ik'); an implicit output is the letters used once, sorted,
    after the ellipsis ('...' is kept as '.' in the terms)."""
    eq = equation.replace(" ", "").replace("...", ".")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        _fail(node, f"equation {equation!r} names {len(terms)} operands, the node has {n_inputs}")
    if not all(re.fullmatch(r"[A-Za-z.]*", t) and t.count(".") <= 1 for t in terms + [rhs]):
        _fail(node, f"equation {equation!r} is not a valid einsum equation")
    if not arrow:
        letters = "".join(terms).replace(".", "")
        rhs = ("." if "." in lhs else "") + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, rhs


@op("einsum", ["x*"], attrs={"equation": REQUIRED})
def _einsum(node, a, ins):
    terms, rhs = _einsum_terms(node, a["equation"], len(ins))
    dims, ellipsis = {}, ()
    for term, v in zip(terms, ins):
        n_ell = len(v.shape) - len(term.replace(".", ""))
        if n_ell < 0 or (n_ell and "." not in term):
            _fail(node, f"term {term!r} does not fit operand shape {list(v.shape)}")
        k = 0
        for c in term:
            if c == ".":
                ell = broadcast(ellipsis, tuple(v.shape[k:k + n_ell]))
                if ell is None:
                    _fail(node, "the '...' dimensions of the operands do not broadcast")
                ellipsis, k = ell, k + n_ell
            else:
                d, prev = v.shape[k], dims.get(c)
                if isinstance(prev, int) and isinstance(d, int) and prev != d:
                    _fail(node, f"label {c!r} has sizes {prev} and {d}")
                if not isinstance(prev, int):  # a static size wins over a symbol
                    dims[c] = d
                k += 1
    shape = []
    for c in rhs:
        if c == ".":
            shape.extend(ellipsis)
        elif c not in dims:
            _fail(node, f"output label {c!r} appears in no input")
        else:
            shape.append(dims[c])
    return [(tuple(shape), ins[0].dtype)]


# ---------------------------------------------------------------- gather / scatter

@op("gather_elements", ["x", "indices"], attrs={"axis": 0}, groups={"gather"})
def _gather_elements(node, a, ins):
    x, idx = ins
    if len(x.shape) != len(idx.shape):
        _fail(node, f"data rank {len(x.shape)} and indices rank {len(idx.shape)} differ")
    _axis(a["axis"], len(x.shape), node)
    return [(idx.shape, x.dtype)]


@op("gather_nd", ["x", "indices"], attrs={"batch_dims": 0}, groups={"gather"})
def _gather_nd(node, a, ins):
    x, idx = ins
    b, m = a["batch_dims"], idx.shape[-1] if idx.shape else None
    if not isinstance(m, int):
        _fail(node, "the last dimension of indices must be static (it decides the output rank)")
    if b + m > len(x.shape):
        _fail(node, f"batch_dims {b} + index length {m} exceed data rank {len(x.shape)}")
    return [(tuple(idx.shape[:-1]) + tuple(x.shape[b + m:]), x.dtype)]


@op("scatter_elements", ["x", "indices", "updates"], attrs={"axis": 0, "reduction": "none"},
    groups={"scatter"})
def _scatter_elements(node, a, ins):
    _axis(a["axis"], len(ins[0].shape), node)
    return _scatter_nd(node, a, ins)


@op("scatter_nd", ["x", "indices", "updates"], attrs={"reduction": "none"}, groups={"scatter"})
def _scatter_nd(node, a, ins):
    if a["reduction"] not in ("none", "add", "mul", "max", "min"):
        _fail(node, f"reduction {a['reduction']!r} is not none, add, mul, max or min")
    return _same(node, a, ins)


@op("one_hot", ["indices", "depth", "values"], attrs={"axis": -1})
def _one_hot(node, a, ins):
    idx, depth, values = ins
    rank = len(idx.shape) + 1
    ax = _axis(a["axis"], rank, node)
    shape = list(idx.shape)  # depth may be a float scalar; its value is the new axis' size
    shape.insert(ax, UNKNOWN if depth.data is None else int(depth.data.reshape(-1)[0]))
    return [(tuple(shape), values.dtype)]


@op("compress", ["x", "condition"], attrs={"axis": None}, groups={"gather"})
def _compress(node, a, ins):
    x = ins[0]
    if a["axis"] is None:  # the flattened input
        return [((UNKNOWN,), x.dtype)]
    ax = _axis(a["axis"], len(x.shape), node)
    return [(tuple(UNKNOWN if i == ax else d for i, d in enumerate(x.shape)), x.dtype)]


@op("non_zero", ["x"])
def _non_zero(node, a, ins):
    return [((len(ins[0].shape), UNKNOWN), "i64")]


@op("reverse_sequence", ["x", "sequence_lens"], attrs={"batch_axis": 1, "time_axis": 0})
def _reverse_sequence(node, a, ins):
    return _same(node, a, ins)


# ---------------------------------------------------------------- generators, matrices

@op("range", ["start", "limit", "delta"])
def _range(node, a, ins):
    start, limit, delta = ins
    n = UNKNOWN
    if all(v.data is not None for v in ins):
        s, lim, d = (v.data.reshape(-1)[0].item() for v in ins)
        if d == 0:
            _fail(node, "delta is 0")
        n = max(math.ceil((lim - s) / d), 0)
    return [((n,), start.dtype)]


@op("trilu", ["x", "k?"], attrs={"upper": 1})
def _trilu(node, a, ins):
    if len(ins[0].shape) < 2:
        _fail(node, f"input has rank {len(ins[0].shape)}; trilu needs rank >= 2")
    return _same(node, a, ins)


@op("eye_like", ["x"], attrs={"dtype": None, "k": 0})
def _eye_like(node, a, ins):
    if len(ins[0].shape) != 2:
        _fail(node, f"input has rank {len(ins[0].shape)}; eye_like needs a 2-D input")
    return [(ins[0].shape, a["dtype"] or ins[0].dtype)]


@op("det", ["x"])
def _det(node, a, ins):
    s = ins[0].shape
    if len(s) < 2:
        _fail(node, f"input has rank {len(s)}; det needs (..., M, M)")
    return [(tuple(s[:-2]), ins[0].dtype)]


@op("size", ["x"], any_rank=True)
def _size(node, a, ins):
    return [((), "i64")]


# ---------------------------------------------------------------- losses

def _loss_shape(node, a, target):
    if a["reduction"] not in ("none", "sum", "mean"):
        _fail(node, f"reduction {a['reduction']!r} is not none, sum or mean")
    if target.dtype not in INT_TYPES:
        _fail(node, f"target has dtype {target.dtype}; class indices must be integers")
    return tuple(target.shape) if a["reduction"] == "none" else ()


@op("negative_log_likelihood_loss", ["x", "target", "weight?"],
    attrs={"reduction": "mean", "ignore_index": None}, groups={"loss"})
def _nll(node, a, ins):
    return [(_loss_shape(node, a, ins[1]), ins[0].dtype)]


@op("softmax_cross_entropy_loss", ["scores", "labels", "weights?"], outputs=("loss", "log_prob"),
    attrs={"reduction": "mean", "ignore_index": None}, groups={"loss"})
def _sce(node, a, ins):
    return [(_loss_shape(node, a, ins[1]), ins[0].dtype), (ins[0].shape, ins[0].dtype)]
