/* Convolution kernels of npurun's cpu backend (AVX2 + FMA), called through ctypes with the
 * GIL released, one call per band of output rows, so Python threads split the work.
 *
 * Dense conv = implicit GEMM:  y (M, Ho*Wo) = W (M, K) @ B (K, Ho*Wo),  K = C*kh*kw in (c, ky, kx)
 * order. B is never built for the image. A tile of the output is MR=4 channels x up to 24
 * pixels of one output row, held in 12 ymm accumulators. For a stride-1 tile whose window lies
 * inside the image, B's row k=(c,ky,kx) is the input itself at
 *     x + c*H*W + (r - pt + ky*dh)*W + (x0 - pl + kx*dw),
 * contiguous along the tile, so the microkernel loads it in place (no copy). Other tiles
 * (borders, strides > 1, ragged row ends) gather their (K, 24) slice of im2col into a small
 * buffer first (zeros where the window hangs over the padding). Either way the B slice
 * (K x 24 floats) stays in L1 while the microkernel runs it against every block of 4 channels.
 * Weights come packed as (ceil(M/4), K, 4), zero-padded, by native.py. Bias + activation are
 * applied in registers before the one store (the epilogue).
 *
 * Column blocks of XB pixels are walked row by row, so the kh input rows a row of tiles
 * reads are still in L2 when the next output row needs them. */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <stdlib.h>
#include <string.h>
#include "act.h"
#include "transpose8.h"

#define MR 4  /* output channels per tile; weights are packed for it */

typedef struct {
    const float *x; int C, H, W;
    const float *wp, *bias; int M, kh, kw, sh, sw, dh, dw, pt, pl;
    int act; float alpha, beta;
    float *y; int Ho, Wo; long ys;  /* ys: output channel pitch (floats) */
    int nt;  /* non-temporal stores */
} conv_args;

/* ---- AVX2: 4 x 24 tiles in 12 ymm accumulators */
#include "simd_avx2.h"
#define NR 24
#define TILE tile_avx2
#define GATHER gather_avx2
#define TILES tiles_avx2
#define CONV2D npr_conv2d_avx2
#include "conv_tile.h"
#include "simd_undef.h"
#undef NR
#undef TILE
#undef GATHER
#undef TILES
#undef CONV2D

/* ---- AVX-512: 4 x 32 tiles in 8 zmm accumulators; the epilogue runs the zmm activation of
 * act512.h. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
#include "act512.h"
#include "simd_avx512.h"
#define NR 32
#define TILE tile_avx512
#define GATHER gather_avx512
#define TILES tiles_avx512
#define CONV2D npr_conv2d_avx512
#include "conv_tile.h"
#pragma GCC pop_options

void npr_activation(const float *x, float *y, long n, int act, float alpha, float beta);

/* dst[0:n] = src[0], src[2], ..., src[2(n-1)]: the even floats, 8 at a time by shuffles (never
 * reading past src[2(n-1)]). */
static void copy_even(float *dst, const float *src, int n)
{
    int i = 0;
    for (; i + 9 <= n; i += 8)  /* reads src[2i .. 2i+15] <= src[2(n-1)] */
        _mm256_storeu_ps(dst + i, npr_evens8(src + 2 * i));
    for (; i < n; i++) dst[i] = src[2 * i];
}

/* Copy one channel's input into the zero-padded phase planes of the depthwise kernels: padded
 * column q = pl + ix of row iy goes to plane q % sw, at q / sw (rows [0, Hp), Wq floats each). */
static void dw_fill(float *pad, const float *xc, int H, int W, int Hp, int Wq, int sw, int pt, int pl)
{
    size_t plane_rows = (size_t)Hp * sw;
    /* a small buffer (small maps: 7x7, 14x14) is zeroed whole, a big one only where the
     * input does not cover it */
    int whole = plane_rows * Wq <= 16384;  /* (<= 64 KB: one memset beats a few hundred small ones) */
    if (whole) memset(pad, 0, sizeof(float) * plane_rows * Wq);
    for (int r = 0; r < Hp; r++) {
        int iy = r - pt;
        for (int ph = 0; ph < sw; ph++) {
            float *dst = pad + ((size_t)r * sw + ph) * Wq;
            if (iy < 0 || iy >= H) { if (!whole) memset(dst, 0, sizeof(float) * Wq); continue; }
            const float *src = xc + (long)iy * W;
            /* n covers input column ph + n*sw - pl: valid for n in [n0, n1) */
            int n0 = pl > ph ? (pl - ph + sw - 1) / sw : 0;
            int n1 = (W + pl - ph + sw - 1) / sw;
            if (n1 > Wq) n1 = Wq;
            if (n0 > n1) n0 = n1;
            if (!whole) memset(dst, 0, sizeof(float) * n0);
            const float *sp = src + ph + (long)n0 * sw - pl;
            if (sw == 1)
                memcpy(dst + n0, sp, sizeof(float) * (n1 - n0));
            else if (sw == 2)
                copy_even(dst + n0, sp, n1 - n0);
            else
                for (int n = n0; n < n1; n++, sp += sw) dst[n] = *sp;
            if (!whole) memset(dst + n1, 0, sizeof(float) * (Wq - n1));
        }
    }
}

/* Depthwise conv (group == C == M), channels [c0, c1) of one image.
 *
 * Each channel's input is copied once, zero-padded, into `sw` phase planes per row: plane p
 * of row iy holds x[iy, p::sw] (with the left padding), so every tap of a strided conv reads
 * contiguous floats (out[j] of tap kx reads plane (kx*dw) % sw at (kx*dw) / sw + j). Each strip
 * of 8 outputs accumulates all kh*kw taps in one register and is stored once, through the
 * activation: one load and one FMA per tap and 8 outputs, nothing else. (The first version
 * copied kh padded rows per output row, kept the sums in memory and gathered strided taps
 * one float at a time: 2.2-8 GFLOP/s on MobileNetV2's depthwise convs.) */
int npr_dwconv2d(const float *x, int C, int H, int W, const float *w, const float *bias,
                 int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                 int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1)
{
    /* padded rows the outputs read: [0, Hp); plane width: the outputs plus the widest tap */
    int Hp = (Ho - 1) * sh + (kh - 1) * dh + 1;
    int Wq = Wo + ((kw - 1) * dw) / sw + 1 + 8;  /* floats per plane (+8: a strip may overrun) */
    size_t plane_rows = (size_t)Hp * sw;
    float *pad = aligned_alloc(64, sizeof(float) * ((plane_rows * Wq + 15) & ~(size_t)15));
    if (!pad) return -1;
    int taps = kh * kw, held = taps <= 64;  /* up to 64 weights are broadcast once a channel */
    /* tap t = (ky, kx) reads, for output row r and column j, base(r) + off[t] + j */
    long *off = malloc(sizeof(long) * taps);
    if (!off) { free(pad); return -1; }
    for (int ky = 0; ky < kh; ky++)
        for (int kx = 0; kx < kw; kx++) {
            int q = kx * dw;
            off[ky * kw + kx] = ((long)ky * dh * sw + q % sw) * Wq + q / sw;
        }
    __m256 wv[64];
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    for (int c = c0; c < c1; c++) {
        const float *xc = x + (long)c * H * W, *wc = w + (long)c * kh * kw;
        dw_fill(pad, xc, H, W, Hp, Wq, sw, pt, pl);
        for (int t = 0; held && t < taps; t++) wv[t] = _mm256_set1_ps(wc[t]);
        __m256 b0 = _mm256_set1_ps(bias ? bias[c] : 0.0f);
        float *yc = y + (long)c * Ho * Wo;
        int wide = Wo / 32 * 32;  /* columns done four strips at a time */
        for (int r = 0; r < Ho; r++) {
            const float *base = pad + (size_t)r * sh * sw * Wq;
            float *yr = yc + (long)r * Wo;
            /* four strips at once: four independent FMA chains (one chain of kh*kw dependent
             * FMAs is latency-bound at ~4 cycles a tap) */
            for (int j = 0; j < wide; j += 32) {
                __m256 a0 = b0, a1 = b0, a2 = b0, a3 = b0;
                for (int t = 0; t < taps; t++) {
                    __m256 wt = held ? wv[t] : _mm256_broadcast_ss(wc + t);
                    const float *src = base + off[t] + j;
                    a0 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src), a0);
                    a1 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src + 8), a1);
                    a2 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src + 16), a2);
                    a3 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src + 24), a3);
                }
                _mm256_storeu_ps(yr + j, npr_act(a0, act, al, be));
                _mm256_storeu_ps(yr + j + 8, npr_act(a1, act, al, be));
                _mm256_storeu_ps(yr + j + 16, npr_act(a2, act, al, be));
                _mm256_storeu_ps(yr + j + 24, npr_act(a3, act, al, be));
            }
        }
        /* the remaining columns (all of them on small maps: 7x7, 14x14), four rows at once */
        const long rstep = (long)sh * sw * Wq;
        for (int j = wide; j < Wo; j += 8) {
            int n = Wo - j < 8 ? Wo - j : 8;
            for (int r = 0; r < Ho; r += 4) {
                int rows = Ho - r < 4 ? Ho - r : 4;
                const float *base = pad + (size_t)r * rstep + j;
                __m256 a0 = b0, a1 = b0, a2 = b0, a3 = b0;
                for (int t = 0; t < taps; t++) {
                    __m256 wt = held ? wv[t] : _mm256_broadcast_ss(wc + t);
                    const float *src = base + off[t];
                    a0 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src), a0);
                    if (rows > 1) a1 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src + rstep), a1);
                    if (rows > 2) a2 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src + 2 * rstep), a2);
                    if (rows > 3) a3 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src + 3 * rstep), a3);
                }
                __m256 acc[4] = {a0, a1, a2, a3};
                for (int k = 0; k < rows; k++) {
                    float *dst = yc + (long)(r + k) * Wo + j;
                    if (n == 8) {
                        _mm256_storeu_ps(dst, npr_act(acc[k], act, al, be));
                    } else {  /* the ragged last strip of a row */
                        float t8[8];
                        _mm256_storeu_ps(t8, npr_act(acc[k], act, al, be));
                        memcpy(dst, t8, sizeof(float) * n);
                    }
                }
            }
        }
    }
    free(off);
    free(pad);
    return 0;
}

/* The per-channel depthwise kernel in AVX-512: the same planes and the same sums, tap after
 * tap from the bias, so its outputs are npr_dwconv2d's bit for bit, but 16 columns a vector and
 * a masked last vector per row, so a 14- or 56-wide row is one or four vectors with no ragged
 * strips (C test, 1 thread, 3x3 ReLU6: 96 x 56x56 185 -> 121 us, 16 x 112x112 120 -> 82,
 * 288 x 14x14 77 -> 24; ORT's NCHWc kernels take 104-126 and 43 inside MobileNetV2), and
 * four output rows a block where the geometry is known (dw512_known). */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
#define DW_STRIP_BYTES (32 << 10)  /* a channel's planes above this go a strip of rows at a time */
/* dw_fill in AVX-512 for strides 1 and 2 (pads >= 0), for a buffer zeroed once per call: a
 * channel's input rows are copied to the same places as every other channel's, so the padding
 * around them stays zero and only the copies are redone (the general fill zeroed every row of
 * every channel: on 28x28 -> 14x14 stride-2 maps, the fill was most of the kernel). At stride
 * 2 each 32 input floats are split into even and odd columns by two permutes. */
static void dw_fill512(float *pad, const float *xc, int H, int W, int r_lo, int r_hi, int Wq, int sw, int pt,
                       int pl, int strip)
{
    /* padded rows [r_lo, r_hi) into the buffer's rows from 0; a padding row among them is
     * zeroed here for a strip (its buffer rows held other rows before, of this channel or the
     * last), else it is still zero from the call's memset */
    if (strip)
        for (int r = r_lo; r < r_hi; r++)
            if (r < pt || r >= pt + H)
                memset(pad + (size_t)(r - r_lo) * sw * Wq, 0, sizeof(float) * sw * Wq);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#define MASK(n) ((n) >= 16 ? (__mmask16)0xFFFF : (n) > 0 ? (__mmask16)((1u << (n)) - 1) : (__mmask16)0)
    int r0 = pt > r_lo ? pt : r_lo, r1 = H + pt < r_hi ? H + pt : r_hi;  /* the rows that hold input rows */
    if (sw == 1) {
        int n = W < Wq - pl ? W : Wq - pl;  /* input columns that land in the plane */
        int full = n / 16 * 16;
        __mmask16 m = MASK(n - full);
        for (int r = r0; r < r1; r++) {
            float *d = pad + (size_t)(r - r_lo) * Wq + pl;
            const float *src = xc + (long)(r - pt) * W;
            for (int j = 0; j < full; j += 16) _mm512_storeu_ps(d + j, _mm512_loadu_ps(src + j));
            if (m) _mm512_mask_storeu_ps(d + full, m, _mm512_maskz_loadu_ps(m, src + full));
        }
        return;
    }
    /* input column ix is padded column ix + pl: plane (ix + pl) % 2, at (ix + pl) / 2 */
    int ne = (W + 1) / 2, no = W / 2;  /* even and odd input columns that land in the planes */
    if (ne > Wq - pl / 2) ne = Wq - pl / 2;
    if (no > Wq - (pl + 1) / 2) no = Wq - (pl + 1) / 2;
    int full = W / 32 * 16;  /* even (odd) columns of the whole 32-float blocks */
    if (full > no) full = no / 16 * 16;
    for (int r = r0; r < r1; r++) {
        float *row = pad + (size_t)(r - r_lo) * 2 * Wq;
        float *de = row + (pl & 1) * Wq + pl / 2, *dd = row + (1 - (pl & 1)) * Wq + (pl + 1) / 2;
        const float *src = xc + (long)(r - pt) * W;
        int m = 0;
        for (; m < full; m += 16) {
            __m512 a = _mm512_loadu_ps(src + 2 * m), b = _mm512_loadu_ps(src + 2 * m + 16);
            _mm512_storeu_ps(de + m, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(dd + m, _mm512_permutex2var_ps(a, odd, b));
        }
        for (; m < ne; m += 16) {
            int left = W - 2 * m;
            __m512 a = _mm512_maskz_loadu_ps(MASK(left), src + 2 * m);
            __m512 b = _mm512_maskz_loadu_ps(MASK(left - 16), src + 2 * m + 16);
            _mm512_mask_storeu_ps(de + m, MASK(ne - m), _mm512_permutex2var_ps(a, even, b));
            _mm512_mask_storeu_ps(dd + m, MASK(no - m), _mm512_permutex2var_ps(a, odd, b));
        }
    }
#undef MASK
}

/* Output rows [ra, rb) of one channel from its phase planes, RB rows a block (rb - ra a
 * multiple of RB), one vector of 16 columns at a time: each input vector is loaded once per
 * block and used by every row of the block it contributes to (a 3x3 stride-1 block of four rows
 * loads 18 vectors for 36 FMAs where one row at a time loads 9 for 9, each load of an unaligned
 * vector splitting over two cache lines). Each output's taps are still summed in order from the
 * bias, so the sums are the one-row kernel's bit for bit. Always inlined with kh, kw, sh, sw and
 * RB constants, so the loops unroll, the weights stay in registers and the offsets fold. */
static inline __attribute__((always_inline)) void dw512_rows(
    const float *pad, const __m512 *wv, __m512 b0, float *yc, int ra, int rb, int row0, int Wo, long Wq,
    const int kh, const int kw, const int sh, const int sw, int act, __m512 al, __m512 be, const int RB)
{
    /* (row0: the padded row in the buffer's first row) */
    const int nv = (Wo + 15) / 16;
    const __mmask16 tail = Wo % 16 ? (__mmask16)((1u << (Wo % 16)) - 1) : (__mmask16)0xFFFF;
    const long rs = (long)sw * Wq;  /* one padded input row: its sw phase planes */
    for (int r0 = ra; r0 < rb; r0 += RB) {
        const float *base = pad + (size_t)(r0 * sh - row0) * rs;
        for (int v = 0; v < nv; v++) {
            __m512 acc[4];
#pragma GCC unroll 4
            for (int r = 0; r < RB; r++) acc[r] = b0;
#pragma GCC unroll 16
            for (int ii = 0; ii < (RB - 1) * sh + kh; ii++)
#pragma GCC unroll 8
                for (int kx = 0; kx < kw; kx++) {
                    __m512 x = _mm512_loadu_ps(base + ii * rs + (kx % sw) * Wq + kx / sw + 16 * v);
#pragma GCC unroll 4
                    for (int r = 0; r < RB; r++) {
                        int ky = ii - r * sh;
                        if (ky >= 0 && ky < kh) acc[r] = _mm512_fmadd_ps(wv[ky * kw + kx], x, acc[r]);
                    }
                }
            __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xFFFF;
#pragma GCC unroll 4
            for (int r = 0; r < RB; r++)
                _mm512_mask_storeu_ps(yc + (long)(r0 + r) * Wo + 16 * v, m, npr_act512(acc[r], act, al, be));
        }
    }
}

/* A channel's plane for a geometry known at compile time: rows four at a time, the last
 * Ho % 4 one at a time (padding the block instead cost 14% on 7x7 maps). Hot, 1 thread, 3x3
 * ReLU6, against one row at a time: 96 x 56x56 0.82, 288 x 14x14 0.80, 480 x 7x7 1.10; stride 2
 * (with dw_fill512) 0.51-0.78; 5x5 0.31-0.60, 7x7 0.26 (C harness, outputs bit-identical). */
static inline __attribute__((always_inline)) void dw512_known(
    const float *pad, const float *wc, __m512 b0, float *yc, int ra, int rb, int row0, int Wo, long Wq,
    const int kh, const int kw, const int sh, const int sw, int act, __m512 al, __m512 be)
{
    __m512 wv[49];
    for (int t = 0; t < kh * kw; t++) wv[t] = _mm512_set1_ps(wc[t]);
    int blocked = ra + (rb - ra) / 4 * 4;
    dw512_rows(pad, wv, b0, yc, ra, blocked, row0, Wo, Wq, kh, kw, sh, sw, act, al, be, 4);
    dw512_rows(pad, wv, b0, yc, blocked, rb, row0, Wo, Wq, kh, kw, sh, sw, act, al, be, 1);
}

/* Output rows [ra, rb) of a known geometry (0: not one of them; npr_dwconv2d_avx512's `known`
 * lists the same geometries, for its choice of strips). */
static int dw512_dispatch(const float *pad, const float *wc, __m512 b0, float *yc, int ra, int rb, int row0,
                          int Wo, long Wq, int kh, int kw, int sh, int sw, int dh, int dw, int act,
                          __m512 al, __m512 be)
{
    int d1 = dh == 1 && dw == 1;
    if (d1 && kh == 3 && kw == 3 && sh == 1 && sw == 1)
        dw512_known(pad, wc, b0, yc, ra, rb, row0, Wo, Wq, 3, 3, 1, 1, act, al, be);
    else if (d1 && kh == 3 && kw == 3 && sh == 2 && sw == 2)
        dw512_known(pad, wc, b0, yc, ra, rb, row0, Wo, Wq, 3, 3, 2, 2, act, al, be);
    else if (d1 && kh == 5 && kw == 5 && sh == 1 && sw == 1)
        dw512_known(pad, wc, b0, yc, ra, rb, row0, Wo, Wq, 5, 5, 1, 1, act, al, be);
    else if (d1 && kh == 5 && kw == 5 && sh == 2 && sw == 2)
        dw512_known(pad, wc, b0, yc, ra, rb, row0, Wo, Wq, 5, 5, 2, 2, act, al, be);
    else if (d1 && kh == 7 && kw == 7 && sh == 1 && sw == 1)
        dw512_known(pad, wc, b0, yc, ra, rb, row0, Wo, Wq, 7, 7, 1, 1, act, al, be);
    else
        return 0;
    return 1;
}

/* One channel's output plane from its phase planes, any geometry (dilation, other kernel
 * sizes, strides > 2): one row and one vector at a time, tap t at offset off[t]. */
static void dw512_plane(const float *pad, const float *wc, __m512 b0, float *yc, int Ho, int Wo, long Wq,
                        const long *off, int kh, int kw, int sh, int sw, int act, __m512 al, __m512 be)
{
    const int taps = kh * kw;
    const int nv = (Wo + 15) / 16;
    const __mmask16 tail = Wo % 16 ? (__mmask16)((1u << (Wo % 16)) - 1) : (__mmask16)0xFFFF;
    for (int r = 0; r < Ho; r++) {
        const float *base = pad + (size_t)r * sh * sw * Wq;
        float *yr = yc + (long)r * Wo;
        for (int v = 0; v < nv; v++) {
            __m512 a = b0;
            for (int t = 0; t < taps; t++)
                a = _mm512_fmadd_ps(_mm512_set1_ps(wc[t]), _mm512_loadu_ps(base + off[t] + 16 * v), a);
            _mm512_mask_storeu_ps(yr + 16 * v, v == nv - 1 ? tail : (__mmask16)0xFFFF, npr_act512(a, act, al, be));
        }
    }
}

int npr_dwconv2d_avx512(const float *x, int C, int H, int W, const float *w, const float *bias,
                        int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                        int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1)
{
    int Hp = (Ho - 1) * sh + (kh - 1) * dh + 1;
    int Wq = Wo + ((kw - 1) * dw) / sw + 1 + 16;  /* (+16: a row's last vector reads whole) */
    size_t row_floats = (size_t)sw * Wq;  /* one padded row: its sw phase planes */
    /* strides 1 and 2 with pads >= 0: the padding zeroed once per call, for every channel */
    int zeroed = (sw == 1 || sw == 2) && pl >= 0 && pt >= 0;
    int d1 = dh == 1 && dw == 1, known = d1 && (kh == 3 || kh == 5 || kh == 7) && kw == kh && sh == sw
                                             && sw <= (kh == 7 ? 1 : 2);
    /* A channel's planes bigger than L1 are made and used a strip of output rows at a time
     * (16 at stride 1, 8 at stride 2), so its rows are read from L1, not L2, right after they
     * are written; the rows two strips share are copied twice (kh - sh of (SR-1)*sh + kh). */
    int SR = sh == 1 ? 16 : 8, strip_rows = (SR - 1) * sh + kh;
    int strips = zeroed && known && (size_t)Hp * row_floats * sizeof(float) > DW_STRIP_BYTES && Ho > SR;
    size_t rows = strips ? (size_t)strip_rows : (size_t)Hp;
    float *pad = aligned_alloc(64, sizeof(float) * ((rows * row_floats + 15) & ~(size_t)15));
    if (!pad) return -1;
    if (zeroed) memset(pad, 0, sizeof(float) * rows * row_floats);
    long *off = malloc(sizeof(long) * kh * kw);  /* tap t's offset in the planes */
    if (!off) { free(pad); return -1; }
    for (int ky = 0; ky < kh; ky++)
        for (int kx = 0; kx < kw; kx++) {
            int q = kx * dw;
            off[ky * kw + kx] = ((long)ky * dh * sw + q % sw) * Wq + q / sw;
        }
    __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
    for (int c = c0; c < c1; c++) {
        const float *xc = x + (long)c * H * W, *wc = w + (long)c * kh * kw;
        __m512 b0 = _mm512_set1_ps(bias ? bias[c] : 0.0f);
        float *yc = y + (long)c * Ho * Wo;
        if (strips) {
            for (int r0 = 0; r0 < Ho; r0 += SR) {
                int r1 = r0 + SR < Ho ? r0 + SR : Ho, a = r0 * sh, b = (r1 - 1) * sh + kh;
                dw_fill512(pad, xc, H, W, a, b, Wq, sw, pt, pl, 1);
                dw512_dispatch(pad, wc, b0, yc, r0, r1, a, Wo, Wq, kh, kw, sh, sw, dh, dw, act, al, be);
            }
            continue;
        }
        if (zeroed)
            dw_fill512(pad, xc, H, W, 0, Hp, Wq, sw, pt, pl, 0);
        else
            dw_fill(pad, xc, H, W, Hp, Wq, sw, pt, pl);
        /* the common geometries with their taps known to the compiler, any other through the
         * one-row kernel with the taps' offsets at run time */
        if (!dw512_dispatch(pad, wc, b0, yc, 0, Ho, 0, Wo, Wq, kh, kw, sh, sw, dh, dw, act, al, be))
            dw512_plane(pad, wc, b0, yc, Ho, Wo, Wq, off, kh, kw, sh, sw, act, al, be);
    }
    free(off);
    free(pad);
    return 0;
}
#pragma GCC pop_options

/* y[0:n] = act(x[0:n]) (y may be x): the standalone activation kernel. */
void npr_activation(const float *x, float *y, long n, int act, float alpha, float beta)
{
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, npr_act(_mm256_loadu_ps(x + i), act, al, be));
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, sizeof(float) * (n - i));
        _mm256_storeu_ps(t, npr_act(_mm256_loadu_ps(t), act, al, be));
        memcpy(y + i, t, sizeof(float) * (n - i));
    }
}

/* ---- The multi-threaded entry points: one call splits the work into `chunks` equal bands on
 * `threads` threads of the library's one spinning pool (par.h says why not Python's pool: a
 * YOLOv8n conv takes 20-300 us, a hand-off there tens of us). */
#include "par.h"

typedef int (*conv_band)(const float *, int, int, int, const float *, const float *, int, int, int, int, int,
                         int, int, int, int, int, float, float, float *, int, int, int, int, long, int);
typedef struct {
    conv_band fn; const float *x; int C, H, W; const float *wp, *bias; int M, kh, kw, sh, sw, dh, dw, pt, pl;
    int act; float alpha, beta; float *y; int Ho, Wo, nt, flat, chunks, r0, r1; atomic_int rc;
} conv_job;

#define FLAT_PIX 64  /* a pointwise conv's pixel row is split in groups of this many */

static void conv_chunk(void *ctx, int i)
{
    conv_job *j = ctx;
    int rc;
    if (j->flat) {  /* pixels [a, b) of the flat (C, Ho*Wo) rows, passed as a 1 x (b-a) image */
        long plane = (long)j->Ho * j->Wo, groups = plane / FLAT_PIX > 0 ? plane / FLAT_PIX : 1;
        long lo = j->r0, hi = j->r1 < groups ? j->r1 : groups;  /* a piece: groups [r0, r1) */
        long g0 = par_at(lo, hi, i, j->chunks), g1 = par_at(lo, hi, i + 1, j->chunks);
        long a = g0 * FLAT_PIX, b = g1 == groups ? plane : g1 * FLAT_PIX;
        if (b <= a) return;
        rc = j->fn(j->x + a, j->C, 1, (int)plane, j->wp, j->bias, j->M, 1, 1, 1, 1, 1, 1, 0, 0, j->act,
                   j->alpha, j->beta, j->y + a, 1, (int)(b - a), 0, 1, plane, j->nt);
    } else {
        int a = (int)par_at(j->r0, j->r1, i, j->chunks), b = (int)par_at(j->r0, j->r1, i + 1, j->chunks);
        if (b <= a) return;
        rc = j->fn(j->x, j->C, j->H, j->W, j->wp, j->bias, j->M, j->kh, j->kw, j->sh, j->sw, j->dh, j->dw,
                   j->pt, j->pl, j->act, j->alpha, j->beta, j->y, j->Ho, j->Wo, a, b, 0, j->nt);
    }
    if (rc) atomic_store(&j->rc, -1);
}

/* One image of a dense (group 1) conv; flat: a pointwise stride-1 unpadded conv, split by
 * pixels rather than rows (whole tiles even on small images). Output rows (flat: 64-pixel
 * groups) [r0, r1) only: a piece of the node, with a preemption point after it
 * (nativeconv.py, backends/pieces.py); [0, Ho) (flat: [0, groups)) is the whole. */
#define CONV_MT(name, fn)                                                                          \
int name(const float *x, int C, int H, int W, const float *wp, const float *bias, int M, int kh, int kw, \
         int sh, int sw, int dh, int dw, int pt, int pl, int act, float alpha, float beta, float *y,      \
         int Ho, int Wo, int nt, int flat, int threads, int chunks, int r0, int r1)                       \
{                                                                                                   \
    conv_job j = {fn, x, C, H, W, wp, bias, M, kh, kw, sh, sw, dh, dw, pt, pl, act, alpha, beta, y,  \
                  Ho, Wo, nt, flat, chunks, r0, r1, 0};                                             \
    par_run(conv_chunk, &j, chunks, threads);                                                       \
    return atomic_load(&j.rc);                                                                      \
}
CONV_MT(npr_conv2d_avx2_mt, npr_conv2d_avx2)
CONV_MT(npr_conv2d_avx512_mt, npr_conv2d_avx512)

typedef int (*dw_fn)(const float *, int, int, int, const float *, const float *, int, int, int, int, int,
                     int, int, int, int, float, float, float *, int, int, int, int);
int npr_dwconv2d_cl(const float *x, int C, int H, int W, const float *w, const float *bias,
                    int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                    int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1);
int npr_dwconv2d_cl16(const float *x, int C, int H, int W, const float *w, const float *bias,
                      int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                      int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1);
int npr_dwconv2d_flat(const float *x, int C, int H, int W, const float *w, const float *bias,
                      int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                      int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1);
static const dw_fn DW_KINDS[5] = {npr_dwconv2d, npr_dwconv2d_cl, npr_dwconv2d_avx512, npr_dwconv2d_cl16,
                                  npr_dwconv2d_flat};

typedef struct {
    dw_fn fn; const float *x; int C, H, W; const float *w, *bias; int kh, kw, sh, sw, dh, dw, pt, pl;
    int act; float alpha, beta; float *y; int Ho, Wo, chunks, align, c0, c1; atomic_int rc;
} dw_job;

static void dw_chunk(void *ctx, int i)
{
    dw_job *j = ctx;
    /* channel bands of [c0, c1); the lanes kernel's in whole blocks of 8 where it can (c0 is
     * a multiple of 8: the blocks are the whole call's, so a piece's results are too) */
    long n = (j->c1 - j->c0 + j->align - 1) / j->align;
    int a = j->c0 + (int)(par_at(0, n, i, j->chunks) * j->align);
    int b = j->c0 + (int)(par_at(0, n, i + 1, j->chunks) * j->align);
    if (b > j->c1) b = j->c1;
    if (b > a && j->fn(j->x, j->C, j->H, j->W, j->w, j->bias, j->kh, j->kw, j->sh, j->sw, j->dh,
                       j->dw, j->pt, j->pl, j->act, j->alpha, j->beta, j->y, j->Ho, j->Wo, a, b))
        atomic_store(&j->rc, -1);
}

/* One image of a depthwise conv, its channels [c0, c1) in `chunks` bands (a piece of the node:
 * nativeconv cuts at multiples of 8); kind: 0 the per-channel kernel above, 1 the
 * channels-in-lanes kernel of dwconv_cl.c (nativeconv.dw_lanes_chosen), 2 the per-channel
 * kernel in AVX-512, 3 the channels-in-lanes kernel with 16 lanes (AVX-512; kind 1's bits), 4 a
 * plane as one flat row (dwconv_flat.c: small maps, AVX-512; kind 2's bits). */
int npr_dwconv2d_mt(const float *x, int C, int H, int W, const float *w, const float *bias,
                    int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                    int act, float alpha, float beta, float *y, int Ho, int Wo, int threads, int chunks,
                    int kind, int c0, int c1)
{
    if (kind < 0 || kind > 4) return -2;
    dw_job j = {DW_KINDS[kind], x, C, H, W, w, bias, kh, kw, sh, sw, dh, dw, pt, pl,
                act, alpha, beta, y, Ho, Wo, chunks, kind == 1 ? 8 : kind == 3 ? 16 : 1, c0, c1, 0};
    par_run(dw_chunk, &j, chunks, threads);
    return atomic_load(&j.rc);
}

typedef struct { const float *x; float *y; long n; int act; float alpha, beta; int chunks; } act_job;

static void act_chunk(void *ctx, int i)
{
    act_job *j = ctx;
    long a = par_at(0, j->n, i, j->chunks), b = par_at(0, j->n, i + 1, j->chunks);
    if (b > a) npr_activation(j->x + a, j->y + a, b - a, j->act, j->alpha, j->beta);
}

/* The standalone activation in `chunks` contiguous parts. */
void npr_activation_mt(const float *x, float *y, long n, int act, float alpha, float beta, int threads, int chunks)
{
    act_job j = {x, y, n, act, alpha, beta, chunks};
    par_run(act_chunk, &j, chunks, threads);
}
