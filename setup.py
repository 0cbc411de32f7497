"""Builds the cpu backend's optional C kernels (csrc/) during `pip install`; the rest of the
package configuration lives in pyproject.toml.

The kernels are a plain shared library loaded with ctypes (npurun/backends/cpu/native.py),
compiled for AVX2 + FMA. It is optional: where there is no C compiler the install still
succeeds and the cpu backend runs its NumPy kernels, with the reason shown by `npurun info`.
"""
import glob
import platform

from setuptools import Extension, setup

x86 = platform.machine().lower() in ("x86_64", "amd64")
ext = Extension(
    "npurun.backends.cpu._kernels",
    # Every C file of csrc/ is one translation unit of the library; headers are templates.
    sources=sorted(glob.glob("csrc/*.c")),
    depends=sorted(glob.glob("csrc/*.h")),
    extra_compile_args=["-O3", "-mavx2", "-mfma", "-std=c11", "-fno-math-errno"],
    optional=True,
)
# The one Python-level helper of the bindings (csrc/py/addr.c: an array's address without
# numpy's per-access ctypes object); portable C, so built on every platform.
addr = Extension("npurun.backends.cpu._addr", sources=["csrc/py/addr.c"], optional=True)
setup(ext_modules=[ext, addr] if x86 else [addr])
