/* dispatch.c — the CPU probe, which ISA variants this CPU can run, and
 * the one kernel table per ISA.
 *
 * Support is decided from CPUID (the instructions exist) and XGETBV (the OS
 * saves the AVX / AVX-512 register state on context switch); a CPU that has
 * AVX-512 but an OS that does not enable ZMM state must not use it.
 * IE_ISA_AVX512 requires F, BW, VL, DQ and VNNI (our int8 dot products are
 * vpdpbusd); AVX-512 CPUs without VNNI (Skylake-X) get AVX2. AVX512_BF16
 * is not required: the BF16 kernels test it themselves (ie_cpu_features).
 *
 * IE_ISA_AMX is the AVX-512 table with the packed matmul of BF16 weights
 * on AMX-BF16 tiles for multi-token steps, and of the int weight types on
 * AMX-INT8 tiles (IE_AMX_INT=1) or dequantized onto the AMX-BF16 tiles
 * (IE_AMX_INT=bf16) where the environment asks for it (pack_amx.c). It needs
 * AVX-512 as above, AMX-TILE and AMX-INT8 in CPUID, the tile state in XCR0
 * (bits 17, 18: Linux 5.16+ sets them) and, Linux's rule for the 8 KiB of
 * tile data every thread's signal frame and XSAVE area then carry, this
 * process's permission: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
 * asked once per process (it covers every thread, present and future;
 * ARCH_GET_XCOMP_PERM confirms it). Without any of these the AMX table is
 * not offered; IE_ISA=amx then fails the worker's start with the reason
 * (ie_isa_unsupported_reason). Where it is offered, ie_isa_best still picks
 * AVX-512 unless IE_ISA=amx asks for it: the tiles have passed their tests
 * and benchmarks on one Xeon with AMX (docs/PERFORMANCE.md), the rest of
 * the test suite has not run with them yet.
 * IE_AMX_EMULATE=1 on an AVX-512 CPU without AMX offers the AMX table with
 * its tiles run by the scalar emulator (kernels/src/amx_emu.c): slow, for
 * testing the engine's whole AMX path on machines without AMX.
 */
#include "ie_kernels.h"
#include "ie_kernels_isa.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define IE_X86 1
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define IE_ARCH_GET_XCOMP_PERM 0x1022
#define IE_ARCH_REQ_XCOMP_PERM 0x1023
#define IE_XFEATURE_XTILEDATA 18
#endif

const char *ie_isa_name(ie_isa_t isa)
{
    switch (isa) {
    case IE_ISA_REF: return "ref";
    case IE_ISA_AVX2: return "avx2";
    case IE_ISA_AVX512: return "avx512";
    case IE_ISA_AMX: return "amx";
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
    default: return ie_dtype_is_iquant(wtype) ? IE_DTYPE_Q8_K : IE_DTYPE_INVALID;
    }
}

ie_dtype_t ie_matmul_packed_act_dtype(ie_dtype_t wtype)
{
    return wtype == IE_DTYPE_MXFP4 ? IE_DTYPE_Q8_P : ie_matmul_act_dtype(wtype);
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
    if ((xcr0 & 0x60000) == 0x60000) { /* XTILECFG | XTILEDATA */
        if ((d >> 24) & 1) f |= IE_CPU_AMX_TILE;
        if ((d >> 25) & 1) f |= IE_CPU_AMX_INT8;
        if ((d >> 22) & 1) f |= IE_CPU_AMX_BF16;
    }
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

/* Why this process may not use the tile data: NULL once the kernel has
 * granted it (asked once; racing first calls both ask, which is harmless:
 * the request is idempotent), else static text. */
static const char *amx_permission(void)
{
    static _Atomic int state; /* 0 not asked, 1 granted, else -errno - 1 */
    int s = state;
    if (s == 0) {
#ifdef IE_ARCH_REQ_XCOMP_PERM
        unsigned long perm = 0;
        s = 1;
        if (syscall(SYS_arch_prctl, IE_ARCH_GET_XCOMP_PERM, &perm) != 0 || !((perm >> IE_XFEATURE_XTILEDATA) & 1)) {
            if (syscall(SYS_arch_prctl, IE_ARCH_REQ_XCOMP_PERM, IE_XFEATURE_XTILEDATA) != 0) s = -errno - 1;
            else if (syscall(SYS_arch_prctl, IE_ARCH_GET_XCOMP_PERM, &perm) != 0 ||
                     !((perm >> IE_XFEATURE_XTILEDATA) & 1))
                s = -EPERM - 1;
        }
#else
        s = -ENOSYS - 1;
#endif
        state = s;
    }
    if (s == 1) return NULL;
    switch (-s - 1) {
    case ENOSYS: return "no arch_prctl(ARCH_REQ_XCOMP_PERM) (not Linux x86-64, or a kernel older than 5.16)";
    case EINVAL:
        return "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused (EINVAL: the kernel does not offer AMX)";
    case ENOSPC: return "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused (ENOSPC: a sigaltstack is too small)";
    case EPERM: return "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused (EPERM: seccomp or policy)";
    default: return "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused";
    }
}

static const unsigned need_avx2 = IE_CPU_AVX2 | IE_CPU_FMA | IE_CPU_F16C;
static const unsigned need_avx512 = IE_CPU_AVX2 | IE_CPU_FMA | IE_CPU_F16C | IE_CPU_AVX512F | IE_CPU_AVX512DQ |
                                    IE_CPU_AVX512BW | IE_CPU_AVX512VL | IE_CPU_AVX512_VNNI;

/* Why this CPU and OS cannot run the real tiles (NULL: they can). */
static const char *amx_hw_reason(void)
{
    const unsigned f = ie_cpu_features();
    if ((f & need_avx512) != need_avx512) return "AMX's table is AVX-512's, and this CPU has no AVX-512 VNNI";
    if (!(f & (IE_CPU_AMX_TILE | IE_CPU_AMX_INT8))) {
#ifdef IE_X86
        unsigned a, b, c, d;
        if (__get_cpuid_max(0, NULL) >= 7) {
            __cpuid_count(7, 0, a, b, c, d);
            if (((d >> 24) & 1) && ((d >> 25) & 1))
                return "the OS does not enable the AMX tile state (XCR0 bits 17/18 clear)";
        }
#endif
        return "no AMX-TILE/AMX-INT8 (CPUID.(7,0):EDX bits 24/25 clear)";
    }
    if (!(f & IE_CPU_AMX_TILE) || !(f & IE_CPU_AMX_INT8))
        return "AMX-TILE without AMX-INT8 (CPUID.(7,0):EDX bit 24/25)";
    return amx_permission();
}

/* Contract (ie_kernels_isa.h). Read once: the table must not change
 * under a running worker. */
int ie_amx_emulated(void)
{
    static _Atomic int state; /* 0 not read, 1 no, 2 yes */
    int s = state;
    if (s == 0) {
        const char *e = getenv("IE_AMX_EMULATE");
        const unsigned f = ie_cpu_features();
        s = e && strcmp(e, "1") == 0 && (f & need_avx512) == need_avx512 && amx_hw_reason() ? 2 : 1;
        state = s;
    }
    return s == 2;
}

/* Contract (ie_kernels_isa.h). */
int ie_amx_min_tok(void)
{
    static _Atomic int cached; /* 0 not read */
    int n = cached;
    if (n == 0) {
        const char *e = getenv("IE_AMX_MIN_TOK");
        char *end = NULL;
        const long v = e ? strtol(e, &end, 10) : 0;
        n = e && end != e && *end == '\0' && v >= 1 && v <= 4096 ? (int)v : IE_AMX_MIN_TOK;
        cached = n;
    }
    return n;
}

/* Contract (ie_kernels_isa.h). */
int ie_amx_int_tiles(void)
{
    static _Atomic int state; /* 0 not read, else the route + 1 */
    int s = state;
    if (s == 0) {
        const char *e = getenv("IE_AMX_INT");
        const int r = !e                                              ? IE_AMX_ROUTE_AVX512
                      : strcmp(e, "1") == 0 || strcmp(e, "int8") == 0 ? IE_AMX_ROUTE_I8
                      : strcmp(e, "bf16") == 0                        ? IE_AMX_ROUTE_BF16
                                                                      : IE_AMX_ROUTE_AVX512;
        s = r + 1;
        state = s;
    }
    return s - 1;
}

/* Contract (ie_kernels_isa.h). */
int ie_amx_route(ie_dtype_t wtype, int64_t n_tok)
{
    if (n_tok < ie_amx_min_tok()) return IE_AMX_ROUTE_AVX512;
    const int bf16 = ie_amx_emulated() || (ie_cpu_features() & IE_CPU_AMX_BF16);
    if (wtype == IE_DTYPE_BF16) return bf16 ? IE_AMX_ROUTE_BF16 : IE_AMX_ROUTE_AVX512;
    const int r = ie_amx_int_tiles();
    if (r == IE_AMX_ROUTE_BF16) /* the int types, the k-quants and MXFP4, dequantized */
        return bf16 && (ie_dtype_is_intw(wtype) || ie_dtype_is_kq_panel(wtype)) ? r : IE_AMX_ROUTE_AVX512;
    return ie_dtype_is_intw(wtype) ? r : IE_AMX_ROUTE_AVX512; /* int8 tiles: the int types only */
}

/* act_dtype of the tables that read what ie_matmul_act_dtype says. */
static ie_dtype_t act_dtype_plain(ie_dtype_t wtype, int packed, int64_t n_tok)
{
    (void)n_tok;
    return packed ? ie_matmul_packed_act_dtype(wtype) : ie_matmul_act_dtype(wtype);
}

/* Contract (ie_kernels.h). */
const char *ie_isa_unsupported_reason(ie_isa_t isa)
{
    const unsigned f = ie_cpu_features();
    switch (isa) {
    case IE_ISA_REF: return NULL;
    case IE_ISA_AVX2:
        return (f & need_avx2) == need_avx2 ? NULL : "no AVX2/FMA/F16C (CPUID) or no YMM state (XCR0)";
    case IE_ISA_AVX512:
        return (f & need_avx512) == need_avx512
                   ? NULL
                   : "no AVX-512 F/BW/VL/DQ/VNNI (CPUID) or no opmask/ZMM state (XCR0)";
    case IE_ISA_AMX: return ie_amx_emulated() ? NULL : amx_hw_reason();
    }
    return "unknown ISA";
}

/* Bit mask of supported ISAs: bit isa set if the CPU and OS can run it. */
static int supported_mask(void)
{
    const unsigned f = ie_cpu_features();
    int mask = 1 << IE_ISA_REF;
    if ((f & need_avx2) == need_avx2) mask |= 1 << IE_ISA_AVX2;
    if ((f & need_avx512) == need_avx512) mask |= 1 << IE_ISA_AVX512;
    return mask;
}

int ie_isa_supported(ie_isa_t isa)
{
    if (isa < IE_ISA_REF || isa > IE_ISA_AMX) return 0;
    /* AMX only when asked about: its check asks the kernel for the tile
     * state, which the default (AVX-512) choice must not do */
    if (isa == IE_ISA_AMX) return ie_isa_unsupported_reason(IE_ISA_AMX) == NULL;
    return (supported_mask() >> isa) & 1;
}

ie_isa_t ie_isa_best(void)
{
    ie_isa_t best = IE_ISA_REF;
    /* AMX only when asked (IE_ISA=amx): measured on one AMX Xeon, but the
     * whole test suite has not run with it (docs/PERFORMANCE.md, "AMX") */
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
        else if (strcmp(env, "amx") == 0) return IE_ISA_AMX; /* forced: fails loudly where it cannot run */
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

/* The i-quants run in their own blocks on every ISA (no panel form). */
#define IE_IQUANT_ROWS(isa)                                                                             \
    [IE_DTYPE_IQ2_XXS] = ie_matmul_iq2_xxs_q8_k_##isa, [IE_DTYPE_IQ2_XS] = ie_matmul_iq2_xs_q8_k_##isa, \
    [IE_DTYPE_IQ2_S] = ie_matmul_iq2_s_q8_k_##isa, [IE_DTYPE_IQ3_XXS] = ie_matmul_iq3_xxs_q8_k_##isa,   \
    [IE_DTYPE_IQ3_S] = ie_matmul_iq3_s_q8_k_##isa, [IE_DTYPE_IQ1_S] = ie_matmul_iq1_s_q8_k_##isa,       \
    [IE_DTYPE_IQ1_M] = ie_matmul_iq1_m_q8_k_##isa

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
                    IE_IQUANT_ROWS(ref),
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
            .act_dtype = act_dtype_plain,
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
                    IE_IQUANT_ROWS(avx2),
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
            .act_dtype = act_dtype_plain,
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
                    IE_IQUANT_ROWS(avx512),
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
            .act_dtype = act_dtype_plain,
        },
};

/* The AMX table: AVX-512's with the packed matmul and MXFP4's on tiles. Made from
 * g_kernels[IE_ISA_AVX512] at run time so that an entry added to the
 * AVX-512 table is in it too (test_kernels checks the difference). */
static ie_kernels_t g_amx;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

static void amx_table_init(void)
{
    g_amx = g_kernels[IE_ISA_AVX512];
    g_amx.isa = IE_ISA_AMX;
    g_amx.matmul_packed = ie_matmul_packed_amx;
    g_amx.matmul_packed_ranges = ie_matmul_packed_ranges_amx;
    g_amx.matmul[IE_DTYPE_MXFP4] = ie_matmul_mxfp4_amx;
    g_amx.act_dtype = ie_act_dtype_amx;
}

/* Contract (ie_kernels_isa.h). */
const ie_kernels_t *ie_kernels_table(ie_isa_t isa)
{
    if (isa < IE_ISA_REF || isa > IE_ISA_AMX) return NULL;
    if (isa == IE_ISA_AMX) {
        pthread_once(&g_amx_once, amx_table_init);
        return &g_amx;
    }
    return &g_kernels[isa];
}

const ie_kernels_t *ie_kernels_get(ie_isa_t isa)
{
    if (!ie_isa_supported(isa)) return NULL;
    return ie_kernels_table(isa);
}
