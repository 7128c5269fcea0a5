/* matmul_avx512.c — AVX-512 (F/BW/VL/DQ + VNNI) matmul and activation
 * quantization. Twins of kernels/ref/matmul_ref.c and quant_ref.c.
 *
 * Tiling. Every weight type runs the same loop nest: a tile of R weight rows
 * x T tokens keeps R*T zmm accumulators; each weight vector is loaded (and
 * unpacked) once per tile and used for all T tokens, so prefill is compute-
 * bound while decode (T = 1) streams each weight byte exactly once. For
 * n_tok > T the rows are walked in panels of ~256 KiB of weights so that the
 * repeated passes over a panel (one per token block) hit L2, not DRAM.
 *
 * Float weights (f32, f16, bf16) x f32 activations: 4 rows x 6 tokens, 16
 * elements per step, f16 widened by vcvtph2ps, bf16 by a 16-bit shift (both
 * exact), products accumulated with FMA in f32. Tails of n_in (any value)
 * use masked loads.
 *
 * Both families prefetch (into L2) the weights two tiles ahead: decode
 * streams many short interleaved rows that the hardware prefetcher alone
 * does not keep ahead of (measured 1.2-2.5x on Zen 4).
 *
 * Block weights (q8_0, q4_0 x q8_0 acts; q4_1 x q8_1 acts): 4 rows x 4
 * tokens, one "group" of 4 blocks (128 elements) per step. A group is
 * gathered from the packed ggml layout with vpermt2w into
 *     lo: dword j = elements 4*(j/4)..+3      of block j%4
 *     hi: dword j = elements 16+4*(j/4)..+3   of block j%4
 *     d : float lane j = scale of block j%4
 * so that one vpdpbusd over lo and one over hi yield, in lane j, a partial
 * integer sum of block j%4 and every lane can be scaled by d_w*d_a before
 * the f32 accumulate. vpdpbusd multiplies unsigned by signed bytes:
 *   q4_0: nibbles 0..15 unsigned, the -8 offset becomes -8*sum(a) per block;
 *   q8_0: w xor 0x80 = w+128 unsigned, corrected by -128*sum(a) per block;
 *   q4_1: nibbles unsigned, no offset; m_w*s_a added per block in f32;
 *   mxfp4: codes mapped by vpshufb to 2*E2M1 + 12 in 0..24 (unsigned), the
 *         +12 offset becomes -12*sum(a); d_w = 2^(e-128) built from the
 *         exponent bits (exact for every e, subnormal for e < 2). 17-byte
 *         blocks: see IDX_MXFP4_QS for the gather.
 * The corrections are computed once per activation group when the
 * activations are packed (below) and seed the vpdpbusd accumulator, so the
 * integer part of each block product is exact, as in the reference.
 *
 * Packed activations: for each token and group, 256 bytes on the stack:
 * lo (64 B), hi (64 B), d_a (16 f32), aux (16 i32 correction, or for q8_1
 * the f32 s_a of each block in lanes 0..3 and zeros elsewhere). k is cut
 * into chunks of IE_KCB blocks so the buffer has a fixed size; later chunks
 * add into y.
 */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define IE_INLINE static inline __attribute__((always_inline))

/* Block bytes of a weight/activation type, inlined (ie_dtype_block_bytes is
 * an out-of-line call, which inside a loop spills every vector register). */
IE_INLINE size_t blk_bytes(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_Q8_0: return sizeof(ie_block_q8_0_t);
    case IE_DTYPE_Q8_1: return sizeof(ie_block_q8_1_t);
    case IE_DTYPE_Q4_0: return sizeof(ie_block_q4_0_t);
    case IE_DTYPE_Q4_1: return sizeof(ie_block_q4_1_t);
    case IE_DTYPE_MXFP4: return sizeof(ie_block_mxfp4_t);
    case IE_DTYPE_F32: return 4;
    default: return 2; /* f16, bf16 */
    }
}

/* ========================================================= float weights */

#define FR 4 /* rows per float tile   */
#define FT 6 /* tokens per float tile */

IE_INLINE __m512 fw_load(ie_dtype_t wt, const char *row, int64_t k)
{
    switch (wt) {
    case IE_DTYPE_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k)));
    case IE_DTYPE_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k))), 16));
    default: return _mm512_loadu_ps((const float *)row + k);
    }
}

IE_INLINE __m512 fw_load_mask(ie_dtype_t wt, const char *row, int64_t k, __mmask16 m)
{
    switch (wt) {
    case IE_DTYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
    case IE_DTYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    }
}

/* One R x T tile: rows w, w+wb, ...; tokens a, a+as, ... (f32, or bf16 rows
 * when at is BF16); y[t*ldy + r]. */
IE_INLINE void ftile(ie_dtype_t wt, ie_dtype_t at, int R, int T, const char *w, size_t wb, int64_t n_in,
                     const char *a, size_t as, float *y, int64_t ldy)
{
    __m512 acc[FR][FT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();

    int64_t k = 0;
    const size_t es = wt == IE_DTYPE_F32 ? 4 : 2;
    for (; k + 16 <= n_in; k += 16) {
        __m512 wv[FR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* the same columns 8 rows (two tiles) ahead, one line per 64 bytes */
            if (es == 4 || (k & 16) == 0) _mm_prefetch(w + (size_t)(r + 8) * wb + (size_t)k * es, _MM_HINT_T1);
            wv[r] = fw_load(wt, w + (size_t)r * wb, k);
        }
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m512 x = fw_load(at, a + (size_t)t * as, k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], x, acc[r][t]);
        }
    }
    if (k < n_in) {
        const __mmask16 m = (__mmask16)((1u << (n_in - k)) - 1);
        __m512 wv[FR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = fw_load_mask(wt, w + (size_t)r * wb, k, m);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m512 x = fw_load_mask(at, a + (size_t)t * as, k, m);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], x, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

#define FTILE(WT, AT, name, R, T)                                                                          \
    static void ftile_##name##_##R##_##T(const char *w, size_t wb, int64_t n_in, const char *a, size_t as, \
                                         float *y, int64_t ldy)                                            \
    {                                                                                                      \
        ftile(WT, AT, R, T, w, wb, n_in, a, as, y, ldy);                                                   \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
#define FTILES(WT, AT, name)                                                                         \
    FTILE(WT, AT, name, 4, 1) FTILE(WT, AT, name, 4, 2) FTILE(WT, AT, name, 4, 3)                   \
    FTILE(WT, AT, name, 4, 4) FTILE(WT, AT, name, 4, 5) FTILE(WT, AT, name, 4, 6)                   \
    FTILE(WT, AT, name, 1, 1) FTILE(WT, AT, name, 1, 2) FTILE(WT, AT, name, 1, 3)                   \
    FTILE(WT, AT, name, 1, 4) FTILE(WT, AT, name, 1, 5) FTILE(WT, AT, name, 1, 6)                   \
    static const ie_ftile_fn ftiles_##name[2][FT + 1] = {                                     \
        { NULL, ftile_##name##_1_1, ftile_##name##_1_2, ftile_##name##_1_3,                \
          ftile_##name##_1_4, ftile_##name##_1_5, ftile_##name##_1_6 },                    \
        { NULL, ftile_##name##_4_1, ftile_##name##_4_2, ftile_##name##_4_3,                \
          ftile_##name##_4_4, ftile_##name##_4_5, ftile_##name##_4_6 } };

FTILES(IE_DTYPE_F32, IE_DTYPE_F32, f32)
FTILES(IE_DTYPE_F16, IE_DTYPE_F32, f16)
// clang-format on
FTILES(IE_DTYPE_BF16, IE_DTYPE_BF16, bf16bf16) /* no AVX512_BF16: widen both */

/* ============================================ bf16 weights x bf16 acts */

/* Contract of ie_matmul_bf16_bf16_ref: W rows and A rows are plain bf16
 * rows of n_in elements (any n_in), the result is the f32 dot product.
 *
 * With AVX512_BF16 (checked at run time, see has_bf16): vdpbf16ps, lane i
 * of an accumulator += w[2i]*a[2i] + w[2i+1]*a[2i+1] (bf16 products are
 * exact in f32; the two adds round, and the instruction treats bf16
 * denormals, |x| < 2^-126, as zero). Tile: 4 rows x 6 tokens = 24 zmm
 * accumulators, 32 elements per step, 4 weight + 6 activation loads per 24
 * vdpbf16ps. Tails of n_in use masked (zeroing) word loads, so an odd
 * element pairs with a zero. The accumulators are reduced together at the
 * end of the rows (reduce16: 45 shuffles/adds for 16 sums instead of 16
 * separate horizontal sums).
 *
 * Without AVX512_BF16: the float tile above with the activations widened
 * too (bf16 -> f32 by a shift, exact), products by FMA. */

#define BR 4 /* rows per bf16 tile   */
#define BT 6 /* tokens per bf16 tile */

/* Lane i of the result = sum of the 16 lanes of v[i]. */
IE_INLINE __m512 reduce16(const __m512 v[16])
{
    __m512 a[8], b[4], c[2];
    /* a[i], per 128-bit lane: [v2i.0+v2i.2, v2i+1.0+v2i+1.2, v2i.1+v2i.3, v2i+1.1+v2i+1.3] */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
        /* b[j], per 128-bit lane q: element e = partial (over lane q) of v[4j+e] */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512d x = _mm512_castps_pd(a[2 * j]), y = _mm512_castps_pd(a[2 * j + 1]);
        b[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* c[h]: 128-bit lanes 0,1 = halves of v[8h..8h+3], lanes 2,3 = of v[8h+4..8h+7] */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
        c[h] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * h], b[2 * h + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * h], b[2 * h + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

IE_INLINE __m512bh bh_load(const char *p) { return (__m512bh)_mm512_loadu_si512((const void *)p); }
IE_INLINE __m512bh bh_load_mask(const char *p, __mmask32 m)
{
    return (__m512bh)_mm512_maskz_loadu_epi16(m, (const void *)p);
}

/* One R x T tile, accumulator of (row r, token t) at acc[t*R + r]. */
IE_INLINE void btile(int R, int T, const char *w, size_t wb, int64_t n_in, const char *a, size_t as, float *y,
                     int64_t ldy)
{
    __m512 acc[BR * BT];
#pragma GCC unroll 24
    for (int i = 0; i < R * T; i++) acc[i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= n_in; k += 32) {
        __m512bh wv[BR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* the same 64 bytes 8 rows (two tiles) ahead; see the file comment */
            _mm_prefetch(w + (size_t)(r + 8) * wb + (size_t)k * 2, _MM_HINT_T1);
            wv[r] = bh_load(w + (size_t)r * wb + (size_t)k * 2);
        }
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m512bh x = bh_load(a + (size_t)t * as + (size_t)k * 2);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[t * R + r] = _mm512_dpbf16_ps(acc[t * R + r], wv[r], x);
        }
    }
    if (k < n_in) {
        const __mmask32 m = _cvtu32_mask32((1u << (n_in - k)) - 1u);
        __m512bh wv[BR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = bh_load_mask(w + (size_t)r * wb + (size_t)k * 2, m);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m512bh x = bh_load_mask(a + (size_t)t * as + (size_t)k * 2, m);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[t * R + r] = _mm512_dpbf16_ps(acc[t * R + r], wv[r], x);
        }
    }
    if (R * T == 1) {
        y[0] = _mm512_reduce_add_ps(acc[0]);
        return;
    }
    _Alignas(64) float s[32];
#pragma GCC unroll 2
    for (int c0 = 0; c0 < R * T; c0 += 16) {
        __m512 v[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) v[i] = c0 + i < R * T ? acc[c0 + i] : _mm512_setzero_ps();
        _mm512_store_ps(s + c0, reduce16(v));
    }
#pragma GCC unroll 6
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[t * ldy + r] = s[t * R + r];
}

#define BTILE(R, T)                                                                                         \
    static void btile_##R##_##T(const char *w, size_t wb, int64_t n_in, const char *a, size_t as, float *y, \
                                int64_t ldy)                                                                \
    {                                                                                                       \
        btile(R, T, w, wb, n_in, a, as, y, ldy);                                                            \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
BTILE(4, 1) BTILE(4, 2) BTILE(4, 3) BTILE(4, 4) BTILE(4, 5) BTILE(4, 6)
BTILE(1, 1) BTILE(1, 2) BTILE(1, 3) BTILE(1, 4) BTILE(1, 5) BTILE(1, 6)
    // clang-format on
    static const
    ie_ftile_fn btiles[2][BT + 1] = {{NULL, btile_1_1, btile_1_2, btile_1_3, btile_1_4, btile_1_5, btile_1_6},
                                     {NULL, btile_4_1, btile_4_2, btile_4_3, btile_4_4, btile_4_5, btile_4_6}};

/* 1 if vdpbf16ps may be used: the CPU has AVX512_BF16 (the library's one
 * probe, ie_cpu_features) and ie_avx512_use_dpbf16 has not turned it off. */
static _Atomic int g_dpbf16 = -1; /* -1: not yet probed */

static int has_bf16(void)
{
    int v = g_dpbf16;
    if (v < 0) g_dpbf16 = v = (ie_cpu_features() & IE_CPU_AVX512_BF16) ? 1 : 0;
    return v;
}

int ie_avx512_use_dpbf16(int on)
{
    g_dpbf16 = -1;
    if (on && has_bf16()) return 1;
    g_dpbf16 = 0;
    return 0;
}

#define BPANEL_KB 512 /* Zen 4: 1 MiB L2 per core */

/* ie_matmul_float_drive's loop nest with larger L2 panels (~512 KiB of
 * weights): the activation block of each pass is re-read from L3 once per
 * panel, and at 2 bf16 operands per flop pair that traffic is what limits a
 * 256 KiB panel (measured 150 vs 200 GFLOP/s per core on 2048 x 2048). */
static void bdrive(const ie_ftile_fn *tiles1, const ie_ftile_fn *tilesR, int R, int T, const void *w, int64_t n_in,
                   int64_t r0, int64_t r1, const void *a, size_t as, int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = (size_t)n_in * 2;
    int64_t P = r1 - r0;
    if (n_tok > T) {
        P = (int64_t)(((size_t)BPANEL_KB << 10) / (wb ? wb : 1));
        P -= P % R;
        if (P < R) P = R;
    }
    for (int64_t p0 = r0; p0 < r1; p0 += P) {
        const int64_t p1 = p0 + P < r1 ? p0 + P : r1;
        for (int64_t t0 = 0; t0 < n_tok; t0 += T) {
            const int tt = (int)(n_tok - t0 < T ? n_tok - t0 : T);
            const char *at = (const char *)a + (size_t)t0 * as;
            float *yt = y + t0 * ldy;
            int64_t r = p0;
            for (; r + R <= p1; r += R) tilesR[tt]((const char *)w + (size_t)r * wb, wb, n_in, at, as, yt + r, ldy);
            for (; r < p1; r++) tiles1[tt]((const char *)w + (size_t)r * wb, wb, n_in, at, as, yt + r, ldy);
        }
    }
}

/* ------------------------------- bf16 prefill: repacked weights, no reduce
 *
 * The tiles above put k along the vector lanes, so every (row, token) pair
 * ends in a horizontal sum (reduce16 per 16 pairs), and at n_in = 2048 its
 * 4 weight and 6 token rows, 4096 bytes apart, share one L1 set. For
 * prefill-sized calls (n_tok >= BP_MIN_TOK)
 * the rows go along the lanes instead. Each row panel is first repacked
 * once into a thread-local buffer, "interleaved pairs":
 *     group g (rows p0+16g .. +15), pair j: one 64-byte vector whose dword
 *     i is the bf16 pair (w[p0+16g+i][2j], w[p0+16g+i][2j+1]),
 * groups BP_GS(n_in) bytes apart, pairs 64 bytes apart; a pair past n_in
 * (odd n_in) and the rows past the panel are zeros. A tile of BPV groups
 * (32 rows) x BPT tokens then keeps BPV*BPT zmm accumulators whose lanes are
 * rows: per pair, BPV weight loads and one vdpbf16ps per (group, token) with
 * the token's pair as the {1to16} broadcast memory operand. An accumulator
 * is 16 consecutive outputs of one token: one (masked at the panel end)
 * store, no reduction. The repack (a 16 x 16 dword transpose per 16 rows x
 * 32 k) costs about one pass over the panel, which every token block then
 * reuses from L2; decode and short batches (n_tok < BP_MIN_TOK) keep the
 * tiles above, and so do rows whose 16-row group does not fit BP_BUF
 * (n_in > ~16.6K).
 *
 * Activations: 4 bytes per token and pair; for odd n_in the last element
 * is loaded alone (widened with a zero), never the word after the row.
 * When the row stride is a multiple of 2048 (the worker's bf16 rows of
 * n_in = 1024, 2048, 4096, ...) the 12 token rows of a tile fall into one
 * or two L1 sets and evict each other every step (measured: 335 vs 445
 * GOP/s); such blocks are read from a copy with a stride of a row + 64
 * bytes, made for the next block by the first tile of the current one (64
 * bytes per row every 16 pairs, overlapped with the arithmetic). The sums
 * are the same products added in another order (per pair, then along k in
 * one f32 accumulator per output, where the tiles above keep 16 partial
 * sums per output). Measured (2 threads, 512 tokens, cpu GOP/s): 2048 x
 * 2048 370 -> 435, 5632 x 2048 370 -> 430, 2048 x 5632 430 -> 445. */

#define BPV 2                                              /* 16-row groups per tile (rows: 16 * BPV) */
#define BPT 12                                             /* tokens per tile                         */
#define BP_MIN_TOK 48                                      /* n_tok from which the repacked path runs */
#define BP_BUF (520u << 10)                                /* 8 groups of n_in 2048 (padded) */
#define BP_GS(n_in) ((size_t)(((n_in) + 1) / 2) * 64 + 64) /* bytes per 16-row group */

#define BP_CP_MAXK 8192                                            /* longest activation row that is copied */
#define BP_AS(n_in) ((((size_t)(n_in)*2 + 63) & ~(size_t)63) + 64) /* copied act stride */

/* A thread's repack buffers (~0.9 MiB): its kernel scratch
 * (ie_kernel_scratch: made on its first prefill call, kept, freed when it
 * exits; as static _Thread_local arrays they were zeroed into every thread
 * of every process at creation, HTTP and ZeroMQ threads included). */
typedef struct bp_bufs {
    _Alignas(64) char pack[BP_BUF];
    _Alignas(64) char act[2][BPT * BP_AS(BP_CP_MAXK)];
} bp_bufs_t;

/* This thread's buffers, or NULL (out of memory: the caller takes the
 * path that needs none). */
static bp_bufs_t *bp_bufs(void) { return ie_kernel_scratch(sizeof(bp_bufs_t)); }

/* acc += vdpbf16ps(w, the bf16 pair at p broadcast to every dword), the
 * broadcast as the instruction's {1to16} memory operand (GCC does not fold
 * _mm512_set1_epi32 of a load into it; a separate vpbroadcastd per product
 * costs an extra uop); see dpbusd_bcast in avx512_inl.h. */
IE_INLINE __m512 dpbf16_bcast(__m512 acc, __m512bh w, const char *p)
{
#ifdef IE_PACK_NO_ASM
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpbf16_ps(acc, w, (__m512bh)_mm512_set1_epi32(v));
#else
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
#endif
}

/* Dword transpose: on return r[j] lane i = r[i] lane j (on entry). */
IE_INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* per 128-bit lane: a0 b0 a1 b1 | a2 b2 a3 b3 */
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* r[4i+c], 128-bit lane l: rows 4i..4i+3 of column 4l+c */
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* 4 x 4 transpose of 128-bit lanes */
        const __m512i v0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44),
                      v1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
        const __m512i v2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
        t[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        t[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Repack rows w[0 .. nrows) (row stride wb) into dst, groups gs apart. */
static void bp_repack(const char *w, size_t wb, int64_t n_in, int64_t nrows, char *dst, size_t gs)
{
    const int64_t np = (n_in + 1) / 2;
    for (int64_t g = 0; g * 16 < nrows; g++) {
        const int64_t nr = nrows - 16 * g < 16 ? nrows - 16 * g : 16;
        const char *src = w + (size_t)(16 * g) * wb;
        char *out = dst + (size_t)g * gs;
        for (int64_t j0 = 0; j0 < np; j0 += 16) {
            const int64_t ne = n_in - 2 * j0 < 32 ? n_in - 2 * j0 : 32; /* valid elements */
            const __mmask32 m = _cvtu32_mask32(ne == 32 ? ~0u : (1u << ne) - 1u);
            __m512i v[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                v[i] = i < nr ? _mm512_maskz_loadu_epi16(m, src + (size_t)i * wb + (size_t)j0 * 4)
                              : _mm512_setzero_si512();
            transpose16(v);
            const int64_t nc = np - j0 < 16 ? np - j0 : 16;
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++)
                if (c < nc) _mm512_store_si512((void *)(out + (size_t)(j0 + c) * 64), v[c]);
        }
    }
}

/* Rows to prefetch (into L2) while a tile runs: n rows from p, s bytes
 * apart; the tile touches line j*4 of each every 16 pairs j, so the rows
 * arrive spread over the tile (bytes 0..4*n_in/2 of each). */
typedef struct bp_pf {
    const char *p;
    size_t s;
    int n;
} bp_pf_t;

/* Activation rows to copy while a tile runs: n rows of n_in bf16 from s
 * (ss bytes apart) to d (ds bytes apart), 64 bytes of each every 16 pairs. */
typedef struct bp_cp {
    const char *s;
    size_t ss;
    char *d;
    size_t ds;
    int n;
} bp_cp_t;

/* One tile of V groups (16V rows, nrows of them valid) x T tokens from the
 * repacked panel at pw; y[t*ldy + r] for r < nrows. Prefetches pf[0], pf[1]
 * on the way. */
IE_INLINE void bptile(int V, int T, const char *pw, size_t gs, int64_t n_in, const char *a, size_t as, float *y,
                      int64_t ldy, int nrows, const bp_pf_t *pf, const bp_cp_t *cp)
{
    __m512 acc[BPV * BPT];
#pragma GCC unroll 24
    for (int i = 0; i < V * T; i++) acc[i] = _mm512_setzero_ps();
    const int64_t nf = n_in / 2, np = (n_in + 1) / 2; /* full pairs, all pairs */
    for (int64_t j0 = 0; j0 < np; j0 += 16) {
        for (int q = 0; q < 2; q++)
            for (int i = 0; i < pf[q].n; i++)
                _mm_prefetch(pf[q].p + (size_t)i * pf[q].s + (size_t)j0 * 4, _MM_HINT_T1);
        if (cp->n) {
            const int64_t ne = n_in - 2 * j0 < 32 ? n_in - 2 * j0 : 32;
            const __mmask32 m = _cvtu32_mask32(ne == 32 ? ~0u : (1u << ne) - 1u);
            for (int i = 0; i < cp->n; i++) {
                const char *src = cp->s + (size_t)i * cp->ss + (size_t)j0 * 4;
                _mm_prefetch(src + 256, _MM_HINT_T1);
                _mm512_store_si512((void *)(cp->d + (size_t)i * cp->ds + (size_t)j0 * 4),
                                   _mm512_maskz_loadu_epi16(m, src));
            }
        }
        const int64_t je = j0 + 16 < nf ? j0 + 16 : nf;
        for (int64_t j = j0; j < je; j++) {
            __m512bh wv[BPV];
#pragma GCC unroll 4
            for (int v = 0; v < V; v++)
                wv[v] = (__m512bh)_mm512_load_si512((const void *)(pw + (size_t)v * gs + (size_t)j * 64));
#pragma GCC unroll 12
            for (int t = 0; t < T; t++)
#pragma GCC unroll 4
                for (int v = 0; v < V; v++)
                    acc[t * V + v] = dpbf16_bcast(acc[t * V + v], wv[v], a + (size_t)t * as + (size_t)j * 4);
        }
    }
    if (n_in & 1) { /* the last element alone: its pair's weight half is 0 */
        __m512bh wv[BPV];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            wv[v] = (__m512bh)_mm512_load_si512((const void *)(pw + (size_t)v * gs + (size_t)nf * 64));
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            uint16_t e;
            memcpy(&e, a + (size_t)t * as + (size_t)nf * 4, 2);
            const __m512bh x = (__m512bh)_mm512_set1_epi32(e);
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) acc[t * V + v] = _mm512_dpbf16_ps(acc[t * V + v], wv[v], x);
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
        const int n = nrows - 16 * v;
        const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * ldy + 16 * v, m, acc[t * V + v]);
    }
}

typedef void (*bptile_fn)(const char *pw, size_t gs, int64_t n_in, const char *a, size_t as, float *y, int64_t ldy,
                          int nrows, const bp_pf_t *pf, const bp_cp_t *cp);

#define BPTILE(V, T)                                                                                          \
    static void bptile_##V##_##T(const char *pw, size_t gs, int64_t n_in, const char *a, size_t as, float *y, \
                                 int64_t ldy, int nrows, const bp_pf_t *pf, const bp_cp_t *cp)                \
    {                                                                                                         \
        bptile(V, T, pw, gs, n_in, a, as, y, ldy, nrows, pf, cp);                                             \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
#define BPTILES(V)                                                                                     \
    BPTILE(V, 1) BPTILE(V, 2) BPTILE(V, 3) BPTILE(V, 4) BPTILE(V, 5) BPTILE(V, 6) BPTILE(V, 7)        \
    BPTILE(V, 8) BPTILE(V, 9) BPTILE(V, 10) BPTILE(V, 11) BPTILE(V, 12)
BPTILES(1)
BPTILES(2)
// clang-format on
static const bptile_fn bptiles[BPV][BPT + 1] = {{NULL, bptile_1_1, bptile_1_2, bptile_1_3, bptile_1_4, bptile_1_5,
                                                 bptile_1_6, bptile_1_7, bptile_1_8, bptile_1_9, bptile_1_10,
                                                 bptile_1_11, bptile_1_12},
                                                {NULL, bptile_2_1, bptile_2_2, bptile_2_3, bptile_2_4, bptile_2_5,
                                                 bptile_2_6, bptile_2_7, bptile_2_8, bptile_2_9, bptile_2_10,
                                                 bptile_2_11, bptile_2_12}};

/* Copy tt activation rows (n_in bf16 each) to dst, rows ds bytes apart. */
static void bp_copy_act(const char *a, size_t as, int64_t n_in, int tt, char *dst, size_t ds)
{
    for (int t = 0; t < tt; t++) {
        const char *src = a + (size_t)t * as;
        char *d = dst + (size_t)t * ds;
        int64_t k = 0;
        for (; k + 32 <= n_in; k += 32)
            _mm512_store_si512((void *)(d + k * 2), _mm512_loadu_si512((const void *)(src + k * 2)));
        if (k < n_in)
            _mm512_store_si512((void *)(d + k * 2),
                               _mm512_maskz_loadu_epi16(_cvtu32_mask32((1u << (n_in - k)) - 1u), src + k * 2));
    }
}

/* Rows r0..r1 in panels that fit bb->pack; per panel, token blocks of BPT or
 * fewer (sizes differ by at most one) against 32-row tiles. The first block
 * repacks each tile just before using it, while the tile before prefetches
 * its rows; the last tile of the last block prefetches the next panel's
 * first tile, and the first tile of every block the next block's
 * activations, so the DRAM / L3 reads overlap the arithmetic.
 * pgs != 0: w is already BF16 PANEL16 (ie_pack.h; r0 a multiple of 16,
 * panels pgs = 32 n_in bytes, n_in even) and the tiles read it in place:
 * no repack and no software prefetch of the weights (a prefetch of the
 * next tile's panels measured no gain here, and lost 5-15% in decode);
 * bb may then be NULL (no activation copies). */
static void bpdrive(bp_bufs_t *bb, const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                    int64_t n_tok, float *y, int64_t ldy, size_t pgs)
{
    const size_t wb = (size_t)n_in * 2, gs = pgs ? pgs : BP_GS(n_in), cas = BP_AS(n_in);
    const int TR = 16 * BPV;                 /* rows per tile */
    int64_t P = (int64_t)(BP_BUF / gs) * 16; /* rows whose groups fit */
    if (P >= TR) P -= P % TR;
    if (pgs && P < TR) P = TR; /* in place: any panel count works */
    const int copy = bb && n_in <= BP_CP_MAXK && as % 2048 == 0;
    const int64_t nb = (n_tok + BPT - 1) / BPT;
    int64_t nblk = 0; /* blocks done: the copy of the current one is bb->act[nblk % 2] */
    if (copy) bp_copy_act((const char *)a, as, n_in, (int)(n_tok / nb), bb->act[0], cas);
    for (int64_t p0 = r0; p0 < r1; p0 += P) {
        const int64_t p1 = p0 + P < r1 ? p0 + P : r1;
        const int64_t nt = (p1 - p0 + TR - 1) / TR;
        for (int64_t b = 0; b < nb; b++, nblk++) {
            const int64_t t0 = n_tok * b / nb, t1 = n_tok * (b + 1) / nb;
            const int tt = (int)(t1 - t0);
            /* the activations after this block: the next one, or block 0 of the next panel */
            bp_pf_t pfa = {NULL, as, 0};
            if (b + 1 < nb)
                pfa = (bp_pf_t){(const char *)a + (size_t)t1 * as, as, (int)(n_tok * (b + 2) / nb - t1)};
            else if (p1 < r1) pfa = (bp_pf_t){(const char *)a, as, (int)(n_tok / nb)};
            const char *at = (const char *)a + (size_t)t0 * as;
            size_t ats = as;
            bp_cp_t cp = {NULL, as, NULL, cas, 0};
            if (copy) { /* this block from its copy; tile 0 copies the next one */
                at = bb->act[nblk % 2];
                ats = cas;
                cp = (bp_cp_t){pfa.p, as, bb->act[(nblk + 1) % 2], cas, pfa.n};
                pfa.n = 0;
            }
            float *yt = y + t0 * ldy;
            for (int64_t i = 0; i < nt; i++) {
                const int64_t r = p0 + i * TR;
                const int nr = (int)(p1 - r < TR ? p1 - r : TR);
                const char *pw = pgs ? (const char *)w + (size_t)(r / 16) * pgs : bb->pack + (size_t)(i * BPV) * gs;
                if (b == 0 && !pgs)
                    bp_repack((const char *)w + (size_t)r * wb, wb, n_in, nr, bb->pack + (size_t)(i * BPV) * gs,
                              gs);
                bp_pf_t pf[2] = {{NULL, wb, 0}, {NULL, as, 0}};
                /* (in place: sequential panels, the hardware prefetchers keep up) */
                if (!pgs && b == 0 && i + 1 < nt)
                    pf[0] = (bp_pf_t){(const char *)w + (size_t)(r + TR) * wb, wb,
                                      (int)(p1 - r - TR < TR ? p1 - r - TR : TR)};
                else if (!pgs && b == nb - 1 && i + 1 == nt && p1 < r1)
                    pf[0] = (bp_pf_t){(const char *)w + (size_t)p1 * wb, wb, (int)(r1 - p1 < TR ? r1 - p1 : TR)};
                static const bp_cp_t nocp = {NULL, 0, NULL, 0, 0};
                if (i == 0) pf[1] = pfa;
                bptiles[nr > 16][tt](pw, gs, n_in, at, ats, yt + r, ldy, nr, pf, i == 0 ? &cp : &nocp);
            }
        }
    }
}

void ie_matmul_bf16_bf16_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) return;
    bp_bufs_t *bb;
    if (has_bf16() && n_tok >= BP_MIN_TOK && BP_GS(n_in) <= BP_BUF && (bb = bp_bufs()) != NULL)
        bpdrive(bb, w, n_in, r0, r1, a, as, n_tok, y, ldy, 0);
    else if (has_bf16()) bdrive(btiles[0], btiles[1], BR, BT, w, n_in, r0, r1, a, as, n_tok, y, ldy);
    else
        ie_matmul_float_drive(IE_DTYPE_BF16, ftiles_bf16bf16[0], ftiles_bf16bf16[1], FR, FT, w, n_in, r0, r1, a, as,
                              n_tok, y, ldy);
}

/* ========================================================= block weights */

#define QR 4       /* rows per block tile                          */
#define QT 4       /* tokens per block tile                        */
#define IE_KCB 256 /* blocks per k-chunk (packed act: 16 KiB/token) */
#define PK_GROUP 256
#define PK_STRIDE ((IE_KCB / 4) * PK_GROUP)

/* vpermt2w / vpermw word indices that gather a group of 4 blocks (layout in
 * the file comment). Word p of a gathered lo/hi vector is dword j = p/2 of
 * block b = j%4, bytes 4*(j/4) + 2*(p%2) of its half; the index is that
 * byte's address / 2 within the pair of 64-byte loads (second load's words
 * start at 32). Generated by a script; the matmul tests check them. */
/* q4_0: loads at +0 and +8 of the 72-byte group. */
static const uint16_t IDX_Q4_0_QS[32]
    __attribute__((aligned(64))) = {1, 2, 10, 11, 19, 20, 28, 29, 3, 4, 12, 13, 21, 22, 30, 31,
                                    5, 6, 14, 15, 23, 24, 60, 61, 7, 8, 16, 17, 25, 26, 62, 63};
static const uint16_t IDX_Q4_0_D[32]
    __attribute__((aligned(64))) = {0, 9, 18, 27, 0, 9, 18, 27, 0, 9, 18, 27, 0, 9, 18, 27,
                                    0, 0, 0,  0,  0, 0, 0,  0,  0, 0, 0,  0,  0, 0, 0,  0};
/* q4_1: loads at +0 and +16 of the 80-byte group; DM: d pattern, then m. */
static const uint16_t IDX_Q4_1_QS[32]
    __attribute__((aligned(64))) = {2, 3, 12, 13, 22, 23, 56, 57, 4, 5, 14, 15, 24, 25, 58, 59,
                                    6, 7, 16, 17, 26, 27, 60, 61, 8, 9, 18, 19, 28, 29, 62, 63};
static const uint16_t IDX_Q4_1_DM[32]
    __attribute__((aligned(64))) = {0, 10, 20, 30, 0, 10, 20, 30, 0, 10, 20, 30, 0, 10, 20, 30,
                                    1, 11, 21, 31, 1, 11, 21, 31, 1, 11, 21, 31, 1, 11, 21, 31};
/* q8_0: lo and d from loads at +0/+64, hi from loads at +8/+72 (136 bytes). */
static const uint16_t IDX_Q8_0_LO[32]
    __attribute__((aligned(64))) = {1, 2, 18, 19, 35, 36, 52, 53, 3, 4, 20, 21, 37, 38, 54, 55,
                                    5, 6, 22, 23, 39, 40, 56, 57, 7, 8, 24, 25, 41, 42, 58, 59};
static const uint16_t IDX_Q8_0_HI[32]
    __attribute__((aligned(64))) = {5, 6,  22, 23, 39, 40, 56, 57, 7,  8,  24, 25, 41, 42, 58, 59,
                                    9, 10, 26, 27, 43, 44, 60, 61, 11, 12, 28, 29, 45, 46, 62, 63};
static const uint16_t IDX_Q8_0_D[32]
    __attribute__((aligned(64))) = {0, 17, 34, 51, 0, 17, 34, 51, 0, 17, 34, 51, 0, 17, 34, 51,
                                    0, 0,  0,  0,  0, 0,  0,  0,  0, 0,  0,  0,  0, 0,  0,  0};
/* q8_1: lo and d/s from loads at +0/+64, hi from loads at +16/+80 (144 bytes). */
static const uint16_t IDX_Q8_1_LO[32]
    __attribute__((aligned(64))) = {2, 3, 20, 21, 38, 39, 56, 57, 4, 5, 22, 23, 40, 41, 58, 59,
                                    6, 7, 24, 25, 42, 43, 60, 61, 8, 9, 26, 27, 44, 45, 62, 63};
static const uint16_t IDX_Q8_1_HI[32]
    __attribute__((aligned(64))) = {2, 3, 20, 21, 38, 39, 56, 57, 4, 5, 22, 23, 40, 41, 58, 59,
                                    6, 7, 24, 25, 42, 43, 60, 61, 8, 9, 26, 27, 44, 45, 62, 63};
static const uint16_t IDX_Q8_1_DS[32]
    __attribute__((aligned(64))) = {0, 18, 36, 54, 0, 18, 36, 54, 0, 18, 36, 54, 0, 18, 36, 54,
                                    1, 19, 37, 55, 1, 19, 37, 55, 1, 19, 37, 55, 1, 19, 37, 55};

#define IDX(t) _mm512_load_si512((const void *)(t))

/* 64-byte load at p+off of a group whose first `valid` bytes exist; a partial
 * (tail) group uses a masked load, which neither reads nor faults past it. */
IE_INLINE __m512i gload(const uint8_t *p, int off, int full, int valid)
{
    if (full) return _mm512_loadu_si512((const void *)(p + off));
    const int n = valid - off;
    const __mmask64 m = n <= 0 ? 0 : n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
    return _mm512_maskz_loadu_epi8(m, p + off);
}

/* Gather one group of a q8_0 / q8_1 row (weights or activations). */
IE_INLINE void q8_gather(int is_q8_1, const uint8_t *p, int full, int valid, __m512i *lo, __m512i *hi, __m512i *ds)
{
    const int hoff = is_q8_1 ? 16 : 8;
    const __m512i z0 = gload(p, 0, full, valid), z1 = gload(p, 64, full, valid);
    const __m512i za = gload(p, hoff, full, valid), zb = gload(p, hoff + 64, full, valid);
    *lo = _mm512_permutex2var_epi16(z0, IDX(is_q8_1 ? IDX_Q8_1_LO : IDX_Q8_0_LO), z1);
    *hi = _mm512_permutex2var_epi16(za, IDX(is_q8_1 ? IDX_Q8_1_HI : IDX_Q8_0_HI), zb);
    *ds = _mm512_permutex2var_epi16(z0, IDX(is_q8_1 ? IDX_Q8_1_DS : IDX_Q8_0_D), z1);
}

/* mxfp4 (68-byte groups, blocks at 0, 17, 34, 51; qs at +1): the qs of
 * blocks 0 and 2 start at even bytes of a load at +1, those of blocks 1
 * and 3 at even bytes of a load at +4, so one vpermt2w gathers the lo/hi
 * layout (same rule as the tables above). E: dword j takes, as its high
 * word, the word of the load at +0 that holds e of block j%4 (low byte for
 * even blocks, high byte for odd ones); rotating by ROT puts e at bits
 * 23..30. */
static const uint16_t IDX_MXFP4_QS[32]
    __attribute__((aligned(64))) = {0, 1, 39, 40, 17, 18, 56, 57, 2, 3, 41, 42, 19, 20, 58, 59,
                                    4, 5, 43, 44, 21, 22, 60, 61, 6, 7, 45, 46, 23, 24, 62, 63};
static const uint16_t IDX_MXFP4_E[32]
    __attribute__((aligned(64))) = {0, 0, 8, 8, 17, 17, 25, 25, 0, 0, 8, 8, 17, 17, 25, 25,
                                    0, 0, 8, 8, 17, 17, 25, 25, 0, 0, 8, 8, 17, 17, 25, 25};
static const int32_t ROT_MXFP4_E[16]
    __attribute__((aligned(64))) = {7, 31, 7, 31, 7, 31, 7, 31, 7, 31, 7, 31, 7, 31, 7, 31};

/* Unpacked weights of one group for one row. */
typedef struct {
    __m512i lo, hi;
    __m512 d, m;
} wgroup_t;

IE_INLINE wgroup_t wgroup_load(ie_dtype_t wt, const uint8_t *p, int full, int valid)
{
    wgroup_t g;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (wt == IE_DTYPE_MXFP4) {
        const __m512i qs = _mm512_permutex2var_epi16(gload(p, 1, full, valid), IDX(IDX_MXFP4_QS),
                                                     gload(p, 4, full, valid));
        const __m512i lut = _mm512_broadcast_i32x4(
            _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
        g.lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(qs, m4));
        g.hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4));
        /* 2^(e-128) from eb = e << 23: eb - 2^23 for e >= 2, and the
         * subnormals 2^-128, 2^-127 = bits 2^21 + eb/4 for e = 0, 1 */
        __m512i eb = _mm512_permutexvar_epi16(IDX(IDX_MXFP4_E), gload(p, 0, full, valid));
        eb = _mm512_and_si512(_mm512_rolv_epi32(eb, IDX(ROT_MXFP4_E)), _mm512_set1_epi32(0x7f800000));
        const __mmask16 small = _mm512_cmplt_epu32_mask(eb, _mm512_set1_epi32(0x01000000));
        const __m512i bits = _mm512_mask_add_epi32(_mm512_sub_epi32(eb, _mm512_set1_epi32(0x00800000)), small,
                                                   _mm512_srli_epi32(eb, 2), _mm512_set1_epi32(0x00200000));
        g.d = _mm512_castsi512_ps(bits);
        g.m = _mm512_setzero_ps();
    } else if (wt == IE_DTYPE_Q8_0) {
        __m512i ds;
        q8_gather(0, p, full, valid, &g.lo, &g.hi, &ds);
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        g.lo = _mm512_xor_si512(g.lo, bias);
        g.hi = _mm512_xor_si512(g.hi, bias);
        g.d = _mm512_cvtph_ps(_mm512_castsi512_si256(ds));
        g.m = _mm512_setzero_ps();
    } else {
        const int is_q4_1 = wt == IE_DTYPE_Q4_1;
        const __m512i z0 = gload(p, 0, full, valid);
        const __m512i z1 = gload(p, is_q4_1 ? 16 : 8, full, valid);
        const __m512i qs = _mm512_permutex2var_epi16(z0, IDX(is_q4_1 ? IDX_Q4_1_QS : IDX_Q4_0_QS), z1);
        const __m512i dm = _mm512_permutexvar_epi16(IDX(is_q4_1 ? IDX_Q4_1_DM : IDX_Q4_0_D), z0);
        g.lo = _mm512_and_si512(qs, m4);
        g.hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
        g.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
        g.m = is_q4_1 ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)) : _mm512_setzero_ps();
    }
    return g;
}

/* Pack one activation group (256 bytes at dst) for weights of type wt. */
IE_INLINE void pack_group(ie_dtype_t wt, const uint8_t *p, int full, int valid, uint8_t *dst)
{
    __m512i lo, hi, ds, aux;
    if (wt == IE_DTYPE_Q4_1) {
        q8_gather(1, p, full, valid, &lo, &hi, &ds);
        /* s of blocks 0..3 in words 16..19, zeros above: lanes 0..3 of aux */
        ds = _mm512_maskz_mov_epi16(0x000fffffu, ds);
        aux = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(ds, 1)));
    } else {
        q8_gather(0, p, full, valid, &lo, &hi, &ds);
        const __m512i ones = _mm512_set1_epi8(1);
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, lo);
        s = _mm512_dpbusd_epi32(s, ones, hi); /* partial sums of a, per block lane */
        s = wt == IE_DTYPE_Q4_0    ? _mm512_slli_epi32(s, 3)
            : wt == IE_DTYPE_MXFP4 ? _mm512_mullo_epi32(s, _mm512_set1_epi32(12))
                                   : _mm512_slli_epi32(s, 7);
        aux = _mm512_sub_epi32(_mm512_setzero_si512(), s);
    }
    _mm512_store_si512((void *)dst, lo);
    _mm512_store_si512((void *)(dst + 64), hi);
    _mm512_store_ps((void *)(dst + 128), _mm512_cvtph_ps(_mm512_castsi512_si256(ds)));
    _mm512_store_si512((void *)(dst + 192), aux);
}

/* Rows ahead that a tile prefetches: the same group of rows r+QPF.., i.e.
 * two tiles ahead, so DRAM latency is hidden in decode, where the hardware
 * prefetcher alone sees many short interleaved row streams. Into L2 (T1):
 * prefetching into L1 (T0) measured 2x slower on Zen 4, as the L1 miss
 * buffers fill up with lines needed only later. */
#define QPF 8

/* Accumulate one group into an R x T tile. */
IE_INLINE void qstep(ie_dtype_t wt, int R, int T, const uint8_t *w, size_t wb, int full, int valid,
                     const uint8_t *pk, size_t ps, __m512 acc[QR][QT])
{
    const size_t gb = 4 * blk_bytes(wt);
    wgroup_t g[QR];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        /* prefetch never faults, so running past the matrix is harmless */
        const char *pf = (const char *)w + (size_t)(r + QPF) * wb;
        for (size_t off = 0; off < gb; off += 64) _mm_prefetch(pf + off, _MM_HINT_T1);
        _mm_prefetch(pf + gb - 1, _MM_HINT_T1);
        g[r] = wgroup_load(wt, w + (size_t)r * wb, full, valid);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *pt = pk + (size_t)t * ps;
        const __m512i alo = _mm512_load_si512((const void *)pt);
        const __m512i ahi = _mm512_load_si512((const void *)(pt + 64));
        const __m512 da = _mm512_load_ps((const void *)(pt + 128));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i s = wt == IE_DTYPE_Q4_1 ? _mm512_setzero_si512() : _mm512_load_si512((const void *)(pt + 192));
            s = _mm512_dpbusd_epi32(s, g[r].lo, alo);
            s = _mm512_dpbusd_epi32(s, g[r].hi, ahi);
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(g[r].d, da), acc[r][t]);
            if (wt == IE_DTYPE_Q4_1)
                acc[r][t] = _mm512_fmadd_ps(g[r].m, _mm512_load_ps((const void *)(pt + 192)), acc[r][t]);
        }
    }
}

IE_INLINE void qtile(ie_dtype_t wt, int R, int T, const uint8_t *w, size_t wb, int64_t ngf, int tail_valid,
                     const uint8_t *pk, float *y, int64_t ldy, int first)
{
    const size_t gb = 4 * blk_bytes(wt);
    __m512 acc[QR][QT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ngf; g++) qstep(wt, R, T, w + g * gb, wb, 1, 0, pk + g * PK_GROUP, PK_STRIDE, acc);
    if (tail_valid) qstep(wt, R, T, w + ngf * gb, wb, 0, tail_valid, pk + ngf * PK_GROUP, PK_STRIDE, acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const float v = _mm512_reduce_add_ps(acc[r][t]);
            y[t * ldy + r] = first ? v : y[t * ldy + r] + v;
        }
}

typedef void (*qtile_fn)(const uint8_t *w, size_t wb, int64_t ngf, int tail_valid, const uint8_t *pk, float *y,
                         int64_t ldy, int first);

#define QTILE(WT, name, R, T)                                                                                 \
    static void qtile_##name##_##R##_##T(const uint8_t *w, size_t wb, int64_t ngf, int tv, const uint8_t *pk, \
                                         float *y, int64_t ldy, int first)                                    \
    {                                                                                                         \
        qtile(WT, R, T, w, wb, ngf, tv, pk, y, ldy, first);                                                   \
    }
/* macro-built tile tables, laid out by hand */
// clang-format off
#define QTILES(WT, name)                                                                       \
    QTILE(WT, name, 4, 1) QTILE(WT, name, 4, 2) QTILE(WT, name, 4, 3) QTILE(WT, name, 4, 4)    \
    QTILE(WT, name, 1, 1) QTILE(WT, name, 1, 2) QTILE(WT, name, 1, 3) QTILE(WT, name, 1, 4)    \
    static const qtile_fn qtiles_##name[2][QT + 1] = {                                         \
        { NULL, qtile_##name##_1_1, qtile_##name##_1_2, qtile_##name##_1_3, qtile_##name##_1_4 }, \
        { NULL, qtile_##name##_4_1, qtile_##name##_4_2, qtile_##name##_4_3, qtile_##name##_4_4 } };

QTILES(IE_DTYPE_Q8_0, q8_0)
QTILES(IE_DTYPE_Q4_0, q4_0)
QTILES(IE_DTYPE_Q4_1, q4_1)
QTILES(IE_DTYPE_MXFP4, mxfp4)
// clang-format on

/* Pack blocks [kb0, kb0+nbc) of tokens t0..t0+tt-1 into pk (PK_STRIDE apart). */
IE_INLINE void pack_tokens(ie_dtype_t wt, const void *a, size_t as, int64_t t0, int tt, int64_t kb0, int64_t nbc,
                           uint8_t *pk)
{
    const size_t ab = blk_bytes(ie_matmul_act_dtype(wt));
    const int64_t ngf = nbc / 4;
    const int tail_valid = (int)((nbc % 4) * ab);
    for (int t = 0; t < tt; t++) {
        const uint8_t *src = (const uint8_t *)a + (size_t)(t0 + t) * as + (size_t)kb0 * ab;
        uint8_t *dst = pk + (size_t)t * PK_STRIDE;
        for (int64_t g = 0; g < ngf; g++) pack_group(wt, src + g * 4 * ab, 1, 0, dst + g * PK_GROUP);
        if (tail_valid) pack_group(wt, src + ngf * 4 * ab, 0, tail_valid, dst + ngf * PK_GROUP);
    }
}

IE_INLINE void matmul_block(ie_dtype_t wt, const qtile_fn tiles[2][QT + 1], const void *w, int64_t n_in, int64_t r0,
                            int64_t r1, const void *a, size_t as, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t pk[QT * PK_STRIDE];
    const size_t wb = ie_dtype_row_bytes(wt, n_in), bb = blk_bytes(wt);
    const int64_t nb = n_in / IE_QK;
    for (int64_t kb0 = 0; kb0 < nb; kb0 += IE_KCB) {
        const int64_t nbc = nb - kb0 < IE_KCB ? nb - kb0 : IE_KCB;
        const int64_t ngf = nbc / 4;
        const int tail_valid = (int)((nbc % 4) * bb);
        const int64_t P = ie_panel_rows(r1 - r0, (size_t)nbc * bb, n_tok, QT, QR);
        for (int64_t p0 = r0; p0 < r1; p0 += P) {
            const int64_t p1 = p0 + P < r1 ? p0 + P : r1;
            for (int64_t t0 = 0; t0 < n_tok; t0 += QT) {
                const int tt = (int)(n_tok - t0 < QT ? n_tok - t0 : QT);
                pack_tokens(wt, a, as, t0, tt, kb0, nbc, pk);
                float *yt = y + t0 * ldy;
                const uint8_t *wk = (const uint8_t *)w + (size_t)kb0 * bb;
                int64_t r = p0;
                for (; r + QR <= p1; r += QR)
                    tiles[1][tt](wk + (size_t)r * wb, wb, ngf, tail_valid, pk, yt + r, ldy, kb0 == 0);
                for (; r < p1; r++)
                    tiles[0][tt](wk + (size_t)r * wb, wb, ngf, tail_valid, pk, yt + r, ldy, kb0 == 0);
            }
        }
    }
}

/* The dense matmuls of the table, one per weight type (contract:
 * ie_matmul_fn in ie_kernels.h; bf16 is ie_matmul_bf16_bf16_avx512 above). */
void ie_matmul_f32_f32_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy)
{
    ie_matmul_float_drive(IE_DTYPE_F32, ftiles_f32[0], ftiles_f32[1], FR, FT, w, n_in, r0, r1, a, as, n_tok, y,
                          ldy);
}

void ie_matmul_f16_f32_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy)
{
    ie_matmul_float_drive(IE_DTYPE_F16, ftiles_f16[0], ftiles_f16[1], FR, FT, w, n_in, r0, r1, a, as, n_tok, y,
                          ldy);
}

void ie_matmul_q8_0_q8_0_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_Q8_0, qtiles_q8_0, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

void ie_matmul_q4_0_q8_0_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_Q4_0, qtiles_q4_0, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

void ie_matmul_q4_1_q8_1_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_Q4_1, qtiles_q4_1, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

void ie_matmul_mxfp4_q8_0_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy)
{
    matmul_block(IE_DTYPE_MXFP4, qtiles_mxfp4, w, n_in, r0, r1, a, as, n_tok, y, ldy);
}

/* ================================================== activation quantize */

/* roundf() semantics (ties away from zero) for |v| < 2^23: truncate, then
 * step away from zero when the dropped fraction is >= 0.5 (v - trunc(v) is
 * exact). Keeps the result bit-identical to the reference quantizer. */
IE_INLINE __m512i round_away_epi32(__m512 v)
{
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_abs_ps(_mm512_sub_ps(v, t));
    const __mmask16 up = _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u)),
                        _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
}

/* Quantize one block of 32 floats; returns sum(q). */
static int q8_block(const float *x, int8_t *q, float *d_out)
{
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (id == __builtin_inff()) id = 0.0f; /* 1/d overflowed: see quant_ref.c */
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = round_away_epi32(_mm512_mul_ps(x0, vid));
    const __m512i q1 = round_away_epi32(_mm512_mul_ps(x1, vid));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
    *d_out = d;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}

/* Lane i of the result = OP over the 16 lanes of v[i] (OP commutative and
 * associative on the values used: max of non-negative floats, int32 add),
 * by the transposition reduce16 uses: 15 OPs and 16 shuffles for 16
 * vectors, where 16 horizontal reductions cost ~8 dependent steps each. */
#define REDUCE16_OP(NAME, OP)                                                                                  \
    IE_INLINE __m512 NAME(const __m512 v[16])                                                                  \
    {                                                                                                          \
        __m512 a[8], b[4], c[2];                                                                               \
        for (int i = 0; i < 8; i++)                                                                            \
            a[i] = OP(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1])); \
        for (int j = 0; j < 4; j++) {                                                                          \
            const __m512d x = _mm512_castps_pd(a[2 * j]), y = _mm512_castps_pd(a[2 * j + 1]);                  \
            b[j] = OP(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y))); \
        }                                                                                                      \
        for (int h = 0; h < 2; h++)                                                                            \
            c[h] = OP(_mm512_shuffle_f32x4(b[2 * h], b[2 * h + 1], 0x88),                                      \
                      _mm512_shuffle_f32x4(b[2 * h], b[2 * h + 1], 0xdd));                                     \
        return OP(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));             \
    }
#define MAX_PS(a, b) _mm512_max_ps(a, b)
#define ADD_EPI32_PS(a, b) _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)))
/* macro-built tile tables, laid out by hand */
// clang-format off
REDUCE16_OP(reduce16_max, MAX_PS)
REDUCE16_OP(reduce16_addi, ADD_EPI32_PS)
// clang-format on

/* Q8_P (wide 0) or Q16_P (wide 1) quantization of nb <= 16 blocks of 32
 * floats at x: q (int8 or int16) for those blocks, and their d and s into
 * d[0..nb) and s[0..nb). The definition's arithmetic per block (ie_pack.h:
 * d = amax/qmax, id = ie_inv_scale(d), q = roundf(x*id), s = (float)sum*d),
 * 16 blocks at a time: the block maxima and sums come out as one vector
 * each (reduce16_*), one division each for d and 1/d, one store each for
 * d and s. |x*id| <= qmax + 0.01, so q needs no clamp. Blocks past nb are
 * never read nor written. */
IE_INLINE int aligned64(const void *p) { return ((uintptr_t)p & 63) == 0; }

/* nt: stores around the caches (see ie_act_quantize_stream_avx512) where
 * the address allows it (64-byte aligned vectors), plain stores elsewhere. */
IE_INLINE void quantize_p16(const int nt, const float *x, int nb, int wide, void *q, float *d, float *s)
{
    const __mmask16 live = (__mmask16)((1u << nb) - 1u);
    __m512 v[16];
    for (int b = 0; b < 16; b++)
        v[b] = b < nb ? _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * b)),
                                      _mm512_abs_ps(_mm512_loadu_ps(x + 32 * b + 16)))
                      : _mm512_setzero_ps();
    const __m512 vd = _mm512_div_ps(reduce16_max(v), _mm512_set1_ps(wide ? 32767.0f : 127.0f));
    __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(vd, _mm512_setzero_ps(), _CMP_NEQ_UQ), _mm512_set1_ps(1.0f),
                                    vd);
    id = _mm512_mask_mov_ps(id, _mm512_cmp_ps_mask(_mm512_abs_ps(id), _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ),
                            _mm512_setzero_ps()); /* 1/d overflowed: ie_inv_scale's 0 */
    for (int b = 0; b < 16; b++) {
        if (b >= nb) {
            v[b] = _mm512_setzero_ps();
            continue;
        }
        const __m512 ib = _mm512_permutexvar_ps(_mm512_set1_epi32(b), id);
        const __m512i q0 = round_away_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b), ib));
        const __m512i q1 = round_away_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b + 16), ib));
        if (wide && nt && aligned64((int16_t *)q + 32 * b)) {
            _mm512_stream_si512((void *)((int16_t *)q + 32 * b),
                                _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(q0)),
                                                   _mm512_cvtepi32_epi16(q1), 1));
        } else if (wide) {
            _mm256_storeu_si256((__m256i *)((int16_t *)q + 32 * b), _mm512_cvtepi32_epi16(q0));
            _mm256_storeu_si256((__m256i *)((int16_t *)q + 32 * b + 16), _mm512_cvtepi32_epi16(q1));
        } else if (nt && ((uintptr_t)((int8_t *)q + 32 * b) & 31) == 0) {
            _mm256_stream_si256((__m256i *)((int8_t *)q + 32 * b),
                                _mm256_set_m128i(_mm512_cvtepi32_epi8(q1), _mm512_cvtepi32_epi8(q0)));
        } else {
            _mm_storeu_si128((__m128i *)((int8_t *)q + 32 * b), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)((int8_t *)q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
        }
        v[b] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
    }
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_castps_si512(reduce16_addi(v)));
    if (nt && nb == 16 && aligned64(d)) _mm512_stream_ps(d, vd);
    else _mm512_mask_storeu_ps(d, live, vd);
    if (nt && nb == 16 && aligned64(s)) _mm512_stream_ps(s, _mm512_mul_ps(sum, vd));
    else _mm512_mask_storeu_ps(s, live, _mm512_mul_ps(sum, vd));
}

/* A row of n floats (n a multiple of 32) to Q8_P or Q16_P (ie_pack.h). */
IE_INLINE void quantize_row_p(const int nt, const float *x, void *out, int64_t n, int wide)
{
    const int64_t nblk = n / IE_QK;
    char *q = out;
    float *d = (float *)(void *)(q + (size_t)n * (wide ? 2 : 1)), *s = d + nblk;
    for (int64_t b = 0; b < nblk; b += 16) {
        const int nb = nblk - b < 16 ? (int)(nblk - b) : 16;
        quantize_p16(nt, x + b * IE_QK, nb, wide, q + (size_t)b * IE_QK * (wide ? 2 : 1), d + b, s + b);
    }
}

/* 16 floats -> bf16 with ie_f32_to_bf16's rule, bit for bit: round to
 * nearest even on the bit pattern (denormals round like any other value,
 * overflow goes to inf), NaN -> quiet NaN with its sign and top payload.
 * Not vcvtne2ps2bf16, which flushes f32 denormals to zero. */
IE_INLINE __m256i bf16_rne16(__m512 v)
{
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

IE_INLINE void f32_to_bf16_row(const int nt, const float *x, ie_bf16_t *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i lo = bf16_rne16(_mm512_loadu_ps(x + i)), hi = bf16_rne16(_mm512_loadu_ps(x + i + 16));
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        if (nt && aligned64(out + i)) _mm512_stream_si512((void *)(out + i), v);
        else _mm512_storeu_si512((void *)(out + i), v);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        _mm256_mask_storeu_epi16(out + i, m, bf16_rne16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

void ie_act_quantize_avx512(ie_dtype_t act, const float *x, void *out, int64_t n)
{
    if (act == IE_DTYPE_BF16) {
        f32_to_bf16_row(0, x, out, n);
        return;
    }
    if (act == IE_DTYPE_Q8_P || act == IE_DTYPE_Q16_P) {
        quantize_row_p(0, x, out, n, act == IE_DTYPE_Q16_P);
        return;
    }
    if (act == IE_DTYPE_Q8_K) {
        ie_quantize_row_q8_k_avx512(x, out, n);
        return;
    }
    ie_act_quantize_drive(act, x, out, n, q8_block);
}

/* ie_kernels_t.act_quantize_stream: the bytes of act_quantize, the
 * BF16, Q8_P and Q16_P rows written with non-temporal stores (64-byte
 * aligned parts; the rest plainly), then a store fence. Measured in the
 * worker's decode (2 threads): when the two threads sit far apart (the
 * high-bandwidth phase of this VM) plain stores into the activation
 * buffer, which the other thread read in the previous matmul, cost ~3 us
 * per 2048-float row in ownership transfers (~3x the arithmetic); these
 * stores skip them, and the matmul then reads the row from memory once. */
void ie_act_quantize_stream_avx512(ie_dtype_t act, const float *x, void *out, int64_t n)
{
    if (act == IE_DTYPE_BF16) f32_to_bf16_row(1, x, out, n);
    else if (act == IE_DTYPE_Q8_P || act == IE_DTYPE_Q16_P) quantize_row_p(1, x, out, n, act == IE_DTYPE_Q16_P);
    else if (act == IE_DTYPE_Q8_K) { /* plain stores: 292-byte blocks, not 64-byte aligned parts */
        ie_quantize_row_q8_k_avx512(x, out, n);
        return;
    } else {
        ie_act_quantize_drive(act, x, out, n, q8_block);
        return;
    }
    _mm_sfence();
}

/* Contract of ie_matmul_packed_bf16_avx512 (ie_kernels_isa.h). Decode-
 * sized calls (n_tok <= BPT): one 16-row tile per panel straight from the
 * weights, so each thread reads one sequential stream (measured on TinyLlama
 * decode, high-bandwidth phase: 0.95-0.98 of the paired read with one panel
 * per tile, 0.91-0.92 with two, 0.72 with two and the next tile prefetched
 * in software; the ROWS tiles reached 0.82); longer ones: bpdrive on the
 * panels in place. */
void ie_matmul_packed_bf16_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t as,
                                  int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) return;
    if (!has_bf16()) {
        ie_matmul_packed_avx2(m, r0, r1, a, as, n_tok, y, ldy);
        return;
    }
    const size_t pgs = (size_t)m->n_in * 32;
    const char *w = m->data;
    if (n_tok > BPT) {
        bpdrive(bp_bufs(), w, m->n_in, r0, r1, a, as, n_tok, y, ldy, pgs);
        return;
    }
    static const bp_cp_t nocp = {NULL, 0, NULL, 0, 0};
    static const bp_pf_t nopf[2] = {{NULL, 0, 0}, {NULL, 0, 0}};
    for (int64_t r = r0; r < r1; r += 16) {
        const int nr = (int)(r1 - r < 16 ? r1 - r : 16);
        bptiles[0][n_tok](w + (size_t)(r / 16) * pgs, pgs, m->n_in, a, as, y + r, ldy, nr, nopf, &nocp);
    }
}

/* ------------------------------------------- f16 panels x f32 activations
 *
 * F16 PANEL16 (ie_pack.h): slice k of a panel is the 16 rows' f16 w[.][k],
 * 32 bytes; vcvtph2ps widens it to one zmm whose lanes are rows, and each
 * token's a[k] meets it in one FMA with a {1to16} broadcast operand: no
 * horizontal sums, one sequential stream per panel. A tile is V panels x T
 * tokens with NA sets of accumulators taking k in turn (decode: one token
 * would otherwise wait on one FMA chain, 4 cycles per 32 bytes), summed at
 * the end. */

#define HT 12 /* tokens per f16 tile */

IE_INLINE void hptile(int V, int T, int NA, const char *pan, size_t pgs, int64_t n_in, const char *a, size_t as,
                      float *y, int64_t ldy, int nrows)
{
    __m512 acc[24];
#pragma GCC unroll 24
    for (int i = 0; i < NA * T * V; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < n_in; k += NA) { /* n_in is a multiple of 32 */
#pragma GCC unroll 4
        for (int j = 0; j < NA; j++) {
            __m512 wv[2];
#pragma GCC unroll 2
            for (int v = 0; v < V; v++)
                wv[v] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    (const __m256i *)(const void *)(pan + (size_t)v * pgs + (size_t)(k + j) * 32)));
#pragma GCC unroll 12
            for (int t = 0; t < T; t++) {
                float x;
                memcpy(&x, a + (size_t)t * as + (size_t)(k + j) * 4, 4);
                const __m512 xv = _mm512_set1_ps(x);
#pragma GCC unroll 2
                for (int v = 0; v < V; v++)
                    acc[(j * T + t) * V + v] = _mm512_fmadd_ps(wv[v], xv, acc[(j * T + t) * V + v]);
            }
        }
    }
#pragma GCC unroll 2
    for (int v = 0; v < V; v++) {
        const int n = nrows - 16 * v;
        const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            __m512 s = acc[t * V + v];
#pragma GCC unroll 4
            for (int j = 1; j < NA; j++) s = _mm512_add_ps(s, acc[(j * T + t) * V + v]);
            _mm512_mask_storeu_ps(y + t * ldy + 16 * v, m, s);
        }
    }
}

typedef void (*hptile_fn)(const char *pan, size_t pgs, int64_t n_in, const char *a, size_t as, float *y,
                          int64_t ldy, int nrows);

#define HPTILE(V, T, NA)                                                                                        \
    static void hptile_##V##_##T(const char *pan, size_t pgs, int64_t n_in, const char *a, size_t as, float *y, \
                                 int64_t ldy, int nrows)                                                        \
    {                                                                                                           \
        hptile(V, T, NA, pan, pgs, n_in, a, as, y, ldy, nrows);                                                 \
    }
/* decode: one panel (one stream per thread), accumulator sets for 1-3 tokens */
/* macro-built tile tables, laid out by hand */
// clang-format off
HPTILE(1, 1, 4) HPTILE(1, 2, 2) HPTILE(1, 3, 2) HPTILE(1, 4, 1) HPTILE(1, 5, 1) HPTILE(1, 6, 1)
HPTILE(1, 7, 1) HPTILE(1, 8, 1) HPTILE(1, 9, 1) HPTILE(1, 10, 1) HPTILE(1, 11, 1) HPTILE(1, 12, 1)
    // clang-format on
    /* prefill: two panels share each broadcast */
    /* macro-built tile tables, laid out by hand */
    // clang-format off
HPTILE(2, 1, 1) HPTILE(2, 2, 1) HPTILE(2, 3, 1) HPTILE(2, 4, 1) HPTILE(2, 5, 1) HPTILE(2, 6, 1)
HPTILE(2, 7, 1) HPTILE(2, 8, 1) HPTILE(2, 9, 1) HPTILE(2, 10, 1) HPTILE(2, 11, 1) HPTILE(2, 12, 1)
    // clang-format on
    static const hptile_fn hptiles[2][HT + 1] = {{NULL, hptile_1_1, hptile_1_2, hptile_1_3, hptile_1_4, hptile_1_5,
                                                  hptile_1_6, hptile_1_7, hptile_1_8, hptile_1_9, hptile_1_10,
                                                  hptile_1_11, hptile_1_12},
                                                 {NULL, hptile_2_1, hptile_2_2, hptile_2_3, hptile_2_4, hptile_2_5,
                                                  hptile_2_6, hptile_2_7, hptile_2_8, hptile_2_9, hptile_2_10,
                                                  hptile_2_11, hptile_2_12}};

/* Contract of ie_matmul_packed_f16_avx512 (ie_kernels_isa.h). Decode-sized
 * calls (n_tok <= HT): front to back, one panel per tile for up to 3
 * tokens, two from 4 on, so each broadcast feeds two FMAs (the tile is
 * then bound by its FMAs, not its loads: TinyLlama F16, 8 streams, 66 ->
 * 98 t/s). Longer ones: rows
 * in blocks of ~512 KiB of panels (L2), and per block, token blocks of HT or
 * fewer (sizes differ by at most one) against 32-row tiles, so each block's
 * panels come from DRAM once and then from L2. */
void ie_matmul_packed_f16_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) return;
    const size_t pgs = (size_t)m->n_in * 32;
    const char *w = m->data;
    if (n_tok <= HT) {
        const int64_t step = n_tok >= 4 ? 32 : 16;
        for (int64_t r = r0; r < r1; r += step) {
            const int nr = (int)(r1 - r < step ? r1 - r : step);
            hptiles[nr > 16][n_tok](w + (size_t)(r / 16) * pgs, pgs, m->n_in, a, as, y + r, ldy, nr);
        }
        return;
    }
    int64_t P = (int64_t)((512u << 10) / pgs) * 16;
    if (P < 32) P = 32;
    P -= P % 32;
    const int64_t nb = (n_tok + HT - 1) / HT;
    for (int64_t p0 = r0; p0 < r1; p0 += P) {
        const int64_t p1 = p0 + P < r1 ? p0 + P : r1;
        for (int64_t b = 0; b < nb; b++) {
            const int64_t t0 = n_tok * b / nb, t1 = n_tok * (b + 1) / nb;
            for (int64_t r = p0; r < p1; r += 32) {
                const int nr = (int)(p1 - r < 32 ? p1 - r : 32);
                hptiles[nr > 16][t1 - t0](w + (size_t)(r / 16) * pgs, pgs, m->n_in,
                                          (const char *)a + (size_t)t0 * as, as, y + t0 * ldy + r, ldy, nr);
            }
        }
    }
}
