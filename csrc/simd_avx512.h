/* The vector vocabulary of the kernel templates (conv_tile.h, conv_gemm_tpl.h, smallc_tpl.h,
 * wino_tpl.h) for AVX-512 (16 floats): VACT is act512.h's npr_act512; compile under #pragma GCC target("avx512f,..."). Include simd_undef.h before switching ISA. */
#define VEC __m512
#define VL 16
#define VLOAD _mm512_loadu_ps
#define VBCAST(p) _mm512_set1_ps(*(p))
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VZERO _mm512_setzero_ps
#define VADD _mm512_add_ps
#define VACT npr_act512
#define VSTORE _mm512_storeu_ps
#define VSTREAM _mm512_stream_ps
