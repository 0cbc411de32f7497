/* MatMulNBits with 4-bit weights at accuracy_level 4 (npurun/contrib/nbits.py): the GenAI model
 * builder's int4 linear layers, as ONNX Runtime's CPU kernel (MLAS's CompInt8) computes them.
 *
 *   A (M, K) float32 is quantized per block of `bs` values along K to int8: scale = max|a| / 127,
 *   q = round-half-even(a * 127 / max|a|) (npr_q8_rows);
 *   B (N, K/bs, bs/2) bytes holds 4-bit weights, two per byte, the even element in the low nibble,
 *   a float scale per (n, block) and a zero point per (n, block) (8 when the model gives none);
 *   C[m, n] = sum over blocks of as[m, b] * bs[n, b] * sum_k qa[m, k] * (qb[n, k] - zp[n, b]).
 *
 * The integer dot products are exact (|q| <= 127, |qb - zp| <= 15: pairs of products fit int16),
 * so C differs from ONNX Runtime's only by the order of the float sums over blocks. Decode
 * (M = 1) is bound by streaming B: half a byte per weight instead of four for the float32
 * weights the reference dequantizes to. Columns of C are split into `chunks` runs on the
 * library's pool (par.h). AVX2: each 32-weight piece is widened to bytes, centred on its zero
 * point, multiplied with vpmaddubsw (|qb| times qa with qb's sign) and summed with vpmaddwd. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "par.h"

/* One block of n <= bs values quantized as MLAS's CompInt8 does: scale = max|x| / 127, q =
 * round-half-even(x * 127 / max|x|) in float32, zeros past n up to bs; returns the scale. */
static float quant_block(const float *x, long n, long bs, int8_t *q)
{
    float amax = 0.0f;
    for (long k = 0; k < n; k++) {
        float v = fabsf(x[k]);
        amax = v > amax ? v : amax;
    }
    float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (long k = 0; k < n; k++) q[k] = (int8_t)lrintf(x[k] * inv);  /* the default rounding: half to even */
    memset(q + n, 0, (size_t)(bs - n));
    return amax / 127.0f;
}

/* A's rows as int8 blocks (M, kb * bs, zero-padded past K) and their scales (M, kb). */
void npr_q8_rows(const float *a, long M, long K, long bs, int8_t *aq, float *as)
{
    long kb = (K + bs - 1) / bs;
    for (long m = 0; m < M; m++)
        for (long b = 0; b < kb; b++) {
            long k0 = b * bs, n = K - k0 < bs ? K - k0 : bs;
            as[m * kb + b] = quant_block(a + m * K + k0, n, bs, aq + m * kb * bs + k0);
        }
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 weights (16 bytes) as bytes in order, centred on zp: qb - zp in [-15, 15]. */
static inline __m256i nibbles(const uint8_t *p, __m256i zp)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(raw, m), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    __m256i w = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    return _mm256_sub_epi8(w, zp);
}

/* 8 int32 partial sums of qa . w over 32 values (w signed, |w| <= 15). */
static inline __m256i dot32(__m256i w, const int8_t *qa)
{
    __m256i a = _mm256_loadu_si256((const __m256i *)qa);
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

#define RT 4  /* rows of A per pass over a column's blocks (B decoded once for them) */

/* Columns [n0, n1) of C = A @ B^T as above; zp: (N, kb) bytes or NULL for 8; bias: (N,) or NULL. */
void npr_q4_gemm(const int8_t *aq, const float *as, const uint8_t *b, const float *bscale, const uint8_t *zp,
                 const float *bias, float *c, long M, long N, long kb, long bs, long n0, long n1)
{
    long blob = bs / 2, Kp = kb * bs;
    for (long n = n0; n < n1; n++) {
        const uint8_t *bn = b + n * kb * blob;
        const float *sn = bscale + n * kb;
        for (long m0 = 0; m0 < M; m0 += RT) {
            int rows = M - m0 < RT ? (int)(M - m0) : RT;
            __m256 acc[RT];
            for (int r = 0; r < RT; r++) acc[r] = _mm256_setzero_ps();
            for (long blk = 0; blk < kb; blk++) {
                __m256i z = _mm256_set1_epi8((char)(zp ? zp[n * kb + blk] : 8));
                for (long j = 0; j < bs; j += 32) {
                    __m256i w = nibbles(bn + blk * blob + j / 2, z);
                    for (int r = 0; r < rows; r++) {
                        long m = m0 + r;
                        __m256i d = dot32(w, aq + m * Kp + blk * bs + j);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(as[m * kb + blk] * sn[blk]),
                                                 acc[r]);
                    }
                }
            }
            for (int r = 0; r < rows; r++)
                c[(m0 + r) * N + n] = hsum8(acc[r]) + (bias ? bias[n] : 0.0f);
        }
    }
}

typedef struct {
    const int8_t *aq;
    const float *as, *bscale, *bias;
    const uint8_t *b, *zp;
    float *c;
    long M, N, kb, bs;
    int chunks;
} q4_job;

static void q4_chunk(void *ctx, int i)
{
    q4_job *j = ctx;
    long n0 = par_at(0, j->N, i, j->chunks), n1 = par_at(0, j->N, i + 1, j->chunks);
    if (n1 > n0) npr_q4_gemm(j->aq, j->as, j->b, j->bscale, j->zp, j->bias, j->c, j->M, j->N, j->kb, j->bs, n0, n1);
}

void npr_q4_gemm_mt(const int8_t *aq, const float *as, const uint8_t *b, const float *bscale, const uint8_t *zp,
                    const float *bias, float *c, long M, long N, long kb, long bs, int threads, int chunks)
{
    q4_job j = {aq, as, bscale, bias, b, zp, c, M, N, kb, bs, chunks};
    par_run(q4_chunk, &j, chunks, threads);
}

/* ---- AVX-512 VNNI: 64 weights per vpdpbusd (unsigned weight nibbles times signed int8 A).
 *
 * B is repacked once per node (npurun/backends/cpu/ops/int4.py `Int4Weights`) into
 * sub-blocks of 32 weights, 16 bytes each: byte j holds weight j in its low nibble and weight
 * j + 16 in its high one, so masking and shifting a 32-byte pair of sub-blocks gives [t0 0..15 | t1 0..15] and
 * [t0 16..31 | t1 16..31] with no byte shuffles; A's quantized rows are written in that order
 * (npr_q4_prep_a). Each of the 16 int32 lanes of the product then belongs to one sub-block and is
 * scaled by as * bs of its block in float; the zero points are taken out afterwards as
 * sum over sub-blocks of (zp * bs) * (as * sum of the sub-block's qa), one dot product per (m, n).
 * One column at a time, reading its weights as one stream: four columns interleaved measured
 * 8% faster on a product whose weights sat in the cache, but 1.7x slower inside a model, whose
 * weights stream from memory (a 125M Llama's decode step, 5.3 vs 9.5 ms in MatMulNBits). */
static const int SUBS = 32;

/* A rows for the VNNI kernel: qa (M, T * 32) in pair order, as32 (M, T) = A's scale of each
 * sub-block's block, aa32 (M, T) = as32 * sum of the sub-block's qa; T sub-blocks (even,
 * padded with zeros past K). */
void npr_q4_prep_a(const float *a, long M, long K, long bs, long T, int8_t *qa, float *as32, float *aa32)
{
    long kb = (K + bs - 1) / bs, r = bs / SUBS;
    int8_t q[256];
    for (long m = 0; m < M; m++) {
        int8_t *dst = qa + m * T * SUBS;
        memset(dst, 0, (size_t)(T * SUBS));
        for (long t = 0; t < T; t++) as32[m * T + t] = aa32[m * T + t] = 0.0f;
        for (long b = 0; b < kb; b++) {
            long k0 = b * bs, n = K - k0 < bs ? K - k0 : bs;
            float s = quant_block(a + m * K + k0, n, bs, q);
            for (long u = 0; u < r; u++) {
                long t = b * r + u, pair = t / 2, odd = t % 2;
                int8_t *p = dst + pair * 64;
                int sum = 0;
                for (int j = 0; j < 16; j++) {
                    p[odd * 16 + j] = q[u * SUBS + j];
                    p[32 + odd * 16 + j] = q[u * SUBS + 16 + j];
                }
                for (int j = 0; j < SUBS; j++) sum += q[u * SUBS + j];
                as32[m * T + t] = s;
                aa32[m * T + t] = s * (float)sum;
            }
        }
    }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")

/* Columns [n0, n1) of C from prepared A (npr_q4_prep_a) and repacked B: bp (N, T * 16) bytes,
 * bs32 (N, T) the weight scale of each sub-block, zb32 (N, T) = zero point * scale. */
void npr_q4_gemm_vnni(const int8_t *qa, const float *as32, const float *aa32, const uint8_t *bp, const float *bs32,
                      const float *zb32, const float *bias, float *c, long M, long N, long T, long n0, long n1)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (long n = n0; n < n1; n++) {
        const uint8_t *bn = bp + n * T * 16;
        const float *sn = bs32 + n * T, *zn = zb32 + n * T;
        for (long m0 = 0; m0 < M; m0 += RT) {  /* up to RT rows of A per decoding of B (prefill) */
            int rows = M - m0 < RT ? (int)(M - m0) : RT;
            __m512 acc[RT];
            for (int r = 0; r < RT; r++) acc[r] = _mm512_setzero_ps();
            for (long t = 0; t < T; t += 2) {
                __m256i y = _mm256_loadu_si256((const __m256i *)(bn + t * 16));
                __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(y, m4)),
                                               _mm256_and_si256(_mm256_srli_epi16(y, 4), m4), 1);
                for (int r = 0; r < rows; r++) {
                    long m = m0 + r;
                    __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w,
                                                    _mm512_loadu_si512((const void *)(qa + (m * T + t) * SUBS)));
                    /* lanes 0-3 and 8-11 are sub-block t, 4-7 and 12-15 sub-block t + 1 */
                    const float *sm = as32 + m * T;
                    __m512 s = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(sm[t] * sn[t]),
                                                    _mm512_set1_ps(sm[t + 1] * sn[t + 1]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[r]);
                }
            }
            for (int r = 0; r < rows; r++) {
                long m = m0 + r;
                __m512 corr = _mm512_setzero_ps();
                for (long t = 0; t + 16 <= T; t += 16)
                    corr = _mm512_fmadd_ps(_mm512_loadu_ps(zn + t), _mm512_loadu_ps(aa32 + m * T + t), corr);
                float z = _mm512_reduce_add_ps(corr);
                for (long t = T & ~15L; t < T; t++) z += zn[t] * aa32[m * T + t];
                c[m * N + n] = _mm512_reduce_add_ps(acc[r]) - z + (bias ? bias[n] : 0.0f);
            }
        }
    }
}

#pragma GCC pop_options

typedef struct {
    const int8_t *qa;
    const float *as32, *aa32, *bs32, *zb32, *bias;
    const uint8_t *bp;
    float *c;
    long M, N, T;
    int chunks;
} vnni_job;

static void vnni_chunk(void *ctx, int i)
{
    vnni_job *j = ctx;
    long n0 = par_at(0, j->N, i, j->chunks), n1 = par_at(0, j->N, i + 1, j->chunks);
    if (n1 > n0)
        npr_q4_gemm_vnni(j->qa, j->as32, j->aa32, j->bp, j->bs32, j->zb32, j->bias, j->c, j->M, j->N, j->T, n0, n1);
}

void npr_q4_gemm_vnni_mt(const int8_t *qa, const float *as32, const float *aa32, const uint8_t *bp, const float *bs32,
                         const float *zb32, const float *bias, float *c, long M, long N, long T, int threads, int chunks)
{
    vnni_job j = {qa, as32, aa32, bs32, zb32, bias, bp, c, M, N, T, chunks};
    par_run(vnni_chunk, &j, chunks, threads);
}
