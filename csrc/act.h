/* Activations applied to 8 floats at once, for the epilogue of a conv tile and for the
 * standalone elementwise kernel. Codes match ACTS in npurun/backends/cpu/native.py. */
#ifndef NPR_ACT_H
#define NPR_ACT_H
#include <immintrin.h>

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_TANH = 2, ACT_SIGMOID = 3, ACT_LEAKY_RELU = 4,
       ACT_CLIP = 5, ACT_SILU = 6, ACT_HARD_SIGMOID = 7, ACT_HARD_SWISH = 8 };

/* tanh as a 13/6 rational function on [-9, 9] (the approximation Eigen uses): a few ulp,
 * no exp, no branch, no division. Outside the clamp tanh is +-1 to float precision. */
static inline __m256 npr_tanh(__m256 x) {
    const __m256 lim = _mm256_set1_ps(9.0f);
    x = _mm256_max_ps(_mm256_min_ps(x, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-2.76076847742355e-16f);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.00018790482477e-13f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-8.60467152213735e-11f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(5.12229709037114e-08f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(1.48572235717979e-05f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(6.37261928875436e-04f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(4.89352455891786e-03f));
    p = _mm256_mul_ps(p, x);
    __m256 q = _mm256_set1_ps(1.19825839466702e-06f);
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(1.18534705686654e-04f));
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(2.26843463243900e-03f));
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(4.89352518554385e-03f));
    /* p / q as p * (1/q): rcp's 12 bits and one Newton step give ~23 bits (q is in
     * [0.0049, 1.6], no overflow), cheaper than vdivps (5-10 cycles a vector; ESPCN runs
     * 88 M tanh). */
    __m256 r = _mm256_rcp_ps(q);
    r = _mm256_mul_ps(r, _mm256_fnmadd_ps(q, r, _mm256_set1_ps(2.0f)));
    return _mm256_mul_ps(p, r);
}

/* sigmoid(x) = (1 + tanh(x/2)) / 2: absolute error ~1e-7, the same rational as tanh. */
static inline __m256 npr_sigmoid(__m256 x) {
    const __m256 h = _mm256_set1_ps(0.5f);
    return _mm256_fmadd_ps(npr_tanh(_mm256_mul_ps(x, h)), h, h);
}

static inline __m256 npr_act(__m256 v, int act, __m256 alpha, __m256 beta) {
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    switch (act) {
    case ACT_RELU: return _mm256_max_ps(v, zero);
    case ACT_TANH: return npr_tanh(v);
    case ACT_SIGMOID: return npr_sigmoid(v);
    case ACT_LEAKY_RELU: return _mm256_blendv_ps(v, _mm256_mul_ps(v, alpha), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    case ACT_CLIP: return _mm256_min_ps(_mm256_max_ps(v, alpha), beta);  /* alpha=min, beta=max */
    case ACT_SILU: return _mm256_mul_ps(v, npr_sigmoid(v));
    case ACT_HARD_SIGMOID:  /* max(0, min(1, alpha*x + beta)) */
        return _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(v, alpha, beta), zero), one);
    case ACT_HARD_SWISH:    /* x * hard_sigmoid(x) with alpha=1/6, beta=1/2 */
        return _mm256_mul_ps(v, _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(v, alpha, beta), zero), one));
    default: return v;
    }
}
#endif
