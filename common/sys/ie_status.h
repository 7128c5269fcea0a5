/* ie_status.h — status codes and the per-thread error message.
 *
 * Every fallible function in clocher returns an ie_status_t. On failure it
 * also records a one-line human-readable reason with ie_error_set(); the
 * caller reads it with ie_error_last() (thread-local, valid until the next
 * ie_error_set on the same thread). Library code never calls exit().
 */
#ifndef IE_STATUS_H
#define IE_STATUS_H

#include "clocher.h" /* ie_status_t, ie_status_str, ie_error_last: public */

#include <stddef.h>

/* Record a printf-style reason for the current thread's last failure and
 * return `st` (so callers can write `return ie_error_set(IE_ERR_IO, ...)`). */
ie_status_t ie_error_set(ie_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the current thread's last reason. */
void ie_error_clear(void);

#endif
