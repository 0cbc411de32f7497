"""PyTorch custom ops that execute through an npurun Executor: `npu::matmul`, `npu::conv2d`,
and `npu::run` (a whole npurun model).

    import npurun.torch_ops as npu_ops          # registers the ops (imports torch)
    y = torch.ops.npu.matmul(a, b)
    y = torch.ops.npu.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1)
    key = npu_ops.register_model("espcn_x3.onnx")
    (out,) = torch.ops.npu.run(key, [x])

Each op has a fake (meta) implementation, so it traces under `torch.compile(fullgraph=True)`
as one opaque call, and passes `torch.library.opcheck`. The Executor's device is
`npurun.torch_ops.DEVICE` ("cpu" unless NPURUN_TORCH_OPS_DEVICE says otherwise): the op
hands host arrays to it and returns tensors on the caller's device. This module imports
torch; `import npurun` does not import this module.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np
import torch

from .errors import InputError
from .ir.graph import Graph, Node, Value
from .ir.shapes import UNKNOWN, parse_affine

DEVICE = os.environ.get("NPURUN_TORCH_OPS_DEVICE", "cpu")
_IR = {torch.float32: "f32", torch.float16: "f16", torch.float64: "f64", torch.bfloat16: "bf16",
       torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64", torch.bool: "bool"}
_lock = threading.Lock()
_executors: dict = {}
_graphs: dict = {}
_models: dict[str, Graph] = {}


def executor(device: str | None = None):
    """The Executor the ops run on (one per device, made on first use)."""
    from .runtime import Executor
    device = device or DEVICE
    with _lock:
        if device not in _executors:
            _executors[device] = Executor(device)
        return _executors[device]


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").contiguous().numpy()


def _ir_dtype(t: torch.Tensor) -> str:
    try:
        return _IR[t.dtype]
    except KeyError:
        raise InputError(f"npu ops take {', '.join(map(str, _IR))}; got {t.dtype}") from None


def _one_node_graph(key, op, inputs, out_shape, attrs) -> Graph:
    """A graph of one node over concrete shapes, cached per shape signature."""
    with _lock:
        g = _graphs.get(key)
        if g is None:
            g = Graph(name=f"npu_{op}", source=f"<npu::{op}>")
            names = []
            for name, t in inputs:
                if t is not None:
                    g.add_value(Value(name, tuple(t.shape), _ir_dtype(t)))
                    g.inputs.append(name)
                names.append(name if t is not None else "")
            g.add_value(Value("y", tuple(out_shape), _ir_dtype(inputs[0][1])))
            g.nodes.append(Node(op, names, ["y"], attrs, name=op))
            g.outputs.append("y")
            _graphs[key] = g
        return g


def _run(g: Graph, feeds: dict) -> dict:
    return executor().run_sync(g, feeds)


# ---------------------------------------------------------------- npu::matmul

@torch.library.custom_op("npu::matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out_shape = torch.matmul(a.to("meta"), b.to("meta")).shape
    g = _one_node_graph(("matmul", tuple(a.shape), tuple(b.shape), a.dtype), "matmul",
                        [("a", a), ("b", b)], out_shape, {})
    y = _run(g, {"a": _host(a), "b": _host(b)})["y"]
    return torch.from_numpy(np.array(y)).to(a.device)


@matmul.register_fake
def _(a, b):
    return torch.matmul(a, b).clone()  # shapes and broadcasting as torch.matmul


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = torch.ops.npu.matmul(grad, b.transpose(-1, -2))
        ga = _unbroadcast(ga, a.shape)
    if ctx.needs_input_grad[1]:
        gb = torch.ops.npu.matmul(a.transpose(-1, -2), grad)
        gb = _unbroadcast(gb, b.shape)
    return ga, gb


def _unbroadcast(g, shape):
    while g.ndim > len(shape):
        g = g.sum(0)
    for d, n in enumerate(shape):
        if n == 1 and g.shape[d] != 1:
            g = g.sum(d, keepdim=True)
    return g


def _matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


# 2-D and batched operands; 1-D operands have no backward here (their grads need reshapes).
torch.library.register_autograd("npu::matmul", _matmul_backward, setup_context=_matmul_setup)


# ---------------------------------------------------------------- npu::conv2d

@torch.library.custom_op("npu::conv2d", mutates_args=())
def conv2d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int) -> torch.Tensor:
    out_shape = torch.nn.functional.conv2d(x.to("meta"), w.to("meta"), None, list(stride), list(padding),
                                           list(dilation), groups).shape
    attrs = {"strides": list(stride), "pads": [padding[0], padding[1], padding[0], padding[1]],
             "dilations": list(dilation), "group": groups, "kernel_shape": list(w.shape[2:])}
    key = ("conv", tuple(x.shape), tuple(w.shape), b is not None, x.dtype, tuple(stride), tuple(padding),
           tuple(dilation), groups)
    g = _one_node_graph(key, "conv", [("x", x), ("w", w), ("b", b)], out_shape, attrs)
    feeds = {"x": _host(x), "w": _host(w)}
    if b is not None:
        feeds["b"] = _host(b)
    return torch.from_numpy(np.array(_run(g, feeds)["y"])).to(x.device)


@conv2d.register_fake
def _(x, w, b, stride, padding, dilation, groups):
    return torch.nn.functional.conv2d(x, w, None, list(stride), list(padding), list(dilation), groups).clone()


def _conv_backward(ctx, grad):
    x, w = ctx.saved_tensors
    gx = torch.nn.grad.conv2d_input(x.shape, w, grad, ctx.stride, ctx.padding, ctx.dilation, ctx.groups) \
        if ctx.needs_input_grad[0] else None
    gw = torch.nn.grad.conv2d_weight(x, w.shape, grad, ctx.stride, ctx.padding, ctx.dilation, ctx.groups) \
        if ctx.needs_input_grad[1] else None
    gb = grad.sum((0, 2, 3)) if ctx.needs_input_grad[2] else None
    return gx, gw, gb, None, None, None, None


def _conv_setup(ctx, inputs, output):
    x, w, b, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, w)
    ctx.stride, ctx.padding, ctx.dilation, ctx.groups = list(stride), list(padding), list(dilation), groups


torch.library.register_autograd("npu::conv2d", _conv_backward, setup_context=_conv_setup)


# ---------------------------------------------------------------- npu::run

def register_model(model, key: str | None = None) -> str:
    """Make a model (a path or an npurun Graph) callable as `torch.ops.npu.run(key, inputs)`;
    returns the key (the path, or the graph's name, unless given)."""
    from .frontend import load
    g = model if isinstance(model, Graph) else load(model)
    key = key or (g.name if isinstance(model, Graph) else str(model))
    with _lock:
        _models[key] = g
    return key


def _model(key: str) -> Graph:
    g = _models.get(key)
    if g is None:
        raise InputError(f"npu::run: no model registered as {key!r}; call npurun.torch_ops.register_model "
                         f"first (registered: {', '.join(_models) or 'none'})")
    return g


@torch.library.custom_op("npu::run", mutates_args=())
def run(model: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    g = _model(model)
    if len(inputs) != len(g.inputs):
        raise InputError(f"npu::run {model!r}: {len(inputs)} inputs given, the model takes {g.inputs}")
    outs = _run(g, {name: _host(t) for name, t in zip(g.inputs, inputs)})
    dev = inputs[0].device if inputs else torch.device("cpu")
    return [torch.from_numpy(np.array(outs[n])).to(dev) for n in g.outputs]


@run.register_fake
def _(model, inputs):
    from .backends.torch.kernels import TORCH_DTYPES
    g = _model(model)
    env: dict = {}
    for name, t in zip(g.inputs, inputs):
        for d, n in zip(g.values[name].shape, t.shape):
            if isinstance(d, str) and d != UNKNOWN and parse_affine(d) and parse_affine(d)[0] == 1 \
                    and parse_affine(d)[2] == 0:
                env[d] = n
    out = []
    for name in g.outputs:
        v = g.values[name]
        shape = []
        for d in v.shape:
            if isinstance(d, int):
                shape.append(d)
            elif d != UNKNOWN and parse_affine(d) and parse_affine(d)[1] in env:
                mul, sym, add = parse_affine(d)
                shape.append(env[sym] * mul + add)
            else:  # a size only the run knows
                shape.append(torch.library.get_ctx().new_dynamic_size())
        dev = inputs[0].device if inputs else torch.device("cpu")
        out.append(torch.empty(shape, dtype=TORCH_DTYPES[v.dtype], device=dev))
    return out
