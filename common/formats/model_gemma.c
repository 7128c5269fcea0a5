/* model_gemma.c — Gemma 2 and Gemma 3 (text) as the model source reads them:
 * llama.cpp's "gemma2" / "gemma3" GGUF keys and names, Gemma2ForCausalLM /
 * Gemma3ForCausalLM directories (model_src_internal.h).
 *
 * What sets them apart from Llama, as hyper-parameter switches the worker
 * implements: GeGLU MLP (ffn_gelu), a norm after each block as well as
 * before (post_norms: attn_norm -> attention -> post_attention_norm,
 * ffn_norm -> MLP -> post_ffw_norm), embeddings times sqrt(hidden)
 * (embd_scale), scores scaled by query_pre_attn_scalar^-1/2 (attn_scale),
 * tanh soft-capping of the scores and of the final logits (Gemma 2),
 * alternating sliding-window / global layers, a tied head; Gemma 3 adds
 * per-head q/k norms and a second RoPE base for its sliding layers, with
 * linear scaling on the global ones.
 *
 * Gemma's RMSNorm multiplies by (1 + w). llama.cpp's converter stores
 * w + 1 for every tensor whose name ends in "norm.weight" (Gemma 3's q/k
 * norms included), so the worker computes x * w for both formats: HF
 * directories get converted float32 copies of their norms, + 1, at load
 * (gemma_hf_convert).
 */
#include "model_src_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const name_pair_t k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"self_attn.q_proj.weight", "attn_q.weight", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 0},
    {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", 0},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", 0},
    {"post_attention_layernorm.weight", "post_attention_norm.weight", 0},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight", 0},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
    {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
};

/* The switches every Gemma turns on, whatever the file. */
static void gemma_common(ie_hparams_t *hp)
{
    hp->rope_layout = IE_ROPE_NEOX; /* llama.cpp does not permute Gemma's Q/K */
    hp->post_norms = 1;
    hp->ffn_gelu = 1;
    hp->qk_norm = hp->arch_id == IE_ARCH_GEMMA3;
}

/* query_pre_attn_scalar -> attn_scale; 0 (the default 1/sqrt(head_dim))
 * when they agree, so an HF directory and its GGUF share a fingerprint. */
static void set_attn_scale(ie_hparams_t *hp, double qpas)
{
    hp->attn_scale = qpas == (double)hp->head_dim ? 0.0f : (float)(1.0 / sqrt(qpas));
}

/* ---------------------------------------------------------------- GGUF */

/* gemma2 / gemma3 GGUF (convert_hf_to_gguf Gemma2Model / Gemma3Model and
 * llama.cpp's loader): the common keys; soft-caps (Gemma 2's default to
 * llama.cpp's 50 / 30 when absent); the sliding layers (gguf_swa: Gemma 2
 * even layers, Gemma 3 five of every six); Gemma 3's sliding layers use base 10000 (or rope.freq_base_swa
 * where a newer converter writes it) unscaled, its global ones
 * rope.freq_base with the linear rope.scaling.factor. The file has no
 * query_pre_attn_scalar: llama.cpp uses n_embd / n_head for the 27B models
 * (46 / 62 layers) and head_dim otherwise; so do we. */
/* Which layers slide, as llama.cpp decides: no window (key absent for
 * Gemma 3, or 0) -> none; <arch>.attention.sliding_window_pattern as a
 * per-layer bool array (true: sliding) or a period p where the file has
 * one, else the architecture's period; with a period, layer l slides when
 * l % p < p - 1 (set_swa_pattern). Gemma 2's window defaults to 4096. */
static ie_status_t gguf_swa(const ie_gguf_t *g, ie_hparams_t *hp, const char *a, int period)
{
    const int g3 = hp->arch_id == IE_ARCH_GEMMA3;
    char key[96];
    int64_t v = g3 ? 0 : 4096;
    ie_gguf_type_t et;
    uint64_t len;
    ie_status_t st;

    snprintf(key, sizeof key, "%s.attention.sliding_window", a);
    if (ie_gguf_find_key(g, key) >= 0 && ie_gguf_get_i64(g, key, &v) != IE_OK) return IE_ERR_FORMAT;
    if (v == 0) return IE_OK; /* no sliding layers */
    if ((st = msrc_check_range(key, v, &hp->sliding_window)) != IE_OK) return st;
    if (hp->n_layer > IE_MAX_LAYERS) return IE_OK; /* validation names it */
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    if (ie_gguf_find_key(g, key) >= 0) {
        if (ie_gguf_get_arr(g, key, &et, &len) == IE_OK) {
            const uint8_t *b = ie_gguf_arr_data(g, key);
            if (et != IE_GGUF_BOOL || len != (uint64_t)hp->n_layer || !b)
                return ie_error_set(IE_ERR_FORMAT, "model: %s must be an array of %d bools or an integer", key,
                                    hp->n_layer);
            for (int l = 0; l < hp->n_layer; l++) hp->layer_swa[l] = b[l] != 0;
            return IE_OK;
        }
        if ((st = msrc_gguf_int(g, key, 1, 0, &period)) != IE_OK) return st;
    }
    for (int l = 0; l < hp->n_layer; l++) hp->layer_swa[l] = (uint8_t)(l % period < period - 1);
    return IE_OK;
}

static ie_status_t gemma_gguf_hparams_arch(const ie_gguf_t *g, ie_hparams_t *hp, const char *a)
{
    const int g3 = hp->arch_id == IE_ARCH_GEMMA3;
    ie_status_t st;
    ie_gguf_str_t str;
    char key[96];

    if ((st = msrc_gguf_hparams_common(g, a, "feed_forward_length", g3 ? 1000000.0f : 10000.0f, hp)) != IE_OK)
        return st;
    if ((st = msrc_gguf_arch_float(g, a, "attn_logit_softcapping", 0, g3 ? 0.0f : 50.0f, &hp->attn_softcap)) !=
        IE_OK)
        return st;
    if ((st = msrc_gguf_arch_float(g, a, "final_logit_softcapping", 0, g3 ? 0.0f : 30.0f, &hp->final_softcap)) !=
        IE_OK)
        return st;
    if (!isfinite(hp->attn_softcap) || hp->attn_softcap < 0.0f || !isfinite(hp->final_softcap) ||
        hp->final_softcap < 0.0f)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: %s.attn_logit_softcapping / final_logit_softcapping must be >= 0", a);
    if ((st = gguf_swa(g, hp, a, g3 ? 6 : 2)) != IE_OK) return st;
    if (g3 && (st = msrc_gguf_arch_float(g, a, "rope.freq_base_swa", 0, 10000.0f, &hp->rope_theta_swa)) != IE_OK)
        return st;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (ie_gguf_find_key(g, key) >= 0) {
        if ((st = ie_gguf_get_str(g, key, &str)) != IE_OK) return st;
        if (str.len == 6 && memcmp(str.ptr, "linear", 6) == 0) {
            float factor;
            if ((st = msrc_gguf_arch_float(g, a, "rope.scaling.factor", 1, 0.0f, &factor)) != IE_OK) return st;
            if (!isfinite(factor) || factor < 1.0f)
                return ie_error_set(IE_ERR_FORMAT, "model: %s.rope.scaling.factor %g must be at least 1", a,
                                    (double)factor);
            hp->rope_freq_scale = factor == 1.0f ? 0.0f : 1.0f / factor;
        } else if (!(str.len == 4 && memcmp(str.ptr, "none", 4) == 0)) {
            return ie_error_set(IE_ERR_UNSUPPORTED, "model: %s '%.*s' is not supported (none, linear)", key,
                                (int)(str.len < 64 ? str.len : 64), str.ptr);
        }
    }
    if (ie_gguf_find_tensor(g, "rope_freqs.weight"))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: tensor 'rope_freqs.weight' is not supported for %s", a);
    if ((st = msrc_gguf_vocab_tied(g, a, hp)) != IE_OK) return st;
    hp->embd_scale = sqrtf((float)hp->n_embd); /* llama.cpp scales in float32 */
    gemma_common(hp);
    set_attn_scale(hp, hp->n_layer == (g3 ? 62 : 46) ? (double)(hp->n_embd / hp->n_head) : (double)hp->head_dim);
    return IE_OK;
}

static ie_status_t gemma2_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    return gemma_gguf_hparams_arch(g, hp, "gemma2");
}

static ie_status_t gemma3_gguf_hparams(const ie_gguf_t *g, ie_hparams_t *hp)
{
    return gemma_gguf_hparams_arch(g, hp, "gemma3");
}

/* ---------------------------------------------------------------- HF */

/* A rope object's type ("default" when untyped), or NULL if not a string. */
static const char *rope_type(const cJSON *ro)
{
    const cJSON *t = msrc_obj_get(ro, "rope_type");
    if (!cJSON_IsString(t)) t = msrc_obj_get(ro, "type");
    if (!t || cJSON_IsNull(t)) return "default";
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* One layer kind's RoPE object (transformers 5 rope_parameters.<kind>, or
 * 4.x rope_scaling for the global layers): its base into *theta (absent:
 * keep) and, where linear is allowed, 1/factor into *scale. */
static ie_status_t hf_rope_obj(const cJSON *ro, const char *field, int linear_ok, float *theta, float *scale)
{
    const char *type;
    double v, prf;
    ie_status_t st;

    if (!ro || cJSON_IsNull(ro)) return IE_OK;
    if (!cJSON_IsObject(ro))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be an object", field);
    if (!(type = rope_type(ro)))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s.rope_type' must be a string", field);
    if ((st = msrc_rope_num(ro, field, "rope_theta", 0, *theta, &v)) != IE_OK) return st;
    *theta = (float)v;
    if ((st = msrc_rope_num(ro, field, "partial_rotary_factor", 0, 1.0, &prf)) != IE_OK) return st;
    if (prf != 1.0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s.partial_rotary_factor %g is not supported",
                            field, prf);
    if (strcmp(type, "default") == 0) return IE_OK;
    if (!linear_ok || strcmp(type, "linear") != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s type '%.32s' is not supported (%s)", field,
                            type, linear_ok ? "default, linear" : "default");
    if ((st = msrc_rope_num(ro, field, "factor", 0, 1.0, &v)) != IE_OK) return st;
    if (!(v >= 1.0))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json %s.factor %g must be at least 1", field, v);
    *scale = v == 1.0 ? 0.0f : (float)(1.0 / v);
    return IE_OK;
}

/* Gemma 3's two RoPEs: transformers 5 writes rope_parameters
 * {sliding_attention: {...}, full_attention: {...}}; 4.x configs have
 * rope_theta (global), rope_local_base_freq (sliding) and rope_scaling
 * (global). Gemma 2 has one (rope_parameters or rope_theta). */
static ie_status_t hf_rope_gemma(ie_hparams_t *hp, const cJSON *cfg, int g3)
{
    const cJSON *rp = msrc_obj_get(cfg, "rope_parameters");
    ie_status_t st;
    float unused = 0.0f;

    if ((st = msrc_cfg_float(cfg, "rope_theta", g3 ? 1000000.0f : 10000.0f, &hp->rope_theta)) != IE_OK) return st;
    if (!g3) {
        if ((st = hf_rope_obj(msrc_obj_get(cfg, "rope_scaling"), "rope_scaling", 0, &hp->rope_theta, &unused)) !=
            IE_OK)
            return st;
        return hf_rope_obj(rp, "rope_parameters", 0, &hp->rope_theta, &unused);
    }
    if ((st = msrc_cfg_float(cfg, "rope_local_base_freq", 10000.0f, &hp->rope_theta_swa)) != IE_OK) return st;
    if ((st = hf_rope_obj(msrc_obj_get(cfg, "rope_scaling"), "rope_scaling", 1, &hp->rope_theta,
                          &hp->rope_freq_scale)) != IE_OK)
        return st;
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            return ie_error_set(IE_ERR_FORMAT, "model: config.json field 'rope_parameters' must be an object");
        if (!msrc_obj_get(rp, "full_attention") && !msrc_obj_get(rp, "sliding_attention"))
            return hf_rope_obj(rp, "rope_parameters", 1, &hp->rope_theta, &hp->rope_freq_scale);
        if ((st = hf_rope_obj(msrc_obj_get(rp, "full_attention"), "rope_parameters.full_attention", 1,
                              &hp->rope_theta, &hp->rope_freq_scale)) != IE_OK)
            return st;
        if ((st = hf_rope_obj(msrc_obj_get(rp, "sliding_attention"), "rope_parameters.sliding_attention", 0,
                              &hp->rope_theta_swa, &unused)) != IE_OK)
            return st;
    }
    if (!isfinite(hp->rope_theta_swa) || hp->rope_theta_swa <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json sliding layers' rope_theta %g must be positive",
                            (double)hp->rope_theta_swa);
    return IE_OK;
}

/* Which layers slide: layer_types if given, else the config class's
 * default (Gemma 2: even layers; Gemma 3: sliding_window_pattern, 6: five
 * sliding then one global). */
static ie_status_t hf_layer_types(ie_hparams_t *hp, const cJSON *cfg, int g3)
{
    ie_status_t st;
    int pattern = 2, given;

    if ((st = msrc_hf_layer_types(cfg, hp, &given)) != IE_OK || given) return st;
    if (g3 && (st = msrc_cfg_int(cfg, "sliding_window_pattern", 0, 6, &pattern)) != IE_OK) return st;
    for (int l = 0; l < hp->n_layer; l++) hp->layer_swa[l] = (uint8_t)((l + 1) % pattern != 0);
    return IE_OK;
}

/* sqrt(hidden) as transformers computes the normalizer: a tensor of the
 * model's dtype (config "dtype" / "torch_dtype"), so a bfloat16 model's is
 * sqrt rounded to bfloat16 (3584: 59.866 -> 60.0) and a float16 one's to
 * float16. float32 (and absent) keeps it. */
static ie_status_t hf_embd_scale(ie_hparams_t *hp, const cJSON *cfg)
{
    const cJSON *dt = msrc_obj_get(cfg, "dtype");
    const float s = sqrtf((float)hp->n_embd);
    if (!dt || cJSON_IsNull(dt)) dt = msrc_obj_get(cfg, "torch_dtype");
    hp->embd_scale = s;
    if (!dt || cJSON_IsNull(dt)) return IE_OK;
    if (!cJSON_IsString(dt))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field 'dtype' must be a string");
    if (strcmp(dt->valuestring, "bfloat16") == 0) hp->embd_scale = ie_bf16_to_f32(ie_f32_to_bf16(s));
    else if (strcmp(dt->valuestring, "float16") == 0) hp->embd_scale = ie_f16_to_f32(ie_f32_to_f16(s));
    return IE_OK;
}

/* Gemma2Config / Gemma3TextConfig; defaults are the config classes'. */
static ie_status_t gemma_hf_hparams(ie_model_src_t *s, const cJSON *cfg)
{
    ie_hparams_t *hp = &s->hp;
    const int g3 = hp->arch_id == IE_ARCH_GEMMA3;
    const cJSON *j;
    ie_status_t st;
    float qpas;

    j = msrc_obj_get(cfg, "architectures");
    if (cJSON_IsArray(j))
        for (const cJSON *e = j->child; e; e = e->next)
            if (cJSON_IsString(e) && strcmp(e->valuestring, "Gemma3ForConditionalGeneration") == 0)
                return ie_error_set(IE_ERR_UNSUPPORTED,
                                    "model: config.json architectures 'Gemma3ForConditionalGeneration' (Gemma 3 "
                                    "with vision) is not supported: its text model sits under text_config and "
                                    "language_model.*; use a Gemma3ForCausalLM checkpoint or its GGUF");
    if ((st = msrc_hf_dims(cfg, g3 ? 131072 : 8192, hp)) != IE_OK) return st;
    j = msrc_obj_get(cfg, "head_dim");
    if (!j || cJSON_IsNull(j)) hp->rope_dim = hp->head_dim = 256; /* the config classes' default */
    if ((st = msrc_cfg_float(cfg, "rms_norm_eps", 1e-6f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = hf_rope_gemma(hp, cfg, g3)) != IE_OK) return st;
    j = msrc_obj_get(cfg, "hidden_activation");
    if (!j || cJSON_IsNull(j)) j = msrc_obj_get(cfg, "hidden_act");
    if (j && !cJSON_IsNull(j) && !(cJSON_IsString(j) && strcmp(j->valuestring, "gelu_pytorch_tanh") == 0))
        return ie_error_set(
            IE_ERR_UNSUPPORTED,
            "model: config.json hidden_activation '%.32s' is not supported (only gelu_pytorch_tanh)",
            cJSON_IsString(j) ? j->valuestring : "?");
    if ((st = msrc_cfg_float(cfg, "query_pre_attn_scalar", 256.0f, &qpas)) != IE_OK) return st;
    if (!isfinite(qpas) || qpas <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json query_pre_attn_scalar %g must be positive",
                            (double)qpas);
    set_attn_scale(hp, qpas);
    if ((st = msrc_cfg_float(cfg, "attn_logit_softcapping", g3 ? 0.0f : 50.0f, &hp->attn_softcap)) != IE_OK)
        return st;
    if ((st = msrc_cfg_float(cfg, "final_logit_softcapping", g3 ? 0.0f : 30.0f, &hp->final_softcap)) != IE_OK)
        return st;
    if (msrc_obj_get(cfg, "attn_logit_softcapping") && cJSON_IsNull(msrc_obj_get(cfg, "attn_logit_softcapping")))
        hp->attn_softcap = 0.0f; /* explicit null: off */
    if (msrc_obj_get(cfg, "final_logit_softcapping") && cJSON_IsNull(msrc_obj_get(cfg, "final_logit_softcapping")))
        hp->final_softcap = 0.0f;
    if (!isfinite(hp->attn_softcap) || hp->attn_softcap < 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json attn_logit_softcapping %g must be positive",
                            (double)hp->attn_softcap);
    if (!isfinite(hp->final_softcap) || hp->final_softcap < 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json final_logit_softcapping %g must be positive",
                            (double)hp->final_softcap);
    j = msrc_obj_get(cfg, "sliding_window");
    if (cJSON_IsNull(j)) hp->sliding_window = 0; /* explicit null: no window */
    else if ((st = msrc_cfg_int(cfg, "sliding_window", 0, 4096, &hp->sliding_window)) != IE_OK) return st;
    if ((st = hf_layer_types(hp, cfg, g3)) != IE_OK) return st;
    if (hp->sliding_window == 0) memset(hp->layer_swa, 0, sizeof hp->layer_swa);
    j = msrc_obj_get(cfg, "tie_word_embeddings");
    if (!j || cJSON_IsNull(j)) hp->tied_embeddings = 1; /* Gemma's default */
    else if ((st = msrc_cfg_bool(cfg, "tie_word_embeddings", &hp->tied_embeddings)) != IE_OK) return st;
    if ((st = msrc_cfg_refuse_true(cfg, "attention_bias")) != IE_OK) return st;
    if ((st = msrc_cfg_refuse_true(cfg, "use_bidirectional_attention")) != IE_OK) return st;
    if ((st = hf_embd_scale(hp, cfg)) != IE_OK) return st;
    gemma_common(hp);
    return IE_OK;
}

/* Every mapped norm ("...norm.weight": the layers' four, Gemma 3's q/k
 * norms, output_norm) becomes a float32 copy of w + 1 in place (the same
 * name, so the table stays sorted): what llama.cpp's converter stores. A
 * norm of another dtype is left for validation to name. */
static ie_status_t gemma_hf_convert(ie_model_src_t *s)
{
    static const char suffix[] = "norm.weight";
    for (int64_t i = 0; i < s->n_tensors; i++) {
        src_tensor_t *t = &s->tensors[i];
        const size_t len = strlen(t->name), es = msrc_float_size(t->t.dtype);
        int64_t n = 1;
        float *f;

        if (len < sizeof suffix - 1 || strcmp(t->name + len - (sizeof suffix - 1), suffix) != 0) continue;
        if (strncmp(t->name, "blk.", 4) != 0 && strcmp(t->name, "output_norm.weight") != 0) continue;
        if (es == 0 || t->owned) continue;
        for (int d = 0; d < t->t.n_dims; d++) n *= t->t.ne[d];
        if ((uint64_t)n * es != t->t.nbytes)
            return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' holds %llu bytes for %lld elements", t->name,
                                (unsigned long long)t->t.nbytes, (long long)n);
        if (!(f = malloc((size_t)(n ? n : 1) * sizeof(float))))
            return ie_error_set(IE_ERR_NOMEM, "model: out of memory converting '%s'", t->name);
        for (int64_t k = 0; k < n; k++) {
            float v;
            if (t->t.dtype == IE_DTYPE_F32) memcpy(&v, (const uint8_t *)t->t.data + k * 4, 4);
            else {
                uint16_t h;
                memcpy(&h, (const uint8_t *)t->t.data + k * 2, 2);
                v = t->t.dtype == IE_DTYPE_F16 ? ie_f16_to_f32(h) : ie_bf16_to_f32(h);
            }
            f[k] = v + 1.0f; /* Gemma RMSNorm: x * (1 + w), in float32 */
        }
        t->owned = f;
        t->t.data = f;
        t->t.dtype = IE_DTYPE_F32;
        t->t.nbytes = (uint64_t)n * sizeof(float);
        t->type_name = "F32";
    }
    return IE_OK;
}

/* The Gemma tensors: embedding, final norm, head unless tied, per layer
 * the sandwich norms, q/k/v/o (Gemma 3: q/k norms) and the GeGLU MLP. */
static ie_status_t gemma_validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;
    const int64_t H = hp->n_embd, F = hp->n_ff, hd = hp->head_dim;
    const int64_t q_dim = (int64_t)hp->n_head * hd, kv_dim = (int64_t)hp->n_head_kv * hd;
    const msrc_req_t req[] = {
        {"attn_norm.weight", 1, 0, {H}},
        {"attn_q.weight", 2, 0, {H, q_dim}},
        {"attn_k.weight", 2, 0, {H, kv_dim}},
        {"attn_v.weight", 2, 0, {H, kv_dim}},
        {"attn_output.weight", 2, 0, {q_dim, H}},
        {"post_attention_norm.weight", 1, 0, {H}},
        {"ffn_norm.weight", 1, 0, {H}},
        {"ffn_gate.weight", 2, 0, {H, F}},
        {"ffn_up.weight", 2, 0, {H, F}},
        {"ffn_down.weight", 2, 0, {F, H}},
        {"post_ffw_norm.weight", 1, 0, {H}},
        {"attn_q_norm.weight", 1, !hp->qk_norm, {hd}}, /* Gemma 3 */
        {"attn_k_norm.weight", 1, !hp->qk_norm, {hd}},
    };
    ie_status_t st;

    if ((st = msrc_check_swa(hp, lb)) != IE_OK) return st;
    if ((st = msrc_check_full_rotary(hp, lb)) != IE_OK) return st;
    if ((st = msrc_need_embd(s, !hp->tied_embeddings)) != IE_OK) return st;
    return msrc_need_layers(s, req, COUNT(req));
}

const msrc_arch_t msrc_arch_gemma2 = {
    .id = IE_ARCH_GEMMA2,
    .name = "gemma2",
    .hf_classes = {"Gemma2ForCausalLM"},
    .hf_model_type = "gemma2",
    .layer_names = k_layer_names,
    .n_layer_names = COUNT(k_layer_names),
    .gguf_hparams = gemma2_gguf_hparams,
    .hf_hparams = gemma_hf_hparams,
    .hf_convert = gemma_hf_convert,
    .validate = gemma_validate,
};

const msrc_arch_t msrc_arch_gemma3 = {
    .id = IE_ARCH_GEMMA3,
    .name = "gemma3",
    .hf_classes = {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"},
    .hf_model_type = "gemma3_text",
    .layer_names = k_layer_names,
    .n_layer_names = COUNT(k_layer_names),
    .gguf_hparams = gemma3_gguf_hparams,
    .hf_hparams = gemma_hf_hparams,
    .hf_convert = gemma_hf_convert,
    .validate = gemma_validate,
};
