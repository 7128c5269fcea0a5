/* ie_serve.h — the coordinator's client endpoint over ZeroMQ: a ROUTER that
 * takes MessagePack requests (ie_proto.h, docs/PROTOCOL.md) and answers
 * with streamed token events and a final summary, or an error.
 *
 * Requests wait in a bounded queue ordered by priority (higher first, then
 * arrival); an overflow is answered at once with a "busy" error. Queued
 * requests with the same sampling settings run together as one
 * continuously batched set (up to the engine's n_seq at a time). Requests
 * that arrive while a set runs wait for the next set. A malformed request
 * gets an error reply and a log line; nothing a client sends stops the
 * loop. Cancelling works for queued requests. */
#ifndef IE_SERVE_H
#define IE_SERVE_H

#include "ie_engine.h"
#include "ie_metrics.h"
#include "ie_transport.h"

#include <signal.h>

typedef struct ie_serve_opts {
    ie_engine_t *engine;
    ie_sock_t *sock;             /* a bound ROUTER                        */
    int queue_max;               /* waiting requests at most (default 64) */
    volatile sig_atomic_t *stop; /* leave the loop when set               */
    ie_metrics_t *metrics;       /* optional                              */
    int verbose;
} ie_serve_opts_t;

/* Serve until *stop. Returns IE_OK, or an error of the socket itself. */
ie_status_t ie_serve_zmq(const ie_serve_opts_t *o);

#endif
