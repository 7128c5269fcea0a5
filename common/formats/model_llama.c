/* model_llama.c — the Llama architecture (SmolLM2, TinyLlama, Llama 2) as
 * the model source reads it: llama.cpp's "llama" GGUF keys and names,
 * LlamaForCausalLM directories (model_src_internal.h).
 */
#include "model_src_internal.h"

#include <stdio.h>
#include <string.h>

static const name_pair_t k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},    {"self_attn.q_proj.weight", "attn_q.weight", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 0},      {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0}, {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},       {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
};

/* llama GGUF: the common keys; the llama.cpp converter permutes Q/K for the
 * interleaved-pair rotation. */
static ie_status_t llama_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    ie_status_t st;
    ie_gguf_str_t str;

    if ((st = msrc_gguf_hparams_common(g, "llama", "feed_forward_length", 10000.0f, hp)) != IE_OK) return st;
    /* Llama 3.1-style frequency scaling: we would silently compute wrong rotations */
    if (ie_gguf_get_str(g, "llama.rope.scaling.type", &str) == IE_OK &&
        !(str.len == 4 && !memcmp(str.ptr, "none", 4)))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: llama.rope.scaling.type '%.*s' is not supported",
                            (int)(str.len < 64 ? str.len : 64), str.ptr);
    if (ie_gguf_find_tensor(g, "rope_freqs.weight"))
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: tensor 'rope_freqs.weight' (RoPE frequency scaling) is not supported");
    if ((st = msrc_gguf_vocab(g, "llama.vocab_size", &hp->n_vocab)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NORMAL;
    hp->tied_embeddings = ie_gguf_find_tensor(g, "output.weight") == NULL;
    return IE_OK;
}

/* LlamaConfig; features we do not implement are refused rather than
 * computed wrong. */
static ie_status_t llama_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *j;
    int flag;

    if ((st = msrc_hf_dims(cfg, 2048, hp)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rms_norm_eps", 1e-6f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rope_theta", 10000.0f, &hp->rope_theta)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "tie_word_embeddings", &hp->tied_embeddings)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;

    if ((st = msrc_hf_check_rope(cfg, "rope_scaling", "unknown")) != IE_OK) return st;
    if ((st = msrc_hf_check_rope(cfg, "rope_parameters", "default")) != IE_OK) return st;
    if ((st = msrc_cfg_float(msrc_obj_get(cfg, "rope_parameters"), "rope_theta", hp->rope_theta, &hp->rope_theta)) != IE_OK)
        return st;
    j = msrc_obj_get(cfg, "hidden_act");
    if (cJSON_IsString(j) && strcmp(j->valuestring, "silu") != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json hidden_act '%.32s' is not supported (only silu)", j->valuestring);
    if ((st = msrc_cfg_bool(cfg, "attention_bias", &flag)) != IE_OK) return st;
    if (flag) return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json attention_bias = true is not supported");
    if ((st = msrc_cfg_bool(cfg, "mlp_bias", &flag)) != IE_OK) return st;
    if (flag) return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json mlp_bias = true is not supported");
    return IE_OK;
}

/* The dense Llama tensors: embedding, norms, head unless tied, and per
 * layer q/k/v/o and the SwiGLU MLP. */
static ie_status_t llama_validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;
    ie_status_t st = IE_OK;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[64];

    (void)lb;
    if ((st = msrc_need(s, "token_embd.weight", 2, hp->n_embd, hp->n_vocab)) != IE_OK) return st;
    if ((st = msrc_need(s, "output_norm.weight", 1, hp->n_embd, 0)) != IE_OK) return st;
    if (!hp->tied_embeddings && (st = msrc_need(s, "output.weight", 2, hp->n_embd, hp->n_vocab)) != IE_OK) return st;
    for (int l = 0; l < hp->n_layer; l++) {
        const struct {
            const char *suffix;
            int n_dims;
            int64_t ne0, ne1;
        } req[] = {
            {"attn_norm.weight", 1, hp->n_embd, 0},       {"attn_q.weight", 2, hp->n_embd, q_dim},
            {"attn_k.weight", 2, hp->n_embd, kv_dim},     {"attn_v.weight", 2, hp->n_embd, kv_dim},
            {"attn_output.weight", 2, q_dim, hp->n_embd}, {"ffn_norm.weight", 1, hp->n_embd, 0},
            {"ffn_gate.weight", 2, hp->n_embd, hp->n_ff}, {"ffn_up.weight", 2, hp->n_embd, hp->n_ff},
            {"ffn_down.weight", 2, hp->n_ff, hp->n_embd},
        };
        for (size_t i = 0; i < COUNT(req); i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, req[i].suffix);
            if ((st = msrc_need(s, name, req[i].n_dims, req[i].ne0, req[i].ne1)) != IE_OK) return st;
        }
    }
    return IE_OK;
}


const msrc_arch_t msrc_arch_llama = {
    .id = IE_ARCH_LLAMA,
    .name = "llama",
    .hf_classes = {"LlamaForCausalLM"},
    .hf_model_type = "llama",
    .layer_names = k_layer_names,
    .n_layer_names = COUNT(k_layer_names),
    .gguf_hparams = llama_gguf_hparams,
    .hf_hparams = llama_hf_hparams,
    .validate = llama_validate,
};
