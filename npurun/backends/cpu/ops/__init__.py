"""The cpu backend's own kernels beyond convolution and activations, one module per op family
(attention and normalization, recurrent cells, elementwise chains, integer matmul, ...).

Each module defines `KERNELS: dict[op name, factory]`; `factory(program)` returns the kernel
the CpuProgram calls for that op (the program gives `threads` and `pool`). A kernel takes the
same arguments as the op's reference kernel and must return the same result (checked in
tests against the reference kernel on random inputs); for inputs it does not handle (a dtype,
a rank) it calls the reference kernel itself. Modules here are loaded automatically.
"""
from __future__ import annotations

import importlib
import pkgutil

FACTORIES: dict = {}
for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    FACTORIES.update(getattr(importlib.import_module(f"{__name__}.{_m.name}"), "KERNELS", {}))
