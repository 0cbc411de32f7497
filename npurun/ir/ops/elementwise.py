"""Elementwise ops: unary math and activations, binary arithmetic, comparisons, where, clip, cast.
They take operands of unknown rank: the result's rank is then unknown too."""
from __future__ import annotations

from ..dtypes import DTYPES
from ..shapes import broadcast
from . import REQUIRED, _fail, _same, op


UNARY = ["relu", "tanh", "sigmoid", "exp", "log", "sqrt", "neg", "abs", "erf", "reciprocal",
         "floor", "ceil", "round", "sin", "cos", "sign", "softplus", "softsign", "identity",
         "hard_swish", "not"]
for _n in UNARY:
    op(_n, ["x"], groups={"elementwise", "unary"}, any_rank=True)(_same)
for _n, _attrs in {"leaky_relu": {"alpha": 0.01}, "elu": {"alpha": 1.0},
                   "selu": {"alpha": 1.6732632423543772, "gamma": 1.0507009873554805},
                   "hard_sigmoid": {"alpha": 0.2, "beta": 0.5}, "gelu": {"approximate": "none"},
                   "celu": {"alpha": 1.0}}.items():
    op(_n, ["x"], attrs=_attrs, groups={"elementwise", "unary"}, any_rank=True)(_same)

ACTIVATIONS = frozenset({"relu", "tanh", "sigmoid", "leaky_relu", "elu", "selu", "hard_sigmoid",
                         "hard_swish", "gelu", "softplus", "clip", "celu"})

# Activations a conv can apply to its result in its own epilogue (passes/fuse_activation.py):
# name -> the meaning of each number of the conv's `activation_params`, in order (the op's
# float attributes; clip's bounds, which are operands of clip). `swish` with alpha 1 is SiLU.
FUSABLE_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "relu": (), "tanh": (), "sigmoid": (), "hard_swish": (), "softplus": (),
    "leaky_relu": ("alpha",), "elu": ("alpha",), "celu": ("alpha",), "swish": ("alpha",),
    "selu": ("alpha", "gamma"), "hard_sigmoid": ("alpha", "beta"), "clip": ("min", "max"),
}


def check_activation(node, a) -> None:
    """A fused `activation` must be one FUSABLE_ACTIVATIONS names, with one number per param."""
    act, params = a.get("activation", ""), a.get("activation_params") or []
    if not act:
        if params:
            _fail(node, f"activation_params {list(params)} given without an activation")
        return
    if act not in FUSABLE_ACTIVATIONS:
        _fail(node, f"fused activation {act!r}; expected one of {', '.join(sorted(FUSABLE_ACTIVATIONS))}")
    want = FUSABLE_ACTIVATIONS[act]
    if len(params) != len(want):
        _fail(node, f"fused activation {act} takes {len(want)} activation_params "
                    f"({', '.join(want) or 'none'}), got {list(params)}")


@op("clip", ["x", "min?", "max?"], groups={"elementwise"}, any_rank=True)
def _clip(node, a, ins):
    return _same(node, a, ins)


@op("cast", ["x"], attrs={"to": REQUIRED, "saturate": 1, "round_mode": "up"}, groups={"elementwise", "unary"},
    any_rank=True)
def _cast(node, a, ins):
    # saturate: out-of-range floats clamp to the 8-bit float's largest finite value (else NaN/inf);
    # round_mode (up, down, nearest) applies to casts to f8e8m0 only.
    if a["to"] not in DTYPES:
        _fail(node, f"cast to unknown dtype {a['to']!r}")
    if a["round_mode"] not in ("up", "down", "nearest"):
        _fail(node, f"round_mode {a['round_mode']!r}; expected up, down or nearest")
    return [(ins[0].shape, a["to"])]


def _bcast(node, ins):
    if any(v.shape is None for v in ins):
        return None  # an operand of unknown rank: the result's rank is unknown too
    shape = ins[0].shape
    for v in ins[1:]:
        shape = broadcast(shape, v.shape)
        if shape is None:
            _fail(node, f"operand shapes {[list(i.shape) for i in ins]} do not broadcast")
    return shape


ARITH = ["add", "sub", "mul", "div", "pow", "max", "min", "mod", "prelu", "bitwise_and"]
COMPARE = ["equal", "less", "greater", "less_or_equal", "greater_or_equal", "and", "or", "xor"]
for _n in ARITH:
    op(_n, ["a", "b"], attrs={"fmod": 0} if _n == "mod" else {}, groups={"elementwise", "binary"}, any_rank=True)(
        lambda node, a, ins: [(_bcast(node, ins), ins[0].dtype)])
for _n in COMPARE:
    op(_n, ["a", "b"], groups={"elementwise", "binary"}, any_rank=True)(
        lambda node, a, ins: [(_bcast(node, ins), "bool")])


@op("where", ["cond", "x", "y"], groups={"elementwise"}, any_rank=True)
def _where(node, a, ins):
    return [(_bcast(node, ins), ins[1].dtype)]


