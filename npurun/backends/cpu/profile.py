"""Per-node time of a compiled Program: where a run's time goes (`npurun bench --profile`).

Each step's kernel is wrapped with a timer for the profiled runs only; the Program's own
overhead per step (argument lookup, freeing dead values) shows as the gap between the sum
of the steps and the whole run."""
from __future__ import annotations

import time
from collections import defaultdict

from ..base import Step


def profile(program, feeds: dict, runs: int = 3) -> tuple[list[tuple[str, str, float]], float]:
    """([(node label, op (+fused activation), median ms)], median ms of the whole run),
    steps in program order."""
    spent: dict[int, list[float]] = defaultdict(list)
    saved = program.steps
    wrapped = []
    for k, (n, fn, attrs, dead) in enumerate(saved):
        def timed(*a, _fn=fn, _k=k, **kw):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                spent[_k].append(time.perf_counter() - t0)
        wrapped.append(Step(n, timed, attrs, dead))
    program.steps = wrapped
    whole = []
    try:
        program.run(feeds)  # warm-up (packs weights)
        spent.clear()
        for _ in range(runs):
            t0 = time.perf_counter()
            program.run(feeds)
            whole.append(time.perf_counter() - t0)
    finally:
        program.steps = saved
    med = lambda v: sorted(v)[len(v) // 2] * 1e3  # noqa: E731
    rows = []
    for k, (n, fn, attrs, dead) in enumerate(saved):
        op = n.op + (f"+{attrs['activation']}" if attrs.get("activation") else "")
        rows.append((n.label(), op, med(spent[k]) if spent[k] else 0.0))
    return rows, med(whole)


def by_op(rows) -> list[tuple[str, int, float]]:
    """(op, count, total ms), largest first."""
    acc: dict[str, list] = {}
    for _, op, ms in rows:
        a = acc.setdefault(op, [0, 0.0])
        a[0] += 1
        a[1] += ms
    return sorted(((op, c, t) for op, (c, t) in acc.items()), key=lambda r: -r[2])
