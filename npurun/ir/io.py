"""Files: `.npuir` text plus its weights side file (`NAME.weights.npz`, keyed by value name).

Both files are written atomically (temporary file + rename), so an interrupted save never
leaves a half-written model behind.
"""
from __future__ import annotations

import io
import os
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
    wname = weights_file_of(text)
    if wname:
        wpath = path.parent / wname
        try:
            with np.load(wpath, allow_pickle=False) as z:
                weights = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise ModelError(f"{path}: its weights file {wpath} is missing") from None
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
            raise ModelError(f"{wpath}: corrupt weights file ({e})") from None
    g = parse(text, file=str(path), weights=weights)
    g.source = str(path)
    return g
