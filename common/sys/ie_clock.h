/* ie_clock.h — the monotonic clock every timing in clocher reads. */
#ifndef IE_CLOCK_H
#define IE_CLOCK_H

#include <stdio.h>
#include <time.h>

/* Milliseconds / seconds on CLOCK_MONOTONIC (arbitrary origin). */
static inline double ie_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline double ie_now_s(void) { return ie_now_ms() / 1e3; }

/* The CLOCK_MONOTONIC time ms milliseconds (>= 0) from now, for
 * pthread_cond_timedwait on a condition variable set to that clock. */
static inline struct timespec ie_deadline_ms(long ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* The wall clock for log lines: "2026-11-26T21:40:01.123Z" (UTC, ms) into
 * out[cap] (cap >= 25; shorter: cut). Services log to stderr, which is not
 * always the journal: a line carries its own time. */
static inline const char *ie_log_time(char *out, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    char day[24];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, cap, "%s.%03dZ", day, (int)(ts.tv_nsec / 1000000));
    return out;
}

/* One line to stderr, ie_log_time first: printf's format and arguments
 * (the caller ends the line with its own newline). */
void ie_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
