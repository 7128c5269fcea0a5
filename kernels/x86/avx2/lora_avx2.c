/* lora_avx2.c — AVX2/FMA twin of ie_lora_f32_ref: the LoRA delta of a
 * group of rows. The shrink (u = scale * A x) takes four rows of A per
 * pass over x; the expand adds rank rows of B^T to y 32 floats at a time,
 * so y is loaded and stored once per row whatever the rank. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

static float hsum(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* u[0..4) = dot(a_i, x) for the 4 rows a0 + i * lda */
static void dot4(const float *a0, int64_t lda, const float *x, int64_t n, float *u)
{
    const float *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 vx = _mm256_loadu_ps(x + k);
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a0 + k), vx, s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a1 + k), vx, s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a2 + k), vx, s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a3 + k), vx, s3);
    }
    u[0] = hsum(s0), u[1] = hsum(s1), u[2] = hsum(s2), u[3] = hsum(s3);
    for (; k < n; k++) {
        u[0] += a0[k] * x[k];
        u[1] += a1[k] * x[k];
        u[2] += a2[k] * x[k];
        u[3] += a3[k] * x[k];
    }
}

static float dot1(const float *a, const float *x, int64_t n)
{
    __m256 s = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(x + k), s);
    float r = hsum(s);
    for (; k < n; k++) r += a[k] * x[k];
    return r;
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_f32). */
void ie_lora_f32_avx2(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp)
{
    const int r = p->rank;
    const int64_t m = p->n_out, ldb = p->ldb;
    for (int t = 0; t < n_rows; t++) {
        const float *x = p->x + (size_t)rows[t] * (size_t)p->ldx;
        float *y = p->y + (size_t)rows[t] * (size_t)p->ldy;
        float *u = tmp + (size_t)t * (size_t)r;
        int j = 0;
        for (; j + 4 <= r; j += 4) dot4(p->a + (size_t)j * (size_t)p->lda, p->lda, x, p->n_in, u + j);
        for (; j < r; j++) u[j] = dot1(p->a + (size_t)j * (size_t)p->lda, x, p->n_in);
        for (j = 0; j < r; j++) u[j] *= p->scale;
        int64_t o = 0;
        for (; o + 32 <= m; o += 32) {
            __m256 y0 = _mm256_loadu_ps(y + o), y1 = _mm256_loadu_ps(y + o + 8);
            __m256 y2 = _mm256_loadu_ps(y + o + 16), y3 = _mm256_loadu_ps(y + o + 24);
            for (j = 0; j < r; j++) {
                const float *b = p->bt + (size_t)j * (size_t)ldb + o;
                const __m256 c = _mm256_set1_ps(u[j]);
                y0 = _mm256_fmadd_ps(c, _mm256_loadu_ps(b), y0);
                y1 = _mm256_fmadd_ps(c, _mm256_loadu_ps(b + 8), y1);
                y2 = _mm256_fmadd_ps(c, _mm256_loadu_ps(b + 16), y2);
                y3 = _mm256_fmadd_ps(c, _mm256_loadu_ps(b + 24), y3);
            }
            _mm256_storeu_ps(y + o, y0);
            _mm256_storeu_ps(y + o + 8, y1);
            _mm256_storeu_ps(y + o + 16, y2);
            _mm256_storeu_ps(y + o + 24, y3);
        }
        for (; o + 8 <= m; o += 8) {
            __m256 y0 = _mm256_loadu_ps(y + o);
            for (j = 0; j < r; j++)
                y0 = _mm256_fmadd_ps(_mm256_set1_ps(u[j]), _mm256_loadu_ps(p->bt + (size_t)j * (size_t)ldb + o),
                                     y0);
            _mm256_storeu_ps(y + o, y0);
        }
        for (; o < m; o++) {
            float s = y[o];
            for (j = 0; j < r; j++) s += u[j] * p->bt[(size_t)j * (size_t)ldb + o];
            y[o] = s;
        }
    }
}
