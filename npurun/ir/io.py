"""Files: `.npuir` text plus its weights side file (`NAME.weights.npz`, keyed by value name).

Both files are written atomically (temporary file + rename), so an interrupted save never
leaves a half-written model behind.
"""
from __future__ import annotations

import io
import math
import os
import tokenize
import zipfile
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..util import atomic_write
from .text import INLINE_LIMIT, constants, parse, print_graph, weights_file_of


def weights_path_for(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".npuir") + ".weights.npz")


def save(g, path: str | os.PathLike) -> Path:
    """Write `g` to PATH (.npuir) and its large constants to PATH's .weights.npz."""
    path = Path(path)
    big = {key: v.data for key, v in constants(g) if v.data.size > INLINE_LIMIT}
    wfile = weights_path_for(path) if big else None
    if big:
        buf = io.BytesIO()
        np.savez(buf, **{k: _storable(a) for k, a in big.items()})
        atomic_write(wfile, buf.getvalue())
    atomic_write(path, print_graph(g, weights_file=wfile.name if wfile else None).encode())
    return path


def _storable(a: np.ndarray) -> np.ndarray:
    """The array as the .npz holds it. The ml_dtypes types (bf16, 8- and 4-bit floats, 4- and
    2-bit integers) have no portable npy encoding: store their raw bytes as unsigned words of
    the same width; the text has the type. Strings are stored as a NumPy unicode array (object
    arrays would need pickle; NumPy drops trailing NUL characters of such strings)."""
    if a.dtype == object or a.dtype.kind in "US":
        return np.array([str(s) for s in a.flat], dtype=str).reshape(a.shape)
    if a.dtype.isbuiltin == 2:  # a user-defined (ml_dtypes) type
        return a.view(np.dtype(f"u{a.dtype.itemsize}"))
    return a


def load_npuir(path: str | os.PathLike):
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except (UnicodeDecodeError, IsADirectoryError) as e:
        raise ModelError(f"{path}: not an .npuir text file ({e.__class__.__name__})") from None
    weights = None
    try:
        wname = weights_file_of(text)
    except ValueError as e:  # a bad escape inside weights="..."
        raise ModelError(f"{path}: its weights=\"...\" is not a valid string ({e})") from None
    if wname:
        # Only a file beside the text, as save() writes it: a model's text cannot make the
        # loader read another folder's files (the external-data traversal of CVE-2022-25882).
        if wname != Path(wname).name or wname in (".", "..") or "\0" in wname or "\\" in wname:
            raise ModelError(f"{path}: weights file {wname!r} must be a plain file name in the model's folder")
        weights = read_weights(path.parent / wname, path)
    g = parse(text, file=str(path), weights=weights)
    g.source = str(path)
    return g


# A compressed member may inflate this many times its stored size (plus 64 KB); beyond, it
# is a zip bomb. np.savez (what save() uses) stores members uncompressed.
MAX_INFLATION = 100


def read_weights(wpath: Path, model: Path, kind: str = "weights file") -> dict:
    """The arrays of a weights .npz (or any .npz: `kind` names it in errors), each member's
    header checked before any array is allocated: no pickled objects, no shape claiming more
    bytes than the member holds, no zip bomb."""
    try:
        with zipfile.ZipFile(wpath) as zf:
            out = {}
            for info in zf.infolist():
                key, arr = _member(zf, info, wpath)
                if key in out:
                    raise ModelError(f"{wpath}: member {info.filename!r} appears twice")
                out[key] = arr
            return out
    except FileNotFoundError:
        raise ModelError(f"{model}: its weights file {wpath} is missing") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, RuntimeError,
            SyntaxError, tokenize.TokenError) as e:  # (numpy parses an .npy header as a Python literal)
        raise ModelError(f"{wpath}: corrupt {kind} ({type(e).__name__}: {e})") from None


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, wpath: Path):
    if not info.filename.endswith(".npy"):
        raise ModelError(f"{wpath}: member {info.filename!r} is not an .npy array")
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_INFLATION * info.compress_size + (64 << 10):
        raise ModelError(f"{wpath}: member {info.filename!r} inflates from {info.compress_size} to "
                         f"{info.file_size} bytes; refusing it (over {MAX_INFLATION}x)")
    return info.filename[:-len(".npy")], _checked_array(lambda: zf.open(info), info.file_size,
                                                        f"{wpath}: member {info.filename!r}")


def _checked_array(open_, size: int, where: str) -> np.ndarray:
    """The .npy array `open_()` reads, its header checked before the data is allocated."""
    fmt = np.lib.format
    with open_() as f:
        # The header from the first 64 KB only: a corrupt length field must not make numpy
        # read (and allocate) what it claims (found by tests/fuzz/test_fuzz_batch.py).
        head = io.BytesIO(f.read(1 << 16))
    version = fmt.read_magic(head)
    if version not in ((1, 0), (2, 0)):
        raise ModelError(f"{where}: unknown .npy format version {version[0]}.{version[1]}")
    read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, _, dtype = read_header(head)
    if dtype.hasobject:
        raise ModelError(f"{where} holds Python objects ({dtype}); npurun never unpickles")
    need = math.prod(shape) * dtype.itemsize
    if need > size:
        raise ModelError(f"{where} claims shape {list(shape)} of {dtype} ({need} bytes) but holds {size} bytes")
    with open_() as f:
        return fmt.read_array(f, allow_pickle=False)


def read_npy(path: Path) -> np.ndarray:
    """One .npy file, with the checks of a weights member; ModelError naming it when corrupt."""
    try:
        return _checked_array(lambda: open(path, "rb"), path.stat().st_size, str(path))
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError, RuntimeError) as e:
        raise ModelError(f"{path}: not a readable .npy file ({type(e).__name__}: {e})") from None

