/* Multi-threaded entry points of transformer.c, on the library's one spinning pool (par.h):
 * the packed sgemm (npr_gemm_* / npr_gemm_q8_*), whose panels of B (columns of C) are split into
 * `chunks` runs, and (below) its elementwise and row kernels. Why not the Program's Python
 * pool: a MiniLM product takes 0.1-0.4 ms and a hand-off to a Python thread costs tens of
 * microseconds on a 2-vCPU VM, so two threads ran no faster than one (docs/cpu.md, "Transformer encoders"). */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include "par.h"
#include "transpose8.h"

void npr_gemm_avx2(const float *, const float *, float *, const float *, const float *, long, long, long, long, long);
void npr_gemm_avx512(const float *, const float *, float *, const float *, const float *, long, long, long, long, long);
void npr_gemm_q8_avx2(const float *, const signed char *, const float *, float *, const float *, const float *,
                      long, long, long, long, long, float *);
void npr_gemm_q8_avx512(const float *, const signed char *, const float *, float *, const float *, const float *,
                        long, long, long, long, long, float *);

typedef struct {
    int isa512, q8;
    const float *a, *bp, *scale, *bias, *res;
    const signed char *bq;
    float *c, *ws;  /* ws: one K x NR widened panel per chunk (q8 only) */
    long M, K, N, panels, ws_stride;
    int chunks;
    long p_lo;  /* the first panel (npr_gemm_range_mt); the run is panels [p_lo, panels) */
} gemm_job;

static void gemm_chunk(void *ctx, int i)
{
    gemm_job *j = ctx;
    long p0 = par_at(j->p_lo, j->panels, i, j->chunks), p1 = par_at(j->p_lo, j->panels, i + 1, j->chunks);
    if (p1 <= p0) return;
    if (j->q8)
        (j->isa512 ? npr_gemm_q8_avx512 : npr_gemm_q8_avx2)(j->a, j->bq, j->scale, j->c, j->bias, j->res,
                                                            j->M, j->K, j->N, p0, p1, j->ws + i * j->ws_stride);
    else
        (j->isa512 ? npr_gemm_avx512 : npr_gemm_avx2)(j->a, j->bp, j->c, j->bias, j->res, j->M, j->K, j->N, p0, p1);
}

/* C = A @ B (+ bias) (+ R) over panels [p0, p1) of packed B (columns of C), in `chunks` runs on
 * `threads`: all of them (0, panels) or a piece of the product between preemption points; each
 * panel is computed as in the whole call, so the pieces together are bit-identical to it. */
void npr_gemm_range_mt(int isa512, const float *A, const float *Bp, float *C, const float *bias, const float *R,
                       long M, long K, long N, long p0, long p1, int threads, int chunks)
{
    gemm_job j = {isa512, 0, A, Bp, NULL, bias, R, NULL, C, NULL, M, K, N, p1, 0, chunks, p0};
    par_run(gemm_chunk, &j, chunks, threads);
}

/* The same product with the rows of A (and C) split into `chunks` bands of whole MR-row tiles,
 * every panel of [p0, p1) in each: for products of few columns and many rows (segformer's
 * 4096 x 32 @ 32 x 32: split by panels, 2 of them, each thread read all of A). A row's sums do
 * not depend on the rows beside it (even alone, GEMV_PANELS sums as the tiles do:
 * tests/test_cpu_transformer.py), so the bits are the same at any thread count. */
static void gemm_rows_chunk(void *ctx, int i)
{
    gemm_job *j = ctx;
    long mr = j->isa512 ? 8 : 6, tiles = (j->M + mr - 1) / mr;
    long r0 = par_at(0, tiles, i, j->chunks) * mr, r1 = par_at(0, tiles, i + 1, j->chunks) * mr;
    if (r1 > j->M) r1 = j->M;
    if (r1 <= r0) return;
    (j->isa512 ? npr_gemm_avx512 : npr_gemm_avx2)(j->a + r0 * j->K, j->bp, j->c + r0 * j->N, j->bias,
                                                  j->res ? j->res + r0 * j->N : NULL, r1 - r0, j->K, j->N,
                                                  j->p_lo, j->panels);
}

void npr_gemm_rows_mt(int isa512, const float *A, const float *Bp, float *C, const float *bias, const float *R,
                      long M, long K, long N, long p0, long p1, int threads, int chunks)
{
    gemm_job j = {isa512, 0, A, Bp, NULL, bias, R, NULL, C, NULL, M, K, N, p1, 0, chunks, p0};
    par_run(gemm_rows_chunk, &j, chunks, threads);
}

/* The int8-panel variant, panels [p0, p1); ws holds `chunks` widened panels of ws_stride floats each. */
void npr_gemm_q8_range_mt(int isa512, const float *A, const signed char *Bq, const float *scale, float *C,
                          const float *bias, const float *R, long M, long K, long N, long p0, long p1, float *ws,
                          long ws_stride, int threads, int chunks)
{
    gemm_job j = {isa512, 1, A, NULL, scale, bias, R, Bq, C, ws, M, K, N, p1, ws_stride, chunks, p0};
    par_run(gemm_chunk, &j, chunks, threads);
}

/* ---- A dense conv as the transposed product (tr_gemm_tpl.h GEMM_TCONV_AP): per image, the
 * input copied zero-padded where a tap falls outside it (so no tap needs a bounds check; an
 * unpadded conv, a pointwise one among them, is read in place), then, a group of pixel blocks
 * at a time, Ap[block][k][r] = the input under tap k (k = (c, ky, kx), W's own order) of the
 * block's pixel r (MR pixels a block, the last repeated past P), then the panels of output
 * channels [p0, p1) over the group in `chunks` runs, each tile GEMM_TILE_TP's. Every step on
 * the library's pool. nativeconv._tgemm says where it wins. */
void npr_tconv_ap_avx2(const float *, const float *, float *, const float *, long, long, long, long, long, long);
void npr_tconv_ap_avx512(const float *, const float *, float *, const float *, long, long, long, long, long, long);
void npr_activation(const float *x, float *y, long n, int act, float alpha, float beta);
void *npr_scratch(int slot, size_t bytes);

typedef struct {
    int isa512, chunks, act;
    float alpha, beta;
    const float *ap, *bp, *bias;
    float *y;
    long np, P, K, M, nr, panels;  /* np pixels from y, whose channel planes are P apart */
} tconvk_job;

/* Panels [p0, p1) of a chunk over the group's pixels, then the activation over those pixels of
 * the panels' channels (act.h's, lane by lane: the bits whatever the group or piece). */
static void tconvk_chunk(void *ctx, int i)
{
    tconvk_job *j = ctx;
    long p0 = par_at(0, j->panels, i, j->chunks), p1 = par_at(0, j->panels, i + 1, j->chunks);
    if (p1 <= p0) return;
    (j->isa512 ? npr_tconv_ap_avx512 : npr_tconv_ap_avx2)(j->ap, j->bp, j->y, j->bias, j->np, j->P, j->K, j->M,
                                                          p0, p1);
    if (j->act) {
        long m1 = p1 * j->nr < j->M ? p1 * j->nr : j->M;
        for (long m = p0 * j->nr; m < m1; m++)
            npr_activation(j->y + m * j->P, j->y + m * j->P, j->np, j->act, j->alpha, j->beta);
    }
}

#ifndef TCONVK_GROUP_BYTES
/* packed pixels a group holds: a 7x7 map from 256 channels x 3x3 in one group (so the weights
 * stream once), a 112x112 one (ResNet's 7x7 stem) in groups of ~1,800 pixels */
#define TCONVK_GROUP_BYTES (1L << 20)
#endif

/* The zero-padded copy of one image (channels [lo, hi) of a chunk) and the packing of a group's
 * blocks (blocks [lo, hi)), each on the pool like the product: at 2 threads the serial copy and
 * packing held YOLOv8n's convs back (1.10x its time before the transposed product). */
typedef struct {
    const float *x;
    float *xp, *ap;
    const long *toff;
    long C, H, W, Hp, Wp, pt, pl, K, P, Wo, sh, sw, q0, nb;
    long limit;  /* floats readable from xp (a vector load may read past a tap's last) */
    int mr, chunks;
} tpack_job;

static void tpad_chunk(void *ctx, int i)
{
    tpack_job *j = ctx;
    long lo = par_at(0, j->C, i, j->chunks), hi = par_at(0, j->C, i + 1, j->chunks);
    for (long c = lo; c < hi; c++)
        for (long r = 0; r < j->Hp; r++) {
            float *d = j->xp + (c * j->Hp + r) * j->Wp;
            long iy = r - j->pt;
            if (iy < 0 || iy >= j->H) { memset(d, 0, sizeof(float) * j->Wp); continue; }
            const float *s = j->x + (c * j->H + iy) * j->W;
            for (long q = 0; q < j->Wp; q++) {
                long ix = q - j->pl;
                d[q] = ix >= 0 && ix < j->W ? s[ix] : 0.0f;
            }
        }
}

static void tpack_chunk(void *ctx, int i)
{
    tpack_job *j = ctx;
    long lo = par_at(0, j->nb, i, j->chunks), hi = par_at(0, j->nb, i + 1, j->chunks);
    const int mr = j->mr;
    long off[8];
    for (long b = lo; b < hi; b++) {
        long q0 = j->q0 + b * mr;
        for (int r = 0; r < mr; r++) {
            long q = q0 + r < j->P ? q0 + r : j->P - 1;
            off[r] = (q / j->Wo) * j->sh * j->Wp + (q % j->Wo) * j->sw;
        }
        float *d = j->ap + b * j->K * mr;
        long k = 0;
        /* A block of pixels in one output row reads, under each tap, mr floats sw apart: one
         * vector (sw 1) or the evens of two (sw 2), stored whole; 8 floats where a block has
         * 6 (AVX2), so the last tap's are written one by one (the next block may be another
         * thread's). Scalar elsewhere: a block across rows, other strides, and the taps whose
         * vector would read past `limit` (taps read in increasing order). */
        if ((j->sw == 1 || j->sw == 2) && q0 + mr <= j->P && q0 % j->Wo + mr <= j->Wo) {
            long kv = mr == 8 ? j->K : j->K - 1, span = j->sw == 1 ? 8 : 16;
            if (j->sw == 1)
                for (; k < kv && j->toff[k] + off[0] + span <= j->limit; k++, d += mr)
                    _mm256_storeu_ps(d, _mm256_loadu_ps(j->xp + j->toff[k] + off[0]));
            else
                for (; k < kv && j->toff[k] + off[0] + span <= j->limit; k++, d += mr)
                    _mm256_storeu_ps(d, npr_evens8(j->xp + j->toff[k] + off[0]));
        }
        for (; k < j->K; k++, d += mr) {
            const float *s = j->xp + j->toff[k];
            for (int r = 0; r < mr; r++) d[r] = s[off[r]];
        }
    }
}

/* Pixel blocks [u0, u1) of the n images' n * blocks (block u: image u / blocks, pixels
 * MR * (u % blocks) on), all channels, with the activation: the whole conv, or a piece of it
 * between preemption points (ranges of pixels; every tile is computed as in the whole call). */
int npr_tconvk_range_mt(int isa512, const float *x, long n, long C, long H, long W, int kh, int kw, int sh, int sw,
                        int dh, int dw, int pt, int pl, long Ho, long Wo, const float *Bp, float *y,
                        const float *bias, long M, int act, float alpha, float beta, long u0, long u1, int threads,
                        int chunks)
{
    const int mr = isa512 ? 8 : 6;
    const long P = Ho * Wo, taps = (long)kh * kw, K = C * taps, blocks = (P + mr - 1) / mr;
    const long nr = isa512 ? 32 : 16, panels = (M + nr - 1) / nr;  /* output-channel panels (GEMM_NR) */
    long Hp = (Ho - 1) * sh + (long)(kh - 1) * dh + 1, Wp = (Wo - 1) * sw + (long)(kw - 1) * dw + 1;
    /* no tap outside the input: read it in place, its own pitches */
    int in_place = pt == 0 && pl == 0 && Hp <= H && Wp <= W;
    if (in_place) Hp = H, Wp = W;
    long gb = TCONVK_GROUP_BYTES / ((long)sizeof(float) * mr * K);  /* blocks a group */
    if (gb < 1) gb = 1;
    if (gb > blocks) gb = blocks;
    size_t xn = in_place ? 0 : (size_t)(C * Hp * Wp), an = (size_t)(gb * K * mr);
    float *buf = npr_scratch(1, sizeof(float) * (xn + an) + sizeof(long) * (size_t)K);
    if (!buf) return -1;
    float *xp = buf, *ap = buf + xn;
    long *toff = (long *)(ap + an);
    for (long c = 0; c < C; c++)
        for (int ky = 0; ky < kh; ky++)
            for (int kx = 0; kx < kw; kx++)
                toff[(c * kh + ky) * kw + kx] = (c * Hp + (long)ky * dh) * Wp + (long)kx * dw;
    int pc = threads > 1 ? 2 * threads : 1;  /* chunks of the copy and of the packing */
    for (long i = u0 / blocks; i < n && i * blocks < u1; i++) {
        long b_lo = u0 > i * blocks ? u0 - i * blocks : 0, b_hi = u1 - i * blocks < blocks ? u1 - i * blocks : blocks;
        const float *xi = x + i * C * H * W;
        /* (padded: the packed blocks follow the copy in the buffer, so a vector may run on) */
        tpack_job pj = {xi, in_place ? (float *)xi : xp, ap, toff, C, H, W, Hp, Wp, pt, pl, K, P, Wo, sh, sw, 0, 0,
                        in_place ? (n - i) * C * H * W : (long)(xn + an), mr, (int)(C < pc ? C : pc)};
        if (!in_place)
            par_run(tpad_chunk, &pj, pj.chunks, threads);
        /* groups of gb blocks: packed, then every panel over them (a tile's bits do not
         * depend on its group) */
        for (long b0 = b_lo; b0 < b_hi; b0 += gb) {
            long nb = b_hi - b0 < gb ? b_hi - b0 : gb, q0 = b0 * mr;
            pj.q0 = q0, pj.nb = nb, pj.chunks = (int)(nb < pc ? nb : pc);
            par_run(tpack_chunk, &pj, pj.chunks, threads);
            /* the group's pixels [q0, q0 + np) as a map of its own: rows P apart in y */
            long np = P - q0 < nb * mr ? P - q0 : nb * mr;
            tconvk_job j = {isa512, chunks, act, alpha, beta, ap, Bp, bias, y + i * M * P + q0, np, P, K, M, nr,
                            panels};
            par_run(tconvk_chunk, &j, chunks, threads);
        }
    }
    return 0;
}

/* A grouped conv as the transposed product: `jobs` (image, group) pairs [j0, j1) of the n * G,
 * each group's channels a conv of their own (input channels [g Cg, (g+1) Cg), output ones
 * [g Mg, (g+1) Mg)) with its W^T packed at Bp + g * (its panels) * K * NR and its bias padded
 * likewise. With more than one thread the pairs go to the threads whole, each run by one
 * thread start to finish (its padded copy and packing in its own scratch): a dense conv per
 * group with both threads on each paid a fork-join per group and per packing step (RegNet-Y's
 * 8 groups of 64 channels on 14x14: 1.40x ORT's time at 2 threads, 1.26x at 1). Each pair is
 * computed as npr_tconvk_range_mt computes it alone, so the bits do not depend on the threads
 * or on the range. */
typedef struct {
    int isa512;
    const float *x, *bp, *bias;
    float *y;
    long G, Cg, H, W, Mg, Ho, Wo, wstep, bstep;
    int kh, kw, sh, sw, dh, dw, pt, pl, act;
    float alpha, beta;
    long j0, j1;
    int chunks;
    atomic_int rc;
} tgroups_job;

static void tgroups_chunk(void *ctx, int i)
{
    tgroups_job *j = ctx;
    long lo = par_at(j->j0, j->j1, i, j->chunks), hi = par_at(j->j0, j->j1, i + 1, j->chunks);
    long P = j->Ho * j->Wo, mr = j->isa512 ? 8 : 6, blocks = (P + mr - 1) / mr;
    for (long q = lo; q < hi; q++) {
        long g = q % j->G;
        if (npr_tconvk_range_mt(j->isa512, j->x + q * j->Cg * j->H * j->W, 1, j->Cg, j->H, j->W, j->kh, j->kw, j->sh,
                                j->sw, j->dh, j->dw, j->pt, j->pl, j->Ho, j->Wo, j->bp + g * j->wstep,
                                j->y + q * j->Mg * P, j->bias + g * j->bstep, j->Mg, j->act, j->alpha, j->beta, 0,
                                blocks, 1, 1))
            atomic_store(&j->rc, -1);
    }
}

int npr_tconvk_groups_mt(int isa512, const float *x, long n, long G, long Cg, long H, long W, int kh, int kw, int sh,
                         int sw, int dh, int dw, int pt, int pl, long Ho, long Wo, const float *Bp, float *y,
                         const float *bias, long Mg, int act, float alpha, float beta, long j0, long j1, int threads)
{
    const long nr = isa512 ? 32 : 16, panels = (Mg + nr - 1) / nr, K = Cg * kh * kw;
    if (j1 > n * G) j1 = n * G;
    if (j1 <= j0) return 0;
    long jobs = j1 - j0;
    tgroups_job j = {isa512, x, Bp, bias, y, G, Cg, H, W, Mg, Ho, Wo, panels * K * nr, panels * nr,
                     kh, kw, sh, sw, dh, dw, pt, pl, act, alpha, beta, j0, j1,
                     (int)(threads > 1 ? (jobs < 2 * threads ? jobs : 2 * threads) : 1), 0};
    par_run(tgroups_chunk, &j, j.chunks, threads);
    return atomic_load(&j.rc);
}

/* ---- The elementwise and row kernels of transformer.c (erf, GELU, LayerNorm, masked softmax)
 * on the same pool: `chunks` equal ranges of elements or rows. MiniLM's GELU over (128, 1536)
 * took 0.2 ms on one thread and no less on two through the Program's Python pool. */
void npr_erf(const float *, float *, long);
void npr_gelu(const float *, float *, long, float, float, float, int);
void npr_layernorm(const float *, const float *, const float *, float *, float *, float *, long, long, long, float);
void npr_softmax(const float *, const float *, float *, long, long, long, long, long, int, float);
void npr_softmax_avx512(const float *, const float *, float *, long, long, long, long, long, int, float);

enum { TR_ERF, TR_GELU, TR_LAYERNORM, TR_SOFTMAX };

typedef struct {
    int kind, mode, fix, chunks;
    const float *x, *p, *q;  /* p, q: scale and bias (LayerNorm), mask (softmax) */
    float *y, *mean, *inv;
    long total, n, div, mrows;  /* total: elements (erf, GELU) or rows */
    float d, a, m, eps;
} tr_job;

static void tr_chunk(void *ctx, int i)
{
    tr_job *j = ctx;
    long lo = par_at(0, j->total, i, j->chunks), hi = par_at(0, j->total, i + 1, j->chunks);
    if (hi <= lo) return;
    switch (j->kind) {
    case TR_ERF: npr_erf(j->x + lo, j->y + lo, hi - lo); break;
    case TR_GELU: npr_gelu(j->x + lo, j->y + lo, hi - lo, j->d, j->a, j->m, j->mode); break;
    case TR_LAYERNORM: npr_layernorm(j->x, j->p, j->q, j->y, j->mean, j->inv, lo, hi, j->n, j->eps); break;
    default: (j->mode ? npr_softmax_avx512 : npr_softmax)(j->x, j->p, j->y, lo, hi, j->n, j->div, j->mrows, j->fix, j->d);
        break;
    }
}

void npr_erf_mt(const float *x, float *y, long n, int threads, int chunks)
{
    tr_job j = {.kind = TR_ERF, .chunks = chunks, .x = x, .y = y, .total = n};
    par_run(tr_chunk, &j, chunks, threads);
}

void npr_gelu_mt(const float *x, float *y, long n, float d, float a, float m, int mode, int threads, int chunks)
{
    tr_job j = {.kind = TR_GELU, .mode = mode, .chunks = chunks, .x = x, .y = y, .total = n, .d = d, .a = a, .m = m};
    par_run(tr_chunk, &j, chunks, threads);
}

void npr_layernorm_mt(const float *x, const float *scale, const float *bias, float *y, float *mean, float *inv,
                      long rows, long n, float eps, int threads, int chunks)
{
    tr_job j = {.kind = TR_LAYERNORM, .chunks = chunks, .x = x, .p = scale, .q = bias, .y = y, .mean = mean,
                .inv = inv, .total = rows, .n = n, .eps = eps};
    par_run(tr_chunk, &j, chunks, threads);
}

void npr_softmax_mt(const float *x, const float *mask, float *y, long rows, long n, long div, long mrows,
                    int fix, float nan_to, int threads, int chunks, int avx512)
{
    tr_job j = {.kind = TR_SOFTMAX, .mode = avx512, .fix = fix, .chunks = chunks, .x = x, .p = mask, .y = y, .total = rows,
                .n = n, .div = div, .mrows = mrows, .d = nan_to};
    par_run(tr_chunk, &j, chunks, threads);
}

/* ---- Batched C[t] = A[t] @ B[t] (attention's Q @ K^T and P @ V: (12, 128, 32) @ (12, 32, 128)
 * and back in MiniLM), B changing every run: each item's B is packed into the chunk's own
 * panel buffer, then the packed sgemm runs it; items are claimed one at a time from the pool.
 * B is read where it lies: items `bitem` floats apart, rows `brow` apart, or (tb) given as
 * the transposes of N x K items (attention's keys for Q @ K^T): a view of heads side by side
 * is packed with no contiguous copy first. */
#include <stdlib.h>
void npr_gemm_pack_avx2(const float *, float *, long, long);
void npr_gemm_pack_avx512(const float *, float *, long, long);
void npr_gemm_pack_t_avx2(const float *, long, float *, long, long);
void npr_gemm_pack_t_avx512(const float *, long, float *, long, long);
void npr_gemm_pack_ld_avx2(const float *, long, float *, long, long);
void npr_gemm_pack_ld_avx512(const float *, long, float *, long, long);
int npr_gemm_nr_avx2(void);
int npr_gemm_nr_avx512(void);

typedef struct {
    int isa512, tb;  /* tb: each item's B given as its transpose, N x K rows (attention's keys) */
    const float *a, *b;
    float *c;
    long batch, M, K, N, bitem, brow;  /* B's items and rows bitem and brow floats apart */
    atomic_int rc;
} bmm_job;

static void bmm_chunk(void *ctx, int t)
{
    bmm_job *j = ctx;
    long nr = j->isa512 ? npr_gemm_nr_avx512() : npr_gemm_nr_avx2(), panels = (j->N + nr - 1) / nr;
    float *bp = aligned_alloc(64, (size_t)((panels * j->K * nr * sizeof(float) + 63) & ~63UL));
    if (!bp) { atomic_store(&j->rc, -1); return; }
    const float *b = j->b + t * j->bitem;
    if (j->tb)
        (j->isa512 ? npr_gemm_pack_t_avx512 : npr_gemm_pack_t_avx2)(b, j->brow, bp, j->K, j->N);
    else
        (j->isa512 ? npr_gemm_pack_ld_avx512 : npr_gemm_pack_ld_avx2)(b, j->brow, bp, j->K, j->N);
    (j->isa512 ? npr_gemm_avx512 : npr_gemm_avx2)(j->a + t * j->M * j->K, bp, j->c + t * j->M * j->N, NULL, NULL,
                                                  j->M, j->K, j->N, 0, panels);
    free(bp);
}

int npr_bmm_mt(int isa512, const float *A, const float *B, float *C, long batch, long M, long K, long N, int threads,
               int tb, long bitem, long brow)
{
    bmm_job j = {isa512, tb, A, B, C, batch, M, K, N, bitem, brow, 0};
    par_run(bmm_chunk, &j, (int)batch, threads);
    return atomic_load(&j.rc);
}
