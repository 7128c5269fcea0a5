/* model_qwen2.c — Qwen2 / Qwen2.5 as the model source reads it: llama.cpp's
 * "qwen2" GGUF keys and names, Qwen2ForCausalLM directories
 * (model_src_internal.h).
 *
 * The Llama block plus biases on q, k and v (none on o: hp.qkv_bias). The
 * llama.cpp converter does not permute Q/K for qwen2 (its RoPE is NEOX), so
 * both formats rotate rotate_half pairs. Small Qwen2.5 models tie the head.
 * Sliding-window attention (use_sliding_window, off in every released
 * model) is refused. Linear and YaRN RoPE scaling (Qwen2.5's long-context
 * recipe: rope_scaling {"rope_type": "yarn", "factor": 4.0,
 * "original_max_position_embeddings": 32768}) are computed as transformers
 * does (msrc_hf_rope_scaling, msrc_gguf_rope_scaling).
 */
#include "model_src_internal.h"

#include <string.h>

static const name_pair_t k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"self_attn.q_proj.weight", "attn_q.weight", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 0},
    {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.q_proj.bias", "attn_q.bias", 0},
    {"self_attn.k_proj.bias", "attn_k.bias", 0},
    {"self_attn.v_proj.bias", "attn_v.bias", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
    {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
};

/* qwen2 GGUF: the common keys (RoPE base 1e6 is only the config's default:
 * the converter always writes qwen2.rope.freq_base). */
static ie_status_t qwen2_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    ie_status_t st;

    if ((st = msrc_gguf_hparams_common(g, "qwen2", "feed_forward_length", 1000000.0f, hp)) != IE_OK) return st;
    if ((st = msrc_gguf_rope_scaling(g, "qwen2", hp)) != IE_OK) return st;
    if (ie_gguf_find_tensor(g, "rope_freqs.weight"))
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: tensor 'rope_freqs.weight' is not expected in a qwen2 model");
    if ((st = msrc_gguf_vocab_tied(g, "qwen2", hp)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;
    hp->qkv_bias = 1;
    return IE_OK;
}

/* Qwen2Config; what we do not implement is refused. */
static ie_status_t qwen2_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *lt, *e;
    const char *type;
    int flag;

    if ((st = msrc_hf_dims(cfg, 32768, hp)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rms_norm_eps", 1e-6f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rope_theta", 10000.0f, &hp->rope_theta)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "tie_word_embeddings", &hp->tied_embeddings)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;
    hp->qkv_bias = 1;

    if ((st = msrc_hf_rope_scaling(cfg, 0, hp, &type)) != IE_OK) return st;
    if ((st = msrc_cfg_silu(cfg)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "use_sliding_window", &flag)) != IE_OK) return st;
    if (flag)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json use_sliding_window = true is not supported (Qwen2 sliding-window "
                            "attention)");
    /* transformers 5 spells the layers' attention out */
    lt = msrc_obj_get(cfg, "layer_types");
    if (cJSON_IsArray(lt)) cJSON_ArrayForEach(e, lt)
        {
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention") != 0)
                return ie_error_set(IE_ERR_UNSUPPORTED,
                                    "model: config.json layer_types entry '%.32s' is not supported (only "
                                    "full_attention)",
                                    cJSON_IsString(e) ? e->valuestring : "?");
        }
    return IE_OK;
}

/* The Llama tensors plus the q/k/v biases. */
static ie_status_t qwen2_validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const msrc_req_t req[] = {
        {"attn_q.bias", 1, 0, {q_dim}},
        {"attn_k.bias", 1, 0, {kv_dim}},
        {"attn_v.bias", 1, 0, {kv_dim}},
    };
    ie_status_t st;

    if ((st = msrc_llama_validate(s, lb)) != IE_OK) return st;
    return msrc_need_layers(s, req, COUNT(req));
}

const msrc_arch_t msrc_arch_qwen2 = {
    .id = IE_ARCH_QWEN2,
    .name = "qwen2",
    .hf_classes = {"Qwen2ForCausalLM"},
    .hf_model_type = "qwen2",
    .layer_names = k_layer_names,
    .n_layer_names = COUNT(k_layer_names),
    .gguf_hparams = qwen2_gguf_hparams,
    .hf_hparams = qwen2_hf_hparams,
    .validate = qwen2_validate,
};
