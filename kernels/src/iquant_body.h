/* iquant_body.h — the SIMD ROWS matmul of ggml's grid i-quants (IQ1_S, IQ1_M,
 * IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) x Q8_K, included once per ISA
 * (kernels/x86/avx2/iquant_avx2.c, kernels/x86/avx512/iquant_avx512.c).
 *
 * How it runs: the blocks of IQ_ROWS rows are decoded, IQ_CHUNK blocks at a
 * time, into int16 weights w = sc * q (the sub-block scale folded in: |w| <=
 * 31 * 62) and one f32 d a block (ie_iq_decode's fields, the same values);
 * then every token's dot with those rows is an int16 x int16 sum per block
 * (the activations widened from Q8_K's int8 as they load), exact in int32,
 * scaled by (a.d * d) in f32. A block's grid lookups are thus paid once per
 * call, not once per token, and a multi-token step runs at the int16 dot
 * product's rate; a one-token step is bound by the decoding. The integer
 * sums equal ie_matmul_iq_q8_k_ref's; only the f32 order of the per-block
 * terms differs (test_iquant bounds it).
 *
 * The includer defines, before including:
 *   iq_emit(int16_t *w, uint64_t g0, g1, g2, g3, uint32_t neg, int sc0, int sc1)
 *       w[0..31] = the unsigned bytes of g0..g3 (element i of g_j is byte i),
 *       negated where bit k of neg is set, times sc0 (elements 0..15) and sc1
 *       (16..31);
 *   iq_emit1(int16_t *w, uint64_t g0, g1, g2, g3, uint32_t dneg, int sc0, int sc1)
 *       the same for IQ1's signed grid bytes g in {-1, 0, 1}: (8g + 1), or
 *       (8g - 1) where bit k of dneg is set, times the scales;
 *   iq_emit_1s, iq_emit1_1s  the same with one scale for the 32 elements;
 *   iq_dot(const int16_t *w, size_t ws, const float *d, int nr, int nb,
 *          const uint8_t *a, int64_t n_tok, size_t as, float *y, int64_t ldy, int add)
 *       for nr rows (row i's nb decoded blocks at w + i*ws, their d at
 *       d[i*IQ_CHUNK + b]) and n_tok Q8_K rows a (a + t*as, already offset to
 *       the chunk's first block): y[t*ldy + i] = (add ? y : 0) + the sum over
 *       the blocks of (a.d * d) * isum;
 *   IQ_ISA  the name suffix (avx2, avx512);
 *   IQ_ROWS_MAX, IQ_CHUNK  rows decoded together (4) and blocks a chunk (8).
 */
#ifndef IQ_ISA
#error "define the emits, iq_dot, IQ_ROWS_MAX, IQ_CHUNK and IQ_ISA before including iquant_body.h"
#endif

#include <immintrin.h>
#include <string.h>

#define IQ_ROWS IQ_ROWS_MAX

static inline uint16_t iqb_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t iqb_ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ie_iq_signs of every 7-bit code, as a table (a load is cheaper than the
 * popcount and its shifts). */
#define IQB_S1(c) (uint8_t)((c) | (__builtin_parity(c) << 7))
#define IQB_S4(c) IQB_S1(c), IQB_S1((c) + 1), IQB_S1((c) + 2), IQB_S1((c) + 3)
#define IQB_S16(c) IQB_S4(c), IQB_S4((c) + 4), IQB_S4((c) + 8), IQB_S4((c) + 12)
static const uint8_t iqb_ksigns[128] = {IQB_S16(0),  IQB_S16(16), IQB_S16(32), IQB_S16(48),
                                        IQB_S16(64), IQB_S16(80), IQB_S16(96), IQB_S16(112)};

/* Four sign codes of 7 bits (IQ2_XXS, IQ2_XS, IQ3_XXS) as a 32-bit mask. */
static inline uint32_t iqb_signs4(unsigned c0, unsigned c1, unsigned c2, unsigned c3)
{
    return (uint32_t)iqb_ksigns[c0 & 127] | (uint32_t)iqb_ksigns[c1 & 127] << 8 |
           (uint32_t)iqb_ksigns[c2 & 127] << 16 | (uint32_t)iqb_ksigns[c3 & 127] << 24;
}

/* Two 4-value IQ3 entries as one 8-value group. */
static inline uint64_t iqb_g3(const uint32_t *grid, unsigned i0, unsigned i1)
{
    return (uint64_t)grid[i0] | (uint64_t)grid[i1] << 32;
}

/* Decode block b of type t into w[0..255] (= sc * q); returns its d. */
static float iqb_decode(ie_dtype_t t, const uint8_t *b, int16_t *w)
{
    switch (t) {
    case IE_DTYPE_IQ2_XXS:
        for (int j = 0; j < 8; j++) {
            const uint8_t *x = b + 2 + 8 * j;
            const uint32_t s = iqb_ld32(x + 4), sc = 2 * (s >> 28) + 1;
            iq_emit_1s(w + 32 * j, ie_iq2xxs_grid[x[0]], ie_iq2xxs_grid[x[1]], ie_iq2xxs_grid[x[2]],
                       ie_iq2xxs_grid[x[3]], iqb_signs4(s, s >> 7, s >> 14, s >> 21), (int)sc);
        }
        return ie_f16_to_f32(iqb_ld16(b)) * 0.125f;
    case IE_DTYPE_IQ2_XS:
        for (int j = 0; j < 8; j++) {
            unsigned v[4];
            for (int l = 0; l < 4; l++) v[l] = iqb_ld16(b + 2 + 8 * j + 2 * l);
            const unsigned sb = b[66 + j];
            iq_emit(w + 32 * j, ie_iq2xs_grid[v[0] & 511], ie_iq2xs_grid[v[1] & 511], ie_iq2xs_grid[v[2] & 511],
                    ie_iq2xs_grid[v[3] & 511], iqb_signs4(v[0] >> 9, v[1] >> 9, v[2] >> 9, v[3] >> 9),
                    (int)(2 * (sb & 15) + 1), (int)(2 * (sb >> 4) + 1));
        }
        return ie_f16_to_f32(iqb_ld16(b)) * 0.125f;
    case IE_DTYPE_IQ2_S:
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = b + 2 + 4 * j;
            const unsigned qh = b[66 + j], sb = b[74 + j];
            iq_emit(w + 32 * j, ie_iq2s_grid[qs[0] | (qh & 3u) << 8], ie_iq2s_grid[qs[1] | (qh & 12u) << 6],
                    ie_iq2s_grid[qs[2] | (qh & 48u) << 4], ie_iq2s_grid[qs[3] | (qh & 192u) << 2],
                    iqb_ld32(b + 34 + 4 * j), (int)(2 * (sb & 15) + 1), (int)(2 * (sb >> 4) + 1));
        }
        return ie_f16_to_f32(iqb_ld16(b)) * 0.125f;
    case IE_DTYPE_IQ3_XXS:
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = b + 2 + 8 * j;
            const uint32_t s = iqb_ld32(b + 66 + 4 * j), sc = 2 * (s >> 28) + 1;
            iq_emit_1s(w + 32 * j, iqb_g3(ie_iq3xxs_grid, qs[0], qs[1]), iqb_g3(ie_iq3xxs_grid, qs[2], qs[3]),
                       iqb_g3(ie_iq3xxs_grid, qs[4], qs[5]), iqb_g3(ie_iq3xxs_grid, qs[6], qs[7]),
                       iqb_signs4(s, s >> 7, s >> 14, s >> 21), (int)sc);
        }
        return ie_f16_to_f32(iqb_ld16(b)) * 0.25f;
    case IE_DTYPE_IQ3_S: {
        /* the 9-bit indices of a sub-block's 8 entries in one register (bit 8
         * of entry i is bit i of qh[j]), then 8 plain loads: cheaper than
         * assembling them one by one or gathering */
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        uint32_t x[8] __attribute__((aligned(32)));
        for (int j = 0; j < 8; j++) {
            __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * j)));
            const __m256i hi = _mm256_and_si256(_mm256_set1_epi32(b[66 + j]), bit);
            idx = _mm256_or_si256(idx, _mm256_slli_epi32(_mm256_min_epu32(hi, _mm256_set1_epi32(1)), 8));
            _mm256_store_si256((__m256i *)x, idx);
            const unsigned sc = 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 15u) + 1;
            iq_emit_1s(w + 32 * j, iqb_g3(ie_iq3s_grid, x[0], x[1]), iqb_g3(ie_iq3s_grid, x[2], x[3]),
                       iqb_g3(ie_iq3s_grid, x[4], x[5]), iqb_g3(ie_iq3s_grid, x[6], x[7]), iqb_ld32(b + 74 + 4 * j),
                       (int)sc);
        }
        return ie_f16_to_f32(iqb_ld16(b));
    }
    case IE_DTYPE_IQ1_S:
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = b + 2 + 4 * j;
            const unsigned h = iqb_ld16(b + 34 + 2 * j), sc = 2 * ((h >> 12) & 7) + 1;
            iq_emit1_1s(w + 32 * j, ie_iq1s_grid[qs[0] | (h & 7u) << 8], ie_iq1s_grid[qs[1] | ((h >> 3) & 7u) << 8],
                        ie_iq1s_grid[qs[2] | ((h >> 6) & 7u) << 8], ie_iq1s_grid[qs[3] | ((h >> 9) & 7u) << 8],
                        h & 0x8000u ? 0xffffffffu : 0u, (int)sc);
        }
        return ie_f16_to_f32(iqb_ld16(b)) * 0.125f;
    case IE_DTYPE_IQ1_M: {
        const uint16_t s[4] = {iqb_ld16(b + 48), iqb_ld16(b + 50), iqb_ld16(b + 52), iqb_ld16(b + 54)};
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = b + 4 * j;
            const unsigned h0 = b[32 + 2 * j], h1 = b[33 + 2 * j];
            const unsigned sw = s[j / 2] >> (6 * (j % 2));
            const uint32_t dneg = (h0 & 8u ? 0xffu : 0u) | (h0 & 128u ? 0xff00u : 0u) | (h1 & 8u ? 0xff0000u : 0u) |
                                  (h1 & 128u ? 0xff000000u : 0u);
            iq_emit1(w + 32 * j, ie_iq1s_grid[qs[0] | (h0 & 7u) << 8], ie_iq1s_grid[qs[1] | (h0 & 0x70u) << 4],
                     ie_iq1s_grid[qs[2] | (h1 & 7u) << 8], ie_iq1s_grid[qs[3] | (h1 & 0x70u) << 4], dneg,
                     (int)(2 * (sw & 7) + 1), (int)(2 * ((sw >> 3) & 7) + 1));
        }
        return ie_f16_to_f32(ie_iq_block_d(t, b)) * 0.125f;
    }
    default: return 0.0f;
    }
}

static void iqb_matmul(ie_dtype_t t, const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                       int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wrow = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t);
    const int64_t nb = n_in / IE_QK_K;
    int16_t wq[IQ_ROWS][IQ_CHUNK * IE_QK_K] __attribute__((aligned(64)));
    float wd[IQ_ROWS * IQ_CHUNK];
    for (int64_t r = r0; r < r1; r += IQ_ROWS) {
        const int nr = (int)(r1 - r < IQ_ROWS ? r1 - r : IQ_ROWS);
        for (int64_t b0 = 0; b0 < nb; b0 += IQ_CHUNK) {
            const int nc = (int)(nb - b0 < IQ_CHUNK ? nb - b0 : IQ_CHUNK);
            for (int i = 0; i < nr; i++) {
                const uint8_t *src = (const uint8_t *)w + (size_t)(r + i) * wrow + (size_t)b0 * bb;
                for (int b = 0; b < nc; b++)
                    wd[i * IQ_CHUNK + b] = iqb_decode(t, src + (size_t)b * bb, wq[i] + b * IE_QK_K);
            }
            iq_dot(&wq[0][0], IQ_CHUNK * IE_QK_K, wd, nr, nc,
                   (const uint8_t *)a + (size_t)b0 * sizeof(ie_block_q8_k_t), n_tok, as, y + r, ldy, b0 > 0);
        }
    }
}

#define IQB_CAT2(a, b) a##b
#define IQB_CAT(a, b) IQB_CAT2(a, b)
#define IQB_DEFINE(stem, type)                                                                                \
    void IQB_CAT(stem, IQ_ISA)(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as, \
                               int64_t n_tok, float *y, int64_t ldy)                                          \
    {                                                                                                         \
        iqb_matmul(type, w, n_in, r0, r1, a, as, n_tok, y, ldy);                                              \
    }

IQB_DEFINE(ie_matmul_iq2_xxs_q8_k_, IE_DTYPE_IQ2_XXS)
IQB_DEFINE(ie_matmul_iq2_xs_q8_k_, IE_DTYPE_IQ2_XS)
IQB_DEFINE(ie_matmul_iq2_s_q8_k_, IE_DTYPE_IQ2_S)
IQB_DEFINE(ie_matmul_iq3_xxs_q8_k_, IE_DTYPE_IQ3_XXS)
IQB_DEFINE(ie_matmul_iq3_s_q8_k_, IE_DTYPE_IQ3_S)
IQB_DEFINE(ie_matmul_iq1_s_q8_k_, IE_DTYPE_IQ1_S)
IQB_DEFINE(ie_matmul_iq1_m_q8_k_, IE_DTYPE_IQ1_M)
