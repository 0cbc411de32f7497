/* The activations of act.h on 16 floats (one zmm), for the AVX-512 kernels' epilogues: the
 * same 13/6 rational tanh, the same codes. Include only where AVX-512F/DQ code may be
 * generated (inside `#pragma GCC target("avx512f,avx512dq,...")`). */
#ifndef NPR_ACT512_H
#define NPR_ACT512_H
#include "act.h"

static inline __m512 npr_tanh512(__m512 x) {
    const __m512 lim = _mm512_set1_ps(9.0f);
    x = _mm512_max_ps(_mm512_min_ps(x, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-2.76076847742355e-16f);
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.00018790482477e-13f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-8.60467152213735e-11f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(5.12229709037114e-08f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(1.48572235717979e-05f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(6.37261928875436e-04f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(4.89352455891786e-03f));
    p = _mm512_mul_ps(p, x);
    __m512 q = _mm512_set1_ps(1.19825839466702e-06f);
    q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(1.18534705686654e-04f));
    q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(2.26843463243900e-03f));
    q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(4.89352518554385e-03f));
    __m512 r = _mm512_rcp14_ps(q);  /* 14 bits; one Newton step: float precision */
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(q, r, _mm512_set1_ps(2.0f)));
    return _mm512_mul_ps(p, r);
}

static inline __m512 npr_sigmoid512(__m512 x) {
    const __m512 h = _mm512_set1_ps(0.5f);
    return _mm512_fmadd_ps(npr_tanh512(_mm512_mul_ps(x, h)), h, h);
}

static inline __m512 npr_act512(__m512 v, int act, __m512 alpha, __m512 beta) {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    switch (act) {
    case ACT_RELU: return _mm512_max_ps(v, zero);
    case ACT_TANH: return npr_tanh512(v);
    case ACT_SIGMOID: return npr_sigmoid512(v);
    case ACT_LEAKY_RELU: return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, alpha);
    case ACT_CLIP: return _mm512_min_ps(_mm512_max_ps(v, alpha), beta);
    case ACT_SILU: return _mm512_mul_ps(v, npr_sigmoid512(v));
    case ACT_HARD_SIGMOID:
        return _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(v, alpha, beta), zero), one);
    case ACT_HARD_SWISH:
        return _mm512_mul_ps(v, _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(v, alpha, beta), zero), one));
    default: return v;
    }
}
#endif
