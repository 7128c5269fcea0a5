/* bench_util.h — small helpers shared by the C microbenchmarks (header
 * only: each bench .c file is its own executable). */
#ifndef IE_BENCH_UTIL_H
#define IE_BENCH_UTIL_H

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

/* Read n bytes as fast as AVX2 loads go (the bandwidth probe's inner loop);
 * returns a value that depends on every byte so nothing is optimized away. */
__attribute__((target("avx2"))) static inline uint64_t probe_read_avx2(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t s = (uint64_t)_mm256_extract_epi64(a0, 0);
    for (; i < n; i++) s += p[i];
    return s;
}

#endif
