/* lora_avx512.c — AVX-512 twins of ie_lora_shrink_ref / ie_lora_expand_ref.
 * f32 and bf16: the shrink takes four rows of A against up to four tokens
 * per pass over the input (up to 16 accumulators: each weight loaded once
 * for the group); the expand adds the rank rows of B^T to 64 columns of up
 * to four tokens' outputs held in registers, so y is read and written once
 * per call and each weight loaded once for the group. The expand reads
 * rank rows side by side (rank streams, more than the hardware prefetchers
 * follow), so it fetches each row ahead itself. One body for both (WT:
 * f32, bf16 widened as it is loaded).
 * int8: VNNI integer dot products (vpdpbusd, 64 products an instruction)
 * on activations quantized per token as the oracle does. vpdpbusd takes
 * unsigned bytes on one side: the weights go in as w + 128 (a xor of the
 * sign bit as they are loaded) against the codes' signed byte planes (q =
 * 128 hi + lo, hi = q >> 7 signed, lo = q & 127), and 128 * the sum of the
 * token's codes comes off each result at the end (the codes are the
 * caller's, summed as they are made: no pass over the weights, unlike
 * summing 128 * the weights, one more vpdpbusd per 64 of them). The
 * integers are exact, so the sums are the oracle's bits in any order. The shrink
 * codes each token's row into a stack buffer once per 4096 columns and
 * runs four rows of A against up to four tokens; the expand takes B^T's
 * groups of four rank rows (ie_kernels.h), so one vpdpbusd adds four ranks
 * to 16 outputs of a token. */
#include "../../src/ie_kernels_isa.h"

#include "avx512_inl.h"

#include <immintrin.h>
#include <math.h>

#define INL static inline __attribute__((always_inline))

/* B^T elements ahead the expand fetches (measured: 128 best of 64..1024) */
#define LORA_PF 128

enum { WT_F32, WT_BF16 };

/* 16 weights at element i of A (bt 0) or B^T (bt 1); lanes off m are 0 */
INL __m512 ldw(const ie_lora_args_t *p, int bt, size_t i, __mmask16 m, const int WT)
{
    if (WT == WT_BF16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (bt ? p->bt16 : p->a16) + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    return _mm512_maskz_loadu_ps(m, (bt ? p->bt : p->a) + i);
}

INL __m512 ldw_full(const ie_lora_args_t *p, int bt, size_t i, const int WT)
{
    if (WT == WT_BF16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((bt ? p->bt16 : p->a16) + i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    return _mm512_loadu_ps((bt ? p->bt : p->a) + i);
}

/* s[a][i] += A row ra[a] . x[i] over 16 columns at k */
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
        for (size_t k = 0; k < nf; k += 16) SHRINK_STEP(ldw_full(p, 0, ra[a] + k, WT), _mm512_loadu_ps(x[i] + k));
        if (mt) SHRINK_STEP(ldw(p, 0, ra[a] + nf, mt, WT), _mm512_maskz_loadu_ps(mt, x[i] + nf));
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
 * chunks (the last one masked by m) */
INL void expand_cols(const ie_lora_args_t *p, float *const *y, const float *const *ut, int64_t o, int c,
                     __mmask16 m, const int NT, const int WT)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++)
            acc[i][q] = _mm512_maskz_loadu_ps(q == c - 1 ? m : (__mmask16)0xFFFF, y[i] + o + 16 * q);
    const size_t es = WT == WT_BF16 ? 2 : 4;
    const char *bt = WT == WT_BF16 ? (const char *)p->bt16 : (const char *)p->bt;
    for (int j = 0; j < p->rank; j++) {
        const size_t b = (size_t)j * (size_t)p->ldb + (size_t)o;
        __m512 wv[4];
        if (c == 4) { /* rank rows a row apart are rank streams: fetch ahead */
            const char *pf = bt + (b + LORA_PF) * es;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
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
            _mm512_mask_storeu_ps(y[i] + o + 16 * q, q == c - 1 ? m : (__mmask16)0xFFFF, acc[i][q]);
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

/* ---- int8 weights (VNNI) */

/* Columns of A the shrink codes at a time (4 tokens x 2 planes: 16 KiB) */
#define Q8_KC 2048
/* Bytes ahead in each group of B^T the int8 expand fetches */
#define Q8_PF 1024
/* Tokens the expand codes at a time */
#define Q8_TB 8

/* The caller's next bytes (ie_lora_args_t.pf) fetched into L2 a few lines
 * a step, so they are all asked for by the end of this call */
typedef struct {
    const char *p;
    int64_t row, col, rows, len, ld;
    int per; /* lines a step */
} pace_t;

INL void pace_init(pace_t *c, const ie_lora_args_t *p, int64_t steps)
{
    *c = (pace_t){p->pf, 0, 0, p->pf ? p->pf_rows : 0, p->pf_len, p->pf_ld, 0};
    const int64_t lines = c->rows * ((c->len + 63) / 64);
    c->per = steps > 0 && lines > 0 ? (int)((lines + steps - 1) / steps) : 0;
}

INL void pace_step(pace_t *c)
{
    for (int n = 0; n < c->per && c->row < c->rows; n++) {
        _mm_prefetch(c->p + c->row * c->ld + c->col, _MM_HINT_T1);
        if ((c->col += 64) >= c->len) c->col = 0, c->row++;
    }
}

/* The oracle's codes of the n <= 64 floats v (times s when s is set: x *
 * sa) times id (rne as nearbyintf; |v * id| <= IE_LORA_QMAX by the
 * choice of id, so no clamp), the rest coded 0, as two signed byte planes
 * of 64: hi = q >> 7 and lo = q & 127; their sum added to *qs (int32
 * lanes; NULL: not wanted). Packed in registers: a vpmovdb to memory is
 * slow on Zen 4. */
INL void code64(const float *v, const float *s, int64_t n, float id, int8_t *hi, int8_t *lo, __m512i *qs)
{
    const __m512 iv = _mm512_set1_ps(id);
    __m512i q[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const int64_t left = n - 16 * c;
        const __mmask16 m = left >= 16  ? (__mmask16)0xFFFF
                            : left <= 0 ? (__mmask16)0
                                        : (__mmask16)((1u << left) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, v + 16 * c);
        if (s) x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, s + 16 * c));
        q[c] = _mm512_cvtps_epi32(_mm512_mul_ps(x, iv));
    }
    if (qs)
        *qs = _mm512_add_epi32(*qs, _mm512_add_epi32(_mm512_add_epi32(q[0], q[1]), _mm512_add_epi32(q[2], q[3])));
    /* words, each 128-bit lane L holding q0..q3's elements 4L..4L+3 */
    const __m512i w01 = _mm512_packs_epi32(q[0], q[1]), w23 = _mm512_packs_epi32(q[2], q[3]);
    const __m512i m7 = _mm512_set1_epi16(127);
    const __m512i h = _mm512_packs_epi16(_mm512_srai_epi16(w01, 7), _mm512_srai_epi16(w23, 7));
    const __m512i l = _mm512_packs_epi16(_mm512_and_si512(w01, m7), _mm512_and_si512(w23, m7));
    /* dword 4L + c holds q[c]'s elements 4L..4L+3: put it at 4c + L */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512((void *)hi, _mm512_permutexvar_epi32(idx, h));
    _mm512_storeu_si512((void *)lo, _mm512_permutexvar_epi32(idx, l));
}

/* The accumulators of shrink8_rows, h (hi plane) and l (lo plane) for row
 * a and token i, named rather than an array (with an array GCC copied all
 * of them every step); X is applied to every (a, i) pair and the ones past
 * NR, NT fold away. */
#define ACCS_ROW(X, a) X(a, 0) X(a, 1) X(a, 2) X(a, 3)
#define ACCS(X) ACCS_ROW(X, 0) ACCS_ROW(X, 1) ACCS_ROW(X, 2) ACCS_ROW(X, 3)
#define ACC_DECL(a, i) __m512i h##a##i = _mm512_setzero_si512(), l##a##i = _mm512_setzero_si512();
#define ACC_DOT(a, i) \
    if (a < NR && i < NT) h##a##i = dpbusd_reg(h##a##i, w##a, xh##i), l##a##i = dpbusd_reg(l##a##i, w##a, xl##i);
#define ACC_SUM(a, i)                                      \
    if (a < nj && i < NT) {                                \
        sums[a][i][0] += _mm512_reduce_add_epi32(h##a##i); \
        sums[a][i][1] += _mm512_reduce_add_epi32(l##a##i); \
    }
/* token i's code planes at k (zero past NT: unused) */
#define XLD(Q, i) (i < NT ? _mm512_load_si512((const void *)(Q[i] + k)) : _mm512_setzero_si512())
/* row a's 64 weights at k, + 128 (past NR: unused) */
#define WLD(LD, a) (a < NR ? _mm512_xor_si512(LD(ra[a]), c80) : c80)
#define LD_FULL(r) _mm512_loadu_si512((const void *)((r) + k))
#define LD_TAIL(r) _mm512_maskz_loadu_epi8(m, (r) + k)
/* One step of 64 columns at k of shrink8_rows (LD: how to load a row's
 * 64 weights); fetches the next block's rows at k (pf: NULL when none) */
#define SHRINK8_STEP(LD)                                                                                          \
    do {                                                                                                          \
        if (pf) _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++) _mm_prefetch(pf + a * lda + k, _MM_HINT_T0); \
        pace_step(pc);                                                                                            \
        const __m512i w0 = WLD(LD, 0), w1 = WLD(LD, 1), w2 = WLD(LD, 2), w3 = WLD(LD, 3);                         \
        const __m512i xh0 = XLD(qh, 0), xh1 = XLD(qh, 1), xh2 = XLD(qh, 2), xh3 = XLD(qh, 3);                     \
        const __m512i xl0 = XLD(ql, 0), xl1 = XLD(ql, 1), xl2 = XLD(ql, 2), xl3 = XLD(ql, 3);                     \
        ACCS(ACC_DOT)                                                                                             \
    } while (0)

/* acc (h, l)[a][i] += A rows ra[0..NR) (+ 128) . the hi / lo plane of
 * token i's codes over this chunk's kc columns (the planes coded to a
 * multiple of 64); then into the sums. */
INL void shrink8_rows(const int8_t *const *ra, const char *pf, int64_t lda, pace_t *pc, const int8_t (*qh)[Q8_KC],
                      const int8_t (*ql)[Q8_KC], int64_t kc, int nj, int64_t (*sums)[4][2], const int NR,
                      const int NT)
{
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    ACCS(ACC_DECL)
    const int64_t kf = kc & ~(int64_t)63;
    int64_t k = 0;
    for (; k < kf; k += 64) SHRINK8_STEP(LD_FULL);
    if (k < kc) {
        const __mmask64 m = ((__mmask64)1 << (kc - k)) - 1;
        SHRINK8_STEP(LD_TAIL);
    }
    ACCS(ACC_SUM)
}

/* u rows of NT (1..4, a constant) tokens for A rows [j0, j1) */
INL void shrink8_tok(const ie_lora_args_t *p, const float *const *x, float *u, int64_t ldu, int j0, int j1,
                     pace_t *pc, const int NT)
{
    const int64_t n = p->n_in;
    float d[4], id[4];
    for (int i = 0; i < NT; i++) { /* the token's step: absmax of x * sa */
        __m512 mx = _mm512_setzero_ps();
        for (int64_t k = 0; k < n; k += 16) {
            const __mmask16 m = n - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - k)) - 1);
            const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x[i] + k), _mm512_maskz_loadu_ps(m, p->sa + k));
            mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
        }
        const float m = _mm512_reduce_max_ps(mx);
        d[i] = m / (float)IE_LORA_QMAX, id[i] = m > 0.0f ? (float)IE_LORA_QMAX / m : 0.0f;
    }
    _Alignas(64) int8_t qh[4][Q8_KC], ql[4][Q8_KC];
    __m512i qv[4]; /* the sums of the tokens' codes (the first row block codes them all) */
    int64_t qsum[4] = {0};
    for (int i = 0; i < NT; i++) qv[i] = _mm512_setzero_si512();
    /* two rows a pass for more than two tokens: the accumulators fit 32 registers */
    const int nr = NT > 2 ? 2 : 4;
    for (int jb = j0; jb < j1; jb += 64) {
        const int je = j1 - jb < 64 ? j1 : jb + 64;
        int64_t sums[64][4][2] = {{{0}}}; /* hi, lo plane sums */
        for (int64_t k0 = 0; k0 < n; k0 += Q8_KC) {
            const int64_t kc = n - k0 < Q8_KC ? n - k0 : Q8_KC, kp = (kc + 63) & ~(int64_t)63;
            for (int i = 0; i < NT; i++)
                for (int64_t k = 0; k < kp; k += 64)
                    code64(x[i] + k0 + k, p->sa + k0 + k, kc - k, id[i], qh[i] + k, ql[i] + k,
                           jb == j0 ? &qv[i] : NULL);
            for (int j = jb; j < je; j += nr) {
                const int nj = je - j < nr ? je - j : nr;
                const int8_t *ra[4]; /* past je: the last row again, its sums dropped */
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++)
                    ra[a] = p->a8 + (size_t)(j + (a < nj ? a : nj - 1)) * (size_t)p->lda + k0;
                /* rows of A are short streams (n_in bytes): the hardware
                 * prefetchers start late on each, so fetch the next rows */
                const char *pf = j + 2 * nr <= je ? (const char *)ra[0] + nr * p->lda : NULL;
                int64_t(*sj)[4][2] = sums + (j - jb);
                if (nr == 4) shrink8_rows(ra, pf, p->lda, pc, qh, ql, kc, nj, sj, 4, NT);
                else shrink8_rows(ra, pf, p->lda, pc, qh, ql, kc, nj, sj, 2, NT);
            }
        }
        if (jb == j0)
            for (int i = 0; i < NT; i++) /* a lane's sum fits 32 bits (n_in < 2^21), the row's in 64 */
                qsum[i] = _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(qv[i]))) +
                          _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(qv[i], 1)));
        for (int j = jb; j < je; j++)
            for (int i = 0; i < NT; i++) {
                const int64_t s = sums[j - jb][i][0] * 128 + sums[j - jb][i][1] - 128 * qsum[i];
                u[(size_t)i * (size_t)ldu + (size_t)j] = p->scale * ((float)s * d[i]);
            }
    }
}

static void shrink8_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                         int64_t ldu)
{
    pace_t pc; /* steps: 64 columns of nr rows, per block of tokens */
    const int64_t nr = n_rows > 2 ? 2 : 4;
    pace_init(&pc, p, (n_rows + 3) / 4 * ((j1 - j0 + nr - 1) / nr) * ((p->n_in + 63) / 64));
    for (int t0 = 0; t0 < n_rows; t0 += 4) {
        const int nt = n_rows - t0 < 4 ? n_rows - t0 : 4;
        const float *x[4];
        for (int i = 0; i < nt; i++) x[i] = p->x + (size_t)rows[t0 + i] * (size_t)p->ldx;
        float *ut = u + (size_t)t0 * (size_t)ldu;
        switch (nt) { /* the token count a constant: accumulators stay in registers */
        case 1: shrink8_tok(p, x, ut, ldu, j0, j1, &pc, 1); break;
        case 2: shrink8_tok(p, x, ut, ldu, j0, j1, &pc, 2); break;
        case 3: shrink8_tok(p, x, ut, ldu, j0, j1, &pc, 3); break;
        default: shrink8_tok(p, x, ut, ldu, j0, j1, &pc, 4); break;
        }
    }
}

/* The expand's coded u: per token, the hi and lo planes of its codes
 * over the rank, four ranks (one group of B^T) to a word, and 128 * the
 * sum of its codes (what the weights' + 128 adds to every output) */
typedef struct {
    uint32_t hi[64], lo[64];
    float d;
    int32_t off;
} q8u_t;

/* y[i][o..o+16c) for NT (1, 2) tokens and c 16-column chunks (the last
 * masked by m) */
INL void expand8_cols(const ie_lora_args_t *p, float *const *y, const q8u_t *qu, int ng, int64_t o, int c,
                      __mmask16 m, pace_t *pc, const int NT)
{
    __m512i ah[2][4], al[2][4];
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
    for (int q = 0; q < c; q++)
#pragma GCC unroll 2
        for (int i = 0; i < NT; i++) ah[i][q] = al[i][q] = _mm512_setzero_si512();
    const int8_t *b = p->bt8 + (size_t)o * 4u;
    const size_t gs = (size_t)p->ldb * 4u; /* bytes from one group of four ranks to the next */
    for (int g = 0; g < ng; g++, b += gs) {
        __m512i wv[4];
        pace_step(pc);
        if (c == 4) /* ng groups a row apart are ng streams: fetch ahead */
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) _mm_prefetch((const char *)b + Q8_PF + 64 * q, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int q = 0; q < c; q++) /* w + 128 (lanes off m: 128, never stored) */
            wv[q] = _mm512_xor_si512(q == c - 1 && m != 0xFFFF ? _mm512_maskz_loadu_epi32(m, b + 64 * q)
                                                               : _mm512_loadu_si512((const void *)(b + 64 * q)),
                                     c80);
#pragma GCC unroll 2
        for (int i = 0; i < NT; i++) {
            const __m512i uh = _mm512_set1_epi32((int)qu[i].hi[g]), ul = _mm512_set1_epi32((int)qu[i].lo[g]);
#pragma GCC unroll 4
            for (int q = 0; q < c; q++) {
                ah[i][q] = dpbusd_reg(ah[i][q], wv[q], uh);
                al[i][q] = dpbusd_reg(al[i][q], wv[q], ul);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < NT; i++)
#pragma GCC unroll 4
        for (int q = 0; q < c; q++) {
            const __mmask16 mq = q == c - 1 ? m : (__mmask16)0xFFFF;
            /* |128 ah| <= 2^30 at rank 256 (ie_kernels.h), and the sum is the exact |s_o| < 2^29 */
            const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(ah[i][q], 7), al[i][q]),
                                               _mm512_set1_epi32(qu[i].off));
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(qu[i].d));
            float *yo = y[i] + o + 16 * q;
            _mm512_mask_storeu_ps(yo, mq,
                                  _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(mq, p->sbt + o + 16 * q),
                                                  _mm512_maskz_loadu_ps(mq, yo)));
        }
}

INL void expand8_pair(const ie_lora_args_t *p, float *const *y, const q8u_t *qu, int ng, int64_t o, int c,
                      __mmask16 m, pace_t *pc, int nt)
{
    if (nt == 2) expand8_cols(p, y, qu, ng, o, c, m, pc, 2);
    else expand8_cols(p, y, qu, ng, o, c, m, pc, 1);
}

static void expand8_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                         const float *u, int64_t ldu)
{
    const int ng = (p->rank + 3) / 4;
    q8u_t qu[Q8_TB];
    float *y[Q8_TB];
    pace_t pc; /* steps: a group of four ranks for 64 columns of a pair of tokens */
    pace_init(&pc, p, (n_rows + 1) / 2 * ((o1 - o0 + 63) / 64) * ng);
    for (int t0 = 0; t0 < n_rows; t0 += Q8_TB) {
        const int nt = n_rows - t0 < Q8_TB ? n_rows - t0 : Q8_TB;
        for (int i = 0; i < nt; i++) { /* the token's codes over the rank, as the oracle's */
            const float *ut = u + (size_t)(t0 + i) * (size_t)ldu;
            y[i] = p->y + (size_t)rows[t0 + i] * (size_t)p->ldy;
            __m512 mx = _mm512_setzero_ps();
            for (int j = 0; j < p->rank; j += 16) {
                const int left = p->rank - j;
                mx = _mm512_max_ps(mx,
                                   _mm512_abs_ps(_mm512_maskz_loadu_ps(left >= 16 ? (__mmask16)0xFFFF
                                                                                  : (__mmask16)((1u << left) - 1),
                                                                       ut + j)));
            }
            const float mv = _mm512_reduce_max_ps(mx);
            qu[i].d = mv / (float)IE_LORA_QMAX;
            __m512i qv = _mm512_setzero_si512();
            for (int j = 0; j < ng * 4; j += 64)
                code64(ut + j, NULL, p->rank - j, mv > 0.0f ? (float)IE_LORA_QMAX / mv : 0.0f,
                       (int8_t *)qu[i].hi + j, (int8_t *)qu[i].lo + j, &qv);
            qu[i].off = 128 * _mm512_reduce_add_epi32(qv); /* |sum| <= 256 IE_LORA_QMAX */
        }
        /* 64 columns at a time for every pair of tokens: the block of B^T
         * stays in L1 for the next pair */
        int64_t o = o0;
        for (; o + 64 <= o1; o += 64)
            for (int i = 0; i < nt; i += 2)
                expand8_pair(p, y + i, qu + i, ng, o, 4, 0xFFFF, &pc, nt - i < 2 ? 1 : 2);
        for (; o + 16 <= o1; o += 16)
            for (int i = 0; i < nt; i += 2)
                expand8_pair(p, y + i, qu + i, ng, o, 1, 0xFFFF, &pc, nt - i < 2 ? 1 : 2);
        if (o < o1)
            for (int i = 0; i < nt; i += 2)
                expand8_pair(p, y + i, qu + i, ng, o, 1, (__mmask16)((1u << (o1 - o)) - 1), &pc,
                             nt - i < 2 ? 1 : 2);
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                           int64_t ldu)
{
    if (p->a8) shrink8_body(p, rows, n_rows, j0, j1, u, ldu);
    else if (p->a16) shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_BF16);
    else shrink_body(p, rows, n_rows, j0, j1, u, ldu, WT_F32);
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_expand). */
void ie_lora_expand_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                           const float *u, int64_t ldu)
{
    if (p->a8) expand8_body(p, rows, n_rows, o0, o1, u, ldu);
    else if (p->a16) expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_BF16);
    else expand_body(p, rows, n_rows, o0, o1, u, ldu, WT_F32);
}
