/* dispatch.c — which ISA variants this CPU can run, and their op tables.
 *
 * Support is decided from CPUID (the instructions exist) and XGETBV (the OS
 * saves the AVX / AVX-512 register state on context switch); a CPU that has
 * AVX-512 but an OS that does not enable ZMM state must not use it.
 * IE_ISA_AVX512 requires F, BW, VL, DQ and VNNI (our int8 dot products are
 * vpdpbusd); AVX-512 CPUs without VNNI (Skylake-X) get AVX2.
 */
#include "ie_kernels.h"
#include "ie_kernels_impl.h"

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
    case IE_DTYPE_F32: case IE_DTYPE_F16: return IE_DTYPE_F32;
    case IE_DTYPE_BF16: return IE_DTYPE_BF16; /* vdpbf16ps: bf16 x bf16 pairs */
    case IE_DTYPE_Q8_0: case IE_DTYPE_Q4_0: case IE_DTYPE_MXFP4: return IE_DTYPE_Q8_0;
    case IE_DTYPE_Q4_1: return IE_DTYPE_Q8_1;
    case IE_DTYPE_I8W: return IE_DTYPE_Q16_P; /* weight-only: 16-bit activations */
    case IE_DTYPE_I4W: case IE_DTYPE_I4WA: return IE_DTYPE_Q8_P;
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

/* Bit mask of supported ISAs: bit isa set if the CPU and OS can run it. */
static int detect(void)
{
    int mask = 1 << IE_ISA_REF;
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return mask;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return mask;
    const unsigned long long xcr0 = xgetbv0();
    const int os_avx = (xcr0 & 0x6) == 0x6;      /* XMM | YMM state      */
    const int os_avx512 = (xcr0 & 0xe6) == 0xe6; /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (__get_cpuid_max(0, NULL) < 7) return mask;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx2 = (b >> 5) & 1;
    const int f512 = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const int vnni = (c >> 11) & 1;
    if (os_avx && avx2 && fma && f16c) mask |= 1 << IE_ISA_AVX2;
    if ((mask & (1 << IE_ISA_AVX2)) && os_avx512 && f512 && dq && bw && vl && vnni)
        mask |= 1 << IE_ISA_AVX512;
    return mask;
}
#else
static int detect(void) { return 1 << IE_ISA_REF; }
#endif

static int supported_mask(void)
{
    /* Idempotent: racing first calls compute the same value. */
    static _Atomic int cached = -1;
    int m = cached;
    if (m < 0) cached = m = detect();
    return m;
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
        if (ie_isa_supported((ie_isa_t)i)) { best = (ie_isa_t)i; break; }
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

/* Contract (ie_kernels_impl.h). */
int ie_packed_ranges_by_calls(ie_packed_fn mm, const ie_pmat_t *m, ie_panel_next_fn next, void *ctx,
                              const void *a, size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    int64_t p0, p1;
    if (!m || !next) return -1;
    while (next(ctx, &p0, &p1)) {
        if (p0 < 0 || p1 <= p0 || p0 * IE_PANEL >= m->n_out) return -1;
        const int64_t r1 = p1 * IE_PANEL < m->n_out ? p1 * IE_PANEL : m->n_out;
        if (mm(m, p0 * IE_PANEL, r1, a, a_stride, n_tok, y, ldy) != 0) return -1;
    }
    return 0;
}

static int ranges_ref(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a, size_t a_stride,
                      int64_t n_tok, float *y, int64_t ldy)
{
    return ie_packed_ranges_by_calls(ie_matmul_packed_ref, m, next, ctx, a, a_stride, n_tok, y, ldy);
}

static int ranges_avx2(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a, size_t a_stride,
                       int64_t n_tok, float *y, int64_t ldy)
{
    return ie_packed_ranges_by_calls(ie_matmul_packed_avx2, m, next, ctx, a, a_stride, n_tok, y, ldy);
}

static const ie_matmul_ops_t g_ops[3] = {
    { IE_ISA_REF, ie_act_quantize_ref, ie_matmul_ref, ie_dot_f32, ie_axpy_f32,
      ie_matmul_packed_ref, ranges_ref, ie_bsr_matmul_ref, ie_act_quantize_ref },
    { IE_ISA_AVX2, ie_act_quantize_avx2, ie_matmul_avx2, ie_dot_f32_avx2, ie_axpy_f32_avx2,
      ie_matmul_packed_avx2, ranges_avx2, ie_bsr_matmul_avx2, ie_act_quantize_avx2 },
    { IE_ISA_AVX512, ie_act_quantize_avx512, ie_matmul_avx512, ie_dot_f32_avx512, ie_axpy_f32_avx512,
      ie_matmul_packed_avx512, ie_matmul_packed_ranges_avx512, ie_bsr_matmul_avx512,
      ie_act_quantize_stream_avx512 },
};

const ie_matmul_ops_t *ie_kernels_get(ie_isa_t isa)
{
    if (!ie_isa_supported(isa)) return NULL;
    return &g_ops[isa];
}
