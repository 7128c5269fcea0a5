/* matmul_avx2.c — AVX2 + FMA + F16C matmul and activation quantization.
 * Twins of kernels/ref/matmul_ref.c and quant_ref.c.
 *
 * Same loop nest as the AVX-512 variant (R weight rows x T tokens per tile,
 * row panels of ~256 KiB when there are several token blocks) sized for 16
 * ymm registers:
 *   float weights: 4 rows x 2 tokens, 8 elements per step; tails of n_in go
 *     through a zero-padded 8-element copy.
 *   block weights: 2 rows x 3 tokens, one pair of blocks (64 elements) per
 *     step, block b in the low 128-bit lane and b+1 in the high one:
 *     lo = elements 0..15, hi = elements 16..31 of each. Activations are
 *     packed into that order once per call (and k-chunk of 128 blocks), with
 *     their scales widened and the q4_0 offset correction precomputed.
 *     Integer dot products use vpmaddubsw (u8 x s8 -> s16 pairs) + vpmaddwd:
 *       q4_0: nibbles 0..15 x a, plus -8 * the pair sums of a (no
 *             saturation: |lo + hi + corr| <= 2*2*15*127 + 8*4*127 < 32767);
 *       q8_0: |w| x sign(a, w), lo and hi widened to i32 separately
 *             (|pairs| <= 2*128*127 < 32767);
 *       q4_1: nibbles x a, plus m_w*s_a in lane 0 of each block;
 *       mxfp4: codes -> 2*E2M1 + 12 in 0..24 by a vpshufb table (unsigned),
 *             x a, plus -12 * the pair sums of a (|p| <= 4*24*127 + 4*12*127
 *             < 32767), scaled by 2^(e-128) * d_a.
 *     The integer part of each partial sum is exact.
 * Weights are prefetched into L2 8 rows ahead (see matmul_avx512.c).
 */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <string.h>

#define IE_INLINE static inline __attribute__((always_inline))

/* Block bytes of a weight/activation type, inlined (ie_dtype_block_bytes is
 * an out-of-line call, which inside a loop spills every vector register). */
IE_INLINE size_t blk_bytes(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_Q8_0: return sizeof(ie_block_q8_0_t);
    case IE_DTYPE_Q8_1: return sizeof(ie_block_q8_1_t);
    case IE_DTYPE_Q4_0: return sizeof(ie_block_q4_0_t);
    case IE_DTYPE_Q4_1: return sizeof(ie_block_q4_1_t);
    case IE_DTYPE_MXFP4: return sizeof(ie_block_mxfp4_t);
    case IE_DTYPE_F32: return 4;
    default: return 2; /* f16, bf16 */
    }
}

IE_INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ========================================================= float weights */

#define FR 4
#define FT 2

IE_INLINE __m256 fw_load(ie_dtype_t wt, const void *p)
{
    switch (wt) {
    case IE_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case IE_DTYPE_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    default: return _mm256_loadu_ps((const float *)p);
    }
}

/* Activations are f32 rows, or bf16 rows (widened exactly) when at is BF16. */
IE_INLINE void ftile(ie_dtype_t wt, ie_dtype_t at, int R, int T, const char *w, size_t wb, int64_t n_in,
                     const char *a, size_t as, float *y, int64_t ldy)
{
    const size_t es = blk_bytes(wt), ea = blk_bytes(at);
    __m256 acc[FR][FT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n_in; k += 8) {
        __m256 wv[FR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* the same columns 8 rows (two tiles) ahead, one line per 64 bytes */
            if ((k & (es == 4 ? 8 : 24)) == 0) _mm_prefetch(w + (size_t)(r + 8) * wb + (size_t)k * es, _MM_HINT_T1);
            wv[r] = fw_load(wt, w + (size_t)r * wb + (size_t)k * es);
        }
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            const __m256 x = fw_load(at, a + (size_t)t * as + (size_t)k * ea);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], x, acc[r][t]);
        }
    }
    if (k < n_in) {
        /* Tail: zero-padded copies, so no load crosses the end of a row. */
        const int64_t m = n_in - k;
        _Alignas(32) uint8_t wbuf[FR][32];
        _Alignas(32) uint8_t xbuf[FT][32];
        __m256 wv[FR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            memset(wbuf[r], 0, sizeof wbuf[r]);
            memcpy(wbuf[r], w + (size_t)r * wb + (size_t)k * es, (size_t)m * es);
            wv[r] = fw_load(wt, wbuf[r]);
        }
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            memset(xbuf[t], 0, sizeof xbuf[t]);
            memcpy(xbuf[t], a + (size_t)t * as + (size_t)k * ea, (size_t)m * ea);
            const __m256 x = fw_load(at, xbuf[t]);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], x, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]);
}

#define FTILE(WT, AT, name, R, T)                                                                          \
    static void ftile_##name##_##R##_##T(const char *w, size_t wb, int64_t n_in, const char *a, size_t as, \
                                         float *y, int64_t ldy)                                            \
    {                                                                                                      \
        ftile(WT, AT, R, T, w, wb, n_in, a, as, y, ldy);                                                   \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
#define FTILES(WT, AT, name)                                                               \
    FTILE(WT, AT, name, 4, 1) FTILE(WT, AT, name, 4, 2)                                   \
    FTILE(WT, AT, name, 1, 1) FTILE(WT, AT, name, 1, 2)                                   \
    static const ie_ftile_fn ftiles_##name[2][FT + 1] = {                                     \
        { NULL, ftile_##name##_1_1, ftile_##name##_1_2 },                                  \
        { NULL, ftile_##name##_4_1, ftile_##name##_4_2 } };

FTILES(IE_DTYPE_F32, IE_DTYPE_F32, f32)
FTILES(IE_DTYPE_F16, IE_DTYPE_F32, f16)
FTILES(IE_DTYPE_BF16, IE_DTYPE_BF16, bf16bf16)
// clang-format on

/* BF16 weights x BF16 activations (contract of ie_matmul_bf16_bf16_ref):
 * both widened to f32 by a 16-bit shift (exact), products by FMA. */
void ie_matmul_bf16_bf16_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) return;
    ie_matmul_float_drive(IE_DTYPE_BF16, ftiles_bf16bf16[0], ftiles_bf16bf16[1], FR, FT, w, n_in, r0, r1, a, as,
                          n_tok, y, ldy);
}

/* ========================================================= block weights */

#define QR 2
#define QT 3
#define QPF 8  /* rows ahead to prefetch (into L2)                  */
#define KCP 64 /* block pairs per k-chunk (4096 elements)           */
#define PK_PAIR 128
#define PK_STRIDE (KCP * PK_PAIR) /* packed activations: 8 KiB per token */

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Two f16 values -> [v0 x4 | v1 x4] as f32. */
IE_INLINE __m256 f16_pair(uint16_t v0, uint16_t v1)
{
    const __m128i x = _mm_cvtsi32_si128((int)((uint32_t)v0 | (uint32_t)v1 << 16));
    return _mm256_cvtph_ps(_mm_shuffle_epi8(x, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3)));
}

/* Pack activation blocks b0 and b1 (b1 NULL past the end) into 128 bytes:
 * alo = [b0 q0..15 | b1 q0..15], ahi = [b0 q16..31 | b1 q16..31],
 * da = [d0 x4 | d1 x4], aux = q4_0 (mxfp4): -8 (-12) * (pair sums of
 * alo + ahi) as the int16 lanes of vpmaddubsw; q4_1: f32 [s0 0 0 0 | s1 0 0 0]. */
IE_INLINE void pack_pair(ie_dtype_t wt, const uint8_t *b0, const uint8_t *b1, uint8_t *dst)
{
    const int qo = wt == IE_DTYPE_Q4_1 ? 4 : 2;
    const __m128i z = _mm_setzero_si128();
    const __m256i alo = _mm256_set_m128i(b1 ? _mm_loadu_si128((const __m128i *)(b1 + qo)) : z,
                                         _mm_loadu_si128((const __m128i *)(b0 + qo)));
    const __m256i ahi = _mm256_set_m128i(b1 ? _mm_loadu_si128((const __m128i *)(b1 + qo + 16)) : z,
                                         _mm_loadu_si128((const __m128i *)(b0 + qo + 16)));
    _mm256_store_si256((__m256i *)dst, alo);
    _mm256_store_si256((__m256i *)(dst + 32), ahi);
    _mm256_store_ps((float *)(dst + 64), f16_pair(ld16(b0), b1 ? ld16(b1) : 0));
    __m256i aux = _mm256_setzero_si256();
    if (wt == IE_DTYPE_Q4_0 || wt == IE_DTYPE_MXFP4) {
        const __m256i eight = _mm256_set1_epi8(wt == IE_DTYPE_MXFP4 ? 12 : 8);
        aux = _mm256_sub_epi16(aux, _mm256_add_epi16(_mm256_maddubs_epi16(eight, alo),
                                                     _mm256_maddubs_epi16(eight, ahi)));
    } else if (wt == IE_DTYPE_Q4_1) {
        const __m128i s = _mm_setr_epi16((short)ld16(b0 + 2), 0, 0, 0, b1 ? (short)ld16(b1 + 2) : 0, 0, 0, 0);
        aux = _mm256_castps_si256(_mm256_cvtph_ps(s));
    }
    _mm256_store_si256((__m256i *)(dst + 96), aux);
}

/* One pair of weight blocks of one row (the second absent if !both):
 * lo/hi in the packed activation order; ulo/uhi the unsigned operands of
 * vpmaddubsw (|w| for q8_0, whose sign moves onto the activations). */
typedef struct {
    __m256i lo, hi, ulo, uhi;
    __m256 d, m;
} wpair_t;

IE_INLINE wpair_t wpair_load(ie_dtype_t wt, const uint8_t *p, int both)
{
    wpair_t w;
    const __m128i z = _mm_setzero_si128();
    const size_t bb = blk_bytes(wt);
    const uint8_t *p1 = p + bb;
    if (wt == IE_DTYPE_Q8_0) {
        w.lo = _mm256_set_m128i(both ? _mm_loadu_si128((const __m128i *)(p1 + 2)) : z,
                                _mm_loadu_si128((const __m128i *)(p + 2)));
        w.hi = _mm256_set_m128i(both ? _mm_loadu_si128((const __m128i *)(p1 + 18)) : z,
                                _mm_loadu_si128((const __m128i *)(p + 18)));
        w.ulo = _mm256_abs_epi8(w.lo);
        w.uhi = _mm256_abs_epi8(w.hi);
        w.m = _mm256_setzero_ps();
    } else if (wt == IE_DTYPE_MXFP4) {
        /* 2*E2M1(code) + 12: unsigned for vpmaddubsw; the +12 is undone by aux */
        const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14,
                                             15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        const __m256i qs = _mm256_set_m128i(both ? _mm_loadu_si128((const __m128i *)(p1 + 1)) : z,
                                            _mm_loadu_si128((const __m128i *)(p + 1)));
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        w.lo = w.ulo = _mm256_shuffle_epi8(lut, _mm256_and_si256(qs, m4));
        w.hi = w.uhi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4));
        w.m = _mm256_setzero_ps();
        w.d = _mm256_set_m128(_mm_set1_ps(both ? ie_e8m0_half_to_f32(p1[0]) : 0.0f),
                              _mm_set1_ps(ie_e8m0_half_to_f32(p[0])));
        return w;
    } else {
        const int qo = wt == IE_DTYPE_Q4_1 ? 4 : 2;
        const __m256i qs = _mm256_set_m128i(both ? _mm_loadu_si128((const __m128i *)(p1 + qo)) : z,
                                            _mm_loadu_si128((const __m128i *)(p + qo)));
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        w.lo = w.ulo = _mm256_and_si256(qs, m4);
        w.hi = w.uhi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
        w.m = wt == IE_DTYPE_Q4_1 ? f16_pair(ld16(p + 2), both ? ld16(p1 + 2) : 0) : _mm256_setzero_ps();
    }
    w.d = f16_pair(ld16(p), both ? ld16(p1) : 0);
    return w;
}

IE_INLINE void qstep(ie_dtype_t wt, int R, int T, const uint8_t *w, size_t wb, int both, const uint8_t *pk,
                     __m256 acc[QR][QT])
{
    const size_t bb = blk_bytes(wt);
    const __m256i ones16 = _mm256_set1_epi16(1);
    wpair_t wv[QR];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        const char *pf = (const char *)w + (size_t)(r + QPF) * wb; /* <= 2 lines */
        _mm_prefetch(pf, _MM_HINT_T1);
        _mm_prefetch(pf + 2 * bb - 1, _MM_HINT_T1);
        wv[r] = wpair_load(wt, w + (size_t)r * wb, both);
    }
#pragma GCC unroll 3
    for (int t = 0; t < T; t++) {
        const uint8_t *pt = pk + (size_t)t * PK_STRIDE;
        const __m256i alo = _mm256_load_si256((const __m256i *)pt);
        const __m256i ahi = _mm256_load_si256((const __m256i *)(pt + 32));
        const __m256 da = _mm256_load_ps((const float *)(pt + 64));
        const __m256i aux = _mm256_load_si256((const __m256i *)(pt + 96));
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m256i s;
            if (wt == IE_DTYPE_Q8_0) {
                s = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r].ulo, _mm256_sign_epi8(alo, wv[r].lo)), ones16),
                    _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r].uhi, _mm256_sign_epi8(ahi, wv[r].hi)), ones16));
            } else {
                __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wv[r].ulo, alo),
                                             _mm256_maddubs_epi16(wv[r].uhi, ahi));
                if (wt == IE_DTYPE_Q4_0 || wt == IE_DTYPE_MXFP4) p = _mm256_add_epi16(p, aux);
                s = _mm256_madd_epi16(p, ones16);
            }
            acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(wv[r].d, da), acc[r][t]);
            if (wt == IE_DTYPE_Q4_1) acc[r][t] = _mm256_fmadd_ps(wv[r].m, _mm256_castsi256_ps(aux), acc[r][t]);
        }
    }
}

IE_INLINE void qtile(ie_dtype_t wt, int R, int T, const uint8_t *w, size_t wb, int64_t npairs, int odd,
                     const uint8_t *pk, float *y, int64_t ldy, int first)
{
    const size_t pb = 2 * blk_bytes(wt);
    __m256 acc[QR][QT];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < npairs; i++) qstep(wt, R, T, w + i * pb, wb, 1, pk + i * PK_PAIR, acc);
    if (odd) qstep(wt, R, T, w + npairs * pb, wb, 0, pk + npairs * PK_PAIR, acc);
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) {
            const float v = hsum256(acc[r][t]);
            y[t * ldy + r] = first ? v : y[t * ldy + r] + v;
        }
}

typedef void (*qtile_fn)(const uint8_t *w, size_t wb, int64_t npairs, int odd, const uint8_t *pk, float *y,
                         int64_t ldy, int first);

#define QTILE(WT, name, R, T)                                                                                 \
    static void qtile_##name##_##R##_##T(const uint8_t *w, size_t wb, int64_t np, int odd, const uint8_t *pk, \
                                         float *y, int64_t ldy, int first)                                    \
    {                                                                                                         \
        qtile(WT, R, T, w, wb, np, odd, pk, y, ldy, first);                                                   \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
#define QTILES(WT, name)                                                                        \
    QTILE(WT, name, 2, 1) QTILE(WT, name, 2, 2) QTILE(WT, name, 2, 3)                           \
    QTILE(WT, name, 1, 1) QTILE(WT, name, 1, 2) QTILE(WT, name, 1, 3)                           \
    static const qtile_fn qtiles_##name[2][QT + 1] = {                                          \
        { NULL, qtile_##name##_1_1, qtile_##name##_1_2, qtile_##name##_1_3 },                   \
        { NULL, qtile_##name##_2_1, qtile_##name##_2_2, qtile_##name##_2_3 } };

QTILES(IE_DTYPE_Q8_0, q8_0)
QTILES(IE_DTYPE_Q4_0, q4_0)
QTILES(IE_DTYPE_Q4_1, q4_1)
QTILES(IE_DTYPE_MXFP4, mxfp4)
// clang-format on

static void matmul_block(ie_dtype_t wt, const qtile_fn tiles[2][QT + 1], const void *w, int64_t n_in, int64_t r0,
                         int64_t r1, const void *a, size_t as, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(32) uint8_t pk[QT * PK_STRIDE];
    const size_t wb = ie_dtype_row_bytes(wt, n_in), bb = blk_bytes(wt);
    const size_t ab = blk_bytes(ie_matmul_act_dtype(wt));
    const int64_t nb = n_in / IE_QK;
    for (int64_t kb0 = 0; kb0 < nb; kb0 += 2 * KCP) {
        const int64_t nbc = nb - kb0 < 2 * KCP ? nb - kb0 : 2 * KCP;
        const int64_t npairs = nbc / 2;
        const int odd = (int)(nbc & 1);
        const int64_t P = ie_panel_rows(r1 - r0, (size_t)nbc * bb, n_tok, QT, QR);
        for (int64_t p0 = r0; p0 < r1; p0 += P) {
            const int64_t p1 = p0 + P < r1 ? p0 + P : r1;
            for (int64_t t0 = 0; t0 < n_tok; t0 += QT) {
                const int tt = (int)(n_tok - t0 < QT ? n_tok - t0 : QT);
                for (int t = 0; t < tt; t++) {
                    const uint8_t *src = (const uint8_t *)a + (size_t)(t0 + t) * as + (size_t)kb0 * ab;
                    uint8_t *dst = pk + (size_t)t * PK_STRIDE;
                    for (int64_t i = 0; i < npairs; i++)
                        pack_pair(wt, src + 2 * i * ab, src + (2 * i + 1) * ab, dst + i * PK_PAIR);
                    if (odd) pack_pair(wt, src + 2 * npairs * ab, NULL, dst + npairs * PK_PAIR);
                }
                float *yt = y + t0 * ldy;
                const uint8_t *wk = (const uint8_t *)w + (size_t)kb0 * bb;
                int64_t r = p0;
                for (; r + QR <= p1; r += QR)
                    tiles[1][tt](wk + (size_t)r * wb, wb, npairs, odd, pk, yt + r, ldy, kb0 == 0);
                for (; r < p1; r++) tiles[0][tt](wk + (size_t)r * wb, wb, npairs, odd, pk, yt + r, ldy, kb0 == 0);
            }
        }
    }
}

/* The dense matmuls of the table, one per weight type (contract:
 * ie_matmul_fn in ie_kernels.h; bf16 is ie_matmul_bf16_bf16_avx2 above). */
void ie_matmul_f32_f32_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                            int64_t n_tok, float *y, int64_t ldy)
{
    ie_matmul_float_drive(IE_DTYPE_F32, ftiles_f32[0], ftiles_f32[1], FR, FT, w, n_in, r0, r1, a, as, n_tok, y,
                          ldy);
}

void ie_matmul_f16_f32_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                            int64_t n_tok, float *y, int64_t ldy)
{
    ie_matmul_float_drive(IE_DTYPE_F16, ftiles_f16[0], ftiles_f16[1], FR, FT, w, n_in, r0, r1, a, as, n_tok, y,
                          ldy);
}

void ie_matmul_q8_0_q8_0_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_Q8_0, qtiles_q8_0, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

void ie_matmul_q4_0_q8_0_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_Q4_0, qtiles_q4_0, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

void ie_matmul_q4_1_q8_1_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_Q4_1, qtiles_q4_1, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

void ie_matmul_mxfp4_q8_0_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                               int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_MXFP4, qtiles_mxfp4, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

/* ================================================== activation quantize */

/* roundf() (ties away from zero) for |v| < 2^23: truncate, then step away
 * from zero when the exact dropped fraction is >= 0.5. */
IE_INLINE __m256i round_away_epi32(__m256 v)
{
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 f = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
    const __m256 up = _mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_and_ps(up, _mm256_or_ps(sign, _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

static int q8_block(const float *x, int8_t *q, float *d_out)
{
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sgn, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (id == __builtin_inff()) id = 0.0f; /* 1/d overflowed: see quant_ref.c */
    const __m256 vid = _mm256_set1_ps(id);
    __m256i qi[4];
    for (int i = 0; i < 4; i++) qi[i] = round_away_epi32(_mm256_mul_ps(v[i], vid));
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d_out = d;
    return _mm_cvtsi128_si32(s4);
}

/* 8 floats -> bf16 bit patterns in the low words of the i32 lanes, with
 * ie_f32_to_bf16's rule (round to nearest even on the bits, NaN -> quiet). */
IE_INLINE __m256i bf16_rne8(__m256 v)
{
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000)); /* signed compare: both >= 0 */
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

static void f32_to_bf16_row(const float *x, ie_bf16_t *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* packus keeps 0..65535 as is; it interleaves 128-bit lanes, undone by the permute */
        const __m256i p = _mm256_packus_epi32(bf16_rne8(_mm256_loadu_ps(x + i)),
                                              bf16_rne8(_mm256_loadu_ps(x + i + 8)));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_permute4x64_epi64(p, 0xd8));
    }
    for (; i < n; i++) out[i] = ie_f32_to_bf16(x[i]);
}

void ie_act_quantize_avx2(ie_dtype_t act, const float *x, void *out, int64_t n)
{
    if (act == IE_DTYPE_BF16) {
        f32_to_bf16_row(x, out, n);
        return;
    }
    ie_act_quantize_drive(act, x, out, n, q8_block);
}
