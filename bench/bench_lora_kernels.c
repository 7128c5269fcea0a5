/* bench_lora_kernels.c — the int8 LoRA kernels' speed on one core (issue
 * 20): a decode step's adapter work of bench_lora.py's mix part, alone.
 *
 * TinyLlama shapes (22 layers, hidden 2048, k/v 256, FFN 5632), 4 adapters
 * of rank 16, 16, 32, 32 on all seven projections, int8 (ie_lora_args_t:
 * ~76 MB, more than the caches, so each step streams them from DRAM as
 * decode does), 8 tokens in 4 groups of 2. A step runs, per layer,
 * projection and group, lora_shrink over the whole rank then lora_expand
 * over all columns; --threads N (default 1) split the args between N
 * threads of the pool (every Nth each: they stream side by side, as the
 * worker's do), timed in the slowest thread's CPU time (the machine is
 * shared). Each step is interleaved with a plain
 * read of the same bytes (stream_read), A/B in one run: reported as ms a
 * step, GB/s of adapter bytes and a fraction of that read (medians). Each
 * step runs twice, ABBA: without and with the prefetch hints
 * (ie_lora_args_t.pf: the shrink fetching the arg's B^T, the expand the
 * next arg's A, as the worker's passes fetch their next call's). The
 * weights hold random codes (the speed does not depend on them).
 *
 * --layers 1 (3.5 MB) fits the L3: the kernels' arithmetic alone, reported
 * for AVX-512 as vpdpbusd a second per thread beside one core's rate
 * (vnni_rate: 12 independent chains; of_vnni is the fraction).
 *
 * usage: bench_lora_kernels [--isa ref,avx2,avx512] [--iters N] [--layers 1..22] [--threads N] */
#define _GNU_SOURCE
#include "ie_kernels.h"
#include "ie_threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

#define N_LAYER 22
#define N_GROUP 4

/* the thread's CPU seconds: on a shared machine a step's wall time
 * counts the other processes' turns too */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One core's vpdpbusd rate, G/s: 12 independent chains in registers, the
 * most the int8 kernels could issue (the machine's limit for in-cache
 * steps, as the paired read is for steps from DRAM); 0 without AVX-512. */
__attribute__((target("avx512f,avx512vnni"))) static double vnni_rate(void)
{
    __m512i a[12], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
    const long n = 4000000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long k = 0; k < n; k++)
#pragma GCC unroll 12 /* constant indices: the chains stay in registers */
        for (int i = 0; i < 12; i++) __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a[i]) : "v"(w), "v"(x));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return s > 0 ? 12.0 * (double)n / s / 1e9 : 0;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One step's adapter work: thread ith takes every nth arg (shrink then
 * expand), its CPU seconds and the expand's into ts/tx[ith] */
typedef struct {
    const ie_kernels_t *ops;
    const ie_lora_args_t *args;
    int n_args, hint;
    float *u[64];
    double ts[64], tx[64];
} step_t;

static void step_run(void *ctx, int ith, int nth)
{
    step_t *c = ctx;
    const double t0 = now_s();
    double tx = 0;
    for (int k = ith; k < c->n_args; k += nth) {
        const int g = k % N_GROUP;
        const int32_t rows[2] = {2 * g, 2 * g + 1};
        ie_lora_args_t p = c->args[k];
        if (c->hint) /* the shrink fetches this arg's B^T, the expand the next arg's A */
            p.pf = (const char *)p.bt8, p.pf_rows = 1, p.pf_len = (p.rank + 3) / 4 * 4 * p.n_out, p.pf_ld = 0;
        c->ops->lora_shrink(&p, rows, 2, 0, p.rank, c->u[ith], 64);
        const double te = now_s();
        if (c->hint && k + nth < c->n_args)
            p.pf = (const char *)c->args[k + nth].a8, p.pf_len = c->args[k + nth].rank * c->args[k + nth].n_in;
        else p.pf = NULL;
        c->ops->lora_expand(&p, rows, 2, 0, p.n_out, c->u[ith], 64);
        tx += now_s() - te;
    }
    c->ts[ith] = now_s() - t0, c->tx[ith] = tx;
}

int main(int argc, char **argv)
{
    static const int64_t shp[7][2] = {{2048, 2048}, {2048, 256},  {2048, 256}, {2048, 2048},
                                      {2048, 5632}, {2048, 5632}, {5632, 2048}}; /* n_in, n_out */
    static const int ranks[N_GROUP] = {16, 16, 32, 32};
    const char *isas = "avx2,avx512";
    int iters = 15, n_layer = N_LAYER, nth = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--isa")) isas = argv[i + 1];
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) n_layer = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) nth = atoi(argv[i + 1]);
    }
    if (iters < 1 || iters > 1000) iters = 15;
    if (n_layer < 1 || n_layer > N_LAYER) n_layer = N_LAYER;
    if (nth < 1 || nth > 64) nth = 1;
    ie_threadpool_t *tp = NULL;
    if (ie_threadpool_new(nth, 0, &tp) != IE_OK) return 1;
    const int n_args = n_layer * 7 * N_GROUP;
    ie_lora_args_t *args = calloc((size_t)n_args, sizeof *args);
    float *x = calloc(8 * 5632, sizeof(float)), *y = calloc(8 * 5632, sizeof(float)), *u = calloc(64 * 8 * 64, 4);
    size_t bytes = 0;
    double vnni_ops = 0;
    uint64_t seed = 7;
    if (!args || !x || !y || !u) return 1;
    for (int i = 0; i < 8 * 5632; i++) x[i] = (float)((i * 37) % 101 - 50) / 50.0f;
    for (int k = 0; k < n_args; k++) {
        const int m = (k / N_GROUP) % 7, r = ranks[k % N_GROUP];
        const int64_t n_in = shp[m][0], n_out = shp[m][1];
        const size_t na = (size_t)r * (size_t)n_in, nb = (size_t)(r + 3) / 4 * 4 * (size_t)n_out;
        int8_t *a8 = malloc(na), *b8 = malloc(nb);
        float *sa = malloc((size_t)n_in * 4), *sb = malloc((size_t)n_out * 4);
        if (!a8 || !b8 || !sa || !sb) return 1;
        for (size_t i = 0; i < na; i++) seed = seed * 6364136223846793005ull + 1, a8[i] = (int8_t)(seed >> 56);
        for (size_t i = 0; i < nb; i++) seed = seed * 6364136223846793005ull + 1, b8[i] = (int8_t)(seed >> 56);
        for (int64_t i = 0; i < n_in; i++) sa[i] = 1e-3f;
        for (int64_t i = 0; i < n_out; i++) sb[i] = 1e-3f;
        args[k] = (ie_lora_args_t){.lda = n_in,
                                   .ldb = n_out,
                                   .rank = r,
                                   .n_in = n_in,
                                   .n_out = n_out,
                                   .scale = 0.5f,
                                   .x = x,
                                   .ldx = n_in,
                                   .y = y,
                                   .ldy = n_out,
                                   .a8 = a8,
                                   .bt8 = b8,
                                   .sa = sa,
                                   .sbt = sb};
        bytes += na + nb;
        /* the int8 AVX-512 pair's vpdpbusd for 2 tokens: 2 code planes each,
         * per 64 weights of A (rows padded to 64) and of B^T */
        vnni_ops += 4.0 * (double)r * (double)((n_in + 63) / 64 * 64 + n_out) / 64.0;
    }
    /* the read probe: a buffer of the same size */
    uint8_t *buf = malloc(bytes);
    if (!buf) return 1;
    memset(buf, 1, bytes);
    const double vnni = ie_isa_supported(IE_ISA_AVX512) ? vnni_rate() : 0;
    printf("a core's vpdpbusd rate: %.2f G/s\n", vnni);
    printf("adapter bytes a step: %.1f MB (int8), 8 tokens in %d groups of 2, %d threads\n", (double)bytes / 1e6,
           N_GROUP, nth);
    for (ie_isa_t isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get(isa);
        if (!ops || !strstr(isas, ie_isa_name(isa))) continue;
        /* [hint][iteration]: each step run with and without the hints,
         * alternating, then the read */
        double *ts[2], *tex[2], *tr = malloc(sizeof(double) * (size_t)iters);
        for (int h = 0; h < 2; h++)
            ts[h] = malloc(sizeof(double) * (size_t)iters), tex[h] = malloc(sizeof(double) * (size_t)iters);
        uint64_t sink = 0;
        step_t st = {.ops = ops, .args = args, .n_args = n_args};
        for (int i = 0; i < nth; i++) st.u[i] = u + (size_t)i * 8 * 64;
        for (int it = -1; it < iters; it++) /* -1: warm-up */
            for (int hh = 0; hh < 2; hh++) {
                const int h = (it & 1) ? 1 - hh : hh; /* ABBA */
                st.hint = h;
                ie_threadpool_run(tp, step_run, &st);
                double t = 0, tx = 0; /* the slowest thread's */
                for (int i = 0; i < nth; i++)
                    if (st.ts[i] > t) t = st.ts[i], tx = st.tx[i];
                if (it >= 0) ts[h][it] = t, tex[h][it] = tx;
                if (hh) {
                    const double t1 = now_s();
                    sink += ops->stream_read(buf, bytes);
                    if (it >= 0) tr[it] = now_s() - t1;
                }
            }
        qsort(tr, (size_t)iters, sizeof *tr, cmp_d);
        const double r = tr[iters / 2];
        for (int h = 0; h < 2; h++) {
            qsort(ts[h], (size_t)iters, sizeof *ts[h], cmp_d);
            qsort(tex[h], (size_t)iters, sizeof *tex[h], cmp_d);
            const double s = ts[h][iters / 2];
            /* the int8 kernels' vpdpbusd a second per thread, beside the core's rate */
            const double vg = isa == IE_ISA_AVX512 ? vnni_ops / nth / s / 1e9 : 0;
            printf("{\"isa\":\"%s\",\"hints\":%d,\"ms_step\":%.3f,\"ms_expand\":%.3f,\"gbps\":%.1f,"
                   "\"read_gbps\":%.1f,\"of_read\":%.3f,\"vnni_g_per_thread\":%.2f,\"of_vnni\":%.3f,"
                   "\"sink\":%u}\n",
                   ie_isa_name(isa), h, s * 1e3, tex[h][iters / 2] * 1e3, (double)bytes / s / 1e9,
                   (double)bytes / r / 1e9, r / s, vg, vnni > 0 ? vg / vnni : 0, (unsigned)(sink & 1));
            free(ts[h]), free(tex[h]);
        }
        free(tr);
    }
    return 0;
}
