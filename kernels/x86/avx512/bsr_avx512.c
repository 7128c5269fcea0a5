/* bsr_avx512.c — block-sparse (BSR) f32 matmul, AVX-512. Twin of
 * ie_bsr_matmul_ref (kernels/ref/bsr_ref.c); contract in ie_bsr.h.
 *
 * Work goes block row by block row. The stored blocks of a block row are
 * contiguous, so a pass over them is a sequential stream; each output row's
 * partial sums stay in zmm accumulators across all the blocks of its block
 * row and are reduced (horizontally) once at the end.
 *
 * Decode (n_tok = 1, any block shape but the flat ones below): wide_decode
 * reads each block once, front to back, with br accumulators (in L1) and
 * software prefetch PF_BLK blocks ahead; x segments (<= 4 vectors) are
 * loaded once per block. Column tails use masked loads, which neither read
 * nor fault past the block.
 *
 * Several tokens: row tiles of 4 rows x 6 tokens, 24 accumulators; each
 * 16-column weight vector is loaded once per tile and used for all tokens,
 * each x vector once per block and used for the 4 rows. A block row's blocks
 * (<= 256 KiB for 2048 columns of 32-row blocks) are re-read from L2, not
 * DRAM, by the later row and token tiles.
 *
 * Flat tiles (bc = 4 or 8, br*bc a multiple of 16, <= 128 floats): a block
 * is NQ = br*bc/16 whole vectors; lane l of vector q always holds element
 * (q*16 + l) of the block, i.e. row (q*16+l)/bc, column (q*16+l)%bc, so one
 * accumulator per (q, token) sums over all blocks of the block row against
 * x segments broadcast to 16/bc copies; groups of bc lanes are added at the
 * end. Other shapes take the row tiles.
 *
 * Rows of [r0, r1) outside whole block rows (not part of the contract) go
 * to the scalar reference. f32 accumulation: results equal the reference
 * within rounding, not bit for bit.
 */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <string.h>

#define IE_INLINE static inline __attribute__((always_inline))

#define RT 6     /* tokens per multi-token row tile */
#define RR 4     /* rows per multi-token row tile   */
#define PF_BLK 2 /* blocks ahead prefetched (decode) */

/* ------------------------------------------------------------ row tiles */

/* R rows x T tokens. w: the first block of the block row, at row i0 of the
 * block; blocks bstride floats apart; col: their block columns; x: token 0;
 * y: row i0 (of the output), token 0. BC: compile-time bc, or 0 (use bc). */
IE_INLINE void rtile(int R, int T, int BC, int bc_rt, size_t bstride, const float *w, const uint32_t *col,
                     uint32_t nb, const float *x, size_t xs, float *y, int64_t ldy)
{
    const int bc = BC ? BC : bc_rt;
    const int full = bc & ~15, tail = bc & 15;
    const __mmask16 tm = (__mmask16)((1u << tail) - 1);
    __m512 acc[RR][RT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();

    for (uint32_t b = 0; b < nb; b++) {
        const float *wb = w + (size_t)b * bstride;
        const float *xb = x + (size_t)col[b] * (size_t)bc;
#pragma GCC unroll 4
        for (int c = 0; c < full; c += 16) {
            __m512 xv[RT];
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(xb + (size_t)t * xs + c);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                if (T == 1) _mm_prefetch((const char *)(wb + PF_BLK * bstride + (size_t)r * bc + c), _MM_HINT_T0);
                const __m512 wv = _mm512_loadu_ps(wb + (size_t)r * bc + c);
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
        if (tail) {
            __m512 xv[RT];
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) xv[t] = _mm512_maskz_loadu_ps(tm, xb + (size_t)t * xs + full);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                if (T == 1 && (full == 0 || r % 4 == 0))
                    _mm_prefetch((const char *)(wb + PF_BLK * bstride + (size_t)r * bc + full), _MM_HINT_T0);
                const __m512 wv = _mm512_maskz_loadu_ps(tm, wb + (size_t)r * bc + full);
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) y[(int64_t)t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

typedef void (*rows_fn)(int R, int T, int bc, size_t bstride, const float *w, const uint32_t *col, uint32_t nb,
                        const float *x, size_t xs, float *y, int64_t ldy);

/* One function per compile-time bc; (R, T) picked by a switch: R in {4, 1},
 * T = 1..6 (T = 1 only for the last token of a prefill: decode alone takes
 * wide_decode). */
#define RC(BC, R, T) \
    case (R)*8 + (T): rtile(R, T, BC, bc, bstride, w, col, nb, x, xs, y, ldy); break;
/* macro-built tile tables, laid out by hand */
// clang-format off
#define ROWS_FN(name, BC)                                                                      \
    static void name(int R, int T, int bc, size_t bstride, const float *w, const uint32_t *col, \
                     uint32_t nb, const float *x, size_t xs, float *y, int64_t ldy)            \
    {                                                                                          \
        switch (R * 8 + T) {                                                                   \
            RC(BC, 4, 1) RC(BC, 4, 2) RC(BC, 4, 3) RC(BC, 4, 4)     \
            RC(BC, 4, 5) RC(BC, 4, 6) RC(BC, 1, 1) RC(BC, 1, 2) RC(BC, 1, 3) RC(BC, 1, 4)      \
            RC(BC, 1, 5) RC(BC, 1, 6)                                                          \
        default: break;                                                                        \
        }                                                                                      \
    }
ROWS_FN(rows_bc16, 16)

ROWS_FN(rows_any, 0)
// clang-format on

/* Decode (T = 1) of a whole block row: each block read once, front to back
 * (row by row, all of a row's columns), br accumulators in memory (L1):
 * decode is bound by DRAM bandwidth, not by these loads. Measured on Zen 4
 * against row tiles: reading the rows of a block in several passes, or a
 * block column-chunk by column-chunk, is 1.5-2.5x slower from DRAM. */
static void wide_decode(int br, int bc, const float *w, const uint32_t *col, uint32_t nb, const float *x, float *y)
{
    __m512 acc[64];
    const size_t bstride = (size_t)br * (size_t)bc;
    const int nv = (bc + 15) / 16; /* vectors per block row, 1..4 */
    __mmask16 mk[4];
    for (int q = 0; q < 4; q++) {
        const int n = bc - 16 * q;
        mk[q] = n >= 16 ? (__mmask16)0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0;
    }
    for (int r = 0; r < br; r++) acc[r] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const float *wb = w + (size_t)b * bstride;
        const float *xb = x + (size_t)col[b] * (size_t)bc;
        const __m512 x0 = _mm512_maskz_loadu_ps(mk[0], xb), x1 = _mm512_maskz_loadu_ps(mk[1], xb + 16);
        const __m512 x2 = _mm512_maskz_loadu_ps(mk[2], xb + 32), x3 = _mm512_maskz_loadu_ps(mk[3], xb + 48);
        /* rows in order: the block is read front to back */
        if (bc == 16) { /* plain loads, no prefetch (measured 10-20% faster without) */
            for (int r = 0; r < br; r++) {
                const float *wr = wb + (size_t)r * 16;
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(wr), x0, acc[r]);
            }
            continue;
        }
        if (bc == 32) {
            for (int r = 0; r < br; r++) {
                const float *wr = wb + (size_t)r * 32;
                _mm_prefetch((const char *)(wr + PF_BLK * bstride), _MM_HINT_T0);
                _mm_prefetch((const char *)(wr + PF_BLK * bstride + 16), _MM_HINT_T0);
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(wr + 16), x1,
                                         _mm512_fmadd_ps(_mm512_loadu_ps(wr), x0, acc[r]));
            }
            continue;
        }
        for (int r = 0; r < br; r++) {
            const float *wr = wb + (size_t)r * bc;
            _mm_prefetch((const char *)(wr + PF_BLK * bstride), _MM_HINT_T0);
            __m512 s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk[0], wr), x0, acc[r]);
            if (nv > 1) {
                _mm_prefetch((const char *)(wr + PF_BLK * bstride + 16), _MM_HINT_T0);
                s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk[1], wr + 16), x1, s);
            }
            if (nv > 2) {
                _mm_prefetch((const char *)(wr + PF_BLK * bstride + 32), _MM_HINT_T0);
                s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk[2], wr + 32), x2, s);
            }
            if (nv > 3) {
                _mm_prefetch((const char *)(wr + PF_BLK * bstride + 48), _MM_HINT_T0);
                s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk[3], wr + 48), x3, s);
            }
            acc[r] = s;
        }
    }
    for (int r = 0; r < br; r++) y[r] = _mm512_reduce_add_ps(acc[r]);
}

/* ----------------------------------------------------------- flat tiles */

#define FQ 8 /* most vectors per flat block (128 floats) */

IE_INLINE __m512 xpat(int BC, const float *xb)
{
    if (BC == 4) return _mm512_broadcast_f32x4(_mm_loadu_ps(xb));
    return _mm512_broadcast_f32x8(_mm256_loadu_ps(xb)); /* BC == 8 */
}

/* A whole block row x T tokens, blocks of NQ vectors, BC columns. */
IE_INLINE void ftile(int NQ, int BC, int T, const float *w, const uint32_t *col, uint32_t nb, const float *x,
                     size_t xs, float *y, int64_t ldy)
{
    __m512 acc[FQ][RT];
#pragma GCC unroll 8
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[q][t] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const float *wb = w + (size_t)b * (size_t)(NQ * 16); /* 64-byte aligned */
        const float *xb = x + (size_t)col[b] * BC;
        __m512 xv[RT];
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) xv[t] = xpat(BC, xb + (size_t)t * xs);
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) {
            /* small blocks: 4x further ahead in blocks */
            if (T == 1) _mm_prefetch((const char *)(wb + PF_BLK * 4 * NQ * 16 + q * 16), _MM_HINT_T0);
            const __m512 wv = _mm512_load_ps(wb + q * 16);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) acc[q][t] = _mm512_fmadd_ps(wv, xv[t], acc[q][t]);
        }
    }
    const int br = NQ * 16 / BC;
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        _Alignas(64) float s[FQ * 16];
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) _mm512_store_ps(s + q * 16, acc[q][t]);
        for (int i = 0; i < br; i++) {
            float v = 0.0f;
            for (int j = 0; j < BC; j++) v += s[i * BC + j];
            y[(int64_t)t * ldy + i] = v;
        }
    }
}

typedef void (*flat_fn)(int T, const float *w, const uint32_t *col, uint32_t nb, const float *x, size_t xs,
                        float *y, int64_t ldy);

#define FC(NQ, BC, T)                                \
    case T:                                          \
        ftile(NQ, BC, T, w, col, nb, x, xs, y, ldy); \
        break;
#define FLAT_FN(NQ, BC)                                                                                          \
    static void flat_##NQ##_##BC(int T, const float *w, const uint32_t *col, uint32_t nb, const float *x,        \
                                 size_t xs, float *y, int64_t ldy)                                               \
    {                                                                                                            \
        if ((NQ)*T > 24) { /* keep accumulators in registers: split the tokens */                                \
            const int h = T / 2;                                                                                 \
            flat_##NQ##_##BC(h, w, col, nb, x, xs, y, ldy);                                                      \
            flat_##NQ##_##BC(T - h, w, col, nb, x + (size_t)h * xs, xs, y + h * ldy, ldy);                       \
            return;                                                                                              \
        }                                                                                                        \
        switch (T) {                                                                                             \
            FC(NQ, BC, 1) FC(NQ, BC, 2) FC(NQ, BC, 3) FC(NQ, BC, 4) FC(NQ, BC, 5) FC(NQ, BC, 6) default : break; \
        }                                                                                                        \
    }
FLAT_FN(1, 4) /* 4x4        */
FLAT_FN(2, 4) /* 8x4        */
FLAT_FN(4, 4) /* 16x4       */
FLAT_FN(2, 8) /* 4x8        */
FLAT_FN(4, 8) /* 8x8, 16x4  */
FLAT_FN(8, 8) /* 16x8       */

static flat_fn flat_for(int br, int bc)
{
    if (bc != 4 && bc != 8) return NULL;
    const int s = br * bc;
    if (s % 16 != 0) return NULL;
    switch (s / 16 * 16 + bc) {
    case 1 * 16 + 4: return flat_1_4;
    case 2 * 16 + 4: return flat_2_4;
    case 4 * 16 + 4: return flat_4_4;
    case 2 * 16 + 8: return flat_2_8;
    case 4 * 16 + 8: return flat_4_8;
    case 8 * 16 + 8: return flat_8_8;
    default: return NULL;
    }
}

/* ---------------------------------------------------------------- driver */

void ie_bsr_matmul_avx512(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                          float *y, int64_t ldy)
{
    if (r0 >= r1 || n_tok <= 0) return;
    const int br = m->br, bc = m->bc;
    /* whole block rows [a, e); anything outside goes to the reference */
    int64_t a = (r0 + br - 1) / br * br, e = r1 / br * br;
    if (a > r1) a = r1;
    if (e < a) e = a;
    if (a > r0) ie_bsr_matmul_ref(m, r0, a, x, xs, n_tok, y, ldy);
    if (r1 > e) ie_bsr_matmul_ref(m, e, r1, x, xs, n_tok, y, ldy);

    const size_t bstride = (size_t)br * (size_t)bc;
    const flat_fn flat = flat_for(br, bc);
    const rows_fn rows = bc == 16 ? rows_bc16 : rows_any;
    for (int64_t bi = a / br; bi < e / br; bi++) {
        const uint32_t b0 = m->rowptr[bi], nb = m->rowptr[bi + 1] - b0;
        const float *w = m->values + (size_t)b0 * bstride;
        const uint32_t *col = m->colidx + b0;
        float *yb = y + bi * br;
        for (int64_t t0 = 0; t0 < n_tok; t0 += RT) {
            const int T = n_tok - t0 < RT ? (int)(n_tok - t0) : RT;
            const float *xt = x + (size_t)t0 * xs;
            float *yt = yb + t0 * ldy;
            if (flat) {
                flat(T, w, col, nb, xt, xs, yt, ldy);
                continue;
            }
            if (T == 1) {
                wide_decode(br, bc, w, col, nb, xt, yt);
                continue;
            }
            int i = 0;
            for (; i + RR <= br; i += RR)
                rows(RR, T, bc, bstride, w + (size_t)i * bc, col, nb, xt, xs, yt + i, ldy);
            for (; i < br; i++) rows(1, T, bc, bstride, w + (size_t)i * bc, col, nb, xt, xs, yt + i, ldy);
        }
    }
}
