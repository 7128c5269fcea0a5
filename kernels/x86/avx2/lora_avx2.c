/* lora_avx2.c — AVX2/FMA twins of ie_lora_shrink_ref / ie_lora_expand_ref.
 * The shrink takes four rows of A against two tokens per pass over the
 * input; the expand adds the rank rows of B^T to 32 columns of up to two
 * tokens' outputs held in registers (16 ymm registers bound both), so each
 * weight is loaded once per pair of tokens. The expand reads rank rows side
 * by side, more streams than the hardware prefetchers follow, so it
 * fetches each row ahead itself. One body for the three weight types (WT:
 * f32, bf16 widened as it is loaded, int8 converted and its column scales
 * folded as the oracle folds them). */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))
/* B^T elements ahead the expand fetches (as lora_avx512.c) */
#define LORA_PF 128

enum { WT_F32, WT_BF16, WT_I8 };

INL float hsum(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 8 weights at element i of A (bt 0) or B^T (bt 1) */
INL __m256 ld8(const ie_lora_args_t *p, int bt, size_t i, const int WT)
{
    if (WT == WT_I8)
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((bt ? p->bt8 : p->a8) + i))));
    if (WT == WT_BF16) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((bt ? p->bt16 : p->a16) + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    return _mm256_loadu_ps((bt ? p->bt : p->a) + i);
}

INL float ld1(const ie_lora_args_t *p, int bt, size_t i, const int WT)
{
    if (WT == WT_I8) return (float)(bt ? p->bt8 : p->a8)[i];
    if (WT == WT_BF16) {
        union {
            uint32_t u;
            float f;
        } v = {(uint32_t)(bt ? p->bt16 : p->a16)[i] << 16};
        return v.f;
    }
    return (bt ? p->bt : p->a)[i];
}

INL void shrink_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                     int64_t ldu, const int WT)
{
    const size_t n = (size_t)p->n_in, nf = n & ~(size_t)7;
    for (int t0 = 0; t0 < n_rows; t0 += 2) {
        const int nt = n_rows - t0 < 2 ? n_rows - t0 : 2;
        const float *x[2]; /* past the group's end: its last row again, its sums dropped */
        for (int i = 0; i < 2; i++) x[i] = p->x + (size_t)rows[t0 + (i < nt ? i : nt - 1)] * (size_t)p->ldx;
        for (int j = j0; j < j1; j += 4) {
            const int nj = j1 - j < 4 ? j1 - j : 4;
            size_t ra[4];
            for (int a = 0; a < 4; a++) ra[a] = (size_t)(j + (a < nj ? a : nj - 1)) * (size_t)p->lda;
            __m256 s[4][2];
            for (int a = 0; a < 4; a++) s[a][0] = s[a][1] = _mm256_setzero_ps();
            for (size_t k = 0; k < nf; k += 8) {
                __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
                if (WT == WT_I8) { /* A's column scales folded into the input */
                    const __m256 sv = _mm256_loadu_ps(p->sa + k);
                    x0 = _mm256_mul_ps(x0, sv), x1 = _mm256_mul_ps(x1, sv);
                }
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++) {
                    const __m256 wv = ld8(p, 0, ra[a] + k, WT);
                    s[a][0] = _mm256_fmadd_ps(wv, x0, s[a][0]);
                    s[a][1] = _mm256_fmadd_ps(wv, x1, s[a][1]);
                }
            }
            for (int a = 0; a < nj; a++)
                for (int i = 0; i < nt; i++) {
                    float r = hsum(s[a][i]);
                    for (size_t k = nf; k < n; k++)
                        r += ld1(p, 0, ra[a] + k, WT) * (WT == WT_I8 ? x[i][k] * p->sa[k] : x[i][k]);
                    u[(size_t)(t0 + i) * (size_t)ldu + (size_t)(j + a)] = p->scale * r;
                }
        }
    }
}

/* y[i][o..o+8c) += sum_j u[i][j] B^T[j][o..] for NT tokens, c 8-column
 * chunks; int8 sums first, then scales by sbt */
INL void expand_cols(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o, int c,
                     const int NT, const int WT)
{
    __m256 acc[2][4];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++)
            acc[i][q] = WT == WT_I8 ? _mm256_setzero_ps() : _mm256_loadu_ps(y[i] + o + 8 * q);
    const size_t es = WT == WT_I8 ? 1 : WT == WT_BF16 ? 2 : 4;
    const char *bt = WT == WT_I8     ? (const char *)p->bt8
                     : WT == WT_BF16 ? (const char *)p->bt16
                                     : (const char *)p->bt;
    for (int j = 0; j < p->rank; j++) {
        const size_t b = (size_t)j * (size_t)p->ldb + (size_t)o;
        __m256 wv[4];
        if (c == 4) { /* rank rows a row apart are rank streams: fetch ahead */
            const char *pf = bt + (b + LORA_PF) * es;
            _mm_prefetch(pf, _MM_HINT_T0);
            if (es > 2) _mm_prefetch(pf + 64, _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int q = 0; q < c; q++) wv[q] = ld8(p, 1, b + 8 * (size_t)q, WT);
#pragma GCC unroll 4
        for (int i = 0; i < NT; i++) {
            const __m256 uv = _mm256_broadcast_ss(&ut[i][j]);
#pragma GCC unroll 4
            for (int q = 0; q < c; q++) acc[i][q] = _mm256_fmadd_ps(uv, wv[q], acc[i][q]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++) {
            __m256 r = acc[i][q];
            if (WT == WT_I8)
                r = _mm256_fmadd_ps(r, _mm256_loadu_ps(p->sbt + o + 8 * q), _mm256_loadu_ps(y[i] + o + 8 * q));
            _mm256_storeu_ps(y[i] + o + 8 * q, r);
        }
}

INL void expand_tok(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o0, int64_t o1,
                    const int NT, const int WT)
{
    int64_t o = o0;
    for (; o + 32 <= o1; o += 32) expand_cols(p, y, ut, o, 4, NT, WT);
    for (; o + 8 <= o1; o += 8) expand_cols(p, y, ut, o, 1, NT, WT);
    for (; o < o1; o++)
        for (int i = 0; i < NT; i++) {
            const size_t b = (size_t)o;
            if (WT == WT_I8) {
                float s = 0.0f;
                for (int j = 0; j < p->rank; j++) s += ut[i][j] * ld1(p, 1, (size_t)j * (size_t)p->ldb + b, WT);
                y[i][o] += s * p->sbt[o];
            } else {
                float s = y[i][o];
                for (int j = 0; j < p->rank; j++) s += ut[i][j] * ld1(p, 1, (size_t)j * (size_t)p->ldb + b, WT);
                y[i][o] = s;
            }
        }
}

INL void expand_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                     const float *u, int64_t ldu, const int WT)
{
    for (int t0 = 0; t0 < n_rows; t0 += 2) {
        const int nt = n_rows - t0 < 2 ? n_rows - t0 : 2;
        float *y[2];
        const float *ut[2];
        for (int i = 0; i < nt; i++) {
            y[i] = p->y + (size_t)rows[t0 + i] * (size_t)p->ldy;
            ut[i] = u + (size_t)(t0 + i) * (size_t)ldu;
        }
        if (nt == 2) expand_tok(p, y, ut, o0, o1, 2, WT);
        else expand_tok(p, y, ut, o0, o1, 1, WT);
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                         int64_t ldu)
{
    if (p->a8) ie_lora_shrink_ref(p, rows, n_rows, j0, j1, u, ldu); /* no VNNI here: the oracle's integers */
    else if (p->a16) shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_BF16);
    else shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_F32);
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_expand). */
void ie_lora_expand_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                         const float *u, int64_t ldu)
{
    if (p->a8) ie_lora_expand_ref(p, rows, n_rows, o0, o1, u, ldu);
    else if (p->a16) expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_BF16);
    else expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_F32);
}
