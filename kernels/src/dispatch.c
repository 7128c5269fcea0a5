/* dispatch.c — the CPU probe, which ISA variants this CPU can run, and
 * the one kernel table per ISA.
 *
 * Support is decided from CPUID (the instructions exist) and XGETBV (the OS
 * saves the AVX / AVX-512 register state on context switch); a CPU that has
 * AVX-512 but an OS that does not enable ZMM state must not use it.
 * IE_ISA_AVX512 requires F, BW, VL, DQ and VNNI (our int8 dot products are
 * vpdpbusd); AVX-512 CPUs without VNNI (Skylake-X) get AVX2. AVX512_BF16
 * is not required: the BF16 kernels test it themselves (ie_cpu_features).
 */
#include "ie_kernels.h"
#include "ie_kernels_isa.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define IE_X86 1
#endif

const char *ie_isa_name(ie_isa_t isa)
{
    switch (isa) {
    case IE_ISA_REF: return "ref";
    case IE_ISA_AVX2: return "avx2";
    case IE_ISA_AVX512: return "avx512";
    }
    return "invalid";
}

ie_dtype_t ie_matmul_act_dtype(ie_dtype_t wtype)
{
    switch (wtype) {
    case IE_DTYPE_F32:
    case IE_DTYPE_F16: return IE_DTYPE_F32;
    case IE_DTYPE_BF16: return IE_DTYPE_BF16; /* vdpbf16ps: bf16 x bf16 pairs */
    case IE_DTYPE_Q8_0:
    case IE_DTYPE_Q4_0:
    case IE_DTYPE_MXFP4: return IE_DTYPE_Q8_0;
    case IE_DTYPE_Q4_1: return IE_DTYPE_Q8_1;
    case IE_DTYPE_I8W: return IE_DTYPE_Q16_P; /* weight-only: 16-bit activations */
    case IE_DTYPE_I4W:
    case IE_DTYPE_I4WA: return IE_DTYPE_Q8_P;
    case IE_DTYPE_Q5_0: /* the 32-element relatives read I4W's activations */
    case IE_DTYPE_Q5_1:
    case IE_DTYPE_IQ4_NL: return IE_DTYPE_Q8_P;
    case IE_DTYPE_Q2_K: /* one scale per super-block: the integer sub-block */
    case IE_DTYPE_Q3_K: /* sums add up before any float (ggml's Q8_K) */
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q5_K:
    case IE_DTYPE_Q6_K:
    case IE_DTYPE_IQ4_XS: return IE_DTYPE_Q8_K;
    default: return IE_DTYPE_INVALID;
    }
}

#ifdef IE_X86
static unsigned long long xgetbv0(void)
{
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static unsigned probe(void)
{
    unsigned f = 0, a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return 0;
    const unsigned long long xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return 0;           /* XMM | YMM state */
    const int os_avx512 = (xcr0 & 0xe6) == 0xe6; /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (fma) f |= IE_CPU_FMA;
    if (f16c) f |= IE_CPU_F16C;
    const unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_sub7 = a;
    if ((b >> 5) & 1) f |= IE_CPU_AVX2;
    if (!os_avx512) return f;
    if ((b >> 16) & 1) f |= IE_CPU_AVX512F;
    if ((b >> 17) & 1) f |= IE_CPU_AVX512DQ;
    if ((b >> 30) & 1) f |= IE_CPU_AVX512BW;
    if ((b >> 31) & 1) f |= IE_CPU_AVX512VL;
    if ((c >> 11) & 1) f |= IE_CPU_AVX512_VNNI;
    if (max_sub7 >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if ((a >> 5) & 1) f |= IE_CPU_AVX512_BF16;
    }
    return f;
}
#else
static unsigned probe(void) { return 0; }
#endif

unsigned ie_cpu_features(void)
{
    /* Idempotent: racing first calls compute the same value. Bit 31 marks
     * "probed" so that a CPU with no features is probed once too. */
    static _Atomic unsigned cached;
    unsigned f = cached;
    if (!f) cached = f = probe() | (1u << 31);
    return f & ~(1u << 31);
}

/* Bit mask of supported ISAs: bit isa set if the CPU and OS can run it. */
static int supported_mask(void)
{
    const unsigned f = ie_cpu_features();
    const unsigned need_avx2 = IE_CPU_AVX2 | IE_CPU_FMA | IE_CPU_F16C;
    const unsigned need_avx512 = need_avx2 | IE_CPU_AVX512F | IE_CPU_AVX512DQ | IE_CPU_AVX512BW | IE_CPU_AVX512VL |
                                 IE_CPU_AVX512_VNNI;
    int mask = 1 << IE_ISA_REF;
    if ((f & need_avx2) == need_avx2) mask |= 1 << IE_ISA_AVX2;
    if ((f & need_avx512) == need_avx512) mask |= 1 << IE_ISA_AVX512;
    return mask;
}

int ie_isa_supported(ie_isa_t isa)
{
    if (isa < IE_ISA_REF || isa > IE_ISA_AVX512) return 0;
    return (supported_mask() >> isa) & 1;
}

ie_isa_t ie_isa_best(void)
{
    ie_isa_t best = IE_ISA_REF;
    for (int i = IE_ISA_AVX512; i > IE_ISA_REF; i--)
        if (ie_isa_supported((ie_isa_t)i)) {
            best = (ie_isa_t)i;
            break;
        }
    const char *env = getenv("IE_ISA");
    if (env && *env) {
        ie_isa_t want = best;
        if (strcmp(env, "ref") == 0) want = IE_ISA_REF;
        else if (strcmp(env, "avx2") == 0) want = IE_ISA_AVX2;
        else if (strcmp(env, "avx512") == 0) want = IE_ISA_AVX512;
        /* Capped at what the CPU can run: walk down to the first supported. */
        while (want > IE_ISA_REF && !ie_isa_supported(want)) want = (ie_isa_t)(want - 1);
        if (want < best) best = want;
    }
    return best;
}

/* Contract (ie_kernels_isa.h). */
ie_status_t ie_packed_ranges_by_calls(ie_packed_fn mm, const ie_pmat_t *m, ie_panel_next_fn next, void *ctx,
                                      const void *a, size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    int64_t p0, p1;
    if (!m || !next) return IE_ERR_INVAL;
    while (next(ctx, &p0, &p1)) {
        if (p0 < 0 || p1 <= p0 || p0 * IE_PANEL >= m->n_out) return IE_ERR_INVAL;
        const int64_t r1 = p1 * IE_PANEL < m->n_out ? p1 * IE_PANEL : m->n_out;
        const ie_status_t st = mm(m, p0 * IE_PANEL, r1, a, a_stride, n_tok, y, ldy);
        if (st != IE_OK) return st;
    }
    return IE_OK;
}

/* The k-quants' ROWS slots, the same scalar reference on every ISA: their
 * fast path is PANEL16 (matmul_packed); ROWS runs with IE_REPACK=0 only. */
#define IE_KQUANT_ROWS_REF                                                                    \
    [IE_DTYPE_Q5_0] = ie_matmul_q5_0_q8_p_ref, [IE_DTYPE_Q5_1] = ie_matmul_q5_1_q8_p_ref,     \
    [IE_DTYPE_IQ4_NL] = ie_matmul_iq4_nl_q8_p_ref, [IE_DTYPE_Q2_K] = ie_matmul_q2_k_q8_k_ref, \
    [IE_DTYPE_Q3_K] = ie_matmul_q3_k_q8_k_ref, [IE_DTYPE_Q4_K] = ie_matmul_q4_k_q8_k_ref,     \
    [IE_DTYPE_Q5_K] = ie_matmul_q5_k_q8_k_ref, [IE_DTYPE_Q6_K] = ie_matmul_q6_k_q8_k_ref,     \
    [IE_DTYPE_IQ4_XS] = ie_matmul_iq4_xs_q8_k_ref

/* One table per ISA, every entry by name; an ISA without its own version
 * of an entry names the one it runs instead. test_kernels checks that no
 * entry that REF fills is NULL on another ISA. */
static const ie_kernels_t g_kernels[3] = {
    [IE_ISA_REF] =
        {
            .isa = IE_ISA_REF,
            .act_quantize = ie_act_quantize_ref,
            .act_quantize_stream = ie_act_quantize_ref,
            .matmul =
                {
                    [IE_DTYPE_F32] = ie_matmul_f32_f32_ref,
                    [IE_DTYPE_F16] = ie_matmul_f16_f32_ref,
                    [IE_DTYPE_BF16] = ie_matmul_bf16_bf16_ref,
                    [IE_DTYPE_Q8_0] = ie_matmul_q8_0_q8_0_ref,
                    [IE_DTYPE_Q4_0] = ie_matmul_q4_0_q8_0_ref,
                    [IE_DTYPE_Q4_1] = ie_matmul_q4_1_q8_1_ref,
                    [IE_DTYPE_MXFP4] = ie_matmul_mxfp4_q8_0_ref,
                    IE_KQUANT_ROWS_REF,
                },
            .matmul_packed = ie_matmul_packed_ref,
            .matmul_packed_ranges = ie_matmul_packed_ranges_ref,
            .matmul_bsr = ie_bsr_matmul_ref,
            .dot_f32 = ie_dot_f32,
            .axpy_f32 = ie_axpy_f32,
            .attn_scores = ie_attn_scores_ref,
            .attn_values = ie_attn_values_ref,
            .kv_scores = ie_kv_scores_ref,
            .kv_values = ie_kv_values_ref,
            .kv_decode = ie_kv_decode_ref,
            .kv_attend = ie_kv_attend_ref,
            .swiglu = ie_swiglu_f32,
            .softmax = ie_softmax_sink_f32,
            .rmsnorm = ie_rmsnorm_f32,
            .lora_shrink = ie_lora_shrink_ref,
            .lora_expand = ie_lora_expand_ref,
            .stream_read = ie_stream_read,
        },
    [IE_ISA_AVX2] =
        {
            .isa = IE_ISA_AVX2,
            .act_quantize = ie_act_quantize_avx2,
            .act_quantize_stream = ie_act_quantize_avx2,
            .matmul =
                {
                    [IE_DTYPE_F32] = ie_matmul_f32_f32_avx2,
                    [IE_DTYPE_F16] = ie_matmul_f16_f32_avx2,
                    [IE_DTYPE_BF16] = ie_matmul_bf16_bf16_avx2,
                    [IE_DTYPE_Q8_0] = ie_matmul_q8_0_q8_0_avx2,
                    [IE_DTYPE_Q4_0] = ie_matmul_q4_0_q8_0_avx2,
                    [IE_DTYPE_Q4_1] = ie_matmul_q4_1_q8_1_avx2,
                    [IE_DTYPE_MXFP4] = ie_matmul_mxfp4_q8_0_avx2,
                    IE_KQUANT_ROWS_REF,
                },
            .matmul_packed = ie_matmul_packed_avx2,
            .matmul_packed_ranges = ie_matmul_packed_ranges_avx2,
            .matmul_bsr = ie_bsr_matmul_avx2,
            .dot_f32 = ie_dot_f32_avx2,
            .axpy_f32 = ie_axpy_f32_avx2,
            .attn_scores = ie_attn_scores_generic,
            .attn_values = ie_attn_values_generic,
            .kv_scores = ie_kv_scores_avx2,
            .kv_values = ie_kv_values_avx2,
            .kv_decode = ie_kv_decode_avx2,
            .kv_attend = ie_kv_attend_avx2,
            .swiglu = ie_swiglu_f32,
            .softmax = ie_softmax_sink_f32,
            .rmsnorm = ie_rmsnorm_f32_avx2,
            .lora_shrink = ie_lora_shrink_avx2,
            .lora_expand = ie_lora_expand_avx2,
            .stream_read = ie_stream_read_avx2,
        },
    [IE_ISA_AVX512] =
        {
            .isa = IE_ISA_AVX512,
            .act_quantize = ie_act_quantize_avx512,
            .act_quantize_stream = ie_act_quantize_stream_avx512,
            .matmul =
                {
                    [IE_DTYPE_F32] = ie_matmul_f32_f32_avx512,
                    [IE_DTYPE_F16] = ie_matmul_f16_f32_avx512,
                    [IE_DTYPE_BF16] = ie_matmul_bf16_bf16_avx512,
                    [IE_DTYPE_Q8_0] = ie_matmul_q8_0_q8_0_avx512,
                    [IE_DTYPE_Q4_0] = ie_matmul_q4_0_q8_0_avx512,
                    [IE_DTYPE_Q4_1] = ie_matmul_q4_1_q8_1_avx512,
                    [IE_DTYPE_MXFP4] = ie_matmul_mxfp4_q8_0_avx512,
                    IE_KQUANT_ROWS_REF,
                },
            .matmul_packed = ie_matmul_packed_avx512,
            .matmul_packed_ranges = ie_matmul_packed_ranges_avx512,
            .matmul_bsr = ie_bsr_matmul_avx512,
            .dot_f32 = ie_dot_f32_avx512,
            .axpy_f32 = ie_axpy_f32_avx512,
            .attn_scores = ie_attn_scores_avx512,
            .attn_values = ie_attn_values_avx512,
            .kv_scores = ie_kv_scores_avx512,
            .kv_values = ie_kv_values_avx512,
            .kv_decode = ie_kv_decode_avx512,
            .kv_attend = ie_kv_attend_avx512,
            .swiglu = ie_swiglu_f32_avx512,
            .softmax = ie_softmax_sink_f32_avx512,
            .rmsnorm = ie_rmsnorm_f32_avx512,
            .lora_shrink = ie_lora_shrink_avx512,
            .lora_expand = ie_lora_expand_avx512,
            /* 32-byte loads here too: a 2-thread read of DRAM measured 1.07x (low
         * bandwidth phase) to 1.13x (high) the rate of 64-byte loads on Zen 4 */
            .stream_read = ie_stream_read_avx2,
        },
};

const ie_kernels_t *ie_kernels_get(ie_isa_t isa)
{
    if (!ie_isa_supported(isa)) return NULL;
    return &g_kernels[isa];
}

/* Contract (ie_kernels_isa.h). */
const ie_kernels_t *ie_kernels_table(ie_isa_t isa)
{
    if (isa < IE_ISA_REF || isa > IE_ISA_AVX512) return NULL;
    return &g_kernels[isa];
}
