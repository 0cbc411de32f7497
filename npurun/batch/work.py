"""A worker: one compiled model on one Executor, and the three stages of an item — load (read
and decode), compute (the device), store (encode and write atomically). The local runner and
each Ray actor hold one worker and drive the same stages (pipeline.py).

An item's failure is an NpurunError with its name (a corrupt image, a wrong shape); anything
else a stage raises is reported as that item's error too, so one bad input never ends a batch.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from ..errors import InputError, NpurunError
from ..util import atomic_write
from .job import Item, Spec


def load_model(spec: Spec):
    """The job's graph, checked against its kind, at its precision (what every worker runs)."""
    from .. import zoo
    from ..compiler import with_precision
    from ..frontend import load
    graph = load(spec.model)
    if spec.kind == "upscale":
        from ..zoo import espcn
        scale = espcn.model_scale(graph)
        if scale != spec.scale:
            raise InputError(f"{spec.model}: the model upscales by {scale}, --scale {spec.scale} was asked; "
                             f"pass --scale {scale} or a model for x{spec.scale}")

        def default_feeds():  # the bundled sample photo's luma, as `npurun upscale` calibrates
            y = espcn.read_image(zoo.path("sample.jpg")).convert("YCbCr").getchannel("Y")
            return [{graph.inputs[0]: espcn.luma_to_array(y)}]
        return with_precision(graph, spec.precision, spec.calibrate, spec.device, default_feeds)
    input_name(graph, spec)  # fail on an ambiguous input before any work
    return with_precision(graph, spec.precision, spec.calibrate, spec.device, None)


def input_name(graph, spec: Spec) -> str:
    if spec.input_name:
        if spec.input_name not in graph.inputs:
            raise InputError(f"--input-name {spec.input_name}: the model's inputs are {graph.inputs}")
        return spec.input_name
    if len(graph.inputs) != 1:
        raise InputError(f"{spec.model}: the model has inputs {graph.inputs}; .npy and Parquet items feed one, "
                         f"name it with --input-name (or give .npz files with a member per input)")
    return graph.inputs[0]


class Worker:
    def __init__(self, spec: Spec, graph=None):
        from ..runtime import Executor
        self.spec = spec
        self.graph = graph if graph is not None else load_model(spec)
        self.exe = Executor(spec.device, parallelism=spec.threads)
        self.exe.compile(self.graph)

    def close(self):
        self.exe.close()

    # -- stages (load and store run in the pipeline's I/O threads, compute in its compute threads)
    def load(self, item: Item):
        if self.spec.kind == "upscale":
            from ..zoo import espcn
            return espcn.read_image(item.input)
        if item.part is not None:
            return _parquet_rows(item, self.spec, self.graph)
        return _tensor_feeds(item, self.spec, self.graph)

    def compute(self, item: Item, loaded):
        if self.spec.kind == "upscale":
            from ..zoo import espcn
            out = self.graph.outputs[0]
            return espcn.upscale(loaded, lambda y: self.exe.run_sync(self.graph, y)[out], self.spec.scale)
        if item.part is not None:
            name = input_name(self.graph, self.spec)
            if loaded and _batchable(self.graph, name) and len({x.shape for x in loaded}) == 1:
                # One run over the row group: the model's first dim is the batch.
                outs = self.exe.run_sync(self.graph, {name: np.concatenate(loaded)})
                return {k: v.reshape((len(loaded), -1) + v.shape[1:]) for k, v in outs.items()}
            rows = [self.exe.run_sync(self.graph, {name: x}) for x in loaded]
            return {k: np.stack([r[k] for r in rows]) if rows else np.empty((0,)) for k in self.graph.outputs}
        return self.exe.run_sync(self.graph, loaded)

    def store(self, item: Item, result) -> str:
        """Write the item's output atomically; the sha256 of the bytes written."""
        import hashlib
        if self.spec.kind == "upscale":
            from ..zoo import espcn
            data = espcn.encode_image(result, item.output, png_level=self.spec.png_level)
        elif item.part is not None:
            data = _parquet_bytes(result)
        else:
            buf = io.BytesIO()
            if item.output.endswith(".npz"):
                np.savez(buf, **{k: np.asarray(v) for k, v in result.items()})
            else:
                np.save(buf, np.asarray(next(iter(result.values()))), allow_pickle=False)
            data = buf.getvalue()
        Path(item.output).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(item.output, data)
        return hashlib.sha256(data).hexdigest()


def _batchable(graph, name) -> bool:
    """Whether rows can run as one batch: the input's first dim is symbolic, and every output's
    first dim is that same symbol (so row k of each output belongs to row k of the input)."""
    first = graph.values[name].shape[:1]
    return bool(first) and isinstance(first[0], str) and len(graph.inputs) == 1 and all(
        graph.values[o].shape[:1] == first for o in graph.outputs)


def _tensor_feeds(item: Item, spec: Spec, graph) -> dict:
    """An .npy (the model's one input) or .npz (a member per input) item, read with the
    weights loader's checks: no pickles, no header lying about its size, no zip bombs."""
    from ..errors import ModelError
    from ..ir.io import read_npy, read_weights
    path = Path(item.input)
    try:
        if path.suffix.lower() == ".npz":
            feeds = read_weights(path, path, kind=".npz file")
        else:
            return {input_name(graph, spec): read_npy(path)}
    except ModelError as e:
        raise InputError(str(e)) from None
    missing = [k for k in graph.inputs if k not in feeds]
    extra = [k for k in feeds if k not in graph.inputs]
    if missing or extra:
        raise InputError(f"{path}: members {sorted(feeds)}; the model's inputs are {graph.inputs}"
                         + (f" (missing {missing})" if missing else "") + (f" (unknown {extra})" if extra else ""))
    return feeds


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError("Parquet inputs need pyarrow: pip install 'npurun[batch]'") from None
    return pyarrow, pyarrow.parquet


def parquet_row_groups(path) -> int:
    _, pq = _pyarrow()
    try:
        return pq.ParquetFile(path).num_row_groups
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError ... for a file it cannot read
        raise InputError(f"{path}: not a readable Parquet file ({e})") from None


def _parquet_rows(item: Item, spec: Spec, graph) -> list[np.ndarray]:
    """The rows of one row group's column, each an array of the model input's dtype, with the
    batch dimension of 1 added where the row lacks it. A column is a fixed-shape tensor
    (Arrow's extension type, as Ray Data and `npurun batch` write) or nested lists."""
    from ..ir.dtypes import to_numpy
    pa, pq = _pyarrow()
    name = input_name(graph, spec)
    value = graph.values[name]
    try:
        pf = pq.ParquetFile(item.input)
        names = pf.schema_arrow.names
        col = spec.column or (names[0] if len(names) == 1 else name if name in names else None)
        if col not in names:
            raise InputError(f"{item.input}: columns {names}; name the one to feed with --column")
        arr = pf.read_row_group(item.part, columns=[col]).column(col).combine_chunks()
    except NpurunError:
        raise
    except Exception as e:  # pyarrow's errors for a corrupt file or row group
        raise InputError(f"{item.label}: cannot read the row group ({e})") from None
    if isinstance(arr.type, pa.FixedShapeTensorType):
        rows = list(arr.to_numpy_ndarray())
    else:
        try:
            rows = [np.asarray(v) for v in arr.to_pylist()]
        except ValueError as e:
            raise InputError(f"{item.label}: column {col!r} is not a tensor per row ({e})") from None
    want = len(value.shape)
    out = []
    for k, r in enumerate(rows):
        if r.dtype == object:
            raise InputError(f"{item.label}: row {k} of {col!r} is ragged or null")
        r = r.astype(to_numpy(value.dtype), copy=False)  # Arrow lists of floats are doubles
        out.append(r[None] if r.ndim == want - 1 else r)
    return out


def _parquet_bytes(outputs: dict) -> bytes:
    """One row per input row; each model output a column of Arrow fixed-shape tensors (the
    per-row batch dimension of 1 dropped)."""
    pa, pq = _pyarrow()
    cols = {}
    for k, v in outputs.items():
        v = np.ascontiguousarray(v)
        if v.ndim >= 2 and v.shape[1] == 1:
            v = v[:, 0]
        cols[k] = pa.FixedShapeTensorArray.from_numpy_ndarray(v) if v.ndim >= 2 else pa.array(v)
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    return buf.getvalue()
