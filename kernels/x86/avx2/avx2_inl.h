/* avx2_inl.h — small inline pieces the AVX2 packed kernels share
 * (pack_avx2.c for int8w/int4w, kquant_avx2.c for the k-quants). For files
 * built with the AVX2 flags. */
#ifndef IE_AVX2_INL_H
#define IE_AVX2_INL_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define IE_INLINE static inline __attribute__((always_inline))

/* A float at any alignment. */
IE_INLINE float ld_f32(const void *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* The 4 bytes at p (any alignment) in every 32-bit lane. */
IE_INLINE __m256i bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

#endif
