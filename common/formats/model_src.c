/* model_src.c — one view over GGUF files, Hugging Face directories, IEBIN
 * models (iebin.c) and in-memory sources built by a converter.
 *
 * All loaders fill the same ie_hparams_t and a table of tensors under
 * canonical GGUF names, then share one validator: hyper-parameters in range
 * and consistent, every tensor the architecture needs present with the
 * exact expected shape and a dtype we compute with (each architecture's
 * tensors: its model_<arch>.c, model_src_internal.h). Tensor data stays in the
 * GGUF / safetensors mappings; only names are copied.
 *
 * Functions that own resources leave through one cleanup label; pure checks
 * return at their first failure, which reads more directly than a goto there.
 */
#include "model_src_internal.h"

#include "ie_mmap.h"
#include "ie_pack.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define JSON_MAX_BYTES (64u << 20) /* config.json / index json size limit    */
#define PATH_CAP 4096

/* ---------------------------------------------------------------- names */

static const name_pair_t k_global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight", 0},
    {"model.norm.weight", "output_norm.weight", 0},
    {"lm_head.weight", "output.weight", 0},
};

/* Translate a tensor name HF -> canonical (to_hf = 0) or back (to_hf = 1)
 * for architecture `arch`. Returns 1 and writes `out` if the mapping knows
 * the name. */
static int translate_name(const char *name, int to_hf, ie_arch_t arch, char *out, size_t cap)
{
    const msrc_arch_t *a = msrc_arch_by_id(arch);
    const name_pair_t *tab = a ? a->layer_names : NULL;
    size_t n_tab = a ? a->n_layer_names : 0;
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
    for (size_t i = 0; i < n_tab; i++)
        if ((to_hf || !tab[i].hint_only) && strcmp(p, to_hf ? tab[i].canon : tab[i].hf) == 0) {
            snprintf(out, cap, "%s%d.%s", to_pre, layer, to_hf ? tab[i].hf : tab[i].canon);
            return 1;
        }
    return 0;
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const src_tensor_t *)a)->t.name, ((const src_tensor_t *)b)->t.name);
}

/* name order, hidden entries after every visible one */
static int tensor_cmp_visible(const void *a, const void *b)
{
    const src_tensor_t *x = a, *y = b;
    if (x->hidden != y->hidden) return x->hidden - y->hidden;
    return strcmp(x->t.name, y->t.name);
}

const src_tensor_t *msrc_find(const ie_model_src_t *s, const char *name)
{
    src_tensor_t key;
    if (!s || !name || !s->tensors) return NULL;
    key.t.name = name;
    return bsearch(&key, s->tensors, (size_t)s->n_sorted, sizeof *s->tensors, tensor_cmp);
}

/* Sort the table and reject names that appear twice. */
ie_status_t msrc_sort_tensors(ie_model_src_t *s)
{
    if (s->n_tensors > 1) qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, tensor_cmp_visible);
    s->n_sorted = s->n_tensors;
    while (s->n_sorted > 0 && s->tensors[s->n_sorted - 1].hidden) s->n_sorted--;
    for (int64_t i = 1; i < s->n_sorted; i++)
        if (strcmp(s->tensors[i - 1].t.name, s->tensors[i].t.name) == 0)
            return ie_error_set(IE_ERR_FORMAT, "model: tensor '%.96s' appears more than once",
                                s->tensors[i].t.name);
    return IE_OK;
}

/* Contract (model_src_internal.h). The fused entry may move when the
 * table is re-sorted; its data (a mapping or its owned copy) does not. A
 * 1-D tensor is one row (n = 1: a rename). */
ie_status_t msrc_split_rows(ie_model_src_t *s, const char *fused, int n, const char *const *names,
                            const int64_t *rows)
{
    src_tensor_t *f = (src_tensor_t *)msrc_find(s, fused);
    const uint8_t *data;
    size_t row_bytes;

    if (!f || f->hidden || f->t.n_dims > 2 || f->t.layout != IE_LAYOUT_ROWS)
        return ie_error_set(IE_ERR_INTERNAL, "model: cannot split '%s' by rows", fused);
    row_bytes = ie_tensor_bytes(f->t.dtype, IE_LAYOUT_ROWS, 0, f->t.ne[0], 1);
    if (f->t.dtype == IE_DTYPE_INVALID || row_bytes == 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: tensor '%s' has type %s, which clocher cannot compute with",
                            fused, f->type_name);
    if (s->n_tensors + n > s->cap_tensors) return ie_error_set(IE_ERR_INTERNAL, "model: tensor table full");
    f->hidden = 1;
    data = f->t.data;
    for (int i = 0; i < n; i++) {
        src_tensor_t *t = &s->tensors[s->n_tensors];
        if (!(t->name = strdup(names[i]))) return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
        s->n_tensors++;
        t->t = f->t;
        t->t.name = t->name;
        t->t.ne[1] = rows[i];
        t->t.data = data;
        t->t.nbytes = (uint64_t)row_bytes * (uint64_t)rows[i];
        t->type_name = f->type_name;
        data += t->t.nbytes;
    }
    return IE_OK;
}

/* ---------------------------------------------------------------- validation */

void msrc_fmt_shape(char *buf, size_t cap, int n_dims, const int64_t *ne)
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
    if (s->kind != IE_SRC_HF_DIR || !translate_name(canon, 1, s->hp.arch_id, hf, sizeof hf)) return "";
    snprintf(buf, cap, " (HF '%s')", hf);
    return buf;
}

/* Tensor `name` must exist with exactly `n_dims` dims equal to ne[] and a
 * dtype the kernels compute with. */
ie_status_t msrc_need_ne(const ie_model_src_t *s, const char *name, int n_dims, const int64_t *want)
{
    const src_tensor_t *st = msrc_find(s, name);
    char hint[300], have_s[96], want_s[96];
    int ok;

    if (!st)
        return ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'%s", name,
                            hf_hint(s, name, hint, sizeof hint));
    ok = st->t.n_dims == n_dims;
    for (int d = 0; d < n_dims && ok; d++) ok = st->t.ne[d] == want[d];
    if (!ok) {
        msrc_fmt_shape(have_s, sizeof have_s, st->t.n_dims, st->t.ne);
        msrc_fmt_shape(want_s, sizeof want_s, n_dims, want);
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' has shape %s, expected %s%s", name, have_s, want_s,
                            hf_hint(s, name, hint, sizeof hint));
    }
    if (st->t.dtype == IE_DTYPE_INVALID)
        return ie_error_set(
            IE_ERR_UNSUPPORTED,
            "model: tensor '%s' has type %s, which clocher cannot compute with "
            "(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_K, q3_K, "
            "q4_K, q5_K, q6_K, iq4_xs, iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, mxfp4)",
            name, st->type_name);
    return IE_OK;
}

ie_status_t msrc_need(const ie_model_src_t *s, const char *name, int n_dims, int64_t ne0, int64_t ne1)
{
    const int64_t want[2] = {ne0, ne1};
    return msrc_need_ne(s, name, n_dims, want);
}


static ie_status_t validate(const ie_model_src_t *s, const hp_labels_t *lb)
{
    const ie_hparams_t *hp = &s->hp;

    if (!msrc_arch_by_id(hp->arch_id))
        return ie_error_set(IE_ERR_FORMAT, "model: unknown architecture id %d", (int)hp->arch_id);
    if (hp->n_layer > IE_MAX_LAYERS)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: %s (%d) exceeds the supported maximum of %d layers",
                            lb->n_layer, hp->n_layer, IE_MAX_LAYERS);
    if (hp->n_head % hp->n_head_kv != 0)
        return ie_error_set(IE_ERR_FORMAT, "model: %s (%d) is not a multiple of %s (%d)", lb->n_head, hp->n_head,
                            lb->n_head_kv, hp->n_head_kv);
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2 != 0)
        return ie_error_set(IE_ERR_FORMAT, "model: %s (%d) must be even and at most %s (%d)", lb->rope_dim,
                            hp->rope_dim, lb->head_dim, hp->head_dim);
    if (hp->n_vocab < 1 || hp->n_vocab > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: vocabulary size %d is out of range [1, %d]", hp->n_vocab,
                            HP_MAX);
    if (!isfinite(hp->rope_theta) || hp->rope_theta <= 0.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: rope theta %g must be positive", (double)hp->rope_theta);
    if (!isfinite(hp->rms_eps) || hp->rms_eps <= 0.0f || hp->rms_eps >= 1.0f)
        return ie_error_set(IE_ERR_FORMAT, "model: RMS norm epsilon %g must be in (0, 1)", (double)hp->rms_eps);
    /* RoPE frequency factors (any architecture): one per rotated pair */
    if (hp->rope_freqs) {
        ie_status_t st = msrc_need(s, "rope_freqs.weight", 1, hp->rope_dim / 2, 0);
        if (st != IE_OK) return st;
    }
    return msrc_arch_by_id(hp->arch_id)->validate(s, lb);
}

ie_status_t msrc_check_range(const char *field, int64_t v, int *out)
{
    if (v < 1 || v > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: %s = %lld is out of range [1, %d]", field, (long long)v, HP_MAX);
    *out = (int)v;
    return IE_OK;
}

/* ---------------------------------------------------------------- GGUF */

/* Integer key; absent -> `def` unless required. */
ie_status_t msrc_gguf_int(const ie_gguf_t *g, const char *key, int required, int64_t def, int *out)
{
    int64_t v = def;
    if (ie_gguf_find_key(g, key) < 0) {
        if (required) return ie_error_set(IE_ERR_FORMAT, "model: missing key '%s'", key);
    } else if (ie_gguf_get_i64(g, key, &v) != IE_OK) {
        return IE_ERR_FORMAT; /* the reason names the key */
    }
    return msrc_check_range(key, v, out);
}

ie_status_t msrc_gguf_float(const ie_gguf_t *g, const char *key, int required, float def, float *out)
{
    *out = def;
    if (ie_gguf_find_key(g, key) < 0)
        return required ? ie_error_set(IE_ERR_FORMAT, "model: missing key '%s'", key) : IE_OK;
    return ie_gguf_get_f32(g, key, out);
}

/* Copy a GGUF string into a fixed buffer (truncating). */
void msrc_str_copy(char *dst, size_t cap, ie_gguf_str_t s)
{
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

/* rows of token_embd.weight, cross-checked with `vocab_key` if present */
ie_status_t msrc_gguf_vocab(const ie_gguf_t *g, const char *vocab_key, int *n_vocab)
{
    const ie_gguf_tensor_info_t *emb = ie_gguf_find_tensor(g, "token_embd.weight");
    ie_status_t st;
    if (!emb) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
    if (emb->ne[1] > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: token_embd.weight has %lld rows, more than %d",
                            (long long)emb->ne[1], HP_MAX);
    *n_vocab = (int)emb->ne[1];
    if (ie_gguf_find_key(g, vocab_key) >= 0) {
        int64_t v;
        if ((st = ie_gguf_get_i64(g, vocab_key, &v)) != IE_OK) return st;
        if (v != *n_vocab)
            return ie_error_set(IE_ERR_FORMAT, "model: %s is %lld but token_embd.weight has %d rows", vocab_key,
                                (long long)v, *n_vocab);
    }
    return IE_OK;
}

/* YaRN attention factor when the file gives none (transformers get_mscale). */
float msrc_yarn_mscale(float factor) { return factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f; }

/* Integer / float key "<arch>.<key>" (the GGUF keys every architecture
 * spells with its own prefix). */
ie_status_t msrc_gguf_arch_int(const ie_gguf_t *g, const char *arch, const char *key, int required, int64_t def,
                               int *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return msrc_gguf_int(g, k, required, def, out);
}

ie_status_t msrc_gguf_arch_float(const ie_gguf_t *g, const char *arch, const char *key, int required, float def,
                                 float *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return msrc_gguf_float(g, k, required, def, out);
}

int msrc_gguf_arch_has(const ie_gguf_t *g, const char *arch, const char *key)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return ie_gguf_find_key(g, k) >= 0;
}

/* The keys every architecture has, under its prefix: shape, context, head
 * geometry, RoPE base and dimensions, norm epsilon (the vocabulary comes
 * last, gguf_vocab, after each architecture's own checks). ff_key: the
 * key of the MLP width; rope_base: the RoPE base when the file gives none. */
ie_status_t msrc_gguf_hparams_common(const ie_gguf_t *g, const char *a, const char *ff_key, float rope_base,
                                     ie_hparams_t *hp)
{
    ie_status_t st;
    int v_len;

    if ((st = msrc_gguf_arch_int(g, a, "block_count", 1, 0, &hp->n_layer)) != IE_OK) return st;
    if ((st = msrc_gguf_arch_int(g, a, "embedding_length", 1, 0, &hp->n_embd)) != IE_OK) return st;
    if ((st = msrc_gguf_arch_int(g, a, ff_key, 1, 0, &hp->n_ff)) != IE_OK) return st;
    if ((st = msrc_gguf_arch_int(g, a, "attention.head_count", 1, 0, &hp->n_head)) != IE_OK) return st;
    if ((st = msrc_gguf_arch_int(g, a, "attention.head_count_kv", 0, hp->n_head, &hp->n_head_kv)) != IE_OK)
        return st;
    if ((st = msrc_gguf_arch_int(g, a, "context_length", 1, 0, &hp->n_ctx_train)) != IE_OK) return st;
    if (!msrc_gguf_arch_has(g, a, "attention.key_length") && hp->n_embd % hp->n_head != 0)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: %s.embedding_length (%d) is not a multiple of %s.attention.head_count (%d) "
                            "and %s.attention.key_length is absent",
                            a, hp->n_embd, a, hp->n_head, a);
    if ((st = msrc_gguf_arch_int(g, a, "attention.key_length", 0, hp->n_embd / hp->n_head, &hp->head_dim)) != IE_OK)
        return st;
    if ((st = msrc_gguf_arch_int(g, a, "attention.value_length", 0, hp->head_dim, &v_len)) != IE_OK) return st;
    if (v_len != hp->head_dim)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: %s.attention.value_length (%d) differs from the key length (%d)", a, v_len,
                            hp->head_dim);
    if ((st = msrc_gguf_arch_int(g, a, "rope.dimension_count", 0, hp->head_dim, &hp->rope_dim)) != IE_OK) return st;
    if ((st = msrc_gguf_arch_float(g, a, "rope.freq_base", 0, rope_base, &hp->rope_theta)) != IE_OK) return st;
    return msrc_gguf_arch_float(g, a, "attention.layer_norm_rms_epsilon", 1, 0.0f, &hp->rms_eps);
}

/* The architecture and name, then its keys (the shared ones once, in
 * gguf_hparams_common; each architecture's extras in its own function). */
static ie_status_t gguf_hparams(ie_model_src_t *s, const char *path)
{
    const ie_gguf_t *g = s->gguf;
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    ie_gguf_str_t str;
    const char *base;
    const msrc_arch_t *arch;
    char list[256];

    if (ie_gguf_find_key(g, "general.architecture") < 0)
        return ie_error_set(IE_ERR_FORMAT, "model: missing key 'general.architecture'");
    if ((st = ie_gguf_get_str(g, "general.architecture", &str)) != IE_OK) return st;
    if (!(arch = msrc_arch_by_name(str.ptr, str.len)))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: architecture '%.*s' is not supported (supported: %s)",
                            (int)(str.len < 64 ? str.len : 64), str.ptr, msrc_arch_list(list, sizeof list));
    hp->arch_id = arch->id;
    snprintf(hp->arch, sizeof hp->arch, "%s", arch->name);
    if (ie_gguf_get_str(g, "general.name", &str) == IE_OK) {
        msrc_str_copy(hp->name, sizeof hp->name, str);
    } else {
        base = strrchr(path, '/');
        snprintf(hp->name, sizeof hp->name, "%s", base ? base + 1 : path);
    }
    return arch->gguf_hparams(g, hp);
}

/* Sort the table, then let the architecture present fused tensors as
 * views (its split_fused re-sorts). */
static ie_status_t split_fused(ie_model_src_t *s)
{
    const msrc_arch_t *arch = msrc_arch_by_id(s->hp.arch_id);
    ie_status_t st = msrc_sort_tensors(s);
    if (st == IE_OK && arch->split_fused) st = arch->split_fused(s);
    return st;
}

static ie_status_t gguf_tensors(ie_model_src_t *s)
{
    int64_t n = ie_gguf_tensor_count(s->gguf);
    /* room for the views of fused tensors */
    const msrc_arch_t *arch = msrc_arch_by_id(s->hp.arch_id);
    int64_t cap = n + (int64_t)arch->views_per_layer * s->hp.n_layer + arch->views_extra;
    s->tensors = calloc(cap ? cap : 1, sizeof *s->tensors);
    if (!s->tensors) return ie_error_set(IE_ERR_NOMEM, "model: out of memory for %lld tensors", (long long)n);
    s->cap_tensors = cap;
    for (int64_t i = 0; i < n; i++) {
        const ie_gguf_tensor_info_t *gt = ie_gguf_tensor(s->gguf, i);
        src_tensor_t *t = &s->tensors[i];
        t->name = malloc(gt->name.len + 1);
        if (!t->name) return ie_error_set(IE_ERR_NOMEM, "model: out of memory for tensor names");
        memcpy(t->name, gt->name.ptr, gt->name.len);
        t->name[gt->name.len] = '\0';
        s->n_tensors = i + 1;
        t->t = (ie_tensor_t){t->name,  gt->dtype,  (int)gt->n_dims, {gt->ne[0], gt->ne[1], gt->ne[2], gt->ne[3]},
                             gt->data, gt->nbytes, IE_LAYOUT_ROWS,  0};
        t->type_name = ie_gguf_ggml_type_name(gt->ggml_type);
    }
    /* a name with an embedded NUL may now collide with another: reject it */
    return split_fused(s);
}

/* validate() with the GGUF keys' names ("<arch>.block_count", ...) */
static ie_status_t validate_gguf(const ie_model_src_t *s)
{
    static const char *const keys[] = {"block_count",          "attention.head_count",    "attention.head_count_kv",
                                       "attention.key_length", "rope.dimension_count",    "expert_count",
                                       "expert_used_count",    "attention.sliding_window"};
    char buf[COUNT(keys)][96];
    for (size_t i = 0; i < COUNT(keys); i++) snprintf(buf[i], sizeof buf[i], "%s.%s", s->hp.arch, keys[i]);
    const hp_labels_t labels = {buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7]};
    return validate(s, &labels);
}

static ie_status_t open_gguf(ie_model_src_t *s, const char *path)
{
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
    return validate_gguf(s);
}

/* ---------------------------------------------------------------- HF directory */

/* Member `key` of `o`, or NULL if absent or `o` is not an object (some cJSON
 * versions dereference array members' NULL names in GetObjectItem). */
const cJSON *msrc_obj_get(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* Read a whole (bounded) file and parse it as JSON. */
ie_status_t msrc_read_json(const char *path, cJSON **out)
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
ie_status_t msrc_cfg_int(const cJSON *cfg, const char *field, int required, int64_t def, int *out)
{
    const cJSON *j = msrc_obj_get(cfg, field);
    double d;
    if (!j || cJSON_IsNull(j)) {
        if (required) return ie_error_set(IE_ERR_FORMAT, "model: config.json is missing field '%s'", field);
        return msrc_check_range(field, def, out);
    }
    d = j->valuedouble;
    if (!cJSON_IsNumber(j) || !(d >= -1e15 && d <= 1e15) || d != (double)(int64_t)d)
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be an integer", field);
    return msrc_check_range(field, (int64_t)d, out);
}

ie_status_t msrc_cfg_float(const cJSON *cfg, const char *field, float def, float *out)
{
    const cJSON *j = msrc_obj_get(cfg, field);
    *out = def;
    if (!j || cJSON_IsNull(j)) return IE_OK;
    if (!cJSON_IsNumber(j))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be a number", field);
    *out = (float)j->valuedouble;
    return IE_OK;
}

/* Absent/null/false -> 0, true -> 1; anything else is an error. */
ie_status_t msrc_cfg_bool(const cJSON *cfg, const char *field, int *out)
{
    const cJSON *j = msrc_obj_get(cfg, field);
    *out = 0;
    if (!j || cJSON_IsNull(j)) return IE_OK;
    if (!cJSON_IsBool(j))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s' must be true or false", field);
    *out = cJSON_IsTrue(j);
    return IE_OK;
}

static ie_status_t hf_check_arch(const cJSON *cfg, const msrc_arch_t **arch)
{
    const cJSON *archs = msrc_obj_get(cfg, "architectures");
    const cJSON *mt = msrc_obj_get(cfg, "model_type");
    const cJSON *a;
    char list[256];
    if ((*arch = msrc_arch_by_hf(cfg))) return IE_OK;
    a = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    return ie_error_set(IE_ERR_UNSUPPORTED,
                        "model: config.json architecture '%.64s' (model_type '%.32s') is not supported "
                        "(supported: %s)",
                        cJSON_IsString(a) ? a->valuestring : "?", cJSON_IsString(mt) ? mt->valuestring : "?",
                        msrc_arch_list(list, sizeof list));
}

/* Number member `key` of the rope object `ro` (named `field` in messages);
 * absent, null or (zero_is_absent) 0 -> def. */
ie_status_t msrc_rope_num(const cJSON *ro, const char *field, const char *key, int zero_is_absent, double def,
                          double *out)
{
    const cJSON *j = msrc_obj_get(ro, key);
    *out = def;
    if (!j || cJSON_IsNull(j)) return IE_OK;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return ie_error_set(IE_ERR_FORMAT, "model: config.json field '%s.%s' must be a number", field, key);
    if (!(zero_is_absent && j->valuedouble == 0.0)) *out = j->valuedouble;
    return IE_OK;
}

/* The transformer dimensions every HF config carries (default_ctx when
 * max_position_embeddings is absent); head_dim defaults to hidden/heads. */
ie_status_t msrc_hf_dims(const cJSON *cfg, int default_ctx, ie_hparams_t *hp)
{
    ie_status_t st;
    const cJSON *j;
    if ((st = msrc_cfg_int(cfg, "hidden_size", 1, 0, &hp->n_embd)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "intermediate_size", 1, 0, &hp->n_ff)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "num_hidden_layers", 1, 0, &hp->n_layer)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "num_attention_heads", 1, 0, &hp->n_head)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "num_key_value_heads", 0, hp->n_head, &hp->n_head_kv)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "vocab_size", 1, 0, &hp->n_vocab)) != IE_OK) return st;
    if ((st = msrc_cfg_int(cfg, "max_position_embeddings", 0, default_ctx, &hp->n_ctx_train)) != IE_OK) return st;
    j = msrc_obj_get(cfg, "head_dim");
    if ((!j || cJSON_IsNull(j)) && hp->n_embd % hp->n_head != 0)
        return ie_error_set(
            IE_ERR_FORMAT,
            "model: hidden_size (%d) is not a multiple of num_attention_heads (%d) and head_dim is absent",
            hp->n_embd, hp->n_head);
    if ((st = msrc_cfg_int(cfg, "head_dim", 0, hp->n_embd / hp->n_head, &hp->head_dim)) != IE_OK) return st;
    hp->rope_dim = hp->head_dim;
    return IE_OK;
}


static ie_status_t hf_hparams(ie_model_src_t *s, const cJSON *cfg, const char *dir)
{
    ie_hparams_t *hp = &s->hp;
    ie_status_t st;
    const msrc_arch_t *arch;
    size_t end = strlen(dir), begin;

    if (!cJSON_IsObject(cfg)) return ie_error_set(IE_ERR_FORMAT, "model: config.json is not a JSON object");
    if ((st = hf_check_arch(cfg, &arch)) != IE_OK) return st;
    hp->arch_id = arch->id;
    snprintf(hp->arch, sizeof hp->arch, "%s", arch->name);
    while (end > 1 && dir[end - 1] == '/') end--; /* name = last path component */
    for (begin = end; begin > 0 && dir[begin - 1] != '/'; begin--) {}
    snprintf(hp->name, sizeof hp->name, "%.*s", (int)(end - begin), dir + begin);
    return arch->hf_hparams(s, cfg);
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
        const cJSON *wm = msrc_obj_get(index, "weight_map");
        if (!cJSON_IsObject(wm))
            return ie_error_set(IE_ERR_FORMAT, "model: model.safetensors.index.json has no \"weight_map\" object");
        cJSON_ArrayForEach(e, wm)
        {
            if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') || e->valuestring[0] == '.')
                return ie_error_set(IE_ERR_FORMAT,
                                    "model: weight_map entry '%.96s' does not name a shard file in the directory",
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
    cJSON_ArrayForEach(e, msrc_obj_get(index, "weight_map"))
    {
        int i = 0;
        while (i < s->n_shards && strcmp(names[i], e->valuestring) != 0) i++;
        if (i == s->n_shards || !ie_safetensors_find(s->shards[i], e->string))
            return ie_error_set(IE_ERR_FORMAT,
                                "model: weight_map puts '%.96s' in '%.96s', which has no such tensor", e->string,
                                e->valuestring);
    }
    return IE_OK;
}


size_t msrc_float_size(ie_dtype_t t)
{
    return t == IE_DTYPE_F32 ? 4 : (t == IE_DTYPE_F16 || t == IE_DTYPE_BF16) ? 2 : 0;
}

/* HF tensor `name` (HF shape order) or NULL if absent and not required. */
ie_status_t msrc_hf_raw(const ie_model_src_t *s, const char *name, int required, int ndim, const int64_t *shape,
                        int want_u8, const src_tensor_t **out)
{
    const src_tensor_t *t = msrc_find(s, name);
    int64_t have[4], want[4];
    char have_s[96], want_s[96];
    int ok;

    *out = NULL;
    if (!t) return required ? ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'", name) : IE_OK;
    ok = t->t.n_dims == ndim;
    for (int d = 0; d < t->t.n_dims && d < 4; d++) have[d] = t->t.ne[t->t.n_dims - 1 - d];
    for (int d = 0; d < ndim; d++) want[d] = shape[d];
    for (int d = 0; d < ndim && ok; d++) ok = have[d] == want[d];
    if (!ok) {
        msrc_fmt_shape(have_s, sizeof have_s, t->t.n_dims, have);
        msrc_fmt_shape(want_s, sizeof want_s, ndim, want);
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' has shape %s, expected %s", name, have_s, want_s);
    }
    if (want_u8 ? strcmp(t->type_name, "U8") != 0 : msrc_float_size(t->t.dtype) == 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: tensor '%s' has type %s, expected %s", name, t->type_name,
                            want_u8 ? "U8" : "F32, F16 or BF16");
    *out = t;
    return IE_OK;
}

/* Next free table entry: a new tensor `name` backed by a fresh zeroed buffer
 * of `nbytes`, returned in *buf. The entry owns the buffer from here on. */
ie_status_t msrc_add_owned(ie_model_src_t *s, const char *name, ie_dtype_t dt, const char *type_name, int n_dims,
                           int64_t ne0, int64_t ne1, int64_t ne2, uint64_t nbytes, uint8_t **buf)
{
    src_tensor_t *t;
    if (s->n_tensors >= s->cap_tensors) return ie_error_set(IE_ERR_INTERNAL, "model: tensor table full");
    t = &s->tensors[s->n_tensors];
    if (!(t->name = strdup(name)) || !(t->owned = calloc(1, nbytes ? (size_t)nbytes : 1)))
        return ie_error_set(IE_ERR_NOMEM, "model: out of memory converting '%s' (%llu bytes)", name,
                            (unsigned long long)nbytes);
    s->n_tensors++;
    t->t = (ie_tensor_t){t->name, dt, n_dims, {ne0, ne1, ne2, 1}, t->owned, nbytes, IE_LAYOUT_ROWS, 0};
    t->type_name = type_name;
    *buf = t->owned;
    return IE_OK;
}

/* MXFP4 rows off, off+stride, ... of [E][R][nb] HF blocks -> ggml blocks [E][R/stride][nb]. */
/* Open the shards and build the canonical tensor table. */
static ie_status_t hf_tensors(ie_model_src_t *s, const char *dir)
{
    ie_status_t st = IE_OK;
    cJSON *index = NULL;
    char **names = NULL, path[PATH_CAP], canon[256];
    const msrc_arch_t *arch;
    int n_names = 0;
    int64_t total = 0, k = 0;

    if (!path_join(path, dir, "model.safetensors.index.json"))
        return ie_error_set(IE_ERR_INVAL, "model: path too long: '%.256s'", dir);
    if (access(path, F_OK) == 0 && (st = msrc_read_json(path, &index)) != IE_OK) goto cleanup;
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

    arch = msrc_arch_by_id(s->hp.arch_id);
    /* converted copies, views */
    total += (int64_t)(arch->hf_extra_per_layer + arch->views_per_layer) * s->hp.n_layer + arch->hf_extra +
             arch->views_extra;
    if (!(s->tensors = calloc(total ? total : 1, sizeof *s->tensors))) {
        st = ie_error_set(IE_ERR_NOMEM, "model: out of memory for %lld tensors", (long long)total);
        goto cleanup;
    }
    s->cap_tensors = total;
    for (int i = 0; i < s->n_shards; i++)
        for (int64_t j = 0; j < ie_safetensors_count(s->shards[i]); j++) {
            const ie_safetensors_tensor_t *ht = ie_safetensors_get(s->shards[i], j);
            src_tensor_t *t = &s->tensors[k];
            int mapped = translate_name(ht->name, 0, s->hp.arch_id, canon, sizeof canon);
            if (mapped && s->hp.tied_embeddings && strcmp(canon, "output.weight") == 0) continue;
            if (!(t->name = strdup(mapped ? canon : ht->name))) {
                st = ie_error_set(IE_ERR_NOMEM, "model: out of memory for tensor names");
                goto cleanup;
            }
            s->n_tensors = ++k;
            t->t = (ie_tensor_t){t->name,  ht->dtype,  ht->ndim,       {1, 1, 1, 1},
                                 ht->data, ht->nbytes, IE_LAYOUT_ROWS, 0};
            for (int d = 0; d < ht->ndim; d++) t->t.ne[d] = ht->shape[ht->ndim - 1 - d]; /* HF is outermost-first */
            t->type_name = ht->dtype_str;
        }
    st = msrc_sort_tensors(s);
    if (st == IE_OK && arch->hf_convert) st = arch->hf_convert(s);
    if (st == IE_OK && arch->split_fused) st = arch->split_fused(s);

cleanup:
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    cJSON_Delete(index);
    return st;
}

static ie_status_t open_hf(ie_model_src_t *s, const char *dir)
{
    static const hp_labels_t labels = {
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "head_dim",          "num_local_experts",   "num_experts_per_tok", "sliding_window"};
    ie_status_t st = IE_OK;
    cJSON *cfg = NULL;
    char path[PATH_CAP];

    s->kind = IE_SRC_HF_DIR;
    if (!path_join(path, dir, "config.json")) {
        st = ie_error_set(IE_ERR_INVAL, "model: path too long: '%.256s'", dir);
        goto cleanup;
    }
    if ((st = msrc_read_json(path, &cfg)) != IE_OK) goto cleanup;
    if ((st = hf_hparams(s, cfg, dir)) != IE_OK) goto cleanup;
    s->hf_cfg = cfg;
    st = hf_tensors(s, dir);
    s->hf_cfg = NULL; /* freed below */
    if (st != IE_OK) goto cleanup;
    if (path_join(path, dir, "tokenizer.json") && access(path, R_OK) == 0 && !(s->tokenizer_path = strdup(path))) {
        st = ie_error_set(IE_ERR_NOMEM, "model: out of memory");
        goto cleanup;
    }
    st = validate(s, &labels);

cleanup:
    cJSON_Delete(cfg);
    return st;
}

/* ---------------------------------------------------------------- IEBIN */

/* Tensor table borrowed from the ie_iebin_t (names copied, data mapped). */
static ie_status_t open_iebin(ie_model_src_t *s, const char *path)
{
    static const hp_labels_t labels = {"hparams.n_layer",       "hparams.n_head",        "hparams.n_head_kv",
                                       "hparams.head_dim",      "hparams.rope_dim",      "hparams.n_expert",
                                       "hparams.n_expert_used", "hparams.sliding_window"};
    ie_status_t st;
    int64_t n;
    char why[512];

    s->kind = IE_SRC_IEBIN;
    if ((st = ie_iebin_open(path, &s->iebin)) != IE_OK) {
        snprintf(why, sizeof why, "%s", ie_error_last());
        return ie_error_set(st, "model: '%s': %s", path, why);
    }
    s->hp = *ie_iebin_hparams(s->iebin);
    n = ie_iebin_n_tensors(s->iebin);
    if (!(s->tensors = calloc((size_t)(n ? n : 1), sizeof *s->tensors)))
        return ie_error_set(IE_ERR_NOMEM, "model: out of memory for %lld tensors", (long long)n);
    s->cap_tensors = n;
    for (int64_t i = 0; i < n; i++) {
        src_tensor_t *t = &s->tensors[i];
        t->t = *ie_iebin_tensor(s->iebin, i);
        if (!(t->name = strdup(t->t.name)))
            return ie_error_set(IE_ERR_NOMEM, "model: out of memory for tensor names");
        t->t.name = t->name;
        t->type_name = ie_dtype_name(t->t.dtype);
        s->n_tensors = i + 1;
    }
    if (!(s->tokenizer_path = strdup(ie_iebin_tokenizer_path(s->iebin))))
        return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    if ((st = msrc_sort_tensors(s)) != IE_OK) return st;
    return validate(s, &labels);
}

/* ---------------------------------------------------------------- in memory */

ie_status_t ie_model_src_new_mem(const ie_hparams_t *hp, const char *tokenizer_path, ie_model_src_t **out)
{
    ie_model_src_t *s;

    if (!out) return ie_error_set(IE_ERR_INVAL, "model: out is NULL");
    *out = NULL;
    if (!hp) return ie_error_set(IE_ERR_INVAL, "model: hyper-parameters are NULL");
    if (!(s = calloc(1, sizeof *s))) return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    s->kind = IE_SRC_MEM;
    s->hp = *hp;
    if (tokenizer_path && !(s->tokenizer_path = strdup(tokenizer_path))) {
        free(s);
        return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    }
    *out = s;
    return IE_OK;
}

/* Contract: `owned` is adopted only on success; on failure the caller
 * still owns it. Dense layouts must have exactly ie_tensor_bytes bytes per
 * ne[2]*ne[3] slice; BSR blobs are checked by their reader (IEBIN). */
ie_status_t ie_model_src_mem_add(ie_model_src_t *src, const ie_tensor_t *t, void *owned)
{
    src_tensor_t *e;
    uint64_t want = 0;
    int64_t rows = 1;
    size_t one;

    if (!src || !t || !t->name || !*t->name || !t->data)
        return ie_error_set(IE_ERR_INVAL, "model: mem_add: NULL source, tensor, name or data");
    if (src->kind != IE_SRC_MEM || src->mem_finished)
        return ie_error_set(IE_ERR_INVAL, "model: mem_add: '%.96s': source is not an unfinished in-memory source",
                            t->name);
    if (t->n_dims < 1 || t->n_dims > 4)
        return ie_error_set(IE_ERR_INVAL, "model: mem_add: '%.96s' has %d dimensions", t->name, t->n_dims);
    for (int d = 0; d < t->n_dims; d++)
        if (t->ne[d] < 1)
            return ie_error_set(IE_ERR_INVAL, "model: mem_add: '%.96s' has dimension %d = %lld", t->name, d,
                                (long long)t->ne[d]);
    if (t->layout != IE_LAYOUT_BSR) {
        one = ie_tensor_bytes(t->dtype, t->layout, t->group, t->ne[0], t->n_dims > 1 ? t->ne[1] : 1);
        for (int d = 2; d < t->n_dims; d++) rows *= t->ne[d];
        if (one == 0 || __builtin_mul_overflow((uint64_t)one, (uint64_t)rows, &want) || want != t->nbytes)
            return ie_error_set(IE_ERR_INVAL,
                                "model: mem_add: '%.96s' has %llu bytes, its shape as %s %s (group %d) "
                                "needs %llu",
                                t->name, (unsigned long long)t->nbytes, ie_dtype_name(t->dtype),
                                ie_layout_name(t->layout), t->group, (unsigned long long)want);
    }
    if (src->n_tensors == src->cap_tensors) {
        size_t cap = src->cap_tensors ? 2 * (size_t)src->cap_tensors : 64;
        src_tensor_t *p = realloc(src->tensors, cap * sizeof *p);
        if (!p) return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
        memset(p + src->cap_tensors, 0, (cap - (size_t)src->cap_tensors) * sizeof *p); /* destroy walks cap */
        src->tensors = p;
        src->cap_tensors = (int64_t)cap;
    }
    e = &src->tensors[src->n_tensors];
    if (!(e->name = strdup(t->name))) return ie_error_set(IE_ERR_NOMEM, "model: out of memory");
    e->t = *t;
    e->t.name = e->name;
    for (int d = t->n_dims; d < 4; d++) e->t.ne[d] = 1;
    e->type_name = ie_dtype_name(t->dtype);
    e->owned = owned;
    src->n_tensors++;
    return IE_OK;
}

ie_status_t ie_model_src_mem_finish(ie_model_src_t *src)
{
    static const hp_labels_t labels = {"n_layer",  "n_head",   "n_head_kv",     "head_dim",
                                       "rope_dim", "n_expert", "n_expert_used", "sliding_window"};
    const ie_hparams_t *hp;
    ie_status_t st;

    if (!src || src->kind != IE_SRC_MEM || src->mem_finished)
        return ie_error_set(IE_ERR_INVAL, "model: mem_finish: not an unfinished in-memory source");
    hp = &src->hp;
    if (hp->n_layer < 1 || hp->n_embd < 1 || hp->n_ff < 1 || hp->n_head < 1 || hp->n_head_kv < 1 ||
        hp->head_dim < 1 || hp->rope_dim < 1 || hp->n_ctx_train < 1 || hp->n_layer > HP_MAX ||
        hp->n_embd > HP_MAX || hp->n_ff > HP_MAX || hp->n_head > HP_MAX || hp->n_head_kv > HP_MAX ||
        hp->head_dim > HP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "model: hyper-parameters out of range (every size must be in [1, %d])",
                            HP_MAX);
    if ((st = msrc_sort_tensors(src)) != IE_OK) return st;
    if ((st = validate(src, &labels)) != IE_OK) return st;
    src->mem_finished = 1;
    return IE_OK;
}

int64_t ie_model_src_n_tensors(const ie_model_src_t *src) { return src ? src->n_sorted : 0; }

const ie_tensor_t *ie_model_src_tensor_at(const ie_model_src_t *src, int64_t i)
{
    return src && i >= 0 && i < src->n_sorted ? &src->tensors[i].t : NULL;
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
    if (ie_iebin_detect(path)) st = open_iebin(s, path);
    else st = S_ISDIR(sb.st_mode) ? open_hf(s, path) : open_gguf(s, path);
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
    for (int64_t i = 0; i < s->cap_tensors && s->tensors; i++) {
        free(s->tensors[i].name);
        free(s->tensors[i].owned);
    }
    free(s->tensors);
    for (int i = 0; i < s->n_shards; i++) ie_safetensors_destroy(&s->shards[i]);
    free(s->shards);
    ie_gguf_destroy(&s->gguf);
    ie_iebin_destroy(&s->iebin);
    free(s->tokenizer_path);
    free(s);
    *self_p = NULL;
}

ie_src_kind_t ie_model_src_kind(const ie_model_src_t *src) { return src ? src->kind : IE_SRC_GGUF; }

const ie_hparams_t *ie_model_src_hparams(const ie_model_src_t *src) { return src ? &src->hp : NULL; }

const ie_tensor_t *ie_model_src_tensor(const ie_model_src_t *src, const char *name)
{
    const src_tensor_t *t = msrc_find(src, name);
    return t ? &t->t : NULL;
}

const char *ie_model_src_tokenizer_path(const ie_model_src_t *src) { return src ? src->tokenizer_path : NULL; }

const struct ie_gguf *ie_model_src_gguf(const ie_model_src_t *src) { return src ? src->gguf : NULL; }

uint64_t ie_model_src_fingerprint(const ie_model_src_t *src)
{
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    /* field by field: the struct has padding and the free-text name */
    int64_t v[] = {hp->arch_id,       hp->n_layer,        hp->n_embd,           hp->n_ff,
                   hp->n_head,        hp->n_head_kv,      hp->head_dim,         hp->n_vocab,
                   hp->rope_dim,      hp->rope_layout,    hp->tied_embeddings,  hp->n_expert,
                   hp->n_expert_used, hp->sliding_window, hp->attn_bias,        hp->attn_sinks,
                   hp->qkv_bias,      hp->qk_norm,        hp->post_norms,       hp->ffn_gelu,
                   hp->rope_freqs,    hp->moe_norm_topk,  hp->moe_softmax_first};
    float f[] = {hp->rope_theta,       hp->rms_eps,        hp->swiglu_limit,   hp->swiglu_alpha,
                 hp->rope_yarn_factor, hp->attn_scale,     hp->attn_softcap,   hp->final_softcap,
                 hp->embd_scale,       hp->rope_theta_swa, hp->rope_freq_scale};
    XXH64_state_t *s = XXH64_createState();
    if (!s) return 0;
    XXH64_reset(s, 0x1e5eed);
    XXH64_update(s, hp->arch, strnlen(hp->arch, sizeof hp->arch));
    XXH64_update(s, v, sizeof v);
    XXH64_update(s, f, sizeof f);
    XXH64_update(s, hp->layer_swa, (size_t)(hp->n_layer > 0 && hp->n_layer <= IE_MAX_LAYERS ? hp->n_layer : 0));
    uint64_t h = XXH64_digest(s);
    XXH64_freeState(s);
    return h;
}

uint64_t ie_model_src_weights_hash(const ie_model_src_t *src, int release)
{
    XXH3_state_t *s = XXH3_createState();
    uint64_t h = 0;
    if (!s) return 0;
    XXH3_64bits_reset_withSeed(s, 0x3e1c4a);
    const int64_t n = ie_model_src_n_tensors(src);
    for (int64_t i = 0; i < n; i++) {
        const ie_tensor_t *t = ie_model_src_tensor_at(src, i);
        /* the metadata field by field (no padding), then the bytes */
        const int64_t meta[] = {t->dtype, t->n_dims, t->ne[0], t->ne[1],          t->ne[2],
                                t->ne[3], t->layout, t->group, (int64_t)t->nbytes};
        XXH3_64bits_update(s, t->name, strlen(t->name) + 1);
        XXH3_64bits_update(s, meta, sizeof meta);
        if (t->data && t->nbytes) XXH3_64bits_update(s, t->data, (size_t)t->nbytes);
        if (release && src->kind != IE_SRC_MEM && !src->tensors[i].owned)
            ie_file_release_pages(t->data, (size_t)t->nbytes);
    }
    h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h ? h : 1; /* 0 is "none" on the wire */
}
