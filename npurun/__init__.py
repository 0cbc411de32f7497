"""npurun: make AI accelerators usable.

    import npurun
    g = npurun.load("model.onnx")                 # NPU-IR graph (or a .npuir file)
    exe = npurun.Executor(device="cpu", parallelism=2)
    outputs = exe.run_sync(g, {"input": x})       # or: await exe.run(g, inputs)
    sess = npurun.InferenceSession("model.onnx")  # ONNX Runtime-shaped API
    g8 = npurun.compile("model.onnx", precision="auto", calibration="random:8")  # per-node precision
    npurun.register_op("swish2", domain="my.ops", reference=fn, ...)  # an op of your own (docs/adding-ops.md)
    gen = npurun.Generator("models/llm")          # text generation, KV cache in place (docs/generate.md)
"""
__version__ = "0.1.0"

from .errors import NpurunError
from .frontend import load
from .ir import Graph, parse, print_graph, save, verify
from .runtime import Executor, InferenceSession
from .compiler import compile  # noqa: A001  (npurun.compile, as the issue names it)
from .registry import REQUIRED, custom_op, register_op, registered_ops, unregister_op
from . import contrib  # noqa: E402,F401  (the com.microsoft ops, registered through register_op)
from .generate import Generator  # noqa: E402

__all__ = ["__version__", "NpurunError", "load", "save", "parse", "print_graph", "verify",
           "Graph", "Executor", "InferenceSession", "compile", "register_op", "custom_op",
           "registered_ops", "unregister_op", "REQUIRED", "Generator"]
