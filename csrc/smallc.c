/* Direct conv for dense convs with very few input channels (C <= 4; ESPCN's first layer, 5x5
 * 1 -> 64 + tanh, pad 2), stride 1, dilation 1. The implicit GEMM of conv.c has K = C*kh*kw
 * = 25 there: each 4 x 24 tile runs 25 taps and then its epilogue, and its loads (3 input
 * vectors + 4 weight broadcasts per 12 FMAs) bound it at ~60 GFLOP/s.
 *
 * Here the kh input rows an output row needs are first copied, zero-padded, into a small
 * buffer (C*kh rows of ~Wo floats: L1), so no tile ever gathers. A tile is MB output
 * channels x NV vectors of one output row; for each tap (c, ky, kx) the NV shifted input
 * vectors are loaded once and FMA'd into all MB channels' accumulators with one weight
 * broadcast each (AVX-512: 8 channels x 3 zmm = 24 accumulators, 3 + 8 loads per 24 FMAs;
 * AVX2: 4 x 3 ymm). Bias + activation (act.h / act512.h codes) run in registers before the
 * single store. Weights are packed (ceil(M/MB), K, MB) by nativeconv.pack. Called per band
 * of output rows, from Python threads (ctypes drops the GIL). */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <stdlib.h>
#include <string.h>
#include "act.h"

/* ---- AVX2: 4 channels x 3 ymm */
#include "simd_avx2.h"
#define MB 4
#define NV 3
#define SMALLC npr_smallc_avx2
#define SMALLC_MR npr_smallc_mr_avx2
#include "smallc_tpl.h"
#include "simd_undef.h"
#undef MB
#undef NV
#undef SMALLC
#undef SMALLC_MR

/* ---- AVX-512: 8 channels x 3 zmm */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
#include "act512.h"
#include "simd_avx512.h"
#define MB 8
#define NV 3
#define SMALLC npr_smallc_avx512
#define SMALLC_MR npr_smallc_mr_avx512
#include "smallc_tpl.h"
#pragma GCC pop_options

/* ---- Output rows [r0, r1) of one image in `chunks` equal bands on `threads` threads of the
 * library's one spinning pool (par.h; why: winograd.c's _mt). */
#include "par.h"

typedef int (*smallc_band)(const float *, int, int, int, const float *, const float *, int, int, int,
                           int, int, int, float, float, float *, int, int, int, int, int);
typedef struct {
    smallc_band fn; const float *x; int C, H, W; const float *wp, *bias; int M, kh, kw, pt, pl, act;
    float alpha, beta; float *y; int Ho, Wo, r0, r1, nt, chunks; atomic_int rc;
} smallc_job;

static void smallc_chunk(void *ctx, int i)
{
    smallc_job *j = ctx;
    int a = (int)par_at(j->r0, j->r1, i, j->chunks), b = (int)par_at(j->r0, j->r1, i + 1, j->chunks);
    if (b > a && j->fn(j->x, j->C, j->H, j->W, j->wp, j->bias, j->M, j->kh, j->kw, j->pt, j->pl, j->act,
                       j->alpha, j->beta, j->y, j->Ho, j->Wo, a, b, j->nt))
        atomic_store(&j->rc, -1);
}

#define SMALLC_MT(name, fn)                                                                        \
int name(const float *x, int C, int H, int W, const float *wp, const float *bias, int M, int kh, int kw, \
         int pt, int pl, int act, float alpha, float beta, float *y, int Ho, int Wo, int r0, int r1, \
         int nt, int threads, int chunks)                                                           \
{                                                                                                   \
    smallc_job j = {fn, x, C, H, W, wp, bias, M, kh, kw, pt, pl, act, alpha, beta, y, Ho, Wo, r0, r1, nt, \
                    chunks, 0};                                                                     \
    par_run(smallc_chunk, &j, chunks, threads);                                                     \
    return atomic_load(&j.rc);                                                                      \
}
SMALLC_MT(npr_smallc_avx2_mt, npr_smallc_avx2)
SMALLC_MT(npr_smallc_avx512_mt, npr_smallc_avx512)
