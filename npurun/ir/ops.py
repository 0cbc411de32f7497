"""The op vocabulary: every op is declared here once.

A declaration gives the op's operands (roles; `?` marks an optional one, `*` a variadic tail),
its attributes with their defaults, group tags that passes ask about
(`"elementwise" in OPS[n.op].groups`), shape/dtype inference and cost (multiply-accumulates;
bytes moved are derived from the operand types).

Op names are lowercase snake case (`matmul`, `depth_to_space`); an op name in text may carry a
precision suffix (`matmul_f16`), kept on the node as `precision`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ..errors import VerifyError
from .dtypes import FLOAT_TYPES
from .shapes import UNKNOWN, affine, broadcast, dim_add, dim_mul, numel

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
    infer: Callable | None = None  # (node, attrs, [Value|None]) -> [(shape, dtype)]
    macs: Callable | None = None  # (attrs, in_shapes, out_shapes) -> int

    @property
    def min_inputs(self) -> int:
        return sum(1 for r in self.inputs if not r.endswith(("?", "*")))

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    def attrs_of(self, node) -> dict:
        return {**self.attrs, **node.attrs}


OPS: dict[str, OpDef] = {}


def op(name, inputs, outputs=("y",), attrs=None, groups=(), macs=None):
    def register(infer):
        OPS[name] = OpDef(name, tuple(inputs), tuple(outputs), dict(attrs or {}),
                          frozenset(groups), infer, macs)
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


def _axis(a, rank, node):
    if not -rank <= a < max(rank, 1):
        _fail(node, f"axis {a} out of range for rank {rank}")
    return a % rank if rank else 0


# ---------------------------------------------------------------- elementwise

def _same(node, a, ins):
    return [(ins[0].shape, ins[0].dtype)]


UNARY = ["relu", "tanh", "sigmoid", "exp", "log", "sqrt", "neg", "abs", "erf", "reciprocal",
         "floor", "ceil", "round", "sin", "cos", "sign", "softplus", "softsign", "identity",
         "hard_swish", "not"]
for _n in UNARY:
    op(_n, ["x"], groups={"elementwise", "unary"})(_same)
for _n, _attrs in {"leaky_relu": {"alpha": 0.01}, "elu": {"alpha": 1.0},
                   "selu": {"alpha": 1.6732632423543772, "gamma": 1.0507009873554805},
                   "hard_sigmoid": {"alpha": 0.2, "beta": 0.5}, "gelu": {"approximate": "none"},
                   "celu": {"alpha": 1.0}}.items():
    op(_n, ["x"], attrs=_attrs, groups={"elementwise", "unary"})(_same)

ACTIVATIONS = frozenset({"relu", "tanh", "sigmoid", "leaky_relu", "elu", "selu", "hard_sigmoid",
                         "hard_swish", "gelu", "softplus", "clip", "celu"})


@op("clip", ["x", "min?", "max?"], groups={"elementwise"})
def _clip(node, a, ins):
    return _same(node, a, ins)


@op("cast", ["x"], attrs={"to": REQUIRED, "saturate": 1}, groups={"elementwise", "unary"})
def _cast(node, a, ins):
    return [(ins[0].shape, a["to"])]


def _bcast(node, ins):
    shape = ins[0].shape
    for v in ins[1:]:
        shape = broadcast(shape, v.shape)
        if shape is None:
            _fail(node, f"operand shapes {[list(i.shape) for i in ins]} do not broadcast")
    return shape


ARITH = ["add", "sub", "mul", "div", "pow", "max", "min", "mod", "prelu", "bitwise_and"]
COMPARE = ["equal", "less", "greater", "less_or_equal", "greater_or_equal", "and", "or", "xor"]
for _n in ARITH:
    op(_n, ["a", "b"], attrs={"fmod": 0} if _n == "mod" else {}, groups={"elementwise", "binary"})(
        lambda node, a, ins: [(_bcast(node, ins), ins[0].dtype)])
for _n in COMPARE:
    op(_n, ["a", "b"], groups={"elementwise", "binary"})(
        lambda node, a, ins: [(_bcast(node, ins), "bool")])


@op("where", ["cond", "x", "y"], groups={"elementwise"})
def _where(node, a, ins):
    return [(_bcast(node, ins), ins[1].dtype)]


# ---------------------------------------------------------------- linear algebra

def _conv_out(size, k, stride, dil, pad_total):
    return affine(size, add=pad_total - dil * (k - 1) - 1 + stride, div=stride) if stride != 1 \
        else affine(size, add=pad_total - dil * (k - 1))


def _spatial(node, a, x_shape, kernel):
    """Output spatial dims of a conv/pool window over `x_shape[2:]`."""
    nd = len(kernel)
    strides = a.get("strides") or [1] * nd
    dils = a.get("dilations") or [1] * nd
    pads = a.get("pads") or [0] * (2 * nd)
    out = []
    for i in range(nd):
        size = x_shape[2 + i]
        auto = a.get("auto_pad", "NOTSET")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out.append(affine(size, add=strides[i] - 1, div=strides[i]) if isinstance(size, int)
                       or strides[i] == 1 else UNKNOWN)
        elif auto == "VALID":
            out.append(_conv_out(size, kernel[i], strides[i], dils[i], 0))
        elif a.get("ceil_mode") and isinstance(size, int):
            eff = dils[i] * (kernel[i] - 1) + 1
            out.append(math.ceil((size + pads[i] + pads[i + nd] - eff) / strides[i]) + 1)
        else:
            out.append(_conv_out(size, kernel[i], strides[i], dils[i], pads[i] + pads[i + nd]))
    return out


def _conv_macs(a, ins, outs):
    w = ins[1]
    return numel(outs[0]) * math.prod(w[1:])


_CONV_ATTRS = {"strides": None, "pads": None, "dilations": None, "group": 1,
               "kernel_shape": None, "auto_pad": "NOTSET"}


@op("conv", ["x", "w", "b?"], attrs=_CONV_ATTRS, groups={"conv", "mac"}, macs=_conv_macs)
def _conv(node, a, ins):
    x, w = ins[0], ins[1]
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        _fail(node, f"input rank {len(x.shape)} and weight rank {len(w.shape)} must match and be >= 3")
    cin, g = x.shape[1], a["group"]
    if isinstance(cin, int) and isinstance(w.shape[1], int) and cin != w.shape[1] * g:
        _fail(node, f"input has {cin} channels, weight expects {w.shape[1]} x group {g}")
    spatial = _spatial(node, a, x.shape, a["kernel_shape"] or list(w.shape[2:]))
    return [((x.shape[0], w.shape[0], *spatial), x.dtype)]


def _matmul_shape(node, sa, sb):
    if len(sa) == 0 or len(sb) == 0:
        _fail(node, "matmul operands must have rank >= 1")
    a2 = sa if len(sa) > 1 else (1, sa[0])
    b2 = sb if len(sb) > 1 else (sb[0], 1)
    k1, k2 = a2[-1], b2[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        _fail(node, f"inner dimensions differ: {list(sa)} @ {list(sb)}")
    batch = broadcast(tuple(a2[:-2]), tuple(b2[:-2]))
    if batch is None:
        _fail(node, f"batch dimensions do not broadcast: {list(sa)} @ {list(sb)}")
    out = list(batch) + [a2[-2], b2[-1]]
    if len(sa) == 1:
        out.pop(-2)
    if len(sb) == 1:
        out.pop(-1)
    return tuple(out)


def _matmul_macs(a, ins, outs):
    return numel(outs[0]) * (ins[0][-1])


@op("matmul", ["a", "b"], groups={"matmul", "mac"}, macs=_matmul_macs)
def _matmul(node, a, ins):
    return [(_matmul_shape(node, ins[0].shape, ins[1].shape), ins[0].dtype)]


@op("gemm", ["a", "b", "c?"], attrs={"alpha": 1.0, "beta": 1.0, "trans_a": 0, "trans_b": 0},
    groups={"matmul", "mac"},
    macs=lambda a, ins, outs: numel(outs[0]) * ins[0][0 if a["trans_a"] else 1])
def _gemm(node, a, ins):
    sa, sb = ins[0].shape, ins[1].shape
    if len(sa) != 2 or len(sb) != 2:
        _fail(node, f"gemm operands must be 2-D, got {list(sa)} and {list(sb)}")
    m = sa[1] if a["trans_a"] else sa[0]
    n = sb[0] if a["trans_b"] else sb[1]
    return [((m, n), ins[0].dtype)]


@op("batch_normalization", ["x", "scale", "bias", "mean", "var"], attrs={"epsilon": 1e-5},
    groups={"norm"})
def _bn(node, a, ins):
    return _same(node, a, ins)


@op("layer_normalization", ["x", "scale", "bias?"], attrs={"axis": -1, "epsilon": 1e-5},
    groups={"norm"})
def _ln(node, a, ins):
    return _same(node, a, ins)


for _n in ("softmax", "log_softmax"):
    op(_n, ["x"], attrs={"axis": -1}, groups={"normalizing"})(_same)


_POOL_ATTRS = {"kernel_shape": REQUIRED, "strides": None, "pads": None, "dilations": None,
               "ceil_mode": 0, "auto_pad": "NOTSET"}


@op("max_pool", ["x"], attrs=_POOL_ATTRS, groups={"pool"})
def _maxpool(node, a, ins):
    x = ins[0]
    return [((x.shape[0], x.shape[1], *_spatial(node, a, x.shape, a["kernel_shape"])), x.dtype)]


@op("average_pool", ["x"], attrs={**_POOL_ATTRS, "count_include_pad": 0}, groups={"pool"})
def _avgpool(node, a, ins):
    return _maxpool(node, a, ins)


for _n in ("global_average_pool", "global_max_pool"):
    op(_n, ["x"], groups={"pool"})(
        lambda node, a, ins: [((*ins[0].shape[:2], *[1] * (len(ins[0].shape) - 2)), ins[0].dtype)])


for _n in ("reduce_mean", "reduce_sum", "reduce_max", "reduce_min"):
    @op(_n, ["x", "axes?"], attrs={"keepdims": 1, "noop_with_empty_axes": 0}, groups={"reduce"})
    def _reduce(node, a, ins):
        x = ins[0]
        axes = _const_ints(ins[1] if len(ins) > 1 else None, node, "axes")
        if len(ins) > 1 and ins[1] is not None and axes is None:
            n = len(x.shape) if a["keepdims"] else UNKNOWN
            return [((UNKNOWN,) * n if isinstance(n, int) else (), x.dtype)]
        if not axes:
            axes = [] if a["noop_with_empty_axes"] else list(range(len(x.shape)))
        axes = {_axis(i, len(x.shape), node) for i in axes}
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if a["keepdims"] else \
            [d for i, d in enumerate(x.shape) if i not in axes]
        return [(tuple(shape), x.dtype)]


# ---------------------------------------------------------------- data movement

@op("reshape", ["x", "shape"], attrs={"allowzero": 0}, groups={"view"})
def _reshape(node, a, ins):
    x, target = ins[0], _const_ints(ins[1], node, "shape")
    if target is None:
        n = ins[1].shape[0] if ins[1].shape and isinstance(ins[1].shape[0], int) else 0
        return [((UNKNOWN,) * n, x.dtype)]
    out = [x.shape[i] if t == 0 and not a["allowzero"] else t for i, t in enumerate(target)]
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


@op("transpose", ["x"], attrs={"perm": None}, groups={"view"})
def _transpose(node, a, ins):
    x = ins[0]
    perm = a["perm"] or list(reversed(range(len(x.shape))))
    if sorted(perm) != list(range(len(x.shape))):
        _fail(node, f"perm {perm} is not a permutation of rank {len(x.shape)}")
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


@op("concat", ["x*"], attrs={"axis": REQUIRED}, groups={"view"})
def _concat(node, a, ins):
    rank = len(ins[0].shape)
    ax = _axis(a["axis"], rank, node)
    size = 0
    for v in ins:
        if len(v.shape) != rank:
            _fail(node, f"operand {v.name!r} has rank {len(v.shape)}, expected {rank}")
        size = dim_add(size, v.shape[ax])
    shape = list(ins[0].shape)
    shape[ax] = size
    return [(tuple(shape), ins[0].dtype)]


@op("split", ["x", "split?"], outputs=("y*",), attrs={"axis": 0, "num_outputs": None}, groups={"view"})
def _split(node, a, ins):
    x = ins[0]
    ax = _axis(a["axis"], len(x.shape), node)
    n = len(node.outputs)
    sizes = _const_ints(ins[1] if len(ins) > 1 else None, node, "split")
    if sizes is None:
        d = x.shape[ax]
        sizes = [-(-d // n)] * (n - 1) + [d - -(-d // n) * (n - 1)] if isinstance(d, int) else [UNKNOWN] * n
    return [(tuple(s if i == ax else d for i, d in enumerate(x.shape)), x.dtype) for s in sizes]


@op("flatten", ["x"], attrs={"axis": 1}, groups={"view"})
def _flatten(node, a, ins):
    s = ins[0].shape
    ax = a["axis"] % (len(s) + 1) if s else 0
    left = 1
    for d in s[:ax]:
        left = dim_mul(left, d)
    right = 1
    for d in s[ax:]:
        right = dim_mul(right, d)
    return [((left, right), ins[0].dtype)]


@op("squeeze", ["x", "axes?"], groups={"view"})
def _squeeze(node, a, ins):
    s = ins[0].shape
    axes = _const_ints(ins[1] if len(ins) > 1 else None, node, "axes")
    if axes is None:
        axes = [i for i, d in enumerate(s) if d == 1]
    axes = {_axis(i, len(s), node) for i in axes}
    for i in axes:
        if isinstance(s[i], int) and s[i] != 1:
            _fail(node, f"cannot squeeze axis {i} of size {s[i]}")
    return [(tuple(d for i, d in enumerate(s) if i not in axes), ins[0].dtype)]


@op("unsqueeze", ["x", "axes"], groups={"view"})
def _unsqueeze(node, a, ins):
    s = list(ins[0].shape)
    axes = _const_ints(ins[1], node, "axes")
    if axes is None:
        _fail(node, "unsqueeze axes must be a constant")
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


@op("shape", ["x"], attrs={"start": 0, "end": None}, groups={"view"})
def _shape(node, a, ins):
    r = len(ins[0].shape)
    return [((len(range(r)[a["start"]:a["end"]]),), "i64")]


@op("expand", ["x", "shape"], groups={"view"})
def _expand(node, a, ins):
    target = _const_ints(ins[1], node, "shape")
    if target is None:
        return [((UNKNOWN,) * (ins[1].shape[0] if isinstance(ins[1].shape[0], int) else 0), ins[0].dtype)]
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


@op("space_to_depth", ["x"], attrs={"blocksize": REQUIRED}, groups={"view"})
def _s2d(node, a, ins):
    n, c, h, w = ins[0].shape
    b = a["blocksize"]
    return [((n, dim_mul(c, b * b), affine(h, div=b), affine(w, div=b)), ins[0].dtype)]


_RESIZE_ATTRS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                 "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75,
                 "exclude_outside": 0, "extrapolation_value": 0.0}


@op("resize", ["x", "roi?", "scales?", "sizes?"], attrs=_RESIZE_ATTRS, groups={"resample"})
def _resize(node, a, ins):
    x = ins[0]
    sizes = _const_ints(ins[3] if len(ins) > 3 else None, node, "sizes")
    if sizes:
        return [(tuple(sizes), x.dtype)]
    scales = ins[2] if len(ins) > 2 else None
    if scales is not None and scales.data is not None and scales.data.size:
        out = []
        for d, s in zip(x.shape, scales.data.reshape(-1).tolist()):
            out.append(int(math.floor(d * s)) if isinstance(d, int) else
                       (affine(d, mul=int(s)) if float(s).is_integer() else UNKNOWN))
        return [(tuple(out), x.dtype)]
    return [((UNKNOWN,) * len(x.shape), x.dtype)]


@op("constant_of_shape", ["shape"], attrs={"value": 0.0, "dtype": "f32"})
def _cos(node, a, ins):
    target = _const_ints(ins[0], node, "shape")
    if target is None:
        return [((UNKNOWN,) * (ins[0].shape[0] if isinstance(ins[0].shape[0], int) else 0), a["dtype"])]
    return [(tuple(target), a["dtype"])]


FLOAT_ONLY = frozenset({"conv", "matmul", "gemm", "softmax", "log_softmax", "tanh", "sigmoid",
                        "erf", "batch_normalization", "layer_normalization"})


def infer_node(node, values: dict) -> list[tuple]:
    """Shape/dtype inference for one node, given the graph's values by name."""
    d = OPS.get(node.op)
    if d is None:
        raise VerifyError(f"{node.label()}: unknown op {node.op!r}")
    ins = [values[i] if i else None for i in node.inputs]
    if node.op in FLOAT_ONLY and ins[0] is not None and ins[0].dtype not in FLOAT_TYPES:
        _fail(node, f"operand {node.inputs[0]!r} has dtype {ins[0].dtype}; {node.op} expects a float type")
    return d.infer(node, d.attrs_of(node), ins)


def macs(node, in_shapes, out_shapes) -> int:
    """Multiply-accumulates of one node for concrete shapes (0 for ops without MACs)."""
    d = OPS[node.op]
    if d.macs is None or any(numel(s) is None for s in list(in_shapes) + list(out_shapes) if s is not None):
        return 0
    return int(d.macs(d.attrs_of(node), in_shapes, out_shapes))
