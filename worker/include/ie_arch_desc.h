/* ie_arch_desc.h — what the forward pass needs to know about a model's
 * architecture, as data.
 *
 * The forward pass (worker/src/forward.c) never asks which architecture it
 * runs: it reads this descriptor, filled once from the hyper-parameters
 * when the worker is made. Adding an architecture is an entry in
 * arch_desc.c (which switches it turns on) plus its tensor names; the
 * pass changes only where the new architecture needs math it does not have
 * yet. Every switch is declared here, with the value that means "off",
 * even combinations no architecture uses yet; a model that
 * turns one on is refused at load (IE_ERR_UNSUPPORTED naming the switch)
 * until the pass implements it.
 *
 * Entries: Llama (SmolLM2, TinyLlama), GPT-OSS, and the families being
 * added (Qwen2/3, Qwen3-MoE, Phi-3, Gemma 2/3), which take their switches
 * from the file's hyper-parameters.
 */
#ifndef IE_ARCH_DESC_H
#define IE_ARCH_DESC_H

#include "ie_kernels.h"
#include "ie_model_src.h"
#include "ie_status.h"

/* How RoPE frequencies are scaled past the training context. */
typedef enum ie_rope_scaling {
    IE_ROPE_SCALING_NONE = 0,   /* theta^(-2i/d) as is                       */
    IE_ROPE_SCALING_YARN = 1,   /* YaRN ramp + attention factor (GPT-OSS)    */
    IE_ROPE_SCALING_LINEAR = 2, /* positions times hp.rope_freq_scale (Gemma 3) */
    IE_ROPE_SCALING_FREQS = 3   /* each frequency divided by its factor in
                                   rope_freqs.weight (Llama 3.x, Phi-3 long
                                   RoPE); cos/sin times rope_attn_factor   */
} ie_rope_scaling_t;

/* The feed-forward block of every layer. */
typedef enum ie_ffn_kind {
    IE_FFN_DENSE = 0, /* gate/up/down on every token                       */
    IE_FFN_MOE = 1    /* a router picks experts per token                  */
} ie_ffn_kind_t;

/* The MLP's activation and how it gates the up projection. */
typedef enum ie_ffn_gating {
    IE_GATING_SWIGLU = 0,       /* act(gate) * up                          */
    IE_GATING_SWIGLU_CLAMP = 1, /* GPT-OSS: gate clamped above, up on both
                                   sides at gate_limit, (up + 1) * gate *
                                   sigmoid(gate_alpha * gate)              */
} ie_ffn_gating_t;

typedef enum ie_ffn_act {
    IE_ACT_SILU = 0,     /* x * sigmoid(x)                                 */
    IE_ACT_GELU_TANH = 1 /* Gemma's gelu_pytorch_tanh                      */
} ie_ffn_act_t;

/* How MoE router logits become expert weights. */
typedef enum ie_moe_routing {
    IE_ROUTE_TOPK_SOFTMAX = 0, /* top-k logits, softmax over those k (GPT-OSS) */
    IE_ROUTE_SOFTMAX_TOPK = 1  /* softmax over all, top-k of the
                                  probabilities (Qwen3-MoE)                */
} ie_moe_routing_t;

/* Where the RMS norms sit around each block. */
typedef enum ie_norm_place {
    IE_NORM_PRE = 0,     /* x += f(norm(x))          (Llama, GPT-OSS)       */
    IE_NORM_SANDWICH = 1 /* x += norm(f(norm(x)))    (Gemma 2/3)            */
} ie_norm_place_t;

typedef struct ie_arch_desc {
    const char *name; /* "llama", "gpt-oss"                     */

    /* ---- attention */
    int qkv_bias;                 /* q, k, v projections add a bias         */
    int o_bias;                   /* the output projection adds a bias      */
    int qk_norm;                  /* per-head RMS norm of q and k before
                                    RoPE (Qwen 3, Gemma 3)                 */
    int sinks;                    /* per-head sink logit in the softmax      */
    int sliding;                  /* some layers see only the last
                                    hp.sliding_window positions; which
                                    ones is the file's pattern,
                                    hp.layer_swa (GPT-OSS: even layers)    */
    ie_rope_layout_t rope_layout; /* NORMAL (interleaved pairs) or NEOX     */
    ie_rope_scaling_t rope_scaling;
    float attn_softcap; /* scores = c * tanh(scores / c); 0: off  */

    /* ---- feed-forward */
    ie_ffn_kind_t ffn;
    ie_ffn_act_t act;
    ie_ffn_gating_t gating;
    float gate_limit, gate_alpha; /* IE_GATING_SWIGLU_CLAMP's constants    */
    ie_moe_routing_t routing;     /* IE_FFN_MOE only                        */
    int top_k;                    /* experts per token (IE_FFN_MOE; 0 dense) */
    int norm_topk;                /* IE_ROUTE_SOFTMAX_TOPK: renormalize the
                                    k weights to sum 1                     */
    int router_bias, expert_bias; /* the router / experts add biases       */

    /* ---- norms, embedding, head */
    ie_norm_place_t norm;
    float embd_scale;    /* x = embedding * embd_scale; 0: off     */
    float final_softcap; /* logits = c * tanh(logits / c); 0: off  */
    int tied_output;     /* the head is token_embd.weight          */

    /* ---- tensor names that differ between architectures */
    const char *ffn_norm_name; /* "ffn_norm" or "post_attention_norm"    */
} ie_arch_desc_t;

/* Fill *out for the model hp describes: the architecture's entry, then
 * what the file decides (RoPE layout and scaling, tied head, MoE). Errors:
 * IE_ERR_UNSUPPORTED for an architecture without an entry or a switch the
 * forward pass does not implement yet (the message names it). */
ie_status_t ie_arch_desc_init(const ie_hparams_t *hp, ie_arch_desc_t *out);

#endif
