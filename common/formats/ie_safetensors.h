/* ie_safetensors.h — read-only .safetensors reader over an mmap'd file.
 *
 * File layout: u64 (little-endian) header length N, N bytes of JSON, then
 * the data section. The JSON maps tensor names to
 *     {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}
 * (offsets relative to the data section) plus an optional "__metadata__"
 * object, which is skipped.
 *
 * ie_safetensors_open() validates everything before returning, like the
 * reference implementation: header length bounded (100 MB) and inside the
 * file, JSON an object, every dtype known, shape dims >= 0 and rank <= 4,
 * shape product x element size == end - begin (overflow-safe), and the
 * tensors tiling the data section exactly (sorted by offset, no gaps, no
 * overlap, ending at end of file). Names are unique.
 *
 * Shapes are in HF order (outermost first, shape[ndim-1] contiguous), the
 * reverse of GGUF's ne[]. Data pointers point into the mapping and carry no
 * alignment guarantee beyond 1 byte.
 */
#ifndef IE_SAFETENSORS_H
#define IE_SAFETENSORS_H

#include "ie_dtype.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_safetensors_tensor {
    const char *name;      /* NUL-terminated, owned by the file object    */
    ie_dtype_t dtype;      /* F32/F16/BF16, else IE_DTYPE_INVALID         */
    const char *dtype_str; /* raw dtype as in the file: "F32", "I64", ... */
    int ndim;              /* 0..4 (0: a scalar, one element)             */
    int64_t shape[4];      /* HF order, outermost first; unused = 0       */
    const void *data;      /* inside the mapping                          */
    uint64_t nbytes;       /* end - begin                                 */
} ie_safetensors_tensor_t;

typedef struct ie_safetensors ie_safetensors_t;

/* Open and validate `path`. On success the caller owns *out (destroy with
 * ie_safetensors_destroy); on failure *out is NULL and ie_error_last() says
 * why: IE_ERR_IO (unreadable), IE_ERR_FORMAT (malformed), IE_ERR_UNSUPPORTED
 * (unknown dtype, rank > 4). */
ie_status_t ie_safetensors_open(const char *path, ie_safetensors_t **out);

/* Same over a caller-owned buffer, which must outlive the returned object
 * (for fuzzing and tests). */
ie_status_t ie_safetensors_open_memory(const void *buf, size_t len, ie_safetensors_t **out);

/* Unmap and free; *self_p is set to NULL. Accepts NULL and *self_p == NULL. */
void ie_safetensors_destroy(ie_safetensors_t **self_p);

/* Number of tensors (excluding __metadata__). */
int64_t ie_safetensors_count(const ie_safetensors_t *st);

/* Tensor i (in header order), or NULL if out of range. Valid while st lives. */
const ie_safetensors_tensor_t *ie_safetensors_get(const ie_safetensors_t *st, int64_t i);

/* Tensor by name, or NULL. Valid while st lives. */
const ie_safetensors_tensor_t *ie_safetensors_find(const ie_safetensors_t *st, const char *name);

#endif
