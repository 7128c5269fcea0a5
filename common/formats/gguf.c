/* gguf.c — GGUF v2/v3 reader over a read-only mapping.
 *
 * Everything is validated once, in ie_gguf_open*(): afterwards the getters
 * only index arrays built during parsing and read bytes that were already
 * bounds-checked. A file is untrusted input, so every count is compared
 * against the bytes that remain before anything is allocated for it, and all
 * size arithmetic is overflow-checked.
 *
 * Layout (all little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv
 *   n_kv  x { str key, u32 type, value }          str = u64 len + bytes
 *   n_tensors x { str name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
 *   padding to general.alignment, then the data section (offsets relative to it)
 *
 * Functions that own resources leave through one cleanup label; pure checks
 * return at their first failure, which reads more directly than a goto there.
 */
#include "ie_gguf.h"
#include "ie_mmap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian files by memcpy and needs a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY_LEN 65535u   /* the spec's limit for keys; we apply it to tensor names too */
#define GGUF_MIN_KV_BYTES 14u     /* u64 len + 1 key byte + u32 type + 1 value byte            */
#define GGUF_MIN_TENSOR_BYTES 33u /* u64 len + 1 name byte + u32 n_dims + u64 ne + u32 type + u64 off */
#define SHOWN 96                  /* at most this many bytes of a name are quoted in errors   */

/* printf arguments for an ie_gguf_str_t: "%.*s" */
#define STR_ARG(s) (int)((s).len < SHOWN ? (s).len : SHOWN), (s).ptr

/* ---------------------------------------------------------------- ggml types */

typedef struct ggml_type_info {
    const char *name; /* NULL: id unknown or removed from ggml */
    uint32_t blck;    /* elements per block                   */
    uint32_t size;    /* bytes per block                      */
    ie_dtype_t dtype; /* what we compute with, or INVALID     */
} ggml_type_info_t;

/* Ids 4, 5 (q4_2, q4_3), 31-33 (q4_0_4_4 ...) and 36-38 (iq4_nl_4_4 ...) were
 * removed from ggml and stay NULL here. Sizes are ggml's static_asserts
 * (q8_1 is 36 bytes: two f16 + 32 int8). */
static const ggml_type_info_t k_ggml[] = {
    [0] = {"f32", 1, 4, IE_DTYPE_F32},
    [1] = {"f16", 1, 2, IE_DTYPE_F16},
    [2] = {"q4_0", 32, 18, IE_DTYPE_Q4_0},
    [3] = {"q4_1", 32, 20, IE_DTYPE_Q4_1},
    [6] = {"q5_0", 32, 22, IE_DTYPE_Q5_0},
    [7] = {"q5_1", 32, 24, IE_DTYPE_Q5_1},
    [8] = {"q8_0", 32, 34, IE_DTYPE_Q8_0},
    [9] = {"q8_1", 32, 36, IE_DTYPE_INVALID}, /* activation-only in clocher */
    [10] = {"q2_K", 256, 84, IE_DTYPE_Q2_K},
    [11] = {"q3_K", 256, 110, IE_DTYPE_Q3_K},
    [12] = {"q4_K", 256, 144, IE_DTYPE_Q4_K},
    [13] = {"q5_K", 256, 176, IE_DTYPE_Q5_K},
    [14] = {"q6_K", 256, 210, IE_DTYPE_Q6_K},
    [15] = {"q8_K", 256, 292, IE_DTYPE_INVALID}, /* activation-only in clocher */
    [16] = {"iq2_xxs", 256, 66, IE_DTYPE_IQ2_XXS},
    [17] = {"iq2_xs", 256, 74, IE_DTYPE_IQ2_XS},
    [18] = {"iq3_xxs", 256, 98, IE_DTYPE_IQ3_XXS},
    [19] = {"iq1_s", 256, 50, IE_DTYPE_IQ1_S},
    [20] = {"iq4_nl", 32, 18, IE_DTYPE_IQ4_NL},
    [21] = {"iq3_s", 256, 110, IE_DTYPE_IQ3_S},
    [22] = {"iq2_s", 256, 82, IE_DTYPE_IQ2_S},
    [23] = {"iq4_xs", 256, 136, IE_DTYPE_IQ4_XS},
    [24] = {"i8", 1, 1, IE_DTYPE_INVALID},
    [25] = {"i16", 1, 2, IE_DTYPE_INVALID},
    [26] = {"i32", 1, 4, IE_DTYPE_INVALID},
    [27] = {"i64", 1, 8, IE_DTYPE_INVALID},
    [28] = {"f64", 1, 8, IE_DTYPE_INVALID},
    [29] = {"iq1_m", 256, 56, IE_DTYPE_IQ1_M},
    [30] = {"bf16", 1, 2, IE_DTYPE_BF16},
    [34] = {"tq1_0", 256, 54, IE_DTYPE_INVALID},
    [35] = {"tq2_0", 256, 66, IE_DTYPE_INVALID},
    [39] = {"mxfp4", 32, 17, IE_DTYPE_MXFP4}, /* { u8 e; u8 qs[16]; } */
};
#define N_GGML_TYPES (sizeof k_ggml / sizeof k_ggml[0])

static const ggml_type_info_t *ggml_info(uint32_t t)
{
    return t < N_GGML_TYPES && k_ggml[t].name ? &k_ggml[t] : NULL;
}

const char *ie_gguf_ggml_type_name(uint32_t ggml_type)
{
    const ggml_type_info_t *ti = ggml_info(ggml_type);
    return ti ? ti->name : "unknown";
}

int ie_gguf_ggml_type_block(uint32_t ggml_type, int64_t *block_elems, size_t *block_bytes)
{
    const ggml_type_info_t *ti = ggml_info(ggml_type);
    if (!ti) return 0;
    if (block_elems) *block_elems = ti->blck;
    if (block_bytes) *block_bytes = ti->size;
    return 1;
}

/* ---------------------------------------------------------------- value types */

static const char *const k_type_names[] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64",
};
/* Size of a scalar value; 0 for string/array. */
static const uint8_t k_type_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static int type_known(uint32_t t) { return t <= IE_GGUF_FLOAT64; }

static const char *type_name(uint32_t t) { return type_known(t) ? k_type_names[t] : "unknown"; }

/* ---------------------------------------------------------------- object */

typedef struct gguf_kv {
    ie_gguf_str_t key;
    ie_gguf_type_t type;
    ie_gguf_type_t elem_type; /* arrays only                                  */
    uint64_t n;               /* arrays only: element count                   */
    const uint8_t *val;       /* scalar bytes, string length prefix, or first
                               * array element                                */
    const uint8_t **strs;     /* string arrays: each element's length prefix  */
} gguf_kv_t;

/* A name and the index of what it names, sorted for bsearch. */
typedef struct name_ref {
    const char *ptr;
    uint64_t len;
    int64_t idx;
} name_ref_t;

struct ie_gguf {
    void *map; /* non-NULL when we own an mmap */
    size_t map_len;
    const uint8_t *base;
    size_t size;
    uint32_t version;
    uint64_t alignment;
    int64_t n_kv;
    gguf_kv_t *kv;
    name_ref_t *kv_index;
    int64_t n_tensors;
    ie_gguf_tensor_info_t *tensors;
    name_ref_t *tensor_index;
};

static int name_cmp(const void *pa, const void *pb)
{
    const name_ref_t *a = pa, *b = pb;
    uint64_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->ptr, b->ptr, n) : 0;
    if (c) return c;
    return (a->len > b->len) - (a->len < b->len);
}

static int64_t name_find(const name_ref_t *index, int64_t n, const char *name)
{
    if (!index || !name) return -1;
    name_ref_t key = {name, strlen(name), -1};
    const name_ref_t *hit = bsearch(&key, index, (size_t)n, sizeof *index, name_cmp);
    return hit ? hit->idx : -1;
}

/* Sort the index; report the first duplicate name, if any, through *dup. */
static void name_sort(name_ref_t *index, int64_t n, const name_ref_t **dup)
{
    *dup = NULL;
    if (n > 1) qsort(index, (size_t)n, sizeof *index, name_cmp);
    for (int64_t i = 1; i < n && !*dup; i++)
        if (name_cmp(&index[i - 1], &index[i]) == 0) *dup = &index[i];
}

/* ---------------------------------------------------------------- cursor */

typedef struct cur {
    const uint8_t *base;
    size_t size;
    size_t pos;
} cur_t;

static size_t cur_left(const cur_t *c) { return c->size - c->pos; }

/* Take n bytes, or fail with "gguf: truncated <what>". */
static ie_status_t cur_take(cur_t *c, uint64_t n, const uint8_t **p, const char *what)
{
    if (n > cur_left(c))
        return ie_error_set(IE_ERR_FORMAT,
                            "gguf: %s at offset %zu needs %llu bytes, only %zu left in file (%zu bytes)", what,
                            c->pos, (unsigned long long)n, cur_left(c), c->size);
    *p = c->base + c->pos;
    c->pos += (size_t)n;
    return IE_OK;
}

static ie_status_t cur_u32(cur_t *c, uint32_t *v, const char *what)
{
    const uint8_t *p = NULL;
    ie_status_t st = cur_take(c, 4, &p, what);
    if (st == IE_OK) memcpy(v, p, 4);
    return st;
}

static ie_status_t cur_u64(cur_t *c, uint64_t *v, const char *what)
{
    const uint8_t *p = NULL;
    ie_status_t st = cur_take(c, 8, &p, what);
    if (st == IE_OK) memcpy(v, p, 8);
    return st;
}

/* A string: u64 length then bytes; `p` receives the length prefix. */
static ie_status_t cur_str(cur_t *c, ie_gguf_str_t *s, const uint8_t **p, const char *what)
{
    size_t at = c->pos;
    uint64_t len;
    const uint8_t *bytes = NULL;
    ie_status_t st = cur_u64(c, &len, what);
    if (st == IE_OK) st = cur_take(c, len, &bytes, what);
    if (st != IE_OK) return st;
    if (p) *p = c->base + at;
    s->ptr = (const char *)bytes;
    s->len = len;
    return IE_OK;
}

static ie_gguf_str_t str_at(const uint8_t *prefix)
{
    ie_gguf_str_t s;
    memcpy(&s.len, prefix, 8);
    s.ptr = (const char *)prefix + 8;
    return s;
}

/* ---------------------------------------------------------------- parsing */

static ie_status_t check_bools(const uint8_t *p, uint64_t n, ie_gguf_str_t key)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return ie_error_set(IE_ERR_FORMAT, "gguf: key '%.*s' has bool value %u (must be 0 or 1)", STR_ARG(key),
                                p[i]);
    return IE_OK;
}

/* Parse the value of kv->key of kv->type at the cursor. */
static ie_status_t parse_value(cur_t *c, gguf_kv_t *kv)
{
    ie_status_t st = IE_OK;
    uint32_t et;
    ie_gguf_str_t s;

    switch (kv->type) {
    case IE_GGUF_STRING: return cur_str(c, &s, &kv->val, "string value");
    case IE_GGUF_ARRAY:
        if ((st = cur_u32(c, &et, "array element type")) != IE_OK) return st;
        if (et == IE_GGUF_ARRAY)
            return ie_error_set(IE_ERR_UNSUPPORTED, "gguf: key '%.*s' is an array of arrays (not supported)",
                                STR_ARG(kv->key));
        if (!type_known(et))
            return ie_error_set(IE_ERR_FORMAT, "gguf: key '%.*s' has unknown array element type %u",
                                STR_ARG(kv->key), et);
        kv->elem_type = (ie_gguf_type_t)et;
        if ((st = cur_u64(c, &kv->n, "array length")) != IE_OK) return st;
        kv->val = c->base + c->pos;
        if (et == IE_GGUF_STRING) {
            /* every element needs at least its 8-byte length: bound n before allocating */
            if (kv->n > cur_left(c) / 8)
                return ie_error_set(IE_ERR_FORMAT,
                                    "gguf: key '%.*s' claims %llu strings, more than fit in the %zu bytes left",
                                    STR_ARG(kv->key), (unsigned long long)kv->n, cur_left(c));
            kv->strs = malloc((kv->n ? kv->n : 1) * sizeof *kv->strs);
            if (!kv->strs) return ie_error_set(IE_ERR_NOMEM, "gguf: out of memory for string array");
            for (uint64_t i = 0; i < kv->n && st == IE_OK; i++)
                st = cur_str(c, &s, &kv->strs[i], "string array element");
            return st;
        }
        if (kv->n > cur_left(c) / k_type_size[et])
            return ie_error_set(IE_ERR_FORMAT,
                                "gguf: key '%.*s' array of %llu %s extends past end of file (%zu bytes)",
                                STR_ARG(kv->key), (unsigned long long)kv->n, type_name(et), c->size);
        if ((st = cur_take(c, kv->n * k_type_size[et], &kv->val, "array data")) != IE_OK) return st;
        return et == IE_GGUF_BOOL ? check_bools(kv->val, kv->n, kv->key) : IE_OK;
    default:
        if ((st = cur_take(c, k_type_size[kv->type], &kv->val, "value")) != IE_OK) return st;
        return kv->type == IE_GGUF_BOOL ? check_bools(kv->val, 1, kv->key) : IE_OK;
    }
}

static ie_status_t parse_kvs(ie_gguf_t *g, cur_t *c)
{
    ie_status_t st = IE_OK;
    const name_ref_t *dup;

    for (int64_t i = 0; i < g->n_kv; i++) {
        gguf_kv_t *kv = &g->kv[i];
        uint32_t type;
        if ((st = cur_str(c, &kv->key, NULL, "metadata key")) != IE_OK) return st;
        if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY_LEN)
            return ie_error_set(IE_ERR_FORMAT, "gguf: metadata key %lld has length %llu (must be 1..%u)",
                                (long long)i, (unsigned long long)kv->key.len, GGUF_MAX_KEY_LEN);
        if ((st = cur_u32(c, &type, "value type")) != IE_OK) return st;
        if (!type_known(type))
            return ie_error_set(IE_ERR_FORMAT, "gguf: key '%.*s' has unknown value type %u", STR_ARG(kv->key),
                                type);
        kv->type = (ie_gguf_type_t)type;
        if ((st = parse_value(c, kv)) != IE_OK) return st;
        g->kv_index[i] = (name_ref_t){kv->key.ptr, kv->key.len, i};
    }
    name_sort(g->kv_index, g->n_kv, &dup);
    if (dup)
        return ie_error_set(IE_ERR_FORMAT, "gguf: duplicate key '%.*s'", (int)(dup->len < SHOWN ? dup->len : SHOWN),
                            dup->ptr);
    return IE_OK;
}

/* general.alignment: optional, an integer power of two. */
static ie_status_t read_alignment(ie_gguf_t *g)
{
    int64_t a;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (ie_gguf_find_key(g, "general.alignment") < 0) return IE_OK;
    if (ie_gguf_get_i64(g, "general.alignment", &a) != IE_OK)
        return ie_error_set(IE_ERR_FORMAT, "gguf: general.alignment must be a non-negative integer");
    if (a <= 0 || (a & (a - 1)) != 0)
        return ie_error_set(IE_ERR_FORMAT, "gguf: general.alignment %lld is not a nonzero power of two",
                            (long long)a);
    g->alignment = (uint64_t)a;
    return IE_OK;
}

/* Read one tensor info record and check it on its own (not yet its data). */
static ie_status_t parse_tensor(cur_t *c, int64_t i, ie_gguf_tensor_info_t *t)
{
    ie_status_t st;
    uint64_t dims[4] = {1, 1, 1, 1}, n_elem = 1;
    const ggml_type_info_t *ti;

    if ((st = cur_str(c, &t->name, NULL, "tensor name")) != IE_OK) return st;
    if (t->name.len == 0 || t->name.len > GGUF_MAX_KEY_LEN)
        return ie_error_set(IE_ERR_FORMAT, "gguf: tensor %lld name has length %llu (must be 1..%u)", (long long)i,
                            (unsigned long long)t->name.len, GGUF_MAX_KEY_LEN);
    if ((st = cur_u32(c, &t->n_dims, "tensor n_dims")) != IE_OK) return st;
    if (t->n_dims < 1 || t->n_dims > 4)
        return ie_error_set(IE_ERR_FORMAT, "gguf: tensor '%.*s' has n_dims %u (must be 1..4)", STR_ARG(t->name),
                            t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((st = cur_u64(c, &dims[d], "tensor dimension")) != IE_OK) return st;
    if ((st = cur_u32(c, &t->ggml_type, "tensor type")) != IE_OK) return st;
    if ((st = cur_u64(c, &t->offset, "tensor offset")) != IE_OK) return st;

    for (uint32_t d = 0; d < 4; d++) {
        if (dims[d] == 0 || dims[d] > (uint64_t)INT64_MAX)
            return ie_error_set(IE_ERR_FORMAT, "gguf: tensor '%.*s' dimension %u is %lld (must be > 0)",
                                STR_ARG(t->name), d, (long long)dims[d]);
        if (__builtin_mul_overflow(n_elem, dims[d], &n_elem) || n_elem > (uint64_t)INT64_MAX)
            return ie_error_set(IE_ERR_FORMAT, "gguf: tensor '%.*s' element count overflows int64",
                                STR_ARG(t->name));
        t->ne[d] = (int64_t)dims[d];
    }
    ti = ggml_info(t->ggml_type);
    if (!ti)
        return ie_error_set(IE_ERR_FORMAT, "gguf: tensor '%.*s' has unknown ggml type %u", STR_ARG(t->name),
                            t->ggml_type);
    if (dims[0] % ti->blck != 0)
        return ie_error_set(IE_ERR_FORMAT,
                            "gguf: tensor '%.*s' row length %llu is not a multiple of the %s block size %u",
                            STR_ARG(t->name), (unsigned long long)dims[0], ti->name, ti->blck);
    if (__builtin_mul_overflow(n_elem / ti->blck, (uint64_t)ti->size, &t->nbytes))
        return ie_error_set(IE_ERR_FORMAT, "gguf: tensor '%.*s' byte size overflows", STR_ARG(t->name));
    t->dtype = ti->dtype;
    return IE_OK;
}

static ie_status_t parse_tensors(ie_gguf_t *g, cur_t *c)
{
    ie_status_t st;
    const name_ref_t *dup;
    uint64_t data_start, data_size;

    for (int64_t i = 0; i < g->n_tensors; i++) {
        if ((st = parse_tensor(c, i, &g->tensors[i])) != IE_OK) return st;
        g->tensor_index[i] = (name_ref_t){g->tensors[i].name.ptr, g->tensors[i].name.len, i};
    }
    name_sort(g->tensor_index, g->n_tensors, &dup);
    if (dup)
        return ie_error_set(IE_ERR_FORMAT, "gguf: duplicate tensor name '%.*s'",
                            (int)(dup->len < SHOWN ? dup->len : SHOWN), dup->ptr);

    /* pos <= size < 2^63 and alignment <= 2^63, so this cannot wrap */
    data_start = ((uint64_t)c->pos + g->alignment - 1) & ~(g->alignment - 1);
    data_size = data_start <= c->size ? c->size - data_start : 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        ie_gguf_tensor_info_t *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return ie_error_set(IE_ERR_FORMAT,
                                "gguf: tensor '%.*s' offset %llu is not a multiple of the alignment %llu",
                                STR_ARG(t->name), (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return ie_error_set(
                IE_ERR_FORMAT,
                "gguf: tensor '%.*s' data [offset %llu, size %llu] extends past end of file (%zu bytes)",
                STR_ARG(t->name), (unsigned long long)(data_start + t->offset), (unsigned long long)t->nbytes,
                c->size);
        t->data = g->base + data_start + t->offset;
    }
    return IE_OK;
}

/* Parse a whole image. On failure *out is NULL and nothing is left allocated
 * (the caller still owns the bytes). */
static ie_status_t gguf_parse(const uint8_t *base, size_t size, ie_gguf_t **out)
{
    ie_status_t st = IE_OK;
    ie_gguf_t *g = NULL;
    cur_t c = {base, size, 0};
    uint64_t n_tensors, n_kv, left;
    const uint8_t *magic;

    *out = NULL;
    if (size < 4 || memcmp(base, "GGUF", 4) != 0) {
        st = ie_error_set(IE_ERR_FORMAT, "gguf: not a GGUF file (bad magic)");
        goto cleanup;
    }
    if ((st = cur_take(&c, 4, &magic, "header")) != IE_OK) goto cleanup;
    g = calloc(1, sizeof *g);
    if (!g) {
        st = ie_error_set(IE_ERR_NOMEM, "gguf: out of memory");
        goto cleanup;
    }
    g->base = base;
    g->size = size;
    if ((st = cur_u32(&c, &g->version, "header")) != IE_OK) goto cleanup;
    if (g->version == 1) {
        st = ie_error_set(IE_ERR_UNSUPPORTED,
                          "gguf: version 1 is not supported (obsolete format; re-convert the model)");
        goto cleanup;
    }
    if (g->version != 2 && g->version != 3) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "gguf: version %u is not supported (expected 2 or 3)%s", g->version,
                          g->version && (g->version & 0xffff) == 0 ? "; big-endian files are not supported" : "");
        goto cleanup;
    }
    if ((st = cur_u64(&c, &n_tensors, "header")) != IE_OK) goto cleanup;
    if ((st = cur_u64(&c, &n_kv, "header")) != IE_OK) goto cleanup;
    left = cur_left(&c);
    if (n_kv > left / GGUF_MIN_KV_BYTES || n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        n_kv * GGUF_MIN_KV_BYTES + n_tensors * GGUF_MIN_TENSOR_BYTES > left) {
        st = ie_error_set(IE_ERR_FORMAT,
                          "gguf: header claims %llu metadata entries and %llu tensors, more than fit in %zu bytes",
                          (unsigned long long)n_kv, (unsigned long long)n_tensors, size);
        goto cleanup;
    }
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->kv_index = calloc(n_kv ? n_kv : 1, sizeof *g->kv_index);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->tensor_index = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensor_index);
    if (!g->kv || !g->kv_index || !g->tensors || !g->tensor_index) {
        st = ie_error_set(IE_ERR_NOMEM, "gguf: out of memory for %llu keys / %llu tensors",
                          (unsigned long long)n_kv, (unsigned long long)n_tensors);
        goto cleanup;
    }
    if ((st = parse_kvs(g, &c)) != IE_OK) goto cleanup;
    if ((st = read_alignment(g)) != IE_OK) goto cleanup;
    if ((st = parse_tensors(g, &c)) != IE_OK) goto cleanup;
    *out = g;
    g = NULL;

cleanup:
    ie_gguf_destroy(&g);
    return st;
}

/* ---------------------------------------------------------------- open / destroy */

ie_status_t ie_gguf_open_memory(const void *buf, size_t len, ie_gguf_t **out)
{
    if (!out) return ie_error_set(IE_ERR_INVAL, "gguf: out is NULL");
    *out = NULL;
    if (!buf && len) return ie_error_set(IE_ERR_INVAL, "gguf: buffer is NULL");
    return gguf_parse(buf ? buf : "", len, out);
}

ie_status_t ie_gguf_open(const char *path, ie_gguf_t **out)
{
    const void *map = NULL;
    size_t len = 0;
    ie_status_t st;

    if (!out) return ie_error_set(IE_ERR_INVAL, "gguf: out is NULL");
    *out = NULL;
    if ((st = ie_file_map("gguf", path, &map, &len)) != IE_OK) return st;
    if ((st = gguf_parse(map ? map : "", len, out)) != IE_OK) {
        ie_file_unmap(map, len);
        return st;
    }
    (*out)->map = (void *)map;
    (*out)->map_len = len;
    return IE_OK;
}

void ie_gguf_destroy(ie_gguf_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_gguf_t *g = *self_p;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv);
    free(g->kv_index);
    free(g->tensors);
    free(g->tensor_index);
    ie_file_unmap(g->map, g->map_len);
    free(g);
    *self_p = NULL;
}

/* ---------------------------------------------------------------- getters */

uint32_t ie_gguf_version(const ie_gguf_t *g) { return g ? g->version : 0; }
size_t ie_gguf_alignment(const ie_gguf_t *g) { return g ? (size_t)g->alignment : 0; }
int64_t ie_gguf_kv_count(const ie_gguf_t *g) { return g ? g->n_kv : 0; }
int64_t ie_gguf_tensor_count(const ie_gguf_t *g) { return g ? g->n_tensors : 0; }

int64_t ie_gguf_find_key(const ie_gguf_t *g, const char *key)
{
    return g ? name_find(g->kv_index, g->n_kv, key) : -1;
}

ie_gguf_str_t ie_gguf_kv_key(const ie_gguf_t *g, int64_t i)
{
    ie_gguf_str_t none = {NULL, 0};
    return g && i >= 0 && i < g->n_kv ? g->kv[i].key : none;
}

ie_gguf_type_t ie_gguf_kv_type(const ie_gguf_t *g, int64_t i)
{
    return g && i >= 0 && i < g->n_kv ? g->kv[i].type : (ie_gguf_type_t)-1;
}

const ie_gguf_tensor_info_t *ie_gguf_tensor(const ie_gguf_t *g, int64_t i)
{
    return g && i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const ie_gguf_tensor_info_t *ie_gguf_find_tensor(const ie_gguf_t *g, const char *name)
{
    int64_t i = g ? name_find(g->tensor_index, g->n_tensors, name) : -1;
    return i >= 0 ? &g->tensors[i] : NULL;
}

/* The kv for `key`, or NULL with "gguf: key 'x' not found" recorded. */
static const gguf_kv_t *kv_get(const ie_gguf_t *g, const char *key)
{
    int64_t i = ie_gguf_find_key(g, key);
    if (i < 0) ie_error_set(IE_ERR_FORMAT, "gguf: key '%s' not found", key ? key : "(null)");
    return i >= 0 ? &g->kv[i] : NULL;
}

static ie_status_t type_error(const char *key, ie_gguf_type_t have, const char *want)
{
    return ie_error_set(IE_ERR_FORMAT, "gguf: key '%s' is %s, expected %s", key, type_name(have), want);
}

/* Integer at p of type t into *out: 1 ok, 0 not an integer type, -1 too big. */
static int scalar_i64(ie_gguf_type_t t, const uint8_t *p, int64_t *out)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    if (!type_known(t) || !k_type_size[t]) return 0;
    memcpy(&v, p, k_type_size[t]);
    switch (t) {
    case IE_GGUF_UINT8: *out = v.u8; return 1;
    case IE_GGUF_INT8: *out = v.i8; return 1;
    case IE_GGUF_UINT16: *out = v.u16; return 1;
    case IE_GGUF_INT16: *out = v.i16; return 1;
    case IE_GGUF_UINT32: *out = v.u32; return 1;
    case IE_GGUF_INT32: *out = v.i32; return 1;
    case IE_GGUF_INT64: *out = v.i64; return 1;
    case IE_GGUF_UINT64:
        if (v.u64 > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v.u64;
        return 1;
    default: return 0;
    }
}

static int scalar_f32(ie_gguf_type_t t, const uint8_t *p, float *out)
{
    if (t == IE_GGUF_FLOAT32) {
        memcpy(out, p, 4);
        return 1;
    }
    if (t == IE_GGUF_FLOAT64) {
        double d;
        memcpy(&d, p, 8);
        *out = (float)d;
        return 1;
    }
    return 0;
}

ie_status_t ie_gguf_get_i64(const ie_gguf_t *g, const char *key, int64_t *out)
{
    const gguf_kv_t *kv = kv_get(g, key);
    int64_t v;
    int r;
    if (!kv) return IE_ERR_FORMAT;
    r = kv->type == IE_GGUF_ARRAY ? 0 : scalar_i64(kv->type, kv->val, &v);
    if (r == 0) return type_error(key, kv->type, "an integer");
    if (r < 0) return ie_error_set(IE_ERR_FORMAT, "gguf: key '%s' value does not fit in int64", key);
    if (out) *out = v;
    return IE_OK;
}

ie_status_t ie_gguf_get_f32(const ie_gguf_t *g, const char *key, float *out)
{
    const gguf_kv_t *kv = kv_get(g, key);
    float v;
    if (!kv) return IE_ERR_FORMAT;
    if (!scalar_f32(kv->type, kv->val, &v)) return type_error(key, kv->type, "a float");
    if (out) *out = v;
    return IE_OK;
}

ie_status_t ie_gguf_get_bool(const ie_gguf_t *g, const char *key, int *out)
{
    const gguf_kv_t *kv = kv_get(g, key);
    if (!kv) return IE_ERR_FORMAT;
    if (kv->type != IE_GGUF_BOOL) return type_error(key, kv->type, "a bool");
    if (out) *out = kv->val[0];
    return IE_OK;
}

ie_status_t ie_gguf_get_str(const ie_gguf_t *g, const char *key, ie_gguf_str_t *out)
{
    const gguf_kv_t *kv = kv_get(g, key);
    if (!kv) return IE_ERR_FORMAT;
    if (kv->type != IE_GGUF_STRING) return type_error(key, kv->type, "a string");
    if (out) *out = str_at(kv->val);
    return IE_OK;
}

ie_status_t ie_gguf_get_arr(const ie_gguf_t *g, const char *key, ie_gguf_type_t *elem_type, uint64_t *len)
{
    const gguf_kv_t *kv = kv_get(g, key);
    if (!kv) return IE_ERR_FORMAT;
    if (kv->type != IE_GGUF_ARRAY) return type_error(key, kv->type, "an array");
    if (elem_type) *elem_type = kv->elem_type;
    if (len) *len = kv->n;
    return IE_OK;
}

/* The array kv for key with element index i checked; NULL with the error set. */
static const gguf_kv_t *arr_elem(const ie_gguf_t *g, const char *key, uint64_t i, ie_status_t *st)
{
    const gguf_kv_t *kv = kv_get(g, key);
    *st = IE_ERR_FORMAT;
    if (!kv) return NULL;
    if (kv->type != IE_GGUF_ARRAY) {
        type_error(key, kv->type, "an array");
        return NULL;
    }
    if (i >= kv->n) {
        *st = ie_error_set(IE_ERR_RANGE, "gguf: index %llu out of range for array '%s' of length %llu",
                           (unsigned long long)i, key, (unsigned long long)kv->n);
        return NULL;
    }
    *st = IE_OK;
    return kv;
}

ie_status_t ie_gguf_arr_str(const ie_gguf_t *g, const char *key, uint64_t i, ie_gguf_str_t *out)
{
    ie_status_t st;
    const gguf_kv_t *kv = arr_elem(g, key, i, &st);
    if (!kv) return st;
    if (kv->elem_type != IE_GGUF_STRING)
        return ie_error_set(IE_ERR_FORMAT, "gguf: key '%s' is an array of %s, expected strings", key,
                            type_name(kv->elem_type));
    if (out) *out = str_at(kv->strs[i]);
    return IE_OK;
}

ie_status_t ie_gguf_arr_i64(const ie_gguf_t *g, const char *key, uint64_t i, int64_t *out)
{
    ie_status_t st;
    const gguf_kv_t *kv = arr_elem(g, key, i, &st);
    int64_t v;
    int r;
    if (!kv) return st;
    r = kv->elem_type == IE_GGUF_STRING ? 0
                                        : scalar_i64(kv->elem_type, kv->val + i * k_type_size[kv->elem_type], &v);
    if (r == 0)
        return ie_error_set(IE_ERR_FORMAT, "gguf: key '%s' is an array of %s, expected integers", key,
                            type_name(kv->elem_type));
    if (r < 0)
        return ie_error_set(IE_ERR_FORMAT, "gguf: key '%s' element %llu does not fit in int64", key,
                            (unsigned long long)i);
    if (out) *out = v;
    return IE_OK;
}

ie_status_t ie_gguf_arr_f32(const ie_gguf_t *g, const char *key, uint64_t i, float *out)
{
    ie_status_t st;
    const gguf_kv_t *kv = arr_elem(g, key, i, &st);
    float v;
    if (!kv) return st;
    if (kv->elem_type == IE_GGUF_STRING || !scalar_f32(kv->elem_type, kv->val + i * k_type_size[kv->elem_type], &v))
        return ie_error_set(IE_ERR_FORMAT, "gguf: key '%s' is an array of %s, expected floats", key,
                            type_name(kv->elem_type));
    if (out) *out = v;
    return IE_OK;
}

const void *ie_gguf_arr_data(const ie_gguf_t *g, const char *key)
{
    int64_t i = ie_gguf_find_key(g, key);
    if (i < 0 || g->kv[i].type != IE_GGUF_ARRAY || g->kv[i].elem_type == IE_GGUF_STRING) return NULL;
    return g->kv[i].val;
}
