"""Backends, registered in one dict by name. A device string is `BACKEND[:TARGET]`."""
from __future__ import annotations

from ..errors import BackendError
from .base import Backend, Program
from .cpu import CpuBackend
from .reference import ReferenceBackend

BACKENDS: dict[str, type[Backend]] = {
    ReferenceBackend.name: ReferenceBackend,
    CpuBackend.name: CpuBackend,
}


def parse_device(device: str) -> tuple[str, str | None]:
    backend, _, target = device.partition(":")
    return backend, (target or None)


def get_backend(device: str, parallelism: int = 1) -> Backend:
    name, target = parse_device(device)
    cls = BACKENDS.get(name)
    if cls is None:
        raise BackendError(f"unknown device {device!r}: backends are {', '.join(BACKENDS)} "
                           f"(a device is BACKEND[:TARGET])")
    ok, why = cls.available()
    if not ok:
        raise BackendError(f"device {device!r} is unavailable: {why}")
    if target is not None and name in ("reference", "cpu"):
        raise BackendError(f"device {device!r}: backend {name} takes no target")
    return cls(target, parallelism)


__all__ = ["BACKENDS", "Backend", "Program", "get_backend", "parse_device"]
