/* lora_ref.c — the LoRA delta of a group of rows, plain C: the oracle of
 * the SIMD twins (lora_avx2.c, lora_avx512.c). */
#include "ie_kernels.h"

/* Contract (ie_kernels.h, ie_kernels_t.lora_f32). */
void ie_lora_f32_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp)
{
    for (int t = 0; t < n_rows; t++) {
        const float *x = p->x + (size_t)rows[t] * (size_t)p->ldx;
        float *y = p->y + (size_t)rows[t] * (size_t)p->ldy;
        float *u = tmp + (size_t)t * (size_t)p->rank;
        /* u = scale * A x */
        for (int j = 0; j < p->rank; j++) {
            const float *a = p->a + (size_t)j * (size_t)p->lda;
            float s = 0.0f;
            for (int64_t k = 0; k < p->n_in; k++) s += a[k] * x[k];
            u[j] = p->scale * s;
        }
        /* y += B u, B held transposed */
        for (int j = 0; j < p->rank; j++) {
            const float *bt = p->bt + (size_t)j * (size_t)p->ldb;
            for (int64_t o = 0; o < p->n_out; o++) y[o] += u[j] * bt[o];
        }
    }
}
