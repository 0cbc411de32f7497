"""Data-movement ONNX ops: reshapes, transposes, slicing, padding, resampling, constants."""
from __future__ import annotations

import numpy as np

from ..context import ConvertError, Ctx
from . import converter


def _ints(ctx: Ctx, values, hint):
    return ctx.const(np.array(values, np.int64), hint)


@converter("Constant")
def Constant(ctx: Ctx):
    a = ctx.attrs
    if "value" in a:
        arr = a["value"]
    elif "value_float" in a:
        arr = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.array(a["value_ints"], np.int64)
    else:
        raise ConvertError(f"Constant with attributes {sorted(a)} is not supported")
    ctx.graph.const(ctx.output(0), arr)


@converter("ConstantOfShape")
def ConstantOfShape(ctx: Ctx):
    val = ctx.attrs.get("value")
    arr = np.zeros(1, np.float32) if val is None else val.reshape(-1)
    from ....ir.dtypes import from_numpy
    ctx.emit("constant_of_shape", [ctx.input(0)], [ctx.output(0)], value=arr[0].item(),
             dtype=from_numpy(arr.dtype))


@converter("Reshape")
def Reshape(ctx: Ctx):
    """Opset < 5: the target shape is an attribute."""
    ctx.emit("reshape", [ctx.input(0), _ints(ctx, ctx.attrs["shape"], "shape")], [ctx.output(0)])


@converter("Reshape", since=5)
def Reshape_5(ctx: Ctx):
    ctx.emit("reshape", ctx.inputs(), [ctx.output(0)], allowzero=ctx.attrs.get("allowzero"))


@converter("Transpose")
def Transpose(ctx: Ctx):
    ctx.emit("transpose", [ctx.input(0)], [ctx.output(0)], perm=ctx.attrs.get("perm"))


@converter("Concat")
def Concat(ctx: Ctx):
    ctx.emit("concat", [i for i in ctx.inputs() if i], [ctx.output(0)], axis=ctx.attrs.get("axis", 1))


@converter("Split")
def Split(ctx: Ctx):
    ins = [ctx.input(0)]
    if "split" in ctx.attrs:
        ins.append(_ints(ctx, ctx.attrs["split"], "split"))
    ctx.emit("split", ins, list(ctx.node.output), axis=ctx.attrs.get("axis", 0),
             num_outputs=None if len(ins) > 1 else len(ctx.node.output))


@converter("Split", since=13)
def Split_13(ctx: Ctx):
    # Without sizes, the parts are as many as the node's outputs.
    n = None if ctx.input(1) else ctx.attrs.get("num_outputs", len(ctx.node.output))
    ctx.emit("split", ctx.inputs(), list(ctx.node.output), axis=ctx.attrs.get("axis", 0), num_outputs=n)


@converter("Flatten")
def Flatten(ctx: Ctx):
    ctx.emit("flatten", [ctx.input(0)], [ctx.output(0)], axis=ctx.attrs.get("axis", 1))


def _axes_attr(ir_op):
    def convert(ctx: Ctx):
        """Opset < 13: `axes` is an attribute."""
        ins = [ctx.input(0)]
        if "axes" in ctx.attrs:
            ins.append(_ints(ctx, ctx.attrs["axes"], "axes"))
        ctx.emit(ir_op, ins, [ctx.output(0)])
    return convert


def _axes_input(ir_op):
    def convert(ctx: Ctx):
        ctx.emit(ir_op, ctx.inputs(), [ctx.output(0)])
    return convert


for _onnx, _ir in (("Squeeze", "squeeze"), ("Unsqueeze", "unsqueeze")):
    converter(_onnx)(_axes_attr(_ir))
    converter(_onnx, since=13)(_axes_input(_ir))


@converter("Slice")
def Slice(ctx: Ctx):
    """Opset < 10: starts/ends/axes are attributes."""
    a = ctx.attrs
    ins = [ctx.input(0), _ints(ctx, a["starts"], "starts"), _ints(ctx, a["ends"], "ends")]
    if "axes" in a:
        ins.append(_ints(ctx, a["axes"], "axes"))
    ctx.emit("slice", ins, [ctx.output(0)])


@converter("Slice", since=10)
def Slice_10(ctx: Ctx):
    ctx.emit("slice", ctx.inputs(), [ctx.output(0)])


@converter("Gather")
def Gather(ctx: Ctx):
    ctx.emit("gather", ctx.inputs(), [ctx.output(0)], axis=ctx.attrs.get("axis", 0))


@converter("Shape")
def Shape(ctx: Ctx):
    ctx.emit("shape", [ctx.input(0)], [ctx.output(0)], start=ctx.attrs.get("start"), end=ctx.attrs.get("end"))


@converter("Expand")
def Expand(ctx: Ctx):
    ctx.emit("expand", ctx.inputs(), [ctx.output(0)])


@converter("Tile", since=6)
def Tile(ctx: Ctx):
    ctx.emit("tile", ctx.inputs(), [ctx.output(0)])


@converter("Pad")
def Pad(ctx: Ctx):
    """Opset < 11: pads and the fill value are attributes."""
    a = ctx.attrs
    pads = a.get("pads", a.get("paddings"))
    ins = [ctx.input(0), _ints(ctx, pads, "pads")]
    if a.get("value", 0.0) != 0.0:
        from ....ir.dtypes import to_numpy
        dt = to_numpy(ctx.graph.values[ctx.input(0)].dtype)
        ins.append(ctx.const(np.array(a["value"], dt), "value"))
    ctx.emit("pad", ins, [ctx.output(0)], mode=a.get("mode", "constant"))


@converter("Pad", since=11)
def Pad_11(ctx: Ctx):
    ctx.emit("pad", ctx.inputs(), [ctx.output(0)], mode=ctx.attrs.get("mode", "constant"))


@converter("DepthToSpace")
def DepthToSpace(ctx: Ctx):
    ctx.emit("depth_to_space", [ctx.input(0)], [ctx.output(0)], blocksize=ctx.attrs["blocksize"],
             mode=ctx.attrs.get("mode", "DCR"))


@converter("SpaceToDepth")
def SpaceToDepth(ctx: Ctx):
    ctx.emit("space_to_depth", [ctx.input(0)], [ctx.output(0)], blocksize=ctx.attrs["blocksize"],
             mode=ctx.attrs.get("mode", "DCR"))


_RESIZE_KEYS = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                "exclude_outside", "extrapolation_value", "antialias", "axes", "keep_aspect_ratio_policy")


@converter("Resize", since=10)
def Resize(ctx: Ctx):
    """Opset 10: (X, scales), asymmetric coordinates; nearest rounds down."""
    mode = ctx.attrs.get("mode", "nearest")
    ctx.emit("resize", [ctx.input(0), "", ctx.input(1)], [ctx.output(0)], mode=mode,
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@converter("Resize", since=11)
def Resize_11(ctx: Ctx):
    """11 adds roi and sizes; 18 antialias, axes and keep_aspect_ratio_policy; 19
    half_pixel_symmetric (all attributes the IR op takes as they are)."""
    a = ctx.attrs
    ctx.emit("resize", ctx.inputs(), [ctx.output(0)], **{k: v for k, v in a.items() if k in _RESIZE_KEYS})


def _upsample_mode(ctx: Ctx) -> str:
    mode = ctx.attrs.get("mode", "nearest")
    return "linear" if mode == "bilinear" else mode


@converter("Upsample", since=7)
def Upsample_7(ctx: Ctx):
    """Opset 7-8: the scales are an attribute. Upsample is Resize with asymmetric coordinates
    and nearest rounding down."""
    scales = ctx.const(np.array(ctx.attrs["scales"], np.float32), "scales")
    ctx.emit("resize", [ctx.input(0), "", scales], [ctx.output(0)], mode=_upsample_mode(ctx),
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@converter("Upsample", since=9)
def Upsample(ctx: Ctx):
    ctx.emit("resize", [ctx.input(0), "", ctx.input(1)], [ctx.output(0)], mode=_upsample_mode(ctx),
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
