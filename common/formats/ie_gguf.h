/* ie_gguf.h — read-only GGUF (v2/v3) reader over an mmap'd file.
 *
 * ie_gguf_open() maps the file and validates everything before returning:
 * magic, version, counts, every string length, every array length, every
 * metadata value type, every tensor's dims/type/offset/size against the file
 * size and the alignment (general.alignment, default 32). Nothing is read
 * from the file after open returns except through pointers it hands out, all
 * of which are inside the mapping. Bad input yields IE_ERR_FORMAT (or
 * IE_ERR_IO / IE_ERR_UNSUPPORTED) with a one-line reason in ie_error_last().
 */
#ifndef IE_GGUF_H
#define IE_GGUF_H

#include "ie_dtype.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ie_gguf_type {
    IE_GGUF_UINT8 = 0,
    IE_GGUF_INT8 = 1,
    IE_GGUF_UINT16 = 2,
    IE_GGUF_INT16 = 3,
    IE_GGUF_UINT32 = 4,
    IE_GGUF_INT32 = 5,
    IE_GGUF_FLOAT32 = 6,
    IE_GGUF_BOOL = 7,
    IE_GGUF_STRING = 8,
    IE_GGUF_ARRAY = 9,
    IE_GGUF_UINT64 = 10,
    IE_GGUF_INT64 = 11,
    IE_GGUF_FLOAT64 = 12
} ie_gguf_type_t;

/* A string inside the mapping: NOT NUL-terminated. */
typedef struct ie_gguf_str {
    const char *ptr;
    uint64_t len;
} ie_gguf_str_t;

typedef struct ie_gguf_tensor_info {
    ie_gguf_str_t name;
    uint32_t ggml_type; /* raw type id from the file                   */
    ie_dtype_t dtype;   /* IE_DTYPE_INVALID if we cannot compute with it */
    uint32_t n_dims;    /* 1..4                                         */
    int64_t ne[4];      /* ne[0] = contiguous (row) length; unused = 1  */
    uint64_t offset;    /* relative to the data section                 */
    uint64_t nbytes;
    const void *data; /* inside the mapping, aligned                  */
} ie_gguf_tensor_info_t;

typedef struct ie_gguf ie_gguf_t;

/* Open and validate `path`. On success *out owns the mapping; destroy with
 * ie_gguf_destroy(). On failure *out is NULL. */
ie_status_t ie_gguf_open(const char *path, ie_gguf_t **out);

/* Same, over a caller-owned buffer (for fuzzing and tests). The buffer must
 * outlive the returned object. */
ie_status_t ie_gguf_open_memory(const void *buf, size_t len, ie_gguf_t **out);

/* Unmap and free; *self_p is set to NULL. Accepts NULL and *self_p == NULL. */
void ie_gguf_destroy(ie_gguf_t **self_p);

/* File version (2 or 3) and data alignment (general.alignment or 32). */
uint32_t ie_gguf_version(const ie_gguf_t *g);
size_t ie_gguf_alignment(const ie_gguf_t *g);

/* ---- metadata ---- */
int64_t ie_gguf_kv_count(const ie_gguf_t *g);
/* Index of key, or -1. */
int64_t ie_gguf_find_key(const ie_gguf_t *g, const char *key);
/* Key / value type of entry i (file order); {NULL, 0} / (ie_gguf_type_t)-1
 * when i is out of range. */
ie_gguf_str_t ie_gguf_kv_key(const ie_gguf_t *g, int64_t i);
ie_gguf_type_t ie_gguf_kv_type(const ie_gguf_t *g, int64_t i);

/* Typed getters by key. Integers of any width/signedness convert when the
 * value fits; floats accept f32/f64. Return IE_ERR_FORMAT on absence or
 * type mismatch (with the key named in ie_error_last()). On failure *out is
 * left untouched, so a caller may pre-load a default. */
ie_status_t ie_gguf_get_i64(const ie_gguf_t *g, const char *key, int64_t *out);
ie_status_t ie_gguf_get_f32(const ie_gguf_t *g, const char *key, float *out);
ie_status_t ie_gguf_get_bool(const ie_gguf_t *g, const char *key, int *out);
ie_status_t ie_gguf_get_str(const ie_gguf_t *g, const char *key, ie_gguf_str_t *out);

/* Arrays: element type and length; element access for the scalar types and
 * strings. Index must be < length (checked, IE_ERR_RANGE). */
ie_status_t ie_gguf_get_arr(const ie_gguf_t *g, const char *key, ie_gguf_type_t *elem_type, uint64_t *len);
ie_status_t ie_gguf_arr_str(const ie_gguf_t *g, const char *key, uint64_t i, ie_gguf_str_t *out);
ie_status_t ie_gguf_arr_i64(const ie_gguf_t *g, const char *key, uint64_t i, int64_t *out);
ie_status_t ie_gguf_arr_f32(const ie_gguf_t *g, const char *key, uint64_t i, float *out);
/* Raw pointer to the packed elements of a numeric array (not strings), or
 * NULL if the key is absent or not a numeric array. Not necessarily aligned. */
const void *ie_gguf_arr_data(const ie_gguf_t *g, const char *key);

/* ---- tensors ---- */
int64_t ie_gguf_tensor_count(const ie_gguf_t *g);
/* Tensor i in file order, or NULL if out of range. Valid while g lives. */
const ie_gguf_tensor_info_t *ie_gguf_tensor(const ie_gguf_t *g, int64_t i);
/* By name, or NULL. */
const ie_gguf_tensor_info_t *ie_gguf_find_tensor(const ie_gguf_t *g, const char *name);

/* Name of a raw ggml type id ("q6_K", ...) or "unknown". */
const char *ie_gguf_ggml_type_name(uint32_t ggml_type);

/* Block geometry of a raw ggml type id: elements per block and bytes per
 * block (either out pointer may be NULL). Returns 1 if the id is a known
 * ggml type, 0 (outs untouched) if unknown or removed from ggml. */
int ie_gguf_ggml_type_block(uint32_t ggml_type, int64_t *block_elems, size_t *block_bytes);

#endif
