"""Vision and signal ONNX ops: ConvTranspose, DeformConv, the CNN normalizations, Lp pooling,
unpooling, region pooling, NonMaxSuppression, GridSample, AffineGrid, Col2Im, CenterCropPad,
DFT, STFT, windows, MelWeightMatrix and ImageDecoder."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..context import ConvertError, Ctx
from ..dtypes import ir_dtype
from . import converter


def _pick(ctx: Ctx, *keys):
    return {k: ctx.attrs[k] for k in keys if k in ctx.attrs}


@converter("ConvTranspose")
def ConvTranspose(ctx: Ctx):
    ctx.emit("conv_transpose", ctx.inputs(), [ctx.output(0)],
             **_pick(ctx, "strides", "pads", "dilations", "group", "kernel_shape", "auto_pad",
                     "output_padding", "output_shape"))


@converter("DeformConv", since=19)
def DeformConv(ctx: Ctx):
    ctx.emit("deform_conv", ctx.inputs(), [ctx.output(0)],
             **_pick(ctx, "strides", "pads", "dilations", "group", "kernel_shape", "offset_group"))


@converter("InstanceNormalization")
def InstanceNormalization(ctx: Ctx):
    ctx.emit("instance_normalization", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "epsilon"))


@converter("GroupNormalization", since=18)
def GroupNormalization(ctx: Ctx):
    """Opset 18 takes scale and bias per group, 21 per channel: the kernel tells them apart by
    their length. stash_type (21) only asks for float32 statistics or better, which the
    reference kernel always computes in float64."""
    ctx.emit("group_normalization", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "num_groups", "epsilon"))


@converter("LRN")
def LRN(ctx: Ctx):
    ctx.emit("lrn", [ctx.input(0)], [ctx.output(0)], **_pick(ctx, "size", "alpha", "beta", "bias"))


@converter("MeanVarianceNormalization", since=9)
def MeanVarianceNormalization(ctx: Ctx):
    ctx.emit("mean_variance_normalization", [ctx.input(0)], [ctx.output(0)], **_pick(ctx, "axes"))


@converter("LpNormalization")
def LpNormalization(ctx: Ctx):
    ctx.emit("lp_normalization", [ctx.input(0)], [ctx.output(0)], **_pick(ctx, "axis", "p"))


@converter("LpPool")
def LpPool(ctx: Ctx):
    a = _pick(ctx, "kernel_shape", "strides", "pads", "dilations", "ceil_mode", "auto_pad", "p")
    if "p" in a:
        if float(a["p"]) != int(a["p"]):  # opset 1 declared p a float
            raise ConvertError(f"p={a['p']} is not an integer")
        a["p"] = int(a["p"])
    ctx.emit("lp_pool", [ctx.input(0)], [ctx.output(0)], **a)


@converter("GlobalLpPool")
def GlobalLpPool(ctx: Ctx):
    p = ctx.attrs.get("p", 2)
    if float(p) != int(p):
        raise ConvertError(f"p={p} is not an integer")
    ctx.emit("global_lp_pool", [ctx.input(0)], [ctx.output(0)], p=int(p))


@converter("MaxUnpool", since=9)
def MaxUnpool(ctx: Ctx):
    ctx.emit("max_unpool", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "kernel_shape", "strides", "pads"))


@converter("MaxRoiPool")
def MaxRoiPool(ctx: Ctx):
    ctx.emit("max_roi_pool", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "pooled_shape", "spatial_scale"))


@converter("RoiAlign", since=10)
def RoiAlign(ctx: Ctx):
    """Opset 10 had no coordinate_transformation_mode: it behaved as `output_half_pixel`."""
    ctx.emit("roi_align", ctx.inputs(), [ctx.output(0)], coordinate_transformation_mode="output_half_pixel",
             **_pick(ctx, "mode", "output_height", "output_width", "sampling_ratio", "spatial_scale"))


@converter("RoiAlign", since=16)
def RoiAlign_16(ctx: Ctx):
    ctx.emit("roi_align", ctx.inputs(), [ctx.output(0)],
             **_pick(ctx, "mode", "output_height", "output_width", "sampling_ratio", "spatial_scale",
                     "coordinate_transformation_mode"))


@converter("NonMaxSuppression", since=10)
def NonMaxSuppression(ctx: Ctx):
    ctx.emit("non_max_suppression", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "center_point_box"))


@converter("GridSample", since=16)
def GridSample(ctx: Ctx):
    """Opset 16 names the modes bilinear / bicubic and takes 4-D input only; 20 says linear /
    cubic and takes any rank."""
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attrs.get("mode", "bilinear"),
                                                        ctx.attrs.get("mode", "bilinear"))
    ctx.emit("grid_sample", ctx.inputs(), [ctx.output(0)], mode=mode,
             **_pick(ctx, "padding_mode", "align_corners"))


@converter("GridSample", since=20)
def GridSample_20(ctx: Ctx):
    ctx.emit("grid_sample", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "mode", "padding_mode", "align_corners"))


@converter("AffineGrid", since=20)
def AffineGrid(ctx: Ctx):
    ctx.emit("affine_grid", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "align_corners"))


@converter("Col2Im", since=18)
def Col2Im(ctx: Ctx):
    ctx.emit("col2im", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "dilations", "pads", "strides"))


@converter("CenterCropPad", since=18)
def CenterCropPad(ctx: Ctx):
    ctx.emit("center_crop_pad", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "axes"))


@converter("DFT", since=17)
def DFT(ctx: Ctx):
    """Opset 17 gives the axis as an attribute (default 1); the IR takes it as an operand."""
    axis = ctx.const(np.array(ctx.attrs.get("axis", 1), np.int64), "axis")
    ctx.emit("dft", [ctx.input(0), ctx.input(1), axis], [ctx.output(0)], **_pick(ctx, "inverse", "onesided"))


@converter("DFT", since=20)
def DFT_20(ctx: Ctx):
    ctx.emit("dft", ctx.inputs()[:3], [ctx.output(0)], **_pick(ctx, "inverse", "onesided"))


@converter("STFT", since=17)
def STFT(ctx: Ctx):
    ctx.emit("stft", ctx.inputs(), [ctx.output(0)], **_pick(ctx, "onesided"))


def _out_type(ctx: Ctx) -> str:
    return ir_dtype(ctx.attrs.get("output_datatype", TensorProto.FLOAT), ctx.name)


def _window(ir_op):
    def convert(ctx: Ctx):
        ctx.emit(ir_op, [ctx.input(0)], [ctx.output(0)], dtype=_out_type(ctx), **_pick(ctx, "periodic"))
    return convert


for _onnx, _ir in (("HannWindow", "hann_window"), ("HammingWindow", "hamming_window"),
                   ("BlackmanWindow", "blackman_window")):
    converter(_onnx, since=17)(_window(_ir))


@converter("MelWeightMatrix", since=17)
def MelWeightMatrix(ctx: Ctx):
    ctx.emit("mel_weight_matrix", ctx.inputs(), [ctx.output(0)], dtype=_out_type(ctx))


@converter("ImageDecoder", since=20)
def ImageDecoder(ctx: Ctx):
    ctx.emit("image_decoder", [ctx.input(0)], [ctx.output(0)], **_pick(ctx, "pixel_format"))
