/* ie_serve.h — the coordinator's serving loop and its ZeroMQ client
 * endpoint.
 *
 * ie_serve_run turns the loop of a serving process: it keeps the cluster
 * alive (heartbeats, registrations, the systemd watchdog), takes client
 * requests from the ZeroMQ ROUTER (MessagePack, ie_proto.h,
 * docs/PROTOCOL.md) into the scheduler, and steps the scheduler (ie_sched.h)
 * — so requests from every front end (ZeroMQ, the HTTP API of ie_http.h,
 * which submits from its own threads) join and leave one continuously
 * batched run at every step.
 *
 * ZeroMQ replies: streamed token events (when the request asks for them)
 * and a final summary, or an error with a code: "busy" at once when the
 * scheduler's queue is full, "invalid_request" (with a log line) for a
 * malformed request or a message of more than one frame after the
 * envelope, "cancelled", "timeout", "unavailable". Nothing a client sends
 * stops the loop. A "cancel" message cancels a queued or running request
 * of the same client, and so does the end of the client's connection (the
 * socket should be watched, ie_sock_watch_peers: that is how the loop
 * learns of it).
 */
#ifndef IE_SERVE_H
#define IE_SERVE_H

#include "ie_engine.h"
#include "ie_metrics.h"
#include "ie_sched.h"
#include "ie_transport.h"

#include <signal.h>

/* ZeroMQ heartbeat interval for the client socket (ie_sock_watch_peers):
 * a client whose host vanished is dropped after three silent intervals. */
#define IE_SERVE_CLIENT_HEARTBEAT_MS 5000

typedef struct ie_serve_opts {
    ie_engine_t *engine;
    ie_sched_t *sched;           /* requests go here; the loop steps it    */
    ie_sock_t *sock;             /* a bound ROUTER for ZeroMQ clients, or
                                    NULL (HTTP only)                      */
    int request_timeout_ms;      /* per-request limit (0: none)           */
    volatile sig_atomic_t *stop; /* drain, then leave the loop, when set  */
    int drain_ms;                /* once *stop is set: new requests are
                                    refused ("unavailable", HTTP 503) and
                                    the accepted ones may finish for this
                                    long (0: none, they end at once)     */
    ie_metrics_t *metrics;       /* optional                              */
    int verbose;
} ie_serve_opts_t;

/* Serve until *stop, then drain (drain_ms). Requests of ZeroMQ clients
 * still open when the loop ends get "unavailable". Returns IE_OK, or an
 * error of the socket itself. */
ie_status_t ie_serve_run(const ie_serve_opts_t *o);

#endif
