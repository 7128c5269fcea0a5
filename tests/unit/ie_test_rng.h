/* ie_test_rng.h — the deterministic test data stream of the kernel suites
 * (test-only, header: each suite is its own executable). */
#ifndef IE_TEST_RNG_H
#define IE_TEST_RNG_H

#include <math.h>
#include <stdint.h>

static uint64_t g_rng;

/* Restart the stream; the same seed gives the same data. */
static inline void rng_seed(uint64_t s) { g_rng = s * 0x9e3779b97f4a7c15ull + 1; }

/* xorshift64, high bits. */
static inline uint32_t rng_u32(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

/* Uniform in [-1, 1). */
static inline float rng_f(void) { return (float)rng_u32() / 4294967296.0f * 2.0f - 1.0f; }

/* Random floats with a per-32-element scale spread over ~3 decades, so
 * block scales differ and some blocks are tiny. */
static inline void rng_fill(float *x, int64_t n)
{
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = powf(10.0f, rng_f() * 1.5f);
        x[i] = rng_f() * scale;
    }
}

#endif
