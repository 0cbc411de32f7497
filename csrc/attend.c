/* Attention of a few query rows over a KV cache, in one call (a decode step's; ~20 NumPy ops
 * and their allocations otherwise):
 *
 * npr_gqa_step: GroupQueryAttention for one sequence over a shared KV buffer (npurun/contrib/
 * gqa.py's fast path, the GenAI builder's attention as a generator runs it): for each of the S new tokens,
 * rotary embeddings on its query and key heads, its key and value rows written into the cache
 * buffer at row P + i, then each query head attends to rows 0 .. P + i of its key/value head
 * (head hq reads key/value head hq / (Nq / Nkv)). One call per node instead of ~20 NumPy ops;
 * the products are float32 (AVX2 FMA), the softmax max-subtracted with expf.
 *
 * q: (S, Nq * H), k, v: (S, Nkv * H) rows of the packed or separate projections (strides
 * given); pk, pv: (Nkv, C, H) the buffers (one sequence); cos, sin: the rotary caches' rows
 * for positions P .. P + S - 1 (S x RD/2), RD the rotary dim (0: no rotary); y: (S, Nq * H);
 * work: at least P + S floats. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float dot(const float *a, const float *b, int n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int e = 0;
    for (; e + 16 <= n; e += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e + 8), _mm256_loadu_ps(b + e + 8), acc1);
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    float d = _mm_cvtss_f32(r);
    for (; e < n; e++) d += a[e] * b[e];
    return d;
}

static inline void axpy(float *y, float p, const float *x, int n)
{
    __m256 vp = _mm256_set1_ps(p);
    int e = 0;
    for (; e + 8 <= n; e += 8) _mm256_storeu_ps(y + e, _mm256_fmadd_ps(vp, _mm256_loadu_ps(x + e), _mm256_loadu_ps(y + e)));
    for (; e < n; e++) y[e] += p * x[e];
}

static void rope(float *x, const float *c, const float *s, int rd, int interleaved)
{
    int half = rd / 2;
    for (int j = 0; j < half; j++) {
        int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
        float x1 = x[a], x2 = x[b];
        x[a] = c[j] * x1 - s[j] * x2;
        x[b] = s[j] * x1 + c[j] * x2;
    }
}

void npr_gqa_step(const float *q, long qstride, const float *k, const float *v, long kvstride, float *pk, float *pv,
                  long C, long P, long S, int nq, int nkv, int H, const float *cos, const float *sin, int rd,
                  int interleaved, float scale, float *y, float *work)
{
    int group = nq / nkv;
    float qh[512];
    for (long i = 0; i < S; i++) {
        long row = P + i;
        for (int g = 0; g < nkv; g++) {  /* the token's key and value rows into the buffer */
            float *kr = pk + ((long)g * C + row) * H, *vr = pv + ((long)g * C + row) * H;
            memcpy(kr, k + i * kvstride + (long)g * H, (size_t)H * sizeof(float));
            memcpy(vr, v + i * kvstride + (long)g * H, (size_t)H * sizeof(float));
            if (rd) rope(kr, cos + i * (rd / 2), sin + i * (rd / 2), rd, interleaved);
        }
    }
    for (long i = 0; i < S; i++) {
        long t = P + i + 1;  /* keys this token sees */
        for (int hq = 0; hq < nq; hq++) {
            int g = hq / group;
            memcpy(qh, q + i * qstride + (long)hq * H, (size_t)H * sizeof(float));
            if (rd) rope(qh, cos + i * (rd / 2), sin + i * (rd / 2), rd, interleaved);
            const float *kb = pk + (long)g * C * H, *vb = pv + (long)g * C * H;
            float m = -INFINITY;
            for (long j = 0; j < t; j++) {
                float d = dot(qh, kb + j * H, H) * scale;
                work[j] = d;
                m = d > m ? d : m;
            }
            float sum = 0.0f;
            for (long j = 0; j < t; j++) {
                work[j] = expf(work[j] - m);
                sum += work[j];
            }
            float inv = 1.0f / sum, *yr = y + i * (long)nq * H + (long)hq * H;
            for (int e = 0; e < H; e++) yr[e] = 0.0f;
            for (long j = 0; j < t; j++) axpy(yr, work[j] * inv, vb + j * H, H);
        }
    }
}

/* softmax(q . K^T * scale + mask) . V for one query row of D floats against keys/values rows
 * 0 .. t-1 (row strides kst, vst); mask: t floats or NULL; a row with no visible key (all
 * -inf) gives zeros, ONNX Attention's rule. y: Dv floats; work: t floats. */
static void attend_row(const float *q, const float *k, long kst, const float *v, long vst, long t, int D, int Dv,
                       const float *mask, long mst, float scale, float *y, float *work)
{
    float m = -INFINITY;
    for (long j = 0; j < t; j++) {
        float d = dot(q, k + j * kst, D) * scale + (mask ? mask[j * mst] : 0.0f);
        work[j] = d;
        m = d > m ? d : m;
    }
    for (int e = 0; e < Dv; e++) y[e] = 0.0f;
    if (m == -INFINITY) return;
    float sum = 0.0f;
    for (long j = 0; j < t; j++) {
        work[j] = expf(work[j] - m);
        sum += work[j];
    }
    float inv = 1.0f / sum;
    for (long j = 0; j < t; j++) axpy(y, work[j] * inv, v + j * vst, Dv);
}

/* npr_attention_rows: ONNX Attention (4-D, no cache operands) for the fused attention of an
 * exported decoder: q (B, Hq, S, D) and y (B, Hq, S, Dv) contiguous; k, v (B, Hkv, T, D|Dv)
 * with element strides (batch, head, row) -- views of a cache buffer read in place; query head
 * h reads key/value head h / (Hq / Hkv); mask: additive, strides (batch, head, query, key)
 * (0 where it broadcasts) or NULL; work: T floats. */
void npr_attention_rows(const float *q, long B, long Hq, long S, long D, const float *k, long ksb, long ksh,
                        long kst, const float *v, long vsb, long vsh, long vst, long Hkv, long T, long Dv,
                        const float *mask, long msb, long msh, long mss, long mst, float scale, float *y,
                        float *work)
{
    long group = Hq / Hkv;
    for (long b = 0; b < B; b++)
        for (long h = 0; h < Hq; h++)
            for (long i = 0; i < S; i++)
                attend_row(q + ((b * Hq + h) * S + i) * D, k + b * ksb + (h / group) * ksh, kst,
                           v + b * vsb + (h / group) * vsh, vst, T, (int)D, (int)Dv,
                           mask ? mask + b * msb + h * msh + i * mss : NULL, mst, scale,
                           y + ((b * Hq + h) * S + i) * Dv, work);
}
