/* A dense conv as im2col + transformer.c's packed sgemm, one panel of output pixels at a time:
 *     y (M, pixels) = act([W | bias] (M, K + 1) @ [im2col(x); 1] (K + 1, pixels))
 * Each panel's NR columns of the im2col matrix are written straight from the input into the
 * sgemm's packed layout (bounds checks stand in for the padding), multiplied while they are
 * in L1/L2, and the panel's (M, NR) result goes out with its activation to each pixel's image
 * and channel. The pixels of all images of a batch are one run of columns, so small images
 * share panels (a Keras Conv1D over 64 sequences of 21 characters: 12 pixels an image).
 *
 * It replaced nativeconv._gemm's NumPy im2col, a separate pack pass and, for a batch, a
 * NumPy transpose of the result: on deepcut's convs (64 x 32 x 1 x 21) that was 0.4-0.8 ms
 * a conv around a 0.5 ms product, none of it on the pool's threads. Panels [p0, p1) are
 * split into `chunks` on the library's pool (par.h); each panel is computed as in the whole
 * call, so pieces (ranges of panels) are bit-identical to it. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "par.h"

void npr_gemm_avx2(const float *, const float *, float *, const float *, const float *, long, long, long, long, long);
void npr_gemm_avx512(const float *, const float *, float *, const float *, const float *, long, long, long, long, long);
typedef void gemm_act_fn(const float *, long, const float *, long, long, float *, long, long, long, long, long, int,
                         int, float, float);
gemm_act_fn npr_gemm_act_avx2, npr_gemm_act_avx512;
void npr_activation(const float *x, float *y, long n, int act, float alpha, float beta);
void *npr_scratch(int slot, size_t bytes);

#define NR_MAX 32

typedef struct {
    const float *x, *wb;
    float *y;
    long C, H, W, M, K1, Ho, Wo, pixels;  /* K1 = C*kh*kw + 1; pixels: over all images */
    int kh, kw, sh, sw, dh, dw, pt, pl, act, isa512, nr;
    float alpha, beta;
    long p0, p1;
    int chunks;
    atomic_int rc;
} ig_job;

/* One panel's columns as runs along an output row: columns [t, t + len) are pixels
 * (img, oy, ox + u) for u < len. */
typedef struct { int t, len; long img, oy, ox; } run_t;

static int row_runs(const ig_job *j, long col0, int nc, run_t *r)
{
    int n = 0;
    long hw = j->Ho * j->Wo;
    for (int t = 0; t < nc;) {
        long col = col0 + t, img = col / hw, pix = col % hw, oy = pix / j->Wo, ox = pix % j->Wo;
        int len = (int)(j->Wo - ox < nc - t ? j->Wo - ox : nc - t);
        r[n++] = (run_t){t, len, img, oy, ox};
        t += len;
    }
    return n;
}

/* bp (K1 x nr) = the panel's im2col columns, zero past nc and where a tap falls in the padding;
 * the last row is ones (the bias). */
static void pack_panel(const ig_job *j, const run_t *runs, int nruns, int nc, float *bp)
{
    const int nr = j->nr, sw = j->sw;
    float *dst = bp;
    for (long ci = 0; ci < j->C; ci++)
        for (int ky = 0; ky < j->kh; ky++)
            for (int kx = 0; kx < j->kw; kx++, dst += nr) {
                for (int q = 0; q < nruns; q++) {
                    const run_t *r = &runs[q];
                    float *d = dst + r->t;
                    long iy = r->oy * j->sh - j->pt + (long)ky * j->dh;
                    if (iy < 0 || iy >= j->H) {
                        for (int u = 0; u < r->len; u++) d[u] = 0.0f;
                        continue;
                    }
                    long ix0 = r->ox * sw - j->pl + (long)kx * j->dw;  /* column u reads ix0 + u*sw */
                    int lo = ix0 >= 0 ? 0 : (int)((-ix0 + sw - 1) / sw);
                    int hi = ix0 >= j->W ? 0 : (int)((j->W - ix0 + sw - 1) / sw);
                    if (lo > r->len) lo = r->len;
                    if (hi > r->len) hi = r->len;
                    if (hi < lo) hi = lo;
                    const float *s = j->x + ((r->img * j->C + ci) * j->H + iy) * j->W + ix0;
                    /* (loops, not memcpy / memset: runs are a few to 32 floats, where a
                     * library call per run was most of the packing time) */
                    for (int u = 0; u < lo; u++) d[u] = 0.0f;
                    if (sw == 1)
                        for (int u = lo; u < hi; u++) d[u] = s[u];
                    else
                        for (int u = lo; u < hi; u++) d[u] = s[(long)u * sw];
                    for (int u = hi; u < r->len; u++) d[u] = 0.0f;
                }
                for (int t = nc; t < nr; t++) dst[t] = 0.0f;
            }
    for (int t = 0; t < nr; t++) dst[t] = t < nc ? 1.0f : 0.0f;
}

/* np packed panels (bp) times [W | bias]: where they are whole and lie in one image, straight
 * into its planes with the activation in the registers (GEMM_ACT); otherwise into the tile
 * (M x np*nr), the activation over the whole tile (one call: per row and image it was ~10% of
 * a small-image conv), then out to the images: runs of pixels of one image each, nc pixels
 * from column col0. Both give the same bits. */
static void multiply_out(const ig_job *j, const float *bp, float *tile, long col0, int nc, int np)
{
    const long hw = j->Ho * j->Wo, N = (long)np * j->nr;
    if (nc == N && col0 % hw + N <= hw) {
        float *y = j->y + (col0 / hw) * j->M * hw + col0 % hw;
        (j->isa512 ? npr_gemm_act_avx512 : npr_gemm_act_avx2)(j->wb, j->K1, bp, j->nr, j->K1 * j->nr, y, hw, j->M,
                                                              j->K1, 0, np, 0, j->act, j->alpha, j->beta);
        return;
    }
    (j->isa512 ? npr_gemm_avx512 : npr_gemm_avx2)(j->wb, bp, tile, NULL, NULL, j->M, j->K1, N, 0, np);
    if (j->act) npr_activation(tile, tile, j->M * N, j->act, j->alpha, j->beta);
    for (int t = 0; t < nc;) {
        long col = col0 + t, img = col / hw, pix = col % hw;
        int len = (int)(hw - pix < nc - t ? hw - pix : nc - t);
        float *y = j->y + img * j->M * hw + pix;
        for (long m = 0; m < j->M; m++) memcpy(y + m * hw, tile + m * N + t, sizeof(float) * len);
        t += len;
    }
}

#ifndef PW_IN_PLACE_BYTES
/* A pointwise conv's input is read in place (no packing) where each of a tile's K rows is one
 * cache line (planes of a multiple of 16 floats, on a line) and they span at most this much
 * (each row is another page once a plane outgrows 4 KB; past the second-level TLB's reach the
 * packed panels won). 1 thread, in place / packed: 144->24 on 56x56 (1.8 MB) 0.61, 16->96 on
 * 112x112 0.63; rows across two lines: 728->728 on 37x37 1.29, 728->728 on 19x19 1.10, 256->728
 * on 37x37 1.18; 128->128 on 147x147 (11 MB) 1.11 (Keras Xception). */
#define PW_IN_PLACE_BYTES (2L << 20)
#endif

#ifndef PW_GROUP_BYTES
/* bytes of packed columns a pointwise conv's group holds: at 1 thread, against one panel at a
 * time (alternating, Zen 3 AVX2): 64 KB 0.67-1.03x, 192-320 KB 0.65-1.01x, whole 0.84-1.40x
 * (a 56x56 map's whole B outgrows L2) on MobileNetV2 / ResNet-50 shapes */
#define PW_GROUP_BYTES (256L << 10)
#endif

/* n floats s -> d: whole vectors for a full 16- or 32-float panel row (the common case), a
 * loop for the rest */
static inline void copy_run(float *d, const float *s, int n)
{
    if (n == 16 || n == 32) {
        for (int u = 0; u < n; u += 8) _mm256_storeu_ps(d + u, _mm256_loadu_ps(s + u));
        return;
    }
    for (int u = 0; u < n; u++) d[u] = s[u];
}

/* A pointwise conv (1x1, stride 1, no padding): panels [p, p + np) packed together, channel by
 * channel, each channel's columns read as one run of the input plane (np*nr floats, split at
 * image ends), then multiplied as one product (N = np*nr) and written out in runs as long.
 * Packing one panel at a time read K runs of nr floats 4*H*W bytes apart for every panel: K
 * streams the prefetchers do not follow, so every line came at memory latency (576->96 on
 * 14x14, 1 thread: 43% of the conv's time was the packing, the product 229 of its ~450 us).
 * Each panel is the same product as alone (same microkernel, same order over K): pieces and
 * thread counts do not change a bit. */
static void pw_group(const ig_job *j, long p, int np, float *bp, float *tile)
{
    const int nr = j->nr;
    const long hw = j->Ho * j->Wo, K = j->K1 - 1, col0 = p * nr, N = (long)np * nr;
    int nc = (int)(j->pixels - col0 < N ? j->pixels - col0 : N);
    const float *xs = j->x + (col0 / hw) * j->C * hw + col0 % hw;  /* the group's first column */
    if (nc == N && col0 % hw + N <= hw && hw % 16 == 0 && (uintptr_t)xs % 64 == 0
        && (long)sizeof(float) * K * hw <= PW_IN_PLACE_BYTES) {
        (j->isa512 ? npr_gemm_act_avx512 : npr_gemm_act_avx2)(j->wb, j->K1, xs, hw, nr,
                                                              j->y + (col0 / hw) * j->M * hw + col0 % hw, hw, j->M,
                                                              K, 0, np, 1, j->act, j->alpha, j->beta);
        return;
    }
    for (long k = 0; k < K; k++)
        for (int t = 0; t < nc;) {
            long col = col0 + t, img = col / hw, pix = col % hw;
            int len = (int)(hw - pix < nc - t ? hw - pix : nc - t);
            const float *s = j->x + (img * j->C + k) * hw + pix;
            for (int u = 0; u < len;) {  /* the run, cut at panel edges */
                int q = (t + u) / nr, o = (t + u) % nr, m = nr - o < len - u ? nr - o : len - u;
                copy_run(bp + ((long)q * j->K1 + k) * nr + o, s + u, m);
                u += m;
            }
            t += len;
        }
    for (int t = nc; t < N; t++)  /* past the last pixel: zero columns */
        for (long k = 0; k < K; k++) bp[((long)(t / nr) * j->K1 + k) * nr + t % nr] = 0.0f;
    for (int t = 0; t < N; t++) bp[((long)(t / nr) * j->K1 + K) * nr + t % nr] = t < nc ? 1.0f : 0.0f;
    multiply_out(j, bp, tile, col0, nc, np);
}

static void ig_chunk(void *ctx, int i)
{
    ig_job *j = ctx;
    long p0 = par_at(j->p0, j->p1, i, j->chunks), p1 = par_at(j->p0, j->p1, i + 1, j->chunks);
    if (p1 <= p0) return;
    const int nr = j->nr;
    /* a pointwise conv packs groups of panels (pw_group), any other one panel at a time */
    int pw = j->kh == 1 && j->kw == 1 && j->sh == 1 && j->sw == 1 && j->pt == 0 && j->pl == 0
             && j->Ho == j->H && j->Wo == j->W;
    long g = pw ? PW_GROUP_BYTES / ((long)sizeof(float) * j->K1 * nr) : 1;
    int gp = g < 1 ? 1 : g > p1 - p0 ? (int)(p1 - p0) : (int)g;
    float *bp = npr_scratch(0, sizeof(float) * (size_t)j->K1 * nr * gp);
    float *tile = npr_scratch(1, sizeof(float) * (size_t)j->M * nr * gp);
    if (!bp || !tile) {
        atomic_store(&j->rc, -1);
        return;
    }
    if (pw) {
        for (long p = p0; p < p1; p += gp) pw_group(j, p, (int)(p1 - p < gp ? p1 - p : gp), bp, tile);
        return;
    }
    run_t runs[NR_MAX];
    for (long p = p0; p < p1; p++) {
        long col0 = p * nr;
        int nc = (int)(j->pixels - col0 < nr ? j->pixels - col0 : nr);
        int nruns = row_runs(j, col0, nc, runs);
        pack_panel(j, runs, nruns, nc, bp);
        multiply_out(j, bp, tile, col0, nc, 1);
    }
}

/* y (n, M, Ho, Wo) for the panels [p0, p1) of the n*Ho*Wo output pixels (NR = npr_gemm_nr_*
 * each), on `threads` in `chunks`. wb: (M, K + 1) row-major, the bias in the last column.
 * Returns 0, or -1 where a thread's scratch could not be allocated. */
int npr_im2col_gemm_mt(const float *x, long n, long C, long H, long W, const float *wb, long M,
                       int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                       int act, float alpha, float beta, float *y, long Ho, long Wo,
                       int isa512, int nr, long p0, long p1, int threads, int chunks)
{
    if (nr > NR_MAX) return -1;
    ig_job j = {x, wb, y, C, H, W, M, C * kh * kw + 1, Ho, Wo, n * Ho * Wo, kh, kw, sh, sw, dh, dw, pt, pl,
                act, isa512, nr, alpha, beta, p0, p1, chunks, 0};
    par_run(ig_chunk, &j, chunks, threads);
    return atomic_load(&j.rc);
}
