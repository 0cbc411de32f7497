/* Dense conv as a GEMM over the flattened output pixels (AVX2 + FMA; AVX-512), for the small
 * images of detection models (YOLOv8n: 10x10 to 160x160):
 *     y (M, Ho*Wo) = act(W (M, K) @ B (K, Ho*Wo) + bias),  K = C*kh*kw.
 * Unlike the implicit GEMM of conv.c, whose tiles are pieces of one output row, tiles here run
 * over the flattened pixels, so a 10- or 20-pixel row no longer leaves vectors half empty. B is
 * read in place from "phase planes" of the padded input (conv_gemm_tpl.h), contiguous along
 * the pixels for every tap whatever the stride, through a K-entry offset table: no im2col.
 * The microkernel (MR channels x up to NVM vectors of pixels) applies bias and activation in
 * registers before its one store. npr_convg_* runs a range of rows (or pixels) of one image;
 * npr_convg_*_mt splits one image over the workers of par.h. The rule: nativeconv.flat_chosen;
 * docs/cpu.md, "Small-image convs". */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime under -std=c11 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "act.h"
#include "par.h"

/* The calling thread's scratch buffers (slot 0: padded input or im2col panel, slot 1: a
 * tile's outputs), grown to the largest request and kept: a fresh malloc of a few 100 KB per
 * conv is an mmap whose pages fault in on every call. A thread keeps at most its largest
 * conv's need (a few MB); a pthread key's destructor frees them when the thread exits. (They
 * were _Thread_local pointers, which C frees nothing for: the scheduler's task threads come
 * and go, and `npurun serve` leaked ~100 KB per thread at 160x120, tests/soak's RSS growth.) */
typedef struct { void *buf[2]; size_t cap[2]; } scratch_t;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    scratch_t *s = p;
    free(s->buf[0]);
    free(s->buf[1]);
    free(s);
}

static void scratch_key_make(void) { pthread_key_create(&scratch_key, scratch_free); }

void *npr_scratch(int slot, size_t bytes)
{
    pthread_once(&scratch_once, scratch_key_make);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)) || pthread_setspecific(scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (bytes > s->cap[slot]) {
        free(s->buf[slot]);
        s->cap[slot] = (bytes + 4095) & ~(size_t)4095;
        s->buf[slot] = aligned_alloc(64, s->cap[slot]);
        if (!s->buf[slot]) s->cap[slot] = 0;
    }
    return s->buf[slot];
}

static inline void store_part256(float *d, __m256 v, int n)
{
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(d, t, sizeof(float) * n);
}

/* d0[j] = s[2j], d1[j] = s[2j + 1] for j in [0, n): a stride-2 row split into its two column
 * phases in one pass (s[0, 2n) readable). */
static inline void deinterleave2(const float *s, float *d0, float *d1, long n)
{
    long j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 a = _mm256_loadu_ps(s + 2 * j), b = _mm256_loadu_ps(s + 2 * j + 8);
        /* shuffle_ps picks within 128-bit lanes: [a0 a2 b0 b2 | a4 a6 b4 b6]; the 64-bit
         * permute puts the pairs in order */
        __m256 ev = _mm256_shuffle_ps(a, b, 0x88), od = _mm256_shuffle_ps(a, b, 0xDD);
        _mm256_storeu_ps(d0 + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8)));
        _mm256_storeu_ps(d1 + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8)));
    }
    for (; j < n; j++) { d0[j] = s[2 * j]; d1[j] = s[2 * j + 1]; }
}

#include "simd_avx2.h"
#define MR 8   /* 8 x 1 vector: 80 GFLOP/s on YOLOv8n's 3x3s; 4 x 3 and 6 x 2 ran 57-68 */
#define NVM 1
#define STORE_PART store_part256
#define KERNEL kernel_avx2
#define CONVG npr_convg_avx2
#include "conv_gemm_tpl.h"
#include "simd_undef.h"
#undef MR
#undef STORE_PART
#undef KERNEL
#undef CONVG

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
#include "act512.h"
static inline void store_part512(float *d, __m512 v, int n)
{
    _mm512_mask_storeu_ps(d, (__mmask16)((1u << n) - 1), v);
}
#include "simd_avx512.h"
#define MR 8

#define STORE_PART store_part512
#define KERNEL kernel_avx512
#define CONVG npr_convg_avx512
#include "conv_gemm_tpl.h"
#pragma GCC pop_options
