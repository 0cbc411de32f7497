"""MatMulNBits: a float A times a weight matrix quantized to 2, 4 or 8 bits in blocks along K,
as ONNX Runtime's MatMulNBitsQuantizer and the GenAI model builder write it.

B is (N, k_blocks, blob_size) uint8, k_blocks = ceil(K / block_size), each blob the block's
`bits`-bit values packed from the low bits of each byte up. Scales are (N, k_blocks) (or
flat); zero points are packed the same way (uint8; default 2^(bits-1)) or floats of the
scales' shape. With g_idx (K,), row k of the weights uses block g_idx[k] (act-order). Then
Y = A @ dequantize(B)^T (+ bias): (..., K) -> (..., N). (ONNX Runtime 1.32's CPU kernel ignores
packed zero points when g_idx is given, using 2^(bits-1); npurun applies them, as the operator's
definition says.) accuracy_level 4 -- what the GenAI builder writes for the CPU -- quantizes A
to int8 per block as ONNX Runtime's kernel does (`int8_activations`): an int4 model's logits
then agree with ONNX Runtime's to float32 rounding instead of to ~1%.

The reference dequantizes on every call. The cpu kernel runs 4-bit weights at accuracy_level 4
on csrc/nbits.c's int4 x int8 kernels, the weights kept packed (backends/cpu/ops/int4.py);
anything else it dequantizes once to float32 (K, N), keeps, and runs the cpu backend's matmul.
"""
from __future__ import annotations

import numpy as np

from ..backends.reference.kernels import KERNELS as REF
from ..ir.ops import _fail
from ..registry import REQUIRED
from ._common import F32, matmul_shape, ms_op

FLOATS = ("f32", "f16", "bf16")


def unpack(packed, bits, count):
    """The first `count` bits-wide values of each row of bytes, low bits first: (..., bytes) ->
    (..., count) int32."""
    per = 8 // bits
    shifts = (np.arange(per) * bits).astype(np.uint8)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(*packed.shape[:-1], -1)[..., :count].astype(np.int32)


def dequantize_weights(b, scales, zero_points, g_idx, *, K, N, bits, block_size):
    """B's (N, K) float32 weights."""
    k_blocks = -(-K // block_size)
    q = unpack(b.reshape(N, k_blocks, -1), bits, block_size).reshape(N, k_blocks * block_size)[:, :K]
    s = scales.astype(F32).reshape(N, k_blocks)
    if zero_points is None:
        z = np.full((N, k_blocks), 1 << (bits - 1), F32)
    elif zero_points.dtype == np.uint8:
        z = unpack(zero_points.reshape(N, -1), bits, k_blocks).astype(F32)
    else:
        z = zero_points.astype(F32).reshape(N, k_blocks)
    blocks = np.arange(K) // block_size if g_idx is None else g_idx.astype(np.int64).reshape(K)
    return (q.astype(F32) - z[:, blocks]) * s[:, blocks]


def int8_activations(a, block_size):
    """A as ONNX Runtime's CPU kernel sees it at accuracy_level 4 (MLAS's CompInt8, which the
    GenAI builder asks for): each block of `block_size` values along K quantized to int8 with
    scale max|a| / 127 (127 / max|a| applied, rounded half to even), then the products are
    exact integer dot products times the scales -- the same as multiplying q * scale."""
    a = np.asarray(a, F32)
    K = a.shape[-1]
    pad = -K % block_size
    blocks = np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)]).reshape(*a.shape[:-1], -1, block_size)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(blocks * inv)
    return (q * (amax / F32(127))).astype(F32).reshape(*a.shape[:-1], -1)[..., :K]


def matmul_nbits_with(mm, weights, a, b, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits,
                      block_size, accuracy_level, weight_prepacked):
    w = weights(b, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size)  # (N, K)
    x = int8_activations(a, block_size) if accuracy_level == 4 and g_idx is None else a.astype(F32)
    y = mm(x, w.T)
    if bias is not None:
        y = y + bias.astype(F32)
    return y.astype(a.dtype)


def _rule(ins, a, node):
    x, b, scales = ins[0], ins[1], ins[2]
    k, n, bits, bs = a["K"], a["N"], a["bits"], a["block_size"]
    if bits not in (2, 4, 8):
        _fail(node, f"bits={bits}: expected 2, 4 or 8")
    if bs < 16 or bs & (bs - 1):
        _fail(node, f"block_size={bs}: expected a power of 2, at least 16")
    if a["weight_prepacked"]:
        _fail(node, "weight_prepacked B (a CUDA layout) is not supported")
    k_blocks, blob = -(-k // bs), bs * bits // 8
    if tuple(b.shape) not in ((n, k_blocks, blob), (n, k_blocks * blob)):
        _fail(node, f"B has shape {list(b.shape)}; K={k}, N={n}, bits={bits}, block_size={bs} need "
                    f"[{n}, {k_blocks}, {blob}]")
    if isinstance(x.shape[-1], int) and x.shape[-1] != k:
        _fail(node, f"A's last axis {x.shape[-1]} is not K={k}")
    sd = scales.shape
    if all(isinstance(d, int) for d in sd) and int(np.prod(sd)) != n * k_blocks:
        _fail(node, f"scales {list(sd)} must hold N x k_blocks = {n * k_blocks} values")
    return [(matmul_shape(x.shape, (k, n), node), x.dtype)]


class _PerWeights:
    """`build(b, scales, zero_points, g_idx, **attrs)` kept per constant B (the graph's own
    arrays: ids stay theirs); computed B is prepared on every call."""

    def __init__(self, program, build):
        self.program, self.build, self.cache, self.consts = program, build, {}, None

    def __call__(self, b, scales, zero_points, g_idx, **attrs):
        if self.consts is None:
            self.consts = {id(v.data): v.data for v in self.program.graph.constants() if v.data is not None}
        key = (id(b), id(scales), id(zero_points), id(g_idx))
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        w = self.build(b, scales, zero_points, g_idx, **attrs)
        if all(x is None or self.consts.get(id(x)) is x for x in (b, scales, zero_points, g_idx)):
            self.cache[key] = w
        return w


def _cpu(program):
    """4-bit weights at accuracy_level 4: the packed int4 x int8 kernels (backends/cpu/ops/int4.py);
    anything else: the weights dequantized once to float32, then the cpu matmul."""
    from ..backends.cpu.ops import FACTORIES, int4
    make = FACTORIES.get("matmul")
    mm = make(program) if make is not None else REF["matmul"]
    weights = _PerWeights(program, dequantize_weights)
    packed = _PerWeights(program, lambda b, s, z, g, *, K, N, bits, block_size:
                         int4.Int4Weights(b, s, z, K=K, N=N, block_size=block_size))

    def matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None, **at):
        if int4.applies(a, at["bits"], at["block_size"], at["accuracy_level"], g_idx):
            w = packed(b, scales, zero_points, g_idx, K=at["K"], N=at["N"], bits=4, block_size=at["block_size"])
            if w.ok:
                return w.matmul(a, bias, program.threads)
        return matmul_nbits_with(mm, weights, a, b, scales, zero_points, g_idx, bias, **at)
    return matmul_nbits


ms_op("matmul_nbits", "MatMulNBits", inputs=["A", "B", "scales", "zero_points?", "g_idx?", "bias?"],
      attrs={"K": REQUIRED, "N": REQUIRED, "bits": 4, "block_size": REQUIRED, "accuracy_level": 0,
             "weight_prepacked": 0},
      groups={"matmul", "mac", "quant"}, dtypes={"A": FLOATS, "B": ("u8",), "g_idx": ("i32",)}, shape=_rule,
      macs=lambda a, ins, outs: int(np.prod(outs[0])) * a["K"], unit="matrix",
      reference=lambda *args, **at: matmul_nbits_with(REF["matmul"], dequantize_weights, *args, **at),
      cpu_factory=_cpu)


# ------------------------------------------------------------------ GatherBlockQuantized

def gather_block_quantized(data, indices, scales, zero_points=None, *, gather_axis, quantize_axis, block_size,
                           bits):
    """Gather of a block-quantized table (the GenAI builder's int4 embedding when it shares the
    lm_head's weights): `data` (int4/uint4, or uint8 holding 2 4-bit or 1 8-bit value a byte,
    low bits first) quantized in blocks of `block_size` along `quantize_axis`, one scale (and
    zero point) a block; out = gather(dequantize(data)) in the scales' type. Zero point when
    none is given: 0, or 2^(bits-1) for uint8 data. Rows are dequantized after the gather, so
    a step reads only the rows it takes."""
    packed = data.dtype == np.uint8
    rank = data.ndim

    def values(x):  # the stored integers: 4-bit pairs of a uint8 unpacked, anything else as it is
        return unpack(x, bits, x.shape[-1] * (8 // bits)) if packed and bits < 8 else x.astype(np.int32)
    ga, qa = gather_axis % rank, quantize_axis % rank
    idx = np.asarray(indices).astype(np.int64)
    n = data.shape[ga]
    idx = np.where(idx < 0, idx + n, idx)
    if np.any((idx < 0) | (idx >= n)):
        raise IndexError(f"an index is out of range for {n} rows")
    if ga == 0 and qa == rank - 1 and rank == 2:  # an embedding table: unpack only the rows taken
        rows = data[idx.reshape(-1)]
        q = values(rows)
        blocks = np.arange(q.shape[-1]) // block_size
        s = np.asarray(scales)[idx.reshape(-1)][:, blocks].astype(F32)
        if zero_points is not None:
            z = values(zero_points[idx.reshape(-1)])[:, blocks].astype(F32)
        else:
            z = F32(1 << (bits - 1) if packed else 0)
        out = ((q.astype(F32) - z) * s).astype(scales.dtype)
        return out.reshape(idx.shape + out.shape[1:])
    q = values(data)
    zp = None if zero_points is None else values(zero_points)
    blocks = np.arange(q.shape[qa]) // block_size  # each element's block along quantize_axis

    def per_element(t):  # (..., blocks along qa, ...) -> (..., q.shape[qa], ...)
        return np.take(t, blocks, axis=qa)
    s = per_element(np.asarray(scales)).astype(F32)
    z = per_element(zp).astype(F32) if zp is not None else F32(1 << (bits - 1) if packed else 0)
    if ga != qa:  # gather the rows first, with their scales and zero points
        q, s = np.take(q, idx, axis=ga), np.take(s, idx, axis=ga)
        z = np.take(z, idx, axis=ga) if zp is not None else z
        return ((q.astype(F32) - z) * s).astype(scales.dtype)
    return np.take((q.astype(F32) - z) * s, idx, axis=ga).astype(scales.dtype)


def _gbq_rule(ins, a, node):
    data, idx, scales = ins[0], ins[1], ins[2]
    rank = len(data.shape)
    if a["bits"] not in (4, 8):
        _fail(node, f"bits={a['bits']}: expected 4 or 8")
    bs = a["block_size"]
    if bs < 16 or bs & (bs - 1):
        _fail(node, f"block_size={bs}: expected a power of 2, at least 16")
    if not -rank <= a["gather_axis"] < rank or not -rank <= a["quantize_axis"] < rank:
        _fail(node, f"gather_axis / quantize_axis out of range for rank {rank}")
    shape = list(data.shape)
    if data.dtype == "u8" and a["bits"] == 4:
        if a["quantize_axis"] % rank != rank - 1:
            _fail(node, "packed uint8 data must be quantized along its last axis")
        last = shape[-1]
        shape[-1] = 2 * last if isinstance(last, int) else "?"
    ga = a["gather_axis"] % rank
    return [(tuple(shape[:ga]) + tuple(idx.shape) + tuple(shape[ga + 1:]), scales.dtype)]


ms_op("gather_block_quantized", "GatherBlockQuantized", inputs=["data", "indices", "scales", "zero_points?"],
      attrs={"gather_axis": 0, "quantize_axis": 1, "block_size": 128, "bits": 4},
      groups={"data_movement", "quant"}, dtypes={"data": ("u8", "i4", "u4"), "indices": ("i32", "i64"),
                                                 "scales": FLOATS},
      shape=_gbq_rule, reference=gather_block_quantized)
