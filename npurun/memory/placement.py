"""Tier placement: which buffer lives in which memory space, and which operands are staged.

Graph inputs and outputs stay in DRAM0 (the host writes inputs there and reads outputs from
there). Every other buffer - intermediates and weights - competes for the fast tier by
benefit: the bytes it would serve from fast memory (accesses x bytes) per byte-step of fast
memory it occupies (bytes x live steps), i.e. accesses / live steps. A value read soon and often
(a conv output read by the next node) ranks high; one read once far away (a skip connection, a
band's result waiting for the final concat) ranks low, as does a weight read once in a long
schedule. In that order each buffer takes the lowest free offset of the fast arena; what does
not fit tries the middle tier (NPU_CACHE), then DRAM0 (which always fits).

A node with an operand in DRAM0 streams it through the fast tier: a ring of `pipeline`
buffers of `burst` bytes, the next burst fetched while the current one is used (double
buffering at pipeline=2). The node gets the hints `pipeline=` and `burst=` (the IR's schedule
hints), and the staging ring is reserved at the bottom of the fast arena for the whole run.
A weight larger than the fast tier is streamed this way ("weight streaming").
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from .arena import Arena, Buffer, aligned, allocate
from .liveness import LiveRange
from .tiers import FAST, MID, SLOW, Tiers

STAGING = "<staging>"  # the pseudo-value of the staging ring in the fast arena


STREAMS = 3  # operands a node streams at once: two inputs and its result (a concat copies
             # its parts one after another, so it needs no more)


def staging_bytes(g: Graph, tiers: Tiers) -> int:
    """Room for the staging rings: `pipeline` bursts per stream of the widest node."""
    widest = max((len([i for i in n.inputs if i]) + len(n.outputs) for n in g.nodes), default=0)
    return aligned(min(widest, STREAMS) * tiers.pipeline * tiers.burst)


def score(b: Buffer, ranges: dict[str, LiveRange]) -> float:
    """Accesses per live step: the benefit per byte-step of fast memory the buffer takes."""
    accesses = sum(ranges[v].reads + (ranges[v].producer is not None) for v in b.values)
    return accesses / (b.end - b.start + 1)


def place(g: Graph, ranges: dict[str, LiveRange], bufs: list[Buffer], tiers: Tiers) -> dict[str, Arena]:
    """Assign every buffer a space and an offset; returns the arena of each space."""
    steps = max(len(g.nodes), 1)
    fast = Arena(FAST, tiers.fast.size)
    reserve = staging_bytes(g, tiers)
    if reserve and (tiers.fast.size is None or reserve <= tiers.fast.size):
        fast.add(Buffer([STAGING], 0, steps - 1, reserve), 0)
    mid = Arena(MID, tiers.mid.size)
    pinned, candidates = [], []
    for b in bufs:
        kinds = {ranges[v].kind for v in b.values}
        (pinned if kinds & {"input", "output"} else candidates).append(b)
    for b in candidates:
        b.score = score(b, ranges)
    # Who gets the fast tier: best benefit density first (among equals the bigger benefit),
    # admitted while the bytes live at every step of its range still fit. Offsets come after,
    # largest first, which packs far tighter than placing in benefit order; a buffer that then
    # finds no gap (fragmentation) moves down a tier.
    room = (tiers.fast.size - fast.size) if tiers.fast.size is not None else None
    use = np.zeros(steps + 1, np.int64)
    chosen, rest = [], []
    for b in sorted(candidates, key=lambda b: (-b.score, -b.size, b.start)):
        lo, hi = max(b.start, 0), b.end + 1
        if room is None or int(use[lo:hi].max(initial=0)) + b.size <= room:
            use[lo:hi] += b.size
            chosen.append(b)
        else:
            rest.append(b)
    for b in sorted(chosen, key=lambda b: (-b.size, b.start)):
        if not fast.place(b):
            rest.append(b)
    for b in sorted(rest, key=lambda b: (-b.score, -b.size, b.start)):
        if not (tiers.mid.size and mid.place(b)):
            pinned.append(b)
    slow, _ = allocate(SLOW, pinned)
    return {FAST: fast, MID: mid, SLOW: slow}


def staged_operands(g: Graph, space_of: dict[str, str], ranges: dict[str, LiveRange]) -> dict[int, list[str]]:
    """step -> the operands it streams from DRAM0 (sized tensors only)."""
    out = {}
    for i, n in enumerate(g.nodes):
        names = [nm for nm in dict.fromkeys([x for x in n.inputs if x] + list(n.outputs))
                 if nm in ranges and ranges[nm].bytes and space_of.get(nm) == SLOW]
        if names:
            out[i] = names
    return out
