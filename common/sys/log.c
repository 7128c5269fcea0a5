/* log.c — one timestamped line to stderr (ie_clock.h). */
#include "ie_clock.h"

#include <stdarg.h>

/* Contract (ie_clock.h). The line is formatted whole first so that
 * concurrent writers do not interleave inside it. */
void ie_log(const char *fmt, ...)
{
    char line[1024], when[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s", ie_log_time(when, sizeof when), line);
}
