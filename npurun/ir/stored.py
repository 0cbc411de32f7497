"""A constant whose bytes stay in its model file: `Stored`.

A weight read from an ONNX file is held as a Stored: its array, read at load, plus where its
bytes lie in the file. A program that runs the weight only through a packed copy of its own
(the cpu backend's packed sgemm) lets the array go (`release`); whoever asks for it later (a
second compile, `npurun compile` saving the graph, a test) gets it read again from the file.
So a model's float32 weights and their packed panels are not both resident for the program's
life (BERT-base: 835 MB peak against ONNX Runtime's 688, which likewise drops an initializer
once its kernels have pre-packed it).
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

from ..errors import ModelError


class Stored:
    """The array of one constant, read from bytes [offset, offset + nbytes) of `path` (plain
    little-endian data of `dtype`, shaped `shape`), kept until `release`."""

    __slots__ = ("path", "offset", "dtype", "shape", "stamp", "_array", "__weakref__")
    _lock = threading.Lock()

    def __init__(self, path, offset: int, dtype: np.dtype, shape: tuple, array: np.ndarray | None = None):
        self.path, self.offset, self.dtype, self.shape = os.fspath(path), offset, np.dtype(dtype), tuple(shape)
        self.stamp = _stamp(self.path)
        self._array = array

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n

    @property
    def resident(self) -> bool:
        return self._array is not None

    def array(self) -> np.ndarray:
        a = self._array
        if a is None:
            with self._lock:
                a = self._array
                if a is None:
                    a = self._array = self._read()
        return a

    def release(self) -> None:
        """Let the array go (it is read again if asked for)."""
        self._array = None

    def _read(self) -> np.ndarray:
        try:
            if _stamp(self.path) != self.stamp:
                raise ModelError(f"{self.path}: the file changed since the model was loaded (its weights are "
                                 f"read from it again when needed); load it again")
            arr = np.empty(self.shape, self.dtype)
            with open(self.path, "rb") as f:
                read_into(f, self.offset, arr)
        except OSError as e:
            raise ModelError(f"{self.path}: cannot read the model's weights again ({e.strerror or e}); "
                             f"load it again") from None
        return arr


def release_unused(source, compiled) -> int:
    """Let go of the arrays of `source`'s Stored constants that `compiled` (a graph compiled
    from it: folding makes new weights, a BatchNorm folded into a conv leaves the conv's
    original weight unread) does not hold; returns how many. The program holds what it runs
    on; whoever asks `source` for one of these later reads it again."""
    def storeds(g, out):
        for v in g.values.values():
            if isinstance(v.stored, Stored):
                out.add(v.stored)
        for n in g.nodes:
            for r in n.regions.values():
                storeds(r, out)
        return out
    kept = storeds(compiled, set())
    gone = [s for s in storeds(source, set()) if s not in kept and s.resident]
    for s in gone:
        s.release()
    return len(gone)


def read_into(f, offset: int, arr: np.ndarray) -> None:
    """Fill arr (native byte order) from f's little-endian bytes at offset (read(), not a
    mapping: mapped pages would count as this process's memory beside the array)."""
    out = memoryview(arr.reshape(-1).view(np.uint8))  # (bytes: bfloat16 has no buffer format)
    f.seek(offset)
    done = 0
    while done < len(out):
        got = f.readinto(out[done:])
        if not got:
            raise ModelError(f"{getattr(f, 'name', '?')}: file shorter than its tensors")
        done += got
    if sys.byteorder != "little" and arr.dtype.itemsize > 1:
        arr.byteswap(inplace=True)


def _stamp(path: str):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino
