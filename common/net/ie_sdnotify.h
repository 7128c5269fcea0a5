/* ie_sdnotify.h — systemd service notifications (libsystemd sd_notify).
 *
 * All calls are no-ops returning 0 when the process was not started by
 * systemd with a notify socket ($NOTIFY_SOCKET unset), so binaries call
 * them unconditionally. */
#ifndef IE_SDNOTIFY_H
#define IE_SDNOTIFY_H

#include <stdint.h>

/* READY=1 plus STATUS=<status> (status may be NULL). >0 sent, 0 no socket,
 * <0 failed (-errno). */
int ie_sd_ready(const char *status);
/* STATUS=<printf text>. */
int ie_sd_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* WATCHDOG=1. */
int ie_sd_watchdog(void);
/* STOPPING=1. */
int ie_sd_stopping(void);
/* The watchdog interval systemd asked for ($WATCHDOG_USEC for this pid),
 * in microseconds; 0 when none. Ping at half of it. */
uint64_t ie_sd_watchdog_usec(void);

#endif
