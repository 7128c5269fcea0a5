/* vec_avx2.c — AVX2/FMA float vector ops: attention's q·k scores and
 * weighted sum of values, rmsnorm, the stream read. Twins of ie_dot_f32 /
 * ie_axpy_f32 / ie_rmsnorm_f32 / ie_stream_read. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <math.h>

float ie_dot_f32_avx2(const float *a, const float *b, int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

void ie_axpy_f32_avx2(float *y, float a, const float *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* Twin of ie_rmsnorm_f32 (ie_kernels.h): the squares summed in double, four
 * 4-lane accumulators (the scalar's one running sum is a 4-cycle chain per
 * element: ~2.8 us at n = 2048, on the critical path of every decode
 * layer); the scale applied with the scalar's per-element formula. */
void ie_rmsnorm_f32_avx2(float *out, const float *x, const float *w, int64_t n, float eps)
{
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        const __m256d c = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
        s0 = _mm256_fmadd_pd(a, a, s0);
        s1 = _mm256_fmadd_pd(b, b, s1);
        s2 = _mm256_fmadd_pd(c, c, s2);
        s3 = _mm256_fmadd_pd(d, d, s3);
    }
    const __m256d s = _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double ss = _mm_cvtsd_f64(h) + _mm_cvtsd_f64(_mm_unpackhi_pd(h, h));
    for (int64_t j = i; j < n; j++) ss += (double)x[j] * x[j];
    const float mean = (float)(ss / (double)n);
    const float scale = (float)(1.0 / sqrt((double)(mean + eps)));
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

/* Twin of ie_stream_read (vec.c): 32-byte loads into four accumulators,
 * 128 bytes a step; the tail goes to the oracle. The xor of all 8-byte
 * words does not depend on how they are grouped. */
uint64_t ie_stream_read_avx2(const void *p, size_t n)
{
    const unsigned char *b = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(const void *)(b + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(const void *)(b + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(const void *)(b + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(const void *)(b + i + 96)));
    }
    const __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    const __m128i h = _mm_xor_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return ((uint64_t)_mm_cvtsi128_si64(h) ^ (uint64_t)_mm_extract_epi64(h, 1)) ^ ie_stream_read(b + i, n - i);
}
