"""Fused ops: what the fusion passes (npurun/passes/fuse_*.py) turn a chain of vocabulary ops
into. Each is exactly a composition of ops of the vocabulary, computed in that order, so a
backend without a kernel of its own runs the composition (the reference kernels do) and the
result is what the unfused chain gave:

    masked_softmax(x, mask?)        softmax(x + mask, axis) (rows that are all -inf give NaN,
                                    replaced by `nan_value` when `nan_fix` is 1: the exported
                                    scaled_dot_product_attention's where(isnan(p), 0, p))
    matmul_add(a, b, c*)            ((a @ b) + c0) + c1 ...  (a linear layer's bias, a residual)
    affine_activation(x)            s1 * act(s0 * x + t0) + t1  (scalars; act optional)
    add_activation(a, b)            act(a + b)  (a residual add and the activation after it)
    channel_affine(x, scale?, shift?)  act((x * scale) + shift), scale and shift one value per
                                    channel (axis 1), shape (C,) (a BatchNorm written out)
    rope_half(x, cos, sin)          x * cos + rotate_half(x) * sin, rotate_half(x) =
                                    concat(-x[..., d/2:], x[..., :d/2]) (transformers' rotary
                                    embedding as exporters write it)
"""
from __future__ import annotations

from ..shapes import broadcast, numel
from . import _fail, _same, op
from .elementwise import check_activation
from .nn import _matmul_macs, _matmul_shape


@op("masked_softmax", ["x", "mask?"], attrs={"axis": -1, "nan_fix": 0, "nan_value": 0.0},
    groups={"normalizing", "fused"})
def _masked_softmax(node, a, ins):
    if ins[1] is not None and broadcast(ins[0].shape, ins[1].shape) is None:
        _fail(node, f"mask shape {list(ins[1].shape)} does not broadcast to scores {list(ins[0].shape)}")
    shape = ins[0].shape if ins[1] is None else broadcast(ins[0].shape, ins[1].shape)
    return [(shape, ins[0].dtype)]


@op("matmul_add", ["a", "b", "c*"], groups={"matmul", "mac", "fused"}, macs=_matmul_macs)
def _matmul_add(node, a, ins):
    shape = _matmul_shape(node, ins[0].shape, ins[1].shape)
    for v in ins[2:]:
        if broadcast(shape, v.shape) != tuple(shape):
            _fail(node, f"addend {v.name!r} of shape {list(v.shape)} does not broadcast to the product's "
                        f"shape {list(shape)}")
    return [(shape, ins[0].dtype)]


@op("affine_activation", ["x"], attrs={"s0": 1.0, "t0": 0.0, "activation": "", "activation_params": [],
                                       "s1": 1.0, "t1": 0.0},
    groups={"elementwise", "unary", "fused"}, macs=lambda a, ins, outs: 2 * numel(outs[0]))
def _affine_activation(node, a, ins):
    check_activation(node, a)
    return _same(node, a, ins)


@op("add_activation", ["a", "b"], attrs={"activation": "", "activation_params": []},
    groups={"elementwise", "fused"}, macs=lambda a, ins, outs: 2 * numel(outs[0]))
def _add_activation(node, a, ins):
    check_activation(node, a)
    shape = broadcast(ins[0].shape, ins[1].shape)
    if shape is None:
        _fail(node, f"a {list(ins[0].shape)} and b {list(ins[1].shape)} do not broadcast")
    return [(shape, ins[0].dtype)]


@op("channel_affine", ["x", "scale?", "shift?"], attrs={"activation": "", "activation_params": []},
    groups={"elementwise", "fused"}, macs=lambda a, ins, outs: 2 * numel(outs[0]))
def _channel_affine(node, a, ins):
    check_activation(node, a)
    x = ins[0]
    c = x.shape[1] if len(x.shape) >= 2 else None
    for v in ins[1:]:
        if v is not None and (len(v.shape) != 1 or not isinstance(c, int) or v.shape[0] != c):
            _fail(node, f"{v.name!r} must hold one value per channel of x {list(x.shape)} (shape [{c}]), "
                        f"got {list(v.shape)}")
    return [(x.shape, x.dtype)]


@op("rope_half", ["x", "cos", "sin"], groups={"elementwise", "fused"},
    macs=lambda a, ins, outs: 2 * numel(outs[0]))
def _rope_half(node, a, ins):
    x, c, s = ins
    d = x.shape[-1] if x.shape else None
    if not isinstance(d, int) or d % 2:
        _fail(node, f"x's last dim must be a known even size, got {list(x.shape)}")
    xc = broadcast(tuple(x.shape), tuple(c.shape))
    shape = None if xc is None else broadcast(xc, tuple(s.shape))
    if shape is None:
        _fail(node, f"cos {list(c.shape)} and sin {list(s.shape)} do not broadcast to x {list(x.shape)}")
    return [(shape, x.dtype)]
