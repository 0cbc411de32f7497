"""Bugs the fuzzers found in code this suite may not change (npurun/passes, backends/cpu,
backends/base.py, runtime, csrc: the lead's), each with a strict xfail test that reproduces
it (named in BUGS). A fuzz case that fails in exactly such a way is counted under its id in
the figures instead of failing the target; any other failure still fails it. When a bug is
fixed its xfail test starts passing, which fails the suite (strict) until the entry here and
the xfail mark are removed."""
from __future__ import annotations

import traceback


def _frames(e: BaseException) -> list[tuple[str, str]]:
    """(file, function) of every frame the exception (and its causes) passed through."""
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out += [(f.filename.replace("\\\\", "/"), f.name) for f in traceback.extract_tb(e.__traceback__)]
        e = e.__cause__ or e.__context__
    return out


def _hang_in_control_flow(e) -> bool:
    # L1: a Loop/Scan body runs with no slice boundary, so the run's timeout never fires
    from fuzzkit import CaseHang
    return isinstance(e, CaseHang) and any(f.endswith("reference/kernels/control.py") and fn in ("loop", "scan")
                                           for f, fn in _frames(e))


# id -> (what, the xfail test that reproduces it, predicate on the case's exception)
BUGS = {
    "L1": ("a Loop or Scan with a huge trip count ignores the run's timeout and cancellation",
           "tests/fuzz/test_fuzz_onnx.py::test_loop_honours_the_run_timeout", _hang_in_control_flow),
}


def classify(e: BaseException) -> str | None:
    for bug, (_, _, pred) in BUGS.items():
        if pred(e):
            return bug
    return None
