/* lora_avx512.c — AVX-512 twins of ie_lora_shrink_ref / ie_lora_expand_ref.
 * The shrink takes four rows of A against up to four tokens per pass over
 * the input (up to 16 accumulators: each weight loaded once for the
 * group); the expand adds the rank rows of B^T to 64 columns of up to four
 * tokens' outputs held in registers, so y is read and written once per
 * call and each weight loaded once for the group. The expand reads rank
 * rows side by side (rank streams, more than the hardware prefetchers
 * follow), so it fetches each row ahead itself. One body for the three
 * weight types (WT: f32, bf16 widened as it is loaded, int8 converted and
 * its column scales folded as the oracle folds them). */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))
/* B^T elements ahead the expand fetches (measured: 128 best of 64..1024) */
#define LORA_PF 128

enum { WT_F32, WT_BF16, WT_I8 };

/* 16 weights at element i of A (bt 0) or B^T (bt 1); lanes off m are 0 */
INL __m512 ldw(const ie_lora_args_t *p, int bt, size_t i, __mmask16 m, const int WT)
{
    if (WT == WT_I8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, (bt ? p->bt8 : p->a8) + i)));
    if (WT == WT_BF16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (bt ? p->bt16 : p->a16) + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    return _mm512_maskz_loadu_ps(m, (bt ? p->bt : p->a) + i);
}

INL __m512 ldw_full(const ie_lora_args_t *p, int bt, size_t i, const int WT)
{
    if (WT == WT_I8)
        return _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((bt ? p->bt8 : p->a8) + i))));
    if (WT == WT_BF16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((bt ? p->bt16 : p->a16) + i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    return _mm512_loadu_ps((bt ? p->bt : p->a) + i);
}

/* s[a][i] += A row ra[a] . x[i] (times sa for int8) over 16 columns at k */
#define SHRINK_STEP(LDW, XLD, SLD)                                                                               \
    do {                                                                                                         \
        __m512 xv[4];                                                                                            \
        const __m512 sv = WT == WT_I8 ? SLD : _mm512_setzero_ps();                                               \
        _Pragma("GCC unroll 4") for (int i = 0; i < NT; i++) xv[i] = WT == WT_I8 ? _mm512_mul_ps(XLD, sv) : XLD; \
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)                                                      \
        {                                                                                                        \
            const __m512 wv = LDW;                                                                               \
            _Pragma("GCC unroll 4") for (int i = 0; i < NT; i++) s[a][i] = _mm512_fmadd_ps(wv, xv[i], s[a][i]);  \
        }                                                                                                        \
    } while (0)

/* u rows of NT (1..4, a constant) tokens for A rows [j0, j1) */
INL void shrink_tok(const ie_lora_args_t *p, const float *const *x, float *u, int64_t ldu, int j0, int j1,
                    const int NT, const int WT)
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
            SHRINK_STEP(ldw_full(p, 0, ra[a] + k, WT), _mm512_loadu_ps(x[i] + k), _mm512_loadu_ps(p->sa + k));
        if (mt)
            SHRINK_STEP(ldw(p, 0, ra[a] + nf, mt, WT), _mm512_maskz_loadu_ps(mt, x[i] + nf),
                        _mm512_maskz_loadu_ps(mt, p->sa + nf));
        for (int a = 0; a < nj; a++)
#pragma GCC unroll 4
            for (int i = 0; i < NT; i++)
                u[(size_t)i * (size_t)ldu + (size_t)(j + a)] = p->scale * _mm512_reduce_add_ps(s[a][i]);
    }
}

INL void shrink_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                     int64_t ldu, const int WT)
{
    for (int t0 = 0; t0 < n_rows; t0 += 4) {
        const int nt = n_rows - t0 < 4 ? n_rows - t0 : 4;
        const float *x[4];
        for (int i = 0; i < nt; i++) x[i] = p->x + (size_t)rows[t0 + i] * (size_t)p->ldx;
        float *ut = u + (size_t)t0 * (size_t)ldu;
        switch (nt) { /* the token count a constant: accumulators stay in registers */
        case 1: shrink_tok(p, x, ut, ldu, j0, j1, 1, WT); break;
        case 2: shrink_tok(p, x, ut, ldu, j0, j1, 2, WT); break;
        case 3: shrink_tok(p, x, ut, ldu, j0, j1, 3, WT); break;
        default: shrink_tok(p, x, ut, ldu, j0, j1, 4, WT); break;
        }
    }
}

/* y[i][o..o+16c) += sum_j u[i][j] B^T[j][o..] for NT tokens and c 16-column
 * chunks (the last one masked by m); int8 sums first, then scales by sbt */
INL void expand_cols(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o, int c,
                     __mmask16 m, const int NT, const int WT)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++)
            acc[i][q] = WT == WT_I8 ? _mm512_setzero_ps()
                                    : _mm512_maskz_loadu_ps(q == c - 1 ? m : (__mmask16)0xFFFF, y[i] + o + 16 * q);
    const size_t es = WT == WT_I8 ? 1 : WT == WT_BF16 ? 2 : 4;
    const char *bt = WT == WT_I8     ? (const char *)p->bt8
                     : WT == WT_BF16 ? (const char *)p->bt16
                                     : (const char *)p->bt;
    for (int j = 0; j < p->rank; j++) {
        const size_t b = (size_t)j * (size_t)p->ldb + (size_t)o;
        __m512 wv[4];
        if (c == 4) { /* rank rows a row apart are rank streams: fetch ahead */
            const char *pf = bt + (b + LORA_PF) * es;
            _mm_prefetch(pf, _MM_HINT_T0);
            if (es > 1) _mm_prefetch(pf + 64, _MM_HINT_T0);
            if (es > 2) _mm_prefetch(pf + 128, _MM_HINT_T0), _mm_prefetch(pf + 192, _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int q = 0; q < c; q++)
            wv[q] = q == c - 1 && m != 0xFFFF ? ldw(p, 1, b + 16 * (size_t)q, m, WT)
                                              : ldw_full(p, 1, b + 16 * (size_t)q, WT);
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
        for (int q = 0; q < c; q++) {
            const __mmask16 mq = q == c - 1 ? m : (__mmask16)0xFFFF;
            __m512 r = acc[i][q];
            if (WT == WT_I8)
                r = _mm512_fmadd_ps(r, _mm512_maskz_loadu_ps(mq, p->sbt + o + 16 * q),
                                    _mm512_maskz_loadu_ps(mq, y[i] + o + 16 * q));
            _mm512_mask_storeu_ps(y[i] + o + 16 * q, mq, r);
        }
}

INL void expand_tok(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o0, int64_t o1,
                    const int NT, const int WT)
{
    int64_t o = o0;
    for (; o + 64 <= o1; o += 64) expand_cols(p, y, ut, o, 4, 0xFFFF, NT, WT);
    for (; o + 16 <= o1; o += 16) expand_cols(p, y, ut, o, 1, 0xFFFF, NT, WT);
    if (o < o1) expand_cols(p, y, ut, o, 1, (__mmask16)((1u << (o1 - o)) - 1), NT, WT);
}

INL void expand_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                     const float *u, int64_t ldu, const int WT)
{
    for (int t0 = 0; t0 < n_rows; t0 += 4) {
        const int nt = n_rows - t0 < 4 ? n_rows - t0 : 4;
        float *y[4];
        const float *ut[4];
        for (int i = 0; i < nt; i++) {
            y[i] = p->y + (size_t)rows[t0 + i] * (size_t)p->ldy;
            ut[i] = u + (size_t)(t0 + i) * (size_t)ldu;
        }
        switch (nt) { /* the token count a constant: accumulators stay in registers */
        case 1: expand_tok(p, y, ut, o0, o1, 1, WT); break;
        case 2: expand_tok(p, y, ut, o0, o1, 2, WT); break;
        case 3: expand_tok(p, y, ut, o0, o1, 3, WT); break;
        default: expand_tok(p, y, ut, o0, o1, 4, WT); break;
        }
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                           int64_t ldu)
{
    if (p->a8) shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_I8);
    else if (p->a16) shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_BF16);
    else shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_F32);
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_expand). */
void ie_lora_expand_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                           const float *u, int64_t ldu)
{
    if (p->a8) expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_I8);
    else if (p->a16) expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_BF16);
    else expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_F32);
}
