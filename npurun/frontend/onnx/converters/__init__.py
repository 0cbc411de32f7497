"""ONNX op converters, one per op (and per opset where the op changed), named after the op.

`converter("Conv")` registers a function for opset 1 on; `converter("Squeeze", since=13)` a
second one for the form that moved `axes` from an attribute to an input. The importer picks
the newest converter whose `since` is at most the opset the model imports for the op's domain
(`ai.onnx` unless `domain=` says otherwise, e.g. `"ai.onnx.preview"`).
"""
from __future__ import annotations

CONVERTERS: dict[tuple[str, str], list[tuple[int, object]]] = {}


def converter(op_type: str, since: int = 1, domain: str = ""):
    def register(fn):
        versions = CONVERTERS.setdefault((domain, op_type), [])
        versions.append((since, fn))
        versions.sort(key=lambda t: t[0])
        return fn
    return register


def find(op_type: str, opset: int, domain: str = ""):
    best = None
    for since, fn in CONVERTERS.get(("" if domain == "ai.onnx" else domain, op_type), []):
        if since <= opset:
            best = fn
    return best


from ....ir.ops import _register_families  # noqa: E402

_register_families(__name__, __path__)
