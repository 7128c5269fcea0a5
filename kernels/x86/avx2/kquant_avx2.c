/* kquant_avx2.c — matmul_packed for the k-quants on AVX2 + FMA + F16C:
 * PANEL16 k-quant weights (ie_pack.h, "K-QUANTS in PANEL16") times Q8_K
 * activations (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) or Q8_P activations
 * (Q5_0, Q5_1, IQ4_NL).
 *
 * A 64-byte chunk of a panel is 16 rows x one quad of 4 consecutive
 * columns; its low 32 bytes are rows 0-7, its high 32 bytes rows 8-15, so
 * one ymm of int32 lanes is 8 rows (a half) and the rows never leave their
 * lane: no horizontal sums. A slab of 32 columns has 8 quads q = 0..7
 * (columns 4q..4q+3); the code byte of quad q is rebuilt in registers from
 * the slab's planes with byte-masked 16-bit shifts (no bit crosses into the
 * neighbouring byte under the masks used):
 *   nibbles : chunk q/2, low nibble (q even) or high nibble (q odd);
 *   crumbs  : chunk q/4, bits 2(q%4)..2(q%4)+1 (bits 0-1 of a 2/3-bit
 *             code, bits 4-5 of a 6-bit one);
 *   bits    : the slab's bit chunk, bit q (bit 2 of a 3-bit code, bit 4
 *             of a 5-bit one);
 *   IQ4     : the nibble looked up in the code book with vpshufb.
 *
 * Integer products without VNNI: vpmaddubsw (u8 code x s8 activation ->
 * int16 sums of 2) and vpmaddwd (-> int32 sums of 4). Every partial sum is
 * exact: with activations q in [-127, 127] (what the quantizers produce)
 * and codes u < 2^b, the int16 lanes of kq_qpm(T) quads (2*qpm products)
 * are added before one vpmaddwd: 4-bit 16 products, at most 16*15*127 =
 * 30480; 2/3-bit 8*7*127; 5-bit 8*31*127 = 31496; 6-bit 4*63*127 = 32004,
 * all < 32767. IQ4 codes kv are signed (-127 .. 113): the product is
 * vpmaddubsw(|kv|, sign(q, kv)), at most 2*127*127 = 32258 per lane, so
 * each goes into vpmaddwd alone; MXFP4's book is small (|kv| <= 12), so
 * its 4-bit lanes add up like the others'.
 *   The vpmaddwd that widens a sub-block's int16 sums multiplies them by
 * its scale (K types and IQ4_XS: each row's sc code duplicated in both
 * halves of its dword) or by ones (32-element types). A super-block's sum
 * sum_j sc_j * sum_k u*q stays an exact int32 (Q6_K, the largest: at most
 * 128*256*63*127 < 2^29, and 32*|msum| below < 2^28). The per-sub-block
 * activation sums of Q8_K (bsums, one per 16) give the rest in integers:
 *   msum = sum_j c_j * bsums_j with c = mn (Q2_K; Q4_K, Q5_K per 32) or
 *   sc (Q3_K, Q6_K), by vpmaddwd of each row's (c_2m, c_2m+1) int16 pair
 *   with the token's broadcast (bsums_2m, bsums_2m+1);
 *   Q2_K, Q4_K, Q5_K: y += d*da*isum - dmin*da*msum
 *   Q3_K: y += d*da*(isum - 4*msum); Q6_K: y += d*da*(isum - 32*msum)
 *   IQ4_XS: y += d*da*isum
 * and for the 32-element types, per block (da, sa = Q8_P's d and s):
 *   IQ4_NL: y += d*da*isum; Q5_0: y += d*da*isum - 16*d*sa;
 *   Q5_1: y += d*da*isum + m*sa
 * (the reference's formula; sums of blocks in f32 FMA here, in double
 * there, so the two agree to rounding, not to the bit.)
 *
 * Tiles: the decode GEMV takes a panel (both halves) x 1 token; the prefill
 * GEMM takes a half panel x KQ_NT tokens, so each rebuilt code vector
 * serves KQ_NT tokens, walking the activations in token blocks of ~256 KiB
 * that stay in L2 while every panel of the range passes over them (a panel
 * is at most 16*n_in*6/8 bytes plus its headers: L2 as well). The GEMV
 * prefetches every line KQ_PF_DIST bytes ahead (the blocks are 0.3-3.3
 * KiB; a line or two ahead left the big-block types at half the bandwidth).
 * The block geometry comes from ie_kq_panel; kq_tile's field offsets
 * inside a block are ie_pack.h's, checked by test_kquant_pack.
 */
#include "../../src/ie_kernels_isa.h"

#include "avx2_inl.h"

#include <immintrin.h>
#include <string.h>


#define KQ_NT 4          /* tokens per GEMM tile: 3, 5 (fewer registers free), 6 (spills) were slower */
#define KQ_PF_DIST 8192  /* GEMV prefetch distance, bytes: 2048 gave 0.7x on Q4_K-Q6_K (Zen 4), 16384 the same */
#define KQ_Q8K_BYTES 292 /* sizeof(ie_block_q8_k_t): f32 d, int8 q[256], int16 bsums[16] */
#define KQ_Q8K_BSUMS 260 /* offset of bsums in a Q8_K block */

/* Geometry of one packed k-quant matrix, computed once per call. */
typedef struct {
    int64_t n_in, nb;   /* elements, blocks per row               */
    size_t hdr_bytes;   /* d, dmin, sc, mn of one block           */
    size_t block_bytes; /* header + codes of one block            */
    size_t panel_bytes; /* one panel                              */
} kq_geom_t;

/* ------------------------------------------------- per-type constants
 * T is always a compile-time constant below (every caller is an
 * always-inline instance for one type), so these fold away. */

IE_INLINE int kq_bits(ie_dtype_t T)
{
    switch (T) {
    case IE_DTYPE_Q2_K: return 2;
    case IE_DTYPE_Q3_K: return 3;
    case IE_DTYPE_Q5_0:
    case IE_DTYPE_Q5_1:
    case IE_DTYPE_Q5_K: return 5;
    case IE_DTYPE_Q6_K: return 6;
    default: return 4; /* Q4_K, IQ4_NL, IQ4_XS, MXFP4 */
    }
}

/* Elements per block: 32 for the Q8_P types, 256 for the Q8_K ones. */
IE_INLINE int kq_qk(ie_dtype_t T)
{
    return T == IE_DTYPE_Q5_0 || T == IE_DTYPE_Q5_1 || T == IE_DTYPE_IQ4_NL || T == IE_DTYPE_MXFP4 ? IE_QK
                                                                                                   : IE_QK_K;
}

/* Sub-blocks (one sc code each) per block; 0 for the 32-element types. */
IE_INLINE int kq_nsub(ie_dtype_t T)
{
    if (kq_qk(T) == IE_QK) return 0;
    return T == IE_DTYPE_Q4_K || T == IE_DTYPE_Q5_K || T == IE_DTYPE_IQ4_XS ? 8 : 16;
}

IE_INLINE int kq_has_dmin(ie_dtype_t T)
{
    return T == IE_DTYPE_Q2_K || T == IE_DTYPE_Q4_K || T == IE_DTYPE_Q5_K || T == IE_DTYPE_Q5_1;
}

IE_INLINE int kq_has_mn(ie_dtype_t T) { return T == IE_DTYPE_Q2_K || T == IE_DTYPE_Q4_K || T == IE_DTYPE_Q5_K; }

/* codes that index a code book (IQ4_NL, IQ4_XS, MXFP4) */
IE_INLINE int kq_is_iq4(ie_dtype_t T) { return ie_kq_book(T) != NULL; }

/* Quads whose vpmaddubsw results may add up in int16 before vpmaddwd
 * (the bounds in the file comment); a divisor of the quads per sub-block. */
IE_INLINE int kq_qpm(ie_dtype_t T)
{
    if (T == IE_DTYPE_MXFP4) return 8; /* |kv| <= 12: 16*12*127 < 32767 */
    if (kq_is_iq4(T)) return 1;
    switch (kq_bits(T)) {
    case 4: return 8;
    case 6: return 2;
    default: return 4;
    }
}

/* ------------------------------------------------------------ helpers */

IE_INLINE __m256i ld256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }

/* Each 16-bit word of v shifted left by n (right by -n when n < 0). */
IE_INLINE __m256i shl16(__m256i v, const int n)
{
    return n >= 0 ? _mm256_slli_epi16(v, n) : _mm256_srli_epi16(v, -n);
}

/* 8 int8 of rows 0-7 as int32 lanes holding the pair (lo[r], hi[r]) of
 * int16: the vpmaddwd operand that weighs an int16 pair with two
 * coefficients (lo = hi: one coefficient for both). */
IE_INLINE __m256i pair16(const int8_t *lo, const int8_t *hi)
{
    const __m256i l = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)lo));
    const __m256i h = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)hi));
    return _mm256_blend_epi16(l, _mm256_slli_epi32(h, 16), 0xaa);
}

/* The code bytes of quad q (0..7) of a slab for one half: sl points at the
 * slab's codes plus 32*half (ie_pack.h: nibble chunks, crumb chunks, bit
 * chunk, 64 bytes each). IQ4 types: the nibble (the code book index). */
IE_INLINE __m256i kq_code(const ie_dtype_t T, const uint8_t *sl, const int q)
{
    const int bits = kq_bits(T);
    __m256i u;
    if (bits >= 4) {
        const __m256i w = ld256(sl + 64 * (q >> 1));
        u = _mm256_and_si256(q & 1 ? _mm256_srli_epi16(w, 4) : w, _mm256_set1_epi8(0x0f));
        if (bits == 5) /* bit chunk after 4 nibble chunks: bit q -> bit 4 */
            u = _mm256_or_si256(u, _mm256_and_si256(shl16(ld256(sl + 256), 4 - q), _mm256_set1_epi8(0x10)));
        if (bits == 6) /* crumb chunk q/4 after the nibbles: bits 2t, 2t+1 -> 4, 5 */
            u = _mm256_or_si256(u, _mm256_and_si256(shl16(ld256(sl + 256 + 64 * (q >> 2)), 4 - 2 * (q & 3)),
                                                    _mm256_set1_epi8(0x30)));
    } else {
        u = _mm256_and_si256(shl16(ld256(sl + 64 * (q >> 2)), -2 * (q & 3)), _mm256_set1_epi8(0x03));
        if (bits == 3) /* bit chunk after 2 crumb chunks: bit q -> bit 2 */
            u = _mm256_or_si256(u, _mm256_and_si256(shl16(ld256(sl + 128), 2 - q), _mm256_set1_epi8(0x04)));
    }
    return u;
}

/* ----------------------------------------------------------------- tile
 *
 * Rows of halves h0 .. h0+NH-1 of panel `pan` x NT tokens (activation rows
 * a[t]); acc[t*NH + hh] receives the 8 results of token t, half h0 + hh. */
IE_INLINE void kq_tile(const ie_dtype_t T, const int NT, const int NH, const kq_geom_t *g, const uint8_t *pan,
                       const int h0, const uint8_t *const *a, __m256 *acc)
{
    const int bits = kq_bits(T), qk = kq_qk(T), nsub = kq_nsub(T), qpm = kq_qpm(T);
    const int nslab = qk / 32, quads_per_sub = nsub == 8 ? 8 : 4;
    const int kq8k = qk == IE_QK_K;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i book = kq_is_iq4(T) ? _mm256_broadcastsi128_si256(
                                            _mm_loadu_si128((const __m128i *)(const void *)ie_kq_book(T)))
                                      : _mm256_setzero_si256();
    /* Q8_P: d[nb] and s[nb] after the n_in quants */
    const size_t ad_off = (size_t)g->n_in, as_off = ad_off + 4 * (size_t)g->nb;

#pragma GCC unroll 8
    for (int i = 0; i < NT * NH; i++) acc[i] = _mm256_setzero_ps();

    for (int64_t b = 0; b < g->nb; b++) {
        const uint8_t *blk = pan + (size_t)b * g->block_bytes;
        const uint8_t *codes = blk + g->hdr_bytes;
        __m256 wd[2], wm[2];
#pragma GCC unroll 2
        for (int hh = 0; hh < NH; hh++) {
            wd[hh] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 16 * (h0 + hh))));
            wm[hh] = kq_has_dmin(T) ? _mm256_cvtph_ps(_mm_loadu_si128(
                                          (const __m128i *)(const void *)(blk + 32 + 16 * (h0 + hh))))
                                    : _mm256_setzero_ps();
        }

        /* the block's scale operands, shared by the NT tokens */
        __m256i scv[16][2], cpv[8][2];
        if (nsub) {
            const int8_t *sc = (const int8_t *)(blk + 32 * (1 + kq_has_dmin(T)));
            const int8_t *mn = sc + 16 * nsub;
            /* Q2_K: mn per 16; Q3_K, Q6_K: sc per 16 (the offset); Q4_K, Q5_K: mn per 32 */
            const int8_t *cf = T == IE_DTYPE_Q3_K || T == IE_DTYPE_Q6_K ? sc : mn;
#pragma GCC unroll 2
            for (int hh = 0; hh < NH; hh++) {
                const int o = 8 * (h0 + hh);
#pragma GCC unroll 16
                for (int j = 0; j < nsub; j++) scv[j][hh] = pair16(sc + 16 * j + o, sc + 16 * j + o);
                if (T != IE_DTYPE_IQ4_XS) {
#pragma GCC unroll 8
                    for (int m = 0; m < 8; m++)
                        cpv[m][hh] = nsub == 8 ? pair16(cf + 16 * m + o, cf + 16 * m + o)
                                               : pair16(cf + 32 * m + o, cf + 32 * m + 16 + o);
                }
            }
        }

        __m256i isum[KQ_NT * 2];
#pragma GCC unroll 8
        for (int i = 0; i < NT * NH; i++) isum[i] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int s = 0; s < nslab; s++) {
            if (NT == 1) { /* the GEMV streams: each line KQ_PF_DIST ahead */
                const uint8_t *from = s ? codes + (size_t)s * bits * 64 : blk;
                const uint8_t *to = codes + (size_t)(s + 1) * bits * 64;
                for (const uint8_t *p = from; p < to; p += 64)
                    _mm_prefetch((const char *)p + KQ_PF_DIST, _MM_HINT_T0);
            }
#pragma GCC unroll 2
            for (int hh = 0; hh < NH; hh++) {
                const uint8_t *sl = codes + (size_t)s * bits * 64 + 32 * (h0 + hh);
                __m256i s16[KQ_NT];
#pragma GCC unroll 8
                for (int q = 0; q < 8; q++) {
                    __m256i u = kq_code(T, sl, q), kv = u;
                    if (kq_is_iq4(T)) {
                        kv = _mm256_shuffle_epi8(book, u);
                        u = _mm256_abs_epi8(kv);
                    }
#pragma GCC unroll 4
                    for (int t = 0; t < NT; t++) {
                        const uint8_t *aq = a[t] + (kq8k ? (size_t)b * KQ_Q8K_BYTES + 4 : (size_t)b * IE_QK);
                        __m256i av = bcast4(aq + 32 * s + 4 * q);
                        if (kq_is_iq4(T)) av = _mm256_sign_epi8(av, kv);
                        const __m256i p = _mm256_maddubs_epi16(u, av);
                        s16[t] = q % qpm == 0 ? p : _mm256_add_epi16(s16[t], p);
                        /* keep the sum a chain: reassociated into a tree, GCC
                         * computes all NT*8 products first and spills them */
                        __asm__("" : "+x"(s16[t]));
                    }
                    if (q % qpm == qpm - 1) {
                        const __m256i f = nsub ? scv[nsub == 8 ? s : 2 * s + q / quads_per_sub][hh] : ones;
#pragma GCC unroll 4
                        for (int t = 0; t < NT; t++) {
                            isum[t * NH + hh] = _mm256_add_epi32(isum[t * NH + hh], _mm256_madd_epi16(s16[t], f));
                            __asm__("" : "+x"(isum[t * NH + hh])); /* a chain too */
                        }
                    }
                }
            }
        }

        /* scale the block's integer sums into the f32 accumulators */
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            if (kq8k) {
                const uint8_t *ab = a[t] + (size_t)b * KQ_Q8K_BYTES;
                const __m256 da = _mm256_set1_ps(ld_f32(ab));
#pragma GCC unroll 2
                for (int hh = 0; hh < NH; hh++) {
                    __m256i is = isum[t * NH + hh], ms = _mm256_setzero_si256();
                    if (T != IE_DTYPE_IQ4_XS) {
#pragma GCC unroll 8
                        for (int m = 0; m < 8; m++)
                            ms = _mm256_add_epi32(ms,
                                                  _mm256_madd_epi16(cpv[m][hh], bcast4(ab + KQ_Q8K_BSUMS + 4 * m)));
                    }
                    if (T == IE_DTYPE_Q3_K) is = _mm256_sub_epi32(is, _mm256_slli_epi32(ms, 2));
                    if (T == IE_DTYPE_Q6_K) is = _mm256_sub_epi32(is, _mm256_slli_epi32(ms, 5));
                    __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(wd[hh], da), acc[t * NH + hh]);
                    if (kq_has_mn(T)) v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(wm[hh], da), v);
                    acc[t * NH + hh] = v;
                }
            } else {
                const __m256 da = _mm256_set1_ps(ld_f32(a[t] + ad_off + 4 * (size_t)b));
                const float sa = ld_f32(a[t] + as_off + 4 * (size_t)b);
#pragma GCC unroll 2
                for (int hh = 0; hh < NH; hh++) {
                    __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t * NH + hh]), _mm256_mul_ps(wd[hh], da),
                                               acc[t * NH + hh]);
                    if (T == IE_DTYPE_Q5_0) v = _mm256_fmadd_ps(wd[hh], _mm256_set1_ps(-16.0f * sa), v);
                    if (T == IE_DTYPE_Q5_1) v = _mm256_fmadd_ps(wm[hh], _mm256_set1_ps(sa), v);
                    acc[t * NH + hh] = v;
                }
            }
        }
    }
}

/* One tile function per (type, shape): the GEMV's whole panel x 1 token
 * and the GEMM's half panel x KQ_NT tokens. */
typedef void (*kq_tile_fn)(const kq_geom_t *g, const uint8_t *pan, int h0, const uint8_t *const *a, __m256 *acc);

#define KQ_TILES(NAME, T)                                                                               \
    static void kq_gemv_##NAME(const kq_geom_t *g, const uint8_t *pan, int h0, const uint8_t *const *a, \
                               __m256 *acc)                                                             \
    {                                                                                                   \
        kq_tile(T, 1, 2, g, pan, h0, a, acc);                                                           \
    }                                                                                                   \
    static void kq_gemm_##NAME(const kq_geom_t *g, const uint8_t *pan, int h0, const uint8_t *const *a, \
                               __m256 *acc)                                                             \
    {                                                                                                   \
        kq_tile(T, KQ_NT, 1, g, pan, h0, a, acc);                                                       \
    }

KQ_TILES(q2_k, IE_DTYPE_Q2_K)
KQ_TILES(q3_k, IE_DTYPE_Q3_K)
KQ_TILES(q4_k, IE_DTYPE_Q4_K)
KQ_TILES(q5_k, IE_DTYPE_Q5_K)
KQ_TILES(q6_k, IE_DTYPE_Q6_K)
KQ_TILES(iq4_xs, IE_DTYPE_IQ4_XS)
KQ_TILES(q5_0, IE_DTYPE_Q5_0)
KQ_TILES(q5_1, IE_DTYPE_Q5_1)
KQ_TILES(iq4_nl, IE_DTYPE_IQ4_NL)
KQ_TILES(mxfp4, IE_DTYPE_MXFP4)

/* The two tiles of type t (both NULL for a type that is not a k-quant). */
static void kq_tiles(ie_dtype_t t, kq_tile_fn *gemv, kq_tile_fn *gemm)
{
    switch (t) {
    case IE_DTYPE_Q2_K: *gemv = kq_gemv_q2_k, *gemm = kq_gemm_q2_k; return;
    case IE_DTYPE_Q3_K: *gemv = kq_gemv_q3_k, *gemm = kq_gemm_q3_k; return;
    case IE_DTYPE_Q4_K: *gemv = kq_gemv_q4_k, *gemm = kq_gemm_q4_k; return;
    case IE_DTYPE_Q5_K: *gemv = kq_gemv_q5_k, *gemm = kq_gemm_q5_k; return;
    case IE_DTYPE_Q6_K: *gemv = kq_gemv_q6_k, *gemm = kq_gemm_q6_k; return;
    case IE_DTYPE_IQ4_XS: *gemv = kq_gemv_iq4_xs, *gemm = kq_gemm_iq4_xs; return;
    case IE_DTYPE_Q5_0: *gemv = kq_gemv_q5_0, *gemm = kq_gemm_q5_0; return;
    case IE_DTYPE_Q5_1: *gemv = kq_gemv_q5_1, *gemm = kq_gemm_q5_1; return;
    case IE_DTYPE_IQ4_NL: *gemv = kq_gemv_iq4_nl, *gemm = kq_gemm_iq4_nl; return;
    case IE_DTYPE_MXFP4: *gemv = kq_gemv_mxfp4, *gemm = kq_gemm_mxfp4; return;
    default: *gemv = *gemm = NULL; return;
    }
}

/* Store 8 results (rows row .. row+7 clipped to r1) of one half. */
IE_INLINE void store8(__m256 v, int64_t row, int64_t r1, float *yt)
{
    const int64_t n = r1 - row;
    if (n >= 8) {
        _mm256_storeu_ps(yt + row, v);
    } else if (n > 0) {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        memcpy(yt + row, tmp, (size_t)n * sizeof(float));
    }
}

/* Contract (ie_kernels_isa.h). */
void ie_matmul_packed_kq_avx2(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                              int64_t n_tok, float *y, int64_t ldy)
{
    const ie_dtype_t wt = m->dtype;
    kq_tile_fn gemv, gemm;
    kq_tiles(wt, &gemv, &gemm);
    ie_kq_panel_t kp;
    if (!gemv || ie_kq_panel(wt, &kp) != 0) return;
    kq_geom_t g;
    g.n_in = m->n_in;
    g.nb = m->n_in / kp.info.qk;
    g.hdr_bytes = kp.codes;
    g.block_bytes = kp.block;
    g.panel_bytes = (size_t)g.nb * kp.block;

    const uint8_t *ab = a;
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    const size_t arow = ie_dtype_row_bytes(ie_matmul_packed_act_dtype(m->dtype), m->n_in);
    int64_t tb = (int64_t)((256u << 10) / (arow ? arow : 1));
    if (tb < KQ_NT) tb = KQ_NT;
    tb -= tb % KQ_NT;

    __m256 acc[2 * KQ_NT];
    for (int64_t tb0 = 0; tb0 < n_tok; tb0 += tb) {
        const int64_t tb1 = tb0 + tb < n_tok ? tb0 + tb : n_tok;
        for (int64_t p = p0; p < p1; p++) {
            const uint8_t *pan = (const uint8_t *)m->data + (size_t)p * g.panel_bytes;
            const int64_t row = p * IE_PANEL;
            int64_t t = tb0;
            for (; t + KQ_NT <= tb1; t += KQ_NT) {
                const uint8_t *ar[KQ_NT];
                for (int i = 0; i < KQ_NT; i++) ar[i] = ab + (size_t)(t + i) * a_stride;
                for (int h = 0; h < 2 && row + 8 * h < r1; h++) {
                    gemm(&g, pan, h, ar, acc);
                    for (int i = 0; i < KQ_NT; i++) store8(acc[i], row + 8 * h, r1, y + (t + i) * ldy);
                }
            }
            for (; t < tb1; t++) {
                const uint8_t *ar[1] = {ab + (size_t)t * a_stride};
                gemv(&g, pan, 0, ar, acc);
                store8(acc[0], row, r1, y + t * ldy);
                store8(acc[1], row + 8, r1, y + t * ldy);
            }
        }
    }
}
