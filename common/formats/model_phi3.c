/* model_phi3.c — Phi-3 / Phi-3.5 (Phi3ForCausalLM, llama.cpp's "phi3") as
 * the model source reads it (model_src_internal.h).
 *
 * The checkpoint fuses two projections: q/k/v in one [(q+2kv) x hidden]
 * matrix (HF self_attn.qkv_proj, GGUF blk.N.attn_qkv) and gate/up in one
 * [2 ff x hidden] matrix, gate rows first (HF mlp.gate_up_proj, GGUF
 * blk.N.ffn_up with 2 ff rows; HF chunks it gate-then-up, llama.cpp's
 * fused SwiGLU takes the first half as the gate). Both are presented as the
 * canonical separate tensors attn_q/k/v and ffn_gate/ffn_up, each a view
 * into the mapped fused rows (msrc_split_rows): no copy, and the worker,
 * its tensor plans and the converter see a Llama-shaped layer.
 *
 * RoPE: NEOX (rotate_half) in both formats (llama.cpp's converter does not
 * permute Phi-3's Q/K); partial_rotary_factor (Phi-4-mini) rotates the
 * first rope_dim dims of each head. Long RoPE (Phi-3 128k, Phi-3.5:
 * rope_scaling type "longrope", legacy "su") has two factor sets of
 * rope_dim/2 divisors of the frequencies; they become rope_freqs.weight
 * (short) and rope_freqs_long.weight (long), hp.rope_freqs = 1,
 * hp.rope_yarn_orig_ctx = original_max_position_embeddings and
 * hp.rope_attn_factor = the cos/sin scale. transformers switches to the
 * long set when the current sequence is longer than the original context;
 * the engine's tables are made once per context, so the worker picks the
 * long set when its configured context exceeds the original one (as
 * llama.cpp does with n_ctx_per_seq).
 *
 * Sliding window: transformers applies config.sliding_window to every
 * layer (a token sees itself and the W-1 before it); so do we, for HF and
 * GGUF alike. llama.cpp reads phi3.attention.sliding_window but currently
 * turns Phi SWA off (llama.cpp PR 13676); for prompts shorter than the
 * window (2047 or 262144 in the published configs) the two agree.
 */
#include "model_src_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The fused HF tensors map to the GGUF names of the fused tensors;
 * split_fused turns both into views. */
static const name_pair_t k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate_up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
    /* the views, for error hints: which HF tensor they come from */
    {"self_attn.qkv_proj.weight", "attn_q.weight", 1},
    {"self_attn.qkv_proj.weight", "attn_k.weight", 1},
    {"self_attn.qkv_proj.weight", "attn_v.weight", 1},
    {"mlp.gate_up_proj.weight", "ffn_gate.weight", 1},
};

/* A window applies to every layer (transformers' Phi3Model masks them all). */
static void all_layers_swa(ie_hparams_t *hp)
{
    for (int l = 0; l < hp->n_layer && l < IE_MAX_LAYERS; l++) hp->layer_swa[l] = hp->sliding_window > 0;
}

/* phi3 GGUF: the common keys, the sliding window, long RoPE's keys when the
 * factor tensors are present (their shapes are checked in split_fused). */
static ie_status_t phi3_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    ie_status_t st;
    int has_long = ie_gguf_find_tensor(g, "rope_factors_long.weight") != NULL;
    int has_short = ie_gguf_find_tensor(g, "rope_factors_short.weight") != NULL;
    int64_t swa = 0;

    if ((st = msrc_gguf_hparams_common(g, "phi3", "feed_forward_length", 10000.0f, hp)) != IE_OK) return st;
    if (ie_gguf_find_key(g, "phi3.attention.sliding_window") >= 0 &&
        (st = ie_gguf_get_i64(g, "phi3.attention.sliding_window", &swa)) != IE_OK)
        return st;
    if (swa < 0 || swa > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: phi3.attention.sliding_window = %lld is out of range [0, %d]",
                            (long long)swa, HP_MAX);
    hp->sliding_window = (int)swa; /* 0: none (Phi-4's converter writes 0) */
    all_layers_swa(hp);
    if (has_long != has_short)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' is present but '%s' is missing",
                            has_long ? "rope_factors_long.weight" : "rope_factors_short.weight",
                            has_long ? "rope_factors_short.weight" : "rope_factors_long.weight");
    if (has_long) {
        float dflt;
        hp->rope_freqs = 1;
        if ((st = msrc_gguf_arch_int(g, "phi3", "rope.scaling.original_context_length", 1, 0,
                                     &hp->rope_yarn_orig_ctx)) != IE_OK)
            return st;
        /* the converter always writes it; its formula when a file does not */
        dflt = hp->n_ctx_train > hp->rope_yarn_orig_ctx
                   ? sqrtf(1.0f + logf((float)hp->n_ctx_train / (float)hp->rope_yarn_orig_ctx) /
                                      logf((float)hp->rope_yarn_orig_ctx))
                   : 1.0f;
        if ((st = msrc_gguf_arch_float(g, "phi3", "rope.scaling.attn_factor", 0, dflt, &hp->rope_attn_factor)) !=
            IE_OK)
            return st;
    }
    if ((st = msrc_gguf_vocab_tied(g, "phi3", hp)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;
    return IE_OK;
}

/* The rope object (rope_parameters in transformers 5, rope_scaling in 4)
 * and its type: "default" when absent. */
static ie_status_t hf_rope_obj(const cJSON *cfg, const cJSON **ro, const char **field, const char **type)
{
    static const char *const fields[] = {"rope_parameters", "rope_scaling"};
    *ro = NULL;
    *field = "rope_scaling";
    *type = "default";
    for (size_t i = 0; i < COUNT(fields); i++) {
        const cJSON *j = msrc_obj_get(cfg, fields[i]), *t;
        if (!j || cJSON_IsNull(j)) continue;
        if (!cJSON_IsObject(j))
            return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be an object", fields[i]);
        *ro = j;
        *field = fields[i];
        t = msrc_obj_get(j, "rope_type");
        if (!cJSON_IsString(t)) t = msrc_obj_get(j, "type");
        if (cJSON_IsString(t)) *type = t->valuestring;
        return IE_OK;
    }
    return IE_OK;
}

/* Number of the rope object, else the top-level field, else def. */
static ie_status_t hf_rope_or_top(const cJSON *cfg, const cJSON *ro, const char *field, const char *key, double def,
                                  double *out)
{
    ie_status_t st = msrc_rope_num(cfg, "config", key, 0, def, out);
    if (st == IE_OK && ro) st = msrc_rope_num(ro, field, key, 0, *out, out);
    return st;
}

/* Long RoPE's factor list `key` of the rope object -> a new F32 tensor
 * `name` [n] (every entry a positive number). */
static ie_status_t hf_factors(ie_model_src_t *s, const cJSON *ro, const char *field, const char *key,
                              const char *name, int n)
{
    const cJSON *list = msrc_obj_get(ro, key), *e;
    uint8_t *buf;
    float *f;
    int i = 0;
    ie_status_t st;

    if (!cJSON_IsArray(list))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.%s must be a list of %d numbers", field, key, n);
    if (cJSON_GetArraySize(list) != n)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: config.json %s.%s has %d entries, expected %d (rotated dims / 2)", field, key,
                            cJSON_GetArraySize(list), n);
    if ((st = msrc_add_owned(s, name, IE_DTYPE_F32, "F32", 1, n, 1, 1, (uint64_t)n * sizeof(float), &buf)) != IE_OK)
        return st;
    f = (float *)buf;
    cJSON_ArrayForEach(e, list)
    {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble <= 0)
            return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.%s[%d] must be a positive number", field, key,
                                i);
        f[i++] = (float)e->valuedouble;
    }
    return IE_OK;
}

/* Phi3Config: dims, RoPE (plain or long, partial rotary), sliding window.
 * The long factor lists become tensors in phi3_hf_convert (the table does
 * not exist yet). */
static ie_status_t phi3_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *ro, *j;
    const char *field, *type;
    double prf, theta, orig, factor, attn;

    if ((st = msrc_hf_dims(cfg, 4096, hp)) != IE_OK) return st;
    if ((st = msrc_cfg_float(cfg, "rms_norm_eps", 1e-5f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = msrc_cfg_bool(cfg, "tie_word_embeddings", &hp->tied_embeddings)) != IE_OK) return st;
    if ((st = msrc_cfg_silu(cfg)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;

    if ((st = hf_rope_obj(cfg, &ro, &field, &type)) != IE_OK) return st;
    if ((st = hf_rope_or_top(cfg, ro, field, "rope_theta", 10000.0, &theta)) != IE_OK) return st;
    hp->rope_theta = (float)theta;
    if ((st = hf_rope_or_top(cfg, ro, field, "partial_rotary_factor", 1.0, &prf)) != IE_OK) return st;
    if (!(prf > 0.0 && prf <= 1.0))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json partial_rotary_factor %g must be in (0, 1]", prf);
    hp->rope_dim = (int)(hp->head_dim * prf); /* transformers: int(head_dim * factor) */
    if (hp->rope_dim < 2 || hp->rope_dim % 2 != 0)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: config.json partial_rotary_factor %g gives %d rotated dims of %d (must be "
                            "even and at least 2)",
                            prf, hp->rope_dim, hp->head_dim);

    if (strcmp(type, "longrope") == 0 || strcmp(type, "su") == 0) {
        if ((st = hf_rope_or_top(cfg, ro, field, "original_max_position_embeddings", 0.0, &orig)) != IE_OK)
            return st;
        if (!(orig >= 1 && orig <= HP_MAX) || orig != floor(orig))
            return ie_error_set(IE_ERR_FORMAT,
                                "model: config.json original_max_position_embeddings must be an integer in "
                                "[1, %d] for %s type '%s'",
                                HP_MAX, field, type);
        hp->rope_freqs = 1;
        hp->rope_yarn_orig_ctx = (int)orig;
        /* transformers' _compute_longrope_parameters: factor defaults to
         * the context ratio, the attention factor to sqrt(1 + ln f / ln L) */
        if ((st = msrc_rope_num(ro, field, "factor", 0, (double)hp->n_ctx_train / orig, &factor)) != IE_OK)
            return st;
        if ((st = msrc_rope_num(ro, field, "attention_factor", 0,
                                factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(orig)), &attn)) != IE_OK)
            return st;
        if (!(attn > 0))
            return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.attention_factor %g must be positive", field,
                                attn);
        hp->rope_attn_factor = (float)attn;
    } else if (strcmp(type, "default") != 0) {
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s type '%.32s' is not supported", field, type);
    }

    j = msrc_obj_get(cfg, "sliding_window");
    if (j && !cJSON_IsNull(j)) {
        if ((st = msrc_cfg_int(cfg, "sliding_window", 1, 0, &hp->sliding_window)) != IE_OK) return st;
        all_layers_swa(hp);
    }
    return IE_OK;
}

/* Split layer l's fused tensors into views; the fused tensor must have
 * exactly the rows the parts need (the error names it, and its HF name). */
static ie_status_t split_layer(ie_model_src_t *s, int l)
{
    const ie_hparams_t *hp = &s->hp;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    char fused[64], n0[64], n1[64], n2[64];
    ie_status_t st;

    snprintf(fused, sizeof fused, "blk.%d.attn_qkv.weight", l);
    if (msrc_find(s, fused)) {
        const char *names[3] = {n0, n1, n2};
        const int64_t rows[3] = {q, kv, kv};
        if ((st = msrc_need(s, fused, 2, hp->n_embd, q + 2 * kv)) != IE_OK) return st;
        snprintf(n0, sizeof n0, "blk.%d.attn_q.weight", l);
        snprintf(n1, sizeof n1, "blk.%d.attn_k.weight", l);
        snprintf(n2, sizeof n2, "blk.%d.attn_v.weight", l);
        if ((st = msrc_split_rows(s, fused, 3, names, rows)) != IE_OK) return st;
    }
    /* llama.cpp's phi3 always fuses gate/up into ffn_up; separate
     * ffn_gate + ffn_up (a re-exported file) are taken as they are */
    snprintf(n0, sizeof n0, "blk.%d.ffn_gate.weight", l);
    snprintf(fused, sizeof fused, "blk.%d.ffn_up.weight", l);
    if (!msrc_find(s, n0) && msrc_find(s, fused)) {
        const char *names[2] = {n0, fused};
        const int64_t rows[2] = {hp->n_ff, hp->n_ff};
        if ((st = msrc_need(s, fused, 2, hp->n_embd, 2 * (int64_t)hp->n_ff)) != IE_OK) return st;
        if ((st = msrc_split_rows(s, fused, 2, names, rows)) != IE_OK) return st;
    }
    return IE_OK;
}

/* GGUF rope_factors_{short,long}.weight -> rope_freqs{,_long}.weight
 * (renames: one-part views). HF sources made them in phi3_hf_convert. */
static ie_status_t gguf_rope_factors(ie_model_src_t *s)
{
    ie_status_t st = IE_OK;

    if (!s->hp.rope_freqs || s->kind != IE_SRC_GGUF) return IE_OK;
    for (int i = 0; i < 2 && st == IE_OK; i++) {
        const char *gg = i ? "rope_factors_long.weight" : "rope_factors_short.weight";
        const char *nm = i ? "rope_freqs_long.weight" : "rope_freqs.weight";
        const int64_t one = 1;
        const src_tensor_t *t;
        if ((st = msrc_need(s, gg, 1, s->hp.rope_dim / 2, 0)) != IE_OK) return st;
        t = msrc_find(s, gg);
        if (t->t.dtype != IE_DTYPE_F32)
            return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' has type %s, expected F32", gg, t->type_name);
        st = msrc_split_rows(s, gg, 1, &nm, &one);
    }
    return st;
}

static ie_status_t phi3_split_fused(ie_model_src_t *s)
{
    ie_status_t st = IE_OK;
    for (int l = 0; l < s->hp.n_layer && st == IE_OK; l++) st = split_layer(s, l);
    if (st == IE_OK) st = gguf_rope_factors(s);
    return st == IE_OK ? msrc_sort_tensors(s) : st;
}

/* HF: long RoPE's factor lists from config.json -> rope_freqs.weight
 * (short) and rope_freqs_long.weight, F32 copies. */
static ie_status_t phi3_hf_convert(ie_model_src_t *s)
{
    const cJSON *ro;
    const char *field, *type;
    ie_status_t st;

    if (!s->hp.rope_freqs) return IE_OK;
    if ((st = hf_rope_obj(s->hf_cfg, &ro, &field, &type)) != IE_OK) return st;
    if ((st = hf_factors(s, ro, field, "short_factor", "rope_freqs.weight", s->hp.rope_dim / 2)) != IE_OK)
        return st;
    if ((st = hf_factors(s, ro, field, "long_factor", "rope_freqs_long.weight", s->hp.rope_dim / 2)) != IE_OK)
        return st;
    return msrc_sort_tensors(s);
}

/* A Llama-shaped model (after the split) and the long RoPE factor sets
 * (the common validator checks rope_freqs.weight). */
static ie_status_t phi3_validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    ie_status_t st;
    if (s->hp.rope_freqs && s->hp.rope_yarn_orig_ctx > 0 &&
        (st = msrc_need(s, "rope_freqs_long.weight", 1, s->hp.rope_dim / 2, 0)) != IE_OK)
        return st;
    return msrc_llama_validate(s, lb);
}

const msrc_arch_t msrc_arch_phi3 = {
    .id = IE_ARCH_PHI3,
    .name = "phi3",
    .hf_classes = {"Phi3ForCausalLM"},
    .hf_model_type = "phi3",
    .layer_names = k_layer_names,
    .n_layer_names = COUNT(k_layer_names),
    .gguf_hparams = phi3_gguf_hparams,
    .hf_hparams = phi3_hf_hparams,
    .hf_extra = 2, /* rope_freqs{,_long}.weight */
    .hf_convert = phi3_hf_convert,
    .views_per_layer = 5, /* q, k, v, gate, up */
    .views_extra = 2,     /* the renamed GGUF rope_factors_{short,long} */
    .split_fused = phi3_split_fused,
    .validate = phi3_validate,
};
