"""ONNX Runtime's contrib ops (domain `com.microsoft`, and the few it adds to ai.onnx), the ones
its own tools emit: the quantizer (`quantize_static` QOperator/QDQ, `quantize_dynamic`), the
transformer optimizer, session-level graph optimization saved to a file, and the GenAI model
builder. Each is registered through the public `npurun.register_op`, one module per family,
with a reference kernel checked against ONNX Runtime (tests/test_contrib_*.py), a cost for
npusim and, where it carries time, a cpu kernel. Semantics follow ONNX Runtime's operator
schemas (docs/ContribOperators.md) and, where those are silent, its CPU kernels.
"""
from ..ir.ops import _register_families

_register_families(__name__, __path__)
