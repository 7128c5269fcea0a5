/* model_family.c — what several architectures' files (model_<arch>.c)
 * share beyond the format side (model_src_internal.h): the per-layer
 * tensor table check, the hyper-parameter checks the validators repeat,
 * and the GGUF keys and config.json fields the Llama-shaped families read
 * alike, and the stacking of HF experts the SwiGLU MoE families share. Each architecture still lists what it needs; these only do the
 * checking, with the error messages the files had.
 */
#include "model_src_internal.h"

#include "ie_mmap.h"
#include <math.h>

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------ validation */

/* Contract (model_src_internal.h). */
ie_status_t msrc_need_layers(const ie_model_src_t *s, const msrc_req_t *req, size_t n)
{
    ie_status_t st = IE_OK;
    char name[96];

    for (int l = 0; l < s->hp.n_layer && st == IE_OK; l++)
        for (size_t i = 0; i < n && st == IE_OK; i++) {
            if (req[i].skip) continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, req[i].suffix);
            st = msrc_need_ne(s, name, req[i].n_dims, req[i].ne);
        }
    return st;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_need_embd(const ie_model_src_t *s, int head)
{
    const int64_t emb[2] = {s->hp.n_embd, s->hp.n_vocab}, norm[1] = {s->hp.n_embd};
    ie_status_t st;

    if ((st = msrc_need_ne(s, "token_embd.weight", 2, emb)) != IE_OK) return st;
    if ((st = msrc_need_ne(s, "output_norm.weight", 1, norm)) != IE_OK) return st;
    return head ? msrc_need_ne(s, "output.weight", 2, emb) : IE_OK;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_check_full_rotary(const ie_hparams_t *hp, const hp_labels_t *lb)
{
    if (hp->rope_dim != hp->head_dim)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: %s (%d) differs from %s (%d): partial rotary is not supported", lb->rope_dim,
                            hp->rope_dim, lb->head_dim, hp->head_dim);
    return IE_OK;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_check_swa(const ie_hparams_t *hp, const hp_labels_t *lb)
{
    int any_swa = 0;

    for (int l = 0; l < hp->n_layer; l++) any_swa |= hp->layer_swa[l];
    if (any_swa && hp->sliding_window < 1)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: %s (%d) must be at least 1: some layers use sliding-window attention",
                            lb->sliding_window, hp->sliding_window);
    return IE_OK;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_check_experts(const ie_hparams_t *hp, const hp_labels_t *lb)
{
    if (hp->n_expert_used > hp->n_expert)
        return ie_error_set(IE_ERR_FORMAT, "model: %s (%d) exceeds %s (%d)", lb->n_expert_used, hp->n_expert_used,
                            lb->n_expert, hp->n_expert);
    return IE_OK;
}

/* ------------------------------------------------------------------ GGUF */

/* Contract (model_src_internal.h). llama.cpp's converter writes
 * rope.scaling.factor for linear and yarn, original_context_length for
 * yarn, and yarn_attn_factor / yarn_beta_fast / yarn_beta_slow only where
 * the config has attention_factor / beta_fast / beta_slow: absent, they are
 * transformers' defaults (0.1 ln(factor) + 1, 32, 1). The correction range
 * is rounded (truncate), as ggml's corr dims and transformers' default do.
 * Extrapolation factors other than 1 and DeepSeek's log multiplier are
 * refused. */
ie_status_t msrc_gguf_rope_scaling(const ie_gguf_t *g, const char *a, ie_hparams_t *hp)
{
    ie_gguf_str_t str;
    ie_status_t st;
    float factor, v;
    char key[96];

    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (ie_gguf_find_key(g, key) < 0) return IE_OK;
    if ((st = ie_gguf_get_str(g, key, &str)) != IE_OK)
        return ie_error_set(IE_ERR_FORMAT, "model: key '%s' must be a string", key);
    if (str.len == 4 && memcmp(str.ptr, "none", 4) == 0) return IE_OK;
    const int linear = str.len == 6 && memcmp(str.ptr, "linear", 6) == 0;
    const int yarn = str.len == 4 && memcmp(str.ptr, "yarn", 4) == 0;
    if (!linear && !yarn)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: %s '%.*s' is not supported (none, linear, yarn)", key,
                            (int)(str.len < 64 ? str.len : 64), str.ptr);
    if ((st = msrc_gguf_arch_float(g, a, "rope.scaling.factor", 1, 0.0f, &factor)) != IE_OK) return st;
    if (!isfinite(factor) || factor < 1.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: %s.rope.scaling.factor %g must be at least 1", a,
                            (double)factor);
    if (linear) {
        hp->rope_freq_scale = factor == 1.0f ? 0.0f : 1.0f / factor;
        return IE_OK;
    }
    if ((st = msrc_gguf_arch_int(g, a, "rope.scaling.original_context_length", 1, 0, &hp->rope_yarn_orig_ctx)) !=
        IE_OK)
        return st;
    if ((st = msrc_gguf_arch_float(g, a, "rope.scaling.yarn_beta_fast", 0, 32.0f, &hp->rope_yarn_beta_fast)) !=
            IE_OK ||
        (st = msrc_gguf_arch_float(g, a, "rope.scaling.yarn_beta_slow", 0, 1.0f, &hp->rope_yarn_beta_slow)) !=
            IE_OK)
        return st;
    if (!isfinite(hp->rope_yarn_beta_fast) || hp->rope_yarn_beta_fast <= 0.0f ||
        !isfinite(hp->rope_yarn_beta_slow) || hp->rope_yarn_beta_slow <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: %s.rope.scaling.yarn_beta_fast %g / yarn_beta_slow %g must be positive", a,
                            (double)hp->rope_yarn_beta_fast, (double)hp->rope_yarn_beta_slow);
    if ((st = msrc_gguf_arch_float(g, a, "rope.scaling.yarn_attn_factor", 0, msrc_yarn_mscale(factor),
                                   &hp->rope_attn_factor)) != IE_OK)
        return st;
    if (!isfinite(hp->rope_attn_factor) || hp->rope_attn_factor <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: %s.rope.scaling.yarn_attn_factor %g must be positive", a,
                            (double)hp->rope_attn_factor);
    if ((st = msrc_gguf_arch_float(g, a, "rope.scaling.yarn_ext_factor", 0, 1.0f, &v)) != IE_OK) return st;
    if (v != 1.0f && v != -1.0f) /* llama.cpp: -1 means 1 for yarn */
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: %s.rope.scaling.yarn_ext_factor %g is not supported (1)", a,
                            (double)v);
    if ((st = msrc_gguf_arch_float(g, a, "rope.scaling.yarn_log_multiplier", 0, 0.0f, &v)) != IE_OK) return st;
    if (v != 0.0f)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: %s.rope.scaling.yarn_log_multiplier %g is not supported", a,
                            (double)v);
    hp->rope_yarn_factor = factor;
    hp->rope_yarn_truncate = 1;
    return IE_OK;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_gguf_vocab_tied(const ie_gguf_t *g, const char *a, ie_hparams_t *hp)
{
    ie_status_t st;
    char key[96];

    snprintf(key, sizeof key, "%s.vocab_size", a);
    if ((st = msrc_gguf_vocab(g, key, &hp->n_vocab)) != IE_OK) return st;
    hp->tied_embeddings = ie_gguf_find_tensor(g, "output.weight") == NULL;
    return IE_OK;
}

/* ----------------------------------------------------------- config.json */

/* Contract (model_src_internal.h). */
const cJSON *msrc_hf_rope_field(const cJSON *cfg, const char **field)
{
    const cJSON *ro = msrc_obj_get(cfg, *field = "rope_parameters");
    if (!ro || cJSON_IsNull(ro)) ro = msrc_obj_get(cfg, *field = "rope_scaling");
    return ro && !cJSON_IsNull(ro) ? ro : NULL;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_rope_obj_base(const cJSON *ro, const char *field, double *theta, const char **type)
{
    const cJSON *t;
    double prf;
    ie_status_t st;

    if (!cJSON_IsObject(ro))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be an object", field);
    if ((st = msrc_rope_num(ro, field, "rope_theta", 0, *theta, theta)) != IE_OK) return st;
    if ((st = msrc_rope_num(ro, field, "partial_rotary_factor", 0, 1.0, &prf)) != IE_OK) return st;
    if (prf != 1.0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s.partial_rotary_factor %g is not supported",
                            field, prf);
    t = msrc_obj_get(ro, "rope_type");
    if (!cJSON_IsString(t)) t = msrc_obj_get(ro, "type");
    *type = cJSON_IsString(t) ? t->valuestring : "default";
    return IE_OK;
}

/* transformers' _compute_yarn_parameters on the rope object ro (named
 * field): original_max_position_embeddings is required (a top-level one
 * takes precedence, as transformers 5's standardize_rope_params gives it);
 * factor absent -> max_position_embeddings / original; attention_factor
 * absent -> the mscale ratio or 0.1 ln(factor) + 1; beta_fast / beta_slow
 * absent or 0 -> 32 / 1; truncate absent -> true. */
static ie_status_t hf_rope_yarn(const cJSON *cfg, const cJSON *ro, const char *field, ie_hparams_t *hp)
{
    const cJSON *t = msrc_obj_get(cfg, "original_max_position_embeddings");
    double factor, orig, bf, bs, af, ms, msa;
    ie_status_t st;

    if (t && !cJSON_IsNull(t)) {
        if ((st = msrc_rope_num(cfg, "config", "original_max_position_embeddings", 0, 0.0, &orig)) != IE_OK)
            return st;
    } else {
        t = msrc_obj_get(ro, "original_max_position_embeddings");
        if (!t || cJSON_IsNull(t))
            return ie_error_set(IE_ERR_FORMAT,
                                "model: config.json %s (rope_type yarn) lacks 'original_max_position_embeddings'",
                                field);
        if ((st = msrc_rope_num(ro, field, "original_max_position_embeddings", 0, 0.0, &orig)) != IE_OK) return st;
    }
    if (!(orig >= 1.0 && orig <= HP_MAX) || orig != floor(orig))
        return ie_error_set(IE_ERR_FORMAT,
                            "model: config.json %s.original_max_position_embeddings %g is out of range", field,
                            orig);
    if ((st = msrc_rope_num(ro, field, "factor", 0, hp->n_ctx_train / orig, &factor)) != IE_OK) return st;
    if (!(factor >= 1.0))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.factor %g must be at least 1", field, factor);
    if ((st = msrc_rope_num(ro, field, "beta_fast", 1, 32.0, &bf)) != IE_OK) return st;
    if ((st = msrc_rope_num(ro, field, "beta_slow", 1, 1.0, &bs)) != IE_OK) return st;
    if (!(bf > 0.0) || !(bs > 0.0))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.beta_fast %g / beta_slow %g must be positive",
                            field, bf, bs);
    if ((st = msrc_rope_num(ro, field, "mscale", 1, 0.0, &ms)) != IE_OK) return st;
    if ((st = msrc_rope_num(ro, field, "mscale_all_dim", 1, 0.0, &msa)) != IE_OK) return st;
    af = factor <= 1.0 ? 1.0 : 0.1 * log(factor) + 1.0;
    if (ms != 0.0 && msa != 0.0 && factor > 1.0)
        af = (0.1 * ms * log(factor) + 1.0) / (0.1 * msa * log(factor) + 1.0);
    if ((st = msrc_rope_num(ro, field, "attention_factor", 0, af, &af)) != IE_OK) return st;
    if (!(af > 0.0))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.attention_factor %g must be positive", field, af);
    t = msrc_obj_get(ro, "truncate");
    if (t && !cJSON_IsNull(t) && !cJSON_IsBool(t))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s.truncate' must be true or false", field);
    hp->rope_yarn_truncate = !(t && cJSON_IsFalse(t));
    hp->rope_yarn_factor = (float)factor;
    hp->rope_yarn_orig_ctx = (int)orig;
    hp->rope_yarn_beta_fast = (float)bf;
    hp->rope_yarn_beta_slow = (float)bs;
    hp->rope_attn_factor = (float)af;
    return IE_OK;
}

/* Contract (model_src_internal.h). A rope_scaling object without a type
 * is plain RoPE only when it carries no factor. */
ie_status_t msrc_hf_rope_scaling(const cJSON *cfg, int llama3_ok, ie_hparams_t *hp, const char **type)
{
    const char *field;
    const cJSON *ro = msrc_hf_rope_field(cfg, &field);
    double theta = hp->rope_theta, factor;
    ie_status_t st;

    *type = "default";
    hp->rope_freq_scale = 0.0f;
    hp->rope_yarn_factor = 0.0f;
    hp->rope_attn_factor = 1.0f;
    if (!ro) return IE_OK;
    if ((st = msrc_rope_obj_base(ro, field, &theta, type)) != IE_OK) return st;
    hp->rope_theta = (float)theta;
    if (!cJSON_IsString(msrc_obj_get(ro, "rope_type")) && !cJSON_IsString(msrc_obj_get(ro, "type")) &&
        msrc_obj_get(ro, "factor"))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s has a factor but no 'rope_type'", field);
    if (strcmp(*type, "default") == 0 || (llama3_ok && strcmp(*type, "llama3") == 0)) return IE_OK;
    if (strcmp(*type, "yarn") == 0) return hf_rope_yarn(cfg, ro, field, hp);
    if (strcmp(*type, "linear") != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s type '%.32s' is not supported (default, %s)",
                            field, *type, llama3_ok ? "linear, yarn, llama3" : "linear, yarn");
    if (!msrc_obj_get(ro, "factor"))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s (rope_type linear) lacks 'factor'", field);
    if ((st = msrc_rope_num(ro, field, "factor", 0, 1.0, &factor)) != IE_OK) return st;
    if (!(factor >= 1.0))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.factor %g must be at least 1", field, factor);
    hp->rope_freq_scale = factor == 1.0 ? 0.0f : (float)(1.0 / factor);
    return IE_OK;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_cfg_silu(const cJSON *cfg)
{
    const cJSON *j = msrc_obj_get(cfg, "hidden_act");
    if (cJSON_IsString(j) && strcmp(j->valuestring, "silu") != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: config.json hidden_act '%.32s' is not supported (only silu)", j->valuestring);
    return IE_OK;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_cfg_refuse_true(const cJSON *cfg, const char *field)
{
    ie_status_t st;
    int flag;

    if ((st = msrc_cfg_bool(cfg, field, &flag)) != IE_OK) return st;
    if (flag) return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s = true is not supported", field);
    return IE_OK;
}

/* Contract (model_src_internal.h). */
ie_status_t msrc_hf_layer_types(const cJSON *cfg, ie_hparams_t *hp, int *given)
{
    const cJSON *j = msrc_obj_get(cfg, "layer_types");

    *given = 0;
    if (hp->n_layer > IE_MAX_LAYERS)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: num_hidden_layers (%d) exceeds the supported maximum of %d layers", hp->n_layer,
                            IE_MAX_LAYERS);
    if (!j || cJSON_IsNull(j)) return IE_OK;
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != hp->n_layer)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field 'layer_types' must be an array of %d strings",
                            hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++) {
        const cJSON *e = cJSON_GetArrayItem(j, l);
        if (cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0) hp->layer_swa[l] = 1;
        else if (cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0) hp->layer_swa[l] = 0;
        else
            return ie_error_set(IE_ERR_FORMAT,
                                "model: config.json layer_types[%d] must be \"sliding_attention\" or "
                                "\"full_attention\"",
                                l);
    }
    *given = 1;
    return IE_OK;
}

/* ------------------------------------------------------------ HF experts */

/* Contract (model_src_internal.h). Each expert's matrix is already one
 * ggml slice in HF's row-major layout, so stacking is a copy per expert;
 * the sources' pages are dropped afterwards (the copy is what runs). */
ie_status_t msrc_hf_stack_experts(ie_model_src_t *s, int l, const char *prefix, const char *const proj[3],
                                  const char *fused_prefix)
{
    const ie_hparams_t *hp = &s->hp;
    const int64_t H = hp->n_embd, I = hp->n_ff, E = hp->n_expert;
    static const char *const canon[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const src_tensor_t *gu = NULL, *dn = NULL;
    ie_status_t st;
    char hn[160], cn[64];
    uint8_t *dst[3];

    snprintf(hn, sizeof hn, "model.layers.%d.%s.gate_up_proj", l, fused_prefix);
    if ((st = msrc_hf_raw(s, hn, 0, 3, (const int64_t[3]){E, 2 * I, H}, 0, &gu)) != IE_OK) return st;
    if (gu) {
        snprintf(hn, sizeof hn, "model.layers.%d.%s.down_proj", l, fused_prefix);
        if ((st = msrc_hf_raw(s, hn, 1, 3, (const int64_t[3]){E, H, I}, 0, &dn)) != IE_OK) return st;
        const size_t es = msrc_float_size(gu->t.dtype), ds = msrc_float_size(dn->t.dtype);
        const uint64_t mat = (uint64_t)(H * I);
        for (int p = 0; p < 3; p++) {
            const src_tensor_t *src = p < 2 ? gu : dn;
            snprintf(cn, sizeof cn, "blk.%d.%s.weight", l, canon[p]);
            if ((st = msrc_add_owned(s, cn, src->t.dtype, src->type_name, 3, p < 2 ? H : I, p < 2 ? I : H, E,
                                     mat * (uint64_t)E * (p < 2 ? es : ds), &dst[p])) != IE_OK)
                return st;
        }
        for (int64_t e = 0; e < E; e++) {
            const uint8_t *g = (const uint8_t *)gu->t.data + (size_t)(e * 2 * mat) * es;
            memcpy(dst[0] + (size_t)(e * mat) * es, g, (size_t)mat * es);
            memcpy(dst[1] + (size_t)(e * mat) * es, g + (size_t)mat * es, (size_t)mat * es);
        }
        memcpy(dst[2], dn->t.data, (size_t)(mat * (uint64_t)E) * ds);
        ie_file_release_pages(gu->t.data, (size_t)gu->t.nbytes);
        ie_file_release_pages(dn->t.data, (size_t)dn->t.nbytes);
        return IE_OK;
    }

    for (int p = 0; p < 3; p++) {
        const int64_t shape[2] = {p < 2 ? I : H, p < 2 ? H : I}; /* HF [out][in] */
        const src_tensor_t *first = NULL;
        size_t es = 0;
        for (int64_t e = 0; e < E; e++) {
            const src_tensor_t *t;
            snprintf(hn, sizeof hn, "model.layers.%d.%s.%lld.%s", l, prefix, (long long)e, proj[p]);
            if ((st = msrc_hf_raw(s, hn, 1, 2, shape, 0, &t)) != IE_OK) return st;
            if (!first) {
                first = t;
                es = msrc_float_size(t->t.dtype);
                snprintf(cn, sizeof cn, "blk.%d.%s.weight", l, canon[p]);
                if ((st = msrc_add_owned(s, cn, t->t.dtype, t->type_name, 3, shape[1], shape[0], E,
                                         (uint64_t)(H * I * E) * es, &dst[p])) != IE_OK)
                    return st;
            } else if (t->t.dtype != first->t.dtype) {
                return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' has type %s, expert 0's has %s", hn,
                                    t->type_name, first->type_name);
            }
            memcpy(dst[p] + (size_t)(e * H * I) * es, t->t.data, (size_t)(H * I) * es);
            ie_file_release_pages(t->t.data, (size_t)t->t.nbytes);
        }
    }
    return IE_OK;
}
