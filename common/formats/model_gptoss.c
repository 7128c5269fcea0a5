/* model_gptoss.c — GPT-OSS as the model source reads it (docs/GPTOSS.md):
 * llama.cpp's "gpt-oss" GGUF keys and names, GptOssForCausalLM directories,
 * whose expert tensors are converted once at load (model_src_internal.h).
 */
#include "model_src_internal.h"

#include "ie_mmap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-OSS (docs/GPTOSS.md §3.1 -> §3.3). The expert matrices and the
 * gate/up bias need converted copies (gptoss_hf_layer); their entries here
 * only name the HF source in error messages. */
static const name_pair_t k_gptoss_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"self_attn.q_proj.weight", "attn_q.weight", 0},
    {"self_attn.q_proj.bias", "attn_q.bias", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 0},
    {"self_attn.k_proj.bias", "attn_k.bias", 0},
    {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.v_proj.bias", "attn_v.bias", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"self_attn.o_proj.bias", "attn_output.bias", 0},
    {"self_attn.sinks", "attn_sinks.weight", 0},
    {"post_attention_layernorm.weight", "post_attention_norm.weight", 0},
    {"mlp.router.weight", "ffn_gate_inp.weight", 0},
    {"mlp.router.bias", "ffn_gate_inp.bias", 0},
    {"mlp.experts.down_proj_bias", "ffn_down_exps.bias", 0},
    {"mlp.experts.gate_up_proj", "ffn_gate_exps.weight", 1},
    {"mlp.experts.gate_up_proj", "ffn_up_exps.weight", 1},
    {"mlp.experts.down_proj", "ffn_down_exps.weight", 1},
    {"mlp.experts.gate_up_proj_bias", "ffn_gate_exps.bias", 1},
    {"mlp.experts.gate_up_proj_bias", "ffn_up_exps.bias", 1},
};

/* GPT-OSS hyper-parameters and tensors (docs/GPTOSS.md §1, §3.3). */
static ie_status_t gptoss_validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;
    const int64_t H = hp->n_embd, I = hp->n_ff, E = hp->n_expert;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const msrc_req_t req[] = {
        {"attn_norm.weight", 1, 0, {H}},
        {"attn_q.weight", 2, 0, {H, q_dim}},
        {"attn_q.bias", 1, 0, {q_dim}},
        {"attn_k.weight", 2, 0, {H, kv_dim}},
        {"attn_k.bias", 1, 0, {kv_dim}},
        {"attn_v.weight", 2, 0, {H, kv_dim}},
        {"attn_v.bias", 1, 0, {kv_dim}},
        {"attn_output.weight", 2, 0, {q_dim, H}},
        {"attn_output.bias", 1, 0, {H}},
        {"attn_sinks.weight", 1, 0, {hp->n_head}},
        {"post_attention_norm.weight", 1, 0, {H}},
        {"ffn_gate_inp.weight", 2, 0, {H, E}},
        {"ffn_gate_inp.bias", 1, 0, {E}},
        {"ffn_gate_exps.weight", 3, 0, {H, I, E}},
        {"ffn_up_exps.weight", 3, 0, {H, I, E}},
        {"ffn_down_exps.weight", 3, 0, {I, H, E}},
        {"ffn_gate_exps.bias", 2, 0, {I, E}},
        {"ffn_up_exps.bias", 2, 0, {I, E}},
        {"ffn_down_exps.bias", 2, 0, {H, E}},
    };
    ie_status_t st;

    if ((st = msrc_check_experts(hp, lb)) != IE_OK) return st;
    if ((st = msrc_check_swa(hp, lb)) != IE_OK) return st;
    if ((st = msrc_check_full_rotary(hp, lb)) != IE_OK) return st;
    if (!isfinite(hp->swiglu_limit) || hp->swiglu_limit <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: swiglu_limit %g must be positive", (double)hp->swiglu_limit);
    if (!isfinite(hp->swiglu_alpha) || hp->swiglu_alpha <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: swiglu_alpha %g must be positive", (double)hp->swiglu_alpha);
    if (hp->rope_yarn_factor != 0.0f) {
        if (!isfinite(hp->rope_yarn_factor) || hp->rope_yarn_factor < 1.0f)
            return ie_error_set(IE_ERR_FORMAT, "model: YaRN factor %g must be at least 1",
                                (double)hp->rope_yarn_factor);
        if (hp->rope_yarn_orig_ctx < 1)
            return ie_error_set(IE_ERR_FORMAT, "model: YaRN original context length %d must be positive",
                                hp->rope_yarn_orig_ctx);
        if (!isfinite(hp->rope_yarn_beta_fast) || hp->rope_yarn_beta_fast <= 0.0f ||
            !isfinite(hp->rope_yarn_beta_slow) || hp->rope_yarn_beta_slow <= 0.0f)
            return ie_error_set(IE_ERR_FORMAT, "model: YaRN beta_fast %g / beta_slow %g must be positive",
                                (double)hp->rope_yarn_beta_fast, (double)hp->rope_yarn_beta_slow);
    }
    if (!isfinite(hp->rope_attn_factor) || hp->rope_attn_factor <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: RoPE attention factor %g must be positive",
                            (double)hp->rope_attn_factor);

    if ((st = msrc_need_embd(s, 1)) != IE_OK) return st;
    return msrc_need_layers(s, req, COUNT(req));
}

/* gpt-oss GGUF (llama.cpp converter, docs/GPTOSS.md §3.3): the common keys,
 * then MoE, sliding window, YaRN. llama.cpp has no layer-type array: even
 * layers are sliding-window (set_swa_pattern(2)). There is no truncate key
 * either; rope_yarn_truncate = 0 because the released config (and
 * transformers / openai on it) use truncate = false, although ggml's own
 * corr-dims computation rounds. */
static ie_status_t gptoss_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    ie_status_t st;
    ie_gguf_str_t str;

    const char *ff_key = msrc_gguf_arch_has(g, "gpt-oss", "expert_feed_forward_length")
                             ? "expert_feed_forward_length"
                             : "feed_forward_length";
    if ((st = msrc_gguf_hparams_common(g, "gpt-oss", ff_key, 150000.0f, hp)) != IE_OK) return st;
    if ((st = msrc_gguf_int(g, "gpt-oss.expert_count", 1, 0, &hp->n_expert)) != IE_OK) return st;
    if ((st = msrc_gguf_int(g, "gpt-oss.expert_used_count", 1, 0, &hp->n_expert_used)) != IE_OK) return st;
    if ((st = msrc_gguf_int(g, "gpt-oss.attention.sliding_window", 1, 0, &hp->sliding_window)) != IE_OK) return st;
    for (int l = 0; l < hp->n_layer && l < IE_MAX_LAYERS; l++) hp->layer_swa[l] = (uint8_t)(l % 2 == 0);

    hp->rope_yarn_factor = 0.0f;
    hp->rope_attn_factor = 1.0f;
    if (ie_gguf_find_key(g, "gpt-oss.rope.scaling.type") >= 0) {
        if ((st = ie_gguf_get_str(g, "gpt-oss.rope.scaling.type", &str)) != IE_OK) return st;
        if (str.len == 4 && memcmp(str.ptr, "yarn", 4) == 0) {
            if ((st = msrc_gguf_float(g, "gpt-oss.rope.scaling.factor", 1, 0.0f, &hp->rope_yarn_factor)) != IE_OK)
                return st;
            if ((st = msrc_gguf_int(g, "gpt-oss.rope.scaling.original_context_length", 1, 0,
                                    &hp->rope_yarn_orig_ctx)) != IE_OK)
                return st;
            if ((st = msrc_gguf_float(g, "gpt-oss.rope.scaling.yarn_beta_fast", 0, 32.0f,
                                      &hp->rope_yarn_beta_fast)) != IE_OK)
                return st;
            if ((st = msrc_gguf_float(g, "gpt-oss.rope.scaling.yarn_beta_slow", 0, 1.0f,
                                      &hp->rope_yarn_beta_slow)) != IE_OK)
                return st;
            if ((st = msrc_gguf_float(g, "gpt-oss.rope.scaling.attn_factor", 0,
                                      msrc_yarn_mscale(hp->rope_yarn_factor), &hp->rope_attn_factor)) != IE_OK)
                return st;
            hp->rope_yarn_truncate = 0;
        } else if (!(str.len == 4 && memcmp(str.ptr, "none", 4) == 0)) {
            return ie_error_set(IE_ERR_UNSUPPORTED, "model: gpt-oss.rope.scaling.type '%.*s' is not supported",
                                (int)(str.len < 64 ? str.len : 64), str.ptr);
        }
    }
    if ((st = msrc_gguf_vocab(g, "gpt-oss.vocab_size", &hp->n_vocab)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX; /* llama.cpp does not permute gpt-oss Q/K */
    hp->tied_embeddings = 0;
    hp->attn_bias = 1;
    hp->attn_sinks = 1;
    hp->swiglu_limit = 7.0f; /* llama.cpp hard-codes both; no GGUF keys */
    hp->swiglu_alpha = 1.702f;
    for (int64_t i = 0; i < ie_gguf_tensor_count(g); i++) {
        const ie_gguf_tensor_info_t *t = ie_gguf_tensor(g, i);
        static const char fused[] = "ffn_gate_up_exps";
        for (uint64_t k = 0; t->name.len >= sizeof fused - 1 && k <= t->name.len - (sizeof fused - 1); k++)
            if (memcmp(t->name.ptr + k, fused, sizeof fused - 1) == 0)
                return ie_error_set(
                    IE_ERR_UNSUPPORTED,
                    "model: tensor '%.*s' (fused gate/up experts, --fuse-gate-up-exps) is not supported",
                    (int)(t->name.len < 96 ? t->name.len : 96), t->name.ptr);
    }
    return IE_OK;
}


/* RoPE of a GPT-OSS config: transformers 5 `rope_parameters` (rope_theta
 * inside) or 4.x `rope_scaling` + top-level `rope_theta`. Neither present:
 * GptOssConfig's default (the release's YaRN). Semantics of
 * _compute_yarn_parameters: factor absent -> max_position / original;
 * attention_factor absent -> mscale ratio or 0.1 ln(factor) + 1; beta_fast /
 * beta_slow absent or 0 -> 32 / 1; truncate absent -> true. */
static ie_status_t hf_rope_gptoss(ie_hparams_t *hp, const cJSON *cfg)
{
    const char *field, *type;
    const cJSON *ro = msrc_hf_rope_field(cfg, &field), *t;
    double theta, factor, orig, bf, bs, af, ms, msa;
    ie_status_t st;

    if ((st = msrc_rope_num(cfg, "config", "rope_theta", 0, 150000.0, &theta)) != IE_OK) return st;
    hp->rope_yarn_factor = 0.0f;
    hp->rope_attn_factor = 1.0f;
    if (!ro) { /* GptOssConfig default */
        hp->rope_theta = (float)theta;
        hp->rope_yarn_factor = 32.0f;
        hp->rope_yarn_orig_ctx = 4096;
        hp->rope_yarn_beta_fast = 32.0f;
        hp->rope_yarn_beta_slow = 1.0f;
        hp->rope_yarn_truncate = 0;
        hp->rope_attn_factor = msrc_yarn_mscale(32.0f);
        return IE_OK;
    }
    if ((st = msrc_rope_obj_base(ro, field, &theta, &type)) != IE_OK) return st;
    hp->rope_theta = (float)theta;
    if (strcmp(type, "default") == 0) return IE_OK;
    if (strcmp(type, "yarn") != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json %s type '%.32s' is not supported (default, yarn)", field, type);
    if ((st = msrc_rope_num(ro, field, "original_max_position_embeddings", 0, hp->n_ctx_train, &orig)) != IE_OK)
        return st;
    if (!(orig >= 1.0 && orig <= HP_MAX) || orig != floor(orig))
        return ie_error_set(IE_ERR_FORMAT,
                            "model: config.json %s.original_max_position_embeddings %g is out of range", field,
                            orig);
    if ((st = msrc_rope_num(ro, field, "factor", 0, hp->n_ctx_train / orig, &factor)) != IE_OK) return st;
    if ((st = msrc_rope_num(ro, field, "beta_fast", 1, 32.0, &bf)) != IE_OK) return st;
    if ((st = msrc_rope_num(ro, field, "beta_slow", 1, 1.0, &bs)) != IE_OK) return st;
    if ((st = msrc_rope_num(ro, field, "mscale", 1, 0.0, &ms)) != IE_OK) return st;
    if ((st = msrc_rope_num(ro, field, "mscale_all_dim", 1, 0.0, &msa)) != IE_OK) return st;
    af = factor <= 1.0 ? 1.0 : 0.1 * log(factor) + 1.0;
    if (ms != 0.0 && msa != 0.0 && factor > 1.0)
        af = (0.1 * ms * log(factor) + 1.0) / (0.1 * msa * log(factor) + 1.0);
    if ((st = msrc_rope_num(ro, field, "attention_factor", 0, af, &af)) != IE_OK) return st;
    t = msrc_obj_get(ro, "truncate");
    if (t && !cJSON_IsNull(t) && !cJSON_IsBool(t))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s.truncate' must be true or false", field);
    hp->rope_yarn_truncate = !(t && cJSON_IsFalse(t)); /* transformers: .get("truncate", True) */
    hp->rope_yarn_factor = (float)factor;
    hp->rope_yarn_orig_ctx = (int)orig;
    hp->rope_yarn_beta_fast = (float)bf;
    hp->rope_yarn_beta_slow = (float)bs;
    hp->rope_attn_factor = (float)af;
    return IE_OK;
}


/* GptOssConfig (docs/GPTOSS.md §1); defaults are the config class's. */
static ie_status_t gptoss_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *j, *q;
    int flag, given;

    if ((st = msrc_hf_dims(cfg, 131072, hp)) != IE_OK) return st;
    if (msrc_obj_get(cfg, "num_local_experts") || !msrc_obj_get(cfg, "num_experts"))
        st = msrc_cfg_int(cfg, "num_local_experts", 1, 0, &hp->n_expert);
    else st = msrc_cfg_int(cfg, "num_experts", 1, 0, &hp->n_expert);
    if (st != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "num_experts_per_tok", 0, 4, &hp->n_expert_used)) != IE_OK) return st;
    j = msrc_obj_get(cfg, "sliding_window");
    if (cJSON_IsNull(j)) hp->sliding_window = 0; /* explicit null: no window */
    else if ((st = msrc_cfg_int(cfg, "sliding_window", 0, 128, &hp->sliding_window)) != IE_OK) return st;
    /* no layer_types: GptOssConfig's even layers slide */
    if ((st = msrc_hf_layer_types(cfg, hp, &given)) != IE_OK) return st;
    if (!given)
        for (int l = 0; l < hp->n_layer; l++) hp->layer_swa[l] = (uint8_t)((l + 1) % 2);
    if ((st = msrc_cfg_float(cfg, "rms_norm_eps", 1e-5f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "swiglu_limit", 7.0f, &hp->swiglu_limit)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "swiglu_alpha", 1.702f, &hp->swiglu_alpha)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "tie_word_embeddings", &flag)) != IE_OK) return st;
    if (flag)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json tie_word_embeddings = true is not supported for gpt_oss");
    j = msrc_obj_get(cfg, "attention_bias");
    if (j && !cJSON_IsNull(j) && (st = msrc_cfg_bool(cfg, "attention_bias", &flag)) != IE_OK) return st;
    if (j && cJSON_IsFalse(j))
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json attention_bias = false is not supported for gpt_oss");
    q = msrc_obj_get(cfg, "quantization_config");
    if (q && !cJSON_IsNull(q)) {
        j = msrc_obj_get(q, "quant_method");
        if (!cJSON_IsString(j) || strcmp(j->valuestring, "mxfp4") != 0)
            return ie_error_set(IE_ERR_UNSUPPORTED,
                                "model: config.json quantization_config.quant_method '%.32s' is not "
                                "supported (only mxfp4)",
                                cJSON_IsString(j) ? j->valuestring : "?");
    }
    if ((st = hf_rope_gptoss(hp, cfg)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;
    hp->tied_embeddings = 0;
    hp->attn_bias = 1;
    hp->attn_sinks = 1;
    return IE_OK;
}

/* ---------------------------------------------------------------- GPT-OSS HF experts
 *
 * The HF expert tensors do not match the canonical layout, so each layer gets
 * converted copies (malloc'd, owned by the table entry, freed in destroy):
 *
 *   plain  gate_up_proj [E][H][2I] (in x out, gate = even columns, up = odd)
 *          -> ffn_gate_exps / ffn_up_exps row-major [E][I][H], source dtype;
 *          down_proj [E][I][H] -> ffn_down_exps [E][H][I] (per-expert transpose);
 *   MXFP4  *_blocks [E][out][in/32][16] + *_scales [E][out][in/32] (rows =
 *          outputs, gate_up rows 2j / 2j+1 = gate j / up j, byte b holds
 *          elements 2b (low nibble) and 2b+1 (high)) -> ggml block_mxfp4
 *          rows {e = scale byte; qs[j] = elem j | elem j+16 << 4};
 *   gate_up_proj_bias [E][2I] -> ffn_gate_exps.bias / ffn_up_exps.bias [E][I].
 *
 * down_proj_bias is already [E][H] and is mapped without a copy. */

static void mxfp4_rows(const uint8_t *blocks, const uint8_t *scales, int64_t E, int64_t R, int64_t nb,
                       int64_t stride, int64_t off, uint8_t *dst)
{
    int64_t r_out = R / stride;
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < r_out; j++)
            for (int64_t b = 0; b < nb; b++) {
                int64_t src_blk = (e * R + off + stride * j) * nb + b;
                const uint8_t *q = blocks + src_blk * 16;
                uint8_t *d = dst + ((e * r_out + j) * nb + b) * 17, code[32];
                for (int k = 0; k < 16; k++) {
                    code[2 * k] = q[k] & 15;
                    code[2 * k + 1] = q[k] >> 4;
                }
                d[0] = scales[src_blk];
                for (int k = 0; k < 16; k++) d[1 + k] = (uint8_t)(code[k] | code[k + 16] << 4);
            }
}

/* Converted sources' pages are dropped from our mapping afterwards
 * (ie_file_release_pages): the copy is what the engine reads, so resident
 * memory stays at about the file's size instead of file + converted experts. */
static ie_status_t gptoss_hf_layer(ie_model_src_t *s, int l)
{
    const int64_t H = s->hp.n_embd, I = s->hp.n_ff, E = s->hp.n_expert;
    const src_tensor_t *gu = NULL, *gu_s = NULL, *dn = NULL, *dn_s = NULL, *gub = NULL;
    char hn[160], hs[160], cg[96], cu[96], cd[96];
    uint8_t *g, *u, *d;
    ie_status_t st;
    size_t es;

    snprintf(hn, sizeof hn, "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
    if (msrc_find(s, hn)) { /* MXFP4 release layout */
        if (H % 32 != 0 || I % 32 != 0)
            return ie_error_set(IE_ERR_FORMAT,
                                "model: MXFP4 experts need hidden_size (%d) and intermediate_size (%d) "
                                "to be multiples of 32 ('%s')",
                                (int)H, (int)I, hn);
        {
            const int64_t gb[4] = {E, 2 * I, H / 32, 16}, db[4] = {E, H, I / 32, 16};
            if ((st = msrc_hf_raw(s, hn, 1, 4, gb, 1, &gu)) != IE_OK) return st;
            snprintf(hs, sizeof hs, "model.layers.%d.mlp.experts.gate_up_proj_scales", l);
            if ((st = msrc_hf_raw(s, hs, 1, 3, gb, 1, &gu_s)) != IE_OK) return st;
            snprintf(hn, sizeof hn, "model.layers.%d.mlp.experts.down_proj_blocks", l);
            if ((st = msrc_hf_raw(s, hn, 1, 4, db, 1, &dn)) != IE_OK) return st;
            snprintf(hs, sizeof hs, "model.layers.%d.mlp.experts.down_proj_scales", l);
            if ((st = msrc_hf_raw(s, hs, 1, 3, db, 1, &dn_s)) != IE_OK) return st;
        }
    } else {
        const int64_t gs[3] = {E, H, 2 * I}, ds[3] = {E, I, H};
        snprintf(hn, sizeof hn, "model.layers.%d.mlp.experts.gate_up_proj", l);
        if ((st = msrc_hf_raw(s, hn, 1, 3, gs, 0, &gu)) != IE_OK) return st;
        snprintf(hn, sizeof hn, "model.layers.%d.mlp.experts.down_proj", l);
        if ((st = msrc_hf_raw(s, hn, 1, 3, ds, 0, &dn)) != IE_OK) return st;
    }
    {
        const int64_t bs[2] = {E, 2 * I};
        snprintf(hn, sizeof hn, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        if ((st = msrc_hf_raw(s, hn, 1, 2, bs, 0, &gub)) != IE_OK) return st;
    }
    snprintf(cg, sizeof cg, "blk.%d.ffn_gate_exps.weight", l);
    snprintf(cu, sizeof cu, "blk.%d.ffn_up_exps.weight", l);
    snprintf(cd, sizeof cd, "blk.%d.ffn_down_exps.weight", l);

    if (gu_s) {
        const uint64_t gbytes = (uint64_t)(E * I * (H / 32)) * 17, dbytes = (uint64_t)(E * H * (I / 32)) * 17;
        if ((st = msrc_add_owned(s, cg, IE_DTYPE_MXFP4, "mxfp4", 3, H, I, E, gbytes, &g)) != IE_OK) return st;
        if ((st = msrc_add_owned(s, cu, IE_DTYPE_MXFP4, "mxfp4", 3, H, I, E, gbytes, &u)) != IE_OK) return st;
        if ((st = msrc_add_owned(s, cd, IE_DTYPE_MXFP4, "mxfp4", 3, I, H, E, dbytes, &d)) != IE_OK) return st;
        mxfp4_rows(gu->t.data, gu_s->t.data, E, 2 * I, H / 32, 2, 0, g);
        mxfp4_rows(gu->t.data, gu_s->t.data, E, 2 * I, H / 32, 2, 1, u);
        mxfp4_rows(dn->t.data, dn_s->t.data, E, H, I / 32, 1, 0, d);
        ie_file_release_pages(gu->t.data, (size_t)gu->t.nbytes);
        ie_file_release_pages(gu_s->t.data, gu_s->t.nbytes);
        ie_file_release_pages(dn->t.data, dn->t.nbytes);
        ie_file_release_pages(dn_s->t.data, dn_s->t.nbytes);
    } else {
        const uint8_t *src = gu->t.data;
        es = msrc_float_size(gu->t.dtype);
        if ((st = msrc_add_owned(s, cg, gu->t.dtype, gu->type_name, 3, H, I, E, (uint64_t)(E * I * H) * es, &g)) !=
            IE_OK)
            return st;
        if ((st = msrc_add_owned(s, cu, gu->t.dtype, gu->type_name, 3, H, I, E, (uint64_t)(E * I * H) * es, &u)) !=
            IE_OK)
            return st;
        for (int64_t e = 0; e < E; e++)
            for (int64_t i = 0; i < H; i++)
                for (int64_t j = 0; j < I; j++) {
                    const uint8_t *p = src + ((e * H + i) * 2 * I + 2 * j) * (int64_t)es;
                    memcpy(g + ((e * I + j) * H + i) * (int64_t)es, p, es);
                    memcpy(u + ((e * I + j) * H + i) * (int64_t)es, p + es, es);
                }
        src = dn->t.data;
        es = msrc_float_size(dn->t.dtype);
        if ((st = msrc_add_owned(s, cd, dn->t.dtype, dn->type_name, 3, I, H, E, (uint64_t)(E * H * I) * es, &d)) !=
            IE_OK)
            return st;
        for (int64_t e = 0; e < E; e++)
            for (int64_t i = 0; i < I; i++)
                for (int64_t h = 0; h < H; h++)
                    memcpy(d + ((e * H + h) * I + i) * (int64_t)es, src + ((e * I + i) * H + h) * (int64_t)es, es);
        ie_file_release_pages(gu->t.data, (size_t)gu->t.nbytes);
        ie_file_release_pages(dn->t.data, dn->t.nbytes);
    }

    snprintf(cg, sizeof cg, "blk.%d.ffn_gate_exps.bias", l);
    snprintf(cu, sizeof cu, "blk.%d.ffn_up_exps.bias", l);
    es = msrc_float_size(gub->t.dtype);
    if ((st = msrc_add_owned(s, cg, gub->t.dtype, gub->type_name, 2, I, E, 1, (uint64_t)(E * I) * es, &g)) != IE_OK)
        return st;
    if ((st = msrc_add_owned(s, cu, gub->t.dtype, gub->type_name, 2, I, E, 1, (uint64_t)(E * I) * es, &u)) != IE_OK)
        return st;
    for (int64_t k = 0; k < E * I; k++) {
        const uint8_t *p = (const uint8_t *)gub->t.data + 2 * k * (int64_t)es;
        memcpy(g + k * (int64_t)es, p, es);
        memcpy(u + k * (int64_t)es, p + es, es);
    }
    return IE_OK;
}

/* Append the converted expert tensors of every layer (msrc_find() keeps
 * searching the sorted prefix of HF names meanwhile), then re-sort. */
static ie_status_t gptoss_hf_convert(ie_model_src_t *s)
{
    ie_status_t st = IE_OK;
    for (int l = 0; l < s->hp.n_layer && st == IE_OK; l++) st = gptoss_hf_layer(s, l);
    return st == IE_OK ? msrc_sort_tensors(s) : st;
}


const msrc_arch_t msrc_arch_gptoss = {
    .id = IE_ARCH_GPTOSS,
    .name = "gpt-oss",
    .hf_classes = {"GptOssForCausalLM"},
    .hf_model_type = "gpt_oss",
    .layer_names = k_gptoss_layer_names,
    .n_layer_names = COUNT(k_gptoss_layer_names),
    .gguf_hparams = gptoss_gguf_hparams,
    .hf_hparams = gptoss_hf_hparams,
    .hf_extra_per_layer = 5,
    .hf_convert = gptoss_hf_convert,
    .validate = gptoss_validate,
};
