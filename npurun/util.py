"""Small helpers shared by several layers."""
from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a
    part: write a temporary file in the same folder, fsync it, then rename over the target."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def memory_limit() -> int:
    """Bytes this process may allocate at most: the machine's memory, or less under an
    address-space limit (RLIMIT_AS)."""
    import resource
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return total if soft == resource.RLIM_INFINITY else min(total, soft)


def check_fits(nbytes: int, what) -> None:
    """An InputError when `nbytes` is more than the process can have: said before the
    allocation, which would fail (or, with overcommit, succeed and be killed later). `what`
    names the value: a string, or a function that makes it (only called to fail)."""
    if nbytes > (1 << 28) and nbytes > memory_limit():
        from .errors import InputError
        what = what() if callable(what) else what
        raise InputError(f"{what} would take {nbytes / 2**30:.1f} GiB; this process can have at most "
                         f"{memory_limit() / 2**30:.1f} GiB")


def trim_malloc() -> bool:
    """Give the pages glibc malloc holds free back to the system now (after a program let
    weight arrays go, ir/stored.py: freed in the middle of a heap, they would stay resident).
    False where this is not glibc."""
    import ctypes
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
