/* lora_avx2.c — AVX2/FMA twins of ie_lora_shrink_ref / ie_lora_expand_ref.
 * f32 and bf16: the shrink takes four rows of A against two tokens per
 * pass over the input; the expand adds the rank rows of B^T to 32 columns
 * of up to two tokens' outputs held in registers (16 ymm registers bound
 * both), so each weight is loaded once per pair of tokens. The expand reads
 * rank rows side by side, more streams than the hardware prefetchers
 * follow, so it fetches each row ahead itself. One body for both (WT: f32,
 * bf16 widened as it is loaded). int8: the oracle's integer arithmetic on
 * vpmaddwd (below), the same bits as the ref. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INL static inline __attribute__((always_inline))
/* B^T elements ahead the expand fetches (as lora_avx512.c) */
#define LORA_PF 128

enum { WT_F32, WT_BF16 };

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
    if (WT == WT_BF16) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((bt ? p->bt16 : p->a16) + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    return _mm256_loadu_ps((bt ? p->bt : p->a) + i);
}

INL float ld1(const ie_lora_args_t *p, int bt, size_t i, const int WT)
{
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
                const __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
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
                    for (size_t k = nf; k < n; k++) r += ld1(p, 0, ra[a] + k, WT) * x[i][k];
                    u[(size_t)(t0 + i) * (size_t)ldu + (size_t)(j + a)] = p->scale * r;
                }
        }
    }
}

/* y[i][o..o+8c) += sum_j u[i][j] B^T[j][o..] for NT tokens, c 8-column
 * chunks */
INL void expand_cols(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o, int c,
                     const int NT, const int WT)
{
    __m256 acc[2][4];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++) acc[i][q] = _mm256_loadu_ps(y[i] + o + 8 * q);
    const size_t es = WT == WT_BF16 ? 2 : 4;
    const char *bt = WT == WT_BF16 ? (const char *)p->bt16 : (const char *)p->bt;
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
        for (int q = 0; q < c; q++) _mm256_storeu_ps(y[i] + o + 8 * q, acc[i][q]);
}

INL void expand_tok(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o0, int64_t o1,
                    const int NT, const int WT)
{
    int64_t o = o0;
    for (; o + 32 <= o1; o += 32) expand_cols(p, y, ut, o, 4, NT, WT);
    for (; o + 8 <= o1; o += 8) expand_cols(p, y, ut, o, 1, NT, WT);
    for (; o < o1; o++)
        for (int i = 0; i < NT; i++) {
            float s = y[i][o];
            for (int j = 0; j < p->rank; j++) s += ut[i][j] * ld1(p, 1, (size_t)j * (size_t)p->ldb + (size_t)o, WT);
            y[i][o] = s;
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

/* ---- int8 weights: the oracle's integer arithmetic (ie_kernels.h) on
 * vpmaddwd (no VNNI here): 15-bit codes against the weights widened to
 * 16 bits, 32-bit sums per 1024 columns (they cannot overflow there),
 * then 64-bit */

#define Q8_KC 1024
/* bytes ahead in each group of B^T the expand fetches */
#define Q8_PF 1024

/* the oracle's codes of the 8 floats v (times s) times id, as 8 int32 */
INL __m256i code8(__m256 v, __m256 id) { return _mm256_cvtps_epi32(_mm256_mul_ps(v, id)); }

/* max |x * sa| over n */
INL float absmax8(const float *x, const float *s, int64_t n)
{
    __m256 mx = _mm256_setzero_ps();
    const __m256 ab = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        if (s) v = _mm256_mul_ps(v, _mm256_loadu_ps(s + k));
        mx = _mm256_max_ps(mx, _mm256_and_ps(v, ab));
    }
    _Alignas(32) float t[8];
    _mm256_store_ps(t, mx);
    float m = 0.0f;
    for (int i = 0; i < 8; i++) m = t[i] > m ? t[i] : m;
    for (; k < n; k++) {
        const float v = fabsf(s ? x[k] * s[k] : x[k]);
        m = v > m ? v : m;
    }
    return m;
}

/* the oracle's code of one float (already times id) */
INL int16_t code1(float v)
{
    const float r = nearbyintf(v);
    const float q = (float)IE_LORA_QMAX;
    return (int16_t)(r != r ? 0 : r > q ? IE_LORA_QMAX : r < -q ? -IE_LORA_QMAX : (int)r);
}

/* n codes of x * s (s NULL: x) times id into q, zero past n up to a
 * multiple of 16 */
INL void code_row(const float *x, const float *s, int64_t n, float id, int16_t *q)
{
    const __m256 iv = _mm256_set1_ps(id);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256 a = _mm256_loadu_ps(x + k), b = _mm256_loadu_ps(x + k + 8);
        if (s) a = _mm256_mul_ps(a, _mm256_loadu_ps(s + k)), b = _mm256_mul_ps(b, _mm256_loadu_ps(s + k + 8));
        /* packs works within 128-bit lanes: put the quarters back in order */
        const __m256i w = _mm256_packs_epi32(code8(a, iv), code8(b, iv));
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permute4x64_epi64(w, 0xD8));
    }
    for (; k < n; k++) q[k] = code1((s ? x[k] * s[k] : x[k]) * id);
    for (; k & 15; k++) q[k] = 0;
}

/* The sum of v's 8 lanes in 64 bits (a chunk's lanes may add past 2^31) */
INL int64_t hsum_i64(__m256i v)
{
    const __m256i w = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                       _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
    const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    return _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1);
}

static void shrink8_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                         int64_t ldu)
{
    const int64_t n = p->n_in;
    _Alignas(32) int16_t q[2][Q8_KC];
    for (int t0 = 0; t0 < n_rows; t0 += 2) {
        const int nt = n_rows - t0 < 2 ? n_rows - t0 : 2;
        const float *x[2];
        float d[2], id[2];
        for (int i = 0; i < nt; i++) {
            x[i] = p->x + (size_t)rows[t0 + i] * (size_t)p->ldx;
            const float m = absmax8(x[i], p->sa, n);
            d[i] = m / (float)IE_LORA_QMAX, id[i] = m > 0.0f ? (float)IE_LORA_QMAX / m : 0.0f;
        }
        for (int jb = j0; jb < j1; jb += 64) { /* 64 rows' sums at a time */
            const int je = j1 - jb < 64 ? j1 : jb + 64;
            int64_t s[64][2] = {{0}};
            for (int64_t k0 = 0; k0 < n; k0 += Q8_KC) {
                const int64_t kc = n - k0 < Q8_KC ? n - k0 : Q8_KC, kf = kc & ~(int64_t)15;
                for (int i = 0; i < nt; i++) code_row(x[i] + k0, p->sa + k0, kc, id[i], q[i]);
                if (nt == 1) memset(q[1], 0, sizeof q[1]); /* the second token's sums: dropped */
                for (int j = jb; j < je; j += 4) {         /* four rows a pass: each code vector loaded once */
                    const int nj = je - j < 4 ? je - j : 4;
                    const int8_t *a[4]; /* past je: the last row again, its sums dropped */
                    for (int r = 0; r < 4; r++)
                        a[r] = p->a8 + (size_t)(j + (r < nj ? r : nj - 1)) * (size_t)p->lda + k0;
                    __m256i acc[4][2];
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
                    for (int64_t k = 0; k < kf; k += 16) {
                        const __m256i q0 = _mm256_load_si256((const __m256i *)(q[0] + k)),
                                      q1 = _mm256_load_si256((const __m256i *)(q[1] + k));
#pragma GCC unroll 4
                        for (int r = 0; r < 4; r++) {
                            const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(a[r] + k)));
                            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(w, q0));
                            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(w, q1));
                        }
                    }
                    /* constant indices only: an array indexed at run time
                     * anywhere lives on the stack (GCC), loop included */
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
#pragma GCC unroll 2
                        for (int i = 0; i < 2; i++) {
                            if (r >= nj || i >= nt) continue;
                            s[j - jb + r][i] += hsum_i64(acc[r][i]);
                            for (int64_t k = kf; k < kc; k++) s[j - jb + r][i] += (int64_t)a[r][k] * q[i][k];
                        }
                }
            }
            for (int j = jb; j < je; j++)
                for (int i = 0; i < nt; i++)
                    u[(size_t)(t0 + i) * (size_t)ldu + (size_t)j] = p->scale * ((float)s[j - jb][i] * d[i]);
        }
    }
}

/* y[i][o..o + 8C) += the outputs of nt (1, 2) tokens' codes q (scales d)
 * over B^T: 8C outputs (C a constant: 2, a line of each group, or 1), the
 * accumulators in registers (constant indices only, see shrink8_body) */
INL void expand8_blk(const ie_lora_args_t *p, float *const *y, const int16_t (*q)[256], const float *d, int nt,
                     int ng, int64_t o, const int C)
{
    /* hadd leaves outputs 0, 1, 4, 5 | 2, 3, 6, 7: put them back */
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    __m256i lo[2][2], hi[2][2];
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) lo[i][h] = hi[i][h] = _mm256_setzero_si256();
    const int8_t *b = p->bt8 + (size_t)o * 4u;
    for (int g = 0; g < ng; g++, b += (size_t)p->ldb * 4u) {
        _mm_prefetch((const char *)b + Q8_PF, _MM_HINT_T0); /* ng streams: fetch ahead */
        /* four ranks' codes, once per output */
        const __m256i u0 = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(q[0] + 4 * g))),
                      u1 = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(q[1] + 4 * g)));
#pragma GCC unroll 2
        for (int h = 0; h < C; h++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(b + 32 * h)); /* 8 outputs x 4 ranks */
            const __m256i wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)),
                          wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
            lo[0][h] = _mm256_add_epi32(lo[0][h], _mm256_madd_epi16(wl, u0));
            hi[0][h] = _mm256_add_epi32(hi[0][h], _mm256_madd_epi16(wh, u0));
            lo[1][h] = _mm256_add_epi32(lo[1][h], _mm256_madd_epi16(wl, u1));
            hi[1][h] = _mm256_add_epi32(hi[1][h], _mm256_madd_epi16(wh, u1));
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < C; h++)
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) {
            if (i >= nt) continue;
            /* pairs of an output side by side: hadd, then outputs back in order */
            const __m256i acc = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[i][h], hi[i][h]), order);
            const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d[i]));
            float *yo = y[i] + o + 8 * h;
            _mm256_storeu_ps(yo, _mm256_fmadd_ps(f, _mm256_loadu_ps(p->sbt + o + 8 * h), _mm256_loadu_ps(yo)));
        }
}

static void expand8_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                         const float *u, int64_t ldu)
{
    const int ng = (p->rank + 3) / 4;
    _Alignas(32) int16_t q[2][256];          /* rank <= IE_LORA_MAX_RANK (256), zero past it */
    for (int t0 = 0; t0 < n_rows; t0 += 2) { /* two tokens a pass: each weight widened once */
        const int nt = n_rows - t0 < 2 ? n_rows - t0 : 2;
        float *y[2], d[2];
        for (int i = 0; i < 2; i++) { /* a missing second token: codes 0, its sums dropped */
            const float *ut = u + (size_t)(t0 + i) * (size_t)ldu;
            float m = 0.0f;
            if (i < nt) m = absmax8(ut, NULL, p->rank), y[i] = p->y + (size_t)rows[t0 + i] * (size_t)p->ldy;
            d[i] = m / (float)IE_LORA_QMAX;
            if (i < nt) code_row(ut, NULL, p->rank, m > 0.0f ? (float)IE_LORA_QMAX / m : 0.0f, q[i]);
            else memset(q[i], 0, sizeof q[i]);
            for (int j = p->rank; j < ng * 4; j++) q[i][j] = 0;
        }
        int64_t o = o0;
        for (; o + 16 <= o1; o += 16) expand8_blk(p, y, q, d, nt, ng, o, 2);
        if (o + 8 <= o1) expand8_blk(p, y, q, d, nt, ng, o, 1), o += 8;
        for (; o < o1; o++)
            for (int i = 0; i < nt; i++) {
                int32_t s = 0;
                for (int j = 0; j < p->rank; j++) s += q[i][j] * (int32_t)p->bt8[IE_LORA_BT8_AT(j, o, p->ldb)];
                y[i][o] = fmaf((float)s * d[i], p->sbt[o], y[i][o]);
            }
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                         int64_t ldu)
{
    if (p->a8) shrink8_body(p, rows, n_rows, j0, j1, u, ldu);
    else if (p->a16) shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_BF16);
    else shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_F32);
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_expand). */
void ie_lora_expand_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                         const float *u, int64_t ldu)
{
    if (p->a8) expand8_body(p, rows, n_rows, o0, o1, u, ldu);
    else if (p->a16) expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_BF16);
    else expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_F32);
}
