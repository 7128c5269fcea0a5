/* mmap.c — whole-file read-only mappings shared by the format readers. */
#include "ie_mmap.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ie_status_t ie_file_map(const char *what, const char *path, const void **map_out, size_t *len_out)
{
    ie_status_t st = IE_OK;
    struct stat sb;
    int fd = -1;

    *map_out = NULL;
    *len_out = 0;
    if (!path) return ie_error_set(IE_ERR_INVAL, "%s: path is NULL", what);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0) {
        st = ie_error_set(IE_ERR_IO, "%s: cannot open '%s': %s", what, path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ie_error_set(IE_ERR_IO, "%s: '%s' is not a regular file", what, path);
        goto cleanup;
    }
    if (sb.st_size == 0) goto cleanup;
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        st = ie_error_set(e == ENOMEM ? IE_ERR_NOMEM : IE_ERR_IO, "%s: cannot map '%s' (%zu bytes): %s", what, path,
                          len, strerror(e));
        goto cleanup;
    }
    (void)madvise(map, len, MADV_HUGEPAGE); /* a hint; file mappings usually refuse it */
    *map_out = map;
    *len_out = len;

cleanup:
    if (fd >= 0) close(fd);
    return st;
}

void ie_file_unmap(const void *map, size_t len)
{
    if (map && len) munmap((void *)map, len);
}

ie_status_t ie_file_read(const char *what, const char *path, size_t max_bytes, char **buf_out, size_t *len_out)
{
    ie_status_t st = IE_OK;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    *buf_out = NULL;
    *len_out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ie_error_set(IE_ERR_IO, "%s: cannot read '%s': %s", what, path, strerror(errno));
    for (;;) {
        if (len + 65536 + 1 > cap) {
            size_t ncap = (len + 65536 + 1) * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                st = ie_error_set(IE_ERR_NOMEM, "%s: out of memory reading '%s'", what, path);
                goto cleanup;
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (len > max_bytes) {
            st = ie_error_set(IE_ERR_FORMAT, "%s: '%s' is larger than %zu bytes", what, path, max_bytes);
            goto cleanup;
        }
        if (r == 0) break;
    }
    if (ferror(f)) {
        st = ie_error_set(IE_ERR_IO, "%s: cannot read '%s'", what, path);
        goto cleanup;
    }
    buf[len] = '\0';

cleanup:
    fclose(f);
    if (st != IE_OK) {
        free(buf);
        return st;
    }
    *buf_out = buf;
    *len_out = len;
    return IE_OK;
}

void ie_file_release_pages(const void *p, size_t n)
{
    const long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || !p || n == 0) return;
    const uintptr_t b = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    const uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)pg - 1);
    if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED);
}
