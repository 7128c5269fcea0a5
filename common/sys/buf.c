/* buf.c — growable byte buffer. */
#include "ie_buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ie_buf_reset(ie_buf_t *b)
{
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void ie_buf_free(ie_buf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static int reserve(ie_buf_t *b, size_t extra)
{
    if (extra > (size_t)-1 / 2 - b->len) return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t c = b->cap ? b->cap : 256;
    while (c < need) c *= 2;
    char *p = realloc(b->data, c);
    if (!p) return -1;
    b->data = p;
    b->cap = c;
    return 0;
}

int ie_buf_append(ie_buf_t *b, const void *p, size_t n)
{
    if (reserve(b, n) != 0) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int ie_buf_printf(ie_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n) != 0) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}
