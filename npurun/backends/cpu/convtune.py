"""Which conv kernel, measured on this machine (the cuDNN `benchmark` idea, for the cpu backend).

nativeconv's rules (`flat_chosen`, `gemm_chosen`, `winograd.chosen`, ...) were tuned on the
machines this project was developed on, and the best kernel for a shape moves with the CPU: on
an AVX2-only AMD EPYC (2 vCPUs, two 128-bit FMA pipes) ResNet-50's 3x3 convs over 14x14 and 7x7
maps and its 1x1 convs ran 1.5-2.5x faster as im2col + sgemm than through the rule's implicit
GEMM at 2 threads, where on the AVX-512 Xeon the rules came from the implicit and the
flat-pixel GEMM win. So the first call of a conv of a new shape times the kernels that can run
it, once each, then the close ones again (hot: the second round), and every later call of that
shape, in any node of any program, runs the fastest. A rule that fits one machine becomes a
measurement that fits each.

Dense convs choose among the rule's pick, the implicit GEMM, the flat-pixel GEMM, im2col +
sgemm and Winograd (where each applies); depthwise convs between their two kernels (8 channels
in the lanes, or a channel's row). Not measured (the rule decides): other grouped convs (one
kernel; groups >= 16 wide run as dense convs, each measured), convs under TUNE_MIN_FLOPS (a
choice worth microseconds, timed in noise), convs over TUNE_MAX_FLOPS (ESPCN's 4K layers: the
rule was tuned on them, and ten extra runs of a 100 ms conv are a second of start-up), and any
call while the device is contended (pieces.wanted(): the timings would measure the other
task; measured on a later call). `NPURUN_CONV_TUNE=0` keeps the rules alone.

Kernels differ in rounding, so a choice that flipped from one process to the next (two
kernels within the timing noise) would make the same model give outputs that differ in the
last bits between two runs of `npurun run`. So the choices are kept in a file per user,
`~/.cache/npurun/convtune.json` (`NPURUN_CONV_TUNE_FILE` elsewhere), under this machine's
name: a shape measured once is run with that kernel by every later process on this machine
(which also skips the measuring: a server's restart starts as fast as before), and by the
processes running beside it: before measuring a shape it has not seen, a process reads what
the others have written since it last read the file (`_refresh`: a Ray worker's choices reach
its driver; a test once saw a Ray job's output differ from a local run's by 1 in one pixel). A kernel
replaces the rule's pick only when it is at least MARGIN faster, so a near-tie keeps the rule.
A missing, unreadable or foreign file is measured afresh and rewritten (atomically);
`choices()` lists this process's view (tests, bench/convtune_ab.py).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from ...util import atomic_write, cpu_model
from .. import pieces

TUNE_MIN_FLOPS = 2e6     # ~50 us at the slow end: below, any kernel will do
TUNE_MAX_FLOPS = 2e9     # ~50 ms at 40 GFLOP/s: above, the rule
GEMM_MAX_BYTES = 64 << 20  # im2col's matrix (the gemm candidate) at most this big
# A pointwise conv's map at most this big is also measured as the transposed product. Offered
# on every map size it won alone and lost in the model: when it read the input in place,
# ResNet-50 1.10x the run and DenseNet-121 1.15x (1 thread); with its pixels packed in groups
# (2026-12-04, night), 0.97-0.99 at 1 thread but Keras Xception 1.09x at 2 (in-model, two
# processes alternating)
TGEMM_MAX_PIXELS = 400
# Other convs are offered as the transposed product over im2col^T wherever the zero-padded copy
# of the input it makes (kept in a per-thread buffer) is at most this big. 1 thread, against ORT:
# 256->256 3x3 on 7x7 1.67 -> 1.18 (gemm -> tgemm), 512->512 1.41 -> 1.12, 256->256 3x3 stride 2
# 1.56 -> 1.11, ResNet's 3->64 7x7 stride-2 stem 1.41 -> 1.11 (flat -> tgemm); Winograd keeps
# the stride-1 3x3 convs on bigger maps (0.4-0.6)
TGEMM_MAX_BYTES = 8 << 20
ROUNDS = 2               # rounds of the close candidates after the first (choose says why)
CLOSE = 1.5              # candidates within this of the first round's best are timed again
MARGIN = 0.9             # another kernel replaces the rule's pick at <= this x its time

_choices: dict[str, str] = {}   # repr(shape key) -> algo; this process's view of the file
_loaded: list = []              # the file's path once read
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("NPURUN_CONV_TUNE", "1") != "0"


def path() -> Path:
    return Path(os.environ.get("NPURUN_CONV_TUNE_FILE") or Path.home() / ".cache" / "npurun" / "convtune.json")


# Bumped when a kernel changes enough to move choices (2: im2col + sgemm folds a batch's small
# images into one product; 3: the per-channel depthwise kernel in AVX-512; 4: its rows four at a
# time and its stride-2 fill in AVX-512; 5: a pointwise conv's im2col panels packed in groups;
# 6: pointwise convs also as the transposed product; 7: its pixels packed first, ~1.3x faster
# on 7x7 maps; 8: the im2col GEMM writes whole panels straight to the output and reads a
# pointwise conv's input in place, up to 1.6x faster on big maps; 9: every dense conv may run as
# the transposed product; 10: its copy and packing on the threads; 11: its tile stored by
# transposes, ~1.2x on convs from RGB; 12: pointwise ones packed once for all threads; 13: its
# activation per group of pixels, in C; 14: the rule picks it for one-row outputs, 1-D convs;
# 15: grouped convs measured, each group as the transposed product against the rule's kernels;
# 16: depthwise convs on small maps as one flat row a plane, dwconv_flat.c): choices measured
# against the old kernels (or without a candidate now offered) are measured again.
KERNELS = 16


def machine() -> str:
    """What the choices depend on: the CPU's model and count, the kernels' ISA and version (the
    key holds the thread count)."""
    from . import native
    return f"{cpu_model()} / {os.cpu_count()} cpus / {native.ISA}" + (f" / kernels {KERNELS}" if KERNELS > 1 else "")


def _file(p: Path) -> dict:
    """The file's contents, {"machines": {machine: {key: algo}}}, with anything else in it
    (unreadable, another shape, a non-string algo) left out."""
    try:
        data = json.loads(p.read_text())
        machines = data["machines"]
    except (OSError, ValueError, KeyError, TypeError):
        return {"machines": {}}
    if not isinstance(machines, dict):
        return {"machines": {}}
    return {"machines": {m: {k: v for k, v in got.items() if isinstance(v, str)}
                         for m, got in machines.items() if isinstance(got, dict)}}


def _load() -> None:
    p = path()
    if _loaded[:1] != [p]:
        _choices.clear()
        _choices.update(_file(p)["machines"].get(machine(), {}))
        _loaded[:] = [p, _stamp(p)]


def _stamp(p: Path):
    try:
        st = p.stat()
        return st.st_mtime_ns, st.st_size
    except OSError:
        return None


def _refresh() -> None:
    """Before measuring a shape this process has not seen: the choices other processes have
    written to the file since it was read (a Ray worker, a server's other process), so that a
    shape measured anywhere on this machine runs with one kernel, and the same bits, in every
    process. This process's own choices stay as they are."""
    p = path()
    stamp = _stamp(p)
    if _loaded[1:] != [stamp]:
        for k, v in _file(p)["machines"].get(machine(), {}).items():
            _choices.setdefault(k, v)
        _loaded[:] = [p, stamp]


def _save(key: str, algo: str) -> None:
    """Add one choice to the file: read, merge, write atomically (another process may have
    added its own meanwhile). A file that cannot be written leaves the choice in memory."""
    p = path()
    data = _file(p)
    mine = data["machines"].setdefault(machine(), {})
    mine[key] = algo
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(p, json.dumps(data, indent=1, sort_keys=True).encode())
    except OSError:
        return
    for k, v in mine.items():  # what the others wrote meanwhile is read with it: no re-read
        _choices.setdefault(k, v)
    _loaded[:] = [p, _stamp(p)]


def choices() -> dict[str, str]:
    """Every choice known to this process (measured here or read from the file): repr(shape
    key) -> algo ("rule": the rule's pick)."""
    with _lock:
        _load()
        return dict(_choices)


def candidates(c, m, group, geo, ho, wo, begin, end) -> list[str]:
    """The kernels that can run this dense conv: the rule's own pick ("rule") first, then each
    forced algorithm whose preconditions (nativeconv.conv2d's) hold."""
    if group != 1:  # (grouped, not depthwise: the rule's kernels, or each group as the transposed product)
        return ["rule", "tgemm"] if tgemm_fits(c // group, geo, ho, wo, begin, end) else []
    kh, kw = geo[:2]
    out = ["rule", "direct"]
    if min(*begin, *end) >= 0:
        out.append("flat")
        if 4 * (c * kh * kw + 1) * ho * wo <= GEMM_MAX_BYTES:
            out.append("gemm")
    if geo[:6] == (3, 3, 1, 1, 1, 1) and min(c, m) >= 8:
        out.append("winograd")
    if geo == (1, 1, 1, 1, 1, 1, 0, 0) and tuple(end) == (0, 0):
        if ho * wo <= TGEMM_MAX_PIXELS:
            out.append("tgemm")  # pointwise on a small map: the transposed product (nativeconv._tgemm)
    elif tgemm_fits(c, geo, ho, wo, begin, end):
        out.append("tgemm")  # any other: the same product over im2col^T (its padded input copied)
    return out


def tgemm_fits(c, geo, ho, wo, begin, end) -> bool:
    """Whether a dense conv (geometry `geo` as candidates' and nativeconv's) can run as the
    transposed product: no negative pad, and its zero-padded input at most TGEMM_MAX_BYTES."""
    kh, kw, sh, sw, dh, dw = geo[:6]
    return min(*begin, *end) >= 0 and 4 * c * ((ho - 1) * sh + (kh - 1) * dh + 1) \
        * ((wo - 1) * sw + (kw - 1) * dw + 1) <= TGEMM_MAX_BYTES


def dw_candidates(begin, flat: bool = False) -> list[str]:
    """A depthwise conv's kernels: the per-channel one ("direct"), where no pad is negative the
    one with the channels in the lanes (dwconv_cl.c), and where it fits (`flat`:
    nativeconv.dw_flat_fits) a small plane as one flat row (dwconv_flat.c)."""
    cands = ["rule", "direct", "dw_lanes"] if min(begin) >= 0 else ["rule", "direct"]
    if flat:
        cands.append("dw_flat")
    return cands if len(cands) > 2 else []


def choose(key: tuple, flops: float, cands: list, run) -> tuple[str, bool]:
    """The algo for conv shape `key` and whether that is final: measured once per process
    (`run(algo)` computes the conv with that algo); "rule" where this conv is not measured
    (final), or not now (a contended device: not final, measured on a later call)."""
    if len(cands) < 2 or not TUNE_MIN_FLOPS <= flops <= TUNE_MAX_FLOPS or not enabled():
        return "rule", True
    k = repr(key)
    with _lock:
        _load()
        if k not in _choices:
            _refresh()
        if k in _choices:
            return _choices[k], True
    if pieces.wanted():
        return "rule", False
    first = {}
    for a in cands:
        # An untimed call first: a candidate's first call packs its weights (Winograd's
        # transforms cost several of its runs) and, at 2 threads, may start the pool's
        # workers; timed in, that cost sent fast kernels out of the second round for good.
        run(a)
        first[a] = _time(run, a)
    best = min(first.values())
    close = [a for a in cands if first[a] <= CLOSE * best]
    # The close ones again, ROUNDS times in turn, each kept at its fastest call: with one call
    # each, a neighbour's burst on a shared VM decided, and a choice stays for good (the corpus's
    # convs not touched by a kernel change, measured twice an hour apart on a 2-vCPU VM: 33 of
    # 147 choices differed).
    second = first
    if len(close) > 1:
        second = {a: first[a] for a in close}
        for _ in range(ROUNDS):
            for a in close:
                second[a] = min(second[a], _time(run, a))
    pick = min(second, key=second.get)
    if "rule" in second and second[pick] > MARGIN * second["rule"]:
        pick = "rule"  # a near-tie: not worth a change of kernel (and of rounding)
    with _lock:
        _choices[k] = pick
        _save(k, pick)
    return pick, True


def _time(run, algo) -> float:
    t0 = time.perf_counter()
    run(algo)
    return time.perf_counter() - t0
