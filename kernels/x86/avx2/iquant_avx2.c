/* iquant_avx2.c — the grid i-quants' ROWS matmul (iquant_body.h) on AVX2:
 * a group of 32 decoded values is two ymm of int16 (signs by a compare
 * against the lane's bit, the scales by vpmullw), and a token's dot with a
 * decoded block is 16 vpmaddwd a row, the activations widened by vpmovsxbw
 * once for the IQ_ROWS rows. */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <string.h>

#define IQ_ROWS_MAX 4
#define IQ_CHUNK 8

/* -1 in the int16 lanes whose bit of m (16 bits) is set, else 0. */
static inline __m256i iq_lanes16(uint32_t m)
{
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                          (short)0x8000);
    return _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(m & 0xffff)), bit), bit);
}

/* 16 values: the bytes of g0 g1 (unsigned), negated where neg says, times sc. */
static inline __m256i iq_half(uint64_t g0, uint64_t g1, uint32_t neg, int sc)
{
    const __m256i v = _mm256_cvtepu8_epi16(_mm_set_epi64x((long long)g1, (long long)g0));
    const __m256i m = iq_lanes16(neg);
    return _mm256_mullo_epi16(_mm256_sub_epi16(_mm256_xor_si256(v, m), m), _mm256_set1_epi16((short)sc));
}

static inline void iq_emit(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t neg, int sc0,
                           int sc1)
{
    _mm256_store_si256((__m256i *)w, iq_half(g0, g1, neg, sc0));
    _mm256_store_si256((__m256i *)(w + 16), iq_half(g2, g3, neg >> 16, sc1));
}

/* IQ1: 8g + 1, or 8g - 1 where dneg says (1 + 2m with m = 0 or -1), times sc. */
static inline __m256i iq_half1(uint64_t g0, uint64_t g1, uint32_t dneg, int sc)
{
    const __m256i v = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_set_epi64x((long long)g1, (long long)g0)), 3);
    const __m256i m = iq_lanes16(dneg);
    const __m256i delta = _mm256_add_epi16(_mm256_set1_epi16(1), _mm256_add_epi16(m, m));
    return _mm256_mullo_epi16(_mm256_add_epi16(v, delta), _mm256_set1_epi16((short)sc));
}

static inline void iq_emit_1s(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t neg, int sc)
{
    iq_emit(w, g0, g1, g2, g3, neg, sc, sc);
}

static inline void iq_emit1(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t dneg, int sc0,
                            int sc1)
{
    _mm256_store_si256((__m256i *)w, iq_half1(g0, g1, dneg, sc0));
    _mm256_store_si256((__m256i *)(w + 16), iq_half1(g2, g3, dneg >> 16, sc1));
}

static inline float iq_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void iq_dot(const int16_t *w, size_t ws, const float *d, int nr, int nb, const uint8_t *a, int64_t n_tok,
                   size_t as, float *y, int64_t ldy, int add)
{
    for (int64_t t = 0; t < n_tok; t++) {
        const uint8_t *at = a + (size_t)t * as;
        __m256 f[IQ_ROWS_MAX];
        for (int i = 0; i < nr; i++) f[i] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *ab = at + (size_t)b * sizeof(ie_block_q8_k_t);
            float da;
            memcpy(&da, ab, sizeof da);
            __m256i s[IQ_ROWS_MAX];
            for (int i = 0; i < nr; i++) s[i] = _mm256_setzero_si256();
            for (int k = 0; k < IE_QK_K; k += 16) {
                const __m256i av = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(ab + 4 + k)));
                for (int i = 0; i < nr; i++)
                    s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(av, _mm256_load_si256(
                                                                            (const __m256i *)(w + (size_t)i * ws +
                                                                                              b * IE_QK_K + k))));
            }
            for (int i = 0; i < nr; i++)
                f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_set1_ps(da * d[i * IQ_CHUNK + b]), f[i]);
        }
        for (int i = 0; i < nr; i++) {
            const float v = iq_hsum(f[i]);
            y[t * ldy + i] = add ? y[t * ldy + i] + v : v;
        }
    }
}

static inline void iq_emit1_1s(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t dneg,
                               int sc)
{
    iq_emit1(w, g0, g1, g2, g3, dneg, sc, sc);
}

#define IQ_ISA avx2
#include "../../src/iquant_body.h"
