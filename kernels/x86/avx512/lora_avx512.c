/* lora_avx512.c — AVX-512 twin of ie_lora_f32_ref: the LoRA delta of a
 * group of rows. The shrink (u = scale * A x) takes four rows of A per
 * pass over x; the expand adds rank rows of B^T to y 64 floats at a time,
 * so y is loaded and stored once per row whatever the rank. */
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

static float hsum(__m512 s) { return _mm512_reduce_add_ps(s); }

/* u[0..4) = dot(a_i, x) for the 4 rows a0 + i * lda */
static void dot4(const float *a0, int64_t lda, const float *x, int64_t n, float *u)
{
    const float *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 vx = _mm512_loadu_ps(x + k);
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a0 + k), vx, s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a1 + k), vx, s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a2 + k), vx, s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a3 + k), vx, s3);
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
    __m512 s = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(x + k), s);
    float r = hsum(s);
    for (; k < n; k++) r += a[k] * x[k];
    return r;
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_f32). */
void ie_lora_f32_avx512(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp)
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
        for (; o + 64 <= m; o += 64) {
            __m512 y0 = _mm512_loadu_ps(y + o), y1 = _mm512_loadu_ps(y + o + 16);
            __m512 y2 = _mm512_loadu_ps(y + o + 32), y3 = _mm512_loadu_ps(y + o + 48);
            for (j = 0; j < r; j++) {
                const float *b = p->bt + (size_t)j * (size_t)ldb + o;
                const __m512 c = _mm512_set1_ps(u[j]);
                y0 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b), y0);
                y1 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b + 16), y1);
                y2 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b + 32), y2);
                y3 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b + 48), y3);
            }
            _mm512_storeu_ps(y + o, y0);
            _mm512_storeu_ps(y + o + 16, y1);
            _mm512_storeu_ps(y + o + 32, y2);
            _mm512_storeu_ps(y + o + 48, y3);
        }
        for (; o + 16 <= m; o += 16) {
            __m512 y0 = _mm512_loadu_ps(y + o);
            for (j = 0; j < r; j++)
                y0 = _mm512_fmadd_ps(_mm512_set1_ps(u[j]), _mm512_loadu_ps(p->bt + (size_t)j * (size_t)ldb + o),
                                     y0);
            _mm512_storeu_ps(y + o, y0);
        }
        for (; o < m; o++) {
            float s = y[o];
            for (j = 0; j < r; j++) s += u[j] * p->bt[(size_t)j * (size_t)ldb + o];
            y[o] = s;
        }
    }
}
