/* lora_avx2.c — AVX2/FMA twins of ie_lora_shrink_ref / ie_lora_expand_ref.
 * The shrink takes four rows of A against two tokens per pass over the
 * input; the expand adds the rank rows of B^T to 32 columns of up to two
 * tokens' outputs held in registers (16 ymm registers bound both), so each
 * weight is loaded once per pair of tokens. The expand reads rank rows side
 * by side, more streams than the hardware prefetchers follow, so it
 * fetches each row ahead itself. One body for both weight types
 * (bf16 widened as it is loaded), specialised by the constant b16. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))
/* B^T elements ahead the expand fetches (as lora_avx512.c) */
#define LORA_PF 128

INL float hsum(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 8 weights at element i of f (f32) or h (bf16) */
INL __m256 ld8(const float *f, const uint16_t *h, size_t i, const int b16)
{
    if (!b16) return _mm256_loadu_ps(f + i);
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

INL float ld1(const float *f, const uint16_t *h, size_t i, const int b16)
{
    if (!b16) return f[i];
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h[i] << 16};
    return v.f;
}

INL void shrink_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                     int64_t ldu, const int b16)
{
    const size_t n = (size_t)p->n_in, nf = n & ~(size_t)7;
    for (int t0 = 0; t0 < n_rows; t0 += 2) {
        const int nt = n_rows - t0 < 2 ? n_rows - t0 : 2;
        const float *x[2]; /* past the group's end: its last row again, its sums dropped */
#pragma GCC unroll 4
        for (int i = 0; i < 2; i++) x[i] = p->x + (size_t)rows[t0 + (i < nt ? i : nt - 1)] * (size_t)p->ldx;
        for (int j = j0; j < j1; j += 4) {
            const int nj = j1 - j < 4 ? j1 - j : 4;
            size_t ra[4];
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++) ra[a] = (size_t)(j + (a < nj ? a : nj - 1)) * (size_t)p->lda;
            __m256 s[4][2];
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++) s[a][0] = s[a][1] = _mm256_setzero_ps();
            for (size_t k = 0; k < nf; k += 8) {
                const __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++) {
                    const __m256 wv = ld8(p->a, p->a16, ra[a] + k, b16);
                    s[a][0] = _mm256_fmadd_ps(wv, x0, s[a][0]);
                    s[a][1] = _mm256_fmadd_ps(wv, x1, s[a][1]);
                }
            }
#pragma GCC unroll 4
            for (int a = 0; a < nj; a++)
#pragma GCC unroll 4
                for (int i = 0; i < nt; i++) {
                    float r = hsum(s[a][i]);
                    for (size_t k = nf; k < n; k++) r += ld1(p->a, p->a16, ra[a] + k, b16) * x[i][k];
                    u[(size_t)(t0 + i) * (size_t)ldu + (size_t)(j + a)] = p->scale * r;
                }
        }
    }
}

/* y[i][o..o+8c) += sum_j u[i][j] B^T[j][o..] for NT tokens, c 8-column chunks */
INL void expand_cols(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o, int c,
                     const int NT, const int b16)
{
    __m256 acc[2][4];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++) acc[i][q] = _mm256_loadu_ps(y[i] + o + 8 * q);
    for (int j = 0; j < p->rank; j++) {
        const size_t b = (size_t)j * (size_t)p->ldb + (size_t)o;
        __m256 wv[4];
        if (c == 4) { /* rank rows a row apart are rank streams: fetch ahead */
            const char *pf = b16 ? (const char *)(p->bt16 + b + LORA_PF) : (const char *)(p->bt + b + LORA_PF);
            _mm_prefetch(pf, _MM_HINT_T0);
            if (!b16) _mm_prefetch(pf + 64, _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int q = 0; q < c; q++) wv[q] = ld8(p->bt, p->bt16, b + 8 * (size_t)q, b16);
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
        for (int q = 0; q < c; q++) _mm256_storeu_ps(y[i] + o + 8 * q, acc[i][q]);
}

INL void expand_tok(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o0, int64_t o1,
                    const int NT, const int b16)
{
    int64_t o = o0;
    for (; o + 32 <= o1; o += 32) expand_cols(p, y, ut, o, 4, NT, b16);
    for (; o + 8 <= o1; o += 8) expand_cols(p, y, ut, o, 1, NT, b16);
    for (; o < o1; o++)
#pragma GCC unroll 4
        for (int i = 0; i < NT; i++) {
            float s = y[i][o];
            for (int j = 0; j < p->rank; j++)
                s += ut[i][j] * ld1(p->bt, p->bt16, (size_t)j * (size_t)p->ldb + (size_t)o, b16);
            y[i][o] = s;
        }
}

INL void expand_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                     const float *u, int64_t ldu, const int b16)
{
    for (int t0 = 0; t0 < n_rows; t0 += 2) {
        const int nt = n_rows - t0 < 2 ? n_rows - t0 : 2;
        float *y[2];
        const float *ut[2];
#pragma GCC unroll 4
        for (int i = 0; i < nt; i++) {
            y[i] = p->y + (size_t)rows[t0 + i] * (size_t)p->ldy;
            ut[i] = u + (size_t)(t0 + i) * (size_t)ldu;
        }
        if (nt == 2) expand_tok(p, y, ut, o0, o1, 2, b16);
        else expand_tok(p, y, ut, o0, o1, 1, b16);
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                         int64_t ldu)
{
    if (p->a16) shrink_body(p, rows, n_rows, j0, j1, u, ldu, 1);
    else shrink_body(p, rows, n_rows, j0, j1, u, ldu, 0);
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_expand). */
void ie_lora_expand_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                         const float *u, int64_t ldu)
{
    if (p->a16) expand_body(p, rows, n_rows, o0, o1, u, ldu, 1);
    else expand_body(p, rows, n_rows, o0, o1, u, ldu, 0);
}
