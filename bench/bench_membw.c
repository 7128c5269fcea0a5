/* bench_membw.c — memory read bandwidth probe: the ceiling for decode.
 *
 * Reads a 1 GiB buffer (2 MiB huge pages via MADV_HUGEPAGE, and for
 * comparison 4 KiB pages via MADV_NOHUGEPAGE) with 1 thread and with
 * --threads threads (default 2) of the clocher thread pool, each thread
 * streaming its contiguous share with the kernel library's stream_read
 * (ie_kernels_t: 256-bit loads where AVX2 runs). Prints GB/s (1e9 B/s):
 * the median over 64 MiB chunks (best of --passes passes; robust when a
 * neighbour steals a core for a few ms) and the best whole-buffer pass;
 * then one JSON line with the chunk-median figures:
 *   {"read_gbps_1t":..,"read_gbps_2t":..,"read_gbps_1t_4k":..,"read_gbps_2t_4k":..,...}
 * ("2t" is the --threads figure). Asserts nothing.
 *
 * usage: bench_membw [--threads N] [--size-mib M] [--passes P]
 */
#define _GNU_SOURCE
#include "ie_threadpool.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_util.h"


typedef struct {
    const uint8_t *buf;
    size_t bytes;
    int nth_used; /* threads that read; the others idle */
    uint64_t sink[64];
} read_job_t;

static void read_task(void *p, int ith, int nth)
{
    read_job_t *j = p;
    (void)nth;
    if (ith >= j->nth_used) return;
    long b, e;
    /* shares in 4 KiB units so every share is aligned */
    ie_split_range((long)(j->bytes / 4096), ith, j->nth_used, &b, &e);
    const uint8_t *s = j->buf + (size_t)b * 4096;
    const size_t n = (size_t)(e - b) * 4096;
    j->sink[ith] = probe_read(s, n);
}

static void fill_task(void *p, int ith, int nth)
{
    read_job_t *j = p;
    long b, e;
    ie_split_range((long)(j->bytes / 4096), ith, nth, &b, &e);
    memset((void *)(j->buf + (size_t)b * 4096), ith + 1, (size_t)(e - b) * 4096);
}


/* GB/s of reading buf with `threads` threads, `passes` times. Each pass is
 * timed in 64 MiB chunks (a fork-join per chunk, ~1-2 ms each), so that a
 * thread descheduled by a busy neighbour spoils one chunk, not the pass:
 * *chunk = best over passes of the median chunk rate (the figure reported),
 * *whole = best whole-pass rate. */
static void measure(ie_threadpool_t *tp, uint8_t *buf, size_t bytes, int threads, int passes, double *chunk,
                    double *whole)
{
    const size_t cb = (size_t)64 << 20;
    const size_t nchunks = bytes / cb ? bytes / cb : 1, csz = bytes / cb ? cb : bytes;
    read_job_t job = {.buf = buf, .bytes = csz, .nth_used = threads};
    double *rates = malloc(nchunks * sizeof *rates);
    *chunk = *whole = 0.0;
    for (size_t c = 0; c < nchunks; c++) { /* warm: TLB, page tables */
        job.buf = buf + c * csz;
        ie_threadpool_run(tp, read_task, &job);
    }
    for (int i = 0; i < passes; i++) {
        const double t_pass = now_s();
        for (size_t c = 0; c < nchunks; c++) {
            job.buf = buf + c * csz;
            const double t0 = now_s();
            ie_threadpool_run(tp, read_task, &job);
            rates[c] = (double)csz / (now_s() - t0) / 1e9;
        }
        const double w = (double)(nchunks * csz) / (now_s() - t_pass) / 1e9;
        qsort(rates, nchunks, sizeof rates[0], cmp_d);
        if (rates[nchunks / 2] > *chunk) *chunk = rates[nchunks / 2];
        if (w > *whole) *whole = w;
    }
    free(rates);
}

static uint8_t *map_buffer(size_t bytes, int huge)
{
    const size_t align = 2u << 20;
    uint8_t *raw = mmap(NULL, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return p; /* leaked on purpose: the process ends soon */
}

/* AnonHugePages of this process in MiB (-1 if unknown): shows whether
 * MADV_HUGEPAGE was honoured. */
static long anon_huge_mib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb / 1024;
}

int main(int argc, char **argv)
{
    int threads = 2, passes = 7;
    size_t mib = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size-mib") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--size-mib M] [--passes P]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (passes < 1) passes = 1;
    const size_t bytes = mib << 20;

    ie_threadpool_t *tp = NULL;
    if (ie_threadpool_new(threads, 1, &tp) != IE_OK) {
        fprintf(stderr, "threadpool: %s\n", ie_error_last());
        return 1;
    }
    uint8_t *huge = map_buffer(bytes, 1), *small = map_buffer(bytes, 0);
    if (!huge || !small) {
        fprintf(stderr, "cannot map 2 x %zu MiB\n", mib);
        return 1;
    }
    read_job_t fj = {.buf = huge, .bytes = bytes};
    ie_threadpool_run(tp, fill_task, &fj); /* first touch by the reading threads */
    fj.buf = small;
    ie_threadpool_run(tp, fill_task, &fj);

    /* A/B interleaved: huge and 4K pages alternate, per thread count, so a
     * bandwidth swing hits both alike. */
    double r[2][2][2] = {{{0}}}; /* [threads 1/N][huge/4k][chunk median/whole pass] */
    for (int round = 0; round < 2; round++)
        for (int ti = 0; ti < 2; ti++)
            for (int pg = 0; pg < 2; pg++) {
                double c, w;
                measure(tp, pg ? small : huge, bytes, ti ? threads : 1, passes, &c, &w);
                if (c > r[ti][pg][0]) r[ti][pg][0] = c;
                if (w > r[ti][pg][1]) r[ti][pg][1] = w;
            }
    printf("memory read bandwidth, %zu MiB buffers, %d passes x 2 rounds (GB/s = 1e9 B/s); "
           "AnonHugePages %ld MiB\n",
           mib, passes, anon_huge_mib());
    printf("  %-10s %-8s %14s %12s\n", "threads", "pages", "64MiB-median", "whole-pass");
    for (int ti = 0; ti < 2; ti++)
        for (int pg = 0; pg < 2; pg++)
            printf("  %-10d %-8s %14.1f %12.1f\n", ti ? threads : 1, pg ? "4K" : "2M", r[ti][pg][0], r[ti][pg][1]);
    printf("{\"bench\":\"membw\",\"size_mib\":%zu,\"threads\":%d,\"read_gbps_1t\":%.2f,\"read_gbps_2t\":%.2f,"
           "\"read_gbps_1t_4k\":%.2f,\"read_gbps_2t_4k\":%.2f}\n",
           mib, threads, r[0][0][0], r[1][0][0], r[0][1][0], r[1][1][0]);
    ie_threadpool_destroy(&tp);
    return 0;
}
