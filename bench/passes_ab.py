"""A/B of cpu lowering passes on corpus models: the cpu pipeline as it is against the same
pipeline without the named passes, alternating in one process, outputs compared; prints, per
model and thread count, how many nodes each pass fused and the time ratio (with / without).
Never asserts.

    python bench/passes_ab.py --passes fuse_attention,fuse_rotary --only text,speech [--threads 1 2]

Judges a new lowering pass on every corpus model it touches (bench/corpus.py builds them).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from corpus import path, selected  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", required=True, help="comma-separated lowering passes to take out for B")
    ap.add_argument("--only", help="corpus models, producers or domains (bench/corpus.py --list)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--time", type=float, default=2.0, help="seconds of alternating runs per model and threads")
    args = ap.parse_args()
    import npurun
    from npurun.backends import get_backend
    from npurun.commands.bench import alternate
    from npurun.passes import pipeline as PL
    drop = set(args.passes.split(","))
    full = PL.PIPELINES["cpu"]
    without = [p for p in full if PL.pass_name(p) not in drop]
    print(f"| model | threads | nodes fused | with / without | max rel. difference |")
    print("|---|---|---|---:|---:|")
    ratios = []
    for spec in selected(args.only):
        try:
            graph, feeds = npurun.load(path(spec.name, build=False)), spec.feeds()
        except Exception as e:  # noqa: BLE001 -- not built, or not loadable: say so, go on
            print(f"| {spec.name} | | {type(e).__name__}: {str(e)[:80]} | | |")
            continue
        shapes = {k: v.shape for k, v in feeds.items()}
        lowered = {}
        for key, passes in (("with", full), ("without", without)):
            PL.PIPELINES["cpu"] = passes
            try:
                lowered[key] = PL.prepare(graph, "cpu", shapes)
            finally:
                PL.PIPELINES["cpu"] = full
        fused = {op: sum(n.op == op for n in lowered["with"].nodes) for op in ("attention", "rope_half")}
        if not any(fused.values()):
            print(f"| {spec.name} | | none | | |")
            continue
        for t in args.threads:
            be = get_backend("cpu", t)
            progs = {k: be.compile(g) for k, g in lowered.items()}
            outs = {k: p.run(feeds) for k, p in progs.items()}
            diff = max(float(np.abs(np.asarray(outs["with"][o], np.float64) - outs["without"][o]).max()
                             / max(float(np.abs(outs["without"][o]).max()), 1e-30))
                       for o in graph.outputs if np.asarray(outs["without"][o]).dtype.kind == "f")
            times = alternate({k: (lambda p=p: p.run(feeds)) for k, p in progs.items()}, args.time, 5)
            med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            r = med["with"] / med["without"]
            ratios.append(r)
            print(f"| {spec.name} | {t} | {fused} | {r:.3f} | {diff:.1e} |", flush=True)
    if ratios:
        print(f"\ngeometric mean with / without: {np.exp(np.mean(np.log(ratios))):.3f} over {len(ratios)} runs")


if __name__ == "__main__":
    main()
