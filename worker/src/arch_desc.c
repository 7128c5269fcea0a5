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

/* Mixtral: the llama architecture with experts (llama.cpp keeps the name;
 * chosen when the file has n_expert > 0). Plain SwiGLU experts without
 * biases, a router without bias; softmax over all experts, top-k,
 * renormalized (from the file, as for Qwen3-MoE). */
static const ie_arch_desc_t k_mixtral = {
    .name = "mixtral",
    .rope_scaling = IE_ROPE_SCALING_NONE,
    .ffn = IE_FFN_MOE,
    .act = IE_ACT_SILU,
    .gating = IE_GATING_SWIGLU,
    .routing = IE_ROUTE_SOFTMAX_TOPK,
    .router_bias = 0,
    .expert_bias = 0,
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

/* The Llama-shaped families: each one's own switches come from the file
 * (ie_arch_desc_init copies hp), so the entries differ only in name. */
static const ie_arch_desc_t k_qwen2 = {.name = "qwen2", .ffn_norm_name = "ffn_norm"};
static const ie_arch_desc_t k_qwen3 = {.name = "qwen3", .ffn_norm_name = "ffn_norm"};
/* Qwen3-MoE: plain SwiGLU experts without biases, router without bias;
 * routing (softmax first) and renormalization come from the file. */
static const ie_arch_desc_t k_qwen3moe = {
    .name = "qwen3moe",
    .gating = IE_GATING_SWIGLU,
    .router_bias = 0,
    .expert_bias = 0,
    .ffn_norm_name = "ffn_norm",
};
static const ie_arch_desc_t k_phi3 = {.name = "phi3", .ffn_norm_name = "ffn_norm"};
static const ie_arch_desc_t k_gemma2 = {.name = "gemma2", .ffn_norm_name = "ffn_norm"};
static const ie_arch_desc_t k_gemma3 = {.name = "gemma3", .ffn_norm_name = "ffn_norm"};

/* Contract (ie_arch_desc.h). */
ie_status_t ie_arch_desc_init(const ie_hparams_t *hp, ie_arch_desc_t *out)
{
    const char *missing = NULL;
    switch (hp->arch_id) {
    case IE_ARCH_LLAMA: *out = hp->n_expert > 0 ? k_mixtral : k_llama; break;
    case IE_ARCH_GPTOSS: *out = k_gptoss; break;
    case IE_ARCH_QWEN2: *out = k_qwen2; break;
    case IE_ARCH_QWEN3: *out = k_qwen3; break;
    case IE_ARCH_QWEN3MOE: *out = k_qwen3moe; break;
    case IE_ARCH_PHI3: *out = k_phi3; break;
    case IE_ARCH_GEMMA2: *out = k_gemma2; break;
    case IE_ARCH_GEMMA3: *out = k_gemma3; break;
    default: return ie_error_set(IE_ERR_UNSUPPORTED, "worker: architecture '%s' has no descriptor", hp->arch);
    }
    /* what the file decides */
    out->rope_layout = hp->rope_layout;
    if (hp->rope_yarn_factor > 0) out->rope_scaling = IE_ROPE_SCALING_YARN;
    out->tied_output = hp->tied_embeddings != 0;
    out->qkv_bias = hp->attn_bias != 0 || hp->qkv_bias != 0;
    out->o_bias = hp->attn_bias != 0;
    out->qk_norm = hp->qk_norm != 0;
    out->attn_softcap = hp->attn_softcap;
    out->final_softcap = hp->final_softcap;
    out->embd_scale = hp->embd_scale;
    out->norm = hp->post_norms ? IE_NORM_SANDWICH : IE_NORM_PRE;
    out->act = hp->ffn_gelu ? IE_ACT_GELU_TANH : IE_ACT_SILU;
    if (hp->rope_freqs) out->rope_scaling = IE_ROPE_SCALING_FREQS;
    else if (hp->rope_freq_scale != 0.0f && hp->rope_freq_scale != 1.0f) out->rope_scaling = IE_ROPE_SCALING_LINEAR;
    out->sinks = hp->attn_sinks != 0;
    out->sliding = hp->sliding_window > 0;
    out->ffn = hp->n_expert > 0 ? IE_FFN_MOE : IE_FFN_DENSE;
    if (out->ffn == IE_FFN_MOE) {
        out->top_k = hp->n_expert_used;
        out->gate_limit = hp->swiglu_limit;
        out->gate_alpha = hp->swiglu_alpha;
        if (hp->moe_softmax_first) out->routing = IE_ROUTE_SOFTMAX_TOPK;
        out->norm_topk = hp->moe_norm_topk != 0;
    } else {
        out->gating = IE_GATING_SWIGLU; /* the clamp is the experts' only */
    }

    /* combinations the forward pass does not implement */
    if (hp->rope_freqs && hp->rope_freq_scale != 0.0f && hp->rope_freq_scale != 1.0f)
        missing = "linear RoPE scaling together with rope_freqs factors";
    if (missing)
        return ie_error_set(IE_ERR_UNSUPPORTED, "worker: architecture '%s' needs %s, which the forward pass lacks",
                            out->name, missing);
    return IE_OK;
}
