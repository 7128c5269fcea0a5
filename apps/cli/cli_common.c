/* cli_common.c — the helpers every executable shares: the one error exit,
 * strict integer flags, the exit code for a failed load, a path's base name. */
#define _GNU_SOURCE
#include "ie_cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ie_cli_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int ie_cli_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int ie_cli_exit_for_load(ie_status_t st)
{
    switch (st) {
    case IE_ERR_IO:
    case IE_ERR_FORMAT:
    case IE_ERR_UNSUPPORTED: return IE_EXIT_MODEL;
    case IE_ERR_NOMEM: return IE_EXIT_NOMEM;
    case IE_ERR_INVAL: return IE_EXIT_USAGE;
    default: return IE_EXIT_ENGINE;
    }
}

/* Contract (ie_cli.h): the last component of path, trailing '/' dropped;
 * malloc'd, the caller frees; NULL when out of memory. */
char *ie_cli_base_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    return strndup(path + b, n - b);
}
