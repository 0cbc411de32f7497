"""The graph npusim times: what a model becomes before the NPU converter sees it. The standard
passes every entry point runs (`prepare`: constants and shape arithmetic folded, no-ops
removed, BatchNorm folded), then the fusions that turn an exporter's spelled-out LayerNorm,
GELU, SiLU/hard-swish and masked softmax into the single ops the NPU runs them as. The
builders of npurun/zoo/architectures already write those as single ops, so an exported model
and its builder are timed alike."""
from __future__ import annotations

from ...ir.graph import Graph
from ...passes.fuse_gelu import fuse_gelu
from ...passes.fuse_hard_swish import fuse_hard_swish
from ...passes.fuse_layer_norm import fuse_layer_norm
from ...passes.fuse_masked_softmax import fuse_masked_softmax
from ...passes.fuse_swish import fuse_swish
from ...passes.pipeline import prepare, run_pipeline

LOWERING = [fuse_layer_norm, fuse_hard_swish, fuse_swish, fuse_gelu, fuse_masked_softmax]


def npusim_view(graph: Graph, shapes: dict | None = None) -> Graph:
    return run_pipeline(prepare(graph, "npusim", shapes or {}), LOWERING)
