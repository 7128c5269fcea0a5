/* kvcache_avx2.c — attention over a typed KV cache with AVX2 (ie_kvcache.h).
 *
 * Each row is converted 8 values a step (f16 by vcvtph2ps, bf16 by a shift,
 * FP8 through f16 as in kvcache_avx512.c, q4 nibbles widened; a tail of
 * fewer than 8 values by the scalar decode) into a row of floats on the
 * stack (L1), which the score and value loops read at once. A q8 K cache
 * is scored on integers: the int16 query (ie_kv_quantize_q16) against the
 * widened int8 row by vpmaddwd, the exact int32 sum scaled after, as the
 * oracle does, so its scores are ie_kv_scores_ref's bits.
 */
#include "../../src/ie_kernels_isa.h"
#include "avx2_inl.h"

#include <string.h>

/* 8 values (chunk c: values 8c ..) of a row of type T as floats (q8
 * scaled by its row's scale, q4 by its group's). */
IE_INLINE __m256 kv_ld8(const ie_kv_type_t T, const unsigned char *row, int c)
{
    switch (T) {
    case IE_KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c)));
    case IE_KV_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c))),
                              16));
    case IE_KV_Q8: {
        const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(row + 4 + 8 * c));
        return _mm256_mul_ps(_mm256_set1_ps(ld_f32(row)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
    }
    case IE_KV_Q4: {
        const unsigned char *g = row + (c >> 2) * 18;
        uint16_t dh;
        memcpy(&dh, g, 2);
        const int part = c & 3; /* values 8*part .. of the group: bytes (part & 1) * 8 .., nibble part >> 1 */
        const __m256i b = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64((const __m128i *)(const void *)(g + 2 + (part & 1) * 8)));
        const __m256i nib = part >> 1 ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)),
                             _mm256_cvtepi32_ps(_mm256_sub_epi32(nib, _mm256_set1_epi32(8))));
    }
    case IE_KV_FP8_E5M2: {
        const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(row + 8 * c)));
        return _mm256_cvtph_ps(_mm_slli_epi16(x, 8));
    }
    case IE_KV_FP8_E4M3: {
        const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(row + 8 * c)));
        const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7f)), 7),
                                       _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8));
        return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    }
    default: return _mm256_loadu_ps((const float *)(const void *)(row + 32 * c));
    }
}

/* Bytes of the first `v` values of a row of type t (q4 never has a tail). */
static size_t val_bytes(ie_kv_type_t t, int v)
{
    return t == IE_KV_F32 ? 4 * (size_t)v : t == IE_KV_F16 || t == IE_KV_BF16 ? 2 * (size_t)v : (size_t)v;
}

IE_INLINE void decode_body(const ie_kv_type_t T, const unsigned char *s, int hd, float *y)
{
    int c = 0;
    for (; 8 * c + 8 <= hd; c++) _mm256_storeu_ps(y + 8 * c, kv_ld8(T, s, c));
    if (8 * c < hd) { /* the tail: the scalar decode of its values */
        if (T == IE_KV_Q8) {
            float d;
            memcpy(&d, s, 4);
            for (int i = 8 * c; i < hd; i++) y[i] = d * (float)(int8_t)s[4 + i];
        } else ie_kv_decode_ref(T, s + val_bytes(T, 8 * c), hd - 8 * c, y + 8 * c);
    }
}

#define DECODE_T(NAME, T) \
    static void NAME(const unsigned char *s, int hd, float *y) { decode_body(T, s, hd, y); }
// clang-format off
DECODE_T(decode_f16, IE_KV_F16)
DECODE_T(decode_bf16, IE_KV_BF16)
DECODE_T(decode_q8, IE_KV_Q8)
DECODE_T(decode_q4, IE_KV_Q4)
DECODE_T(decode_e4m3, IE_KV_FP8_E4M3)
DECODE_T(decode_e5m2, IE_KV_FP8_E5M2)
// clang-format on

/* Contract (ie_kernels_t.kv_decode). */
void ie_kv_decode_avx2(ie_kv_type_t t, const void *src, int hd, float *y)
{
    const unsigned char *s = src;
    switch (t) {
    case IE_KV_F16: decode_f16(s, hd, y); break;
    case IE_KV_BF16: decode_bf16(s, hd, y); break;
    case IE_KV_Q8: decode_q8(s, hd, y); break;
    case IE_KV_Q4: decode_q4(s, hd, y); break;
    case IE_KV_FP8_E4M3: decode_e4m3(s, hd, y); break;
    case IE_KV_FP8_E5M2: decode_e5m2(s, hd, y); break;
    default: ie_kv_decode_ref(t, s, hd, y); break;
    }
}

/* Horizontal sums. */
IE_INLINE float hsum8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}
IE_INLINE int32_t hsum8_epi32(__m256i v)
{
    __m128i a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(a);
}

/* f32 dot of two rows of hd floats (8 at a time, the tail scalar). */
static float dot_row(const float *a, const float *b, int hd)
{
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= hd; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < hd; i++) s += a[i] * b[i];
    return s;
}

/* A q8 row's score: the exact int32 dot of the int16 query qi (32-byte
 * aligned, zeros past hd) and its int8 values, times its scale, times qs
 * (the query's scale times the score scale), as the oracle computes it. */
static float q8_score(const int16_t *qi, const unsigned char *row, int hd, float qs)
{
    const int8_t *kr = (const int8_t *)(row + 4);
    __m256i acc = _mm256_setzero_si256();
    int i = 0;
    for (; i + 16 <= hd; i += 16) {
        const __m256i kk = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(kr + i)));
        acc = _mm256_add_epi32(acc,
                               _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(const void *)(qi + i)), kk));
    }
    int32_t dot = hsum8_epi32(acc);
    for (; i < hd; i++) dot += (int32_t)qi[i] * (int32_t)kr[i];
    return ((float)dot * ld_f32(row)) * qs;
}

/* Contract (ie_kernels_t.kv_scores). */
void ie_kv_scores_avx2(ie_kv_type_t t, const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0,
                       int n, int hd, float scale, float *s, size_t ld)
{
    if (hd <= 0 || hd > IE_KV_MAX_HD) {
        ie_kv_scores_ref(t, q, q_stride, nh, k, j0, n, hd, scale, s, ld);
        return;
    }
    ie_kv_cursor_t cur;
    ie_kv_cursor_init(&cur, k, j0);
    if (t == IE_KV_Q8) {
        /* one head at a time: its int16 query stays in L1 over the rows */
        _Alignas(32) int16_t qi[IE_KV_MAX_HD];
        for (int h = 0; h < nh; h++) {
            float dq;
            ie_kv_quantize_q16(q + (size_t)h * q_stride, hd, qi, &dq);
            const float qs = dq * scale;
            ie_kv_cursor_init(&cur, k, j0);
            for (int j = 0; j < n; j++) s[(size_t)h * ld + j] = q8_score(qi, ie_kv_cursor_next(&cur), hd, qs);
        }
        return;
    }
    float kf[IE_KV_MAX_HD];
    for (int j = 0; j < n; j++) { /* each row converted once for every head */
        ie_kv_decode_avx2(t, ie_kv_cursor_next(&cur), hd, kf);
        for (int h = 0; h < nh; h++) s[(size_t)h * ld + j] = dot_row(q + (size_t)h * q_stride, kf, hd) * scale;
    }
}

/* Contract (ie_kernels_t.kv_values). */
void ie_kv_values_avx2(ie_kv_type_t t, const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n,
                       int hd, float *out, size_t o_stride)
{
    if (hd <= 0 || hd > IE_KV_MAX_HD) {
        ie_kv_values_ref(t, p, ld, nh, v, j0, n, hd, out, o_stride);
        return;
    }
    for (int h = 0; h < nh; h++) memset(out + (size_t)h * o_stride, 0, (size_t)hd * sizeof(float));
    float vf[IE_KV_MAX_HD];
    ie_kv_cursor_t cur;
    ie_kv_cursor_init(&cur, v, j0);
    for (int j = 0; j < n; j++) {
        ie_kv_decode_avx2(t, ie_kv_cursor_next(&cur), hd, vf);
        for (int h = 0; h < nh; h++) {
            float *o = out + (size_t)h * o_stride;
            const float w = p[(size_t)h * ld + j];
            const __m256 wv = _mm256_set1_ps(w);
            int i = 0;
            for (; i + 8 <= hd; i += 8)
                _mm256_storeu_ps(o + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(vf + i), _mm256_loadu_ps(o + i)));
            for (; i < hd; i++) o[i] += w * vf[i];
        }
    }
}

/* Contract (ie_kernels_t.kv_attend): tiles of 16 rows; each K row
 * converted once for every head of a pass (a q8 row scored on integers),
 * the softmax update by scalar expf (as this table's softmax), each V row
 * converted once into the heads' f32 outputs, rescaled as the tile starts. */
#define AB 16 /* heads a pass */
void ie_kv_attend_avx2(const ie_kv_attend_t *a, const ie_attn_state_t *st)
{
    const int hd = a->hd;
    if (hd <= 0 || hd > IE_KV_MAX_HD) {
        ie_kv_attend_ref(a, st);
        return;
    }
    const float inv_cap = a->cap != 0.0f ? 1.0f / a->cap : 0.0f;
    _Alignas(32) int16_t qi[AB][IE_KV_MAX_HD];
    float kf[IE_KV_MAX_HD], vf[IE_KV_MAX_HD], s[AB][16], qs[AB];
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
            l[h] = 0.0f;
            memset(o + (size_t)h * st->os, 0, (size_t)hd * sizeof(float));
        }
        ie_kv_cursor_t ck, cv;
        ie_kv_cursor_init(&ck, a->k, a->kj);
        ie_kv_cursor_init(&cv, a->v, a->vj);
        for (int t = 0; t < a->n; t += 16) {
            const int nr = a->n - t < 16 ? a->n - t : 16;
            for (int r = 0; r < nr; r++) {
                const unsigned char *row = ie_kv_cursor_next(&ck);
                if (a->kt == IE_KV_Q8) {
                    for (int h = 0; h < g; h++) s[h][r] = q8_score(qi[h], row, hd, qs[h]);
                    continue;
                }
                const float *k = kf;
                if (a->kt == IE_KV_F32 && hd % 8 == 0)
                    k = (const float *)(const void *)row; /* whole vectors: no float read unaligned */
                else ie_kv_decode_avx2(a->kt, row, hd, kf);
                for (int h = 0; h < g; h++) s[h][r] = dot_row(q + (size_t)h * a->q_stride, k, hd) * a->scale;
            }
            float alpha[AB];
            for (int h = 0; h < g; h++) {
                float tmax = -INFINITY;
                for (int r = 0; r < nr; r++) {
                    float x = a->add ? s[h][r] + a->add[h0 + h] : s[h][r];
                    if (a->cap != 0.0f) x = a->cap * tanhf(x * inv_cap);
                    s[h][r] = x;
                    tmax = x > tmax ? x : tmax;
                }
                const float mn = tmax > m[h] ? tmax : m[h];
                alpha[h] = l[h] > 0.0f ? expf(m[h] - mn) : 0.0f;
                float z = 0.0f;
                for (int r = 0; r < nr; r++) z += s[h][r] = expf(s[h][r] - mn);
                l[h] = l[h] * alpha[h] + z;
                m[h] = mn;
                float *oh = o + (size_t)h * st->os;
                const __m256 av = _mm256_set1_ps(alpha[h]);
                int i = 0;
                for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(oh + i, _mm256_mul_ps(av, _mm256_loadu_ps(oh + i)));
                for (; i < hd; i++) oh[i] *= alpha[h];
            }
            for (int r = 0; r < nr; r++) {
                const unsigned char *row = ie_kv_cursor_next(&cv);
                const float *v = vf;
                if (a->vt == IE_KV_F32 && hd % 8 == 0) v = (const float *)(const void *)row;
                else ie_kv_decode_avx2(a->vt, row, hd, vf);
                for (int h = 0; h < g; h++) {
                    float *oh = o + (size_t)h * st->os;
                    const float w = s[h][r];
                    const __m256 wv = _mm256_set1_ps(w);
                    int i = 0;
                    for (; i + 8 <= hd; i += 8)
                        _mm256_storeu_ps(oh + i,
                                         _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(oh + i)));
                    for (; i < hd; i++) oh[i] += w * v[i];
                }
            }
        }
    }
}
