"""The BLAS libraries' thread counts, held to a value for the length of a call.

NumPy's BLAS threads are process-wide: a Program limits them to its parallelism for one run
(and a product already split over the Program's threads to one), then restores them, so the
caller's own NumPy work is left as it was. The libraries are found once through threadpoolctl;
a call then costs one get per library plus a set only where the count differs (~1-2 us),
where `ThreadpoolController.limit()` rebuilds its view of every library each time (~20 us warm,
far more after an idle gap: a streaming caller's small model felt it on every run)."""
from __future__ import annotations

_LIBS: list | None = None


def _libs() -> list:
    global _LIBS
    if _LIBS is None:
        try:
            from threadpoolctl import ThreadpoolController
            _LIBS = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:  # noqa: BLE001 - no controllable BLAS: nothing to hold back
            _LIBS = []
    return _LIBS


def with_threads(n: int, fn):
    """fn() with every BLAS library at `n` threads, their counts restored after."""
    changed = []
    for lib in _libs():
        had = lib.get_num_threads()
        if had != n:
            lib.set_num_threads(n)
            changed.append((lib, had))
    try:
        return fn()
    finally:
        for lib, had in changed:
            lib.set_num_threads(had)
