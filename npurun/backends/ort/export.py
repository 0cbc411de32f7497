"""NPU-IR back to ONNX: a graph (or a run of its nodes) as an ONNX model ONNX Runtime loads.

IR ops keep ONNX semantics under snake-case names, so a node exports as the ONNX op of the
same name with the attributes the op's ONNX schema declares (dtype attributes as ONNX
element types). Precision suffixes export explicitly:

* `f16` / `bf16`: Cast the float operands in, run the op, Cast the results back;
* `i8` (matmul, conv with a constant weight): QDQ form. The weight is stored int8 per output
  channel with a DequantizeLinear; the activation goes through DynamicQuantizeLinear ->
  DequantizeLinear (uint8, per tensor). ONNX Runtime fuses such pairs into integer kernels
  where its provider has them.

The opset is the newest any exported node needs, at least `BASE_OPSET`.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...frontend.onnx.dtypes import TO_ONNX
from ...ir.dtypes import DTYPES
from ...ir.ops import OPS

BASE_OPSET = 21
MAX_OPSET = 24  # newest opset whose ops ONNX Runtime 1.32's CPU provider implements fully

# IR op -> ONNX op where the CamelCase of the IR name is not the ONNX name.
SPECIAL = {
    "arg_max": "ArgMax", "arg_min": "ArgMin", "is_nan": "IsNaN", "is_inf": "IsInf",
    "matmul": "MatMul", "matmul_integer": "MatMulInteger", "qlinear_matmul": "QLinearMatMul",
    "gather_nd": "GatherND", "scatter_nd": "ScatterND", "top_k": "TopK", "prelu": "PRelu",
    "lrn": "LRN", "gru": "GRU", "lstm": "LSTM", "rnn": "RNN", "dft": "DFT", "stft": "STFT",
    "max_roi_pool": "MaxRoiPool", "tfidf_vectorizer": "TfIdfVectorizer", "cum_sum": "CumSum",
    "cum_prod": "CumProd", "reduce_l1": "ReduceL1", "reduce_l2": "ReduceL2",
    "col2im": "Col2Im", "non_zero": "NonZero", "rms_normalization": "RMSNormalization",
    "bitcast": "BitCast", "hard_swish": "HardSwish",
}
NOT_EXPORTED = {"optional", "image_decoder"}  # type-valued attributes, files


def onnx_op(op: str) -> str:
    return SPECIAL.get(op) or "".join(p.capitalize() for p in op.split("_"))


def schema(op: str, opset: int = MAX_OPSET):
    """The ONNX schema `op` exports to at `opset`, or None."""
    name = onnx_op(op)
    if not onnx.defs.has(name):
        return None
    try:
        return onnx.defs.get_schema(name, opset)
    except onnx.defs.SchemaError:
        return None


def exportable(node) -> str | None:
    """None when the node exports; else why not."""
    if node.op in NOT_EXPORTED:
        return f"{node.op} is not exported to ONNX"
    if "random" in OPS[node.op].groups:  # (ir/ops/random.py)
        return (f"{node.op} draws npurun's random stream on every backend (ONNX Runtime's "
                f"generator gives other values for the same seed)")
    s = schema(node.op)
    if s is None:
        return f"ONNX (up to opset {MAX_OPSET}) has no op {onnx_op(node.op)}"
    declared = OPS[node.op].attrs
    for k, v in node.attrs.items():
        if k not in s.attributes and v not in (None, "", [], 0) and v != declared.get(k):
            return f"attribute {k}={v!r} has no counterpart in ONNX {s.name}-{s.since_version}"
    return None


def _attr_value(k, v, a):
    if a.type == onnx.AttributeProto.INT and isinstance(v, str) and v in DTYPES:
        return TO_ONNX[v]
    if a.type == onnx.AttributeProto.INT and isinstance(v, bool):
        return int(v)
    return v


def _type(v, shape=True):
    """The ONNX type of an IR value: element type and shape (symbols as dim_params). Outputs
    leave their shape to ONNX Runtime (`shape=False`)."""
    dims = None if v.shape is None else \
        [d if isinstance(d, int) else (None if d in (None, "?") else str(d)) for d in v.shape]
    t = helper.make_tensor_type_proto(TO_ONNX[v.dtype], dims if shape else None)  # (None: unknown rank)
    if v.kind == "seq":
        return helper.make_sequence_type_proto(t)
    if v.kind == "opt":
        return helper.make_optional_type_proto(t)
    if v.kind == "opt seq":
        return helper.make_optional_type_proto(helper.make_sequence_type_proto(t))
    return t


def _initializer(name, data):
    return numpy_helper.from_array(np.asarray(data), name)


class _Exporter:
    def __init__(self, graph):
        self.graph = graph
        self.opset = BASE_OPSET
        self.count = 0

    def fresh(self, hint):
        self.count += 1
        return f"__npurun_{hint}_{self.count}"

    def nodes(self, nodes, values) -> tuple[list, list]:
        """(ONNX nodes, extra initializers) for IR nodes reading `values` (name -> Value)."""
        out, inits = [], []
        for n in nodes:
            self.opset = max(self.opset, schema(n.op).since_version)
            if n.precision in ("f16", "bf16"):
                out += self._cast_around(n, values)
            elif n.precision == "i8":
                o, i = self._qdq(n, values)
                out += o
                inits += i
            else:
                out.append(self._node(n, n.inputs, n.outputs))
        return out, inits

    def _node(self, n, inputs, outputs):
        s = schema(n.op)
        attrs = {}
        for k, v in OPS[n.op].attrs_of(n).items():
            if k not in s.attributes or v is None or (isinstance(v, str) and v == "" and k != "delimiter"):
                continue
            attrs[k] = _attr_value(k, v, s.attributes[k])
        if n.op == "constant_of_shape":  # IR: a number and a dtype; ONNX: a one-element tensor
            dt = OPS[n.op].attrs_of(n)["dtype"]
            attrs = {"value": helper.make_tensor("value", TO_ONNX[dt], [1], [n.attrs.get("value", 0.0)])}
        for k, r in n.regions.items():
            attrs[k] = self.subgraph(r, f"{n.name or n.op}_{k}")
        # Attributes with an empty list need their declared type.
        proto = helper.make_node(onnx_op(n.op), list(inputs), list(outputs), name=n.name or None)
        for k, v in attrs.items():
            if isinstance(v, list) and not v:
                proto.attribute.append(helper.make_attribute(k, v, attr_type=s.attributes[k].type))
            else:
                proto.attribute.append(helper.make_attribute(k, v))
        return proto

    def _cast_around(self, n, values):
        to = TensorProto.FLOAT16 if n.precision == "f16" else TensorProto.BFLOAT16
        nodes, ins, outs = [], [], []
        for i in n.inputs:
            if i and values[i].dtype in ("f32", "f64"):
                c = self.fresh("in")
                nodes.append(helper.make_node("Cast", [i], [c], to=to))
                ins.append(c)
            else:
                ins.append(i)
        back = []
        for o in n.outputs:
            if values[o].dtype in ("f32", "f64"):
                c = self.fresh("out")
                outs.append(c)
                back.append(helper.make_node("Cast", [c], [o], to=TO_ONNX[values[o].dtype]))
            else:
                outs.append(o)
        return nodes + [self._node(n, ins, outs)] + back

    def _qdq(self, n, values):
        x, w = n.inputs[0], n.inputs[1]
        wdata = values[w].data.astype(np.float32)
        axis = 1 if n.op == "matmul" else 0  # per output channel: matmul (K, N), conv (M, C, ...)
        red = tuple(d for d in range(wdata.ndim) if d != axis)
        sw = np.maximum(np.abs(wdata).max(axis=red), 1e-12) / 127.0
        shape = [1] * wdata.ndim
        shape[axis] = -1
        qw = np.clip(np.round(wdata / sw.reshape(shape)), -127, 127).astype(np.int8)
        qn, sn, zn = self.fresh("wq"), self.fresh("ws"), self.fresh("wz")
        inits = [_initializer(qn, qw), _initializer(sn, sw.astype(np.float32)),
                 _initializer(zn, np.zeros(sw.shape, np.int8))]
        xq, xs, xz, xd, wd = (self.fresh(h) for h in ("xq", "xs", "xz", "xd", "wd"))
        nodes = [helper.make_node("DynamicQuantizeLinear", [x], [xq, xs, xz]),
                 helper.make_node("DequantizeLinear", [xq, xs, xz], [xd]),
                 helper.make_node("DequantizeLinear", [qn, sn, zn], [wd], axis=axis)]
        nodes.append(self._node(n, [xd, wd] + list(n.inputs[2:]), n.outputs))
        return nodes, inits

    def subgraph(self, g, name):
        nodes, inits = self.nodes(g.nodes, g.values)
        inits += [_initializer(v.name, v.data) for v in g.constants()]
        return helper.make_graph(nodes, name, [helper.make_value_info(i, _type(g.values[i])) for i in g.inputs],
                                 [helper.make_value_info(o, _type(g.values[o], False)) for o in g.outputs], inits)


def export(graph, nodes=None, inputs=None, outputs=None, name=None) -> onnx.ModelProto:
    """`graph` (or its `nodes`, reading `inputs` and producing `outputs`) as an ONNX model."""
    nodes = graph.nodes if nodes is None else nodes
    inputs = graph.inputs if inputs is None else inputs
    outputs = graph.outputs if outputs is None else outputs
    ex = _Exporter(graph)
    onnx_nodes, inits = ex.nodes(nodes, graph.values)
    used = {i for n in nodes for i in n.inputs if i} | {c for n in nodes for r in n.regions.values()
                                                        for c in r.captures()}
    inits += [_initializer(v.name, v.data) for v in graph.constants() if v.name in used]
    g = helper.make_graph(onnx_nodes, name or graph.name,
                          [helper.make_value_info(i, _type(graph.values[i])) for i in inputs],
                          [helper.make_value_info(o, _type(graph.values[o], False)) for o in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", ex.opset)], ir_version=10,
                             producer_name="npurun")
