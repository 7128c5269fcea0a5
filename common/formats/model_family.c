/* model_family.c — what several architectures' files (model_<arch>.c)
 * share beyond the format side (model_src_internal.h): the per-layer
 * tensor table check, the hyper-parameter checks the validators repeat,
 * and the GGUF keys and config.json fields the Llama-shaped families read
 * alike. Each architecture still lists what it needs; these only do the
 * checking, with the error messages the files had.
 */
#include "model_src_internal.h"

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

/* Contract (model_src_internal.h). */
ie_status_t msrc_gguf_rope_plain(const ie_gguf_t *g, const char *a)
{
    ie_gguf_str_t str;
    char key[96];

    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (ie_gguf_get_str(g, key, &str) == IE_OK && !(str.len == 4 && !memcmp(str.ptr, "none", 4)))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: %s '%.*s' is not supported", key,
                            (int)(str.len < 64 ? str.len : 64), str.ptr);
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
ie_status_t msrc_hf_plain_rope(const cJSON *cfg, ie_hparams_t *hp)
{
    ie_status_t st;

    if ((st = msrc_hf_check_rope(cfg, "rope_scaling", "unknown")) != IE_OK) return st;
    if ((st = msrc_hf_check_rope(cfg, "rope_parameters", "default")) != IE_OK) return st;
    return msrc_cfg_float(msrc_obj_get(cfg, "rope_parameters"), "rope_theta", hp->rope_theta, &hp->rope_theta);
}

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
