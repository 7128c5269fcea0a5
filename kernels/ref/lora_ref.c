/* lora_ref.c — the LoRA delta of a group of rows in its two passes, plain
 * C: the oracles of the SIMD twins (lora_avx2.c, lora_avx512.c), for f32,
 * bf16 and int8 (column-scaled) weights. The int8 forms fold the scales
 * where the twins do: A's into the input (x[k] * sa[k]), B^T's applied once
 * to each output column's sum. */
#include "ie_dtype.h"
#include "ie_kernels.h"

/* Weight i of A (bt 0) or B^T (bt 1), f32 or bf16 */
static float ld(const ie_lora_args_t *p, int bt, size_t i)
{
    if (p->a16) return ie_bf16_to_f32((bt ? p->bt16 : p->a16)[i]);
    return (bt ? p->bt : p->a)[i];
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                        int64_t ldu)
{
    for (int t = 0; t < n_rows; t++) {
        const float *x = p->x + (size_t)rows[t] * (size_t)p->ldx;
        for (int j = j0; j < j1; j++) {
            const size_t r = (size_t)j * (size_t)p->lda;
            float s = 0.0f;
            if (p->a8)
                for (int64_t k = 0; k < p->n_in; k++) s += (float)p->a8[r + (size_t)k] * (x[k] * p->sa[k]);
            else
                for (int64_t k = 0; k < p->n_in; k++) s += ld(p, 0, r + (size_t)k) * x[k];
            u[(size_t)t * (size_t)ldu + (size_t)j] = p->scale * s;
        }
    }
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_expand). */
void ie_lora_expand_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int64_t o0, int64_t o1,
                        const float *u, int64_t ldu)
{
    for (int t = 0; t < n_rows; t++) {
        float *y = p->y + (size_t)rows[t] * (size_t)p->ldy;
        const float *ut = u + (size_t)t * (size_t)ldu;
        if (p->bt8)
            for (int64_t o = o0; o < o1; o++) {
                float s = 0.0f;
                for (int j = 0; j < p->rank; j++)
                    s += ut[j] * (float)p->bt8[(size_t)j * (size_t)p->ldb + (size_t)o];
                y[o] += s * p->sbt[o];
            }
        else
            for (int j = 0; j < p->rank; j++)
                for (int64_t o = o0; o < o1; o++) y[o] += ut[j] * ld(p, 1, (size_t)j * (size_t)p->ldb + (size_t)o);
    }
}
