"""The BLAS libraries' thread counts, held to a value for the length of a call.

NumPy's BLAS threads are process-wide: a Program limits them to its parallelism for one run
(and a product already split over the Program's threads to one), then restores them, so the
caller's own NumPy work is left as it was. The libraries are found once through threadpoolctl;
OpenBLAS's own get/set functions are then called directly, one ctypes call each. Through
threadpoolctl's controller objects a get + set + restore cost ~0.85 ms after an idle gap on
a 2-core VM (0.3 ms directly), which a streaming small model (silero-vad, one chunk every
32 ms) paid on every run; `ThreadpoolController.limit()` rebuilt its view of every library
each time on top of that.

Nested calls (a product split over a Program's own threads runs its parts at one) restore the
enclosing call's count; when the last call in flight on any thread leaves, the counts found
when the first one entered come back. Runs on two threads at once that ask for different
counts share one process-wide setting meanwhile, but never leave it changed."""
from __future__ import annotations

import sys
import threading

_LIBS: list | None = None  # (get, set) per BLAS library
_MODULES = -1  # len(sys.modules) when _LIBS was found
_LOCK = threading.Lock()
_active = 0  # calls inside with_threads now, on every thread
_base: list = []  # each library's count when the first of them entered
_now: list = []  # each library's count now (read on the first entry, then as set here)


def _libs() -> list:
    """The BLAS libraries loaded now, found again whenever modules were imported since the
    last look (a library arrives with an import: scipy's or torch's own OpenBLAS loaded after
    a first run would otherwise run its products at its default thread count). Called with
    _LOCK held; never while a call is in flight (`_now` and `_base` are per library)."""
    global _LIBS, _MODULES
    if _LIBS is None or (len(sys.modules) != _MODULES and _active == 0):
        _MODULES = len(sys.modules)
        try:
            from threadpoolctl import ThreadpoolController
            _LIBS = [_get_set(c) for c in ThreadpoolController().select(user_api="blas").lib_controllers]
        except Exception:  # noqa: BLE001 - no controllable BLAS: nothing to hold back
            _LIBS = []
    return _LIBS


def _get_set(controller) -> tuple:
    """OpenBLAS's own functions where its threads are its own (pthreads; with OpenMP the
    count is per thread and threadpoolctl goes through OpenMP); else the controller's methods."""
    symbol = getattr(controller, "_get_symbol", None)
    if controller.internal_api == "openblas" and getattr(controller, "threading_layer", "") != "openmp" and symbol:
        get, set_ = symbol("openblas_get_num_threads"), symbol("openblas_set_num_threads")
        if get is not None and set_ is not None:
            return get, set_
    return controller.get_num_threads, controller.set_num_threads


def with_threads(n: int, fn):
    """fn() with every BLAS library at `n` threads, their counts restored after."""
    global _active, _base
    with _LOCK:  # (_libs looks again only here, lock held, with no call in flight)
        libs = _libs()
        if libs:
            if _active == 0:
                _now[:] = _base = [get() for get, _ in libs]
            had = list(_now)
            _active += 1
            _set(libs, [n] * len(libs))
    if not libs:
        return fn()
    try:
        return fn()
    finally:
        with _LOCK:
            _active -= 1
            _set(libs, _base if _active == 0 else had)


def _set(libs, counts):
    """Set each library whose count (as last set here, lock held) differs."""
    for i, ((_, set_), c) in enumerate(zip(libs, counts)):
        if _now[i] != c:
            set_(c)
            _now[i] = c
