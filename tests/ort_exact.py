"""ONNX Runtime as an exact oracle for integer products on every x86 CPU.

ORT's u8 x s8 kernels on x86 without VNNI (AVX2 only) add pairs of products in saturating
16-bit lanes (vpmaddubsw), so with full-range int8 weights its results are not the exact ones
there: on an AVX2-only VM a QLinearConv had 128 of 270 outputs off by up to 17, MatMulInteger,
QGemm, DynamicQuantizeMatMul, QAttention and the quantized LSTM likewise, while on a VNNI
machine the same tests pass. Its u8 x u8 kernels widen to 16 bits first and are exact.

`u8_weights(model, feeds)` is the same computation with every int8 weight of a u8 x s8
integer product as uint8 (w + 128) and its zero point + 128 (an absent one becomes 128): the
same integers, so the same outputs, computed exactly by ORT on any machine (s8 x s8 products,
which do not saturate, are left as they are). Tests give ORT that
form and npurun the original, so npurun's int8 paths are still what is tested.
"""
from __future__ import annotations

import copy

import numpy as np
from onnx import TensorProto, helper, numpy_helper, shape_inference

MS = "com.microsoft"
# (domain, op) -> [(weight input index, its zero point's input index)]; the activation is input 0
# (float in the dynamically quantizing ops, which quantize it to uint8)
WEIGHTS = {
    ("", "MatMulInteger"): [(1, 3)], ("", "ConvInteger"): [(1, 3)],
    ("", "QLinearConv"): [(3, 5)], ("", "QLinearMatMul"): [(3, 5)],
    (MS, "MatMulIntegerToFloat"): [(1, 5)], (MS, "DynamicQuantizeMatMul"): [(1, 3)],
    (MS, "QGemm"): [(3, 5)], (MS, "QAttention"): [(1, 7)],
    (MS, "DynamicQuantizeLSTM"): [(1, 9), (2, 11)],
}


def _u8(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.int16) + 128).astype(np.uint8)


def u8_weights(model, feeds: dict | None = None):
    """(model, feeds) with the int8 weights of integer products (initializers or graph
    inputs) and their zero points moved to uint8; other values unchanged."""
    m = copy.deepcopy(model)
    g = m.graph
    feeds = dict(feeds or {})
    inits = {t.name: t for t in g.initializer}
    inputs = {v.name: v for v in g.input}
    done: dict[str, str] = {}  # int8 value -> its uint8 form
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(shape_inference.infer_shapes(m).graph.value_info) + list(g.input)}
    types.update({t.name: t.data_type for t in g.initializer})
    producer = {o: n for n in g.node for o in n.output}

    def elem_type(name):
        """A value's element type; for one that shape inference could not type (the output of
        a com.microsoft QLinear* op), that of its producer's output zero point: the last 8-bit
        constant among its inputs."""
        if types.get(name):
            return types[name]
        p = producer.get(name)
        if p is None:
            return None
        if p.op_type == "DynamicQuantizeLinear":
            return TensorProto.UINT8
        eight = [types.get(x) for x in p.input if x in inits and types.get(x) in (TensorProto.INT8, TensorProto.UINT8)]
        return eight[-1] if eight else None

    def is_s8(name):
        if name in inits:
            return inits[name].data_type == TensorProto.INT8
        if name in inputs:
            return inputs[name].type.tensor_type.elem_type == TensorProto.INT8
        return False

    def convert(name):
        if name in done:
            return done[name]
        new = f"{name}__u8"
        if name in inits:
            g.initializer.append(numpy_helper.from_array(_u8(numpy_helper.to_array(inits[name])), new))
        else:  # a graph input: its feed moves too
            v = copy.deepcopy(inputs[name])
            v.name = new
            v.type.tensor_type.elem_type = TensorProto.UINT8
            g.input.append(v)
            feeds[new] = _u8(feeds.pop(name))
        done[name] = new
        return new

    for node in g.node:
        for wi, zi in WEIGHTS.get((node.domain or "", node.op_type), []):
            if wi >= len(node.input) or not is_s8(node.input[wi]):
                continue
            if elem_type(node.input[0]) not in (TensorProto.UINT8, TensorProto.FLOAT):
                continue  # only u8 x s8 saturates (and ORT has no s8 x u8 kernels)
            zp = node.input[zi] if zi < len(node.input) else ""
            if zp and not is_s8(zp):
                continue  # a zero point we cannot move with it: leave this weight as it is
            node.input[wi] = convert(node.input[wi])
            if zp:
                node.input[zi] = convert(zp)
            else:
                while len(node.input) <= zi:
                    node.input.append("")
                name = f"{node.input[wi]}__zp128"
                if name not in inits:
                    g.initializer.append(helper.make_tensor(name, TensorProto.UINT8, [], [128]))
                    inits[name] = g.initializer[-1]
                node.input[zi] = name
    # graph inputs that only the converted nodes read are dropped with their feeds
    read = {x for n in g.node for x in n.input}
    for name in list(done):
        if name in inputs and name not in read:
            g.input.remove(inputs[name])
            feeds.pop(name, None)
    return m, feeds
