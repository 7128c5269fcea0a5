/* avx512_inl.h — small inline pieces the AVX-512 kernels share
 * (pack_avx512.c for int8w/int4w, kquant_avx512.c for the k-quants,
 * lora_avx512.c for the int8 adapters).
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

/* acc += vpdpbusd(w (u8), x (s8)), both in registers. In asm because GCC
 * 12 kept loop-carried accumulators of _mm512_dpbusd_epi32 in registers
 * only by copying each one to another register every step (and spilling
 * some: a store-to-load chain through the loop): the int8 LoRA shrink's
 * loop ran at ~30% of the core's vpdpbusd rate, ~55% with this and named
 * accumulators. IE_PACK_NO_ASM: the intrinsic form. */
IE_INLINE __m512i dpbusd_reg(__m512i acc, __m512i w, __m512i x)
{
#ifdef IE_PACK_NO_ASM
    return _mm512_dpbusd_epi32(acc, w, x);
#else
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
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

/* exp of 16 floats: exp(x) = 2^n * 2^f with n = round(x*log2 e), f in
 * [-1/2, 1/2]; 2^f by its degree-7 Taylor polynomial in f*ln 2 (relative
 * error < 2e-8 on the range, below float rounding), scaled by 2^n with
 * vscalefps. Inputs are clamped to [-87.3, 88.7], where expf neither
 * overflows nor denormalizes (so exp_ps(-inf) is ~1e-38, not 0). */
IE_INLINE __m512 exp_ps(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* f*ln2 computed as x - n*ln2 in two parts for accuracy */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
