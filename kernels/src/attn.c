/* attn.c — the portable float attention loops (the AVX2 table's). */
#include "ie_kernels_isa.h"

#include <string.h>

/* Contract (ie_kernels_isa.h): float-accumulating C loops (the compiler
 * vectorizes the inner loops); ref keeps double accumulation. */
void ie_attn_scores_generic(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, int hd,
                            float scale, float *s, size_t ld)
{
    for (int h = 0; h < nh; h++) {
        const float *qh = q + (size_t)h * q_stride;
        ie_attn_cursor_t c;
        ie_attn_cursor_init(&c, k, j0);
        for (int j = 0; j < n; j++) {
            const float *kj = ie_attn_cursor_next(&c);
            float acc = 0.0f;
            for (int i = 0; i < hd; i++) acc += qh[i] * kj[i];
            s[(size_t)h * ld + j] = acc * scale;
        }
    }
}

void ie_attn_values_generic(const float *p, size_t ld, int nh, const ie_attn_rows_t *v, int j0, int n, int hd,
                            float *out, size_t o_stride)
{
    for (int h = 0; h < nh; h++) memset(out + (size_t)h * o_stride, 0, (size_t)hd * sizeof(float));
    ie_attn_cursor_t c;
    ie_attn_cursor_init(&c, v, j0);
    for (int j = 0; j < n; j++) {
        const float *vj = ie_attn_cursor_next(&c);
        for (int h = 0; h < nh; h++) {
            const float w = p[(size_t)h * ld + j];
            float *oh = out + (size_t)h * o_stride;
            for (int i = 0; i < hd; i++) oh[i] += w * vj[i];
        }
    }
}
