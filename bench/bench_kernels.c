/* bench_kernels.c — matmul throughput per weight type and ISA.
 *
 * GEMV (decode, n_tok = 1) at model shapes, with the weights cycled through
 * a ~1 GiB pool of copies (2 MiB pages) so every call streams its matrix
 * from DRAM, as decode does. Each GEMV is interleaved with a plain read of
 * the same number of bytes by the same threads (A/B in one run: bandwidth
 * here swings by 1.5x over minutes), and reported as GB/s of weight bytes
 * and as a fraction of that probe.
 * GEMM (prefill, n_tok = 64): GOP/s (2 * n_out * n_in * n_tok per call), by
 * wall clock (median, best) and "cpu": ops over the slowest thread's CPU
 * time, what an idle machine would show (this box is often shared).
 * Rows are split over --threads threads (default 2) of the clocher pool in
 * multiples of 4. Prints figures, asserts nothing; one JSON line per result.
 *
 * BF16 weights take BF16 activations (ie_kernels_act_dtype; vdpbf16ps on
 * AVX512_BF16) and run their GEMM like the packed types: --ptok tokens
 * (default 512) over all five TinyLlama-1.1B shapes.
 *
 * Packed weights (int8w, int4w, int4w_affine in PANEL16, group --group,
 * default 32) run matmul_packed with the activations ie_kernels_act_dtype
 * asks for (int8w: Q16_P, int4w/int4w_affine: Q8_P): GEMV at the
 * TinyLlama-1.1B shapes (incl. k/v 256x2048), same A/B probe, and GEMM with
 * --ptok tokens (default 512). Rows are split over threads in whole panels
 * of 16. The panels hold random quants and small random scales (the
 * kernels' speed does not depend on the values).
 *
 * K-quants (q4_K, q6_K, q5_K, q5_0, iq4_xs, iq4_nl, q3_K, q2_K, q5_1) run
 * matmul_packed over their PANEL16 layout (ie_pack.h; group = block size,
 * --group ignored) with Q8_K or Q8_P activations, the same shapes, probe
 * and GEMM as the int types: compare with int4w in the same run. Their
 * panels hold random codes, small f16 scales and small sub-block codes.
 * --mxfp4-panel runs mxfp4 that way too (IQ4_NL's panels, the layout the
 * engine binds MXFP4 experts in; without it, ggml's rows).
 *
 * The grid i-quants (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m)
 * run in ggml's rows (their only layout) with Q8_K activations; random
 * codes, d ~ 0.01.
 *
 * AMX (--isa amx, or avx512,amx for the A/B in one run): the AVX-512 table
 * but bf16's packed matmul on AMX-BF16 tiles for n_tok >= 16 (and the int
 * types' on AMX-INT8 tiles with IE_AMX_INT=1, or dequantized onto the bf16
 * tiles with BF16 activations with IE_AMX_INT=bf16; IE_AMX_MIN_TOK moves
 * the threshold); the run first prints the tiles' int8 peak on every pool thread (4
 * independent tdpbssd chains, full 64-byte and the GEMM's 32-byte k-slabs)
 * so the GEMM GOP/s can be read as a fraction of it.
 *
 * usage: bench_kernels [--threads N] [--isa ref,avx2,avx512,amx] [--types f32,q4_0,int4w,...]
 *                      [--iters N] [--pool-mib M] [--ntok T] [--ptok T] [--group G]
 */
#define _GNU_SOURCE
#include "ie_kernels.h"
#include "ie_threadpool.h"
#include "../kernels/src/ie_kernels_isa.h" /* ie_kq_info: a k-quant block's fields */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_util.h"


/* ---------------------------------------------------------------- jobs */

typedef struct {
    const ie_kernels_t *ops;
    ie_dtype_t wt;
    int group; /* packed types */
    const uint8_t *w;
    int64_t n_in, n_out, n_tok;
    const void *a;
    size_t as;
    float *y;
    /* read probe */
    const uint8_t *buf;
    size_t bytes;
    uint64_t sink[64];
    double cpu[64]; /* thread CPU seconds of the last run, per thread */
} job_t;

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void matmul_task(void *p, int ith, int nth)
{
    job_t *j = p;
    long b, e; /* rows in units of 4 */
    ie_split_range((long)((j->n_out + 3) / 4), ith, nth, &b, &e);
    const int64_t r0 = 4 * b, r1 = 4 * e < j->n_out ? 4 * e : j->n_out;
    const double c0 = cpu_s();
    if (r0 < r1) ie_kernels_matmul(j->ops, j->wt, j->w, j->n_in, r0, r1, j->a, j->as, j->n_tok, j->y, j->n_out);
    if (ith < 64) j->cpu[ith] = cpu_s() - c0;
}

static int g_half_panel;  /* --half-panel: BF16 and F16 weights in PANEL16 (matmul_packed) */
static int g_mxfp4_panel; /* --mxfp4-panel: MXFP4 in the k-quant panels (the engine's default) */

static int is_packed(ie_dtype_t t)
{
    return t == IE_DTYPE_I8W || t == IE_DTYPE_I4W || t == IE_DTYPE_I4WA || ie_dtype_is_kquant(t) ||
           (g_half_panel && ie_dtype_is_half(t)) || (g_mxfp4_panel && t == IE_DTYPE_MXFP4);
}

/* The packed group of type t: a k-quant's (or MXFP4's) block size, else --group. */
static int packed_group(ie_dtype_t t, int group)
{
    return ie_dtype_is_kq_panel(t) ? ie_dtype_block_elems(t) : group;
}

static void matmul_packed_task(void *p, int ith, int nth)
{
    job_t *j = p;
    long b, e; /* rows in whole panels */
    ie_split_range((long)((j->n_out + IE_PANEL - 1) / IE_PANEL), ith, nth, &b, &e);
    const int64_t r0 = IE_PANEL * b, r1 = IE_PANEL * e < j->n_out ? IE_PANEL * e : j->n_out;
    const ie_pmat_t m = {
        .dtype = j->wt, .group = packed_group(j->wt, j->group), .n_in = j->n_in, .n_out = j->n_out, .data = j->w};
    const double c0 = cpu_s();
    if (r0 < r1) j->ops->matmul_packed(&m, r0, r1, j->a, j->as, j->n_tok, j->y, j->n_out);
    if (ith < 64) j->cpu[ith] = cpu_s() - c0;
}

/* Matrix bytes of an n_out x n_in matrix of type wt (packed: PANEL16). */
static size_t mat_bytes(ie_dtype_t wt, int group, int64_t n_out, int64_t n_in)
{
    return is_packed(wt) ? ie_pack_bytes(wt, packed_group(wt, group), n_in, n_out)
                         : ie_dtype_row_bytes(wt, n_in) * (size_t)n_out;
}


static void read_task(void *p, int ith, int nth)
{
    job_t *j = p;
    long b, e;
    ie_split_range((long)(j->bytes / 64), ith, nth, &b, &e);
    j->sink[ith] = probe_read(j->buf + (size_t)b * 64, (size_t)(e - b) * 64);
}

/* ---------------------------------------------------------------- data */


static uint8_t *g_pool;
static size_t g_pool_bytes;

/* Fill `copies` copies of an n_out x n_in matrix of type wt into the pool:
 * 64 distinct random rows, repeated (the kernels do not care; the caches do). */
static void fill_pool(ie_dtype_t wt, int64_t n_out, int64_t n_in, size_t copies)
{
    const size_t rb = ie_dtype_row_bytes(wt, n_in);
    float *x = malloc((size_t)n_in * sizeof(float));
    for (int64_t r = 0; r < n_out; r++) {
        if (r < 64 && ie_dtype_is_iquant(wt)) { /* no quantizer: random codes, d = +-0.01 (IQ1_M: 0x2000) */
            uint8_t *row = g_pool + (size_t)r * rb;
            for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)(rnd_u64() >> 56);
            for (int64_t b = 0; b < n_in / IE_QK_K; b++) {
                uint8_t *blk = row + (size_t)b * ie_dtype_block_bytes(wt);
                if (wt == IE_DTYPE_IQ1_M) blk[55] = (uint8_t)(blk[55] & 0x0f) | 0x20;
                else blk[0] = 0x1e, blk[1] = 0x21; /* 0x211e ~ 0.0101 */
            }
        } else if (r < 64) {
            for (int64_t k = 0; k < n_in; k++) x[k] = rnd() * 0.05f;
            ie_quantize_row(wt, x, g_pool + (size_t)r * rb, n_in);
        } else {
            memcpy(g_pool + (size_t)r * rb, g_pool + (size_t)(r % 64) * rb, rb);
        }
    }
    const size_t mb = rb * (size_t)n_out;
    for (size_t c = 1; c < copies; c++) memcpy(g_pool + c * mb, g_pool, mb);
    free(x);
}

/* Fill `copies` copies of a PANEL16 matrix: random quants (int8w: never
 * the unused byte 0, i.e. q = -128), scales of +-0.01 and offsets of
 * +-0.05 in f16, zero scales on padding rows. */
static void fill_pool_packed(ie_dtype_t wt, int group, int64_t n_out, int64_t n_in, size_t copies)
{
    ie_kq_info_t kq;
    if (ie_kq_info(wt, &kq) == 0) { /* random codes; per block: d, dmin of +-0.01, sub-block codes 0..31 */
        const size_t pb = ie_pack_panel_bytes(wt, kq.qk, n_in);
        const size_t hs = 32u * (size_t)(1 + kq.has_dmin), hdr = hs + 16u * (size_t)kq.nsub * (1 + kq.has_mn);
        const size_t bb = hdr + 2u * (size_t)kq.qk * (size_t)kq.bits;
        const int64_t np = (n_out + IE_PANEL - 1) / IE_PANEL;
        for (size_t i = 0; i < pb; i++) {
            g_pool[i] = (uint8_t)(g_rng >> 24);
            rnd();
        }
        for (size_t b = 0; b < pb / bb; b++) {
            uint8_t *bp = g_pool + b * bb;
            for (size_t i = 0; i < hs / 2; i++) {
                const uint16_t d = ie_f32_to_f16(rnd() * 0.01f);
                memcpy(bp + 2 * i, &d, 2);
            }
            for (size_t i = hs; i < hdr; i++) bp[i] &= 0x1f;
        }
        for (int64_t p = 1; p < np; p++) memcpy(g_pool + (size_t)p * pb, g_pool, pb);
        for (size_t c = 1; c < copies; c++) memcpy(g_pool + c * pb * (size_t)np, g_pool, pb * (size_t)np);
        return;
    }
    if (ie_dtype_is_half(wt)) { /* 16 random rows in every panel, zero padding rows */
        const size_t pb = ie_pack_panel_bytes(wt, group, n_in);
        const int64_t np = (n_out + IE_PANEL - 1) / IE_PANEL, r1 = n_out < IE_PANEL ? n_out : IE_PANEL;
        float *x = malloc(sizeof(float) * (size_t)n_in * IE_PANEL);
        for (int64_t k = 0; k < n_in * IE_PANEL; k++) x[k] = rnd() * 0.05f;
        ie_pack_quantize(wt, group, IE_QSCALE_ABSMAX, x, n_in, 0, r1, n_out, g_pool);
        free(x);
        for (int64_t p = 1; p < np; p++) memcpy(g_pool + (size_t)p * pb, g_pool, pb);
        const size_t live = (size_t)(n_out % IE_PANEL), sl = wt == IE_DTYPE_BF16 ? 64 : 32; /* bytes per slice */
        if (np > 1 && live) /* BF16: slices of 2 k, F16: of 1 k; row i at 2 * (sl / 32) * i */
            for (size_t c = 0; c < pb / sl; c++)
                memset(g_pool + (size_t)(np - 1) * pb + c * sl + live * (sl / 16), 0,
                       (IE_PANEL - live) * (sl / 16));
        for (size_t c = 1; c < copies; c++) memcpy(g_pool + c * pb * (size_t)np, g_pool, pb * (size_t)np);
        return;
    }
    const size_t pb = ie_pack_panel_bytes(wt, group, n_in), ng = (size_t)(n_in / group);
    const size_t gb = pb / ng, hdr = wt == IE_DTYPE_I4WA ? 64 : 32;
    const int64_t np = (n_out + IE_PANEL - 1) / IE_PANEL;
    for (int64_t p = 0; p < np; p++) {
        uint8_t *pp = g_pool + (size_t)p * pb;
        if (p >= 8) {
            memcpy(pp, g_pool + (size_t)(p % 8) * pb, pb);
            continue;
        }
        for (size_t g = 0; g < ng; g++) {
            uint8_t *gp = pp + g * gb;
            for (size_t i = hdr; i < gb; i++) {
                const uint8_t v = (uint8_t)(g_rng >> 24);
                rnd();
                gp[i] = wt == IE_DTYPE_I8W && v == 0 ? 1 : v;
            }
            for (int i = 0; i < IE_PANEL; i++) {
                const uint16_t d = ie_f32_to_f16(rnd() * 0.01f), m = ie_f32_to_f16(rnd() * 0.05f);
                memcpy(gp + 2 * i, &d, 2);
                if (wt == IE_DTYPE_I4WA) memcpy(gp + 32 + 2 * i, &m, 2);
            }
        }
    }
    /* padding rows of the last panel: zero scales */
    if (n_out % IE_PANEL) {
        uint8_t *pp = g_pool + (size_t)(np - 1) * pb;
        for (size_t g = 0; g < ng; g++)
            for (int64_t i = n_out % IE_PANEL; i < IE_PANEL; i++) memset(pp + g * gb + 2 * i, 0, 2);
    }
    const size_t mb = pb * (size_t)np;
    for (size_t c = 1; c < copies; c++) memcpy(g_pool + c * mb, g_pool, mb);
}

/* ---------------------------------------------------------------- AMX peak */

typedef struct {
    int k_bytes;
    int64_t iters;
    _Atomic int failed;
} peak_job_t;

static void peak_task(void *ctx, int ith, int nth)
{
    peak_job_t *j = ctx;
    (void)ith, (void)nth;
    if (ie_amx_peak_run(j->k_bytes, j->iters) != IE_OK) j->failed = 1;
}

/* The tiles' int8 rate on every pool thread at once (best of 5 runs of
 * ~0.1 s on a 2 GHz core at the advertised 1024 ops/cycle), per k-slab. */
static void amx_peak(ie_threadpool_t *tp, int threads)
{
    const char *why = ie_amx_emulated() ? "IE_AMX_EMULATE=1: the tiles are emulated"
                                        : ie_isa_unsupported_reason(IE_ISA_AMX);
    if (why) {
        printf("amx peak: not supported here (%s)\n", why);
        return;
    }
    for (int k = 64; k >= 32; k /= 2) {
        peak_job_t j = {.k_bytes = k, .iters = 2000000};
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            const double t0 = now_s();
            ie_threadpool_run(tp, peak_task, &j);
            const double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        const double ops = 4.0 * 2.0 * 16 * 16 * k * (double)j.iters * threads;
        printf("amx peak: tdpbssd 16x16x%d, %d thread(s): %.1f GOP/s%s\n", k, threads, ops / best / 1e9,
               j.failed ? " (FAILED on a thread)" : "");
        printf("{\"bench\":\"amx_peak\",\"k_bytes\":%d,\"threads\":%d,\"gops\":%.2f}\n", k, threads,
               ops / best / 1e9);
    }
}

/* ---------------------------------------------------------------- main */

typedef struct {
    int64_t n_out, n_in;
    const char *what;
} shape_t;

int main(int argc, char **argv)
{
    int threads = 2, iters = 15, isa_mask = -1, type_mask = -1;
    int64_t gemm_tok = 64, packed_tok = 512;
    int group = 32;
    size_t pool_mib = 1024;
    static const ie_dtype_t types[] = {IE_DTYPE_F32,    IE_DTYPE_F16,   IE_DTYPE_BF16,    IE_DTYPE_Q8_0,
                                       IE_DTYPE_Q4_0,   IE_DTYPE_Q4_1,  IE_DTYPE_MXFP4,   IE_DTYPE_I8W,
                                       IE_DTYPE_I4W,    IE_DTYPE_I4WA,  IE_DTYPE_Q4_K,    IE_DTYPE_Q6_K,
                                       IE_DTYPE_Q5_K,   IE_DTYPE_Q5_0,  IE_DTYPE_IQ4_XS,  IE_DTYPE_IQ4_NL,
                                       IE_DTYPE_Q3_K,   IE_DTYPE_Q2_K,  IE_DTYPE_Q5_1,    IE_DTYPE_IQ2_XXS,
                                       IE_DTYPE_IQ2_XS, IE_DTYPE_IQ2_S, IE_DTYPE_IQ3_XXS, IE_DTYPE_IQ3_S,
                                       IE_DTYPE_IQ1_S,  IE_DTYPE_IQ1_M};
    const int n_types = (int)(sizeof types / sizeof types[0]);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pool-mib") && i + 1 < argc) pool_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--ntok") && i + 1 < argc) gemm_tok = atol(argv[++i]);
        else if (!strcmp(argv[i], "--ptok") && i + 1 < argc) packed_tok = atol(argv[++i]);
        else if (!strcmp(argv[i], "--group") && i + 1 < argc) group = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            isa_mask = (strstr(s, "ref") ? 1 : 0) | (strstr(s, "avx2") ? 2 : 0) | (strstr(s, "avx512") ? 4 : 0) |
                       (strstr(s, "amx") ? 8 : 0);
        } else if (!strcmp(argv[i], "--half-panel")) {
            g_half_panel = 1;
        } else if (!strcmp(argv[i], "--mxfp4-panel")) {
            g_mxfp4_panel = 1;
        } else if (!strcmp(argv[i], "--types") && i + 1 < argc) {
            type_mask = 0;
            char *s = strdup(argv[++i]);
            for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ","))
                for (int t = 0; t < n_types; t++)
                    if (!strcmp(tok, ie_dtype_name(types[t]))) type_mask |= 1 << t;
            free(s);
        } else {
            fprintf(
                stderr,
                "usage: %s [--threads N] [--isa ref,avx2,avx512,amx] [--types f32,f16,bf16,q8_0,q4_0,q4_1,mxfp4,"
                "int8w,int4w,int4w_affine,q4_K,q6_K,q5_K,q5_0,iq4_xs,iq4_nl,q3_K,q2_K,q5_1] [--iters N] "
                "[--pool-mib M] [--ntok T] [--ptok T] [--group G] [--half-panel] [--mxfp4-panel]\n",
                argv[0]);
            return 2;
        }
    }
    if (isa_mask < 0) isa_mask = 2 | 4; /* ref is far too slow for these shapes unless asked */
    if (iters < 3) iters = 3;
    if (iters > 200) iters = 200;

    ie_threadpool_t *tp = NULL;
    if (ie_threadpool_new(threads, 1, &tp) != IE_OK) {
        fprintf(stderr, "threadpool: %s\n", ie_error_last());
        return 1;
    }
    g_pool_bytes = pool_mib << 20;
    const size_t align = 2u << 20;
    uint8_t *raw = mmap(NULL, g_pool_bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        fprintf(stderr, "cannot map pool\n");
        return 1;
    }
    g_pool = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    madvise(g_pool, g_pool_bytes, MADV_HUGEPAGE);

    static const shape_t gemv_shapes[] = {{2048, 2048, "attn q/o 1B"},
                                          {5632, 2048, "ffn up 1B"},
                                          {2048, 5632, "ffn down 1B"},
                                          {32000, 2048, "lm head 1B"}};
    static const shape_t gemm_shapes[] = {{2048, 2048, "attn q/o 1B"}, {5632, 2048, "ffn up 1B"}};
    /* packed: k/v (256 rows) too, and ffn down in the GEMM */
    static const shape_t pgemv_shapes[] = {{2048, 2048, "attn q/o 1B"},
                                           {256, 2048, "attn k/v 1B"},
                                           {5632, 2048, "ffn up 1B"},
                                           {2048, 5632, "ffn down 1B"},
                                           {32000, 2048, "lm head 1B"}};
    static const shape_t pgemm_shapes[] = {{2048, 2048, "attn q/o 1B"},
                                           {5632, 2048, "ffn up 1B"},
                                           {2048, 5632, "ffn down 1B"}};

    const int64_t max_in = 5632;
    int64_t max_tok = gemm_tok > packed_tok ? gemm_tok : packed_tok;
    if (max_tok < 1) max_tok = 1;
    float *xf = malloc(sizeof(float) * (size_t)max_in);
    /* activation rows of any format: f32 is the widest (4n >= Q16_P's 2n + n/4) */
    uint8_t *acts = malloc(ie_dtype_row_bytes(IE_DTYPE_F32, max_in) * (size_t)max_tok);
    float *yp = malloc(sizeof(float) * 5632 * (size_t)max_tok); /* packed GEMM output */
    float *y = malloc(sizeof(float) * 32000 * (size_t)max_tok); /* GEMV, GEMM (bf16: lm head x ptok) */

    printf("bench_kernels: %d thread(s), %d iters, pool %zu MiB; GEMV GB/s = weight bytes / time "
           "(median), vs a read probe of the same bytes interleaved; GEMM n_tok=%lld GOP/s\n",
           threads, iters, pool_mib, (long long)gemm_tok);
    printf("%-7s %-10s %-12s %-11s %9s %9s %9s %7s %9s\n", "isa", "type", "shape", "", "ms", "GB/s", "probe",
           "frac", "best GB/s");

    if ((isa_mask >> IE_ISA_AMX) & 1) amx_peak(tp, threads);
    for (int ii = 0; ii <= IE_ISA_AMX; ii++) {
        const ie_isa_t isa = (ie_isa_t)ii;
        if (!((isa_mask >> ii) & 1)) continue;
        const ie_kernels_t *ops = ie_kernels_get(isa);
        if (!ops) {
            printf("%s: not supported here\n", ie_isa_name(isa));
            continue;
        }
        for (int ti = 0; ti < n_types; ti++) {
            if (!((type_mask >> ti) & 1)) continue;
            const ie_dtype_t wt = types[ti];
            const int pk = is_packed(wt);
            const ie_dtype_t at = ie_kernels_act_dtype(ops, wt, pk, 1); /* the GEMM's: gat below */
            void (*task)(void *, int, int) = pk ? matmul_packed_task : matmul_task;
            const shape_t *gv = pk ? pgemv_shapes : gemv_shapes, *gm = pk ? pgemm_shapes : gemm_shapes;
            if (wt == IE_DTYPE_BF16) gm = pgemv_shapes;
            const size_t n_gv = pk ? sizeof pgemv_shapes / sizeof pgemv_shapes[0]
                                   : sizeof gemv_shapes / sizeof gemv_shapes[0];
            const size_t n_gm = wt == IE_DTYPE_BF16 ? sizeof pgemv_shapes / sizeof pgemv_shapes[0]
                                : pk                ? sizeof pgemm_shapes / sizeof pgemm_shapes[0]
                                                    : sizeof gemm_shapes / sizeof gemm_shapes[0];
            const int bfg = wt == IE_DTYPE_BF16; /* prefill shapes and token count of the packed types */
            const int64_t gtok = pk || bfg ? packed_tok : gemm_tok;
            const int pg = packed_group(wt, group);
            if (pk && (!ops->matmul_packed || ie_pack_check(wt, pg, 2048) || ie_pack_check(wt, pg, 5632))) {
                printf("%s %s: group %d does not fit the shapes\n", ie_isa_name(isa), ie_dtype_name(wt), group);
                continue;
            }
            char tname[32];
            if (pk && ie_dtype_is_kquant(wt)) snprintf(tname, sizeof tname, "%s", ie_dtype_name(wt));
            else if (pk && wt == IE_DTYPE_MXFP4) snprintf(tname, sizeof tname, "mxfp4/p16");
            else if (pk && !ie_dtype_is_intw(wt)) snprintf(tname, sizeof tname, "%s/p16", ie_dtype_name(wt));
            else if (pk)
                snprintf(tname, sizeof tname, "%s/g%d", wt == IE_DTYPE_I4WA ? "i4wa" : ie_dtype_name(wt), group);
            else snprintf(tname, sizeof tname, "%s", ie_dtype_name(wt));
            for (size_t si = 0; si < n_gv; si++) {
                const shape_t sh = gv[si];
                const size_t mb = mat_bytes(wt, group, sh.n_out, sh.n_in);
                size_t copies = g_pool_bytes / mb;
                if (copies < 2) {
                    printf("pool too small for %s %lldx%lld\n", ie_dtype_name(wt), (long long)sh.n_out,
                           (long long)sh.n_in);
                    continue;
                }
                /* at most 64 copies, but at least 256 MiB of them (when the pool
                 * holds that much) so small matrices (k/v) are not L3-resident */
                {
                    const size_t want = ((256u << 20) + mb - 1) / mb;
                    const size_t cap = want > 64 ? want : 64;
                    if (copies > cap) copies = cap;
                }
                if (pk) fill_pool_packed(wt, group, sh.n_out, sh.n_in, copies);
                else fill_pool(wt, sh.n_out, sh.n_in, copies);
                for (int64_t k = 0; k < sh.n_in; k++) xf[k] = rnd();
                ie_kernels_get(IE_ISA_REF)->act_quantize(at, xf, acts, sh.n_in);
                job_t j = {.ops = ops,
                           .wt = wt,
                           .group = group,
                           .n_in = sh.n_in,
                           .n_out = sh.n_out,
                           .n_tok = 1,
                           .a = acts,
                           .as = ie_dtype_row_bytes(at, sh.n_in),
                           .y = y,
                           .bytes = mb};
                double tm[200], tp_[200];
                size_t c = 0;
                j.w = g_pool;
                ie_threadpool_run(tp, task, &j); /* warm code and pages */
                for (int it = 0; it < iters; it++) {
                    c = (c + 1) % copies;
                    j.buf = g_pool + c * mb;
                    double t0 = now_s();
                    ie_threadpool_run(tp, read_task, &j);
                    tp_[it] = now_s() - t0;
                    c = (c + 1) % copies;
                    j.w = g_pool + c * mb;
                    t0 = now_s();
                    ie_threadpool_run(tp, task, &j);
                    tm[it] = now_s() - t0;
                }
                qsort(tm, (size_t)iters, sizeof tm[0], cmp_d);
                qsort(tp_, (size_t)iters, sizeof tp_[0], cmp_d);
                const double med = tm[iters / 2], best = tm[0], pmed = tp_[iters / 2];
                const double gbs = (double)mb / med / 1e9, pgbs = (double)mb / pmed / 1e9;
                char shape[32];
                snprintf(shape, sizeof shape, "%lldx%lld", (long long)sh.n_out, (long long)sh.n_in);
                printf("%-7s %-10s %-12s %-11s %9.3f %9.1f %9.1f %7.2f %9.1f\n", ie_isa_name(isa), tname, shape,
                       sh.what, med * 1e3, gbs, pgbs, gbs / pgbs, (double)mb / best / 1e9);
                printf("{\"bench\":\"gemv\",\"isa\":\"%s\",\"type\":\"%s\",\"act\":\"%s\",\"group\":%d,\"n_out\":%"
                       "lld,\"n_in\":%lld,"
                       "\"threads\":%d,\"ms\":%.4f,\"gbps\":%.2f,\"probe_gbps\":%.2f,\"frac\":%.3f}\n",
                       ie_isa_name(isa), ie_dtype_name(wt), ie_dtype_name(at), pk ? group : 0, (long long)sh.n_out,
                       (long long)sh.n_in, threads, med * 1e3, gbs, pgbs, gbs / pgbs);
                fflush(stdout);
            }
            if (gtok <= 1) continue;
            for (size_t si = 0; si < n_gm; si++) {
                const shape_t sh = gm[si];
                const size_t mb = mat_bytes(wt, group, sh.n_out, sh.n_in);
                size_t copies = g_pool_bytes / mb;
                if (copies > 16) copies = 16;
                if (copies < 1) continue;
                if (pk) fill_pool_packed(wt, group, sh.n_out, sh.n_in, copies);
                else fill_pool(wt, sh.n_out, sh.n_in, copies);
                const ie_dtype_t gat = ie_kernels_act_dtype(ops, wt, pk, gtok); /* BF16 on AMX's bf16 route */
                const size_t as = ie_dtype_row_bytes(gat, sh.n_in);
                for (int64_t t = 0; t < gtok; t++) {
                    for (int64_t k = 0; k < sh.n_in; k++) xf[k] = rnd();
                    ie_kernels_get(IE_ISA_REF)->act_quantize(gat, xf, acts + (size_t)t * as, sh.n_in);
                }
                job_t j = {.ops = ops,
                           .wt = wt,
                           .group = group,
                           .n_in = sh.n_in,
                           .n_out = sh.n_out,
                           .n_tok = gtok,
                           .a = acts,
                           .as = as,
                           .y = pk && wt != IE_DTYPE_BF16 ? yp : y,
                           .w = g_pool};
                ie_threadpool_run(tp, task, &j);
                const int gi = iters / 2 < 5 ? 5 : iters / 2;
                double tm[200], tc[200];
                for (int it = 0; it < gi; it++) {
                    j.w = g_pool + (size_t)((it + 1) % copies) * mb;
                    const double t0 = now_s();
                    ie_threadpool_run(tp, task, &j);
                    tm[it] = now_s() - t0;
                    tc[it] = 0;
                    for (int i = 0; i < threads && i < 64; i++) tc[it] = j.cpu[i] > tc[it] ? j.cpu[i] : tc[it];
                }
                qsort(tm, (size_t)gi, sizeof tm[0], cmp_d);
                qsort(tc, (size_t)gi, sizeof tc[0], cmp_d);
                const double med = tm[gi / 2];
                const double gops = 2.0 * (double)sh.n_out * (double)sh.n_in * (double)gtok / med / 1e9;
                char shape[48];
                snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)sh.n_out, (long long)sh.n_in,
                         (long long)gtok);
                /* cpu: ops / the slowest thread's CPU time (best run): what the
                 * wall clock would show on an otherwise idle machine */
                printf("%-7s %-10s %-12s %-11s %9.3f %9.1f GOP/s (best %.1f, cpu %.1f)\n", ie_isa_name(isa), tname,
                       shape, "gemm", med * 1e3, gops,
                       2.0 * (double)sh.n_out * (double)sh.n_in * (double)gtok / tm[0] / 1e9,
                       2.0 * (double)sh.n_out * (double)sh.n_in * (double)gtok / tc[0] / 1e9);
                printf("{\"bench\":\"gemm\",\"isa\":\"%s\",\"type\":\"%s\",\"act\":\"%s\",\"group\":%d,\"n_out\":%"
                       "lld,\"n_in\":%lld,\"n_tok\":%lld,"
                       "\"threads\":%d,\"ms\":%.4f,\"gops\":%.2f,\"cpu_gops\":%.2f}\n",
                       ie_isa_name(isa), ie_dtype_name(wt), ie_dtype_name(gat), pk ? group : 0, (long long)sh.n_out,
                       (long long)sh.n_in, (long long)gtok, threads, med * 1e3, gops,
                       2.0 * (double)sh.n_out * (double)sh.n_in * (double)gtok / tc[0] / 1e9);
                fflush(stdout);
            }
        }
    }
    free(xf);
    free(acts);
    free(y);
    free(yp);
    ie_threadpool_destroy(&tp);
    return 0;
}
