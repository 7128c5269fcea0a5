/* bench_amx.c — what the AMX tile instructions cost on this core, and the
 * tile GEMMs against AVX-512 on one core (issue 23; docs/PERFORMANCE.md,
 * "AMX tiles"). Where the CPU or OS has no AMX it says why and times the
 * AVX-512 GEMMs alone.
 *
 * 1. Loops of tile instructions, in TSC cycles per iteration's tdp: the
 *    tdp's throughput (4 independent C tiles) and latency (one chain),
 *    tileloadd from L1, with a 4 KiB row stride, from L2 and from L3, a
 *    tdp with its loads, and a tdp whose C is stored and read back by
 *    vector loads (the int GEMMs' per-block epilogue).
 * 2. N threads at once (default 1), pinned to cpus FIRST.. (default 0),
 *    each with its own 512-row slice of a 2048 x 2048 matrix (one thread's
 *    share at 4 threads), 16 and 512 tokens: the AVX-512 kernel against
 *    the tile GEMM for bf16, int8w (Q8_0) and int4w (Q4_0), and for the
 *    int types their bf16 route (dequantized onto the bf16 tiles, BF16
 *    activation rows); then MXFP4 at GPT-OSS's expert shape (512 x 2880,
 *    16-128 tokens): AVX-512 on ggml's rows (Q8_0) and on the k-quant
 *    panels the engine binds the experts in (Q8_P), against the bf16 tiles
 *    on each (BF16 rows); aggregate GOP/s. Without AMX, the AVX-512 arms
 *    alone.
 *
 * usage: bench_amx [--reps N] [--threads N] [--cpu FIRST]
 */
#define _GNU_SOURCE
#include "ie_kernels.h"
#include "ie_pack.h"
#include "../kernels/src/ie_kernels_isa.h"
#include "../kernels/x86/amx/amx_inl.h"
#include "ie_clock.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

/* tmm0..3 C 16 x 64 bytes, tmm4..5 A 16 x 64, tmm6..7 B 16 x 64. */
static void configure(void)
{
    _Alignas(64) uint8_t c[64];
    memset(c, 0, sizeof c);
    c[0] = 1;
    for (int t = 0; t < 8; t++) {
        const uint16_t cb = 64;
        memcpy(c + 16 + 2 * t, &cb, 2);
        c[48 + t] = 16;
    }
    AMX_LDTILECFG(c);
}

static uint8_t *filled(size_t n)
{
    uint8_t *p = aligned_alloc(4096, n);
    if (!p) {
        fprintf(stderr, "bench_amx: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 7 + 1) & 0x3f);
    return p;
}

/* Time `body` reps times (after one warm-up pass); print cycles per tdp. */
#define LOOP(name, ntdp, body)                                                                        \
    do {                                                                                              \
        uint64_t c0 = 0;                                                                              \
        for (int pass = 0; pass < 2; pass++) {                                                        \
            c0 = __rdtsc();                                                                           \
            for (int i = 0; i < reps; i++) { body; }                                                  \
        }                                                                                             \
        printf("  %-46s %7.1f TSC cycles per tdp\n", name, (double)(__rdtsc() - c0) / reps / (ntdp)); \
    } while (0)

static void instruction_costs(int reps, int bf16)
{
    uint8_t *a = filled(1 << 20), *b = filled(8u << 20), *l1 = filled(4096);
    _Alignas(64) int32_t cb[256];
    __m512 acc = _mm512_setzero_ps();
    configure();
    puts("instruction costs (one core):");
    LOOP("tdpbssd, 4 independent C tiles", 4, _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6);
         _tile_dpbssd(3, 5, 7));
    LOOP("tdpbssd, one dependent chain", 1, _tile_dpbssd(0, 4, 6));
    if (bf16)
        LOOP("tdpbf16ps, 4 independent C tiles", 4, _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
             _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7));
    LOOP("tileloadd from L1", 1, AMX_TILELOADD(4, l1, 64));
    LOOP("tileloadd, rows 4 KiB apart", 1, AMX_TILELOADD(4, a + 64 * (i & 63), 4096));
    LOOP("tileloadd from 1 MiB (L2)", 1, AMX_TILELOADD(6, b + 1024 * (i & 1023), 64));
    LOOP("tileloadd from 8 MiB (L3)", 1, AMX_TILELOADD(6, b + 1024 * (i & 8191), 64));
    LOOP("chain + A (4 KiB rows) + B (L2) loads", 1, AMX_TILELOADD(4, a + 64 * (i & 63), 4096);
         AMX_TILELOADD(6, b + 1024 * (i & 1023), 64); _tile_dpbssd(0, 4, 6));
    LOOP("4 C tiles + 2 A + 2 B loads", 4, AMX_TILELOADD(4, a + 64 * (i & 63), 4096);
         AMX_TILELOADD(5, a + 65536 + 64 * (i & 63), 4096); AMX_TILELOADD(6, b + 2048 * (i & 511), 64);
         AMX_TILELOADD(7, b + 2048 * (i & 511) + 1024, 64); _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7);
         _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7));
    LOOP("tdp + tilestored C + a vector load of it", 1, _tile_dpbssd(0, 4, 6); _tile_stored(0, cb, 64);
         acc = _mm512_add_ps(acc, _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb + 16 * (i & 15))))));
    float sink[16];
    _mm512_storeu_ps(sink, acc);
    if (sink[0] == 12345.0f) puts("");
    free(a), free(b), free(l1);
}

typedef ie_status_t (*tile_fn)(const ie_pmat_t *, int64_t, int64_t, const void *, size_t, int64_t, float *,
                               int64_t);

static ie_status_t int_tiles(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t as, int64_t n_tok,
                             float *y, int64_t ldy)
{
    return ie_amx_gemm_hw(m, r0, r1, a, as, n_tok, y, ldy, NULL);
}

#define N_IN 2048
#define N_OUT 2048
#define ROWS 512 /* one thread's share of N_OUT at 4 threads */
#define MAX_TOK 512
#define MAX_THREADS 64

/* One thread's copy of a type's weights and activations (its own, so that
 * N threads at once read N copies, as N workers' shares would). */
typedef struct {
    ie_dtype_t wt;
    size_t as, abs;
    uint8_t *a, *ab; /* the type's activation rows; BF16 rows (the int types' bf16 route) */
    void *wd;
    float *y;
} gemm_data_t;

typedef struct {
    int n_threads, first_cpu, amx, bf16;
    pthread_barrier_t bar;
    double dt[MAX_THREADS]; /* this measurement's time per thread */
    int failed;
} gemm_run_t;

typedef struct {
    gemm_run_t *run;
    int ith;
} gemm_arg_t;

static void gemm_setup(gemm_data_t *d, ie_dtype_t wt)
{
    const ie_dtype_t at = ie_matmul_act_dtype(wt);
    float *wf = malloc(sizeof(float) * N_IN * N_OUT), *x = malloc(sizeof(float) * N_IN * MAX_TOK);
    d->wt = wt;
    d->as = ie_dtype_row_bytes(at, N_IN);
    d->a = malloc(d->as * MAX_TOK);
    d->abs = ie_dtype_row_bytes(IE_DTYPE_BF16, N_IN);
    d->ab = malloc(d->abs * MAX_TOK);
    d->wd = aligned_alloc(64, (ie_pack_bytes(wt, 32, N_IN, N_OUT) + 63) / 64 * 64);
    d->y = malloc(sizeof(float) * N_OUT * MAX_TOK);
    if (!wf || !x || !d->a || !d->ab || !d->wd || !d->y) {
        fprintf(stderr, "bench_amx: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < (int64_t)N_IN * N_OUT; i++) wf[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < (int64_t)N_IN * MAX_TOK; i++) x[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
    if (ie_pack_quantize(wt, 32, IE_QSCALE_ABSMAX, wf, N_IN, 0, N_OUT, N_OUT, d->wd) != 0) {
        fprintf(stderr, "bench_amx: cannot pack %s\n", ie_dtype_name(wt));
        exit(1);
    }
    for (int64_t t = 0; t < MAX_TOK; t++) {
        ie_act_quantize_ref(at, x + t * N_IN, d->a + t * d->as, N_IN);
        ie_act_quantize_ref(IE_DTYPE_BF16, x + t * N_IN, d->ab + t * d->abs, N_IN);
    }
    free(wf), free(x);
}

static void gemm_free(gemm_data_t *d) { free(d->a), free(d->ab), free(d->wd), free(d->y); }

/* One call of arm w (0: AVX-512) of a GEMM for n_tok tokens. */
typedef ie_status_t (*arm_fn)(const void *ctx, int w, int64_t n_tok);

/* 4 rounds of each of `arms` arms, all threads starting together
 * (barrier): best[w], the slowest thread's time in the best round. */
#define MAX_ARMS 4
static void time_arms(gemm_run_t *run, int ith, int arms, arm_fn call, const void *ctx, int64_t n_tok,
                      double best[MAX_ARMS])
{
    for (int w = 0; w < MAX_ARMS; w++) best[w] = 1e30;
    for (int r = 0; r < 4; r++)
        for (int w = 0; w < arms; w++) {
            pthread_barrier_wait(&run->bar);
            const double t0 = ie_now_s();
            const ie_status_t st = call(ctx, w, n_tok);
            run->dt[ith] = ie_now_s() - t0;
            if (st != IE_OK) run->failed = 1;
            pthread_barrier_wait(&run->bar);
            double slowest = 0.0;
            for (int i = 0; i < run->n_threads; i++) slowest = run->dt[i] > slowest ? run->dt[i] : slowest;
            if (slowest < best[w]) best[w] = slowest;
            pthread_barrier_wait(&run->bar); /* dt read before the next round writes it */
        }
}

/* The packed types' arms: AVX-512; the tiles (bf16, or int8 on the codes);
 * the int types dequantized onto the bf16 tiles. */
static ie_status_t packed_arm(const void *ctx, int w, int64_t n_tok)
{
    const gemm_data_t *d = ctx;
    const ie_pmat_t m = {d->wt, 32, N_IN, N_OUT, d->wd};
    if (w == 2) return ie_amx_gemm_bf16_hw(&m, 0, ROWS, d->ab, d->abs, n_tok, d->y, N_OUT);
    if (w == 1)
        return d->wt == IE_DTYPE_BF16 ? ie_amx_gemm_bf16_hw(&m, 0, ROWS, d->a, d->as, n_tok, d->y, N_OUT)
                                      : int_tiles(&m, 0, ROWS, d->a, d->as, n_tok, d->y, N_OUT);
    return ie_matmul_packed_avx512(&m, 0, ROWS, d->a, d->as, n_tok, d->y, N_OUT);
}

/* GPT-OSS's expert shape (2880 in; ROWS rows: a thread's share of an
 * expert's 2880), MXFP4 in ggml's blocks and in the k-quant panels the
 * engine binds them in (IQ4_NL's, ie_pack.h), as many tokens as an expert
 * meets in a prefill (top-4 of 32: an eighth of the step's). */
#define MX_IN 2880
typedef struct {
    uint8_t *w, *pw;      /* weights: ggml's rows, the panels */
    uint8_t *a, *ap, *ab; /* Q8_0, Q8_P and BF16 activation rows */
    size_t as, aps, abs;
    float *y;
} mx_data_t;

static void mx_setup(mx_data_t *d)
{
    const size_t rb = ie_dtype_row_bytes(IE_DTYPE_MXFP4, MX_IN);
    d->as = ie_dtype_row_bytes(IE_DTYPE_Q8_0, MX_IN);
    d->aps = ie_dtype_row_bytes(IE_DTYPE_Q8_P, MX_IN);
    d->abs = ie_dtype_row_bytes(IE_DTYPE_BF16, MX_IN);
    d->w = malloc(rb * ROWS);
    d->pw = aligned_alloc(64, (ie_pack_bytes(IE_DTYPE_MXFP4, 32, MX_IN, ROWS) + 63) / 64 * 64);
    d->a = malloc(d->as * MAX_TOK);
    d->ap = malloc(d->aps * MAX_TOK);
    d->ab = malloc(d->abs * MAX_TOK);
    d->y = malloc(sizeof(float) * ROWS * MAX_TOK);
    float *x = malloc(sizeof(float) * MX_IN);
    if (!d->w || !d->pw || !d->a || !d->ap || !d->ab || !d->y || !x) {
        fprintf(stderr, "bench_amx: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < rb * ROWS; i++) /* codes of every value; exponents 2^-8 .. 2^-2 */
        d->w[i] = i % sizeof(ie_block_mxfp4_t) ? (uint8_t)((i * 2654435761u) >> 9) : (uint8_t)(120 + i % 7);
    if (ie_pack_repack(IE_DTYPE_MXFP4, 32, d->w, MX_IN, 0, ROWS, ROWS, d->pw) != 0) {
        fprintf(stderr, "bench_amx: MXFP4 repack refused\n");
        exit(1);
    }
    for (int64_t t = 0; t < MAX_TOK; t++) {
        for (int64_t i = 0; i < MX_IN; i++) x[i] = (float)(((t * MX_IN + i) * 40503u) % 1000) / 1000.0f - 0.5f;
        ie_act_quantize_ref(IE_DTYPE_Q8_0, x, d->a + t * d->as, MX_IN);
        ie_act_quantize_ref(IE_DTYPE_Q8_P, x, d->ap + t * d->aps, MX_IN);
        ie_act_quantize_ref(IE_DTYPE_BF16, x, d->ab + t * d->abs, MX_IN);
    }
    free(x);
}

/* MXFP4's arms: AVX-512 on the rows (Q8_0), AVX-512 on the panels (Q8_P,
 * the engine's default), the bf16 tiles on the rows (the MXFP4 slot) and
 * on the panels (the k-quants' bf16 route). */
static ie_status_t mx_arm(const void *ctx, int w, int64_t n_tok)
{
    const mx_data_t *d = ctx;
    const ie_pmat_t m = {IE_DTYPE_MXFP4, 32, MX_IN, ROWS, d->pw};
    switch (w) {
    case 1: return ie_matmul_packed_avx512(&m, 0, ROWS, d->ap, d->aps, n_tok, d->y, ROWS);
    case 2: return ie_amx_mxfp4_hw(d->w, MX_IN, 0, ROWS, d->ab, d->abs, n_tok, d->y, ROWS);
    case 3: return ie_amx_gemm_bf16_hw(&m, 0, ROWS, d->ab, d->abs, n_tok, d->y, ROWS);
    default: ie_matmul_mxfp4_q8_0_avx512(d->w, MX_IN, 0, ROWS, d->a, d->as, n_tok, d->y, ROWS); return IE_OK;
    }
}

/* Each thread, pinned to first_cpu + ith: for every type, token count and
 * arm, 4 rounds of one GEMM call (time_arms); thread 0 prints the
 * aggregate of the slowest. */
static void *gemm_thread(void *p)
{
    const gemm_arg_t *ga = p;
    gemm_run_t *run = ga->run;
    const int ith = ga->ith;
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(run->first_cpu + ith, &cs);
    if (sched_setaffinity(0, sizeof cs, &cs) != 0 && ith == 0) puts("  (could not pin the threads)");
    static const ie_dtype_t types[] = {IE_DTYPE_BF16, IE_DTYPE_I8W, IE_DTYPE_I4W};
    static const int64_t toks[] = {16, MAX_TOK};
    double best[MAX_ARMS];
    for (int ti = run->bf16 ? 0 : 1; ti < 3; ti++) {
        gemm_data_t d;
        gemm_setup(&d, types[ti]);
        const int arms = !run->amx ? 1 : d.wt != IE_DTYPE_BF16 && run->bf16 ? 3 : 2;
        for (int k = 0; k < 2; k++) {
            time_arms(run, ith, arms, packed_arm, &d, toks[k], best);
            if (ith == 0) {
                const double ops = 2.0 * ROWS * N_IN * (double)toks[k] * run->n_threads;
                printf("  %-6s %3lld tokens: avx512 %7.1f", ie_dtype_name(d.wt), (long long)toks[k],
                       ops / best[0] / 1e9);
                if (arms > 1) printf("  amx %7.1f  (amx/avx512 %.2f)", ops / best[1] / 1e9, best[0] / best[1]);
                if (arms > 2) printf("  bf16 route %7.1f  (/avx512 %.2f)", ops / best[2] / 1e9, best[0] / best[2]);
                putchar('\n');
            }
        }
        gemm_free(&d);
    }
    mx_data_t mx;
    mx_setup(&mx);
    static const int64_t mx_toks[] = {16, 32, 64, 128};
    const int mx_arms = run->amx && run->bf16 ? 4 : 2;
    for (int k = 0; k < 4; k++) {
        time_arms(run, ith, mx_arms, mx_arm, &mx, mx_toks[k], best);
        if (ith == 0) {
            const double ops = 2.0 * ROWS * MX_IN * (double)mx_toks[k] * run->n_threads;
            printf("  mxfp4 x %d (GPT-OSS expert) %3lld tokens: avx512 rows %7.1f  panels %7.1f", MX_IN,
                   (long long)mx_toks[k], ops / best[0] / 1e9, ops / best[1] / 1e9);
            if (mx_arms > 2)
                printf("  bf16 tiles: rows %7.1f  panels %7.1f  (/avx512 panels %.2f)", ops / best[2] / 1e9,
                       ops / best[3] / 1e9, best[1] / best[3]);
            putchar('\n');
        }
    }
    free(mx.w), free(mx.pw), free(mx.a), free(mx.ap), free(mx.ab), free(mx.y);
    return NULL;
}

/* The GEMMs on n_threads pinned threads at once (cpus first_cpu...). */
static int gemms(int n_threads, int first_cpu, int amx, int bf16)
{
    gemm_run_t run = {.n_threads = n_threads, .first_cpu = first_cpu, .amx = amx, .bf16 = bf16};
    gemm_arg_t args[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    if (pthread_barrier_init(&run.bar, NULL, (unsigned)n_threads) != 0) return 1;
    printf("GEMM, %d thread(s) at once on cpus %d-%d, each its own %d rows x %d (aggregate GOP/s of the slowest, "
           "best of 4):\n",
           n_threads, first_cpu, first_cpu + n_threads - 1, ROWS, N_IN);
    int started = 0;
    for (; started < n_threads; started++) {
        args[started] = (gemm_arg_t){&run, started};
        if (pthread_create(&th[started], NULL, gemm_thread, &args[started]) != 0) break;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&run.bar);
    if (started < n_threads || run.failed) {
        fprintf(stderr, "bench_amx: %s\n", started < n_threads ? "cannot start the threads" : "a GEMM failed");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 20000, threads = 1, first_cpu = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--cpu") == 0 && i + 1 < argc) first_cpu = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--reps N] [--threads N] [--cpu FIRST]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || threads < 1 || threads > MAX_THREADS || first_cpu < 0) {
        fprintf(stderr, "bench_amx: --reps >= 1, --threads 1..%d, --cpu >= 0\n", MAX_THREADS);
        return 2;
    }
    if (!ie_isa_supported(IE_ISA_AVX512)) {
        printf("bench_amx: skipped: %s\n", ie_isa_unsupported_reason(IE_ISA_AVX512));
        return 0;
    }
    const char *why = ie_amx_emulated() ? "IE_AMX_EMULATE=1: no real tiles" : ie_isa_unsupported_reason(IE_ISA_AMX);
    const int amx = why == NULL, bf16 = amx && (ie_cpu_features() & IE_CPU_AMX_BF16);
    if (!amx) printf("amx: skipped (%s): the AVX-512 GEMMs only\n", why);
    else if (!bf16) puts("no AMX-BF16 (CPUID.(7,0):EDX bit 22): its loop and GEMM are left out");
    if (amx) {
        cpu_set_t cs;
        CPU_ZERO(&cs);
        CPU_SET(first_cpu, &cs);
        sched_setaffinity(0, sizeof cs, &cs);
        instruction_costs(reps, bf16);
    }
    return gemms(threads, first_cpu, amx, amx ? bf16 : 1);
}
