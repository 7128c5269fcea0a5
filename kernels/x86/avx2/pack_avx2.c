/* pack_avx2.c — matmul_packed for AVX2 + FMA (+ F16C): PANEL16 weights
 * (ie_pack.h) times Q16_P (I8W) or Q8_P (I4W, I4WA) activations.
 *
 * A 64-byte chunk of a panel holds 16 rows x 4 consecutive k; its low 32
 * bytes are rows 0-7 and its high 32 bytes rows 8-15, so one ymm of int32
 * lanes is 8 rows and both halves of a chunk are two ymm. The tile is the
 * whole panel (16 rows) x NT tokens (NT = 1 or 2: 2*NT float accumulators,
 * 2*NT integer block sums and a few temporaries fit the 16 ymm).
 *
 * Integer products use vpmaddubsw (u8 x s8 -> pairs of s16) and vpmaddwd
 * with ones (-> int32 sums of 4), both exact here:
 *   I4W/I4WA: u in [0, 15], activations q in [-127, 127]: a pair is at most
 *     2*15*127 = 3810, so the 8 pair sums of one 32-element block (4 chunks,
 *     low and high nibbles) add up in int16 (<= 30480) before one vpmaddwd.
 *     The block sum is of the stored codes u; as in the reference, the
 *     symmetric offset comes back per group as -8*d*sum_b(s_b) and the
 *     affine one as +m*sum_b(s_b).
 *   I8W x Q16_P: each 32-byte half-chunk (8 rows x 4 k) is split by two
 *     in-lane byte shuffles into int16 pairs, lane r = (u[r][k0], u[r][k1])
 *     and (u[r][k2], u[r][k3]) with u = q + 128 zero-extended, and vpmaddwd
 *     multiplies them with the token's broadcast int16 pairs (a0, a1) and
 *     (a2, a3): int32 per row, no cross-lane reduction. Each product pair is
 *     at most 2*255*32767 < 2^24 and a block's 32 products plus the start
 *     value -128*sum(a) (computed per block from the int16 quants) stay
 *     below 2^29, so the block sum is sum(q*a) exactly.
 * Per block, the int32 sums become f32 and are scaled by d_w*d_a into the
 * accumulators (f32 FMA). Prefill walks the activations in token blocks of
 * ~256 KiB so they stay in L2 while every panel of the range passes over
 * them; each panel (n_in*16 bytes or less) is reused by every token pair of
 * the block from L2.
 */
#include "../../src/ie_kernels_isa.h"

#include "avx2_inl.h"

#include <immintrin.h>
#include <string.h>


/* Geometry of one packed matrix, computed once per call. */
typedef struct {
    ie_dtype_t t;
    int G;
    int64_t n_in, nb;   /* elements, 32-blocks per row */
    int64_t aq_bytes;   /* quants of an activation row: 2*n_in (Q16_P), n_in (Q8_P) */
    size_t panel_bytes; /* one panel                   */
    size_t group_bytes; /* one group of a panel        */
    size_t scale_bytes; /* d[16] (+ m[16]) of a group  */
} geom_t;

/* One tile: panel `pan` (16 rows) x nt tokens (rows a[t]); writes the
 * 16 x nt results into acc[2*t + h] (h: rows 0-7 / 8-15). */
IE_INLINE void tile(const geom_t *g, const uint8_t *pan, const int8_t *const *a, int nt, __m256 *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    /* per 128-bit lane, dword i = row: bytes (4i, 4i+1) / (4i+2, 4i+3) of
     * the half-chunk, zero-extended to int16 pairs (-128: zero) */
    const __m256i s_lo = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0, -128, 1, -128, 4, -128, 5, -128, 8, -128, 9, -128, 12, -128, 13, -128));
    const __m256i s_hi = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(2, -128, 3, -128, 6, -128, 7, -128, 10, -128, 11, -128, 14, -128, 15, -128));
    const int bpg = g->G / IE_QK; /* blocks per group */
#pragma GCC unroll 4
    for (int i = 0; i < 2 * nt; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t gi = 0; gi < g->n_in / g->G; gi++) {
        const uint8_t *grp = pan + (size_t)gi * g->group_bytes;
        const uint8_t *qw = grp + g->scale_bytes;
        const __m256 wd[2] = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)grp)),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + 16)))};
        for (int j = 0; j < bpg; j++) {
            const int64_t b = gi * bpg + j; /* block index in the row */
            __m256i isum[4];
            if (g->t == IE_DTYPE_I8W) {
                /* start at -128*sum(q) of the token's block, in every lane */
#pragma GCC unroll 2
                for (int t = 0; t < nt; t++) {
                    const uint8_t *qa = (const uint8_t *)a[t] + 64 * b;
                    __m256i v = _mm256_add_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)qa), ones),
                                                 _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(qa + 32)),
                                                                   ones));
                    v = _mm256_add_epi32(v, _mm256_permute2x128_si256(v, v, 1));
                    v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0x4e));
                    v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0xb1));
                    isum[2 * t] = isum[2 * t + 1] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                                                     _mm256_slli_epi32(v, 7));
                }
                const uint8_t *ch = qw + (size_t)j * 8 * 64;
                if (nt == 1) _mm_prefetch((const char *)ch + 1024, _MM_HINT_T0);
#pragma GCC unroll 2
                for (int c = 0; c < 8; c++) {
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
                        const __m256i w = _mm256_loadu_si256((const __m256i *)(ch + 64 * c + 32 * h));
                        const __m256i wl = _mm256_shuffle_epi8(w, s_lo), wh = _mm256_shuffle_epi8(w, s_hi);
#pragma GCC unroll 2
                        for (int t = 0; t < nt; t++) {
                            const int8_t *ab = a[t] + 2 * (b * IE_QK + 4 * c); /* int16 a[4c..4c+3] */
                            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wl, bcast4(ab)),
                                                               _mm256_madd_epi16(wh, bcast4(ab + 4)));
                            isum[2 * t + h] = _mm256_add_epi32(isum[2 * t + h], p);
                        }
                    }
                }
            } else {
                __m256i s16[4];
#pragma GCC unroll 4
                for (int i = 0; i < 2 * nt; i++) s16[i] = _mm256_setzero_si256();
                const uint8_t *ch = qw + (size_t)j * 4 * 64;
                if (nt == 1) _mm_prefetch((const char *)ch + 512, _MM_HINT_T0);
#pragma GCC unroll 2
                for (int c = 0; c < 4; c++) {
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
                        const __m256i w = _mm256_loadu_si256((const __m256i *)(ch + 64 * c + 32 * h));
                        const __m256i lo = _mm256_and_si256(w, m4);
                        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
#pragma GCC unroll 2
                        for (int t = 0; t < nt; t++) {
                            const int8_t *ab = a[t] + b * IE_QK + 8 * c;
                            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(ab)),
                                                               _mm256_maddubs_epi16(hi, bcast4(ab + 4)));
                            s16[2 * t + h] = _mm256_add_epi16(s16[2 * t + h], p);
                        }
                    }
                }
#pragma GCC unroll 4
                for (int i = 0; i < 2 * nt; i++) isum[i] = _mm256_madd_epi16(s16[i], ones);
            }
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) {
                const __m256 ad = _mm256_set1_ps(ld_f32((const uint8_t *)a[t] + g->aq_bytes + 4 * b));
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++)
                    acc[2 * t + h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[2 * t + h]), _mm256_mul_ps(wd[h], ad),
                                                     acc[2 * t + h]);
            }
        }
        if (g->t != IE_DTYPE_I8W) {
            /* offsets: -8*d*S (I4W) or +m*S (I4WA), S = sum of the group's s_b */
            const __m256 wo[2] = {g->t == IE_DTYPE_I4WA
                                      ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + 32)))
                                      : _mm256_mul_ps(wd[0], _mm256_set1_ps(-8.0f)),
                                  g->t == IE_DTYPE_I4WA
                                      ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + 48)))
                                      : _mm256_mul_ps(wd[1], _mm256_set1_ps(-8.0f))};
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) {
                const uint8_t *sp = (const uint8_t *)a[t] + g->aq_bytes + 4 * (g->nb + gi * bpg);
                float S = 0.0f;
                for (int j = 0; j < bpg; j++) S += ld_f32(sp + 4 * j);
                const __m256 vs = _mm256_set1_ps(S);
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) acc[2 * t + h] = _mm256_fmadd_ps(wo[h], vs, acc[2 * t + h]);
            }
        }
    }
}

/* Store rows [row, row + 16) of acc (clipped to r1) for nt tokens. */
static void store_tile(const __m256 *acc, int nt, int64_t row, int64_t r1, float *y, int64_t t0, int64_t ldy)
{
    for (int t = 0; t < nt; t++) {
        float *yt = y + (t0 + t) * ldy + row;
        for (int h = 0; h < 2; h++) {
            const int64_t n = r1 - (row + 8 * h);
            if (n >= 8) {
                _mm256_storeu_ps(yt + 8 * h, acc[2 * t + h]);
            } else if (n > 0) {
                float tmp[8];
                _mm256_storeu_ps(tmp, acc[2 * t + h]);
                memcpy(yt + 8 * h, tmp, (size_t)n * sizeof(float));
            }
        }
    }
}

static void tile1(const geom_t *g, const uint8_t *pan, const int8_t *const *a, __m256 *acc)
{
    tile(g, pan, a, 1, acc);
}
static void tile2(const geom_t *g, const uint8_t *pan, const int8_t *const *a, __m256 *acc)
{
    tile(g, pan, a, 2, acc);
}

/* ------------------------------------------------ BF16 panels x BF16 rows
 *
 * A BF16 panel chunk (ie_pack.h) is 16 rows x one k pair, rows 0-7 in its
 * low 32 bytes: per ymm, the even elements widen exactly to f32 by a 16-bit
 * left shift of each dword and the odd ones by masking off its low half,
 * and each meets the token's element broadcast in one FMA. BT2 tokens per
 * tile: 2*BT2 accumulators + 4 widened weights + 2 broadcasts fit 16 ymm. */

#define BT2 4

IE_INLINE void bf16_tile(int T, const uint8_t *pan, int64_t n_in, const uint8_t *a, size_t as, float *y,
                         int64_t ldy, int rows)
{
    __m256 acc[2 * BT2];
    for (int i = 0; i < 2 * T; i++) acc[i] = _mm256_setzero_ps();
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t c = 0; c < n_in / 2; c++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)(pan + (size_t)c * 64));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(pan + (size_t)c * 64 + 32));
        const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)),
                     o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, hi));
        const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)),
                     o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, hi));
        for (int t = 0; t < T; t++) {
            uint32_t pr;
            memcpy(&pr, a + (size_t)t * as + (size_t)c * 4, 4);
            const uint32_t ue = pr << 16, uo = pr & 0xffff0000u;
            float fe, fo;
            memcpy(&fe, &ue, 4);
            memcpy(&fo, &uo, 4);
            const __m256 ae = _mm256_set1_ps(fe), ao = _mm256_set1_ps(fo);
            acc[2 * t] = _mm256_fmadd_ps(o0, ao, _mm256_fmadd_ps(e0, ae, acc[2 * t]));
            acc[2 * t + 1] = _mm256_fmadd_ps(o1, ao, _mm256_fmadd_ps(e1, ae, acc[2 * t + 1]));
        }
    }
    for (int t = 0; t < T; t++) {
        _Alignas(32) float v[16];
        _mm256_store_ps(v, acc[2 * t]);
        _mm256_store_ps(v + 8, acc[2 * t + 1]);
        memcpy(y + t * ldy, v, sizeof(float) * (size_t)rows);
    }
}

/* F16 panels x F32 rows: a 32-byte slice (16 rows, one k) widens by two
 * vcvtph2ps into rows 0-7 and 8-15, each meeting the token's broadcast
 * element in one FMA. */
IE_INLINE void f16_tile(int T, const uint8_t *pan, int64_t n_in, const uint8_t *a, size_t as, float *y, int64_t ldy,
                        int rows)
{
    __m256 acc[2 * BT2];
    for (int i = 0; i < 2 * T; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < n_in; k++) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(pan + (size_t)k * 32)));
        const __m256 w1 = _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)(pan + (size_t)k * 32 + 16)));
        for (int t = 0; t < T; t++) {
            float x;
            memcpy(&x, a + (size_t)t * as + (size_t)k * 4, 4);
            const __m256 xv = _mm256_set1_ps(x);
            acc[2 * t] = _mm256_fmadd_ps(w0, xv, acc[2 * t]);
            acc[2 * t + 1] = _mm256_fmadd_ps(w1, xv, acc[2 * t + 1]);
        }
    }
    for (int t = 0; t < T; t++) {
        _Alignas(32) float v[16];
        _mm256_store_ps(v, acc[2 * t]);
        _mm256_store_ps(v + 8, acc[2 * t + 1]);
        memcpy(y + t * ldy, v, sizeof(float) * (size_t)rows);
    }
}

/* One function per token count of the tiles above. */
#define HALF_TILE(FN, T)                                                                                         \
    static void FN##T(const uint8_t *p, int64_t n, const uint8_t *a, size_t as, float *y, int64_t ldy, int rows) \
    {                                                                                                            \
        FN(T, p, n, a, as, y, ldy, rows);                                                                        \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
HALF_TILE(bf16_tile, 1) HALF_TILE(bf16_tile, 2) HALF_TILE(bf16_tile, 3) HALF_TILE(bf16_tile, 4)
HALF_TILE(f16_tile, 1) HALF_TILE(f16_tile, 2) HALF_TILE(f16_tile, 3) HALF_TILE(f16_tile, 4)
    // clang-format on

    /* Panels [p0, p1) x all tokens, in token blocks of ~256 KiB of activations
 * (kept in L2 while the panels pass); BF16 or F16 panels. */
    static void half_packed(const ie_pmat_t *m, int64_t r0, int64_t r1, const uint8_t *a, size_t as, int64_t n_tok,
                            float *y, int64_t ldy)
{
    typedef void (*fn_t)(const uint8_t *, int64_t, const uint8_t *, size_t, float *, int64_t, int);
    static const fn_t btiles[BT2 + 1] = {NULL, bf16_tile1, bf16_tile2, bf16_tile3, bf16_tile4};
    static const fn_t htiles[BT2 + 1] = {NULL, f16_tile1, f16_tile2, f16_tile3, f16_tile4};
    const fn_t *tiles = m->dtype == IE_DTYPE_BF16 ? btiles : htiles;
    const size_t pb = ie_pack_panel_bytes(m->dtype, m->group, m->n_in);
    int64_t tb = (int64_t)((256u << 10) / ((size_t)m->n_in * 4));
    if (tb < BT2) tb = BT2;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tb) {
        const int64_t t1 = t0 + tb < n_tok ? t0 + tb : n_tok;
        for (int64_t r = r0; r < r1; r += IE_PANEL) {
            const uint8_t *pan = (const uint8_t *)m->data + (size_t)(r / IE_PANEL) * pb;
            const int rows = r1 - r < IE_PANEL ? (int)(r1 - r) : IE_PANEL;
            for (int64_t t = t0; t < t1; t += BT2) {
                const int tt = t1 - t < BT2 ? (int)(t1 - t) : BT2;
                tiles[tt](pan, m->n_in, a + (size_t)t * as, as, y + t * ldy + r, ldy, rows);
            }
        }
    }
}

/* Contract of ie_kernels_t.matmul_packed (I8W x Q16_P, I4W/I4WA x
 * Q8_P, BF16 x BF16, F16 x F32; the k-quants x Q8_P / Q8_K in
 * kquant_avx2.c). Assumes Q8_P quants in [-127, 127] and Q16_P quants
 * in [-32767, 32767], as the quantizers produce. */
ie_status_t ie_matmul_packed_avx2(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                  int64_t n_tok, float *y, int64_t ldy)
{
    if (!m || !m->data || ie_pack_check(m->dtype, m->group, m->n_in) != 0) return IE_ERR_INVAL;
    if (m->n_out <= 0 || r0 < 0 || r0 > r1 || r1 > m->n_out || r0 % IE_PANEL != 0) return IE_ERR_INVAL;
    if (r1 != m->n_out && r1 % IE_PANEL != 0) return IE_ERR_INVAL;
    if (n_tok < 0) return IE_ERR_INVAL;
    if (n_tok == 0 || r0 == r1) return IE_OK;
    if (!a || !y) return IE_ERR_INVAL;
    if (ie_dtype_is_kq_panel(m->dtype)) {
        ie_matmul_packed_kq_avx2(m, r0, r1, a, a_stride, n_tok, y, ldy);
        return IE_OK;
    }
    if (ie_dtype_is_half(m->dtype)) {
        half_packed(m, r0, r1, a, a_stride, n_tok, y, ldy);
        return IE_OK;
    }

    geom_t g;
    g.t = m->dtype;
    g.G = m->group;
    g.n_in = m->n_in;
    g.nb = m->n_in / IE_QK;
    g.aq_bytes = (m->dtype == IE_DTYPE_I8W ? 2 : 1) * m->n_in;
    g.panel_bytes = ie_pack_panel_bytes(m->dtype, m->group, m->n_in);
    g.group_bytes = g.panel_bytes / (size_t)(m->n_in / m->group);
    g.scale_bytes = IE_PANEL * (m->dtype == IE_DTYPE_I4WA ? 4 : 2);

    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    const size_t arow = ie_dtype_row_bytes(ie_matmul_packed_act_dtype(m->dtype), m->n_in);
    int64_t tb = (int64_t)((256u << 10) / (arow ? arow : 1));
    if (tb < 2) tb = 2;
    tb -= tb % 2;

    __m256 acc[4];
    for (int64_t tb0 = 0; tb0 < n_tok; tb0 += tb) {
        const int64_t tb1 = tb0 + tb < n_tok ? tb0 + tb : n_tok;
        for (int64_t p = p0; p < p1; p++) {
            const uint8_t *pan = (const uint8_t *)m->data + (size_t)p * g.panel_bytes;
            int64_t t = tb0;
            for (; t + 2 <= tb1; t += 2) {
                const int8_t *ar[2] = {(const int8_t *)((const uint8_t *)a + (size_t)t * a_stride),
                                       (const int8_t *)((const uint8_t *)a + (size_t)(t + 1) * a_stride)};
                tile2(&g, pan, ar, acc);
                store_tile(acc, 2, p * IE_PANEL, r1, y, t, ldy);
            }
            if (t < tb1) {
                const int8_t *ar[1] = {(const int8_t *)((const uint8_t *)a + (size_t)t * a_stride)};
                tile1(&g, pan, ar, acc);
                store_tile(acc, 1, p * IE_PANEL, r1, y, t, ldy);
            }
        }
    }
    return IE_OK;
}

/* Contract of ie_kernels_t.matmul_packed_ranges: one call per range (the
 * activations are packed per call here, so nothing is gained by more). */
ie_status_t ie_matmul_packed_ranges_avx2(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                         size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    return ie_packed_ranges_by_calls(ie_matmul_packed_avx2, m, next, ctx, a, a_stride, n_tok, y, ldy);
}
