/* mmap.c — whole-file read-only mappings shared by the format readers. */
#include "ie_mmap.h"

#include <errno.h>
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
        st = ie_error_set(e == ENOMEM ? IE_ERR_NOMEM : IE_ERR_IO, "%s: cannot map '%s' (%zu bytes): %s", what,
                          path, len, strerror(e));
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
