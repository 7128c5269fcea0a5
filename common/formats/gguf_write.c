/* gguf_write.c — minimal GGUF v3 writer (metadata only), see ie_gguf_write.h.
 *
 * Layout written (little-endian, as gguf.c reads it):
 *   "GGUF" u32 version=3, u64 n_tensors=0, u64 n_kv,
 *   n_kv x { u64 len + key bytes, u32 type, value }
 * Strings are u64 length + bytes; arrays are u32 element type, u64 count,
 * elements. With no tensors there is no tensor-info section and the data
 * section is empty.
 */
#include "ie_gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_write.c writes little-endian files by memcpy and needs a little-endian host"
#endif

#define GGUF_MAX_KEY_LEN 65535u

struct ie_gguf_writer {
    uint8_t *p; /* serialized kv entries */
    size_t n, cap;
    char **keys; /* for the duplicate check */
    uint64_t n_kv;
    size_t cap_keys;
};

static const uint8_t k_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static int scalar_type(ie_gguf_type_t t) { return (unsigned)t <= IE_GGUF_FLOAT64 && k_size[t] != 0; }

/* Append n bytes; 0 or -1 (overflow / out of memory). */
static int put(ie_gguf_writer_t *w, const void *src, size_t n)
{
    if (n > SIZE_MAX - w->n) return -1;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->n + n) {
            if (cap > SIZE_MAX / 2) return -1;
            cap *= 2;
        }
        uint8_t *q = realloc(w->p, cap);
        if (!q) return -1;
        w->p = q;
        w->cap = cap;
    }
    if (n) memcpy(w->p + w->n, src, n);
    w->n += n;
    return 0;
}

static int put_u32(ie_gguf_writer_t *w, uint32_t v) { return put(w, &v, 4); }
static int put_u64(ie_gguf_writer_t *w, uint64_t v) { return put(w, &v, 8); }
static int put_str(ie_gguf_writer_t *w, const char *s, uint64_t len)
{
    return len > SIZE_MAX ? -1 : put_u64(w, len) || put(w, s, (size_t)len);
}

ie_status_t ie_gguf_writer_new(ie_gguf_writer_t **out)
{
    if (!out) return ie_error_set(IE_ERR_INVAL, "gguf writer: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? IE_OK : ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
}

void ie_gguf_writer_destroy(ie_gguf_writer_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_gguf_writer_t *w = *self_p;
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->p);
    free(w);
    *self_p = NULL;
}

/* Start an entry: check and record the key, write key and type. On failure
 * the buffer may hold a partial entry; callers then return an error and the
 * writer must not be written (set_* contract: a failed set poisons w). */
static ie_status_t begin(ie_gguf_writer_t *w, const char *key, ie_gguf_type_t type)
{
    size_t len;
    char *copy;
    if (!w || !key) return ie_error_set(IE_ERR_INVAL, "gguf writer: NULL writer or key");
    len = strlen(key);
    if (len == 0 || len > GGUF_MAX_KEY_LEN)
        return ie_error_set(IE_ERR_INVAL, "gguf writer: key length %zu must be 1..%u", len, GGUF_MAX_KEY_LEN);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return ie_error_set(IE_ERR_INVAL, "gguf writer: duplicate key '%.96s'", key);
    if (w->n_kv == w->cap_keys) {
        size_t cap = w->cap_keys ? 2 * w->cap_keys : 16;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
        w->keys = k;
        w->cap_keys = cap;
    }
    if (!(copy = strdup(key))) return ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
    w->keys[w->n_kv++] = copy;
    if (put_str(w, key, len) || put_u32(w, (uint32_t)type))
        return ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
    return IE_OK;
}

static ie_status_t check_bools(const uint8_t *p, uint64_t n, const char *key)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1) return ie_error_set(IE_ERR_INVAL, "gguf writer: key '%.96s' has bool value %u", key, p[i]);
    return IE_OK;
}

ie_status_t ie_gguf_writer_set_scalar(ie_gguf_writer_t *w, const char *key, ie_gguf_type_t type, const void *value)
{
    ie_status_t st;
    if (!scalar_type(type) || !value)
        return ie_error_set(IE_ERR_INVAL, "gguf writer: key '%.96s': bad scalar type %d", key ? key : "",
                            (int)type);
    if (type == IE_GGUF_BOOL && (st = check_bools(value, 1, key)) != IE_OK) return st;
    if ((st = begin(w, key, type)) != IE_OK) return st;
    return put(w, value, k_size[type]) ? ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory") : IE_OK;
}

ie_status_t ie_gguf_writer_set_str(ie_gguf_writer_t *w, const char *key, const char *s, uint64_t len)
{
    ie_status_t st;
    if (!s && len) return ie_error_set(IE_ERR_INVAL, "gguf writer: key '%.96s': NULL string", key ? key : "");
    if ((st = begin(w, key, IE_GGUF_STRING)) != IE_OK) return st;
    return put_str(w, s, len) ? ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory") : IE_OK;
}

ie_status_t ie_gguf_writer_set_arr(ie_gguf_writer_t *w, const char *key, ie_gguf_type_t elem_type, const void *data,
                                   uint64_t n)
{
    ie_status_t st;
    if (!scalar_type(elem_type) || (!data && n) || n > SIZE_MAX / 8)
        return ie_error_set(IE_ERR_INVAL, "gguf writer: key '%.96s': bad array (type %d, %llu elements)",
                            key ? key : "", (int)elem_type, (unsigned long long)n);
    if (elem_type == IE_GGUF_BOOL && (st = check_bools(data, n, key)) != IE_OK) return st;
    if ((st = begin(w, key, IE_GGUF_ARRAY)) != IE_OK) return st;
    if (put_u32(w, (uint32_t)elem_type) || put_u64(w, n) || put(w, data, (size_t)n * k_size[elem_type]))
        return ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
    return IE_OK;
}

ie_status_t ie_gguf_writer_set_arr_str(ie_gguf_writer_t *w, const char *key, const ie_gguf_str_t *strs, uint64_t n)
{
    ie_status_t st;
    if (!strs && n) return ie_error_set(IE_ERR_INVAL, "gguf writer: key '%.96s': NULL strings", key ? key : "");
    if ((st = begin(w, key, IE_GGUF_ARRAY)) != IE_OK) return st;
    if (put_u32(w, IE_GGUF_STRING) || put_u64(w, n))
        return ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
    for (uint64_t i = 0; i < n; i++)
        if (put_str(w, strs[i].ptr, strs[i].len)) return ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
    return IE_OK;
}

ie_status_t ie_gguf_writer_copy_kv(ie_gguf_writer_t *w, const ie_gguf_t *g, int64_t i)
{
    ie_status_t st = IE_OK;
    ie_gguf_str_t k = ie_gguf_kv_key(g, i), s;
    ie_gguf_type_t type = ie_gguf_kv_type(g, i), et;
    ie_gguf_str_t *strs = NULL;
    char *key = NULL;
    uint64_t n;
    uint8_t b[8];

    if (!w || !k.ptr) return ie_error_set(IE_ERR_INVAL, "gguf writer: no entry %lld to copy", (long long)i);
    if (memchr(k.ptr, '\0', k.len))
        return ie_error_set(IE_ERR_FORMAT, "gguf writer: key %lld contains a NUL byte", (long long)i);
    if (!(key = malloc(k.len + 1))) return ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory");
    memcpy(key, k.ptr, k.len);
    key[k.len] = '\0';

    switch (type) {
    case IE_GGUF_STRING:
        if ((st = ie_gguf_get_str(g, key, &s)) == IE_OK) st = ie_gguf_writer_set_str(w, key, s.ptr, s.len);
        break;
    case IE_GGUF_BOOL: {
        int v;
        if ((st = ie_gguf_get_bool(g, key, &v)) == IE_OK) {
            b[0] = (uint8_t)v;
            st = ie_gguf_writer_set_scalar(w, key, type, b);
        }
        break;
    }
    case IE_GGUF_FLOAT32:
    case IE_GGUF_FLOAT64: {
        float f;
        double d;
        if ((st = ie_gguf_get_f32(g, key, &f)) != IE_OK) break;
        d = f;
        st = ie_gguf_writer_set_scalar(w, key, type, type == IE_GGUF_FLOAT32 ? (const void *)&f : (const void *)&d);
        break;
    }
    case IE_GGUF_ARRAY:
        if ((st = ie_gguf_get_arr(g, key, &et, &n)) != IE_OK) break;
        if (et != IE_GGUF_STRING) {
            const void *data = ie_gguf_arr_data(g, key);
            if (!data && n) {
                st = ie_error_set(IE_ERR_FORMAT, "gguf writer: array '%.96s' has no data", key);
                break;
            }
            st = ie_gguf_writer_set_arr(w, key, et, data, n);
            break;
        }
        if (!(strs = malloc((n ? n : 1) * sizeof *strs))) {
            st = ie_error_set(IE_ERR_NOMEM, "gguf writer: out of memory for %llu strings", (unsigned long long)n);
            break;
        }
        for (uint64_t j = 0; j < n && st == IE_OK; j++) st = ie_gguf_arr_str(g, key, j, &strs[j]);
        if (st == IE_OK) st = ie_gguf_writer_set_arr_str(w, key, strs, n);
        break;
    default: {
        int64_t v;
        if ((st = ie_gguf_get_i64(g, key, &v)) != IE_OK) break;
        memcpy(b, &v, 8); /* little-endian: the low k_size[type] bytes are the value */
        st = ie_gguf_writer_set_scalar(w, key, type, b);
        break;
    }
    }
    free(strs);
    free(key);
    return st;
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t r = write(fd, b, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

ie_status_t ie_gguf_writer_write(const ie_gguf_writer_t *w, const char *path)
{
    ie_status_t st = IE_OK;
    uint8_t hdr[24];
    uint32_t version = 3;
    uint64_t n_tensors = 0;
    int fd = -1;

    if (!w || !path) return ie_error_set(IE_ERR_INVAL, "gguf writer: NULL writer or path");
    memcpy(hdr, "GGUF", 4);
    memcpy(hdr + 4, &version, 4);
    memcpy(hdr + 8, &n_tensors, 8);
    memcpy(hdr + 16, &w->n_kv, 8);
    if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        st = ie_error_set(IE_ERR_IO, "gguf writer: cannot create '%s': %s", path, strerror(errno));
        goto cleanup;
    }
    if (write_all(fd, hdr, sizeof hdr) || write_all(fd, w->p, w->n) || fsync(fd) != 0) {
        st = ie_error_set(IE_ERR_IO, "gguf writer: cannot write '%s': %s", path, strerror(errno));
        goto cleanup;
    }

cleanup:
    if (fd >= 0 && close(fd) != 0 && st == IE_OK)
        st = ie_error_set(IE_ERR_IO, "gguf writer: cannot write '%s': %s", path, strerror(errno));
    return st;
}
