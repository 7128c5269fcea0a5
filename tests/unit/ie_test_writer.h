/* ie_test_writer.h — tiny in-memory GGUF and safetensors writers for tests.
 *
 * Test-only code (static functions, aborts on OOM). The GGUF writer keeps
 * three sections — metadata, tensor infos, data — and glues them together in
 * gw_finish(); each gw_* call returns the offset of what it wrote within its
 * section so tests can corrupt single fields afterwards (gw_kv_at/gw_ti_at
 * turn a section offset into a file offset). The last tensor's data ends the
 * file exactly, so every strict prefix of a written file is invalid.
 */
#ifndef IE_TEST_WRITER_H
#define IE_TEST_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- bytes */

typedef struct tbuf {
    uint8_t *p;
    size_t n, cap;
} tbuf_t;

static inline void tb_put(tbuf_t *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void tb_u8(tbuf_t *b, uint8_t v) { tb_put(b, &v, 1); }
static inline void tb_u16(tbuf_t *b, uint16_t v) { tb_put(b, &v, 2); }
static inline void tb_u32(tbuf_t *b, uint32_t v) { tb_put(b, &v, 4); }
static inline void tb_u64(tbuf_t *b, uint64_t v) { tb_put(b, &v, 8); }
static inline void tb_f32(tbuf_t *b, float v) { tb_put(b, &v, 4); }
static inline void tb_f64(tbuf_t *b, double v) { tb_put(b, &v, 8); }
static inline void tb_str(tbuf_t *b, const char *s)
{
    tb_u64(b, strlen(s));
    tb_put(b, s, strlen(s));
}
static inline void tb_zeros(tbuf_t *b, size_t n)
{
    while (n--) tb_u8(b, 0);
}
static inline void tb_free(tbuf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
static inline void tb_set_u32(tbuf_t *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static inline void tb_set_u64(tbuf_t *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

/* ---------------------------------------------------------------- GGUF */

typedef struct gguf_w {
    tbuf_t kv, ti, data;
    uint64_t n_kv, n_tensors;
    size_t align; /* must match general.alignment if the test writes it */
} gguf_w_t;

static inline void gw_init(gguf_w_t *w)
{
    memset(w, 0, sizeof *w);
    w->align = 32;
}
static inline void gw_free(gguf_w_t *w)
{
    tb_free(&w->kv);
    tb_free(&w->ti);
    tb_free(&w->data);
}

/* Start a kv: key and type; returns the kv's offset in the kv section. The
 * caller appends the value with tb_* on &w->kv. */
static inline size_t gw_key(gguf_w_t *w, const char *key, uint32_t type)
{
    size_t at = w->kv.n;
    tb_str(&w->kv, key);
    tb_u32(&w->kv, type);
    w->n_kv++;
    return at;
}

static inline size_t gw_u32(gguf_w_t *w, const char *key, uint32_t v)
{
    size_t at = gw_key(w, key, 4);
    tb_u32(&w->kv, v);
    return at;
}
static inline size_t gw_i32(gguf_w_t *w, const char *key, int32_t v)
{
    size_t at = gw_key(w, key, 5);
    tb_u32(&w->kv, (uint32_t)v);
    return at;
}
static inline size_t gw_f32(gguf_w_t *w, const char *key, float v)
{
    size_t at = gw_key(w, key, 6);
    tb_f32(&w->kv, v);
    return at;
}
static inline size_t gw_bool(gguf_w_t *w, const char *key, int v)
{
    size_t at = gw_key(w, key, 7);
    tb_u8(&w->kv, (uint8_t)v);
    return at;
}
static inline size_t gw_str(gguf_w_t *w, const char *key, const char *v)
{
    size_t at = gw_key(w, key, 8);
    tb_str(&w->kv, v);
    return at;
}
static inline size_t gw_u64(gguf_w_t *w, const char *key, uint64_t v)
{
    size_t at = gw_key(w, key, 10);
    tb_u64(&w->kv, v);
    return at;
}

/* Array header: key, ARRAY, element type, length; append the elements after. */
static inline size_t gw_arr(gguf_w_t *w, const char *key, uint32_t elem_type, uint64_t n)
{
    size_t at = gw_key(w, key, 9);
    tb_u32(&w->kv, elem_type);
    tb_u64(&w->kv, n);
    return at;
}

/* Tensor: info record plus data (aligned). Returns the info's offset in the
 * tensor-info section. `data` may be NULL (zeros). */
static inline size_t gw_tensor(gguf_w_t *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                               const void *data, size_t nbytes)
{
    size_t at = w->ti.n;
    size_t pad = (w->align - w->data.n % w->align) % w->align;
    tb_zeros(&w->data, pad);
    tb_str(&w->ti, name);
    tb_u32(&w->ti, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) tb_u64(&w->ti, ne[d]);
    tb_u32(&w->ti, type);
    tb_u64(&w->ti, w->data.n);
    if (data) tb_put(&w->data, data, nbytes);
    else tb_zeros(&w->data, nbytes);
    w->n_tensors++;
    return at;
}

/* File offsets of section offsets (valid for the file gw_finish writes). */
static inline size_t gw_kv_at(const gguf_w_t *w, size_t at)
{
    (void)w;
    return 24 + at;
}
static inline size_t gw_ti_at(const gguf_w_t *w, size_t at) { return 24 + w->kv.n + at; }

/* Offset within a tensor-info record at `ti` of its fields, given its name. */
static inline size_t gw_ti_ndims(const char *name) { return 8 + strlen(name); }
static inline size_t gw_ti_dim(const char *name, int d) { return 8 + strlen(name) + 4 + 8 * (size_t)d; }
static inline size_t gw_ti_type(const char *name, uint32_t n_dims) { return 8 + strlen(name) + 4 + 8 * n_dims; }
static inline size_t gw_ti_offset(const char *name, uint32_t n_dims) { return gw_ti_type(name, n_dims) + 4; }

/* The whole file into *out (caller frees with tb_free). */
static inline void gw_finish(const gguf_w_t *w, uint32_t version, tbuf_t *out)
{
    memset(out, 0, sizeof *out);
    tb_put(out, "GGUF", 4);
    tb_u32(out, version);
    tb_u64(out, w->n_tensors);
    tb_u64(out, w->n_kv);
    tb_put(out, w->kv.p, w->kv.n);
    tb_put(out, w->ti.p, w->ti.n);
    if (w->n_tensors) {
        tb_zeros(out, (w->align - out->n % w->align) % w->align);
        tb_put(out, w->data.p, w->data.n);
    }
}

/* ---------------------------------------------------------------- safetensors */

/* Header JSON + data: the file is u64 len, json, data. */
static inline void st_finish(const char *json, const void *data, size_t nbytes, tbuf_t *out)
{
    memset(out, 0, sizeof *out);
    tb_u64(out, strlen(json));
    tb_put(out, json, strlen(json));
    tb_put(out, data, nbytes);
}

/* Safetensors builder: append tensors, then st_build() writes the file. */
typedef struct st_w {
    tbuf_t json, data;
    int n;
} st_w_t;

static inline void sw_tensor(st_w_t *w, const char *name, const char *dtype, int ndim, const int64_t *shape,
                             const void *data, size_t nbytes)
{
    char tmp[512];
    int at = snprintf(tmp, sizeof tmp, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", w->n ? "," : "{", name, dtype);
    for (int d = 0; d < ndim; d++)
        at += snprintf(tmp + at, sizeof tmp - (size_t)at, "%s%lld", d ? "," : "", (long long)shape[d]);
    snprintf(tmp + at, sizeof tmp - (size_t)at, "],\"data_offsets\":[%zu,%zu]}", w->data.n, w->data.n + nbytes);
    tb_put(&w->json, tmp, strlen(tmp));
    if (data) tb_put(&w->data, data, nbytes);
    else tb_zeros(&w->data, nbytes);
    w->n++;
}

static inline void sw_finish(st_w_t *w, tbuf_t *out)
{
    tb_put(&w->json, w->n ? "}" : "{}", w->n ? 2 : 3); /* includes the NUL */
    st_finish((const char *)w->json.p, w->data.p, w->data.n, out);
    tb_free(&w->json);
    tb_free(&w->data);
    w->n = 0;
}

/* ---------------------------------------------------------------- files */

static inline int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

#endif
