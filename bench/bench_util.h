/* bench_util.h — small helpers shared by the C microbenchmarks (header
 * only: each bench .c file is its own executable). */
#ifndef IE_BENCH_UTIL_H
#define IE_BENCH_UTIL_H

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

#endif
