/* lora.c — LoRA adapters from PEFT directories and GGUF LoRA files
 * (ie_lora.h): parse, check every tensor against the base, widen to f32.
 *
 * Both readers fill the same table through put_mat, which checks the
 * shapes against the base and copies (f16/bf16 widened, q/k B rows
 * permuted when the adapter's and the base's row orders differ).
 * Functions that own resources leave through one cleanup label.
 */
#include "ie_lora.h"
#include "ie_dtype.h"
#include "ie_kernels.h"
#include "ie_gguf.h"
#include "ie_mmap.h"
#include "ie_safetensors.h"

#include <cjson/cJSON.h>
#include <xxhash.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LORA_MAX_CONFIG (1u << 20)

static const char *const k_mod_names[IE_LORA_NMOD] = {"q", "k", "v", "o", "gate", "up", "down"};
/* PEFT (HF Llama module names) and GGUF names of each module */
static const char *const k_peft_mods[IE_LORA_NMOD] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                      "mlp.down_proj"};
static const char *const k_gguf_mods[IE_LORA_NMOD] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                      "ffn_gate", "ffn_up", "ffn_down"};

const char *ie_lora_mod_name(ie_lora_mod_t m) { return (unsigned)m < IE_LORA_NMOD ? k_mod_names[m] : "?"; }

const ie_lora_mat_t *ie_lora_mat(const ie_lora_t *a, int l, ie_lora_mod_t m)
{
    if (!a || l < 0 || l >= a->n_layer || (unsigned)m >= IE_LORA_NMOD) return NULL;
    return &a->mats[(size_t)l * IE_LORA_NMOD + m];
}

void ie_lora_destroy(ie_lora_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_lora_t *a = *self_p;
    for (int i = 0; a->mats && i < a->n_layer * IE_LORA_NMOD; i++) {
        free(a->mats[i].a);
        free(a->mats[i].bt);
        free(a->mats[i].a16);
        free(a->mats[i].bt16);
        free(a->mats[i].a8);
        free(a->mats[i].bt8);
        free(a->mats[i].sa8);
        free(a->mats[i].sbt8);
    }
    free(a->mats);
    free(a);
    *self_p = NULL;
}

/* The base's shape of module m: n_out x n_in. */
static void mod_shape(const ie_hparams_t *hp, ie_lora_mod_t m, int64_t *n_out, int64_t *n_in)
{
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    switch (m) {
    case IE_LORA_Q: *n_out = qd, *n_in = d; break;
    case IE_LORA_K:
    case IE_LORA_V: *n_out = kvd, *n_in = d; break;
    case IE_LORA_O: *n_out = d, *n_in = qd; break;
    case IE_LORA_DOWN: *n_out = d, *n_in = hp->n_ff; break;
    default: *n_out = hp->n_ff, *n_in = d; break;
    }
}

static ie_status_t lora_new(const ie_hparams_t *hp, const char *format, ie_lora_t **out)
{
    *out = NULL;
    if (hp->n_layer < 1) return ie_error_set(IE_ERR_INVAL, "lora: base model without layers");
    ie_lora_t *a = calloc(1, sizeof *a);
    if (!a || !(a->mats = calloc((size_t)hp->n_layer * IE_LORA_NMOD, sizeof *a->mats))) {
        free(a);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    a->n_layer = hp->n_layer;
    a->format = format;
    *out = a;
    return IE_OK;
}

/* Element i of a 2-D tensor of dtype dt as float. */
static float elem(ie_dtype_t dt, const void *data, size_t i)
{
    if (dt == IE_DTYPE_F32) {
        float f;
        memcpy(&f, (const char *)data + i * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)data + i * 2, 2);
    return dt == IE_DTYPE_F16 ? ie_f16_to_f32((ie_f16_t)h) : ie_bf16_to_f32((ie_bf16_t)h);
}

/* One side of an adapted projection, as the file gives it. */
typedef struct side {
    const char *name; /* for messages */
    ie_dtype_t dtype;
    int64_t rows, cols; /* row-major */
    const void *data;
} side_t;

/* Row r of a q/k projection in the other rope row order: llama.cpp's
 * permute (convert_hf_to_gguf.py) maps HF row (h, s, j) to GGUF row
 * (h, j, s) within each head of hd rows (s < 2, j < hd / 2). to_gguf 1:
 * the HF row that GGUF row r holds; 0: the reverse. */
static int64_t perm_row(int64_t r, int hd, int to_gguf)
{
    const int64_t h = r / hd, i = r % hd, half = hd / 2;
    if (to_gguf) return h * hd + (i % 2) * half + i / 2; /* gguf (j, s) <- hf (s, j) */
    return h * hd + (i % half) * 2 + i / half;           /* hf (s, j) <- gguf (j, s) */
}

/* Check A and B of (layer l, module m) against the base and store them
 * as f32. permute: 0 none, 1 B rows HF -> GGUF order, 2 GGUF -> HF. */
static ie_status_t put_mat(ie_lora_t *ad, const ie_hparams_t *hp, const char *what, int l, ie_lora_mod_t m,
                           const side_t *A, const side_t *B, float alpha, int rslora, int permute)
{
    int64_t n_out, n_in;
    if (l < 0 || l >= hp->n_layer)
        return ie_error_set(IE_ERR_INVAL, "%s: tensor '%s' is for layer %d; the base has %d", what, A->name, l,
                            hp->n_layer);
    if (hp->n_expert > 0 && m >= IE_LORA_GATE)
        return ie_error_set(IE_ERR_UNSUPPORTED, "%s: tensor '%s' adapts the MLP of a mixture-of-experts model",
                            what, A->name);
    mod_shape(hp, m, &n_out, &n_in);
    const int64_t r = A->rows;
    if (r < 1 || r > IE_LORA_MAX_RANK)
        return ie_error_set(IE_ERR_INVAL, "%s: tensor '%s' has rank %lld (1..%d)", what, A->name, (long long)r,
                            IE_LORA_MAX_RANK);
    if (A->cols != n_in)
        return ie_error_set(IE_ERR_INVAL, "%s: tensor '%s' is [%lld x %lld]; the base's %s takes %lld inputs", what,
                            A->name, (long long)A->rows, (long long)A->cols, k_mod_names[m], (long long)n_in);
    if (B->rows != n_out || B->cols != r)
        return ie_error_set(IE_ERR_INVAL,
                            "%s: tensor '%s' is [%lld x %lld]; expected [%lld x %lld] (%s, rank %lld)", what,
                            B->name, (long long)B->rows, (long long)B->cols, (long long)n_out, (long long)r,
                            k_mod_names[m], (long long)r);
    ie_lora_mat_t *mt = &ad->mats[(size_t)l * IE_LORA_NMOD + m];
    if (mt->rank)
        return ie_error_set(IE_ERR_FORMAT, "%s: layer %d %s adapted twice ('%s')", what, l, k_mod_names[m],
                            A->name);
    /* bf16 kept as bf16 (exact, half the bytes); anything else as f32 */
    const int keep16 = A->dtype == IE_DTYPE_BF16 && B->dtype == IE_DTYPE_BF16;
    const size_t es = keep16 ? sizeof(uint16_t) : sizeof(float);
    void *a = malloc((size_t)(r * n_in) * es), *b = malloc((size_t)(r * n_out) * es);
    if (!a || !b) {
        free(a);
        free(b);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < (size_t)(r * n_in); i++) {
        if (keep16) memcpy((uint16_t *)a + i, (const char *)A->data + i * 2, 2);
        else ((float *)a)[i] = elem(A->dtype, A->data, i);
    }
    const int perm = permute && (m == IE_LORA_Q || m == IE_LORA_K) && hp->head_dim % 2 == 0;
    for (int64_t o = 0; o < n_out; o++) {
        const int64_t src = perm ? perm_row(o, hp->head_dim, permute == 1) : o;
        for (int64_t j = 0; j < r; j++) {
            const size_t at = (size_t)(src * r + j), to = (size_t)(j * n_out + o);
            if (keep16) memcpy((uint16_t *)b + to, (const char *)B->data + at * 2, 2);
            else ((float *)b)[to] = elem(B->dtype, B->data, at);
        }
    }
    mt->rank = (int)r;
    mt->n_in = n_in;
    mt->n_out = n_out;
    mt->scale = alpha == 0.0f ? 1.0f : alpha / (rslora ? sqrtf((float)r) : (float)r);
    if (keep16) {
        mt->a16 = a;
        mt->bt16 = b;
    } else {
        mt->a = a;
        mt->bt = b;
    }
    ad->mods |= 1u << m;
    ad->n_mats++;
    if (r > ad->max_rank) ad->max_rank = (int)r;
    ad->bytes += (uint64_t)(r * (n_in + n_out)) * es;
    return IE_OK;
}

/* ------------------------------------------------------------------ PEFT */

/* The config's settings that matter. */
typedef struct peft_cfg {
    int r;
    float alpha;
    int rslora;
} peft_cfg_t;

static int json_true(const cJSON *o, const char *k) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k)); }

/* A config entry that must be absent, null, false or empty. */
static int json_set(const cJSON *o, const char *k)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!j || cJSON_IsNull(j) || cJSON_IsFalse(j)) return 0;
    if ((cJSON_IsArray(j) || cJSON_IsObject(j)) && !j->child) return 0;
    return 1;
}

/* A target_modules entry -> module (-1: not one of ours). */
static int peft_target(const char *s)
{
    static const char *const names[IE_LORA_NMOD] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};
    for (int m = 0; m < IE_LORA_NMOD; m++)
        if (!strcmp(s, names[m])) return m;
    return -1;
}

static ie_status_t peft_config(const char *what, const char *txt, size_t len, peft_cfg_t *c)
{
    ie_status_t st = IE_OK;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    if (!j || !cJSON_IsObject(j)) {
        st = ie_error_set(IE_ERR_FORMAT, "%s: adapter_config.json is not a JSON object", what);
        goto cleanup;
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    if (pt && (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0)) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "%s: peft_type %s is not LORA", what,
                          cJSON_IsString(pt) ? pt->valuestring : "(not a string)");
        goto cleanup;
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r"),
                *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    if (!cJSON_IsNumber(r) || !(r->valuedouble >= 1 && r->valuedouble <= IE_LORA_MAX_RANK) ||
        r->valuedouble != (double)(int)r->valuedouble) {
        st = ie_error_set(IE_ERR_FORMAT, "%s: adapter_config.json: \"r\" must be an integer 1..%d", what,
                          IE_LORA_MAX_RANK);
        goto cleanup;
    }
    c->r = (int)r->valuedouble;
    if (al && (!cJSON_IsNumber(al) || !isfinite(al->valuedouble))) {
        st = ie_error_set(IE_ERR_FORMAT, "%s: adapter_config.json: \"lora_alpha\" is not a number", what);
        goto cleanup;
    }
    c->alpha = al ? (float)al->valuedouble : 8.0f; /* peft's default */
    c->rslora = json_true(j, "use_rslora");
    static const char *const refused[] = {"use_dora",      "modules_to_save", "rank_pattern",
                                          "alpha_pattern", "fan_in_fan_out",  "layer_replication"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (json_set(j, refused[i])) {
            st = ie_error_set(IE_ERR_UNSUPPORTED, "%s: adapter_config.json sets \"%s\" (not supported%s)", what,
                              refused[i], i == 0 ? ": DoRA" : "");
            goto cleanup;
        }
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none"))) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "%s: adapter_config.json: LoRA biases (\"bias\") are not supported",
                          what);
        goto cleanup;
    }
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules"), *e;
    if (cJSON_IsArray(tm)) cJSON_ArrayForEach(e, tm)
        {
            if (!cJSON_IsString(e) || peft_target(e->valuestring) < 0) {
                st = ie_error_set(IE_ERR_UNSUPPORTED,
                                  "%s: target module '%s' is not one of q_proj k_proj v_proj o_proj gate_proj "
                                  "up_proj down_proj",
                                  what, cJSON_IsString(e) ? e->valuestring : "(not a string)");
                goto cleanup;
            }
        }

cleanup:
    cJSON_Delete(j);
    return st;
}

/* "....layers.N.MOD.lora_A.weight" -> layer, module, A (1) or B (0); 0
 * when the name is not of that form. */
static int peft_name(const char *name, int *layer, int *mod, int *is_a)
{
    const char *p = strstr(name, "layers.");
    if (!p) return 0;
    p += 7;
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l > 1000000) return 0;
    p = end + 1;
    for (int m = 0; m < IE_LORA_NMOD; m++) {
        size_t n = strlen(k_peft_mods[m]);
        if (strncmp(p, k_peft_mods[m], n) != 0 || p[n] != '.') continue;
        const char *s = p + n + 1;
        if (!strcmp(s, "lora_A.weight") || !strcmp(s, "lora_A.default.weight")) *is_a = 1;
        else if (!strcmp(s, "lora_B.weight") || !strcmp(s, "lora_B.default.weight")) *is_a = 0;
        else return 0;
        *layer = (int)l;
        *mod = m;
        return 1;
    }
    return 0;
}

static ie_status_t st_side(const char *what, const ie_safetensors_tensor_t *t, side_t *s)
{
    if (t->dtype != IE_DTYPE_F32 && t->dtype != IE_DTYPE_F16 && t->dtype != IE_DTYPE_BF16)
        return ie_error_set(IE_ERR_UNSUPPORTED, "%s: tensor '%s' is %s (F32, F16 or BF16 only)", what, t->name,
                            t->dtype_str);
    if (t->ndim != 2) return ie_error_set(IE_ERR_FORMAT, "%s: tensor '%s' is not 2-D", what, t->name);
    *s = (side_t){t->name, t->dtype, t->shape[0], t->shape[1], t->data};
    return IE_OK;
}

static ie_status_t peft_tensors(const char *what, const ie_safetensors_t *sf, const peft_cfg_t *c,
                                const ie_hparams_t *hp, ie_lora_t *ad)
{
    const int64_t n = ie_safetensors_count(sf);
    const int permute = hp->rope_layout == IE_ROPE_NORMAL && !strcmp(hp->arch, "llama") ? 1 : 0;
    for (int64_t i = 0; i < n; i++) {
        const ie_safetensors_tensor_t *t = ie_safetensors_get(sf, i);
        int l, m, is_a;
        if (!peft_name(t->name, &l, &m, &is_a)) {
            const char *why = strstr(t->name, "lora_magnitude_vector") ? " (DoRA)"
                              : strstr(t->name, "embed") || strstr(t->name, "lm_head")
                                  ? " (embedding and head adapters are not supported)"
                                  : "";
            return ie_error_set(IE_ERR_UNSUPPORTED, "%s: tensor '%s' is not a LoRA A/B of q/k/v/o/gate/up/down%s",
                                what, t->name, why);
        }
        if (!is_a) continue; /* found from its A */
        char bname[512];
        const char *ap = strstr(t->name, "lora_A");
        size_t pre = (size_t)(ap - t->name);
        if (pre + strlen(ap) + 1 > sizeof bname)
            return ie_error_set(IE_ERR_FORMAT, "%s: tensor name too long '%s'", what, t->name);
        memcpy(bname, t->name, pre);
        snprintf(bname + pre, sizeof bname - pre, "lora_B%s", ap + 6);
        const ie_safetensors_tensor_t *tb = ie_safetensors_find(sf, bname);
        if (!tb) return ie_error_set(IE_ERR_FORMAT, "%s: tensor '%s' has no '%s'", what, t->name, bname);
        side_t A, B;
        ie_status_t st;
        if ((st = st_side(what, t, &A)) != IE_OK || (st = st_side(what, tb, &B)) != IE_OK) return st;
        if (A.rows != c->r)
            return ie_error_set(IE_ERR_INVAL, "%s: tensor '%s' has rank %lld; adapter_config.json says r = %d",
                                what, t->name, (long long)A.rows, c->r);
        if ((st = put_mat(ad, hp, what, l, (ie_lora_mod_t)m, &A, &B, c->alpha, c->rslora, permute)) != IE_OK)
            return st;
    }
    /* every B has its A */
    for (int64_t i = 0; i < n; i++) {
        int l, m, is_a;
        const ie_safetensors_tensor_t *t = ie_safetensors_get(sf, i);
        if (peft_name(t->name, &l, &m, &is_a) && !is_a && l < hp->n_layer &&
            !ad->mats[(size_t)l * IE_LORA_NMOD + m].rank)
            return ie_error_set(IE_ERR_FORMAT, "%s: tensor '%s' has no lora_A", what, t->name);
    }
    if (ad->n_mats == 0) return ie_error_set(IE_ERR_FORMAT, "%s: no LoRA tensors", what);
    return IE_OK;
}

/* Contract (ie_lora.h). */
ie_status_t ie_lora_load_peft_memory(const char *cfg, size_t cfg_len, const void *st_buf, size_t st_len,
                                     const ie_hparams_t *hp, ie_lora_t **out)
{
    ie_status_t st;
    ie_safetensors_t *sf = NULL;
    ie_lora_t *ad = NULL;
    peft_cfg_t c;
    *out = NULL;
    if ((st = peft_config("lora", cfg, cfg_len, &c)) != IE_OK) goto cleanup;
    if ((st = ie_safetensors_open_memory(st_buf, st_len, &sf)) != IE_OK) goto cleanup;
    if ((st = lora_new(hp, "peft", &ad)) != IE_OK) goto cleanup;
    st = peft_tensors("lora", sf, &c, hp, ad);

cleanup:
    ie_safetensors_destroy(&sf);
    if (st != IE_OK) ie_lora_destroy(&ad);
    *out = ad;
    return st;
}

static ie_status_t load_peft(const char *dir, const ie_hparams_t *hp, ie_lora_t **out)
{
    ie_status_t st;
    char path[4096], *cfg = NULL;
    size_t cfg_len;
    ie_safetensors_t *sf = NULL;
    ie_lora_t *ad = NULL;
    peft_cfg_t c;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if ((st = ie_file_read("lora", path, LORA_MAX_CONFIG, &cfg, &cfg_len)) != IE_OK) goto cleanup;
    if ((st = peft_config(dir, cfg, cfg_len, &c)) != IE_OK) goto cleanup;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if ((st = ie_safetensors_open(path, &sf)) != IE_OK) {
        char why[512]; /* ie_error_last's buffer is the one ie_error_set writes */
        snprintf(why, sizeof why, "%s", ie_error_last());
        st = ie_error_set(st, "lora: %s", why);
        goto cleanup;
    }
    if ((st = lora_new(hp, "peft", &ad)) != IE_OK) goto cleanup;
    st = peft_tensors(dir, sf, &c, hp, ad);

cleanup:
    free(cfg);
    ie_safetensors_destroy(&sf);
    if (st != IE_OK) ie_lora_destroy(&ad);
    *out = ad;
    return st;
}

/* ------------------------------------------------------------------ GGUF */

static int gguf_str_is(ie_gguf_str_t s, const char *v) { return s.len == strlen(v) && !memcmp(s.ptr, v, s.len); }

/* "blk.N.MOD.weight.lora_a" -> layer, module, A (1) / B (0). */
static int gguf_name(const char *name, int *layer, int *mod, int *is_a)
{
    if (strncmp(name, "blk.", 4) != 0) return 0;
    char *end;
    long l = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || l < 0 || l > 1000000) return 0;
    for (int m = 0; m < IE_LORA_NMOD; m++) {
        size_t n = strlen(k_gguf_mods[m]);
        if (strncmp(end + 1, k_gguf_mods[m], n) != 0) continue;
        const char *s = end + 1 + n;
        if (!strcmp(s, ".weight.lora_a")) *is_a = 1;
        else if (!strcmp(s, ".weight.lora_b")) *is_a = 0;
        else continue;
        *layer = (int)l;
        *mod = m;
        return 1;
    }
    return 0;
}

static ie_status_t gguf_side(const char *what, const ie_gguf_tensor_info_t *t, const char *name, side_t *s)
{
    if (t->dtype != IE_DTYPE_F32 && t->dtype != IE_DTYPE_F16 && t->dtype != IE_DTYPE_BF16)
        return ie_error_set(IE_ERR_UNSUPPORTED, "%s: tensor '%s' is %s (F32, F16 or BF16 only)", what, name,
                            ie_gguf_ggml_type_name(t->ggml_type));
    if (t->n_dims != 2) return ie_error_set(IE_ERR_FORMAT, "%s: tensor '%s' is not 2-D", what, name);
    *s = (side_t){name, t->dtype, t->ne[1], t->ne[0], t->data};
    return IE_OK;
}

static ie_status_t load_gguf(const char *path, const ie_hparams_t *hp, ie_lora_t **out)
{
    ie_status_t st;
    ie_gguf_t *g = NULL;
    ie_lora_t *ad = NULL;
    ie_gguf_str_t s;
    float alpha = 0.0f;
    char an[256], bn[256];
    if ((st = ie_gguf_open(path, &g)) != IE_OK) {
        char why[512]; /* ie_error_last's buffer is the one ie_error_set writes */
        snprintf(why, sizeof why, "%s", ie_error_last());
        st = ie_error_set(st, "lora: %s", why);
        goto cleanup;
    }
    if (ie_gguf_get_str(g, "general.type", &s) != IE_OK || !gguf_str_is(s, "adapter")) {
        st = ie_error_set(IE_ERR_FORMAT, "lora %s: general.type is not \"adapter\" (a model, not a LoRA?)", path);
        goto cleanup;
    }
    if (ie_gguf_get_str(g, "adapter.type", &s) == IE_OK && !gguf_str_is(s, "lora")) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "lora %s: adapter.type is \"%.*s\", not \"lora\"", path, (int)s.len,
                          s.ptr);
        goto cleanup;
    }
    if (ie_gguf_get_str(g, "general.architecture", &s) == IE_OK && !gguf_str_is(s, hp->arch)) {
        st = ie_error_set(IE_ERR_INVAL, "lora %s: adapter for architecture \"%.*s\"; the base is \"%s\"", path,
                          (int)s.len, s.ptr, hp->arch);
        goto cleanup;
    }
    if (ie_gguf_find_key(g, "adapter.lora.alpha") >= 0 &&
        (ie_gguf_get_f32(g, "adapter.lora.alpha", &alpha) != IE_OK || !isfinite(alpha))) {
        st = ie_error_set(IE_ERR_FORMAT, "lora %s: adapter.lora.alpha is not a number", path);
        goto cleanup;
    }
    if ((st = lora_new(hp, "gguf", &ad)) != IE_OK) goto cleanup;
    const int permute = hp->rope_layout == IE_ROPE_NEOX && !strcmp(hp->arch, "llama") ? 2 : 0;
    for (int64_t i = 0; i < ie_gguf_tensor_count(g); i++) {
        const ie_gguf_tensor_info_t *t = ie_gguf_tensor(g, i);
        int l, m, is_a;
        snprintf(an, sizeof an, "%.*s", (int)(t->name.len < 255 ? t->name.len : 255), t->name.ptr);
        if (!gguf_name(an, &l, &m, &is_a)) {
            st = ie_error_set(IE_ERR_UNSUPPORTED, "lora %s: tensor '%s' is not a LoRA A/B of q/k/v/o/gate/up/down",
                              path, an);
            goto cleanup;
        }
        if (!is_a) continue;
        snprintf(bn, sizeof bn, "%.*s_b", (int)strlen(an) - 2, an);
        const ie_gguf_tensor_info_t *tb = ie_gguf_find_tensor(g, bn);
        if (!tb) {
            st = ie_error_set(IE_ERR_FORMAT, "lora %s: tensor '%s' has no '%s'", path, an, bn);
            goto cleanup;
        }
        side_t A, B;
        if ((st = gguf_side(path, t, an, &A)) != IE_OK || (st = gguf_side(path, tb, bn, &B)) != IE_OK) goto cleanup;
        if ((st = put_mat(ad, hp, path, l, (ie_lora_mod_t)m, &A, &B, alpha, 0, permute)) != IE_OK) goto cleanup;
    }
    for (int64_t i = 0; i < ie_gguf_tensor_count(g); i++) {
        const ie_gguf_tensor_info_t *t = ie_gguf_tensor(g, i);
        int l, m, is_a;
        snprintf(an, sizeof an, "%.*s", (int)(t->name.len < 255 ? t->name.len : 255), t->name.ptr);
        if (gguf_name(an, &l, &m, &is_a) && !is_a && l < hp->n_layer &&
            !ad->mats[(size_t)l * IE_LORA_NMOD + m].rank) {
            st = ie_error_set(IE_ERR_FORMAT, "lora %s: tensor '%s' has no lora_a", path, an);
            goto cleanup;
        }
    }
    if (ad->n_mats == 0) st = ie_error_set(IE_ERR_FORMAT, "lora %s: no LoRA tensors", path);

cleanup:
    ie_gguf_destroy(&g);
    if (st != IE_OK) ie_lora_destroy(&ad);
    *out = ad;
    return st;
}

/* Contract (ie_lora.h). */
ie_status_t ie_lora_load(const char *path, const ie_hparams_t *hp, ie_lora_t **out)
{
    struct stat sb;
    uint64_t fp = 0;
    ie_status_t st;
    *out = NULL;
    if (!path || !hp) return ie_error_set(IE_ERR_INVAL, "lora: NULL argument");
    if (stat(path, &sb) != 0) return ie_error_set(IE_ERR_IO, "lora: cannot open '%s'", path);
    st = S_ISDIR(sb.st_mode) ? load_peft(path, hp, out) : load_gguf(path, hp, out);
    if (st == IE_OK && (st = ie_lora_fingerprint(path, &fp)) != IE_OK) ie_lora_destroy(out);
    if (st == IE_OK) (*out)->fingerprint = fp;
    return st;
}

/* Feed the bytes of file `path` to h. */
static ie_status_t hash_file(XXH3_state_t *h, const char *path)
{
    char buf[1 << 16];
    size_t n;
    FILE *f = fopen(path, "rb");
    if (!f) return ie_error_set(IE_ERR_IO, "lora: cannot read '%s'", path);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) XXH3_64bits_update(h, buf, n);
    const int bad = ferror(f);
    fclose(f);
    return bad ? ie_error_set(IE_ERR_IO, "lora: error reading '%s'", path) : IE_OK;
}

/* Contract (ie_lora.h). */
ie_status_t ie_lora_fingerprint(const char *path, uint64_t *out)
{
    struct stat sb;
    char p[4096];
    ie_status_t st = IE_OK;
    *out = 0;
    if (stat(path, &sb) != 0) return ie_error_set(IE_ERR_IO, "lora: cannot open '%s'", path);
    XXH3_state_t *h = XXH3_createState();
    if (!h) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    XXH3_64bits_reset(h);
    if (S_ISDIR(sb.st_mode)) {
        snprintf(p, sizeof p, "%s/adapter_config.json", path);
        if ((st = hash_file(h, p)) == IE_OK) {
            snprintf(p, sizeof p, "%s/adapter_model.safetensors", path);
            st = hash_file(h, p);
        }
    } else {
        st = hash_file(h, path);
    }
    if (st == IE_OK) *out = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return st;
}

/* Weight (j, c) of m's A (bt 0) or B^T (bt 1), in f32, whatever it holds */
static float mat_w(const ie_lora_mat_t *m, int bt, int j, int64_t c)
{
    const int64_t ld = bt ? m->n_out : m->n_in;
    const size_t at = (size_t)j * (size_t)ld + (size_t)c;
    if (bt && m->bt8) return (float)m->bt8[IE_LORA_BT8_AT(j, c, m->n_out)] * m->sbt8[c];
    if (!bt && m->a8) return (float)m->a8[at] * m->sa8[c];
    if (bt ? m->bt16 != NULL : m->a16 != NULL) return ie_bf16_to_f32((bt ? m->bt16 : m->a16)[at]);
    return (bt ? m->bt : m->a)[at];
}

/* The bytes of one matrix in int8: codes of A and of B^T (its rank rows
 * in groups of four, the last padded), then a scale per column of each. */
static uint64_t int8_mat_bytes(const ie_lora_mat_t *p)
{
    return (uint64_t)p->rank * (uint64_t)p->n_in + (uint64_t)((p->rank + 3) & ~3) * (uint64_t)p->n_out +
           (uint64_t)(p->n_in + p->n_out) * 4u;
}

/* Contract (ie_lora.h). */
uint64_t ie_lora_int8_bytes(const ie_lora_t *a)
{
    uint64_t b = 0;
    for (size_t k = 0; a && k < (size_t)a->n_layer * IE_LORA_NMOD; k++)
        if (a->mats[k].rank) b += int8_mat_bytes(&a->mats[k]);
    return b;
}

/* Contract (ie_lora.h). */
ie_status_t ie_lora_quantize_int8(const ie_lora_t *a, ie_lora_t **out)
{
    ie_status_t st = IE_OK;
    ie_lora_t *c = NULL;
    if (!a || !out) return ie_error_set(IE_ERR_INVAL, "lora: quantize: NULL argument");
    *out = NULL;
    if (!(c = calloc(1, sizeof *c)) || !(c->mats = calloc((size_t)a->n_layer * IE_LORA_NMOD, sizeof *c->mats))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    c->n_layer = a->n_layer, c->max_rank = a->max_rank, c->mods = a->mods, c->n_mats = a->n_mats;
    c->format = a->format, c->fingerprint = a->fingerprint;
    for (size_t k = 0; k < (size_t)a->n_layer * IE_LORA_NMOD; k++) {
        const ie_lora_mat_t *p = &a->mats[k];
        ie_lora_mat_t *m = &c->mats[k];
        if (!p->rank) continue;
        *m = (ie_lora_mat_t){.rank = p->rank, .n_in = p->n_in, .n_out = p->n_out, .scale = p->scale};
        for (int bt = 0; bt < 2; bt++) {
            const int64_t n = bt ? p->n_out : p->n_in;
            /* B^T in groups of four rank rows (ie_kernels.h), the last padded with 0 */
            const size_t rows = bt ? (size_t)(p->rank + 3) & ~(size_t)3 : (size_t)p->rank;
            int8_t *q = calloc(rows * (size_t)n, 1);
            float *sc = malloc((size_t)n * sizeof *sc);
            if (bt) m->bt8 = q, m->sbt8 = sc;
            else m->a8 = q, m->sa8 = sc;
            if (!q || !sc) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            for (int64_t col = 0; col < n; col++) {
                float mx = 0.0f;
                for (int j = 0; j < p->rank; j++) mx = fmaxf(mx, fabsf(mat_w(p, bt, j, col)));
                const float s = mx / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
                sc[col] = s;
                for (int j = 0; j < p->rank; j++) {
                    const float v = nearbyintf(mat_w(p, bt, j, col) * inv);
                    q[bt ? IE_LORA_BT8_AT(j, col, n) : (size_t)j * (size_t)n + (size_t)col] =
                        (int8_t)(v != v        ? 0
                                 : v > 127.0f  ? 127
                                 : v < -127.0f ? -127
                                               : v); /* NaN: 0 */
                }
            }
        }
        c->bytes += int8_mat_bytes(p);
    }

cleanup:
    if (st != IE_OK) ie_lora_destroy(&c);
    *out = c;
    return st;
}

/* Contract (ie_lora.h). */
ie_status_t ie_lora_concat(const ie_lora_t *const *parts, const float *scales, int n, ie_lora_t **out)
{
    ie_status_t st = IE_OK;
    ie_lora_t *c = NULL;
    *out = NULL;
    if (!parts || !scales || n < 1 || n > 8)
        return ie_error_set(IE_ERR_INVAL, "lora: concat of %d adapters (1..8)", n);
    for (int i = 0; i < n; i++) {
        if (!parts[i]) return ie_error_set(IE_ERR_INVAL, "lora: concat: NULL adapter %d", i);
        if (parts[i]->n_layer != parts[0]->n_layer)
            return ie_error_set(IE_ERR_INVAL, "lora: concat: adapters of %d and %d layers", parts[0]->n_layer,
                                parts[i]->n_layer);
        if (!isfinite(scales[i])) return ie_error_set(IE_ERR_INVAL, "lora: concat: scale %d is not finite", i);
    }
    if (!(c = calloc(1, sizeof *c)) ||
        !(c->mats = calloc((size_t)parts[0]->n_layer * IE_LORA_NMOD, sizeof *c->mats))) {
        free(c);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    c->n_layer = parts[0]->n_layer;
    c->format = "concat";
    for (size_t k = 0; k < (size_t)c->n_layer * IE_LORA_NMOD; k++) {
        ie_lora_mat_t *m = &c->mats[k];
        int r = 0;
        for (int i = 0; i < n; i++) {
            const ie_lora_mat_t *p = &parts[i]->mats[k];
            if (!p->rank) continue;
            if (r && (p->n_in != m->n_in || p->n_out != m->n_out)) {
                st = ie_error_set(IE_ERR_INVAL, "lora: concat: layer %d %s shapes differ", (int)(k / IE_LORA_NMOD),
                                  k_mod_names[k % IE_LORA_NMOD]);
                goto cleanup;
            }
            m->n_in = p->n_in, m->n_out = p->n_out;
            r += p->rank;
        }
        if (!r) continue;
        if (r > IE_LORA_MAX_RANK) {
            st = ie_error_set(IE_ERR_RANGE, "lora: concat: layer %d %s would have rank %d (at most %d)",
                              (int)(k / IE_LORA_NMOD), k_mod_names[k % IE_LORA_NMOD], r, IE_LORA_MAX_RANK);
            goto cleanup;
        }
        if (!(m->a = malloc((size_t)r * (size_t)m->n_in * sizeof(float))) ||
            !(m->bt = malloc((size_t)r * (size_t)m->n_out * sizeof(float)))) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        m->rank = r;
        m->scale = 1.0f;
        int j0 = 0;
        for (int i = 0; i < n; i++) {
            const ie_lora_mat_t *p = &parts[i]->mats[k];
            const float s = scales[i] * p->scale;
            for (int j = 0; j < p->rank; j++, j0++) {
                float *ar = m->a + (size_t)j0 * (size_t)m->n_in, *br = m->bt + (size_t)j0 * (size_t)m->n_out;
                for (int64_t x = 0; x < m->n_in; x++) ar[x] = s * mat_w(p, 0, j, x);
                for (int64_t o = 0; o < m->n_out; o++) br[o] = mat_w(p, 1, j, o);
            }
        }
        c->mods |= 1u << (k % IE_LORA_NMOD);
        c->n_mats++;
        if (r > c->max_rank) c->max_rank = r;
        c->bytes += (uint64_t)r * (uint64_t)(m->n_in + m->n_out) * sizeof(float);
    }
    if (!c->n_mats) st = ie_error_set(IE_ERR_INVAL, "lora: concat of adapters that adapt nothing");

cleanup:
    if (st != IE_OK) ie_lora_destroy(&c);
    *out = c;
    return st;
}
