"""Fuzz target: the system shared-memory extension's arguments (Triton's CVE-2024-0088 and
CVE-2025-23319/-23320/-23334 class). Each case is a short sequence of register, infer (input
and/or output through regions), status and unregister calls whose names, keys, offsets and
byte sizes are drawn hostile: negative, 2^63, 2^64-32, past the object, overlapping
regions, keys with `..`, symbolic links, folders, missing objects; and an unregister racing
an inference that uses the region. Pass: each answer a 2xx or a JSON 4xx (served.check_answer),
an MLP output read back from a region sums to 1 per row (softmax), and after the run no
region of the fuzzer's is still mapped by the server (/proc/self/maps)."""
from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzzkit
import served
from mutate import INTERESTING_INTS

TAG = f"npurun_fuzz_{os.getpid()}"
SIZES = st.sampled_from(INTERESTING_INTS + [0, 32, 64, 96, 128, 4096, 4095, 4097]) | st.integers(-10, 5000)


def _objects() -> dict[str, Path]:
    """The /dev/shm objects the cases may name: two real ones, a link out, a folder."""
    shm = Path("/dev/shm")
    objs = {"a": shm / f"{TAG}_a", "b": shm / f"{TAG}_b", "link": shm / f"{TAG}_link", "dir": shm / f"{TAG}_dir"}
    objs["a"].write_bytes(np.full(1024, 0.25, np.float32).tobytes())  # 4096 bytes
    objs["b"].write_bytes(bytes(128))
    objs["link"].symlink_to("/etc/passwd")
    objs["dir"].mkdir()
    return objs


OFFSETS = st.sampled_from([0, 0, 64]) | SIZES  # valid ones often, so inferences get through too
LENGTHS = st.sampled_from([128, 128, 4096, 64]) | SIZES
KEYS = st.sampled_from([f"/{TAG}_a"] * 6 + [f"/{TAG}_b", f"{TAG}_a", f"/{TAG}_link", f"/{TAG}_dir", f"/{TAG}_none",
                        "/../etc/passwd", "/", "", "..", "/dev/shm/x", "a/b", "\x00", 7, None])
REGIONS = st.sampled_from(["r0", "r0", "r1", "r1", "r2", "", "../r", "r" * 200, "r\n"])
OP = st.one_of(
    st.tuples(st.just("register"), REGIONS, KEYS, OFFSETS, LENGTHS),
    st.tuples(st.just("infer"), REGIONS, OFFSETS, LENGTHS, st.sampled_from([None, "r0", "r1", "r2"]), OFFSETS, LENGTHS),
    st.tuples(st.just("status"), REGIONS | st.none()),
    st.tuples(st.just("unregister"), REGIONS | st.none()),
    st.tuples(st.just("race"), REGIONS),
)


def infer_body(region, off, size, out_region, out_off, out_size) -> bytes:
    inp = {"name": "x", "shape": [4, 8], "datatype": "FP32",
           "parameters": {"shared_memory_region": region, "shared_memory_offset": off, "shared_memory_byte_size": size}}
    req = {"inputs": [inp]}
    if out_region:
        req["outputs"] = [{"name": "p", "parameters": {"shared_memory_region": out_region,
                                                        "shared_memory_offset": out_off,
                                                        "shared_memory_byte_size": out_size}}]
    return json.dumps(req).encode()


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    srv = served.start(Path(tempfile.mkdtemp(prefix="npurun-fuzz-shm-")))
    objs = _objects()
    registered: dict[str, tuple] = {}  # what the fuzzer registered successfully: name -> (key, offset, size)

    def post(path, body=b"{}", method="POST"):
        status, h, data = served.post(srv, path, body, {"Content-Type": "application/json"}, method=method)
        served.check_answer(status, h, data, stats, False)
        return status, data

    def infer(args):
        status, data = post("/v2/models/mlp/infer", infer_body(*args))
        out_region, out_off = args[3], args[4]
        if status == 200 and out_region and out_region in registered:
            key, off, _ = registered[out_region]
            raw = Path("/dev/shm", key.lstrip("/")).read_bytes()[off + out_off: off + out_off + 64]
            if len(raw) == 64:  # 4 rows of softmax over 4 classes
                np.testing.assert_allclose(np.frombuffer(raw, np.float32).reshape(4, 4).sum(1), 1, rtol=1e-5)
                stats.notes["outputs read back from a region"] += 1
        return status

    def one(ops):
        for op in ops:
            if op[0] == "register":
                _, name, key, off, size = op
                status, _ = post(f"/v2/systemsharedmemory/region/{quote(name, safe='')}/register",
                                 json.dumps({"key": key, "offset": off, "byte_size": size}).encode())
                if status == 200:
                    registered[name] = (key, off, size)
                    stats.notes["registered"] += 1
            elif op[0] == "infer":
                if infer(op[1:]) == 200:
                    stats.notes["shm inferences ok"] += 1
            elif op[0] == "status":
                post(f"/v2/systemsharedmemory/region/{quote(op[1], safe='')}/status" if op[1] is not None
                     else "/v2/systemsharedmemory/status", b"", method="GET")
            elif op[0] == "unregister":
                post(f"/v2/systemsharedmemory/region/{quote(op[1], safe='')}/unregister" if op[1] is not None
                     else "/v2/systemsharedmemory/unregister")
                registered.pop(op[1], None) if op[1] is not None else registered.clear()
            else:  # an inference reading the region while another request unregisters it
                t = threading.Thread(target=infer, args=((op[1], 0, 128, op[1], 0, 64),))
                t.start()
                post(f"/v2/systemsharedmemory/region/{quote(op[1], safe='')}/unregister")
                t.join(30)
                assert not t.is_alive(), "an inference racing an unregister did not finish"
                registered.pop(op[1], None)
                stats.notes["unregister raced an inference"] += 1
        post("/v2/systemsharedmemory/unregister")
        registered.clear()
        status, data = served.post(srv, "/v2/systemsharedmemory/status", b"", method="GET")[::2]
        assert json.loads(data) == [], data

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(st.lists(OP, min_size=1, max_size=6))
    def case(ops):
        stats.case(one, ops)

    try:
        case()
        maps = Path("/proc/self/maps").read_text()
        assert TAG not in maps, "the server still maps a region of the fuzzer's after unregistering them all"
    finally:
        srv.stop()
        for p in objs.values():
            p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()


@pytest.mark.fuzz
def test_fuzz_shared_memory():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_shm"))
