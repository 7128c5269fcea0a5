/* lora_avx512.c — AVX-512 twins of ie_lora_shrink_ref / ie_lora_expand_ref.
 * The shrink takes four rows of A against up to four tokens per pass over
 * the input (up to 16 accumulators: each weight loaded once for the
 * group); the expand adds the rank rows of B^T to 64 columns of up to four
 * tokens' outputs held in registers, so y is read and written once per
 * call and each weight loaded once for the group. The expand reads rank
 * rows side by side (rank streams, more than the hardware prefetchers
 * follow), so it fetches each row ahead itself. One body for both weight types
 * (bf16 widened as it is loaded), specialised by the constant b16. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))
/* B^T elements ahead the expand fetches (measured: 128 best of 64..1024) */
#define LORA_PF 128

/* 16 weights at element i of f (f32) or h (bf16); lanes off m are 0 */
INL __m512 ldw(const float *f, const uint16_t *h, size_t i, __mmask16 m, const int b16)
{
    if (!b16) return _mm512_maskz_loadu_ps(m, f + i);
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, h + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

INL __m512 ldw_full(const float *f, const uint16_t *h, size_t i, const int b16)
{
    if (!b16) return _mm512_loadu_ps(f + i);
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* s[a][i] += A row ra[a] . x[i] over 16 columns at k (mask m) */
#define SHRINK_STEP(LDW, XLD)                                                                                   \
    do {                                                                                                        \
        __m512 xv[4];                                                                                           \
        _Pragma("GCC unroll 4") for (int i = 0; i < NT; i++) xv[i] = XLD;                                       \
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)                                                     \
        {                                                                                                       \
            const __m512 wv = LDW;                                                                              \
            _Pragma("GCC unroll 4") for (int i = 0; i < NT; i++) s[a][i] = _mm512_fmadd_ps(wv, xv[i], s[a][i]); \
        }                                                                                                       \
    } while (0)

/* u rows of NT (1..4, a constant) tokens for A rows [j0, j1) */
INL void shrink_tok(const ie_lora_args_t *p, const float *const *x, float *u, int64_t ldu, int j0, int j1,
                    const int NT, const int b16)
{
    const size_t n = (size_t)p->n_in, nf = n & ~(size_t)15;
    const __mmask16 mt = (__mmask16)((1u << (n & 15)) - 1);
    for (int j = j0; j < j1; j += 4) {
        const int nj = j1 - j < 4 ? j1 - j : 4;
        size_t ra[4]; /* past j1: the last row again, its sums dropped */
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) ra[a] = (size_t)(j + (a < nj ? a : nj - 1)) * (size_t)p->lda;
        __m512 s[4][4];
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
            for (int i = 0; i < NT; i++) s[a][i] = _mm512_setzero_ps();
        for (size_t k = 0; k < nf; k += 16)
            SHRINK_STEP(ldw_full(p->a, p->a16, ra[a] + k, b16), _mm512_loadu_ps(x[i] + k));
        if (mt) SHRINK_STEP(ldw(p->a, p->a16, ra[a] + nf, mt, b16), _mm512_maskz_loadu_ps(mt, x[i] + nf));
        for (int a = 0; a < nj; a++)
#pragma GCC unroll 4
            for (int i = 0; i < NT; i++)
                u[(size_t)i * (size_t)ldu + (size_t)(j + a)] = p->scale * _mm512_reduce_add_ps(s[a][i]);
    }
}

INL void shrink_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                     int64_t ldu, const int b16)
{
    for (int t0 = 0; t0 < n_rows; t0 += 4) {
        const int nt = n_rows - t0 < 4 ? n_rows - t0 : 4;
        const float *x[4];
        for (int i = 0; i < nt; i++) x[i] = p->x + (size_t)rows[t0 + i] * (size_t)p->ldx;
        float *ut = u + (size_t)t0 * (size_t)ldu;
        switch (nt) { /* the token count a constant: accumulators stay in registers */
        case 1: shrink_tok(p, x, ut, ldu, j0, j1, 1, b16); break;
        case 2: shrink_tok(p, x, ut, ldu, j0, j1, 2, b16); break;
        case 3: shrink_tok(p, x, ut, ldu, j0, j1, 3, b16); break;
        default: shrink_tok(p, x, ut, ldu, j0, j1, 4, b16); break;
        }
    }
}

/* y[i][o..o+16c) += sum_j u[i][j] B^T[j][o..] for NT tokens and c 16-column
 * chunks (the last one masked by m) */
INL void expand_cols(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o, int c,
                     __mmask16 m, const int NT, const int b16)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++)
            acc[i][q] = _mm512_maskz_loadu_ps(q == c - 1 ? m : (__mmask16)0xFFFF, y[i] + o + 16 * q);
    for (int j = 0; j < p->rank; j++) {
        const size_t b = (size_t)j * (size_t)p->ldb + (size_t)o;
        __m512 wv[4];
        if (c == 4) { /* rank rows a row apart are rank streams: fetch ahead */
            const char *pf = b16 ? (const char *)(p->bt16 + b + LORA_PF) : (const char *)(p->bt + b + LORA_PF);
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            if (!b16) _mm_prefetch(pf + 128, _MM_HINT_T0), _mm_prefetch(pf + 192, _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int q = 0; q < c; q++)
            wv[q] = q == c - 1 && m != 0xFFFF ? ldw(p->bt, p->bt16, b + 16 * (size_t)q, m, b16)
                                              : ldw_full(p->bt, p->bt16, b + 16 * (size_t)q, b16);
#pragma GCC unroll 4
        for (int i = 0; i < NT; i++) {
            const __m512 uv = _mm512_set1_ps(ut[i][j]);
#pragma GCC unroll 4
            for (int q = 0; q < c; q++) acc[i][q] = _mm512_fmadd_ps(uv, wv[q], acc[i][q]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++)
            _mm512_mask_storeu_ps(y[i] + o + 16 * q, q == c - 1 ? m : (__mmask16)0xFFFF, acc[i][q]);
}

INL void expand_tok(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o0, int64_t o1,
                    const int NT, const int b16)
{
    int64_t o = o0;
    for (; o + 64 <= o1; o += 64) expand_cols(p, y, ut, o, 4, 0xFFFF, NT, b16);
    for (; o + 16 <= o1; o += 16) expand_cols(p, y, ut, o, 1, 0xFFFF, NT, b16);
    if (o < o1) expand_cols(p, y, ut, o, 1, (__mmask16)((1u << (o1 - o)) - 1), NT, b16);
}

INL void expand_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                     const float *u, int64_t ldu, const int b16)
{
    for (int t0 = 0; t0 < n_rows; t0 += 4) {
        const int nt = n_rows - t0 < 4 ? n_rows - t0 : 4;
        float *y[4];
        const float *ut[4];
#pragma GCC unroll 4
        for (int i = 0; i < nt; i++) {
            y[i] = p->y + (size_t)rows[t0 + i] * (size_t)p->ldy;
            ut[i] = u + (size_t)(t0 + i) * (size_t)ldu;
        }
        switch (nt) { /* the token count a constant: accumulators stay in registers */
        case 1: expand_tok(p, y, ut, o0, o1, 1, b16); break;
        case 2: expand_tok(p, y, ut, o0, o1, 2, b16); break;
        case 3: expand_tok(p, y, ut, o0, o1, 3, b16); break;
        default: expand_tok(p, y, ut, o0, o1, 4, b16); break;
        }
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                           int64_t ldu)
{
    if (p->a16) shrink_body(p, rows, n_rows, j0, j1, u, ldu, 1);
    else shrink_body(p, rows, n_rows, j0, j1, u, ldu, 0);
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_expand). */
void ie_lora_expand_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                           const float *u, int64_t ldu)
{
    if (p->a16) expand_body(p, rows, n_rows, o0, o1, u, ldu, 1);
    else expand_body(p, rows, n_rows, o0, o1, u, ldu, 0);
}
