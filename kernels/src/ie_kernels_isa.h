/* ie_kernels_isa.h — every per-ISA kernel behind the ie_kernels_get() table.
 *
 * Internal to kernels/ (and to tests that compare ISAs one kernel at a time).
 * Each definition file (kernels/ref/, kernels/src/, kernels/x86/avx2/,
 * kernels/x86/avx512/) includes this header, so the compiler checks every
 * definition against the one declaration here; dispatch.c fills the table
 * from it. Every function has the contract of the ie_kernels_t member it
 * fills (ie_kernels.h); the _ref twins are the oracle the SIMD variants are
 * tested against. Names carry the types: ie_matmul_<weight>_<act>_<isa>.
 */
#ifndef IE_KERNELS_ISA_H
#define IE_KERNELS_ISA_H

#include "ie_kernels.h"

#include <math.h>

/* --------------------------------------------- CPU features (dispatch.c) */

/* What this CPU can run, from CPUID (the instructions exist) and XGETBV
 * (the OS saves the register state they need): an AVX bit is set only if
 * the OS saves YMM state, an AVX-512 bit only if it saves opmask and ZMM
 * state. The one probe of the library: ie_isa_supported and every
 * feature test inside a kernel (vdpbf16ps) read it. */
enum {
    IE_CPU_AVX2 = 1u << 0,
    IE_CPU_FMA = 1u << 1,
    IE_CPU_F16C = 1u << 2,
    IE_CPU_AVX512F = 1u << 3,
    IE_CPU_AVX512DQ = 1u << 4,
    IE_CPU_AVX512BW = 1u << 5,
    IE_CPU_AVX512VL = 1u << 6,
    IE_CPU_AVX512_VNNI = 1u << 7, /* vpdpbusd: the int8 dot products */
    IE_CPU_AVX512_BF16 = 1u << 8, /* vdpbf16ps: the bf16 dot products */
    /* AMX (CPUID.(7,0):EDX bits 24, 25, 22), set only if XCR0 enables the
     * tile state (bits 17 XTILECFG and 18 XTILEDATA); the process must
     * still be granted it (ie_isa_supported(IE_ISA_AMX) asks) */
    IE_CPU_AMX_TILE = 1u << 9,
    IE_CPU_AMX_INT8 = 1u << 10,
    IE_CPU_AMX_BF16 = 1u << 11
};

/* IE_CPU_* bits of this CPU (0 off x86). Probed once; thread-safe. */
unsigned ie_cpu_features(void);

/* The table of `isa` whether or not this CPU can run it (NULL only for an
 * isa out of range): for tests that inspect the tables themselves. Call
 * nothing from it unless ie_isa_supported(isa). */
const ie_kernels_t *ie_kernels_table(ie_isa_t isa);

/* ---------------------------------------------- shared drivers (drive.c) */

/* Rows per panel so that one panel of weights (~256 KiB) stays in L2 while
 * every token block passes over it; all rows when there is one token block. */
int64_t ie_panel_rows(int64_t n_rows, size_t row_bytes, int64_t n_tok, int tile_tok, int tile_rows);

/* This thread's kernel scratch of at least n bytes, 64-byte aligned: kept
 * (grown when asked for more) for the thread's later calls and freed when
 * it exits (a pthread key); NULL when out of memory. Its contents do not
 * survive another caller on the same thread: a kernel uses it within one
 * call. drive.c. */
void *ie_kernel_scratch(size_t n);

/* A float-weight tile: rows from w (wb bytes apart) against tokens from a
 * (as bytes apart) into y. */
typedef void (*ie_ftile_fn)(const char *w, size_t wb, int64_t n_in, const char *a, size_t as, float *y,
                            int64_t ldy);

/* Float-weight matmul over [r0, r1) x n_tok in L2 panels of tiles:
 * tilesR[t] does tile_rows rows x t tokens, tiles1[t] one row x t tokens
 * (t = 1..tile_tok). */
void ie_matmul_float_drive(ie_dtype_t wt, const ie_ftile_fn *tiles1, const ie_ftile_fn *tilesR, int tile_rows,
                           int tile_tok, const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a,
                           size_t as, int64_t n_tok, float *y, int64_t ldy);

/* Quantize 32 floats to int8 q with scale *d_out; returns sum(q). */
typedef int (*ie_q8_block_fn)(const float *x, int8_t *q, float *d_out);

/* 1/d as ggml computes it, except that a scale so tiny that 1/d overflows
 * quantizes to zeros instead of hitting the undefined float->int
 * conversion of inf (every quantizer here, ref and SIMD, does the same). */
static inline float ie_inv_scale(float d)
{
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return isinf(id) ? 0.0f : id;
}

/* ie_kernels_t.act_quantize on top of an ISA's block quantizer (Q8_0,
 * Q8_1, Q8_P; Q8_K always by ie_quantize_row_q8_k_ref). Q16_P is quantized here by portable scalar code, bit for bit
 * equal to ie_quantize_row_q16_p_ref on every ISA (x * (1/d) rounded half
 * away from zero as trunc(v + copysign(0.5 - 2^-25, v)), which equals
 * roundf(v) for every |v| <= 32768 — checked exhaustively). */
void ie_act_quantize_drive(ie_dtype_t act, const float *x, void *out, int64_t n, ie_q8_block_fn q8);

/* ------------------------------------------------------------------ ref */

/* The reference ie_q8_block_fn: d = amax/127, q = roundf(x * (1/d)). */
int ie_q8_block_ref(const float *x, int8_t *q, float *d_out);

/* Activation quantizers, identical to ggml's quantize_row_q8_{0,1}_ref:
 * d = amax/127, q = roundf(x * (1/d)) (ties away from zero), and for Q8_1
 * s = d * sum(q) (d in f32, rounded to f16 once). n is a multiple of 32. */
void ie_quantize_row_q8_0_ref(const float *x, ie_block_q8_0_t *y, int64_t n);
void ie_quantize_row_q8_1_ref(const float *x, ie_block_q8_1_t *y, int64_t n);

void ie_act_quantize_ref(ie_dtype_t act, const float *x, void *out, int64_t n);

/* Per-type reference matmuls (accumulate in double; integer block sums exact). */
void ie_matmul_f32_f32_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                           int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_f16_f32_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                           int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_bf16_f32_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                            int64_t n_tok, float *y, int64_t ldy);
/* BF16 weights x BF16 activation rows (the REF table's BF16 slot):
 * exact bf16 products summed in double; any n_in. */
void ie_matmul_bf16_bf16_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q8_0_q8_0_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q4_0_q8_0_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q4_1_q8_1_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_mxfp4_q8_0_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                              int64_t n_tok, float *y, int64_t ldy);

/* ---------------------------------------- k-quant codes (kquant_ref.c) */

/* The shape of a k-quant type, or of MXFP4 as its panels hold it
 * (ie_dtype_is_kq_panel): elements per block, sub-blocks per block (0 for
 * the 32-element types: their scale is d alone), code bits, and which
 * fields it has (ie_dtype.h, ie_pack.h). */
typedef struct ie_kq_info {
    int qk;       /* 32 or 256                                       */
    int nsub;     /* 0, 8 or 16                                      */
    int bits;     /* 2 .. 6                                          */
    int has_dmin; /* Q2_K, Q4_K, Q5_K (dmin); Q5_1 (its m)           */
    int has_mn;   /* Q2_K, Q4_K, Q5_K: min codes per sub-block       */
} ie_kq_info_t;

/* 0 and *info filled for a k-quant type or MXFP4, -1 for any other. */
int ie_kq_info(ie_dtype_t t, ie_kq_info_t *info);

/* The code book a type's 4-bit codes index (IQ4_NL, IQ4_XS: ie_iq4nl_kvalues;
 * MXFP4: ie_mxfp4_kvalues), NULL for the types whose codes are integers. */
static inline const int8_t *ie_kq_book(ie_dtype_t t)
{
    if (t == IE_DTYPE_IQ4_NL || t == IE_DTYPE_IQ4_XS) return ie_iq4nl_kvalues;
    return t == IE_DTYPE_MXFP4 ? ie_mxfp4_kvalues : NULL;
}

/* One block's fields, decoded: u[k] the unsigned code of element k (k <
 * qk), sc[j] / mn[j] sub-block j's signed scale / min code exactly as
 * PANEL16 stores them (ie_pack.h: Q3_K and IQ4_XS already minus 32), d
 * and dmin the f16 fields as stored (dmin: Q5_1's m; 0 where absent). */
typedef struct ie_kq_codes {
    uint8_t u[IE_QK_K];
    int8_t sc[16];
    int8_t mn[16];
    ie_f16_t d, dmin;
} ie_kq_codes_t;

/* Decode one ggml block of type t into c. The one place that knows which
 * bits of a ggml block hold which code (dequantize, repack and the
 * quantizers all go through it and ie_kq_encode). MXFP4: d = 2^(e-128) as
 * f16 (ie_pack.h; 0 for a block of +-0 codes); a block that has no such d
 * gives -1. Returns 0, -1 if t is neither a k-quant nor MXFP4. */
int ie_kq_decode(ie_dtype_t t, const void *block, ie_kq_codes_t *c);

/* The panels' d of one MXFP4 block (ggml's { e, qs[16] }): 2^(e-128) as
 * f16 for e in [104, 143], 0 for a block of +-0 codes whatever its e;
 * returns 0, or -1 (d = 0) when neither holds (ie_pack.h). */
int ie_mxfp4_panel_d(const void *block, ie_f16_t *d);

/* The inverse: write the ggml block of type t holding c's fields (codes
 * out of their range are masked to their bits; MXFP4: d must be a power
 * of two in [2^-24, 2^15], or 0 with +-0 codes, giving e = 0). Returns 0 or -1. */
int ie_kq_encode(ie_dtype_t t, const ie_kq_codes_t *c, void *block);

/* Element k's value from c by the type's formula (ie_dtype.h), in f32 in
 * the order gguf.quants computes it: ie_dequantize_row's values. */
float ie_kq_value(ie_dtype_t t, const ie_kq_codes_t *c, int k);

/* ie_quantize_row for a k-quant t (n floats, finite, a multiple of the
 * block size): Q5_0 / Q5_1 by ggml's reference rule, the others by the
 * search quantizers described in kquant_ref.c. Returns 0, -1 if t is not
 * a k-quant or n does not fit its blocks. */
int ie_kq_quantize_row(ie_dtype_t t, const float *src, void *dst, int64_t n);

/* Where one k-quant block's fields sit in a PANEL16 panel (ie_pack.h), in
 * bytes from the start of the block's header: f16 d[16] at d, f16
 * dmin[16] at dmin (info.has_dmin), int8 sc[nsub][16] at sc (nsub > 0),
 * int8 mn[nsub][16] at mn (info.has_mn); absent fields have offset 0.
 * The codes start at `codes`: qk/32 slabs of `slab` (= 64*bits) bytes,
 * planes in the order nibbles (4 chunks, bits >= 4), crumbs (2 chunks,
 * bits 2, 3, 6), bit (1 chunk, bits 3, 5) at nib, crumb, bit from the
 * slab's start. `block` = header + codes: the stride of blocks in a panel,
 * so a panel is (n_in/qk)*block bytes. Defined in pack.c. */
typedef struct ie_kq_panel {
    ie_kq_info_t info;
    size_t d, dmin, sc, mn, codes; /* header offsets, codes offset   */
    size_t slab;                   /* bytes per 32 columns: 64*bits  */
    size_t nib, crumb, bit;        /* plane offsets inside a slab    */
    size_t block;                  /* bytes per block of one panel   */
} ie_kq_panel_t;

/* 0 and *g filled for a k-quant type, -1 for any other. */
int ie_kq_panel(ie_dtype_t t, ie_kq_panel_t *g);

/* The k-quants in ROWS layout (ggml blocks, ie_dtype.h) against their
 * activations (ie_matmul_act_dtype: Q8_P for q5_0/q5_1/iq4_nl, Q8_K for
 * the 256-element types): per block, the integer code x activation sums
 * exactly (int32), then scaled in f32 in a fixed order, summed over blocks
 * in double. Q8_K rows: ie_quantize_row_q8_k_ref (ggml's
 * quantize_row_q8_K rule, n a multiple of 256). */
void ie_quantize_row_q8_k_ref(const float *x, ie_block_q8_k_t *y, int64_t n);
void ie_matmul_q5_0_q8_p_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q5_1_q8_p_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq4_nl_q8_p_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                               int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q2_k_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q3_k_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q4_k_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q5_k_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q6_k_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq4_xs_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                               int64_t n_tok, float *y, int64_t ldy);

/* ---- ggml's grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
 * IQ3_S; ie_dtype.h), computed in their own blocks (ROWS).
 *
 * The grids (kernels/ref/iquant_grids.c, generated from the gguf package by
 * tests/reference/gen_iquant_grids.py): entry e's byte i is element i of a
 * group. A sign byte covers 8 elements (bit i: element i negative); the
 * 7-bit sign codes of IQ2_XXS, IQ2_XS and IQ3_XXS stand for the byte with
 * bit 7 set to make the count of negatives even (ie_iq_signs). */
extern const uint64_t ie_iq2xxs_grid[256];
extern const uint64_t ie_iq2xs_grid[512];
extern const uint64_t ie_iq2s_grid[1024];
extern const uint32_t ie_iq3xxs_grid[256];
extern const uint32_t ie_iq3s_grid[512];
extern const uint64_t ie_iq1s_grid[2048];

/* The sign byte of a 7-bit sign code: bit 7 is the parity of the others. */
static inline uint8_t ie_iq_signs(unsigned c)
{
    c &= 127u;
    return (uint8_t)(c | (unsigned)(__builtin_popcount(c) & 1) << 7);
}

/* One decoded i-quant block: element k is (d * sc[k/16]) * q[k], every
 * product exact in f32 (d is the block's f16 times 2^-3 (IQ2, IQ1) or 2^-2
 * (IQ3_XXS) or 1 (IQ3_S); sc the odd sub-block scale 2s+1 <= 31, per 16
 * elements (repeated for the types that scale per 32); |q| <= 62), which
 * is gguf.quants' value bit for bit. IQ1's q is 8g +- 1 (g in {-1, 0, 1},
 * the +-1/8 delta times 8). */
typedef struct ie_iq_codes {
    float d;
    int8_t sc[IE_QK_K / 16];
    int8_t q[IE_QK_K];
} ie_iq_codes_t;

/* Decode one block of i-quant type t (any bytes are a valid block).
 * Returns 0, or -1 when t is not an i-quant. */
int ie_iq_decode(ie_dtype_t t, const void *block, ie_iq_codes_t *c);

/* The bits of block's f16 scale d (IQ1_M's gathered from its four scale
 * words). */
uint16_t ie_iq_block_d(ie_dtype_t t, const void *block);

/* ROWS i-quant x Q8_K matmuls (the ie_matmul_fn contract): per block the
 * exact integer sum sum_j sc_j sum_{k in j} q_k a_k, then (a.d * d) * isum
 * in f32, blocks summed in double. The oracle of the SIMD versions. */
void ie_matmul_iq_q8_k_ref(ie_dtype_t t, const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a,
                           size_t a_stride, int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_xxs_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_xs_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                               int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_s_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq3_xxs_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq3_s_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq1_s_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq1_m_q8_k_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
/* The same on AVX2 and AVX-512 (iquant_body.h): decoded once a call into
 * int16 sc*q, then int16 dot products; equal integer sums. */
void ie_matmul_iq2_xxs_q8_k_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_xs_q8_k_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_s_q8_k_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                               int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq3_xxs_q8_k_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq3_s_q8_k_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                               int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq1_s_q8_k_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                               int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq1_m_q8_k_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                               int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_xxs_q8_k_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                   int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_xs_q8_k_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                  int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq2_s_q8_k_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq3_xxs_q8_k_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                   int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq3_s_q8_k_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq1_s_q8_k_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_iq1_m_q8_k_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);

/* Packed (ie_pack.h) reference matmul (I8W x Q16_P, I4W/I4WA x Q8_P, BF16,
 * F16 and the k-quants: the oracle of every ISA's matmul_packed) and
 * the Q8_P / Q16_P activation quantizers (n a multiple of 32). */
ie_status_t ie_matmul_packed_ref(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                 int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_matmul_packed_ranges_ref(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                        size_t a_stride, int64_t n_tok, float *y, int64_t ldy);
void ie_quantize_row_q8_p_ref(const float *x, void *out, int64_t n);
void ie_quantize_row_q16_p_ref(const float *x, void *out, int64_t n);

/* Block-sparse (ie_bsr.h): Y[t*ldy + r] = sum_k W[r][k] * X[t][k] for rows
 * r in [r0, r1) (multiples of br, or r1 = n_out) and tokens t < n_tok; X
 * rows xs floats apart. */
void ie_bsr_matmul_ref(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                       float *y, int64_t ldy);

/* Attention (attn_ref.c): double accumulation. */
void ie_attn_scores_ref(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, int hd,
                        float scale, float *s, size_t ld);
void ie_attn_values_ref(const float *p, size_t ld, int nh, const ie_attn_rows_t *v, int j0, int n, int hd,
                        float *out, size_t o_stride);
void ie_kv_scores_ref(ie_kv_type_t t, const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0, int n,
                      int hd, float scale, float *s, size_t ld);
void ie_kv_values_ref(ie_kv_type_t t, const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n,
                      int hd, float *out, size_t o_stride);
void ie_kv_decode_ref(ie_kv_type_t t, const void *src, int hd, float *y);
void ie_kv_attend_ref(const ie_kv_attend_t *a, const ie_attn_state_t *st);

/* -------------------------------------------------------------- generic */

/* Portable C compiled with the library's default flags (attn.c), float
 * accumulation: the AVX2 table's attention (the compiler vectorizes the
 * inner loops). Built without -mfma on purpose: no contraction into FMA,
 * so the bits do not depend on the AVX2 files' flags. */
void ie_attn_scores_generic(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, int hd,
                            float scale, float *s, size_t ld);
void ie_attn_values_generic(const float *p, size_t ld, int nh, const ie_attn_rows_t *v, int j0, int n, int hd,
                            float *out, size_t o_stride);

/* ----------------------------------------------------------------- avx2 */

/* Needs AVX2, FMA and F16C (checked by dispatch.c). */
void ie_act_quantize_avx2(ie_dtype_t act, const float *x, void *out, int64_t n);
void ie_matmul_f32_f32_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                            int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_f16_f32_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                            int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_bf16_bf16_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q8_0_q8_0_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q4_0_q8_0_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q4_1_q8_1_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_mxfp4_q8_0_avx2(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                               int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_matmul_packed_avx2(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                  int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_matmul_packed_ranges_avx2(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                         size_t a_stride, int64_t n_tok, float *y, int64_t ldy);
/* matmul_packed for a k-quant or MXFP4 PANEL16 matrix (ie_dtype_is_kq_panel;
 * ie_pack.h) whose arguments the caller has checked: rows [r0, r1), r0 a
 * multiple of 16, activation rows (Q8_K or Q8_P, ie_matmul_packed_act_dtype) a_stride bytes
 * apart with quants in [-127, 127], as the quantizers produce. Does
 * nothing for another dtype. */
void ie_matmul_packed_kq_avx2(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_bsr_matmul_avx2(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                        float *y, int64_t ldy);
float ie_dot_f32_avx2(const float *a, const float *b, int64_t n);
void ie_axpy_f32_avx2(float *y, float a, const float *x, int64_t n);
void ie_rmsnorm_f32_avx2(float *out, const float *x, const float *w, int64_t n, float eps);
void ie_lora_shrink_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                         int64_t ldu);
void ie_lora_expand_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                         const float *u, int64_t ldu);
uint64_t ie_stream_read_avx2(const void *p, size_t n);
void ie_kv_scores_avx2(ie_kv_type_t t, const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0,
                       int n, int hd, float scale, float *s, size_t ld);
void ie_kv_values_avx2(ie_kv_type_t t, const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n,
                       int hd, float *out, size_t o_stride);
void ie_kv_decode_avx2(ie_kv_type_t t, const void *src, int hd, float *y);
void ie_kv_attend_avx2(const ie_kv_attend_t *a, const ie_attn_state_t *st);

/* --------------------------------------------------------------- avx512 */

/* Needs AVX-512 F/BW/VL/DQ and VNNI (checked by dispatch.c). */
void ie_act_quantize_avx512(ie_dtype_t act, const float *x, void *out, int64_t n);
void ie_act_quantize_stream_avx512(ie_dtype_t act, const float *x, void *out, int64_t n);
/* BF16 x BF16 with vdpbf16ps where the CPU has AVX512_BF16, else widened
 * to f32 and FMA. ie_avx512_use_dpbf16(0) forces the fallback (tests),
 * (1) restores the CPU default; returns whether vdpbf16ps is now used. */
void ie_matmul_bf16_bf16_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy);
int ie_avx512_use_dpbf16(int on);
void ie_matmul_f32_f32_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_f16_f32_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q8_0_q8_0_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q4_0_q8_0_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_q4_1_q8_1_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                int64_t n_tok, float *y, int64_t ldy);
void ie_matmul_mxfp4_q8_0_avx512(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);
/* matmul_packed for a BF16 PANEL16 matrix whose arguments the caller has
 * checked (rows [r0, r1), r0 a multiple of 16; BF16 activation rows as
 * apart): vdpbf16ps with the rows along the lanes, no horizontal sums;
 * without AVX512_BF16, ie_matmul_packed_avx2. */
void ie_matmul_packed_bf16_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t as,
                                  int64_t n_tok, float *y, int64_t ldy);
/* matmul_packed for an F16 PANEL16 matrix whose arguments the caller has
 * checked, F32 activation rows as bytes apart: vcvtph2ps and FMA with the
 * rows along the lanes. */
void ie_matmul_packed_f16_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t as,
                                 int64_t n_tok, float *y, int64_t ldy);
/* ie_quantize_row_q8_k_ref's bytes, bit for bit, with AVX-512 (n a
 * multiple of 256; out: n/256 ie_block_q8_k_t). */
void ie_quantize_row_q8_k_avx512(const float *x, void *out, int64_t n);
/* matmul_packed / matmul_packed_ranges for the k-quant and MXFP4 PANEL16
 * types (ie_dtype_is_kq_panel; kquant_avx512.c): Q8_K activations for the
 * 256-element types, Q8_P for Q5_0, Q5_1, IQ4_NL and MXFP4. The contracts of the
 * table entries (IE_ERR_INVAL for another dtype). */
ie_status_t ie_matmul_packed_kq_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                       int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_matmul_packed_ranges_kq_avx512(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                              size_t a_stride, int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_matmul_packed_avx512(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                    int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_matmul_packed_ranges_avx512(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                           size_t a_stride, int64_t n_tok, float *y, int64_t ldy);
void ie_bsr_matmul_avx512(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                          float *y, int64_t ldy);
float ie_dot_f32_avx512(const float *a, const float *b, int64_t n);
void ie_axpy_f32_avx512(float *y, float a, const float *x, int64_t n);
void ie_rmsnorm_f32_avx512(float *out, const float *x, const float *w, int64_t n, float eps);
void ie_lora_shrink_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                           int64_t ldu);
void ie_lora_expand_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                           const float *u, int64_t ldu);
void ie_swiglu_f32_avx512(float *out, const float *g, const float *u, int64_t n);
void ie_softmax_sink_f32_avx512(float *x, int64_t n, const float *sink);
void ie_attn_scores_avx512(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, int hd,
                           float scale, float *s, size_t ld);
void ie_attn_values_avx512(const float *p, size_t ld, int nh, const ie_attn_rows_t *v, int j0, int n, int hd,
                           float *out, size_t o_stride);
void ie_kv_scores_avx512(ie_kv_type_t t, const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0,
                         int n, int hd, float scale, float *s, size_t ld);
void ie_kv_values_avx512(ie_kv_type_t t, const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n,
                         int hd, float *out, size_t o_stride);
void ie_kv_decode_avx512(ie_kv_type_t t, const void *src, int hd, float *y);
void ie_kv_attend_avx512(const ie_kv_attend_t *a, const ie_attn_state_t *st);

/* ------------------------------------------------------------------ amx */

/* Steps with fewer tokens than this take the AVX-512 kernels in the AMX
 * table: one full A tile of tokens. On one core of a Xeon with AMX the
 * bf16 tiles won 6x at 16 tokens; at 4 threads they were within noise of
 * AVX-512 from 4 to 32 (docs/PERFORMANCE.md). */
#define IE_AMX_MIN_TOK 16

/* The AMX table's threshold in tokens: IE_AMX_MIN_TOK, or the environment's
 * IE_AMX_MIN_TOK (1..4096, read once; anything else is ignored) so that the
 * crossover can be measured without a rebuild. */
int ie_amx_min_tok(void);

/* Where the AMX table sends a packed matmul of one weight type. */
enum {
    IE_AMX_ROUTE_AVX512 = 0, /* the AVX-512 kernels                                  */
    IE_AMX_ROUTE_I8 = 1,     /* AMX-INT8 tiles on the codes (I8W x Q16_P, I4* x Q8_P)  */
    IE_AMX_ROUTE_BF16 = 2    /* AMX-BF16 tiles (BF16; the int types dequantized to bf16, x BF16 rows) */
};

/* The route of the AMX table's int weight types (I8W, I4W, I4WA; with
 * "bf16" the k-quants and MXFP4 too) from IE_AMX_INT in the environment (read once):
 * "1" or "int8" IE_AMX_ROUTE_I8, "bf16" IE_AMX_ROUTE_BF16, else (unset)
 * IE_AMX_ROUTE_AVX512. On the one Xeon
 * with AMX measured so far the int8 tiles ran slower than AVX-512 VNNI
 * (amx_gemm_body.h) and the bf16 route is not measured yet, so by default
 * only BF16 takes the tiles; the knob is for the tests and for measuring. */
int ie_amx_int_tiles(void);

/* The route the AMX table's packed matmul takes for weights of wtype in a
 * step of n_tok tokens: AVX-512 below ie_amx_min_tok() tokens and for the
 * types without tiles; BF16 on the bf16 tiles where the CPU has AMX-BF16
 * (or they are emulated); the int types as ie_amx_int_tiles() says, and
 * the k-quants and MXFP4 on its bf16 route (the int8 tiles have no GEMM
 * for them), the bf16 route only where the CPU has AMX-BF16. The one rule
 * the AMX table's matmul_packed, MXFP4 slot and act_dtype (pack_amx.c)
 * share. */
int ie_amx_route(ie_dtype_t wtype, int64_t n_tok);

/* 1 if the AMX table runs on the tile emulator: IE_AMX_EMULATE=1 in the
 * environment (read once), an AVX-512 CPU, and no real AMX (real tiles
 * win). Then ie_isa_supported(IE_ISA_AMX) is 1, the table's tile calls go
 * to the _emu GEMMs (~1000x slower than the tiles: tests of the engine's
 * AMX path on machines without AMX), and the _hw entry points refuse. */
int ie_amx_emulated(void);

/* The AMX table's packed matmul (pack_amx.c; needs AVX-512 and the AMX
 * permission, checked by dispatch.c): AMX-INT8 tiles for I8W x Q16_P and
 * I4W, I4WA x Q8_P, AMX-BF16 tiles for BF16 (where the CPU has them) when
 * n_tok >= IE_AMX_MIN_TOK, else (and for every other dtype)
 * ie_matmul_packed_avx512 / _ranges_avx512; the MXFP4 slot on the bf16
 * tiles where ie_amx_route says so. Contracts of the table entries. */
ie_status_t ie_matmul_packed_amx(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                 int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_matmul_packed_ranges_amx(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                        size_t a_stride, int64_t n_tok, float *y, int64_t ldy);
ie_dtype_t ie_act_dtype_amx(ie_dtype_t wtype, int packed, int64_t n_tok);
void ie_matmul_mxfp4_amx(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                         int64_t n_tok, float *y, int64_t ldy);

/* The tile GEMM itself (amx_gemm_body.h), for any n_tok: matmul_packed's
 * contract for I8W, I4W, I4WA (IE_ERR_UNSUPPORTED for another dtype), with
 * y(t, r) the same sum as ie_matmul_packed_ref's up to f32 rounding. isums:
 * NULL, or room for n_tok * (r1 - r0) * (n_in / 32) int32 that receive the
 * exact block dot products of the signed codes and activation quants,
 * [t][r - r0][b] (tests). _hw runs the tiles (IE_ERR_UNSUPPORTED, touching
 * nothing, where ie_isa_supported(IE_ISA_AMX) is 0); _emu runs the same
 * code over the scalar emulator on any CPU. */
ie_status_t ie_amx_gemm_hw(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                           int64_t n_tok, float *y, int64_t ldy, int32_t *isums);
ie_status_t ie_amx_gemm_emu(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                            int64_t n_tok, float *y, int64_t ldy, int32_t *isums);

/* The AMX int8 peak probe (bench_kernels --amx-peak): `iters` rounds of 4
 * independent tdpbssd of 16 x 16 x k_bytes (k_bytes 64: full tiles; 32:
 * the GEMM's one-block slabs), 4 * 2 * 16 * 16 * k_bytes ops a round, on
 * the calling thread. IE_ERR_UNSUPPORTED without AMX, IE_ERR_INVAL for
 * another k_bytes. */
ie_status_t ie_amx_peak_run(int k_bytes, int64_t iters);

/* The AMX-BF16 GEMM (amx_gemm_body.h) for BF16 PANEL16 weights, or I8W /
 * I4W / I4WA / k-quant ones dequantized to bf16 per row block (each value
 * ie_pack_dequant_row's, rounded as ie_f32_to_bf16; a per-thread buffer of
 * ~1 MiB, kept: IE_ERR_NOMEM if it cannot be had), and BF16 activation
 * rows, any n_tok: matmul_packed's contract (IE_ERR_UNSUPPORTED for
 * another dtype), f32 sums of bf16 products in k order (tdpbf16ps:
 * subnormals flushed). _hw: IE_ERR_UNSUPPORTED, touching nothing, without
 * AMX or without AMX-BF16; _emu: over the emulator, any CPU. */
ie_status_t ie_amx_gemm_bf16_hw(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_amx_gemm_bf16_emu(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                 int64_t n_tok, float *y, int64_t ldy);

/* The MXFP4 GEMM on the AMX-BF16 tiles (amx_gemm_body.h): ie_matmul_fn's
 * contract for MXFP4 ROWS weights (rows [r0, r1), any r0) and BF16
 * activation rows, any n_tok; each weight exactly ref's value (bf16 holds
 * every MXFP4 value; subnormals flushed, as the tiles read them), f32 sums
 * of the products in k order. A 128 KiB buffer on the stack, nothing
 * allocated. _hw: IE_ERR_UNSUPPORTED, touching nothing, without AMX or
 * AMX-BF16, else IE_OK; _emu: over the emulator, any CPU. */
ie_status_t ie_amx_mxfp4_hw(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                            int64_t n_tok, float *y, int64_t ldy);
void ie_amx_mxfp4_emu(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                      int64_t n_tok, float *y, int64_t ldy);

/* The tile emulator (amx_emu.c), this thread's state: ldtilecfg (64-byte
 * palette-0/1 config), tilerelease, tilezero, tileloadd, tilestored and
 * tdpb{s,u}{s,u}d (sa, sb: 1 if A, B bytes are signed), tdpbf16ps, with the SDM's
 * semantics. ie_amx_emu_faults returns (and clears) how many #UD/#GP the
 * hardware would have raised, ie_amx_emu_last_fault says the last one.
 * ie_amx_emu_forget_config clears ie_amx_gemm_emu's per-thread "tiles
 * configured" mark (tests that release the tiles behind its back). */
void ie_amx_emu_ldtilecfg(const void *cfg);
void ie_amx_emu_tilerelease(void);
void ie_amx_emu_tilezero(int t);
void ie_amx_emu_tileloadd(int t, const void *base, size_t stride);
void ie_amx_emu_tilestored(int t, void *base, size_t stride);
void ie_amx_emu_tdp(int c, int a, int b, int sa, int sb);
void ie_amx_emu_tdpbf16ps(int c, int a, int b);
int ie_amx_emu_faults(void);
const char *ie_amx_emu_last_fault(void);
void ie_amx_emu_forget_config(void);

/* ------------------------------------------------- shared (dispatch.c) */

/* matmul_packed's signature, and matmul_packed_ranges done by one `mm`
 * call per range (the activations packed per range): the ISAs without a
 * pack-once version, and AVX-512 beyond one token tile or one k pass.
 * Stops at the first range mm fails (its status) or that is out of the
 * matrix (IE_ERR_INVAL). */
typedef ie_status_t (*ie_packed_fn)(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                    int64_t n_tok, float *y, int64_t ldy);
ie_status_t ie_packed_ranges_by_calls(ie_packed_fn mm, const ie_pmat_t *m, ie_panel_next_fn next, void *ctx,
                                      const void *a, size_t a_stride, int64_t n_tok, float *y, int64_t ldy);

#endif
