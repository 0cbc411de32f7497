/* Fused elementwise chains of npurun's cpu backend (ops/fused.py, made by passes/fuse_affine_chain.py): one pass
 * over memory for what the graph writes as several elementwise nodes, e.g. PP-LCNet's
 * "learnable affine" after an activation, s1 * hard_swish(s0 * x + t0) + t1 (4-8 nodes).
 *
 *   y[i] = s1 * act(s0 * x[i] + t0) + t1,   i in [0, n)   (y may be x)
 *
 * act is an activation code of act.h (0 = none; its alpha, beta as for the conv epilogue). */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <math.h>
#include <string.h>
#include "act.h"
#include "par.h"

void npr_affine_act(const float *x, float *y, long n, float s0, float t0, int act, float alpha,
                    float beta, float s1, float t1)
{
    __m256 a0 = _mm256_set1_ps(s0), b0 = _mm256_set1_ps(t0), a1 = _mm256_set1_ps(s1),
           b1 = _mm256_set1_ps(t1), al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    long i = 0;
    /* each multiply and add rounded on its own, as the Mul and Add nodes it replaced round them
     * (an FMA's single rounding differs by an ulp now and then, and a dynamically quantized
     * model carries such an ulp across a quantization step on: PP-OCRv5 det after ONNX
     * Runtime's quantize_dynamic came out 0.99 off ORT's on some pixels, 0.03 op by op) */
    for (; i + 16 <= n; i += 16) {
        __m256 u = _mm256_add_ps(_mm256_mul_ps(a0, _mm256_loadu_ps(x + i)), b0);
        __m256 v = _mm256_add_ps(_mm256_mul_ps(a0, _mm256_loadu_ps(x + i + 8)), b0);
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(a1, npr_act(u, act, al, be)), b1));
        _mm256_storeu_ps(y + i + 8, _mm256_add_ps(_mm256_mul_ps(a1, npr_act(v, act, al, be)), b1));
    }
    for (; i < n; i += 8) {
        float t[8] = {0};
        long k = n - i < 8 ? n - i : 8;
        memcpy(t, x + i, sizeof(float) * k);
        __m256 u = _mm256_add_ps(_mm256_mul_ps(a0, _mm256_loadu_ps(t)), b0);
        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_mul_ps(a1, npr_act(u, act, al, be)), b1));
        memcpy(y + i, t, sizeof(float) * k);
    }
}

/* Per-channel ops over x laid out (outer, C, inner): channel c of every outer index is a run
 * of `inner` contiguous floats (NCHW: outer = N, inner = H*W). */

/* y = act(x * s[c] + t[c]): an inference BatchNorm standing alone (after a concat, before an
 * activation: DenseNet, pre-activation ResNets), a per-channel scale and shift. s or t NULL
 * means 1 or 0. */
void npr_channel_affine_act(const float *x, float *y, long outer, long C, long inner, const float *s,
                            const float *t, int act, float alpha, float beta)
{
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    for (long o = 0; o < outer; o++)
        for (long c = 0; c < C; c++) {
            const float *xs = x + (o * C + c) * inner;
            float *ys = y + (o * C + c) * inner;
            __m256 a = _mm256_set1_ps(s ? s[c] : 1.0f), b = _mm256_set1_ps(t ? t[c] : 0.0f);
            long i = 0;
            for (; i + 8 <= inner; i += 8)
                _mm256_storeu_ps(ys + i, npr_act(_mm256_fmadd_ps(a, _mm256_loadu_ps(xs + i), b), act, al, be));
            if (i < inner) {
                float tmp[8] = {0};
                long k = inner - i;
                memcpy(tmp, xs + i, sizeof(float) * k);
                _mm256_storeu_ps(tmp, npr_act(_mm256_fmadd_ps(a, _mm256_loadu_ps(tmp), b), act, al, be));
                memcpy(ys + i, tmp, sizeof(float) * k);
            }
        }
}

/* y = x >= 0 ? x : slope[c] * x: PRelu with one slope per channel (MTCNN, ArcFace-style face
 * models put it after every conv). */
void npr_prelu_channels(const float *x, float *y, long outer, long C, long inner, const float *slope)
{
    __m256 zero = _mm256_setzero_ps();
    for (long o = 0; o < outer; o++)
        for (long c = 0; c < C; c++) {
            const float *xs = x + (o * C + c) * inner;
            float *ys = y + (o * C + c) * inner;
            __m256 a = _mm256_set1_ps(slope[c]);
            long i = 0;
            for (; i + 8 <= inner; i += 8) {
                __m256 v = _mm256_loadu_ps(xs + i);
                _mm256_storeu_ps(ys + i, _mm256_blendv_ps(v, _mm256_mul_ps(v, a), _mm256_cmp_ps(v, zero, _CMP_LT_OQ)));
            }
            for (; i < inner; i++)
                ys[i] = xs[i] < 0 ? slope[c] * xs[i] : xs[i];
        }
}


/* y = act(a + b) over n floats (passes/fuse_add_activation.py: a residual add and the
 * activation after it, one pass over memory instead of two; y may be a or b). */
static void add_act(const float *a, const float *b, float *y, long n, int act, float alpha, float beta)
{
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 u = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
        _mm256_storeu_ps(y + i, npr_act(u, act, al, be));
        _mm256_storeu_ps(y + i + 8, npr_act(v, act, al, be));
    }
    for (; i < n; i += 8) {
        float t[8] = {0}, r[8] = {0};
        long k = n - i < 8 ? n - i : 8;
        memcpy(t, a + i, sizeof(float) * k);
        memcpy(r, b + i, sizeof(float) * k);
        _mm256_storeu_ps(t, npr_act(_mm256_add_ps(_mm256_loadu_ps(t), _mm256_loadu_ps(r)), act, al, be));
        memcpy(y + i, t, sizeof(float) * k);
    }
}

typedef struct { const float *a, *b; float *y; long n; int act; float alpha, beta; int chunks; } add_job;

static void add_chunk(void *ctx, int i)
{
    add_job *j = ctx;
    /* chunk edges on whole vectors (16 floats), so each element is computed as in one call */
    long lo = par_at(0, j->n / 16, i, j->chunks) * 16, hi = i + 1 == j->chunks ? j->n : par_at(0, j->n / 16, i + 1, j->chunks) * 16;
    if (hi > lo) add_act(j->a + lo, j->b + lo, j->y + lo, hi - lo, j->act, j->alpha, j->beta);
}

/* The same in `chunks` contiguous parts on the library's pool (one chunk: this thread). */
void npr_add_act_mt(const float *a, const float *b, float *y, long n, int act, float alpha, float beta,
                    int threads, int chunks)
{
    add_job j = {a, b, y, n, act, alpha, beta, chunks};
    par_run(add_chunk, &j, chunks, threads);
}

/* y = act(x * s[c] + t[c]) over x laid out (outer, C, inner), the product and the sum rounded
 * each (not one FMA), so the same floats as the unfused mul, add and activation nodes
 * (passes/fuse_channel_affine.py: a BatchNorm written out by hand with nothing before it to
 * fold into, DenseNet's and pre-activation ResNets'). s or t NULL: 1 or 0 (that step skipped).
 * Channel runs [r0, r1) of the outer * C runs. */
static void channel_affine(const float *x, float *y, long C, long inner, const float *s, const float *t,
                           int act, float alpha, float beta, long r0, long r1)
{
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    for (long r = r0; r < r1; r++) {
        long c = r % C;
        const float *xs = x + r * inner;
        float *ys = y + r * inner;
        __m256 a = _mm256_set1_ps(s ? s[c] : 1.0f), b = _mm256_set1_ps(t ? t[c] : 0.0f);
        long i = 0;
        for (; i < inner; i += 8) {
            long k = inner - i < 8 ? inner - i : 8;
            float tmp[8] = {0};
            __m256 v;
            if (k == 8) v = _mm256_loadu_ps(xs + i);
            else { memcpy(tmp, xs + i, sizeof(float) * k); v = _mm256_loadu_ps(tmp); }
            if (s) v = _mm256_mul_ps(v, a);
            if (t) v = _mm256_add_ps(v, b);
            v = npr_act(v, act, al, be);
            if (k == 8) _mm256_storeu_ps(ys + i, v);
            else { _mm256_storeu_ps(tmp, v); memcpy(ys + i, tmp, sizeof(float) * k); }
        }
    }
}

typedef struct { const float *x; float *y; long C, inner; const float *s, *t; int act; float alpha, beta; long runs;
                 int chunks; } chaff_job;

static void chaff_chunk(void *ctx, int i)
{
    chaff_job *j = ctx;
    long r0 = par_at(0, j->runs, i, j->chunks), r1 = par_at(0, j->runs, i + 1, j->chunks);
    if (r1 > r0) channel_affine(j->x, j->y, j->C, j->inner, j->s, j->t, j->act, j->alpha, j->beta, r0, r1);
}

/* channel_affine over every run, in `chunks` parts of whole channel runs on the pool. */
void npr_channel_affine_mt(const float *x, float *y, long outer, long C, long inner, const float *s, const float *t,
                           int act, float alpha, float beta, int threads, int chunks)
{
    chaff_job j = {x, y, C, inner, s, t, act, alpha, beta, outer * C, chunks};
    par_run(chaff_chunk, &j, chunks, threads);
}


/* y = a op b, NumPy's broadcasting (ops/elementwise_pieces.py in a replayed program, where a
 * call costs less than NumPy's dispatch): y is contiguous of shape[nd], sa and sb are a's and
 * b's strides in floats (0 along a broadcast axis). op: 0 add, 1 sub, 2 mul, 3 div, 4 max,
 * 5 min. Each element is one IEEE operation, as NumPy's; max and min return a NaN operand
 * and, between equal operands (+0 and -0), the second, as NumPy's vector loops (maxps). */
#define BIN_LOOP(EXPR)                                                                     \
    if (ia == 1 && ib == 1)                                                                \
        for (long i = 0; i < n; i++) { float p = a[i], q = b[i]; y[i] = (EXPR); }          \
    else if (ia == 1 && ib == 0) {                                                         \
        float q = b[0];                                                                    \
        for (long i = 0; i < n; i++) { float p = a[i]; y[i] = (EXPR); }                    \
    } else if (ia == 0 && ib == 1) {                                                       \
        float p = a[0];                                                                    \
        for (long i = 0; i < n; i++) { float q = b[i]; y[i] = (EXPR); }                    \
    } else                                                                                 \
        for (long i = 0; i < n; i++) { float p = a[i * ia], q = b[i * ib]; y[i] = (EXPR); }

static void binary_row(int op, const float *a, long ia, const float *b, long ib, float *y, long n)
{
    switch (op) {
    case 0: BIN_LOOP(p + q) break;
    case 1: BIN_LOOP(p - q) break;
    case 2: BIN_LOOP(p * q) break;
    case 3: BIN_LOOP(p / q) break;
    case 4: BIN_LOOP((p > q || p != p) ? p : q) break;
    default: BIN_LOOP((p < q || p != p) ? p : q) break;
    }
}

void npr_binary(int op, const float *a, const float *b, float *y, int nd, const long *shape,
                const long *sa, const long *sb)
{
    long n = shape[nd - 1], idx[16] = {0}, rows = 1;
    for (int d = 0; d < nd - 1; d++)
        rows *= shape[d];
    for (long r = 0; r < rows; r++) {
        long oa = 0, ob = 0;
        for (int d = 0; d < nd - 1; d++)
            oa += idx[d] * sa[d], ob += idx[d] * sb[d];
        binary_row(op, a + oa, sa[nd - 1], b + ob, sb[nd - 1], y + r * n, n);
        for (int d = nd - 2; d >= 0 && ++idx[d] == shape[d]; d--)  /* the next row's index */
            idx[d] = 0;
    }
}

typedef struct { int op, nd, chunks; const float *a, *b; float *y; const long *shape, *sa, *sb; long rows, n; } bin_job;

/* Rows [r0, r1) of npr_binary's, each over its columns [c0, c1). */
static void binary_rows(const bin_job *j, long r0, long r1, long c0, long c1)
{
    int nd = j->nd;
    long idx[16] = {0}, r = r0;
    for (int d = nd - 2; d >= 0; d--) { idx[d] = r % j->shape[d]; r /= j->shape[d]; }
    long ia = j->sa[nd - 1], ib = j->sb[nd - 1];
    for (r = r0; r < r1; r++) {
        long oa = 0, ob = 0;
        for (int d = 0; d < nd - 1; d++)
            oa += idx[d] * j->sa[d], ob += idx[d] * j->sb[d];
        binary_row(j->op, j->a + oa + c0 * ia, ia, j->b + ob + c0 * ib, ib, j->y + r * j->n + c0, c1 - c0);
        for (int d = nd - 2; d >= 0 && ++idx[d] == j->shape[d]; d--)
            idx[d] = 0;
    }
}

static void bin_chunk(void *ctx, int i)
{
    bin_job *j = ctx;
    if (j->rows >= j->chunks) {  /* whole rows a chunk */
        long r0 = par_at(0, j->rows, i, j->chunks), r1 = par_at(0, j->rows, i + 1, j->chunks);
        if (r1 > r0) binary_rows(j, r0, r1, 0, j->n);
    } else {  /* few long rows: every row, a range of its columns (16 apart) */
        long c0 = par_at(0, j->n / 16, i, j->chunks) * 16, c1 = i + 1 == j->chunks ? j->n : par_at(0, j->n / 16, i + 1, j->chunks) * 16;
        if (c1 > c0) binary_rows(j, 0, j->rows, c0, c1);
    }
}

/* npr_binary in `chunks` parts on the pool (the same elements, each one operation: the same
 * bits). NumPy's ufuncs run on one thread: a model's large adds and products (FocalNet's
 * modulations, SqueezeBERT's residuals) did not speed up at 2 threads. */
void npr_binary_mt(int op, const float *a, const float *b, float *y, int nd, const long *shape,
                   const long *sa, const long *sb, int threads, int chunks)
{
    long rows = 1;
    for (int d = 0; d < nd - 1; d++)
        rows *= shape[d];
    bin_job j = {op, nd, chunks, a, b, y, shape, sa, sb, rows, shape[nd - 1]};
    par_run(bin_chunk, &j, chunks, threads);
}


/* y = f(x) over n floats (ops/unary.py in a replayed program). op: 0 sqrt, 1 reciprocal, 2 neg,
 * 3 abs, 4 exp, 5 log, 6 sin, 7 cos, 8 floor, 9 ceil. sqrt, reciprocal, neg, abs, floor and
 * ceil are exact, as NumPy's; exp, log, sin and cos are libm's (within an ulp or two of
 * NumPy's own vector versions). */
void npr_unary(int op, const float *x, float *y, long n)
{
    switch (op) {
    case 0: for (long i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
    case 1: for (long i = 0; i < n; i++) y[i] = 1.0f / x[i]; break;
    case 2: for (long i = 0; i < n; i++) y[i] = -x[i]; break;
    case 3: for (long i = 0; i < n; i++) y[i] = fabsf(x[i]); break;
    case 4: for (long i = 0; i < n; i++) y[i] = expf(x[i]); break;
    case 5: for (long i = 0; i < n; i++) y[i] = logf(x[i]); break;
    case 6: for (long i = 0; i < n; i++) y[i] = sinf(x[i]); break;
    case 7: for (long i = 0; i < n; i++) y[i] = cosf(x[i]); break;
    case 8: for (long i = 0; i < n; i++) y[i] = floorf(x[i]); break;
    default: for (long i = 0; i < n; i++) y[i] = ceilf(x[i]); break;
    }
}
