"""Random sampling: normal and uniform draws (of a given shape, or of another tensor's shape),
Bernoulli and multinomial sampling, and dropout.

Seed semantics are ONNX's: a node with a `seed` attribute draws the same values on every run
(its kernel seeds a fresh generator from it each run); a node without one draws fresh values
on every run. ONNX leaves the generator to the implementation, so the values never equal
another runtime's; npurun's are NumPy's PCG64 stream, from the reference kernels, which every
backend runs for these ops. Passes must not fold, merge or reorder these ops (they carry the
group `random`): two unseeded draws are two different tensors.

`dropout` in inference (no `training_mode`, or false) is the identity with an all-true mask;
in training it keeps each element with probability 1 - ratio and scales the kept ones by
1 / (1 - ratio); its mask says which were kept.
"""
from __future__ import annotations

from ..dtypes import FLOAT_TYPES
from . import REQUIRED, _fail, op

_RANDOM = {"random"}
_SEED = {"seed": None}  # None: no seed (fresh values each run); else a number (ONNX: a float)


def _float_dtype(node, dtype):
    if dtype not in FLOAT_TYPES:
        _fail(node, f"dtype {dtype} is not a float type; {node.op} draws one of {', '.join(sorted(FLOAT_TYPES))}")
    return dtype


def _static_shape(node, shape):
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
        _fail(node, f"shape {shape!r} must be a list of non-negative integers")
    return tuple(shape)


@op("random_normal", [], attrs={"shape": REQUIRED, "dtype": "f32", "mean": 0.0, "scale": 1.0, **_SEED},
    groups=_RANDOM)
def _random_normal(node, a, ins):
    return [(_static_shape(node, a["shape"]), _float_dtype(node, a["dtype"]))]


@op("random_uniform", [], attrs={"shape": REQUIRED, "dtype": "f32", "low": 0.0, "high": 1.0, **_SEED},
    groups=_RANDOM)
def _random_uniform(node, a, ins):
    return [(_static_shape(node, a["shape"]), _float_dtype(node, a["dtype"]))]


def _like(node, a, ins):
    """The operand's shape; `dtype` if given, else the operand's type (whose values are not read)."""
    return [(ins[0].shape, _float_dtype(node, a["dtype"] or ins[0].dtype))]


op("random_normal_like", ["x"], attrs={"dtype": None, "mean": 0.0, "scale": 1.0, **_SEED},
   groups=_RANDOM)(_like)
op("random_uniform_like", ["x"], attrs={"dtype": None, "low": 0.0, "high": 1.0, **_SEED},
   groups=_RANDOM)(_like)


@op("bernoulli", ["p"], attrs={"dtype": None, **_SEED}, groups=_RANDOM)
def _bernoulli(node, a, ins):
    # 1 with probability p, else 0; in `dtype` (any numeric type or bool), else p's type.
    p = ins[0]
    if p.dtype not in FLOAT_TYPES:
        _fail(node, f"probabilities {p.name!r} are {p.dtype}; bernoulli takes a float type")
    return [(p.shape, a["dtype"] or p.dtype)]


@op("multinomial", ["logits"], attrs={"dtype": "i32", "sample_size": 1, **_SEED}, groups=_RANDOM)
def _multinomial(node, a, ins):
    # logits is (batch, classes) of unnormalized log-probabilities; the result is
    # (batch, sample_size) class indices drawn with replacement.
    x = ins[0]
    if x.shape is None or len(x.shape) != 2:
        _fail(node, f"logits must be 2-D (batch, classes), got {x.shape and list(x.shape)}")
    if x.dtype not in FLOAT_TYPES:
        _fail(node, f"logits {x.name!r} are {x.dtype}; multinomial takes a float type")
    if a["dtype"] not in ("i32", "i64"):
        _fail(node, f"dtype {a['dtype']} must be i32 or i64")
    if not isinstance(a["sample_size"], int) or a["sample_size"] < 1:
        _fail(node, f"sample_size {a['sample_size']!r} must be a positive integer")
    return [((x.shape[0], a["sample_size"]), a["dtype"])]


@op("dropout", ["x", "ratio?", "training_mode?"], ["y", "mask?"], attrs=dict(_SEED), groups=_RANDOM)
def _dropout(node, a, ins):
    x = ins[0]
    ratio = ins[1] if len(ins) > 1 else None
    training = ins[2] if len(ins) > 2 else None
    if ratio is not None and (ratio.dtype not in FLOAT_TYPES or ratio.shape not in ((), (1,))):
        _fail(node, f"ratio {ratio.name!r} must be a float scalar, got {ratio.type_str()}")
    if training is not None and (training.dtype != "bool" or training.shape not in ((), (1,))):
        _fail(node, f"training_mode {training.name!r} must be a bool scalar, got {training.type_str()}")
    return [(x.shape, x.dtype), (x.shape, "bool")][:len(node.outputs)]
