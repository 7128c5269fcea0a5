/* model_src.c — one view over GGUF files and Hugging Face directories.
 *
 * Both loaders fill the same ie_hparams_t and a table of tensors under
 * canonical GGUF names, then share one validator: hyper-parameters in range
 * and consistent, every tensor the llama architecture needs present with the
 * exact expected shape and a dtype we compute with. Tensor data stays in the
 * GGUF / safetensors mappings; only names are copied.
 *
 * Functions that own resources leave through one cleanup label; pure checks
 * return at their first failure, which reads more directly than a goto there.
 */
#include "ie_model_src.h"

#include "ie_gguf.h"
#include "ie_safetensors.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HP_MAX (1 << 20)           /* bound on every integer hyper-parameter */
#define JSON_MAX_BYTES (64u << 20) /* config.json / index json size limit    */
#define PATH_CAP 4096

typedef struct src_tensor {
    ie_tensor_t t;         /* must stay first: the public view            */
    char *name;            /* owned; t.name points here                   */
    const char *type_name; /* the file's name for the dtype, for errors   */
} src_tensor_t;

struct ie_model_src {
    ie_src_kind_t kind;
    ie_hparams_t hp;
    ie_gguf_t *gguf;
    ie_safetensors_t **shards;
    int n_shards;
    src_tensor_t *tensors; /* sorted by name */
    int64_t n_tensors;
    char *tokenizer_path;
};

/* Field names as each format spells them, for error messages. */
typedef struct hp_labels {
    const char *n_head, *n_head_kv, *head_dim, *rope_dim;
} hp_labels_t;

/* ---------------------------------------------------------------- names */

typedef struct name_pair {
    const char *hf, *canon;
} name_pair_t;

static const name_pair_t k_global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

static const name_pair_t k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Translate a tensor name HF -> canonical (to_hf = 0) or back (to_hf = 1).
 * Returns 1 and writes `out` if the name is one the llama mapping knows. */
static int translate_name(const char *name, int to_hf, char *out, size_t cap)
{
    const char *from_pre = to_hf ? "blk." : "model.layers.";
    const char *to_pre = to_hf ? "model.layers." : "blk.";
    size_t pl = strlen(from_pre);
    const char *p;
    int layer = 0, nd = 0;

    for (size_t i = 0; i < COUNT(k_global_names); i++)
        if (strcmp(name, to_hf ? k_global_names[i].canon : k_global_names[i].hf) == 0) {
            snprintf(out, cap, "%s", to_hf ? k_global_names[i].hf : k_global_names[i].canon);
            return 1;
        }
    if (strncmp(name, from_pre, pl) != 0) return 0;
    for (p = name + pl; *p >= '0' && *p <= '9' && nd < 7; p++, nd++) layer = layer * 10 + (*p - '0');
    if (nd == 0 || *p != '.' || (nd > 1 && name[pl] == '0')) return 0;
    p++;
    for (size_t i = 0; i < COUNT(k_layer_names); i++)
        if (strcmp(p, to_hf ? k_layer_names[i].canon : k_layer_names[i].hf) == 0) {
            snprintf(out, cap, "%s%d.%s", to_pre, layer, to_hf ? k_layer_names[i].hf : k_layer_names[i].canon);
            return 1;
        }
    return 0;
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const src_tensor_t *)a)->t.name, ((const src_tensor_t *)b)->t.name);
}

static const src_tensor_t *find(const ie_model_src_t *s, const char *name)
{
    src_tensor_t key;
    if (!s || !name || !s->tensors) return NULL;
    key.t.name = name;
    return bsearch(&key, s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, tensor_cmp);
}

/* Sort the table and reject names that appear twice. */
static ie_status_t sort_tensors(ie_model_src_t *s)
{
    if (s->n_tensors > 1) qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, tensor_cmp);
    for (int64_t i = 1; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i - 1].t.name, s->tensors[i].t.name) == 0)
            return ie_error_set(IE_ERR_FORMAT, "model: tensor '%.96s' appears more than once", s->tensors[i].t.name);
    return IE_OK;
}

/* ---------------------------------------------------------------- validation */

static void fmt_shape(char *buf, size_t cap, int n_dims, const int64_t *ne)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < n_dims && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "", (long long)ne[d]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* " (HF 'model.layers.0...')" for HF sources, "" otherwise. */
static const char *hf_hint(const ie_model_src_t *s, const char *canon, char *buf, size_t cap)
{
    char hf[256];
    if (s->kind != IE_SRC_HF_DIR || !translate_name(canon, 1, hf, sizeof hf)) return "";
    snprintf(buf, cap, " (HF '%s')", hf);
    return buf;
}

/* Tensor `name` must exist with exactly dims ne0 (and ne1 if n_dims == 2)
 * and a dtype the kernels compute with. */
static ie_status_t need(const ie_model_src_t *s, const char *name, int n_dims, int64_t ne0, int64_t ne1)
{
    const src_tensor_t *st = find(s, name);
    int64_t want[2] = {ne0, ne1};
    char hint[300], have_s[96], want_s[96];
    int ok;

    if (!st)
        return ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'%s", name, hf_hint(s, name, hint, sizeof hint));
    ok = st->t.n_dims == n_dims;
    for (int d = 0; d < n_dims && ok; d++) ok = st->t.ne[d] == want[d];
    if (!ok) {
        fmt_shape(have_s, sizeof have_s, st->t.n_dims, st->t.ne);
        fmt_shape(want_s, sizeof want_s, n_dims, want);
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' has shape %s, expected %s%s", name, have_s, want_s,
                            hf_hint(s, name, hint, sizeof hint));
    }
    if (st->t.dtype == IE_DTYPE_INVALID)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: tensor '%s' has type %s, which clocher cannot compute with "
                            "(supported: f32, f16, bf16, q8_0, q4_0, q4_1)",
                            name, st->type_name);
    return IE_OK;
}

static ie_status_t validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;
    ie_status_t st = IE_OK;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[64];

    if (hp->n_head % hp->n_head_kv != 0)
        return ie_error_set(IE_ERR_FORMAT, "model: %s (%d) is not a multiple of %s (%d)", lb->n_head, hp->n_head,
                            lb->n_head_kv, hp->n_head_kv);
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2 != 0)
        return ie_error_set(IE_ERR_FORMAT, "model: %s (%d) must be even and at most %s (%d)", lb->rope_dim,
                            hp->rope_dim, lb->head_dim, hp->head_dim);
    if (hp->n_vocab < 1 || hp->n_vocab > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: vocabulary size %d is out of range [1, %d]", hp->n_vocab, HP_MAX);
    if (!isfinite(hp->rope_theta) || hp->rope_theta <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: rope theta %g must be positive", (double)hp->rope_theta);
    if (!isfinite(hp->rms_eps) || hp->rms_eps <= 0.0f || hp->rms_eps >= 1.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: RMS norm epsilon %g must be in (0, 1)", (double)hp->rms_eps);

    if ((st = need(s, "token_embd.weight", 2, hp->n_embd, hp->n_vocab)) != IE_OK) return st;
    if ((st = need(s, "output_norm.weight", 1, hp->n_embd, 0)) != IE_OK) return st;
    if (!hp->tied_embeddings && (st = need(s, "output.weight", 2, hp->n_embd, hp->n_vocab)) != IE_OK) return st;
    for (int l = 0; l < hp->n_layer; l++) {
        const struct { const char *suffix; int n_dims; int64_t ne0, ne1; } req[] = {
            {"attn_norm.weight", 1, hp->n_embd, 0},   {"attn_q.weight", 2, hp->n_embd, q_dim},
            {"attn_k.weight", 2, hp->n_embd, kv_dim}, {"attn_v.weight", 2, hp->n_embd, kv_dim},
            {"attn_output.weight", 2, q_dim, hp->n_embd}, {"ffn_norm.weight", 1, hp->n_embd, 0},
            {"ffn_gate.weight", 2, hp->n_embd, hp->n_ff}, {"ffn_up.weight", 2, hp->n_embd, hp->n_ff},
            {"ffn_down.weight", 2, hp->n_ff, hp->n_embd},
        };
        for (size_t i = 0; i < COUNT(req); i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, req[i].suffix);
            if ((st = need(s, name, req[i].n_dims, req[i].ne0, req[i].ne1)) != IE_OK) return st;
        }
    }
    return IE_OK;
}

static ie_status_t check_range(const char *field, int64_t v, int *out)
{
    if (v < 1 || v > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: %s = %lld is out of range [1, %d]", field, (long long)v, HP_MAX);
    *out = (int)v;
    return IE_OK;
}

/* ---------------------------------------------------------------- GGUF */

/* Integer key; absent -> `def` unless required. */
static ie_status_t gguf_int(const ie_gguf_t *g, const char *key, int required, int64_t def, int *out)
{
    int64_t v = def;
    if (ie_gguf_find_key(g, key) < 0) {
        if (required) return ie_error_set(IE_ERR_FORMAT, "model: missing key '%s'", key);
    } else if (ie_gguf_get_i64(g, key, &v) != IE_OK) {
        return IE_ERR_FORMAT; /* the reason names the key */
    }
    return check_range(key, v, out);
}

static ie_status_t gguf_float(const ie_gguf_t *g, const char *key, int required, float def, float *out)
{
    *out = def;
    if (ie_gguf_find_key(g, key) < 0)
        return required ? ie_error_set(IE_ERR_FORMAT, "model: missing key '%s'", key) : IE_OK;
    return ie_gguf_get_f32(g, key, out);
}

/* Copy a GGUF string into a fixed buffer (truncating). */
static void str_copy(char *dst, size_t cap, ie_gguf_str_t s)
{
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

static ie_status_t gguf_hparams(ie_model_src_t *s, const char *path)
{
    const ie_gguf_t *g = s->gguf;
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    ie_gguf_str_t str;
    const ie_gguf_tensor_info_t *emb;
    const char *base;
    int v_len;

    if (ie_gguf_find_key(g, "general.architecture") < 0)
        return ie_error_set(IE_ERR_FORMAT, "model: missing key 'general.architecture'");
    if ((st = ie_gguf_get_str(g, "general.architecture", &str)) != IE_OK) return st;
    if (str.len != 5 || memcmp(str.ptr, "llama", 5) != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: architecture '%.*s' is not supported (only 'llama')",
                            (int)(str.len < 64 ? str.len : 64), str.ptr);
    snprintf(hp->arch, sizeof hp->arch, "llama");
    if (ie_gguf_get_str(g, "general.name", &str) == IE_OK) {
        str_copy(hp->name, sizeof hp->name, str);
    } else {
        base = strrchr(path, '/');
        snprintf(hp->name, sizeof hp->name, "%s", base ? base + 1 : path);
    }

    if ((st = gguf_int(g, "llama.block_count", 1, 0, &hp->n_layer)) != IE_OK) return st;
    if ((st = gguf_int(g, "llama.embedding_length", 1, 0, &hp->n_embd)) != IE_OK) return st;
    if ((st = gguf_int(g, "llama.feed_forward_length", 1, 0, &hp->n_ff)) != IE_OK) return st;
    if ((st = gguf_int(g, "llama.attention.head_count", 1, 0, &hp->n_head)) != IE_OK) return st;
    if ((st = gguf_int(g, "llama.attention.head_count_kv", 0, hp->n_head, &hp->n_head_kv)) != IE_OK) return st;
    if ((st = gguf_int(g, "llama.context_length", 1, 0, &hp->n_ctx_train)) != IE_OK) return st;
    if (ie_gguf_find_key(g, "llama.attention.key_length") < 0 && hp->n_embd % hp->n_head != 0)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: llama.embedding_length (%d) is not a multiple of llama.attention.head_count (%d) "
                            "and llama.attention.key_length is absent",
                            hp->n_embd, hp->n_head);
    if ((st = gguf_int(g, "llama.attention.key_length", 0, hp->n_embd / hp->n_head, &hp->head_dim)) != IE_OK)
        return st;
    if ((st = gguf_int(g, "llama.attention.value_length", 0, hp->head_dim, &v_len)) != IE_OK) return st;
    if (v_len != hp->head_dim)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: llama.attention.value_length (%d) differs from the key length (%d)", v_len,
                            hp->head_dim);
    if ((st = gguf_int(g, "llama.rope.dimension_count", 0, hp->head_dim, &hp->rope_dim)) != IE_OK) return st;
    if ((st = gguf_float(g, "llama.rope.freq_base", 0, 10000.0f, &hp->rope_theta)) != IE_OK) return st;
    if ((st = gguf_float(g, "llama.attention.layer_norm_rms_epsilon", 1, 0.0f, &hp->rms_eps)) != IE_OK) return st;

    /* Llama 3.1-style frequency scaling: we would silently compute wrong rotations */
    if (ie_gguf_get_str(g, "llama.rope.scaling.type", &str) == IE_OK && !(str.len == 4 && !memcmp(str.ptr, "none", 4)))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: llama.rope.scaling.type '%.*s' is not supported",
                            (int)(str.len < 64 ? str.len : 64), str.ptr);
    if (ie_gguf_find_tensor(g, "rope_freqs.weight"))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: tensor 'rope_freqs.weight' (RoPE frequency scaling) is not supported");

    emb = ie_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
    if (emb->ne[1] > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: token_embd.weight has %lld rows, more than %d",
                            (long long)emb->ne[1], HP_MAX);
    hp->n_vocab = (int)emb->ne[1];
    if (ie_gguf_find_key(g, "llama.vocab_size") >= 0) {
        int64_t v;
        if ((st = ie_gguf_get_i64(g, "llama.vocab_size", &v)) != IE_OK) return st;
        if (v != hp->n_vocab)
            return ie_error_set(IE_ERR_FORMAT, "model: llama.vocab_size is %lld but token_embd.weight has %d rows",
                                (long long)v, hp->n_vocab);
    }
    hp->rope_layout = IE_ROPE_NORMAL;
    hp->tied_embeddings = ie_gguf_find_tensor(g, "output.weight") == NULL;
    return IE_OK;
}

static ie_status_t gguf_tensors(ie_model_src_t *s)
{
    int64_t n = ie_gguf_tensor_count(s->gguf);
    s->tensors = calloc(n ? n : 1, sizeof *s->tensors);
    if (!s->tensors) return ie_error_set(IE_ERR_NOMEM, "model: out of memory for %lld tensors", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const ie_gguf_tensor_info_t *gt = ie_gguf_tensor(s->gguf, i);
        src_tensor_t *t = &s->tensors[i];
        t->name = malloc(gt->name.len + 1);
        if (!t->name) return ie_error_set(IE_ERR_NOMEM, "model: out of memory for tensor names");
        memcpy(t->name, gt->name.ptr, gt->name.len);
        t->name[gt->name.len] = '\0';
        s->n_tensors = i + 1;
        t->t = (ie_tensor_t){t->name, gt->dtype, (int)gt->n_dims, {gt->ne[0], gt->ne[1], gt->ne[2], gt->ne[3]},
                             gt->data, gt->nbytes};
        t->type_name = ie_gguf_ggml_type_name(gt->ggml_type);
    }
    /* a name with an embedded NUL may now collide with another: reject it */
    return sort_tensors(s);
}

static ie_status_t open_gguf(ie_model_src_t *s, const char *path)
{
    static const hp_labels_t labels = {"llama.attention.head_count", "llama.attention.head_count_kv",
                                       "llama.attention.key_length", "llama.rope.dimension_count"};
    ie_status_t st;
    char why[512];

    s->kind = IE_SRC_GGUF;
    if ((st = ie_gguf_open(path, &s->gguf)) != IE_OK) {
        snprintf(why, sizeof why, "%s", ie_error_last());
        return ie_error_set(st, "model: '%s': %s", path, why);
    }
    if ((st = gguf_hparams(s, path)) != IE_OK) return st;
    if ((st = gguf_tensors(s)) != IE_OK) return st;
    if (!(s->tokenizer_path = strdup(path))) return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    return validate(s, &labels);
}

/* ---------------------------------------------------------------- HF directory */

/* Member `key` of `o`, or NULL if absent or `o` is not an object (some cJSON
 * versions dereference array members' NULL names in GetObjectItem). */
static const cJSON *obj_get(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* Read a whole (bounded) file and parse it as JSON. */
static ie_status_t read_json(const char *path, cJSON **out)
{
    ie_status_t st = IE_OK;
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len = -1;

    *out = NULL;
    if (!f) return ie_error_set(IE_ERR_IO, "model: cannot open '%s': %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || (unsigned long)len > JSON_MAX_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        st = ie_error_set(IE_ERR_IO, "model: cannot read '%s' (or larger than %u bytes)", path, JSON_MAX_BYTES);
        goto cleanup;
    }
    if (!(buf = malloc((size_t)len + 1))) {
        st = ie_error_set(IE_ERR_NOMEM, "model: out of memory reading '%s'", path);
        goto cleanup;
    }
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        st = ie_error_set(IE_ERR_IO, "model: error reading '%s'", path);
        goto cleanup;
    }
    buf[len] = '\0';
    if (!(*out = cJSON_ParseWithLength(buf, (size_t)len)))
        st = ie_error_set(IE_ERR_FORMAT, "model: '%s' is not valid JSON", path);

cleanup:
    free(buf);
    fclose(f);
    return st;
}

/* Integer config field; absent or null -> `def` unless required. */
static ie_status_t cfg_int(const cJSON *cfg, const char *field, int required, int64_t def, int *out)
{
    const cJSON *j = obj_get(cfg, field);
    double d;
    if (!j || cJSON_IsNull(j)) {
        if (required) return ie_error_set(IE_ERR_FORMAT, "model: config.json is missing field '%s'", field);
        return check_range(field, def, out);
    }
    d = j->valuedouble;
    if (!cJSON_IsNumber(j) || !(d >= -1e15 && d <= 1e15) || d != (double)(int64_t)d)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be an integer", field);
    return check_range(field, (int64_t)d, out);
}

static ie_status_t cfg_float(const cJSON *cfg, const char *field, float def, float *out)
{
    const cJSON *j = obj_get(cfg, field);
    *out = def;
    if (!j || cJSON_IsNull(j)) return IE_OK;
    if (!cJSON_IsNumber(j)) return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be a number", field);
    *out = (float)j->valuedouble;
    return IE_OK;
}

/* Absent/null/false -> 0, true -> 1; anything else is an error. */
static ie_status_t cfg_bool(const cJSON *cfg, const char *field, int *out)
{
    const cJSON *j = obj_get(cfg, field);
    *out = 0;
    if (!j || cJSON_IsNull(j)) return IE_OK;
    if (!cJSON_IsBool(j)) return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be true or false", field);
    *out = cJSON_IsTrue(j);
    return IE_OK;
}

static ie_status_t hf_check_arch(const cJSON *cfg)
{
    const cJSON *archs = obj_get(cfg, "architectures");
    const cJSON *mt = obj_get(cfg, "model_type");
    const cJSON *a;
    if (cJSON_IsArray(archs))
        cJSON_ArrayForEach(a, archs)
            if (cJSON_IsString(a) && strcmp(a->valuestring, "LlamaForCausalLM") == 0) return IE_OK;
    if (cJSON_IsString(mt) && strcmp(mt->valuestring, "llama") == 0) return IE_OK;
    a = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    return ie_error_set(IE_ERR_UNSUPPORTED,
                        "model: config.json architecture '%.64s' (model_type '%.32s') is not supported (only llama)",
                        cJSON_IsString(a) ? a->valuestring : "?", cJSON_IsString(mt) ? mt->valuestring : "?");
}

/* rope_scaling (transformers 4) and rope_parameters (transformers 5, which
 * also moves rope_theta there): only the plain, full-width rotation is
 * implemented. `untyped` is the type assumed when the object names none. */
static ie_status_t hf_check_rope(const cJSON *cfg, const char *field, const char *untyped)
{
    const cJSON *j = obj_get(cfg, field), *t, *prf;
    const char *type;
    if (!j || cJSON_IsNull(j)) return IE_OK;
    if (!cJSON_IsObject(j)) return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s type 'unknown' is not supported", field);
    t = obj_get(j, "rope_type");
    if (!cJSON_IsString(t)) t = obj_get(j, "type");
    type = cJSON_IsString(t) ? t->valuestring : untyped;
    if (strcmp(type, "default") != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s type '%.32s' is not supported", field, type);
    prf = obj_get(j, "partial_rotary_factor");
    if (cJSON_IsNumber(prf) && prf->valuedouble != 1.0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json %s partial_rotary_factor %g is not supported", field,
                            prf->valuedouble);
    return IE_OK;
}

static ie_status_t hf_hparams(ie_model_src_t *s, const cJSON *cfg, const char *dir)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const cJSON *j;
    size_t end = strlen(dir), begin;
    int flag;

    if (!cJSON_IsObject(cfg)) return ie_error_set(IE_ERR_FORMAT, "model: config.json is not a JSON object");
    if ((st = hf_check_arch(cfg)) != IE_OK) return st;
    snprintf(hp->arch, sizeof hp->arch, "llama");
    while (end > 1 && dir[end - 1] == '/') end--; /* name = last path component */
    for (begin = end; begin > 0 && dir[begin - 1] != '/'; begin--) {}
    snprintf(hp->name, sizeof hp->name, "%.*s", (int)(end - begin), dir + begin);

    if ((st = cfg_int(cfg, "hidden_size", 1, 0, &hp->n_embd)) != IE_OK) return st;
    if ((st = cfg_int(cfg, "intermediate_size", 1, 0, &hp->n_ff)) != IE_OK) return st;
    if ((st = cfg_int(cfg, "num_hidden_layers", 1, 0, &hp->n_layer)) != IE_OK) return st;
    if ((st = cfg_int(cfg, "num_attention_heads", 1, 0, &hp->n_head)) != IE_OK) return st;
    if ((st = cfg_int(cfg, "num_key_value_heads", 0, hp->n_head, &hp->n_head_kv)) != IE_OK) return st;
    if ((st = cfg_int(cfg, "vocab_size", 1, 0, &hp->n_vocab)) != IE_OK) return st;
    if ((st = cfg_int(cfg, "max_position_embeddings", 0, 2048, &hp->n_ctx_train)) != IE_OK) return st;
    j = obj_get(cfg, "head_dim");
    if ((!j || cJSON_IsNull(j)) && hp->n_embd % hp->n_head != 0)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: hidden_size (%d) is not a multiple of num_attention_heads (%d) and head_dim is absent",
                            hp->n_embd, hp->n_head);
    if ((st = cfg_int(cfg, "head_dim", 0, hp->n_embd / hp->n_head, &hp->head_dim)) != IE_OK) return st;
    hp->rope_dim = hp->head_dim;
    if ((st = cfg_float(cfg, "rms_norm_eps", 1e-6f, &hp->rms_eps)) != IE_OK) return st;
    if ((st = cfg_float(cfg, "rope_theta", 10000.0f, &hp->rope_theta)) != IE_OK) return st;
    if ((st = cfg_bool(cfg, "tie_word_embeddings", &hp->tied_embeddings)) != IE_OK) return st;
    hp->rope_layout = IE_ROPE_NEOX;

    /* features of LlamaConfig we do not implement: refuse rather than compute wrong numbers */
    if ((st = hf_check_rope(cfg, "rope_scaling", "unknown")) != IE_OK) return st;
    if ((st = hf_check_rope(cfg, "rope_parameters", "default")) != IE_OK) return st;
    if ((st = cfg_float(obj_get(cfg, "rope_parameters"), "rope_theta", hp->rope_theta, &hp->rope_theta)) != IE_OK)
        return st;
    j = obj_get(cfg, "hidden_act");
    if (cJSON_IsString(j) && strcmp(j->valuestring, "silu") != 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json hidden_act '%.32s' is not supported (only silu)",
                            j->valuestring);
    if ((st = cfg_bool(cfg, "attention_bias", &flag)) != IE_OK) return st;
    if (flag) return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json attention_bias = true is not supported");
    if ((st = cfg_bool(cfg, "mlp_bias", &flag)) != IE_OK) return st;
    if (flag) return ie_error_set(IE_ERR_UNSUPPORTED, "model: config.json mlp_bias = true is not supported");
    return IE_OK;
}

static int path_join(char *out, const char *dir, const char *file)
{
    int n = snprintf(out, PATH_CAP, "%s/%s", dir, file);
    return n > 0 && n < PATH_CAP;
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Add `name` to the list of shard file names unless already there. */
static ie_status_t add_shard_name(char ***names, int *n, const char *name)
{
    char **grown;
    for (int i = 0; i < *n; i++)
        if (strcmp((*names)[i], name) == 0) return IE_OK;
    if (!(grown = realloc(*names, (size_t)(*n + 1) * sizeof *grown)))
        return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    *names = grown;
    if (!(grown[*n] = strdup(name))) return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    (*n)++;
    return IE_OK;
}

/* Shard file names (relative to dir): the index's weight_map values, else
 * model.safetensors, else every *.safetensors in the directory (sorted). */
static ie_status_t hf_shard_names(const char *dir, const cJSON *index, char ***names, int *n)
{
    ie_status_t st = IE_OK;
    char path[PATH_CAP];
    DIR *d = NULL;
    struct dirent *de;
    const cJSON *e;

    if (index) {
        const cJSON *wm = obj_get(index, "weight_map");
        if (!cJSON_IsObject(wm))
            return ie_error_set(IE_ERR_FORMAT, "model: model.safetensors.index.json has no \"weight_map\" object");
        cJSON_ArrayForEach(e, wm) {
            if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') || e->valuestring[0] == '.')
                return ie_error_set(IE_ERR_FORMAT, "model: weight_map entry '%.96s' does not name a shard file in the directory",
                                    e->string);
            if ((st = add_shard_name(names, n, e->valuestring)) != IE_OK) return st;
        }
        return IE_OK;
    }
    if (path_join(path, dir, "model.safetensors") && access(path, F_OK) == 0)
        return add_shard_name(names, n, "model.safetensors");
    if (!(d = opendir(dir))) return ie_error_set(IE_ERR_IO, "model: cannot list '%s': %s", dir, strerror(errno));
    while ((de = readdir(d)) && st == IE_OK) {
        size_t l = strlen(de->d_name);
        if (l > 12 && de->d_name[0] != '.' && strcmp(de->d_name + l - 12, ".safetensors") == 0)
            st = add_shard_name(names, n, de->d_name);
    }
    closedir(d);
    if (st == IE_OK && *n == 0) st = ie_error_set(IE_ERR_IO, "model: no *.safetensors files in '%s'", dir);
    if (st == IE_OK && *n > 1) qsort(*names, (size_t)*n, sizeof **names, str_cmp);
    return st;
}

/* Every weight_map entry must be in the shard it names. */
static ie_status_t hf_check_index(const ie_model_src_t *s, const cJSON *index, char **names)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, obj_get(index, "weight_map")) {
        int i = 0;
        while (i < s->n_shards && strcmp(names[i], e->valuestring) != 0) i++;
        if (i == s->n_shards || !ie_safetensors_find(s->shards[i], e->string))
            return ie_error_set(IE_ERR_FORMAT, "model: weight_map puts '%.96s' in '%.96s', which has no such tensor",
                                e->string, e->valuestring);
    }
    return IE_OK;
}

/* Open the shards and build the canonical tensor table. */
static ie_status_t hf_tensors(ie_model_src_t *s, const char *dir)
{
    ie_status_t st = IE_OK;
    cJSON *index = NULL;
    char **names = NULL, path[PATH_CAP], canon[256];
    int n_names = 0;
    int64_t total = 0, k = 0;

    if (!path_join(path, dir, "model.safetensors.index.json"))
        return ie_error_set(IE_ERR_INVAL, "model: path too long: '%.256s'", dir);
    if (access(path, F_OK) == 0 && (st = read_json(path, &index)) != IE_OK) goto cleanup;
    if ((st = hf_shard_names(dir, index, &names, &n_names)) != IE_OK) goto cleanup;
    if (!(s->shards = calloc((size_t)n_names + 1, sizeof *s->shards))) {
        st = ie_error_set(IE_ERR_NOMEM, "model: out of memory");
        goto cleanup;
    }
    for (; s->n_shards < n_names; s->n_shards++) {
        if (!path_join(path, dir, names[s->n_shards])) {
            st = ie_error_set(IE_ERR_INVAL, "model: path too long: '%.256s'", dir);
            goto cleanup;
        }
        if ((st = ie_safetensors_open(path, &s->shards[s->n_shards])) != IE_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", ie_error_last());
            st = ie_error_set(st, "model: '%s': %s", path, why);
            goto cleanup;
        }
        total += ie_safetensors_count(s->shards[s->n_shards]);
    }
    if (index && (st = hf_check_index(s, index, names)) != IE_OK) goto cleanup;

    if (!(s->tensors = calloc(total ? total : 1, sizeof *s->tensors))) {
        st = ie_error_set(IE_ERR_NOMEM, "model: out of memory for %lld tensors", (long long)total);
        goto cleanup;
    }
    for (int i = 0; i < s->n_shards; i++)
        for (int64_t j = 0; j < ie_safetensors_count(s->shards[i]); j++) {
            const ie_safetensors_tensor_t *ht = ie_safetensors_get(s->shards[i], j);
            src_tensor_t *t = &s->tensors[k];
            int mapped = translate_name(ht->name, 0, canon, sizeof canon);
            if (mapped && s->hp.tied_embeddings && strcmp(canon, "output.weight") == 0) continue;
            if (!(t->name = strdup(mapped ? canon : ht->name))) {
                st = ie_error_set(IE_ERR_NOMEM, "model: out of memory for tensor names");
                goto cleanup;
            }
            s->n_tensors = ++k;
            t->t = (ie_tensor_t){t->name, ht->dtype, ht->ndim, {1, 1, 1, 1}, ht->data, ht->nbytes};
            for (int d = 0; d < ht->ndim; d++) t->t.ne[d] = ht->shape[ht->ndim - 1 - d]; /* HF is outermost-first */
            t->type_name = ht->dtype_str;
        }
    st = sort_tensors(s);

cleanup:
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    cJSON_Delete(index);
    return st;
}

static ie_status_t open_hf(ie_model_src_t *s, const char *dir)
{
    static const hp_labels_t labels = {"num_attention_heads", "num_key_value_heads", "head_dim", "head_dim"};
    ie_status_t st = IE_OK;
    cJSON *cfg = NULL;
    char path[PATH_CAP];

    s->kind = IE_SRC_HF_DIR;
    if (!path_join(path, dir, "config.json")) {
        st = ie_error_set(IE_ERR_INVAL, "model: path too long: '%.256s'", dir);
        goto cleanup;
    }
    if ((st = read_json(path, &cfg)) != IE_OK) goto cleanup;
    if ((st = hf_hparams(s, cfg, dir)) != IE_OK) goto cleanup;
    if ((st = hf_tensors(s, dir)) != IE_OK) goto cleanup;
    if (path_join(path, dir, "tokenizer.json") && access(path, R_OK) == 0 && !(s->tokenizer_path = strdup(path))) {
        st = ie_error_set(IE_ERR_NOMEM, "model: out of memory");
        goto cleanup;
    }
    st = validate(s, &labels);

cleanup:
    cJSON_Delete(cfg);
    return st;
}

/* ---------------------------------------------------------------- public */

ie_status_t ie_model_src_open(const char *path, ie_model_src_t **out)
{
    ie_status_t st = IE_OK;
    ie_model_src_t *s = NULL;
    struct stat sb;

    if (!out) return ie_error_set(IE_ERR_INVAL, "model: out is NULL");
    *out = NULL;
    if (!path) return ie_error_set(IE_ERR_INVAL, "model: path is NULL");
    if (stat(path, &sb) != 0) return ie_error_set(IE_ERR_IO, "model: cannot open '%s': %s", path, strerror(errno));
    if (!(s = calloc(1, sizeof *s))) return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    st = S_ISDIR(sb.st_mode) ? open_hf(s, path) : open_gguf(s, path);
    if (st == IE_OK) {
        *out = s;
        s = NULL;
    }
    ie_model_src_destroy(&s);
    return st;
}

void ie_model_src_destroy(ie_model_src_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_model_src_t *s = *self_p;
    for (int64_t i = 0; i < s->n_tensors; i++) free(s->tensors[i].name);
    free(s->tensors);
    for (int i = 0; i < s->n_shards; i++) ie_safetensors_destroy(&s->shards[i]);
    free(s->shards);
    ie_gguf_destroy(&s->gguf);
    free(s->tokenizer_path);
    free(s);
    *self_p = NULL;
}

ie_src_kind_t ie_model_src_kind(const ie_model_src_t *src) { return src ? src->kind : IE_SRC_GGUF; }

const ie_hparams_t *ie_model_src_hparams(const ie_model_src_t *src) { return src ? &src->hp : NULL; }

const ie_tensor_t *ie_model_src_tensor(const ie_model_src_t *src, const char *name)
{
    const src_tensor_t *t = find(src, name);
    return t ? &t->t : NULL;
}

const char *ie_model_src_tokenizer_path(const ie_model_src_t *src) { return src ? src->tokenizer_path : NULL; }

const struct ie_gguf *ie_model_src_gguf(const ie_model_src_t *src) { return src ? src->gguf : NULL; }
