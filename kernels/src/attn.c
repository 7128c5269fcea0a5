/* attn.c — the portable float attention loops (the AVX2 table's). */
#include "ie_kernels_isa.h"

#include <math.h>
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

/* Contract (ie_attn.h). */
void ie_attn_state_merge(const ie_attn_state_t *a, const ie_attn_state_t *b, int nh, int hd)
{
    for (int h = 0; h < nh; h++) {
        if (b->l[h] == 0.0f) continue; /* b empty: a stands */
        float *oa = a->o + (size_t)h * a->os;
        const float *ob = b->o + (size_t)h * b->os;
        if (a->l[h] == 0.0f) { /* a empty: b's state (exp(-inf) never taken) */
            a->m[h] = b->m[h];
            a->l[h] = b->l[h];
            memcpy(oa, ob, (size_t)hd * sizeof(float));
            continue;
        }
        const float m = a->m[h] > b->m[h] ? a->m[h] : b->m[h];
        const float ca = expf(a->m[h] - m), cb = expf(b->m[h] - m);
        a->m[h] = m;
        a->l[h] = a->l[h] * ca + b->l[h] * cb;
        for (int i = 0; i < hd; i++) oa[i] = oa[i] * ca + ob[i] * cb;
    }
}

/* Contract (ie_attn.h). */
void ie_attn_state_finish(const ie_attn_state_t *a, int nh, int hd, const float *sink, float *out,
                          size_t out_stride)
{
    for (int h = 0; h < nh; h++) {
        const float mh = a->l[h] > 0.0f ? a->m[h] : -INFINITY;
        const float m = sink && sink[h] > mh ? sink[h] : mh;
        const float c = a->l[h] > 0.0f ? expf(mh - m) : 0.0f;
        const float z = a->l[h] * c + (sink ? expf(sink[h] - m) : 0.0f);
        const float f = c / z;
        const float *o = a->o + (size_t)h * a->os;
        float *y = out + (size_t)h * out_stride;
        for (int i = 0; i < hd; i++) y[i] = o[i] * f;
    }
}
