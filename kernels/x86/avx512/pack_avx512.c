/* pack_avx512.c — AVX-512 VNNI matmul over PANEL16 weights (ie_pack.h):
 * ie_kernels_t.matmul_packed for I8W x Q16_P and I4W, I4WA x Q8_P
 * activations. Twin of ie_matmul_packed_ref (kernels/ref/pack_ref.c).
 *
 * Inner step. One 64-byte chunk of a panel is one zmm: 16 int32 lanes = the
 * 16 rows of the panel, each lane 4 consecutive k as u8.
 *   I4W/I4WA x Q8_P: a 32-element block of 16 rows is 8 such vectors
 *     W[0..7] (chunk c gives W[2c] = low nibbles = k 8c..8c+3 and W[2c+1] =
 *     high nibbles = k 8c+4..8c+7), and W[j] pairs with activation dword j
 *     of the block, broadcast to all lanes by vpdpbusd's {1to16} memory
 *     operand:  i = c + sum_j vpdpbusd(W[j], bcast(a32[j]))   (exact int32)
 *   I8W x Q16_P: chunk j (k 4j..4j+3) becomes two vectors of int16 pairs:
 *     read as words, lane r is (u0 + 256 u1, u2 + 256 u3), so Wl = v & 0x00ff
 *     is (u[r][4j], u[r][4j+2]) and Wh = v >> 8 (16-bit shift) is
 *     (u[r][4j+1], u[r][4j+3]), zero-extended; the pack stores each token's
 *     int16 quants as pairs (a[4j], a[4j+2]), (a[4j+1], a[4j+3]), broadcast
 *     as dwords:
 *         i = c + sum_j vpdpwssd(Wl, bcast) + vpdpwssd(Wh, bcast)  (exact)
 *     Lanes stay rows, so nothing is reduced across lanes; the cost is 16
 *     products per block and token instead of 8 (GEMM about half the int8
 *     rate; decode stays bandwidth-bound).
 * The weight offset is removed in the integer domain: c = -off * sum(q)
 * over the activation block (off = 128 for I8W's u8 = q+128, 8 for I4W's
 * u = q+8, 0 for I4WA), so i is the exact block dot product of the signed
 * weights, as in the reference. Then per block gacc += cvt(i) * d_a, and at
 * the end of each group acc += gacc * d_w (16 row scales, f16 -> f32), and
 * for I4WA acc += m_w * S with S = sum of the activation s over the group.
 * Per block and token that is 8 vpdpbusd (16 vpdpwssd) + cvt + 1 mul/fma
 * (+1 fma per group).
 *
 * Activation packing. For every tile of T tokens and k-chunk the activation
 * rows are rearranged once into a stack buffer, per block b:
 *     q[T][32] | f32 d[T] | int32 c[T]    ((QB+8)*T bytes)
 * with q int8 (QB = 32 bytes, Q8_P) or int16 (QB = 64, Q16_P for I8W, in
 * each group of 4 reordered a0, a2, a1, a3) (for
 * I4WA c holds, as f32, S of the group segment that ends at b, else 0), so
 * the tile kernel addresses every token with one pointer and fixed
 * displacements. The pack is reused by all panels of a row block.
 *
 * Tiling. A tile is 1 panel (16 rows) x T tokens (T <= 8), the weights of
 * one block unpacked once into 8 registers (I8W: one chunk, 2 registers, at
 * a time) and used for all T tokens; the tokens' float accumulators (and
 * per-group partial sums) stay in registers. Prefill walks the rows in
 * blocks of ~2 MiB of panels: for each row block, for each tile of 8 tokens
 * (packed once), all panels of the block; each panel comes from DRAM once
 * per row block and then from L3/L2 (one tile needs ~4 B/cycle of weights,
 * which L3 delivers), while the packed tokens stay in L1/L2. Smaller
 * (L2-sized) row blocks measured slower: the pack, ~15 instructions per
 * token and block, is then amortized over fewer panels (-10% at n_in = 5632
 * with 512 KiB). Decode (n_tok <= PT: one token tile) streams the thread's
 * panels once (they are contiguous), with software prefetch into L1
 * (PF_HINT) PFD bytes ahead; the first PFD bytes are requested before the
 * activations are packed: a batch of 8 tokens left to the hardware
 * prefetchers alone took ~1.4x as long (docs/PERFORMANCE.md). So does the
 * first token tile of each prefill row block, the one that reads the
 * block's panels from memory. A/B on Zen 4, 2 threads, TinyLlama Q4_0
 * decode as a fraction of
 * the paired read (2026-11-27): where the read runs at ~50 GB/s, L2 at 2 KiB
 * and L1 at 6 KiB both 0.96-0.98; where it runs at 80-85 GB/s, L2 at 2 KiB
 * 0.84-0.86, L1 at 2 KiB 0.84-0.86, L1 at 6 KiB 0.91-0.92 (8 pairs; the
 * k-quant GEMV measured the same, kquant_avx512.c KPFD).
 *
 * k is cut into chunks of at most KCB blocks (I8W: what the buffer holds at
 * 72*T bytes a block: 106 for a full tile) (the packed buffer has a fixed
 * size); later chunks add into y. Groups may span chunks (the
 * group's scale multiplies each partial sum).
 */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include "avx512_inl.h"

#include <immintrin.h>
#include <string.h>


#define PT 8             /* max tokens per tile                    */
#define PK_BLK (40 * PT) /* packed bytes per block of a full tile  */
#define KCB 192          /* blocks per k-chunk (60 KiB pack)       */
#ifndef PFD
#define PFD 6144 /* decode prefetch distance, bytes        */
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0 /* ... into L1 */
#endif
#define ROWBLK_BYTES (2u << 20) /* weights per row block in prefill      */

enum { D_I8W = 0, D_I4W = 1, D_I4WA = 2 };

/* Bytes of one token's quants in a packed block: int16 for I8W (Q16_P),
 * int8 otherwise (Q8_P). A packed block of T tokens is (QB + 8) * T bytes:
 * q[T][32] | f32 d[T] | int32 c[T]. */
#define QB(DT) ((DT) == D_I8W ? 64 : 32)

/* One block (32 k) of one panel against T packed tokens (block pointer p):
 * gacc[t] (+)= cvt(exact int dot - off*sum(q)) * d_a[t].
 * I8W x Q16_P: chunk j (k = 4j..4j+3) is split by an and and a shift into
 * Wl (lane r = row r: k 4j, 4j+2 as zero-extended int16) and Wh (k 4j+1,
 * 4j+3), each multiplied by the token's matching int16 pair with vpdpwssd: 16 products per block and token, every lane still one row, so
 * nothing needs reducing. u8 <= 255 times |q| <= 32767, 32 of them, plus
 * the -128*sum(q) start: every partial sum stays below 2^29 in magnitude.
 * For T <= 4 the Wl and Wh products go to two chains (their sum at the end)
 * to halve the dependent vpdpwssd latency of decode. */
IE_INLINE void pblock(const int DT, const int T, const int FIRST, const int PF, const uint8_t *q, const uint8_t *p,
                      __m512 gacc[PT])
{
    const size_t bb = DT == D_I8W ? 512 : 256;
    const int qb = QB(DT);
    if (PF) {
#pragma GCC unroll 8
        for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)q + PFD + o, PF_HINT);
    }
    __m512i I[PT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        I[t] = DT == D_I4WA ? _mm512_setzero_si512() : _mm512_set1_epi32(ld32(p + (qb + 4) * T + 4 * t));
    if (DT == D_I8W) {
        /* lane r of a chunk is the bytes (k0, k1, k2, k3) of row r; as int16
         * words (k0 + 256 k1, k2 + 256 k3), so an and with 0x00ff gives the
         * zero-extended pair (k0, k2) and a word shift by 8 (k1, k3); the
         * pack stored the activations as (a0, a2), (a1, a3) to match */
        const __m512i lo8 = _mm512_set1_epi16(0x00ff);
        const int two = T <= 4;
        __m512i I2[PT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) I2[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * j));
            const __m512i wl = _mm512_and_si512(v, lo8), wh = _mm512_srli_epi16(v, 8);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                I[t] = dpwssd_bcast(I[t], wl, p + 64 * t + 8 * j);
                if (two) I2[t] = dpwssd_bcast(I2[t], wh, p + 64 * t + 8 * j + 4);
                else I[t] = dpwssd_bcast(I[t], wh, p + 64 * t + 8 * j + 4);
            }
        }
        if (two) {
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) I[t] = _mm512_add_epi32(I[t], I2[t]);
        }
    } else {
        __m512i W[8];
        const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
            W[2 * c] = _mm512_and_si512(v, m4);
            W[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        /* j outer, tokens inner: T independent vpdpbusd chains in flight
         * (token-outer order left the scheduler full of dependent ops);
         * decode (T <= 2) splits each token's 8 products over NC chains so
         * the block is not one 8-deep dependency chain */
        const int NC = T == 1 ? 4 : T == 2 ? 2 : 1;
        __m512i X[PT][4];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
#pragma GCC unroll 4
            for (int c = 1; c < NC; c++) X[t][c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                if (j % NC == 0) I[t] = dpbusd_bcast(I[t], W[j], p + 32 * t + 4 * j);
                else X[t][j % NC] = dpbusd_bcast(X[t][j % NC], W[j], p + 32 * t + 4 * j);
            }
        if (NC > 1) {
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512i s = X[t][1];
#pragma GCC unroll 4
                for (int c = 2; c < NC; c++) s = _mm512_add_epi32(s, X[t][c]);
                I[t] = _mm512_add_epi32(I[t], s);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m512 da = _mm512_set1_ps(ldf(p + qb * T + 4 * t));
        gacc[t] = FIRST ? _mm512_mul_ps(_mm512_cvtepi32_ps(I[t]), da)
                        : _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[t]), da, gacc[t]);
    }
}

/* One panel x T tokens over blocks [b0, b1) of k. panel: the panel's first
 * byte; gb: bytes per group in a panel; bpg: blocks per group (ONE: bpg is
 * 1); pk: packed tokens (block b at pk + (b-b0)*(QB+8)*T); y: row 16p of token
 * 0; rows with a clear bit in rmask are not written; first: store (else
 * add into y). */
IE_INLINE void ptile(const int DT, const int T, const int ONE, const int PF, const uint8_t *panel, size_t gb,
                     int64_t bpg, int64_t b0, int64_t b1, const uint8_t *pk, float *y, int64_t ldy, __mmask16 rmask,
                     int first)
{
    const size_t hdr = DT == D_I4WA ? 64 : 32, bb = DT == D_I8W ? 512 : 256, ks = (QB(DT) + 8) * (size_t)T;
    __m512 acc[PT], gacc[PT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const uint8_t *p = pk;
    if (ONE) {
        const uint8_t *gp = panel + (size_t)b0 * gb;
        for (int64_t b = b0; b < b1; b++, gp += gb, p += ks) {
            const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gp));
            pblock(DT, T, 1, PF, gp + hdr, p, gacc);
            if (DT == D_I4WA) {
                const __m512 wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gp + 32)));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    acc[t] = _mm512_fmadd_ps(wm, _mm512_set1_ps(ldf(p + (QB(DT) + 4) * T + 4 * t)),
                                             _mm512_fmadd_ps(gacc[t], wd, acc[t]));
            } else {
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) acc[t] = _mm512_fmadd_ps(gacc[t], wd, acc[t]);
            }
        }
    } else {
        int64_t b = b0;
        while (b < b1) {
            const int64_t g = b / bpg;
            const int64_t e = (g + 1) * bpg < b1 ? (g + 1) * bpg : b1;
            const uint8_t *gp = panel + (size_t)g * gb;
            const uint8_t *q = gp + hdr + (size_t)(b - g * bpg) * bb;
            pblock(DT, T, 1, PF, q, p, gacc);
            for (b++, q += bb, p += ks; b < e; b++, q += bb, p += ks) pblock(DT, T, 0, PF, q, p, gacc);
            const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gp));
            if (DT == D_I4WA) {
                const __m512 wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gp + 32)));
                const uint8_t *pe = p - ks; /* block e-1 holds S of this segment */
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    acc[t] = _mm512_fmadd_ps(wm, _mm512_set1_ps(ldf(pe + (QB(DT) + 4) * T + 4 * t)),
                                             _mm512_fmadd_ps(gacc[t], wd, acc[t]));
            } else {
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) acc[t] = _mm512_fmadd_ps(gacc[t], wd, acc[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        float *yt = y + (int64_t)t * ldy;
        __m512 v = acc[t];
        if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rmask, yt));
        _mm512_mask_storeu_ps(yt, rmask, v);
    }
}

typedef void (*ptile_fn)(const uint8_t *panel, size_t gb, int64_t bpg, int64_t b0, int64_t b1, const uint8_t *pk,
                         float *y, int64_t ldy, __mmask16 rmask, int first);

/* Tiles that read their panels from memory (a decode call's one token
 * tile, the first token tile of a prefill row block) prefetch (PF 1); the
 * other prefill tiles read L2/L3-resident panels and do not. */
#define PTILE(DT, name, T, ONE, PF)                                                                         \
    static void ptile_##name##_##T##_##ONE##_##PF(const uint8_t *panel, size_t gb, int64_t bpg, int64_t b0, \
                                                  int64_t b1, const uint8_t *pk, float *y, int64_t ldy,     \
                                                  __mmask16 rmask, int first)                               \
    {                                                                                                       \
        ptile(DT, T, ONE, PF, panel, gb, bpg, b0, b1, pk, y, ldy, rmask, first);                            \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
#define PTILES1(DT, name, ONE, PF)                                                                                \
    PTILE(DT, name, 1, ONE, PF) PTILE(DT, name, 2, ONE, PF) PTILE(DT, name, 3, ONE, PF)                           \
    PTILE(DT, name, 4, ONE, PF) PTILE(DT, name, 5, ONE, PF) PTILE(DT, name, 6, ONE, PF)                           \
    PTILE(DT, name, 7, ONE, PF) PTILE(DT, name, 8, ONE, PF)
#define PTROW(name, ONE, PF)                                                                                      \
    { NULL, ptile_##name##_1_##ONE##_##PF, ptile_##name##_2_##ONE##_##PF, ptile_##name##_3_##ONE##_##PF,          \
      ptile_##name##_4_##ONE##_##PF, ptile_##name##_5_##ONE##_##PF, ptile_##name##_6_##ONE##_##PF,                \
      ptile_##name##_7_##ONE##_##PF, ptile_##name##_8_##ONE##_##PF }
#define PTILES(DT, name)                                                                                          \
    PTILES1(DT, name, 0, 0) PTILES1(DT, name, 1, 0) PTILES1(DT, name, 0, 1) PTILES1(DT, name, 1, 1)               \
    static const ptile_fn ptiles_##name[2][2][PT + 1] = {                                                         \
        { PTROW(name, 0, 0), PTROW(name, 1, 0) }, { PTROW(name, 0, 1), PTROW(name, 1, 1) } };

PTILES(D_I8W, i8w)
PTILES(D_I4W, i4w)
PTILES(D_I4WA, i4wa)
// clang-format on

/* Pack blocks [kb0, kb1) of tokens a, a+as, ... (tt of them) into pk
 * (layout in the file comment, T = tt; I8W: Q16_P rows, int16 quants). */
static void pack_tokens(int dt, int64_t bpg, const uint8_t *a, size_t as, int64_t n_in, int tt, int64_t kb0,
                        int64_t kb1, uint8_t *pk)
{
    const int64_t nb = n_in / 32;
    const size_t qb = dt == D_I8W ? 64 : 32, ks = (qb + 8) * (size_t)tt;
    const int off = dt == D_I8W ? 128 : 8;
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    /* int16 (a0, a1, a2, a3) -> (a0, a2, a1, a3) in every group of 4 */
    const __m512i a_perm = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
    for (int t = 0; t < tt; t++) {
        const uint8_t *row = a + (size_t)t * as;
        const uint8_t *dp = row + qb * (size_t)nb, *sp = dp + 4 * nb;
        uint8_t *dst = pk + qb * (size_t)t;
        float S = 0.0f;
        for (int64_t b = kb0; b < kb1; b++, dst += ks) {
            uint8_t *dq = dst + qb * (size_t)(tt - t) + 4 * (size_t)t; /* this token's d */
            uint8_t *cp = dq + 4 * (size_t)tt;                         /* and c          */
            memcpy(dq, dp + 4 * b, 4);
            int32_t sum = 0;
            if (dt == D_I8W) {
                /* 32 int16: sum by vpmaddwd with ones, then across lanes */
                const __m512i q = _mm512_loadu_si512((const void *)(row + 64 * b));
                _mm512_storeu_si512((void *)dst, _mm512_shuffle_epi8(q, a_perm));
                sum = _mm512_reduce_add_epi32(_mm512_madd_epi16(q, _mm512_set1_epi16(1)));
            } else {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(row + 32 * b));
                _mm256_storeu_si256((__m256i *)dst, q);
                /* sum of 32 int8: sad of q^0x80 (= q+128) against 0, minus 32*128 */
                const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(q, bias), _mm256_setzero_si256());
                const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
                sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
            }
            if (dt == D_I4WA) {
                S += ldf(sp + 4 * b);
                const int end = (b + 1) % bpg == 0 || b + 1 == kb1;
                const float v = end ? S : 0.0f;
                memcpy(cp, &v, 4);
                if (end) S = 0.0f;
            } else {
                const int32_t c = -off * sum;
                memcpy(cp, &c, 4);
            }
        }
    }
}

ie_status_t ie_matmul_packed_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                    int64_t n_tok, float *y, int64_t ldy)
{
    if (!m || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || r0 < 0 || r0 % IE_PANEL != 0 || r1 < r0 ||
        r1 > m->n_out || (r1 != m->n_out && r1 % IE_PANEL != 0))
        return IE_ERR_INVAL;
    if (r0 == r1 || n_tok <= 0) return IE_OK;
    if (ie_dtype_is_kq_panel(m->dtype)) return ie_matmul_packed_kq_avx512(m, r0, r1, a, a_stride, n_tok, y, ldy);
    if (ie_dtype_is_half(m->dtype)) {
        if (!m->data || !a || !y) return IE_ERR_INVAL;
        (m->dtype == IE_DTYPE_BF16 ? ie_matmul_packed_bf16_avx512
                                   : ie_matmul_packed_f16_avx512)(m, r0, r1, a, a_stride, n_tok, y, ldy);
        return IE_OK;
    }
    const int dt = m->dtype == IE_DTYPE_I8W ? D_I8W : m->dtype == IE_DTYPE_I4W ? D_I4W : D_I4WA;
    const ptile_fn(*tiles)[2][PT + 1] = dt == D_I8W ? ptiles_i8w : dt == D_I4W ? ptiles_i4w : ptiles_i4wa;
    const int64_t n_in = m->n_in, nb = n_in / 32, bpg = m->group / 32;
    const size_t pb = ie_pack_panel_bytes(m->dtype, m->group, n_in);
    const size_t gb = pb / (size_t)(n_in / m->group);
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    const int T = n_tok < PT ? (int)n_tok : PT;
    /* the first token tile of a row block reads its panels from memory:
     * it fetches ahead; the others find them in L2/L3 */
    const ptile_fn *first_fns = tiles[1][bpg == 1], *fns = tiles[0][bpg == 1];
    /* panels per row block: all of them when there is one token tile */
    int64_t rb = p1 - p0;
    if (n_tok > T) {
        rb = (int64_t)(ROWBLK_BYTES / pb);
        if (rb < 1) rb = 1;
    }
    _Alignas(64) uint8_t pk[KCB * PK_BLK];
    /* I8W: as many blocks as the buffer holds for this tile (>= 106; one
     * chunk for decode up to n_in = 27k, so each panel streams once) */
    const int64_t kcb = dt == D_I8W ? (int64_t)(sizeof pk / (72 * (size_t)T)) : KCB;
    const uint8_t *w = m->data;
    for (size_t o = 0; o < PFD; o += 64) _mm_prefetch((const char *)w + (size_t)p0 * pb + o, PF_HINT);
    for (int64_t kb0 = 0; kb0 < nb; kb0 += kcb) {
        const int64_t kb1 = kb0 + kcb < nb ? kb0 + kcb : nb;
        for (int64_t q0 = p0; q0 < p1; q0 += rb) {
            const int64_t q1 = q0 + rb < p1 ? q0 + rb : p1;
            for (int64_t t0 = 0; t0 < n_tok; t0 += T) {
                const int tt = n_tok - t0 < T ? (int)(n_tok - t0) : T;
                pack_tokens(dt, bpg, (const uint8_t *)a + (size_t)t0 * a_stride, a_stride, n_in, tt, kb0, kb1, pk);
                for (int64_t p = q0; p < q1; p++) {
                    const int64_t rows = r1 - p * IE_PANEL;
                    const __mmask16 rmask = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
                    (t0 == 0 ? first_fns : fns)[tt](w + (size_t)p * pb, gb, bpg, kb0, kb1, pk,
                                                    y + t0 * ldy + p * IE_PANEL, ldy, rmask, kb0 == 0);
                }
            }
        }
    }
    return IE_OK;
}

/* Contract of ie_kernels_t.matmul_packed_ranges. One token tile and one
 * k pass (n_tok <= PT, n_in <= KCB blocks for the int4 types, what the
 * buffer holds for I8W): the tokens are packed once and every range runs
 * its panels from that pack, each range starting with the prefetch of its
 * first PFD bytes (a range that continues the previous one finds them in
 * flight already). Otherwise one matmul_packed call per range. */
ie_status_t ie_matmul_packed_ranges_avx512(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                           size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    if (!m || !next || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || n_tok <= 0) return IE_ERR_INVAL;
    if (ie_dtype_is_kq_panel(m->dtype))
        return ie_matmul_packed_ranges_kq_avx512(m, next, ctx, a, a_stride, n_tok, y, ldy);
    if (ie_dtype_is_half(m->dtype)) /* nothing to pack once */
        return ie_packed_ranges_by_calls(ie_matmul_packed_avx512, m, next, ctx, a, a_stride, n_tok, y, ldy);
    const int dt = m->dtype == IE_DTYPE_I8W ? D_I8W : m->dtype == IE_DTYPE_I4W ? D_I4W : D_I4WA;
    const int64_t n_in = m->n_in, nb = n_in / 32, bpg = m->group / 32;
    const int64_t np = (m->n_out + IE_PANEL - 1) / IE_PANEL;
    _Alignas(64) uint8_t pk[KCB * PK_BLK];
    const int64_t kcb = dt == D_I8W ? (int64_t)(sizeof pk / (72 * (size_t)n_tok)) : KCB;
    if (n_tok > PT || nb > kcb)
        return ie_packed_ranges_by_calls(ie_matmul_packed_avx512, m, next, ctx, a, a_stride, n_tok, y, ldy);
    int64_t p0, p1;
    const ptile_fn(*tiles)[2][PT + 1] = dt == D_I8W ? ptiles_i8w : dt == D_I4W ? ptiles_i4w : ptiles_i4wa;
    const ptile_fn *fns = tiles[1][bpg == 1]; /* one token tile: streamed */
    const size_t pb = ie_pack_panel_bytes(m->dtype, m->group, n_in);
    const size_t gb = pb / (size_t)(n_in / m->group);
    const int tt = (int)n_tok;
    const uint8_t *w = m->data;
    int packed = 0;
    while (next(ctx, &p0, &p1)) {
        if (p0 < 0 || p1 <= p0 || p0 >= np) return IE_ERR_INVAL;
        if (p1 > np) p1 = np;
        for (size_t o = 0; o < PFD; o += 64) _mm_prefetch((const char *)w + (size_t)p0 * pb + o, PF_HINT);
        if (!packed) {
            pack_tokens(dt, bpg, (const uint8_t *)a, a_stride, n_in, tt, 0, nb, pk);
            packed = 1;
        }
        for (int64_t p = p0; p < p1; p++) {
            const int64_t rows = m->n_out - p * IE_PANEL;
            const __mmask16 rmask = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
            fns[tt](w + (size_t)p * pb, gb, bpg, 0, nb, pk, y + p * IE_PANEL, ldy, rmask, 1);
        }
    }
    return IE_OK;
}
