/* kquant_avx512.c — AVX-512 VNNI matmul over k-quant PANEL16 weights
 * (ie_pack.h, "K-QUANTS in PANEL16"): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and
 * IQ4_XS against Q8_K activations, Q5_0, Q5_1, IQ4_NL and MXFP4 (its
 * panels are IQ4_NL's with another code book) against Q8_P.
 * Twin of ie_matmul_packed_ref; built like the I4W kernel (pack_avx512.c):
 * the 16 rows of a panel are the 16 int32 lanes, one 64-byte code chunk
 * is one zmm, vpdpbusd multiplies 4 code bytes per lane by 4 activation
 * bytes broadcast ({1to16} memory operand), so nothing is summed across
 * lanes.
 *
 * Codes. A slab of 32 columns is rebuilt 16 columns (4 quads, one quad =
 * 4 consecutive columns per row) at a time into W[0..3], each byte the
 * element's unsigned code: nibbles by an and (low) or a 16-bit shift (high);
 * the upper bits (bit plane: b = 3, 5; crumb plane: b = 6) isolated by an
 * and with their bit in every byte, moved to their place by a 16-bit shift
 * (a lone bit or crumb per byte never crosses into the next byte) and
 * merged by one vpternlogd (A & mask) | B. IQ4: the code book + 128 (u8)
 * by vpshufb. 2/3-bit: crumb >> 2t & 3.
 *
 * Arithmetic per block and token (all of it exact up to the f32 steps):
 *   I_j = sum over sub-block j of code * q          vpdpbusd, int32
 *   F   = sum_j float(sc_j) * float(I_j)            cvt + fma per sub-block
 *         (measured against vpmulld + vpaddd in int32 and one cvt per
 *         block: the float form ran 20-30% faster in the GEMM on Zen 4)
 *   M   = sum_j c_j * S_j                           vpdpwssd on (c, c')
 *         int16 pairs against the activation sums S (Q8_K bsums, per 32
 *         for the 8-sub-block types); c = the min codes (Q2_K, Q4_K, Q5_K)
 *         or the scales (the offset types, whose code offset off -- u - 4
 *         for Q3_K, u - 32 for Q6_K, kv + 128 for IQ4_XS -- contributes
 *         -off * sc_j * S_j)
 *   acc += d_a * (d * F - dmin * M)    or    d_a * d * (F - off * M)
 * The unpacked prefill (below) differs for Q3_K and Q6_K: I_j starts at
 * -off * S_j (k_pre), so M goes; and its F uses d * sc_j as f32 (prepared
 * by k_unpack), so the final multiply by d goes (Q5_K: v = F - dmin * M).
 * The 32-element types have no sub-blocks: the chain starts at -off *
 * sum(q) (u - 16 for Q5_0, kv + 128 for IQ4_NL) and acc += (d * d_a) * I;
 * Q5_1 adds m * s_a. Float sums in another order than the ref: equal
 * within f32 rounding, not bit for bit (test_kquant_pack's tolerance).
 *
 * Activations are rearranged once per token tile and k-chunk into a stack
 * buffer so the tile addresses every token with one pointer and fixed
 * displacements. Per 256-block (Q8_K), T tokens:
 *     q: slab s, token t at 32*T*s + 32*t (32 bytes)  | f32 d[T] |
 *     aux[T][64 bytes]: the int16 sums S as (S_2m, S_2m+1) pairs
 * Per 32-block (Q8_P): q[T][32] | f32 d[T] | c[T] (int32 -off*sum(q), or
 * Q5_1's f32 s).
 *
 * Tiling as pack_avx512.c: one panel x T <= 8 tokens per tile, rows walked
 * in ~2 MiB blocks for prefill, except Q3_K, Q5_K and Q6_K, whose prefill
 * unpacks each panel's codes of KUB blocks once into a buffer (k_unpack)
 * that up to KUTG token tiles read (the _u tiles); decode (one token tile,
 * T <= KT) and the first token tile of each row block stream the panels
 * with software prefetch into L1 (KPF_HINT) KPFD bytes ahead, one line per
 * 64 bytes as each slab starts. Measured (Zen 4, one thread,
 * CPU time, 2048 x 5632 at 512 tokens, before the unpacked prefill): GOP/s
 * q4_K 655, q6_K 470, iq4_xs 630, q3_K 520 against I4W's 590; GEMV over an
 * L2-resident matrix: q4_K, q6_K ~88 GB/s of weights per core (I4W 68).
 */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include "avx512_inl.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>


#define KT 8 /* max tokens per tile */
#ifndef KPFD
#define KPFD 6144 /* decode prefetch distance, bytes (see KPF_HINT) */
#endif
/* Decode prefetch hint: T0 (into L1), not T1. A/B on Zen 4 (bench_kernels
 * GEMV over DRAM, 2026-11-27, load 7-9): with T1 the k-quants reached 0.72
 * (q4_K) and 0.61 (q6_K) of the paired read at 4096 bytes ahead and no
 * better at 2048-16384, while their L2-resident rate (67-80 GB/s a core)
 * was above I4W's, so the L1 misses to L2 were left exposed (why I4W's T1
 * suffices is a guess: its loads are one ascending stream the L1
 * prefetcher follows; a k-quant block's are not: header, then each slab's
 * planes). T0 at 6144: 0.88-0.92 (q4_K) and 0.86 (q6_K); q6_K
 * 0.74 at 4096, 0.81-0.84 at 8192-10240; NTA equal to T0 (docs/PERFORMANCE.md). */
#define KPF_HINT _MM_HINT_T0
#define KROWBLK (2u << 20)    /* weights per row block in prefill */
#define KPK_BYTES (64u << 10) /* activation pack buffer */
/* Prefill of Q3_K, Q5_K, Q6_K (k_merged): a tile rebuilt its codes from
 * their planes per 8 tokens (Q6_K: 2.75 of ~17 vector instructions per
 * token and 32 columns, Q5_K 3.4 of ~15); unpacked once per panel and
 * k-chunk into a buffer that 16 token tiles read instead. A/B on Zen 4
 * (bench_kernels GEMM CPU time / int4w's, 2026-11-27, load ~10): q6_K
 * 0.75-0.77 -> 0.86-0.88, q5_K 0.85 -> 0.98-1.00, q3_K 0.84 -> 0.91-0.93;
 * KUB 2/4/16/32 and 8 or 64 tiles measured lower; q4_K, q2_K, iq4_xs (cheap unpack) lost 0-4%
 * and keep the per-tile codes. */
#define KUCOD 4096u /* unpacked codes of one 256-block of a panel */
/* ... then its sub-block scales times d as f32 (16 lanes per sub-block):
 * the tile's per-token FMA takes them as a memory operand, and the
 * per-tile convert of the scales and the per-block multiply by d go */
#define KUBLK (KUCOD + 64u * 16u)
#define KUB 8   /* blocks per k-chunk of the unpacked prefill */
#define KUTG 16 /* token tiles per pass of the unpacked prefill */

/* the types, as compile-time constants of the inlined tiles */
enum { K_Q2 = 0, K_Q3, K_Q4, K_Q5, K_Q6, K_IQ4XS, K_Q50, K_Q51, K_IQ4NL, K_MXFP4, K_NTYPES };

IE_INLINE int k_qk(int ty) { return ty >= K_Q50 ? 32 : 256; }
IE_INLINE int k_nsub(int ty) { return ty >= K_Q50 ? 0 : (ty == K_Q2 || ty == K_Q3 || ty == K_Q6) ? 16 : 8; }
IE_INLINE int k_bits(int ty)
{
    switch (ty) {
    case K_Q2: return 2;
    case K_Q3: return 3;
    case K_Q5:
    case K_Q50:
    case K_Q51: return 5;
    case K_Q6: return 6;
    default: return 4;
    }
}
IE_INLINE int k_dmin(int ty) { return ty == K_Q2 || ty == K_Q4 || ty == K_Q5 || ty == K_Q51; }
IE_INLINE int k_mn(int ty) { return ty == K_Q2 || ty == K_Q4 || ty == K_Q5; }
IE_INLINE int k_iq(int ty) { return ty == K_IQ4XS || ty == K_IQ4NL || ty == K_MXFP4; }
/* the 256-element types whose codes are merged from 2 or 3 planes */
IE_INLINE int k_merged(int ty) { return ty == K_Q3 || ty == K_Q5 || ty == K_Q6; }
/* the code's offset against the value's integer factor (folded in as
 * -off * sum(q)); 0 for the types with mins (their M term) and Q5_1 */
IE_INLINE int k_off(int ty)
{
    switch (ty) {
    case K_Q3: return 4;
    case K_Q6: return 32;
    case K_Q50: return 16;
    case K_IQ4XS:
    case K_IQ4NL:
    case K_MXFP4: return 128;
    default: return 0;
    }
}
/* the unpacked prefill (UW tiles) of the 16-sub-block offset types starts
 * each sub-block's int32 sum at -off * S_j (k_pack's aux holds these int32
 * per token instead of the int16 S pairs) rather than subtracting
 * off * sum_j sc_j * S_j per block: one broadcast load per sub-block and
 * token instead of 8 vpdpwssd + a convert + an FMA per block and token,
 * which ran on the FMA/dot-product pipes the GEMM is bound by. */
IE_INLINE int k_pre(int ty) { return ty == K_Q3 || ty == K_Q6; }
/* header bytes per block and panel (ie_pack.h) */
IE_INLINE size_t k_hdr(int ty) { return 32u * (1 + k_dmin(ty)) + 16u * k_nsub(ty) * (1 + k_mn(ty)); }
IE_INLINE size_t k_sc(int ty) { return 32u * (1 + k_dmin(ty)); }
IE_INLINE size_t k_slab(int ty) { return 64u * k_bits(ty); }
IE_INLINE size_t k_blk(int ty) { return k_hdr(ty) + (size_t)(k_qk(ty) / 32) * k_slab(ty); }
/* packed activation bytes per block and token */
IE_INLINE size_t k_pk(int ty) { return k_qk(ty) == 256 ? 256 + 4 + 64 : 32 + 4 + 4; }

static int k_type(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_Q2_K: return K_Q2;
    case IE_DTYPE_Q3_K: return K_Q3;
    case IE_DTYPE_Q4_K: return K_Q4;
    case IE_DTYPE_Q5_K: return K_Q5;
    case IE_DTYPE_Q6_K: return K_Q6;
    case IE_DTYPE_IQ4_XS: return K_IQ4XS;
    case IE_DTYPE_Q5_0: return K_Q50;
    case IE_DTYPE_Q5_1: return K_Q51;
    case IE_DTYPE_IQ4_NL: return K_IQ4NL;
    case IE_DTYPE_MXFP4: return K_MXFP4;
    default: return -1;
    }
}

/* v shifted by n bits (left for n > 0) in 16-bit lanes */
IE_INLINE __m512i sh16(__m512i v, int n)
{
    if (n > 0) return _mm512_slli_epi16(v, (unsigned)n);
    if (n < 0) return _mm512_srli_epi16(v, (unsigned)-n);
    return v;
}

/* (a & m) | b: vpternlogd truth table 0xEC */
IE_INLINE __m512i merge(__m512i a, __m512i b, __m512i m) { return _mm512_ternarylogic_epi32(a, b, m, 0xEC); }

/* The codes of columns 16h .. 16h+15 of the slab at q (quads 4h .. 4h+3)
 * into W[0..3], one unsigned code per byte. */
IE_INLINE void k_codes(const int ty, const uint8_t *q, int h, __m512i W[4])
{
    const int b = k_bits(ty);
    if (b >= 4) {
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        __m512i src[4];
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * (2 * h + c)));
            src[2 * c] = v;
            src[2 * c + 1] = _mm512_srli_epi16(v, 4);
        }
        if (b == 4) {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) W[i] = _mm512_and_si512(src[i], m4);
            if (k_iq(ty)) {
                /* the code book + 128 (u8: sign bit flipped), the same in
                 * every 128-bit lane */
                const __m512i tab = _mm512_broadcast_i32x4(_mm_xor_si128(
                    _mm_loadu_si128(
                        (const __m128i *)(const void *)(ty == K_MXFP4 ? ie_mxfp4_kvalues : ie_iq4nl_kvalues)),
                    _mm_set1_epi8((char)0x80)));
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) W[i] = _mm512_shuffle_epi8(tab, W[i]);
            }
        } else if (b == 5) {
            const __m512i hb = _mm512_loadu_si512((const void *)(q + 256));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int Q = 4 * h + i; /* bit Q of each byte -> bit 4 */
                W[i] = merge(src[i], sh16(_mm512_and_si512(hb, _mm512_set1_epi8((char)(1 << Q))), 4 - Q), m4);
            }
        } else {
            /* 6: crumb chunk h, crumb i -> bits 4-5. Crumbs 0, 2 (mask 0x33)
             * and 1, 3 (0xcc) shifted into bits 4-5 leave bits 6-7 zero,
             * so a bit select (bits 0-3 from the nibble, 4-7 from the
             * crumbs) merges them: 2 ands for the 4 quads, not 4 */
            const __m512i cr = _mm512_loadu_si512((const void *)(q + 256 + 64 * h));
            const __m512i c02 = _mm512_and_si512(cr, _mm512_set1_epi8(0x33));
            const __m512i c13 = _mm512_and_si512(cr, _mm512_set1_epi8((char)0xcc));
            W[0] = _mm512_ternarylogic_epi32(src[0], _mm512_slli_epi16(c02, 4), m4, 0xE4);
            W[1] = _mm512_ternarylogic_epi32(src[1], _mm512_slli_epi16(c13, 2), m4, 0xE4);
            W[2] = _mm512_ternarylogic_epi32(src[2], c02, m4, 0xE4);
            W[3] = _mm512_ternarylogic_epi32(src[3], _mm512_srli_epi16(c13, 2), m4, 0xE4);
        }
    } else {
        const __m512i m2 = _mm512_set1_epi8(0x03);
        const __m512i cr = _mm512_loadu_si512((const void *)(q + 64 * h));
        if (b == 2) {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) W[i] = _mm512_and_si512(sh16(cr, -2 * i), m2);
        } else { /* 3: + bit Q of the bit chunk -> bit 2 */
            const __m512i hb = _mm512_loadu_si512((const void *)(q + 128));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int Q = 4 * h + i;
                W[i] = merge(sh16(cr, -2 * i), sh16(_mm512_and_si512(hb, _mm512_set1_epi8((char)(1 << Q))), 2 - Q),
                             m2);
            }
        }
    }
}

/* int16 pairs (v[2m][i], v[2m+1][i]) in lane i, from two int8 rows of 16 */
IE_INLINE __m512i pair16(const uint8_t *rows2)
{
    static const uint16_t idx[32]
        __attribute__((aligned(64))) = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)rows2));
    return _mm512_permutexvar_epi16(_mm512_load_si512((const void *)idx), w);
}

/* One 256-element block of one panel (wb: its header) against T packed
 * tokens (p): acc[t] += the block's dot products. */
IE_INLINE void k_block256(const int ty, const int T, const int PF, const int UW, const uint8_t *wb,
                          const uint8_t *uw, const uint8_t *p, __m512 acc[KT])
{
    const int nsub = k_nsub(ty), off = k_off(ty), PRE = UW && k_pre(ty);
    const size_t hdr = k_hdr(ty), slab = k_slab(ty), sco = k_sc(ty);
    /* the header's lines here, each slab's as it starts: a steady stream of
     * requests PFD bytes ahead rather than a burst of a whole block's */
    if (PF)
        for (size_t o = 0; o < hdr; o += 64) _mm_prefetch((const char *)wb + KPFD + o, KPF_HINT);
    const size_t paux = 260 * (size_t)T; /* aux of token t at paux + 64 t */
    /* decode: each sub-block's products in two chains (summed before the
     * scale), so a token is not one chain of 4-8 dependent vpdpbusd */
    const int two = T <= 2;
    __m512 F[KT];
    __m512i I[KT], X[KT];
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        const uint8_t *q = wb + hdr + (size_t)s * slab;
        if (PF)
            for (size_t o = 0; o < slab; o += 64) _mm_prefetch((const char *)q + KPFD + o, KPF_HINT);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i W[4];
            if (UW) /* k_unpack's codes */
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    W[i] = _mm512_load_si512((const void *)(uw + 256 * (2 * s + h) + 64 * i));
            else k_codes(ty, q, h, W);
            const int j = nsub == 16 ? 2 * s + h : s;
            if (nsub == 16 || h == 0) {
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    X[t] = _mm512_setzero_si512();
                    I[t] = PRE ? _mm512_set1_epi32(ld32(p + paux + 64 * (size_t)t + 4 * (size_t)j)) : X[t];
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const uint8_t *a = p + 32 * (size_t)T * s + 32 * (size_t)t + 16 * h + 4 * i;
                    if (two && (nsub == 16 ? i >= 2 : h == 1)) X[t] = dpbusd_bcast(X[t], W[i], a);
                    else I[t] = dpbusd_bcast(I[t], W[i], a);
                }
            if (nsub == 16 || h == 1) {
                if (two) {
#pragma GCC unroll 8
                    for (int t = 0; t < T; t++) I[t] = _mm512_add_epi32(I[t], X[t]);
                }
                const __m512 scf = UW ? _mm512_load_ps((const void *)(uw + KUCOD + 64 * (size_t)j))
                                      : _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                            _mm_loadu_si128((const __m128i *)(wb + sco + 16 * (size_t)j))));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    F[t] = j == 0 ? _mm512_mul_ps(_mm512_cvtepi32_ps(I[t]), scf)
                                  : _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[t]), scf, F[t]);
            }
        }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
    if (PRE) { /* the offset and d are in F already */
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(F[t], _mm512_set1_ps(ldf(p + 256 * (size_t)T + 4 * (size_t)t)), acc[t]);
        return;
    }
    /* M = sum_j c_j * S_j with c the min codes (types with mins) or the
     * scales (offset types): vpdpwssd on (c_2m, c_2m+1) pairs */
    const uint8_t *cr = wb + sco + (k_mn(ty) ? 16 * (size_t)nsub : 0);
    __m512i P[8];
#pragma GCC unroll 8
    for (int m = 0; m < nsub / 2; m++) P[m] = pair16(cr + 32 * m);
    const __m512 dmin = k_mn(ty) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + 32))) : d;
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int m = 0; m < nsub / 2; m++) M = dpwssd_bcast(M, P[m], p + paux + 64 * (size_t)t + 4 * (size_t)m);
        const __m512 da = _mm512_set1_ps(ldf(p + 256 * (size_t)T + 4 * (size_t)t));
        __m512 v;
        if (UW) /* F holds d already */
            v = _mm512_fnmadd_ps(k_mn(ty) ? dmin : _mm512_mul_ps(d, _mm512_set1_ps((float)off)),
                                 _mm512_cvtepi32_ps(M), F[t]);
        else if (k_mn(ty)) v = _mm512_fmsub_ps(d, F[t], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(M)));
        else v = _mm512_mul_ps(d, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_set1_ps((float)off), F[t]));
        acc[t] = _mm512_fmadd_ps(v, da, acc[t]);
    }
}

/* One 32-element block (one slab) of one panel against T packed tokens. */
IE_INLINE void k_block32(const int ty, const int T, const int PF, const uint8_t *wb, const uint8_t *p,
                         __m512 acc[KT])
{
    const size_t hdr = k_hdr(ty);
    if (PF) {
        const size_t bb = k_blk(ty);
        for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)wb + KPFD + o, KPF_HINT);
    }
    __m512i I[KT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        I[t] = ty == K_Q51 ? _mm512_setzero_si512() : _mm512_set1_epi32(ld32(p + 36 * (size_t)T + 4 * (size_t)t));
    /* decode: two chains per token so a block is not one 8-deep chain */
    const int two = T <= 2;
    __m512i X[KT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) X[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i W[4];
        k_codes(ty, wb + hdr, h, W);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const uint8_t *a = p + 32 * (size_t)t + 16 * h + 4 * i;
                if (two && h == 1) X[t] = dpbusd_bcast(X[t], W[i], a);
                else I[t] = dpbusd_bcast(I[t], W[i], a);
            }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
    const __m512 mw = ty == K_Q51 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + 32))) : d;
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        if (two) I[t] = _mm512_add_epi32(I[t], X[t]);
        const __m512 da = _mm512_set1_ps(ldf(p + 32 * (size_t)T + 4 * (size_t)t));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[t]), _mm512_mul_ps(d, da), acc[t]);
        if (ty == K_Q51)
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ldf(p + 36 * (size_t)T + 4 * (size_t)t)), acc[t]);
    }
}

/* One panel x T tokens over blocks [b0, b1) (pk: the packed tokens of
 * block b0 on); y: row 16p of token 0; rows with a clear bit in rmask are
 * not written; first: store (else add into y). */
IE_INLINE void k_tile(const int ty, const int T, const int PF, const int UW, const uint8_t *panel, int64_t b0,
                      int64_t b1, const uint8_t *pk, const uint8_t *uw, float *y, int64_t ldy, __mmask16 rmask,
                      int first)
{
    const size_t bb = k_blk(ty), ks = k_pk(ty) * (size_t)T;
    __m512 acc[KT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const uint8_t *wb = panel + (size_t)b0 * bb, *p = pk;
    for (int64_t b = b0; b < b1; b++, wb += bb, p += ks) {
        if (k_qk(ty) == 256) k_block256(ty, T, PF, UW, wb, UW ? uw + (size_t)(b - b0) * KUBLK : uw, p, acc);
        else k_block32(ty, T, PF, wb, p, acc);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        float *yt = y + (int64_t)t * ldy;
        __m512 v = acc[t];
        if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rmask, yt));
        _mm512_mask_storeu_ps(yt, rmask, v);
    }
}

typedef void (*ktile_fn)(const uint8_t *panel, int64_t b0, int64_t b1, const uint8_t *pk, const uint8_t *uw,
                         float *y, int64_t ldy, __mmask16 rmask, int first);

/* Tiles that read their panels from memory (a decode call's one token
 * tile, the first token tile of a prefill row block) prefetch (PF 1); the
 * other prefill tiles read panels that the row blocking keeps in L2/L3.
 * The _u tiles (k_merged types) take their codes from k_unpack's buffer
 * uw (blocks b0.. on) instead. */
#define KTILE(TY, name, T, PF)                                                                                  \
    static void ktile_##name##_##T##_##PF(const uint8_t *panel, int64_t b0, int64_t b1, const uint8_t *pk,      \
                                          const uint8_t *uw, float *y, int64_t ldy, __mmask16 rmask, int first) \
    {                                                                                                           \
        k_tile(TY, T, PF, 0, panel, b0, b1, pk, uw, y, ldy, rmask, first);                                      \
    }
#define KTILEU(TY, name, T)                                                                               \
    static void ktileu_##name##_##T(const uint8_t *panel, int64_t b0, int64_t b1, const uint8_t *pk,      \
                                    const uint8_t *uw, float *y, int64_t ldy, __mmask16 rmask, int first) \
    {                                                                                                     \
        k_tile(TY, T, 0, 1, panel, b0, b1, pk, uw, y, ldy, rmask, first);                                 \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
#define KROW(name, PF)                                                                                 \
    { NULL, ktile_##name##_1_##PF, ktile_##name##_2_##PF, ktile_##name##_3_##PF, ktile_##name##_4_##PF,  \
      ktile_##name##_5_##PF, ktile_##name##_6_##PF, ktile_##name##_7_##PF, ktile_##name##_8_##PF }
#define KTILES(TY, name)                                                                               \
    KTILE(TY, name, 1, 0) KTILE(TY, name, 2, 0) KTILE(TY, name, 3, 0) KTILE(TY, name, 4, 0)            \
    KTILE(TY, name, 5, 0) KTILE(TY, name, 6, 0) KTILE(TY, name, 7, 0) KTILE(TY, name, 8, 0)            \
    KTILE(TY, name, 1, 1) KTILE(TY, name, 2, 1) KTILE(TY, name, 3, 1) KTILE(TY, name, 4, 1)            \
    KTILE(TY, name, 5, 1) KTILE(TY, name, 6, 1) KTILE(TY, name, 7, 1) KTILE(TY, name, 8, 1)            \
    static const ktile_fn ktiles_##name[2][KT + 1] = { KROW(name, 0), KROW(name, 1) };
#define KTILESU(TY, name)                                                                              \
    KTILEU(TY, name, 1) KTILEU(TY, name, 2) KTILEU(TY, name, 3) KTILEU(TY, name, 4)                    \
    KTILEU(TY, name, 5) KTILEU(TY, name, 6) KTILEU(TY, name, 7) KTILEU(TY, name, 8)                    \
    static const ktile_fn ktilesu_##name[KT + 1] = {                                                   \
        NULL, ktileu_##name##_1, ktileu_##name##_2, ktileu_##name##_3, ktileu_##name##_4,              \
        ktileu_##name##_5, ktileu_##name##_6, ktileu_##name##_7, ktileu_##name##_8 };

KTILES(K_Q2, q2k)
KTILES(K_Q3, q3k)
KTILES(K_Q4, q4k)
KTILES(K_Q5, q5k)
KTILES(K_Q6, q6k)
KTILES(K_IQ4XS, iq4xs)
KTILES(K_Q50, q50)
KTILES(K_Q51, q51)
KTILES(K_IQ4NL, iq4nl)
KTILES(K_MXFP4, mxfp4)
KTILESU(K_Q3, q3k)
KTILESU(K_Q5, q5k)
KTILESU(K_Q6, q6k)
// clang-format on

static const ktile_fn (*const ktiles[K_NTYPES])[KT + 1] = {ktiles_q2k,   ktiles_q3k,   ktiles_q4k, ktiles_q5k,
                                                           ktiles_q6k,   ktiles_iq4xs, ktiles_q50, ktiles_q51,
                                                           ktiles_iq4nl, ktiles_mxfp4};
static const ktile_fn *const ktilesu[K_NTYPES] = {NULL, ktilesu_q3k, NULL, ktilesu_q5k, ktilesu_q6k,
                                                  NULL, NULL,        NULL, NULL,        NULL};

/* The codes of blocks [0, nblk) of one panel (wb: the first block's
 * header; 256-element types) into u, one unsigned code per byte, in the
 * order k_block256 reads them with UW: block b, slab s, half h, quad i at
 * u + KUBLK*b + 256*(2s + h) + 64i (one zmm of k_codes' W[i]). */
IE_INLINE void k_unpack_t(const int ty, const uint8_t *wb, int64_t nblk, uint8_t *u)
{
    const size_t bb = k_blk(ty), hdr = k_hdr(ty), slab = k_slab(ty);
    for (int64_t b = 0; b < nblk; b++, wb += bb, u += KUBLK)
#pragma GCC unroll 2
        for (int s = 0; s < 8; s++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i W[4];
                k_codes(ty, wb + hdr + (size_t)s * slab, h, W);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) _mm512_store_si512((void *)(u + 256 * (2 * s + h) + 64 * i), W[i]);
            }
    /* d * sc_j: an f16 times a 6- or 8-bit integer, exact in f32 */
    wb -= (size_t)nblk * bb;
    u -= (size_t)nblk * KUBLK;
    for (int64_t b = 0; b < nblk; b++, wb += bb, u += KUBLK) {
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
        for (int j = 0; j < k_nsub(ty); j++)
            _mm512_store_ps((void *)(u + KUCOD + 64 * (size_t)j),
                            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                                 (const __m128i *)(wb + k_sc(ty) + 16 * (size_t)j))))));
    }
}

static void k_unpack(int ty, const uint8_t *wb, int64_t nblk, uint8_t *u)
{
    switch (ty) {
    case K_Q3: k_unpack_t(K_Q3, wb, nblk, u); break;
    case K_Q5: k_unpack_t(K_Q5, wb, nblk, u); break;
    case K_Q6: k_unpack_t(K_Q6, wb, nblk, u); break;
    default: break; /* k_merged types only */
    }
}

/* Sum of 32 int8 at p. */
static inline int32_t sum32_i8(const uint8_t *p)
{
    const __m256i q = _mm256_loadu_si256((const __m256i *)p);
    /* sad of q^0x80 (= q+128) against 0, minus 32*128 */
    const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    return (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
}

/* Pack blocks [kb0, kb1) of tt activation rows (a, as bytes apart; Q8_K
 * or Q8_P rows of n_in) for type ty into pk (layout in the file comment). */
static void k_pack(int ty, int pre, const uint8_t *a, size_t as, int64_t n_in, int tt, int64_t kb0, int64_t kb1,
                   uint8_t *pk)
{
    const size_t ks = k_pk(ty) * (size_t)tt;
    const int off = k_off(ty);
    if (k_qk(ty) == 256) {
        const int nsub = k_nsub(ty);
        for (int t = 0; t < tt; t++) {
            const uint8_t *row = a + (size_t)t * as;
            uint8_t *dst = pk;
            for (int64_t b = kb0; b < kb1; b++, dst += ks) {
                const uint8_t *src = row + (size_t)b * sizeof(ie_block_q8_k_t);
                for (int s = 0; s < 8; s++)
                    _mm256_storeu_si256((__m256i *)(dst + 32 * (size_t)tt * s + 32 * (size_t)t),
                                        _mm256_loadu_si256((const __m256i *)(src + 4 + 32 * s)));
                memcpy(dst + 256 * (size_t)tt + 4 * (size_t)t, src, 4);
                int16_t bs[16];
                memcpy(bs, src + 260, sizeof bs);
                uint8_t *aux = dst + 260 * (size_t)tt + 64 * (size_t)t;
                if (pre) { /* int32 -off * S_j, the sub-block sums' start */
                    int32_t st[16];
                    for (int j = 0; j < 16; j++) st[j] = -off * (int32_t)bs[j];
                    memcpy(aux, st, 64);
                } else if (nsub == 16) {
                    memcpy(aux, bs, 32);
                } else { /* sums per 32 */
                    int16_t sj[8];
                    for (int j = 0; j < 8; j++) sj[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
                    memcpy(aux, sj, 16);
                }
            }
        }
        return;
    }
    const int64_t nb = n_in / 32;
    for (int t = 0; t < tt; t++) {
        const uint8_t *row = a + (size_t)t * as;
        const uint8_t *dp = row + (size_t)n_in, *sp = dp + 4 * nb;
        uint8_t *dst = pk;
        for (int64_t b = kb0; b < kb1; b++, dst += ks) {
            memcpy(dst + 32 * (size_t)t, row + 32 * b, 32);
            memcpy(dst + 32 * (size_t)tt + 4 * (size_t)t, dp + 4 * b, 4);
            uint8_t *cp = dst + 36 * (size_t)tt + 4 * (size_t)t;
            if (ty == K_Q51) memcpy(cp, sp + 4 * b, 4);
            else {
                const int32_t c = -off * sum32_i8(row + 32 * b);
                memcpy(cp, &c, 4);
            }
        }
    }
}

/* Blocks per k-chunk for tiles of T tokens (what the pack buffer holds). */
static int64_t k_kcb(int ty, int T) { return (int64_t)(KPK_BYTES / (k_pk(ty) * (size_t)T)); }

ie_status_t ie_matmul_packed_kq_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                       int64_t n_tok, float *y, int64_t ldy)
{
    const int ty = m ? k_type(m->dtype) : -1;
    if (ty < 0 || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || !m->data || !a || !y || r0 < 0 ||
        r0 % IE_PANEL != 0 || r1 < r0 || r1 > m->n_out || (r1 != m->n_out && r1 % IE_PANEL != 0))
        return IE_ERR_INVAL;
    if (r0 == r1 || n_tok <= 0) return IE_OK;
    const int64_t n_in = m->n_in, nb = n_in / k_qk(ty);
    const size_t pb = (size_t)nb * k_blk(ty);
    /* the first token tile of a row block reads its panels from memory:
     * it fetches ahead; the others find them in L2/L3 */
    const ktile_fn *first_fns = ktiles[ty][1], *fns = ktiles[ty][0];
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    if (n_tok > KT && k_merged(ty)) {
        /* prefill of the merged-plane types: each panel's codes of KUB
         * blocks unpacked once (k_unpack) for up to KUTG token tiles, whose
         * activations for those blocks are packed side by side; without the
         * buffer, the tiles below */
        const int64_t ntg = (n_tok + KT - 1) / KT < KUTG ? (n_tok + KT - 1) / KT : KUTG;
        const size_t tpk = (k_pk(ty) * KT * KUB + 63) / 64 * 64, bb = k_blk(ty);
        uint8_t *buf = aligned_alloc(64, (size_t)ntg * tpk + KUB * KUBLK);
        if (buf) {
            uint8_t *uw = buf + (size_t)ntg * tpk;
            const ktile_fn *fu = ktilesu[ty];
            const uint8_t *w = m->data;
            for (int64_t g0 = 0; g0 < n_tok; g0 += ntg * KT) {
                const int64_t g1 = g0 + ntg * KT < n_tok ? g0 + ntg * KT : n_tok;
                for (int64_t kb0 = 0; kb0 < nb; kb0 += KUB) {
                    const int64_t kb1 = kb0 + KUB < nb ? kb0 + KUB : nb;
                    for (int64_t t0 = g0, i = 0; t0 < g1; t0 += KT, i++) {
                        const int tt = g1 - t0 < KT ? (int)(g1 - t0) : KT;
                        k_pack(ty, k_pre(ty), (const uint8_t *)a + (size_t)t0 * a_stride, a_stride, n_in, tt, kb0,
                               kb1, buf + (size_t)i * tpk);
                    }
                    for (int64_t p = p0; p < p1; p++) {
                        const int64_t rows = r1 - p * IE_PANEL;
                        const __mmask16 rmask = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
                        k_unpack(ty, w + (size_t)p * pb + (size_t)kb0 * bb, kb1 - kb0, uw);
                        for (int64_t t0 = g0, i = 0; t0 < g1; t0 += KT, i++) {
                            const int tt = g1 - t0 < KT ? (int)(g1 - t0) : KT;
                            fu[tt](w + (size_t)p * pb, kb0, kb1, buf + (size_t)i * tpk, uw,
                                   y + t0 * ldy + p * IE_PANEL, ldy, rmask, kb0 == 0);
                        }
                    }
                }
            }
            free(buf);
            return IE_OK;
        }
    }
    const int T = n_tok < KT ? (int)n_tok : KT;
    int64_t rb = p1 - p0; /* panels per row block: all of them for one token tile */
    if (n_tok > T) {
        rb = (int64_t)(KROWBLK / pb);
        if (rb < 1) rb = 1;
    }
    _Alignas(64) uint8_t pk[KPK_BYTES];
    const int64_t kcb = k_kcb(ty, T);
    const uint8_t *w = m->data;
    for (size_t o = 0; o < KPFD; o += 64) _mm_prefetch((const char *)w + (size_t)p0 * pb + o, KPF_HINT);
    for (int64_t kb0 = 0; kb0 < nb; kb0 += kcb) {
        const int64_t kb1 = kb0 + kcb < nb ? kb0 + kcb : nb;
        for (int64_t q0 = p0; q0 < p1; q0 += rb) {
            const int64_t q1 = q0 + rb < p1 ? q0 + rb : p1;
            for (int64_t t0 = 0; t0 < n_tok; t0 += T) {
                const int tt = n_tok - t0 < T ? (int)(n_tok - t0) : T;
                k_pack(ty, 0, (const uint8_t *)a + (size_t)t0 * a_stride, a_stride, n_in, tt, kb0, kb1, pk);
                for (int64_t p = q0; p < q1; p++) {
                    const int64_t rows = r1 - p * IE_PANEL;
                    const __mmask16 rmask = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
                    (t0 == 0 ? first_fns : fns)[tt](w + (size_t)p * pb, kb0, kb1, pk, NULL,
                                                    y + t0 * ldy + p * IE_PANEL, ldy, rmask, kb0 == 0);
                }
            }
        }
    }
    return IE_OK;
}

ie_status_t ie_matmul_packed_ranges_kq_avx512(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                              size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    const int ty = m ? k_type(m->dtype) : -1;
    if (ty < 0 || !next || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || n_tok <= 0) return IE_ERR_INVAL;
    const int64_t n_in = m->n_in, nb = n_in / k_qk(ty);
    if (n_tok > KT || nb > k_kcb(ty, (int)n_tok))
        return ie_packed_ranges_by_calls(ie_matmul_packed_kq_avx512, m, next, ctx, a, a_stride, n_tok, y, ldy);
    if (!m->data || !a || !y) return IE_ERR_INVAL;
    const int64_t np = (m->n_out + IE_PANEL - 1) / IE_PANEL;
    const size_t pb = (size_t)nb * k_blk(ty);
    const ktile_fn *fns = ktiles[ty][1]; /* one token tile: streamed */
    const int tt = (int)n_tok;
    const uint8_t *w = m->data;
    _Alignas(64) uint8_t pk[KPK_BYTES];
    int packed = 0;
    int64_t p0, p1;
    while (next(ctx, &p0, &p1)) {
        if (p0 < 0 || p1 <= p0 || p0 >= np) return IE_ERR_INVAL;
        if (p1 > np) p1 = np;
        for (size_t o = 0; o < KPFD; o += 64) _mm_prefetch((const char *)w + (size_t)p0 * pb + o, KPF_HINT);
        if (!packed) {
            k_pack(ty, 0, (const uint8_t *)a, a_stride, n_in, tt, 0, nb, pk);
            packed = 1;
        }
        for (int64_t p = p0; p < p1; p++) {
            const int64_t rows = m->n_out - p * IE_PANEL;
            const __mmask16 rmask = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
            fns[tt](w + (size_t)p * pb, 0, nb, pk, NULL, y + p * IE_PANEL, ldy, rmask, 1);
        }
    }
    return IE_OK;
}

/* ------------------------------------------------ Q8_K activations */

/* ie_quantize_row_q8_k_ref's bytes, 16 lanes at a time: amax by vmaxps
 * with the new value first (a NaN element is skipped, as the scalar
 * compare skips it), max = the first element of that magnitude (the
 * lowest set bit of the equality mask), q = iscale * x rounded to nearest
 * even by vcvtps2dq (ggml's nearest_int for |v| < 2^22), capped at 127;
 * bsums: one 16-lane group each. The scalar decisions (iscale, the zero
 * block, d = 1/iscale) are the ref's own lines. */
void ie_quantize_row_q8_k_avx512(const float *x, void *out, int64_t n)
{
    ie_block_q8_k_t *y = out;
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < n / IE_QK_K; b++) {
        const float *xb = x + b * IE_QK_K;
        ie_block_q8_k_t *o = y + b;
        __m512 am = _mm512_setzero_ps();
        for (int j = 0; j < IE_QK_K; j += 16) am = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + j), absm), am);
        const float amax = _mm512_reduce_max_ps(am);
        float max = 0.0f;
        if (amax != 0.0f)
            for (int j = 0; j < IE_QK_K; j += 16) {
                const __mmask16 e = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(xb + j), absm),
                                                       _mm512_set1_ps(amax), _CMP_EQ_OQ);
                if (e) {
                    max = xb[j + __builtin_ctz(e)];
                    break;
                }
            }
        const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
        if (iscale == 0.0f || isinf(iscale)) {
            memset(o, 0, sizeof *o);
            continue;
        }
        const __m512 is = _mm512_set1_ps(iscale);
        const __m512i cap = _mm512_set1_epi32(127);
        int16_t bs[16];
        for (int j = 0; j < IE_QK_K; j += 16) {
            const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(xb + j))), cap);
            _mm_storeu_si128((__m128i *)(o->q + j), _mm512_cvtsepi32_epi8(q));
            bs[j / 16] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        memcpy(o->bsums, bs, sizeof bs);
        o->d = 1.0f / iscale;
    }
}
