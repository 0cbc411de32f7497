"""The fused ops of ir/ops/fused.py on the cpu backend (the passes produce them; each kernel
here computes what the op's reference kernel computes, checked in tests/test_cpu_fused.py):

- `masked_softmax`: csrc/transformer.c's softmax with the mask added and the NaN rows fixed
  in the same pass over the rows (ops/transformer.py `softmax_call`);
- `matmul_add` (and a plain `matmul`) by a constant 2-D weight: the packed-weight sgemm with
  the bias and residual added in its store (ops/matmul.py `linear`, weights packed once per
  node: `linear_kernel`); by a computed operand, banded BLAS with the adds in place;
- `affine_activation`: csrc/chain.c's one pass y = s1 * act(s0 * x + t0) + t1;
- `add_activation`: csrc/chain.c's one pass y = act(a + b), on the pool for big maps;
- `channel_affine`: csrc/chain.c's one pass y = act(x * s[c] + t[c]), on the pool for big maps;
- `rope_half`: the rotary embedding in NumPy with two fewer temporaries, bit-identical.

Anything a kernel does not take (another dtype, a mask that broadcasts some other way) runs
the reference kernel.
"""
from __future__ import annotations

import numpy as np

from ... import pieces

from ...reference.kernels import KERNELS as REF
from .. import native
from . import matmul as MM
from . import transformer as T

# csrc/chain.c: y[i] = s1 * act(s0 * x[i] + t0) + t1 (activation codes of csrc/act.h)
CHAIN_ACTS = ("relu", "sigmoid", "tanh", "hard_swish", "hard_sigmoid", "leaky_relu", "clip", "silu")
AFFINE_ACT = None if native.LIB is None else native.LIB.npr_affine_act


def make_masked_softmax(program):
    def masked_softmax(x, mask=None, *, axis, nan_fix, nan_value):
        if mask is not None and not native.broadcasts_to(mask.shape, x.shape):
            x, mask = mask, x  # the add is commutative: the full-shaped operand is the scores
        if x.ndim and axis % x.ndim == x.ndim - 1:
            y = T.softmax_call(program, x, mask, nan_value if nan_fix else None)
            if y is not None:
                return y
        return REF["masked_softmax"](x, mask, axis=axis, nan_fix=nan_fix, nan_value=nan_value)
    return masked_softmax


def make_matmul_add(program):
    def matmul_add(a, b, *adds):
        y = MM.matmul_add(program, a, b, adds)
        return REF["matmul_add"](a, b, *adds) if y is None else y
    return matmul_add


SMALL_FLOP = 1 << 20  # a smaller product: NumPy's dot (~1-2 us) beats a ctypes call + packing


def linear_kernel(program, fallback, cache: dict | None = None):
    """The kernel of one matmul / matmul_add node whose weights `b` are a constant (K, N)
    matrix: packed once for the packed sgemm (into `cache`: this node's, or one shared by the
    nodes reading the same weight); a small product (a 7-node MLP's 1 x 64 x 256) through
    NumPy's dot, the adds in place."""
    cache = {} if cache is None else cache

    def linear(a, b, *adds):
        if a.dtype == np.float32 and b.dtype == np.float32 and native.small(2 * a.size * b.shape[-1], SMALL_FLOP) \
                and a.ndim >= 1 and a.shape[-1] == b.shape[0]:
            y = np.matmul(a, b)
            for c in adds:
                if c.dtype != np.float32 or not native.broadcasts_to(c.shape, y.shape):
                    return fallback(a, b, *adds)
                np.add(y, c, out=y)
            return y
        y = MM.linear(program, a, b, cache, adds)
        return fallback(a, b, *adds) if y is None else y
    linear.cache = cache  # (tests look at the packing)
    return linear


class PackedSource:
    """Where a weight that no file holds (one the passes made: a BatchNorm folded into a
    Linear) is read again from once let go (ir/stored.py): its own packed panels, unpacked,
    exactly (matmul.unpack)."""

    path = "<packed weights>"

    def __init__(self):
        self.cache, self.trans = None, False

    def bind(self, cache: dict, trans: bool) -> None:
        self.cache, self.trans = cache, trans

    def read_into(self, offset: int, arr: np.ndarray) -> None:
        K, N = arr.shape[::-1] if self.trans else arr.shape
        w = MM.unpack(self.cache, K, N)
        arr[...] = w.T if self.trans else w


def packed_linear(program, cache: dict, stored, trans: bool = False, alpha: float = 1.0):
    """a @ W [+ adds] where W (stored's matrix, transposed with `trans`, times alpha) lives
    only in its packed panels: packed now into `cache` (shared by the nodes reading the same
    weight the same way), then the float32 array is let go (ir/stored.py), so the program
    holds the weight once, as ONNX Runtime holds a pre-packed initializer. Returns
    (lin(a, *adds) -> y, or None where the packed sgemm does not take the call; the stand-in
    the program passes for the weight: a zero-strided array of its shape, no memory, never
    read)."""
    def pack():
        w = stored.array()
        w = w.T if trans else w
        MM.prepare(cache, w * np.float32(alpha) if alpha != 1.0 else w)
        standin = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), w.shape, (0, 0), writeable=False)
        cache.update(b=standin, standin=standin)
    if "standin" not in cache or cache.get("isa") != native.ISA:
        pack()
    if isinstance(stored.source, PackedSource) and alpha == 1.0:  # (the program only lets alpha 1 through)
        stored.source.bind(cache, trans)
    stored.release()
    standin = cache["standin"]

    def lin(a, *adds):
        if cache.get("isa") != native.ISA:  # (the ISA switched under the program, as tests do)
            pack()
        return MM.linear(program, a, standin, cache, adds)
    lin.cache = cache
    return lin, standin


def packed_linear_kernel(program, fallback, cache: dict, stored):
    """The kernel of matmul / matmul_add nodes whose weight lives only in its packs
    (`packed_linear`); what the packed sgemm does not take (another dtype for `a`, adds it
    would reorder) runs `fallback` on the weight read again from the file."""
    lin, standin = packed_linear(program, cache, stored)

    def linear(a, b, *adds):
        y = lin(a, *adds)
        return fallback(a, stored.array(), *adds) if y is None else y
    linear.cache = cache
    return linear, standin


def gemm_kernel(program, node, graph, fallback, packs: dict | None = None):
    """One gemm node by a constant (K, N) or, trans_b, (N, K) weight: the weight transposed and
    scaled by alpha once, the bias scaled by beta once when constant; then the linear kernel.
    Anything else (a computed weight) runs `fallback`. With `packs` (a dict the program
    shares between nodes) the weight, a Stored read by nothing else, lives only in its packed
    copy (`packed_linear`): returns (kernel, stand-in for the weight)."""
    from ....ir.ops import OPS
    a_ = OPS["gemm"].attrs_of(node)
    v = graph.values[node.inputs[1]]
    cname = node.inputs[2] if len(node.inputs) > 2 else ""
    cv = graph.values[cname].data if cname else None
    beta, trans_a = a_["beta"], a_["trans_a"]
    c_const = None if cv is None else (cv if beta == 1.0 else (cv * np.float32(beta)).astype(cv.dtype))
    if packs is not None:
        key = (v.stored, a_["trans_b"], a_["alpha"])  # (a matmul reading the same weight: (s, 0, 1.0))
        lin, standin = packed_linear(program, packs.setdefault(key, {}), v.stored, a_["trans_b"], a_["alpha"])
        weight = v.stored.array  # (the fallback's: read again from the file)
    else:
        w = v.data
        if w is None or w.dtype != np.float32 or w.ndim != 2:
            return fallback
        # A view where alpha is 1: the packed sgemm packs from it (a transposed copy would stay
        # beside the graph's weight and the packed panels: a third copy of every Gemm weight).
        bt = (w.T if a_["trans_b"] else w) * np.float32(a_["alpha"]) if a_["alpha"] != 1.0 \
            else (w.T if a_["trans_b"] else w)
        lin0 = linear_kernel(program, lambda a, b, *adds: None)
        lin, standin, weight = (lambda a, *adds: lin0(a, bt, *adds)), None, None
        lin.cache = lin0.cache

    def gemm(a, b, c=None, **_attrs):
        if a.dtype != np.float32 or a.ndim != 2:
            return fallback(a, b if weight is None else weight(), c, **_attrs)
        a = a.T if trans_a else a
        adds = () if c is None else ((c_const,) if c_const is not None else ((c if beta == 1.0 else c * np.float32(beta)),))
        y = lin(a, *adds)
        if y is None:  # (a released weight is read again from the file for it)
            return fallback(a.T if trans_a else a, b if weight is None else weight(), c, **_attrs)
        return y
    gemm.cache = lin.cache
    return gemm if packs is None else (gemm, standin)


def make_affine_activation(program):
    from .. import native_activation

    def affine_activation(x, *, s0, t0, activation, activation_params, s1, t1):
        act, act_attrs = native_activation(activation, activation_params)
        if AFFINE_ACT is None or x.dtype != np.float32 or (act is not None and act not in CHAIN_ACTS):
            return REF["affine_activation"](x, s0=s0, t0=t0, activation=activation,
                                            activation_params=activation_params, s1=s1, t1=t1)
        code, alpha, beta = native.act_params(act, act_attrs)
        x = native.contiguous(x)
        y = np.empty_like(x)
        xp, yp = native.ptr(x), native.ptr(y)
        # Pieces on a contended device (backends/pieces.py): flat ranges of whole 64-float
        # blocks, so every vector lane and the one tail fall where the whole call's do.
        cut = pieces.cut(x.size, x.size * AFFINE_S_PER_ELEMENT, unit=64, cal=_CAL) \
            if x.size >= PIECE_MIN else [(0, x.size)]
        for i0, i1 in pieces.each(cut):
            AFFINE_ACT(xp + 4 * i0, yp + 4 * i0, i1 - i0, s0, t0, code, alpha, beta, s1, t1)
        return y
    return affine_activation


def make_add_activation(program):
    """act(a + b) of two float32 arrays of one shape (a residual add and its activation):
    csrc/chain.c's one pass, on the pool's threads for a big map (chunks of whole vectors: the
    same result as one call); anything else (a broadcast, another dtype or activation) the
    reference kernel (NumPy's add, then the activation)."""
    from .. import native_activation

    def add_activation(a, b, *, activation, activation_params):
        act, act_attrs = native_activation(activation, activation_params)
        if native.LIB is None or a.dtype != np.float32 or b.dtype != np.float32 or a.shape != b.shape \
                or (act is not None and act not in CHAIN_ACTS) or native.small(a.size, ADD_ACT_MIN):
            return REF["add_activation"](a, b, activation=activation, activation_params=activation_params)
        code, alpha, beta = native.act_params(act, act_attrs)
        a, b = native.contiguous(a), native.contiguous(b)
        y = np.empty_like(a)
        threads = program.threads
        chunks = max(1, min(threads, a.size // ADD_ACT_MIN))
        native.LIB.npr_add_act_mt(native.ptr(a), native.ptr(b), native.ptr(y), a.size, code, alpha, beta,
                                  threads, chunks)
        return y
    return add_activation


def make_channel_affine(program):
    """act((x * scale[c]) + shift[c]) of a float32 map (a BatchNorm written out, with its
    activation): csrc/chain.c's one pass, the product and the sum each rounded as NumPy's are
    (the reference's floats), whole channel runs on the pool's threads for a big map; anything
    else the reference kernel."""
    from .. import native_activation

    def channel_affine(x, scale=None, shift=None, *, activation, activation_params):
        act, act_attrs = native_activation(activation, activation_params)
        if native.LIB is None or x.dtype != np.float32 or x.ndim < 2 or native.small(x.size, ADD_ACT_MIN) \
                or any(p is not None and p.dtype != np.float32 for p in (scale, shift)) \
                or (act is not None and act not in CHAIN_ACTS):
            return REF["channel_affine"](x, scale, shift, activation=activation, activation_params=activation_params)
        code, alpha, beta = native.act_params(act, act_attrs)
        x = native.contiguous(x)
        y = np.empty_like(x)
        s = None if scale is None else np.ascontiguousarray(scale)
        t = None if shift is None else np.ascontiguousarray(shift)
        outer, c = x.shape[0], x.shape[1]
        threads = program.threads
        chunks = max(1, min(threads, x.size // ADD_ACT_MIN, outer * c))
        native.LIB.npr_channel_affine_mt(native.ptr(x), native.ptr(y), outer, c, x.size // (outer * c),
                                         native.ptr(s), native.ptr(t), code, alpha, beta, threads, chunks)
        return y
    return channel_affine


ADD_ACT_MIN = 1 << 12  # elements: a smaller add is NumPy's (a ctypes call costs what it saves)
PIECE_MIN = 1 << 20  # elements: smaller maps run in one call (under ~1 ms)
AFFINE_S_PER_ELEMENT = 1e-9
_CAL: dict = {}  # the measured speed of the chain's pieces (pieces.split)


def make_rope_half(program):
    """x * cos + concat(-x2, x1) * sin with two fewer temporaries: the same float32 products
    and sums in the same order (a + (-b) is a - b exactly), so bit-identical to the reference."""
    def rope_half(x, cos, sin):
        h = x.shape[-1] // 2
        if x.dtype != np.float32 or cos.dtype != np.float32 or sin.dtype != np.float32 \
                or not (native.broadcasts_to(cos.shape, x.shape) and native.broadcasts_to(sin.shape, x.shape)) or sin.shape[-1] not in (1, 2 * h):
            return REF["rope_half"](x, cos, sin)
        y = x * cos
        s1, s2 = (sin, sin) if sin.shape[-1] == 1 else (sin[..., :h], sin[..., h:])
        np.subtract(y[..., :h], x[..., h:] * s1, out=y[..., :h])
        np.add(y[..., h:], x[..., :h] * s2, out=y[..., h:])
        return y
    return rope_half


KERNELS = {} if T.LIB is None else {
    "masked_softmax": make_masked_softmax,
    "matmul_add": make_matmul_add,
    "affine_activation": make_affine_activation,
    "add_activation": make_add_activation,
    "channel_affine": make_channel_affine,
    "rope_half": make_rope_half,
}
