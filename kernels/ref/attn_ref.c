/* attn_ref.c — scalar attention loops (the oracle) and the portable C
 * variants used where no SIMD version exists. */
#include "ie_attn.h"

void ie_attn_scores_ref(const float *q, size_t q_stride, int nh, const float *k, size_t k_stride, int n, int hd,
                        float scale, float *s, size_t ld)
{
    for (int h = 0; h < nh; h++) {
        const float *qh = q + (size_t)h * q_stride;
        for (int j = 0; j < n; j++) {
            const float *kj = k + (size_t)j * k_stride;
            double acc = 0.0;
            for (int i = 0; i < hd; i++) acc += (double)qh[i] * (double)kj[i];
            s[(size_t)h * ld + j] = (float)acc * scale;
        }
    }
}

/* Float sums in position order, continuing from out when acc is set: the
 * paged cache calls this once per block and must get the bits of one call
 * over all positions (a double sum rounded once per call could not). */
void ie_attn_values_ref(const float *p, size_t ld, int nh, const float *v, size_t v_stride, int n, int hd,
                        float *out, size_t o_stride, int acc)
{
    for (int h = 0; h < nh; h++) {
        const float *ph = p + (size_t)h * ld;
        float *oh = out + (size_t)h * o_stride;
        for (int i = 0; i < hd; i++) {
            float a = acc ? oh[i] : 0.0f;
            for (int j = 0; j < n; j++) a += ph[j] * v[(size_t)j * v_stride + i];
            oh[i] = a;
        }
    }
}
