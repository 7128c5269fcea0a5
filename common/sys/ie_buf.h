/* ie_buf.h — a growable byte buffer (encoders and renderers append to it). */
#ifndef IE_BUF_H
#define IE_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct ie_buf {
    char *data; /* NUL-terminated after every append (not counted in len) */
    size_t len, cap;
} ie_buf_t;

/* len = 0, keeps the memory. */
void ie_buf_reset(ie_buf_t *b);
/* Frees and zeroes. Accepts a zeroed buffer. */
void ie_buf_free(ie_buf_t *b);
/* Append n bytes / a printf-formatted string. 0 ok, -1 out of memory (the
 * buffer is unchanged then). */
int ie_buf_append(ie_buf_t *b, const void *p, size_t n);
int ie_buf_printf(ie_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
