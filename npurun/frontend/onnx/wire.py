"""Read an ONNX file's weights straight into their arrays, without a protobuf copy of them.

`onnx.load` parses the whole file into one protobuf message, weights included, and
`numpy_helper.to_array` then copies each weight out of it: for a moment the process holds every
weight twice (BERT-base: peak RSS 896 MB for 440 MB of weights, where ONNX Runtime peaks at
697), and the freed protobuf memory mostly stays with the allocator afterwards (LeViT-128S:
73 MB resident after loading 31 MB of weights).

Here the file is scanned at the protobuf wire level (the encoding is public and stable:
https://protobuf.dev/programming-guides/encoding/): the `raw_data` field of each initializer of
the main graph is left out of the bytes handed to protobuf, and its span in the file is read
into a fresh (aligned) NumPy array instead, held as a `Stored` (ir/stored.py) that remembers
the span, so a program may let the array go once it has packed it. Tensors in an external
data file inside the model's folder are read the same way. Only element types whose raw bytes
are their NumPy layout are taken; any other tensor (strings, 4- and 2-bit types, data held in
typed fields, external data elsewhere) stays in the message for `numpy_helper.to_array` and
onnx's external data loader, as before.
"""
from __future__ import annotations

import mmap
import os

import numpy as np
import onnx

from ...ir.stored import Source, Stored

# ModelProto.graph, GraphProto.initializer, TensorProto.{data_type, raw_data, data_location}
_GRAPH, _INITIALIZER, _DATA_TYPE, _RAW, _LOCATION = 7, 5, 2, 9, 14
_LEN = 2  # wire type of length-delimited fields (messages, bytes, packed repeated scalars)
# Element types whose raw_data is exactly the little-endian NumPy array of their dtype.
_PLAIN = {onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8, onnx.TensorProto.INT8,
          onnx.TensorProto.UINT16, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
          onnx.TensorProto.INT64, onnx.TensorProto.BOOL, onnx.TensorProto.FLOAT16,
          onnx.TensorProto.DOUBLE, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
          onnx.TensorProto.BFLOAT16}


class WireError(ValueError):
    """The bytes are not the protobuf encoding this reader expects (the caller falls back)."""


def _varint(buf, i: int, end: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= end or shift > 63:
            raise WireError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _fields(buf, i: int, end: int):
    """(field number, wire type, start of the field's tag, start of its payload, end) for each
    field of the message in buf[i:end]."""
    while i < end:
        start = i
        key, i = _varint(buf, i, end)
        field, wt = key >> 3, key & 7
        if wt == 0:
            _, j = _varint(buf, i, end)
        elif wt == 1:
            j = i + 8
        elif wt == 5:
            j = i + 4
        elif wt == _LEN:
            n, i = _varint(buf, i, end)
            j = i + n
        else:  # groups (3, 4) are deprecated and never written by onnx
            raise WireError(f"wire type {wt}")
        if j > end:
            raise WireError("field runs past its message")
        yield field, wt, start, i, j
        i = j


def _tensor(buf, i: int, end: int):
    """One initializer's bytes without its raw_data, and the span of that raw_data (or None
    where the tensor is not one this reader takes)."""
    dtype, raw, external, parts = None, None, False, []
    for field, wt, start, p, j in _fields(buf, i, end):
        if field == _DATA_TYPE and wt == 0:
            dtype = _varint(buf, p, j)[0]
        elif field == _LOCATION and wt == 0:
            external = _varint(buf, p, j)[0] == onnx.TensorProto.EXTERNAL
        if field == _RAW and wt == _LEN:
            raw = (p, j)  # the last one wins, as in protobuf
            continue
        parts.append((start, j))
    if raw is None or external or dtype not in _PLAIN:
        return None, None
    return b"".join(buf[a:b] for a, b in parts), raw


def _message(tag: int, body: bytes) -> bytes:
    return _encode_varint(tag << 3 | _LEN) + _encode_varint(len(body)) + body


def strip(buf) -> tuple[bytes, list]:
    """The model's bytes with the raw_data of the main graph's plain initializers left out,
    and per initializer (in order) its raw_data's (start, end) in buf, or None if it kept it."""
    out, spans = [], []
    for field, wt, start, p, j in _fields(buf, 0, len(buf)):
        if field != _GRAPH or wt != _LEN:
            out.append(buf[start:j])
            continue
        graph = []
        for f2, wt2, s2, p2, j2 in _fields(buf, p, j):
            if f2 == _INITIALIZER and wt2 == _LEN:
                body, raw = _tensor(buf, p2, j2)
                spans.append(raw)
                if raw is not None:
                    graph.append(_message(_INITIALIZER, body))
                    continue
            graph.append(buf[s2:j2])
        out.append(_message(_GRAPH, b"".join(graph)))
    return b"".join(out), spans


def read(path) -> tuple[onnx.ModelProto, dict]:
    """The model without the raw bytes of its main graph's plain initializers, and those
    initializers as arrays that know where their bytes lie (ir/stored.py):
    {index in graph.initializer: Stored}. Raises WireError (or
    protobuf's DecodeError) where the file is not a protobuf this reader can take, or holds a
    tensor whose shape and bytes disagree: the caller then parses it the usual way, whose
    checks say what is wrong."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise WireError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            stripped, spans = strip(mm)
        model = onnx.ModelProto()
        model.ParseFromString(stripped)
        del stripped
        if len(spans) != len(model.graph.initializer):
            raise WireError("initializers counted differently from protobuf")
        source = Source(path)  # (one per file: its constants share it)
        arrays = {k: _array(t, source, span[0], span[1] - span[0])
                  for k, (t, span) in enumerate(zip(model.graph.initializer, spans)) if span is not None}
    sources: dict = {}
    for k, t in enumerate(model.graph.initializer):
        if k not in arrays and t.data_location == onnx.TensorProto.EXTERNAL:
            taken = _external(t, path, sources)
            if taken is not None:
                arrays[k] = taken
                del t.external_data[:]  # (so onnx's loader leaves it: read here, once)
                t.data_location = onnx.TensorProto.DEFAULT
    return model, arrays


def _external(t, model_path, sources: dict):
    """A plain tensor in an external data file (models over 2 GB keep their weights so) as a
    Stored on that file; None for anything this does not take (onnx's loader then reads it, or
    says why not): another element type, a location onnx's own resolver refuses (absolute, out
    of the model's folder, through a link or a hard link: CVE-2022-25882, CVE-2024-27318), a
    length that disagrees with the shape, a file too short."""
    from onnx import external_data_helper as edh
    if t.data_type not in _PLAIN:
        return None
    try:
        info = edh.ExternalDataInfo(t)
        base = os.path.dirname(os.path.abspath(model_path))
        key = (base, info.location)
        if key not in sources:
            # onnx's resolver opens it (the checks and the open are one step: no swap between)
            fd = edh._open_external_data_fd(base, info.location, t.name, True)
            sources[key] = Source.of_open(os.path.join(base, info.location), os.fdopen(fd, "rb"))
        offset = info.offset or 0
        length = info.length if info.length is not None else _nbytes(t)
        if offset + length > sources[key].stamp[0]:
            return None
        return _array(t, sources[key], offset, length)
    except Exception:  # noqa: BLE001 -- whatever it is, onnx's loader meets it again and says it
        return None


def _nbytes(t) -> int:
    n = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    for d in t.dims:
        n *= d
    return n


def _array(t, source, offset: int, length: int) -> Stored:
    """Tensor t's `length` bytes at `offset` of `source`, read into its array."""
    if any(d < 0 for d in t.dims) or _nbytes(t) != length:
        raise WireError(f"initializer {t.name!r}: shape and bytes disagree")  # (the caller's full parse says how)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
    arr = np.empty(tuple(t.dims), dtype)
    source.read_into(offset, arr)
    return Stored(source, offset, dtype, tuple(t.dims), arr)
