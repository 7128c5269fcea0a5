/* ie_vec.h — element-wise activation kernels with SIMD variants.
 *
 * The scalar definitions live in ie_kernels.h (ie_swiglu_f32,
 * ie_softmax_sink_f32) and are
 * the oracles; the SIMD versions here agree within a few float ulps (a
 * polynomial exp instead of libm's expf). Obtain the table once with
 * ie_vec_get(isa); callers split long arrays across threads themselves.
 */
#ifndef IE_VEC_H
#define IE_VEC_H

#include "ie_kernels.h"

typedef struct ie_vec_ops {
    ie_isa_t isa;
    /* out[i] = silu(g[i]) * u[i]; out may alias g or u. */
    void (*swiglu)(float *out, const float *g, const float *u, int64_t n);
    /* In-place softmax over n >= 1 values; with sink != NULL the logit
     * *sink joins the normalization and its share is dropped (GPT-OSS's
     * attention sinks): x[i] = exp(x[i]-m) / (sum_j exp(x[j]-m) + exp(*sink-m)). */
    void (*softmax)(float *x, int64_t n, const float *sink);
} ie_vec_ops_t;

/* Table for `isa` (AVX2 uses the scalar loops), or NULL if unsupported. */
const ie_vec_ops_t *ie_vec_get(ie_isa_t isa);

#endif
