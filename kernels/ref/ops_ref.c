/* ops_ref.c — element-wise and small ops of the forward pass (scalar).
 *
 * Numerics follow HF transformers' float32 code paths where that matters for
 * agreement with reference logits: rmsnorm scales x by rsqrt(mean(x^2)+eps)
 * before multiplying by the weight, rope angles are computed in float32 from
 * a float32 inv_freq table. Reductions accumulate in double (more accurate
 * than torch's float32 sums, never less).
 */
#include "ie_kernels.h"

#include <math.h>

void ie_rmsnorm_f32(float *out, const float *x, const float *w, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float mean = (float)(ss / (double)n);
    const float scale = (float)(1.0 / sqrt((double)(mean + eps)));
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void ie_softmax_sink_f32(float *x, int64_t n, const float *sink)
{
    if (n <= 0) return;
    float max = sink && *sink > x[0] ? *sink : x[0];
    for (int64_t i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = sink ? (double)expf(*sink - max) : 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void ie_softmax_f32(float *x, int64_t n) { ie_softmax_sink_f32(x, n, NULL); }

void ie_swiglu_f32(float *out, const float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i], ui = u[i];
        out[i] = gi / (1.0f + expf(-gi)) * ui; /* silu(g) * u */
    }
}

/* cos/sin of pair i's angle, computed as HF does in float32:
 * inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim)). */
static void rope_cs(int64_t i, int64_t rot_dim, int64_t pos, float theta, float *c, float *s)
{
    const float expo = (float)(2 * i) / (float)rot_dim;
    const float inv_freq = 1.0f / powf(theta, expo);
    const float angle = (float)pos * inv_freq;
    *c = (float)cos((double)angle); /* correctly rounded cos of the float angle */
    *s = (float)sin((double)angle);
}

void ie_rope_table_f32(float *cos_t, float *sin_t, int64_t rot_dim, int64_t pos, float theta)
{
    for (int64_t i = 0; i < rot_dim / 2; i++) rope_cs(i, rot_dim, pos, theta, &cos_t[i], &sin_t[i]);
}

/* Rotate pair (x0, x1) by (c, s) with HF's float order: q*cos + rotate_half(q)*sin. */
static inline void rope_pair(float *x, int64_t i0, int64_t i1, float c, float s)
{
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * c - x1 * s;
    x[i1] = x1 * c + x0 * s;
}

void ie_rope_apply_f32(float *x, int64_t head_dim, int64_t rot_dim, const float *cos_t, const float *sin_t,
                       ie_rope_layout_t layout)
{
    (void)head_dim; /* elements in [rot_dim, head_dim) are left untouched */
    const int64_t half = rot_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        if (layout == IE_ROPE_NEOX) rope_pair(x, i, i + half, cos_t[i], sin_t[i]);
        else rope_pair(x, 2 * i, 2 * i + 1, cos_t[i], sin_t[i]);
    }
}

void ie_rope_f32(float *x, int64_t head_dim, int64_t rot_dim, int64_t pos, float theta, ie_rope_layout_t layout)
{
    (void)head_dim;
    const int64_t half = rot_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float c, s;
        rope_cs(i, rot_dim, pos, theta, &c, &s);
        if (layout == IE_ROPE_NEOX) rope_pair(x, i, i + half, c, s);
        else rope_pair(x, 2 * i, 2 * i + 1, c, s);
    }
}

float ie_dot_f32(const float *a, const float *b, int64_t n)
{
    /* Eight independent partial sums: lets the compiler vectorize without
     * -ffast-math, and is more accurate than one running sum. */
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void ie_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
