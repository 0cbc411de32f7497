"""2-D convolution through the compiled kernels (csrc/): dense and grouped convs as an
implicit GEMM with the bias and activation fused (conv.c), 3x3 stride-1 dense convs as
Winograd F(4x4, 3x3) (winograd.c), depthwise convs as a direct kernel (a channel's row, or 8
channels, in the lanes), dense convs as the flat-pixel GEMM of conv_gemm.c, as im2col + the
packed sgemm of transformer.c a panel of pixels at a time (im2col_gemm.c), and stride-1 convs with <= 4 input channels (ESPCN's 5x5 1->64)
as the direct kernel of smallc.c. Which one a shape runs is measured on its first call on this
machine (convtune.py); the rules here (`flat_chosen`, `gemm_chosen`, `smallc_chosen`,
`winograd.chosen`, `dw_lanes_chosen`) are its first candidate and its fallback. Each node's
call is then planned once per input shape (`_plan`).

On more than one thread the work is split into bands of output rows (dense; of channels,
depthwise; of pixel panels, im2col + sgemm, whose panels run over all images of a batch), one
call per image otherwise (per group of a grouped conv),
on the library's one spinning pool (csrc/par.h), whose hand-offs cost ~1 us; there is no
Python thread pool. Weights are packed once per node, (M, C, kh, kw) -> (ceil(M/4), C*kh*kw,
4), or transformed and packed for Winograd (winograd.pack), and kept in the node's cache.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import BackendError
from ...util import check_fits
from .. import pieces
from ..reference.kernels.nn import _window_pads
from . import convtune, native, winograd
from .native import LIB, act_params, ptr

MR = 4  # output channels per microkernel tile (csrc/conv.c)
# The depthwise kernels by kind (_depthwise says which is which; conv.c's DW_KINDS in order)
DW_KERNELS = () if LIB is None else (LIB.npr_dwconv2d, LIB.npr_dwconv2d_cl, LIB.npr_dwconv2d_avx512,
                                     LIB.npr_dwconv2d_cl16, LIB.npr_dwconv2d_flat)
MIN_FLOPS_PER_BAND = 2e6  # below this a band costs more to hand to a thread than to run
DW_FLOP_COST = 8  # a depthwise conv's FLOP in dense-conv FLOPs of time (for its bands)
# Pieces' time model: dense FLOP/s per thread (on the low side of the kernels' 30-60 on the
# development VM, so a piece errs short), and Winograd's F(4x4,3x3) saving in time.
PIECE_FLOPS = 30e9
WINO_SPEEDUP = 2.5
# Outputs this big are stored with non-temporal stores: they leave the caches anyway, and
# the stores then skip reading each line first (ESPCN's unbanded first conv, 236 MB out:
# 99 -> 36 ms). At 1-4 MB (cascaded bands) A/B runs were inconclusive, so bands don't.
STREAM_BYTES = 64 << 20
# A strided 1x1 conv runs as the stride-1 conv of its gathered pixels (conv2d says why; off
# only for bench/cpu_ops_ab.py's A/B).
GATHER_STRIDED_1X1 = True


def applies(x, w, attrs) -> bool:
    """Float32 2-D convs with something to sum: a window of no input channels or no taps (a
    zero in w.shape[1:]) is the bias alone, the reference kernel's job (the kernels divide by
    the reduction's length: SIGFPE; found by `make fuzz`)."""
    return (LIB is not None and x.ndim == 4 and x.dtype == np.float32 and w.dtype == np.float32
            and w.ndim == 4 and 0 not in w.shape[1:])


def pack(w: np.ndarray, b: np.ndarray | None, group: int, mr: int = MR):
    """Per group: weights (ceil(Mg/mr), Cg*kh*kw, mr) and bias padded to a multiple of mr."""
    m = w.shape[0]
    mg, k = m // group, math.prod(w.shape[1:])
    mp = -(-mg // mr) * mr
    out = []
    for g in range(group):
        wg = np.zeros((mp, k), np.float32)
        wg[:mg] = w[g * mg:(g + 1) * mg].reshape(mg, k)
        bg = np.zeros(mp, np.float32)
        if b is not None:
            bg[:mg] = b[g * mg:(g + 1) * mg]
        out.append((np.ascontiguousarray(wg.reshape(mp // mr, mr, k).transpose(0, 2, 1)), bg))
    return out


def conv2d(x, w, b, attrs, act, act_attrs, threads, cache: dict, isa: str | None = None,
           algo: str | None = None, memo: bool = False):
    """algo: None picks by measurement (convtune: the fastest kernel for this shape on this
    machine, timed on its first call) where convtune measures, else as "rule" does; "rule" picks
    by flat_chosen / gemm_chosen / smallc_chosen / winograd.chosen / dw_lanes_chosen; "direct",
    "winograd", "flat", "gemm", "tgemm" (the transposed product, output channels in the vectors, _tgemm),
    "smallc", "dw_lanes" (depthwise with the channels in the lanes; "direct" is the per-channel
    one), "dw_flat" (depthwise, a small plane as one flat row) forces one (tests, benches).
    memo: `cache` is one node's, whose weights, attributes and activation never change (a
    program's conv step, CpuProgram.lower): once planned for x's shape, the plan is also kept
    as cache["memo", x.shape], which the step calls on a contiguous float32 x of that shape
    without coming here (conv_step)."""
    shape0 = x.shape if memo else None  # (None where x is reshaped or gathered below)
    if GATHER_STRIDED_1X1 and w.shape[2:] == (1, 1) and tuple(attrs["strides"] or (1, 1)) != (1, 1) \
            and not any(attrs["pads"] or ()):
        # A strided 1x1 conv reads only every s-th pixel: it is the stride-1 conv of those
        # pixels, gathered once (any auto_pad: a 1x1 window needs no padding, and ceil(H/s)
        # outputs are the pixels ::s). The stride-1 kernels then run on a dense block (ResNet
        # v1's downsampling shortcuts, 1 thread: 512->1024 on 14x14 392 -> 342 us, 1024->2048
        # 1.81 -> 1.33 ms, 128->256 on 56x56 338 -> 270 us).
        sh, sw = attrs["strides"]
        x = x[:, :, ::sh, ::sw]
        shape0 = None
        attrs = {**attrs, "strides": [1, 1], "auto_pad": "NOTSET"}
    if x.shape[3] == 1 and w.shape[3] == 1 and x.shape[2] > 1 and (
            attrs["auto_pad"] != "NOTSET" or not attrs["pads"] or attrs["pads"][1] == attrs["pads"][3] == 0):
        # A 1-D conv written along H (N, C, L, 1), as Keras/TF exports write them: every kernel
        # vectorizes along W, so one output column ran at 1/8 of the lanes (magika's 256->512
        # k=5 conv over 512 rows: 238 ms at 1 thread on an AVX2 VM, ORT's whole model 24 ms).
        # The same memory is (N, C, 1, L): swap the spatial axes by reshapes (no copy).
        n, c, h, _ = x.shape
        m, cg, kh, _ = w.shape
        sw = [1, (attrs["strides"] or (1, 1))[0]]
        dl = [1, (attrs["dilations"] or (1, 1))[0]]
        pads = attrs["pads"] and [0, attrs["pads"][0], 0, attrs["pads"][2]]
        t = {**attrs, "strides": sw, "dilations": dl, "pads": pads,
             "kernel_shape": attrs.get("kernel_shape") and [1, attrs["kernel_shape"][0]]}
        y = conv2d(x.reshape(n, c, 1, h), w.reshape(m, cg, 1, kh), b, t, act, act_attrs, threads, cache, isa, algo)
        return y.reshape(n, m, y.shape[3], 1)
    # the kernels index a dense (N, C, H, W) block; a view may be strided (a transposed one, e.g.
    # token maps seen as channel maps, by the blocked transpose: native.contiguous)
    x = native.contiguous(x, threads)
    tuned = ("tuned", x.shape, threads, isa)
    if algo is None:
        algo = cache.get(tuned)  # this node's measured choice (None: not measured yet)
    # A node's call, once planned for an input shape (below), skips the rule and the argument
    # set-up. The cache belongs to one weight array (a node, or conv1d.py's per-weight packs),
    # so the attributes are checked too.
    key = ("plan", x.shape, threads, isa, algo, act)
    hit = cache.get(key)
    if hit is not None and (hit[0] is act_attrs or hit[0] == act_attrs) and hit[2] == attrs:
        if shape0 == x.shape:
            cache["memo", shape0] = hit[1]
        return hit[1](x)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    group = attrs["group"]
    begin, end, (ho, wo), (sh, sw), (dh, dw) = _window_pads(
        x.shape, [kh, kw], attrs["strides"], attrs["dilations"], attrs["pads"], attrs["auto_pad"])
    code, alpha, beta = act_params(act, act_attrs)
    yshape = (n, m, ho, wo)
    if 0 in yshape:  # a zero dim (ONNX allows it): nothing to compute, and the kernels divide by ho*wo
        return empty(yshape)
    # Where one output row (column) is all there is, its stride is never applied, and end
    # padding past the last window is never read: both are dropped, exactly. The kernels lay out
    # the padded input (in stride phases): a stride or a padding of 2^31 asked them for
    # buffers no process has (found by `make fuzz`); what is left is checked first.
    sh, sw = (1 if ho == 1 else sh), (1 if wo == 1 else sw)
    end = [e if e < 0 else min(e, max(0, (o - 1) * s + (k - 1) * d + 1 - size - bg))
           for e, o, s, k, d, size, bg in zip(end, (ho, wo), (sh, sw), (kh, kw), (dh, dw), (h, wd), begin)]
    check_fits(4 * c * (h + max(0, begin[0]) + end[0]) * (wd + max(0, begin[1]) + end[1]) * sh * sw,
               f"the conv's padded input ({c} x {h + begin[0] + end[0]} x {wd + begin[1] + end[1]}, strides {sh}, {sw})")
    flops = 2.0 * m * cg * kh * kw * ho * wo
    geo = (kh, kw, sh, sw, dh, dw, begin[0], begin[1])
    if algo is None:
        shape_key = (x.shape, w.shape, geo, tuple(end), group, threads, isa or native.ISA, act)
        # (work: the whole call's, every image of the batch)
        if group == c == m and cg == 1:  # depthwise: its two kernels, in time-equivalent FLOPs
            flat_ok = (isa or native.ISA) == "avx512" and dw_flat_fits(h, wd, geo, ho, wo)
            cands, work = convtune.dw_candidates(begin, flat_ok), DW_FLOP_COST * flops * n
        else:
            cands, work = convtune.candidates(c, m, group, geo, ho, wo, begin, end), flops * n
        # Each candidate plans and packs into a scratch copy of the cache, and only the
        # winner's is kept: the losers' packed weights would otherwise stay for good (a
        # CRNN's 3x3 convs held winograd, direct, flat and im2col packs side by side).
        scratch: dict = {}
        algo, final = convtune.choose(shape_key, work, cands, lambda a: conv2d(
            x, w, b, attrs, act, act_attrs, threads, scratch.setdefault(a, dict(cache)), isa, a))
        cache.update(scratch.get(algo, ()))
        del scratch
        if final:
            cache[tuned] = algo
            key = ("plan", x.shape, threads, isa, algo, act)  # (the key the next call looks up)
        else:  # not measured yet (a contended device): no plan, so a later call measures
            key = None
        if algo != "rule":
            return conv2d(x, w, b, attrs, act, act_attrs, threads, cache, isa, algo)
    if algo == "rule":
        algo = None
    # From here each branch plans its call: a function of x alone, kept in the node's cache
    # for this input shape (`key`), so later calls skip the geometry, the checks and the rule
    # (40-60 us a call on a 2-vCPU VM: most of a small conv's time; PP-OCR's classifier runs 53).
    epi = (code, alpha, beta)
    if algo is None and group > 1 and not group == c == m and grouped_tgemm_chosen(cg, geo, ho, wo, begin, end):
        algo = "tgemm"
    if algo is None and group > 1 and cg >= GROUP_SPLIT_MIN and m // group >= GROUP_SPLIT_MIN:
        dense = dict(attrs)
        return _plan(cache, key, act_attrs, attrs, x, lambda x: _wide_groups(
            x, w, b, dense, act, act_attrs, threads, cache, isa, empty(yshape)))
    if group == c == m and cg == 1:  # depthwise
        wide = (isa or native.ISA) == "avx512"
        flat = wide and dw_flat_fits(h, wd, geo, ho, wo)
        if algo == "dw_flat" and not flat:
            raise BackendError(f"cpu conv: algo='dw_flat' needs AVX-512 and a small 'same' depthwise conv at "
                               f"stride 1 or 2, got input {tuple(x.shape)}, output {ho}x{wo}, geometry {geo}")
        flat = flat and (algo == "dw_flat" or algo is None and dw_flat_chosen(geo, wo))
        lanes = not flat and (algo == "dw_lanes" or algo is None and dw_lanes_chosen(c, wo, sw, isa or native.ISA, kw)) \
            and min(begin) >= 0
        kind = 4 if flat else (3 if wide else 1) if lanes else 2 if wide else 0
        return _plan(cache, key, act_attrs, attrs, x, _depthwise_plan(
            x.shape, yshape, w, b, geo, epi, threads, cache, kind, flops))
    if algo is None and min(*begin, *end) >= 0 and batch_gemm_chosen(n, c, m, group, geo, ho, wo):
        return _plan(cache, key, act_attrs, attrs, x, _gemm_plan(x.shape, yshape, w, b, geo, end, epi, threads,
                                                                 cache, flops))
    if algo is None and group == 1 and tgemm_chosen(c, geo, ho, wo, begin, end):
        algo = "tgemm"
    if algo is None and threads == 1 and sgemm_pointwise(c, m, group, geo, ho, wo):
        return _plan(cache, key, act_attrs, attrs, x, _gemm_plan(x.shape, yshape, w, b, geo, end, epi, threads,
                                                                 cache, flops))
    if algo == "flat" or (algo is None and min(*begin, *end) >= 0
                          and flat_chosen(c, m, group, geo, ho, wo, isa or native.ISA, threads)):
        if group != 1:
            raise BackendError(f"cpu conv: algo='flat' needs a dense conv (group 1), got group {group}")
        return _plan(cache, key, act_attrs, attrs, x,
                     _flat(x.shape, w, b, geo, *epi, yshape, threads, cache, isa or native.ISA, flops))
    # (the rule: 1 thread only; more threads run _gemm on the library's pool, chosen where convtune
    # measures it faster)
    if algo == "gemm" or (algo is None and threads == 1 and min(*begin, *end) >= 0
                          and gemm_chosen(c, m, group, geo, ho, wo)):
        if group != 1:
            raise BackendError(f"cpu conv: algo='gemm' needs a dense conv (group 1), got group {group}")
        return _plan(cache, key, act_attrs, attrs, x, _gemm_plan(x.shape, yshape, w, b, geo, end, epi, threads,
                                                                 cache, flops))
    if algo == "tgemm":
        if min(*begin, *end) < 0:
            raise BackendError(f"cpu conv: algo='tgemm' needs pads >= 0, got pads {begin + end}")
        return _plan(cache, key, act_attrs, attrs, x, _tgemm_plan(x.shape, yshape, w, b, epi, threads, cache, flops,
                                                                  (*geo, ho, wo), group))
    if algo == "smallc" or (algo is None and min(*begin, *end) >= 0
                            and smallc_chosen(c, m, group, geo, isa or native.ISA)):
        if group != 1 or geo[2:6] != (1, 1, 1, 1) or min(*begin, *end) < 0:
            raise BackendError(f"cpu conv: algo='smallc' needs a stride-1 dilation-1 dense conv with pads >= 0, "
                               f"got weights {tuple(w.shape)}, group {group}, strides {(sh, sw)}, dilations {(dh, dw)}")
        return _plan(cache, key, act_attrs, attrs, x, lambda x: _smallc(
            x, w, b, geo, *epi, empty(yshape), threads, cache, isa or native.ISA, flops))
    if algo == "winograd" or (algo is None and winograd.chosen(c, m, group, geo, ho, wo, isa or native.ISA)):
        if group != 1 or geo[:6] != (3, 3, 1, 1, 1, 1):
            raise BackendError(f"cpu conv: algo='winograd' needs a 3x3 stride-1 dilation-1 dense conv, "
                               f"got weights {tuple(w.shape)}, group {group}, strides {(sh, sw)}, dilations {(dh, dw)}")
        return _plan(cache, key, act_attrs, attrs, x, _winograd_plan(x.shape, yshape, w, b, geo, epi, threads, cache,
                                                                     isa, flops))
    return _plan(cache, key, act_attrs, attrs, x, _direct_plan(x.shape, yshape, w, b, group, geo, epi, threads, cache,
                                                               isa, flops))


F32 = np.dtype(np.float32)


def conv_step(fn, cache: dict):
    """A program's conv step with constant weights: `fn` (the backend's conv kernel, called
    with `cache` as the node's) until conv2d has planned the node for an input shape, then that
    plan straight away. The path from the step to the plan (the 1-D and strided-1x1 checks, the
    activation's lookup, the plan's key and the attributes' comparison, three frames with their
    keyword arguments) cost 4-6 us a conv on the development VM, where a small depthwise conv's
    kernel takes 3-20."""
    def run(x, w, b=None, **attrs):
        plan = cache.get(("memo", x.shape))
        if plan is not None and x.dtype is F32 and x.flags.c_contiguous:
            return plan(x)
        return fn(x, w, b, _cache=cache, **attrs)
    return run


def _plan(cache, key, act_attrs, attrs, x, run):
    """Keep `run` (x -> y) as this node's call for x's shape and these attributes (unless key
    is None); run it."""
    if key is not None:
        cache[key] = (act_attrs, run, dict(attrs))
    return run(x)


def _depthwise_plan(xshape, yshape, w, b, geo, epi, threads, cache, kind, flops):
    """run(x) -> y for one image: its calls bound once (native.bound: the arguments converted
    here, not on every run); a batch, or pieces on a contended device, through _depthwise."""
    def general(x):
        return _depthwise(x, empty(yshape), w, b, geo, epi, threads, cache, kind, flops)
    n, c, h, wd = xshape
    if n > 1:
        return general
    ho, wo = yshape[2:]
    _depthwise_weights(w, b, geo, cache)
    wdw, bdw = cache["dw"]
    bands = _bands(c, threads, DW_FLOP_COST * flops)
    pre = (None, c, h, wd, ptr(wdw), ptr(bdw), *geo, *epi, None, ho, wo)
    if threads > 1 and len(bands) > 1:
        calls = [native.bound(LIB.npr_dwconv2d_mt, (*pre, threads, len(bands), kind, 0, c), 0, 17)]
    else:
        kernel = DW_KERNELS[kind]
        calls = [native.bound(kernel, (*pre, c0, c1), 0, 17) for c0, c1 in bands]

    return _bound_run(calls, yshape, DW_FLOP_COST * flops / (PIECE_FLOPS * threads), cache, general, (wdw, bdw))


def _bound_run(calls, yshape, secs, cache, general, keep):
    """A plan's run(x) -> y: the bound calls (native.bound) into a fresh y, or, where pieces are
    wanted for a node of `secs` predicted seconds (None: never), the general path. `keep` holds
    the arrays whose addresses the calls carry, alive as long as the plan."""
    def run(x):
        if secs is not None and pieces.wanted(secs, cache):
            return general(x)
        y = empty(yshape)
        for call in calls:
            _check(call(x, y))
        return y
    run.keep = keep
    return run


def _depthwise_weights(w, b, geo, cache):
    """The weights as the kernels take them, (C, kh*kw) and a bias, kept in the node's cache."""
    if "dw" not in cache:
        c, (kh, kw) = w.shape[0], geo[:2]
        cache["dw"] = (np.ascontiguousarray(w.reshape(c, kh * kw)),
                       np.ascontiguousarray(b, np.float32) if b is not None else np.zeros(c, np.float32))


def _depthwise(x, y, w, b, geo, epi, threads, cache, kind, flops):
    """Bands of channels on the threads, pieces of channels on a contended device. kind: 0 the
    per-channel kernel (AVX2), 1 channels in the lanes (dwconv_cl.c), 2 per-channel in AVX-512
    (the same bits as 0, 16 columns a vector), 3 16 channels in the lanes (AVX-512, the same
    bits as 1), 4 a plane as one flat row (dwconv_flat.c: small maps, AVX-512, the same bits as 2)."""
    n, c, h, wd = x.shape
    ho, wo = y.shape[2:]
    _depthwise_weights(w, b, geo, cache)
    wdw, bdw = cache["dw"]
    if n > 1:
        # A batch is one image of n*c channels, the weights repeated per image (each channel's
        # arithmetic is its own: the same bits): one call, bands over every image's channels,
        # instead of n calls (CenterFace's 960-channel 3x3 on ten 1x1 maps: ten calls of a few
        # microseconds' work each).
        if cache.get("dw_n", (0,))[0] != n:
            cache["dw_n"] = (n, np.tile(wdw, (n, 1)), np.tile(bdw, n))
        _, wdw, bdw = cache["dw_n"]
        _depthwise_image(x.reshape(1, n * c, h, wd), y.reshape(1, n * c, ho, wo), wdw, bdw, geo, epi, threads,
                         cache, kind, flops * n)
        return y
    _depthwise_image(x, y, wdw, bdw, geo, epi, threads, cache, kind, flops)
    return y


def _depthwise_image(x, y, wdw, bdw, geo, epi, threads, cache, kind, flops):
    """_depthwise's calls, images one after the other (one image after the batch fold)."""
    n, c, h, wd = x.shape
    ho, wo = y.shape[2:]
    # Bands are sized by time: a depthwise FLOP costs ~8 of a dense conv's (10 against 80
    # GFLOP/s, memory-bound), so its channels split at 1/8 of the work. 2 threads, one
    # model alternating with and without: MobileNetV2 0.88-0.94x, PP-LCNet 0.87-0.91x,
    # MobileNetV3-L 0.91-0.96x, EfficientNet-B0 0.94-0.96x; ConvNeXt-T 0.97-1.05x (noise).
    bands = _bands(c, threads, DW_FLOP_COST * flops)
    # Pieces on a contended device: channel ranges cut at multiples of 8, where the lanes
    # kernel's blocks of 8 channels fall in the whole call too (bit-identical).
    secs = DW_FLOP_COST * flops / (PIECE_FLOPS * threads)
    cut = pieces.split(c, secs, unit=8, cal=cache) if pieces.wanted(secs, cache) else None
    if threads > 1 and len(bands) > 1:  # channel bands on par.h's spinning pool
        for i in range(n):
            for c0, c1 in pieces.each(cut) if cut else [(0, c)]:
                chunks = len(bands) if c1 - c0 == c else max(1, min(len(bands), -(-(c1 - c0) // 8)))
                _check(LIB.npr_dwconv2d_mt(ptr(x[i]), c, h, wd, ptr(wdw), ptr(bdw), *geo, *epi,
                                           ptr(y[i]), ho, wo, threads, chunks, kind, c0, c1))
        return y
    dw_kernel = DW_KERNELS[kind]
    for i in range(n):
        for c0, c1 in pieces.each(cut) if cut else bands:
            _check(dw_kernel(ptr(x[i]), c, h, wd, ptr(wdw), ptr(bdw), *geo, *epi, ptr(y[i]), ho, wo, c0, c1))
    return y


def _direct(x, y, w, b, group, geo, epi, threads, cache, isa, flops):
    """The implicit GEMM (conv.c): bands of output rows (of 64-pixel groups for a pointwise
    conv, one flat row) on the threads, per image and group."""
    n, c, h, wd = x.shape
    m, ho, wo = y.shape[1:]
    cg, mg = c // group, m // group
    if "packed" not in cache:
        cache["packed"] = pack(w, b, group)
    packed = cache["packed"]
    kernel = native.conv2d_fn(isa)
    nt = int(y.nbytes >= STREAM_BYTES)
    # A pointwise conv sees each channel as one long row: whole tiles even on small images.
    flat = pointwise(geo, (h, wd), (ho, wo))
    rows = max(1, ho * wo // 64) if flat else ho  # the flat row splits into bands of 64-pixel groups
    bands = _bands(rows, threads, flops / group)
    # Pieces (backends/pieces.py): on a contended device, a long conv's rows in ~1 ms ranges
    # with a preemption point between them; the same kernel on the same rows (bit-identical).
    # (Not for a flat pointwise conv: its pixel tiles start where a call starts, so other
    # edges would change which pixels share a tile, and the rounding with it.)
    cut = pieces.cut(rows, flops / group / (PIECE_FLOPS * threads), cal=cache) if not flat else [(0, rows)]
    if threads > 1 and len(bands) > 1:  # the bands on par.h's spinning pool, a call per image and group
        mt = getattr(LIB, f"npr_conv2d_{isa or native.ISA}_mt")
        for i in range(n):
            for g in range(group):
                wp, bp = packed[g]
                for r0, r1 in pieces.each(cut):
                    # (a piece's rows on every thread, one part each: two parts each cut a piece of
                    # ~1 ms into slivers, each paying its edges: +10-20% on the piece's time)
                    chunks = len(bands) if len(cut) == 1 else min(r1 - r0, threads)
                    _check(mt(ptr(x[i, g * cg:]), cg, h, wd, ptr(wp), ptr(bp), mg, *geo, *epi,
                              ptr(y[i, g * mg:]), ho, wo, nt, int(flat), threads, chunks, r0, r1))
        return y
    if len(cut) > len(bands):
        bands = cut
    jobs = [(i, g, r0, r1) for i in range(n) for g in range(group) for r0, r1 in bands]

    def run(job):
        i, g, r0, r1 = job
        wp, bp = packed[g]
        if flat:  # a band of the flat row: a pixel range, passed as a narrower image
            c0, c1 = r0 * 64, (ho * wo if r1 == rows else r1 * 64)
            xv, yv = x[i, g * cg:].reshape(-1), y[i, g * mg:].reshape(-1)
            _check(_flat_band(kernel, xv, yv, c0, c1, cg, mg, ho * wo, wp, bp, *epi, nt))
            return
        _check(kernel(ptr(x[i, g * cg:]), cg, h, wd, ptr(wp), ptr(bp), mg, *geo,
                      *epi, ptr(y[i, g * mg:]), ho, wo, r0, r1, 0, nt))
    _run(run, jobs, pieced=len(cut) > 1)
    return y


def _direct_plan(xshape, yshape, w, b, group, geo, epi, threads, cache, isa, flops):
    """run(x) -> y for one image of a dense conv: _direct's calls bound once (native.bound); a
    batch, groups, a pointwise conv's several bands of pixels, or pieces on a contended device,
    through _direct."""
    def general(x):
        return _direct(x, empty(yshape), w, b, group, geo, epi, threads, cache, isa, flops)
    n, c, h, wd = xshape
    m, ho, wo = yshape[1:]
    flat = pointwise(geo, (h, wd), (ho, wo))
    rows = max(1, ho * wo // 64) if flat else ho
    bands = _bands(rows, threads, flops)
    if n > 1 or group > 1 or (flat and len(bands) > 1 and threads == 1):
        return general
    if "packed" not in cache:
        cache["packed"] = pack(w, b, group)
    wp, bp = (ptr(a) for a in cache["packed"][0])
    nt = int(4 * m * ho * wo >= STREAM_BYTES)
    if threads > 1 and len(bands) > 1:  # (as _direct: x and y at slots 0 and 18)
        mt = getattr(LIB, f"npr_conv2d_{isa or native.ISA}_mt")
        calls = [native.bound(mt, (None, c, h, wd, wp, bp, m, *geo, *epi, None, ho, wo, nt, int(flat), threads,
                                   len(bands), 0, rows), 0, 18)]
    elif flat:  # the one band of the flat row: _flat_band's call over all ho * wo pixels
        calls = [native.bound(native.conv2d_fn(isa), (None, c, 1, ho * wo, wp, bp, m, 1, 1, 1, 1, 1, 1, 0, 0, *epi,
                                                      None, 1, ho * wo, 0, 1, ho * wo, nt), 0, 18)]
    else:
        calls = [native.bound(native.conv2d_fn(isa), (None, c, h, wd, wp, bp, m, *geo, *epi, None, ho, wo, r0, r1,
                                                      0, nt), 0, 18) for r0, r1 in bands]
    # (a flat pointwise row is never cut: its pixel tiles start where a call starts)
    return _bound_run(calls, yshape, None if flat else flops / (PIECE_FLOPS * threads), cache, general,
                      cache["packed"])


# Groups at least this wide run as one dense conv each (RegNet's 64-wide groups: the grouped
# implicit GEMM ran them at 5-25 GFLOP/s, the dense kernels at their usual 60-90).
GROUP_SPLIT_MIN = 16


def _wide_groups(x, w, b, attrs, act, act_attrs, threads, cache, isa, y):
    """A grouped conv as `group` dense convs, each on its channel slice with the algorithm its
    own shape picks (Winograd, flat GEMM, ...), weights packed per group in the node's cache."""
    group = attrs["group"]
    m, cg = w.shape[:2]
    mg = m // group
    parts = cache.get("groups")
    if parts is None:
        parts = cache["groups"] = [(np.ascontiguousarray(w[g * mg:(g + 1) * mg]),
                                    None if b is None else np.ascontiguousarray(b[g * mg:(g + 1) * mg]), {})
                                   for g in range(group)]
    dense = {**attrs, "group": 1}
    for g, (wg, bg, cg_cache) in enumerate(parts):
        y[:, g * mg:(g + 1) * mg] = conv2d(x[:, g * cg:(g + 1) * cg], wg, bg, dense, act, act_attrs, threads,
                                           cg_cache, isa)
    return y


FLAT_MAX_PIXELS = 160 * 160  # bigger outputs keep the implicit GEMM / Winograd (ESPCN's tuning)
FLAT_SPLIT_M = 400  # threads split the output channels at most this many output pixels


def dw_lanes_chosen(c: int, wo: int, sw: int, isa: str = "avx2", kw: int = 3) -> bool:
    """Depthwise convs with the channels in the lanes (dwconv_cl.c) where a row of the
    output is short (<= 28) or strided; at least one block of 8 channels. `python
    bench/dwconv.py`, 1 thread (AVX-512 machine, both kernels AVX2): lanes 0.55-0.75x the
    per-channel kernel's time on the 28x28..7x7 and stride-2 shapes of MobileNetV2/V3,
    EfficientNet and ConvNeXt (3x3 to 7x7), a tie at 56x56 stride 1, 1.2x slower at 112x112
    stride 1 (a 112-float row fills the per-channel kernel's strips). On whole models
    (alternating, same process): MobileNetV2 0.84-0.90x, EfficientNet-B0 0.75x, NASNet-mobile
    0.89x, PP-LCNet 0.90x, ConvNeXt-T and YOLOv8n unchanged.
    With AVX-512 the per-channel kernel takes a row 16 columns a vector with a masked last one,
    four output rows a block, and wins down to 14-wide rows at stride 1 and 28-wide at stride 2
    (`bench/dwconv.py`, 1 thread: 144 x 56x56 stride 2 169 us against lanes 179, 96 x 112x112
    stride 2 418 against 444, 5x5 on 28x28 191 against 243); lanes keep rows of at most 8
    (960 x 7x7 3x3 49 against 67, 1152 x 7x7 5x5 103 against 168) and stride 2 onto rows of
    at most 16 (576 x 14x14 -> 7x7 52 against 85). convtune measures both wherever a conv is
    big enough.
    Since 2026-12-06 the lanes on AVX-512 are 16 channels a vector (npr_dwconv2d_cl16), and
    they win more: `python bench/dwconv.py`, 1 thread, AMD EPYC (Zen 4 class), per-channel
    against lanes, us: every stride-2 shape (96 x 112x112 -> 56 355 / 310, 144 x 56x56 -> 28
    155 / 102, 576 x 14x14 -> 7 102 / 38), rows of at most 8 (960 x 7x7 69 / 42, 768 x 7x7 7x7
    363 / 90), and 5x5 / 7x7 windows on rows of up to 28 (480 x 14x14 5x5 145 / 102, 384 x
    14x14 7x7 264 / 131, 240 x 28x28 5x5 199 / 179); 3x3 on rows of 14 and more stays
    per-channel (384 x 14x14 43 / 50, 192 x 28x28 61 / 89), as does 7x7 on 56 (518 / 600).
    """
    if isa == "avx512":
        return c >= 8 and (sw > 1 or wo <= 8 or (kw >= 5 and wo <= 28))
    return c >= 8 and (wo <= 28 or sw > 1)


DW_FLAT_MAX_OUT = 1024  # csrc/dwconv_flat.c's FLAT_MAX_OUT


def dw_flat_fits(h: int, wd: int, geo: tuple, ho: int, wo: int) -> bool:
    """Whether dwconv_flat.c takes a depthwise conv (npr_dwconv2d_flat_fits says the same): no
    dilation, the same stride both ways, 1 or 2, a window of at most 49 taps, at most
    DW_FLAT_MAX_OUT outputs a plane, and the input's columns on the output's row pitch: at
    stride 1 rows as wide as the output's ("same" padding), at stride 2 phase rows that fit it."""
    kh, kw, sh, sw, dh, dw = geo[:6]
    if dh != 1 or dw != 1 or sh != sw or kh * kw > 49 or not 0 < ho * wo <= DW_FLAT_MAX_OUT:
        return False
    return wd == wo if sh == 1 else sh == 2 and (wd + 1) // 2 <= wo


def dw_flat_chosen(geo: tuple, wo: int) -> bool:
    """A 3x3 stride-1 depthwise conv on rows of at most 14 as one flat row a plane (AVX-512,
    dwconv_flat.c), where dw_flat_fits. `python bench/dwconv.py --threads 1`, AMD EPYC (Zen 4
    class), 2026-12-06, us flat / 16 lanes / per channel: 960 x 7x7 29.5 / 38-41 / 62-68,
    384 x 14x14 36-38 / 45-58 / 39-49; on 28x28 it ties the per-channel kernel (64 / 57-75), and
    at stride 2 or with 5x5 / 7x7 windows the lanes win (576 x 14x14 s2 52 / 34, 768 x 7x7 7x7
    100-114 / 85): each tap there is a load across two cache lines, where the lanes load one
    aligned vector. convtune measures it beside the others wherever it fits."""
    return geo[:4] == (3, 3, 1, 1) and wo <= 14


def grouped_tgemm_chosen(cg: int, geo: tuple, ho: int, wo: int, begin, end) -> bool:
    """A grouped conv (not depthwise) on a map of at most TGEMM_MAX_PIXELS outputs as the
    transposed product of each group, whole groups on the threads (_tgemm). A group at a time,
    each with every thread on it (_wide_groups' dense convs, or the grouped implicit GEMM),
    paid a fork-join per group for little work: 2 threads, against ORT, alone (rule -> tgemm):
    RegNet-Y's 8 groups of 64 on 14x14 2.14 -> 1.19, 17 groups on 7x7 2.91 -> 1.42,
    SqueezeBERT's 4 pointwise groups of 192 over 128 positions 1.05 -> 0.99 (its 3072 -> 768
    1.74 -> 0.92), wav2vec2's 16 groups of 48, k128 over 49, 1.99 -> 1.01; in the model,
    SqueezeBERT's convs 57.8 -> 48.2 ms. On bigger maps a group's own dense conv may be
    Winograd (RegNet-Y's 3 groups on 28x28: 0.55 of ORT's time, 1.19 this way): convtune
    measures both there."""
    return ho * wo <= convtune.TGEMM_MAX_PIXELS and convtune.tgemm_fits(cg, geo, ho, wo, begin, end)


def tgemm_chosen(c: int, geo: tuple, ho: int, wo: int, begin, end) -> bool:
    """The transposed product for a conv of one output row and a window wider than a pixel (1-D
    convs: audio front ends, text CNNs), where convtune does not measure (above
    TUNE_MAX_FLOPS, below TUNE_MIN_FLOPS, not yet on a contended device). The implicit GEMM
    splits output rows over the threads, so it ran such a conv on one: wav2vec2's 512->512 k3
    stride-2 conv over 3,199 samples (2.5 GFLOP, never measured) took 28.7 ms at 2 threads
    against ORT's 14.7. Alone, ms (direct / tgemm), 1 thread: that conv 29.1 / 28.3, 1->512
    k10 s5 over 16,000 0.71 / 0.65, 512->512 k2 s2 over 199 1.35 / 1.14, 256->256 k5 over 500
    3.53 / 3.45, 64->64 k3 over 1,000 0.29 / 0.30; 2 threads 29.2 / 14.6, 1.00 / 0.34,
    1.31 / 0.64, 3.54 / 2.24, 0.45 / 0.22."""
    return ho == 1 and geo[1] > 1 and convtune.tgemm_fits(c, geo, ho, wo, begin, end)


def flat_chosen(c: int, m: int, group: int, geo: tuple, ho: int, wo: int, isa: str, threads: int = 1) -> bool:
    """conv_gemm.c for dense convs with at most FLAT_MAX_PIXELS output pixels, except where
    Winograd wins: 3x3 stride-1 with >= 32 input channels on >= 40x40 outputs (YOLOv8n's
    64->64 on 40x40: 0.51 ms Winograd, 0.68 ms flat; 32->32 on 40x40 ties; PP-OCRv4 det's
    96->24 on 160x160: 4.8 against 7.9 ms; 16->16 on 80x80: flat 0.21, Winograd 0.25). On more
    threads Winograd keeps only > 40x40: flat's own workers scale where Winograd's bands on the
    Python pool do not (2 threads, 64->64 on 40x40: 0.44 against 0.50 ms). AVX-512 only: the AVX2
    build (8 x 1-vector tiles, ~80 GFLOP/s) lost to the AVX2 Winograd and implicit GEMM on
    most of YOLOv8n's shapes (docs/cpu.md, "Small-image convs"). Measured on YOLOv8n's 63 convs
    at 1 thread, AVX-512: 14.1 ms in all (the previous choice 19.8, ORT 14.3).
    On AVX2, small convs only (under TUNE_MIN_FLOPS, which convtune leaves to this rule): there
    the implicit GEMM's set-up per band outweighs its tiles, and flat ran 446 dense shapes
    (C 1-256, M 1-128, 1x1/3x3/5x5, maps 1-28) in a median 0.31 of its time, 1 thread (LeNet's
    5x5 convs 66 -> 18 us, ORT 34; an SE block's 576->24 on a 1x1 map 39 -> 14, ORT 25),
    except pointwise convs to a few channels from many (256->4 on 28x28: 1.41x), left to it."""
    if isa != "avx512":
        kh, kw = geo[:2]
        return group == 1 and 2 * c * m * kh * kw * ho * wo < convtune.TUNE_MIN_FLOPS \
            and not (kh * kw == 1 and m < 8 and c >= 64)
    if group != 1 or ho * wo > FLAT_MAX_PIXELS:
        return False
    return not (winograd.chosen(c, m, group, geo, ho, wo, isa) and c >= 32
                and ho * wo >= (1600 if threads == 1 else 1601))


SGEMM_POINTWISE_FLOATS = 1 << 19  # a pointwise conv's input over this (2 MB) goes to the sgemm


def sgemm_pointwise(c: int, m: int, group: int, geo: tuple, ho: int, wo: int) -> bool:
    """A 1x1 stride-1 unpadded conv whose input matrix (C x H*W) outgrows L2 (and C >= 256) is
    an sgemm (_gemm; its im2col is a copy): conv_gemm.c's flat kernel has no K blocking and
    streams it from memory once per output-channel tile. Measured at 1 thread on a 3x3 grid of
    C, M in 128..1024 and H*W in 256..4096 (AVX-512, when _gemm was NumPy's BLAS): flat 19-48
    against BLAS 66-133 GFLOP/s there (SegFormer's 1024 -> 256 on 64x64: 25 against ~140),
    equal below."""
    return group == 1 and geo == (1, 1, 1, 1, 1, 1, 0, 0) and c >= 256 and c * ho * wo >= SGEMM_POINTWISE_FLOATS


def gemm_chosen(c: int, m: int, group: int, geo: tuple, ho: int, wo: int) -> bool:
    """im2col + sgemm (_gemm) for dense convs where the implicit GEMM's 4-channel x 1-3-vector
    tiles run short or gather: strided convs (the gather is scalar), and small images (a row of
    10-20 pixels fills one vector of a tile; Winograd pads a 10x10 image to 1.9x its work).
    Measured on YOLOv8n's shapes (docs/cpu.md, "Small images"): 0.46-0.9x the time of the
    chosen kernel there; 1.3-2.9x on 3x3 stride-1 convs over >= 20x20 images (Winograd wins)
    and on 1x1 convs over big images with few channels."""
    if group != 1 or c * m < 256:
        return False
    k1 = geo[0] == geo[1] == 1
    if geo[2] > 1 or geo[3] > 1:
        return True
    if k1:
        return ho * wo <= 400 and c * m >= 32768
    return ho * wo <= 144


def batch_gemm_chosen(n: int, c: int, m: int, group: int, geo: tuple, ho: int, wo: int) -> bool:
    """im2col + sgemm for a batch of tiny images (at most 16 output pixels each) under weights of
    at least 16 KB: every other kernel runs one call per image and streams the weights once per
    image for a few pixels of work, where _gemm makes the whole batch's pixels one run of
    panels. 1 and 2 threads alike (medians, AVX-512 VM): CenterFace's 576->160 1x1 on ten 1x1
    maps 248 -> 74 us, 960->320 706 -> 175; 64->128 3x3 on four 4x4 maps 141 -> 125 (1T), 71
    (2T); at 8x8 the gain is gone (24->24 3x3 on ten: 113 flat, 189 gemm at 1 thread)."""
    return n > 1 and group == 1 and ho * wo <= 16 and c * m * geo[0] * geo[1] >= 4096


SMALLC_MAX_C = 4  # input channels; above this the implicit GEMM's K is long enough


def smallc_chosen(c: int, m: int, group: int, geo: tuple, isa: str) -> bool:
    """smallc.c, the direct kernel, for stride-1 dilation-1 dense convs with at most
    SMALLC_MAX_C input channels and at least 2x2 taps, on images flat_chosen leaves (it is
    checked first). ESPCN's 5x5 1->64 +tanh on 1280x720, 1 thread: AVX-512 ~23 ms against the
    implicit GEMM's ~51 (docs/cpu.md, "ESPCN 720p -> 4K, now")."""
    return (group == 1 and c <= SMALLC_MAX_C and geo[2:6] == (1, 1, 1, 1) and geo[0] * geo[1] >= 4
            and m >= 8)


def _smallc(x, w, b, geo, code, alpha, beta, y, threads, cache, isa, flops):
    """Bands of output rows on the threads; weights packed for the kernel's MB once per node."""
    fn = getattr(LIB, f"npr_smallc_{isa}")
    mb = getattr(LIB, f"npr_smallc_mr_{isa}")()
    if ("smallc", mb) not in cache:
        cache["smallc", mb] = pack(w, b, 1, mb)[0]
    wp, bp = cache["smallc", mb]
    n, c, h, wd = x.shape
    m, ho, wo = y.shape[1:]
    kh, kw, pt, pl = geo[0], geo[1], geo[6], geo[7]
    nt = int(y.nbytes >= STREAM_BYTES)
    bands = _bands(ho, threads, flops)
    if threads > 1 and len(bands) > 1:  # the bands on par.h's spinning pool (see _winograd)
        mt = getattr(LIB, f"npr_smallc_{isa}_mt")
        for i in range(n):
            _check(mt(ptr(x[i]), c, h, wd, ptr(wp), ptr(bp), m, kh, kw, pt, pl, code, alpha, beta,
                      ptr(y[i]), ho, wo, 0, ho, nt, threads, len(bands)))
        return y
    jobs = [(i, r0, r1) for i in range(n) for r0, r1 in bands]

    def run(job):
        i, r0, r1 = job
        _check(fn(ptr(x[i]), c, h, wd, ptr(wp), ptr(bp), m, kh, kw, pt, pl, code, alpha, beta,
                  ptr(y[i]), ho, wo, r0, r1, nt))
    _run(run, jobs)
    return y


def _gemm(x, w, b, geo, end, code, alpha, beta, y, cache, threads=1, flops=0.0):
    """y[i] = act([W | bias] @ [im2col(x[i]); 1]) by csrc/im2col_gemm.c: the bias rides the
    GEMM as a row of ones; each panel of output pixels (16 or 32) is packed straight from the
    input into transformer.c's sgemm layout, multiplied, and written out with its activation,
    on the library's pool (par.h). The pixels of all images are one run of panels, so small
    images share them (deepcut's 64 sequences of 12 output pixels each ran as 64 products of
    one half-empty panel). Not NumPy's BLAS: its threads spin after a call and on 2 vCPUs took
    a core from the next kernel's pool workers (PP-OCRv4 det: a Winograd conv right after BLAS
    convs ran 2x its time), and a product there has no preemption points. Pieces on a
    contended device: ranges of panels (each computed as in the whole call: bit-identical)."""
    args, panels = _gemm_args(x.shape, y.shape, w, b, geo, (code, alpha, beta), cache, threads)
    cut = pieces.cut(panels, flops * x.shape[0] / (PIECE_FLOPS * threads), cal=cache)
    for p0, p1 in pieces.each(cut):
        a = args(p0, p1)
        _check(LIB.npr_im2col_gemm_mt(ptr(x), *a[1:18], ptr(y), *a[19:]))
    return y


def _gemm_args(xshape, yshape, w, b, geo, epi, cache, threads):
    """(args(p0, p1): npr_im2col_gemm_mt's arguments for panels [p0, p1), x and y left None
    (slots 0 and 18); the number of panels). [W | bias] packed once into the node's cache."""
    n, c, h, wd = xshape
    m, ho, wo = yshape[1:]
    kh, kw, sh, sw, dh, dw, pt, pl = geo
    if pointwise(geo, (h, wd), (ho, wo)):
        # a pointwise conv reads each channel's plane whole: one row of h*w pixels, so the
        # kernel packs a panel's columns in one run (7x7 maps: runs of 7 otherwise)
        h, wd, ho, wo = 1, h * wd, 1, h * wd
    k = c * kh * kw
    if "gemm" not in cache:
        wb = np.empty((m, k + 1), np.float32)
        wb[:, :k] = w.reshape(m, k)
        wb[:, k] = 0 if b is None else b
        cache["gemm"] = wb
    wp = ptr(cache["gemm"])
    isa = native.ISA
    nr = getattr(LIB, f"npr_gemm_nr_{isa}")()

    def args(p0, p1):
        return (None, n, c, h, wd, wp, m, kh, kw, sh, sw, dh, dw, pt, pl, *epi, None, ho, wo, int(isa == "avx512"),
                nr, p0, p1, threads, max(1, min(threads * 4, p1 - p0)) if threads > 1 else 1)
    return args, -(-(n * ho * wo) // nr)


def _gemm_plan(xshape, yshape, w, b, geo, end, epi, threads, cache, flops):
    """run(x) -> y: _gemm's one call bound once (native.bound: a call's 27 arguments are not
    converted on every run); pieces on a contended device through _gemm itself."""
    args, panels = _gemm_args(xshape, yshape, w, b, geo, epi, cache, threads)
    whole = native.bound(LIB.npr_im2col_gemm_mt, args(0, panels), 0, 18)
    return _bound_run([whole], yshape, flops * xshape[0] / (PIECE_FLOPS * threads), cache,
                      lambda x: _gemm(x, w, b, geo, end, *epi, empty(yshape), cache, threads, flops), cache["gemm"])


def _tgemm(x, w, b, code, alpha, beta, y, cache, threads, flops, geo, group=1):
    """A conv as the transposed product, output channels in the vectors (gemm_mt.c
    npr_tconvk_range_mt, tr_gemm_tpl.h GEMM_TCONV_AP): the input as im2col^T in packed blocks
    of pixels (read in place where no tap falls outside it, else from a zero-padded copy), W^T
    packed once as any weight; the output channels' panels in bands on the threads, the
    activation after each band; pieces on a contended device are ranges of pixel blocks (a conv
    with few output channels has one or two panels). `geo`: the conv's geometry and its output
    map's size. For small maps, where the im2col GEMM's 16-pixel panels run part empty (7x7: 64
    columns for 49 pixels) and stream all the weights once per panel (a 3x3 conv from 256
    channels: 2.4 MB, four times), and convs from few channels (K 27: RGB stems); convtune
    measures it against the others. A grouped conv (`group` > 1) runs each group as such a
    conv, whole groups on the threads (npr_tconvk_groups_mt; pieces: ranges of groups)."""
    fn, args, units, y_at = _tgemm_args(x.shape, y.shape, w, b, (code, alpha, beta), cache, threads, geo, group)
    for u0, u1 in pieces.each(pieces.cut(units, flops * x.shape[0] / (PIECE_FLOPS * threads), cal=cache)):
        a = args(u0, u1)
        _check(fn(a[0], ptr(x), *a[2:y_at], ptr(y), *a[y_at + 1:]))
    return y


def _tgemm_args(xshape, yshape, w, b, epi, cache, threads, geo, group=1):
    """(the entry point; args(u0, u1): its arguments for units [u0, u1) — pixel blocks of all
    images, or (image, group) pairs of a grouped conv — x and y left None (slot 1 and slot
    y_at); the number of units; y_at). W^T and the bias packed once into the node's cache, a
    group's panels after another's."""
    n, c, h, wd = xshape
    m = yshape[1]
    mg = m // group
    k = w[0].size  # (c / group) * kh * kw: W^T's rows, in W's own order
    isa = native.ISA
    nr = getattr(LIB, f"npr_gemm_nr_{isa}")()
    panels = -(-mg // nr)
    if "tgemm" not in cache:
        bp = np.empty(group * panels * k * nr, np.float32)
        bias = np.zeros(group * panels * nr, np.float32)
        for g in range(group):
            wt = np.ascontiguousarray(w[g * mg:(g + 1) * mg].reshape(mg, k).T)
            getattr(LIB, f"npr_gemm_pack_{isa}")(ptr(wt), ptr(bp[g * panels * k * nr:]), k, mg)
            if b is not None:
                bias[g * panels * nr:g * panels * nr + mg] = b[g * mg:(g + 1) * mg]
        cache["tgemm"] = (bp, bias)
    bp, bias = (ptr(a) for a in cache["tgemm"])
    isa512 = int(isa == "avx512")
    if group > 1:
        def args(u0, u1):
            return (isa512, None, n, group, c // group, h, wd, *geo, bp, None, bias, mg, *epi, u0, u1, threads)
        return LIB.npr_tconvk_groups_mt, args, n * group, 18
    mr = 8 if isa == "avx512" else 6  # (the tile's pixels: tr_gemm_tpl.h MR)
    blocks = -(-(geo[8] * geo[9]) // mr)
    chunks = max(1, min(threads * 2, panels)) if threads > 1 else 1

    def args(u0, u1):
        return (isa512, None, n, c, h, wd, *geo, bp, None, bias, m, *epi, u0, u1, threads, chunks)
    return LIB.npr_tconvk_range_mt, args, n * blocks, 17


def _tgemm_plan(xshape, yshape, w, b, epi, threads, cache, flops, geo, group=1):
    """run(x) -> y: _tgemm's call bound once; pieces on a contended device through _tgemm."""
    fn, args, units, y_at = _tgemm_args(xshape, yshape, w, b, epi, cache, threads, geo, group)
    return _bound_run([native.bound(fn, args(0, units), 1, y_at)], yshape,
                      flops * xshape[0] / (PIECE_FLOPS * threads), cache,
                      lambda x: _tgemm(x, w, b, *epi, empty(yshape), cache, threads, flops, geo, group),
                      cache["tgemm"])


def pointwise(geo: tuple, in_hw: tuple, out_hw: tuple) -> bool:
    """A 1x1 stride-1 dilation-1 conv with no padding, whose output planes are its input planes:
    the kernels then read each channel as one row of pixels. The map sizes are asked too: geo
    holds the begin pads only, and a 1x1 conv padded at the end has more output pixels than
    input ones (`_direct` took such a conv for pointwise and read past its planes: found by the
    kernels fuzz target)."""
    return geo == (1, 1, 1, 1, 1, 1, 0, 0) and tuple(in_hw) == tuple(out_hw)


def empty(shape) -> np.ndarray:
    """np.empty(shape, float32) starting on a cache line. NumPy aligns big arrays to 16 bytes
    only; the non-temporal stores need whole aligned vectors, and aligned rows keep ordinary
    vector stores from straddling two lines (worth 0-10% on ESPCN's first conv)."""
    n = math.prod(shape)
    buf = np.empty(n + 16, np.float32)
    o = (-ptr(buf) % 64) // 4
    return buf[o:o + n].reshape(shape)


def _winograd(x, w, b, geo, code, alpha, beta, y, threads, cache, isa, flops):
    """Bands of 4-row tile rows on the threads; the transformed weights are kept per node.
    On more threads the bands go to the library's one spinning pool (csrc/par.h) in one call
    per image, not to the Program's Python pool: a hand-off there costs tens of us on a
    2-vCPU VM, and ESPCN's cascade hands over 23 bands x 8 parts per conv."""
    fn, mr = native.wino_fn(isa)
    if ("wino", mr) not in cache:
        cache["wino", mr] = winograd.pack(w, b, mr)
    u, bias = cache["wino", mr]
    n, c, h, wd = x.shape
    m, ho, wo = y.shape[1:]
    bands = _bands(-(-ho // 4), threads, flops / 4)  # a quarter of the multiplies
    nt = int(y.nbytes >= STREAM_BYTES)
    mt = getattr(LIB, f"npr_wino_{isa or native.ISA}_mt", None)
    tiles = -(-ho // 4)
    # Pieces of tile rows (whole 4-row tiles: the same tiles as the whole node's).
    cut = pieces.cut(tiles, flops / (WINO_SPEEDUP * PIECE_FLOPS * threads), cal=cache)
    if threads > 1 and len(bands) > 1 and mt is not None:  # the bands on par.h's spinning pool
        for i in range(n):
            for t0, t1 in pieces.each(cut):
                # (one part a thread: two each split a piece's tiles into partial blocks of
                # TB tiles, re-reading the transformed weights: a 96->24 3x3 conv on 160x160
                # ran 1.22x its whole time in pieces that way, 1.02x so)
                chunks = len(bands) if len(cut) == 1 else min(t1 - t0, threads)
                _check(mt(ptr(x[i]), c, h, wd, ptr(u), ptr(bias), m, geo[6], geo[7], code, alpha, beta,
                          ptr(y[i]), ho, wo, t0, t1, nt, threads, chunks))
        return y
    if len(cut) > len(bands):
        bands = cut
    jobs = [(i, r0, r1) for i in range(n) for r0, r1 in bands]

    def run(job):
        i, r0, r1 = job
        _check(fn(ptr(x[i]), c, h, wd, ptr(u), ptr(bias), m, geo[6], geo[7], code, alpha, beta,
                  ptr(y[i]), ho, wo, r0, r1, nt))
    _run(run, jobs, pieced=len(cut) > 1)
    return y


def _winograd_plan(xshape, yshape, w, b, geo, epi, threads, cache, isa, flops):
    """run(x) -> y for one image: _winograd's calls bound once (native.bound); a batch, or
    pieces on a contended device, through _winograd."""
    def general(x):
        return _winograd(x, w, b, geo, *epi, empty(yshape), threads, cache, isa, flops)
    n, c, h, wd = xshape
    m, ho, wo = yshape[1:]
    if n > 1:
        return general
    fn, mr = native.wino_fn(isa)
    if ("wino", mr) not in cache:
        cache["wino", mr] = winograd.pack(w, b, mr)
    u, bias = (ptr(a) for a in cache["wino", mr])
    tiles = -(-ho // 4)
    bands = _bands(tiles, threads, flops / 4)
    nt = int(4 * m * ho * wo >= STREAM_BYTES)
    mt = getattr(LIB, f"npr_wino_{isa or native.ISA}_mt", None)
    pre = (None, c, h, wd, u, bias, m, geo[6], geo[7], *epi, None, ho, wo)  # (x and y at slots 0 and 12)
    if threads > 1 and len(bands) > 1 and mt is not None:
        calls = [native.bound(mt, (*pre, 0, tiles, nt, threads, len(bands)), 0, 12)]
    else:
        calls = [native.bound(fn, (*pre, r0, r1, nt), 0, 12) for r0, r1 in bands]
    return _bound_run(calls, yshape, flops / (WINO_SPEEDUP * PIECE_FLOPS * threads), cache, general,
                      cache["wino", mr])


def _flat(xshape, w, b, geo, code, alpha, beta, yshape, threads, cache, isa, flops):
    """conv_gemm.c, weights packed for the kernel's MR once per node; returns run(x) -> y for
    inputs of this shape. Threads split the output channels on small images (<= FLAT_SPLIT_M
    pixels: each thread then streams only its share of the weights, and no band ends in a
    short tile), else bands of whole output rows; the parts run on conv_gemm.c's workers,
    which spin between convs (csrc/par.h says why), not on the program's pool."""
    mr, nr = getattr(LIB, f"npr_convg_{isa}_mr")(), getattr(LIB, f"npr_convg_{isa}_nr")()
    if ("flat", mr) not in cache:
        cache["flat", mr] = pack(w, b, 1, mr)[0]
    wp, bp = cache["flat", mr]
    n, c, h, wd = xshape
    m, ho, wo = yshape[1:]
    split_m = ho * wo <= FLAT_SPLIT_M
    parts = min(threads, len(_bands(-(-m // mr) if split_m else ho, threads, flops)))  # fork-join: no more
    pre = (c, h, wd, ptr(wp), ptr(bp), m, *geo, code, alpha, beta)
    if parts > 1:  # one call per image, its parts on conv_gemm.c's own spinning workers
        fn, post = getattr(LIB, f"npr_convg_{isa}_mt"), (ho, wo, parts, int(split_m))
    else:
        fn, post = getattr(LIB, f"npr_convg_{isa}"), (ho, wo)  # + pixels [p0, p1)
    xstep, ystep = 4 * c * h * wd, 4 * m * ho * wo  # bytes per image

    whole = native.bound(fn, (None, *pre, None, *post, 0, ho * wo), 0, len(pre) + 1) \
        if n == 1 else None

    def run(x):
        y = empty(yshape)
        secs = flops / (PIECE_FLOPS * parts)
        pieced = not split_m and pieces.wanted(secs, cache)
        if whole is not None and not pieced:  # one image, one call
            _check(whole(x, y))
            return y
        xp, yp = ptr(x), ptr(y)
        # Pieces on a contended device: whole output rows through the threaded entry point (it
        # splits its parts at whole rows too), whole tiles of pixels on one thread (its one
        # call tiles pixels across rows from pixel 0); split_m's small images run whole.
        if not pieced:
            cut, px = [(0, ho * wo)], 1
        elif parts > 1:  # (ranges of rows, passed as pixels)
            cut, px = pieces.split(ho, secs, cal=cache), wo
        else:
            cut, px = pieces.split(ho * wo, secs, unit=nr, cal=cache), 1
        for i in range(n):
            for p0, p1 in pieces.each(cut):
                _check(fn(xp + i * xstep, *pre, yp + i * ystep, *post, p0 * px, p1 * px))
        return y
    run.keep = (wp, bp)  # kept alive with the plan
    return run


def _flat_band(kernel, xv, yv, c0, c1, cg, mg, plane, wp, bp, code, alpha, beta, nt) -> int:
    """Pixels [c0, c1) of a pointwise conv over flat (C, plane) channels: a 1 x (c1-c0) image
    whose input and output channels keep their pitch `plane`."""
    return kernel(ptr(xv[c0:]), cg, 1, plane, ptr(wp), ptr(bp), mg, 1, 1, 1, 1, 1, 1, 0, 0,
                  code, alpha, beta, ptr(yv[c0:]), 1, c1 - c0, 0, 1, plane, nt)


def _bands(rows: int, threads: int, flops: float) -> list[tuple[int, int]]:
    """Split `rows` into about `threads` equal bands, fewer when the work is small."""
    want = threads * (4 if flops > 1e8 else 1)  # big work: more bands than threads, for balance
    k = max(1, min(want, rows, int(flops // MIN_FLOPS_PER_BAND)))
    edges = [round(rows * j / k) for j in range(k + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _run(fn, jobs, pieced: bool = False):
    """The jobs one after another on the calling thread (one thread, or a conv too small to
    split: more threads go to the library's pool through the kernels' _mt entry points);
    pieced: a preemption point between two jobs."""
    for j in pieces.each(jobs) if pieced else jobs:
        fn(j)


def _check(rc: int):
    if rc != 0:
        raise MemoryError("the conv kernel could not allocate its tile buffer")
