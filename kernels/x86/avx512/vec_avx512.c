/* vec_avx512.c — AVX-512 float vector ops: attention's q·k scores and
 * weighted sum of values, and rmsnorm. Twins of ie_dot_f32 / ie_axpy_f32 /
 * ie_rmsnorm_f32 in ref/. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>
#include <math.h>

float ie_dot_f32_avx512(const float *a, const float *b, int64_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void ie_axpy_f32_avx512(float *y, float a, const float *x, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m,
                              _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i),
                                              _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* Twin of ie_rmsnorm_f32 (ie_kernels.h): the squares summed in double, four
 * 8-lane accumulators, the tail masked; the scale applied with the
 * scalar's per-element formula, so only the sum's order differs. */
void ie_rmsnorm_f32_avx512(float *out, const float *x, const float *w, int64_t n, float eps)
{
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        const __m512d c = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16));
        const __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
        s0 = _mm512_fmadd_pd(a, a, s0);
        s1 = _mm512_fmadd_pd(b, b, s1);
        s2 = _mm512_fmadd_pd(c, c, s2);
        s3 = _mm512_fmadd_pd(d, d, s3);
    }
    for (; i < n; i += 8) {
        const __mmask8 m = n - i >= 8 ? (__mmask8)0xff : (__mmask8)((1u << (n - i)) - 1u);
        const __m512d a = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i));
        s0 = _mm512_fmadd_pd(a, a, s0);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
    const float mean = (float)(ss / (double)n);
    const float scale = (float)(1.0 / sqrt((double)(mean + eps)));
    const __m512 vs = _mm512_set1_ps(scale);
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), _mm512_loadu_ps(w + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(out + i, m,
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs),
                                            _mm512_maskz_loadu_ps(m, w + i)));
    }
}
