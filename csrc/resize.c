/* Interpolating resize of the cpu backend (npurun/backends/cpu/ops/vision.py), one axis at a
 * time: x is (outer, n_in, inner) float32, y is (outer, n_out, inner), and each output
 * position j of the axis sums k taps of the input:
 *
 *     y[o, j, i] = sum_t w[j, t] * x[o, idx[j, t], i]
 *
 * with the taps' indices and weights the reference kernel's own (linear: 2, cubic: 4, more
 * with antialias). The inner loop runs over `inner` (the axes after the resized one: a row of
 * W floats when the H axis is resized), which the compiler vectorizes; the last axis
 * (inner = 1) is one small dot product per output. */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <stddef.h>
#include "par.h"

void npr_resize_axis(const float *x, float *y, long outer, long n_in, long inner, long n_out,
                     const long *idx, const float *w, int k)
{
    for (long o = 0; o < outer; o++) {
        const float *xo = x + o * n_in * inner;
        float *yo = y + o * n_out * inner;
        if (inner == 1) {
            for (long j = 0; j < n_out; j++) {
                float s = 0.0f;
                for (int t = 0; t < k; t++) s += w[j * k + t] * xo[idx[j * k + t]];
                yo[j] = s;
            }
            continue;
        }
        for (long j = 0; j < n_out; j++) {
            float *yr = yo + j * inner;
            const float *x0 = xo + idx[j * k] * inner;
            const float w0 = w[j * k];
            for (long i = 0; i < inner; i++) yr[i] = w0 * x0[i];
            for (int t = 1; t < k; t++) {
                const float *xt = xo + idx[j * k + t] * inner;
                const float wt = w[j * k + t];
                for (long i = 0; i < inner; i++) yr[i] += wt * xt[i];
            }
        }
    }
}

/* ---- The same over the library's pool: the outer slices (channels of the images) in `chunks`
 * parts, each npr_resize_axis on its own slices, so the result is the one call's. */
typedef struct { const float *x; float *y; long outer, n_in, inner, n_out; const long *idx; const float *w; int k, chunks; } rs_job;

static void rs_chunk(void *ctx, int i)
{
    rs_job *j = ctx;
    long o0 = par_at(0, j->outer, i, j->chunks), o1 = par_at(0, j->outer, i + 1, j->chunks);
    if (o1 > o0)
        npr_resize_axis(j->x + o0 * j->n_in * j->inner, j->y + o0 * j->n_out * j->inner, o1 - o0, j->n_in,
                        j->inner, j->n_out, j->idx, j->w, j->k);
}

void npr_resize_axis_mt(const float *x, float *y, long outer, long n_in, long inner, long n_out,
                        const long *idx, const float *w, int k, int threads, int chunks)
{
    rs_job j = {x, y, outer, n_in, inner, n_out, idx, w, k, chunks};
    par_run(rs_chunk, &j, chunks, threads);
}
