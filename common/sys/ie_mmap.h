/* ie_mmap.h — whole files: mapped read-only for the format readers, or read
 * into memory for small text inputs (JSON, prompts, manifests). */
#ifndef IE_MMAP_H
#define IE_MMAP_H

#include "ie_status.h"

#include <stddef.h>

/* Map the regular file `path` read-only (MAP_PRIVATE, huge pages hinted).
 * `what` prefixes error messages ("gguf", "safetensors"). An empty file
 * gives *map_out = NULL and *len_out = 0 (mmap cannot map zero bytes).
 * Errors: IE_ERR_IO (missing, unreadable, not a regular file), IE_ERR_NOMEM
 * (no address space). Unmap with ie_file_unmap(). */
ie_status_t ie_file_map(const char *what, const char *path, const void **map_out, size_t *len_out);

/* Undo ie_file_map(); accepts NULL. */
void ie_file_unmap(const void *map, size_t len);

/* Drop the whole pages inside [p, p+n) of a read-only file mapping from this
 * process (MADV_DONTNEED): they no longer count as resident, and a later
 * read refaults them from the file. Only for file-backed mappings —
 * anonymous memory would read back as zeros. NULL or n = 0: nothing. */
void ie_file_release_pages(const void *p, size_t n);

/* Read the whole file `path` (regular file or pipe) into a NUL-terminated
 * malloc'd buffer: *buf_out (caller frees), *len_out bytes before the NUL.
 * `what` prefixes error messages. Errors: IE_ERR_IO (cannot open/read,
 * with strerror), IE_ERR_FORMAT (longer than max_bytes), IE_ERR_NOMEM. On
 * failure *buf_out is NULL. */
ie_status_t ie_file_read(const char *what, const char *path, size_t max_bytes, char **buf_out, size_t *len_out);

#endif
