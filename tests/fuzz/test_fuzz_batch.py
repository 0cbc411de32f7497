"""Fuzz target: a batch job's inputs (`npurun batch`, issue O). Seeds: .npy and .npz files and
Parquet tables (Arrow fixed-shape tensors and nested lists) for a small model; mutations of
their bytes, one to three files per job. Pass: the job plans (or refuses with an NpurunError,
e.g. a Parquet footer it cannot read) and every item gets exactly one status row, `ok` with
its output readable or `error` with an NpurunError's message — never an internal error, a
lost item, or a crash."""
from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzzkit
from mutate import _EDIT
from mutate import apply as apply_bytes


def model(path: Path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def seeds() -> list[tuple[str, bytes]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    r = np.random.default_rng(1)
    x = r.standard_normal((6, 4)).astype(np.float32)
    out = []
    buf = io.BytesIO()
    np.save(buf, x[:2])
    out.append((".npy", buf.getvalue()))
    buf = io.BytesIO()
    np.savez(buf, x=x[:3])
    out.append((".npz", buf.getvalue()))
    for col in (pa.FixedShapeTensorArray.from_numpy_ndarray(x), pa.array([list(map(float, row)) for row in x])):
        buf = io.BytesIO()
        pq.write_table(pa.table({"x": col}), buf, row_group_size=4)
        out.append((".parquet", buf.getvalue()))
    return out


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    from npurun.batch.job import Spec, plan
    from npurun.batch.pipeline import run_items
    from npurun.batch.work import Worker, parquet_row_groups
    tmp = Path(tempfile.mkdtemp(prefix="npurun-fuzz-batch-"))
    model(tmp / "m.onnx")
    spec = Spec(kind="tensors", model=str(tmp / "m.onnx"), threads=1, io_threads=1)
    worker = Worker(spec)
    base = seeds()

    def one(files):
        job = tmp / "job"
        shutil.rmtree(job, ignore_errors=True)
        (job / "in").mkdir(parents=True)
        for k, (suffix, data) in enumerate(files):
            (job / "in" / f"f{k}{suffix}").write_bytes(data)
        items = plan([str(job / "in")], job / "out", kind="tensors", suffix=".npy", parquet_parts=parquet_row_groups)
        rows = []
        run_items(worker, items, rows.append, io_threads=1, computes=1)
        assert sorted(r["input"] for r in rows) == sorted(it.label for it in items), "an item lost or doubled"
        for r in rows:
            assert not r["error"].startswith("internal error"), r["error"]
            if r["status"] == "ok":
                assert Path(r["output"]).is_file()
                stats.notes["ok"] += 1
            else:
                stats.notes["error rows"] += 1
        return rows

    file = st.tuples(st.integers(0, len(base) - 1), st.lists(_EDIT, max_size=5)).map(
        lambda t: (base[t[0]][0], apply_bytes(base[t[0]][1], t[1]) if t[1] else base[t[0]][1]))

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(st.lists(file, min_size=1, max_size=3))
    def case(files):
        stats.case(one, files)

    case()
    worker.close()


@pytest.mark.fuzz
def test_fuzz_batch():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_batch"))
