/* vec.c — the element-wise kernel table per ISA. */
#include "ie_vec.h"

void ie_swiglu_f32_avx512(float *out, const float *g, const float *u, int64_t n);
void ie_softmax_sink_f32_avx512(float *x, int64_t n, const float *sink);

static const ie_vec_ops_t g_vec[3] = {
    {IE_ISA_REF, ie_swiglu_f32, ie_softmax_sink_f32},
    {IE_ISA_AVX2, ie_swiglu_f32, ie_softmax_sink_f32},
    {IE_ISA_AVX512, ie_swiglu_f32_avx512, ie_softmax_sink_f32_avx512},
};

const ie_vec_ops_t *ie_vec_get(ie_isa_t isa)
{
    if (!ie_isa_supported(isa)) return NULL;
    return &g_vec[isa];
}
