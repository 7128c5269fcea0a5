/* ie_pack.h — engine-native quantized weights (int8w, int4w) and the
 * blocked-K panel layout the VNNI kernels read.
 *
 * Types (ie_dtype.h):  I8W  x = d*q            q int8 in [-127, 127]
 *                      I4W  x = d*(u - 8)      u in [0, 15]   (symmetric)
 *                      I4WA x = d*u + m        u in [0, 15]   (affine)
 * with one f16 d (and m) per group of G consecutive elements of a row;
 * G is a multiple of 32 that divides n_in (G = n_in: one scale per row).
 *
 * PANEL16 layout. Rows are taken 16 at a time (a panel; the last panel is
 * padded with zero rows whose scales are 0). Panel p holds rows 16p..16p+15
 * and is ie_pack_panel_bytes() long; panels follow each other. Inside a
 * panel, for each group g = 0 .. n_in/G - 1 in order:
 *     f16 d[16]                 scale of row 16p+i for group g
 *     f16 m[16]                 (I4WA only) offset of row 16p+i
 *     quants of elements k = gG .. gG+G-1, in chunks of 64 bytes:
 *       I8W : G/4 chunks; chunk c, byte 4i+j = (uint8)(q[16p+i][gG+4c+j] + 128)
 *       I4W, I4WA: G/8 chunks; chunk c, byte 4i+j =
 *                 u[16p+i][gG+8c+j] | u[16p+i][gG+8c+4+j] << 4
 *     (i = 0..15 row in panel, j = 0..3)
 * so one 64-byte chunk is one zmm: 16 int32 lanes = 16 rows, each lane 4
 * consecutive k — exactly what vpdpbusd (u8 weights x s8 activations)
 * wants with the activations' 4 bytes broadcast. int8 weights are stored
 * offset by +128 (u8); the kernels subtract 128*sum(a) per block.
 * Panel bytes: (n_in/G) * (2*16*(1 + [I4WA]) + 16*G*bits/8).
 *
 * BF16 in PANEL16 (plain bf16 values, no scales; G must be 32 and only
 * sets where ie_tensor_slice may cut columns): panel p is n_in/2 chunks of
 * 64 bytes; chunk c, dword i (row 16p+i) = the bf16 pair
 * (w[16p+i][2c], w[16p+i][2c+1]), the even element in the low half. One
 * chunk is one zmm for vdpbf16ps with the activations' pair broadcast:
 * lanes are rows, so a GEMV needs no horizontal sums and reads one stream.
 * Panel bytes: 32 * n_in. Activations: BF16 rows (ie_matmul_act_dtype).
 *
 * F16 in PANEL16 (the same rules): panel p is n_in slices of 32 bytes;
 * slice k, word i = the f16 w[16p+i][k]. One slice widens (vcvtph2ps) to
 * one zmm of 16 rows for an FMA with the activation broadcast. Panel bytes
 * 32 * n_in. Activations: F32 rows.
 *
 * K-QUANTS in PANEL16 (Q5_0, Q5_1, IQ4_NL, MXFP4: blocks of QK = 32;
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: super-blocks of QK = 256;
 * ie_dtype.h gives each type's codes and formula). A lossless
 * rearrangement of the ggml blocks: every f16 and every code is kept, 6-bit
 * and 4-bit scale codes are widened to int8. `group` is QK. MXFP4 is laid
 * out as IQ4_NL (d, then 4-bit codes into ie_mxfp4_kvalues) with d the f16
 * 2^(e-128) of its block's exponent e: exact for e in [104, 143] (f16
 * subnormals included), and d = 0 for a block whose codes are all +-0
 * whatever its e; a block outside both has no panel form (ie_pack_repack
 * refuses the matrix, which then runs in ROWS). Panel p, for each block b =
 * 0 .. n_in/QK - 1 in order, is a header and then the codes:
 *   header, in this order (16 = the panel's rows, row i at index i):
 *     f16 d[16]                      every type
 *     f16 dmin[16]                   Q2_K, Q4_K, Q5_K (dmin); Q5_1 (its m)
 *     int8 sc[nsub][16]              K types and IQ4_XS: sc[j][i] = the
 *                                    signed scale of sub-block j of row i:
 *                                    Q2_K, Q4_K, Q5_K its code; Q3_K and
 *                                    IQ4_XS code - 32; Q6_K its int8
 *     int8 mn[nsub][16]              Q2_K, Q4_K, Q5_K: min codes
 *   (nsub = 16 for Q2_K, Q3_K, Q6_K; 8 for Q4_K, Q5_K, IQ4_XS; 32-element
 *   types have no sc/mn: their scale is d alone.)
 *   codes, for each slab of 32 columns K = 32s of the block in order, the
 *   b-bit code u (b = 2 Q2_K, 3 Q3_K, 4 Q4_K IQ4_NL IQ4_XS MXFP4, 5 Q5_0 Q5_1
 *   Q5_K, 6 Q6_K) split into planes of 64-byte chunks (row i, j = 0..3):
 *     nibble chunks c = 0..3 (b >= 4): bits 0-3;
 *         byte 4i+j = lo4(u[i][K+8c+j]) | lo4(u[i][K+8c+4+j]) << 4
 *     crumb chunks c = 0..1 (b = 2, 3: bits 0-1; b = 6: bits 4-5);
 *         byte 4i+j, bits 2t..2t+1 (t = 0..3) = those bits of u[i][K+16c+4t+j]
 *     bit chunk (b = 3: bit 2; b = 5: bit 4);
 *         byte 4i+j, bit t (t = 0..7) = that bit of u[i][K+4t+j]
 *   in the order nibbles, crumbs, bit: b*64 bytes per slab. Each chunk
 *   holds whole quads of 4 consecutive columns per row in one dword,
 *   the layout vpdpbusd reads with 4 activation bytes broadcast.
 * The value of element k of row i is the type's formula (ie_dtype.h) on
 * these fields, evaluated in the same order, so ie_pack_dequant_row equals
 * ie_dequantize_row on the source bit for bit. Activations: Q8_P for the
 * 32-element types, Q8_K for the others (ie_matmul_packed_act_dtype); the
 * same for their ROWS kernels, except MXFP4's (Q8_0).
 * Panel bytes per block: 2*16*(1 + has_dmin) + 16*nsub*(1 + has_mn) + 16*QK*b/8.
 *
 * Q8_P activations (what matmul_packed reads): per token row of n_in
 * (a multiple of 32) floats x:
 *     int8 q[n_in]; float d[n_in/32]; float s[n_in/32]
 * with, per block b of 32: d = amax/127, q = roundf(x/d) (ggml's Q8_0
 * rounding), s = d * sum(q). Row bytes: ie_dtype_row_bytes(Q8_P, n_in)
 * = n_in + 8*(n_in/32).
 *
 * Q16_P activations (what matmul_packed reads for I8W weights, so int8w is
 * a weight-only scheme: 16-bit activations keep their rounding ~256x below
 * int8's): per token row of n_in floats:
 *     int16 q[n_in]; float d[n_in/32]; float s[n_in/32]
 * with, per block of 32: d = amax/32767, q = roundf(x/d), s = d * sum(q).
 * Row bytes: 2*n_in + 8*(n_in/32). I4W/I4WA read Q8_P.
 */
#ifndef IE_PACK_H
#define IE_PACK_H

#include "ie_dtype.h"

#include <stddef.h>
#include <stdint.h>

#define IE_PANEL 16 /* rows per panel */

/* A weight matrix in PANEL16 layout. */
typedef struct ie_pmat {
    ie_dtype_t dtype; /* I8W, I4W, I4WA, BF16, F16 or a k-quant  */
    int group;        /* G (k-quants: their block size, 32/256)  */
    int64_t n_in;     /* elements per row                        */
    int64_t n_out;    /* rows (not padded)                       */
    const void *data; /* ie_pack_bytes() bytes, 64-byte aligned  */
} ie_pmat_t;

/* How scales are chosen when quantizing floats. */
typedef enum ie_qscale {
    IE_QSCALE_ABSMAX = 0, /* d from the group's extreme values (ggml's rule)  */
    IE_QSCALE_MSE = 1     /* search clip ratios, keep the least squared error */
} ie_qscale_t;

/* 1 for the engine-native int weight types (I8W, I4W, I4WA). */
static inline int ie_dtype_is_intw(ie_dtype_t t)
{
    return t == IE_DTYPE_I8W || t == IE_DTYPE_I4W || t == IE_DTYPE_I4WA;
}

/* 1 for the plain 16-bit float types PANEL16 holds (no scales). */
static inline int ie_dtype_is_half(ie_dtype_t t) { return t == IE_DTYPE_BF16 || t == IE_DTYPE_F16; }

/* 1 for the types whose PANEL16 is the k-quant panel (below): the
 * k-quants and MXFP4, whose blocks are IQ4_NL's with another code book and
 * a power-of-two scale (its panels hold d = 2^(e-128) as f16). */
static inline int ie_dtype_is_kq_panel(ie_dtype_t t) { return ie_dtype_is_kquant(t) || t == IE_DTYPE_MXFP4; }

/* 1 for the types PANEL16 can hold: the I-types, BF16, F16, the k-quants
 * and MXFP4 (ie_dtype_is_kq_panel). */
static inline int ie_dtype_is_packable(ie_dtype_t t)
{
    return ie_dtype_is_intw(t) || ie_dtype_is_half(t) || ie_dtype_is_kq_panel(t);
}

/* 0 if (dtype, group, n_in) is a valid packed shape (dtype in I8W/I4W/I4WA,
 * group a positive multiple of 32 dividing n_in; BF16 and F16 with group
 * 32 and n_in a multiple of 32; a k-quant with group = its block size
 * dividing n_in), else -1. */
int ie_pack_check(ie_dtype_t dtype, int group, int64_t n_in);

/* Bytes of one panel / of a whole n_out-row matrix in PANEL16 layout; 0 if
 * the shape is invalid. */
size_t ie_pack_panel_bytes(ie_dtype_t dtype, int group, int64_t n_in);
size_t ie_pack_bytes(ie_dtype_t dtype, int group, int64_t n_in, int64_t n_out);

/* Bytes of one ROWS-layout row of I8W/I4W/I4WA (see ie_layout_t); 0 if
 * invalid (BF16 and F16 included). For ggml types use ie_dtype_row_bytes. */
size_t ie_qrow_bytes(ie_dtype_t dtype, int group, int64_t n_in);

/* Bytes of a whole 2-D tensor of n_rows rows of n_in in any dense layout
 * (ROWS of any dtype, PANEL16 of the packable types: group must be valid
 * for ie_pack_check there, e.g. a k-quant's block size); 0 if invalid.
 * For ROWS, group is ignored for non-I types. */
size_t ie_tensor_bytes(ie_dtype_t dtype, ie_layout_t layout, int group, int64_t n_in, int64_t n_rows);

/* Quantize float rows [r0, r1) of an n_out x n_in matrix (src points at row
 * 0, rows n_in floats apart) into the PANEL16 buffer dst of the whole
 * matrix. r0 must be a multiple of 16; r1 = n_out or a multiple of 16; the
 * caller may run disjoint ranges concurrently. Padding rows of the last
 * panel are written as zeros when r1 = n_out. Rounding: I8W d = amax/127,
 * q = roundf(x/d); I4W d = max/-8 (max: the value of largest magnitude),
 * u = clamp(roundf(x/d) + 8, 0, 15) ... exactly ggml's Q4_0 rule (x*(1/d) +
 * 8.5 truncated, clamped to 15); I4WA d = (max-min)/15, m = min, u = ggml's
 * Q4_1 rule. IE_QSCALE_MSE tries clip ratios and keeps the best per group.
 * BF16 / F16: ie_f32_to_bf16 / ie_f32_to_f16 per element (`how` ignored),
 * padding rows 0. The k-quants are refused (-1): they come from files;
 * floats reach them through ie_quantize_row (ROWS) and ie_pack_repack.
 * Inputs must be finite. Returns 0, or -1 on a bad shape/range. */
int ie_pack_quantize(ie_dtype_t dtype, int group, ie_qscale_t how, const float *src, int64_t n_in, int64_t r0,
                     int64_t r1, int64_t n_out, void *dst);

/* Quantize one float row to the ROWS layout of an I-type (n_in floats ->
 * ie_qrow_bytes bytes), same rounding as ie_pack_quantize. 0 or -1 (also
 * for BF16 and F16: their rows are ie_quantize_row's). */
int ie_qrow_quantize(ie_dtype_t dtype, int group, ie_qscale_t how, const float *src, int64_t n_in, void *dst);

/* Dequantize one ROWS-layout row of an I-type. */
void ie_qrow_dequantize(ie_dtype_t dtype, int group, const void *src, float *dst, int64_t n_in);

/* The packed type a ROWS-layout tensor repacks to losslessly:
 * Q8_0 -> I8W, Q4_0 -> I4W, Q4_1 -> I4WA (group 32), I-types, BF16 and
 * F16 (group 32), the k-quants and MXFP4 (group = block size) ->
 * themselves; IE_DTYPE_INVALID for anything else. */
ie_dtype_t ie_pack_target(ie_dtype_t rows_dtype);

/* Repack rows [r0, r1) (same alignment rules as ie_pack_quantize) of a
 * ROWS-layout matrix (src: its row 0) — ggml Q8_0/Q4_0/Q4_1, BF16 and F16
 * (group 32), a k-quant or MXFP4 (group = its block size), whatever `group`
 * says for these; I-types with `group` — into PANEL16 (of ie_pack_target's
 * type) without changing a single value. Padding rows of a k-quant's last
 * panel: every field 0 (d, dmin, sc, mn, codes). 0, or -1 on bad arguments
 * or an MXFP4 block with no panel form (see above; the range's panels are
 * then partly written). */
int ie_pack_repack(ie_dtype_t rows_dtype, int group, const void *src, int64_t n_in, int64_t r0, int64_t r1,
                   int64_t n_out, void *dst);

/* Dequantize row r of a packed matrix into n_in floats (embedding lookup,
 * tests, calibration). Repacked ggml rows (Q8_0/Q4_0/Q4_1, BF16, F16, the
 * k-quants) give ie_dequantize_row's bits on the source row. */
void ie_pack_dequant_row(const ie_pmat_t *m, int64_t r, float *dst);

/* Copy the sub-matrix rows [r0, r1) x columns [c0, c1) of a dense weight
 * tensor of n_out rows of n_in elements into dst, which must hold
 * ie_tensor_bytes(dtype, layout, group, c1 - c0, r1 - r0) bytes; the result
 * is the same dtype/layout/group, as if the smaller matrix had been made
 * directly. ROWS layout: any dense dtype; c0 and c1 on the dtype's block
 * boundaries (32 columns; 256 for Q2_K..Q6_K and IQ4_XS). PANEL16: r0 a
 * multiple of 16, c0 and c1 multiples of the group (a k-quant's block
 * size); the padding rows of the result's last panel are written as
 * ie_pack_quantize / ie_pack_repack write them.
 * Returns 0, or -1 when the cut is out of range or not on those boundaries
 * (dst untouched). */
int ie_tensor_slice(ie_dtype_t dtype, ie_layout_t layout, int group, const void *src, int64_t n_in, int64_t n_out,
                    int64_t r0, int64_t r1, int64_t c0, int64_t c1, void *dst);

#endif
