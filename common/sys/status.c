/* status.c — status names and the thread-local last-error message. */
#include "ie_status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char g_last_error[512];

const char *ie_status_str(ie_status_t st)
{
    switch (st) {
    case IE_OK: return "IE_OK";
    case IE_ERR_INVAL: return "IE_ERR_INVAL";
    case IE_ERR_IO: return "IE_ERR_IO";
    case IE_ERR_FORMAT: return "IE_ERR_FORMAT";
    case IE_ERR_UNSUPPORTED: return "IE_ERR_UNSUPPORTED";
    case IE_ERR_NOMEM: return "IE_ERR_NOMEM";
    case IE_ERR_RANGE: return "IE_ERR_RANGE";
    case IE_ERR_INTERNAL: return "IE_ERR_INTERNAL";
    case IE_ERR_TIMEOUT: return "IE_ERR_TIMEOUT";
    case IE_ERR_UNAVAILABLE: return "IE_ERR_UNAVAILABLE";
    case IE_ERR_BUSY: return "IE_ERR_BUSY";
    }
    return "IE_ERR_UNKNOWN";
}

ie_status_t ie_error_set(ie_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return st;
}

const char *ie_error_last(void) { return g_last_error; }

void ie_error_clear(void) { g_last_error[0] = '\0'; }
