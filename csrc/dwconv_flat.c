/* Depthwise conv on small maps with a channel's whole output plane as one flat row (AVX-512).
 *
 * On maps of 28x28 and less a row of the output fills a vector of 16 lanes by half or less
 * (7x7: 7 of 16), so the per-channel kernel (conv.c) wastes lanes, and the channels-in-lanes
 * kernel (dwconv_cl.c) spends most of its time transposing each block in and out: MobileNetV2's
 * 960 x 7x7 3x3 took 38 us in lanes where the FMAs need ~9, and ORT's NCHWc kernel, whose
 * activations are channel-blocked already, 29 inside the model.
 *
 * Here the lanes run along the plane's flat output index p = oy*Wo + ox, across row ends: 16
 * outputs a vector, a 7x7 plane in 4 vectors. At stride 1 with W == Wo (a "same" padded conv)
 * tap (ky, kx) of output p reads input p + (ky-pt)*W + (kx-pl): one load, straight from the
 * input, no padded copy; the lanes whose tap falls outside the image (the padding, or the next
 * row's first columns) are masked to zero. (Loading a window row's vectors once and shifting
 * them in registers for its taps, valignd, was slower on 3x3: 960 x 7x7 37 against 29.5 us on
 * this AMD EPYC; faster only on 7x7, where the lanes kernel wins anyway.) At stride 2 each channel's input is first split into
 * its four phase planes (even/odd rows x even/odd columns, each with the output's row pitch),
 * where the tap is again one offset from p. The masks depend only on the chunk of 16 outputs and
 * the tap, not on the channel: computed once per call.
 *
 * Each output is the bias, then its taps in (ky, kx) order by FMA, a zero where the window
 * hangs over the padding: the per-channel kernel's sums, so the same bits (tested). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#define FLAT_MAX_OUT 1024  /* outputs a plane (64 vectors); bigger maps fill the per-row kernels */
#define FLAT_MAX_TAPS 49

/* Whether this kernel takes the geometry (nativeconv.dw_flat_fits says the same). Plain C, outside
 * the AVX-512 code below: any CPU may ask. */
int npr_dwconv2d_flat_fits(int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int Ho, int Wo)
{
    if (dh != 1 || dw != 1 || sh != sw || kh * kw > FLAT_MAX_TAPS || (long)Ho * Wo > FLAT_MAX_OUT || Ho < 1 || Wo < 1)
        return 0;
    if (sh == 1) return W == Wo;
    return sh == 2 && (W + 1) / 2 <= Wo;  /* every phase plane's columns within the row pitch */
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
#include "act512.h"

/* masks[q * taps + t]: the lanes of chunk q (outputs 16q .. 16q+15) that are outputs and whose
 * tap t lies inside the image. */
static void flat_masks(__mmask16 *masks, int nq, int H, int W, int kh, int kw, int s, int pt, int pl,
                       int Ho, int Wo)
{
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int q = 0; q < nq; q++) {
        __m512i p = _mm512_add_epi32(_mm512_set1_epi32(16 * q), iota);
        /* oy = p / Wo exactly: p < 2^10, so the float quotient rounds to within 1 of it */
        __m512i oy = _mm512_cvttps_epi32(_mm512_div_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps((float)Wo)));
        __m512i ox = _mm512_sub_epi32(p, _mm512_mullo_epi32(oy, _mm512_set1_epi32(Wo)));
        __mmask16 hi = _mm512_cmpge_epi32_mask(ox, _mm512_set1_epi32(Wo)), lo = _mm512_cmplt_epi32_mask(ox, _mm512_setzero_si512());
        oy = _mm512_mask_add_epi32(oy, hi, oy, _mm512_set1_epi32(1));
        ox = _mm512_mask_sub_epi32(ox, hi, ox, _mm512_set1_epi32(Wo));
        oy = _mm512_mask_sub_epi32(oy, lo, oy, _mm512_set1_epi32(1));
        ox = _mm512_mask_add_epi32(ox, lo, ox, _mm512_set1_epi32(Wo));
        __mmask16 out = _mm512_cmplt_epi32_mask(p, _mm512_set1_epi32(Ho * Wo));
        __mmask16 rows[FLAT_MAX_TAPS], cols[FLAT_MAX_TAPS];
        for (int ky = 0; ky < kh; ky++) {
            __m512i iy = _mm512_add_epi32(_mm512_mullo_epi32(oy, _mm512_set1_epi32(s)), _mm512_set1_epi32(ky - pt));
            rows[ky] = _mm512_cmpge_epi32_mask(iy, _mm512_setzero_si512()) & _mm512_cmplt_epi32_mask(iy, _mm512_set1_epi32(H));
        }
        for (int kx = 0; kx < kw; kx++) {
            __m512i ix = _mm512_add_epi32(_mm512_mullo_epi32(ox, _mm512_set1_epi32(s)), _mm512_set1_epi32(kx - pl));
            cols[kx] = _mm512_cmpge_epi32_mask(ix, _mm512_setzero_si512()) & _mm512_cmplt_epi32_mask(ix, _mm512_set1_epi32(W));
        }
        for (int ky = 0; ky < kh; ky++)
            for (int kx = 0; kx < kw; kx++)
                masks[q * kh * kw + ky * kw + kx] = out & rows[ky] & cols[kx];
    }
}

/* A channel's input rows split into its four phase planes ph[(iy&1)*2 + (ix&1)], rows iy>>1,
 * columns ix>>1, row pitch Wo, Hh rows a plane. Only the places an unmasked tap reads are
 * written (masked lanes read nothing). */
static void flat_phases(float *ph, const float *xc, int H, int W, int Hh, int Wo)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const long plane = (long)Hh * Wo;
    int ne = (W + 1) / 2, no = W / 2;
    for (int iy = 0; iy < H; iy++) {
        const float *src = xc + (long)iy * W;
        float *de = ph + (iy & 1) * 2 * plane + (long)(iy >> 1) * Wo, *dd = de + plane;
        for (int m = 0; m < ne; m += 16) {
            int left = W - 2 * m;
            __mmask16 ma = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
            __mmask16 mb = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            __m512 a = _mm512_maskz_loadu_ps(ma, src + 2 * m), b = _mm512_maskz_loadu_ps(mb, src + 2 * m + 16);
            int re = ne - m, ro = no - m;
            _mm512_mask_storeu_ps(de + m, re >= 16 ? 0xFFFF : (__mmask16)((1u << re) - 1),
                                  _mm512_permutex2var_ps(a, even, b));
            if (ro > 0)
                _mm512_mask_storeu_ps(dd + m, ro >= 16 ? 0xFFFF : (__mmask16)((1u << ro) - 1),
                                      _mm512_permutex2var_ps(a, odd, b));
        }
    }
}

/* Chunks [q0, q0 + G) of a channel's plane: tap after tap, each weight and offset fetched once
 * for the G chunks, whose G sums are independent chains; always inlined with G and the taps
 * known to the compiler for the common windows. */
static inline __attribute__((always_inline)) void flat_chunks(
    const float *base, const long *off, const __mmask16 *masks, const float *wc, __m512 b0, float *yc,
    int q0, int n, const int taps, const int G, int act, __m512 al, __m512 be)
{
    __m512 a[4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) a[g] = b0;
    const __mmask16 *mq = masks + (long)q0 * taps;
    const float *src = base + 16 * q0;
#pragma GCC unroll 49
    for (int t = 0; t < taps; t++) {
        __m512 wt = _mm512_set1_ps(wc[t]);
        const float *s = src + off[t];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            a[g] = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(mq[g * taps + t], s + 16 * g), a[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        int left = n - 16 * (q0 + g);
        _mm512_mask_storeu_ps(yc + 16 * (q0 + g), left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1),
                              npr_act512(a[g], act, al, be));
    }
}

static inline __attribute__((always_inline)) void flat_plane(
    const float *base, const long *off, const __mmask16 *masks, const float *wc, __m512 b0, float *yc,
    int nq, int n, const int taps, int act, __m512 al, __m512 be)
{
    int q = 0;
    for (; q + 4 <= nq; q += 4) flat_chunks(base, off, masks, wc, b0, yc, q, n, taps, 4, act, al, be);
    for (; q < nq; q++) flat_chunks(base, off, masks, wc, b0, yc, q, n, taps, 1, act, al, be);
}

int npr_dwconv2d_flat(const float *x, int C, int H, int W, const float *w, const float *bias,
                      int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                      int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1)
{
    (void)C;
    if (!npr_dwconv2d_flat_fits(H, W, kh, kw, sh, sw, dh, dw, Ho, Wo)) return -2;
    const int taps = kh * kw, n = Ho * Wo, nq = (n + 15) / 16, s = sh;
    const int Hh = (H + 1) / 2;
    __mmask16 *masks = malloc(sizeof(__mmask16) * (size_t)nq * taps);
    long off[FLAT_MAX_TAPS];
    /* stride 2: two channels' phase planes, one filled while the other is read (a load that
     * spans several just-stored vectors waits for them to reach the cache) */
    float *ph = s == 2 ? aligned_alloc(64, sizeof(float) * (((size_t)8 * Hh * Wo + 16 + 15) & ~(size_t)15)) : NULL;
    if (!masks || (s == 2 && !ph)) { free(masks); free(ph); return -1; }
    flat_masks(masks, nq, H, W, kh, kw, s, pt, pl, Ho, Wo);
    const long plane = (long)Hh * Wo;
    for (int ky = 0; ky < kh; ky++)
        for (int kx = 0; kx < kw; kx++) {
            if (s == 1) {
                off[ky * kw + kx] = (long)(ky - pt) * W + (kx - pl);
            } else {
                int dy = ky - pt, dx = kx - pl, py = dy & 1, px = dx & 1;
                off[ky * kw + kx] = (py * 2 + px) * plane + (long)((dy - py) / 2) * Wo + (dx - px) / 2;
            }
        }
    __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
    if (s == 2 && c0 < c1) flat_phases(ph, x + (long)c0 * H * W, H, W, Hh, Wo);
    for (int c = c0; c < c1; c++) {
        const float *wc = w + (long)c * taps, *base = x + (long)c * H * W;
        if (s == 2) {
            base = ph + (size_t)((c - c0) & 1) * 4 * plane;
            if (c + 1 < c1)
                flat_phases(ph + (size_t)((c + 1 - c0) & 1) * 4 * plane, x + (long)(c + 1) * H * W, H, W, Hh, Wo);
        }
        __m512 b0 = _mm512_set1_ps(bias ? bias[c] : 0.0f);
        float *yc = y + (long)c * n;
        if (taps == 9)
            flat_plane(base, off, masks, wc, b0, yc, nq, n, 9, act, al, be);
        else if (taps == 25)
            flat_plane(base, off, masks, wc, b0, yc, nq, n, 25, act, al, be);
        else if (taps == 49)
            flat_plane(base, off, masks, wc, b0, yc, nq, n, 49, act, al, be);
        else
            flat_plane(base, off, masks, wc, b0, yc, nq, n, taps, act, al, be);
    }
    free(masks);
    free(ph);
    return 0;
}
#pragma GCC pop_options
