"""Float32 MatMul on the cpu backend: BLAS sgemm (NumPy's OpenBLAS), with the rows of the
output split over the program's threads by the program's own pool rather than by BLAS,
and the adds that follow a matmul (bias, residual) applied in place on each band.

Why not BLAS's threads: OpenBLAS's workers spin and then yield between calls; on a machine
whose cores are shared, a 128 x 384 x 384 sgemm that takes 0.3 ms on one thread took 20-40 ms
on two (MiniLM: 1.8 s a run at 2 threads, against 40 ms at 1). Bands on the pool's threads
block instead of spinning, and each band is one single-threaded sgemm (NumPy releases the
GIL for it). BLAS is held to one thread for the length of the call (threadpoolctl's
controller, ~1 us) and given back its count afterwards.

A matmul by a constant matrix (the weights of a linear layer; CpuProgram.lower finds
them) runs csrc/transformer.c's sgemm instead: the weights packed once per node into panels
of 2 vectors of columns (`pack`), an 8 x 32 (AVX-512) / 6 x 16 (AVX2) register tile, the bias
and residual adds in the tile's store, bands of panels over the threads (`linear`). Measured
(1 thread, one 128 x 384 @ 384 x 384 product, warm caches): 0.18 ms on AVX-512 against
OpenBLAS's 0.22 ms; 128 x 384 @ 384 x 1536: 0.87 vs 1.1 ms; AVX2 build 0.31 / 1.37 ms.
Packed weights are a second copy of each weight matrix. Float32 weights that are int8 values
times one scale per column, bit for bit (MiniLM-int8's, dequantized at import), are packed as
int8 + scales instead (`int8_columns`): each panel is widened to float32 once per call into a
per-thread buffer, giving the kernel the very same floats, and the weights cross the memory
bus at a quarter of the bytes (36 MiniLM products: 21.6 -> 18.1 ms on AVX-512, 28.8 -> 25.2 ms
on AVX2; +10.6 MB resident instead of +42 MB).

Shapes: a (..., M, K) @ b (K, N) runs as one (rows, K) @ (K, N) sgemm per band of rows;
batched a (B..., M, K) @ b (B..., K, N) (attention's QKᵀ and PV: (1, 12, 128, 32) @
(1, 12, 32, 128)) in bands of the batch, each item's b packed where it lies (a view of heads
side by side, or Kᵀ straight from the keys: `_b_items`), at one thread too where K is long
(`OWN_MIN_K`). Anything else (integers, broadcast batches, 1-D operands) runs the reference
kernel.
"""
from __future__ import annotations

import numpy as np

from ... import pieces
from ...reference.kernels import KERNELS as REF
from .. import blas, native
from .. import nativeconv

MIN_FLOP = 2_000_000  # a smaller product runs on the calling thread (hand-off ~20-50 us)
OWN_MIN_K = 128  # at one thread, a product by a computed b with a shorter K keeps NumPy's sgemm (matmul_add)
# A product of a few rows (a decoder's step: one token) reads each weight once and is bound by
# memory, not arithmetic: splitting it pays from a quarter of a megabyte of weights (medians on
# the development VM, weights in cache: 768 x 768 at 2 threads 55 -> 36 us, 768 x 256 25 -> 19).
MIN_GEMV_FLOP = 1 << 17
GEMV_ROWS = 4


def _single_blas(fn):
    """fn() with every BLAS at one thread (the product is already split over ours)."""
    return blas.with_threads(1, fn)


def _parts(program, flop, units, rows=None):
    limit = MIN_GEMV_FLOP if rows is not None and rows <= GEMV_ROWS else MIN_FLOP
    if program.threads == 1 or flop < limit:
        return 1
    return max(1, min(program.threads, units))


def matmul_add(program, a, b, adds=()):
    """((a @ b) + adds[0]) + adds[1] ..., each add in place where its operand broadcasts to
    the product's shape; None where the fast path does not apply (the caller then runs the
    reference kernels)."""
    if a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 2 or b.ndim < 2:
        return None
    K, N = b.shape[-2], b.shape[-1]
    if a.shape[-1] != K:
        return None
    if b.ndim == 2:
        out_shape = a.shape[:-1] + (N,)
        a2 = native.contiguous(a).reshape(-1, K)
        rows, units = a2.shape[0], a2.shape[0]
    elif a.shape[:-2] == b.shape[:-2]:
        out_shape = a.shape[:-1] + (N,)
        a2 = native.contiguous(a).reshape(-1, a.shape[-2], K)
        rows, units = a2.shape[0] * a2.shape[1], a2.shape[0]
    else:
        return None
    for c in adds:
        if c.dtype != np.float32 or not native.broadcasts_to(c.shape, out_shape):
            return None
    y = np.empty(out_shape, np.float32)
    # Per band: the adds as (rows, N) slices, or one row of N broadcast down the band.
    flat = []
    for c in adds:
        if c.size == N and c.shape[-1:] == (N,):
            flat.append((c.reshape(N), False))
        elif c.shape == out_shape:
            flat.append((np.ascontiguousarray(c).reshape(rows, N), True))
        else:
            flat.append((c, None))  # some other broadcast: added whole, after the product
    y2 = y.reshape(rows, N)
    parts = _parts(program, 2 * rows * K * N, units)
    edges = [units * j // parts for j in range(parts + 1)]
    per = rows // units  # output rows per unit

    def band(j):
        u0, u1 = edges[j], edges[j + 1]
        if b.ndim == 2:
            np.matmul(a2[u0:u1], b, out=y2[u0:u1])
        else:  # (a copy of b where its batch dims do not merge)
            np.matmul(a2[u0:u1], b.reshape(-1, K, N)[u0:u1], out=y.reshape(-1, per, N)[u0:u1])
        yb = y2[u0 * per:u1 * per]
        for c, full in flat:
            if full is None:
                return
            np.add(yb, c[u0 * per:u1 * per] if full else c, out=yb)

    # The packed sgemm, b packed for this call, outruns NumPy's OpenBLAS at one thread too where
    # K is long (1 thread, AMD EPYC AVX-512, ms packed / OpenBLAS: YOLOS's P @ V 3 x 677x677 @
    # 677x64 1.56 / 1.81, BERT's 12 x 128x128 @ 128x64 0.24 / 0.28, DeiT's 6 x 197x197 @ 197x64
    # 0.28 / 0.32); on K = 64 (Q @ K^T) it loses (2.1 / 1.8-1.9: a tile's 64 steps do not
    # pay for its set-up and stores), and NumPy keeps the small products.
    own = _bmm() is not None and 2 * rows * K * N >= MIN_FLOP and K >= OWN_MIN_K
    if (parts > 1 or own) and b.ndim == 2:  # b packed for this call, its panels on the library's pool
        done = linear(program, a, b, {}, adds, weights=False)
        if done is not None:
            return done
        parts = 1
    if parts > 1 or own and b.ndim > 2:  # the heads on the library's spinning pool, each packed then multiplied
        # (pieces: ranges of heads, each computed as in the whole call; b read where it lies)
        bs, tb, bitem, brow = _b_items(b)
        for u0, u1 in pieces.each(_cut(units, 2 * rows * K * N, parts, None)):
            if _bmm()(native.ISA == "avx512", native.ptr(a2[u0:]), native.ptr(bs) + u0 * bitem * 4,
                      native.ptr(y2[u0 * per:]), u1 - u0, per, K, N, program.threads, tb, bitem, brow):
                raise MemoryError("the batched matmul could not allocate its panel buffer")
        for c, full in flat:
            if full is None:
                break
            np.add(y2, c, out=y2)
    else:
        _single_blas(lambda: band(0))
    if any(full is None for _, full in flat):  # an odd broadcast: the adds in order, whole
        k = next(i for i, (_, full) in enumerate(flat) if full is None)
        for c in adds[k:]:
            np.add(y, c, out=y)
    return y


def pack(b: np.ndarray, isa: str) -> np.ndarray:
    """b (K x N) as the kernel's panels: ceil(N / NR) x K x NR floats, zero-padded columns."""
    lib = _lib()
    nr = getattr(lib, f"npr_gemm_nr_{isa}")()
    K, N = b.shape
    bp = np.empty(-(-N // nr) * K * nr, np.float32)
    if not b.flags.c_contiguous:
        # A view (a Gemm's transposed weight): panels copied straight from it, with no
        # contiguous copy of the whole matrix on the way (32 MB more at the peak of an OCR
        # head's 8k-wide Gemm).
        full, tail = divmod(N, nr)
        b3 = bp.reshape(-1, K, nr)
        b3[:full] = b[:, :full * nr].reshape(K, full, nr).transpose(1, 0, 2)
        if tail:
            b3[full, :, :tail] = b[:, full * nr:]
            b3[full, :, tail:] = 0
        return bp
    getattr(lib, f"npr_gemm_pack_{isa}")(native.ptr(b), native.ptr(bp), K, N)
    return bp


def _lib():
    return native.LIB


def int8_columns(b: np.ndarray):
    """(q int8 (K x N), s float32 (N,)) with float32(q) * s equal to b bit for bit, or None.

    Weights stored as int8 and dequantized at import (MiniLM-int8: `cast(q) * scale`, one
    scale per column, folded to float32 constants) are found again this way: s = max |b| / 127
    per column (or its float32 neighbours), q = rint(b / s), kept only where every element
    of every column comes back exactly."""
    if b.ndim != 2 or b.dtype != np.float32 or b.size == 0:
        return None
    # Every column must pass: a few first (float weights fail there), before the scan's
    # temporaries the size of the whole matrix (3-4 of them: 100+ MB at the peak of loading a
    # model with a 32 MB weight)
    if b.shape[1] > PROBE_COLUMNS and _int8_exact(b[:, :PROBE_COLUMNS]) is None:
        return None
    return _int8_exact(b)


PROBE_COLUMNS = 8


def _int8_exact(b: np.ndarray):
    amax = np.abs(b).max(axis=0)
    if not np.all(np.isfinite(amax)):
        return None
    s0 = (amax / np.float32(127)).astype(np.float32)
    q = np.zeros(b.shape, np.int8)
    s = np.zeros_like(s0)
    done = np.zeros(b.shape[1], bool)
    bits = b.view(np.int32)
    for cand in (s0, np.nextafter(s0, np.float32(np.inf)), np.nextafter(s0, np.float32(0))):
        with np.errstate(divide="ignore", invalid="ignore"):
            qc = np.clip(np.rint(b / np.where(cand == 0, 1, cand)), -127, 127).astype(np.int8)
        ok = np.all((qc.astype(np.float32) * cand).view(np.int32) == bits, axis=0) & ~done
        q[:, ok], s[ok] = qc[:, ok], cand[ok]
        done |= ok
        if done.all():
            return q, s
    return None


def _pack_q8(q, s, nr):
    """int8 panels Bq[panel][k][NR] and the scales padded to whole panels (zeros)."""
    K, N = q.shape
    panels = -(-N // nr)
    qp = np.zeros((K, panels * nr), np.int8)
    qp[:, :N] = q
    sp = np.zeros(panels * nr, np.float32)
    sp[:N] = s
    return np.ascontiguousarray(qp.reshape(K, panels, nr).transpose(1, 0, 2)), sp


def unpack(cache, K: int, N: int) -> np.ndarray:
    """The (K, N) float32 matrix `prepare` packed into `cache`, back from its panels: exactly
    (float32 panels hold its floats; int8 panels hold values whose float32 product with their
    column's scale is each float, as int8_columns checked)."""
    nr = cache["nr"]
    if cache.get("bq") is not None:
        q = cache["bq"].reshape(-1, K, nr).transpose(1, 0, 2).reshape(K, -1)[:, :N]
        return q.astype(np.float32) * cache["scale"][:N]
    return np.ascontiguousarray(cache["bp"].reshape(-1, K, nr).transpose(1, 0, 2).reshape(K, -1)[:, :N])


def prepare(cache, b) -> None:
    """Pack constant weights b into `cache` for `linear`, now (for this machine's ISA)."""
    _prepare(cache, b, native.ISA, _lib(), True)


def _prepare(cache, b, isa, lib, weights=True):
    """Pack b for the kernel once: int8 panels + scales where b is int8 weights dequantized
    exactly (a quarter of the bytes to stream each run), else float32 panels. (weights False:
    b is computed, packed for one call; no scan for int8 columns.)"""
    nr = getattr(lib, f"npr_gemm_nr_{isa}")()
    q8 = int8_columns(b) if weights else None
    if q8 is not None:
        bq, sp = _pack_q8(*q8, nr)
        cache.update(b=b, isa=isa, nr=nr, bq=bq, scale=sp, bp=None)
    else:
        cache.update(b=b, isa=isa, nr=nr, bp=pack(b, isa), bq=None, scale=None)


def _bmm():
    """csrc/gemm_mt.c's batched packed sgemm on the library's pool."""
    lib = _lib()
    return None if lib is None else lib.npr_bmm_mt


def _b_items(b: np.ndarray) -> tuple[np.ndarray, int, int, int]:
    """b (B..., K, N) float32 as the batched sgemm reads it, with no copy where it can:
    (array, tb, item stride, row stride) in floats. tb 0: K rows of N floats; tb 1: b is the
    transpose of N rows of K floats (attention's K^T: its keys, packed straight from them).
    A view of heads side by side (keys and values split from one projection) has rows further
    apart than their length; a copy is made only where the items are not evenly spaced or
    neither axis is contiguous."""
    K, N = b.shape[-2:]
    sk, sn = b.strides[-2:]
    item = _item_stride(b)
    if item is not None:
        if sn == 4 and sk % 4 == 0 and sk >= 4 * N:
            return b, 0, item, sk // 4
        if sk == 4 and sn % 4 == 0 and sn >= 4 * K:
            return b, 1, item, sn // 4
    c = native.contiguous(b)
    return c, 0, K * N, N


def _item_stride(b: np.ndarray) -> int | None:
    """Floats between consecutive items of b's flattened batch dims, or None where they are not
    evenly spaced (0 for a single item)."""
    dims = [(n, st) for n, st in zip(b.shape[:-2], b.strides[:-2]) if n > 1]
    for (_, s0), (n1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * n1:
            return None
    if not dims:
        return 0
    st = dims[-1][1]
    return st // 4 if st > 0 and st % 4 == 0 else None


def _cut(total: int, flop: float, parts: int, cal: dict | None):
    """[0, total) whole, or in pieces (backends/pieces.py, issue L: a preemption point between
    two; `parts` threads share each piece)."""
    return pieces.cut(total, flop / (nativeconv.PIECE_FLOPS * parts), cal=cal)


def linear(program, a, b, cache: dict, adds=(), weights=True):
    """a @ b [+ bias] [+ residual] on the packed-weight sgemm, b constant (packed on first use,
    kept in `cache`); None where it does not apply: other dtypes or ranks, or adds that are
    not (bias of N values first, then a residual of the product's shape)."""
    lib = _lib()
    if lib is None or a.dtype != np.float32 or b.dtype != np.float32 or b.ndim != 2 or a.ndim < 1 \
            or a.shape[-1] != b.shape[0] or len(adds) > 2 or a.size == 0:
        return None
    K, N = b.shape
    out_shape = a.shape[:-1] + (N,)
    bias = res = None
    for c in adds:
        if c.dtype != np.float32:
            return None
        if bias is None and res is None and c.size == N and c.shape[-1:] == (N,) and c.ndim <= len(out_shape):
            bias = np.ascontiguousarray(c).reshape(N)
        elif res is None and c.shape == out_shape:
            res = np.ascontiguousarray(c)
        else:
            return None
    isa = native.ISA
    if cache.get("b") is not b or cache.get("isa") != isa:
        _prepare(cache, b, isa, lib, weights)
    nr = cache["nr"]
    a2 = native.contiguous(a)
    rows = a2.size // K
    y = np.empty(out_shape, np.float32)
    panels = -(-N // nr)
    by_rows = rows_split(rows, panels, program.threads, isa) and _parts(program, 2 * rows * K * N, rows, rows) > 1
    parts = program.threads if by_rows else _parts(program, 2 * rows * K * N, panels, rows)
    pa, py = native.ptr(a2), native.ptr(y)
    pbias = native.ptr(bias)
    pres = native.ptr(res)
    isa512 = isa == "avx512"
    # Pieces are ranges of panels (columns of the product, every row): each panel is computed
    # as in the whole call, so the result is bit-identical (tests/test_pieces.py).
    cut = _cut(panels, 2 * rows * K * N, parts, cache)
    if cache["bq"] is not None:
        ws = np.empty((parts, K * nr), np.float32)  # one widened panel per thread
        pq, ps, pws = native.ptr(cache["bq"]), native.ptr(cache["scale"]), native.ptr(ws)
        one = getattr(lib, f"npr_gemm_q8_{isa}")
        for p0, p1 in pieces.each(cut):
            if parts > 1:  # the panels on the library's spinning pool (csrc/gemm_mt.c)
                lib.npr_gemm_q8_range_mt(isa512, pa, pq, ps, py, pbias, pres, rows, K, N, p0, p1, pws, K * nr,
                                         program.threads, min(parts, p1 - p0))
            else:
                one(pa, pq, ps, py, pbias, pres, rows, K, N, p0, p1, pws)
        return y
    pb = native.ptr(cache["bp"])
    one = getattr(lib, f"npr_gemm_{isa}")
    for p0, p1 in pieces.each(cut):
        if by_rows:  # (bands of rows, each piece's panels in all of them)
            lib.npr_gemm_rows_mt(isa512, pa, pb, py, pbias, pres, rows, K, N, p0, p1, program.threads,
                                 2 * parts)
        elif parts > 1:
            lib.npr_gemm_range_mt(isa512, pa, pb, py, pbias, pres, rows, K, N, p0, p1, program.threads,
                                  min(parts, p1 - p0))
        else:
            one(pa, pb, py, pbias, pres, rows, K, N, p0, p1)
    return y


def rows_split(rows: int, panels: int, threads: int, isa: str) -> bool:
    """Whether the threads split a product's rows rather than its panels (columns): where there
    are fewer than two panels a thread and at least four row tiles a thread (csrc/gemm_mt.c
    npr_gemm_rows_mt). Split by panels, every thread reads all of A, and a product of one panel
    ran on one thread. Alone, hot, 2 threads: 1024 x 64 @ 64 x 16 32.7 -> 22.7 us, 4096 x 32 @
    32 x 32 81 -> 64. In segformer (2 threads, its 144 such products) those nodes ran in half
    the time under the profiler (0.21 -> 0.10 ms) but the whole run moved less than the noise
    (46.4 -> 46.2 ms; 40.0 either way after 100 ms idle): the next node reads half the output
    from the other core's cache."""
    mr = 8 if isa == "avx512" else 6
    return threads > 1 and panels < 2 * threads and rows >= 4 * mr * threads


def _recorded(program, a, b):
    """a @ b in a replayed program (native.CALLS), where every product is worth a call: b
    packed for this call and the packed sgemm, or the batched sgemm over matching batches;
    None where neither applies."""
    if a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2] \
            or a.size == 0 or b.size == 0:
        return None
    if b.ndim == 2:
        return linear(program, a, b, {}, weights=False)
    if a.shape[:-2] != b.shape[:-2] or _bmm() is None:
        return None
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    a2, (b2, tb, bitem, brow) = native.contiguous(a), _b_items(b)
    y = np.empty(a.shape[:-1] + (N,), np.float32)
    if _bmm()(native.ISA == "avx512", native.ptr(a2), native.ptr(b2), native.ptr(y), a2.size // (M * K), M, K, N,
              program.threads, tb, bitem, brow):
        raise MemoryError("the batched matmul could not allocate its panel buffer")
    return y


def make_matmul(program):
    def matmul(a, b):
        if native.CALLS.cheap:
            y = _recorded(program, a, b)
            if y is not None:
                return y
        # A product too small to split or to pack: NumPy straight away (~2 us, where the
        # banding's checks cost ~10: silero-like graphs of tiny nodes feel it).
        if a.ndim < 2 or b.ndim < 2 or 2 * a.size * b.shape[-1] < MIN_FLOP:
            return REF["matmul"](a, b)
        y = matmul_add(program, a, b)
        return REF["matmul"](a, b) if y is None else y
    return matmul


KERNELS = {"matmul": make_matmul}
