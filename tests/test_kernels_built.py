"""setup.py builds csrc/ as an optional extension, so that a machine without a C compiler still
installs (the cpu backend then runs NumPy kernels and `npurun info` says why). The price: a
compile error in csrc/ fails nothing at `pip install` — the library is simply absent (or, in a
development tree, the previous build keeps running) and every test file of the compiled kernels
skips with its reason. This test makes that a failure wherever the kernels can be built."""
import platform
import shutil
import sys

import pytest

from npurun.backends.cpu import native


def test_the_compiled_kernels_are_loaded_where_they_can_be_built():
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the compiled kernels are built for x86-64 Linux only")
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("no C compiler here: the install falls back to the NumPy kernels")
    if {"avx2", "fma"} - native._cpu_flags():
        pytest.skip(f"this CPU cannot run them: {native.REASON}")
    assert native.LIB is not None, f"compiled kernels unavailable: {native.REASON}"
    assert native._bind is not None, "csrc/py/addr.c's bound calls are not built"
