"""Single-node ONNX models with fresh random inputs, for checking npurun against ONNX Runtime."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from conftest import nonzero_normal




def single_node_model(op, inputs, consts=None, attrs=None, opset=17, n_out=1):
    """One `op` node reading the graph inputs `inputs` (name -> array), then the initializers
    `consts` (name -> array), in that order."""
    consts = consts or {}
    names = list(inputs) + list(consts)
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], name=f"the_{op.lower()}", **(attrs or {}))
    g = helper.make_graph(
        [node], f"case_{op}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def cases(rng):
    """(id, op, inputs, consts, attrs, opset, n_out) for every op family the importer takes."""
    f = lambda *s: nonzero_normal(rng, s)  # noqa: E731
    pos = lambda *s: (np.abs(f(*s)) + 0.1).astype(np.float32)  # noqa: E731
    c = []
    add = lambda id_, op, ins, consts=None, attrs=None, opset=17, n_out=1: c.append(  # noqa: E731
        (id_, op, ins, consts or {}, attrs or {}, opset, n_out))

    # convolution in its forms
    add("conv_pads", "Conv", {"x": f(1, 3, 11, 13)}, {"w": f(8, 3, 3, 3), "b": f(8)}, {"pads": [1, 1, 1, 1]})
    add("conv_stride_dil", "Conv", {"x": f(2, 4, 17, 15)}, {"w": f(6, 4, 3, 3)},
        {"strides": [2, 1], "dilations": [2, 2], "pads": [1, 2, 0, 1]})
    add("conv_group", "Conv", {"x": f(1, 6, 9, 9)}, {"w": f(4, 3, 3, 3), "b": f(4)}, {"group": 2, "pads": [1, 1, 1, 1]})
    add("conv_depthwise", "Conv", {"x": f(1, 5, 10, 8)}, {"w": f(5, 1, 3, 3)}, {"group": 5, "strides": [2, 2]})
    add("conv_same_upper", "Conv", {"x": f(1, 2, 10, 7)}, {"w": f(3, 2, 4, 4)},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]})
    add("conv_1x1", "Conv", {"x": f(1, 16, 6, 6)}, {"w": f(8, 16, 1, 1), "b": f(8)})
    add("conv_1d", "Conv", {"x": f(2, 3, 20)}, {"w": f(5, 3, 5), "b": f(5)}, {"pads": [2, 2]})
    add("conv_5x5_espcn", "Conv", {"x": f(1, 1, 12, 14)}, {"w": f(64, 1, 5, 5), "b": f(64)}, {"pads": [2, 2, 2, 2]})
    # matrix products
    add("matmul_2d", "MatMul", {"a": f(7, 5), "b": f(5, 3)})
    add("matmul_batched", "MatMul", {"a": f(2, 3, 7, 5)}, {"b": f(5, 4)})
    add("matmul_vec", "MatMul", {"a": f(5), "b": f(2, 5, 3)})
    add("gemm", "Gemm", {"a": f(4, 6)}, {"b": f(5, 6), "c": f(5)}, {"transB": 1, "alpha": 0.7, "beta": 1.3})
    add("gemm_trans_a", "Gemm", {"a": f(6, 4), "b": f(6, 5)}, attrs={"transA": 1})
    # elementwise
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        add(op.lower() + "_bcast", op, {"a": f(2, 3, 4), "b": f(3, 1)})
    add("pow", "Pow", {"a": pos(3, 4), "b": f(3, 4)})
    add("div_int", "Div", {"a": rng.integers(-50, 50, (4, 5)).astype(np.int64),
                           "b": rng.choice([-7, -3, 2, 5], (4, 5)).astype(np.int64)})
    add("mod_int", "Mod", {"a": rng.integers(-50, 50, (4, 5)).astype(np.int64),
                           "b": rng.choice([-7, -3, 2, 5], (4, 5)).astype(np.int64)})
    add("mod_fmod", "Mod", {"a": f(4, 5), "b": pos(4, 5)}, attrs={"fmod": 1})
    add("prelu", "PRelu", {"x": f(1, 3, 4, 4)}, {"s": f(3, 1, 1)})
    for op in ("Relu", "Tanh", "Sigmoid", "Exp", "Neg", "Abs", "Erf", "Floor", "Ceil", "Softplus",
               "Softsign", "HardSwish", "Sign", "Sin", "Cos", "Identity", "Round"):
        add(op.lower(), op, {"x": f(3, 4, 5) * 3})
    add("log", "Log", {"x": pos(3, 4)})
    add("sqrt", "Sqrt", {"x": pos(3, 4)})
    add("reciprocal", "Reciprocal", {"x": pos(3, 4)})
    add("leaky_relu", "LeakyRelu", {"x": f(3, 4)}, attrs={"alpha": 0.2})
    add("elu", "Elu", {"x": f(3, 4)}, attrs={"alpha": 0.7})
    add("selu", "Selu", {"x": f(3, 4)})
    add("celu", "Celu", {"x": f(3, 4)}, attrs={"alpha": 1.5})
    add("hard_sigmoid", "HardSigmoid", {"x": f(3, 4) * 4}, attrs={"alpha": 0.3, "beta": 0.4})
    add("gelu", "Gelu", {"x": f(3, 4)}, opset=20)
    add("gelu_tanh", "Gelu", {"x": f(3, 4)}, attrs={"approximate": "tanh"}, opset=20)
    add("clip", "Clip", {"x": f(3, 4) * 3}, {"lo": np.array(-0.5, np.float32), "hi": np.array(0.8, np.float32)})
    add("clip_v6", "Clip", {"x": f(3, 4) * 3}, attrs={"min": -0.5, "max": 0.8}, opset=6)
    add("cast_f2i", "Cast", {"x": f(3, 4) * 10}, attrs={"to": TensorProto.INT32})
    add("cast_i2f", "Cast", {"x": rng.integers(-9, 9, (3, 4)).astype(np.int64)}, attrs={"to": TensorProto.FLOAT})
    add("where", "Where", {"c": rng.random((3, 4)) > 0.5, "x": f(3, 4), "y": f(1, 4)})
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        add(op.lower(), op, {"a": rng.integers(0, 3, (3, 4)).astype(np.int64),
                             "b": rng.integers(0, 3, (3, 4)).astype(np.int64)})
    add("sum3", "Sum", {"a": f(3, 4), "b": f(3, 4), "c": f(1, 4)})
    add("mean3", "Mean", {"a": f(3, 4), "b": f(3, 4), "c": f(3, 4)})
    # normalization, softmax, reductions
    add("batchnorm", "BatchNormalization", {"x": f(2, 3, 5, 4)},
        {"s": f(3), "b": f(3), "m": f(3), "v": pos(3)}, {"epsilon": 1e-3})
    add("layernorm", "LayerNormalization", {"x": f(2, 5, 8)}, {"s": f(8), "b": f(8)})
    add("softmax", "Softmax", {"x": f(2, 3, 5)}, attrs={"axis": 1})
    add("softmax_v11", "Softmax", {"x": f(2, 3, 5)}, attrs={"axis": 1}, opset=11)
    add("log_softmax", "LogSoftmax", {"x": f(4, 6)})
    add("reduce_mean_v13", "ReduceMean", {"x": f(2, 3, 4)}, attrs={"axes": [1, 2], "keepdims": 0}, opset=13)
    add("reduce_sum_v13", "ReduceSum", {"x": f(2, 3, 4)}, {"axes": np.array([-1], np.int64)})
    add("reduce_max_v18", "ReduceMax", {"x": f(2, 3, 4)}, {"axes": np.array([0], np.int64)}, opset=18)
    # pooling
    add("maxpool", "MaxPool", {"x": f(1, 3, 9, 11)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    add("maxpool_ceil", "MaxPool", {"x": f(1, 2, 10, 10)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1})
    add("avgpool_excl", "AveragePool", {"x": f(1, 3, 9, 9)},
        attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    add("avgpool_incl", "AveragePool", {"x": f(1, 3, 9, 9)},
        attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1})
    add("global_avg", "GlobalAveragePool", {"x": f(2, 3, 5, 6)})
    add("global_max", "GlobalMaxPool", {"x": f(2, 3, 5, 6)})
    # data movement
    add("reshape", "Reshape", {"x": f(2, 3, 4)}, {"s": np.array([0, -1, 2], np.int64)})
    add("transpose", "Transpose", {"x": f(2, 3, 4)}, attrs={"perm": [2, 0, 1]})
    add("concat", "Concat", {"a": f(2, 3), "b": f(2, 5)}, attrs={"axis": 1})
    add("split", "Split", {"x": f(6, 4)}, {"s": np.array([2, 4], np.int64)}, {"axis": 0}, n_out=2)
    add("flatten", "Flatten", {"x": f(2, 3, 4, 5)}, attrs={"axis": 2})
    add("squeeze_v13", "Squeeze", {"x": f(3, 1, 4, 1)}, {"a": np.array([1], np.int64)})
    add("squeeze_v11", "Squeeze", {"x": f(3, 1, 4, 1)}, attrs={"axes": [3]}, opset=11)
    add("unsqueeze", "Unsqueeze", {"x": f(3, 4)}, {"a": np.array([0, 3], np.int64)})
    add("slice", "Slice", {"x": f(6, 8)}, {"st": np.array([1, -1], np.int64), "en": np.array([5, -8], np.int64),
                                          "ax": np.array([0, 1], np.int64), "sp": np.array([2, -2], np.int64)})
    add("gather", "Gather", {"x": f(5, 4)}, {"i": np.array([[0, -1], [3, 2]], np.int64)}, {"axis": 0})
    add("shape", "Shape", {"x": f(2, 3, 4)})
    add("shape_slice", "Shape", {"x": f(2, 3, 4)}, attrs={"start": 1}, opset=15)
    add("expand", "Expand", {"x": f(3, 1)}, {"s": np.array([2, 3, 4], np.int64)})
    add("tile", "Tile", {"x": f(2, 3)}, {"r": np.array([2, 3], np.int64)})
    add("pad_const", "Pad", {"x": f(1, 2, 3, 4)}, {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
                                                  "v": np.array(0.5, np.float32)})
    add("pad_reflect", "Pad", {"x": f(1, 2, 4, 5)}, {"p": np.array([0, 0, 2, 1, 0, 0, 1, 2], np.int64)},
        {"mode": "reflect"})
    add("pad_edge", "Pad", {"x": f(1, 2, 4, 5)}, {"p": np.array([0, 0, 2, 1, 0, 0, 1, 2], np.int64)},
        {"mode": "edge"})
    add("d2s_dcr", "DepthToSpace", {"x": f(1, 8, 3, 4)}, attrs={"blocksize": 2})
    add("d2s_crd", "DepthToSpace", {"x": f(1, 18, 3, 4)}, attrs={"blocksize": 3, "mode": "CRD"})
    add("s2d", "SpaceToDepth", {"x": f(1, 2, 6, 4)}, attrs={"blocksize": 2})
    add("const_of_shape", "ConstantOfShape", {}, {"s": np.array([2, 3], np.int64)},
        {"value": numpy_helper.from_array(np.array([1.5], np.float32))})
    # resampling
    for mode, ctm in (("nearest", "asymmetric"), ("nearest", "half_pixel"), ("linear", "half_pixel"),
                      ("linear", "align_corners"), ("linear", "pytorch_half_pixel"), ("cubic", "half_pixel"),
                      ("cubic", "asymmetric")):
        add(f"resize_{mode}_{ctm}", "Resize", {"x": f(1, 2, 5, 6)},
            {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2.0, 1.5], np.float32)},
            {"mode": mode, "coordinate_transformation_mode": ctm})
    add("resize_sizes_linear", "Resize", {"x": f(1, 2, 7, 6)},
        {"roi": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": np.array([1, 2, 4, 9], np.int64)},
        {"mode": "linear"})
    add("resize_down_cubic_excl", "Resize", {"x": f(1, 1, 9, 8)},
        {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 0.5, 0.75], np.float32)},
        {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5})
    return c
