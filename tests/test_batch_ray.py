"""Batch jobs on a real local Ray instance (issue O): a folder with a corrupt photo, a worker
SIGKILLed midway, a driver killed and rerun. Pixels are compared with the same job run here."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from npurun.cli import main

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="the test extra installs ray[data,serve]")


@pytest.fixture(scope="module")
def cluster():
    # A short temp dir: Ray's Unix socket paths must stay under ~107 bytes.
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    ray.init(address="local", num_cpus=4, object_store_memory=256 * 2**20, include_dashboard=False,
             _temp_dir=tmp, logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def photos(folder: Path, n: int, size=(64, 36), seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(folder / f"p{i:02d}.png")


def pixels(path):
    return np.asarray(Image.open(path))


def rows(outdir):
    return [json.loads(line) for line in (outdir / "manifest.jsonl").read_text().splitlines()]


def assert_complete(out: Path, local: Path, n: int):
    """Every output once, no partial file, pixels equal to the local run's, one row per input."""
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == [f"p{i:02d}.png" for i in range(n)]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    for name in names:
        np.testing.assert_array_equal(pixels(out / name), pixels(local / name), err_msg=name)
    r = rows(out)
    assert len(r) == n and len({x["input"] for x in r}) == n and {x["status"] for x in r} <= {"ok", "skipped"}


def local_run(src, out):
    assert main(["upscale", str(src), "-o", str(out), "-q", "--threads", "1"]) == 0


def test_ray_folder_with_a_corrupt_photo(cluster, tmp_path, capsys):
    photos(tmp_path / "in", 6)
    (tmp_path / "in" / "zz_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    assert main(["upscale", str(tmp_path / "in"), "-o", str(tmp_path / "ray"), "-q", "--ray", "--workers", "2"]) == 1
    cap = capsys.readouterr()
    assert "6 written, 0 already done, 1 failed" in cap.out and "zz_broken.png" in cap.err
    (tmp_path / "in" / "zz_broken.png").unlink()
    local_run(tmp_path / "in", tmp_path / "local")
    r = {x["input"]: x for x in rows(tmp_path / "ray")}
    assert r[str(tmp_path / "in" / "zz_broken.png")]["status"] == "error"
    del r[str(tmp_path / "in" / "zz_broken.png")]
    assert all(x["worker"].endswith("@" + os.uname().nodename) for x in r.values())  # done in an actor
    assert_complete_except(tmp_path / "ray", tmp_path / "local", 6, broken="zz_broken.png")


def assert_complete_except(out, local, n, broken):
    assert not (out / broken).exists()
    for i in range(n):
        np.testing.assert_array_equal(pixels(out / f"p{i:02d}.png"), pixels(local / f"p{i:02d}.png"))


def _worker_pids():
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"MapBatches(RayWorker)" in (d / "cmdline").read_bytes() and int(d.name) != os.getpid():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def test_worker_killed_midway(cluster, tmp_path):
    n = 16
    photos(tmp_path / "in", n, size=(640, 360))
    out = tmp_path / "ray"
    killed = []

    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(out.glob("p*.png")):
            time.sleep(0.02)
        for pid in _worker_pids():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    t = threading.Thread(target=killer)
    t.start()
    assert main(["upscale", str(tmp_path / "in"), "-o", str(out), "-q", "--ray", "--workers", "2"]) == 0
    t.join()
    assert killed, "no worker was found to kill"
    done_before = len(list(out.glob("*.png")))
    local_run(tmp_path / "in", tmp_path / "local")
    assert_complete(out, tmp_path / "local", n)
    assert done_before == n
    survivors = {x["worker"].split("@")[0] for x in rows(out)}
    assert survivors - {str(p) for p in killed}, "no replacement worker finished anything"


def test_driver_killed_and_rerun(cluster, tmp_path):
    n = 16
    photos(tmp_path / "in", n, size=(640, 360), seed=1)
    out = tmp_path / "ray"
    cmd = [sys.executable, "-m", "npurun", "upscale", str(tmp_path / "in"), "-o", str(out), "-q",
           "--ray", cluster, "--workers", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(list(out.glob("p*.png"))) < 2 and p.poll() is None:
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    assert p.returncode == -signal.SIGKILL, "the driver finished before it could be killed"
    time.sleep(2)  # Ray ends a dead driver's actors
    before = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in out.glob("p*.png")}
    assert 0 < len(before) < n
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"already done" in r.stdout
    for name, st in before.items():
        f = out / name
        assert (f.stat().st_ino, f.stat().st_mtime_ns) == st, f"{name} was rewritten by the rerun"
    local_run(tmp_path / "in", tmp_path / "local")
    assert_complete(out, tmp_path / "local", n)


def test_serve_with_two_replicas_answers_tritonclient(cluster, tmp_path):
    import shutil

    from npurun import zoo
    from npurun.frontend import load
    from npurun.runtime import Executor
    from npurun.serve import ray_serve
    httpclient = pytest.importorskip("tritonclient.http")
    from ray import serve
    shutil.copy(zoo.path("espcn_x3.onnx"), tmp_path / "espcn_x3.onnx")
    port = ray_serve.deploy(tmp_path, replicas=2, port=0, threads=1)
    try:
        app = serve.status().applications[ray_serve.APP]
        running = app.deployments[ray_serve.APP].replica_states.get("RUNNING", 0)
        assert app.status == "RUNNING" and running == 2, app
        c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert c.is_server_ready() and c.is_model_ready("espcn_x3")
        graph = load(tmp_path / "espcn_x3.onnx")
        rng = np.random.default_rng(3)
        with Executor("reference") as ref:
            for _ in range(6):
                x = rng.random((1, 1, 12, 16), dtype=np.float32)
                inp = httpclient.InferInput("input", list(x.shape), "FP32").set_data_from_numpy(x)
                got = c.infer("espcn_x3", [inp]).as_numpy(graph.outputs[0])
                np.testing.assert_allclose(got, ref.run_sync(graph, x)[graph.outputs[0]], rtol=1e-4, atol=1e-5)
    finally:
        ray_serve.shutdown()
