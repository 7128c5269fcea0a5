/* model_llama.c — the Llama architecture (SmolLM2, TinyLlama, Llama 2,
 * Llama 3.x, Mistral) as the model source reads it: llama.cpp's "llama"
 * GGUF keys and names, LlamaForCausalLM / MistralForCausalLM directories
 * (model_src_internal.h).
 *
 * Llama 3.x's "llama3" RoPE scaling becomes per-frequency divisors in
 * rope_freqs.weight (hp.rope_freqs): llama.cpp's converter writes that
 * tensor into the GGUF; for an HF directory we compute it from config.json
 * (llama_hf_convert). Mistral is Llama with a sliding window on every layer
 * when its config sets one; llama.cpp converts it as "llama" without the
 * window, so a Mistral GGUF attends to everything, as llama.cpp does.
 *
 * Mixtral is Llama whose MLP is a mixture of experts, and llama.cpp keeps
 * it "llama": a GGUF with llama.expert_count > 0 has per layer a router
 * (ffn_gate_inp, no bias) and stacked SwiGLU experts ffn_{gate,up,down}_exps
 * (feed_forward_length is the expert width); routing is a softmax over all
 * experts, top-k, the k weights renormalized to sum 1 (transformers'
 * MixtralTopKRouter, llama.cpp's norm_w for llama). MixtralForCausalLM
 * directories store the router as block_sparse_moe.gate and the experts one
 * by one (block_sparse_moe.experts.N.w1 / w3 / w2: gate / up / down),
 * stacked at load like Qwen3-MoE's (msrc_hf_stack_experts). Old GGUFs with
 * one tensor per expert (blk.N.ffn_gate.E.weight) are refused.
 */
#include "model_src_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const name_pair_t k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"self_attn.q_proj.weight", "attn_q.weight", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 0},
    {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
    {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
    /* Mixtral: the router; transformers 5's in-memory name second. The
     * expert stacks are converted copies (llama_hf_convert): their entries
     * only name the HF source in errors. */
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight", 0},
    {"mlp.gate.weight", "ffn_gate_inp.weight", 0},
    {"block_sparse_moe.experts.*.w1.weight", "ffn_gate_exps.weight", 1},
    {"block_sparse_moe.experts.*.w3.weight", "ffn_up_exps.weight", 1},
    {"block_sparse_moe.experts.*.w2.weight", "ffn_down_exps.weight", 1},
};

/* Mixtral: llama.expert_count absent or 0 is a plain Llama; else the top-k
 * (expert_used_count) is required and the routing is Mixtral's. Experts
 * stored one per tensor (llama.cpp before its stacked layout) are refused
 * naming the tensor rather than read as a dense Llama. */
static ie_status_t llama_gguf_experts(const ie_gguf_t *g, ie_hparams_t *hp)
{
    static const char *const old[3] = {"ffn_gate", "ffn_up", "ffn_down"};
    int64_t n = 0;
    ie_status_t st;
    char name[64];

    hp->n_expert = hp->n_expert_used = 0;
    if (ie_gguf_find_key(g, "llama.expert_count") >= 0 && ie_gguf_get_i64(g, "llama.expert_count", &n) != IE_OK)
        return IE_ERR_FORMAT; /* the reason names the key */
    if (n == 0) return IE_OK;
    if ((st = msrc_check_range("llama.expert_count", n, &hp->n_expert)) != IE_OK) return st;
    if ((st = msrc_gguf_int(g, "llama.expert_used_count", 1, 0, &hp->n_expert_used)) != IE_OK) return st;
    for (int p = 0; p < 3; p++) {
        snprintf(name, sizeof name, "blk.0.%s.0.weight", old[p]);
        if (ie_gguf_find_tensor(g, name))
            return ie_error_set(IE_ERR_UNSUPPORTED,
                                "model: tensor '%s': experts stored one per tensor (an old llama.cpp "
                                "conversion) are not supported; convert again for ffn_%s_exps.weight",
                                name, old[p] + 4);
    }
    hp->moe_softmax_first = 1;
    hp->moe_norm_topk = 1;
    return IE_OK;
}

/* llama GGUF: the common keys; the llama.cpp converter permutes Q/K for the
 * interleaved-pair rotation. */
static ie_status_t llama_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    ie_status_t st;

    if ((st = msrc_gguf_hparams_common(g, "llama", "feed_forward_length", 10000.0f, hp)) != IE_OK) return st;
    /* linear / YaRN scaling; Llama 3.x's has no type key, only
     * rope_freqs.weight. */
    if ((st = msrc_gguf_rope_scaling(g, "llama", hp)) != IE_OK) return st;
    hp->rope_freqs = ie_gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    if ((st = msrc_gguf_vocab_tied(g, "llama", hp)) != IE_OK) return st;
    if ((st = llama_gguf_experts(g, hp)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NORMAL;
    return IE_OK;
}

/* Llama 3.x's scaling constants (transformers' _compute_llama3_parameters
 * requires all four). */
typedef struct llama3_rope {
    double factor, low_freq_factor, high_freq_factor, orig_ctx;
} llama3_rope_t;

static ie_status_t llama3_read(const cJSON *ro, const char *field, llama3_rope_t *r)
{
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    double *vals[] = {&r->factor, &r->low_freq_factor, &r->high_freq_factor, &r->orig_ctx};
    ie_status_t st;
    for (size_t i = 0; i < COUNT(keys); i++) {
        const cJSON *j = msrc_obj_get(ro, keys[i]);
        if (!j || cJSON_IsNull(j))
            return ie_error_set(IE_ERR_FORMAT, "model: config.json %s (rope_type llama3) lacks '%s'", field,
                                keys[i]);
        if ((st = msrc_rope_num(ro, field, keys[i], 0, 0.0, vals[i])) != IE_OK) return st;
        if (!(*vals[i] > 0.0))
            return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s.%s' = %g must be positive", field,
                                keys[i], *vals[i]);
    }
    if (!(r->low_freq_factor < r->high_freq_factor))
        return ie_error_set(IE_ERR_FORMAT,
                            "model: config.json %s.low_freq_factor (%g) must be below high_freq_factor (%g)", field,
                            r->low_freq_factor, r->high_freq_factor);
    return IE_OK;
}

/* RoPE: the base, then plain, linear, YaRN (msrc_hf_rope_scaling) or
 * "llama3" scaling (hp->rope_freqs; the divisors are computed once the
 * tensor table exists, llama_hf_convert); every other type is refused. */
static ie_status_t llama_hf_rope(const cJSON *cfg, ie_hparams_t *hp)
{
    const char *field, *type;
    const cJSON *ro;
    llama3_rope_t r;
    ie_status_t st;

    if ((st = msrc_cfg_float(cfg, "rope_theta", 10000.0f, &hp->rope_theta)) != IE_OK) return st;
    hp->rope_freqs = 0;
    if ((st = msrc_hf_rope_scaling(cfg, 1, hp, &type)) != IE_OK) return st;
    if (strcmp(type, "llama3") != 0) return IE_OK;
    ro = msrc_hf_rope_field(cfg, &field);
    if ((st = llama3_read(ro, field, &r)) != IE_OK) return st;
    hp->rope_freqs = 1;
    return IE_OK;
}

/* 1 if config.json names class `cls` in "architectures" or has
 * model_type `type`. */
static int hf_is(const cJSON *cfg, const char *cls, const char *type)
{
    const cJSON *j = msrc_obj_get(cfg, "model_type"), *archs = msrc_obj_get(cfg, "architectures"), *a;
    if (cJSON_IsString(j) && strcmp(j->valuestring, type) == 0) return 1;
    if (!cJSON_IsArray(archs)) return 0;
    cJSON_ArrayForEach(a, archs)
    {
        if (cJSON_IsString(a) && strcmp(a->valuestring, cls) == 0) return 1;
    }
    return 0;
}

/* MixtralConfig's experts: num_local_experts (required: its default, 8,
 * says nothing about the checkpoint) and num_experts_per_tok (default 2),
 * the top-k at most the experts; intermediate_size is the expert width. */
static ie_status_t mixtral_hf_experts(const cJSON *cfg, ie_hparams_t *hp)
{
    ie_status_t st;
    if ((st = msrc_cfg_int(cfg, "num_local_experts", 1, 0, &hp->n_expert)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "num_experts_per_tok", 0, 2, &hp->n_expert_used)) != IE_OK) return st;
    if (hp->n_expert_used > hp->n_expert)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: config.json num_experts_per_tok (%d) exceeds num_local_experts (%d)",
                            hp->n_expert_used, hp->n_expert);
    hp->moe_softmax_first = 1;
    hp->moe_norm_topk = 1;
    return IE_OK;
}

/* LlamaConfig / MistralConfig / MixtralConfig; features we do not
 * implement are refused rather than computed wrong. */
static ie_status_t llama_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *j;
    int mistral, mixtral;

    if ((st = msrc_hf_dims(cfg, 2048, hp)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rms_norm_eps", 1e-6f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "tie_word_embeddings", &hp->tied_embeddings)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;
    if ((st = llama_hf_rope(cfg, hp)) != IE_OK) return st;
    if ((st = msrc_cfg_silu(cfg)) != IE_OK) return st;
    if ((st = msrc_cfg_refuse_true(cfg, "attention_bias")) != IE_OK) return st;
    if ((st = msrc_cfg_refuse_true(cfg, "mlp_bias")) != IE_OK) return st;

    /* Mistral and Mixtral: sliding_window (null: none) on every layer.
     * LlamaConfig has no such field, so a Llama config's stray one is
     * ignored like HF does. */
    mixtral = hf_is(cfg, "MixtralForCausalLM", "mixtral");
    mistral = mixtral || hf_is(cfg, "MistralForCausalLM", "mistral");
    hp->n_expert = hp->n_expert_used = 0;
    if (mixtral && (st = mixtral_hf_experts(cfg, hp)) != IE_OK) return st;
    hp->sliding_window = 0;
    j = msrc_obj_get(cfg, "sliding_window");
    if (mistral && j && !cJSON_IsNull(j)) { /* msrc_cfg_int would refuse null's default 0 */
        if ((st = msrc_cfg_int(cfg, "sliding_window", 1, 0, &hp->sliding_window)) != IE_OK) return st;
        for (int l = 0; l < hp->n_layer && l < IE_MAX_LAYERS; l++) hp->layer_swa[l] = hp->sliding_window > 0;
    }
    return IE_OK;
}

/* HF "llama3" RoPE: rope_freqs.weight[i] = inv_freq[i] / inv_freq_llama3[i],
 * both computed in float32 like transformers' _compute_llama3_parameters
 * (the worker divides inv_freq by it: llama.cpp's freq_factors). High
 * frequencies keep theirs (1), low ones are divided by factor, a smooth
 * blend between. */
static ie_status_t llama3_hf_freqs(ie_model_src_t *s)
{
    const ie_hparams_t *hp = &s->hp;
    const char *field;
    const cJSON *ro;
    llama3_rope_t r;
    uint8_t *buf;
    ie_status_t st;
    const int half = hp->rope_dim / 2;

    if (hp->rope_dim < 2 || hp->rope_dim % 2)
        return ie_error_set(IE_ERR_FORMAT, "model: head_dim (%d) must be even for RoPE", hp->rope_dim);
    ro = msrc_hf_rope_field(s->hf_cfg, &field);
    if ((st = llama3_read(ro, field, &r)) != IE_OK) return st;
    if (msrc_find(s, "rope_freqs.weight"))
        return ie_error_set(IE_ERR_FORMAT, "model: the checkpoint has a tensor 'rope_freqs.weight' of its own");
    if ((st = msrc_add_owned(s, "rope_freqs.weight", IE_DTYPE_F32, "F32", 1, half, 1, 1,
                             (uint64_t)half * sizeof(float), &buf)) != IE_OK)
        return st;
    float *rf = (float *)buf;
    const float factor = (float)r.factor, lo = (float)r.low_freq_factor, hi = (float)r.high_freq_factor;
    const float old_ctx = (float)r.orig_ctx;
    const float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    for (int i = 0; i < half; i++) {
        const float inv = 1.0f / powf(hp->rope_theta, (float)(2 * i) / (float)hp->rope_dim);
        const float wavelen = (float)(2.0 * M_PI) / inv;
        float scaled = inv;
        if (wavelen > low_wavelen) scaled = inv / factor;
        else if (!(wavelen < high_wavelen)) {
            const float smooth = (old_ctx / wavelen - lo) / (hi - lo);
            scaled = (1.0f - smooth) * inv / factor + smooth * inv;
        }
        rf[i] = inv / scaled;
    }
    return IE_OK;
}

/* Mixtral's expert stacks (block_sparse_moe.experts.N.w1/w3/w2, or
 * transformers 5's fused mlp.experts), then the llama3 RoPE divisors;
 * msrc_find() keeps searching the sorted prefix of HF names meanwhile, and
 * the table is re-sorted once. */
static ie_status_t llama_hf_convert(ie_model_src_t *s)
{
    static const char *const proj[3] = {"w1.weight", "w3.weight", "w2.weight"};
    ie_status_t st = IE_OK;

    if (!s->hp.rope_freqs && s->hp.n_expert == 0) return IE_OK;
    for (int l = 0; l < s->hp.n_layer && s->hp.n_expert > 0 && st == IE_OK; l++)
        st = msrc_hf_stack_experts(s, l, "block_sparse_moe.experts", proj, "mlp.experts");
    if (st == IE_OK && s->hp.rope_freqs) st = llama3_hf_freqs(s);
    return st == IE_OK ? msrc_sort_tensors(s) : st;
}

/* Contract (model_src_internal.h). With experts (Mixtral), the router and
 * the expert stacks replace the dense MLP. */
ie_status_t msrc_llama_validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;
    const int64_t H = hp->n_embd, F = hp->n_ff, E = hp->n_expert;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const int moe = E > 0;
    const msrc_req_t req[] = {
        {"attn_norm.weight", 1, 0, {H}},
        {"attn_q.weight", 2, 0, {H, q_dim}},
        {"attn_k.weight", 2, 0, {H, kv_dim}},
        {"attn_v.weight", 2, 0, {H, kv_dim}},
        {"attn_output.weight", 2, 0, {q_dim, H}},
        {"ffn_norm.weight", 1, 0, {H}},
        /* dense */
        {"ffn_gate.weight", 2, moe, {H, F}},
        {"ffn_up.weight", 2, moe, {H, F}},
        {"ffn_down.weight", 2, moe, {F, H}},
        /* MoE */
        {"ffn_gate_inp.weight", 2, !moe, {H, E}},
        {"ffn_gate_exps.weight", 3, !moe, {H, F, E}},
        {"ffn_up_exps.weight", 3, !moe, {H, F, E}},
        {"ffn_down_exps.weight", 3, !moe, {F, H, E}},
    };
    ie_status_t st;

    if (moe && (st = msrc_check_experts(hp, lb)) != IE_OK) return st;
    if ((st = msrc_need_embd(s, !hp->tied_embeddings)) != IE_OK) return st;
    return msrc_need_layers(s, req, COUNT(req));
}


const msrc_arch_t msrc_arch_llama = {
    .id = IE_ARCH_LLAMA,
    .name = "llama",
    .hf_classes = {"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"},
    .hf_model_type = "llama",
    .layer_names = k_layer_names,
    .n_layer_names = COUNT(k_layer_names),
    .gguf_hparams = llama_gguf_hparams,
    .hf_hparams = llama_hf_hparams,
    .hf_extra_per_layer = 3, /* Mixtral's expert stacks */
    .hf_extra = 1,           /* rope_freqs.weight */
    .hf_convert = llama_hf_convert,
    .validate = msrc_llama_validate,
};
