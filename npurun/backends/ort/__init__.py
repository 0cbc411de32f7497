"""The `ort` backend: a compiled graph handed to ONNX Runtime with a chosen execution provider.

Devices: `ort:CPUExecutionProvider` (the default target; `ort:cpu` too), `ort:CUDAExecutionProvider`,
`ort:QNNExecutionProvider`, `ort:OpenVINOExecutionProvider`, `ort:DmlExecutionProvider`, ...
(short names: cpu, cuda, qnn, openvino, dml, tensorrt, coreml). The graph is exported back to
ONNX (export.py; QDQ form for i8 nodes); each maximal run of nodes that export becomes one
ONNX Runtime session, and nodes that do not export run on the reference kernels between them.

Provider options (QNN: `backend_path`, `htp_performance_mode`, `qnn_context_priority`,
`vtcm_mb`, ...) are passed through unchanged, later sources winning: npurun's configuration
(section `qnn`, where its schema has those keys), `OrtBackend.configure(provider, **options)`,
and the variable `NPURUN_ORT_PROVIDER_OPTIONS="key=value,key=value"` (the device's provider).

ONNX Runtime is optional: imported when a program is compiled or a device is checked.
"""
from __future__ import annotations

import importlib.util
import os

from ...errors import BackendError
from ...ir.dtypes import FLOAT_TYPES
from .. import register
from ..base import Backend

ALIASES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "qnn": "QNNExecutionProvider",
           "openvino": "OpenVINOExecutionProvider", "dml": "DmlExecutionProvider",
           "directml": "DmlExecutionProvider", "tensorrt": "TensorrtExecutionProvider",
           "coreml": "CoreMLExecutionProvider"}
# Options of the QNN provider npurun documents (others pass through the same way).
QNN_OPTIONS = ("backend_path", "htp_performance_mode", "qnn_context_priority", "vtcm_mb",
               "htp_graph_finalization_optimization_mode", "soc_model", "htp_arch", "device_id",
               "enable_htp_fp16_precision", "profiling_level")
ORT_TYPES = frozenset({"f32", "f16", "bf16", "f64", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64",
                       "bool", "str"})


def exports_to_onnx(node, graph) -> bool:
    """The node does not export to an ONNX op ONNX Runtime runs (no such op up to the opset
    npurun exports, or an attribute with no ONNX counterpart)."""
    from .export import exportable
    return exportable(node) is None


def tensor_values(node, graph) -> bool:
    """A sequence or optional value, or an element type the export does not carry (8/4-bit
    floats, sub-byte integers)."""
    if graph is None:
        return True
    names = [i for i in node.inputs if i] + list(node.outputs)
    return all(graph.values[n].kind == "tensor" and graph.values[n].dtype in ORT_TYPES
               for n in names if n in graph.values)


def precision_exports(node, graph) -> bool:
    """Its precision suffix has no ONNX form here: f32, f16 and bf16 export as casts, and i8 as
    QDQ for matmul with a constant 2-D weight and conv with a constant weight."""
    p = node.precision
    if p in (None, "f32", "f16", "bf16"):
        return True
    if p != "i8" or graph is None or node.op not in ("matmul", "conv"):
        return False
    w = graph.values.get(node.inputs[1])
    return (w is not None and w.is_const and graph.values[node.inputs[0]].dtype in FLOAT_TYPES
            and (node.op == "conv" or w.data.ndim == 2))


@register
class OrtBackend(Backend):
    """ONNX Runtime sessions with one execution provider (the graph exported back to ONNX)."""

    specializes = False  # (see Backend.specializes)

    name = "ort"
    rules = (exports_to_onnx, tensor_values, precision_exports)
    fallback = "reference"
    options: dict[str, dict] = {}  # provider -> provider options, set by configure()

    def __init__(self, target=None, parallelism=1):
        super().__init__(target, parallelism)
        self.provider = ALIASES.get((target or "cpu").lower(), target or "CPUExecutionProvider")
        import onnxruntime as ort
        have = ort.get_available_providers()
        if self.provider not in have:
            raise BackendError(f"device 'ort:{target}': ONNX Runtime {ort.__version__} here has no "
                               f"{self.provider}; its providers are {', '.join(have)} "
                               f"(a provider comes with its own onnxruntime build, e.g. onnxruntime-qnn)")
        self.provider_options = {**_config_options(self.provider), **self.options.get(self.provider, {}),
                                 **_env_options()}

    @classmethod
    def available(cls):
        if importlib.util.find_spec("onnxruntime") is None:
            return False, "ONNX Runtime is not installed (pip install onnxruntime~=1.32.0)"
        return True, ""

    @classmethod
    def configure(cls, provider: str, **options) -> None:
        """Provider options for every later `ort:` backend of `provider` (values pass through
        to ONNX Runtime as strings)."""
        provider = ALIASES.get(provider.lower(), provider)
        cls.options[provider] = {k: str(v) for k, v in options.items()}

    def compile(self, graph):
        from .program import OrtProgram
        return OrtProgram(graph, self)


def _config_options(provider: str) -> dict:
    """QNN options from npurun's configuration (section `qnn`), where its schema declares them;
    an option the schema does not know is simply not read from there."""
    if provider != "QNNExecutionProvider":
        return {}
    from ...config import SCHEMA, load
    cfg = load()  # a broken configuration is a ConfigError naming the file and key
    return {k: str(cfg.get("qnn", k)) for k in QNN_OPTIONS
            if k in SCHEMA["qnn"] and cfg.get("qnn", k) not in (None, "", 0)}


def _env_options() -> dict:
    raw = os.environ.get("NPURUN_ORT_PROVIDER_OPTIONS", "").strip()
    out = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        k, sep, v = part.partition("=")
        if not sep or not k.strip():
            raise BackendError(f"NPURUN_ORT_PROVIDER_OPTIONS: {part!r} is not key=value")
        out[k.strip()] = v.strip()
    return out
