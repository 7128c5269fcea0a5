/* bench_amx.c — what the AMX tile instructions cost on this core, and the
 * tile GEMMs against AVX-512 on one core (issue 23; docs/PERFORMANCE.md,
 * "AMX tiles"). Prints "skipped: <reason>" and exits 0 where the CPU or
 * OS has no AMX.
 *
 * 1. Loops of tile instructions, in TSC cycles per iteration's tdp: the
 *    tdp's throughput (4 independent C tiles) and latency (one chain),
 *    tileloadd from L1, with a 4 KiB row stride, from L2 and from L3, a
 *    tdp with its loads, and a tdp whose C is stored and read back by
 *    vector loads (the int GEMMs' per-block epilogue).
 * 2. One core (pinned to the CPU it starts on), a 512-row slice of a
 *    2048 x 2048 matrix (one thread's share at 4 threads), 16 and 512
 *    tokens: the AVX-512 kernel against the tile GEMM for bf16, int8w
 *    (Q8_0) and int4w (Q4_0), GOP/s.
 *
 * usage: bench_amx [--reps N]
 */
#define _GNU_SOURCE
#include "ie_kernels.h"
#include "ie_pack.h"
#include "../kernels/src/ie_kernels_isa.h"

#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    uint8_t b[64];
} cfg_t;
#define LDCFG(c) __asm__ volatile("ldtilecfg %0" ::"m"(*(const cfg_t *)(c)) : "memory")
#define TLOAD_(t, p, s) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(s)) : "memory")
#define TLOAD(t, p, s) TLOAD_(t, p, s)

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
    LDCFG(c);
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
    LOOP("tileloadd from L1", 1, TLOAD(4, l1, 64));
    LOOP("tileloadd, rows 4 KiB apart", 1, TLOAD(4, a + 64 * (i & 63), 4096));
    LOOP("tileloadd from 1 MiB (L2)", 1, TLOAD(6, b + 1024 * (i & 1023), 64));
    LOOP("tileloadd from 8 MiB (L3)", 1, TLOAD(6, b + 1024 * (i & 8191), 64));
    LOOP("chain + A (4 KiB rows) + B (L2) loads", 1, TLOAD(4, a + 64 * (i & 63), 4096);
         TLOAD(6, b + 1024 * (i & 1023), 64); _tile_dpbssd(0, 4, 6));
    LOOP("4 C tiles + 2 A + 2 B loads", 4, TLOAD(4, a + 64 * (i & 63), 4096);
         TLOAD(5, a + 65536 + 64 * (i & 63), 4096); TLOAD(6, b + 2048 * (i & 511), 64);
         TLOAD(7, b + 2048 * (i & 511) + 1024, 64); _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7);
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

static void gemms(int bf16)
{
    const int64_t n_in = 2048, n_out = 2048, rows = 512, toks[2] = {16, 512};
    static const ie_dtype_t types[] = {IE_DTYPE_BF16, IE_DTYPE_I8W, IE_DTYPE_I4W};
    float *wf = malloc(sizeof(float) * n_in * n_out), *x = malloc(sizeof(float) * n_in * 512),
          *y = malloc(sizeof(float) * n_out * 512);
    if (!wf || !x || !y) {
        fprintf(stderr, "bench_amx: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n_in * n_out; i++) wf[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < n_in * 512; i++) x[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
    puts("GEMM, one core, 512 rows x 2048 (GOP/s, best of 4):");
    for (int ti = bf16 ? 0 : 1; ti < 3; ti++) {
        const ie_dtype_t wt = types[ti], at = ie_matmul_act_dtype(wt);
        const size_t as = ie_dtype_row_bytes(at, n_in);
        uint8_t *a = malloc(as * 512);
        void *wd = aligned_alloc(64, (ie_pack_bytes(wt, 32, n_in, n_out) + 63) / 64 * 64);
        if (!a || !wd || ie_pack_quantize(wt, 32, IE_QSCALE_ABSMAX, wf, n_in, 0, n_out, n_out, wd) != 0) {
            fprintf(stderr, "bench_amx: cannot set up %s\n", ie_dtype_name(wt));
            exit(1);
        }
        for (int64_t t = 0; t < 512; t++) ie_act_quantize_ref(at, x + t * n_in, a + t * as, n_in);
        const ie_pmat_t m = {wt, 32, n_in, n_out, wd};
        const tile_fn tiles = wt == IE_DTYPE_BF16 ? ie_amx_gemm_bf16_hw : int_tiles;
        for (int k = 0; k < 2; k++) {
            double best[2] = {1e30, 1e30};
            for (int r = 0; r < 4; r++)
                for (int w = 0; w < 2; w++) {
                    const double t0 = now_s();
                    const ie_status_t st = w ? tiles(&m, 0, rows, a, as, toks[k], y, n_out)
                                             : ie_matmul_packed_avx512(&m, 0, rows, a, as, toks[k], y, n_out);
                    const double dt = now_s() - t0;
                    if (st != IE_OK) {
                        fprintf(stderr, "bench_amx: %s GEMM failed (%d)\n", ie_dtype_name(wt), (int)st);
                        exit(1);
                    }
                    if (dt < best[w]) best[w] = dt;
                }
            const double ops = 2.0 * (double)rows * (double)n_in * (double)toks[k];
            printf("  %-6s %3lld tokens: avx512 %7.1f  amx %7.1f  (amx/avx512 %.2f)\n", ie_dtype_name(wt),
                   (long long)toks[k], ops / best[0] / 1e9, ops / best[1] / 1e9, best[0] / best[1]);
        }
        free(a), free(wd);
    }
    free(wf), free(x), free(y);
}

int main(int argc, char **argv)
{
    int reps = 20000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    const char *why = ie_amx_emulated() ? "IE_AMX_EMULATE=1: no real tiles" : ie_isa_unsupported_reason(IE_ISA_AMX);
    if (why) {
        printf("bench_amx: skipped: %s\n", why);
        return 0;
    }
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(sched_getcpu(), &cs);
    sched_setaffinity(0, sizeof cs, &cs);
    const int bf16 = (ie_cpu_features() & IE_CPU_AMX_BF16) != 0;
    if (!bf16) puts("no AMX-BF16 (CPUID.(7,0):EDX bit 22): its loop and GEMM are left out");
    instruction_costs(reps, bf16);
    gemms(bf16);
    return 0;
}
