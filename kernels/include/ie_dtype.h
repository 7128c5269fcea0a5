/* ie_dtype.h — element types of weights and activations, and their block
 * layouts. Values equal GGML's type ids so GGUF files map 1:1.
 *
 * Block layouts (little-endian, packed, identical to GGUF/ggml):
 *   Q8_0 : 32 elements = { f16 d; int8 q[32]; }             34 bytes, x = d*q
 *   Q8_1 : 32 elements = { f16 d; f16 s; int8 q[32]; }      36 bytes, s = d*sum(q)
 *   Q4_0 : 32 elements = { f16 d; uint8 qs[16]; }           18 bytes, x = d*(q-8)
 *   Q4_1 : 32 elements = { f16 d; f16 m; uint8 qs[16]; }    20 bytes, x = d*q + m
 *   MXFP4: 32 elements = { uint8 e; uint8 qs[16]; }         17 bytes (OCP MX, E2M1 + E8M0)
 *   (4-bit: element j<16 is the low nibble of qs[j], element j+16 its high nibble)
 * Q8_1 is an activation format only (paired with Q4_1 weights).
 *
 * The k-quant family and its relatives (ggml's layouts, byte for byte; u is
 * an element's unsigned code, sc/mn its sub-block's scale/min codes; which
 * bits of qs/qh/scales hold which element's code is ggml's, decoded by
 * ie_dequantize_row — gguf.quants' dequantization is the oracle):
 *   Q5_0  : 32 = { f16 d; u8 qh[4]; u8 qs[16]; }            22 B, x = d*(u-16)
 *   Q5_1  : 32 = { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }     24 B, x = d*u + m
 *   IQ4_NL: 32 = { f16 d; u8 qs[16]; }                      18 B, x = d*kv[u]
 *   Q2_K  : 256 = { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; }      84 B,
 *           16 subs of 16, sc and mn 4 bits: x = (d*sc)*u - (dmin*mn)
 *   Q3_K  : 256 = { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; } 110 B,
 *           16 subs of 16, 6-bit codes s: x = (d*(s-32))*(u-4), u in [0,7]
 *   Q4_K  : 256 = { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }    144 B,
 *           8 subs of 32, sc and mn 6 bits: x = (d*sc)*u - (dmin*mn)
 *   Q5_K  : 256 = { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }
 *           176 B, as Q4_K with u in [0,31]
 *   Q6_K  : 256 = { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d; } 210 B,
 *           16 subs of 16: x = (d*sc)*(u-32), u in [0,63]
 *   IQ4_XS: 256 = { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; } 136 B,
 *           8 subs of 32, 6-bit codes s: x = (d*(s-32))*kv[u]
 *   Q8_K  : 256 = { f32 d; int8 q[256]; int16 bsums[16]; } 292 B, activations
 *           only (the K types' and IQ4_XS's): x = d*q, bsums[i] = sum of
 *           q[16i .. 16i+15]; ggml's rounding (d = -max/127 with max the
 *           value of largest magnitude, q = nearest(x/d) capped at 127).
 * The i-quants (grid types; 256 elements, groups of 8 (IQ3: two halves of 4)
 * take their values from a code-book grid entry, signs and scales per sub-block;
 * decoded by ie_iq_decode into x = (d*sc[k/16])*q[k], q int8, d = f16 * 2^-3,
 * 2^-2 or 1):
 *   IQ2_XXS: { f16 d; u16 qs[32]; }                       66 B, 2.06 bits/weight
 *   IQ2_XS : { f16 d; u16 qs[32]; u8 scales[8]; }         74 B
 *   IQ2_S  : { f16 d; u8 qs[64]; u8 qh[8]; u8 scales[8]; } 82 B
 *   IQ3_XXS: { f16 d; u8 qs[96]; }                        98 B
 *   IQ3_S  : { f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]; } 110 B
 *   IQ1_S  : { f16 d; u8 qs[32]; u16 qh[8]; }             50 B
 *   IQ1_M  : { u8 qs[32]; u8 qh[16]; u16 scales[4]; }     56 B (d in the
 *            scales' top nibbles)
 * kv = ie_iq4nl_kvalues (int8, non-linear). Every product in parentheses is
 * exact in f32 (an f16 times a code of at most 6 bits), so (d*sc)*u - (dmin*mn)
 * rounds once, as gguf.quants computes it.
 *
 * MXFP4 values, exactly as ggml decodes them (dequantize_row_mxfp4,
 * kvalues_mxfp4, GGML_E8M0_TO_FP32_HALF in ggml-quants.c / ggml-impl.h):
 *   x = E2M1(code) * 2^(e-127) = ie_mxfp4_kvalues[code] * 2^(e-128)
 * where the 4-bit code is sign (bit 3) | magnitude index (bits 0-2) and
 * E2M1 magnitudes are {0, .5, 1, 1.5, 2, 3, 4, 6}; ie_mxfp4_kvalues holds
 * them doubled as int8 {0,1,2,3,4,6,8,12, 0,-1,...,-12} so that integer dot
 * products are exact. Code 8 (-0) decodes to +0. e is a plain biased
 * exponent for all 256 values: e = 0 gives 2^-128 (an f32 subnormal), and
 * e = 255 gives 2^127 per table unit, not NaN as the OCP spec reserves it;
 * values beyond FLT_MAX (e >= 254 with large codes) become +-inf in f32.
 */
#ifndef IE_DTYPE_H
#define IE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum ie_dtype {
    IE_DTYPE_F32 = 0,
    IE_DTYPE_F16 = 1,
    IE_DTYPE_Q4_0 = 2,
    IE_DTYPE_Q4_1 = 3,
    IE_DTYPE_Q5_0 = 6,
    IE_DTYPE_Q5_1 = 7,
    IE_DTYPE_Q8_0 = 8,
    IE_DTYPE_Q8_1 = 9,
    IE_DTYPE_Q2_K = 10,
    IE_DTYPE_Q3_K = 11,
    IE_DTYPE_Q4_K = 12,
    IE_DTYPE_Q5_K = 13,
    IE_DTYPE_Q6_K = 14,
    IE_DTYPE_Q8_K = 15,
    IE_DTYPE_IQ2_XXS = 16,
    IE_DTYPE_IQ2_XS = 17,
    IE_DTYPE_IQ3_XXS = 18,
    IE_DTYPE_IQ1_S = 19,
    IE_DTYPE_IQ4_NL = 20,
    IE_DTYPE_IQ3_S = 21,
    IE_DTYPE_IQ2_S = 22,
    IE_DTYPE_IQ4_XS = 23,
    IE_DTYPE_IQ1_M = 29,
    IE_DTYPE_BF16 = 30,
    IE_DTYPE_MXFP4 = 39,
    /* engine-native weight quantizations (never in GGUF files; ids outside
     * ggml's range). Group size G (a multiple of 32, dividing the row) is a
     * property of the tensor, not of the type; see ie_pack.h. */
    IE_DTYPE_I8W = 64,   /* int8w : x = d*q,       q int8 in [-127,127], f16 d per group */
    IE_DTYPE_I4W = 65,   /* int4w symmetric: x = d*(u-8), u in [0,15], f16 d per group */
    IE_DTYPE_I4WA = 66,  /* int4w affine:    x = d*u + m, f16 d and m per group        */
    IE_DTYPE_Q8_P = 67,  /* activations only: planar int8 row + f32 d, s per 32 (ie_pack.h) */
    IE_DTYPE_Q16_P = 68, /* activations only: planar int16 row + f32 d, s per 32 (ie_pack.h) */
    IE_DTYPE_INVALID = -1
} ie_dtype_t;

/* How a 2-D weight tensor's bytes are arranged (see ie_pack.h, ie_bsr.h).
 *   ROWS    : n_out rows one after another, each in its dtype's row format.
 *             For I8W/I4W/I4WA a row is n_in/G groups, each
 *             { f16 d; [f16 m (I4WA)]; q[G] (int8) or qs[G/2] (4-bit, element
 *             j < G/2 in the low nibble of qs[j], j + G/2 in the high) } —
 *             with G = 32 byte-identical to Q8_0 / Q4_0 / Q4_1.
 *   PANEL16 : I8W/I4W/I4WA, BF16, F16: rows interleaved 16 at a time in
 *             the kernels' blocked-K layout (ie_pack.h).
 *   BSR     : block-sparse rows, f32 blocks (ie_bsr.h); dtype is F32. */
typedef enum ie_layout { IE_LAYOUT_ROWS = 0, IE_LAYOUT_PANEL16 = 1, IE_LAYOUT_BSR = 2 } ie_layout_t;

/* "rows", "panel16", "bsr" or "invalid". */
const char *ie_layout_name(ie_layout_t l);

#define IE_QK 32    /* elements per quantized block */
#define IE_QK_K 256 /* elements per k-quant super-block */

typedef uint16_t ie_f16_t;  /* IEEE binary16 bits */
typedef uint16_t ie_bf16_t; /* bfloat16 bits      */

typedef struct {
    ie_f16_t d;
    int8_t q[IE_QK];
} ie_block_q8_0_t;
typedef struct {
    ie_f16_t d;
    ie_f16_t s;
    int8_t q[IE_QK];
} ie_block_q8_1_t;
typedef struct {
    ie_f16_t d;
    uint8_t qs[IE_QK / 2];
} ie_block_q4_0_t;
typedef struct {
    ie_f16_t d;
    ie_f16_t m;
    uint8_t qs[IE_QK / 2];
} ie_block_q4_1_t;
typedef struct {
    uint8_t e;
    uint8_t qs[IE_QK / 2];
} ie_block_mxfp4_t;

typedef struct {
    ie_f16_t d;
    uint8_t qh[4];
    uint8_t qs[IE_QK / 2];
} ie_block_q5_0_t;
typedef struct {
    ie_f16_t d;
    ie_f16_t m;
    uint8_t qh[4];
    uint8_t qs[IE_QK / 2];
} ie_block_q5_1_t;
typedef struct {
    ie_f16_t d;
    uint8_t qs[IE_QK / 2];
} ie_block_iq4_nl_t;
typedef struct {
    uint8_t scales[IE_QK_K / 16];
    uint8_t qs[IE_QK_K / 4];
    ie_f16_t d;
    ie_f16_t dmin;
} ie_block_q2_k_t;
typedef struct {
    uint8_t hmask[IE_QK_K / 8];
    uint8_t qs[IE_QK_K / 4];
    uint8_t scales[12];
    ie_f16_t d;
} ie_block_q3_k_t;
typedef struct {
    ie_f16_t d;
    ie_f16_t dmin;
    uint8_t scales[12];
    uint8_t qs[IE_QK_K / 2];
} ie_block_q4_k_t;
typedef struct {
    ie_f16_t d;
    ie_f16_t dmin;
    uint8_t scales[12];
    uint8_t qh[IE_QK_K / 8];
    uint8_t qs[IE_QK_K / 2];
} ie_block_q5_k_t;
typedef struct {
    uint8_t ql[IE_QK_K / 2];
    uint8_t qh[IE_QK_K / 4];
    int8_t scales[IE_QK_K / 16];
    ie_f16_t d;
} ie_block_q6_k_t;
typedef struct {
    float d;
    int8_t q[IE_QK_K];
    int16_t bsums[IE_QK_K / 16];
} ie_block_q8_k_t;
typedef struct {
    ie_f16_t d;
    uint16_t scales_h;
    uint8_t scales_l[IE_QK_K / 64];
    uint8_t qs[IE_QK_K / 2];
} ie_block_iq4_xs_t;

_Static_assert(sizeof(ie_block_q8_0_t) == 34, "q8_0 layout");
_Static_assert(sizeof(ie_block_q5_0_t) == 22, "q5_0 layout");
_Static_assert(sizeof(ie_block_q5_1_t) == 24, "q5_1 layout");
_Static_assert(sizeof(ie_block_iq4_nl_t) == 18, "iq4_nl layout");
_Static_assert(sizeof(ie_block_q2_k_t) == 84, "q2_K layout");
_Static_assert(sizeof(ie_block_q3_k_t) == 110, "q3_K layout");
_Static_assert(sizeof(ie_block_q4_k_t) == 144, "q4_K layout");
_Static_assert(sizeof(ie_block_q5_k_t) == 176, "q5_K layout");
_Static_assert(sizeof(ie_block_q6_k_t) == 210, "q6_K layout");
_Static_assert(sizeof(ie_block_q8_k_t) == 292, "q8_K layout");
_Static_assert(sizeof(ie_block_iq4_xs_t) == 136, "iq4_xs layout");
_Static_assert(sizeof(ie_block_q8_1_t) == 36, "q8_1 layout");
_Static_assert(sizeof(ie_block_q4_0_t) == 18, "q4_0 layout");
_Static_assert(sizeof(ie_block_q4_1_t) == 20, "q4_1 layout");
_Static_assert(sizeof(ie_block_mxfp4_t) == 17, "mxfp4 layout");

/* 2 x the E2M1 value of each 4-bit MXFP4 code (see above). */
extern const int8_t ie_mxfp4_kvalues[16];

/* The IQ4_NL / IQ4_XS code book: {-127, -104, ..., 113} (ggml's kvalues_iq4nl). */
extern const int8_t ie_iq4nl_kvalues[16];

/* 1 for the ggml k-quant family and relatives this engine computes with
 * (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS; not the activation type Q8_K). */
int ie_dtype_is_kquant(ie_dtype_t t);

/* 1 for ggml's grid i-quants this engine computes with in their own blocks
 * (ROWS layout only: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S). */
int ie_dtype_is_iquant(ie_dtype_t t);

/* 2^(e-128) as f32, exact for every e (the scale of one ie_mxfp4_kvalues
 * unit; e < 2 gives subnormals 2^-128, 2^-127). */
static inline float ie_e8m0_half_to_f32(uint8_t e)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return v.f;
}

/* Lower-case name ("f32", "q4_1", ...) or "invalid". Never NULL. */
const char *ie_dtype_name(ie_dtype_t t);

/* 1 for f32/f16/bf16, 32 or 256 (k-quants, i-quants, Q8_K) for block types,
 * 0 for an unknown type. */
int ie_dtype_block_elems(ie_dtype_t t);

/* Bytes of one block (element size for non-block types), 0 if unknown. */
size_t ie_dtype_block_bytes(ie_dtype_t t);

/* Bytes for a row of n elements; 0 if the type is unknown or n is not a
 * multiple of the block size. */
size_t ie_dtype_row_bytes(ie_dtype_t t, int64_t n);

/* Scalar conversions (exact, round-to-nearest-even on the way down). */
float ie_f16_to_f32(ie_f16_t h);
ie_f16_t ie_f32_to_f16(float f);
float ie_bf16_to_f32(ie_bf16_t h);
ie_bf16_t ie_f32_to_bf16(float f);

#endif
