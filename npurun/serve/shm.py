"""System shared memory (the KServe/Triton extension): tensors pass by region name, not
through the socket.

A local client creates a POSIX shared-memory object (`shm_open(KEY)`, on Linux the file
/dev/shm/KEY; tritonclient.utils.shared_memory does this), registers it under a NAME with an
offset and a byte size, then names the region in an input's or output's parameters. The
server maps exactly [offset, offset + byte_size) of the object and only ever touches it
through the name the client registered:

- the key is one plain file name under /dev/shm (no `/` inside, no `..`, no symbolic link,
  a regular file), and the object must already be at least offset + byte_size long;
- every read or write is bounds-checked against the registered byte size;
- inputs are copied out of the region once (the run never sees memory the client may change
  under it); outputs are copied in once, after checking they fit.

Calls come from the event loop (register, unregister) and from worker threads (tensor reads
and writes); a lock guards the table so a region is never unmapped while it is read or
written.
"""
from __future__ import annotations

import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from .protocol import ServeError

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"^/?[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    map: mmap.mmap
    start: int  # where offset lies inside `map` (mmap offsets must be page-aligned)


class SharedMemory:
    def __init__(self, root: Path = SHM_ROOT, max_regions: int = 64):
        self.root, self.max_regions = Path(root), max_regions
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    # --- the extension's endpoints
    def register(self, name: str, key, offset, byte_size) -> None:
        if not _NAME.match(name):
            raise ServeError(400, f"shared-memory region name {name!r}: use 1-128 letters, digits, '_', '.', '-'")
        if not isinstance(key, str) or not _KEY.match(key) or key.strip("/") in (".", ".."):
            raise ServeError(400, f"shared-memory region {name!r}: key {key!r} must be one POSIX shm name "
                                  f"like '/my_region' (letters, digits, '_', '.', '-')")
        for what, v in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ServeError(400, f"shared-memory region {name!r}: {what} must be a non-negative integer, got {v!r}")
        if byte_size == 0:
            raise ServeError(400, f"shared-memory region {name!r}: byte_size must be positive")
        with self._lock:
            if name in self._regions:
                raise ServeError(400, f"shared-memory region {name!r} is already registered; unregister it first")
            if len(self._regions) >= self.max_regions:
                raise ServeError(400, f"shared-memory region {name!r}: the server holds its limit of "
                                      f"{self.max_regions} regions; unregister some first")
            self._regions[name] = self._map(name, key, offset, byte_size)

    def _map(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        path = self.root / key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ServeError(400, f"shared-memory region {name!r}: no shared-memory object {key!r}") from None
        except OSError as e:  # a symbolic link (ELOOP), no permission, ...
            raise ServeError(400, f"shared-memory region {name!r}: cannot open {key!r} ({e.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ServeError(400, f"shared-memory region {name!r}: {key!r} is not a shared-memory object")
            if offset + byte_size > st.st_size:
                raise ServeError(400, f"shared-memory region {name!r}: offset {offset} + byte_size {byte_size} "
                                      f"is past the end of {key!r} ({st.st_size} bytes)")
            start = offset % mmap.ALLOCATIONGRANULARITY
            m = mmap.mmap(fd, start + byte_size, offset=offset - start)
        finally:
            os.close(fd)
        return Region(name, key, offset, byte_size, m, start)

    def unregister(self, name: str | None = None) -> None:
        """Forget one region (all of them when `name` is None); an unknown name is a no-op, as
        in Triton."""
        with self._lock:
            gone = list(self._regions) if name is None else [name] if name in self._regions else []
            for n in gone:
                self._regions.pop(n).map.close()

    def status(self, name: str | None = None) -> list[dict]:
        with self._lock:
            if name is not None and name not in self._regions:
                raise ServeError(404, f"no shared-memory region {name!r} is registered")
            regs = [self._regions[name]] if name is not None else list(self._regions.values())
            return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regs]

    # --- tensors
    def _region(self, name, off: int, size: int) -> Region:
        r = self._regions.get(name) if isinstance(name, str) else None
        if r is None:
            raise ServeError(400, f"shared-memory region {name!r} is not registered")
        if off + size > r.byte_size:
            raise ServeError(400, f"shared-memory region {name!r}: offset {off} + {size} bytes is past its "
                                  f"registered byte_size {r.byte_size}")
        return r

    def check(self, name, off: int, size: int) -> None:
        with self._lock:
            self._region(name, off, size)

    def read(self, name, off: int, size: int) -> bytes:
        """A copy of `size` bytes at `off` in region `name`."""
        with self._lock:
            r = self._region(name, off, size)
            return r.map[r.start + off:r.start + off + size]

    def write(self, name, off: int, size: int, data: bytes, tensor: str) -> None:
        """Put `data` at `off` in region `name`, whose caller-given slot is `size` bytes."""
        if len(data) > size:
            raise ServeError(400, f"output {tensor!r} is {len(data)} bytes, its shared-memory slot in "
                                  f"{name!r} is {size}")
        with self._lock:
            r = self._region(name, off, size)
            r.map[r.start + off:r.start + off + len(data)] = data

    def close(self) -> None:
        self.unregister(None)
