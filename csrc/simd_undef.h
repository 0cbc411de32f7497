/* Ends a simd_avx2.h / simd_avx512.h section. */
#undef VEC
#undef VL
#undef VLOAD
#undef VBCAST
#undef VSET1
#undef VFMA
#undef VZERO
#undef VADD
#undef VACT
#undef VSTORE
#undef VSTREAM
