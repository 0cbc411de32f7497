"""Fuzz target: the weights side file of an .npuir (NAME.weights.npz) -> load_npuir -> run.
Seeds are ESPCN and a corpus graph saved by npurun.save. Mutations: the .npz's bytes (zip
headers, npy headers, data), or its members rewritten: an object array (pickle), npy headers
lying about shape, dtype or order, members missing, extra, renamed, twice, compressed into a
bomb. Pass: a graph that runs, or an NpurunError. Regression tests for what it found follow."""
from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_seeds
import fuzzkit
from mutate import _EDIT, INTERESTING_INTS
from mutate import apply as apply_bytes


def _npy(header: dict, data: bytes) -> bytes:
    """An .npy member with the header given as is (it may lie about the data)."""
    h = repr(header).encode()
    h += b" " * (63 - (len(h) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + data


MEMBER_EDITS = st.one_of(
    st.tuples(st.just("pickle"), st.integers(0, 99)),
    st.tuples(st.just("shape"), st.integers(0, 99), st.lists(st.sampled_from([x for x in INTERESTING_INTS if x >= 0]),
                                                             max_size=4)),
    st.tuples(st.just("descr"), st.integers(0, 99), st.sampled_from(["<f4", ">f4", "|O", "<U3", "|V8", "<c16", "x",
                                                                     "<f2", "|b1", "<i8", "[('a','<f4')]"])),
    st.tuples(st.just("fortran"), st.integers(0, 99)),
    st.tuples(st.just("drop"), st.integers(0, 99)),
    st.tuples(st.just("extra"), st.integers(0, 99)),
    st.tuples(st.just("rename"), st.integers(0, 99), st.sampled_from(["../x.npy", "/abs.npy", "x", "a\x00b.npy", ""])),
    st.tuples(st.just("twice"), st.integers(0, 99)),
    st.tuples(st.just("bomb"), st.integers(0, 99)),
)


def edit_members(npz: bytes, edits) -> bytes:
    with zipfile.ZipFile(io.BytesIO(npz)) as zf:
        members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    # headers are rewritten from the seed's arrays (an edited member may claim 16 GB)
    originals = {nm: np.lib.format.read_array(io.BytesIO(d), allow_pickle=False) for nm, d in members}
    bombs = set()
    for e in edits:
        if not members:
            break
        k = e[1] % len(members)
        name, data = members[k]
        arr = originals.get(name) if e[0] in ("shape", "descr", "fortran") else None
        if e[0] == "pickle":
            buf = io.BytesIO()
            np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
            members[k] = (name, buf.getvalue())
        elif arr is not None:
            hdr = {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False, "shape": arr.shape}
            if e[0] == "shape":
                hdr["shape"] = tuple(e[2])
            elif e[0] == "descr":
                hdr["descr"] = e[2]
            else:
                hdr["fortran_order"] = True
            members[k] = (name, _npy(hdr, arr.tobytes()))
        elif e[0] == "drop":
            del members[k]
        elif e[0] == "extra":
            members.append(("extra.npy", data))
        elif e[0] == "rename":
            members[k] = (e[2], data)
        elif e[0] == "twice":
            members.append((name, data))
        elif e[0] == "bomb":
            # 16 MB of zeros deflate ~1000x; a real bomb is the same shape, only larger
            members[k] = (name, _npy({"descr": "<f4", "fortran_order": False, "shape": (1 << 22,)}, bytes(1 << 24)))
            bombs.add(k)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for k, (name, data) in enumerate(members):
            zf.writestr(zipfile.ZipInfo(name or "x"), data,
                        compress_type=zipfile.ZIP_DEFLATED if k in bombs else zipfile.ZIP_STORED)
    return out.getvalue()


def _seeds(tmp: Path) -> list[tuple[str, bytes]]:
    """(.npuir text, .weights.npz bytes) of graphs with large constants."""
    import npurun
    from npurun.frontend.onnx import import_model
    out = []
    for k, m in enumerate([fuzz_seeds.ROOT / "npurun/zoo/espcn_x3.onnx"] + fuzz_seeds.handmade()):
        g = import_model(m)
        p = tmp / f"seed{k}.npuir"
        npurun.save(g, p)
        w = p.with_name(p.name.removesuffix(".npuir") + ".weights.npz")
        if w.exists():
            out.append((p.read_text().replace(w.name, "model.weights.npz"), w.read_bytes()))
    return out


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    import npurun
    from npurun.ir.io import load_npuir
    tmp = Path(tempfile.mkdtemp(prefix="npurun-fuzz-weights-"))
    seeds = _seeds(tmp)
    exe = npurun.Executor("reference", parallelism=1)
    text_path, weights_path = tmp / "model.npuir", tmp / "model.weights.npz"

    def one(k: int, npz: bytes, seed: int):
        text_path.write_text(seeds[k][0])
        weights_path.write_bytes(npz)
        g = load_npuir(text_path)
        stats.notes["loaded"] += 1
        return fuzzkit.run_graph(exe, g, np.random.default_rng(seed), stats)

    blobs = st.integers(0, len(seeds) - 1).flatmap(lambda k: st.tuples(st.just(k), st.one_of(
        st.lists(_EDIT, min_size=1, max_size=6).map(lambda e: apply_bytes(seeds[k][1], e)),
        st.lists(MEMBER_EDITS, min_size=1, max_size=3).map(lambda e: edit_members(seeds[k][1], e)))))

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(blobs, st.integers(0, 2**32 - 1))
    def case(blob, seed):
        stats.case(one, blob[0], blob[1], seed)

    case()


@pytest.mark.fuzz
def test_fuzz_weights_npz():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_weights"))


# ---------------------------------------------------------------- what it found (fixed)

@pytest.fixture
def saved(tmp_path):
    (text, npz), = _seeds(tmp_path)[:1]
    (tmp_path / "model.npuir").write_text(text)
    return tmp_path / "model.npuir", tmp_path / "model.weights.npz", npz


@pytest.mark.parametrize("edit, words", [
    (("pickle", 0), "holds Python objects"),
    (("shape", 0, [2**36]), "but holds"),  # numpy allocated the claimed 256 GB before reading
    (("bomb", 0), "refusing it (over 100x)"),
    (("twice", 0), "appears twice"),
    (("rename", 0, "x"), "is not an .npy array"),
])
def test_weights_headers_are_checked_before_allocating(saved, edit, words):
    from npurun.errors import ModelError
    from npurun.ir.io import load_npuir
    text, weights, npz = saved
    weights.write_bytes(edit_members(npz, [edit]))
    with pytest.raises(ModelError) as e:
        load_npuir(text)
    assert words in str(e.value) and str(weights) in str(e.value), str(e.value)


@pytest.mark.parametrize("name", ["../model.weights.npz", "/etc/passwd", "sub/model.weights.npz", ".."])
def test_weights_file_must_sit_beside_the_text(saved, name):
    from npurun.errors import ModelError
    from npurun.ir.io import load_npuir
    text, weights, npz = saved
    weights.write_bytes(npz)
    text.write_text(text.read_text().replace('"model.weights.npz"', f'"{name}"'))
    with pytest.raises(ModelError, match="must be a plain file name in the model's folder"):
        load_npuir(text)
