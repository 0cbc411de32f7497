"""The timing, traffic and energy model of one inference on a device, node by node.

For each node npusim decides
  * its precision (`choose_precision`: from --precision, the node's own suffix or its dtype)
    and so its family (int8 | fp16 | a16: 16-bit activations, i.e. int16, w8a16, w4a16),
  * its compute unit: convolutions and matrix products on the matrix unit (HMX), depthwise
    convolutions and everything else on the vector units (HVX); view ops (reshape, flatten,
    ...) and shape arithmetic on constants (an exporter's Shape -> Gather -> Concat chains,
    which the converter folds) cost nothing; a bias add and an activation that directly
    follow a matrix op they alone read are fused into it (the matrix unit's output stage),
  * compute cycles: MACs / (MACs per cycle x tile utilization x calibrated efficiency), where
    tile utilization is what the MAC array loses when a layer's depth, channel or pixel count
    is not a multiple of its tile (x is (N, C, H, W); a pass covers tile[0] input channels x
    tile[1] output channels x tile[2] output pixels); a product of two activations
    (attention's Q K^T, P V) runs at a calibrated share of the weight rate,
  * transfer time per memory tier from the placement (SRAM or DRAM), DMA bursts included;
    weights are stored at the precision's weight width (w4a16: 4 bits plus a 16-bit scale per
    64 weights), activations at its activation width,
  * the node's time: compute and transfer overlap when the node is software-pipelined
    (`pipeline` hint or the device's default; 2 = double buffering): max(c, m) + min(c, m)/p,
    and c + m without pipelining; plus the per-op dispatch overhead.
Everything is in seconds at a given DVFS point; `NodeTiming` carries what the report, the CSV
and the trace need.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...devices import FAMILY, IR_TO_DEVICE, Device
from ...errors import NpurunError
from ...ir.dtypes import to_numpy
from ...ir.graph import Graph
from ...ir.ops import OPS, macs as op_macs
from ...ir.shapes import UNKNOWN, bind, numel, parse_affine

# Ops that only relabel memory: no time, no dispatch.
FREE_OPS = frozenset({"reshape", "flatten", "squeeze", "unsqueeze", "identity", "shape", "size",
                      "constant_of_shape", "dropout"})
# Activations the matrix unit's output stage applies for free after a conv / matmul: the
# piecewise-linear ones (PReLU's per-channel slope is applied like the per-channel requantization
# scale; fusing it lowered the held-out error, docs/npusim.md); sigmoid-based SiLU/swish and
# GELU run as their own vector op.
FUSABLE = frozenset({"relu", "clip", "leaky_relu", "prelu"})
MATRIX_OPS = frozenset({"conv", "matmul", "gemm", "matmul_add"})
# Ops that write into (or read out of) a slice of a buffer along the channel axis: the producer
# writes its part in place, so they cost nothing when the axis is 1 (NCHW channels).
IN_PLACE = frozenset({"concat", "split"})
# Vector work per output element, in MAC-equivalents, for ops heavier than one lane op.
# Normalizations read their input twice (statistics, then the affine); softmax is a max, an
# exp, a sum and a scale per element (and runs at its own calibrated rate); a transcendental
# (sigmoid, tanh, exp, erf) is a table lookup and an interpolating product (HVX's vlut), so 2;
# GELU and SiLU are one of those and a product, 3. (Costing transcendentals as 4-6 lane ops
# made SiLU-heavy YOLOv8 predicted 58% slow; held-out figures in docs/npusim.md.)
VECTOR_OPS_PER_ELEMENT = {"sigmoid": 2, "tanh": 2, "gelu": 3, "erf": 2, "exp": 2,
                          "log_softmax": 6, "layer_normalization": 6, "batch_normalization": 2,
                          "rms_normalization": 5, "simplified_layer_normalization": 5,
                          "instance_normalization": 6, "group_normalization": 6, "prelu": 2,
                          "swish": 3, "hard_swish": 3, "softmax": 10, "masked_softmax": 11,
                          "depth_to_space": 8, "space_to_depth": 8, "transpose": 8, "div": 4, "sqrt": 4,
                          "reciprocal": 4, "resize": 2, "pow": 4}
# Ops timed at the calibrated softmax efficiency rather than the elementwise one.
SOFTMAX_OPS = frozenset({"softmax", "masked_softmax", "log_softmax"})
PRECISION_CHOICES = ("auto", "int8", "fp16", "int16", "w8a16", "w4a16")
# Bytes per element of an activation and of a weight (a constant operand) at each precision.
BYTES = {"int8": 1, "int8_acc16": 1, "fp16": 2, "int16": 2, "w8a16": 2, "w4a16": 2}
WEIGHT_BYTES = {"int8": 1, "int8_acc16": 1, "fp16": 2, "int16": 2, "w8a16": 1, "w4a16": 0.5 + 2 / 64}


@dataclass
class NodeTiming:
    name: str
    op: str
    unit: str  # compute unit name, or "" for a free (view) op
    precision: str
    macs: int = 0
    vector_work: float = 0.0  # MAC-equivalents done on the vector unit
    utilization: float = 1.0  # tile utilization of the unit (before calibrated efficiency)
    sram_bytes: int = 0
    dram_bytes: int = 0
    compute_s: float = 0.0
    transfer_s: float = 0.0
    overhead_s: float = 0.0
    time_s: float = 0.0
    start_s: float = 0.0
    energy_j: float = 0.0
    dram_s: float = 0.0  # the DRAM part of transfer_s
    fused: list[str] = field(default_factory=list)

    @property
    def bound(self) -> str:
        if not self.unit:
            return "free"
        if self.overhead_s >= max(self.compute_s, self.transfer_s):
            return "overhead"
        return "compute" if self.compute_s >= self.transfer_s else "memory"


def resolve_shapes(g: Graph, input_shapes: dict) -> dict[str, tuple]:
    """Concrete shape of every value, binding the inputs' symbolic dims to `input_shapes`."""
    env: dict[str, int] = {}
    for name in g.inputs:
        shape = input_shapes.get(name, g.values[name].shape)
        if not all(isinstance(d, int) for d in shape):
            continue  # left unbound: estimate() asks for this input's shape
        if not bind(g.values[name].shape, tuple(shape), env):
            raise NpurunError(f"{g.source}: input {name!r} cannot have shape {list(shape)}; "
                              f"declared {list(g.values[name].shape)}")
    out = {}
    for nm, v in g.values.items():
        if v.shape is None:  # unknown rank: no concrete shape before a run
            out[nm] = None
            continue
        dims = []
        for d in (input_shapes.get(nm, v.shape) if nm in g.inputs else v.shape):
            if isinstance(d, int):
                dims.append(d)
            elif d != UNKNOWN and (p := parse_affine(d)) and p[1] in env:
                dims.append(p[0] * env[p[1]] + p[2])
            else:
                dims = None
                break
        out[nm] = tuple(dims) if dims is not None else None
    return out


def choose_precision(node, g: Graph, requested: str) -> str:
    """The device precision a node runs at: --precision int8/fp16/int16/w8a16/w4a16 for every
    node; auto takes the node's own suffix (matmul_f16), else its first operand's dtype."""
    if requested not in PRECISION_CHOICES:
        raise NpurunError(f"precision {requested!r}: expected one of {', '.join(PRECISION_CHOICES)}")
    if requested != "auto":
        return requested
    if node.precision in IR_TO_DEVICE:
        return IR_TO_DEVICE[node.precision]
    first = next((i for i in node.inputs if i), None)
    dt = g.values[first].dtype if first else "f32"
    return {"i8": "int8", "u8": "int8", "i16": "int16", "u16": "int16"}.get(dt, "fp16")


def family(precision: str) -> str:
    return FAMILY[precision]


def _quant(n: int, t: int) -> float:
    """Share of `ceil(n / t)` passes of width t that `n` fills."""
    return n / (math.ceil(n / t) * t) if n > 0 else 1.0


def is_matrix_node(node, shapes) -> bool:
    d = OPS.get(node.op)
    if d is not None and d.unit:  # an op registered through npurun.register_op says which unit
        return d.unit == "matrix"
    if node.op in ("matmul", "gemm", "matmul_add", "matmul_integer", "qlinear_matmul"):
        return True
    if node.op in ("conv", "conv_integer", "qlinear_conv", "conv_transpose"):
        w = shapes.get(node.inputs[1 if node.op != "qlinear_conv" else 3])
        return w is not None and w[1] > 1  # depthwise (1 input channel per group) runs on vectors
    return False


def is_dynamic_matmul(node, g: Graph) -> bool:
    """A matrix product of two activations (attention's Q K^T and P V): neither operand is a
    weight laid out ahead of time."""
    return node.op in ("matmul", "matmul_add") and not any(
        g.values[x].is_const for x in node.inputs[:2] if x)


def matrix_utilization(node, shapes, tile) -> float:
    """Tile utilization of the MAC array for a conv or matmul (see the module docstring)."""
    td, tc, tp = tile
    if node.op.startswith("conv") or node.op == "qlinear_conv":
        w = shapes[node.inputs[1 if node.op != "qlinear_conv" else 3]]
        y = shapes[node.outputs[0]]
        cin_g, taps = w[1], math.prod(w[2:])
        groups = OPS[node.op].attrs_of(node).get("group", 1)
        if groups > 1 and cin_g < td:
            # Grouped: groups packed block-diagonally into a tile use cin_g of its td depth.
            depth = cin_g / td
        elif cin_g < td:
            # A thin input (the first layer) is packed tap by tap into the depth.
            depth = _quant(cin_g * taps, td)
        else:
            depth = _quant(cin_g, td)
        return depth * _quant(w[0], tc) * _quant(math.prod(y[2:]) * y[0], tp)
    a, y = shapes[node.inputs[0]], shapes[node.outputs[0]]
    m = math.prod(y[:-1]) if len(y) > 1 else 1
    return _quant(a[-1], td) * _quant(y[-1], tc) * _quant(m, tp)


def vector_work(node, shapes, g) -> float:
    """MAC-equivalents the vector units do for a node."""
    y = shapes.get(node.outputs[0]) if node.outputs else None
    n_out = numel(y) if y else 0
    if node.op in ("conv", "conv_integer"):  # depthwise
        return float(op_macs(node, [shapes.get(i) if i else None for i in node.inputs],
                             [shapes.get(o) for o in node.outputs]))
    if node.op in ("max_pool", "average_pool", "lp_pool"):
        k = OPS[node.op].attrs_of(node)["kernel_shape"]
        return float(n_out * math.prod(k))
    if node.op in ("global_average_pool", "global_max_pool", "reduce_mean", "reduce_sum", "reduce_max"):
        x = shapes.get(node.inputs[0])
        return float(numel(x) if x else n_out)
    d = OPS.get(node.op)
    if d is not None and d.unit == "vector" and not d.vector_ops and d.macs is not None:
        # registered through npurun.register_op with MACs and no vector work of its own
        return float(op_macs(node, [shapes.get(i) if i else None for i in node.inputs],
                             [shapes.get(o) for o in node.outputs]))
    total_out = sum(numel(shapes[o]) for o in node.outputs if o and shapes.get(o))
    return float(total_out * VECTOR_OPS_PER_ELEMENT.get(node.op, (d.vector_ops if d else 0) or 1))


def static_nodes(g: Graph, shapes: dict) -> set[int]:
    """Indices of nodes that compute only from constants and shapes (an exporter's shape
    arithmetic: Shape -> Gather -> Unsqueeze -> Concat -> Reshape): the NPU converter folds
    them, so they are never dispatched. A node is static when all its inputs are constants or
    outputs of static nodes (or of shape/size), and its outputs are small (<= 64 elements)."""
    static_vals = {nm for nm, v in g.values.items() if v.is_const}
    out = set()
    for i, n in enumerate(g.nodes):
        if n.op in ("shape", "size"):
            static_vals.update(n.outputs)
            out.add(i)
            continue
        ins = [x for x in n.inputs if x]
        small = all(shapes.get(o) is not None and numel(shapes[o]) <= 64 for o in n.outputs if o)
        if ins and small and not n.regions and all(x in static_vals for x in ins):
            static_vals.update(n.outputs)
            out.add(i)
    return out


# NCHW <-> NHWC: on a device that keeps every tensor channels-last, the converter turns these
# two permutations into a relabel (no data moves).
LAYOUT_PERMS = ([0, 2, 3, 1], [0, 3, 1, 2])
# What may sit between attention's two products: the scale, the mask, views, the softmax.
_ATTENTION_LINKS = frozenset({"mul", "div", "add", "where", "reshape", "softmax", "masked_softmax", "cast"})


def is_layout_transpose(n) -> bool:
    return n.op == "transpose" and list(OPS["transpose"].attrs_of(n).get("perm") or []) in LAYOUT_PERMS


def attention_interior(g: Graph) -> set[str]:
    """Values between attention's two matrix products (scores, masked scores, probabilities):
    the NPU computes attention in tiles of keys that stay in on-chip memory (a fused, flash-
    style kernel), so these never travel to DRAM, however large (SD's 64x64 self-attention
    scores are 268 MB)."""
    prod = g.producers()
    readers = g.consumers()
    out: set[str] = set()
    for n in g.nodes:
        if n.op not in ("softmax", "masked_softmax"):
            continue
        chain, cur = [], n.inputs[0]
        while cur in prod and prod[cur].op in _ATTENTION_LINKS and prod[cur] is not n:
            chain.append(cur)
            cur = prod[cur].inputs[0] if prod[cur].inputs[0] in prod else prod[cur].inputs[-1]
        chain.append(cur)
        if cur not in prod or not is_dynamic_matmul(prod[cur], g):
            continue
        after, y = [], n.outputs[0]
        while len(readers.get(y, [])) == 1 and readers[y][0].op in ("reshape", "cast"):
            after.append(y)
            y = readers[y][0].outputs[0]
        if any(is_dynamic_matmul(r, g) for r in readers.get(y, [])):
            out.update(chain + after + [y])
    return out


def _bias_like(n, g: Graph, shapes: dict, prev_out: str) -> bool:
    """An add of a constant with one value per output channel (conv: axis 1; matmul: last axis)
    to `prev_out`: a bias the matrix unit's output stage adds."""
    if n.op != "add" or prev_out not in n.inputs[:2]:
        return False
    other = n.inputs[1] if n.inputs[0] == prev_out else n.inputs[0]
    v = g.values.get(other)
    y = shapes.get(prev_out)
    if v is None or not v.is_const or y is None or shapes.get(other) is None:
        return False
    per_channel = {y[-1]} | ({y[1]} if len(y) > 1 else set())
    return numel(shapes[other]) in per_channel | {1}


def fusions(g: Graph, shapes: dict | None = None) -> dict[int, int]:
    """Index of each fused node -> index of the matrix node it is fused into: the chain of bias
    adds and piecewise-linear activations directly after a conv/matmul, each the only reader of
    the value before it."""
    shapes = shapes or {}
    readers = g.consumers()
    out = {}
    for i, n in enumerate(g.nodes[:-1]):
        if n.op not in MATRIX_OPS or not n.outputs:
            continue
        cur, j = n.outputs[0], i + 1
        while j < len(g.nodes):
            nxt = g.nodes[j]
            if len(readers.get(cur, [])) != 1 or cur in g.outputs or readers[cur][0] is not nxt:
                break
            if not ((nxt.op in FUSABLE and nxt.inputs[:1] == [cur]) or _bias_like(nxt, g, shapes, cur)):
                break
            out[j] = i
            cur, j = nxt.outputs[0], j + 1
    return out


def value_bytes(shape, precision: str, dtype: str, weight: bool = False) -> int:
    """Bytes of a value as the device stores it: floats and 8/16-bit integers at the node's
    precision (a weight at its weight width, an activation at its activation width); index
    tensors, masks and packed data at their own width."""
    if shape is None:
        return 0
    n = numel(shape)
    if dtype in ("f32", "f16", "bf16", "f64") or (not weight and dtype in ("i8", "u8", "i16", "u16")):
        return int(math.ceil(n * (WEIGHT_BYTES if weight else BYTES)[precision]))
    return n * to_numpy(dtype).itemsize  # index tensors, masks, packed quantized weights, ...


def node_timings(g: Graph, dev: Device, shapes: dict, placement: dict[str, str], precision: str,
                 freq_hz: float) -> list[NodeTiming]:
    """Per-node timing at clock `freq_hz`; `placement` maps value name -> 'sram' | 'dram'."""
    cal = dev.calibration
    mat, vec = dev.unit("matrix"), dev.unit("vector")
    fused = fusions(g, shapes)
    static = static_nodes(g, shapes)
    interior = attention_interior(g)
    fused_into: dict[int, list[str]] = {}
    for a, m in fused.items():
        fused_into.setdefault(m, []).append(g.nodes[a].name or g.nodes[a].op)
    dram_bw = dev.dram.bandwidth_gbps * 1e9 * cal["dram_share"]
    out = []
    for i, n in enumerate(g.nodes):
        prec = choose_precision(n, g, precision)
        fam = FAMILY[prec]
        nt = NodeTiming(n.name or n.full_op, n.full_op, "", prec)
        in_place = n.op in IN_PLACE and OPS[n.op].attrs_of(n).get("axis") in (1, -3) \
            and len(shapes.get(n.outputs[0]) or ()) == 4
        if n.op in FREE_OPS or i in fused or i in static or in_place or is_layout_transpose(n) or not n.outputs:
            nt.fused = ["(fused)"] if i in fused else []
            out.append(nt)
            continue
        ins = [shapes.get(x) if x else None for x in n.inputs]
        outs = [shapes.get(o) for o in n.outputs]
        if OPS[n.op].unit:  # registered through npurun.register_op: every operand it has
            known = all(shapes.get(x) is not None for x in n.inputs if x)
        else:  # the two a matrix product reads (a scalar scale's shape is (), not unknown)
            known = all(s is not None for s in ins[:2])
        if is_matrix_node(n, shapes) and mat.macs_per_cycle.get(prec, 0) > 0 and known:
            nt.unit = mat.name
            nt.macs = op_macs(n, ins, outs)
            nt.utilization = matrix_utilization(n, shapes, mat.tile)
            eff = cal["matrix_efficiency"][fam]
            if is_dynamic_matmul(n, g):
                eff *= cal["dynamic_matmul_efficiency"]
            rate = mat.count * mat.macs_per_cycle[prec] * nt.utilization * eff * freq_hz
            nt.compute_s = nt.macs / rate if nt.macs else 0.0
            # The fused activation's lanes work in the output stage, overlapped.
        else:
            nt.unit = vec.name
            nt.vector_work = vector_work(n, shapes, g)
            nt.macs = op_macs(n, ins, outs) if n.op in ("conv", "matmul", "gemm") else 0
            lanes = vec.macs_per_cycle.get(prec) or max(vec.macs_per_cycle.values())
            nt.utilization = _quant(shapes[n.outputs[0]][1] if len(shapes.get(n.outputs[0]) or ()) > 1 else 1,
                                    vec.tile[0]) if n.op == "conv" else 1.0
            eff = (cal["depthwise_efficiency"] if n.op in ("conv", "conv_integer")
                   else cal["softmax_efficiency"] if n.op in SOFTMAX_OPS else cal["vector_efficiency"])
            rate = vec.count * lanes * eff * freq_hz
            nt.compute_s = nt.vector_work / rate
        # Traffic: every operand read and result written once, at its tier.
        names = [x for x in n.inputs if x] + [o for o in n.outputs if o]
        if n.op == "gather" and g.values[n.inputs[0]].is_const:
            # a lookup (an embedding table) reads the rows it gathers, not the table
            names = [n.inputs[1], n.outputs[0], n.outputs[0]]
        for nm in names:
            v = g.values[nm]
            b = value_bytes(shapes.get(nm), prec, v.dtype, weight=v.is_const)
            if placement.get(nm, "dram") == "sram" or nm in interior:
                nt.sram_bytes += b
            else:
                nt.dram_bytes += b
        _own_traffic(n, g, shapes, nt)
        bursts = math.ceil(nt.dram_bytes / max(int(n.hints.get("burst", dev.burst_bytes)), 1))
        nt.dram_s = (nt.dram_bytes / dram_bw
                     + bursts * dev.setup_cycles / freq_hz / dev.dma_engines / cal["dram_share"])
        sram_s = nt.sram_bytes / (dev.sram.bandwidth_gbps * 1e9)
        nt.transfer_s = nt.dram_s + sram_s
        p = int(n.hints.get("pipeline", dev.pipeline))
        c, m = nt.compute_s, nt.transfer_s
        busy = max(c, m) + min(c, m) / p if p >= 2 else c + m
        f_top = dev.dvfs[-1].freq_mhz * 1e6
        nt.overhead_s = dev.op_us * cal["op_us_scale"][fam] * 1e-6 * f_top / freq_hz
        nt.time_s = busy
        nt.fused = fused_into.get(i, [])
        out.append(nt)
    share = dispatch_shares(g, [bool(nt.unit) for nt in out], dev.dispatch_width)
    t = 0.0
    for nt, s in zip(out, share):
        nt.overhead_s *= s
        nt.time_s += nt.overhead_s
        nt.start_s = t
        t += nt.time_s
    return out


def dispatch_shares(g: Graph, timed: list[bool], width: int) -> list[float]:
    """Each timed node's share of one per-op dispatch overhead. Ops at the same depth of the
    graph (counted in timed ops along the longest path to them) depend on none of each other,
    and up to `width` of them are dispatched at once, their overheads overlapped: a depth
    holding k ops costs ceil(k / width) overheads, shared evenly by its k ops. With width 1
    every op pays its own. (Why: a graph split per attention head, as AI Hub's Whisper and
    MobileSAM exports are, has 6-8 independent chains of tiny ops; paying each op's overhead
    in series predicted those graphs 1.5-2x slow while graphs of the same depth but fused heads
    were right; docs/npusim.md.)"""
    depth_of: dict[str, int] = {}
    depths = []
    for n, tm in zip(g.nodes, timed):
        d = max((depth_of.get(x, 0) for x in n.inputs if x), default=0) + (1 if tm else 0)
        for o in n.outputs:
            depth_of[o] = d
        depths.append(d)
    count: dict[int, int] = {}
    for d, tm in zip(depths, timed):
        if tm:
            count[d] = count.get(d, 0) + 1
    return [math.ceil(count[d] / width) / count[d] if tm else 0.0 for d, tm in zip(depths, timed)]


def _own_traffic(n, g: Graph, shapes: dict, nt: NodeTiming) -> None:
    """An op registered with its own `bytes` rule (e.g. a lookup that reads a few rows of a
    table) moves that many bytes rather than all its operands: both tiers are scaled by the
    rule's bytes over the operands' bytes at their own dtypes."""
    d = OPS[n.op]
    names = [x for x in n.inputs if x] + [o for o in n.outputs if o]
    if d.bytes is None or any(shapes.get(nm) is None for nm in names):
        return
    pair = lambda nm: (shapes[nm], g.values[nm].dtype) if nm else None  # noqa: E731
    own = d.bytes(d.attrs_of(n), [pair(x) for x in n.inputs], [pair(o) for o in n.outputs])
    full = sum(numel(shapes[nm]) * to_numpy(g.values[nm].dtype).itemsize for nm in names)
    if full > 0:
        nt.sram_bytes = int(nt.sram_bytes * own / full)
        nt.dram_bytes = int(nt.dram_bytes * own / full)


def graph_overhead_s(dev: Device, precision_family: str, io_bytes: int = 0) -> float:
    """Per-inference overhead of a graph whose MACs are mostly of `precision_family` (int8 |
    fp16 | a16): launch and sync, plus moving the graph's inputs and outputs (host float32
    buffers: `io_bytes`) in and out at the calibrated host I/O rate."""
    return (dev.graph_us * dev.calibration["graph_us_scale"][precision_family] * 1e-6
            + io_bytes / (dev.calibration["io_gbps"] * 1e9))


def io_bytes(g: Graph, shapes: dict) -> int:
    """Bytes of the graph's inputs and outputs as the host holds them (float32 for floats)."""
    total = 0
    for nm in list(g.inputs) + list(g.outputs):
        s = shapes.get(nm)
        if s is not None:
            total += numel(s) * max(to_numpy(g.values[nm].dtype).itemsize, 4 if g.values[nm].dtype.startswith("f") else 1)
    return total


def node_energy(nt: NodeTiming, dev: Device, voltage: float) -> float:
    """Dynamic energy of one node: MACs (matrix and vector) and bytes moved per tier, scaled by
    (V / V_ref)^2 for the compute part."""
    v2 = (voltage / dev.reference_voltage) ** 2
    e = (nt.macs if nt.unit and nt.unit == dev.unit("matrix").name else nt.vector_work) \
        * dev.pj_per_mac[nt.precision] * v2
    e += nt.sram_bytes * dev.pj_per_byte["sram"] + nt.dram_bytes * dev.pj_per_byte["dram"]
    return e * 1e-12
