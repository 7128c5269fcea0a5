/* amx_gemm_body.h — the AMX-INT8 GEMM over PANEL16 weights (ie_pack.h),
 * written once over tile macros and compiled twice:
 *   kernels/x86/amx/pack_amx.c  the real instructions (-mamx-tile -mamx-int8)
 *   kernels/src/amx_emu.c       a scalar tile emulator (any CPU: the tests)
 * The includer defines, before including this file:
 *   IE_AMX_GEMM_NAME            name of the function to define
 *   IE_AMX_CFG(cfg)             ldtilecfg of a 64-byte palette-1 config
 *   IE_AMX_ZERO(t)              tilezero tmm t
 *   IE_AMX_LOAD(t, p, stride)   tileloadd tmm t from p, rows stride bytes apart
 *   IE_AMX_STORE(t, p, stride)  tilestored
 *   IE_AMX_DPBSUD(c, a, b)      tdpbsud: c += a (s8) . b (u8), 4-byte dot products
 *   IE_AMX_DPBUUD(c, a, b)      tdpbuud: c += a (u8) . b (u8)
 *   IE_AMX_GEMM_BF16_NAME       name of the BF16 GEMM to define
 *   IE_AMX_DPBF16PS(c, a, b)    tdpbf16ps: c (f32) += a (bf16 pairs) . b
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
 *     unpacked per (panel, block) on the fly into 8 B rows (low nibbles of
 *     chunk c = row 2c: k 8c..8c+3; high = row 2c+1: k 8c+4..8c+7); the
 *     Q8_P activation rows are the A tile as they lie (stride a_stride).
 *     Codes are u = q + 8 (I4W) or u (I4WA): tdpbsud(a, u).
 * The code offset leaves the integer domain once: i = C - off*sum(a) is the
 * exact signed block dot product (I4WA: off 0, its m*S term added in f32).
 * Why the k-slab is one 32-element block (A colsb 32, B 8 rows) and not a
 * full 64-byte tile: every block has its own activation scale per token and
 * its own weight scale per row; a 64-byte slab would add two blocks' int32
 * sums before either scale is applied, which is exact only after
 * requantizing to one scale per 64 (a different, lossier format). So the
 * int32 sums of each block are stored (tilestored, 1 KiB) and scaled in f32
 * like the AVX-512 kernel does: gacc += i * d_a per block, acc += gacc * d_w
 * per group (segment). Whether a K=32 tdp costs as much as a K=64 one, and
 * how much of the TMUL rate the f32 epilogue leaves, is for a machine with
 * AMX to measure.
 *
 * Order of the loops (weights must come from L2, not DRAM: one 16x16x32
 * tdp eats 512 weight bytes in ~16 cycles): for each k-chunk of KC blocks,
 * for each row block of panels (~1 MiB of weights of the chunk), for each
 * token tile of 16 (packed: I8W hi/lo planes, every type the block sums
 * and scales), for each panel, for each block. Later k-chunks add into y.
 *
 * BF16 (AMX-BF16, tdpbf16ps): a BF16 PANEL16 chunk (dword i = the pair
 * w[16p+i][2c], w[2c+1]) is a B row in the pair layout, so 16 chunks (32
 * k) are a B tile as they lie; A = 16 tokens x 32 bf16 straight from the
 * BF16 activation rows; C (f32) accumulates over all of k in the tile (no
 * scales, no epilogue) and is stored once per panel and token tile.
 *
 * Not done (candidates once this measures): 2 panels x 2 token tiles per
 * step (4 C tiles sharing A and B loads); a load-time I4W repack into
 * unpacked bytes (twice the memory, no unpack per tile); int8 activations
 * for I8W (one tdp instead of two, but ggml's Q8_0 x Q8_0 precision and
 * numbers that change with the ISA).
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

/* Pack bytes per block: I8W hi[16][32] lo[16][32], then int32 sum[16] and
 * f32 d[16] (every type). */
#define AMX_PK_PLANES (2 * AMX_T * 32)
#define AMX_PK_TAIL (8 * AMX_T)

/* This thread's tile configuration: mt token rows + 32 for the BF16
 * shapes (0: not configured). */
static _Thread_local int amx_cfg_rows;

/* Configure tmm0..4 for tiles of mt token rows, int8 (bf16 0) or BF16
 * shapes (bf16 1), unless already so. */
static void amx_configure(int mt, int bf16)
{
    if (amx_cfg_rows == mt + 32 * bf16) return;
    _Alignas(64) uint8_t cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1; /* palette 1; start_row 0 */
    /* int8: C0, C1 mt x 16 int32; A0, A1 mt x 32 bytes; B 8 quads x 64.
     * bf16: C0 mt x 16 f32; A0 mt x 32 bf16; B 16 pairs x 64 bytes. */
    const uint16_t colsb[5] = {64, (uint16_t)(bf16 ? 0 : 64), (uint16_t)(bf16 ? 64 : 32), (uint16_t)(bf16 ? 0 : 32),
                               64};
    const uint8_t rows[5] = {(uint8_t)mt, (uint8_t)(bf16 ? 0 : mt), (uint8_t)mt, (uint8_t)(bf16 ? 0 : mt),
                             (uint8_t)(bf16 ? 16 : 8)};
    for (int t = 0; t < 5; t++) {
        memcpy(cfg + 16 + 2 * t, &colsb[t], 2);
        cfg[48 + t] = rows[t];
    }
    IE_AMX_CFG(cfg);
    amx_cfg_rows = mt + 32 * bf16;
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

/* Pack blocks [kb0, kb1) of mt tokens (rows a, a+as, ...): I8W's planes of
 * the int16 quants, every type's block sums of the quants and scales d. */
static void amx_pack(int i8w, const uint8_t *a, size_t as, int64_t n_in, int mt, int64_t kb0, int64_t kb1,
                     uint8_t *pk)
{
    const size_t blk = (i8w ? AMX_PK_PLANES : 0) + AMX_PK_TAIL;
    for (int t = 0; t < mt; t++) {
        const uint8_t *row = a + (size_t)t * as;
        const uint8_t *dp = row + (i8w ? 2 : 1) * (size_t)n_in;
        for (int64_t b = kb0; b < kb1; b++) {
            uint8_t *p = pk + (size_t)(b - kb0) * blk;
            int32_t sum = 0;
            if (i8w) {
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
            } else {
                for (int j = 0; j < 32; j++) sum += (int8_t)row[32 * b + j];
            }
            memcpy(p + 4 * t, &sum, 4);
            memcpy(p + 4 * AMX_T + 4 * t, dp + 4 * b, 4);
        }
    }
}

/* Unpack one I4W/I4WA block (4 chunks of nibbles) into B's 8 rows. */
static void amx_unpack4(const uint8_t *q, uint8_t *ub)
{
    for (int c = 0; c < 4; c++)
        for (int x = 0; x < 64; x++) {
            ub[128 * c + x] = q[64 * c + x] & 0x0f;
            ub[128 * c + 64 + x] = q[64 * c + x] >> 4;
        }
}

/* One panel (16 rows) x mt tokens over blocks [kb0, kb1) (pk: their pack;
 * a: the tokens' activation rows for I4W's A tiles and I4WA's s): y rows
 * of the panel that exist (nr) and the tile's tokens, stored when first,
 * else added. isums (tests): the exact block dots, [t][row][block], ldr
 * rows and nbt blocks per token.
 * The f32 epilogue of a block is the cost the tiles do not take (one tdp
 * is ~16 cycles): its loops are 16 wide over the rows with the token's
 * scalars hoisted, so that each becomes one zmm per token row (the
 * compiler vectorizes them in pack_amx.c: -O2 -mavx512f). Groups of one
 * block (the repacked ggml types) fold the weight scale into the block's:
 * acc += i * (d_a * d_w); wider groups sum i * d_a per group first, as
 * the AVX-512 kernel. */
static void amx_panel(ie_dtype_t dt, const uint8_t *panel, size_t gb, int64_t bpg, int64_t kb0, int64_t kb1,
                      const uint8_t *pk, const uint8_t *a, size_t as, int64_t n_in, int mt, float *y, int64_t ldy,
                      int nr, int first, int32_t *isums, int64_t ldr, int64_t nbt)
{
    const int i8w = dt == IE_DTYPE_I8W, affine = dt == IE_DTYPE_I4WA;
    const size_t hdr = affine ? 64 : 32, bb = i8w ? 512 : 256;
    const size_t blk = (i8w ? AMX_PK_PLANES : 0) + AMX_PK_TAIL;
    const int32_t off = i8w ? 128 : dt == IE_DTYPE_I4W ? 8 : 0;
    const int64_t nb = n_in / 32;
    _Alignas(64) int32_t c0[AMX_T][16], c1[AMX_T][16];
    _Alignas(64) uint8_t ub[8 * 64];
    _Alignas(64) float acc[AMX_T][16], gacc[AMX_T][16], wd[16], wm[16], da[AMX_T], ssum[AMX_T];
    int32_t corr[AMX_T];
    memset(acc, 0, sizeof acc);
    int64_t b = kb0;
    while (b < kb1) {
        const int64_t g = b / bpg, e = (g + 1) * bpg < kb1 ? (g + 1) * bpg : kb1;
        const uint8_t *gp = panel + (size_t)g * gb;
        for (int r = 0; r < 16; r++) {
            wd[r] = amx_f16(gp + 2 * r);
            wm[r] = affine ? amx_f16(gp + 32 + 2 * r) : 0.0f;
        }
        for (int64_t k = b; k < e; k++) {
            const uint8_t *q = gp + hdr + (size_t)(k - g * bpg) * bb;
            const uint8_t *p = pk + (size_t)(k - kb0) * blk;
            IE_AMX_ZERO(AMX_C0);
            if (i8w) {
                IE_AMX_ZERO(AMX_C1);
                IE_AMX_LOAD(AMX_B, q, 64);
                IE_AMX_LOAD(AMX_A0, p, 32);
                IE_AMX_LOAD(AMX_A1, p + AMX_T * 32, 32);
                IE_AMX_DPBSUD(AMX_C0, AMX_A0, AMX_B);
                IE_AMX_DPBUUD(AMX_C1, AMX_A1, AMX_B);
                IE_AMX_STORE(AMX_C1, c1, 64);
                p += AMX_PK_PLANES;
            } else {
                amx_unpack4(q, ub);
                IE_AMX_LOAD(AMX_B, ub, 64);
                IE_AMX_LOAD(AMX_A0, a + 32 * (size_t)k, as);
                IE_AMX_DPBSUD(AMX_C0, AMX_A0, AMX_B);
            }
            IE_AMX_STORE(AMX_C0, c0, 64);
            for (int t = 0; t < mt; t++) {
                int32_t sum;
                memcpy(&sum, p + 4 * t, 4);
                corr[t] = -off * sum;
                da[t] = amx_ldf(p + 4 * AMX_T + 4 * t);
            }
            /* the exact block dot: 256*hi + lo - off*sum(a), |.| < 2^29;
             * made inside each f32 loop (no store and reload of C), in
             * wrapping 32-bit arithmetic: a tile a faulting op left
             * unwritten (the emulator goes on where the CPU would trap)
             * must not make it undefined */
#define AMX_DOT(t, r) \
    ((int32_t)((i8w ? 256u * (uint32_t)c0[t][r] + (uint32_t)c1[t][r] : (uint32_t)c0[t][r]) + (uint32_t)corr[t]))
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
        if (affine) { /* + m * S, S: the activation s summed over the segment */
            for (int t = 0; t < mt; t++) {
                const uint8_t *sp = a + (size_t)t * as + (size_t)n_in + 4 * (size_t)nb;
                float sv = 0.0f;
                for (int64_t k = b; k < e; k++) sv += amx_ldf(sp + 4 * k);
                ssum[t] = sv;
            }
            for (int t = 0; t < mt; t++) {
                const float sv = ssum[t];
                for (int r = 0; r < 16; r++) acc[t][r] += wm[r] * sv;
            }
        }
        b = e;
    }
    for (int t = 0; t < mt; t++) {
        float *yt = y + (int64_t)t * ldy;
        for (int r = 0; r < nr; r++) yt[r] = first ? acc[t][r] : yt[r] + acc[t][r];
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
    const ie_dtype_t dt = m->dtype;
    const int i8w = dt == IE_DTYPE_I8W;
    const int64_t n_in = m->n_in, nb = n_in / 32, bpg = m->group / 32;
    const size_t pb = ie_pack_panel_bytes(dt, m->group, n_in);
    const size_t gb = pb / (size_t)(n_in / m->group);
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    _Alignas(64) uint8_t pk[AMX_KC * (AMX_PK_PLANES + AMX_PK_TAIL)];
    const uint8_t *w = m->data, *act = a;
    for (int64_t kb0 = 0; kb0 < nb; kb0 += AMX_KC) {
        const int64_t kb1 = kb0 + AMX_KC < nb ? kb0 + AMX_KC : nb;
        /* panels per row block: their chunk's weights ~ AMX_ROWBLK bytes */
        int64_t rb = (int64_t)(AMX_ROWBLK / ((size_t)(kb1 - kb0) * (i8w ? 512 : 256) + 1));
        if (rb < 1) rb = 1;
        for (int64_t q0 = p0; q0 < p1; q0 += rb) {
            const int64_t q1 = q0 + rb < p1 ? q0 + rb : p1;
            for (int64_t t0 = 0; t0 < n_tok; t0 += AMX_T) {
                const int mt = n_tok - t0 < AMX_T ? (int)(n_tok - t0) : AMX_T;
                const uint8_t *at = act + (size_t)t0 * a_stride;
                amx_pack(i8w, at, a_stride, n_in, mt, kb0, kb1, pk);
                amx_configure(mt, 0);
                for (int64_t p = q0; p < q1; p++) {
                    const int64_t rows = r1 - p * IE_PANEL;
                    const int nr = rows < IE_PANEL ? (int)rows : IE_PANEL;
                    int32_t *is = isums ? isums + ((t0 * (r1 - r0)) + (p * IE_PANEL - r0)) * nb : NULL;
                    amx_panel(dt, w + (size_t)p * pb, gb, bpg, kb0, kb1, pk, at, a_stride, n_in, mt,
                              y + t0 * ldy + p * IE_PANEL, ldy, nr, kb0 == 0, is, r1 - r0, nb);
                }
            }
        }
    }
    return IE_OK;
}

/* The AMX-BF16 GEMM (contract in ie_kernels_isa.h: ie_amx_gemm_bf16_*). */
ie_status_t IE_AMX_GEMM_BF16_NAME(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                  int64_t n_tok, float *y, int64_t ldy)
{
    if (!m || !m->data || !a || !y || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || r0 < 0 ||
        r0 % IE_PANEL != 0 || r1 < r0 || r1 > m->n_out || (r1 != m->n_out && r1 % IE_PANEL != 0) || n_tok < 0)
        return IE_ERR_INVAL;
    if (m->dtype != IE_DTYPE_BF16) return IE_ERR_UNSUPPORTED;
    if (r0 == r1 || n_tok == 0) return IE_OK;
    const int64_t n_in = m->n_in, ns = n_in / 32; /* k-slabs of 32 */
    const size_t pb = ie_pack_panel_bytes(m->dtype, m->group, n_in);
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    int64_t rb = (int64_t)(AMX_ROWBLK / pb);
    if (rb < 1) rb = 1;
    const uint8_t *w = m->data, *act = a;
    _Alignas(64) float c[AMX_T][16];
    for (int64_t q0 = p0; q0 < p1; q0 += rb) {
        const int64_t q1 = q0 + rb < p1 ? q0 + rb : p1;
        for (int64_t t0 = 0; t0 < n_tok; t0 += AMX_T) {
            const int mt = n_tok - t0 < AMX_T ? (int)(n_tok - t0) : AMX_T;
            const uint8_t *at = act + (size_t)t0 * a_stride;
            amx_configure(mt, 1);
            for (int64_t p = q0; p < q1; p++) {
                const uint8_t *panel = w + (size_t)p * pb;
                IE_AMX_ZERO(AMX_C0);
                for (int64_t k = 0; k < ns; k++) {
                    IE_AMX_LOAD(AMX_A0, at + 64 * (size_t)k, a_stride);
                    IE_AMX_LOAD(AMX_B, panel + 1024 * (size_t)k, 64);
                    IE_AMX_DPBF16PS(AMX_C0, AMX_A0, AMX_B);
                }
                const int64_t rows = r1 - p * IE_PANEL;
                const int nr = rows < IE_PANEL ? (int)rows : IE_PANEL;
                float *yp = y + t0 * ldy + p * IE_PANEL;
                if (nr == IE_PANEL) {
                    IE_AMX_STORE(AMX_C0, yp, (size_t)ldy * sizeof(float));
                } else {
                    IE_AMX_STORE(AMX_C0, c, sizeof c[0]);
                    for (int t = 0; t < mt; t++) memcpy(yp + (int64_t)t * ldy, c[t], sizeof(float) * (size_t)nr);
                }
            }
        }
    }
    return IE_OK;
}
