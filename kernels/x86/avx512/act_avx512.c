/* act_avx512.c — SwiGLU and softmax with a vectorized exp (ie_kernels_t.swiglu, .softmax).
 *
 * exp(x) = 2^n * 2^f with n = round(x*log2 e), f in [-1/2, 1/2]; 2^f by its
 * degree-7 Taylor polynomial in f*ln 2 (relative error < 2e-8 on the
 * range, below float rounding), scaled by 2^n with vscalefps. Inputs are
 * clamped to [-87.3, 88.7] where expf neither overflows nor denormalizes;
 * silu of larger |g| is then exact to float precision anyway.
 */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

static inline __m512 exp_ps(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* f*ln2 computed as x - n*ln2 in two parts for accuracy */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

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
