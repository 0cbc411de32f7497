"""The Open Inference Protocol (KServe v2) on the wire: request parsing and response encoding.

A request body is a JSON header, optionally followed by raw tensor bytes (the *binary tensor
extension*): the `Inference-Header-Content-Length` HTTP header says where the JSON ends, and
each input with `parameters.binary_data_size = n` takes the next n bytes, in input order.

    {"id": "7", "parameters": {"priority": 1, "timeout": 500000, "binary_data_output": true},
     "inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [...]}          # JSON
                {"name": "y", "shape": [2], "datatype": "INT64",
                 "parameters": {"binary_data_size": 16}}                                  # binary
                {"name": "z", "shape": [4], "datatype": "FP32",
                 "parameters": {"shared_memory_region": "in0", "shared_memory_byte_size": 16}}],
     "outputs": [{"name": "p", "parameters": {"binary_data": true}}]}

Outputs go back as JSON `data`, as binary after the JSON header (`binary_data_size` in their
parameters, same header), or into a registered shared-memory region. Request parameters
follow Triton: `priority` 0 = the model's default, 1 = highest; `timeout` in microseconds.
npurun's priorities are 0 (highest) .. 3, so Triton priority k runs at npurun priority k - 1.

Every malformed request raises ServeError with the HTTP status it deserves (400, 413); the
message names the input or field and what was expected.
"""
from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

from ..errors import NpurunError
from ..ir.dtypes import to_numpy

# KServe v2 datatype <-> NPU-IR dtype. BF16 travels only as binary data (as in Triton).
KSERVE_TO_IR = {"BOOL": "bool", "UINT8": "u8", "UINT16": "u16", "UINT32": "u32", "UINT64": "u64",
                "INT8": "i8", "INT16": "i16", "INT32": "i32", "INT64": "i64",
                "FP16": "f16", "FP32": "f32", "FP64": "f64", "BF16": "bf16", "BYTES": "str"}
IR_TO_KSERVE = {v: k for k, v in KSERVE_TO_IR.items()}
PRIORITY_LEVELS = 4  # Triton priorities 1..4 -> npurun 0..3
# The protocol's binary tensors are little-endian; arrays go on the wire in the host's order.
assert sys.byteorder == "little", "npurun serve needs a little-endian host"


class ServeError(NpurunError):
    """A request the server refuses; `status` is the HTTP status it answers with."""

    def __init__(self, status: int, msg: str):
        self.status = status
        super().__init__(msg)


def kserve_datatype(ir_dtype: str) -> str | None:
    return IR_TO_KSERVE.get(ir_dtype)


@dataclass
class OutputSpec:
    """How one output goes back: binary or JSON, or into a shared-memory region."""
    name: str
    binary: bool
    region: str | None = None
    region_offset: int = 0
    region_size: int = 0


@dataclass
class InferRequest:
    id: str | None
    feeds: dict[str, np.ndarray]
    outputs: list[OutputSpec]
    priority: int | None  # npurun priority 0..3; None = the scheduler's default
    timeout: float | None  # seconds
    params: dict = field(default_factory=dict)


@dataclass
class Limits:
    max_tensor_bytes: int = 64 << 20


# ---------------------------------------------------------------- requests

def parse_infer(body: bytes, header_length: str | None, model, shm, limits: Limits) -> InferRequest:
    """Parse an infer request for `model` (a serve.models.Model); `shm` resolves regions."""
    if header_length is not None:
        try:
            hlen = int(header_length)
        except ValueError:
            raise ServeError(400, f"Inference-Header-Content-Length {header_length!r} is not an integer") from None
        if not 0 <= hlen <= len(body):
            raise ServeError(400, f"Inference-Header-Content-Length {hlen} is outside the body's "
                                  f"{len(body)} bytes")
    else:
        hlen = len(body)
    req = loads_json(body[:hlen], "the request header")
    if not isinstance(req, dict):
        raise ServeError(400, "the request must be a JSON object with 'inputs'")
    params = _dict(req.get("parameters"), "parameters")
    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ServeError(400, "'id' must be a string")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ServeError(400, "'inputs' must be a non-empty list of tensors")
    binary = memoryview(body)[hlen:]
    feeds, pos = {}, 0
    for k, t in enumerate(inputs):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ServeError(400, f"inputs[{k}] must be an object with a 'name'")
        name = t["name"]
        if name in feeds:
            raise ServeError(400, f"input {name!r} is given twice")
        feeds[name], pos = _input(t, model, binary, pos, shm, limits)
    if pos != len(binary):
        raise ServeError(400, f"the body has {len(binary) - pos} bytes of binary data beyond what the "
                              f"inputs' binary_data_size declare")
    missing = [n for n in model.graph.inputs if n not in feeds]
    if missing:
        raise ServeError(400, f"model {model.name!r}: missing input(s) {', '.join(map(repr, missing))}")
    return InferRequest(rid, feeds, _outputs(req, params, model, shm), _priority(params), _timeout(params), params)


def loads_json(data: bytes, what: str):
    """Parsed JSON, or a 400 naming `what`. Nesting deeper than Python's recursion limit
    (~1000) is a 400 too: the decoder raises RecursionError there (a body nested 100,000 deep
    was a 500)."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServeError(400, f"{what} is not valid JSON ({e})") from None
    except RecursionError:
        raise ServeError(400, f"{what} is JSON nested too deep") from None


def _dict(x, what: str) -> dict:
    if x is None:
        return {}
    if not isinstance(x, dict):
        raise ServeError(400, f"'{what}' must be a JSON object")
    return x


def _priority(params: dict) -> int | None:
    p = params.get("priority", 0)
    if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p <= PRIORITY_LEVELS:
        raise ServeError(400, f"parameters.priority must be an integer from 0 (default) to {PRIORITY_LEVELS}, "
                              f"1 the highest; got {p!r}")
    return None if p == 0 else p - 1


def _timeout(params: dict) -> float | None:
    t = params.get("timeout")
    if t is None:
        return None
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
        raise ServeError(400, f"parameters.timeout must be a non-negative number of microseconds, got {t!r}")
    return t / 1e6 if t > 0 else None


def _shape(t: dict, name: str) -> tuple[int, ...]:
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise ServeError(400, f"input {name!r}: 'shape' must be a list of non-negative integers, got {shape!r}")
    return tuple(shape)


def _input(t: dict, model, binary: memoryview, pos: int, shm, limits: Limits):
    """One input tensor as a NumPy array; returns it and the new position in the binary part."""
    name = t["name"]
    if name not in model.graph.inputs:
        raise ServeError(400, f"model {model.name!r} has no input {name!r}; its inputs are "
                              f"{', '.join(map(repr, model.graph.inputs))}")
    want_dt = kserve_datatype(model.graph.values[name].dtype)
    dt = t.get("datatype")
    if dt != want_dt:
        raise ServeError(400, f"model {model.name!r}: input {name!r} has datatype {dt!r}, expected {want_dt!r}")
    shape = _shape(t, name)
    n = math.prod(shape)
    npdt = to_numpy(KSERVE_TO_IR[dt])
    # BYTES elements have no fixed size: bound them by count (one 4-byte length each at least).
    nbytes = n * (npdt.itemsize if dt != "BYTES" else 4)
    if nbytes > limits.max_tensor_bytes:
        raise ServeError(413, f"input {name!r} of shape {list(shape)} is {nbytes} bytes, over the server's "
                              f"limit of {limits.max_tensor_bytes} bytes per tensor")
    p = _dict(t.get("parameters"), f"input {name!r} parameters")
    region = p.get("shared_memory_region")
    if region is not None:
        if "data" in t or "binary_data_size" in p:
            raise ServeError(400, f"input {name!r}: give either shared_memory_region, binary_data_size or data")
        size = _int(p, "shared_memory_byte_size", name)
        off = _int(p, "shared_memory_offset", name, default=0)
        raw = shm.read(region, off, size)
        return _from_bytes(raw, dt, npdt, shape, name, "shared memory"), pos
    if "binary_data_size" in p:
        if "data" in t:
            raise ServeError(400, f"input {name!r}: give either binary_data_size or data, not both")
        size = _int(p, "binary_data_size", name)
        if pos + size > len(binary):
            raise ServeError(400, f"input {name!r}: binary_data_size {size} runs past the end of the body "
                                  f"({len(binary) - pos} bytes left); the body is truncated")
        return _from_bytes(binary[pos:pos + size], dt, npdt, shape, name, "binary data"), pos + size
    if "data" not in t:
        raise ServeError(400, f"input {name!r} has no 'data', binary_data_size or shared_memory_region")
    return _from_json(t["data"], dt, npdt, shape, name), pos


def _int(p: dict, key: str, name: str, default=None) -> int:
    v = p.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ServeError(400, f"input {name!r}: parameters.{key} must be a non-negative integer, got {v!r}")
    return v


def _from_bytes(raw, dt: str, npdt: np.dtype, shape: tuple, name: str, where: str) -> np.ndarray:
    n = math.prod(shape)
    if dt == "BYTES":
        items = deserialize_bytes(raw, name)
        if len(items) != n:
            raise ServeError(400, f"input {name!r}: {len(items)} BYTES elements for shape {list(shape)}")
        return np.array([s.decode("utf-8", "replace") for s in items], dtype=object).reshape(shape)
    if len(raw) != n * npdt.itemsize:
        raise ServeError(400, f"input {name!r}: {where} holds {len(raw)} bytes, shape {list(shape)} of {dt} "
                              f"needs {n * npdt.itemsize}")
    # A copy: the array outlives the request body and the shared-memory mapping.
    return np.frombuffer(raw, dtype=npdt).reshape(shape).copy()


def _from_json(data, dt: str, npdt: np.dtype, shape: tuple, name: str) -> np.ndarray:
    n = math.prod(shape)
    if dt == "BF16":
        raise ServeError(400, f"input {name!r}: BF16 tensors must be sent as binary data")
    if not isinstance(data, list):
        data = [data]
    try:
        arr = np.asarray(data, dtype=object if dt == "BYTES" else None)
    except ValueError as e:
        raise ServeError(400, f"input {name!r}: 'data' is not a regular array ({e})") from None
    if arr.size != n:
        raise ServeError(400, f"input {name!r}: 'data' has {arr.size} elements, shape {list(shape)} needs {n}")
    arr = arr.reshape(shape)
    if dt == "BYTES":
        if not all(isinstance(s, str) for s in arr.flat):
            raise ServeError(400, f"input {name!r}: BYTES data must be strings")
        return arr
    ok = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}[npdt.kind]
    if n and arr.dtype.kind not in ok:
        raise ServeError(400, f"input {name!r}: 'data' holds {arr.dtype.kind!r} values, not {dt}")
    out = arr.astype(npdt)
    if npdt.kind in "iu" and n and not np.array_equal(out, arr):
        raise ServeError(400, f"input {name!r}: 'data' holds values outside the range of {dt}")
    return out


def deserialize_bytes(raw, name: str) -> list[bytes]:
    """KServe's BYTES encoding: each element is a 4-byte little-endian length, then its bytes."""
    raw = bytes(raw)
    items, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ServeError(400, f"input {name!r}: BYTES data ends inside an element's length")
        (k,) = struct.unpack_from("<I", raw, pos)
        if pos + 4 + k > len(raw):
            raise ServeError(400, f"input {name!r}: a BYTES element of {k} bytes runs past the data")
        items.append(raw[pos + 4:pos + 4 + k])
        pos += 4 + k
    return items


def _raw(arr: np.ndarray, dt: str) -> bytes:
    """Tensor bytes on the wire: row-major, little-endian (the host's order, checked at import)."""
    return serialize_bytes(arr) if dt == "BYTES" else np.ascontiguousarray(arr).tobytes()


def serialize_bytes(arr: np.ndarray) -> bytes:
    parts = []
    for s in arr.flat:
        b = s if isinstance(s, bytes) else str(s).encode()
        parts += [struct.pack("<I", len(b)), b]
    return b"".join(parts)


def _outputs(req: dict, params: dict, model, shm) -> list[OutputSpec]:
    default_binary = params.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise ServeError(400, "parameters.binary_data_output must be true or false")
    asked = req.get("outputs")
    if asked is None:
        return [OutputSpec(n, default_binary) for n in model.graph.outputs]
    if not isinstance(asked, list):
        raise ServeError(400, "'outputs' must be a list")
    specs, seen = [], set()
    for k, o in enumerate(asked):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise ServeError(400, f"outputs[{k}] must be an object with a 'name'")
        name = o["name"]
        if name not in model.graph.outputs:
            raise ServeError(400, f"model {model.name!r} has no output {name!r}; its outputs are "
                                  f"{', '.join(map(repr, model.graph.outputs))}")
        if name in seen:
            raise ServeError(400, f"output {name!r} is requested twice")
        seen.add(name)
        p = _dict(o.get("parameters"), f"output {name!r} parameters")
        if "classification" in p:
            raise ServeError(400, f"output {name!r}: the classification extension is not supported")
        binary = p.get("binary_data", default_binary)
        if not isinstance(binary, bool):
            raise ServeError(400, f"output {name!r}: parameters.binary_data must be true or false")
        spec = OutputSpec(name, binary)
        if p.get("shared_memory_region") is not None:
            spec.region = p["shared_memory_region"]
            spec.region_size = _int(p, "shared_memory_byte_size", name)
            spec.region_offset = _int(p, "shared_memory_offset", name, default=0)
            shm.check(spec.region, spec.region_offset, spec.region_size)
        specs.append(spec)
    return specs


# ---------------------------------------------------------------- responses

def encode_response(model, req: InferRequest, outs: dict[str, np.ndarray], shm) -> tuple[bytes, dict]:
    """The response body and the extra HTTP headers it needs."""
    tensors, blobs = [], []
    for spec in req.outputs:
        arr = np.asarray(outs[spec.name])
        dt = kserve_datatype(model.graph.values[spec.name].dtype) or ""
        if not dt:
            raise ServeError(500, f"model {model.name!r}: output {spec.name!r} has dtype "
                                  f"{model.graph.values[spec.name].dtype}, which KServe v2 cannot carry")
        t = {"name": spec.name, "datatype": dt, "shape": list(arr.shape)}
        if spec.region is not None:
            raw = _raw(arr, dt)
            shm.write(spec.region, spec.region_offset, spec.region_size, raw, spec.name)
            t["parameters"] = {"shared_memory_region": spec.region, "shared_memory_byte_size": len(raw)}
            if spec.region_offset:
                t["parameters"]["shared_memory_offset"] = spec.region_offset
        elif spec.binary:
            raw = _raw(arr, dt)
            t["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            if dt == "BF16":
                raise ServeError(400, f"output {spec.name!r}: BF16 tensors can only be returned as binary data")
            flat = arr.ravel()
            t["data"] = [str(s) for s in flat] if dt == "BYTES" else flat.tolist()
        tensors.append(t)
    head = {"model_name": model.name, "model_version": model.version, "outputs": tensors}
    if req.id is not None:
        head["id"] = req.id
    text = json.dumps(head, separators=(",", ":")).encode()
    if not blobs:
        return text, {"content-type": "application/json"}
    return b"".join([text, *blobs]), {"content-type": "application/octet-stream",
                                      "inference-header-content-length": str(len(text))}
