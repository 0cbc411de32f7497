/* Depthwise conv with the channels in the vector lanes (AVX2 + FMA), for the maps where the
 * per-channel kernel of conv.c (one channel's row in the lanes) runs short: 28x28 and smaller,
 * and every stride-2 conv (MobileNet/EfficientNet/PP-LCNet's last stages: 2-4x ONNX Runtime's
 * time there, since a 7- or 14-wide row fills one or two 8-float strips and each channel pays
 * its own copy, memsets and weight broadcasts).
 *
 * Blocks of 8 channels: the block's input is transposed, 8x8 tiles at a time, into a
 * zero-padded buffer [Hp][Wp][8] (a pixel's 8 channels contiguous); every output pixel is then
 * kh*kw FMAs of one vector of weights by one vector of inputs, whatever the stride or width
 * (a strided tap is just another pixel offset), 8 pixels at once for independent chains; the
 * bias and activation are applied before the store to a [Ho*Wo][8] tile, which is transposed
 * back into the block's 8 output planes. The rule that picks it: npr_dwconv2d (conv.c).
 *
 * On AVX-512 the same kernel runs 16 channels in the lanes (npr_dwconv2d_cl16): half the
 * instructions a channel (on AMD Zen 4, whose 512-bit loads and FMAs are double-pumped, 0.85-0.9x
 * the 8-lane kernel's time where the lanes are chosen; a CPU with two 512-bit FMA units should
 * gain more, not measured here). Each lane's arithmetic is the 8-lane kernel's (the bias, then
 * the taps in order, FMA by FMA; the activation through act.h on each half), so a channel's
 * results are the same bits in either kernel and in any block. Both are dwconv_cl_tpl.h. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include "act.h"
#include "transpose8.h"

static inline __m256i first(int k)  /* lanes [0, k) set */
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* dst[p*L + l] = src[l][p] for p in [0, n), l in [0, nl) (lanes >= nl: 0); src[l] = row l; L
 * (8 or 16) floats a pixel, filled 8 channels at a time. 8x8 tiles through the registers, the
 * last (n % 8 pixels) with masked loads. */
static void interleave(float *dst, const float *const src[], int nl, long n, int L)
{
    for (int h = 0; h < L; h += 8)
        for (long p = 0; p < n; p += 8) {
            int k = n - p < 8 ? (int)(n - p) : 8;
            __m256i m = first(k);
            __m256 r[8];
            for (int l = 0; l < 8; l++) {
                int c = h + l;
                r[l] = c >= nl ? _mm256_setzero_ps() : k == 8 ? _mm256_loadu_ps(src[c] + p) : _mm256_maskload_ps(src[c] + p, m);
            }
            npr_transpose8(r);
            for (int q = 0; q < k; q++) _mm256_storeu_ps(dst + (p + q) * L + h, r[q]);
        }
}

/* dst[l][p] = src[p*L + l] for p in [0, n), l in [0, nl). */
static void deinterleave(float *const dst[], const float *src, int nl, long n, int L)
{
    for (int h = 0; h < L && h < nl; h += 8)
        for (long p = 0; p < n; p += 8) {
            int k = n - p < 8 ? (int)(n - p) : 8;
            __m256i m = first(k);
            __m256 r[8];
            for (int q = 0; q < 8; q++) r[q] = q < k ? _mm256_loadu_ps(src + (p + q) * L + h) : _mm256_setzero_ps();
            npr_transpose8(r);
            for (int l = 0; l < 8 && h + l < nl; l++) {
                if (k == 8) _mm256_storeu_ps(dst[h + l] + p, r[l]);
                else _mm256_maskstore_ps(dst[h + l] + p, m, r[l]);
            }
        }
}

/* ---- 8 lanes (AVX2) */
#define DW_NAME npr_dwconv2d_cl
#define L 8
#define VEC __m256
#define VLOADU _mm256_loadu_ps
#define VLOADA _mm256_load_ps
#define VSTOREA _mm256_store_ps
#define VFMA _mm256_fmadd_ps
#define VACT(v, act, al, be) npr_act(v, act, al, be)
#include "dwconv_cl_tpl.h"
#undef DW_NAME
#undef L
#undef VEC
#undef VLOADU
#undef VLOADA
#undef VSTOREA
#undef VFMA
#undef VACT

/* ---- 16 lanes (AVX-512) */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
static inline __m512 act16(__m512 v, int act, __m256 al, __m256 be)  /* act.h on each half */
{
    __m256 lo = npr_act(_mm512_castps512_ps256(v), act, al, be);
    __m256 hi = npr_act(_mm512_extractf32x8_ps(v, 1), act, al, be);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
#define DW_NAME npr_dwconv2d_cl16
#define L 16
#define VEC __m512
#define VLOADU _mm512_loadu_ps
#define VLOADA _mm512_load_ps
#define VSTOREA _mm512_store_ps
#define VFMA _mm512_fmadd_ps
#define VACT(v, act, al, be) act16(v, act, al, be)
#include "dwconv_cl_tpl.h"
#pragma GCC pop_options
