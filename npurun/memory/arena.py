"""Offsets in one arena per memory space, and in-place reuse.

A *buffer* is a piece of an arena one or more values occupy in turn. Most values get their
own buffer; a value computed in place takes over the buffer of an operand that dies at that
very step (the operand is read and the result written element by element, so one buffer is
enough): elementwise ops (`tanh`, `add` of a bias, `cast` between equal-size types) and
reshapes (`reshape`, `flatten`, `squeeze`, `unsqueeze`: same bytes, new shape). A chain
`conv -> tanh -> mul` whose intermediates die at their reader is one buffer.

Offsets: a buffer gets the lowest offset (aligned to `ALIGN` bytes) at which it overlaps no
buffer already placed that is live at the same time; buffers are taken largest first
(the greedy-by-size heuristic of TFLite's and Vela's arena planners), so big tensors pack
tightly and small ones fill the gaps. The verifier (verify.py) proves the result.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph
from ..ir.ops import OPS
from .liveness import LiveRange

ALIGN = 64
RESHAPES = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Buffer:
    values: list[str]          # the values that occupy it, in schedule order
    start: int
    end: int
    size: int                  # bytes, aligned
    space: str = ""
    offset: int = -1
    score: float = 0.0         # placement benefit (placement.py)
    meta: dict = field(default_factory=dict)

    def overlaps(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


def inplace_pairs(g: Graph, ranges: dict[str, LiveRange]) -> dict[str, str]:
    """result -> operand for each node that may write its result over a dying operand."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for i, n in enumerate(g.nodes):
        if len(n.outputs) != 1 or n.regions:
            continue
        groups = OPS[n.op].groups
        if "elementwise" not in groups and n.op not in RESHAPES:
            continue
        y = ranges.get(n.outputs[0])
        if y is None or y.kind != "act" or y.bytes is None:
            continue
        operands = n.inputs[:1] if n.op in RESHAPES else n.inputs
        for x_name in operands:
            x = ranges.get(x_name) if x_name else None
            if (x is not None and x.kind == "act" and x.end == i and x.bytes == y.bytes
                    and x_name not in taken and n.inputs.count(x_name) == 1):
                out[y.name] = x_name
                taken.add(x_name)
                break
    return out


def buffers(ranges: dict[str, LiveRange], pairs: dict[str, str]) -> list[Buffer]:
    """One buffer per value, in-place chains merged into one."""
    owner: dict[str, Buffer] = {}
    out = []
    for r in sorted(ranges.values(), key=lambda r: (r.start, r.name)):
        if r.bytes is None:
            continue
        src = pairs.get(r.name)
        if src in owner:
            b = owner[src]
            b.values.append(r.name)
            b.end = max(b.end, r.end)
            b.size = max(b.size, aligned(r.bytes))
        else:
            b = Buffer([r.name], r.start, r.end, aligned(r.bytes))
            out.append(b)
        owner[r.name] = b
    return out


class Arena:
    """The buffers of one memory space; `capacity` None means unbounded (DRAM)."""

    def __init__(self, space: str, capacity: int | None = None):
        self.space, self.capacity = space, capacity
        self.placed: list[Buffer] = []
        # start, end, offset, size of the placed buffers: one vectorized overlap test per fit
        self._cols = np.zeros((4, 64), np.int64)

    def fit(self, b: Buffer) -> int | None:
        """Lowest offset where `b` fits beside the buffers live at the same time, or None."""
        n = len(self.placed)
        st, en, off_, sz = self._cols[:, :n]
        live = (st <= b.end) & (b.start <= en)
        lo, size = off_[live], sz[live]
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], -(-(lo[order] + size[order]) // ALIGN) * ALIGN
        # Walking the live buffers by offset, the first gap before buffer j is what lies between
        # the highest end below it and its start.
        reach = np.maximum.accumulate(hi) if len(hi) else hi
        before = np.concatenate([[0], reach[:-1]])
        ok = before + b.size <= lo
        off = int(before[np.argmax(ok)]) if ok.any() else (int(reach[-1]) if len(reach) else 0)
        if self.capacity is not None and off + b.size > self.capacity:
            return None
        return off

    def add(self, b: Buffer, offset: int) -> None:
        b.space, b.offset = self.space, offset
        n = len(self.placed)
        if n == self._cols.shape[1]:
            self._cols = np.concatenate([self._cols, np.zeros_like(self._cols)], axis=1)
        self._cols[:, n] = (b.start, b.end, offset, b.size)
        self.placed.append(b)

    def place(self, b: Buffer) -> bool:
        off = self.fit(b)
        if off is None:
            return False
        self.add(b, off)
        return True

    @property
    def size(self) -> int:
        """Bytes the arena needs: its highest end offset."""
        return max((p.offset + p.size for p in self.placed), default=0)


def allocate(space: str, bufs: list[Buffer], capacity: int | None = None) -> tuple[Arena, list[Buffer]]:
    """Greedy by size: (the arena, the buffers that did not fit)."""
    arena, left = Arena(space, capacity), []
    for b in sorted(bufs, key=lambda b: (-b.size, b.start)):
        if not arena.place(b):
            left.append(b)
    return arena, left
