/* serve_http_gate.h — the HTTP server's front door (serve_http.c): the
 * listening socket is ours, not libmicrohttpd's, so that a request head
 * libmicrohttpd would answer with its compiled-in HTML page (a malformed
 * request line or header, an HTTP version other than 1.0/1.1, a head past
 * its memory) is answered in OpenAI's JSON error shape instead.
 *
 * An acceptor thread accepts each connection, keeps it in an epoll set
 * (edge-triggered: the bytes are only peeked, never consumed, so that they
 * stay for libmicrohttpd) until its first request head is complete or
 * fails, and then either answers the failure itself (JSON, Connection:
 * close, the socket closed after a short lingering drain) or hands the
 * connection to libmicrohttpd (ie_http_gate_opts_t.admit). Only the first
 * request's head is checked; later requests on a kept-alive connection are
 * libmicrohttpd's. The connection limits (total, per address) and the
 * request-read deadline count the connections held here too. Internal to
 * the coordinator library. */
#ifndef IE_SERVE_HTTP_GATE_H
#define IE_SERVE_HTTP_GATE_H

#include "ie_status.h"

#include <stddef.h>
#include <sys/socket.h>

#define IE_HTTP_GATE_PEEK \
    (32 *                 \
     1024) /* a first head longer than this is refused: above the 8 KiB URI + 16 KiB headers that libmicrohttpd's side accepts */

/* Why a head was refused: the HTTP status, OpenAI's code and a message. */
typedef struct ie_http_head_err {
    int status;
    const char *code;
    char message[160];
} ie_http_head_err_t;

/* Contract: checks the start of a connection's bytes p[0..n) (n may be 0;
 * full: no more bytes will be looked at, n is the peek limit). Returns 1
 * when a whole request head ("\r\n\r\n" or "\n\n") is there and well
 * formed (request line METHOD SP target SP HTTP/1.0|1.1, header lines with
 * a colon, a numeric Content-Length, a Host header for HTTP/1.1), 0 when
 * it is not complete yet and nothing is wrong so far (never when full),
 * -1 when it is refused (*e: 400 malformed_request, 505
 * http_version_not_supported, 414 uri_too_long or 431 headers_too_large
 * when full; the messages name max_uri / max_headers). Never reads past
 * p[n-1]; p need not be NUL-terminated. */
int ie_http_head_check(const char *p, size_t n, int full, int max_uri, int max_headers, ie_http_head_err_t *e);

/* Contract: writes the JSON error answer for e into buf (cap bytes): the
 * status line, Content-Type, Content-Length, Connection: close and the
 * body {"error": {"message", "type": "invalid_request_error", "param":
 * null, "code"}}. Returns its length, 0 when it does not fit. */
size_t ie_http_head_answer(const ie_http_head_err_t *e, char *buf, size_t cap);

typedef struct ie_http_gate ie_http_gate_t;

typedef struct ie_http_gate_opts {
    int max_conns;            /* connections at most, held here and by libmicrohttpd */
    int max_conns_per_addr;   /* the same, from one peer address                      */
    int read_timeout_ms;      /* a first head must be complete within this            */
    int max_uri, max_headers; /* for the messages of 414 / 431                      */
    int verbose;
    /* hands a connection with a good first head on; fd is the callee's
     * from then (closed by it on failure); t_accept is when it was
     * accepted (ie_now_ms), where the read deadline began */
    void (*admit)(void *ctx, int fd, const struct sockaddr *sa, socklen_t len, double t_accept);
    /* the connections the callee holds: returns the total, *n_addr those
     * from sa's address */
    int (*held)(void *ctx, const struct sockaddr *sa, int *n_addr);
    void (*on_slow)(void *ctx);               /* one closed at the read deadline */
    void (*on_answer)(void *ctx, int status); /* one refused with status          */
    void *ctx;
} ie_http_gate_opts_t;

/* Contract: starts the acceptor on listen_fd (bound and listening; it is
 * made non-blocking and stays the caller's: close it after
 * ie_http_gate_stop). The callbacks run on the acceptor thread. *out
 * receives the gate (ie_http_gate_stop). IE_ERR_NOMEM, IE_ERR_IO. */
ie_status_t ie_http_gate_start(int listen_fd, const ie_http_gate_opts_t *o, ie_http_gate_t **out);

/* Contract: stops the acceptor thread, closes the connections it still
 * holds (not the listening socket), frees the gate, sets *g to NULL. */
void ie_http_gate_stop(ie_http_gate_t **g);

#endif
