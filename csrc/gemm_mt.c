/* Multi-threaded entry points of transformer.c's packed sgemm (npr_gemm_* / npr_gemm_q8_*):
 * the panels of B (columns of C) are split into `chunks` runs and run on the library's one
 * spinning pool (par.h). Why not the Program's Python pool: a MiniLM product takes 0.1-0.4 ms
 * and a hand-off to a Python thread costs tens of microseconds on a 2-vCPU VM, so two
 * threads ran no faster than one (docs/cpu.md, "Transformer encoders"). */
#define _POSIX_C_SOURCE 200809L
#include "par.h"

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
} gemm_job;

static void gemm_chunk(void *ctx, int i)
{
    gemm_job *j = ctx;
    long p0 = j->panels * i / j->chunks, p1 = j->panels * (i + 1) / j->chunks;
    if (p1 <= p0) return;
    if (j->q8)
        (j->isa512 ? npr_gemm_q8_avx512 : npr_gemm_q8_avx2)(j->a, j->bq, j->scale, j->c, j->bias, j->res,
                                                            j->M, j->K, j->N, p0, p1, j->ws + i * j->ws_stride);
    else
        (j->isa512 ? npr_gemm_avx512 : npr_gemm_avx2)(j->a, j->bp, j->c, j->bias, j->res, j->M, j->K, j->N, p0, p1);
}

/* C = A @ B (+ bias) (+ R) over all `panels` panels of packed B, in `chunks` runs on `threads`. */
void npr_gemm_mt(int isa512, const float *A, const float *Bp, float *C, const float *bias, const float *R,
                 long M, long K, long N, long panels, int threads, int chunks)
{
    gemm_job j = {isa512, 0, A, Bp, NULL, bias, R, NULL, C, NULL, M, K, N, panels, 0, chunks};
    par_run(gemm_chunk, &j, chunks, threads);
}

/* The int8-panel variant; ws holds `chunks` widened panels of ws_stride floats each. */
void npr_gemm_q8_mt(int isa512, const float *A, const signed char *Bq, const float *scale, float *C,
                    const float *bias, const float *R, long M, long K, long N, long panels, float *ws,
                    long ws_stride, int threads, int chunks)
{
    gemm_job j = {isa512, 1, A, NULL, scale, bias, R, Bq, C, ws, M, K, N, panels, ws_stride, chunks};
    par_run(gemm_chunk, &j, chunks, threads);
}
