/* The vector vocabulary of the kernel templates (conv_tile.h, conv_gemm_tpl.h, smallc_tpl.h,
 * wino_tpl.h) for AVX2 (8 floats): VACT is act.h's npr_act. Include simd_undef.h before switching ISA. */
#define VEC __m256
#define VL 8
#define VLOAD _mm256_loadu_ps
#define VBCAST _mm256_broadcast_ss
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VZERO _mm256_setzero_ps
#define VADD _mm256_add_ps
#define VACT npr_act
#define VSTORE _mm256_storeu_ps
#define VSTREAM _mm256_stream_ps
