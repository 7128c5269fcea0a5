/* bench_bsr.c — block-sparse (BSR) GEMV vs dense f32 GEMV.
 *
 * For each shape (2048x2048, 5632x2048), block size (16x16, 32x32 by
 * default), density (100%, 50%, 25%, 10% of blocks kept, random masks) and
 * thread count (1, 2; the clocher pool, rows split in whole block rows):
 * time of ops->matmul_bsr with n_tok = 1 (or --ntok) against ops->matmul[F32] on
 * the same matrix stored dense in f32. Matrices are cycled through a pool of
 * copies (> L3) so every call streams its bytes from DRAM, as decode does;
 * each timed call is preceded by a plain read of the same number of bytes
 * by the same threads (the bandwidth probe, as in bench_kernels), so that
 * GB/s can be read against what the machine delivered at that moment.
 * GB/s = bytes read (blob or dense matrix) / time; speedup = dense time /
 * BSR time. Reports the best and the median of --iters calls. Prints
 * figures, asserts only that BSR and dense agree (to 1e-3 relative).
 *
 * usage: bench_bsr [--iters N] [--pool-mib M] [--ntok T] [--isa ref|avx2|avx512]
 *                  [--blocks 16x16,32x32,...] [--threads 1,2]
 */
#define _GNU_SOURCE
#include "ie_kernels.h"
#include "ie_threadpool.h"

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
    int sparse;
    const float *w; /* dense */
    ie_bsr_t m;     /* sparse */
    int64_t n_in, n_out, n_tok;
    const float *x;
    float *y;
    /* read probe */
    const uint8_t *buf;
    size_t bytes;
    uint64_t sink[64];
} job_t;

static void matmul_task(void *p, int ith, int nth)
{
    job_t *j = p;
    long b, e;
    if (j->sparse) { /* whole block rows */
        const int br = j->m.br;
        ie_split_range((long)(j->n_out / br), ith, nth, &b, &e);
        if (b < e)
            j->ops->matmul_bsr(&j->m, (int64_t)b * br, (int64_t)e * br, j->x, (size_t)j->n_in, j->n_tok, j->y,
                               j->n_out);
    } else { /* rows in units of 4, as bench_kernels */
        ie_split_range((long)((j->n_out + 3) / 4), ith, nth, &b, &e);
        const int64_t r0 = 4 * b, r1 = 4 * e < j->n_out ? 4 * e : j->n_out;
        if (r0 < r1)
            ie_kernels_matmul(j->ops, IE_DTYPE_F32, j->w, j->n_in, r0, r1, j->x, (size_t)j->n_in * sizeof(float),
                              j->n_tok, j->y, j->n_out);
    }
}


static void read_task(void *p, int ith, int nth)
{
    job_t *j = p;
    long b, e;
    ie_split_range((long)(j->bytes / 64), ith, nth, &b, &e);
    j->sink[ith] = probe_read(j->buf + (size_t)b * 64, (size_t)(e - b) * 64);
}

/* ---------------------------------------------------------------- pool */

static uint8_t *g_pool;
static size_t g_pool_bytes;

typedef struct {
    double best, med, pmed;
} timing_t;

/* Times `iters` calls of j over `copies` copies of `bytes` bytes each
 * (stride apart in the pool; set_copy points j at copy c), each preceded by
 * a probe read of another copy. */
static timing_t run(ie_threadpool_t *tp, job_t *j, size_t bytes, size_t stride, size_t copies, int iters,
                    void (*set_copy)(job_t *, const uint8_t *))
{
    double tm[256], tpr[256];
    size_t c = 0;
    j->bytes = bytes;
    set_copy(j, g_pool);
    ie_threadpool_run(tp, matmul_task, j); /* warm code and pages */
    for (int it = 0; it < iters; it++) {
        c = (c + 1) % copies;
        j->buf = g_pool + c * stride;
        double t0 = now_s();
        ie_threadpool_run(tp, read_task, j);
        tpr[it] = now_s() - t0;
        c = (c + 1) % copies;
        set_copy(j, g_pool + c * stride);
        t0 = now_s();
        ie_threadpool_run(tp, matmul_task, j);
        tm[it] = now_s() - t0;
    }
    qsort(tm, (size_t)iters, sizeof tm[0], cmp_d);
    qsort(tpr, (size_t)iters, sizeof tpr[0], cmp_d);
    return (timing_t){tm[0], tm[iters / 2], tpr[iters / 2]};
}

static void set_dense(job_t *j, const uint8_t *p) { j->w = (const float *)p; }

static void set_sparse(job_t *j, const uint8_t *p)
{
    /* same layout in every copy: rebase the view's pointers */
    const uint8_t *old = (const uint8_t *)j->m.rowptr - 24;
    const ptrdiff_t d = p - old;
    j->m.rowptr = (const uint32_t *)((const uint8_t *)j->m.rowptr + d);
    j->m.colidx = (const uint32_t *)((const uint8_t *)j->m.colidx + d);
    j->m.values = (const float *)((const uint8_t *)j->m.values + d);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    int iters = 21, isa = -1;
    int64_t n_tok = 1;
    size_t pool_mib = 768;
    int blocks[8][2] = {{16, 16}, {32, 32}}, n_blocks = 2;
    int threads[4] = {1, 2}, n_threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pool-mib") && i + 1 < argc) pool_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--ntok") && i + 1 < argc) n_tok = atol(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            isa = !strcmp(s, "ref") ? IE_ISA_REF : !strcmp(s, "avx2") ? IE_ISA_AVX2 : IE_ISA_AVX512;
        } else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) {
            n_blocks = 0;
            char *s = strdup(argv[++i]);
            for (char *tok = strtok(s, ","); tok && n_blocks < 8; tok = strtok(NULL, ","))
                if (sscanf(tok, "%dx%d", &blocks[n_blocks][0], &blocks[n_blocks][1]) == 2) n_blocks++;
            free(s);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = 0;
            char *s = strdup(argv[++i]);
            for (char *tok = strtok(s, ","); tok && n_threads < 4; tok = strtok(NULL, ","))
                threads[n_threads++] = atoi(tok);
            free(s);
        } else {
            fprintf(stderr,
                    "usage: %s [--iters N] [--pool-mib M] [--ntok T] [--isa ref|avx2|avx512] "
                    "[--blocks 16x16,32x32] [--threads 1,2]\n",
                    argv[0]);
            return 2;
        }
    }
    if (iters < 3) iters = 3;
    if (iters > 256) iters = 256;
    if (n_tok < 1) n_tok = 1;
    const ie_isa_t the_isa = isa < 0 ? ie_isa_best() : (ie_isa_t)isa;
    const ie_kernels_t *ops = ie_kernels_get(the_isa);
    if (!ops) {
        fprintf(stderr, "%s not supported here\n", ie_isa_name(the_isa));
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

    static const int64_t shapes[][2] = {{2048, 2048}, {5632, 2048}};
    static const double dens[] = {1.0, 0.5, 0.25, 0.10};
    const int64_t max_out = 5632, max_in = 2048;
    float *w = malloc(sizeof(float) * (size_t)(max_out * max_in));
    float *x = malloc(sizeof(float) * (size_t)(max_in * n_tok));
    float *y = malloc(sizeof(float) * (size_t)(max_out * n_tok));
    float *y2 = malloc(sizeof(float) * (size_t)(max_out * n_tok));
    for (int64_t i = 0; i < max_in * n_tok; i++) x[i] = rnd();

    printf("bench_bsr: isa %s, n_tok %lld, %d iters, pool %zu MiB; best (median) of timed calls; GB/s = bytes "
           "read / best time; probe = plain read of the same bytes (median GB/s)\n",
           ie_isa_name(the_isa), (long long)n_tok, iters, pool_mib);
    printf("%-10s %-6s %5s %3s | %9s %7s %7s | %9s %9s %7s %7s %7s | %7s\n", "shape", "block", "dens", "thr",
           "dense ms", "GB/s", "probe", "bsr ms", "(median)", "MiB", "GB/s", "probe", "speedup");

    ie_threadpool_t *tps[4] = {0};
    for (int ti = 0; ti < n_threads; ti++)
        if (ie_threadpool_new(threads[ti], 1, &tps[ti]) != IE_OK) {
            fprintf(stderr, "threadpool: %s\n", ie_error_last());
            return 1;
        }

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t n_out = shapes[si][0], n_in = shapes[si][1];
        const size_t dbytes = sizeof(float) * (size_t)(n_out * n_in);
        for (int bi = 0; bi < n_blocks; bi++) {
            const int br = blocks[bi][0], bc = blocks[bi][1];
            if (n_out % br || n_in % bc) {
                printf("%dx%d does not divide the shape\n", br, bc);
                continue;
            }
            for (size_t di = 0; di < sizeof dens / sizeof dens[0]; di++) {
                /* random block mask at this density; non-zero values everywhere kept */
                for (int64_t i = 0; i < n_out * n_in; i++) w[i] = rnd() * 0.05f;
                for (int64_t ib = 0; ib < n_out / br; ib++)
                    for (int64_t jb = 0; jb < n_in / bc; jb++) {
                        if ((double)(rnd_u64() >> 11) / 9007199254740992.0 < dens[di]) continue;
                        for (int i = 0; i < br; i++)
                            memset(w + (ib * br + i) * n_in + jb * bc, 0, sizeof(float) * (size_t)bc);
                    }
                void *blob;
                size_t sbytes;
                if (ie_bsr_from_dense(w, n_in, n_out, br, bc, 0.0f, &blob, &sbytes) != 0) {
                    fprintf(stderr, "from_dense failed\n");
                    return 1;
                }
                const size_t sstride = (sbytes + 4095) & ~(size_t)4095;
                size_t dcopies = g_pool_bytes / dbytes, scopies = g_pool_bytes / sstride;
                if (dcopies < 2 || scopies < 2) {
                    fprintf(stderr, "pool too small\n");
                    return 1;
                }
                if (scopies > 256) scopies = 256;
                job_t *j = calloc(1, sizeof *j);
                j->ops = ops;
                j->n_in = n_in;
                j->n_out = n_out;
                j->n_tok = n_tok;
                j->x = x;
                for (int ti = 0; ti < n_threads; ti++) {
                    /* dense: fill the pool with copies, time */
                    for (size_t c = 0; c < dcopies; c++) memcpy(g_pool + c * dbytes, w, dbytes);
                    j->sparse = 0;
                    j->y = y;
                    const timing_t td = run(tps[ti], j, dbytes, dbytes, dcopies, iters, set_dense);
                    /* sparse */
                    for (size_t c = 0; c < scopies; c++) memcpy(g_pool + c * sstride, blob, sbytes);
                    char err[200];
                    if (ie_bsr_view(g_pool, sbytes, n_in, n_out, &j->m, err, sizeof err) != 0) {
                        fprintf(stderr, "view: %s\n", err);
                        return 1;
                    }
                    j->sparse = 1;
                    j->y = y2;
                    const timing_t ts = run(tps[ti], j, sbytes, sstride, scopies, iters, set_sparse);
                    /* agreement */
                    double md = 0, mx = 0;
                    for (int64_t i = 0; i < n_out * n_tok; i++) {
                        md = fmax(md, fabs((double)y[i] - y2[i]));
                        mx = fmax(mx, fabs((double)y[i]));
                    }
                    char shape[32], blk[16];
                    snprintf(shape, sizeof shape, "%lldx%lld", (long long)n_out, (long long)n_in);
                    snprintf(blk, sizeof blk, "%dx%d", br, bc);
                    const double real_d = (double)j->m.n_blocks / (double)((n_out / br) * (n_in / bc));
                    printf(
                        "%-10s %-6s %4.0f%% %3d | %9.3f %7.1f %7.1f | %9.3f %9.3f %7.1f %7.1f %7.1f | %6.2fx%s\n",
                        shape, blk, real_d * 100, threads[ti], td.best * 1e3, (double)dbytes / td.best / 1e9,
                        (double)dbytes / td.pmed / 1e9, ts.best * 1e3, ts.med * 1e3, (double)sbytes / 1048576.0,
                        (double)sbytes / ts.best / 1e9, (double)sbytes / ts.pmed / 1e9, td.best / ts.best,
                        md > 1e-3 * mx + 1e-6 ? "  MISMATCH" : "");
                    printf("{\"bench\":\"bsr\",\"isa\":\"%s\",\"n_out\":%lld,\"n_in\":%lld,\"br\":%d,\"bc\":%d,"
                           "\"density\":%.3f,\"threads\":%d,\"n_tok\":%lld,\"dense_ms\":%.4f,\"dense_gbps\":%.2f,"
                           "\"dense_probe_gbps\":%.2f,\"bsr_ms\":%.4f,\"bsr_gbps\":%.2f,\"bsr_probe_gbps\":%.2f,"
                           "\"speedup\":%.3f}\n",
                           ie_isa_name(the_isa), (long long)n_out, (long long)n_in, br, bc, real_d, threads[ti],
                           (long long)n_tok, td.best * 1e3, (double)dbytes / td.best / 1e9,
                           (double)dbytes / td.pmed / 1e9, ts.best * 1e3, (double)sbytes / ts.best / 1e9,
                           (double)sbytes / ts.pmed / 1e9, td.best / ts.best);
                    fflush(stdout);
                }
                free(j);
                free(blob);
            }
        }
    }
    for (int ti = 0; ti < n_threads; ti++) ie_threadpool_destroy(&tps[ti]);
    free(w);
    free(x);
    free(y);
    free(y2);
    munmap(raw, g_pool_bytes + align);
    return 0;
}
