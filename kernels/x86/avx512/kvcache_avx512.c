/* kvcache_avx512.c — attention over a typed KV cache with AVX-512
 * (ie_kvcache.h).
 *
 * Each row is converted in registers as it is read, 16 values a step:
 * f16 by vcvtph2ps, bf16 by a 16-bit shift, FP8 through f16 (e5m2 is the
 * top byte of an f16; e4m3's exponent and mantissa shifted into an f16's,
 * times 2^8, subnormals included, so both are exact), q4 nibbles widened
 * and scaled by their group's f16 scale. A head size that is not a
 * multiple of 16 reads its last chunk with a mask (zeros past hd). Scores
 * keep the f32 kernel's shape (attn_avx512.c): tiles of 16 rows, each query
 * head of the group against the tile, one transpose-reduction per tile. A
 * q8 K cache is scored on integers: the int16 query (ie_kv_quantize_q16)
 * against the widened int8 row by vpdpwssd (VNNI, which the AVX-512 table
 * requires), 32 products an instruction, the
 * row scales applied to the 16 sums of a tile at once. Values: every row
 * loaded and converted once (q8: times its scale, the decoded value's
 * bits) into up to 16 accumulators (heads x chunks), in the order of the
 * f32 kernel, so a typed V sums as its decoded copy does in a prefill.
 */
#include "../../src/ie_kernels_isa.h"
#include "avx512_inl.h"

#define MAXC 16    /* chunks of 16 values: hd <= IE_KV_MAX_HD */
#define PF_ROWS 32 /* rows fetched ahead (into L2, as attn_avx512.c) */

/* 16 values (chunk c: values 16c ..) of a row of type T as floats, lanes
 * outside m zero. q8: the int8 values unscaled (callers apply the row's
 * scale); q4: scaled by the group's. */
IE_INLINE __m512 kv_ld16(const ie_kv_type_t T, const unsigned char *row, int c, __mmask16 m)
{
    switch (T) {
    case IE_KV_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 32 * c));
    case IE_KV_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 32 * c)), 16));
    case IE_KV_Q8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, row + 4 + 16 * c)));
    case IE_KV_Q4: {
        const unsigned char *g = row + (c >> 1) * 18; /* q4 hd is a multiple of 32: no mask */
        uint16_t dh;
        memcpy(&dh, g, 2);
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(g + 2)));
        const __m512i nib = c & 1 ? _mm512_srli_epi32(b, 4) : _mm512_and_si512(b, _mm512_set1_epi32(15));
        return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(dh)),
                             _mm512_cvtepi32_ps(_mm512_sub_epi32(nib, _mm512_set1_epi32(8))));
    }
    case IE_KV_FP8_E5M2:
        return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, row + 16 * c)), 8));
    case IE_KV_FP8_E4M3: {
        const __m256i x = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, row + 16 * c));
        const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7f)), 7),
                                          _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8));
        return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    }
    default: return _mm512_maskz_loadu_ps(m, row + 64 * c);
    }
}

/* The scale of a q8 row. */
IE_INLINE float q8_scale(const unsigned char *row) { return ldf(row); }

/* Every 64-byte line of a row's bytes, into L2. */
IE_INLINE void prefetch_bytes(const unsigned char *r, size_t n)
{
    const uintptr_t e = (uintptr_t)r + n; /* a head of a row need not start a line */
    for (uintptr_t l = (uintptr_t)r & ~(uintptr_t)63; l < e; l += 64) _mm_prefetch((const char *)l, _MM_HINT_T1);
}

/* Sum of each of v[0..15]'s 16 lanes, as lanes 0..15 of the result; F
 * selects float or int32 adds (the shuffles are the same). */
#define TRANSPOSE_REDUCE16(NAME, ADD)                                                                           \
    IE_INLINE __m512 NAME(const __m512 v[16])                                                                   \
    {                                                                                                           \
        __m512 t[8], u[4], w[2];                                                                                \
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)                                                     \
            t[p] = ADD(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]), _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1])); \
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++)                                                     \
        {                                                                                                       \
            const __m512d c = _mm512_castps_pd(t[2 * q]), d = _mm512_castps_pd(t[2 * q + 1]);                   \
            u[q] = ADD(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)), _mm512_castpd_ps(_mm512_unpackhi_pd(c, d))); \
        }                                                                                                       \
        _Pragma("GCC unroll 2") for (int r = 0; r < 2; r++)                                                     \
            w[r] = ADD(_mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(2, 0, 2, 0)),                   \
                       _mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(3, 1, 3, 1)));                  \
        return ADD(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),                                   \
                   _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));                                  \
    }
IE_INLINE __m512 add_i32(__m512 a, __m512 b)
{
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
TRANSPOSE_REDUCE16(reduce16_ps, _mm512_add_ps)
TRANSPOSE_REDUCE16(reduce16_epi32, add_i32)

/* --------------------------------------------------------------- scores */

/* Float-converted types: the 16 scores of head qh against rows[16]. */
/* (k0 != NULL: row r at k0 + r*step, the rows of one block, addressed
 * without the table: the same arithmetic) */
IE_INLINE void scores_tile_at(const ie_kv_type_t T, const int C, __mmask16 mt, const float *qh,
                              const unsigned char *k0, ptrdiff_t step, const unsigned char *const rows[16],
                              __m512 vs, float *dst)
{
    __m512 qv[MAXC], acc[16];
#pragma GCC unroll 16
    for (int c = 0; c < MAXC; c++) qv[c] = _mm512_setzero_ps(); /* (the unused ones: quiets GCC) */
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) qv[c] = _mm512_maskz_loadu_ps(c == C - 1 ? mt : 0xffff, qh + 16 * c);
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        const unsigned char *kr = k0 ? k0 + r * step : rows[r];
        __m512 a = _mm512_mul_ps(qv[0], kv_ld16(T, kr, 0, C == 1 ? mt : 0xffff));
#pragma GCC unroll 16
        for (int c = 1; c < C; c++) a = _mm512_fmadd_ps(qv[c], kv_ld16(T, kr, c, c == C - 1 ? mt : 0xffff), a);
        acc[r] = a;
    }
    _mm512_storeu_ps(dst, _mm512_mul_ps(reduce16_ps(acc), vs));
}

/* The 16 scores of head qh against rows[16]. */
IE_INLINE void scores_tile(const ie_kv_type_t T, const int C, __mmask16 mt, const float *qh,
                           const unsigned char *const rows[16], __m512 vs, float *dst)
{
    scores_tile_at(T, C, mt, qh, NULL, 0, rows, vs, dst);
}

/* q8: the 16 exact int32 dots of one int16 query head against rows[16]. */
IE_INLINE __m512i q8_tile(const int C2, __mmask32 mt, const int16_t *qi, const unsigned char *const rows[16])
{
    __m512i qv[MAXC / 2];
    __m512 acc[16];
#pragma GCC unroll 8
    for (int c = 0; c < MAXC / 2; c++) qv[c] = _mm512_setzero_si512(); /* (the unused ones: quiets GCC) */
#pragma GCC unroll 8
    for (int c = 0; c < C2; c++) qv[c] = _mm512_loadu_si512((const void *)(qi + 32 * c));
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int c = 0; c < C2; c++) {
            const __m512i k = _mm512_cvtepi8_epi16(
                _mm256_maskz_loadu_epi8(c == C2 - 1 ? mt : 0xffffffffu, rows[r] + 4 + 32 * c));
            a = _mm512_dpwssd_epi32(a, qv[c], k);
        }
        acc[r] = _mm512_castsi512_ps(a);
    }
    return _mm512_castps_si512(reduce16_epi32(acc));
}

/* The score of one head against one row kr, outside a whole tile: a q8
 * row on integers (qi, qs = its scale times `scale`), others by floats. */
IE_INLINE float score_row(const ie_kv_type_t T, const int C, __mmask16 mt, int C2, __mmask32 mt2, const float *qh,
                          const int16_t *qi, float qs, const unsigned char *kr, float scale)
{
    if (T == IE_KV_Q8) {
        __m512i a = _mm512_setzero_si512();
        for (int c = 0; c < C2; c++) {
            const __m512i kk = _mm512_cvtepi8_epi16(
                _mm256_maskz_loadu_epi8(c == C2 - 1 ? mt2 : 0xffffffffu, kr + 4 + 32 * c));
            const __m512i qq = _mm512_loadu_si512((const void *)(qi + 32 * c));
            a = _mm512_dpwssd_epi32(a, qq, kk);
        }
        return ((float)_mm512_reduce_add_epi32(a) * q8_scale(kr)) * qs;
    }
    __m512 a = _mm512_setzero_ps();
    for (int c = 0; c < C; c++) {
        const __mmask16 m = c == C - 1 ? mt : 0xffff;
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qh + 16 * c), kv_ld16(T, kr, c, m), a);
    }
    return _mm512_reduce_add_ps(a) * scale;
}

/* Heads quantized a batch at a time (the int16 queries live on the stack). */
#define QB 8

IE_INLINE void scores_body(const ie_kv_type_t T, const int C, const float *q, size_t q_stride, int nh,
                           const ie_kv_rows_t *k, int j0, int n, int hd, float scale, float *s, size_t ld)
{
    const __m512 vs = _mm512_set1_ps(scale);
    const __mmask16 mt = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff;
    const int C2 = (hd + 31) / 32;
    const __mmask32 mt2 = hd % 32 ? (__mmask32)((1u << (hd % 32)) - 1) : (__mmask32)0xffffffffu;
    const size_t rb = ie_kv_head_bytes(T, hd);
    _Alignas(64) int16_t qi[QB][IE_KV_MAX_HD];
    float qs[QB];
    for (int h0 = 0; h0 < nh; h0 += QB) {
        const int g = nh - h0 < QB ? nh - h0 : QB;
        if (T == IE_KV_Q8)
            for (int h = 0; h < g; h++) {
                float dq;
                ie_kv_quantize_q16(q + (size_t)(h0 + h) * q_stride, hd, qi[h], &dq);
                qs[h] = dq * scale;
            }
        ie_kv_cursor_t cur, pre;
        ie_kv_cursor_init(&cur, k, j0);
        ie_kv_cursor_init(&pre, k, j0);
        int pj = 0;
        for (; pj < n && pj < PF_ROWS; pj++) prefetch_bytes(ie_kv_cursor_next(&pre), rb);
        const unsigned char *rows[16];
        int j = 0;
        for (; j + 16 <= n; j += 16) {
            for (const int e = pj + 16 < n ? pj + 16 : n; pj < e; pj++) prefetch_bytes(ie_kv_cursor_next(&pre), rb);
            for (int r = 0; r < 16; r++) rows[r] = ie_kv_cursor_next(&cur);
            if (T == IE_KV_Q8) {
                float dk[16];
                for (int r = 0; r < 16; r++) dk[r] = q8_scale(rows[r]);
                const __m512 vdk = _mm512_loadu_ps(dk);
                for (int h = 0; h < g; h++) {
                    const __m512 d = _mm512_cvtepi32_ps(q8_tile(C2, mt2, qi[h], rows));
                    _mm512_storeu_ps(s + (size_t)(h0 + h) * ld + j,
                                     _mm512_mul_ps(_mm512_mul_ps(d, vdk), _mm512_set1_ps(qs[h])));
                }
            } else
                for (int h = 0; h < g; h++)
                    scores_tile(T, C, mt, q + (size_t)(h0 + h) * q_stride, rows, vs, s + (size_t)(h0 + h) * ld + j);
        }
        for (; j < n; j++) { /* the last rows, one at a time */
            const unsigned char *kr = ie_kv_cursor_next(&cur);
            for (int h = 0; h < g; h++)
                s[(size_t)(h0 + h) * ld + j] = score_row(T, C, mt, C2, mt2, q + (size_t)(h0 + h) * q_stride, qi[h],
                                                         qs[h], kr, scale);
        }
    }
}

#define SCORES_T(NAME, T)                                                                                   \
    static void NAME(const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0, int n, int hd, \
                     float scale, float *s, size_t ld)                                                      \
    {                                                                                                       \
        const int C = (hd + 15) / 16;                                                                       \
        if (C == 4) scores_body(T, 4, q, q_stride, nh, k, j0, n, hd, scale, s, ld);                         \
        else if (C == 8) scores_body(T, 8, q, q_stride, nh, k, j0, n, hd, scale, s, ld);                    \
        else scores_body(T, C, q, q_stride, nh, k, j0, n, hd, scale, s, ld);                                \
    }
// clang-format off
SCORES_T(scores_f32, IE_KV_F32)
SCORES_T(scores_f16, IE_KV_F16)
SCORES_T(scores_bf16, IE_KV_BF16)
SCORES_T(scores_q8, IE_KV_Q8)
SCORES_T(scores_q4, IE_KV_Q4)
SCORES_T(scores_e4m3, IE_KV_FP8_E4M3)
SCORES_T(scores_e5m2, IE_KV_FP8_E5M2)
// clang-format on

/* Contract (ie_kernels_t.kv_scores). */
void ie_kv_scores_avx512(ie_kv_type_t t, const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0,
                         int n, int hd, float scale, float *s, size_t ld)
{
    if (hd <= 0 || hd > IE_KV_MAX_HD) {
        ie_kv_scores_ref(t, q, q_stride, nh, k, j0, n, hd, scale, s, ld);
        return;
    }
    switch (t) {
    case IE_KV_F32: scores_f32(q, q_stride, nh, k, j0, n, hd, scale, s, ld); break;
    case IE_KV_F16: scores_f16(q, q_stride, nh, k, j0, n, hd, scale, s, ld); break;
    case IE_KV_BF16: scores_bf16(q, q_stride, nh, k, j0, n, hd, scale, s, ld); break;
    case IE_KV_Q8: scores_q8(q, q_stride, nh, k, j0, n, hd, scale, s, ld); break;
    case IE_KV_Q4: scores_q4(q, q_stride, nh, k, j0, n, hd, scale, s, ld); break;
    case IE_KV_FP8_E4M3: scores_e4m3(q, q_stride, nh, k, j0, n, hd, scale, s, ld); break;
    case IE_KV_FP8_E5M2: scores_e5m2(q, q_stride, nh, k, j0, n, hd, scale, s, ld); break;
    default: break;
    }
}

/* --------------------------------------------------------------- values */

/* acc[hh*C + c] += wv[hh] * row vj for the g <= G heads used: the row
 * converted once (a q8 row times its scale: the decoded value's bits,
 * kv_decode), C chunks of 16 values, the last masked by mt. */
IE_INLINE void values_row(const ie_kv_type_t T, const int C, const int G, int g, __mmask16 mt,
                          const unsigned char *vj, const __m512 *wv, __m512 *acc)
{
    const __m512 dv = _mm512_set1_ps(T == IE_KV_Q8 ? q8_scale(vj) : 1.0f);
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
        __m512 x = kv_ld16(T, vj, c, c == C - 1 ? mt : 0xffff);
        if (T == IE_KV_Q8) x = _mm512_mul_ps(dv, x);
#pragma GCC unroll 16
        for (int hh = 0; hh < G; hh++)
            if (hh < g) acc[hh * C + c] = _mm512_fmadd_ps(wv[hh], x, acc[hh * C + c]);
    }
}

/* The g used heads' accumulators to out (heads o_stride floats apart). */
IE_INLINE void values_store(const int C, const int G, int g, __mmask16 mt, const __m512 *acc, float *out,
                            size_t o_stride)
{
#pragma GCC unroll 16
    for (int hh = 0; hh < G; hh++)
        if (hh < g)
#pragma GCC unroll 16
            for (int c = 0; c < C; c++)
                _mm512_mask_storeu_ps(out + (size_t)hh * o_stride + 16 * c, c == C - 1 ? mt : 0xffff,
                                      acc[hh * C + c]);
}

/* One pass over the rows for G heads (G*C <= 16 accumulators; g <= G of
 * them used): each row converted once, weighted into every head. */
IE_INLINE void values_pass(const ie_kv_type_t T, const int C, const int G, int g, __mmask16 mt, const float *p,
                           size_t ld, const ie_kv_rows_t *v, int j0, int n, size_t rb, float *out, size_t o_stride)
{
    __m512 acc[MAXC];
#pragma GCC unroll 16
    for (int i = 0; i < G * C; i++) acc[i] = _mm512_setzero_ps();
    ie_kv_cursor_t cur, pre;
    ie_kv_cursor_init(&cur, v, j0);
    ie_kv_cursor_init(&pre, v, j0);
    int pj = 0;
    for (; pj < n && pj < PF_ROWS; pj++) prefetch_bytes(ie_kv_cursor_next(&pre), rb);
    __m512 wv[MAXC];
#pragma GCC unroll 16
    for (int i = 0; i < MAXC; i++) wv[i] = _mm512_setzero_ps(); /* (past G: quiets GCC) */
    for (int j = 0; j < n; j++) {
        const unsigned char *vj = ie_kv_cursor_next(&cur);
        if (pj < n) {
            prefetch_bytes(ie_kv_cursor_next(&pre), rb);
            pj++;
        }
#pragma GCC unroll 16
        for (int hh = 0; hh < G; hh++)
            wv[hh] = hh < g ? _mm512_set1_ps(p[(size_t)hh * ld + j]) : _mm512_setzero_ps();
        values_row(T, C, G, g, mt, vj, wv, acc);
    }
    values_store(C, G, g, mt, acc, out, o_stride);
}

#define VALUES_T(NAME, T)                                                                                         \
    static void NAME(const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n, int hd, float *out, \
                     size_t o_stride)                                                                             \
    {                                                                                                             \
        const int C = (hd + 15) / 16, HG = MAXC / C;                                                              \
        const __mmask16 mt = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff;                    \
        const size_t rb = ie_kv_head_bytes(T, hd);                                                                \
        for (int h0 = 0; h0 < nh; h0 += HG) {                                                                     \
            const int g = nh - h0 < HG ? nh - h0 : HG;                                                            \
            const float *ph = p + (size_t)h0 * ld;                                                                \
            float *oh = out + (size_t)h0 * o_stride;                                                              \
            if (C == 4) values_pass(T, 4, 4, g, mt, ph, ld, v, j0, n, rb, oh, o_stride);                          \
            else if (C == 8) values_pass(T, 8, 2, g, mt, ph, ld, v, j0, n, rb, oh, o_stride);                     \
            else values_pass(T, C, HG, g, mt, ph, ld, v, j0, n, rb, oh, o_stride);                                \
        }                                                                                                         \
    }
// clang-format off
VALUES_T(values_f32, IE_KV_F32)
VALUES_T(values_f16, IE_KV_F16)
VALUES_T(values_bf16, IE_KV_BF16)
VALUES_T(values_q8, IE_KV_Q8)
VALUES_T(values_q4, IE_KV_Q4)
VALUES_T(values_e4m3, IE_KV_FP8_E4M3)
VALUES_T(values_e5m2, IE_KV_FP8_E5M2)
// clang-format on

/* Contract (ie_kernels_t.kv_values). */
void ie_kv_values_avx512(ie_kv_type_t t, const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n,
                         int hd, float *out, size_t o_stride)
{
    if (hd <= 0 || hd > IE_KV_MAX_HD) {
        ie_kv_values_ref(t, p, ld, nh, v, j0, n, hd, out, o_stride);
        return;
    }
    switch (t) {
    case IE_KV_F32: values_f32(p, ld, nh, v, j0, n, hd, out, o_stride); break;
    case IE_KV_F16: values_f16(p, ld, nh, v, j0, n, hd, out, o_stride); break;
    case IE_KV_BF16: values_bf16(p, ld, nh, v, j0, n, hd, out, o_stride); break;
    case IE_KV_Q8: values_q8(p, ld, nh, v, j0, n, hd, out, o_stride); break;
    case IE_KV_Q4: values_q4(p, ld, nh, v, j0, n, hd, out, o_stride); break;
    case IE_KV_FP8_E4M3: values_e4m3(p, ld, nh, v, j0, n, hd, out, o_stride); break;
    case IE_KV_FP8_E5M2: values_e5m2(p, ld, nh, v, j0, n, hd, out, o_stride); break;
    default: break;
    }
}

/* --------------------------------------------------------------- decode */

#define DECODE_T(NAME, T)                                                                      \
    static void NAME(const unsigned char *s, int hd, float *y)                                 \
    {                                                                                          \
        const int C = (hd + 15) / 16;                                                          \
        const __mmask16 mt = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff; \
        const __m512 d = _mm512_set1_ps(T == IE_KV_Q8 ? q8_scale(s) : 1.0f);                   \
        for (int c = 0; c < C; c++) {                                                          \
            const __mmask16 m = c == C - 1 ? mt : 0xffff;                                      \
            const __m512 x = kv_ld16(T, s, c, m);                                              \
            _mm512_mask_storeu_ps(y + 16 * c, m, T == IE_KV_Q8 ? _mm512_mul_ps(d, x) : x);     \
        }                                                                                      \
    }
// clang-format off
DECODE_T(decode_f32, IE_KV_F32)
DECODE_T(decode_f16, IE_KV_F16)
DECODE_T(decode_bf16, IE_KV_BF16)
DECODE_T(decode_q8, IE_KV_Q8)
DECODE_T(decode_q4, IE_KV_Q4)
DECODE_T(decode_e4m3, IE_KV_FP8_E4M3)
DECODE_T(decode_e5m2, IE_KV_FP8_E5M2)
// clang-format on

/* Contract (ie_kernels_t.kv_decode). */
void ie_kv_decode_avx512(ie_kv_type_t t, const void *src, int hd, float *y)
{
    const unsigned char *s = src;
    if (hd <= 0) return;
    switch (t) {
    case IE_KV_F32: decode_f32(s, hd, y); break;
    case IE_KV_F16: decode_f16(s, hd, y); break;
    case IE_KV_BF16: decode_bf16(s, hd, y); break;
    case IE_KV_Q8: decode_q8(s, hd, y); break;
    case IE_KV_Q4: decode_q4(s, hd, y); break;
    case IE_KV_FP8_E4M3: decode_e4m3(s, hd, y); break;
    case IE_KV_FP8_E5M2: decode_e5m2(s, hd, y); break;
    default: break;
    }
}

/* --------------------------------------------------------------- attend */

/* kv_attend: steps of 64 rows. Every head of a pass against the step's K
 * rows in tiles of 16 counted from the call's first row (the kv_scores
 * tiles above: the same scores), then per head the step's max, every
 * head's rescale factor in one exp_ps, the step's exp and a lane-wise sum
 * of them, then the step's V rows into the heads' f32 outputs, which live
 * in the state (L1) and are rescaled as a pass loads them: 64 rows of FMAs
 * a load and store of hd floats (a step of 16 rows measured ~15% slower
 * than the two-pass loops on a q8 cache, the loads, stores and
 * reductions of each step its cost). */

#define AB 16       /* heads a pass: their int16 queries, scores and weights on the stack */
#define PF_AHEAD 64 /* rows of K and V fetched ahead (one step) */
#define ST 64       /* rows a step: 4 score tiles, one softmax update and one pass of the values */

/* The scores of g heads against a tile's nr <= 16 rows: s[h*ST + r]. */
typedef void (*att_scores_fn)(const float *q, size_t q_stride, const int16_t (*qi)[IE_KV_MAX_HD], const float *qs,
                              int g, const unsigned char *const rows[16], int nr, int hd, float scale, float *s);
/* o[h*os + i] = alpha[h] o[h*os + i] + sum_r p[h*ST + r] row_r[i], h < g, r < nr <= ST. */
typedef void (*att_values_fn)(const float *p, const float *alpha, int g, const unsigned char *const rows[ST],
                              int nr, int hd, float *o, size_t os);

IE_INLINE void att_scores_body(const ie_kv_type_t T, const int C, const float *q, size_t q_stride,
                               const int16_t (*qi)[IE_KV_MAX_HD], const float *qs, int g,
                               const unsigned char *const rows[16], int nr, int hd, float scale, float *s)
{
    const __mmask16 mt = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff;
    const int C2 = (hd + 31) / 32;
    const __mmask32 mt2 = hd % 32 ? (__mmask32)((1u << (hd % 32)) - 1) : (__mmask32)0xffffffffu;
    if (nr == 16) {
        if (T == IE_KV_Q8) {
            float dk[16];
            for (int r = 0; r < 16; r++) dk[r] = q8_scale(rows[r]);
            const __m512 vdk = _mm512_loadu_ps(dk);
            for (int h = 0; h < g; h++) {
                const __m512 d = _mm512_cvtepi32_ps(q8_tile(C2, mt2, qi[h], rows));
                _mm512_storeu_ps(s + ST * h, _mm512_mul_ps(_mm512_mul_ps(d, vdk), _mm512_set1_ps(qs[h])));
            }
        } else {
            /* rows at one stride (a tile inside a block): no table reads */
            const ptrdiff_t step = rows[1] - rows[0];
            int even = 1;
            for (int r = 2; r < 16; r++) even &= rows[r] == rows[r - 1] + step;
            for (int h = 0; h < g; h++)
                scores_tile_at(T, C, mt, q + (size_t)h * q_stride, even ? rows[0] : NULL, step, rows,
                               _mm512_set1_ps(scale), s + ST * h);
        }
        return;
    }
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < g; h++)
            s[ST * h + r] = score_row(T, C, mt, C2, mt2, q + (size_t)h * q_stride, qi[h], qs[h], rows[r], scale);
}

#define ATT_SCORES_T(NAME, T)                                                                                   \
    static void NAME(const float *q, size_t q_stride, const int16_t(*qi)[IE_KV_MAX_HD], const float *qs, int g, \
                     const unsigned char *const rows[16], int nr, int hd, float scale, float *s)                \
    {                                                                                                           \
        const int C = (hd + 15) / 16;                                                                           \
        /* hd 64 and 128 as constants: whole chunks, plain loads */                                             \
        if (hd == 64) att_scores_body(T, 4, q, q_stride, qi, qs, g, rows, nr, 64, scale, s);                    \
        else if (hd == 128) att_scores_body(T, 8, q, q_stride, qi, qs, g, rows, nr, 128, scale, s);             \
        else if (C == 4) att_scores_body(T, 4, q, q_stride, qi, qs, g, rows, nr, hd, scale, s);                 \
        else if (C == 8) att_scores_body(T, 8, q, q_stride, qi, qs, g, rows, nr, hd, scale, s);                 \
        else att_scores_body(T, C, q, q_stride, qi, qs, g, rows, nr, hd, scale, s);                             \
    }
// clang-format off
ATT_SCORES_T(att_scores_f32, IE_KV_F32)
ATT_SCORES_T(att_scores_f16, IE_KV_F16)
ATT_SCORES_T(att_scores_bf16, IE_KV_BF16)
ATT_SCORES_T(att_scores_q8, IE_KV_Q8)
ATT_SCORES_T(att_scores_q4, IE_KV_Q4)
ATT_SCORES_T(att_scores_e4m3, IE_KV_FP8_E4M3)
ATT_SCORES_T(att_scores_e5m2, IE_KV_FP8_E5M2)
// clang-format on

/* G heads (g of them used) x C chunks of accumulators, G*C <= 16, each V
 * row converted once (q8: times its scale, the decoded value's bits). */
IE_INLINE void att_values_pass(const ie_kv_type_t T, const int C, const int G, int g, __mmask16 mt, const float *p,
                               const float *alpha, const unsigned char *const rows[ST], int nr, float *o, size_t os)
{
    __m512 acc[MAXC], wv[MAXC];
#pragma GCC unroll 16
    for (int i = 0; i < MAXC; i++) acc[i] = wv[i] = _mm512_setzero_ps(); /* (past G*C: quiets GCC) */
#pragma GCC unroll 16
    for (int hh = 0; hh < G; hh++)
        if (hh < g)
#pragma GCC unroll 16
            for (int c = 0; c < C; c++)
                acc[hh * C + c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(c == C - 1 ? mt : 0xffff,
                                                                      o + (size_t)hh * os + 16 * c),
                                                _mm512_set1_ps(alpha[hh]));
    for (int r = 0; r < nr; r++) {
        const unsigned char *vj = rows[r];
#pragma GCC unroll 16
        for (int hh = 0; hh < G; hh++)
            if (hh < g) wv[hh] = _mm512_set1_ps(p[ST * hh + r]);
        values_row(T, C, G, g, mt, vj, wv, acc);
    }
    values_store(C, G, g, mt, acc, o, os);
}

#define ATT_VALUES_T(NAME, T)                                                                                \
    static void NAME(const float *p, const float *alpha, int g, const unsigned char *const rows[ST], int nr, \
                     int hd, float *o, size_t os)                                                            \
    {                                                                                                        \
        const int C = (hd + 15) / 16, HG = MAXC / C;                                                         \
        const __mmask16 mt = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff;               \
        for (int h0 = 0; h0 < g; h0 += HG) {                                                                 \
            const int gg = g - h0 < HG ? g - h0 : HG;                                                        \
            const float *ph = p + ST * h0, *ah = alpha + h0;                                                 \
            float *oh = o + (size_t)h0 * os;                                                                 \
            /* a whole group: g a constant, no test of hh < g per FMA */                                     \
            if (hd == 64 && gg == 4) att_values_pass(T, 4, 4, 4, 0xffff, ph, ah, rows, nr, oh, os);          \
            else if (hd == 128 && gg == 2) att_values_pass(T, 8, 2, 2, 0xffff, ph, ah, rows, nr, oh, os);    \
            else if (C == 4 && gg == 4) att_values_pass(T, 4, 4, 4, mt, ph, ah, rows, nr, oh, os);           \
            else if (C == 4) att_values_pass(T, 4, 4, gg, mt, ph, ah, rows, nr, oh, os);                     \
            else if (C == 8 && gg == 2) att_values_pass(T, 8, 2, 2, mt, ph, ah, rows, nr, oh, os);           \
            else if (C == 8) att_values_pass(T, 8, 2, gg, mt, ph, ah, rows, nr, oh, os);                     \
            else att_values_pass(T, C, HG, gg, mt, ph, ah, rows, nr, oh, os);                                \
        }                                                                                                    \
    }
// clang-format off
ATT_VALUES_T(att_values_f32, IE_KV_F32)
ATT_VALUES_T(att_values_f16, IE_KV_F16)
ATT_VALUES_T(att_values_bf16, IE_KV_BF16)
ATT_VALUES_T(att_values_q8, IE_KV_Q8)
ATT_VALUES_T(att_values_q4, IE_KV_Q4)
ATT_VALUES_T(att_values_e4m3, IE_KV_FP8_E4M3)
ATT_VALUES_T(att_values_e5m2, IE_KV_FP8_E5M2)
// clang-format on

static const att_scores_fn att_scores_tab[IE_KV_TYPE_COUNT] = {att_scores_f32, att_scores_f16, att_scores_bf16,
                                                               att_scores_q8,  att_scores_q4,  att_scores_e4m3,
                                                               att_scores_e5m2};
static const att_values_fn att_values_tab[IE_KV_TYPE_COUNT] = {att_values_f32, att_values_f16, att_values_bf16,
                                                               att_values_q8,  att_values_q4,  att_values_e4m3,
                                                               att_values_e5m2};

/* Contract (ie_kernels_t.kv_attend). */
void ie_kv_attend_avx512(const ie_kv_attend_t *a, const ie_attn_state_t *st)
{
    const int hd = a->hd;
    if (hd <= 0 || hd > IE_KV_MAX_HD || (unsigned)a->kt >= IE_KV_TYPE_COUNT ||
        (unsigned)a->vt >= IE_KV_TYPE_COUNT) {
        ie_kv_attend_ref(a, st);
        return;
    }
    const att_scores_fn sf = att_scores_tab[a->kt];
    const att_values_fn vf = att_values_tab[a->vt];
    const size_t kb = ie_kv_head_bytes(a->kt, hd), vb = ie_kv_head_bytes(a->vt, hd);
    const float inv_cap = a->cap != 0.0f ? 1.0f / a->cap : 0.0f;
    _Alignas(64) int16_t qi[AB][IE_KV_MAX_HD];
    _Alignas(64) float s[AB * ST], p[AB * ST];
    float qs[AB], alpha[AB], mn[AB];
    __m512 lv[AB];
    for (int h0 = 0; h0 < a->nh; h0 += AB) {
        const int g = a->nh - h0 < AB ? a->nh - h0 : AB;
        const float *q = a->q + (size_t)h0 * a->q_stride;
        if (a->kt == IE_KV_Q8)
            for (int h = 0; h < g; h++) {
                float dq;
                ie_kv_quantize_q16(q + (size_t)h * a->q_stride, hd, qi[h], &dq);
                qs[h] = dq * a->scale;
            }
        float *m = st->m + h0, *l = st->l + h0, *o = st->o + (size_t)h0 * st->os;
        for (int h = 0; h < g; h++) {
            m[h] = -INFINITY;
            lv[h] = _mm512_setzero_ps();
            memset(o + (size_t)h * st->os, 0, (size_t)hd * sizeof(float));
        }
        ie_kv_cursor_t ck, cv, pk, pv;
        ie_kv_cursor_init(&ck, a->k, a->kj);
        ie_kv_cursor_init(&cv, a->v, a->vj);
        ie_kv_cursor_init(&pk, a->k, a->kj);
        ie_kv_cursor_init(&pv, a->v, a->vj);
        /* K and V rows fetched into L2 one step ahead, 16 rows of each
         * between two score tiles: a burst of a step's rows as it starts
         * ran a q8 cache from DRAM at 1.27x the two-pass loops' time, this
         * at 1.02-1.06x (bench_attend --layers 24; 32 or 128 rows ahead
         * measured no better) */
        int pj = 0;
        for (; pj < a->n && pj < PF_AHEAD; pj++) {
            prefetch_bytes(ie_kv_cursor_next(&pk), kb);
            prefetch_bytes(ie_kv_cursor_next(&pv), vb);
        }
        const unsigned char *kr[ST], *vr[ST];
        for (int t = 0; t < a->n; t += ST) {
            const int nr = a->n - t < ST ? a->n - t : ST;
            for (int r = 0; r < nr; r++) {
                kr[r] = ie_kv_cursor_next(&ck);
                vr[r] = ie_kv_cursor_next(&cv);
            }
            for (int u = 0; u < nr; u += 16) { /* tiles of 16 from the call's first row */
                for (const int e = pj + 16 < a->n ? pj + 16 : a->n; pj < e; pj++) {
                    prefetch_bytes(ie_kv_cursor_next(&pk), kb);
                    prefetch_bytes(ie_kv_cursor_next(&pv), vb);
                }
                sf(q, a->q_stride, (const int16_t(*)[IE_KV_MAX_HD])qi, qs, g, kr + u, nr - u < 16 ? nr - u : 16, hd,
                   a->scale, s + u);
            }
            const int nv = (nr + 15) / 16; /* vectors of scores, the last masked */
            const __mmask16 ml = (__mmask16)(nr % 16 ? (1u << (nr % 16)) - 1 : 0xffffu);
            for (int h = 0; h < g; h++) { /* the scores as the softmax sees them, the new maxima */
                float *sh = s + ST * h;
                if (a->cap != 0.0f) /* Gemma 2: c tanh(s / c), after the add */
                    for (int r = 0; r < nr; r++) {
                        const float x = a->add ? sh[r] + a->add[h0 + h] : sh[r];
                        sh[r] = a->cap * tanhf(x * inv_cap);
                    }
                __m512 vmax = _mm512_set1_ps(-INFINITY);
                for (int c = 0; c < nv; c++) {
                    const __mmask16 mc = c == nv - 1 ? ml : 0xffff;
                    __m512 x = _mm512_maskz_loadu_ps(mc, sh + 16 * c);
                    if (a->add && a->cap == 0.0f) {
                        x = _mm512_add_ps(x, _mm512_set1_ps(a->add[h0 + h]));
                        _mm512_mask_storeu_ps(sh + 16 * c, mc, x);
                    }
                    vmax = _mm512_mask_max_ps(vmax, mc, vmax, x);
                }
                const float tmax = _mm512_reduce_max_ps(vmax);
                mn[h] = tmax > m[h] ? tmax : m[h];
            }
            /* every head's rescale factor in one exp: exactly 1 where the
             * max stands, ~1e-38 (times zeros) before the first step */
            for (int h = 0; h < g; h += 16) {
                const __mmask16 mh = (__mmask16)(g - h >= 16 ? 0xffffu : (1u << (g - h)) - 1);
                const __m512 mold = _mm512_maskz_loadu_ps(mh, m + h), mnew = _mm512_maskz_loadu_ps(mh, mn + h);
                _mm512_mask_storeu_ps(alpha + h, mh, exp_ps(_mm512_sub_ps(mold, mnew)));
                _mm512_mask_storeu_ps(m + h, mh, mnew);
            }
            for (int h = 0; h < g; h++) {
                const __m512 vm = _mm512_set1_ps(mn[h]);
                __m512 acc = _mm512_mul_ps(lv[h], _mm512_set1_ps(alpha[h]));
                for (int c = 0; c < nv; c++) {
                    const __mmask16 mc = c == nv - 1 ? ml : 0xffff;
                    const __m512 e = _mm512_maskz_mov_ps(
                        mc, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mc, s + ST * h + 16 * c), vm)));
                    _mm512_storeu_ps(p + ST * h + 16 * c, e);
                    acc = _mm512_add_ps(acc, e); /* the sum of exp, lane-wise */
                }
                lv[h] = acc;
            }
            vf(p, alpha, g, vr, nr, hd, o, st->os);
        }
        for (int h = 0; h < g; h++) l[h] = a->n ? _mm512_reduce_add_ps(lv[h]) : 0.0f;
    }
}
