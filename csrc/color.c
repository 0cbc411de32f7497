/* YCbCr -> RGB for `npurun upscale` (npurun/zoo/espcn.py, merge_ycbcr): the network's float
 * luma and Pillow's 8-bit bicubic chroma, converted with the JFIF matrix and rounded once, into
 * three 8-bit planes (Pillow interleaves them). The NumPy form of the same takes ~150 ms on a
 * 4K frame (five passes per channel); this is one AVX2 pass. Rounding: nearest, ties to even
 * (cvtps, as NumPy's rint); the saturating packs clamp to [0, 255]; NaN luma counts as 0. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline void store8(uint8_t *dst, __m256 v)
{
    __m256i i = _mm256_cvtps_epi32(v);
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(w, w));
}

static inline __m256 widen(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

void npr_ycc_to_rgb(const float *y, const uint8_t *cb, const uint8_t *cr, uint8_t *r, uint8_t *g,
                    uint8_t *b, long n)
{
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), s = _mm256_set1_ps(255.0f),
                 c128 = _mm256_set1_ps(128.0f), kr = _mm256_set1_ps(1.402f), kgu = _mm256_set1_ps(-0.344136f),
                 kgv = _mm256_set1_ps(-0.714136f), kb = _mm256_set1_ps(1.772f);
    for (long i = 0; i < n; i += 8) {
        long k = n - i < 8 ? n - i : 8;
        float yt[8] = {0};
        uint8_t ut[8] = {0}, vt[8] = {0}, rt[8], gt[8], bt[8];
        const float *py = y + i;
        const uint8_t *pu = cb + i, *pv = cr + i;
        if (k < 8) {  /* the ragged end through small buffers */
            memcpy(yt, py, 4 * k); memcpy(ut, pu, k); memcpy(vt, pv, k);
            py = yt; pu = ut; pv = vt;
        }
        /* max(y, 0) gives 0 for NaN (the second operand) */
        __m256 yy = _mm256_mul_ps(_mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(py), zero), one), s);
        __m256 u = _mm256_sub_ps(widen(pu), c128), v = _mm256_sub_ps(widen(pv), c128);
        __m256 vr = _mm256_add_ps(yy, _mm256_mul_ps(kr, v));
        __m256 vg = _mm256_add_ps(yy, _mm256_add_ps(_mm256_mul_ps(kgu, u), _mm256_mul_ps(kgv, v)));
        __m256 vb = _mm256_add_ps(yy, _mm256_mul_ps(kb, u));
        if (k == 8) {
            store8(r + i, vr); store8(g + i, vg); store8(b + i, vb);
        } else {
            store8(rt, vr); store8(gt, vg); store8(bt, vb);
            memcpy(r + i, rt, k); memcpy(g + i, gt, k); memcpy(b + i, bt, k);
        }
    }
}
