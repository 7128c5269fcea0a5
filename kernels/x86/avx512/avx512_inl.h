/* avx512_inl.h — small inline pieces the AVX-512 packed kernels share
 * (pack_avx512.c for int8w/int4w, kquant_avx512.c for the k-quants).
 * Include after <immintrin.h> in files built with the AVX-512 flags. */
#ifndef IE_AVX512_INL_H
#define IE_AVX512_INL_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define IE_INLINE static inline __attribute__((always_inline))

/* 4 / float bytes at any alignment. */
IE_INLINE int32_t ld32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

IE_INLINE float ldf(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* acc += vpdpbusd(w (u8), 4 bytes at p broadcast (s8)), with the broadcast
 * as the instruction's {1to16} memory operand (GCC does not fold
 * _mm512_set1_epi32 of a load into vpdpbusd; a separate vpbroadcastd per
 * product costs an extra uop). IE_PACK_NO_ASM: the intrinsic form. */
IE_INLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const uint8_t *p)
{
#ifdef IE_PACK_NO_ASM
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(ld32(p)));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
#endif
}

/* acc += vpdpwssd(w (16 x int16 pairs), the int16 pair at p broadcast),
 * the broadcast again as the {1to16} memory operand. */
IE_INLINE __m512i dpwssd_bcast(__m512i acc, __m512i w, const uint8_t *p)
{
#ifdef IE_PACK_NO_ASM
    return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(ld32(p)));
#else
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
#endif
}

#endif
