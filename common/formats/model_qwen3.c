/* model_qwen3.c — Qwen3 and Qwen3-MoE as the model source reads them
 * (model_src_internal.h): llama.cpp's "qwen3" / "qwen3moe" GGUF keys and
 * names, Qwen3ForCausalLM / Qwen3MoeForCausalLM directories.
 *
 * Both are Llama-shaped with a per-head RMS norm of q and k before RoPE
 * (attn_q_norm / attn_k_norm, [head_dim]), an explicit head_dim (often not
 * hidden / heads), no biases and NEOX RoPE in both formats (the converter
 * does not permute Q/K for qwen3). Qwen3-MoE replaces every layer's MLP by
 * a router (ffn_gate_inp, no bias) choosing top-k of n_expert SwiGLU
 * experts after a softmax over all of them, optionally renormalizing the k
 * weights (norm_topk_prob). HF directories store the experts one by one
 * (mlp.experts.N.{gate,up,down}_proj.weight; transformers 5 may save them
 * fused as mlp.experts.gate_up_proj / down_proj): both become converted
 * copies stacked as the GGUF holds them, ffn_{gate,up,down}_exps.weight
 * with the expert outermost (ne = [in, out, n_expert]).
 */
#include "model_src_internal.h"

#include <stdio.h>
#include <string.h>

/* HF name after "model.layers.N." <-> canonical name after "blk.N.". */
static const name_pair_t k_qwen3_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},    {"self_attn.q_proj.weight", "attn_q.weight", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 0},      {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0}, {"self_attn.q_norm.weight", "attn_q_norm.weight", 0},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", 0}, {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},       {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
};

/* The same attention; the expert stacks are converted copies
 * (qwen3moe_hf_layer): their entries only name the HF source in errors. */
static const name_pair_t k_qwen3moe_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"self_attn.q_proj.weight", "attn_q.weight", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 0},
    {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", 0},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate.weight", "ffn_gate_inp.weight", 0},
    {"mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight", 1},
    {"mlp.experts.*.up_proj.weight", "ffn_up_exps.weight", 1},
    {"mlp.experts.*.down_proj.weight", "ffn_down_exps.weight", 1},
};

/* ------------------------------------------------------------------ GGUF */

/* The keys both share under prefix a: the common ones (ff_key: the MLP or
 * expert width), plain RoPE only, vocabulary, tied head, q/k norm. */
static ie_status_t qwen3_gguf_common(const ie_gguf_t *g, const char *a, const char *ff_key, ie_hparams_t *hp)
{
    ie_status_t st;

    if ((st = msrc_gguf_hparams_common(g, a, ff_key, 10000.0f, hp)) != IE_OK) return st;
    /* linear / YaRN (Qwen3's long-context recipe) */
    if ((st = msrc_gguf_rope_scaling(g, a, hp)) != IE_OK) return st;
    if (ie_gguf_find_tensor(g, "blk.0.attn_q.bias"))
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: tensor 'blk.0.attn_q.bias': %s with attention biases is not supported", a);
    if ((st = msrc_gguf_vocab_tied(g, a, hp)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX; /* convert_hf_to_gguf does not permute qwen3 Q/K */
    hp->qk_norm = 1;
    return IE_OK;
}

static ie_status_t qwen3_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    return qwen3_gguf_common(g, "qwen3", "feed_forward_length", hp);
}

/* qwen3moe: expert width, count and top-k. llama.cpp always renormalizes
 * the top-k weights for qwen3moe (every release has norm_topk_prob = true);
 * an expert_weights_norm key, where a file has one, decides. */
static ie_status_t qwen3moe_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    ie_status_t st;

    if ((st = qwen3_gguf_common(g, "qwen3moe", "expert_feed_forward_length", hp)) != IE_OK) return st;
    if ((st = msrc_gguf_int(g, "qwen3moe.expert_count", 1, 0, &hp->n_expert)) != IE_OK) return st;
    if ((st = msrc_gguf_int(g, "qwen3moe.expert_used_count", 1, 0, &hp->n_expert_used)) != IE_OK) return st;
    hp->moe_norm_topk = 1;
    if (ie_gguf_find_key(g, "qwen3moe.expert_weights_norm") >= 0 &&
        (st = ie_gguf_get_bool(g, "qwen3moe.expert_weights_norm", &hp->moe_norm_topk)) != IE_OK)
        return ie_error_set(st, "model: key 'qwen3moe.expert_weights_norm' must be a bool");
    hp->moe_softmax_first = 1;
    /* llama.cpp's expert_gating_func: 1 = softmax, what Qwen3-MoE routes with */
    if (msrc_gguf_arch_has(g, "qwen3moe", "expert_gating_func")) {
        int fn = 0;
        if ((st = msrc_gguf_int(g, "qwen3moe.expert_gating_func", 1, 0, &fn)) != IE_OK) return st;
        if (fn != 1)
            return ie_error_set(IE_ERR_UNSUPPORTED,
                                "model: qwen3moe.expert_gating_func = %d is not supported (only 1, softmax)", fn);
    }
    if (msrc_gguf_arch_has(g, "qwen3moe", "expert_shared_count") ||
        ie_gguf_find_tensor(g, "blk.0.ffn_gate_shexp.weight"))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: qwen3moe with a shared expert is not supported");
    return IE_OK;
}

/* -------------------------------------------------------------- config.json */

/* What Qwen3Config and Qwen3MoeConfig share; features we do not implement
 * are refused rather than computed wrong. */
static ie_status_t qwen3_hf_common(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *j, *e;
    const char *type;

    if ((st = msrc_hf_dims(cfg, 32768, hp)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rms_norm_eps", 1e-6f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rope_theta", 10000.0f, &hp->rope_theta)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "tie_word_embeddings", &hp->tied_embeddings)) != IE_OK) return st;
    if ((st = msrc_hf_rope_scaling(cfg, 0, hp, &type)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;
    hp->qk_norm = 1;
    if ((st = msrc_cfg_silu(cfg)) != IE_OK) return st;
    if ((st = msrc_cfg_refuse_true(cfg, "attention_bias")) != IE_OK) return st;
    if ((st = msrc_cfg_refuse_true(cfg, "use_sliding_window")) != IE_OK) return st;
    j = msrc_obj_get(cfg, "layer_types");
    if (cJSON_IsArray(j)) cJSON_ArrayForEach(e, j)
        {
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention") != 0)
                return ie_error_set(IE_ERR_UNSUPPORTED,
                                    "model: config.json layer_types: only 'full_attention' layers are supported");
        }
    return IE_OK;
}

/* Qwen3Config: head_dim defaults to 128 there, not hidden / heads. */
static ie_status_t qwen3_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_status_t st;
    const cJSON *j = msrc_obj_get(cfg, "head_dim");
    if ((st = qwen3_hf_common(s, cfg)) != IE_OK) return st;
    if (!j || cJSON_IsNull(j)) s->hp.head_dim = s->hp.rope_dim = 128;
    return IE_OK;
}

/* Qwen3MoeConfig: every layer must be sparse (decoder_sparse_step 1, no
 * mlp_only_layers): a dense layer among experts is not supported. */
static ie_status_t qwen3moe_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *j;
    const char *ne_field = msrc_obj_get(cfg, "num_experts") ? "num_experts" : "num_local_experts";
    int step;

    if ((st = qwen3_hf_common(s, cfg)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, ne_field, 1, 0, &hp->n_expert)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "num_experts_per_tok", 0, 8, &hp->n_expert_used)) != IE_OK) return st;
    if (hp->n_expert_used > hp->n_expert)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json num_experts_per_tok (%d) exceeds %s (%d)",
                            hp->n_expert_used, ne_field, hp->n_expert);
    if ((st = msrc_cfg_int(cfg, "moe_intermediate_size", 0, 768, &hp->n_ff)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "norm_topk_prob", &hp->moe_norm_topk)) != IE_OK) return st;
    hp->moe_softmax_first = 1;
    if ((st = msrc_cfg_int(cfg, "decoder_sparse_step", 0, 1, &step)) != IE_OK) return st;
    if (step != 1)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json decoder_sparse_step = %d (dense MLP layers among MoE layers) is "
                            "not supported",
                            step);
    j = msrc_obj_get(cfg, "mlp_only_layers");
    if (j && !cJSON_IsNull(j) && (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 0))
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json mlp_only_layers (dense MLP layers among MoE layers) is not "
                            "supported");
    return IE_OK;
}

/* Layer l's experts as ffn_{gate,up,down}_exps.weight (msrc_hf_stack_experts):
 * mlp.experts.N.{gate,up,down}_proj.weight, or fused under mlp.experts. */
static ie_status_t qwen3moe_hf_layer(ie_model_src_t *s, int l)
{
    static const char *const proj[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    return msrc_hf_stack_experts(s, l, "mlp.experts", proj, "mlp.experts");
}

/* Append every layer's converted stacks (msrc_find() keeps searching the
 * sorted prefix of HF names meanwhile), then re-sort. */
static ie_status_t qwen3moe_hf_convert(ie_model_src_t *s)
{
    ie_status_t st = IE_OK;
    for (int l = 0; l < s->hp.n_layer && st == IE_OK; l++) st = qwen3moe_hf_layer(s, l);
    return st == IE_OK ? msrc_sort_tensors(s) : st;
}

/* ------------------------------------------------------------- validation */

/* Embedding, norms, head unless tied; per layer attention with the q/k
 * norms, then the dense MLP (n_expert 0) or router and expert stacks. */
static ie_status_t qwen3_validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;
    const int64_t H = hp->n_embd, I = hp->n_ff, E = hp->n_expert;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const int moe = hp->arch_id == IE_ARCH_QWEN3MOE;
    const msrc_req_t req[] = {
        {"attn_norm.weight", 1, 0, {H}},
        {"attn_q.weight", 2, 0, {H, q_dim}},
        {"attn_k.weight", 2, 0, {H, kv_dim}},
        {"attn_v.weight", 2, 0, {H, kv_dim}},
        {"attn_output.weight", 2, 0, {q_dim, H}},
        {"attn_q_norm.weight", 1, 0, {hp->head_dim}},
        {"attn_k_norm.weight", 1, 0, {hp->head_dim}},
        {"ffn_norm.weight", 1, 0, {H}},
        /* dense */
        {"ffn_gate.weight", 2, moe, {H, I}},
        {"ffn_up.weight", 2, moe, {H, I}},
        {"ffn_down.weight", 2, moe, {I, H}},
        /* MoE */
        {"ffn_gate_inp.weight", 2, !moe, {H, E}},
        {"ffn_gate_exps.weight", 3, !moe, {H, I, E}},
        {"ffn_up_exps.weight", 3, !moe, {H, I, E}},
        {"ffn_down_exps.weight", 3, !moe, {I, H, E}},
    };
    ie_status_t st;

    if (moe && (st = msrc_check_experts(hp, lb)) != IE_OK) return st;
    if ((st = msrc_check_full_rotary(hp, lb)) != IE_OK) return st;
    if ((st = msrc_need_embd(s, !hp->tied_embeddings)) != IE_OK) return st;
    return msrc_need_layers(s, req, COUNT(req));
}

const msrc_arch_t msrc_arch_qwen3 = {
    .id = IE_ARCH_QWEN3,
    .name = "qwen3",
    .hf_classes = {"Qwen3ForCausalLM"},
    .hf_model_type = "qwen3",
    .layer_names = k_qwen3_names,
    .n_layer_names = COUNT(k_qwen3_names),
    .gguf_hparams = qwen3_gguf_hparams,
    .hf_hparams = qwen3_hf_hparams,
    .validate = qwen3_validate,
};

const msrc_arch_t msrc_arch_qwen3moe = {
    .id = IE_ARCH_QWEN3MOE,
    .name = "qwen3moe",
    .hf_classes = {"Qwen3MoeForCausalLM"},
    .hf_model_type = "qwen3_moe",
    .layer_names = k_qwen3moe_names,
    .n_layer_names = COUNT(k_qwen3moe_names),
    .gguf_hparams = qwen3moe_gguf_hparams,
    .hf_hparams = qwen3moe_hf_hparams,
    .hf_extra_per_layer = 3,
    .hf_convert = qwen3moe_hf_convert,
    .validate = qwen3_validate,
};
