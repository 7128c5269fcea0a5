/* bench_util.h — small helpers shared by the C microbenchmarks (header
 * only: each bench .c file is its own executable). */
#ifndef IE_BENCH_UTIL_H
#define IE_BENCH_UTIL_H

#include "ie_kernels.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Monotonic seconds. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort comparator for doubles (medians of timings). */
static inline int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Deterministic xorshift64 stream (benchmark data; speed does not depend on
 * the values). */
static uint64_t g_rng = 88172645463325252ull;
static inline uint64_t rnd_u64(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Uniform float in [-1, 1). */
static inline float rnd(void) { return (float)(rnd_u64() >> 40) / 16777216.0f * 2.0f - 1.0f; }

/* Read n bytes as a plain stream (the bandwidth probe's inner loop): the
 * kernel library's stream_read for the best ISA (ie_kernels_t), the same read
 * ie_worker_stream_probe pairs with decode; returns a value that depends on
 * every byte so nothing is optimized away. */
static inline uint64_t probe_read(const uint8_t *p, size_t n)
{
    return ie_kernels_get(ie_isa_best())->stream_read(p, n);
}

#endif
