/* lora_avx2.c — AVX2/FMA twins of ie_lora_f32_ref / ie_lora_bf16_ref: the
 * LoRA delta of a group of rows. The shrink (u = scale * A x) takes four
 * rows of A per pass over x; the expand adds rank rows of B^T to y 32
 * floats at a time, so y is loaded and stored once per row whatever the
 * rank. One body for both weight types (bf16 widened as it is loaded),
 * specialised by the constant b16. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))

INL float hsum(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 8 weights at element i of f (f32) or h (bf16) */
INL __m256 ld8(const float *f, const uint16_t *h, size_t i, const int b16)
{
    if (!b16) return _mm256_loadu_ps(f + i);
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

INL float ld1(const float *f, const uint16_t *h, size_t i, const int b16)
{
    if (!b16) return f[i];
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h[i] << 16};
    return v.f;
}

/* u[0..4) = dot(A row j + i, x) for i < 4 */
INL void dot4(const ie_lora_args_t *p, int j, const float *x, float *u, const int b16)
{
    const size_t r0 = (size_t)j * (size_t)p->lda, l = (size_t)p->lda, n = (size_t)p->n_in;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 vx = _mm256_loadu_ps(x + k);
        s0 = _mm256_fmadd_ps(ld8(p->a, p->a16, r0 + k, b16), vx, s0);
        s1 = _mm256_fmadd_ps(ld8(p->a, p->a16, r0 + l + k, b16), vx, s1);
        s2 = _mm256_fmadd_ps(ld8(p->a, p->a16, r0 + 2 * l + k, b16), vx, s2);
        s3 = _mm256_fmadd_ps(ld8(p->a, p->a16, r0 + 3 * l + k, b16), vx, s3);
    }
    u[0] = hsum(s0), u[1] = hsum(s1), u[2] = hsum(s2), u[3] = hsum(s3);
    for (; k < n; k++)
        for (int i = 0; i < 4; i++) u[i] += ld1(p->a, p->a16, r0 + (size_t)i * l + k, b16) * x[k];
}

INL float dot1(const ie_lora_args_t *p, int j, const float *x, const int b16)
{
    const size_t r0 = (size_t)j * (size_t)p->lda, n = (size_t)p->n_in;
    __m256 s = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= n; k += 8) s = _mm256_fmadd_ps(ld8(p->a, p->a16, r0 + k, b16), _mm256_loadu_ps(x + k), s);
    float r = hsum(s);
    for (; k < n; k++) r += ld1(p->a, p->a16, r0 + k, b16) * x[k];
    return r;
}

INL void lora_body(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp, const int b16)
{
    const int r = p->rank;
    const int64_t m = p->n_out;
    const size_t ldb = (size_t)p->ldb;
    for (int t = 0; t < n_rows; t++) {
        const float *x = p->x + (size_t)rows[t] * (size_t)p->ldx;
        float *y = p->y + (size_t)rows[t] * (size_t)p->ldy;
        float *u = tmp + (size_t)t * (size_t)r;
        int j = 0;
        for (; j + 4 <= r; j += 4) dot4(p, j, x, u + j, b16);
        for (; j < r; j++) u[j] = dot1(p, j, x, b16);
        for (j = 0; j < r; j++) u[j] *= p->scale;
        int64_t o = 0;
        for (; o + 32 <= m; o += 32) {
            __m256 y0 = _mm256_loadu_ps(y + o), y1 = _mm256_loadu_ps(y + o + 8);
            __m256 y2 = _mm256_loadu_ps(y + o + 16), y3 = _mm256_loadu_ps(y + o + 24);
            for (j = 0; j < r; j++) {
                const size_t b = (size_t)j * ldb + (size_t)o;
                const __m256 c = _mm256_set1_ps(u[j]);
                y0 = _mm256_fmadd_ps(c, ld8(p->bt, p->bt16, b, b16), y0);
                y1 = _mm256_fmadd_ps(c, ld8(p->bt, p->bt16, b + 8, b16), y1);
                y2 = _mm256_fmadd_ps(c, ld8(p->bt, p->bt16, b + 16, b16), y2);
                y3 = _mm256_fmadd_ps(c, ld8(p->bt, p->bt16, b + 24, b16), y3);
            }
            _mm256_storeu_ps(y + o, y0);
            _mm256_storeu_ps(y + o + 8, y1);
            _mm256_storeu_ps(y + o + 16, y2);
            _mm256_storeu_ps(y + o + 24, y3);
        }
        for (; o + 8 <= m; o += 8) {
            __m256 y0 = _mm256_loadu_ps(y + o);
            for (j = 0; j < r; j++)
                y0 = _mm256_fmadd_ps(_mm256_set1_ps(u[j]), ld8(p->bt, p->bt16, (size_t)j * ldb + (size_t)o, b16),
                                     y0);
            _mm256_storeu_ps(y + o, y0);
        }
        for (; o < m; o++) {
            float s = y[o];
            for (j = 0; j < r; j++) s += u[j] * ld1(p->bt, p->bt16, (size_t)j * ldb + (size_t)o, b16);
            y[o] = s;
        }
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_f32). */
void ie_lora_f32_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp)
{
    lora_body(p, rows, n_rows, tmp, 0);
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_bf16). */
void ie_lora_bf16_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp)
{
    lora_body(p, rows, n_rows, tmp, 1);
}
