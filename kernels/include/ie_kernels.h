/* ie_kernels.h — the math of clocher: pure functions over caller-owned memory.
 *
 * Kernels know nothing of models, files, threads or the network. They
 * allocate in two ways: a per-thread scratch buffer, made on a thread's
 * first call that needs it, kept, freed when the thread exits
 * (ie_kernel_scratch, drive.c), which the AVX-512 BF16 prefill matmul
 * (~0.9 MiB; without memory it takes the tiled path, which needs none and
 * sums in another order) and the AMX table's bf16 route of the packed int
 * types and k-quants (~1 MiB; without memory IE_ERR_NOMEM, the step's
 * status) use; and ie_bsr_from_dense's malloc'd blob (a conversion, not a
 * step kernel). Work is split by the caller: functions that take (ith, nth) do
 * the ith of nth equal shares and may be called concurrently for every ith.
 *
 * Every kernel has a scalar reference twin in kernels/ref/ (the test oracle).
 * SIMD variants (kernels/x86/avx2, kernels/x86/avx512, kernels/x86/amx)
 * are compiled with their own flags, declared in kernels/src/ie_kernels_isa.h, and reach
 * callers through one table per ISA (ie_kernels_t, ie_kernels_get) chosen
 * once at start-up from the CPU's features (ie_isa_best).
 *
 * Matrix convention: a weight matrix W has n_out rows of n_in elements each,
 * stored row-major in its dtype (rows are ie_dtype_row_bytes(dtype, n_in)
 * bytes apart). Activations X are n_tok rows of n_in floats. The product is
 *     Y[t][r] = sum_k W[r][k] * X[t][k]
 */
#ifndef IE_KERNELS_H
#define IE_KERNELS_H

#include "clocher.h" /* ie_status_t: kernels report failures in the API's own terms */
#include "ie_attn.h"
#include "ie_bsr.h"
#include "ie_dtype.h"
#include "ie_kvcache.h"
#include "ie_pack.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ie_isa {
    IE_ISA_REF = 0,    /* portable scalar C: always available, the oracle */
    IE_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C                               */
    IE_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ + VNNI (+BF16 where present) */
    IE_ISA_AMX = 3     /* AVX512's table + AMX-INT8 tiles for multi-token int-weight GEMMs */
} ie_isa_t;

/* "ref", "avx2", "avx512", "amx". */
const char *ie_isa_name(ie_isa_t isa);

/* Best ISA both compiled in and supported by this CPU. Honours the env var
 * IE_ISA=ref|avx2|avx512 (capped at what the CPU supports) and IE_ISA=amx,
 * which is returned even where the CPU or OS cannot run it, so that
 * ie_kernels_get gives NULL and the caller fails with
 * ie_isa_unsupported_reason instead of silently running another path. */
ie_isa_t ie_isa_best(void);

/* 1 if `isa` is compiled in and this CPU can run it. For IE_ISA_AMX the
 * first call asks the kernel for the tile state (arch_prctl
 * ARCH_REQ_XCOMP_PERM, once per process; thread-safe). */
int ie_isa_supported(ie_isa_t isa);

/* Why `isa` cannot run here (static text naming the missing CPUID bit,
 * XCR0 state or refused permission), or NULL if it can. */
const char *ie_isa_unsupported_reason(ie_isa_t isa);

/* Activation format that matmul expects for weights of type `wtype`:
 * F32 for f32/f16 weights, BF16 (bf16 rows, round to nearest even) for bf16
 * weights, Q8_0 for q8_0/q4_0/mxfp4, Q8_1 for q4_1,
 * Q8_P for the packed I4W/I4WA and Q16_P for the packed I8W (matmul_packed);
 * Q8_P for q5_0/q5_1/iq4_nl and Q8_K for q2_K..q6_K and iq4_xs, in either
 * layout (ROWS or PANEL16), except packed MXFP4 (ie_matmul_packed_act_dtype). */
ie_dtype_t ie_matmul_act_dtype(ie_dtype_t wtype);

/* Activation format that matmul_packed expects for PANEL16 weights of type
 * `wtype`: ie_matmul_act_dtype's, except Q8_P for MXFP4 (its panels are
 * IQ4_NL's with another code book, read by the same kernels). */
ie_dtype_t ie_matmul_packed_act_dtype(ie_dtype_t wtype);

/* A source of panel ranges for matmul_packed_ranges: returns 1 and sets
 * [*p0, *p1) (panels of IE_PANEL rows, p0 < p1) to compute next, or 0
 * when no work is left. Several threads may share one source. */
typedef int (*ie_panel_next_fn)(void *ctx, int64_t *p0, int64_t *p1);

/* Dense matmul for one weight dtype (the dtype is the table slot's):
 * Y[t*ldy + r] = dot(W row r, A row t) for rows r in [r0, r1) and tokens
 * t in [0, n_tok). W rows are ie_dtype_row_bytes(wtype, n_in) bytes apart;
 * A rows (in ie_matmul_act_dtype(wtype)) are a_stride bytes apart. Reads
 * each weight row once per token block: the GEMM for prefill and the GEMV
 * for decode (n_tok = 1). Expects r1 > r0 and n_tok > 0; cannot fail.
 * Called through ie_kernels_matmul, which picks the slot and checks both. */
typedef void (*ie_matmul_fn)(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy);

/* Slots of ie_kernels_t.matmul: the dense weight dtypes are all below
 * this (the packed IE_DTYPE_I8W.. go through matmul_packed). */
#define IE_MATMUL_SLOTS (IE_DTYPE_MXFP4 + 1)

/* Every kernel of one ISA: filled once per ISA (dispatch.c), obtained with
 * ie_kernels_get() and read once per call. Entries are named for what they
 * compute; the dense matmuls sit in a slot per weight dtype. On REF every
 * entry is the scalar oracle; an ISA without its own version of an entry
 * holds the nearest one it can run (e.g. AVX2's swiglu is the scalar one).
 *
 * What can fail (the status goes back to the caller, who must not use y):
 *   ie_kernels_matmul     IE_ERR_UNSUPPORTED: the weight dtype has no dense
 *                         kernel (an empty slot, or out of the slots).
 *   matmul_packed,        IE_ERR_INVAL: a bad packed matrix (dtype, group or
 *   matmul_packed_ranges  n_in that ie_pack_check refuses, NULL data) or a
 *                         bad row / panel range, NULL a or y.
 * Nothing else in the table can fail: the other entries take arguments the
 * caller has checked (shapes of the model) and return nothing. The
 * conversions outside the table (ie_quantize_row, ie_pack_*, ie_qrow_*,
 * ie_tensor_slice, ie_bsr_*), run when weights are bound, not in a step,
 * return 0 or -1 as documented with each. */
/* One LoRA-adapted projection for ie_kernels_t.lora_f32: A [rank][n_in]
 * (row stride lda), B transposed [rank][n_out] (row stride ldb), the
 * input rows x (stride ldx) and the output rows y (stride ldy). The
 * strides let a tensor-parallel rank run its slice of A's columns or of
 * B's rows in place. */
typedef struct ie_lora_args {
    const float *a, *bt;        /* f32 weights                        */
    const uint16_t *a16, *bt16; /* or the same as bf16 bits           */
    int64_t lda, ldb;
    int rank;
    int64_t n_in, n_out;
    float scale;
    const float *x;
    int64_t ldx;
    float *y;
    int64_t ldy;
    /* or int8: A[j][k] = a8[j * lda + k] * sa[k], B^T[j][o] =
     * bt8[IE_LORA_BT8_AT(j, o, ldb)] * sbt[o] (one scale per column, over
     * the rank: a column slice keeps its scales, so a tensor-parallel
     * rank's share quantizes as the whole matrix does). B^T is held in
     * groups of four rank rows, a column's four codes side by side (one
     * 32-bit lane of a vpdpbusd: four ranks of one output); the rows past
     * the rank in the last group are 0. A column slice at o is bt8 + 4 *
     * o with the same ldb. */
    const int8_t *a8, *bt8;
    const float *sa, *sbt;
    /* a hint, NULL for none: bytes the caller reads next (its next call),
     * pf_rows rows of pf_len bytes pf_ld apart, which a kernel may fetch
     * into the cache while it runs, paced over its own reads, so the next
     * call does not start cold on rows too short for the hardware
     * prefetchers (the int8 AVX-512 pair fetches them; the others ignore
     * it). Never read, so any address will do. */
    const char *pf;
    int64_t pf_rows, pf_len, pf_ld;
} ie_lora_args_t;

/* The int8 LoRA kernels' activation codes lie within +-IE_LORA_QMAX (15
 * bits: a code splits into a signed high byte q >> 7 and a low byte q & 127
 * that the VNNI kernels multiply with the weights as two byte planes). */
#define IE_LORA_QMAX 16383

/* Index of B^T[j][o] in an int8 B^T of row stride ldb (ie_lora_args_t):
 * (ceil(rank / 4) * ldb * 4 bytes in all) */
#define IE_LORA_BT8_AT(j, o, ldb) ((((size_t)(j) >> 2) * (size_t)(ldb) + (size_t)(o)) * 4u + ((size_t)(j)&3u))

typedef struct ie_kernels {
    ie_isa_t isa;

    /* ---- activations */

    /* Convert n floats (n a multiple of 32 for block formats) into activation
     * format `act` (IE_DTYPE_F32: plain copy, BF16: ie_f32_to_bf16 per element
     * for any n, bit-identical on every ISA, Q8_0, Q8_1, Q8_P, Q16_P; Q8_K,
     * n a multiple of 256, by ie_quantize_row_q8_k_ref on every ISA) at
     * `out`, which holds ie_dtype_row_bytes(act, n) bytes. Another `act`
     * (ie_matmul_act_dtype of a dtype with no kernel) writes nothing; the
     * matmul that would read it reports IE_ERR_UNSUPPORTED. */
    void (*act_quantize)(ie_dtype_t act, const float *x, void *out, int64_t n);

    /* act_quantize's bytes, written for other cores to read next: where the
     * ISA has them (AVX-512: BF16, Q8_P, Q16_P) with non-temporal stores and
     * a store fence, so writing does not first take the lines back from a
     * core that read the previous row there; elsewhere act_quantize. For
     * rows read once by several threads (the worker's decode matmuls), not
     * for rows this core re-reads at once. */
    void (*act_quantize_stream)(ie_dtype_t act, const float *x, void *out, int64_t n);

    /* ---- matmul */

    /* matmul[wtype]: the dense kernel for weights of type wtype (F32, F16,
     * BF16, Q8_0, Q4_0, Q4_1, MXFP4, and the k-quants Q5_0, Q5_1, IQ4_NL,
     * Q2_K..Q6_K, IQ4_XS in ROWS layout), NULL for the others. */
    ie_matmul_fn matmul[IE_MATMUL_SLOTS];

    /* Packed weights (ie_pack.h): Y[t*ldy + r] = dot(W row r, A row t) for
     * r in [r0, r1) — r0 a multiple of 16, r1 = m->n_out or a multiple of
     * 16 — and t < n_tok. A rows are ie_matmul_packed_act_dtype(m->dtype),
     * a_stride bytes apart: Q8_P (I4W, I4WA, Q5_0, Q5_1, IQ4_NL, MXFP4), Q16_P (I8W), BF16
     * (BF16), F32 (F16), or rows of ggml Q8_K blocks (Q2_K..Q6_K, IQ4_XS).
     * k-quants: per block the exact integer sums, then the block's scales
     * in f32; ie_matmul_packed_ref's order (pack_ref.c) is the oracle, the
     * SIMD kernels may scale and sum in another order. Register-
     * and cache-blocked GEMM for prefill, a streaming GEMV (with prefetch)
     * for n_tok = 1. Returns IE_OK, or IE_ERR_INVAL on a bad matrix/range. */
    ie_status_t (*matmul_packed)(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                 int64_t n_tok, float *y, int64_t ldy);

    /* matmul_packed over the panel ranges next(ctx, ...) hands out, in its
     * order, until it returns 0: the rows of panels [p0, p1) get exactly
     * what matmul_packed(m, 16 p0, min(16 p1, n_out), ...) writes. When the
     * activations fit one pass (decode-sized n_tok; AVX-512) they are
     * packed once for all ranges, so ranges may be a few panels: threads
     * can share the work of one matrix through one source (the worker's
     * decode balancing). Returns IE_OK, or IE_ERR_INVAL on a bad matrix or
     * range (the ranges before it are done). */
    ie_status_t (*matmul_packed_ranges)(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                        size_t a_stride, int64_t n_tok, float *y, int64_t ldy);

    /* Block-sparse weights (ie_bsr.h) times f32 activations:
     * Y[t*ldy + r] = sum_k W[r][k] * X[t][k] for rows r in [r0, r1)
     * (multiples of m->br, or r1 = n_out) and tokens t < n_tok; X rows xs
     * floats apart. */
    void (*matmul_bsr)(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                       float *y, int64_t ldy);

    /* ---- vectors */

    /* ie_dot_f32 / ie_axpy_f32 at this ISA's width. Sums in another order
     * than ref: equal within float rounding, not bit for bit. */
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);

    /* ---- attention (ie_attn.h: nh heads sharing one KV head) */

    /* s[h*ld + j] = scale * dot(q + h*q_stride, row(k, j0 + j), hd)
     * for h < nh, j < n. */
    void (*attn_scores)(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, int hd,
                        float scale, float *s, size_t ld);
    /* out[h*o_stride + i] = sum_j p[h*ld + j] * row(v, j0 + j)[i]
     * for h < nh, i < hd (out is overwritten). */
    void (*attn_values)(const float *p, size_t ld, int nh, const ie_attn_rows_t *v, int j0, int n, int hd,
                        float *out, size_t o_stride);

    /* ---- attention over a typed KV cache (ie_kvcache.h): the rows are
     * converted in registers as they are read. The contracts of
     * attn_scores / attn_values with row(k, j) the decoded row, except a
     * q8 K cache: s = ((float)idot * dk) * (dq * scale), idot the exact
     * int32 dot of the int16 query (ie_kv_quantize_q16, scale dq) and the
     * row's int8 values, dk the row's scale — the same bits on every ISA.
     * Other types agree with ie_kv_*_ref within float rounding. Any hd the
     * type holds (ie_kv_head_bytes != 0). */
    void (*kv_scores)(ie_kv_type_t t, const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0, int n,
                      int hd, float scale, float *s, size_t ld);
    void (*kv_values)(ie_kv_type_t t, const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n,
                      int hd, float *out, size_t o_stride);
    /* One head of type t at src, decoded into hd floats (the same bits on
     * every ISA: every conversion is exact, q8/q4 one product each). */
    void (*kv_decode)(ie_kv_type_t t, const void *src, int hd, float *y);
    /* Fused attention with an online softmax (ie_kv_attend_t): the rows
     * are read in tiles of 16 counted from the first (a paged view gives
     * a contiguous one's bits), each tile's scores, their running max and
     * sum of exp, and the f32 output of every head rescaled when the max
     * grows. Writes the state of the rows (ie_attn_state_t: nh heads, any
     * n >= 0; merge with ie_attn_state_merge, normalize with
     * ie_attn_state_finish). Any K and V type pair at an hd both hold;
     * agrees with the ref within float rounding (a q8 K's scores are its
     * bits, as kv_scores'). */
    void (*kv_attend)(const ie_kv_attend_t *a, const ie_attn_state_t *st);

    /* ---- element-wise (the scalar ie_swiglu_f32, ie_softmax_sink_f32 and
     * ie_rmsnorm_f32 are the oracles; the SIMD versions agree within a few
     * float ulps: a polynomial exp instead of libm's expf). Callers split
     * long arrays across threads themselves. */

    /* out[i] = silu(g[i]) * u[i]; out may alias g or u. */
    void (*swiglu)(float *out, const float *g, const float *u, int64_t n);
    /* In-place softmax over n >= 1 values; with sink != NULL the logit
     * *sink joins the normalization and its share is dropped (GPT-OSS's
     * attention sinks): x[i] = exp(x[i]-m) / (sum_j exp(x[j]-m) + exp(*sink-m)). */
    void (*softmax)(float *x, int64_t n, const float *sink);
    /* out = x * (1/sqrt(mean(x^2) + eps)) * w over n >= 1 floats, the
     * square sum in double like ie_rmsnorm_f32 (only the order of its adds
     * differs; each output is the scalar's formula on that scale). out may
     * alias x. */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);

    /* ---- LoRA */

    /* An adapter's low-rank path for the n_rows rows r = rows[t] (its
     * group of tokens) in two passes, so that a pool can split each over
     * the weights and every weight byte is read once a step for the whole
     * group: lora_shrink sets u[t * ldu + j] = scale * dot(A_j, x_r) for
     * j0 <= j < j1; lora_expand then adds y_r[o] += sum_j u[t * ldu + j] *
     * B^T[j][o] for o0 <= o < o1 (j over the whole rank). The weights are
     * int8 with column scales when p->a8 is set, else bf16 when p->a16 is
     * set (widened exactly as they are read), else f32. ie_lora_shrink_ref /
     * ie_lora_expand_ref are the oracles; for f32 and bf16 the SIMD twins
     * sum in another order (agree within float rounding). int8 is integer
     * arithmetic on activations quantized per token to 15-bit codes, and
     * the twins give the oracle's bits (for finite inputs): the shrink
     * takes v_k = x_k * sa_k, m = max |v_k| over the whole row, codes q_k
     * = rne(v_k * (Q / m)) within +-Q (Q = IE_LORA_QMAX; 0 when m is 0),
     * s_j = sum_k a8[j][k] q_k exact (64 bits), u_j = scale * ((float)s_j
     * * (m / Q)); the expand codes u the same way over the rank (m' =
     * max_j |u_j|), s_o = sum_j q_j B8[j][o] exact, y_o = fma((float)s_o *
     * (m' / Q), sbt_o, y_o). (8-bit codes moved a small model's logits by
     * 7.8% of the adapter's effect, against 1.7% for the int8 weights
     * alone; wider codes cost one more vpdpbusd a token.) Any rank >= 1
     * (int8: <= 256, so an output's sum fits 32 bits), n_in, n_out >= 1,
     * 0 <= j0 <= j1 <= rank, 0 <= o0 <= o1 <= n_out. */
    void (*lora_shrink)(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                        int64_t ldu);
    void (*lora_expand)(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                        const float *u, int64_t ldu);
    /* ie_stream_read at this ISA's load width (the same result). */
    uint64_t (*stream_read)(const void *p, size_t n);
    /* The activation rows this table's matmul (packed 0) or matmul_packed
     * (packed 1) reads for weights of wtype in a step of n_tok tokens:
     * ie_matmul_act_dtype's (packed: ie_matmul_packed_act_dtype's), except where a table routes a type elsewhere
     * (the AMX table's bf16 route: BF16 rows). Call ie_kernels_act_dtype. */
    ie_dtype_t (*act_dtype)(ie_dtype_t wtype, int packed, int64_t n_tok);
} ie_kernels_t;

/* The activation format table k's matmul (packed 0) or matmul_packed
 * (packed 1) reads for weights of wtype in a step of n_tok tokens (k's
 * act_dtype): what ie_matmul_act_dtype (packed: ie_matmul_packed_act_dtype)
 * says, except BF16 rows for the int
 * types (I8W, I4W, I4WA) and the k-quants where the AMX table dequantizes
 * them onto its bf16 tiles (IE_AMX_INT=bf16, n_tok at least its
 * threshold). Callers of a table's matmuls ask this, not
 * ie_matmul_act_dtype. */
static inline ie_dtype_t ie_kernels_act_dtype(const ie_kernels_t *k, ie_dtype_t wtype, int packed, int64_t n_tok)
{
    return k->act_dtype(wtype, packed, n_tok);
}

/* The kernels for `isa`, or NULL if not compiled in or not supported by
 * this CPU. The table is static: never freed, safe to share. */
const ie_kernels_t *ie_kernels_get(ie_isa_t isa);

/* The dense matmul for weights of type wtype (ie_kernels_t.matmul[wtype]):
 * IE_OK, or IE_ERR_UNSUPPORTED (and y untouched) when this ISA has no
 * kernel for wtype. An empty range (r1 <= r0 or n_tok <= 0) does nothing
 * and returns IE_OK for a supported wtype. */
static inline ie_status_t ie_kernels_matmul(const ie_kernels_t *k, ie_dtype_t wtype, const void *w, int64_t n_in,
                                            int64_t r0, int64_t r1, const void *a, size_t a_stride, int64_t n_tok,
                                            float *y, int64_t ldy)
{
    if ((unsigned)wtype >= IE_MATMUL_SLOTS || !k->matmul[wtype]) return IE_ERR_UNSUPPORTED;
    if (r1 > r0 && n_tok > 0) k->matmul[wtype](w, n_in, r0, r1, a, a_stride, n_tok, y, ldy);
    return IE_OK;
}

/* Index of the first block among the n elements at src (a row or several,
 * n a multiple of the block size) of ggml block type t whose scale fields
 * (d, dmin, m, e...) are NaN or infinite, or -1 when every one is finite
 * (always -1 for f32/f16/bf16, whose values are checked elsewhere if at
 * all). Run when weights are bound: a NaN scale would poison every sum. */
int64_t ie_quant_find_nonfinite(ie_dtype_t t, const void *src, int64_t n);

/* Dequantize/convert n elements of a row of type t to floats. */
void ie_dequantize_row(ie_dtype_t t, const void *src, float *dst, int64_t n);

/* Quantize/convert n floats into a row of type t (n a multiple of 32 for
 * block types), with ggml's reference rounding so results match files
 * written by llama.cpp's quantizer: Q8_0/Q8_1 d = amax/127; Q4_0
 * d = max/-8 (max = the value of largest magnitude); Q4_1 d = (max-min)/15,
 * m = min; MXFP4 e = floor(log2f(amax)) + 125 (clamped to >= 0; 0 for an
 * all-zero block), i.e. element scale 2^(e-127) puts amax/scale in [4, 8):
 * values above 6*scale saturate to +-6, the rest go to the nearest E2M1
 * value, ties to the smaller magnitude (ggml scans the 16 codes in order,
 * first best wins); Q5_0 d = max/-16, Q5_1 d = (max-min)/31, m = min
 * (ggml's rule, bit-exact with gguf.quants). IQ4_NL, IQ4_XS and Q2_K..Q6_K
 * (n a multiple of their block, 32 or 256) use this engine's own
 * least-squares scale searches (kquant_ref.c; not llama.cpp's bytes).
 * Inputs must be finite. f16/bf16 round to nearest even.
 * Returns 0, or -1 if t is unknown or n does not fit its blocks. */
int ie_quantize_row(ie_dtype_t t, const float *src, void *dst, int64_t n);

/* ---- element-wise and small ops (scalar; the forward pass uses these) ---- */

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may alias x. */
void ie_rmsnorm_f32(float *out, const float *x, const float *w, int64_t n, float eps);
void ie_lora_shrink_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                        int64_t ldu);
void ie_lora_expand_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                        const float *u, int64_t ldu);

/* In-place softmax over n values. */
void ie_softmax_f32(float *x, int64_t n);

/* Softmax with an optional sink logit (GPT-OSS attention sinks): with
 * sink != NULL, *sink joins the normalization and its share is dropped,
 * x[i] = exp(x[i]-m) / (sum_j exp(x[j]-m) + exp(*sink-m)). NULL: plain
 * ie_softmax_f32. */
void ie_softmax_sink_f32(float *x, int64_t n, const float *sink);

/* out[i] = silu(g[i]) * u[i]; out may alias g or u. */
void ie_swiglu_f32(float *out, const float *g, const float *u, int64_t n);

/* Index of the first largest of x[0..n): NaN never counts, -inf never
 * wins; -1 when nothing is usable (n <= 0, every value NaN or -inf). The
 * maximum (-inf when -1) goes to *max_out (may be NULL). Portable C, 16
 * lanes at a time (two passes: the maximum, then its first index); the
 * greedy sampler and the cluster's arg-max rows use it. */
int64_t ie_argmax_f32(const float *x, int64_t n, float *max_out);

/* Rotary embedding on one head vector of head_dim floats at position pos.
 * Pair i (0 <= i < rot_dim/2) rotates by angle pos * theta^(-2i/rot_dim).
 * NORMAL layout pairs (2i, 2i+1) (GGUF llama); NEOX pairs (i, i+rot_dim/2)
 * (HF rotate_half). Elements past rot_dim are untouched. */
typedef enum { IE_ROPE_NORMAL = 0, IE_ROPE_NEOX = 1 } ie_rope_layout_t;
void ie_rope_f32(float *x, int64_t head_dim, int64_t rot_dim, int64_t pos, float theta, ie_rope_layout_t layout);

/* cos/sin tables for one position (rot_dim/2 entries each), computed the way
 * HF transformers does in float32: inv_freq[i] = 1 / theta^((float)(2i)/rot_dim),
 * angle = (float)pos * inv_freq[i], then cos/sin of that float angle
 * (correctly rounded). ie_rope_f32 uses exactly these values. */
void ie_rope_table_f32(float *cos_t, float *sin_t, int64_t rot_dim, int64_t pos, float theta);

/* Precomputed rope: cos/sin tables for one position, rot_dim/2 entries. */
void ie_rope_apply_f32(float *x, int64_t head_dim, int64_t rot_dim, const float *cos_t, const float *sin_t,
                       ie_rope_layout_t layout);

/* dot product of two float vectors, and y += a*x. */
float ie_dot_f32(const float *a, const float *b, int64_t n);
void ie_axpy_f32(float *y, float a, const float *x, int64_t n);

/* Read n bytes at p once, front to back, and return the xor of their
 * 8-byte words in native byte order (the last n % 8 bytes zero-extended
 * into one more word, as if copied to the start of a zeroed word): a plain
 * memory stream with the least work per byte, the ceiling a kernel
 * streaming the same bytes is measured against (ie_worker_stream_probe).
 * Any alignment; n may be 0 (returns 0). The portable oracle; the table's
 * stream_read is the fast one. */
uint64_t ie_stream_read(const void *p, size_t n);

#endif
