"""Per-node precision overrides: `Conv=int8,/blocks.3/*=fp16,head.fc=fp32`.

Each comma-separated rule is `KEY=PRECISION`. KEY is an op type, in ONNX spelling (`Conv`,
`MatMul`, `LayerNormalization`) or npurun's (`conv`, `layer_normalization`), or else a node
name or a glob over node names (`/blocks.3/*`, fnmatch rules). Later rules win over earlier
ones. A rule that matches no node of the graph is an error naming it (a typo never passes
silently).
"""
from __future__ import annotations

import fnmatch

from ..ir.ops import OPS
from . import USER_NAME, PrecisionError, ir_precision

_BY_FOLDED = {k.replace("_", ""): k for k in OPS}  # "layernormalization" -> "layer_normalization"


def op_of(key: str) -> str | None:
    """The npurun op a key names (`MatMul`, `matmul`), or None when it is not an op type."""
    return _BY_FOLDED.get(key.replace("_", "").lower())


def parse_overrides(spec) -> list[tuple[str, str]]:
    """`"Conv=int8,/a/*=fp16"` (or a dict, or a list of pairs) -> [(key, ir precision)]."""
    if not spec:
        return []
    if isinstance(spec, dict):
        items = list(spec.items())
    elif isinstance(spec, str):
        items = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            key, sep, prec = part.rpartition("=")
            if not sep or not key.strip():
                raise PrecisionError(f"precision override {part!r}: expected KEY=PRECISION "
                                     f"(e.g. Conv=int8 or /blocks.3/*=fp16)")
            items.append((key.strip(), prec.strip()))
    else:
        items = list(spec)
    return [(k, ir_precision(p, f"precision override {k!r}")) for k, p in items]


def resolve(rules: list[tuple[str, str]], nodes) -> dict[int, tuple[str, str]]:
    """id(node) -> (ir precision, the rule text) for every node a rule forces."""
    forced: dict[int, tuple[str, str]] = {}
    for key, prec in rules:
        op = op_of(key)
        hits = [n for n in nodes if n.name == key or (n.name and fnmatch.fnmatchcase(n.name, key))]
        if op is not None and not hits:
            hits = [n for n in nodes if n.op == op]
        if not hits:
            kind = f"op type {op!r}" if op else "node name or pattern"
            raise PrecisionError(f"precision override {key!r}: no node matches this {kind}; "
                                 f"use an op type (Conv, MatMul, ...) or a node name/glob of this graph")
        for n in hits:
            forced[id(n)] = (prec, f"{key}={USER_NAME[prec]}")
    return forced
