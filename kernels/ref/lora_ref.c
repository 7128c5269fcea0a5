/* lora_ref.c — the LoRA delta of a group of rows, plain C: the oracles of
 * the SIMD twins (lora_avx2.c, lora_avx512.c), for f32 and bf16 weights.
 * One body, the weight load the only difference (W, LD below). */
#include "ie_dtype.h"
#include "ie_kernels.h"

#define LORA_REF_BODY(A, BT, LD)                                                                          \
    for (int t = 0; t < n_rows; t++) {                                                                    \
        const float *x = p->x + (size_t)rows[t] * (size_t)p->ldx;                                         \
        float *y = p->y + (size_t)rows[t] * (size_t)p->ldy;                                               \
        float *u = tmp + (size_t)t * (size_t)p->rank;                                                     \
        /* u = scale * A x */                                                                             \
        for (int j = 0; j < p->rank; j++) {                                                               \
            float s = 0.0f;                                                                               \
            for (int64_t k = 0; k < p->n_in; k++) s += LD(A, (size_t)j * (size_t)p->lda + k) * x[k];      \
            u[j] = p->scale * s;                                                                          \
        }                                                                                                 \
        /* y += B u, B held transposed */                                                                 \
        for (int j = 0; j < p->rank; j++)                                                                 \
            for (int64_t o = 0; o < p->n_out; o++) y[o] += u[j] * LD(BT, (size_t)j * (size_t)p->ldb + o); \
    }

#define LD_F32(w, i) (w)[i]
#define LD_BF16(w, i) ie_bf16_to_f32((w)[i])

/* Contract (ie_kernels.h, ie_kernels_t.lora_f32). */
void ie_lora_f32_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp)
{
    LORA_REF_BODY(p->a, p->bt, LD_F32)
}

/* Contract (ie_kernels.h, ie_kernels_t.lora_bf16). */
void ie_lora_bf16_ref(const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *tmp)
{
    LORA_REF_BODY(p->a16, p->bt16, LD_BF16)
}
