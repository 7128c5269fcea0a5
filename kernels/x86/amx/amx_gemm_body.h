/* amx_gemm_body.h — the AMX-INT8 GEMM over PANEL16 weights (ie_pack.h),
 * written once over tile macros and compiled twice:
 *   kernels/x86/amx/pack_amx.c  the real instructions (-mamx-tile -mamx-int8)
 *   kernels/src/amx_emu.c       a scalar tile emulator (any CPU: the tests;
 *                               its macros in kernels/src/amx_emu_ops.h)
 * The includer defines, before including this file:
 *   IE_AMX_GEMM_NAME            name of the function to define
 *   IE_AMX_CFG(cfg)             ldtilecfg of a 64-byte palette-1 config
 *   IE_AMX_ZERO(t)              tilezero tmm t
 *   IE_AMX_LOAD(t, p, stride)   tileloadd tmm t from p, rows stride bytes apart
 *   IE_AMX_STORE(t, p, stride)  tilestored
 *   IE_AMX_DPBSUD(c, a, b)      tdpbsud: c += a (s8) . b (u8), 4-byte dot products
 *   IE_AMX_DPBSSD(c, a, b)      tdpbssd: c += a (s8) . b (s8)
 *   IE_AMX_DPBUUD(c, a, b)      tdpbuud: c += a (u8) . b (u8)
 *   IE_AMX_GEMM_BF16_NAME       name of the BF16 GEMM to define
 *   IE_AMX_DPBF16PS(c, a, b)    tdpbf16ps: c (f32) += a (bf16 pairs) . b
 *   IE_AMX_MXFP4_NAME           name of the MXFP4 (ROWS) GEMM on the BF16 tiles
 *   IE_AMX_AVX512               (optional) the I4 path's unpack and epilogue,
 *                               and the bf16 route's dequantization, in
 *                               AVX-512 + AVX512_BF16 (else plain C: the
 *                               emulator's build)
 * Tile numbers are literals (the intrinsics take immediates).
 *
 * Shapes. C[m][n] (int32) += sum over quads k of the 4 byte products
 * A[m][4k+i] * B[k][4n+i]: A = 16 tokens x 32 bytes (one block of 32 k of
 * each token), B = 8 quads x 64 bytes, C = 16 tokens x 16 weight rows. A
 * 64-byte PANEL16 chunk (byte 4i+j = row i, k 4c+j) is one B row in this
 * "VNNI" layout, so:
 *   I8W (Q8_0 repacked): the 8 chunks of a block are a B tile as they lie
 *     (tileloadd with stride 64 straight from the panel; no repack). Codes
 *     are u8 = q + 128; the activations are Q16_P (int16; what the AVX-512
 *     and ref kernels read, so the numbers do not change with the ISA),
 *     split per block into a signed high byte and an unsigned low byte,
 *     a = 256*hi + lo: C = 256*tdpbsud(hi, w) + tdpbuud(lo, w), exact.
 *   I4W / I4WA (Q4_0 / Q4_1 repacked): a block's 4 chunks of nibbles are
 *     unpacked into 8 B rows (low nibbles of chunk c = row 2c: k 8c..8c+3;
 *     high = row 2c+1: k 8c+4..8c+7), once per row block of panels and
 *     k-chunk (amx_gemm_i4); the Q8_P activation rows are the A tile as
 *     they lie (stride a_stride). I4W's B is the signed q = u - 8
 *     (tdpbssd: C is the block dot); I4WA's the u8 codes (tdpbsud), its
 *     m*s term added in f32.
 * I8W's code offset leaves the integer domain once: i = C - 128*sum(a).
 * Why the k-slab is one 32-element block (A colsb 32, B 8 rows) and not a
 * full 64-byte tile: every block has its own activation scale per token and
 * its own weight scale per row; a 64-byte slab would add two blocks' int32
 * sums before either scale is applied, which is exact only after
 * requantizing to one scale per 64 (a different, lossier format). So the
 * int32 sums of each block are stored (tilestored, 1 KiB) and scaled in f32
 * like the AVX-512 kernel does. A K=32 tdp costs what a K=64 one does (13
 * TSC cycles either way, one core of a Xeon with AMX), so the int types run
 * at half the tiles' rate at best, and the f32 epilogue (3-4 vector
 * instructions per token row and block) costs more than the tdp: measured
 * there, I4W ran at 0.84x AVX-512 VNNI on one core and 0.92x on four, I8W
 * (two tdps: Q16_P activations split into bytes) at 0.47x, which is why
 * the AMX table keeps the int types on AVX-512 (pack_amx.c). The I4 path
 * was then software-pipelined and its epilogue freed of spills (below),
 * not yet measured on AMX hardware.
 *
 * Order of the loops (I8W; weights must come from L2, not DRAM): for each
 * k-chunk of KC blocks, for each row block of panels (~1 MiB of weights of
 * the chunk), for each token tile of 16 (packed: hi/lo planes, block sums
 * and scales), for each panel, for each block. Later k-chunks add into y.
 *
 * BF16 (AMX-BF16, tdpbf16ps): a BF16 PANEL16 chunk (dword i = the pair
 * w[16p+i][2c], w[2c+1]) is a B row in the pair layout, so 16 chunks (32
 * k) are a B tile as they lie; A = 16 tokens x 32 bf16 straight from the
 * BF16 activation rows; C (f32) accumulates over all of k in the tile (no
 * scales, no epilogue) and is stored once per panel and token tile. With
 * two panels per step (C0, C1 sharing each A tile) one core ran 512 rows x
 * 2048 x 512 tokens at 481 GOP/s against AVX-512's 63-67; the loop now
 * runs two token tiles x two panels (four C tiles, each A and B tile used
 * twice: half the B loads a tdp; not yet measured on AMX). The same GEMM takes
 * I8W / I4W / I4WA and k-quant weights dequantized to bf16 per row block
 * (the "bf16 route", below).
 *
 * Tile configuration is per thread and kept: the first call on a thread
 * (and a call with another token-tail height) runs ldtilecfg; the worker
 * pool's threads live as long as the worker, and no other code in the
 * process uses tiles, so the configuration is never released
 * (tilerelease would only put the tile state back in its init state:
 * context switches of a pool thread then save ~8 KiB less, and the next
 * prefill would configure again; Linux's idle driver releases tiles
 * itself before deep C-states). The rows of A and C are the
 * tokens of the tile (mt <= 16), so a tail tile reads no byte past its
 * tokens.
 */

#include <stdint.h>
#include <string.h>

#define AMX_T 16  /* tokens per tile (A and C rows)                      */
#define AMX_KC 48 /* blocks per k-chunk: the I8W pack is 48 x 1152 bytes */
#define AMX_ROWBLK (1u << 20)

/* tile numbers */
#define AMX_C0 0 /* C: I8W high-byte sums, I4W sums */
#define AMX_C1 1 /* C: I8W low-byte sums            */
#define AMX_A0 2 /* A: tokens (I8W high bytes)      */
#define AMX_A1 3 /* A: I8W low bytes                */
#define AMX_B 4  /* B: one block of one panel       */
#define AMX_B1 5 /* B: the I4 path's second block   */

/* Pack bytes per block: I8W hi[16][32] lo[16][32], then int32 sum[16] and
 * f32 d[16] (every type). */
#define AMX_PK_PLANES (2 * AMX_T * 32)
#define AMX_PK_TAIL (8 * AMX_T)

/* This thread's tile configuration, a key: mt token rows for the int8
 * shapes, amx_configure_bf16's above 63 (0: not configured). */
static _Thread_local int amx_cfg_rows;

/* Configure tmm0..5 for the int8 tiles of mt token rows, unless already
 * so: C0, C1 mt x 16 int32; A0, A1 mt x 32 bytes; B, B1 8 quads x 64. */
static void amx_configure(int mt)
{
    if (amx_cfg_rows == mt) return;
    _Alignas(64) uint8_t cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1; /* palette 1; start_row 0 */
    const uint16_t colsb[6] = {64, 64, 32, 32, 64, 64};
    const uint8_t rows[6] = {(uint8_t)mt, (uint8_t)mt, (uint8_t)mt, (uint8_t)mt, 8, 8};
    for (int t = 0; t < 6; t++) {
        memcpy(cfg + 16 + 2 * t, &colsb[t], 2);
        cfg[48 + t] = rows[t];
    }
    IE_AMX_CFG(cfg);
    amx_cfg_rows = mt;
}

static inline float amx_ldf(const uint8_t *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float amx_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return ie_f16_to_f32(h);
}

/* Pack blocks [kb0, kb1) of mt I8W tokens (Q16_P rows a, a+as, ...): the
 * planes of the int16 quants, their block sums and scales d. */
static void amx_pack(const uint8_t *a, size_t as, int64_t n_in, int mt, int64_t kb0, int64_t kb1, uint8_t *pk)
{
    const size_t blk = AMX_PK_PLANES + AMX_PK_TAIL;
    for (int t = 0; t < mt; t++) {
        const uint8_t *row = a + (size_t)t * as;
        const uint8_t *dp = row + 2 * (size_t)n_in;
        for (int64_t b = kb0; b < kb1; b++) {
            uint8_t *p = pk + (size_t)(b - kb0) * blk;
            int32_t sum = 0;
            int8_t *hi = (int8_t *)p + 32 * t;
            uint8_t *lo = p + AMX_T * 32 + 32 * t;
            for (int j = 0; j < 32; j++) {
                int16_t q;
                memcpy(&q, row + 2 * (32 * b + j), 2);
                hi[j] = (int8_t)(q >> 8); /* arithmetic: a = 256*hi + lo */
                lo[j] = (uint8_t)(q & 0xff);
                sum += q;
            }
            p += AMX_PK_PLANES;
            memcpy(p + 4 * t, &sum, 4);
            memcpy(p + 4 * AMX_T + 4 * t, dp + 4 * b, 4);
        }
    }
}

/* I8W: one panel (16 rows) x mt tokens over blocks [kb0, kb1) (pk: their
 * pack): y rows of the panel that exist (nr) and the tile's tokens, stored
 * when first, else added. isums (tests): the exact block dots,
 * [t][row][block], ldr rows and nbt blocks per token. Groups of one block
 * (repacked Q8_0) fold the weight scale into the block's: acc += i * (d_a *
 * d_w); wider groups sum i * d_a per group first, as the AVX-512 kernel. */
static void amx_panel(const uint8_t *panel, size_t gb, int64_t bpg, int64_t kb0, int64_t kb1, const uint8_t *pk,
                      int mt, float *y, int64_t ldy, int nr, int first, int32_t *isums, int64_t ldr, int64_t nbt)
{
    const size_t blk = AMX_PK_PLANES + AMX_PK_TAIL;
    _Alignas(64) int32_t c0[AMX_T][16], c1[AMX_T][16];
    _Alignas(64) float acc[AMX_T][16], gacc[AMX_T][16], wd[16], da[AMX_T];
    int32_t corr[AMX_T];
    memset(acc, 0, sizeof acc);
    int64_t b = kb0;
    while (b < kb1) {
        const int64_t g = b / bpg, e = (g + 1) * bpg < kb1 ? (g + 1) * bpg : kb1;
        const uint8_t *gp = panel + (size_t)g * gb;
        for (int r = 0; r < 16; r++) wd[r] = amx_f16(gp + 2 * r);
        for (int64_t k = b; k < e; k++) {
            const uint8_t *q = gp + 32 + (size_t)(k - g * bpg) * 512;
            const uint8_t *p = pk + (size_t)(k - kb0) * blk;
            IE_AMX_ZERO(AMX_C0);
            IE_AMX_ZERO(AMX_C1);
            IE_AMX_LOAD(AMX_B, q, 64);
            IE_AMX_LOAD(AMX_A0, p, 32);
            IE_AMX_LOAD(AMX_A1, p + AMX_T * 32, 32);
            IE_AMX_DPBSUD(AMX_C0, AMX_A0, AMX_B);
            IE_AMX_DPBUUD(AMX_C1, AMX_A1, AMX_B);
            IE_AMX_STORE(AMX_C1, c1, 64);
            IE_AMX_STORE(AMX_C0, c0, 64);
            p += AMX_PK_PLANES;
            for (int t = 0; t < mt; t++) {
                int32_t sum;
                memcpy(&sum, p + 4 * t, 4);
                corr[t] = -128 * sum;
                da[t] = amx_ldf(p + 4 * AMX_T + 4 * t);
            }
            /* the exact block dot: 256*hi + lo - 128*sum(a), |.| < 2^29;
             * in wrapping 32-bit arithmetic: a tile a faulting op left
             * unwritten (the emulator goes on where the CPU would trap)
             * must not make it undefined */
#define AMX_DOT(t, r) ((int32_t)(256u * (uint32_t)c0[t][r] + (uint32_t)c1[t][r] + (uint32_t)corr[t]))
            if (isums)
                for (int t = 0; t < mt; t++)
                    for (int r = 0; r < nr; r++) isums[((int64_t)t * ldr + r) * nbt + k] = AMX_DOT(t, r);
            for (int t = 0; t < mt; t++) {
                const float s = da[t];
                if (bpg == 1)
                    for (int r = 0; r < 16; r++) acc[t][r] += (float)AMX_DOT(t, r) * (s * wd[r]);
                else if (k == b)
                    for (int r = 0; r < 16; r++) gacc[t][r] = (float)AMX_DOT(t, r) * s;
                else
                    for (int r = 0; r < 16; r++) gacc[t][r] += (float)AMX_DOT(t, r) * s;
            }
#undef AMX_DOT
        }
        if (bpg > 1)
            for (int t = 0; t < mt; t++)
                for (int r = 0; r < 16; r++) acc[t][r] += gacc[t][r] * wd[r];
        b = e;
    }
    for (int t = 0; t < mt; t++) {
        float *yt = y + (int64_t)t * ldy;
        for (int r = 0; r < nr; r++) yt[r] = first ? acc[t][r] : yt[r] + acc[t][r];
    }
}

/* ------------------------------------------------------------ I4W / I4WA */

/* The I4 path (Q4_0 / Q4_1 repacked): for each k-chunk of AMX_KC4 blocks
 * and row block of AMX_RB4 panels, the panels' blocks are unpacked once
 * into B tiles (signed nibble - 8 for I4W, tdpbssd: the block dot is C
 * itself; unsigned for I4WA, tdpbsud) with their scales in f32; then each
 * token tile runs over the row block's panels, two blocks at a time on
 * two C tiles, and the f32 epilogue of a block, acc[t] += C[t] * (dw *
 * da[t]) (+ mw * s[t] for I4WA), keeps the tile's 16 accumulators in
 * registers (AVX-512) while the next blocks' tile work runs. Unpacking per
 * row block rather than per (panel, token tile), and the AVX-512 epilogue,
 * took one core from 47 to 247 GOP/s (512 tokens; AVX-512 VNNI: 292). */
#define AMX_KC4 32 /* blocks per k-chunk                                   */
#define AMX_RB4 8  /* panels per row block: 8 x 32 x 512 B = 128 KiB of B */

/* Unpack block q (4 chunks of 64 nibble pairs) into B's 8 rows (low
 * nibbles of chunk c = row 2c, high = row 2c+1), minus off. */
static void amx_unpack4(const uint8_t *q, uint8_t *ub, int off)
{
#ifdef IE_AMX_AVX512
    const __m512i m = _mm512_set1_epi8(0x0f), o = _mm512_set1_epi8((char)off);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
        _mm512_store_si512((void *)(ub + 128 * c), _mm512_sub_epi8(_mm512_and_si512(v, m), o));
        _mm512_store_si512((void *)(ub + 128 * c + 64),
                           _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m), o));
    }
#else
    for (int c = 0; c < 4; c++)
        for (int x = 0; x < 64; x++) {
            ub[128 * c + x] = (uint8_t)((q[64 * c + x] & 0x0f) - off);
            ub[128 * c + 64 + x] = (uint8_t)((q[64 * c + x] >> 4) - off);
        }
#endif
}

/* One token tile (mt tokens, activation rows at, as apart; daT/sT: their
 * block scales and sums [kc][16]) x one unpacked panel (ub: kc blocks,
 * dw/mw: [kc][16]): the panel's nr rows of y, stored when first, else
 * added. isums (tests): the exact block dots, [t][row][block].
 * Software-pipelined by pairs of blocks: the tdps of a pair are issued
 * before the f32 epilogue of the previous pair (read from the other half
 * of cb), and their C tiles stored after it, so the tiles work while the
 * vector units scale. */
static void amx_i4_tile(int affine, const uint8_t *ub, const float *dw, const float *mw, int kc, int64_t kb0,
                        const uint8_t *at, size_t as, const float *daT, const float *sT, int mt, float *y,
                        int64_t ldy, int nr, int first, int32_t *isums, int64_t ldr, int64_t nbt)
{
    _Alignas(64) int32_t cb[2][2][AMX_T][16]; /* [pair parity][block of the pair] */
    _Alignas(64) float acc[AMX_T][16];
#define AMX_X16(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#ifdef IE_AMX_AVX512
    const int vec = mt == AMX_T;
#define AMX_ACC(t) __m512 acc##t = _mm512_setzero_ps();
    AMX_X16(AMX_ACC);
#undef AMX_ACC
#else
    const int vec = 0;
#endif
    if (!vec) memset(acc, 0, sizeof acc);
        /* the epilogue of the pair at block kp (its C tiles in cb[(kp / 2) & 1]) */
#define AMX_I4_EPI(kp)                                                                                 \
    for (int h = 0; h < 2 && (kp) + h < kc; h++) {                                                     \
        const int kk = (kp) + h;                                                                       \
        int32_t(*c)[16] = cb[((kp) / 2) & 1][h];                                                       \
        const float *d = daT + 16 * kk, *sv = sT + 16 * kk;                                            \
        if (isums)                                                                                     \
            for (int t = 0; t < mt; t++)                                                               \
                for (int r = 0; r < nr; r++) isums[((int64_t)t * ldr + r) * nbt + kb0 + kk] = c[t][r]; \
        if (vec) {                                                                                     \
            AMX_I4_EPI_VEC;                                                                            \
            continue;                                                                                  \
        }                                                                                              \
        for (int t = 0; t < mt; t++)                                                                   \
            for (int r = 0; r < 16; r++)                                                               \
                acc[t][r] += (float)c[t][r] * (dw[16 * kk + r] * d[t]) +                               \
                             (affine ? mw[16 * kk + r] * sv[t] : 0.0f);                                \
    }
#ifdef IE_AMX_AVX512
/* affine tested once per block, not per row: inside the row sequence it
 * made GCC 12 compute all 16 rows before the branch and spill */
#define AMX_EPI(t)                                                                      \
    acc##t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)c[t])), \
                             _mm512_mul_ps(vdw, _mm512_set1_ps(d[t])), acc##t);
#define AMX_EPI_M(t) acc##t = _mm512_fmadd_ps(vmw, _mm512_set1_ps(sv[t]), acc##t);
#define AMX_I4_EPI_VEC                                   \
    const __m512 vdw = _mm512_load_ps(dw + 16 * kk);     \
    AMX_X16(AMX_EPI)                                     \
    if (affine) {                                        \
        const __m512 vmw = _mm512_load_ps(mw + 16 * kk); \
        AMX_X16(AMX_EPI_M)                               \
    }
#else
#define AMX_I4_EPI_VEC
#endif
    for (int k = 0; k < kc + 2; k += 2) {
        if (k < kc) { /* the tdps of the pair at k */
            IE_AMX_ZERO(AMX_C0);
            IE_AMX_LOAD(AMX_A0, at + 32 * (size_t)(kb0 + k), as);
            IE_AMX_LOAD(AMX_B, ub + 512 * (size_t)k, 64);
            if (affine) IE_AMX_DPBSUD(AMX_C0, AMX_A0, AMX_B);
            else IE_AMX_DPBSSD(AMX_C0, AMX_A0, AMX_B);
            if (k + 1 < kc) {
                IE_AMX_ZERO(AMX_C1);
                IE_AMX_LOAD(AMX_A1, at + 32 * (size_t)(kb0 + k + 1), as);
                IE_AMX_LOAD(AMX_B1, ub + 512 * (size_t)(k + 1), 64);
                if (affine) IE_AMX_DPBSUD(AMX_C1, AMX_A1, AMX_B1);
                else IE_AMX_DPBSSD(AMX_C1, AMX_A1, AMX_B1);
            }
        }
        if (k > 0) AMX_I4_EPI(k - 2) /* the previous pair's epilogue */
        if (k < kc) {
            IE_AMX_STORE(AMX_C0, cb[(k / 2) & 1][0], 64);
            if (k + 1 < kc) IE_AMX_STORE(AMX_C1, cb[(k / 2) & 1][1], 64);
        }
    }
#ifdef IE_AMX_AVX512
    if (vec) {
#define AMX_OUT(t) _mm512_store_ps(acc[t], acc##t);
        AMX_X16(AMX_OUT);
#undef AMX_OUT
    }
#endif
#undef AMX_I4_EPI
#undef AMX_I4_EPI_VEC
#undef AMX_EPI
#undef AMX_EPI_M
#undef AMX_X16
    for (int t = 0; t < mt; t++) {
        float *yt = y + (int64_t)t * ldy;
        for (int r = 0; r < nr; r++) yt[r] = first ? acc[t][r] : yt[r] + acc[t][r];
    }
}

/* The I4 path of IE_AMX_GEMM_NAME (same arguments, checked). */
static void amx_gemm_i4(const ie_pmat_t *m, int64_t r0, int64_t r1, const uint8_t *act, size_t as, int64_t n_tok,
                        float *y, int64_t ldy, int32_t *isums)
{
    const int affine = m->dtype == IE_DTYPE_I4WA;
    const int64_t n_in = m->n_in, nb = n_in / 32, bpg = m->group / 32;
    const size_t pb = ie_pack_panel_bytes(m->dtype, m->group, n_in), gb = pb / (size_t)(n_in / m->group);
    const size_t hdr = affine ? 64 : 32;
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    _Alignas(64) uint8_t ub[AMX_RB4][AMX_KC4][512];
    _Alignas(64) float dw[AMX_RB4][AMX_KC4][16], mw[AMX_RB4][AMX_KC4][16], daT[AMX_KC4][16], sT[AMX_KC4][16];
    for (int64_t kb0 = 0; kb0 < nb; kb0 += AMX_KC4) {
        const int kc = (int)(nb - kb0 < AMX_KC4 ? nb - kb0 : AMX_KC4);
        for (int64_t q0 = p0; q0 < p1; q0 += AMX_RB4) {
            const int np = (int)(p1 - q0 < AMX_RB4 ? p1 - q0 : AMX_RB4);
            for (int i = 0; i < np; i++) {
                const uint8_t *panel = m->data + (size_t)(q0 + i) * pb;
                for (int k = 0; k < kc; k++) {
                    const int64_t b = kb0 + k, g = b / bpg;
                    const uint8_t *gp = panel + (size_t)g * gb;
                    amx_unpack4(gp + hdr + (size_t)(b - g * bpg) * 256, ub[i][k], affine ? 0 : 8);
                    for (int r = 0; r < 16; r++) {
                        dw[i][k][r] = amx_f16(gp + 2 * r);
                        mw[i][k][r] = affine ? amx_f16(gp + 32 + 2 * r) : 0.0f;
                    }
                }
            }
            for (int64_t t0 = 0; t0 < n_tok; t0 += AMX_T) {
                const int mt = n_tok - t0 < AMX_T ? (int)(n_tok - t0) : AMX_T;
                const uint8_t *at = act + (size_t)t0 * as;
                /* the tokens' block scales and sums, transposed: [block][token] */
                memset(daT, 0, sizeof daT);
                memset(sT, 0, sizeof sT);
                for (int t = 0; t < mt; t++) {
                    const uint8_t *dp = at + (size_t)t * as + (size_t)n_in;
                    for (int k = 0; k < kc; k++) {
                        daT[k][t] = amx_ldf(dp + 4 * (size_t)(kb0 + k));
                        if (affine) sT[k][t] = amx_ldf(dp + 4 * (size_t)(nb + kb0 + k));
                    }
                }
                amx_configure(mt);
                for (int i = 0; i < np; i++) {
                    const int64_t p = q0 + i, rows = r1 - p * IE_PANEL;
                    const int nr = rows < IE_PANEL ? (int)rows : IE_PANEL;
                    int32_t *is = isums ? isums + ((t0 * (r1 - r0)) + (p * IE_PANEL - r0)) * nb : NULL;
                    amx_i4_tile(affine, ub[i][0], dw[i][0], mw[i][0], kc, kb0, at, as, daT[0], sT[0], mt,
                                y + t0 * ldy + p * IE_PANEL, ldy, nr, kb0 == 0, is, r1 - r0, nb);
                }
            }
        }
    }
}

/* The AMX GEMM (contract in ie_kernels_isa.h: ie_amx_gemm_hw / _emu). */
ie_status_t IE_AMX_GEMM_NAME(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy, int32_t *isums)
{
    if (!m || !m->data || !a || !y || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || r0 < 0 ||
        r0 % IE_PANEL != 0 || r1 < r0 || r1 > m->n_out || (r1 != m->n_out && r1 % IE_PANEL != 0) || n_tok < 0)
        return IE_ERR_INVAL;
    if (!ie_dtype_is_intw(m->dtype)) return IE_ERR_UNSUPPORTED;
    if (r0 == r1 || n_tok == 0) return IE_OK;
    if (m->dtype != IE_DTYPE_I8W) {
        amx_gemm_i4(m, r0, r1, a, a_stride, n_tok, y, ldy, isums);
        return IE_OK;
    }
    const int64_t n_in = m->n_in, nb = n_in / 32, bpg = m->group / 32;
    const size_t pb = ie_pack_panel_bytes(m->dtype, m->group, n_in);
    const size_t gb = pb / (size_t)(n_in / m->group);
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    _Alignas(64) uint8_t pk[AMX_KC * (AMX_PK_PLANES + AMX_PK_TAIL)];
    const uint8_t *w = m->data, *act = a;
    for (int64_t kb0 = 0; kb0 < nb; kb0 += AMX_KC) {
        const int64_t kb1 = kb0 + AMX_KC < nb ? kb0 + AMX_KC : nb;
        /* panels per row block: their chunk's weights ~ AMX_ROWBLK bytes */
        int64_t rb = (int64_t)(AMX_ROWBLK / ((size_t)(kb1 - kb0) * 512 + 1));
        if (rb < 1) rb = 1;
        for (int64_t q0 = p0; q0 < p1; q0 += rb) {
            const int64_t q1 = q0 + rb < p1 ? q0 + rb : p1;
            for (int64_t t0 = 0; t0 < n_tok; t0 += AMX_T) {
                const int mt = n_tok - t0 < AMX_T ? (int)(n_tok - t0) : AMX_T;
                amx_pack(act + (size_t)t0 * a_stride, a_stride, n_in, mt, kb0, kb1, pk);
                amx_configure(mt);
                for (int64_t p = q0; p < q1; p++) {
                    const int64_t rows = r1 - p * IE_PANEL;
                    const int nr = rows < IE_PANEL ? (int)rows : IE_PANEL;
                    int32_t *is = isums ? isums + ((t0 * (r1 - r0)) + (p * IE_PANEL - r0)) * nb : NULL;
                    amx_panel(w + (size_t)p * pb, gb, bpg, kb0, kb1, pk, mt, y + t0 * ldy + p * IE_PANEL, ldy, nr,
                              kb0 == 0, is, r1 - r0, nb);
                }
            }
        }
    }
    return IE_OK;
}

/* ------------------------------------- the int types on the BF16 tiles */

/* A second route for the int types and the only one for the k-quants
 * (IE_AMX_INT=bf16): each row block of panels is dequantized once into the
 * BF16 PANEL16 layout (the value of
 * every code, bit for bit ie_pack_dequant_row's f32, rounded to bf16), and
 * the BF16 tile loop below runs over it with BF16 activation rows. The
 * block scales are then inside B, so C accumulates over the whole of k
 * with no per-block f32 epilogue (what held the int8 tiles at or below
 * VNNI, above); the cost is the unpack, once per row block and step, and
 * the bf16 rounding of weights and activations (the BF16 models' own
 * precision). */

/* One dequantized panel: n_in k in 16 rows of bf16. */
#define AMX_UB_PANEL(n_in) ((size_t)(n_in)*32)

#ifdef IE_AMX_AVX512
/* the rounding of the explicit-rounding forms: a constant expression (clang) */
#define AMX_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* 32 codes of one pair row (c32: the int8 codes of rows 0..15, two each,
 * in order) to 32 bf16 values: v = code * s, then + mo (op 1), - mo (op
 * -1) or nothing (op 0); s / mo hold each row's factor and term twice
 * ([0]: rows 0..7, [1]: rows 8..15). Explicit rounding keeps mul and add
 * apart (no fma: ref's f32 formula, one rounding each). */
static inline __m512i amx_pair_bf16(__m256i c32, const __m512 *s, const __m512 *mo, int op)
{
    __m512 fl = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c32)));
    __m512 fh = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(c32, 1)));
    fl = _mm512_mul_round_ps(fl, s[0], AMX_RN);
    fh = _mm512_mul_round_ps(fh, s[1], AMX_RN);
    if (op > 0) {
        fl = _mm512_add_round_ps(fl, mo[0], AMX_RN);
        fh = _mm512_add_round_ps(fh, mo[1], AMX_RN);
    } else if (op < 0) {
        fl = _mm512_sub_round_ps(fl, mo[0], AMX_RN);
        fh = _mm512_sub_round_ps(fh, mo[1], AMX_RN);
    }
    /* round to nearest even; the values are normal or zero (f16 scales
     * times small integers), so the instruction's flush of denormals never
     * acts */
    return (__m512i)_mm512_cvtne2ps_pbh(fh, fl);
}

/* v's 16 per-row values, each twice: out[0] rows 0..7, out[1] rows 8..15. */
static inline void amx_twice(__m512 v, __m512 out[2])
{
    const __m512i il = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    out[0] = _mm512_permutexvar_ps(il, v);
    out[1] = _mm512_permutexvar_ps(_mm512_add_epi32(il, _mm512_set1_epi32(8)), v);
}

/* The pair rows 2c, 2c+1 of quad chunk U (byte 4i+j: row i, k 4c+j) at o. */
static inline void amx_quad_bf16(__m512i U, const __m512 *s, const __m512 *mo, int op, __m512i *o)
{
    _mm512_store_si512(o, amx_pair_bf16(_mm512_cvtepi32_epi16(U), s, mo, op));
    _mm512_store_si512(o + 1, amx_pair_bf16(_mm512_cvtepi32_epi16(_mm512_srli_epi32(U, 16)), s, mo, op));
}

/* I8W / I4W / I4WA panel to bf16 (amx_unpack_bf16's contract). */
static void amx_unpack_intw(ie_dtype_t t, int G, int64_t n_in, const uint8_t *panel, uint8_t *out)
{
    const int i8 = t == IE_DTYPE_I8W, aff = t == IE_DTYPE_I4WA;
    const size_t hdr = aff ? 64 : 32, qb = i8 ? 512 : 256; /* scales; quants of one 32-block */
    const size_t gb = hdr + (size_t)(G / 32) * qb;
    const __m512i m4 = _mm512_set1_epi8(0x0f), off = _mm512_set1_epi8(aff ? 0 : 8);
    for (int64_t g = 0; g < n_in / G; g++) {
        const uint8_t *gp = panel + (size_t)g * gb;
        __m512 s[2], mo[2];
        amx_twice(_mm512_cvtph_ps(_mm256_loadu_si256((const void *)gp)), s);
        amx_twice(aff ? _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(gp + 32))) : _mm512_setzero_ps(), mo);
        for (int b = 0; b < G / 32; b++) {
            const uint8_t *q = gp + hdr + (size_t)b * qb;
            __m512i *o = (__m512i *)(void *)(out + ((size_t)g * G + 32 * (size_t)b) * 32);
            if (i8) /* chunk c: k 4c..4c+3, u8 = q + 128 */
                for (int c = 0; c < 8; c++)
                    amx_quad_bf16(_mm512_xor_si512(_mm512_loadu_si512((const void *)(q + 64 * c)),
                                                   _mm512_set1_epi8((char)0x80)),
                                  s, mo, 0, o + 2 * c);
            else /* chunk c: low nibbles k 8c..8c+3, high 8c+4..8c+7 (u < 16: int8 either way) */
                for (int c = 0; c < 4; c++) {
                    const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
                    amx_quad_bf16(_mm512_sub_epi8(_mm512_and_si512(v, m4), off), s, mo, aff, o + 4 * c);
                    amx_quad_bf16(_mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), off), s, mo, aff,
                                  o + 4 * c + 2);
                }
        }
    }
}

/* The 8 quad chunks of one 32-k slab of k-quant codes (U[c]: byte 4i+j =
 * the code of row i, k 4c+j) from its planes (ie_kq_panel_t: nibbles,
 * crumbs, bits; pack_ref.c's kq_put_row writes them). */
static inline void amx_kq_quads(const ie_kq_panel_t *g, const uint8_t *slab, __m512i U[8])
{
    const int b = g->info.bits;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3), m1 = _mm512_set1_epi8(1);
    for (int c = 0; c < 8; c++) U[c] = _mm512_setzero_si512();
    if (b >= 4)
        for (int ch = 0; ch < 4; ch++) { /* low nibble: k 8ch + j, high: 8ch + 4 + j */
            const __m512i v = _mm512_loadu_si512((const void *)(slab + g->nib + 64 * (size_t)ch));
            U[2 * ch] = _mm512_and_si512(v, m4);
            U[2 * ch + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
    if (b == 2 || b == 3 || b == 6) { /* crumb t of chunk ch: k 16ch + 4t + j */
        const int sh = b == 6 ? 4 : 0;
        for (int ch = 0; ch < 2; ch++) {
            const __m512i v = _mm512_loadu_si512((const void *)(slab + g->crumb + 64 * (size_t)ch));
            for (int t = 0; t < 4; t++) {
                const __m512i x = _mm512_and_si512(_mm512_srli_epi16(v, (unsigned)(2 * t)), m2);
                U[4 * ch + t] = _mm512_or_si512(U[4 * ch + t], _mm512_slli_epi16(x, (unsigned)sh));
            }
        }
    }
    if (b == 3 || b == 5) { /* bit t: k 4t + j */
        const int pos = b == 3 ? 2 : 4;
        const __m512i v = _mm512_loadu_si512((const void *)(slab + g->bit));
        for (int t = 0; t < 8; t++) {
            const __m512i x = _mm512_and_si512(_mm512_srli_epi16(v, (unsigned)t), m1);
            U[t] = _mm512_or_si512(U[t], _mm512_slli_epi16(x, (unsigned)pos));
        }
    }
}

/* A k-quant panel to bf16 (amx_unpack_bf16's contract): per block the
 * row factors d (the 32-element types) or d * sc[j] and terms dmin *
 * mn[j] (Q2_K, Q4_K, Q5_K: subtracted) or m (Q5_1: added) in f32, the
 * codes minus their offset or through their code book, ie_kq_value's formula
 * in its order. */
static void amx_unpack_kq(ie_dtype_t t, const ie_kq_panel_t *g, int64_t n_in, const uint8_t *panel, uint8_t *out)
{
    const ie_kq_info_t *in = &g->info;
    const int qk = in->qk, nsub = in->nsub;
    const int8_t *book = ie_kq_book(t);
    const int op = t == IE_DTYPE_Q5_1 ? 1 : in->has_mn ? -1 : 0;
    const __m512i off = _mm512_set1_epi8((char)(t == IE_DTYPE_Q5_0   ? 16
                                                : t == IE_DTYPE_Q3_K ? 4
                                                : t == IE_DTYPE_Q6_K ? 32
                                                                     : 0));
    const __m512i tbl = book ? _mm512_broadcast_i32x4(_mm_loadu_si128((const void *)book)) : _mm512_setzero_si512();
    for (int64_t bi = 0; bi < n_in / qk; bi++) {
        const uint8_t *bp = panel + (size_t)bi * g->block;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(bp + g->d)));
        const __m512 dm = in->has_dmin ? _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(bp + g->dmin)))
                                       : _mm512_setzero_ps();
        __m512 s[2], mo[2]; /* the 32-element types' (no sub-blocks); replaced per sub-block */
        int cur = -1;
        amx_twice(d, s);
        amx_twice(dm, mo);
        for (int sl = 0; sl < qk / 32; sl++) {
            __m512i U[8];
            amx_kq_quads(g, bp + g->codes + (size_t)sl * g->slab, U);
            for (int c = 0; c < 8; c++) /* every value fits int8 */
                U[c] = book ? _mm512_shuffle_epi8(tbl, U[c]) : _mm512_sub_epi8(U[c], off);
            __m512i *o = (__m512i *)(void *)(out + ((size_t)bi * qk + 32 * (size_t)sl) * 32);
            for (int c = 0; c < 8; c++) {
                const int j = nsub == 16 ? 2 * sl + (c >= 4) : sl; /* sub-block of k 4c.. */
                if (nsub && j != cur) {
                    const __m512 sc = _mm512_cvtepi32_ps(
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(bp + g->sc + 16 * (size_t)j))));
                    amx_twice(_mm512_mul_round_ps(d, sc, AMX_RN), s);
                    if (in->has_mn) {
                        const __m512 mn = _mm512_cvtepi32_ps(
                            _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(bp + g->mn + 16 * (size_t)j))));
                        amx_twice(_mm512_mul_round_ps(dm, mn, AMX_RN), mo);
                    } else {
                        amx_twice(_mm512_setzero_ps(), mo);
                    }
                    cur = j;
                }
                amx_quad_bf16(U[c], s, mo, op, o + 2 * c);
            }
        }
    }
}
#endif

/* Panel p of m (I8W, I4W, I4WA or a k-quant; its bytes at panel)
 * dequantized to BF16 PANEL16 bytes at out (AMX_UB_PANEL(m->n_in)): pair chunk c (k 2c, 2c+1) at out +
 * 64c, dword i = row i; each value ie_pack_dequant_row's, rounded as
 * ie_f32_to_bf16 does (rows past n_out: zeros in the plain build, their
 * stored fields' values in the AVX-512 one; no caller reads them). The
 * plain build computes exactly that, row by row through tmp (n_in
 * floats): the AVX-512 one is tested against it bit for bit. */
static void amx_unpack_bf16(const ie_pmat_t *m, int64_t p, const uint8_t *panel, uint8_t *out, float *tmp)
{
#ifdef IE_AMX_AVX512
    (void)tmp;
    ie_kq_panel_t g;
    if (ie_dtype_is_intw(m->dtype)) amx_unpack_intw(m->dtype, m->group, m->n_in, panel, out);
    else if (ie_kq_panel(m->dtype, &g) == 0) amx_unpack_kq(m->dtype, &g, m->n_in, panel, out);
#else
    (void)panel;
    for (int r = 0; r < IE_PANEL; r++) {
        const int64_t row = p * IE_PANEL + r;
        if (row < m->n_out) ie_pack_dequant_row(m, row, tmp);
        else memset(tmp, 0, sizeof(float) * (size_t)m->n_in);
        for (int64_t k = 0; k < m->n_in; k++) {
            const ie_bf16_t h = ie_f32_to_bf16(tmp[k]);
            memcpy(out + (size_t)(k / 2) * 64 + 4 * (size_t)r + 2 * (size_t)(k & 1), &h, 2);
        }
    }
#endif
}

/* The BF16 loop's tiles: C[token tile v][panel h] = tmm 2v + h, A of token
 * tile v = tmm 4 + v, B of panel h = tmm 6 + h. */
#define AMX_BC00 0
#define AMX_BC01 1
#define AMX_BC10 2
#define AMX_BC11 3
#define AMX_BA0 4
#define AMX_BA1 5
#define AMX_BB0 6
#define AMX_BB1 7

/* OP (IE_AMX_LOAD or IE_AMX_STORE) on C tile (v, h) of the BF16 loop, at p
 * with rows s bytes apart (tile numbers are immediates). */
#define AMX_BC_AT(OP, v, h, p, s)             \
    do {                                      \
        if (!(v) && !(h)) OP(AMX_BC00, p, s); \
        else if (!(v)) OP(AMX_BC01, p, s);    \
        else if (!(h)) OP(AMX_BC10, p, s);    \
        else OP(AMX_BC11, p, s);              \
    } while (0)

/* Configure the BF16 loop's eight tiles for token tiles of mt0 and mt1
 * rows (mt1 0: the second token tile's A and C tiles left unconfigured),
 * unless already so. */
static void amx_configure_bf16(int mt0, int mt1)
{
    const int key = 64 + 17 * mt0 + mt1; /* above the int8 keys (mt <= 16) */
    if (amx_cfg_rows == key) return;
    _Alignas(64) uint8_t cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    const uint8_t rows[8] = {(uint8_t)mt0, (uint8_t)mt0, (uint8_t)mt1, (uint8_t)mt1,
                             (uint8_t)mt0, (uint8_t)mt1, 16,           16};
    for (int t = 0; t < 8; t++) {
        const uint16_t cb = rows[t] ? 64 : 0;
        memcpy(cfg + 16 + 2 * t, &cb, 2);
        cfg[48 + t] = rows[t];
    }
    IE_AMX_CFG(cfg);
    amx_cfg_rows = key;
}

/* The BF16 tile loop over panels [q0, q1) (panel p's BF16 PANEL16 bytes at
 * w + (p - q0) * pb, ns k-slabs of 32; act: the rows' first k of those
 * slabs): two token tiles x two panels per step, four C tiles over the ns
 * slabs, each A and B tile loaded once for two tdps (the 1x2 loop it
 * replaces loaded a B tile for every tdp, and the B tiles come from L2:
 * 481 GOP/s on one core was ~18% of the tdp rate), each C stored into y
 * once; acc: C starts from y (the sums of earlier slabs), else from 0. */
static void amx_bf16_rows(const uint8_t *w, size_t pb, int64_t q0, int64_t q1, int64_t r1, int64_t ns,
                          const uint8_t *act, size_t a_stride, int64_t n_tok, float *y, int64_t ldy, int acc)
{
    _Alignas(64) float c[AMX_T][16];
    for (int64_t t0 = 0; t0 < n_tok; t0 += 2 * AMX_T) {
        const int mt0 = n_tok - t0 < AMX_T ? (int)(n_tok - t0) : AMX_T;
        const int64_t left = n_tok - t0 - AMX_T;
        const int mt1 = left <= 0 ? 0 : left < AMX_T ? (int)left : AMX_T;
        const uint8_t *a0 = act + (size_t)t0 * a_stride, *a1 = a0 + AMX_T * a_stride;
        amx_configure_bf16(mt0, mt1);
        for (int64_t p = q0; p < q1; p += 2) {
            const int two = p + 1 < q1, both = mt1 > 0;
            const uint8_t *panel = w + (size_t)(p - q0) * pb;
            if (!acc) {
                IE_AMX_ZERO(AMX_BC00);
                if (two) IE_AMX_ZERO(AMX_BC01);
                if (both) IE_AMX_ZERO(AMX_BC10);
                if (both && two) IE_AMX_ZERO(AMX_BC11);
            } else { /* the sums of the earlier k-slabs, from y */
                for (int v = 0; v <= both; v++)
                    for (int h = 0; h <= two; h++) {
                        const int64_t rows = r1 - (p + h) * IE_PANEL;
                        const int nr = rows < IE_PANEL ? (int)rows : IE_PANEL, mt = v ? mt1 : mt0;
                        const float *yp = y + (t0 + AMX_T * v) * ldy + (p + h) * IE_PANEL;
                        const float *src = yp;
                        size_t ss = (size_t)ldy * sizeof(float);
                        if (nr < IE_PANEL) {
                            memset(c, 0, sizeof c);
                            for (int t = 0; t < mt; t++)
                                memcpy(c[t], yp + (int64_t)t * ldy, sizeof(float) * (size_t)nr);
                            src = &c[0][0];
                            ss = sizeof c[0];
                        }
                        AMX_BC_AT(IE_AMX_LOAD, v, h, src, ss);
                    }
            }
            for (int64_t k = 0; k < ns; k++) {
                IE_AMX_LOAD(AMX_BA0, a0 + 64 * (size_t)k, a_stride);
                IE_AMX_LOAD(AMX_BB0, panel + 1024 * (size_t)k, 64);
                IE_AMX_DPBF16PS(AMX_BC00, AMX_BA0, AMX_BB0);
                if (two) {
                    IE_AMX_LOAD(AMX_BB1, panel + pb + 1024 * (size_t)k, 64);
                    IE_AMX_DPBF16PS(AMX_BC01, AMX_BA0, AMX_BB1);
                }
                if (both) {
                    IE_AMX_LOAD(AMX_BA1, a1 + 64 * (size_t)k, a_stride);
                    IE_AMX_DPBF16PS(AMX_BC10, AMX_BA1, AMX_BB0);
                    if (two) IE_AMX_DPBF16PS(AMX_BC11, AMX_BA1, AMX_BB1);
                }
            }
            for (int v = 0; v <= both; v++)
                for (int h = 0; h <= two; h++) {
                    const int64_t rows = r1 - (p + h) * IE_PANEL;
                    const int nr = rows < IE_PANEL ? (int)rows : IE_PANEL, mt = v ? mt1 : mt0;
                    float *yp = y + (t0 + AMX_T * v) * ldy + (p + h) * IE_PANEL;
                    float *dst = nr == IE_PANEL ? yp : &c[0][0];
                    const size_t ds = nr == IE_PANEL ? (size_t)ldy * sizeof(float) : sizeof c[0];
                    AMX_BC_AT(IE_AMX_STORE, v, h, dst, ds);
                    if (nr < IE_PANEL)
                        for (int t = 0; t < mt; t++)
                            memcpy(yp + (int64_t)t * ldy, c[t], sizeof(float) * (size_t)nr);
                }
        }
    }
}

/* The AMX-BF16 GEMM (contract in ie_kernels_isa.h: ie_amx_gemm_bf16_*). */
ie_status_t IE_AMX_GEMM_BF16_NAME(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                  int64_t n_tok, float *y, int64_t ldy)
{
    if (!m || !m->data || !a || !y || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || r0 < 0 ||
        r0 % IE_PANEL != 0 || r1 < r0 || r1 > m->n_out || (r1 != m->n_out && r1 % IE_PANEL != 0) || n_tok < 0)
        return IE_ERR_INVAL;
    if (m->dtype != IE_DTYPE_BF16 && !ie_dtype_is_intw(m->dtype) && !ie_dtype_is_kq_panel(m->dtype))
        return IE_ERR_UNSUPPORTED;
    if (r0 == r1 || n_tok == 0) return IE_OK;
    const int64_t n_in = m->n_in;
    const size_t pb = ie_pack_panel_bytes(m->dtype, m->group, n_in);
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    const uint8_t *w = m->data, *act = a;
    if (m->dtype == IE_DTYPE_BF16) {
        int64_t rb = (int64_t)(AMX_ROWBLK / pb);
        if (rb < 1) rb = 1;
        for (int64_t q0 = p0; q0 < p1; q0 += rb) {
            const int64_t q1 = q0 + rb < p1 ? q0 + rb : p1;
            amx_bf16_rows(w + (size_t)q0 * pb, pb, q0, q1, r1, n_in / 32, act, a_stride, n_tok, y, ldy, 0);
        }
        return IE_OK;
    }
    /* the int types and k-quants: a row block (~AMX_ROWBLK, at least a
     * pair) dequantized, then the same loop */
    const size_t hb = AMX_UB_PANEL(n_in);
    int64_t rb = (int64_t)(AMX_ROWBLK / hb);
    if (rb < 2) rb = 2;
    if (rb > p1 - p0) rb = p1 - p0;
    uint8_t *ub = ie_kernel_scratch((size_t)rb * hb + sizeof(float) * (size_t)n_in);
    if (!ub) return IE_ERR_NOMEM;
    float *tmp = (float *)(void *)(ub + (size_t)rb * hb);
    for (int64_t q0 = p0; q0 < p1; q0 += rb) {
        const int64_t q1 = q0 + rb < p1 ? q0 + rb : p1;
        for (int64_t p = q0; p < q1; p++)
            amx_unpack_bf16(m, p, w + (size_t)p * pb, ub + (size_t)(p - q0) * hb, tmp);
        amx_bf16_rows(ub, hb, q0, q1, r1, n_in / 32, act, a_stride, n_tok, y, ldy, 0);
    }
    return IE_OK;
}

/* -------------------------------------------- MXFP4 on the BF16 tiles */

/* MXFP4 (GPT-OSS's experts, ROWS layout) on the bf16 route: every value
 * kv[code] * 2^(e-128) is exact in bf16 (kv has at most two significant
 * bits), so B holds ref's weights themselves and only the activations are
 * rounded (to bf16, against ref's Q8_0). Unlike the panel types the rows
 * lie in ggml's blocks (17 bytes: e, 16 bytes of nibble pairs: element j
 * low, j + 16 high), so each 16-row slab is transposed into the pair
 * layout. The buffer is two panels x AMX_KCM blocks on the stack (no
 * allocation: ie_matmul_fn cannot fail); longer rows run in k-chunks, C
 * carried in y between them. */
#define AMX_KCM 64 /* blocks per k-chunk: 2 panels x 64 KiB of bf16 */

#ifdef IE_AMX_AVX512
/* r[i] (dword j: the pair k 2j, 2j+1 of row i) transposed in place: r[j]
 * dword i = the same pair. Unpacks of dwords and qwords within 128-bit
 * lanes, then a 4x4 transpose of the lanes. */
static inline void amx_tr16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* u[4g + j], lane l: dword 4l + j of rows 4g..4g+3 */
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44),
                      x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee);
        const __m512i x2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44),
                      x3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
        r[j] = _mm512_shuffle_i32x4(x0, x2, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
        r[8 + j] = _mm512_shuffle_i32x4(x1, x3, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
    }
}
#endif

/* Blocks [kb0, kb0 + kc) of nr (<= 16) MXFP4 rows (w: the first, rows rb
 * bytes apart) to kc BF16 slabs at out (slab k at out + 1024 k: pair chunk
 * c, k 2c and 2c + 1, at + 64 c, dword i = row i; rows from nr on zero):
 * each value ie_dequantize_row's, rounded to bf16, subnormals as zeros of
 * their sign (what vcvtne2ps2bf16 and the tiles make of them). The plain
 * build computes exactly that through ie_dequantize_row; the AVX-512 one
 * is tested against it bit for bit. AVX-512: where a block's 16 exponents
 * are all in [2, 252] (every real model's), the codes' bytes are
 * transposed first (4 bytes of 16 rows a register: 64 bytes, not the 1 KiB
 * of bf16 they become) and each pair of nibbles becomes its pair of bf16
 * directly (word table, exponent added): one Zen 4 core 59 ns a 512-weight
 * block-panel, against 68 through f32 and a transpose of the bf16 (kept
 * for the blocks with subnormal or infinite values) and 67 gathering the
 * rows' bytes. */
static void amx_mxfp4_bf16(const uint8_t *w, size_t rb, int nr, int64_t kb0, int kc, uint8_t *out)
{
#ifdef IE_AMX_AVX512
    const __m128i tbl = _mm_loadu_si128((const void *)ie_mxfp4_kvalues);
    /* words 0..15: E2M1(code) = ie_mxfp4_kvalues / 2 as bf16 (exact; code 8, -0, as +0) */
    const __m512i lut = (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(),
                                                     _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(tbl)),
                                                                   _mm512_set1_ps(0.5f)));
    /* per dword (row): bytes 0, 1 (or 2, 3) of the row's four code bytes
     * zero-extended to words: the pair's two nibble indices */
    const __m512i c01 = _mm512_broadcast_i32x4(
        _mm_set_epi8(-128, 13, -128, 12, -128, 9, -128, 8, -128, 5, -128, 4, -128, 1, -128, 0));
    const __m512i c23 = _mm512_add_epi8(c01, _mm512_set1_epi32(0x00020002));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* dword 4m + l <- 4l + m: a 4 x 4 transpose of the dwords of four rows */
    const __m512i tp = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    for (int k = 0; k < kc; k++) {
        const uint8_t *base = w + sizeof(ie_block_mxfp4_t) * (size_t)(kb0 + k);
        uint8_t *o = out + 1024 * (size_t)k;
        /* every exponent in [2, 252]: every value a normal bf16, E2M1's
         * with e - 127 added to its exponent field */
        _Alignas(64) int32_t ev[16];
        int emin = 255, emax = 0;
        for (int i = 0; i < 16; i++) {
            const int e = i < nr ? base[(size_t)i * rb] : 127;
            emin = e < emin ? e : emin;
            emax = e > emax ? e : emax;
            const uint32_t d = (uint32_t)(e - 127) << 7 & 0xffff;
            ev[i] = (int32_t)(d << 16 | d); /* both words of the pair */
        }
        if (emin >= 2 && emax <= 252) {
            const __m512i off = _mm512_load_si512((const void *)ev);
            /* g[m] dword i: code bytes 4m..4m+3 of row i (k 4m.. low
             * nibbles, 4m+16.. high): rows four to a register, each's
             * dwords transposed, then the registers' lanes */
            __m512i t[4], g[4];
            for (int q = 0; q < 4; q++) {
                __m128i r4[4];
                for (int l = 0; l < 4; l++) {
                    const int i = 4 * q + l;
                    r4[l] = i < nr ? _mm_loadu_si128((const void *)(base + (size_t)i * rb + 1))
                                   : _mm_setzero_si128();
                }
                __m512i z = _mm512_castsi128_si512(r4[0]);
                z = _mm512_inserti32x4(z, r4[1], 1);
                z = _mm512_inserti32x4(z, r4[2], 2);
                z = _mm512_inserti32x4(z, r4[3], 3);
                t[q] = _mm512_permutexvar_epi32(tp, z);
            }
            const __m512i x0 = _mm512_shuffle_i32x4(t[0], t[1], 0x44), x1 = _mm512_shuffle_i32x4(t[0], t[1], 0xee);
            const __m512i x2 = _mm512_shuffle_i32x4(t[2], t[3], 0x44), x3 = _mm512_shuffle_i32x4(t[2], t[3], 0xee);
            g[0] = _mm512_shuffle_i32x4(x0, x2, 0x88);
            g[1] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
            g[2] = _mm512_shuffle_i32x4(x1, x3, 0x88);
            g[3] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
            for (int m = 0; m < 4; m++) {
                const __m512i nl = _mm512_and_si512(g[m], m4),
                              nh = _mm512_and_si512(_mm512_srli_epi32(g[m], 4), m4);
                const __m512i src[4] = {nl, nl, nh, nh}, ctl[4] = {c01, c23, c01, c23};
                const int chunk[4] = {2 * m, 2 * m + 1, 2 * m + 8, 2 * m + 9};
                for (int h = 0; h < 4; h++) {
                    __m512i v = _mm512_permutexvar_epi16(_mm512_shuffle_epi8(src[h], ctl[h]), lut);
                    v = _mm512_mask_add_epi16(v, _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7fff)), v, off);
                    _mm512_store_si512((void *)(o + 64 * (size_t)chunk[h]), v);
                }
            }
            continue;
        }
        /* else (subnormal or infinite values): through f32, rows transposed */
        __m512i r[16];
        for (int i = 0; i < 16; i++) {
            if (i >= nr) {
                r[i] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *b = base + (size_t)i * rb;
            const __m128i q = _mm_loadu_si128((const void *)(b + 1));
            const __m128i ql = _mm_shuffle_epi8(tbl, _mm_and_si128(q, _mm_set1_epi8(0x0f)));
            const __m128i qh = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f)));
            /* kv * 2^(e-128), exact (a power of two times a small integer);
             * k 0..31 in order: dword j = the pair k 2j, 2j+1 */
            const __m512 sc = _mm512_set1_ps(ie_e8m0_half_to_f32(b[0])), s2[2] = {sc, sc};
            r[i] = amx_pair_bf16(_mm256_set_m128i(qh, ql), s2, s2, 0);
        }
        amx_tr16(r);
        for (int c = 0; c < 16; c++) _mm512_store_si512((void *)(o + 64 * (size_t)c), r[c]);
    }
#else
    float v[32];
    for (int k = 0; k < kc; k++)
        for (int i = 0; i < 16; i++) {
            if (i < nr)
                ie_dequantize_row(IE_DTYPE_MXFP4, w + (size_t)i * rb + sizeof(ie_block_mxfp4_t) * (size_t)(kb0 + k),
                                  v, 32);
            else memset(v, 0, sizeof v);
            for (int j = 0; j < 32; j++) {
                ie_bf16_t h = ie_f32_to_bf16(v[j]);
                if ((h & 0x7f80) == 0) h &= 0x8000; /* subnormal: zero of its sign */
                memcpy(out + 1024 * (size_t)k + 64 * (size_t)(j / 2) + 4 * (size_t)i + 2 * (size_t)(j & 1), &h, 2);
            }
        }
#endif
}

/* The MXFP4 GEMM on the BF16 tiles (contract in ie_kernels_isa.h:
 * ie_amx_mxfp4_*). Per pair of panels and k-chunk: dequantize, then the
 * BF16 loop over every token. */
void IE_AMX_MXFP4_NAME(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                       int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) return;
    const int64_t nb = n_in / 32, nrows = r1 - r0, np = (nrows + IE_PANEL - 1) / IE_PANEL;
    const size_t rb = sizeof(ie_block_mxfp4_t) * (size_t)nb;
    _Alignas(64) uint8_t ub[2 * AMX_KCM * 1024];
    const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * rb, *act = a;
    y += r0; /* rows and panels from here on count from r0 */
    for (int64_t q0 = 0; q0 < np; q0 += 2) {
        const int64_t q1 = q0 + 2 < np ? q0 + 2 : np;
        for (int64_t kb0 = 0; kb0 < nb; kb0 += AMX_KCM) {
            const int kc = nb - kb0 < AMX_KCM ? (int)(nb - kb0) : AMX_KCM;
            for (int64_t p = q0; p < q1; p++) {
                const int64_t left = nrows - p * IE_PANEL;
                amx_mxfp4_bf16(wr + (size_t)(p * IE_PANEL) * rb, rb, left < IE_PANEL ? (int)left : IE_PANEL, kb0,
                               kc, ub + (size_t)(p - q0) * (size_t)kc * 1024);
            }
            amx_bf16_rows(ub, (size_t)kc * 1024, q0, q1, nrows, kc, act + 64 * (size_t)kb0, a_stride, n_tok, y, ldy,
                          kb0 > 0);
        }
    }
}
