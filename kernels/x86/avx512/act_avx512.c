/* act_avx512.c — SwiGLU and softmax with a vectorized exp (ie_kernels_t.swiglu, .softmax).
 *
 * exp is avx512_inl.h's exp_ps (clamped to [-87.3, 88.7]): silu of larger
 * |g| is exact to float precision anyway.
 */
#include "../../src/ie_kernels_isa.h"

#include "avx512_inl.h" /* exp_ps */

static inline __m512 swiglu_ps(__m512 g, __m512 u)
{
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void ie_swiglu_f32_avx512(float *out, const float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, swiglu_ps(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(out + i, m,
                              swiglu_ps(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

void ie_softmax_sink_f32_avx512(float *x, int64_t n, const float *sink)
{
    __m512 vm = _mm512_set1_ps(sink ? *sink : x[0]);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(x + i));
    const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
    if (i < n) vm = _mm512_mask_max_ps(vm, tail, vm, _mm512_maskz_loadu_ps(tail, x + i));
    const float m = _mm512_reduce_max_ps(vm);
    const __m512 mm = _mm512_set1_ps(m);
    __m512 vz = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mm));
        _mm512_storeu_ps(x + i, e);
        vz = _mm512_add_ps(vz, e);
    }
    if (i < n) {
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + i), mm));
        _mm512_mask_storeu_ps(x + i, tail, e);
        vz = _mm512_mask_add_ps(vz, tail, vz, e);
    }
    float z = _mm512_reduce_add_ps(vz);
    if (sink) z += _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(*sink - m)));
    const __m512 iz = _mm512_set1_ps(1.0f / z);
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), iz));
    if (i < n) _mm512_mask_storeu_ps(x + i, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), iz));
}
