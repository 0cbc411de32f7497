"""Fuzz target: ONNX external data resolution (CVE-2022-25882, CVE-2024-27318). A model
whose weight lives in a side file names it by `location`, `offset` and `length`; the cases
draw hostile ones: `..` paths, absolute paths, symbolic links and hard links to a file
outside the model's folder, a folder, a FIFO (a read that never ends), NUL bytes, long
names, offsets and lengths past the file or near 2^63, unknown keys. Pass: the model
imports with the weight read from inside its folder, or an NpurunError; a weight holding the
outside file's marker value means the importer read outside the folder, and fails."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import fuzzkit
from mutate import INTERESTING_INTS

OUTSIDE_MARK = 777.0  # every float of the file outside the folder
N = 6  # the weight is [2, 3] f32: 24 bytes


def _layout(root: Path) -> Path:
    """root/secret.bin (outside), root/model/ with w.bin (inside), links and odd files."""
    outside = root / "secret.bin"
    outside.write_bytes(np.full(64, OUTSIDE_MARK, np.float32).tobytes())
    d = root / "model"
    (d / "sub").mkdir(parents=True)
    (d / "w.bin").write_bytes(np.arange(N, dtype=np.float32).tobytes())  # exactly the weight
    (d / "sub" / "w.bin").write_bytes(np.arange(N, dtype=np.float32).tobytes())
    (d / "big.bin").write_bytes(np.arange(64, dtype=np.float32).tobytes())  # the weight at offset 4k
    (d / "link_out.bin").symlink_to(outside)
    (d / "link_in.bin").symlink_to(d / "w.bin")
    (d / "dirlink").symlink_to(root)
    os.link(outside, d / "hard_out.bin")  # a hard link is the outside file itself
    os.mkfifo(d / "fifo.bin")
    (d / "empty.bin").write_bytes(b"")
    return d


LOCATIONS = st.one_of(
    st.sampled_from(["w.bin", "sub/w.bin", "big.bin", "big.bin", "./w.bin", "sub/../w.bin", "../secret.bin", "../../../../etc/passwd",
                     "/etc/passwd", "ROOT/secret.bin", "link_out.bin", "link_in.bin", "dirlink/secret.bin",
                     "hard_out.bin", "fifo.bin", "sub", ".", "..", "", "empty.bin", "w.bin\x00../secret.bin",
                     "w.bin/", "%2e%2e/secret.bin", "..\\secret.bin", "C:\\secret.bin", "a" * 5000, "\u202e.bin",
                     "/proc/self/mem", "/dev/zero", "~/secret.bin"]),
    st.text(max_size=30))
NUMBERS = st.one_of(st.none(), st.none(), st.sampled_from(["0", "4", "24", "24", "232"]),
                    st.sampled_from(INTERESTING_INTS + [23, 25, 256]).map(str),
                    st.sampled_from(["-1", "abc", "1e3", " 4", "0x10", "", "99999999999999999999999"]))


def make_model(location: str, offset, length, extra_key: bool) -> onnx.ModelProto:
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = w.external_data.add()
            e.key, e.value = k, v
    if extra_key:
        e = w.external_data.add()
        e.key, e.value = "basepath", "/"
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "ext",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    import npurun
    from npurun.frontend.onnx import import_model
    root = Path(tempfile.mkdtemp(prefix="npurun-fuzz-ext-"))
    d = _layout(root)
    path = d / "m.onnx"
    exe = npurun.Executor("reference", parallelism=1)

    def one(location, offset, length, extra):
        m = make_model(location.replace("ROOT", str(root)), offset, length, extra)
        path.write_bytes(m.SerializeToString())
        g = import_model(path)
        w = g.values["w"].data if "w" in g.values else None
        y = exe.run_sync(g, {"x": np.zeros((2, 3), np.float32)})["y"]
        # the weight (or the sum, if folded away) must come from inside the folder
        assert not np.any(y == OUTSIDE_MARK) and (w is None or not np.any(w == OUTSIDE_MARK)), \
            f"read the file outside the model's folder through location {location!r}"
        stats.notes["imported from inside the folder"] += 1

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(LOCATIONS, NUMBERS, NUMBERS, st.booleans())
    def case(location, offset, length, extra):
        stats.case(one, location, offset, length, extra)

    case()


@pytest.mark.fuzz
def test_fuzz_external_data():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_external_data"))


# ---------------------------------------------------------------- each attack, and what it found

@pytest.fixture
def folder(tmp_path):
    return tmp_path, _layout(tmp_path)


# (onnx refuses every symbolic link, even one to a file inside the folder: link_in.bin)
@pytest.mark.parametrize("location", ["../secret.bin", "ROOT/secret.bin", "link_out.bin", "link_in.bin", "dirlink/secret.bin",
                                      "hard_out.bin", "fifo.bin", "sub", "w.bin\x00../secret.bin", "/dev/zero",
                                      "a" * 5000])  # the last was a RuntimeError from onnx's C++ path check
def test_external_data_outside_the_folder_is_refused(folder, location):
    from npurun.errors import ModelError
    from npurun.frontend.onnx import import_model
    root, d = folder
    (d / "m.onnx").write_bytes(make_model(location.replace("ROOT", str(root)), None, None, False).SerializeToString())
    with pytest.raises(ModelError, match="cannot load external weights"):
        import_model(d / "m.onnx")


@pytest.mark.parametrize("offset, length, words", [("4096", None, "exceeds file size"), ("0", "9999", "exceeds available"),
                                                   ("-1", None, "non-negative"), (str(2**63), "24", "exceeds file size")])
def test_external_data_offsets_past_the_file_are_refused(folder, offset, length, words):
    from npurun.errors import ModelError
    from npurun.frontend.onnx import import_model
    _, d = folder
    (d / "m.onnx").write_bytes(make_model("big.bin", offset, length, False).SerializeToString())
    with pytest.raises(ModelError, match=words):
        import_model(d / "m.onnx")


@pytest.mark.parametrize("location, offset", [("w.bin", None), ("sub/w.bin", None), ("big.bin", "24")])
def test_external_data_inside_the_folder_loads(folder, location, offset):
    from npurun.frontend.onnx import import_model
    _, d = folder
    (d / "m.onnx").write_bytes(make_model(location, offset, "24", False).SerializeToString())
    g = import_model(d / "m.onnx")
    start = 0 if offset is None else int(offset) // 4
    np.testing.assert_array_equal(g.values["w"].data.reshape(-1), np.arange(start, start + N, dtype=np.float32))
