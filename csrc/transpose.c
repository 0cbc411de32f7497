/* Batched 2-D transposes of float32, for turning a transposed view into a contiguous array
 * (npurun/backends/cpu/native.py `contiguous`): dst[b][c][r] = src[b][r][c].
 *
 * Why: NumPy copies a view in the destination's order, so a view whose inner axis has a large
 * stride (a (1, 4096, 256) token map seen as (1, 256, 4096) channels, SegFormer's and
 * ConvNeXt's NHWC <-> NCHW steps) reads one float per cache line: 8 ms for 4 MB on the
 * development VM. Here 8x8 blocks are moved through AVX registers, 64 x 64 tiles at a time so a
 * tile's source and destination lines stay in L1, tiles split over the library's pool. */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <immintrin.h>
#include <string.h>
#include "par.h"
#include "transpose8.h"

#define TT 64  /* tile edge */

/* the 8x8 block at (r, c) of a rows x cols matrix with source row pitch sp into dst (pitch dp) */
static inline void block8(const float *s, long sp, float *d, long dp)
{
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(s + i * sp);
    npr_transpose8(r);
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + i * dp, r[i]);
}

typedef struct { const float *src; float *dst; long batch, rows, cols, sb, sr; long tr, tc; int chunks; } tr_job;

/* tiles [t0, t1) of all batch * tr * tc tiles */
static void tr_tiles(const tr_job *j, long t0, long t1)
{
    for (long t = t0; t < t1; t++) {
        long b = t / (j->tr * j->tc), rem = t % (j->tr * j->tc);
        long r0 = rem / j->tc * TT, c0 = rem % j->tc * TT;
        long r1 = r0 + TT < j->rows ? r0 + TT : j->rows, c1 = c0 + TT < j->cols ? c0 + TT : j->cols;
        const float *s = j->src + b * j->sb;
        float *d = j->dst + b * j->rows * j->cols;
        long r = r0;
        for (; r + 8 <= r1; r += 8) {
            long c = c0;
            for (; c + 8 <= c1; c += 8) block8(s + r * j->sr + c, j->sr, d + c * j->rows + r, j->rows);
            for (; c < c1; c++)
                for (long k = r; k < r + 8; k++) d[c * j->rows + k] = s[k * j->sr + c];
        }
        for (; r < r1; r++)
            for (long c = c0; c < c1; c++) d[c * j->rows + r] = s[r * j->sr + c];
    }
}

static void tr_chunk(void *ctx, int i)
{
    tr_job *j = ctx;
    long n = j->batch * j->tr * j->tc;
    tr_tiles(j, par_at(0, n, i, j->chunks), par_at(0, n, i + 1, j->chunks));
}

/* dst (batch, cols, rows), contiguous, from src: batch b's row r, column c at
 * src + b * sb + r * sr + c (columns contiguous). */
void npr_transpose_mt(const float *src, float *dst, long batch, long rows, long cols, long sb, long sr,
                      int threads, int chunks)
{
    tr_job j = {src, dst, batch, rows, cols, sb, sr, (rows + TT - 1) / TT, (cols + TT - 1) / TT, chunks};
    par_run(tr_chunk, &j, chunks, threads);
}


/* y = x for any strided x and y of shape[nd] (strides in bytes, 0 along a broadcast axis of
 * x, negative for a reversed view), elements of `item` bytes: the copies of a replayed
 * program (native.copy_into: a view made contiguous, a concat's parts, a pad's core and
 * borders, an expand), where a call costs less than NumPy's dispatch. y and x do not overlap. */
void npr_copy(char *y, const char *x, int nd, const long *shape, const long *sy, const long *sx, long item)
{
    long n = shape[nd - 1], iy = sy[nd - 1], ix = sx[nd - 1], idx[16] = {0}, rows = 1;
    for (int d = 0; d < nd - 1; d++)
        rows *= shape[d];
    for (long r = 0; r < rows; r++) {
        long oy = 0, ox = 0;
        for (int d = 0; d < nd - 1; d++)
            oy += idx[d] * sy[d], ox += idx[d] * sx[d];
        char *yr = y + oy;
        const char *xr = x + ox;
        if (iy == item && ix == item)
            memcpy(yr, xr, (size_t)(n * item));
        else if (item == 4)
            for (long i = 0; i < n; i++) memcpy(yr + i * iy, xr + i * ix, 4);
        else if (item == 8)
            for (long i = 0; i < n; i++) memcpy(yr + i * iy, xr + i * ix, 8);
        else
            for (long i = 0; i < n; i++) memcpy(yr + i * iy, xr + i * ix, (size_t)item);
        for (int d = nd - 2; d >= 0 && ++idx[d] == shape[d]; d--)
            idx[d] = 0;
    }
}


/* y[o, j, :] = x[o, idx[j], :] for o < outer, j < n: a Gather along one axis of a contiguous x
 * seen as (outer, len, inner bytes), the indices read when called (a replayed program's Gather
 * takes whatever indices the run brings: ops/shape_fast.py). Negative indices count from the
 * end. Returns 0, or 1 (nothing written) for an index out of range: the caller raises. */
int npr_take(char *y, const char *x, const long *idx, long n, long outer, long len, long inner)
{
    for (long j = 0; j < n; j++)
        if (idx[j] < -len || idx[j] >= len)
            return 1;
    for (long o = 0; o < outer; o++)
        for (long j = 0; j < n; j++) {
            long i = idx[j] < 0 ? idx[j] + len : idx[j];
            memcpy(y + (o * n + j) * inner, x + (o * len + i) * inner, (size_t)inner);
        }
    return 0;
}
