"""Backends, registered in one dict by name. A device string is `BACKEND[:TARGET]`."""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import BackendError
from .base import Backend, Program, Step

BACKENDS: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: make a backend reachable by its device name."""
    BACKENDS[cls.name] = cls
    return cls


# Every subpackage is a backend; importing it registers it. A backend whose library is
# optional (torch, ...) must import that library lazily and say so in `available()`.
for _m in pkgutil.iter_modules(__path__):
    if _m.ispkg:
        importlib.import_module(f"{__name__}.{_m.name}")


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


__all__ = ["BACKENDS", "Backend", "Program", "Step", "get_backend", "parse_device", "register"]
