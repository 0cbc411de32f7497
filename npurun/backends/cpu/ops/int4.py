"""4-bit weights times int8 activations on the cpu backend (csrc/nbits.c): MatMulNBits with
bits=4 at accuracy_level 4, what onnxruntime-genai's builder writes for a CPU int4 model.

The activations are quantized per block of K to int8 as ONNX Runtime's CompInt8 does
(contrib/nbits.py `int8_activations` is the NumPy statement of it), the products are exact
integer dot products, and the weights stay packed: a decode step streams half a byte per
weight instead of the four of the float32 matrix the reference dequantizes to. Two kernels:
AVX-512 VNNI (vpdpbusd, 64 weights an instruction; the weights repacked once per node so that
a mask and a shift give them in order) where the CPU has it, AVX2 (vpmaddubsw) otherwise;
`NPURUN_CPU_ISA=avx2` forces the second. Columns are split over the library's pool.

Measured on the development VM (1 thread, N x K = 73,728 x 768 weights, M = 1, the machine
busy with another job): AVX2 7.2, VNNI 25 G weights/s.
"""
from __future__ import annotations

import numpy as np

from .. import native

SUB = 32  # weights per sub-block of the kernels
MIN_SPLIT = 1 << 17  # weights: a smaller product runs on the calling thread (one token's product
# streams its weights from memory: two threads pay from a few hundred kilobytes of them)


def applies(a, bits, block_size, accuracy_level, g_idx) -> bool:
    return (native.LIB is not None and bits == 4 and accuracy_level == 4 and g_idx is None
            and a.dtype == np.float32 and block_size % SUB == 0 and block_size <= 256 and a.size > 0)


def _nibbles(x):
    """(N, bytes) -> (N, 2 * bytes) 4-bit values, the even one of each pair in the low nibble
    (contrib/nbits.py `unpack` kept in uint8: a large model's weights as int32 would take four
    times the memory while they are repacked)."""
    x = np.ascontiguousarray(x, np.uint8).reshape(x.shape[0], -1)
    return np.stack([x & np.uint8(0x0F), x >> np.uint8(4)], axis=-1).reshape(x.shape[0], -1)


class Int4Weights:
    """One node's B prepared for the kernels (kept per constant B by the caller)."""

    def __init__(self, b, scales, zero_points, *, K, N, block_size):
        kb = -(-K // block_size)
        self.K, self.N, self.bs, self.kb = K, N, block_size, kb
        self.vnni = native.vnni() and native.ISA == "avx512"
        s = np.ascontiguousarray(scales, np.float32).reshape(N, kb)
        if zero_points is None:
            z = np.full((N, kb), 8, np.uint8)
        elif zero_points.dtype == np.uint8:
            z = _nibbles(zero_points.reshape(N, -1))[:, :kb]
        else:
            z = None  # float zero points: not the integer kernels' arithmetic
        self.ok = z is not None
        if not self.ok:
            return
        if self.vnni:
            r = block_size // SUB
            t = kb * r
            self.T = t + t % 2
            e = _nibbles(np.asarray(b).reshape(N, -1))[:, :kb * block_size].reshape(N, t, SUB)
            self.bp = np.zeros((N, self.T, 16), np.uint8)
            self.bp[:, :t] = e[:, :, :16] | (e[:, :, 16:] << np.uint8(4))
            self.bs32 = np.zeros((N, self.T), np.float32)
            self.zb32 = np.zeros((N, self.T), np.float32)
            self.bs32[:, :t] = np.repeat(s, r, axis=1)
            self.zb32[:, :t] = np.repeat(s * z.astype(np.float32), r, axis=1)
            self._bp, self._bs32, self._zb32 = native.ptr(self.bp), native.ptr(self.bs32), native.ptr(self.zb32)
        else:
            self.b = np.ascontiguousarray(b, np.uint8)
            self.scales = s
            self.zp = np.ascontiguousarray(z, np.uint8)

    def matmul(self, a, bias, threads: int):
        """a (..., K) float32 @ B^T (+ bias): (..., N) float32."""
        lib = native.LIB
        x = np.ascontiguousarray(a, np.float32).reshape(-1, self.K)
        M, N = x.shape[0], self.N
        c = np.empty((M, N), np.float32)
        chunks = 1 if threads == 1 or M * N * self.K < MIN_SPLIT else threads * 4
        pb = None if bias is None else np.ascontiguousarray(bias, np.float32)
        pbias = native.ptr(pb)
        if self.vnni:
            # one scratch buffer for A's int8 rows and its two scale rows (a decode step calls
            # this ~60 times per token: allocations and pointer lookups add up)
            T = self.T
            scratch = np.empty(M * T * (SUB // 4 + 2), np.float32)
            qa = native.ptr(scratch)
            as32, aa32 = qa + M * T * SUB, qa + M * T * (SUB + 4)
            lib.npr_q4_prep_a(native.ptr(x), M, self.K, self.bs, T, qa, as32, aa32)
            lib.npr_q4_gemm_vnni_mt(qa, as32, aa32, self._bp, self._bs32, self._zb32, pbias, native.ptr(c), M, N, T,
                                    threads, chunks)
        else:
            qa = np.empty((M, self.kb * self.bs), np.int8)
            sa = np.empty((M, self.kb), np.float32)
            lib.npr_q8_rows(native.ptr(x), M, self.K, self.bs, native.ptr(qa), native.ptr(sa))
            lib.npr_q4_gemm_mt(native.ptr(qa), native.ptr(sa), native.ptr(self.b), native.ptr(self.scales),
                               native.ptr(self.zp), pbias, native.ptr(c), M, N, self.kb, self.bs, threads, chunks)
        return c.reshape(*a.shape[:-1], N)
