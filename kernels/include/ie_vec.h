/* ie_vec.h — element-wise activation kernels with SIMD variants.
 *
 * The scalar definitions live in ie_kernels.h (ie_swiglu_f32,
 * ie_softmax_sink_f32, ie_rmsnorm_f32) and are
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
    /* out = x * (1/sqrt(mean(x^2) + eps)) * w over n >= 1 floats, the
     * square sum in double like ie_rmsnorm_f32 (only the order of its adds
     * differs; each output is the scalar's formula on that scale). out may
     * alias x. */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    /* ie_stream_read at this ISA's load width (the same result). */
    uint64_t (*stream_read)(const void *p, size_t n);
} ie_vec_ops_t;

/* Read n bytes at p once, front to back, and return the xor of their
 * 8-byte words in native byte order (the last n % 8 bytes zero-extended
 * into one more word, as if copied to the start of a zeroed word): a plain
 * memory stream with the least work per byte, the ceiling a kernel
 * streaming the same bytes is measured against (ie_worker_stream_probe).
 * Any alignment; n may be 0 (returns 0). The portable oracle; the table's
 * stream_read is the fast one. */
uint64_t ie_stream_read(const void *p, size_t n);

/* Table for `isa` (AVX2 uses the scalar loops), or NULL if unsupported. */
const ie_vec_ops_t *ie_vec_get(ie_isa_t isa);

#endif
