/* lora_ref.c — the LoRA delta of a group of rows in its two passes, plain
 * C: the oracles of the SIMD twins (lora_avx2.c, lora_avx512.c), for f32,
 * bf16 and int8 (column-scaled) weights. The int8 forms are integer dot
 * products on activations quantized per token (ie_kernels.h, int8
 * arithmetic): the twins give the same bits, whatever order they add in,
 * because every sum that order could change is an exact integer sum. */
#include "ie_dtype.h"
#include "ie_kernels.h"

#include <math.h>

/* Weight i of A (bt 0) or B^T (bt 1), f32 or bf16 */
static float ld(const ie_lora_args_t *p, int bt, size_t i)
{
    if (p->a16) return ie_bf16_to_f32((bt ? p->bt16 : p->a16)[i]);
    return (bt ? p->bt : p->a)[i];
}

/* The code of v (already times IE_LORA_QMAX / absmax): round to nearest
 * even, within +-IE_LORA_QMAX (NaN 0) */
static int code(float v)
{
    const float r = nearbyintf(v), q = (float)IE_LORA_QMAX;
    return r != r ? 0 : r > q ? IE_LORA_QMAX : r < -q ? -IE_LORA_QMAX : (int)r;
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_shrink). */
void ie_lora_shrink_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, int j0, int j1, float *u,
                        int64_t ldu)
{
    for (int t = 0; t < n_rows; t++) {
        const float *x = p->x + (size_t)rows[t] * (size_t)p->ldx;
        float d = 0.0f, id = 0.0f;
        if (p->a8) { /* the token's step: absmax of x * sa over the row */
            float mx = 0.0f;
            for (int64_t k = 0; k < p->n_in; k++) mx = fmaxf(mx, fabsf(x[k] * p->sa[k]));
            d = mx / (float)IE_LORA_QMAX, id = mx > 0.0f ? (float)IE_LORA_QMAX / mx : 0.0f;
        }
        for (int j = j0; j < j1; j++) {
            const size_t r = (size_t)j * (size_t)p->lda;
            if (p->a8) {
                int64_t s = 0;
                for (int64_t k = 0; k < p->n_in; k++)
                    s += (int64_t)p->a8[r + (size_t)k] * code(x[k] * p->sa[k] * id);
                u[(size_t)t * (size_t)ldu + (size_t)j] = p->scale * ((float)s * d);
            } else {
                float s = 0.0f;
                for (int64_t k = 0; k < p->n_in; k++) s += ld(p, 0, r + (size_t)k) * x[k];
                u[(size_t)t * (size_t)ldu + (size_t)j] = p->scale * s;
            }
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
        if (p->bt8) {
            float mx = 0.0f; /* the token's step: absmax of u over the rank */
            for (int j = 0; j < p->rank; j++) mx = fmaxf(mx, fabsf(ut[j]));
            const float d = mx / (float)IE_LORA_QMAX, id = mx > 0.0f ? (float)IE_LORA_QMAX / mx : 0.0f;
            for (int64_t o = o0; o < o1; o++) {
                int32_t s = 0; /* |s| <= IE_LORA_QMAX * 128 * 256 */
                for (int j = 0; j < p->rank; j++)
                    s += code(ut[j] * id) * (int32_t)p->bt8[IE_LORA_BT8_AT(j, o, p->ldb)];
                y[o] = fmaf((float)s * d, p->sbt[o], y[o]);
            }
        } else
            for (int j = 0; j < p->rank; j++)
                for (int64_t o = o0; o < o1; o++) y[o] += ut[j] * ld(p, 1, (size_t)j * (size_t)p->ldb + (size_t)o);
    }
}
