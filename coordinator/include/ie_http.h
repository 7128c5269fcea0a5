/* ie_http.h — the coordinator's OpenAI-compatible HTTP API (libmicrohttpd).
 *
 *   POST /v1/completions        {"model", "prompt", "max_tokens", "temperature",
 *                                "top_p", "stop", "seed", "stream", ...}
 *   POST /v1/chat/completions   {"model", "messages", ...}; the prompt is the
 *                               model's own chat template (ie_chat.h: ChatML
 *                               for SmolLM2, harmony for GPT-OSS)
 *   POST /v1/embeddings         {"model", "input", "encoding_format"}: pooled
 *                               final-norm hidden states (ie_embd.h)
 *   GET  /v1/models             the one model served
 *   GET  /health                200 {"status":"ok"} when steps can run, else
 *                               503 (a cluster that is not ready)
 *   GET  /metrics               the Prometheus registry (when one is given)
 *
 * Requests go to the scheduler (ie_sched.h). "stream": true answers with
 * server-sent events ("data: {chunk}\n\n" ... "data: [DONE]\n\n"). Errors
 * use OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400
 * invalid_request_error for bad JSON or parameters, 401 without the right
 * API key, 404 unknown path or model, 405 wrong method, 413 a body too
 * large, 415 a POST whose Content-Type is not application/json (a browser
 * sends text/plain across origins without a CORS preflight), 429 when the
 * queue is full ("busy"), 503 when workers are unavailable or the server
 * drains, 504 on a request timeout, 500 otherwise; 429 and 503 carry
 * "Retry-After: 1". A string with a NUL character (\u0000) is refused
 * (400) rather than cut short. Connections: at most max_conns,
 * max_conns_per_addr from one address (more are closed at once), and each
 * request must be read whole within read_timeout_ms. A client that
 * disconnects has its request cancelled (its KV blocks are freed at the
 * next step).
 *
 * The server runs on libmicrohttpd's threads; it never steps the scheduler
 * itself — the serving loop (ie_serve_run) does.
 */
#ifndef IE_HTTP_H
#define IE_HTTP_H

#include "ie_engine.h"
#include "ie_metrics.h"
#include "ie_sched.h"

typedef struct ie_http ie_http_t;

#define IE_HTTP_READ_TIMEOUT_MS 10000
#define IE_HTTP_MAX_CONNS 1024
#define IE_HTTP_MAX_CONNS_PER_ADDR 256

typedef struct ie_http_opts {
    ie_engine_t *engine;     /* tokenizer, chat template, shapes        */
    ie_sched_t *sched;       /* where requests go                       */
    const char *addr;        /* listen address (NULL: "127.0.0.1")       */
    int port;                /* 0: pick a free port (ie_http_port)      */
    const char *api_key;     /* non-NULL: require "Authorization: Bearer
                                  <key>" on /v1/ endpoints               */
    const char *model_name;  /* id in /v1/models and responses (NULL:
                                  the model file's base name)            */
    ie_metrics_t *metrics;   /* served at /metrics when non-NULL        */
    int request_timeout_ms;  /* per-request limit given to the scheduler
                                  (0: none)                               */
    int max_body;            /* bytes of request body at most (0: 1 MiB) */
    int read_timeout_ms;     /* a connection's whole request (line,
                                  headers, body) must arrive within this
                                  of its start or of the previous answer;
                                  else it is closed (0: 10 s)            */
    int max_conns;           /* open connections at most (0: 1024)      */
    int max_conns_per_addr;  /* ... from one client address (0: 256)    */
    int verbose;             /* one log line per request to stderr      */
    const char *cors_origin; /* non-NULL: answer CORS preflights (OPTIONS)
                                  and allow this origin ("*": any) */
    int pooling;             /* /v1/embeddings: ie_pooling_t (ie_sched.h; 0: mean) */
    int embd_norm;           /* ... IE_EMBD_NORM_L2 or _NONE (ie_embd.h; 0: L2)    */
} ie_http_opts_t;

/* Start listening. IE_ERR_IO when the address cannot be bound (message
 * names it), IE_ERR_INVAL for bad options. Caller owns *out. */
ie_status_t ie_http_start(const ie_http_opts_t *o, ie_http_t **out);

/* The port actually bound. */
int ie_http_port(const ie_http_t *h);

/* Stop accepting; open connections get an error (or the end of their event
 * stream) and are closed; their requests are cancelled in the scheduler;
 * returns when every connection has ended. A request's state outlives its
 * connection until the scheduler's terminal event for it arrives (that
 * event touches only the request's own state, never the ie_http_t), so
 * the usual shutdown — leave the serving loop, ie_http_stop,
 * ie_sched_destroy — frees everything, and no order of the two deadlocks.
 * Accepts NULL. */
void ie_http_stop(ie_http_t **self_p);

#endif
