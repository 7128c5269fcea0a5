/* ie_clock.h — the monotonic clock every timing in clocher reads. */
#ifndef IE_CLOCK_H
#define IE_CLOCK_H

#include <time.h>

/* Milliseconds / seconds on CLOCK_MONOTONIC (arbitrary origin). */
static inline double ie_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline double ie_now_s(void) { return ie_now_ms() / 1e3; }

#endif
