/* arch_desc.c — the architecture descriptors (ie_arch_desc.h): one entry
 * per architecture, what the file decides on top, and the check that the
 * forward pass implements every switch a model turns on.
 *
 * To add an architecture: give it an ie_arch_t in ie_model_src.h, its
 * hyper-parameters and tensor names in common/src/model_src.c, an entry
 * here; then only the switches it needs and the pass lacks are new code.
 */
#include "ie_arch_desc.h"

#include <stddef.h>

/* What each architecture is, whatever the file. */
static const ie_arch_desc_t k_llama = {
    .name = "llama",
    .rope_scaling = IE_ROPE_SCALING_NONE,
    .ffn = IE_FFN_DENSE,
    .act = IE_ACT_SILU,
    .gating = IE_GATING_SWIGLU,
    .norm = IE_NORM_PRE,
    .ffn_norm_name = "ffn_norm",
};

static const ie_arch_desc_t k_gptoss = {
    .name = "gpt-oss",
    .qkv_bias = 1,
    .o_bias = 1,
    .sinks = 1,
    .sliding = 1,
    .ffn = IE_FFN_MOE,
    .act = IE_ACT_SILU,
    .gating = IE_GATING_SWIGLU_CLAMP,
    .routing = IE_ROUTE_TOPK_SOFTMAX,
    .router_bias = 1,
    .expert_bias = 1,
    .norm = IE_NORM_PRE,
    .ffn_norm_name = "post_attention_norm",
};

/* Contract (ie_arch_desc.h). */
ie_status_t ie_arch_desc_init(const ie_hparams_t *hp, ie_arch_desc_t *out)
{
    const char *missing = NULL;
    switch (hp->arch_id) {
    case IE_ARCH_LLAMA: *out = k_llama; break;
    case IE_ARCH_GPTOSS: *out = k_gptoss; break;
    default: return ie_error_set(IE_ERR_UNSUPPORTED, "worker: architecture '%s' has no descriptor", hp->arch);
    }
    /* what the file decides */
    out->rope_layout = hp->rope_layout;
    if (hp->rope_yarn_factor > 0) out->rope_scaling = IE_ROPE_SCALING_YARN;
    out->tied_output = hp->tied_embeddings != 0;
    out->qkv_bias = out->o_bias = hp->attn_bias != 0;
    out->sinks = hp->attn_sinks != 0;
    out->sliding = hp->sliding_window > 0;
    out->ffn = hp->n_expert > 0 ? IE_FFN_MOE : IE_FFN_DENSE;
    if (out->ffn == IE_FFN_MOE) {
        out->top_k = hp->n_expert_used;
        out->gate_limit = hp->swiglu_limit;
        out->gate_alpha = hp->swiglu_alpha;
    } else {
        out->gating = IE_GATING_SWIGLU; /* the clamp is the experts' only */
    }

    /* switches declared for the next architectures, not implemented yet */
    if (out->qk_norm) missing = "per-head q/k norm";
    else if (out->attn_softcap != 0) missing = "attention logit soft-capping";
    else if (out->final_softcap != 0) missing = "final logit soft-capping";
    else if (out->embd_scale != 0) missing = "embedding scale";
    else if (out->norm != IE_NORM_PRE) missing = "post-block norms";
    else if (out->act != IE_ACT_SILU) missing = "GELU activation";
    else if (out->rope_scaling == IE_ROPE_SCALING_LINEAR || out->rope_scaling == IE_ROPE_SCALING_LLAMA3)
        missing = "RoPE scaling other than YaRN";
    else if (out->ffn == IE_FFN_MOE && out->routing != IE_ROUTE_TOPK_SOFTMAX)
        missing = "softmax-then-top-k routing";
    else if (out->ffn == IE_FFN_MOE && !out->expert_bias) missing = "MoE experts without biases";
    else if (out->ffn == IE_FFN_MOE && out->gating != IE_GATING_SWIGLU_CLAMP)
        missing = "MoE experts without the clamped SwiGLU";
    if (missing)
        return ie_error_set(IE_ERR_UNSUPPORTED, "worker: architecture '%s' needs %s, which the forward pass lacks",
                            out->name, missing);
    return IE_OK;
}
