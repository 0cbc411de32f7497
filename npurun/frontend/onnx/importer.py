"""onnx2npu: read an ONNX file, check it, and convert it node by node into NPU-IR.

Shapes and dtypes come from npurun's own inference (`npurun.ir.ops`); the shapes a model
declares for its intermediate and output values are ignored, since real models get them
wrong. Every op the importer cannot take is reported at once, in one error.
"""
from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from ...errors import ModelError, VerifyError
from ...ir.graph import Graph, Value
from ...ir.ops.shape import MAX_RANK
from ...ir.shapes import SYMBOL, UNKNOWN
from ...ir.verify import verify
from . import wire
from .context import ConvertError, Ctx
from .converters import find
from .dtypes import ir_dtype

MAX_ELEMENTS = 1 << 34  # no real tensor has more; refuse before trying to allocate it
_ONNX_DOMAINS = ("", "ai.onnx")


def load_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    """Parse an ONNX file (and its external data), turning every failure into a ModelError."""
    return _read(path, weights=False)[0]


def _read(path, weights: bool) -> tuple[onnx.ModelProto, dict]:
    """The parsed model, and with `weights` its main graph's plain initializers read straight
    into arrays ({index: Stored}; see wire.py) instead of into the message."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such file")
    arrays: dict = {}
    try:
        model = None
        if weights:
            try:
                model, arrays = wire.read(path)
            except (wire.WireError, DecodeError, OSError, ValueError):
                model = None  # not what wire.py reads: protobuf's full parse gives the verdict
        if model is None:
            model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: not a valid ONNX model (protobuf parse failed: {e})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelError(f"{path}: not a valid ONNX model (it has no graph)")
    _check_tensors(model, path)
    try:
        from onnx.external_data_helper import load_external_data_for_model
        load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError, RuntimeError, onnx.checker.ValidationError) as e:
        # (RuntimeError: onnx's C++ path checks, e.g. "File name too long")
        raise ModelError(f"{path}: cannot load external weights ({e})") from None
    return model, arrays


def _check_tensors(model: onnx.ModelProto, path) -> None:
    """Refuse tensors whose declared size is absurd or larger than the bytes they carry."""
    for t in model.graph.initializer:
        n = math.prod(t.dims) if t.dims else 1
        if any(d < 0 for d in t.dims) or n > MAX_ELEMENTS:
            raise ModelError(f"{path}: initializer {t.name!r} claims shape {list(t.dims)} "
                             f"({n} elements); refusing to allocate it")
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if t.HasField("raw_data") and t.data_type != onnx.TensorProto.STRING:
            try:
                need = _raw_bytes(t.data_type, n)
            except ModelError as e:
                raise ModelError(f"{path}: initializer {t.name!r}: {e}") from None
            if len(t.raw_data) != need:  # (a copy of the bytes, for the tensors wire.py left)
                raise ModelError(f"{path}: initializer {t.name!r} claims shape {list(t.dims)} "
                                 f"({need} bytes) but holds {len(t.raw_data)} bytes")


_PACKED = {onnx.TensorProto.INT4: 2, onnx.TensorProto.UINT4: 2, onnx.TensorProto.FLOAT4E2M1: 2}
for _t in ("INT2", "UINT2"):
    if hasattr(onnx.TensorProto, _t):
        _PACKED[getattr(onnx.TensorProto, _t)] = 4


def _raw_bytes(data_type: int, n: int) -> int:
    """Bytes of raw data n elements take: sub-byte types pack 2 or 4 to a byte."""
    per = _PACKED.get(data_type)
    if per:
        return -(-n // per)
    try:
        return n * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except KeyError:
        raise ModelError(f"element type {data_type} is not an ONNX tensor type") from None


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    """Opset version per domain ("" stands for ai.onnx)."""
    out = {"": 1}
    for o in model.opset_import:
        out["" if o.domain in _ONNX_DOMAINS else o.domain] = o.version
    return out


def _symbol(param: str, table: dict) -> str:
    """ONNX dim_param -> an IR symbol ('batch size' becomes d0, d1, ...; a placeholder such as
    '?' or '-1' names no dimension and stays unknown)."""
    if SYMBOL.match(param):
        return param
    if not any(c.isalpha() for c in param):
        return UNKNOWN
    return table.setdefault(param, f"d{len(table)}")


def _value_type(vi, where: str, syms: dict, top: bool = True) -> tuple | None:
    """(shape, dtype, kind) of a graph input; None when a subgraph leaves it untyped (the
    control-flow converter then supplies it)."""
    t, kind = vi.type, "tensor"
    if t.HasField("optional_type"):
        t, kind = t.optional_type.elem_type, "opt"
    if t.HasField("sequence_type"):
        t, kind = t.sequence_type.elem_type, ("opt seq" if kind == "opt" else "seq")
    if not t.HasField("tensor_type"):
        if t.WhichOneof("value") is None and not top:
            return None
        raise ModelError(f"{where}: input {vi.name!r} is a {t.WhichOneof('value') or 'value of no type'}; "
                         f"tensors, sequences and optionals are supported")
    tt = t.tensor_type
    dtype = ir_dtype(tt.elem_type, f"{where}: input {vi.name!r}")
    if not tt.HasField("shape"):
        if top and kind == "tensor":
            raise ModelError(f"{where}: input {vi.name!r} has no declared rank")
        return None, dtype, kind  # a subgraph's input of unknown rank
    if len(tt.shape.dim) > MAX_RANK:
        raise ModelError(f"{where}: input {vi.name!r} has rank {len(tt.shape.dim)}; at most {MAX_RANK} dims are supported")
    shape = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:  # exporters write -1 for "dynamic"
            if d.dim_value > MAX_ELEMENTS:
                raise ModelError(f"{where}: input {vi.name!r} has an absurd dimension {d.dim_value}")
            shape.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            if isinstance(d.dim_param, bytes):  # (protobuf's bytes for invalid UTF-8: see _check_names)
                raise ModelError(f"{where}: input {vi.name!r}: dimension name {d.dim_param!r} is not valid UTF-8")
            shape.append(_symbol(d.dim_param, syms))
        else:
            shape.append(UNKNOWN)
    return tuple(shape), dtype, kind


def _topological(nodes, available: set, where: str):
    """Nodes in dependency order; a ModelError names dangling inputs and cycles."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    missing = defaultdict(list)
    for n in nodes:
        for i in n.input:
            if i and i not in available and i not in producer:
                missing[i].append(n.name or n.op_type)
    if missing:
        items = "; ".join(f"{k!r} (read by {', '.join(v)})" for k, v in missing.items())
        raise ModelError(f"{where}: dangling inputs, never produced nor declared: {items}")
    order, state = [], [0] * len(nodes)  # 0 new, 1 on stack, 2 done
    for root in range(len(nodes)):
        stack = [(root, iter(nodes[root].input))]
        if state[root]:
            continue
        state[root] = 1
        while stack:
            idx, it = stack[-1]
            nxt = next((producer[i] for i in it if i in producer and i not in available), None)
            if nxt is None:
                state[idx] = 2
                order.append(nodes[idx])
                stack.pop()
            elif state[nxt] == 1:
                cyc = [nodes[j].name or nodes[j].op_type for j, _ in stack]
                raise ModelError(f"{where}: the graph has a cycle through nodes {', '.join(cyc)}")
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(nodes[nxt].input)))
    return order


def _attrs(node, where: str) -> dict:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        try:
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, onnx.TensorProto):
                v = numpy_helper.to_array(v)
            elif isinstance(v, list):
                v = [x.decode() if isinstance(x, bytes) else x for x in v]
        except UnicodeDecodeError:
            raise ModelError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}): attribute "
                             f"{a.name!r} holds a string that is not UTF-8") from None
        except (ValueError, TypeError) as e:  # a tensor whose data does not fill its dims
            raise ModelError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}): attribute "
                             f"{a.name!r} holds a tensor that cannot be read ({e})") from None
        out[a.name] = v
    return out


def _check_names(g, where: str) -> None:
    """Every name (graph, node, op, domain, value) must be text. protobuf hands a string field
    holding invalid UTF-8 back as bytes, which no later step expects."""
    def bad(field, x):
        raise ModelError(f"{where}: {field} {x!r} is not valid UTF-8")
    if isinstance(g.name, bytes):
        bad("graph name", g.name)
    for coll in (g.input, g.output, g.value_info, g.initializer):
        for v in coll:
            if isinstance(v.name, bytes):
                bad("value name", v.name)
    for n in g.node:
        for field in ("name", "op_type", "domain"):
            if isinstance(getattr(n, field), bytes):
                bad(f"node {field}", getattr(n, field))
        for x in list(n.input) + list(n.output):
            if isinstance(x, bytes):
                bad(f"node {n.name or n.op_type!r}: operand name", x)
        for a in n.attribute:
            if isinstance(a.name, bytes):
                bad(f"node {n.name or n.op_type!r}: attribute name", a.name)
        for sub in _subgraphs(n):
            _check_names(sub, where)


def _schema_attr_types(op: str, domain: str, opset: int) -> tuple[dict, list]:
    """({attribute name: the AttributeProto type ONNX's schema declares}, [required names]);
    ({}, []) when the op has no schema here (a custom domain)."""
    key = (op, domain, opset)
    if key not in _ATTR_TYPES:
        try:
            s = onnx.defs.get_schema(op, opset, domain)
            _ATTR_TYPES[key] = ({k: int(a.type) for k, a in s.attributes.items()},
                                sorted(k for k, a in s.attributes.items() if a.required))
        except onnx.defs.SchemaError:
            _ATTR_TYPES[key] = ({}, [])
    return _ATTR_TYPES[key]


_ATTR_TYPES: dict = {}


def _check_attr_types(node, domain: str, opset: int, where: str) -> None:
    """Refuse an attribute of another type than ONNX declares (`pads` given as one INT instead
    of INTS): the converters and shape rules may then rely on the declared form."""
    want, required = _schema_attr_types(node.op_type, domain, opset)
    missing = [k for k in required if k not in {a.name for a in node.attribute}]
    if missing:
        raise ModelError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}): missing required "
                         f"attribute(s) {', '.join(map(repr, missing))}")
    for a in node.attribute:
        t = want.get(a.name)
        if want and t is None:  # as ONNX Runtime refuses it: no converter reads what opset lacks
            raise ModelError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}): attribute {a.name!r} "
                             f"is not one of {node.op_type}-{opset}'s ({', '.join(sorted(want)) or 'none'})")
        if t is not None and a.type != t:
            got = onnx.AttributeProto.AttributeType.Name(a.type) if a.type in onnx.AttributeProto.AttributeType.values() else a.type
            raise ModelError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}): attribute {a.name!r} "
                             f"is {got}, ONNX declares {onnx.AttributeProto.AttributeType.Name(t)}")


def _report_unsupported(where: str, problems: dict) -> None:
    lines = []
    for (op, domain, opset, reason), names in problems.items():
        shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
        lines.append(f"{op} (domain {domain or 'ai.onnx'}, opset {opset}) x{len(names)}: "
                     f"{reason} [nodes: {shown}]")
    raise ModelError(f"{where}: {len(lines)} unsupported op kind(s): " + " | ".join(lines))


def _no_converter(domain: str) -> str:
    """The reason for an op nothing converts; a custom domain's op can be registered."""
    if domain and not domain.startswith("ai.onnx"):
        return "no converter (npurun.register_op adds ops of any domain: docs/adding-ops.md)"
    return "no converter"


def _subgraphs(node):
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


class _Importer:
    """One model's conversion: the opsets it imports, where it came from, symbol names."""

    def __init__(self, model: onnx.ModelProto, where: str, weights: dict | None = None):
        self.model, self.where = model, where
        self.weights = weights or {}  # main graph's initializers read by wire.py, by index
        self.opsets = _opsets(model)
        self.syms: dict = {}

    def converter_of(self, n):
        domain = "" if n.domain in _ONNX_DOMAINS else n.domain
        return find(n.op_type, self.opsets.get(domain, 1), domain), domain

    def check_supported(self, og) -> None:
        """Every node without a converter, subgraphs included, in one error."""
        problems: dict = defaultdict(list)

        def walk(graph):
            for n in graph.node:
                fn, domain = self.converter_of(n)
                if fn is None:
                    problems[(n.op_type, domain, self.opsets.get(domain, 1), _no_converter(domain))].append(n.name or n.op_type)
                for sub in _subgraphs(n):
                    walk(sub)
        walk(og)
        if problems:
            _report_unsupported(self.where, problems)

    def convert(self, og, name: str, outer: dict | None = None, input_types: list | None = None) -> Graph:
        """One ONNX graph -> one IR graph. For a region, `outer` holds the enclosing graphs'
        values (which it may read) and `input_types` the types its owner gives its inputs."""
        where = self.where
        g = Graph(name=re.sub(r"[^A-Za-z0-9_.\-/]", "_", name) or "main", source=where)
        read = self.weights if outer is None else {}  # (regions are never the main graph)
        for k, t in enumerate(og.initializer):
            try:
                g.const(t.name, read[k] if k in read else numpy_helper.to_array(t))
            except (ValueError, TypeError) as e:
                raise ModelError(f"{where}: initializer {t.name!r} cannot be read ({e})") from None
        for k, vi in enumerate(og.input):
            if vi.name in g.values and outer is None:
                continue  # old exporters list initializers among the inputs too
            typ = _value_type(vi, where, self.syms, top=outer is None)
            if (typ is None or typ[0] is None) and input_types and k < len(input_types):
                typ = input_types[k]
            if typ is None:
                raise ModelError(f"{where}: subgraph {name!r} input {vi.name!r} has no type")
            g.add_value(Value(vi.name, typ[0], typ[1], kind=typ[2]))
            g.inputs.append(vi.name)

        outer = outer or {}
        nodes = _topological(list(og.node), set(g.values) | set(outer), where)
        ctx = Ctx(g, self.opsets[""])
        ctx.region_of = lambda proto, types, nm: self.convert(proto, nm, {**outer, **g.values}, types)
        problems: dict = defaultdict(list)
        for n in nodes:
            for i in n.input:  # a region reads enclosing values by name: declare them here
                if i and i not in g.values and i in outer:
                    v = outer[i]
                    # A constant is declared a constant here too, sharing the enclosing graph's
                    # array or stored weight (not a copy): folding sees through the region's
                    # edge, and a backend lowers a branch's Gemm by a weight as it does the
                    # graph's (openWakeWord's verifier MLP inside an `if` ran the reference Gemm).
                    g.add_value(Value(v.name, v.shape, v.dtype, v.space, kind=v.kind, stored=v.stored))
            fn, domain = self.converter_of(n)
            ctx.opset = self.opsets.get(domain, 1)
            _check_attr_types(n, domain, ctx.opset, where)
            ctx.node, ctx.attrs = n, _attrs(n, where)
            try:
                fn(ctx)
            except ConvertError as e:
                problems[(n.op_type, domain, ctx.opset, str(e))].append(n.name or n.op_type)
            except VerifyError as e:
                raise ModelError(f"{where}: {e}") from None
            except KeyError as e:
                raise ModelError(f"{where}: node {n.name or n.op_type!r} ({n.op_type}): missing "
                                 f"attribute or input {e}") from None
            except (TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as e:
                # A malformed node that a converter or shape rule did not foresee: named, like a
                # kernel failure at run time (backends/base.py), never a bare traceback.
                raise ModelError(f"{where}: node {n.name or n.op_type!r} ({n.op_type}) cannot be converted "
                                 f"(internal error {type(e).__name__}: {e})") from e
        if problems:
            _report_unsupported(where, problems)

        for vi in og.output:
            if vi.name not in g.values and vi.name in outer:  # a region passing on a capture
                v = outer[vi.name]
                g.add_value(Value(v.name, v.shape, v.dtype, v.space, kind=v.kind))
            if vi.name not in g.values:
                raise ModelError(f"{where}: graph output {vi.name!r} is never produced")
            # An output may be an input or a constant (perhaps folded): it keeps its name.
            g.outputs.append(vi.name)
        _drop_unused(g)
        return g


def import_model(model: onnx.ModelProto | str | os.PathLike, *, name: str | None = None) -> Graph:
    """Convert an ONNX model (a ModelProto or a path) into a verified NPU-IR graph."""
    where, weights = "<onnx model>", None
    if not isinstance(model, onnx.ModelProto):
        where = str(model)
        model, weights = _read(model, weights=True)
    _check_names(model.graph, where)
    for o in model.opset_import:
        if isinstance(o.domain, bytes):
            raise ModelError(f"{where}: opset domain {o.domain!r} is not valid UTF-8")
    imp = _Importer(model, where, weights)
    imp.check_supported(model.graph)
    return verify(imp.convert(model.graph, name or model.graph.name or "main"))


def _drop_unused(g: Graph) -> None:
    """Constants no node reads (e.g. initializers listed but unused) are not part of the model."""
    used = {i for n in g.nodes for i in n.inputs} | set(g.outputs) | set(g.inputs)
    used |= {c for n in g.nodes for r in n.regions.values() for c in r.captures()}
    for nm in [nm for nm, v in g.values.items() if v.is_const and nm not in used]:
        del g.values[nm]
