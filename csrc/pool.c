/* Max pooling of the cpu backend (npurun/backends/cpu/ops/vision.py): 2-D, no dilation,
 * float32, over planes [p0, p1) of x (n*c planes of h x w) into y (planes of ho x wo).
 *
 * Padding is -inf (cells outside the image are skipped), and a NaN in a window is the
 * window's max, as np.maximum (the reference) has it.
 *
 * Each output row is computed rows first: the max of its window's kh input rows over the
 * whole width (contiguous: vectorized loads), then, along that one row, the max of kw taps
 * at the stride (strides 1 and 2 get their own copy of the loop, a constant stride). That
 * reads the strided data kw times per output instead of kh*kw. The max is one vmaxps
 * (v > o ? v : o), which drops a NaN v; so the rows pass also sums v * 0, which is NaN
 * exactly when a NaN (or an infinity) went by, and a plane where one did is computed again
 * with a NaN-keeping max. Why C: the NumPy form (2*(k-1) np.maximum passes over strided
 * views) took 0.6-0.9 ms on a ResNet stem's 3x3 stride-2 pool of (1, 64, 112, 112). */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "par.h"

static inline float nanmax(float m, float v) { return (v > m || v != v) ? v : m; }
static inline float fastmax(float m, float v) { return v > m ? v : m; }

#define COLS_LOOP(SW, MAX)                                                         \
    for (long j = lo; j <= hi; j++) out[j] = MAX(out[j], t[j * (SW)]);

/* one output row from the window rows of output row i (in fast mode, v * 0 of every input
 * read is added to `seen`, per column) */
static void out_row(const float *restrict xp, float *restrict out, float *restrict tmp, float *restrict seen,
                    const long *lim, int i, int h, int w, int wo, int kh, int kw, int sh, int sw, int pt,
                    int pl, int strict)
{
    if (!strict) {
        /* the usual windows (2 or 3 rows inside the image): their rows' max in one pass, one
         * store of tmp and one of seen per column instead of one per row (the rows pass was
         * store-bound: 0.32 ms on a ResNet stem's (1, 64, 112, 112) pool) */
        const float *restrict r[3];
        int nr = 0;
        for (int ky = 0; ky < kh && nr <= 3; ky++) {
            const int row = i * sh - pt + ky;
            if (row >= 0 && row < h) {
                if (nr < 3) r[nr] = xp + (long)row * w;
                nr++;
            }
        }
        if (nr == 2 || nr == 3) {
            const float *restrict a = r[0], *restrict b = r[1], *restrict c3 = nr == 3 ? r[2] : r[1];
            for (int c = 0; c < w; c++) {
                tmp[c] = fastmax(fastmax(a[c], b[c]), c3[c]);
                seen[c] += a[c] * 0.0f + b[c] * 0.0f + c3[c] * 0.0f;
            }
            goto cols;
        }
    }
    int first = 1;
    for (int ky = 0; ky < kh; ky++) {
        const int r = i * sh - pt + ky;
        if (r < 0 || r >= h) continue;
        const float *restrict src = xp + (long)r * w;
        if (first) {
            for (int c = 0; c < w; c++) tmp[c] = src[c];
            if (!strict)
                for (int c = 0; c < w; c++) seen[c] += src[c] * 0.0f;
            first = 0;
        } else if (strict) {
            for (int c = 0; c < w; c++) tmp[c] = nanmax(tmp[c], src[c]);
        } else {
            for (int c = 0; c < w; c++) {
                tmp[c] = fastmax(tmp[c], src[c]);
                seen[c] += src[c] * 0.0f;
            }
        }
    }
    if (first)  /* (a window of padding only: ceil_mode's last one can be) */
        for (int c = 0; c < w; c++) tmp[c] = -INFINITY;
cols:
    if (!strict && sw == 2 && kw == 3) {
        /* the columns whose three taps are all inside the row in one pass (one store each,
         * not one per tap); the others tap by tap as below */
        long jl = lim[0], jh = lim[1];
        for (int kx = 1; kx < 3; kx++) {
            if (lim[2 * kx] > jl) jl = lim[2 * kx];
            if (lim[2 * kx + 1] < jh) jh = lim[2 * kx + 1];
        }
        if (jl <= jh) {
            const float *restrict t = tmp - pl;
            for (long j = jl; j <= jh; j++)
                out[j] = fastmax(fastmax(t[2 * j], t[2 * j + 1]), t[2 * j + 2]);
            for (long j = 0; j < wo; j++) {
                if (j == jl) { j = jh; continue; }
                out[j] = -INFINITY;
                for (int kx = 0; kx < 3; kx++)
                    if (j >= lim[2 * kx] && j <= lim[2 * kx + 1]) out[j] = fastmax(out[j], t[2 * j + kx]);
            }
            return;
        }
    }
    for (int j = 0; j < wo; j++) out[j] = -INFINITY;
    for (int kx = 0; kx < kw; kx++) {
        const long lo = lim[2 * kx], hi = lim[2 * kx + 1];
        const float *restrict t = tmp + (kx - pl);
        if (strict) {
            if (sw == 1) { COLS_LOOP(1, nanmax) } else if (sw == 2) { COLS_LOOP(2, nanmax) } else { COLS_LOOP(sw, nanmax) }
        } else {
            if (sw == 1) { COLS_LOOP(1, fastmax) } else if (sw == 2) { COLS_LOOP(2, fastmax) } else { COLS_LOOP(sw, fastmax) }
        }
    }
}

/* Stride 1, one plane, in two flat passes over its -inf-padded copy P (Hp x Wp): V = the max
 * of each kh rows (V[i] = max over ky of P[i + ky*Wp], one long vectorized pass), then each
 * output row the max of kw neighbours of V's row. Rows first, taps in order, vmaxps(v, m):
 * the per-row path's results. A plane of small rows was ~200 cycles a row that way (SPPF's
 * 5x5 on 20x20: 0.29 ms for 256 planes, ORT 0.09). Returns 1 (nothing trusted) where a NaN
 * or an infinity is in the plane: the caller redoes it row by row, keeping NaNs. */
static int plane_s1(const float *restrict x, float *restrict y, float *restrict P, int h, int w, int ho, int wo,
                    int kh, int kw, int pt, int pl)
{
    const long Wp = wo + kw - 1, Hp = ho + kh - 1, L = Hp * Wp;
    const __m256 zero = _mm256_setzero_ps();
    __m256 z = zero;
    long k = 0, n = (long)h * w;
    for (; k + 8 <= n; k += 8) z = _mm256_add_ps(z, _mm256_mul_ps(_mm256_loadu_ps(x + k), zero));
    float zs = 0.0f;
    for (; k < n; k++) zs += x[k] * 0.0f;
    float zv[8];
    _mm256_storeu_ps(zv, z);
    for (int q = 0; q < 8; q++) zs += zv[q];
    if (zs != zs) return 1;
    float *restrict V = P + L;
    for (long i = 0; i < L; i++) P[i] = -INFINITY;
    for (int r = 0; r < h; r++)
        if (r + pt < Hp) memcpy(P + (r + pt) * Wp + pl, x + (long)r * w, sizeof(float) * (size_t)(w < Wp - pl ? w : Wp - pl));
    const long LV = (long)ho * Wp;  /* V's rows: one per output row */
    long i = 0;
    for (; i + 8 <= LV; i += 8) {
        __m256 m = _mm256_loadu_ps(P + i);
        for (int ky = 1; ky < kh; ky++) m = _mm256_max_ps(_mm256_loadu_ps(P + i + ky * Wp), m);
        _mm256_storeu_ps(V + i, m);
    }
    for (; i < LV; i++) {
        float m = P[i];
        for (int ky = 1; ky < kh; ky++) m = fastmax(m, P[i + ky * Wp]);
        V[i] = m;
    }
    for (int r = 0; r < ho; r++) {
        const float *restrict v = V + r * Wp;
        float *restrict out = y + (long)r * wo;
        int j = 0;
        for (; j + 8 <= wo; j += 8) {
            __m256 m = _mm256_loadu_ps(v + j);
            for (int kx = 1; kx < kw; kx++) m = _mm256_max_ps(_mm256_loadu_ps(v + j + kx), m);
            _mm256_storeu_ps(out + j, m);
        }
        for (; j < wo; j++) {
            float m = v[j];
            for (int kx = 1; kx < kw; kx++) m = fastmax(m, v[j + kx]);
            out[j] = m;
        }
    }
    return 0;
}

/* returns 0, or -1 when out of memory */
int npr_maxpool2d(const float *restrict x, float *restrict y, long p0, long p1, int h, int w, int ho, int wo,
                  int kh, int kw, int sh, int sw, int pt, int pl)
{
    long *lim = malloc(2 * (size_t)kw * sizeof(long) + 2 * (size_t)w * sizeof(float));
    if (!lim) return -1;
    float *tmp = (float *)(lim + 2 * kw), *seen = tmp + w;
    for (int kx = 0; kx < kw; kx++) {
        /* output columns j whose tap kx lands inside the row: 0 <= j*sw - pl + kx < w */
        const int off = kx - pl;
        long lo = off >= 0 ? 0 : (-off + sw - 1) / sw;
        long hi = off > w - 1 ? -1 : (w - 1 - off) / sw;
        lim[2 * kx] = lo;
        lim[2 * kx + 1] = hi > wo - 1 ? wo - 1 : hi;
    }
    float *P = NULL;
    if (sh == 1 && sw == 1) {
        P = malloc(2 * sizeof(float) * (size_t)(ho + kh - 1) * (size_t)(wo + kw - 1));
        if (!P) { free(lim); return -1; }
    }
    for (long p = p0; p < p1; p++) {
        const float *xp = x + p * (long)h * w;
        float *yp = y + p * (long)ho * wo;
        if (P && !plane_s1(xp, yp, P, h, w, ho, wo, kh, kw, pt, pl))
            continue;
        for (int c = 0; c < w; c++) seen[c] = 0.0f;
        for (int i = 0; i < ho; i++)
            out_row(xp, yp + (long)i * wo, tmp, seen, lim, i, h, w, wo, kh, kw, sh, sw, pt, pl, 0);
        int bad = 0;
        for (int c = 0; c < w; c++) bad |= seen[c] != seen[c];
        if (bad)  /* a NaN or an infinity went by: the plane again, keeping NaNs */
            for (int i = 0; i < ho; i++)
                out_row(xp, yp + (long)i * wo, tmp, seen, lim, i, h, w, wo, kh, kw, sh, sw, pt, pl, 1);
    }
    free(P);
    free(lim);
    return 0;
}


typedef struct {
    const float *x; float *y; long planes; int h, w, ho, wo, kh, kw, sh, sw, pt, pl, chunks;
    atomic_int failed;
} pool_job;

static void pool_chunk(void *ctx, int i)
{
    pool_job *j = ctx;
    long a = par_at(0, j->planes, i, j->chunks), b = par_at(0, j->planes, i + 1, j->chunks);
    if (b > a && npr_maxpool2d(j->x, j->y, a, b, j->h, j->w, j->ho, j->wo, j->kh, j->kw, j->sh, j->sw, j->pt, j->pl))
        atomic_store(&j->failed, 1);
}

/* The planes in `chunks` contiguous parts on the library's pool; 0, or -1 when out of memory. */
int npr_maxpool2d_mt(const float *x, float *y, long planes, int h, int w, int ho, int wo, int kh, int kw,
                     int sh, int sw, int pt, int pl, int threads, int chunks)
{
    pool_job j = {x, y, planes, h, w, ho, wo, kh, kw, sh, sw, pt, pl, chunks, 0};
    par_run(pool_chunk, &j, chunks, threads);
    return atomic_load(&j.failed) ? -1 : 0;
}


/* Global average pooling (and a mean over trailing axes): y[p] = the mean of the p-th run of
 * hw contiguous floats, for p in [p0, p1). Four 8-lane partial sums, combined in a fixed
 * order (the same result on any thread count). Why C: the reference's mean accumulates in
 * float64 through a converted copy, 0.58 ms on an EfficientNet squeeze-excite input of
 * (1, 96, 112, 112), 8-12% of the MobileNetV3 / EfficientNet / PP-LCNet runs; NumPy's float32
 * reduce took half of that. */
static void plane_means(const float *x, float *y, long p0, long p1, long hw)
{
    for (long p = p0; p < p1; p++) {
        const float *s = x + p * hw;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        long i = 0;
        for (; i + 32 <= hw; i += 32) {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s + i));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(s + i + 8));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(s + i + 16));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(s + i + 24));
        }
        for (; i + 8 <= hw; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s + i));
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        float sum = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
        for (; i < hw; i++) sum += s[i];
        y[p] = sum / (float)hw;
    }
}

typedef struct { const float *x; float *y; long planes, hw; int chunks; } mean_job;

static void mean_chunk(void *ctx, int i)
{
    mean_job *j = ctx;
    plane_means(j->x, j->y, par_at(0, j->planes, i, j->chunks), par_at(0, j->planes, i + 1, j->chunks), j->hw);
}

/* The planes in `chunks` contiguous parts on the library's pool (one chunk: this thread). */
void npr_plane_means_mt(const float *x, float *y, long planes, long hw, int threads, int chunks)
{
    mean_job j = {x, y, planes, hw, chunks};
    par_run(mean_chunk, &j, chunks, threads);
}
