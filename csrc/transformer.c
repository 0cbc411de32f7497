/* Transformer-encoder kernels of the cpu backend (AVX2 + FMA, float32):
 *   npr_erf        y = erf(x)
 *   npr_gelu       y = x * (m * (erf(x / d) + a))   (BERT's exported GELU: d = sqrt 2, a = 1, m = 0.5;
 *                  mode 1: erf(x * d), for exporters that multiply by 1 / sqrt 2; mode 2: the
 *                  tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's)
 *   npr_layernorm  y = (x - mean) / sqrt(var + eps) * scale + bias over rows of n
 *   npr_rmsnorm    y = s / sqrt(mean(s^2) + eps) * scale, s = x (+ skip) (+ bias), over rows of n
 *   npr_gemm_*     C = A @ B (+ bias) (+ R), B packed once (npr_gemm_pack_*), AVX2 and AVX-512;
 *                  npr_gemm_q8_*: B as int8 panels times a scale per column (dequantized weights)
 *   npr_softmax    y = exp(x - max) / sum over rows of n, optionally x + mask first and NaN
 *                  rows (fully masked queries) replaced by a value
 *
 * erf: |x| < 0.5 as x * S(x^2) (relative accuracy down to the subnormals), 0.5 <= |x| < 4 as
 * one degree-7 polynomial per interval of 0.5 whose coefficients are picked per lane from
 * registers (vpermps on the interval number), 1 beyond (erf(3.92) already rounds to 1 in
 * float32). Max error 2 ulp against the correctly rounded erf (coefficients: float64 least-squares
 * fits on 4000 Chebyshev nodes of each interval; tests/test_cpu_transformer.py checks the
 * error over [-5, 5] and down to 1e-30). NaN stays NaN.
 * exp (softmax): Cody-Waite reduction by ln 2, degree-6 polynomial, 2^n through the exponent
 * bits; x < -87.3 gives 0 and NaN stays NaN, so a row holding NaN, +inf or only -inf comes
 * out all NaN exactly as exp(x - max) / sum computes it.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include "act.h"
#include "transpose8.h"
void *npr_scratch(int slot, size_t bytes);  /* conv_gemm.c: per-thread scratch */

/* erf(x) = x * S(x^2) on |x| < 0.5 */
static const float ERF_S[5] = {1.128379166e+00f, -3.761261509e-01f, 1.128293222e-01f, -2.676355423e-02f, 4.729982132e-03f};
/* erf(x) = sum_k ERF_P[k][i] (|x| - 0.5 i - 0.25)^k on 0.5 i <= |x| < 0.5 (i + 1) */
static const float ERF_P[8][8] = {
    {2.763263890e-01f, 7.111556334e-01f, 9.229001289e-01f, 9.866716711e-01f, 9.985372833e-01f, 9.998993781e-01f, 9.999956972e-01f, 9.999998863e-01f},
    {1.060014128e+00f, 6.429310713e-01f, 2.365211220e-01f, 5.277499545e-02f, 7.142319215e-03f, 5.862772866e-04f, 2.918901172e-05f, 8.814288504e-07f},
    {-2.650029551e-01f, -4.821981600e-01f, -2.956517445e-01f, -9.235620182e-02f, -1.607015689e-02f, -1.612267422e-03f, -9.486933414e-05f, -3.306071075e-06f},
    {-3.091704952e-01f, 2.678835045e-02f, 1.675358903e-01f, 9.015738694e-02f, 2.172451248e-02f, 2.760380297e-03f, 1.958126302e-04f, 7.970327898e-06f},
    {1.269345568e-01f, 1.506756274e-01f, -6.132031594e-03f, -4.810552495e-02f, -1.908825692e-02f, -3.257710398e-03f, -2.861693788e-04f, -1.378540187e-05f},
    {8.003626402e-02f, -5.321708628e-02f, -4.718655457e-02f, 6.618472462e-03f, 1.066005975e-02f, 2.756291048e-03f, 3.136288335e-04f, 1.833005591e-05f},
    {-3.934072190e-02f, -2.658281180e-02f, 2.059769316e-02f, 9.049499768e-03f, -2.779557394e-03f, -1.667851210e-03f, -2.737590853e-04f, -2.069251419e-05f},
    {-1.580335068e-02f, 1.788546513e-02f, 3.745116969e-03f, -5.933092400e-03f, -7.215298059e-04f, 6.358148074e-04f, 1.735966936e-04f, 1.714475824e-05f},
};

static inline __m256 erf8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    /* small |x|: x * S(x^2) */
    __m256 z = _mm256_mul_ps(ax, ax);
    __m256 s = _mm256_set1_ps(ERF_S[4]);
    for (int k = 3; k >= 0; k--) s = _mm256_fmadd_ps(s, z, _mm256_set1_ps(ERF_S[k]));
    s = _mm256_mul_ps(s, ax);
    /* interval i = floor(2|x|) in 1..7 (0 and NaN take lane 0's coefficients, unused) */
    __m256i i = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_mul_ps(ax, _mm256_set1_ps(2.0f)), _mm256_set1_ps(7.0f)));
    __m256 t = _mm256_sub_ps(ax, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(0.5f), _mm256_set1_ps(0.25f)));
    __m256 p = _mm256_permutevar8x32_ps(_mm256_loadu_ps(ERF_P[7]), i);
    for (int k = 6; k >= 0; k--)
        p = _mm256_fmadd_ps(p, t, _mm256_permutevar8x32_ps(_mm256_loadu_ps(ERF_P[k]), i));
    __m256 r = _mm256_blendv_ps(p, s, _mm256_cmp_ps(ax, _mm256_set1_ps(0.5f), _CMP_LT_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(1.0f), _mm256_cmp_ps(ax, _mm256_set1_ps(4.0f), _CMP_GE_OQ));
    /* NaN: the polynomial of lane garbage is not NaN for sure; put x back */
    r = _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_or_ps(r, _mm256_and_ps(sign, x));
}

static inline __m256 exp8(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504089f);
    __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), x); /* NaN stays (2nd operand) */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n in two halves so that n = 128 (x near 88.7) does not overflow the exponent field */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i h = _mm256_srai_epi32(ni, 1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ));
}

/* The last n % 8 floats go through a padded copy. */
#define TAIL(n, body)                                                  \
    do {                                                               \
        long r_ = (n) & 7;                                             \
        if (r_) {                                                      \
            float bx_[8] = {0}, by_[8];                                \
            memcpy(bx_, x + (n) - r_, r_ * sizeof(float));             \
            __m256 v = _mm256_loadu_ps(bx_);                           \
            _mm256_storeu_ps(by_, body);                               \
            memcpy(y + (n) - r_, by_, r_ * sizeof(float));             \
        }                                                              \
    } while (0)

void npr_erf(const float *x, float *y, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, erf8(_mm256_loadu_ps(x + i)));
    TAIL(n, erf8(v));
}

static inline __m256 gelu8(__m256 v, __m256 d, __m256 a, __m256 m, int mode) {
    if (mode == 2) {  /* tanh form: act.h's rational tanh (a few ulp) */
        const __m256 k = _mm256_set1_ps(0.044715f), c = _mm256_set1_ps(0.7978845608028654f);
        const __m256 h = _mm256_set1_ps(0.5f);
        __m256 u = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(k, v), _mm256_mul_ps(v, v), v));
        return _mm256_mul_ps(_mm256_mul_ps(h, v), _mm256_add_ps(npr_tanh(u), _mm256_set1_ps(1.0f)));
    }
    __m256 t = mode ? _mm256_mul_ps(v, d) : _mm256_div_ps(v, d);
    return _mm256_mul_ps(v, _mm256_mul_ps(m, _mm256_add_ps(erf8(t), a)));
}

void npr_gelu_avx512(const float *x, float *y, long n, float d, float a, float m, int mode);

/* mode | 4: the AVX-512 kernel (the same bits; the caller knows the CPU has it) */
void npr_gelu(const float *x, float *y, long n, float d, float a, float m, int mode) {
    if (mode & 4) {
        npr_gelu_avx512(x, y, n, d, a, m, mode & 3);
        return;
    }
    __m256 vd = _mm256_set1_ps(d), va = _mm256_set1_ps(a), vm = _mm256_set1_ps(m);
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu8(_mm256_loadu_ps(x + i), vd, va, vm, mode));
    TAIL(n, gelu8(v, vd, va, vm, mode));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows [r0, r1) of a (rows x n) matrix. scale: n floats; bias: n floats or NULL; mean and
 * inv_std (one per row) are written where not NULL. Statistics in float32, two passes. */
void npr_layernorm(const float *x, const float *scale, const float *bias, float *y,
                   float *mean_out, float *inv_out, long r0, long r1, long n, float eps) {
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        long i = 0;
        for (; i + 16 <= n; i += 16) {
            acc0 = _mm256_add_ps(acc0, _mm256_loadu_ps(xr + i));
            acc1 = _mm256_add_ps(acc1, _mm256_loadu_ps(xr + i + 8));
        }
        float sum = hsum(_mm256_add_ps(acc0, acc1));
        for (; i < n; i++) sum += xr[i];
        float mean = sum / (float)n;
        __m256 vm = _mm256_set1_ps(mean);
        acc0 = _mm256_setzero_ps(); acc1 = _mm256_setzero_ps();
        for (i = 0; i + 16 <= n; i += 16) {
            __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(xr + i), vm);
            __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(xr + i + 8), vm);
            acc0 = _mm256_fmadd_ps(d0, d0, acc0);
            acc1 = _mm256_fmadd_ps(d1, d1, acc1);
        }
        float ss = hsum(_mm256_add_ps(acc0, acc1));
        for (; i < n; i++) ss += (xr[i] - mean) * (xr[i] - mean);
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        if (mean_out) mean_out[r] = mean;
        if (inv_out) inv_out[r] = inv;
        __m256 vi = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= n; i += 8) {
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vm), vi),
                                     _mm256_loadu_ps(scale + i));
            if (bias) t = _mm256_add_ps(t, _mm256_loadu_ps(bias + i));
            _mm256_storeu_ps(yr + i, t);
        }
        for (; i < n; i++) {
            float t = ((xr[i] - mean) * inv) * scale[i];
            yr[i] = bias ? t + bias[i] : t;
        }
    }
}

/* RMS normalization (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization, ONNX's
 * RMSNormalization) over rows [r0, r1) of n: s = x (+ skip) (+ bias), written to sum when given;
 * y = s * (1 / sqrt(mean(s^2) + eps)) * scale; inv_out (optional) takes 1 / rms per row. The
 * sum of squares runs in double: the reference's float64 within float32 rounding of y. */
void npr_rmsnorm(const float *x, const float *skip, const float *bias, const float *scale, float *y, float *sum,
                 float *inv_out, long r0, long r1, long n, float eps) {
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n, *sr = sum ? sum + r * n : yr;
        const float *src = xr;
        if (skip || bias) {  /* s first (into sum, or y as scratch) */
            for (long i = 0; i < n; i++) {
                float v = xr[i];
                if (skip) v += skip[r * n + i];
                if (bias) v += bias[i];
                sr[i] = v;
            }
            src = sr;
        } else if (sum) {
            memcpy(sum + r * n, xr, (size_t)n * sizeof(float));
        }
        double ss = 0.0;
        for (long i = 0; i < n; i++) ss += (double)src[i] * (double)src[i];
        float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        if (inv_out) inv_out[r] = inv;
        __m256 vi = _mm256_set1_ps(inv);
        long i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), vi),
                                                   _mm256_loadu_ps(scale + i)));
        for (; i < n; i++) yr[i] = (src[i] * inv) * scale[i];
    }
}

/* The end of one softmax row, both kernels': from element i on, exp(x - m) in vectors of 8
 * and a padded last one, added to acc (the sums so far, lane by lane) in order; then the sum,
 * the NaN rows' fix, and the scaling. */
static inline void softmax_finish(const float *xr, float *yr, long i, long n, float m, __m256 acc, int fix,
                                  float nan_to) {
    __m256 vm = _mm256_set1_ps(m);
    float sum = 0.0f;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vm));
        _mm256_storeu_ps(yr + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        float bx[8], by[8];
        long rr = n - i;
        for (long k = 0; k < 8; k++) bx[k] = k < rr ? xr[i + k] - m : -INFINITY;
        _mm256_storeu_ps(by, exp8(_mm256_loadu_ps(bx)));
        for (long k = 0; k < rr; k++) { yr[i + k] = by[k]; sum += by[k]; }
    }
    sum += hsum(acc);
    /* NaN in the row (or only -inf, or +inf): m - m or x - m is NaN somewhere, so sum is */
    if (fix && sum != sum) {
        for (i = 0; i < n; i++) yr[i] = nan_to;
        return;
    }
    /* times 1 / sum, not divided by it (a division a vector costs ~5 times a product: a third
     * of the kernel's time); within an ulp or two of the quotient, as ORT's MLAS */
    float inv = 1.0f / sum;
    __m256 vs = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(yr + i), vs));
    for (; i < n; i++) yr[i] *= inv;
}

/* Rows [r0, r1) of a (rows x n) matrix, softmax along each row. mask (or NULL): added to x
 * first, row r reads mask + (r / mask_div % mask_rows) * n (a mask broadcast over heads
 * and/or rows: mask_div = rows per mask row, mask_rows = its row count). fix: a row whose
 * sum is NaN (then every element is NaN: the others are finite and the sum >= 1) becomes
 * nan_to, as IsNaN -> Where after the softmax of exported attention does. */
void npr_softmax(const float *x, const float *mask, float *y, long r0, long r1, long n,
                 long mask_div, long mask_rows, int fix, float nan_to) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * n;
        const float *mr = mask ? mask + (r / mask_div % mask_rows) * n : NULL;
        float *yr = y + r * n;
        long i = 0;
        __m256 vmax = ninf;
        float m = -INFINITY;
        if (mr) {
            for (; i + 8 <= n; i += 8) {
                __m256 v = _mm256_add_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(mr + i));
                _mm256_storeu_ps(yr + i, v);
                vmax = _mm256_max_ps(vmax, v);
            }
            for (; i < n; i++) { yr[i] = xr[i] + mr[i]; m = yr[i] > m ? yr[i] : m; }
            xr = yr;  /* the masked scores, computed in place in y */
        } else {
            for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(xr + i));
            for (; i < n; i++) m = xr[i] > m ? xr[i] : m;
        }
        float hm = hmax(vmax);
        m = hm > m ? hm : m;
        __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        /* two vectors an iteration, two sums: the exps of one do not wait on the other's add */
        for (i = 0; i + 16 <= n; i += 16) {
            __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vm));
            __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + i + 8), vm));
            _mm256_storeu_ps(yr + i, e0);
            _mm256_storeu_ps(yr + i + 8, e1);
            acc = _mm256_add_ps(acc, e0);
            acc1 = _mm256_add_ps(acc1, e1);
        }
        softmax_finish(xr, yr, i, n, m, _mm256_add_ps(acc, acc1), fix, nan_to);
    }
}

/* ---- sgemm with pre-packed weights (tr_gemm_tpl.h), for MatMul by a constant matrix and
 * the bias/residual adds after it. AVX2: 6 x 16 tile. */
#define VEC __m256
#define VL 8
#define MR 6
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VADD _mm256_add_ps
#define VFMA _mm256_fmadd_ps
#define VZERO _mm256_setzero_ps
#define GEMM_TILE gemm_tile_avx2
#define GEMV_PANELS gemv_panels_avx2
#define GEMM_PACK npr_gemm_pack_avx2
#define GEMM_PACK_T npr_gemm_pack_t_avx2
#define GEMM_PACK_LD npr_gemm_pack_ld_avx2
#define GEMM_NR npr_gemm_nr_avx2
#define GEMM npr_gemm_avx2
#define GEMM_Q8 npr_gemm_q8_avx2
#define GEMM_TCONV_AP npr_tconv_ap_avx2
#define GEMM_TILE_TP gemm_tile_tp_avx2
#define GEMM_ACT npr_gemm_act_avx2
#define GEMM_TILE_AB gemm_tile_ab_avx2
#define VACT(v, act, a, b) npr_act(v, act, _mm256_set1_ps(a), _mm256_set1_ps(b))
#define VMUL _mm256_mul_ps
#define VLOADQ8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#include "tr_gemm_tpl.h"
#undef VEC
#undef VL
#undef MR
#undef VLOAD
#undef VSTORE
#undef VSET1
#undef VADD
#undef VFMA
#undef VZERO
#undef GEMM_TILE
#undef GEMV_PANELS
#undef GEMM_PACK
#undef GEMM_PACK_T
#undef GEMM_PACK_LD
#undef GEMM_NR
#undef GEMM
#undef GEMM_Q8
#undef GEMM_TCONV_AP
#undef GEMM_TILE_TP
#undef GEMM_ACT
#undef GEMM_TILE_AB
#undef VACT
#undef VMUL
#undef VLOADQ8

/* AVX-512: 8 x 32 tile (16 zmm accumulators). */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
/* act.h's AVX2 activation on each half of a zmm: GEMM_ACT's outputs are the bits of the
 * AVX2 pass (npr_activation) the im2col GEMM ran over its tile on either ISA */
static inline __m512 act256x2(__m512 v, int act, float a, float b)
{
    __m256 al = _mm256_set1_ps(a), be = _mm256_set1_ps(b);
    __m256 lo = npr_act(_mm512_castps512_ps256(v), act, al, be);
    __m256 hi = npr_act(_mm512_extractf32x8_ps(v, 1), act, al, be);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
#define VEC __m512
#define VL 16
#define MR 8
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VADD _mm512_add_ps
#define VFMA _mm512_fmadd_ps
#define VZERO _mm512_setzero_ps
#define GEMM_TILE gemm_tile_avx512
#define GEMV_PANELS gemv_panels_avx512
#define GEMM_PACK npr_gemm_pack_avx512
#define GEMM_PACK_T npr_gemm_pack_t_avx512
#define GEMM_PACK_LD npr_gemm_pack_ld_avx512
#define GEMM_NR npr_gemm_nr_avx512
#define GEMM npr_gemm_avx512
#define GEMM_Q8 npr_gemm_q8_avx512
#define GEMM_TCONV_AP npr_tconv_ap_avx512
#define GEMM_TILE_TP gemm_tile_tp_avx512
#define GEMM_ACT npr_gemm_act_avx512
#define GEMM_TILE_AB gemm_tile_ab_avx512
#define VACT(v, act, a, b) act256x2(v, act, a, b)
#define VMUL _mm512_mul_ps
#define VLOADQ8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#include "tr_gemm_tpl.h"
#pragma GCC pop_options

/* ---- npr_softmax on AVX-512: the same bits as the AVX2 kernel, in fewer instructions (the
 * AVX2 kernel is bound by issuing exp8's ~24 instructions per 8 floats). exp16 is exp8's
 * arithmetic on 16 lanes with 2^n by vscalefps: p * 2^n is exact wherever exp8's two-step
 * scaling is, and below exp8's cut-off both give 0. The sums: a 16-lane accumulator is the
 * AVX2 loop's two 8-lane ones side by side, added as it adds them. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
static inline __m512 exp16(__m512 x) {
    __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x); /* NaN stays (2nd operand) */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504089f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 y = _mm512_scalef_ps(p, n);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ), y,
                                _mm512_setzero_ps());
}

void npr_softmax_avx512(const float *x, const float *mask, float *y, long r0, long r1, long n,
                        long mask_div, long mask_rows, int fix, float nan_to) {
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * n;
        const float *mr = mask ? mask + (r / mask_div % mask_rows) * n : NULL;
        float *yr = y + r * n;
        long i = 0;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        float m = -INFINITY;
        if (mr) {
            for (; i + 16 <= n; i += 16) {
                __m512 v = _mm512_add_ps(_mm512_loadu_ps(xr + i), _mm512_loadu_ps(mr + i));
                _mm512_storeu_ps(yr + i, v);
                vmax = _mm512_max_ps(vmax, v);
            }
            for (; i < n; i++) { yr[i] = xr[i] + mr[i]; m = yr[i] > m ? yr[i] : m; }
            xr = yr;
        } else {
            for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(xr + i));
            for (; i < n; i++) m = xr[i] > m ? xr[i] : m;
        }
        float hm = _mm512_reduce_max_ps(vmax);
        m = hm > m ? hm : m;
        __m512 vm = _mm512_set1_ps(m), acc16 = _mm512_setzero_ps();
        for (i = 0; i + 16 <= n; i += 16) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(xr + i), vm));
            _mm512_storeu_ps(yr + i, e);
            acc16 = _mm512_add_ps(acc16, e);
        }
        softmax_finish(xr, yr, i, n, m, _mm256_add_ps(_mm512_castps512_ps256(acc16), _mm512_extractf32x8_ps(acc16, 1)),
                       fix, nan_to);
    }
}

/* erf8 and GELU's erf form on 16 lanes, operation for operation (the coefficient tables are
 * read through 16-lane permutes of the 8 entries twice over): the AVX2 kernel's bits, with
 * half its instructions, which bound it. The tanh form (GPT-2's) stays on gelu8. */
static inline __m512 erf16(__m512 x) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 ax = _mm512_andnot_ps(sign, x);
    __m512 z = _mm512_mul_ps(ax, ax);
    __m512 s = _mm512_set1_ps(ERF_S[4]);
    for (int k = 3; k >= 0; k--) s = _mm512_fmadd_ps(s, z, _mm512_set1_ps(ERF_S[k]));
    s = _mm512_mul_ps(s, ax);
    __m512i i = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_mul_ps(ax, _mm512_set1_ps(2.0f)), _mm512_set1_ps(7.0f)));
    __m512 t = _mm512_sub_ps(ax, _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f)));
#define ERF_ROW(k) _mm512_permutexvar_ps(i, _mm512_broadcast_f32x8(_mm256_loadu_ps(ERF_P[k])))
    __m512 p = ERF_ROW(7);
    for (int k = 6; k >= 0; k--) p = _mm512_fmadd_ps(p, t, ERF_ROW(k));
#undef ERF_ROW
    __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.5f), _CMP_LT_OQ), p, s);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(4.0f), _CMP_GE_OQ), r, _mm512_set1_ps(1.0f));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, x);
    return _mm512_or_ps(r, _mm512_and_ps(sign, x));
}

void npr_gelu_avx512(const float *x, float *y, long n, float d, float a, float m, int mode) {
    if (mode == 2) {
        npr_gelu(x, y, n, d, a, m, mode);
        return;
    }
    __m512 vd = _mm512_set1_ps(d), va = _mm512_set1_ps(a), vm = _mm512_set1_ps(m);
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 t = mode ? _mm512_mul_ps(v, vd) : _mm512_div_ps(v, vd);
        _mm512_storeu_ps(y + i, _mm512_mul_ps(v, _mm512_mul_ps(vm, _mm512_add_ps(erf16(t), va))));
    }
    if (i < n)
        npr_gelu(x + i, y + i, n - i, d, a, m, mode);
}
#pragma GCC pop_options
