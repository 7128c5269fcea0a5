/* iebin.c — IEBIN v1 reader and writer (ie_iebin.h, docs/FORMAT.md).
 *
 * Reader: model.ie.json is parsed with cJSON and checked field by field
 * (types, ranges, known dtype/layout/group combinations, sizes against the
 * shapes, alignment, bounds, overlaps, unique names, the content hash over
 * the tensor table, BSR blobs through ie_bsr_view, and each tensor's XXH3-64
 * unless IE_IEBIN_VERIFY=0) before anything is handed out. model.ie.bin is
 * mapped read-only; tensors point into the mapping.
 *
 * Writer: tensors are appended to model.ie.bin.tmp (64-byte aligned, 4 KiB
 * for tensors of 64 KiB or more) while their hashes are computed; finish()
 * writes model.ie.json.tmp, fsyncs everything and renames the tokenizer
 * files, the blob and finally the json into place (the json's presence is
 * what marks a directory as an IEBIN model).
 *
 * Functions that own resources leave through one cleanup label; pure checks
 * return at their first failure.
 */
#include "ie_iebin.h"

#include "ie_bsr.h"
#include "ie_gguf.h"
#include "ie_gguf_write.h"
#include "ie_mmap.h"
#include "ie_pack.h"
#include "ie_tokfile.h"

#include <cjson/cJSON.h>
#include <xxhash.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define IB_ALIGN 64u  /* every tensor                           */
#define IB_PAGE 4096u /* tensors of IB_PAGE_MIN bytes or more   */
#define IB_PAGE_MIN (64u << 10)
#define IB_JSON_MAX (64u << 20)     /* model.ie.json size limit               */
#define IB_HP_MAX (1 << 20)         /* bound on integer hyper-parameters      */
#define IB_NAME_MAX 255             /* tensor / tokenizer file name bytes     */
#define IB_U53 (((int64_t)1) << 53) /* JSON numbers are exact up to here      */
#define IB_DIM_MAX (((int64_t)1) << 32)
#define IB_MAX_TENSORS (1 << 20)

/* ---------------------------------------------------------------- tables */

static const struct {
    const char *name;
    ie_dtype_t dt;
} k_dtypes[] = {
    {"f32", IE_DTYPE_F32},
    {"f16", IE_DTYPE_F16},
    {"bf16", IE_DTYPE_BF16},
    {"q4_0", IE_DTYPE_Q4_0},
    {"q4_1", IE_DTYPE_Q4_1},
    {"q8_0", IE_DTYPE_Q8_0},
    {"mxfp4", IE_DTYPE_MXFP4},
    {"int8w", IE_DTYPE_I8W},
    {"int4w", IE_DTYPE_I4W},
    {"int4w_affine", IE_DTYPE_I4WA},
    /* ggml's k-quant family and relatives (ie_dtype_is_kquant), under
     * ie_dtype_name's spelling (the writer stores that name) */
    {"q5_0", IE_DTYPE_Q5_0},
    {"q5_1", IE_DTYPE_Q5_1},
    {"iq4_nl", IE_DTYPE_IQ4_NL},
    {"q2_K", IE_DTYPE_Q2_K},
    {"q3_K", IE_DTYPE_Q3_K},
    {"q4_K", IE_DTYPE_Q4_K},
    {"q5_K", IE_DTYPE_Q5_K},
    {"q6_K", IE_DTYPE_Q6_K},
    {"iq4_xs", IE_DTYPE_IQ4_XS},
    /* ggml's grid i-quants (ie_dtype_is_iquant): rows only */
    {"iq2_xxs", IE_DTYPE_IQ2_XXS},
    {"iq2_xs", IE_DTYPE_IQ2_XS},
    {"iq2_s", IE_DTYPE_IQ2_S},
    {"iq3_xxs", IE_DTYPE_IQ3_XXS},
    {"iq3_s", IE_DTYPE_IQ3_S},
    {"iq1_s", IE_DTYPE_IQ1_S},
    {"iq1_m", IE_DTYPE_IQ1_M},
};
#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])
#define DTYPE_LIST                                                                                                \
    "f32, f16, bf16, q4_0, q4_1, q8_0, mxfp4, int8w, int4w, int4w_affine, q5_0, q5_1, iq4_nl, q2_K, q3_K, q4_K, " \
    "q5_K, q6_K, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m"

static ie_dtype_t dtype_parse(const char *s)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(s, k_dtypes[i].name) == 0) return k_dtypes[i].dt;
    return IE_DTYPE_INVALID;
}

static int dtype_known(ie_dtype_t dt)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (k_dtypes[i].dt == dt) return 1;
    return 0;
}

static int layout_parse(const char *s, ie_layout_t *out)
{
    if (strcmp(s, "rows") == 0) *out = IE_LAYOUT_ROWS;
    else if (strcmp(s, "panel16") == 0) *out = IE_LAYOUT_PANEL16;
    else if (strcmp(s, "bsr") == 0) *out = IE_LAYOUT_BSR;
    else return 0;
    return 1;
}

/* Hyper-parameters as stored in "hparams" (besides name, rope_layout and
 * layer_swa). Integers in [lo, hi]; floats finite and > 0 (lo = 1) or >= 0
 * (lo = 0); bools true/false. */
enum { HP_INT, HP_FLOAT, HP_BOOL };
typedef struct hp_field {
    const char *key;
    int kind;
    size_t off;
    int64_t lo, hi;
    int opt; /* may be absent (0): the switches added after version 1's
                first files, which stay readable */
} hp_field_t;

#define HPI(f, lo, hi)                                   \
    {                                                    \
#f, HP_INT, offsetof(ie_hparams_t, f), lo, hi, 0 \
    }
#define HPF(f, lo)                                        \
    {                                                     \
#f, HP_FLOAT, offsetof(ie_hparams_t, f), lo, 0, 0 \
    }
#define HPB(f)                                          \
    {                                                   \
#f, HP_BOOL, offsetof(ie_hparams_t, f), 0, 1, 0 \
    }
#define HPO(f, kind, lo, hi)                           \
    {                                                  \
#f, kind, offsetof(ie_hparams_t, f), lo, hi, 1 \
    }
static const hp_field_t k_hp[] = {
    HPI(n_layer, 1, IE_MAX_LAYERS),
    HPI(n_embd, 1, IB_HP_MAX),
    HPI(n_ff, 1, IB_HP_MAX),
    HPI(n_head, 1, IB_HP_MAX),
    HPI(n_head_kv, 1, IB_HP_MAX),
    HPI(head_dim, 1, IB_HP_MAX),
    HPI(n_vocab, 1, IB_HP_MAX),
    HPI(n_ctx_train, 1, IB_HP_MAX),
    HPI(rope_dim, 1, IB_HP_MAX),
    HPF(rope_theta, 1),
    HPF(rms_eps, 1),
    HPB(tied_embeddings),
    HPI(n_expert, 0, IB_HP_MAX),
    HPI(n_expert_used, 0, IB_HP_MAX),
    HPI(sliding_window, 0, IB_HP_MAX),
    HPB(attn_bias),
    HPB(attn_sinks),
    HPF(swiglu_limit, 0),
    HPF(swiglu_alpha, 0),
    HPF(rope_yarn_factor, 0),
    HPI(rope_yarn_orig_ctx, 0, IB_HP_MAX),
    HPF(rope_yarn_beta_fast, 0),
    HPF(rope_yarn_beta_slow, 0),
    HPB(rope_yarn_truncate),
    HPF(rope_attn_factor, 0),
    HPO(qkv_bias, HP_BOOL, 0, 1),
    HPO(qk_norm, HP_BOOL, 0, 1),
    HPO(attn_scale, HP_FLOAT, 0, 0),
    HPO(attn_softcap, HP_FLOAT, 0, 0),
    HPO(final_softcap, HP_FLOAT, 0, 0),
    HPO(embd_scale, HP_FLOAT, 0, 0),
    HPO(post_norms, HP_BOOL, 0, 1),
    HPO(ffn_gelu, HP_BOOL, 0, 1),
    HPO(rope_theta_swa, HP_FLOAT, 0, 0),
    HPO(rope_freq_scale, HP_FLOAT, 0, 0),
    HPO(rope_freqs, HP_BOOL, 0, 1),
    HPO(moe_norm_topk, HP_BOOL, 0, 1),
    HPO(moe_softmax_first, HP_BOOL, 0, 1),
};
#define N_HP (sizeof k_hp / sizeof k_hp[0])

/* ---------------------------------------------------------------- shared checks */

/* A tensor name: 1..IB_NAME_MAX bytes, no control characters (the canonical
 * form separates fields with tabs and lines with newlines). */
static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > IB_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

/* A tokenizer file name: a plain name inside the model directory. */
static int file_name_ok(const char *s)
{
    return name_ok(s) && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 &&
           strcmp(s, IE_IEBIN_JSON) != 0 && strcmp(s, IE_IEBIN_BIN) != 0;
}

static void fmt_shape(char *buf, size_t cap, int n_dims, const int64_t *ne)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < n_dims && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "", (long long)ne[d]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* Check that (dtype, layout, group, shape) is a combination the format
 * allows and compute the tensor's byte size (*bytes = 0 for BSR, whose size
 * comes from its blob). Errors carry status `bad` and name the tensor. Dense
 * 3-D/4-D tensors are ne[2]*ne[3] matrices of ne[1] rows laid out one after
 * another (a PANEL16 slice pads its own last panel). */
static ie_status_t check_shape(ie_status_t bad, const char *name, ie_dtype_t dt, ie_layout_t lay, int group,
                               int n_dims, const int64_t *ne, uint64_t *bytes)
{
    char shp[128];
    size_t one;
    uint64_t slices = 1, total;

    *bytes = 0;
    fmt_shape(shp, sizeof shp, n_dims, ne);
    if (!dtype_known(dt)) return ie_error_set(bad, "iebin: tensor '%s': dtype %d is not storable", name, (int)dt);
    if (n_dims < 1 || n_dims > 4)
        return ie_error_set(bad, "iebin: tensor '%s': %d dimensions (must be 1..4)", name, n_dims);
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 1 || ne[d] > IB_DIM_MAX)
            return ie_error_set(bad, "iebin: tensor '%s': shape %s has a dimension outside [1, 2^32]", name, shp);
    /* ggml block types: whole blocks per row (a k-quant's 256) */
    if (!ie_dtype_is_intw(dt) && ne[0] % ie_dtype_block_elems(dt) != 0)
        return ie_error_set(bad, "iebin: tensor '%s': row length %lld is not a multiple of %s's block of %d", name,
                            (long long)ne[0], ie_dtype_name(dt), ie_dtype_block_elems(dt));
    switch (lay) {
    case IE_LAYOUT_ROWS:
        if (!ie_dtype_is_intw(dt) && group != 0)
            return ie_error_set(bad, "iebin: tensor '%s': group %d must be 0 for dtype %s", name, group,
                                ie_dtype_name(dt));
        break;
    case IE_LAYOUT_PANEL16:
        if (!ie_dtype_is_intw(dt) && !ie_dtype_is_kquant(dt))
            return ie_error_set(bad,
                                "iebin: tensor '%s': layout panel16 needs dtype int8w, int4w, int4w_affine or a "
                                "k-quant, not %s",
                                name, ie_dtype_name(dt));
        if (n_dims < 2)
            return ie_error_set(bad, "iebin: tensor '%s': layout panel16 needs at least 2 dimensions", name);
        /* a packed k-quant's group is its block size (ie_pack.h) */
        if (ie_dtype_is_kquant(dt) && group != ie_dtype_block_elems(dt))
            return ie_error_set(bad, "iebin: tensor '%s': panel16 %s needs group %d (its block size), not %d", name,
                                ie_dtype_name(dt), ie_dtype_block_elems(dt), group);
        if (ie_dtype_is_kquant(dt) && ie_pack_check(dt, group, ne[0]) != 0)
            return ie_error_set(bad, "iebin: tensor '%s': this build has no panel16 layout for %s rows of %lld",
                                name, ie_dtype_name(dt), (long long)ne[0]);
        break;
    case IE_LAYOUT_BSR:
        if (dt != IE_DTYPE_F32 || group != 0 || n_dims != 2)
            return ie_error_set(bad,
                                "iebin: tensor '%s': layout bsr needs dtype f32, group 0 and 2 dimensions "
                                "(have %s, group %d, shape %s)",
                                name, ie_dtype_name(dt), group, shp);
        return IE_OK;
    default: return ie_error_set(bad, "iebin: tensor '%s': unknown layout %d", name, (int)lay);
    }
    if (ie_dtype_is_intw(dt) && ie_pack_check(dt, group, ne[0]) != 0)
        return ie_error_set(bad,
                            "iebin: tensor '%s': group %d is not valid for %s rows of %lld (must be a positive "
                            "multiple of 32 dividing the row length)",
                            name, group, ie_dtype_name(dt), (long long)ne[0]);
    one = ie_tensor_bytes(dt, lay, group, ne[0], n_dims > 1 ? ne[1] : 1);
    if (one == 0)
        return ie_error_set(bad,
                            "iebin: tensor '%s': shape %s is not valid for %s %s (row length must be a multiple "
                            "of the block size)",
                            name, shp, ie_dtype_name(dt), ie_layout_name(lay));
    for (int d = 2; d < n_dims; d++) slices *= (uint64_t)ne[d]; /* < 2^64: two factors <= 2^32 */
    if (__builtin_mul_overflow((uint64_t)one, slices, &total) || total > (uint64_t)IB_U53)
        return ie_error_set(bad, "iebin: tensor '%s': shape %s is too large", name, shp);
    *bytes = total;
    return IE_OK;
}

/* BSR blob check through ie_bsr_view. */
static ie_status_t check_bsr(ie_status_t bad, const char *name, const void *data, uint64_t size, const int64_t *ne)
{
    char why[256] = "";
    ie_bsr_t v;
    if (((uintptr_t)data & (IB_ALIGN - 1)) != 0)
        return ie_error_set(bad, "iebin: tensor '%s': BSR blob is not 64-byte aligned in memory", name);
    if (ie_bsr_view(data, (size_t)size, ne[0], ne[1], &v, why, sizeof why) != 0)
        return ie_error_set(bad, "iebin: tensor '%s': bad BSR blob: %s", name, why);
    return IE_OK;
}

/* Sanity of the hyper-parameters on their own (the model source checks the
 * tensors against them). */
static ie_status_t hp_check(ie_status_t bad, const ie_hparams_t *hp)
{
    int n_swa = 0;
    for (size_t i = 0; i < N_HP; i++) {
        const hp_field_t *f = &k_hp[i];
        const void *p = (const char *)hp + f->off;
        if (f->kind == HP_FLOAT) {
            float v;
            memcpy(&v, p, sizeof v);
            if (!isfinite(v) || v < 0.0f || (f->lo && v == 0.0f))
                return ie_error_set(bad, "iebin: hparams: '%s' = %g must be finite and %s", f->key, (double)v,
                                    f->lo ? "positive" : "non-negative");
        } else {
            int v;
            memcpy(&v, p, sizeof v);
            if (v < f->lo || v > f->hi)
                return ie_error_set(bad, "iebin: hparams: '%s' = %d is out of range [%lld, %lld]", f->key, v,
                                    (long long)f->lo, (long long)f->hi);
        }
    }
    if (hp->rms_eps >= 1.0f)
        return ie_error_set(bad, "iebin: hparams: 'rms_eps' = %g must be below 1", (double)hp->rms_eps);
    if (hp->n_expert_used > hp->n_expert)
        return ie_error_set(bad, "iebin: hparams: 'n_expert_used' (%d) exceeds 'n_expert' (%d)", hp->n_expert_used,
                            hp->n_expert);
    if (hp->rope_layout != IE_ROPE_NORMAL && hp->rope_layout != IE_ROPE_NEOX)
        return ie_error_set(bad, "iebin: hparams: unknown rope_layout %d", (int)hp->rope_layout);
    if (!ie_arch_name(hp->arch_id)) return ie_error_set(bad, "iebin: unknown architecture id %d", (int)hp->arch_id);
    for (int l = 0; l < IE_MAX_LAYERS; l++) n_swa += hp->layer_swa[l] != 0 && l >= hp->n_layer;
    if (n_swa) return ie_error_set(bad, "iebin: hparams: layer_swa marks layers beyond n_layer (%d)", hp->n_layer);
    return IE_OK;
}

/* ---------------------------------------------------------------- canonical form */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf_t;

static int sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sb_printf(sbuf_t *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        size_t room = b->cap - b->n;
        int k;
        va_start(ap, fmt);
        k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return -1;
        if (b->p && (size_t)k < room) {
            b->n += (size_t)k;
            return 0;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n <= (size_t)k) {
            if (cap > SIZE_MAX / 2) return -1;
            cap *= 2;
        }
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q;
        b->cap = cap;
    }
}

/* One tensor-table line of the canonical form (docs/FORMAT.md §Hashes):
 * name TAB dtype TAB layout TAB group TAB ne0,ne1,.. TAB offset TAB size TAB xxh3 LF */
static int canon_line(sbuf_t *b, const char *name, ie_dtype_t dt, ie_layout_t lay, int group, int n_dims,
                      const int64_t *ne, uint64_t offset, uint64_t size, uint64_t xxh3)
{
    if (sb_printf(b, "%s\t%s\t%s\t%d\t", name, ie_dtype_name(dt), ie_layout_name(lay), group)) return -1;
    for (int d = 0; d < n_dims; d++)
        if (sb_printf(b, "%s%lld", d ? "," : "", (long long)ne[d])) return -1;
    return sb_printf(b, "\t%llu\t%llu\t%016llx\n", (unsigned long long)offset, (unsigned long long)size,
                     (unsigned long long)xxh3);
}

/* "xxh3-128:" + 32 lower-case hex digits (XXH128 canonical, big-endian). */
static void content_hash_str(const sbuf_t *b, char out[48])
{
    XXH128_hash_t h = XXH3_128bits(b->p ? b->p : "", b->n);
    snprintf(out, 48, "xxh3-128:%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

/* ---------------------------------------------------------------- JSON getters */

static const cJSON *obj_get(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* Integer member in [lo, hi] (hi <= 2^53). `where` names the object. */
static ie_status_t j_int(const cJSON *o, const char *key, const char *where, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *j = obj_get(o, key);
    double d;
    if (!j) return ie_error_set(IE_ERR_FORMAT, "iebin: %s: missing '%s'", where, key);
    d = j->valuedouble;
    if (!cJSON_IsNumber(j) || !(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return ie_error_set(IE_ERR_FORMAT, "iebin: %s: '%s' must be an integer in [%lld, %lld]", where, key,
                            (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return IE_OK;
}

static ie_status_t j_str(const cJSON *o, const char *key, const char *where, const char **out)
{
    const cJSON *j = obj_get(o, key);
    if (!j) return ie_error_set(IE_ERR_FORMAT, "iebin: %s: missing '%s'", where, key);
    if (!cJSON_IsString(j) || !j->valuestring)
        return ie_error_set(IE_ERR_FORMAT, "iebin: %s: '%s' must be a string", where, key);
    *out = j->valuestring;
    return IE_OK;
}

/* ---------------------------------------------------------------- reader */

typedef struct ib_entry {
    ie_tensor_t t; /* t.name points to name */
    char *name;
    uint64_t offset;
    uint64_t xxh3;
} ib_entry_t;

struct ie_iebin {
    ie_hparams_t hp;
    ib_entry_t *ent;
    int64_t n;
    const void *map; /* owned mapping (ie_iebin_open), or NULL */
    size_t map_len;
    const uint8_t *blob;
    size_t blob_len;
    char *tok_path;
    char content_hash[48];
};

static ie_status_t parse_hparams(const cJSON *root, ie_hparams_t *hp)
{
    const cJSON *h = obj_get(root, "hparams"), *swa, *e;
    const char *s;
    ie_status_t st;
    int64_t v;

    memset(hp, 0, sizeof *hp);
    if ((st = j_str(root, "arch", "model.ie.json", &s)) != IE_OK) return st;
    if (!ie_arch_from_name(s, &hp->arch_id))
        return ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json: 'arch' is '%.64s', which is no architecture", s);
    snprintf(hp->arch, sizeof hp->arch, "%s", s);
    if (!cJSON_IsObject(h)) return ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json: 'hparams' must be an object");
    if ((st = j_str(h, "name", "hparams", &s)) != IE_OK) return st;
    if (strlen(s) >= sizeof hp->name)
        return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: 'name' is longer than %zu bytes", sizeof hp->name - 1);
    snprintf(hp->name, sizeof hp->name, "%s", s);
    for (size_t i = 0; i < N_HP; i++) {
        const hp_field_t *f = &k_hp[i];
        const cJSON *j = obj_get(h, f->key);
        void *p = (char *)hp + f->off;
        if (f->opt && (!j || cJSON_IsNull(j))) continue; /* stays 0 */
        if (f->kind == HP_INT) {
            int iv;
            if ((st = j_int(h, f->key, "hparams", f->lo, f->hi, &v)) != IE_OK) return st;
            iv = (int)v;
            memcpy(p, &iv, sizeof iv);
        } else if (f->kind == HP_BOOL) {
            int bv;
            if (!j) return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: missing '%s'", f->key);
            if (!cJSON_IsBool(j))
                return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: '%s' must be true or false", f->key);
            bv = cJSON_IsTrue(j);
            memcpy(p, &bv, sizeof bv);
        } else {
            float fv;
            if (!j) return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: missing '%s'", f->key);
            if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || fabs(j->valuedouble) > 3e38)
                return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: '%s' must be a finite number", f->key);
            fv = (float)j->valuedouble;
            memcpy(p, &fv, sizeof fv);
        }
    }
    if ((st = j_str(h, "rope_layout", "hparams", &s)) != IE_OK) return st;
    if (strcmp(s, "normal") == 0) hp->rope_layout = IE_ROPE_NORMAL;
    else if (strcmp(s, "neox") == 0) hp->rope_layout = IE_ROPE_NEOX;
    else
        return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: 'rope_layout' is '%.32s' (expected 'normal' or 'neox')",
                            s);
    swa = obj_get(h, "layer_swa");
    if (!cJSON_IsArray(swa))
        return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: 'layer_swa' must be an array of layer indices");
    cJSON_ArrayForEach(e, swa)
    {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(d >= 0 && d < hp->n_layer) || d != floor(d))
            return ie_error_set(IE_ERR_FORMAT,
                                "iebin: hparams: 'layer_swa' entries must be layer indices in [0, %d)",
                                hp->n_layer);
        if (hp->layer_swa[(int)d])
            return ie_error_set(IE_ERR_FORMAT, "iebin: hparams: 'layer_swa' lists layer %d twice", (int)d);
        hp->layer_swa[(int)d] = 1;
    }
    return hp_check(IE_ERR_FORMAT, hp);
}

static ie_status_t parse_tokenizer(ie_iebin_t *m, const cJSON *root, const char *dir)
{
    const cJSON *t = obj_get(root, "tokenizer");
    const char *file, *kind;
    ie_status_t st;
    size_t n;

    if (!cJSON_IsObject(t))
        return ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json: 'tokenizer' must be an object");
    if ((st = j_str(t, "file", "tokenizer", &file)) != IE_OK) return st;
    if ((st = j_str(t, "kind", "tokenizer", &kind)) != IE_OK) return st;
    if (!file_name_ok(file))
        return ie_error_set(IE_ERR_FORMAT,
                            "iebin: tokenizer: 'file' '%.64s' must be a plain file name in the model "
                            "directory",
                            file);
    if (strcmp(kind, "gguf") != 0 && strcmp(kind, "hf-json") != 0 && strcmp(kind, "tiktoken") != 0)
        return ie_error_set(IE_ERR_FORMAT,
                            "iebin: tokenizer: 'kind' is '%.32s' (expected gguf, hf-json or tiktoken)", kind);
    n = (dir ? strlen(dir) + 1 : 0) + strlen(file) + 1;
    if (!(m->tok_path = malloc(n))) return ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
    snprintf(m->tok_path, n, "%s%s%s", dir ? dir : "", dir ? "/" : "", file);
    if (dir && access(m->tok_path, R_OK) != 0)
        return ie_error_set(IE_ERR_FORMAT,
                            "iebin: tokenizer file '%s' named by model.ie.json is missing or "
                            "unreadable: %s",
                            m->tok_path, strerror(errno));
    return IE_OK;
}

/* One entry of "tensors": fields, then dtype/layout/shape/size checks. */
static ie_status_t parse_tensor(ie_iebin_t *m, const cJSON *j, int64_t i)
{
    ib_entry_t *e = &m->ent[i];
    const cJSON *shape, *d, *q;
    const char *name, *s;
    char where[IB_NAME_MAX + 32], idx[48];
    ie_status_t st;
    int64_t v, size;
    uint64_t want;

    snprintf(idx, sizeof idx, "tensors[%lld]", (long long)i);
    if (!cJSON_IsObject(j)) return ie_error_set(IE_ERR_FORMAT, "iebin: %s must be an object", idx);
    if ((st = j_str(j, "name", idx, &name)) != IE_OK) return st;
    if (!name_ok(name))
        return ie_error_set(IE_ERR_FORMAT, "iebin: %s: name must be 1..%d bytes without control characters", idx,
                            IB_NAME_MAX);
    if (!(e->name = strdup(name))) return ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
    e->t.name = e->name;
    snprintf(where, sizeof where, "tensor '%s'", name);
    if ((st = j_str(j, "dtype", where, &s)) != IE_OK) return st;
    if ((e->t.dtype = dtype_parse(s)) == IE_DTYPE_INVALID)
        return ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s': unknown dtype '%.32s' (known: " DTYPE_LIST ")",
                            name, s);
    if ((st = j_str(j, "layout", where, &s)) != IE_OK) return st;
    if (!layout_parse(s, &e->t.layout))
        return ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s': unknown layout '%.32s' (known: rows, panel16, bsr)",
                            name, s);
    if ((st = j_int(j, "group", where, 0, IB_HP_MAX, &v)) != IE_OK) return st;
    e->t.group = (int)v;
    shape = obj_get(j, "shape");
    e->t.n_dims = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : 0;
    if (e->t.n_dims < 1 || e->t.n_dims > 4)
        return ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s': 'shape' must be an array of 1..4 dimensions", name);
    e->t.ne[0] = e->t.ne[1] = e->t.ne[2] = e->t.ne[3] = 1;
    v = 0;
    cJSON_ArrayForEach(d, shape)
    {
        double x = d->valuedouble;
        if (!cJSON_IsNumber(d) || !(x >= 1 && x <= (double)IB_DIM_MAX) || x != floor(x))
            return ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s': shape entries must be integers in [1, 2^32]",
                                name);
        e->t.ne[v++] = (int64_t)x;
    }
    if ((st = j_int(j, "offset", where, 0, IB_U53, &v)) != IE_OK) return st;
    e->offset = (uint64_t)v;
    if ((st = j_int(j, "size", where, 1, IB_U53, &size)) != IE_OK) return st;
    e->t.nbytes = (uint64_t)size;
    if ((st = j_str(j, "xxh3", where, &s)) != IE_OK) return st;
    if (strlen(s) != 16 || strspn(s, "0123456789abcdefABCDEF") != 16)
        return ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s': 'xxh3' must be 16 hex digits", name);
    e->xxh3 = strtoull(s, NULL, 16);
    q = obj_get(j, "quant");
    if (q && !cJSON_IsObject(q) && !cJSON_IsNull(q))
        return ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s': 'quant' must be an object", name);
    if ((st = check_shape(IE_ERR_FORMAT, name, e->t.dtype, e->t.layout, e->t.group, e->t.n_dims, e->t.ne, &want)) !=
        IE_OK)
        return st;
    if (e->t.layout != IE_LAYOUT_BSR && want != e->t.nbytes) {
        char shp[128];
        fmt_shape(shp, sizeof shp, e->t.n_dims, e->t.ne);
        return ie_error_set(IE_ERR_FORMAT,
                            "iebin: tensor '%s': size %llu does not match shape %s as %s %s "
                            "(group %d): expected %llu bytes",
                            name, (unsigned long long)e->t.nbytes, shp, ie_dtype_name(e->t.dtype),
                            ie_layout_name(e->t.layout), e->t.group, (unsigned long long)want);
    }
    return IE_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const ib_entry_t *const *)a)->name, (*(const ib_entry_t *const *)b)->name);
}

static int cmp_offset(const void *a, const void *b)
{
    uint64_t x = (*(const ib_entry_t *const *)a)->offset, y = (*(const ib_entry_t *const *)b)->offset;
    return (x > y) - (x < y);
}

/* Placement: inside the blob, aligned, unique names, no overlaps. */
static ie_status_t check_placement(const ie_iebin_t *m)
{
    ie_status_t st = IE_OK;
    ib_entry_t **by = NULL;

    for (int64_t i = 0; i < m->n; i++) {
        const ib_entry_t *e = &m->ent[i];
        uint64_t align = e->t.nbytes >= IB_PAGE_MIN ? IB_PAGE : IB_ALIGN;
        if (e->offset % align != 0)
            return ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s': offset %llu is not a multiple of %llu", e->name,
                                (unsigned long long)e->offset, (unsigned long long)align);
        if (e->offset > m->blob_len || e->t.nbytes > m->blob_len - e->offset)
            return ie_error_set(IE_ERR_FORMAT,
                                "iebin: tensor '%s': bytes [%llu, %llu) extend past the end of "
                                "model.ie.bin (%zu bytes)",
                                e->name, (unsigned long long)e->offset,
                                (unsigned long long)(e->offset + e->t.nbytes), m->blob_len);
    }
    if (!(by = malloc((size_t)(m->n ? m->n : 1) * sizeof *by)))
        return ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
    for (int64_t i = 0; i < m->n; i++) by[i] = &m->ent[i];
    qsort(by, (size_t)m->n, sizeof *by, cmp_name);
    for (int64_t i = 1; i < m->n; i++)
        if (strcmp(by[i - 1]->name, by[i]->name) == 0) {
            st = ie_error_set(IE_ERR_FORMAT, "iebin: tensor '%s' appears more than once", by[i]->name);
            goto cleanup;
        }
    qsort(by, (size_t)m->n, sizeof *by, cmp_offset);
    for (int64_t i = 1; i < m->n; i++)
        if (by[i - 1]->offset + by[i - 1]->t.nbytes > by[i]->offset) {
            st = ie_error_set(IE_ERR_FORMAT, "iebin: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                              by[i - 1]->name, (unsigned long long)by[i - 1]->offset,
                              (unsigned long long)(by[i - 1]->offset + by[i - 1]->t.nbytes), by[i]->name,
                              (unsigned long long)by[i]->offset,
                              (unsigned long long)(by[i]->offset + by[i]->t.nbytes));
            goto cleanup;
        }

cleanup:
    free(by);
    return st;
}

static ie_status_t check_content_hash(ie_iebin_t *m, const cJSON *root)
{
    ie_status_t st = IE_OK;
    sbuf_t b = {0};
    const char *have;

    if ((st = j_str(root, "content_hash", "model.ie.json", &have)) != IE_OK) return st;
    for (int64_t i = 0; i < m->n; i++) {
        const ib_entry_t *e = &m->ent[i];
        if (canon_line(&b, e->name, e->t.dtype, e->t.layout, e->t.group, e->t.n_dims, e->t.ne, e->offset,
                       e->t.nbytes, e->xxh3)) {
            st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
            goto cleanup;
        }
    }
    content_hash_str(&b, m->content_hash);
    if (strcasecmp(have, m->content_hash) != 0)
        st = ie_error_set(IE_ERR_FORMAT,
                          "iebin: content_hash '%.64s' does not match the tensor table (%s): "
                          "model.ie.json was edited or corrupted",
                          have, m->content_hash);

cleanup:
    free(b.p);
    return st;
}

/* IE_IEBIN_VERIFY=0 skips the per-tensor data hashes. */
static int verify_data(void)
{
    const char *v = getenv("IE_IEBIN_VERIFY");
    return !(v && strcmp(v, "0") == 0);
}

static ie_status_t parse(ie_iebin_t *m, const char *json, size_t json_len, const char *dir)
{
    ie_status_t st = IE_OK;
    cJSON *root = NULL;
    const cJSON *tensors, *conv, *j;
    const char *s;
    int64_t v;

    if (!(root = cJSON_ParseWithLength(json, json_len))) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json is not valid JSON");
        goto cleanup;
    }
    if (!cJSON_IsObject(root)) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json must hold a JSON object");
        goto cleanup;
    }
    if ((st = j_str(root, "format", "model.ie.json", &s)) != IE_OK) goto cleanup;
    if (strcmp(s, "iebin") != 0) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json: 'format' is '%.32s', expected 'iebin'", s);
        goto cleanup;
    }
    j = obj_get(root, "version");
    if (!cJSON_IsNumber(j)) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json: 'version' must be a number");
        goto cleanup;
    }
    if (j->valuedouble != IE_IEBIN_VERSION) {
        st = ie_error_set(IE_ERR_FORMAT,
                          "iebin: model.ie.json version %g is not supported (this build reads "
                          "version %d; convert the model again or update clocher)",
                          j->valuedouble, IE_IEBIN_VERSION);
        goto cleanup;
    }
    if ((st = parse_hparams(root, &m->hp)) != IE_OK) goto cleanup;
    if ((st = parse_tokenizer(m, root, dir)) != IE_OK) goto cleanup;
    conv = obj_get(root, "conversion");
    if (conv && !cJSON_IsObject(conv) && !cJSON_IsNull(conv)) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json: 'conversion' must be an object");
        goto cleanup;
    }
    tensors = obj_get(root, "tensors");
    if (!cJSON_IsArray(tensors)) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json: 'tensors' must be an array");
        goto cleanup;
    }
    m->n = cJSON_GetArraySize(tensors);
    if (m->n > IB_MAX_TENSORS) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: model.ie.json lists %lld tensors (at most %d)", (long long)m->n,
                          IB_MAX_TENSORS);
        goto cleanup;
    }
    if (!(m->ent = calloc((size_t)(m->n ? m->n : 1), sizeof *m->ent))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory for %lld tensors", (long long)m->n);
        goto cleanup;
    }
    v = 0;
    cJSON_ArrayForEach(j, tensors)
    {
        if ((st = parse_tensor(m, j, v)) != IE_OK) goto cleanup;
        v++;
    }
    if ((st = j_int(root, "blob_size", "model.ie.json", 0, IB_U53, &v)) != IE_OK) goto cleanup;
    if ((uint64_t)v != m->blob_len) {
        st = ie_error_set(IE_ERR_FORMAT,
                          "iebin: model.ie.bin is %zu bytes but model.ie.json says blob_size %lld "
                          "(truncated or mismatched blob)",
                          m->blob_len, (long long)v);
        goto cleanup;
    }
    if ((st = check_placement(m)) != IE_OK) goto cleanup;
    if ((st = check_content_hash(m, root)) != IE_OK) goto cleanup;
    for (int64_t i = 0; i < m->n; i++) {
        ib_entry_t *e = &m->ent[i];
        e->t.data = m->blob + e->offset;
        if (e->t.layout == IE_LAYOUT_BSR &&
            (st = check_bsr(IE_ERR_FORMAT, e->name, e->t.data, e->t.nbytes, e->t.ne)) != IE_OK)
            goto cleanup;
    }
    if (verify_data())
        for (int64_t i = 0; i < m->n; i++) {
            const ib_entry_t *e = &m->ent[i];
            XXH64_hash_t h = XXH3_64bits(e->t.data, (size_t)e->t.nbytes);
            if (h != e->xxh3) {
                st = ie_error_set(IE_ERR_FORMAT,
                                  "iebin: tensor '%s': data hash %016llx does not match xxh3 %016llx "
                                  "in model.ie.json (model.ie.bin corrupted?)",
                                  e->name, (unsigned long long)h, (unsigned long long)e->xxh3);
                goto cleanup;
            }
        }

cleanup:
    cJSON_Delete(root);
    return st;
}

ie_status_t ie_iebin_open_memory(const char *json, size_t json_len, const void *blob, size_t blob_len,
                                 const char *dir, ie_iebin_t **out)
{
    ie_status_t st;
    ie_iebin_t *m;

    if (!out) return ie_error_set(IE_ERR_INVAL, "iebin: out is NULL");
    *out = NULL;
    if ((!json && json_len) || (!blob && blob_len)) return ie_error_set(IE_ERR_INVAL, "iebin: NULL buffer");
    if (!(m = calloc(1, sizeof *m))) return ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
    m->blob = blob ? blob : (const uint8_t *)"";
    m->blob_len = blob_len;
    st = parse(m, json ? json : "", json_len, dir);
    if (st == IE_OK) *out = m;
    else ie_iebin_destroy(&m);
    return st;
}

/* Read a whole (bounded) text file. */
static ie_status_t read_text(const char *path, char **out, size_t *len_out)
{
    ie_status_t st = IE_OK;
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len = -1;

    *out = NULL;
    if (!f) return ie_error_set(IE_ERR_IO, "iebin: cannot open '%s': %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || (unsigned long)len > IB_JSON_MAX || fseek(f, 0, SEEK_SET) != 0) {
        st = ie_error_set(IE_ERR_IO, "iebin: cannot read '%s' (or larger than %u bytes)", path, IB_JSON_MAX);
        goto cleanup;
    }
    if (!(buf = malloc((size_t)len + 1))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory reading '%s'", path);
        goto cleanup;
    }
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        st = ie_error_set(IE_ERR_IO, "iebin: error reading '%s'", path);
        goto cleanup;
    }
    buf[len] = '\0';
    *out = buf;
    *len_out = (size_t)len;
    buf = NULL;

cleanup:
    free(buf);
    fclose(f);
    return st;
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* `path`'s last component is exactly `name`. */
static int is_named(const char *path, const char *name)
{
    size_t n = strlen(path), k = strlen(name);
    return has_suffix(path, name) && (n == k || path[n - k - 1] == '/');
}

/* The model directory of `path` (a directory, or .../model.ie.json). */
static char *model_dir(const char *path)
{
    struct stat sb;
    size_t n = strlen(path);
    char *d;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return strdup(path);
    n -= strlen(IE_IEBIN_JSON);
    if (n == 0) return strdup(".");
    if (!(d = malloc(n + 1))) return NULL;
    memcpy(d, path, n - 1); /* drop the '/' */
    d[n - 1] = '\0';
    if (n == 1) strcpy(d, "/");
    return d;
}

ie_status_t ie_iebin_open(const char *path, ie_iebin_t **out)
{
    ie_status_t st = IE_OK;
    char *dir = NULL, *json = NULL, *jpath = NULL, *bpath = NULL;
    size_t json_len = 0, n;
    const void *map = NULL;
    size_t map_len = 0;

    if (!out) return ie_error_set(IE_ERR_INVAL, "iebin: out is NULL");
    *out = NULL;
    if (!path) return ie_error_set(IE_ERR_INVAL, "iebin: path is NULL");
    if (!ie_iebin_detect(path))
        return ie_error_set(IE_ERR_IO, "iebin: '%s' is not an IEBIN model (no " IE_IEBIN_JSON ")", path);
    if (!(dir = model_dir(path))) return ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
    n = strlen(dir) + 32;
    if (!(jpath = malloc(n)) || !(bpath = malloc(n))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
        goto cleanup;
    }
    snprintf(jpath, n, "%s/%s", dir, IE_IEBIN_JSON);
    snprintf(bpath, n, "%s/%s", dir, IE_IEBIN_BIN);
    if ((st = read_text(jpath, &json, &json_len)) != IE_OK) goto cleanup;
    if ((st = ie_file_map("iebin", bpath, &map, &map_len)) != IE_OK) goto cleanup;
    if ((st = ie_iebin_open_memory(json, json_len, map, map_len, dir, out)) != IE_OK) goto cleanup;
    (*out)->map = map;
    (*out)->map_len = map_len;
    map = NULL;

cleanup:
    ie_file_unmap(map, map_len);
    free(json);
    free(jpath);
    free(bpath);
    free(dir);
    return st;
}

void ie_iebin_destroy(ie_iebin_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_iebin_t *m = *self_p;
    for (int64_t i = 0; m->ent && i < m->n; i++) free(m->ent[i].name);
    free(m->ent);
    free(m->tok_path);
    ie_file_unmap(m->map, m->map_len);
    free(m);
    *self_p = NULL;
}

int ie_iebin_detect(const char *path)
{
    struct stat sb;
    char buf[4096];
    if (!path || stat(path, &sb) != 0) return 0;
    if (S_ISDIR(sb.st_mode)) {
        if (snprintf(buf, sizeof buf, "%s/%s", path, IE_IEBIN_JSON) >= (int)sizeof buf) return 0;
        return access(buf, F_OK) == 0;
    }
    return is_named(path, IE_IEBIN_JSON);
}

const ie_hparams_t *ie_iebin_hparams(const ie_iebin_t *m) { return m ? &m->hp : NULL; }
int64_t ie_iebin_n_tensors(const ie_iebin_t *m) { return m ? m->n : 0; }
const ie_tensor_t *ie_iebin_tensor(const ie_iebin_t *m, int64_t i)
{
    return m && i >= 0 && i < m->n ? &m->ent[i].t : NULL;
}
const char *ie_iebin_tokenizer_path(const ie_iebin_t *m) { return m ? m->tok_path : NULL; }
const char *ie_iebin_content_hash(const ie_iebin_t *m) { return m ? m->content_hash : NULL; }

/* ---------------------------------------------------------------- writer */

#define WR_MAX_FILES 3 /* tokenizer + its companion file */

typedef struct wr_entry {
    char *name;
    ie_dtype_t dtype;
    ie_layout_t layout;
    int group, n_dims;
    int64_t ne[4];
    uint64_t offset, size, xxh3;
    cJSON *quant;
} wr_entry_t;

struct ie_iebin_writer {
    char *dir;
    char *bin_tmp, *json_tmp;
    int fd;
    int failed; /* a write failed: the blob is unusable */
    uint64_t pos;
    wr_entry_t *ent;
    size_t n, cap;
    char *tok_file;
    const char *tok_kind;
    int n_files; /* tokenizer files written under .tmp */
    char *tmp[WR_MAX_FILES], *fin[WR_MAX_FILES];
};

static char *path_of(const char *dir, const char *name, const char *suffix)
{
    size_t n = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s%s", dir, name, suffix);
    return p;
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t r = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static void writer_free(ie_iebin_writer_t *w, int remove_temps)
{
    if (w->fd >= 0) close(w->fd);
    if (remove_temps) {
        if (w->bin_tmp) unlink(w->bin_tmp);
        if (w->json_tmp) unlink(w->json_tmp);
        for (int i = 0; i < w->n_files; i++) unlink(w->tmp[i]);
    }
    for (int i = 0; i < w->n_files; i++) {
        free(w->tmp[i]);
        free(w->fin[i]);
    }
    for (size_t i = 0; i < w->n; i++) {
        free(w->ent[i].name);
        cJSON_Delete(w->ent[i].quant);
    }
    free(w->ent);
    free(w->tok_file);
    free(w->bin_tmp);
    free(w->json_tmp);
    free(w->dir);
    free(w);
}

ie_status_t ie_iebin_writer_open(const char *dir, ie_iebin_writer_t **out)
{
    ie_status_t st = IE_OK;
    ie_iebin_writer_t *w = NULL;

    if (!out) return ie_error_set(IE_ERR_INVAL, "iebin: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return ie_error_set(IE_ERR_INVAL, "iebin: output directory is NULL or empty");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ie_error_set(IE_ERR_IO, "iebin: cannot create directory '%s': %s", dir, strerror(errno));
    if (!(w = calloc(1, sizeof *w))) return ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
    w->fd = -1;
    if (!(w->dir = strdup(dir)) || !(w->bin_tmp = path_of(dir, IE_IEBIN_BIN, ".tmp")) ||
        !(w->json_tmp = path_of(dir, IE_IEBIN_JSON, ".tmp"))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
        goto cleanup;
    }
    if ((w->fd = open(w->bin_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        st = ie_error_set(IE_ERR_IO, "iebin: cannot create '%s': %s", w->bin_tmp, strerror(errno));
        goto cleanup;
    }
    *out = w;
    w = NULL;

cleanup:
    if (w) writer_free(w, 1);
    return st;
}

ie_status_t ie_iebin_writer_add(ie_iebin_writer_t *w, const ie_tensor_t *t, const char *quant_json)
{
    static const uint8_t zeros[IB_PAGE];
    ie_status_t st = IE_OK;
    cJSON *quant = NULL;
    uint64_t want, align, pad;
    int64_t ne[4] = {1, 1, 1, 1};
    wr_entry_t *e;

    if (!w || !t || !t->name) return ie_error_set(IE_ERR_INVAL, "iebin: writer_add: NULL writer, tensor or name");
    if (w->failed) return ie_error_set(IE_ERR_IO, "iebin: an earlier write to '%s' failed", w->bin_tmp);
    if (!name_ok(t->name))
        return ie_error_set(IE_ERR_INVAL,
                            "iebin: tensor name '%.64s' must be 1..%d bytes without control characters", t->name,
                            IB_NAME_MAX);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->ent[i].name, t->name) == 0)
            return ie_error_set(IE_ERR_INVAL, "iebin: tensor '%s' added twice", t->name);
    for (int d = 0; d < t->n_dims && d < 4; d++) ne[d] = t->ne[d];
    if ((st = check_shape(IE_ERR_INVAL, t->name, t->dtype, t->layout, t->group, t->n_dims, ne, &want)) != IE_OK)
        return st;
    if (!t->data || t->nbytes == 0 || t->nbytes > (uint64_t)IB_U53)
        return ie_error_set(IE_ERR_INVAL, "iebin: tensor '%s': no data", t->name);
    if (t->layout == IE_LAYOUT_BSR) {
        if ((st = check_bsr(IE_ERR_INVAL, t->name, t->data, t->nbytes, ne)) != IE_OK) return st;
    } else if (want != t->nbytes) {
        return ie_error_set(IE_ERR_INVAL, "iebin: tensor '%s': %llu bytes given, its shape as %s %s needs %llu",
                            t->name, (unsigned long long)t->nbytes, ie_dtype_name(t->dtype),
                            ie_layout_name(t->layout), (unsigned long long)want);
    }
    if (quant_json && (!(quant = cJSON_Parse(quant_json)) || !cJSON_IsObject(quant))) {
        st = ie_error_set(IE_ERR_INVAL, "iebin: tensor '%s': quant is not a JSON object", t->name);
        goto cleanup;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        wr_entry_t *p = realloc(w->ent, cap * sizeof *p);
        if (!p) {
            st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
            goto cleanup;
        }
        w->ent = p;
        w->cap = cap;
    }
    align = t->nbytes >= IB_PAGE_MIN ? IB_PAGE : IB_ALIGN;
    pad = (align - w->pos % align) % align;
    if (write_all(w->fd, zeros, (size_t)pad) || write_all(w->fd, t->data, (size_t)t->nbytes)) {
        w->failed = 1;
        st = ie_error_set(IE_ERR_IO, "iebin: cannot write '%s': %s", w->bin_tmp, strerror(errno));
        goto cleanup;
    }
    e = &w->ent[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(t->name))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
        goto cleanup;
    }
    e->dtype = t->dtype;
    e->layout = t->layout;
    e->group = t->group;
    e->n_dims = t->n_dims;
    memcpy(e->ne, ne, sizeof ne);
    e->offset = w->pos + pad;
    e->size = t->nbytes;
    e->xxh3 = XXH3_64bits(t->data, (size_t)t->nbytes);
    e->quant = quant;
    quant = NULL;
    w->pos = e->offset + e->size;
    w->n++;

cleanup:
    cJSON_Delete(quant);
    return st;
}

/* Copy file src to w->dir/<name>.tmp and register it for the rename. */
static ie_status_t copy_file(ie_iebin_writer_t *w, const char *src, const char *name)
{
    ie_status_t st = IE_OK;
    char buf[1 << 16];
    int in = -1, outfd = -1;
    ssize_t r;
    char *tmp = NULL, *fin = NULL;

    if (w->n_files >= WR_MAX_FILES) return ie_error_set(IE_ERR_INTERNAL, "iebin: too many tokenizer files");
    if (!(tmp = path_of(w->dir, name, ".tmp")) || !(fin = path_of(w->dir, name, ""))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
        goto cleanup;
    }
    if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0) {
        st = ie_error_set(IE_ERR_IO, "iebin: cannot open tokenizer '%s': %s", src, strerror(errno));
        goto cleanup;
    }
    if ((outfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        st = ie_error_set(IE_ERR_IO, "iebin: cannot create '%s': %s", tmp, strerror(errno));
        goto cleanup;
    }
    w->tmp[w->n_files] = tmp; /* registered: removed by abort from here on */
    w->fin[w->n_files++] = fin;
    tmp = fin = NULL;
    while ((r = read(in, buf, sizeof buf)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || write_all(outfd, buf, (size_t)r)) {
            st = ie_error_set(IE_ERR_IO, "iebin: cannot copy tokenizer '%s': %s", src, strerror(errno));
            goto cleanup;
        }
    }
    if (fsync(outfd) != 0)
        st = ie_error_set(IE_ERR_IO, "iebin: cannot sync the tokenizer copy: %s", strerror(errno));

cleanup:
    if (in >= 0) close(in);
    if (outfd >= 0 && close(outfd) != 0 && st == IE_OK)
        st = ie_error_set(IE_ERR_IO, "iebin: cannot write the tokenizer copy: %s", strerror(errno));
    free(tmp);
    free(fin);
    return st;
}

/* tokenizer.gguf from a GGUF: tokenizer.* and general.architecture. */
static ie_status_t write_tok_gguf(ie_iebin_writer_t *w, const char *src)
{
    ie_status_t st = IE_OK;
    ie_gguf_t *g = NULL;
    ie_gguf_writer_t *gw = NULL;
    char *tmp = NULL, *fin = NULL;
    int n_tok = 0;

    if ((st = ie_gguf_open(src, &g)) != IE_OK) goto cleanup;
    if ((st = ie_gguf_writer_new(&gw)) != IE_OK) goto cleanup;
    for (int64_t i = 0; i < ie_gguf_kv_count(g); i++) {
        ie_gguf_str_t k = ie_gguf_kv_key(g, i);
        int is_tok = k.len > 10 && memcmp(k.ptr, "tokenizer.", 10) == 0;
        int is_arch = k.len == 20 && memcmp(k.ptr, "general.architecture", 20) == 0;
        if (!is_tok && !is_arch) continue;
        n_tok += is_tok;
        if ((st = ie_gguf_writer_copy_kv(gw, g, i)) != IE_OK) goto cleanup;
    }
    if (n_tok == 0) {
        st = ie_error_set(IE_ERR_FORMAT, "iebin: GGUF '%s' has no tokenizer.* keys", src);
        goto cleanup;
    }
    if (!(tmp = path_of(w->dir, "tokenizer.gguf", ".tmp")) || !(fin = path_of(w->dir, "tokenizer.gguf", ""))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
        goto cleanup;
    }
    w->tmp[w->n_files] = tmp;
    w->fin[w->n_files++] = fin;
    tmp = fin = NULL;
    st = ie_gguf_writer_write(gw, w->tmp[w->n_files - 1]);

cleanup:
    free(tmp);
    free(fin);
    ie_gguf_writer_destroy(&gw);
    ie_gguf_destroy(&g);
    return st;
}

static int is_gguf_file(const char *path)
{
    char magic[4];
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

/* Copy `companion` from src's directory too, if it exists there. */
static ie_status_t copy_companion(ie_iebin_writer_t *w, const char *src, const char *companion)
{
    const char *slash = strrchr(src, '/');
    size_t dn = slash ? (size_t)(slash - src) : 1;
    char path[4096];
    if (snprintf(path, sizeof path, "%.*s/%s", (int)dn, slash ? src : ".", companion) >= (int)sizeof path)
        return IE_OK;
    if (access(path, R_OK) != 0) return IE_OK;
    return copy_file(w, path, companion);
}

ie_status_t ie_iebin_writer_set_tokenizer(ie_iebin_writer_t *w, const char *src_path)
{
    ie_status_t st = IE_OK;
    struct stat sb;
    char *src = NULL;
    const char *base;

    if (!w || !src_path) return ie_error_set(IE_ERR_INVAL, "iebin: set_tokenizer: NULL writer or path");
    if (w->tok_file) return ie_error_set(IE_ERR_INVAL, "iebin: the tokenizer is already set");
    if (stat(src_path, &sb) != 0)
        return ie_error_set(IE_ERR_IO, "iebin: cannot open tokenizer '%s': %s", src_path, strerror(errno));
    src = S_ISDIR(sb.st_mode) ? path_of(src_path, "tokenizer.json", "") : strdup(src_path);
    if (!src) return ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
    base = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
    if (is_gguf_file(src)) {
        w->tok_kind = "gguf";
        if (!(w->tok_file = strdup("tokenizer.gguf"))) {
            st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
            goto cleanup;
        }
        st = write_tok_gguf(w, src);
        goto cleanup;
    }
    if (!file_name_ok(base) || strcmp(base, "tokenizer_config.json") == 0 ||
        strcmp(base, IE_TIKTOKEN_SPECIALS) == 0) {
        st = ie_error_set(IE_ERR_INVAL, "iebin: tokenizer file name '%.64s' cannot be stored", base);
        goto cleanup;
    }
    w->tok_kind = has_suffix(base, ".tiktoken") ? "tiktoken" : "hf-json";
    if (!(w->tok_file = strdup(base))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
        goto cleanup;
    }
    if ((st = copy_file(w, src, base)) != IE_OK) goto cleanup;
    st = copy_companion(w, src,
                        strcmp(w->tok_kind, "tiktoken") == 0 ? IE_TIKTOKEN_SPECIALS : "tokenizer_config.json");

cleanup:
    if (st != IE_OK) {
        free(w->tok_file);
        w->tok_file = NULL;
    }
    free(src);
    return st;
}

static cJSON *hparams_json(const ie_hparams_t *hp)
{
    cJSON *h = cJSON_CreateObject(), *swa;
    int ok = h && cJSON_AddStringToObject(h, "name", hp->name) != NULL;
    for (size_t i = 0; i < N_HP && ok; i++) {
        const hp_field_t *f = &k_hp[i];
        const void *p = (const char *)hp + f->off;
        int iv;
        float fv;
        if (f->kind == HP_FLOAT) {
            memcpy(&fv, p, sizeof fv);
            ok = cJSON_AddNumberToObject(h, f->key, (double)fv) != NULL;
        } else {
            memcpy(&iv, p, sizeof iv);
            ok = (f->kind == HP_BOOL ? cJSON_AddBoolToObject(h, f->key, iv != 0)
                                     : cJSON_AddNumberToObject(h, f->key, iv)) != NULL;
        }
    }
    ok = ok && cJSON_AddStringToObject(h, "rope_layout", hp->rope_layout == IE_ROPE_NEOX ? "neox" : "normal");
    ok = ok && (swa = cJSON_AddArrayToObject(h, "layer_swa")) != NULL;
    for (int l = 0; l < hp->n_layer && l < IE_MAX_LAYERS && ok; l++)
        if (hp->layer_swa[l]) ok = cJSON_AddItemToArray(swa, cJSON_CreateNumber(l));
    if (ok) return h;
    cJSON_Delete(h);
    return NULL;
}

static cJSON *tensor_json(const wr_entry_t *e)
{
    cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray();
    char hex[24];
    int ok = o && shape;
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)e->xxh3);
    for (int d = 0; d < e->n_dims && ok; d++)
        ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->ne[d]));
    ok = ok && cJSON_AddStringToObject(o, "name", e->name) &&
         cJSON_AddStringToObject(o, "dtype", ie_dtype_name(e->dtype)) &&
         cJSON_AddStringToObject(o, "layout", ie_layout_name(e->layout)) &&
         cJSON_AddNumberToObject(o, "group", e->group);
    if (ok && cJSON_AddItemToObject(o, "shape", shape)) shape = NULL;
    else ok = 0;
    ok = ok && cJSON_AddNumberToObject(o, "offset", (double)e->offset) &&
         cJSON_AddNumberToObject(o, "size", (double)e->size) && cJSON_AddStringToObject(o, "xxh3", hex);
    if (ok && e->quant) ok = cJSON_AddItemToObject(o, "quant", cJSON_Duplicate(e->quant, 1));
    cJSON_Delete(shape);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* model.ie.json text for the tensors written so far. */
static ie_status_t build_json(const ie_iebin_writer_t *w, const ie_hparams_t *hp, const char *conversion_json,
                              char **text)
{
    ie_status_t st = IE_OK;
    cJSON *root = cJSON_CreateObject(), *tok = NULL, *arr = NULL, *item, *conv = NULL;
    sbuf_t b = {0};
    char hash[48];
    int ok = root != NULL;

    *text = NULL;
    if (conversion_json && (!(conv = cJSON_Parse(conversion_json)) || !cJSON_IsObject(conv))) {
        st = ie_error_set(IE_ERR_INVAL, "iebin: conversion record is not a JSON object");
        goto cleanup;
    }
    for (size_t i = 0; i < w->n && ok; i++) {
        const wr_entry_t *e = &w->ent[i];
        ok = !canon_line(&b, e->name, e->dtype, e->layout, e->group, e->n_dims, e->ne, e->offset, e->size, e->xxh3);
    }
    if (!ok) goto nomem;
    content_hash_str(&b, hash);
    ok = cJSON_AddStringToObject(root, "format", "iebin") &&
         cJSON_AddNumberToObject(root, "version", IE_IEBIN_VERSION) && ie_arch_name(hp->arch_id) &&
         cJSON_AddStringToObject(root, "arch", ie_arch_name(hp->arch_id));
    if (!ok || !(item = hparams_json(hp)) || !cJSON_AddItemToObject(root, "hparams", item)) goto nomem;
    if (!(tok = cJSON_AddObjectToObject(root, "tokenizer")) || !cJSON_AddStringToObject(tok, "file", w->tok_file) ||
        !cJSON_AddStringToObject(tok, "kind", w->tok_kind) || !(arr = cJSON_AddArrayToObject(root, "tensors")))
        goto nomem;
    for (size_t i = 0; i < w->n; i++)
        if (!(item = tensor_json(&w->ent[i])) || !cJSON_AddItemToArray(arr, item)) goto nomem;
    if (!cJSON_AddNumberToObject(root, "blob_size", (double)w->pos) ||
        !cJSON_AddStringToObject(root, "content_hash", hash))
        goto nomem;
    if (conv) {
        if (!cJSON_AddItemToObject(root, "conversion", conv)) goto nomem;
        conv = NULL;
    }
    if (!(*text = cJSON_Print(root))) goto nomem;
    goto cleanup;
nomem:
    st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory building model.ie.json");
cleanup:
    free(b.p);
    cJSON_Delete(conv);
    cJSON_Delete(root);
    return st;
}

ie_status_t ie_iebin_writer_finish(ie_iebin_writer_t **w_p, const ie_hparams_t *hp, const char *conversion_json)
{
    ie_status_t st = IE_OK;
    ie_iebin_writer_t *w;
    ie_hparams_t hpc;
    char *text = NULL, *jfin = NULL, *bfin = NULL;
    int fd = -1, dfd = -1;

    if (!w_p || !*w_p) return ie_error_set(IE_ERR_INVAL, "iebin: finish: NULL writer");
    w = *w_p;
    *w_p = NULL;
    if (!hp) {
        st = ie_error_set(IE_ERR_INVAL, "iebin: finish: hparams are NULL");
        goto cleanup;
    }
    if (!w->tok_file) {
        st = ie_error_set(IE_ERR_INVAL, "iebin: finish: no tokenizer set (ie_iebin_writer_set_tokenizer)");
        goto cleanup;
    }
    if (w->failed) {
        st = ie_error_set(IE_ERR_IO, "iebin: finish: an earlier write to '%s' failed", w->bin_tmp);
        goto cleanup;
    }
    hpc = *hp;
    if (hpc.n_layer >= 1 && hpc.n_layer < IE_MAX_LAYERS) /* entries beyond n_layer are not stored */
        memset(hpc.layer_swa + hpc.n_layer, 0, IE_MAX_LAYERS - (size_t)hpc.n_layer);
    if (strlen(hpc.name) >= sizeof hpc.name || (st = hp_check(IE_ERR_INVAL, &hpc)) != IE_OK) {
        if (st == IE_OK) st = ie_error_set(IE_ERR_INVAL, "iebin: hparams name is not terminated");
        goto cleanup;
    }
    if ((st = build_json(w, &hpc, conversion_json, &text)) != IE_OK) goto cleanup;
    if ((fd = open(w->json_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ||
        write_all(fd, text, strlen(text)) || write_all(fd, "\n", 1) || fsync(fd) != 0) {
        st = ie_error_set(IE_ERR_IO, "iebin: cannot write '%s': %s", w->json_tmp, strerror(errno));
        goto cleanup;
    }
    if (fsync(w->fd) != 0 || close(w->fd) != 0) {
        w->fd = -1;
        st = ie_error_set(IE_ERR_IO, "iebin: cannot write '%s': %s", w->bin_tmp, strerror(errno));
        goto cleanup;
    }
    w->fd = -1;
    if (!(jfin = path_of(w->dir, IE_IEBIN_JSON, "")) || !(bfin = path_of(w->dir, IE_IEBIN_BIN, ""))) {
        st = ie_error_set(IE_ERR_NOMEM, "iebin: out of memory");
        goto cleanup;
    }
    /* the json last: its presence marks a complete model */
    for (int i = 0; i < w->n_files; i++)
        if (rename(w->tmp[i], w->fin[i]) != 0) {
            st = ie_error_set(IE_ERR_IO, "iebin: cannot rename '%s': %s", w->tmp[i], strerror(errno));
            goto cleanup;
        }
    if (rename(w->bin_tmp, bfin) != 0 || rename(w->json_tmp, jfin) != 0) {
        st = ie_error_set(IE_ERR_IO, "iebin: cannot rename the model files in '%s': %s", w->dir, strerror(errno));
        goto cleanup;
    }
    if ((dfd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) (void)fsync(dfd);

cleanup:
    if (fd >= 0) close(fd);
    if (dfd >= 0) close(dfd);
    free(text);
    free(jfin);
    free(bfin);
    writer_free(w, st != IE_OK);
    return st;
}

void ie_iebin_writer_abort(ie_iebin_writer_t **w_p)
{
    if (!w_p || !*w_p) return;
    writer_free(*w_p, 1);
    *w_p = NULL;
}
