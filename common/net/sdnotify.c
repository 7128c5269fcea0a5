/* sdnotify.c — systemd readiness, status and watchdog notifications (see
 * ie_sdnotify.h), a thin layer over libsystemd's sd_notify.
 *
 * The environment is left set (unset_environment = 0): the service keeps
 * notifying for its whole life (status lines, watchdog pings, STOPPING), not
 * just once at start-up.
 */
#define _GNU_SOURCE
#include "ie_sdnotify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

/* The notify protocol is newline-separated KEY=VALUE pairs: a newline in a
 * status text would start a bogus assignment, so it becomes a space. */
static void flatten(char *s)
{
    for (; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

/* Contract: sends READY=1 and, when status is not NULL, STATUS=<status>.
 * >0 sent, 0 no notify socket, <0 -errno. */
int ie_sd_ready(const char *status)
{
    if (!status) return sd_notify(0, "READY=1");
    char *text = strdup(status);
    if (!text) return -ENOMEM;
    flatten(text);
    int rc = sd_notifyf(0, "READY=1\nSTATUS=%s", text);
    free(text);
    return rc;
}

/* Contract: sends STATUS=<formatted text> (newlines become spaces). >0
 * sent, 0 no notify socket, <0 -errno. */
int ie_sd_status(const char *fmt, ...)
{
    char *text = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (n < 0) return -ENOMEM;
    flatten(text);
    int rc = sd_notifyf(0, "STATUS=%s", text);
    free(text);
    return rc;
}

/* Contract: sends WATCHDOG=1. >0 sent, 0 no notify socket, <0 -errno. */
int ie_sd_watchdog(void) { return sd_notify(0, "WATCHDOG=1"); }

/* Contract: sends STOPPING=1. >0 sent, 0 no notify socket, <0 -errno. */
int ie_sd_stopping(void) { return sd_notify(0, "STOPPING=1"); }

/* Contract: $WATCHDOG_USEC when the watchdog is meant for this process
 * ($WATCHDOG_PID unset or our pid), else 0 (also for malformed values). */
uint64_t ie_sd_watchdog_usec(void)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0) return 0;
    return usec;
}
