/* safetensors.c — .safetensors reader: mmap, parse the JSON header with
 * cJSON, validate every entry against the file, then serve pointers into the
 * mapping. Validation follows the reference implementation (huggingface/
 * safetensors): the tensors must tile the data section exactly.
 *
 * Functions that own resources leave through one cleanup label; pure checks
 * return at their first failure, which reads more directly than a goto there.
 */
#include "ie_safetensors.h"
#include "ie_mmap.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ull /* the reference implementation's limit */
#define ST_MAX_RANK 4
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: JSON numbers past this are not exact in a double */

typedef struct st_dtype {
    const char *name;
    uint32_t size;
    ie_dtype_t dtype;
} st_dtype_t;

/* Sub-byte dtypes (F4, F6_*) are not listed: their packing is not
 * byte-granular and no model we load uses them. */
static const st_dtype_t k_dtypes[] = {
    {"F32", 4, IE_DTYPE_F32},         {"F16", 2, IE_DTYPE_F16},         {"BF16", 2, IE_DTYPE_BF16},
    {"F64", 8, IE_DTYPE_INVALID},     {"I64", 8, IE_DTYPE_INVALID},     {"U64", 8, IE_DTYPE_INVALID},
    {"I32", 4, IE_DTYPE_INVALID},     {"U32", 4, IE_DTYPE_INVALID},     {"I16", 2, IE_DTYPE_INVALID},
    {"U16", 2, IE_DTYPE_INVALID},     {"I8", 1, IE_DTYPE_INVALID},      {"U8", 1, IE_DTYPE_INVALID},
    {"BOOL", 1, IE_DTYPE_INVALID},    {"F8_E5M2", 1, IE_DTYPE_INVALID}, {"F8_E4M3", 1, IE_DTYPE_INVALID},
    {"F8_E8M0", 1, IE_DTYPE_INVALID}, {"C64", 8, IE_DTYPE_INVALID},
};

typedef struct name_ref {
    const char *name;
    int64_t idx;
} name_ref_t;

typedef struct span {
    uint64_t begin, end;
    int64_t idx;
} span_t;

struct ie_safetensors {
    void *map; /* non-NULL when we own an mmap */
    size_t map_len;
    int64_t n;
    ie_safetensors_tensor_t *tensors;
    char *names;       /* all names, NUL-separated */
    name_ref_t *index; /* sorted by name           */
};

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const name_ref_t *)a)->name, ((const name_ref_t *)b)->name);
}

static int span_cmp(const void *pa, const void *pb)
{
    const span_t *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return (a->end > b->end) - (a->end < b->end);
}

/* A JSON number that is an exact non-negative integer. */
static int json_u64(const cJSON *j, uint64_t *out)
{
    double d;
    if (!cJSON_IsNumber(j)) return 0;
    d = j->valuedouble;
    if (!(d >= 0.0 && d <= ST_MAX_EXACT) || (double)(uint64_t)d != d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Fill t from one header entry `e` named e->string (name not yet set). */
static ie_status_t parse_entry(const cJSON *e, uint64_t data_size, ie_safetensors_tensor_t *t, span_t *sp)
{
    const char *name = e->string;
    const cJSON *dt, *shape, *offs;
    const st_dtype_t *d = NULL;
    uint64_t n_elem = 1, nbytes, dim;
    const cJSON *j;
    int rank;

    if (!cJSON_IsObject(e)) return ie_error_set(IE_ERR_FORMAT, "safetensors: entry '%.96s' is not an object", name);
    dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return ie_error_set(IE_ERR_FORMAT, "safetensors: tensor '%.96s' has no string \"dtype\"", name);
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0] && !d; i++)
        if (strcmp(dt->valuestring, k_dtypes[i].name) == 0) d = &k_dtypes[i];
    if (!d)
        return ie_error_set(IE_ERR_UNSUPPORTED, "safetensors: tensor '%.96s' has unsupported dtype '%.32s'", name,
                            dt->valuestring);
    if (!cJSON_IsArray(shape))
        return ie_error_set(IE_ERR_FORMAT, "safetensors: tensor '%.96s' has no \"shape\" array", name);
    rank = cJSON_GetArraySize(shape);
    if (rank > ST_MAX_RANK)
        return ie_error_set(IE_ERR_UNSUPPORTED, "safetensors: tensor '%.96s' has rank %d (at most %d supported)",
                            name, rank, ST_MAX_RANK);
    t->ndim = 0;
    cJSON_ArrayForEach(j, shape)
    {
        if (!json_u64(j, &dim))
            return ie_error_set(IE_ERR_FORMAT,
                                "safetensors: tensor '%.96s' shape[%d] is not a non-negative integer", name,
                                t->ndim);
        if (__builtin_mul_overflow(n_elem, dim, &n_elem) || n_elem > (uint64_t)INT64_MAX)
            return ie_error_set(IE_ERR_FORMAT, "safetensors: tensor '%.96s' element count overflows", name);
        t->shape[t->ndim++] = (int64_t)dim;
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u64(offs->child, &sp->begin) ||
        !json_u64(offs->child->next, &sp->end) || sp->begin > sp->end)
        return ie_error_set(IE_ERR_FORMAT,
                            "safetensors: tensor '%.96s' needs \"data_offsets\": [begin, end] with begin <= end",
                            name);
    if (sp->end > data_size)
        return ie_error_set(
            IE_ERR_FORMAT,
            "safetensors: tensor '%.96s' data_offsets [%llu, %llu] extend past the data section (%llu bytes)", name,
            (unsigned long long)sp->begin, (unsigned long long)sp->end, (unsigned long long)data_size);
    if (__builtin_mul_overflow(n_elem, (uint64_t)d->size, &nbytes) || nbytes != sp->end - sp->begin)
        return ie_error_set(IE_ERR_FORMAT,
                            "safetensors: tensor '%.96s' is %llu elements of %s but data_offsets span %llu bytes",
                            name, (unsigned long long)n_elem, d->name, (unsigned long long)(sp->end - sp->begin));
    t->dtype = d->dtype;
    t->dtype_str = d->name;
    t->nbytes = nbytes;
    return IE_OK;
}

/* Check that the spans, sorted, tile [0, data_size) exactly. */
static ie_status_t check_tiling(const ie_safetensors_t *s, span_t *spans, uint64_t data_size)
{
    uint64_t at = 0;
    if (s->n > 1) qsort(spans, (size_t)s->n, sizeof *spans, span_cmp);
    for (int64_t i = 0; i < s->n; i++) {
        if (spans[i].begin != at)
            return ie_error_set(IE_ERR_FORMAT,
                                "safetensors: tensor '%.96s' data_offsets [%llu, %llu] %s (expected begin %llu)",
                                s->tensors[spans[i].idx].name, (unsigned long long)spans[i].begin,
                                (unsigned long long)spans[i].end,
                                spans[i].begin < at ? "overlap another tensor" : "leave a gap",
                                (unsigned long long)at);
        at = spans[i].end;
    }
    if (at != data_size)
        return ie_error_set(IE_ERR_FORMAT, "safetensors: tensors cover %llu bytes but the data section has %llu",
                            (unsigned long long)at, (unsigned long long)data_size);
    return IE_OK;
}

static ie_status_t st_parse(const uint8_t *base, size_t size, ie_safetensors_t **out)
{
    ie_status_t st = IE_OK;
    ie_safetensors_t *s = NULL;
    char *text = NULL;
    cJSON *root = NULL;
    span_t *spans = NULL;
    const cJSON *e;
    const char *end = NULL;
    uint64_t hlen, data_size;
    size_t names_len = 0, at = 0;
    int64_t i = 0;

    *out = NULL;
    if (size < 8) {
        st = ie_error_set(IE_ERR_FORMAT, "safetensors: file is %zu bytes, too small for a header", size);
        goto cleanup;
    }
    memcpy(&hlen, base, 8); /* little-endian host assumed, as in gguf.c */
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > size - 8) {
        st = ie_error_set(IE_ERR_FORMAT,
                          "safetensors: header length %llu is invalid (file is %zu bytes, limit %llu)",
                          (unsigned long long)hlen, size, ST_MAX_HEADER);
        goto cleanup;
    }
    data_size = size - 8 - hlen;
    /* cJSON wants a terminated buffer; the header is bounded, so copy it */
    text = malloc(hlen + 1);
    if (!text) {
        st = ie_error_set(IE_ERR_NOMEM, "safetensors: out of memory for a %llu-byte header",
                          (unsigned long long)hlen);
        goto cleanup;
    }
    memcpy(text, base + 8, hlen);
    text[hlen] = '\0';
    root = cJSON_ParseWithLengthOpts(text, hlen, &end, 0);
    if (!root) {
        st = ie_error_set(IE_ERR_FORMAT, "safetensors: header is not valid JSON (near byte %lld)",
                          (long long)((cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : text) - text));
        goto cleanup;
    }
    for (; end && end < text + hlen; end++) /* writers pad the header with spaces */
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            st = ie_error_set(IE_ERR_FORMAT, "safetensors: trailing bytes after the JSON header");
            goto cleanup;
        }
    if (!cJSON_IsObject(root)) {
        st = ie_error_set(IE_ERR_FORMAT, "safetensors: header is not a JSON object");
        goto cleanup;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        st = ie_error_set(IE_ERR_NOMEM, "safetensors: out of memory");
        goto cleanup;
    }
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        s->n++;
        names_len += strlen(e->string) + 1;
    }
    s->tensors = calloc(s->n ? s->n : 1, sizeof *s->tensors);
    s->index = calloc(s->n ? s->n : 1, sizeof *s->index);
    spans = calloc(s->n ? s->n : 1, sizeof *spans);
    s->names = malloc(names_len ? names_len : 1);
    if (!s->tensors || !s->index || !spans || !s->names) {
        st = ie_error_set(IE_ERR_NOMEM, "safetensors: out of memory for %lld tensors", (long long)s->n);
        goto cleanup;
    }
    cJSON_ArrayForEach(e, root)
    {
        ie_safetensors_tensor_t *t = &s->tensors[i];
        size_t nl = strlen(e->string) + 1;
        if (strcmp(e->string, "__metadata__") == 0) continue;
        if ((st = parse_entry(e, data_size, t, &spans[i])) != IE_OK) goto cleanup;
        memcpy(s->names + at, e->string, nl);
        t->name = s->names + at;
        t->data = base + 8 + hlen + spans[i].begin;
        at += nl;
        spans[i].idx = i;
        s->index[i] = (name_ref_t){t->name, i};
        i++;
    }
    if (s->n > 1) qsort(s->index, (size_t)s->n, sizeof *s->index, name_cmp);
    for (i = 1; i < s->n; i++)
        if (strcmp(s->index[i - 1].name, s->index[i].name) == 0) {
            st = ie_error_set(IE_ERR_FORMAT, "safetensors: duplicate tensor name '%.96s'", s->index[i].name);
            goto cleanup;
        }
    if ((st = check_tiling(s, spans, data_size)) != IE_OK) goto cleanup;
    *out = s;
    s = NULL;

cleanup:
    ie_safetensors_destroy(&s);
    free(spans);
    cJSON_Delete(root);
    free(text);
    return st;
}

ie_status_t ie_safetensors_open_memory(const void *buf, size_t len, ie_safetensors_t **out)
{
    if (!out) return ie_error_set(IE_ERR_INVAL, "safetensors: out is NULL");
    *out = NULL;
    if (!buf && len) return ie_error_set(IE_ERR_INVAL, "safetensors: buffer is NULL");
    return st_parse(buf ? buf : "", len, out);
}

ie_status_t ie_safetensors_open(const char *path, ie_safetensors_t **out)
{
    const void *map = NULL;
    size_t len = 0;
    ie_status_t st;

    if (!out) return ie_error_set(IE_ERR_INVAL, "safetensors: out is NULL");
    *out = NULL;
    if ((st = ie_file_map("safetensors", path, &map, &len)) != IE_OK) return st;
    if ((st = st_parse(map ? map : "", len, out)) != IE_OK) {
        ie_file_unmap(map, len);
        return st;
    }
    (*out)->map = (void *)map;
    (*out)->map_len = len;
    return IE_OK;
}

void ie_safetensors_destroy(ie_safetensors_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_safetensors_t *s = *self_p;
    free(s->tensors);
    free(s->index);
    free(s->names);
    ie_file_unmap(s->map, s->map_len);
    free(s);
    *self_p = NULL;
}

int64_t ie_safetensors_count(const ie_safetensors_t *st) { return st ? st->n : 0; }

const ie_safetensors_tensor_t *ie_safetensors_get(const ie_safetensors_t *st, int64_t i)
{
    return st && i >= 0 && i < st->n ? &st->tensors[i] : NULL;
}

const ie_safetensors_tensor_t *ie_safetensors_find(const ie_safetensors_t *st, const char *name)
{
    name_ref_t key = {name, -1};
    const name_ref_t *hit;
    if (!st || !name) return NULL;
    hit = bsearch(&key, st->index, (size_t)st->n, sizeof *st->index, name_cmp);
    return hit ? &st->tensors[hit->idx] : NULL;
}
