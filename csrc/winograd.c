/* Winograd F(4x4, 3x3) for 3x3 stride-1 dilation-1 dense convs (npurun's cpu backend; the
 * cost rule that picks it is in npurun/backends/cpu/winograd.py).
 *
 * Each 4x4 output tile is  Y = A^T [ sum_c (G g_mc G^T) . (B^T d_c B) ] A,  d_c the 6x6 input
 * window of channel c: 36 multiplies per tile per (m, c) instead of 144, so the GEMM work is
 * a quarter of the direct conv's. The weights U = G g G^T are transformed once, in float64,
 * by the Python side. A call runs a band of tile rows; each tile row is cut into blocks of TB
 * tiles (fewer at a row's end: BLOCK in wino_tpl.h), and a block goes through three phases
 * whose buffers stay in L2:
 *   input:  V[p][c][t] (36 x C x TB), the 6 input rows copied to a zero-padded row buffer
 *           (borders and any padding then cost nothing special; AVX-512 reads rows inside
 *           the image in place), tiles of a vector's lanes taken apart by the stride-4
 *           shuffles PHASES6, the 1-D transform along x then y;
 *   GEMM:   Mt[p] (M x TB) = U[p] (M x C) @ V[p] (C x TB) for the 36 points p, a register
 *           tile of WMR output channels x WNV vectors of tiles (U packed (C, WMR) per block);
 *   output: A^T M A, bias and the activation in registers, INTERLEAVE4 back to pixel order,
 *           one store per vector (through a small buffer at the ragged right edge).
 * Accuracy: F(4x4) multiplies by up to 8 in the transforms; on random inputs its error is
 * ~5e-6 of the output's largest value (the direct kernel's ~1e-7); docs/cpu.md has numbers. */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <stdlib.h>
#include <string.h>
#include "act.h"

/* ---- AVX2: 8 tiles a vector, GEMM tile 6 channels x 16 tiles (12 ymm accumulators) */
/* [lo[0:4] | hi[0:4]] (_mm256_loadu2_m128, which GCC < 10 lacks) */
static inline __attribute__((always_inline)) __m256 loadu2(const float *hi, const float *lo)
{
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
}

/* d[j][k] = p[4k + j], j = 0..5, k = 0..7: the 4x4 transpose of 128-bit rows, twice. */
static inline __attribute__((always_inline)) void phases6_avx2(const float *p, __m256 *d)
{
    __m256 r0 = loadu2(p + 16, p), r1 = loadu2(p + 20, p + 4);
    __m256 r2 = loadu2(p + 24, p + 8), r3 = loadu2(p + 28, p + 12);
    __m256 r4 = loadu2(p + 32, p + 16);  /* tiles 4 | 8: for the shifted phases */
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    d[0] = _mm256_shuffle_ps(t0, t2, 0x44); d[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    d[2] = _mm256_shuffle_ps(t1, t3, 0x44); d[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u0 = _mm256_unpacklo_ps(r1, r2), u2 = _mm256_unpacklo_ps(r3, r4);
    d[4] = _mm256_shuffle_ps(u0, u2, 0x44); d[5] = _mm256_shuffle_ps(u0, u2, 0xEE);
}

/* dst[4k + j] = o[j][k], j = 0..3, k = 0..7 (the inverse of the first four phases). */
static inline __attribute__((always_inline)) void interleave4_avx2(const __m256 *o, float *dst, int nt)
{
    __m256 t0 = _mm256_unpacklo_ps(o[0], o[1]), t1 = _mm256_unpackhi_ps(o[0], o[1]);
    __m256 t2 = _mm256_unpacklo_ps(o[2], o[3]), t3 = _mm256_unpackhi_ps(o[2], o[3]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 z0 = _mm256_permute2f128_ps(u0, u1, 0x20), z1 = _mm256_permute2f128_ps(u2, u3, 0x20);
    __m256 z2 = _mm256_permute2f128_ps(u0, u1, 0x31), z3 = _mm256_permute2f128_ps(u2, u3, 0x31);
    if (nt) {  /* dst is 32-byte aligned: the caller checked */
        _mm256_stream_ps(dst, z0); _mm256_stream_ps(dst + 8, z1);
        _mm256_stream_ps(dst + 16, z2); _mm256_stream_ps(dst + 24, z3);
    } else {
        _mm256_storeu_ps(dst, z0); _mm256_storeu_ps(dst + 8, z1);
        _mm256_storeu_ps(dst + 16, z2); _mm256_storeu_ps(dst + 24, z3);
    }
}

#include "simd_avx2.h"
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VFNMA _mm256_fnmadd_ps
#define ACT npr_act
#define PHASES6 phases6_avx2
#define INTERLEAVE4 interleave4_avx2
#define WMR 6
#define WNV 2
#define TB 32
#define RS (4 * TB + 16)
#define IN_PLACE 0
#define SUF _avx2
#define WINO npr_wino_avx2
#define WINO_MR npr_wino_mr_avx2
#include "wino_tpl.h"
#include "simd_undef.h"
#undef VSUB
#undef VMUL
#undef VFNMA
#undef ACT
#undef PHASES6
#undef INTERLEAVE4
#undef WMR
#undef WNV
#undef TB
#undef RS
#undef IN_PLACE
#undef SUF
#undef WINO
#undef WINO_MR

/* ---- AVX-512: 16 tiles a vector, GEMM tile 12 channels x 32 tiles (24 zmm accumulators) */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
#include "act512.h"

/* d[j][k] = p[4k + j], j = 0..5, k = 0..15: a two-source permute gathers phases (0, 1) or
 * (2, 3) of 8 tiles into the halves of a vector, a 256-bit shuffle pairs the halves. */
static inline __attribute__((always_inline)) void phases6_avx512(const float *p, __m512 *d)
{
    __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16);
    __m512 v2 = _mm512_loadu_ps(p + 32), v3 = _mm512_loadu_ps(p + 48);
    const __m512i i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
    __m512 a = _mm512_permutex2var_ps(v0, i01, v1), b = _mm512_permutex2var_ps(v0, i23, v1);
    __m512 c = _mm512_permutex2var_ps(v2, i01, v3), e = _mm512_permutex2var_ps(v2, i23, v3);
    d[0] = _mm512_shuffle_f32x4(a, c, 0x44); d[1] = _mm512_shuffle_f32x4(a, c, 0xEE);
    d[2] = _mm512_shuffle_f32x4(b, e, 0x44); d[3] = _mm512_shuffle_f32x4(b, e, 0xEE);
    /* phases 4, 5 are phases 0, 1 of the next tile: shift one lane, bring in tile 16's */
    d[4] = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(_mm512_set1_ps(p[64])),
                                                   _mm512_castps_si512(d[0]), 1));
    d[5] = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(_mm512_set1_ps(p[65])),
                                                   _mm512_castps_si512(d[1]), 1));
}

/* dst[4k + j] = o[j][k], j = 0..3, k = 0..15: pairs (o0, o1), (o2, o3), then 64-bit pairs. */
static inline __attribute__((always_inline)) void interleave4_avx512(const __m512 *o, float *dst, int nt)
{
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    __m512d a0 = _mm512_castps_pd(_mm512_permutex2var_ps(o[0], lo, o[1]));
    __m512d a1 = _mm512_castps_pd(_mm512_permutex2var_ps(o[0], hi, o[1]));
    __m512d b0 = _mm512_castps_pd(_mm512_permutex2var_ps(o[2], lo, o[3]));
    __m512d b1 = _mm512_castps_pd(_mm512_permutex2var_ps(o[2], hi, o[3]));
    const __m512i q0 = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), q1 = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    __m512 z0 = _mm512_castpd_ps(_mm512_permutex2var_pd(a0, q0, b0));
    __m512 z1 = _mm512_castpd_ps(_mm512_permutex2var_pd(a0, q1, b0));
    __m512 z2 = _mm512_castpd_ps(_mm512_permutex2var_pd(a1, q0, b1));
    __m512 z3 = _mm512_castpd_ps(_mm512_permutex2var_pd(a1, q1, b1));
    if (nt) {  /* dst is 64-byte aligned: the caller checked */
        _mm512_stream_ps(dst, z0); _mm512_stream_ps(dst + 16, z1);
        _mm512_stream_ps(dst + 32, z2); _mm512_stream_ps(dst + 48, z3);
    } else {
        _mm512_storeu_ps(dst, z0); _mm512_storeu_ps(dst + 16, z1);
        _mm512_storeu_ps(dst + 32, z2); _mm512_storeu_ps(dst + 48, z3);
    }
}

#include "simd_avx512.h"
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VFNMA _mm512_fnmadd_ps
#define ACT npr_act512
#define PHASES6 phases6_avx512
#define INTERLEAVE4 interleave4_avx512
#define WMR 12
#define WNV 2
#define TB 64
#define RS (4 * TB + 16)
#define IN_PLACE 1
#define SUF _avx512
#define WINO npr_wino_avx512
#define WINO_MR npr_wino_mr_avx512
#include "wino_tpl.h"
#pragma GCC pop_options

/* ---- One image's tile rows [tr0, tr1) in `chunks` equal bands on `threads` threads of the
 * library's one spinning pool (par.h): a band handed over costs ~1 us there, tens of us
 * through the Program's Python pool (ESPCN runs 23 cascaded bands x 3 convs x 8 parts). */
#include "par.h"

typedef int (*wino_band)(const float *, int, int, int, const float *, const float *, int, int, int,
                         int, float, float, float *, int, int, int, int, int);
typedef struct {
    wino_band fn; const float *x; int C, H, W; const float *U, *bias; int M, pt, pl, act;
    float alpha, beta; float *y; int Ho, Wo, tr0, tr1, nt, chunks; atomic_int rc;
} wino_job;

static void wino_chunk(void *ctx, int i)
{
    wino_job *j = ctx;
    int a = (int)par_at(j->tr0, j->tr1, i, j->chunks), b = (int)par_at(j->tr0, j->tr1, i + 1, j->chunks);
    if (b > a && j->fn(j->x, j->C, j->H, j->W, j->U, j->bias, j->M, j->pt, j->pl, j->act, j->alpha, j->beta,
                       j->y, j->Ho, j->Wo, a, b, j->nt))
        atomic_store(&j->rc, -1);
}

#define WINO_MT(name, fn)                                                                          \
int name(const float *x, int C, int H, int W, const float *U, const float *bias, int M, int pt, int pl, \
         int act, float alpha, float beta, float *y, int Ho, int Wo, int tr0, int tr1, int nt,      \
         int threads, int chunks)                                                                   \
{                                                                                                   \
    wino_job j = {fn, x, C, H, W, U, bias, M, pt, pl, act, alpha, beta, y, Ho, Wo, tr0, tr1, nt, chunks, 0}; \
    par_run(wino_chunk, &j, chunks, threads);                                                       \
    return atomic_load(&j.rc);                                                                      \
}
WINO_MT(npr_wino_avx2_mt, npr_wino_avx2)
WINO_MT(npr_wino_avx512_mt, npr_wino_avx512)
