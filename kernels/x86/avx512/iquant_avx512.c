/* iquant_avx512.c — the grid i-quants' ROWS matmul (iquant_body.h) on
 * AVX-512 BW + VNNI: a group of 32 decoded values is one zmm of int16 (signs
 * by a 32-bit mask, the scales by vpmullw), and a token's dot with a decoded
 * block is 8 vpdpwssd a row, the activations widened by vpmovsxbw once for
 * the IQ_ROWS rows. */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <string.h>

#define IQ_ROWS_MAX 4
#define IQ_CHUNK 8

static inline __m512i iq_scales(int sc0, int sc1)
{
    return _mm512_inserti64x4(_mm512_set1_epi16((short)sc0), _mm256_set1_epi16((short)sc1), 1);
}

static inline __m512i iq_vals(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t neg)
{
    const __m256i g = _mm256_set_epi64x((long long)g3, (long long)g2, (long long)g1, (long long)g0);
    const __m512i v = _mm512_cvtepu8_epi16(g);
    return _mm512_mask_sub_epi16(v, (__mmask32)neg, _mm512_setzero_si512(), v);
}

static inline __m512i iq_vals1(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t dneg)
{
    const __m256i g = _mm256_set_epi64x((long long)g3, (long long)g2, (long long)g1, (long long)g0);
    const __m512i v = _mm512_slli_epi16(_mm512_cvtepi8_epi16(g), 3);
    return _mm512_add_epi16(v,
                            _mm512_mask_blend_epi16((__mmask32)dneg, _mm512_set1_epi16(1), _mm512_set1_epi16(-1)));
}

static inline void iq_emit(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t neg, int sc0,
                           int sc1)
{
    _mm512_store_si512((void *)w, _mm512_mullo_epi16(iq_vals(g0, g1, g2, g3, neg), iq_scales(sc0, sc1)));
}

static inline void iq_emit_1s(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t neg, int sc)
{
    _mm512_store_si512((void *)w, _mm512_mullo_epi16(iq_vals(g0, g1, g2, g3, neg), _mm512_set1_epi16((short)sc)));
}

static inline void iq_emit1(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t dneg, int sc0,
                            int sc1)
{
    _mm512_store_si512((void *)w, _mm512_mullo_epi16(iq_vals1(g0, g1, g2, g3, dneg), iq_scales(sc0, sc1)));
}

static inline void iq_emit1_1s(int16_t *w, uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t dneg,
                               int sc)
{
    _mm512_store_si512((void *)w, _mm512_mullo_epi16(iq_vals1(g0, g1, g2, g3, dneg), _mm512_set1_epi16((short)sc)));
}

/* nr rows x nt tokens (compile-time after inlining, so the accumulators
 * stay in registers): 4 x 2 is the main tile, a token's activations are
 * widened once for the nr rows and each weight load serves nt tokens. */
static inline __attribute__((always_inline)) void iq_tile(const int16_t *w, size_t ws, const float *d, int nb,
                                                          const uint8_t *a, size_t as, float *y, int64_t ldy,
                                                          int add, const int nr, const int nt)
{
    __m512 f[IQ_ROWS_MAX][2];
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
        f[i][u] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *ab[2];
        float da[2];
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
        {
            ab[u] = a + (size_t)u * as + (size_t)b * sizeof(ie_block_q8_k_t);
            memcpy(&da[u], ab[u], sizeof da[u]);
        }
        __m512i s[IQ_ROWS_MAX][2];
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
            s[i][u] = _mm512_setzero_si512();
        for (int k = 0; k < IE_QK_K; k += 32) {
            __m512i av[2];
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
                av[u] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(ab[u] + 4 + k)));
            _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++)
            {
                const __m512i wv = _mm512_load_si512((const void *)(w + (size_t)i * ws + b * IE_QK_K + k));
                _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
                    s[i][u] = _mm512_dpwssd_epi32(s[i][u], av[u], wv);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
            f[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][u]), _mm512_set1_ps(da[u] * d[i * IQ_CHUNK + b]),
                                      f[i][u]);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
    {
        const float v = _mm512_reduce_add_ps(f[i][u]);
        y[u * ldy + i] = add ? y[u * ldy + i] + v : v;
    }
}

static void iq_dot(const int16_t *w, size_t ws, const float *d, int nr, int nb, const uint8_t *a, int64_t n_tok,
                   size_t as, float *y, int64_t ldy, int add)
{
    int64_t t = 0;
    for (; t + 2 <= n_tok; t += 2) {
        const uint8_t *at = a + (size_t)t * as;
        float *yt = y + t * ldy;
        switch (nr) {
        case 4: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 4, 2); break;
        case 3: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 3, 2); break;
        case 2: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 2, 2); break;
        default: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 1, 2); break;
        }
    }
    if (t < n_tok) {
        const uint8_t *at = a + (size_t)t * as;
        float *yt = y + t * ldy;
        switch (nr) {
        case 4: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 4, 1); break;
        case 3: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 3, 1); break;
        case 2: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 2, 1); break;
        default: iq_tile(w, ws, d, nb, at, as, yt, ldy, add, 1, 1); break;
        }
    }
}

#define IQ_ISA avx512
#include "../../src/iquant_body.h"
