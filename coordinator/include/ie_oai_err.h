/* ie_oai_err.h — an HTTP error answer in OpenAI's shape ({"error":
 * {"message", "type", "param", "code"}}): filled where the error is found
 * (serve_http.c, serve_oai_lora.c), sent by serve_http.c. One type and one
 * setter for both, so the two cannot drift apart.
 */
#ifndef IE_OAI_ERR_H
#define IE_OAI_ERR_H

#include <stdarg.h>

typedef struct ie_oai_err {
    unsigned status;  /* HTTP status                              */
    const char *type; /* static: "invalid_request_error", ...     */
    const char *code; /* static or NULL                           */
    char param[64];   /* "" = null                                */
    char message[512];
} ie_oai_err_t;

/* Fill *e: status, type and code as given, param (NULL: none) and the
 * message printf-style (both cut to their fields). Returns -1, what the
 * handlers that fail return. */
int ie_oai_err_set(ie_oai_err_t *e, unsigned status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ie_oai_err_set with the message's arguments as a va_list. */
int ie_oai_err_vset(ie_oai_err_t *e, unsigned status, const char *type, const char *code, const char *param,
                    const char *fmt, va_list ap) __attribute__((format(printf, 6, 0)));

#endif
