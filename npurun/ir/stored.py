"""A constant whose bytes stay in its model file: `Stored`.

A weight read from an ONNX file is held as a Stored: its array, read at load, plus where its
bytes lie in the file. A program that runs the weight only through a packed copy of its own
(the cpu backend's packed sgemm) lets the array go (`release`); whoever asks for it later (a
second compile, `npurun compile` saving the graph, a test) gets it read again from the file
(held open, `Source`, so a file replaced under its name still reads as it was loaded).
So a model's float32 weights and their packed panels are not both resident for the program's
life, as ONNX Runtime drops an initializer once its kernels have pre-packed it (BERT-base's
peak RSS 835 -> 489 MB; ONNX Runtime's 624-697).
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

from ..errors import ModelError


HOLD_OPEN_MIN = 1 << 20  # bytes: a model file from this size on is held open while it is in use


class Source:
    """A model (or external data) file that constants are read from. From HOLD_OPEN_MIN bytes
    on it is held open while any of its constants lives, so a file replaced or deleted under
    its name (an atomic save, a new version deployed beside a running server) still reads as
    it was loaded; a smaller one is opened by name again. Either way a file changed in place
    (size or mtime not as loaded) is refused with a ModelError."""

    __slots__ = ("path", "stamp", "_file", "_lock", "__weakref__")

    def __init__(self, path, stamp=None):
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._file = open(self.path, "rb")
        st = os.fstat(self._file.fileno())
        self.stamp = (st.st_size, st.st_mtime_ns)
        if stamp is not None and self.stamp != tuple(stamp):
            self._file.close()
            raise ModelError(f"{self.path}: the file changed since the model was loaded; load it again")
        if st.st_size < HOLD_OPEN_MIN:
            self._file.close()
            self._file = None

    @classmethod
    def of_open(cls, path, file) -> "Source":
        """A Source on a file opened already (by onnx's external data resolver, which checks
        and opens in one step): held open whatever its size, never opened by name again."""
        self = cls.__new__(cls)
        self.path, self._lock, self._file = os.fspath(path), threading.Lock(), file
        st = os.fstat(file.fileno())
        self.stamp = (st.st_size, st.st_mtime_ns)
        return self

    def __reduce__(self):  # (a graph sent to another process: the file opened there by name)
        return Source, (self.path, self.stamp)

    def __del__(self):
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()

    def read_into(self, offset: int, arr: np.ndarray) -> None:
        try:
            with self._lock:
                f = self._file if self._file is not None else open(self.path, "rb")
                try:
                    st = os.fstat(f.fileno())
                    if (st.st_size, st.st_mtime_ns) != self.stamp:
                        raise ModelError(f"{self.path}: the file changed since the model was loaded (its "
                                         f"weights are read from it again when needed); load it again")
                    read_into(f, offset, arr)
                finally:
                    if f is not self._file:
                        f.close()
        except OSError as e:
            raise ModelError(f"{self.path}: cannot read the model's weights again ({e.strerror or e}); "
                             f"load it again") from None


class Stored:
    """The array of one constant, read from bytes [offset, offset + nbytes) of `source` (a
    Source, or a path; plain little-endian data of `dtype`, shaped `shape`), kept until
    `release`."""

    __slots__ = ("source", "offset", "dtype", "shape", "_array", "__weakref__")
    _lock = threading.Lock()

    def __init__(self, source, offset: int, dtype: np.dtype, shape: tuple, array: np.ndarray | None = None):
        # (a path, a Source, or any object with `path` and `read_into(offset, arr)`)
        self.source = Source(source) if isinstance(source, (str, os.PathLike)) else source
        self.offset, self.dtype, self.shape = offset, np.dtype(dtype), tuple(shape)
        self._array = array

    @property
    def path(self) -> str:
        return self.source.path

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
                    a = np.empty(self.shape, self.dtype)
                    self.source.read_into(self.offset, a)
                    self._array = a
        return a

    def release(self) -> None:
        """Let the array go (it is read again if asked for)."""
        self._array = None


def let_go(value) -> None:
    """Drop the array of a constant read from a model file (it is read again if anyone asks).
    A pass calls it on a weight its rewrite leaves unread (a BatchNorm or a layer scale folded
    into a new weight), so the original and the folded copy are not both resident until the
    compile ends and `release_unused` runs: ConvNeXt-T's compile peaked at 243 MB, 77 MB of
    originals beside their folded copies. A weight no file holds is left alone."""
    s = getattr(value, "stored", None)
    if isinstance(s, Stored) and isinstance(s.source, Source):
        s.release()


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
