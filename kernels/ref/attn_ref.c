/* attn_ref.c — scalar attention loops (the oracle). */
#include "../src/ie_kernels_isa.h"

void ie_attn_scores_ref(const float *q, size_t q_stride, int nh, const ie_attn_rows_t *k, int j0, int n, int hd,
                        float scale, float *s, size_t ld)
{
    for (int h = 0; h < nh; h++) {
        const float *qh = q + (size_t)h * q_stride;
        ie_attn_cursor_t c;
        ie_attn_cursor_init(&c, k, j0);
        for (int j = 0; j < n; j++) {
            const float *kj = ie_attn_cursor_next(&c);
            double acc = 0.0;
            for (int i = 0; i < hd; i++) acc += (double)qh[i] * (double)kj[i];
            s[(size_t)h * ld + j] = (float)acc * scale;
        }
    }
}

void ie_attn_values_ref(const float *p, size_t ld, int nh, const ie_attn_rows_t *v, int j0, int n, int hd,
                        float *out, size_t o_stride)
{
    for (int h = 0; h < nh; h++) {
        const float *ph = p + (size_t)h * ld;
        float *oh = out + (size_t)h * o_stride;
        for (int i = 0; i < hd; i++) {
            double acc = 0.0;
            for (int j = 0; j < n; j++) acc += (double)ph[j] * (double)ie_attn_row(v, j0 + j)[i];
            oh[i] = (float)acc;
        }
    }
}
