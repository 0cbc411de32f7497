/* Fused elementwise chains of npurun's cpu backend (npurun/backends/cpu/chains.py): one pass
 * over memory for what the graph writes as several elementwise nodes, e.g. PP-LCNet's
 * "learnable affine" after an activation, s1 * hard_swish(s0 * x + t0) + t1 (4-8 nodes).
 *
 *   y[i] = s1 * act(s0 * x[i] + t0) + t1,   i in [0, n)   (y may be x)
 *
 * act is an activation code of act.h (0 = none; its alpha, beta as for the conv epilogue). */
#include <string.h>
#include "act.h"

void npr_affine_act(const float *x, float *y, long n, float s0, float t0, int act, float alpha,
                    float beta, float s1, float t1)
{
    __m256 a0 = _mm256_set1_ps(s0), b0 = _mm256_set1_ps(t0), a1 = _mm256_set1_ps(s1),
           b1 = _mm256_set1_ps(t1), al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    long i = 0;
    for (; i + 16 <= n; i += 16) {  /* two vectors a step: the FMA chains overlap */
        __m256 u = _mm256_fmadd_ps(a0, _mm256_loadu_ps(x + i), b0);
        __m256 v = _mm256_fmadd_ps(a0, _mm256_loadu_ps(x + i + 8), b0);
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a1, npr_act(u, act, al, be), b1));
        _mm256_storeu_ps(y + i + 8, _mm256_fmadd_ps(a1, npr_act(v, act, al, be), b1));
    }
    for (; i < n; i += 8) {
        float t[8] = {0};
        long k = n - i < 8 ? n - i : 8;
        memcpy(t, x + i, sizeof(float) * k);
        __m256 u = _mm256_fmadd_ps(a0, _mm256_loadu_ps(t), b0);
        _mm256_storeu_ps(t, _mm256_fmadd_ps(a1, npr_act(u, act, al, be), b1));
        memcpy(y + i, t, sizeof(float) * k);
    }
}
