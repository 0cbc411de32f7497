"""ONNX op converters, one per op (and per opset where the op changed), named after the op.

`converter("Conv")` registers a function for opset 1 on; `converter("Squeeze", since=13)` a
second one for the form that moved `axes` from an attribute to an input. The importer picks
the newest converter whose `since` is at most the model's opset.
"""
from __future__ import annotations

CONVERTERS: dict[str, list[tuple[int, object]]] = {}


def converter(op_type: str, since: int = 1):
    def register(fn):
        CONVERTERS.setdefault(op_type, []).append((since, fn))
        CONVERTERS[op_type].sort(key=lambda t: t[0])
        return fn
    return register


def find(op_type: str, opset: int):
    best = None
    for since, fn in CONVERTERS.get(op_type, []):
        if since <= opset:
            best = fn
    return best


from . import elementwise, nn, shape  # noqa: E402,F401  (registration)
