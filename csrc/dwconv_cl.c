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
 * back into the block's 8 output planes. The rule that picks it: npr_dwconv2d (conv.c). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include "act.h"
#include "transpose8.h"

static inline __m256i first(int k)  /* lanes [0, k) set */
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* dst[p*8 + l] = src[l][p] for p in [0, n), l in [0, nl) (lanes >= nl: 0); src[l] = row l.
 * 8x8 tiles through the registers, the last (n % 8 pixels) with masked loads. */
static void interleave(float *dst, const float *const src[8], int nl, long n)
{
    for (long p = 0; p < n; p += 8) {
        int k = n - p < 8 ? (int)(n - p) : 8;
        __m256i m = first(k);
        __m256 r[8];
        for (int l = 0; l < 8; l++)
            r[l] = l >= nl ? _mm256_setzero_ps() : k == 8 ? _mm256_loadu_ps(src[l] + p) : _mm256_maskload_ps(src[l] + p, m);
        npr_transpose8(r);
        for (int q = 0; q < k; q++) _mm256_storeu_ps(dst + (p + q) * 8, r[q]);
    }
}

/* dst[l][p] = src[p*8 + l] for p in [0, n), l in [0, nl). */
static void deinterleave(float *const dst[8], const float *src, int nl, long n)
{
    for (long p = 0; p < n; p += 8) {
        int k = n - p < 8 ? (int)(n - p) : 8;
        __m256i m = first(k);
        __m256 r[8];
        for (int q = 0; q < 8; q++) r[q] = q < k ? _mm256_loadu_ps(src + (p + q) * 8) : _mm256_setzero_ps();
        npr_transpose8(r);
        for (int l = 0; l < nl; l++) {
            if (k == 8) _mm256_storeu_ps(dst[l] + p, r[l]);
            else _mm256_maskstore_ps(dst[l] + p, m, r[l]);
        }
    }
}

int npr_dwconv2d_cl(const float *x, int C, int H, int W, const float *w, const float *bias,
                    int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                    int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1)
{
    (void)C;
    int Hp = (Ho - 1) * sh + (kh - 1) * dh + 1, Wp = (Wo - 1) * sw + (kw - 1) * dw + 1;
    if (Wp < pl + W) Wp = pl + W;  /* (the copy writes whole input rows) */
    if (Hp < pt + H) Hp = pt + H;
    int taps = kh * kw;
    long npix = (long)Ho * Wo;
    float *buf = aligned_alloc(32, sizeof(float) * 8 * ((size_t)Hp * Wp + npix + 8));
    __m256 *wv = aligned_alloc(32, sizeof(__m256) * (size_t)taps);
    long *off = malloc(sizeof(long) * (size_t)(taps + npix));
    if (!buf || !wv || !off) { free(buf); free(wv); free(off); return -1; }
    long *poff = off + taps;  /* output pixel -> its window's first float in buf */
    for (long i = 0; i < npix; i++) poff[i] = ((i / Wo) * sh * (long)Wp + (i % Wo) * sw) * 8;
    float *out = buf + 8 * (size_t)Hp * Wp;
    for (int ky = 0; ky < kh; ky++)
        for (int kx = 0; kx < kw; kx++) off[ky * kw + kx] = ((long)ky * dh * Wp + (long)kx * dw) * 8;
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    for (int cb = c0; cb < c1; cb += 8) {
        int nl = c1 - cb < 8 ? c1 - cb : 8;
        /* the padded, interleaved input: the pad rows and columns zero, each input row a run */
        memset(buf, 0, sizeof(float) * 8 * (size_t)pt * Wp);
        for (int iy = 0; iy < H; iy++) {
            float *row = buf + 8 * ((size_t)(iy + pt) * Wp);
            memset(row, 0, sizeof(float) * 8 * pl);
            const float *src[8];
            for (int l = 0; l < 8; l++) src[l] = x + ((long)(cb + (l < nl ? l : 0)) * H + iy) * W;
            interleave(row + 8 * pl, src, nl, W);
            memset(row + 8 * (pl + W), 0, sizeof(float) * 8 * (Wp - pl - W));
        }
        memset(buf + 8 * ((size_t)(pt + H) * Wp), 0, sizeof(float) * 8 * (size_t)(Hp - pt - H) * Wp);
        for (int t = 0; t < taps; t++) {
            float v[8];
            for (int l = 0; l < 8; l++) v[l] = l < nl ? w[(long)(cb + l) * taps + t] : 0.0f;
            wv[t] = _mm256_loadu_ps(v);
        }
        float bv[8];
        for (int l = 0; l < 8; l++) bv[l] = bias && l < nl ? bias[cb + l] : 0.0f;
        __m256 b0 = _mm256_loadu_ps(bv);
        /* output pixels in flattened order, eight at a time whatever the row length (a 7x7 map
         * is six groups and one pixel, not seven rows of 4 + 3) */
        long p = 0;
        for (; p + 8 <= npix; p += 8) {
            __m256 a[8];
            for (int u = 0; u < 8; u++) a[u] = b0;
            for (int t = 0; t < taps; t++) {
                const float *q = buf + off[t];
                for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(wv[t], _mm256_load_ps(q + poff[p + u]), a[u]);
            }
            for (int u = 0; u < 8; u++) _mm256_store_ps(out + 8 * (p + u), npr_act(a[u], act, al, be));
        }
        for (; p < npix; p++) {
            __m256 a0 = b0;
            for (int t = 0; t < taps; t++) a0 = _mm256_fmadd_ps(wv[t], _mm256_load_ps(buf + off[t] + poff[p]), a0);
            _mm256_store_ps(out + 8 * p, npr_act(a0, act, al, be));
        }
        float *dst[8];
        for (int l = 0; l < 8; l++) dst[l] = y + (long)(cb + (l < nl ? l : 0)) * npix;
        deinterleave(dst, out, nl, npix);
    }
    free(off);
    free(wv);
    free(buf);
    return 0;
}

/* ---- The same kernel with 16 channels in the lanes (AVX-512): half the instructions a
 * channel, which bound it on 5x5 and 7x7 windows (ConvNeXt's 7x7: 1.4-2.4x ONNX Runtime's
 * time with 8 lanes). Each lane's arithmetic is the 8-lane kernel's (the bias, then the taps
 * in order, FMA by FMA; the activation through act.h on each half), so a channel's results are
 * the same bits in either kernel and in any block. The buffers are [Hp][Wp][16]; the
 * interleaves are the 8-lane ones, twice, each half of the channels into its half of a pixel. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
static void interleave16(float *dst, const float *const src[16], int nl, long n)
{
    for (int h = 0; h < 2; h++)
        for (long p = 0; p < n; p += 8) {
            int k = n - p < 8 ? (int)(n - p) : 8;
            __m256i m = first(k);
            __m256 r[8];
            for (int l = 0; l < 8; l++) {
                int c = 8 * h + l;
                r[l] = c >= nl ? _mm256_setzero_ps() : k == 8 ? _mm256_loadu_ps(src[c] + p) : _mm256_maskload_ps(src[c] + p, m);
            }
            npr_transpose8(r);
            for (int q = 0; q < k; q++) _mm256_storeu_ps(dst + (p + q) * 16 + 8 * h, r[q]);
        }
}

static void deinterleave16(float *const dst[16], const float *src, int nl, long n)
{
    for (int h = 0; h < 2 && 8 * h < nl; h++)
        for (long p = 0; p < n; p += 8) {
            int k = n - p < 8 ? (int)(n - p) : 8;
            __m256i m = first(k);
            __m256 r[8];
            for (int q = 0; q < 8; q++) r[q] = q < k ? _mm256_loadu_ps(src + (p + q) * 16 + 8 * h) : _mm256_setzero_ps();
            npr_transpose8(r);
            for (int l = 0; l < 8 && 8 * h + l < nl; l++) {
                if (k == 8) _mm256_storeu_ps(dst[8 * h + l] + p, r[l]);
                else _mm256_maskstore_ps(dst[8 * h + l] + p, m, r[l]);
            }
        }
}

static inline __m512 act16(__m512 v, int act, __m256 al, __m256 be)
{
    __m256 lo = npr_act(_mm512_castps512_ps256(v), act, al, be);
    __m256 hi = npr_act(_mm512_extractf32x8_ps(v, 1), act, al, be);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

int npr_dwconv2d_cl16(const float *x, int C, int H, int W, const float *w, const float *bias,
                      int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                      int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1)
{
    (void)C;
    int Hp = (Ho - 1) * sh + (kh - 1) * dh + 1, Wp = (Wo - 1) * sw + (kw - 1) * dw + 1;
    if (Wp < pl + W) Wp = pl + W;
    if (Hp < pt + H) Hp = pt + H;
    int taps = kh * kw;
    long npix = (long)Ho * Wo;
    float *buf = aligned_alloc(64, sizeof(float) * 16 * ((size_t)Hp * Wp + npix + 8));
    __m512 *wv = aligned_alloc(64, sizeof(__m512) * (size_t)taps);
    long *off = malloc(sizeof(long) * (size_t)(taps + npix));
    if (!buf || !wv || !off) { free(buf); free(wv); free(off); return -1; }
    long *poff = off + taps;
    for (long i = 0; i < npix; i++) poff[i] = ((i / Wo) * sh * (long)Wp + (i % Wo) * sw) * 16;
    float *out = buf + 16 * (size_t)Hp * Wp;
    for (int ky = 0; ky < kh; ky++)
        for (int kx = 0; kx < kw; kx++) off[ky * kw + kx] = ((long)ky * dh * Wp + (long)kx * dw) * 16;
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    for (int cb = c0; cb < c1; cb += 16) {
        int nl = c1 - cb < 16 ? c1 - cb : 16;
        memset(buf, 0, sizeof(float) * 16 * (size_t)pt * Wp);
        for (int iy = 0; iy < H; iy++) {
            float *row = buf + 16 * ((size_t)(iy + pt) * Wp);
            memset(row, 0, sizeof(float) * 16 * pl);
            const float *src[16];
            for (int l = 0; l < 16; l++) src[l] = x + ((long)(cb + (l < nl ? l : 0)) * H + iy) * W;
            interleave16(row + 16 * pl, src, nl, W);
            memset(row + 16 * (pl + W), 0, sizeof(float) * 16 * (Wp - pl - W));
        }
        memset(buf + 16 * ((size_t)(pt + H) * Wp), 0, sizeof(float) * 16 * (size_t)(Hp - pt - H) * Wp);
        for (int t = 0; t < taps; t++) {
            float v[16];
            for (int l = 0; l < 16; l++) v[l] = l < nl ? w[(long)(cb + l) * taps + t] : 0.0f;
            wv[t] = _mm512_loadu_ps(v);
        }
        float bv[16];
        for (int l = 0; l < 16; l++) bv[l] = bias && l < nl ? bias[cb + l] : 0.0f;
        __m512 b0 = _mm512_loadu_ps(bv);
        long p = 0;
        for (; p + 8 <= npix; p += 8) {
            __m512 a[8];
            for (int u = 0; u < 8; u++) a[u] = b0;
            for (int t = 0; t < taps; t++) {
                const float *q = buf + off[t];
                for (int u = 0; u < 8; u++) a[u] = _mm512_fmadd_ps(wv[t], _mm512_load_ps(q + poff[p + u]), a[u]);
            }
            for (int u = 0; u < 8; u++) _mm512_store_ps(out + 16 * (p + u), act16(a[u], act, al, be));
        }
        for (; p < npix; p++) {
            __m512 a0 = b0;
            for (int t = 0; t < taps; t++) a0 = _mm512_fmadd_ps(wv[t], _mm512_load_ps(buf + off[t] + poff[p]), a0);
            _mm512_store_ps(out + 16 * p, act16(a0, act, al, be));
        }
        float *dst[16];
        for (int l = 0; l < 16; l++) dst[l] = y + (long)(cb + (l < nl ? l : 0)) * npix;
        deinterleave16(dst, out, nl, npix);
    }
    free(off);
    free(wv);
    free(buf);
    return 0;
}
#pragma GCC pop_options
