"""Bugs the fuzzers found in code this suite may not change (npurun/passes, backends/cpu,
backends/base.py, runtime, csrc: the lead's), each with a strict xfail test that reproduces
it (named in BUGS). A fuzz case that fails in exactly such a way is counted under its id in
the figures instead of failing the target; any other failure still fails it. When a bug is
fixed its xfail test starts passing, which fails the suite (strict) until the entry here and
the xfail mark are removed."""
from __future__ import annotations


# id -> (what, the xfail test that reproduces it, predicate on the case's exception)
# (none open: L1, a Loop ignoring its run's timeout, L2 and L3, conv hangs and SIGFPE, are fixed)
BUGS: dict = {}


def classify(e: BaseException) -> str | None:
    for bug, (_, _, pred) in BUGS.items():
        if pred(e):
            return bug
    return None
