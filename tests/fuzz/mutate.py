"""Hypothesis strategies for mutation fuzzing: a seed file's bytes changed the way a disk, a
network or an attacker changes them (bit flips, overwritten runs, cut or repeated ranges,
truncation, interesting integers), as a libFuzzer-style mutator would, but drawn by
hypothesis so a failure shrinks to the fewest, smallest edits."""
from __future__ import annotations

import struct

from hypothesis import strategies as st

# Values that break size arithmetic: 0, -1, sign bits, 2^31/2^32/2^63/2^64 neighbours.
INTERESTING_INTS = [0, 1, -1, 2, 7, 8, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                    2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 32, 2**64 - 1, -(2**31), -(2**63)]


def varint(v: int) -> bytes:
    """Protobuf base-128 varint of v (negative numbers as their 64-bit two's complement)."""
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _packed(v: int) -> list[bytes]:
    return [varint(v), struct.pack("<q", v if -(2**63) <= v < 2**63 else -1),
            struct.pack("<i", v if -(2**31) <= v < 2**31 else -1)]


_EDIT = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**32), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 2**32), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 2**32), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 2**32), st.integers(1, 64)),
    st.tuples(st.just("repeat"), st.integers(0, 2**32), st.integers(1, 64), st.integers(1, 8)),
    st.tuples(st.just("truncate"), st.integers(0, 2**32)),
    st.tuples(st.just("int"), st.integers(0, 2**32), st.sampled_from(INTERESTING_INTS), st.integers(0, 2)),
)


def apply(seed: bytes, edits) -> bytes:
    b = bytearray(seed)
    for e in edits:
        if not b:
            b = bytearray(b"\x00")
        kind, pos = e[0], e[1] % (len(b) + 1)
        if kind == "flip" and pos < len(b):
            b[pos] ^= 1 << e[2]
        elif kind == "set" and pos < len(b):
            b[pos] = e[2]
        elif kind == "insert":
            b[pos:pos] = e[2]
        elif kind == "delete":
            del b[pos:pos + e[2]]
        elif kind == "repeat":
            b[pos:pos] = bytes(b[pos:pos + e[2]]) * e[3]
        elif kind == "truncate":
            del b[pos:]
        elif kind == "int":
            enc = _packed(e[2])[e[3]]
            b[pos:pos + len(enc)] = enc
    return bytes(b)


@st.composite
def mutated(draw, seeds: list[bytes], max_edits: int = 8):
    """(seed index, mutated bytes) from one of `seeds`."""
    i = draw(st.integers(0, len(seeds) - 1))
    edits = draw(st.lists(_EDIT, min_size=1, max_size=max_edits))
    return i, apply(seeds[i], edits)
