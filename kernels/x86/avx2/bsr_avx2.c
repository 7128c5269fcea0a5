/* bsr_avx2.c — block-sparse (BSR) f32 matmul, AVX2 + FMA. Twin of
 * ie_bsr_matmul_ref (kernels/ref/bsr_ref.c); contract in ie_bsr.h.
 *
 * The scheme of bsr_avx512.c at 8 floats per vector and 16 registers:
 * block row by block row; decode reads each block once, front to back
 * (wide_decode, br accumulators in L1, prefetch PF_BLK blocks ahead);
 * several tokens take row tiles of 4 rows x 3 tokens, fast for bc a
 * multiple of 8, masked loads (vmaskmovps, which never faults on the
 * masked-off lanes) for column tails; flat tiles for bc = 4 (a block is
 * NQ = br*4/8 vectors, x broadcast to both 128-bit halves, lanes summed in
 * groups of 4 at the end). Rows outside whole block rows go to the scalar
 * reference. f32 accumulation: equal to the reference within rounding.
 */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <string.h>

#define IE_INLINE static inline __attribute__((always_inline))

#define RT 3     /* tokens per multi-token row tile */
#define RR 4     /* rows per multi-token row tile   */
#define PF_BLK 2 /* blocks ahead prefetched (decode) */

IE_INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane mask with the first n (0..8) lanes on. */
static const int32_t MASKTAB[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* ------------------------------------------------------------ row tiles */

/* R rows x T tokens; arguments as rtile in bsr_avx512.c. */
IE_INLINE void rtile(int R, int T, int BC, int bc_rt, size_t bstride, const float *w, const uint32_t *col,
                     uint32_t nb, const float *x, size_t xs, float *y, int64_t ldy)
{
    const int bc = BC ? BC : bc_rt;
    const int full = bc & ~7, tail = bc & 7;
    const __m256i tm = _mm256_loadu_si256((const __m256i *)(MASKTAB + 8 - tail));
    __m256 acc[RR][RT];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();

    for (uint32_t b = 0; b < nb; b++) {
        const float *wb = w + (size_t)b * bstride;
        const float *xb = x + (size_t)col[b] * (size_t)bc;
#pragma GCC unroll 4
        for (int c = 0; c < full; c += 8) {
            __m256 xv[RT];
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(xb + (size_t)t * xs + c);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                if (T == 1 && (c & 8) == 0)
                    _mm_prefetch((const char *)(wb + PF_BLK * bstride + (size_t)r * bc + c), _MM_HINT_T0);
                const __m256 wv = _mm256_loadu_ps(wb + (size_t)r * bc + c);
#pragma GCC unroll 3
                for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
        if (tail) {
            __m256 xv[RT];
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) xv[t] = _mm256_maskload_ps(xb + (size_t)t * xs + full, tm);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                if (T == 1 && (full == 0 || r % 8 == 0))
                    _mm_prefetch((const char *)(wb + PF_BLK * bstride + (size_t)r * bc + full), _MM_HINT_T0);
                const __m256 wv = _mm256_maskload_ps(wb + (size_t)r * bc + full, tm);
#pragma GCC unroll 3
                for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) y[(int64_t)t * ldy + r] = hsum8(acc[r][t]);
}

typedef void (*rows_fn)(int R, int T, int bc, size_t bstride, const float *w, const uint32_t *col, uint32_t nb,
                        const float *x, size_t xs, float *y, int64_t ldy);

/* R in {4, 1}, T = 1..3 (decode alone takes wide_decode). */
#define RC(BC, R, T)                                             \
    case (R)*8 + (T):                                            \
        rtile(R, T, BC, bc, bstride, w, col, nb, x, xs, y, ldy); \
        break;
#define ROWS_FN(name, BC)                                                                                    \
    static void name(int R, int T, int bc, size_t bstride, const float *w, const uint32_t *col, uint32_t nb, \
                     const float *x, size_t xs, float *y, int64_t ldy)                                       \
    {                                                                                                        \
        switch (R * 8 + T) {                                                                                 \
            RC(BC, 4, 1) RC(BC, 4, 2) RC(BC, 4, 3) RC(BC, 1, 1) RC(BC, 1, 2) RC(BC, 1, 3) default : break;   \
        }                                                                                                    \
    }
ROWS_FN(rows_bc8, 8)
ROWS_FN(rows_bc16, 16)
ROWS_FN(rows_bc32, 32)
ROWS_FN(rows_any, 0)

/* Decode (T = 1) of a whole block row: each block read once, front to back,
 * br accumulators in memory (L1); decode is bound by DRAM bandwidth (row
 * passes that read part of every block measured 1.5-2.5x slower). */
static void wide_decode(int br, int bc, const float *w, const uint32_t *col, uint32_t nb, const float *x, float *y)
{
    __m256 acc[64];
    const size_t bstride = (size_t)br * (size_t)bc;
    const int nv = (bc + 7) / 8; /* vectors per block row, 1..8 */
    __m256i mk[8];
    for (int q = 0; q < nv; q++) {
        const int n = bc - 8 * q;
        mk[q] = _mm256_loadu_si256((const __m256i *)(MASKTAB + 8 - (n >= 8 ? 8 : n)));
    }
    for (int r = 0; r < br; r++) acc[r] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const float *wb = w + (size_t)b * bstride;
        const float *xb = x + (size_t)col[b] * (size_t)bc;
        __m256 xv[8];
        for (int q = 0; q < nv; q++) xv[q] = _mm256_maskload_ps(xb + 8 * q, mk[q]);
        /* rows in order: the block is read front to back */
        for (int r = 0; r < br; r++) {
            const float *wr = wb + (size_t)r * bc;
            __m256 s = acc[r];
            for (int q = 0; q < nv; q++) {
                if ((q & 1) == 0) _mm_prefetch((const char *)(wr + PF_BLK * bstride + 8 * q), _MM_HINT_T0);
                s = _mm256_fmadd_ps(_mm256_maskload_ps(wr + 8 * q, mk[q]), xv[q], s);
            }
            acc[r] = s;
        }
    }
    for (int r = 0; r < br; r++) y[r] = hsum8(acc[r]);
}

/* ----------------------------------------------------------- flat tiles */

#define FQ 8 /* most vectors per flat block (4 columns x 16 rows) */

/* A whole block row x T tokens, 4-column blocks of NQ vectors. */
IE_INLINE void ftile(int NQ, int T, const float *w, const uint32_t *col, uint32_t nb, const float *x, size_t xs,
                     float *y, int64_t ldy)
{
    __m256 acc[FQ][RT];
#pragma GCC unroll 8
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[q][t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const float *wb = w + (size_t)b * (size_t)(NQ * 8);
        const float *xb = x + (size_t)col[b] * 4;
        __m256 xv[RT];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) xv[t] = _mm256_broadcast_ps((const __m128 *)(xb + (size_t)t * xs));
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) {
            /* small blocks: 4x further ahead in blocks, one per 64-byte line */
            if (T == 1 && (q & 1) == 0) _mm_prefetch((const char *)(wb + PF_BLK * 4 * NQ * 8 + q * 8), _MM_HINT_T0);
            const __m256 wv = _mm256_loadu_ps(wb + q * 8);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[q][t] = _mm256_fmadd_ps(wv, xv[t], acc[q][t]);
        }
    }
    const int br = NQ * 2;
#pragma GCC unroll 3
    for (int t = 0; t < T; t++) {
        _Alignas(32) float s[FQ * 8];
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) _mm256_store_ps(s + q * 8, acc[q][t]);
        for (int i = 0; i < br; i++)
            y[(int64_t)t * ldy + i] = (s[4 * i] + s[4 * i + 1]) + (s[4 * i + 2] + s[4 * i + 3]);
    }
}

typedef void (*flat_fn)(int T, const float *w, const uint32_t *col, uint32_t nb, const float *x, size_t xs,
                        float *y, int64_t ldy);

#define FC(NQ, T)                                \
    case T:                                      \
        ftile(NQ, T, w, col, nb, x, xs, y, ldy); \
        break;
#define FLAT_FN(NQ)                                                                                           \
    static void flat_##NQ(int T, const float *w, const uint32_t *col, uint32_t nb, const float *x, size_t xs, \
                          float *y, int64_t ldy)                                                              \
    {                                                                                                         \
        if ((NQ)*T > 12) { /* keep accumulators in registers: split the tokens */                             \
            const int h = T / 2;                                                                              \
            flat_##NQ(h, w, col, nb, x, xs, y, ldy);                                                          \
            flat_##NQ(T - h, w, col, nb, x + (size_t)h * xs, xs, y + h * ldy, ldy);                           \
            return;                                                                                           \
        }                                                                                                     \
        switch (T) {                                                                                          \
            FC(NQ, 1) FC(NQ, 2) FC(NQ, 3) default : break;                                                    \
        }                                                                                                     \
    }
FLAT_FN(2) /* 4x4  */
FLAT_FN(4) /* 8x4  */
FLAT_FN(8) /* 16x4 */

static flat_fn flat_for(int br, int bc)
{
    if (bc != 4) return NULL;
    switch (br) {
    case 4: return flat_2;
    case 8: return flat_4;
    case 16: return flat_8;
    default: return NULL;
    }
}

/* ---------------------------------------------------------------- driver */

void ie_bsr_matmul_avx2(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                        float *y, int64_t ldy)
{
    if (r0 >= r1 || n_tok <= 0) return;
    const int br = m->br, bc = m->bc;
    int64_t a = (r0 + br - 1) / br * br, e = r1 / br * br;
    if (a > r1) a = r1;
    if (e < a) e = a;
    if (a > r0) ie_bsr_matmul_ref(m, r0, a, x, xs, n_tok, y, ldy);
    if (r1 > e) ie_bsr_matmul_ref(m, e, r1, x, xs, n_tok, y, ldy);

    const size_t bstride = (size_t)br * (size_t)bc;
    const flat_fn flat = flat_for(br, bc);
    const rows_fn rows = bc == 8 ? rows_bc8 : bc == 16 ? rows_bc16 : bc == 32 ? rows_bc32 : rows_any;
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
