/* ie_gguf_write.h — a minimal GGUF v3 writer: metadata only, no tensors.
 *
 * Used by the IEBIN writer to store a GGUF source's tokenizer as
 * tokenizer.gguf (tokenizer.* and general.architecture keys). Entries are
 * collected in memory in the order they are set and written by
 * ie_gguf_writer_write(); the result reads back with ie_gguf_open().
 * All KV types are supported: every scalar type, strings, and arrays of any
 * scalar type or of strings (GGUF forbids nothing else we would write;
 * arrays of arrays are not supported, as in our reader).
 */
#ifndef IE_GGUF_WRITE_H
#define IE_GGUF_WRITE_H

#include "ie_gguf.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_gguf_writer ie_gguf_writer_t;

/* An empty writer. Caller owns *out (ie_gguf_writer_destroy). */
ie_status_t ie_gguf_writer_new(ie_gguf_writer_t **out);
void ie_gguf_writer_destroy(ie_gguf_writer_t **self_p);

/* A scalar of `type` (not STRING/ARRAY); `value` points at its
 * little-endian bytes (1, 2, 4 or 8 as the type says; bools 0 or 1). */
ie_status_t ie_gguf_writer_set_scalar(ie_gguf_writer_t *w, const char *key, ie_gguf_type_t type, const void *value);
/* A string of `len` bytes (need not be NUL-terminated). */
ie_status_t ie_gguf_writer_set_str(ie_gguf_writer_t *w, const char *key, const char *s, uint64_t len);
/* An array of n scalars of elem_type, packed little-endian at `data`. */
ie_status_t ie_gguf_writer_set_arr(ie_gguf_writer_t *w, const char *key, ie_gguf_type_t elem_type, const void *data,
                                   uint64_t n);
/* An array of n strings. */
ie_status_t ie_gguf_writer_set_arr_str(ie_gguf_writer_t *w, const char *key, const ie_gguf_str_t *strs, uint64_t n);

/* Copy entry `i` of reader `g` (same key, type and value). Float64 scalars
 * are copied through the reader's f32 getter (tokenizer keys have none);
 * uint64 scalars above INT64_MAX are refused. */
ie_status_t ie_gguf_writer_copy_kv(ie_gguf_writer_t *w, const ie_gguf_t *g, int64_t i);

/* Write the file at `path` (created or truncated, fsync'd). Keys must be
 * unique: a repeated key is IE_ERR_INVAL. */
ie_status_t ie_gguf_writer_write(const ie_gguf_writer_t *w, const char *path);

#endif
