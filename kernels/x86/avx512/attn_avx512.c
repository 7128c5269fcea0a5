/* attn_avx512.c — attention loops with AVX-512 (ie_attn.h).
 *
 * scores: tiles of 16 cached keys; for each query head of the group, the
 * tile's 16 dot products into 16 accumulators, then one transpose-reduction turns the 16
 * vectors of partial sums into one vector of 16 scores (~3 shuffles/adds per
 * score instead of a full horizontal sum each).
 * values: every value row is loaded once and multiplied into up to 16
 * accumulator registers (heads x hd/16 chunks) with the broadcast weight.
 * hd must be a multiple of 16 (up to 256); other sizes use the ref loops.
 * Rows come through a cursor (ie_attn.h): groups of 16 are counted from
 * j0 whether the view is contiguous or paged, so both give the same bits.
 */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

#define MAXC 16 /* hd/16 chunks supported by the register paths */

/* Sum of each of v[0..15]'s 16 lanes, as lanes 0..15 of the result. */
static inline __attribute__((always_inline)) __m512 transpose_reduce16(const __m512 v[16])
{
    __m512 t[8], u[4], w[2];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        t[p] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]),
                             _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]));
        /* t[p], per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] (a = v[2p], b = v[2p+1]) */
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        const __m512d c = _mm512_castps_pd(t[2 * q]), d = _mm512_castps_pd(t[2 * q + 1]);
        u[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    }
    /* u[q], 128-bit lane L: partial sums (lane L's share) of positions 4q..4q+3 */
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
        w[r] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* w[r] 128-bit lanes: [u0(L0+L1), u0(L2+L3), u1(L0+L1), u1(L2+L3)] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

#define IE_INLINE static inline __attribute__((always_inline))

/* The 16 scores of one head against one tile of 16 key rows. C (hd/16) is
 * a compile-time constant in the specialised copies below, so the 16
 * accumulators and the query stay in registers (a run-time C made GCC keep
 * them on the stack). */
IE_INLINE void scores_tile(const int C, const float *qh, const float *k0, ptrdiff_t step,
                           const float *const rows[16], __m512 vs, float *dst)
{
    __m512 qv[MAXC], acc[16];
    qv[0] = _mm512_loadu_ps(qh);
    for (int c = 1; c < C; c++) qv[c] = _mm512_loadu_ps(qh + 16 * c);
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        const float *kr = k0 ? k0 + r * step : rows[r];
        __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
#pragma GCC unroll 16
        for (int c = 1; c < C; c++) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), a);
        acc[r] = a;
    }
    _mm512_storeu_ps(dst, _mm512_mul_ps(transpose_reduce16(acc), vs));
}

/* Rows are fetched ahead by software: a head's rows are hd floats out of
 * every kv_dim (and blocks are placed anywhere), a pattern the hardware
 * prefetchers do not follow; without this the first head's loads of every
 * tile waited on memory (measured: 1 thread, 22 layers x 4 KV heads of a
 * TinyLlama-shaped cache at 200 positions, ~6 GB/s of cache read). The
 * prefetch cursor walks the same rows, never past n. Into L2, not L1: an
 * L1 prefetch holds one of the core's few L1 miss slots until its line
 * arrives, which capped the cache read; decode at 1000 positions (Q4_0
 * TinyLlama shape, 2 threads, alternating runs in the high-bandwidth
 * phase) ran 0.75-0.77 of a plain read of its weights against 0.70-0.72
 * with the L1 hint. Twice the distance measured the same. */
#define PF_TILES 2 /* scores: tiles of 16 rows ahead */
#define PF_ROWS 16 /* values: rows ahead */
IE_INLINE void prefetch_row(const float *r, const int C)
{
    for (int c = 0; c < C; c++) _mm_prefetch((const char *)(r + 16 * c), _MM_HINT_T1);
}

IE_INLINE void scores_body(const int C, const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0,
                           int n, float scale, float *s, size_t ld)
{
    const __m512 vs = _mm512_set1_ps(scale);
    /* Tiles of 16 keys, every head of the group against a tile before the
     * next: a tile (16 x hd floats, 4 KiB at hd 64) stays in L1 while the
     * heads reuse it, where a head-outer walk would stream the whole cache
     * from L2 once per head. Each score's arithmetic is that of a head-outer
     * walk (same products, same order), so the bits do not depend on nh. */
    ie_attn_cursor_t cur, pre;
    ie_attn_cursor_init(&cur, k, j0);
    ie_attn_cursor_init(&pre, k, j0);
    int pj = 0; /* rows prefetched: PF_TILES tiles ahead of j */
    for (; pj < n && pj < 16 * PF_TILES; pj++) prefetch_row(ie_attn_cursor_next(&pre), C);
    const float *rows[16];
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        for (const int e = pj + 16 < n ? pj + 16 : n; pj < e; pj++) prefetch_row(ie_attn_cursor_next(&pre), C);
        const float *k0;
        const ptrdiff_t step = (ptrdiff_t)cur.row_stride; /* 16 rows in one block: a fixed stride */
        if (ie_attn_cursor_run(&cur, &k0) >= 16) {
            ie_attn_cursor_skip(&cur, 16);
            for (int h = 0; h < nh; h++)
                scores_tile(C, q + (size_t)h * q_stride, k0, step, rows, vs, s + (size_t)h * ld + j);
        } else { /* the group crosses blocks: walk it into a table of rows */
            for (int r = 0; r < 16; r++) rows[r] = ie_attn_cursor_next(&cur);
            for (int h = 0; h < nh; h++)
                scores_tile(C, q + (size_t)h * q_stride, NULL, 0, rows, vs, s + (size_t)h * ld + j);
        }
    }
    for (; j < n; j++) {
        const float *kr = ie_attn_cursor_next(&cur);
        for (int h = 0; h < nh; h++) {
            const float *qh = q + (size_t)h * q_stride;
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(kr));
            for (int c = 1; c < C; c++)
                a = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * c), _mm512_loadu_ps(kr + 16 * c), a);
            s[(size_t)h * ld + j] = _mm512_reduce_add_ps(a) * scale;
        }
    }
}

#define SCORES_C(CC)                                                                                          \
    static void scores_c##CC(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, \
                             float scale, float *s, size_t ld)                                                \
    {                                                                                                         \
        scores_body(CC, q, q_stride, nh, k, j0, n, scale, s, ld);                                             \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
SCORES_C(1)
SCORES_C(2)
SCORES_C(4)
SCORES_C(8)
// clang-format on

void ie_attn_scores_avx512(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, int hd,
                           float scale, float *s, size_t ld)
{
    if (hd % 16 != 0 || hd / 16 > MAXC) {
        ie_attn_scores_ref(q, q_stride, nh, k, j0, n, hd, scale, s, ld);
        return;
    }
    switch (hd / 16) {
    case 1: scores_c1(q, q_stride, nh, k, j0, n, scale, s, ld); break;
    case 2: scores_c2(q, q_stride, nh, k, j0, n, scale, s, ld); break;
    case 4: scores_c4(q, q_stride, nh, k, j0, n, scale, s, ld); break;
    case 8: scores_c8(q, q_stride, nh, k, j0, n, scale, s, ld); break;
    default: scores_body(hd / 16, q, q_stride, nh, k, j0, n, scale, s, ld); break;
    }
}

/* One pass of the values loop: G heads x C chunks of accumulators
 * (G*C <= 16), both compile-time constants in the specialised copies. */
IE_INLINE void values_pass(const int C, const int G, const float *p, size_t ld, const ie_attn_rows_t *v, int j0,
                           int n, float *out, size_t o_stride)
{
    __m512 acc[MAXC];
#pragma GCC unroll 16
    for (int i = 0; i < G * C; i++) acc[i] = _mm512_setzero_ps();
    ie_attn_cursor_t cur, pre;
    ie_attn_cursor_init(&cur, v, j0);
    ie_attn_cursor_init(&pre, v, j0);
    int pj = 0;
    for (; pj < n && pj < PF_ROWS; pj++) prefetch_row(ie_attn_cursor_next(&pre), C);
    for (int j = 0; j < n;) {
        const float *vj;
        int run = ie_attn_cursor_run(&cur, &vj); /* rows of one block, in order */
        run = run < n - j ? run : n - j;
        ie_attn_cursor_skip(&cur, run);
        for (const int e = j + run; j < e; j++, vj += cur.row_stride) {
            if (pj < n) {
                prefetch_row(ie_attn_cursor_next(&pre), C);
                pj++;
            }
#pragma GCC unroll 16
            for (int c = 0; c < C; c++) {
                const __m512 x = _mm512_loadu_ps(vj + 16 * c);
#pragma GCC unroll 16
                for (int hh = 0; hh < G; hh++)
                    acc[hh * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)hh * ld + j]), x, acc[hh * C + c]);
            }
        }
    }
#pragma GCC unroll 16
    for (int hh = 0; hh < G; hh++)
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) _mm512_storeu_ps(out + (size_t)hh * o_stride + 16 * c, acc[hh * C + c]);
}

typedef void (*values_fn)(const float *p, size_t ld, const ie_attn_rows_t *v, int j0, int n, float *out,
                          size_t o_stride);
#define VALUES_CG(CC, GG)                                                                               \
    static void values_c##CC##_g##GG(const float *p, size_t ld, const ie_attn_rows_t *v, int j0, int n, \
                                     float *out, size_t o_stride)                                       \
    {                                                                                                   \
        values_pass(CC, GG, p, ld, v, j0, n, out, o_stride);                                            \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
VALUES_CG(1, 1) VALUES_CG(1, 2) VALUES_CG(1, 4) VALUES_CG(1, 8) VALUES_CG(1, 16)
VALUES_CG(2, 1) VALUES_CG(2, 2) VALUES_CG(2, 4) VALUES_CG(2, 8)
VALUES_CG(4, 1) VALUES_CG(4, 2) VALUES_CG(4, 3) VALUES_CG(4, 4)
VALUES_CG(8, 1) VALUES_CG(8, 2)
    // clang-format on

    /* The specialised pass for C chunks and g heads, or NULL. */
    static values_fn values_get(int C, int g)
{
    switch (C) {
    case 1:
        return g == 1    ? values_c1_g1
               : g == 2  ? values_c1_g2
               : g == 4  ? values_c1_g4
               : g == 8  ? values_c1_g8
               : g == 16 ? values_c1_g16
                         : NULL;
    case 2:
        return g == 1 ? values_c2_g1 : g == 2 ? values_c2_g2 : g == 4 ? values_c2_g4 : g == 8 ? values_c2_g8 : NULL;
    case 4:
        return g == 1 ? values_c4_g1 : g == 2 ? values_c4_g2 : g == 3 ? values_c4_g3 : g == 4 ? values_c4_g4 : NULL;
    case 8: return g == 1 ? values_c8_g1 : g == 2 ? values_c8_g2 : NULL;
    default: return NULL;
    }
}

void ie_attn_values_avx512(const float *p, size_t ld, int nh, const ie_attn_rows_t *v, int j0, int n, int hd,
                           float *out, size_t o_stride)
{
    if (hd % 16 != 0 || hd / 16 > MAXC) {
        ie_attn_values_ref(p, ld, nh, v, j0, n, hd, out, o_stride);
        return;
    }
    const int C = hd / 16;
    const int HG = MAXC / C; /* heads per pass: HG*C <= 16 accumulators */
    for (int h0 = 0; h0 < nh; h0 += HG) {
        const int g = nh - h0 < HG ? nh - h0 : HG;
        const float *ph = p + (size_t)h0 * ld;
        float *oh = out + (size_t)h0 * o_stride;
        const values_fn fn = values_get(C, g);
        if (fn) fn(ph, ld, v, j0, n, oh, o_stride);
        else /* the remaining shapes: the same loop with run-time sizes */
            values_pass(C, g, ph, ld, v, j0, n, oh, o_stride);
    }
}
