/* ie_status.h — status codes and the per-thread error message.
 *
 * Every fallible function in clocher returns an ie_status_t. On failure it
 * also records a one-line human-readable reason with ie_error_set(); the
 * caller reads it with ie_error_last() (thread-local, valid until the next
 * ie_error_set on the same thread). Library code never calls exit().
 */
#ifndef IE_STATUS_H
#define IE_STATUS_H

#include <stddef.h>

typedef enum ie_status {
    IE_OK = 0,
    IE_ERR_INVAL,       /* bad argument / bad usage                         */
    IE_ERR_IO,          /* file missing or unreadable                       */
    IE_ERR_FORMAT,      /* file readable but malformed / inconsistent       */
    IE_ERR_UNSUPPORTED, /* well-formed but uses something we do not support */
    IE_ERR_NOMEM,       /* allocation failed                                */
    IE_ERR_RANGE,       /* value out of range (context full, id too big)    */
    IE_ERR_INTERNAL,    /* programmer error caught at run time              */
    IE_ERR_TIMEOUT,     /* nothing arrived in time (not always a failure)   */
    IE_ERR_UNAVAILABLE, /* a peer is gone or the cluster is not ready       */
    IE_ERR_BUSY         /* queue full: try again later                      */
} ie_status_t;

/* Static name of a status, e.g. "IE_ERR_FORMAT". Never NULL. */
const char *ie_status_str(ie_status_t st);

/* Record a printf-style reason for the current thread's last failure and
 * return `st` (so callers can write `return ie_error_set(IE_ERR_IO, ...)`). */
ie_status_t ie_error_set(ie_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The current thread's last recorded reason ("" if none). Never NULL. */
const char *ie_error_last(void);

/* Clear the current thread's last reason. */
void ie_error_clear(void);

#endif
