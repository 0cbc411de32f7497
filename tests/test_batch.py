"""Local batch jobs (issue O): `npurun upscale DIR -o OUTDIR` and `npurun batch MODEL INPUTS`.
A folder with a corrupt photo, resume, the job file, partial files, tensors vs ONNX Runtime."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from npurun import zoo
from npurun.cli import main
from npurun.frontend import load
from npurun.runtime import Executor
from npurun.zoo import espcn

ort = pytest.importorskip("onnxruntime")


def photos(folder, rng, n=4, size=(40, 24)):
    (folder / "sub").mkdir(parents=True)
    paths = []
    for i in range(n):
        p = folder / ("sub" if i == n - 1 else "") / f"p{i}.png"
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(p)
        paths.append(p)
    return paths


def manifest(outdir):
    return [json.loads(line) for line in (outdir / "manifest.jsonl").read_text().splitlines()]


def test_folder_with_a_corrupt_photo(tmp_path, rng, capsys):
    srcs = photos(tmp_path / "in", rng)
    (tmp_path / "in" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = tmp_path / "out"
    assert main(["upscale", str(tmp_path / "in"), "-o", str(out), "-q"]) == 1
    cap = capsys.readouterr()
    assert "4 written, 0 already done, 1 failed" in cap.out
    assert "broken.jpg" in cap.err and "cannot decode" in cap.err or "not an image" in cap.err
    # The folder's layout is kept; each output equals the photo upscaled on its own (reference
    # backend, an independent implementation of every kernel) within one 8-bit level.
    graph = load(zoo.path("espcn_x3.onnx"))
    with Executor("reference") as exe:
        for src in srcs:
            rel = src.relative_to(tmp_path / "in").with_suffix(".png")
            got = np.asarray(Image.open(out / rel), dtype=np.int16)
            want = espcn.upscale(Image.open(src), lambda y: exe.run_sync(graph, y)[graph.outputs[0]], 3)
            assert got.shape == (72, 120, 3)
            assert np.abs(got - np.asarray(want, dtype=np.int16)).max() <= 1
    rows = manifest(out)
    assert sorted(r["status"] for r in rows) == ["error"] + ["ok"] * 4
    for r in rows:
        if r["status"] == "ok":
            import hashlib
            assert hashlib.sha256(open(r["output"], "rb").read()).hexdigest() == r["sha256"]


def test_rerun_resumes_and_never_rewrites(tmp_path, rng, capsys):
    photos(tmp_path / "in", rng)
    out = tmp_path / "out"
    args = ["upscale", str(tmp_path / "in"), "-o", str(out), "-q"]
    assert main(args) == 0
    stats = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*.png")}
    (out / "p1.png").unlink()
    (out / ".p2.png.abc123.tmp").write_bytes(b"half a file")  # what a killed writer leaves
    capsys.readouterr()
    assert main(args) == 0
    assert "1 written, 3 already done, 0 failed" in capsys.readouterr().out
    for p, st in stats.items():
        if p.name != "p1.png":
            assert (p.stat().st_ino, p.stat().st_mtime_ns) == st, f"{p} was rewritten"
    assert (out / "p1.png").is_file() and not list(out.rglob("*.tmp"))
    rows = manifest(out)
    assert len(rows) == 4 and len({r["input"] for r in rows}) == 4
    assert sorted(r["status"] for r in rows) == ["ok", "skipped", "skipped", "skipped"]


def test_resume_with_other_options_is_refused(tmp_path, rng, capsys):
    photos(tmp_path / "in", rng, n=2)
    out = tmp_path / "out"
    assert main(["upscale", str(tmp_path / "in"), "-o", str(out), "-q"]) == 0
    capsys.readouterr()
    assert main(["upscale", str(tmp_path / "in"), "-o", str(out), "-q", "--format", "jpg"]) == 1
    err = capsys.readouterr().err
    assert "holds the outputs of a job with other options" in err and "output_format" in err
    assert not list(out.rglob("*.jpg"))


def test_bad_job_arguments_fail_before_work(tmp_path, rng):
    photos(tmp_path / "a", rng, n=2)
    photos(tmp_path / "b", rng, n=2)
    env = {**os.environ, "NPURUN_DEBUG": ""}
    for args, words in (
            ([tmp_path / "a" / "p0.png", tmp_path / "b" / "p0.png"], "would both write"),
            ([tmp_path / "nothing-here"], "no such file or folder"),
            ([str(tmp_path / "a" / "*.gif")], "matches no file"),
            ([tmp_path / "a", "--workers", "2"], "--workers and --resource go with --ray"),
            ([tmp_path / "a", "--format", "xyz"], "unknown output format"),
            ([tmp_path / "a", "-o", tmp_path / "big.png"], "give -o a folder")):
        r = subprocess.run([sys.executable, "-m", "npurun", "upscale", "-o", str(tmp_path / "o"), *map(str, args)],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("npurun: error: ") and words in r.stderr, (words, r.stderr)


def mlp(path, rng, batch="N"):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                          "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
                          [numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("batch", ["N", 1])
def test_tensors_npy_npz_and_parquet_match_onnxruntime(tmp_path, rng, capsys, batch):
    import pyarrow as pa
    import pyarrow.parquet as pq
    sess = mlp(tmp_path / "m.onnx", rng, batch)
    (tmp_path / "t").mkdir()
    n = 2 if batch == "N" else 1
    xs = {f"a{i}": rng.standard_normal((n, 4)).astype(np.float32) for i in range(3)}
    for k, x in xs.items():
        np.save(tmp_path / "t" / f"{k}.npy", x)
    np.savez(tmp_path / "t" / "z.npz", x=xs["a0"])
    np.save(tmp_path / "t" / "wrong.npy", rng.standard_normal((n, 5)).astype(np.float32))
    rows = rng.standard_normal((11, 4)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(11), "x": pa.FixedShapeTensorArray.from_numpy_ndarray(rows)}),
                   tmp_path / "tab.parquet", row_group_size=4)
    out = tmp_path / "out"
    assert main(["batch", str(tmp_path / "m.onnx"), str(tmp_path / "t"), str(tmp_path / "tab.parquet"),
                 "-o", str(out), "-q"]) == 1
    cap = capsys.readouterr()
    assert "8 items" in cap.out and "7 written" in cap.out and "1 failed" in cap.out and "wrong.npy" in cap.err
    for k, x in xs.items():
        np.testing.assert_allclose(np.load(out / f"{k}.npy"), sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(out / "z.npy"), sess.run(None, {"x": xs["a0"]})[0], rtol=1e-5, atol=1e-6)
    got = np.concatenate([pq.read_table(out / "tab" / f"part-{k:05d}.parquet").column("y").combine_chunks()
                          .to_numpy_ndarray() for k in range(3)])
    want = np.concatenate([sess.run(None, {"x": r[None]})[0] for r in rows])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_parquet_with_several_columns_needs_column(tmp_path, rng, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    mlp(tmp_path / "m.onnx", rng)
    pq.write_table(pa.table({"a": [[1.0, 2.0, 3.0, 4.0]], "b": [[1.0, 2.0, 3.0, 4.0]]}), tmp_path / "t.parquet")
    assert main(["batch", str(tmp_path / "m.onnx"), str(tmp_path / "t.parquet"), "-o", str(tmp_path / "o"), "-q"]) == 1
    assert "columns ['a', 'b']; name the one to feed with --column" in capsys.readouterr().err
    assert main(["batch", str(tmp_path / "m.onnx"), str(tmp_path / "t.parquet"), "-o", str(tmp_path / "o2"),
                 "-q", "--column", "b"]) == 0


class _FlakyWorker:
    """Stages that take random time and fail on chosen items, to check the pipeline's books."""

    def __init__(self, rng, fail):
        self.rng, self.fail = rng, fail
        import threading
        self.lock = threading.Lock()

    def _stage(self, item, stage):
        import time
        with self.lock:
            dt = float(self.rng.random()) * 0.004
        time.sleep(dt)
        if self.fail.get(item.input) == stage:
            raise ValueError(f"{stage} failed")

    def load(self, item):
        self._stage(item, "load")
        return item.input

    def compute(self, item, loaded):
        assert loaded == item.input  # each compute gets its own item's load
        self._stage(item, "compute")
        return loaded

    def store(self, item, result):
        assert result == item.input
        self._stage(item, "store")
        return "sha-" + result


@pytest.mark.parametrize("n,io,computes", [(1, 1, 1), (5, 2, 2), (37, 2, 2), (37, 1, 3), (64, 4, 1)])
def test_pipeline_gives_every_item_exactly_one_row(rng, n, io, computes):
    from npurun.batch.job import Item
    from npurun.batch.pipeline import run_items
    items = [Item(f"in{i}", f"out{i}") for i in range(n)]
    stages = ("load", "compute", "store")
    fail = {f"in{i}": stages[int(rng.integers(0, 3))] for i in rng.choice(n, size=n // 4, replace=False)}
    rows = []
    run_items(_FlakyWorker(rng, fail), items, rows.append, io_threads=io, computes=computes, who="w")
    assert sorted(r["input"] for r in rows) == sorted(it.input for it in items)
    for r in rows:
        if r["input"] in fail:
            assert r["status"] == "error" and r["error"].startswith("internal error (ValueError:"), r
        else:
            assert r["status"] == "ok" and r["sha256"] == "sha-" + r["input"] and r["worker"] == "w", r


def test_corrupt_tensor_files_are_error_rows(tmp_path, rng, capsys):
    """Found by tests/fuzz/test_fuzz_batch.py: a .npz that is not a zip (BadZipFile), an .npy
    header numpy's parser chokes on (tokenize.TokenError), and an .npy whose version bytes
    are corrupt, so numpy read a 4-byte header length of ~660 MB (MemoryError)."""
    import io
    mlp(tmp_path / "m.onnx", rng)
    (tmp_path / "t").mkdir()
    buf = io.BytesIO()
    np.save(buf, rng.standard_normal((2, 4)).astype(np.float32))
    good = buf.getvalue()
    (tmp_path / "t" / "version.npy").write_bytes(good[:6] + b"\x00\x01" + good[8:])
    (tmp_path / "t" / "header.npy").write_bytes(good[:10] + b"{'descr': '<f4', 'shape': (2,\n")
    (tmp_path / "t" / "notzip.npz").write_bytes(b"PK\x03\x04" + good)
    assert main(["batch", str(tmp_path / "m.onnx"), str(tmp_path / "t"), "-o", str(tmp_path / "o"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "version.npy: unknown .npy format version 0.1" in err
    assert "header.npy: not a readable .npy file" in err and "notzip.npz: corrupt .npz file" in err
    assert "internal error" not in err
