/* serve_http.c — the OpenAI-compatible HTTP API (ie_http.h) on libmicrohttpd.
 *
 * Threads. libmicrohttpd runs a listening thread and one thread per
 * connection (MHD_USE_THREAD_PER_CONNECTION), where handlers may block: a
 * request is straight-line code — read the body, parse, submit to the
 * scheduler, wait for its events, answer. The serving loop steps the
 * scheduler on its own thread; the scheduler's callback (req_on_event)
 * touches only the request's state (req_t: a mutex, a condition variable,
 * the text and ids not yet sent, the outcome), never the ie_http_t.
 *
 * Ownership. A req_t is reference counted: one reference for the
 * connection (dropped when libmicrohttpd reports the request completed),
 * one for the body of a streamed response (dropped when libmicrohttpd
 * frees the response), one for the scheduler from each choice's
 * submission to its terminal event (a request with "n" > 1 is n
 * scheduler requests of the same prompt, its choices). So a request
 * outlives its connection until the scheduler is done with it, and the
 * scheduler may deliver that event after the server is gone
 * (ie_http_stop before ie_sched_destroy).
 *
 * Waiting. A connection thread sleeps on its request's condition variable
 * and wakes for every event — streams flow token by token — and every
 * IE_HTTP_POLL_MS to see whether its client hung up (poll POLLRDHUP on the
 * socket) or the server is stopping. A client that hangs up, noticed there
 * or by a failed write, has its request cancelled in the request-completed
 * callback (its KV blocks are freed at the next step). A client that
 * half-closes its socket (shutdown(SHUT_WR)) after sending counts as gone.
 *
 * Streams. The response headers wait for the request's first event, so a
 * request that fails before its first token (a timeout in the queue, the
 * cluster lost) gets its own status rather than a 200 with an error event;
 * after that an error arrives as an event {"error": {...}} (the openai
 * client raises it) and the stream ends with "data: [DONE]".
 *
 * Harmony models (GPT-OSS): the generated ids go through the harmony
 * stream parser (ie_harmony.h); message content is the final channel, the
 * analysis channel is returned as "reasoning_content" (vLLM's name).
 */
#define _GNU_SOURCE
#include "ie_http.h"
#include "ie_clock.h"

#include "ie_chat.h"
#include "ie_embd.h"
#include "ie_grammar.h"
#include "ie_harmony.h"
#include "ie_logprobs.h"
#include "ie_model_src.h"
#include "ie_oai_err.h"
#include "ie_oai_format.h"
#include "serve_http_gate.h"
#include "serve_oai_tools.h"
#include "serve_tok.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include "ie_serve_lora.h"
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IE_HTTP_POLL_MS 100        /* hang-up / stop checks while waiting */
#define IE_HTTP_STOP_GRACE_MS 3000 /* ie_http_stop waits this long for answers */
#define IE_HTTP_MAX_STOP 16        /* stop strings per request at most    */
#define IE_HTTP_MAX_STOP_IDS 64    /* stop_token_ids per request at most  */
#define IE_HTTP_JSON "application/json"
#define IE_HTTP_REAP_MS 200 /* how often slow request reads are looked for */
/* libmicrohttpd answers a request line or headers that outgrow a
 * connection's memory itself, with an HTML page (its build decides the
 * body; no option replaces it). So its memory is set well above limits of
 * our own, which are checked in the handler and answered in OpenAI's JSON
 * shape: only a request beyond IE_HTTP_CONN_MEMORY still gets its page.
 * The memory is mapped per connection and touched as it is used. */
#define IE_HTTP_MAX_URI 8192             /* path + query, bytes: 414 beyond      */
#define IE_HTTP_MAX_HEADERS 16384        /* names + values, bytes: 431 beyond    */
#define IE_HTTP_CONN_MEMORY (256 * 1024) /* libmicrohttpd's per-connection pool */

/* One open connection, for the request-read deadline: from its start (or
 * the previous answer, on a kept-alive connection) until its request has
 * been read whole. Linked in ie_http.conns under conns_mu. */
typedef struct hconn {
    int fd;
    struct sockaddr_storage peer; /* checked before a shutdown: the fd is ours */
    socklen_t peer_len;
    double t_read; /* when reading the current request began      */
    int reading;   /* the request is not read whole yet           */
    int cut;       /* shut down for reading too slowly            */
    struct hconn *prev, *next;
} hconn_t;

struct ie_http {
    ie_http_opts_t o; /* borrowed pointers: engine, sched, metrics */
    char *api_key;    /* owned copies of the strings            */
    char *cors_origin;
    char *model_name;
    struct MHD_Daemon *d;
    MHD_socket listen_fd; /* ours: the gate accepts on it              */
    int port;
    long created; /* start time, for /v1/models            */
    const ie_tokenizer_t *tok;
    ie_chat_format_t chat_fmt;
    int n_ctx;
    int32_t n_vocab;
    size_t max_body;
    atomic_int stopping;
    pthread_mutex_t mu; /* n_busy                                */
    pthread_cond_t cv;
    int n_busy;           /* generation requests not yet completed  */
    ie_metric_t *m_req;   /* ie_http_requests_total{code}          */
    ie_metric_t *m_gone;  /* ie_http_client_disconnects_total      */
    ie_metric_t *m_slow;  /* ie_http_slow_requests_total           */
    ie_metric_t *m_stage; /* ie_stage_seconds{stage="tokenize"}   */
    pthread_mutex_t conns_mu;
    hconn_t *conns;   /* every open connection                 */
    pthread_t reaper; /* cuts connections past read_timeout_ms */
    int reaper_running;
    pthread_cond_t reaper_cv; /* wakes the reaper to stop (conns_mu) */
    ie_http_gate_t *gate;     /* accepts, checks first request heads    */
    hconn_t *handoff;         /* handed to libmicrohttpd, not started   */
};

/* ------------------------------------------------------------- requests */

#define IE_HTTP_MAX_N 16        /* choices per prompt at most ("n")       */
#define IE_HTTP_MAX_PROMPTS 256 /* prompts per completions request at most */
#define IE_HTTP_MAX_CHOICES 256 /* prompts x n at most                     */

/* One generated token's log-probabilities (a TOKEN event's). */
typedef struct tok_lp {
    int32_t id;
    float logprob;
    int n_top;
    ie_token_logprob_t top[IE_LOGPROBS_MAX_TOP];
} tok_lp_t;

struct req;

/* One choice of a request: one scheduler request. Fields under the
 * request's mu are written by the scheduler callback and read by the
 * connection; the outcome fields are written once, with `terminal`, and
 * read-only after. */
typedef struct choice {
    struct req *r;
    int index;     /* prompt * n + its number among the prompt's n */
    int prompt;    /* the request's prompt it continues            */
    ie_buf_t text; /* released text not yet taken (mu)          */
    int32_t *ids;  /* token ids not yet taken (mu)              */
    size_t n_ids, cap_ids;
    tok_lp_t *lp; /* every token's log-probabilities so far,
                             in order, when the request asks (mu)     */
    size_t n_lp, cap_lp;
    size_t n_events; /* TOKEN events so far (mu)                  */
    int terminal;    /* 0, IE_SCHED_DONE or IE_SCHED_ERROR (mu)   */
    char *all_text;  /* outcome: the whole output                  */
    int32_t *all_ids;
    size_t n_gen;
    ie_finish_t finish;
    ie_status_t status;
    char code[32];
    char message[256];
    uint64_t id; /* connection thread only                    */
    int submitted;
    int abandoned;         /* never submitted: another choice failed first */
    ie_lora_lease_t lease; /* its adapter set, leased before submission
                              and given back at its terminal event (set
                              -1: none held)                              */
} choice_t;

/* One prompt of a request. With echo: its text (as given, or its ids
 * decoded) and its tokens' log-probabilities from its first choice (set
 * once, under mu; entry 0 NaN) when the request asks for logprobs. */
typedef struct rprompt {
    int32_t *ids; /* echo only */
    size_t n_ids;
    char *echo_text;
    tok_lp_t *plp;
} rprompt_t;

/* One generation request: its choices (n per prompt) share the lock and the
 * condition variable, so a connection waits for whichever choice moves next. */
typedef struct req {
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;     /* choices: n_prompts x n_per                 */
    int n_per; /* choices per prompt ("n")                   */
    int n_prompts;
    int logprobs;    /* keep the TOKEN events' log-probabilities   */
    size_t n_ev;     /* events of every choice so far (mu)         */
    int n_done;      /* choices ended (mu)                         */
    int oom;         /* an event could not be stored (mu)         */
    size_t n_prompt; /* prompt tokens, every prompt's once         */
    choice_t *ch;
    rprompt_t *pr;
    ie_lora_cache_t *lc;  /* the engine's adapter registry (choices' leases) */
    ie_oai_tools_t tools; /* the request's tools (serve_oai_tools.h); read-only */
} req_t;

static req_t *req_new(int n_prompts, int n_per, int logprobs)
{
    req_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->ch = calloc((size_t)(n_prompts * n_per), sizeof *r->ch);
    r->pr = calloc((size_t)n_prompts, sizeof *r->pr);
    if (!r->ch || !r->pr) {
        free(r->ch);
        free(r->pr);
        free(r);
        return NULL;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&r->refs, 1);
    r->n = n_prompts * n_per;
    r->n_per = n_per;
    r->n_prompts = n_prompts;
    r->logprobs = logprobs;
    for (int i = 0; i < r->n; i++) {
        r->ch[i].r = r;
        r->ch[i].index = i;
        r->ch[i].prompt = i / n_per;
        r->ch[i].lease = (ie_lora_lease_t){.id = -1, .salt = 0, .set = -1};
    }
    return r;
}

static void req_ref(req_t *r) { atomic_fetch_add(&r->refs, 1); }

static void req_unref(req_t *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    for (int i = 0; i < r->n; i++) {
        choice_t *c = &r->ch[i];
        ie_buf_free(&c->text);
        free(c->ids);
        free(c->lp);
        free(c->all_text);
        free(c->all_ids);
    }
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->pr[i].ids);
        free(r->pr[i].echo_text);
        free(r->pr[i].plp);
    }
    ie_oai_tools_free(&r->tools);
    free(r->ch);
    free(r->pr);
    free(r);
}

static int req_push_id(choice_t *r, int32_t id)
{
    if (r->n_ids == r->cap_ids) {
        size_t cap = r->cap_ids ? r->cap_ids * 2 : 64;
        int32_t *n = realloc(r->ids, cap * sizeof *n);
        if (!n) return -1;
        r->ids = n;
        r->cap_ids = cap;
    }
    r->ids[r->n_ids++] = id;
    return 0;
}

static int req_push_lp(choice_t *c, const ie_sched_event_t *ev)
{
    if (c->n_lp == c->cap_lp) {
        size_t cap = c->cap_lp ? c->cap_lp * 2 : 32;
        tok_lp_t *n = realloc(c->lp, cap * sizeof *n);
        if (!n) return -1;
        c->lp = n;
        c->cap_lp = cap;
    }
    tok_lp_t *t = &c->lp[c->n_lp++];
    t->id = ev->token;
    t->logprob = ev->logprob;
    t->n_top = ev->n_top < IE_LOGPROBS_MAX_TOP ? ev->n_top : IE_LOGPROBS_MAX_TOP;
    if (t->n_top > 0) memcpy(t->top, ev->top, (size_t)t->n_top * sizeof *t->top);
    return 0;
}

/* The prompt's log-probabilities of an event (ie_sched_event_t.prompt_lp)
 * into pr->plp, for echo: entry i holds prompt token i. -1 out of memory. */
static int req_take_plp(rprompt_t *pr, const ie_sched_event_t *ev)
{
    if (ev->n_prompt != pr->n_ids) return 0; /* not this prompt's (cannot happen) */
    tok_lp_t *p = calloc(pr->n_ids ? pr->n_ids : 1, sizeof *p);
    if (!p) return -1;
    const int k = ev->prompt_k < IE_LOGPROBS_MAX_TOP ? ev->prompt_k : IE_LOGPROBS_MAX_TOP;
    for (size_t i = 0; i < pr->n_ids; i++) {
        p[i].id = pr->ids[i];
        p[i].logprob = ev->prompt_lp[i];
        p[i].n_top = i ? k : 0;
        if (i && k) memcpy(p[i].top, ev->prompt_top + i * (size_t)ev->prompt_k, (size_t)k * sizeof *p[i].top);
    }
    pr->plp = p;
    return 0;
}

/* The scheduler's callback (serving thread), ctx a choice_t: store the
 * event, wake the connection; the terminal event drops the scheduler's
 * reference. */
static void req_on_event(void *ctx, const ie_sched_event_t *ev)
{
    choice_t *c = ctx;
    req_t *r = c->r;
    int terminal = ev->kind != IE_SCHED_TOKEN;
    pthread_mutex_lock(&r->mu);
    rprompt_t *pr = &r->pr[c->prompt];
    if (ev->prompt_lp && !pr->plp && pr->ids && req_take_plp(pr, ev) != 0) r->oom = 1;
    if (!terminal) {
        c->n_events++;
        if (ev->len && ie_buf_append(&c->text, ev->text, ev->len) != 0) r->oom = 1;
        if (req_push_id(c, ev->token) != 0) r->oom = 1;
        if (r->logprobs && ev->has_logprob && req_push_lp(c, ev) != 0) r->oom = 1;
    } else {
        c->n_gen = ev->n_gen;
        c->finish = ev->finish;
        c->status = ev->status;
        snprintf(c->code, sizeof c->code, "%s", ev->code ? ev->code : "");
        snprintf(c->message, sizeof c->message, "%s", ev->message ? ev->message : "");
        if (ev->all_text && !(c->all_text = strdup(ev->all_text))) r->oom = 1;
        if (ev->ids && ev->n_gen) {
            if ((c->all_ids = malloc(ev->n_gen * sizeof *c->all_ids)))
                memcpy(c->all_ids, ev->ids, ev->n_gen * sizeof *c->all_ids);
            else r->oom = 1;
        }
        c->terminal = ev->kind;
        r->n_done++;
    }
    r->n_ev++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (terminal) {
        ie_lora_cache_release(r->lc, &c->lease, ev->n_gen); /* an unloaded adapter may go now */
        req_unref(r);
    }
}

/* With r->mu held: the first choice that ended with an error (one that
 * ran before one abandoned), or NULL. */
static const choice_t *req_failed_locked(const req_t *r)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < r->n; i++)
            if (r->ch[i].terminal == IE_SCHED_ERROR && r->ch[i].abandoned == pass) return &r->ch[i];
    return NULL;
}

/* With r->mu held: the choices not submitted end here (a choice failed
 * before they started), so that waiting for every choice ends. */
static void req_abandon_locked(req_t *r)
{
    for (int i = 0; i < r->n; i++) {
        choice_t *c = &r->ch[i];
        if (c->submitted || c->terminal) continue;
        c->terminal = IE_SCHED_ERROR;
        c->abandoned = 1;
        c->status = IE_ERR_INVAL;
        snprintf(c->code, sizeof c->code, "cancelled");
        snprintf(c->message, sizeof c->message, "not started: another choice of the request failed");
        r->n_done++;
    }
}

enum { WAIT_OK = 0, WAIT_GONE = -1, WAIT_STOP = -2 };

/* 1 when the client closed its end of the connection. */
static int peer_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* With r->mu held: wait until every choice has ended (any == 0) or until
 * an event beyond the first `seen` arrived (any == 1). WAIT_GONE when the
 * client hung up, WAIT_STOP when the server is stopping (checked every
 * IE_HTTP_POLL_MS). */
static int req_wait_locked(req_t *r, ie_http_t *h, int fd, int any, size_t seen)
{
    for (;;) {
        if (r->n_done == r->n || r->oom || (any && r->n_ev > seen)) return WAIT_OK;
        if (atomic_load(&h->stopping)) return WAIT_STOP;
        if (peer_gone(fd)) return WAIT_GONE;
        const struct timespec ts = ie_deadline_ms(IE_HTTP_POLL_MS);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
}

/* ------------------------------------------------------------ responses */

/* An error in OpenAI's shape, kept until the answer is sent (the type
 * serve_oai_lora.c fills too). */
typedef ie_oai_err_t http_err_t;

static int err_set(http_err_t *e, unsigned status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ie_oai_err_set under the short name this file uses everywhere. */
static int err_set(http_err_t *e, unsigned status, const char *type, const char *code, const char *param,
                   const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ie_oai_err_vset(e, status, type, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad_param(http_err_t *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad_param(http_err_t *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    e->status = MHD_HTTP_BAD_REQUEST;
    e->type = "invalid_request_error";
    e->code = "invalid_value";
    snprintf(e->param, sizeof e->param, "%s", param);
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static cJSON *err_json(const http_err_t *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    if (!o) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    return root;
}

typedef enum route {
    ROUTE_NONE = 0,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_EMBED,
    ROUTE_GET, /* health, metrics, models */
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_LORA_LOAD,
    ROUTE_LORA_UNLOAD
} route_t;

/* State of one HTTP request (libmicrohttpd's con_cls). */
typedef struct conn {
    char method[8];
    char url[128];
    int route; /* route_t                                   */
    int fd;
    ie_buf_t body;
    int too_large, body_oom;
    int early;     /* `err` answers once the body is read        */
    int preflight; /* a CORS preflight: 204 once the body is read */
    http_err_t err;
    const char *allow; /* the Allow header of a 405 (static)        */
    unsigned status;   /* what was answered (the log line)          */
    double t0;
    int busy;   /* counted in h->n_busy                       */
    req_t *req; /* the connection's reference                 */
} conn_t;

static void count_status(ie_http_t *h, unsigned status)
{
    if (!h->m_req) return;
    char code[8];
    snprintf(code, sizeof code, "%u", status);
    ie_metric_add(h->m_req, code, 1);
}

/* With --cors-origin, every answer names the allowed origin, and a
 * preflight's answer also what a cross-origin request may carry. Without
 * it no CORS header is sent, so browsers keep other origins from reading
 * answers and from sending JSON (which needs a preflight). */
static void cors_headers(const ie_http_t *h, struct MHD_Response *r, int preflight)
{
    if (!h->cors_origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", h->cors_origin);
    if (strcmp(h->cors_origin, "*") != 0) MHD_add_response_header(r, "Vary", "Origin");
    if (!preflight) return;
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
}

/* 1 when the request's Content-Type is application/json (parameters such
 * as charset allowed). */
static int json_content(struct MHD_Connection *mc)
{
    const char *v = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    const size_t n = strlen(IE_HTTP_JSON);
    if (!v) return 0;
    while (*v == ' ' || *v == '\t') v++;
    return strncasecmp(v, IE_HTTP_JSON, n) == 0 && (v[n] == '\0' || v[n] == ';' || v[n] == ' ' || v[n] == '\t');
}

/* Queue `body` (malloc'd, taken; NULL = out of memory) with `status`. */
static enum MHD_Result send_body(ie_http_t *h, struct MHD_Connection *mc, conn_t *c, unsigned status, char *body,
                                 const char *ctype, const char *allow)
{
    static char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                        "\"code\":\"internal\"}}";
    struct MHD_Response *r;
    if (body) {
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
        if (!r) free(body);
    } else {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        ctype = IE_HTTP_JSON;
        r = MHD_create_response_from_buffer(strlen(oom), oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    /* a full queue empties as requests finish, typically within seconds;
     * a draining or not-ready server is not worth retrying sooner either */
    if (status == MHD_HTTP_TOO_MANY_REQUESTS || status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    cors_headers(h, r, c && c->preflight);
    enum MHD_Result ret = MHD_queue_response(mc, status, r);
    MHD_destroy_response(r);
    if (c) c->status = status;
    count_status(h, status);
    return ret;
}

/* Queue a JSON document (taken). */
static enum MHD_Result send_json(ie_http_t *h, struct MHD_Connection *mc, conn_t *c, unsigned status, cJSON *js)
{
    char *body = js ? cJSON_PrintUnformatted(js) : NULL;
    cJSON_Delete(js);
    return send_body(h, mc, c, status, body, IE_HTTP_JSON, NULL);
}

static enum MHD_Result send_err(ie_http_t *h, struct MHD_Connection *mc, conn_t *c, const http_err_t *e,
                                const char *allow)
{
    cJSON *js = err_json(e);
    char *body = js ? cJSON_PrintUnformatted(js) : NULL;
    cJSON_Delete(js);
    return send_body(h, mc, c, e->status, body, IE_HTTP_JSON, allow);
}

/* The HTTP status and error for a scheduler failure (at submit: st and
 * ie_error_last(); from an ERROR event: its status and code). */
static void err_from_sched(http_err_t *e, ie_status_t st, const char *code, const char *msg)
{
    if (code && !strcmp(code, "timeout")) st = IE_ERR_TIMEOUT;
    else if (code && (!strcmp(code, "unavailable") || !strcmp(code, "cancelled"))) st = IE_ERR_UNAVAILABLE;
    else if (code && !strcmp(code, "busy")) st = IE_ERR_BUSY;
    else if (code && !strcmp(code, "out_of_memory")) st = IE_ERR_NOMEM;
    switch (st) {
    case IE_ERR_BUSY:
        err_set(e, MHD_HTTP_TOO_MANY_REQUESTS, "rate_limit_error", "busy", NULL, "%s",
                msg && *msg ? msg : "server busy: too many requests waiting; try again later");
        break;
    case IE_ERR_INVAL:
    case IE_ERR_RANGE:
    case IE_ERR_FORMAT:
        err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", NULL, "%s", msg);
        break;
    case IE_ERR_TIMEOUT:
        err_set(e, MHD_HTTP_GATEWAY_TIMEOUT, "server_error", "timeout", NULL, "%s",
                msg && *msg ? msg : "the request timed out");
        break;
    case IE_ERR_UNAVAILABLE:
        err_set(e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", code && *code ? code : "unavailable", NULL, "%s",
                msg && *msg ? msg : "the model is unavailable");
        break;
    case IE_ERR_NOMEM:
        err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "out_of_memory", NULL, "%s",
                msg && *msg ? msg : "out of memory");
        break;
    default:
        err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "%s",
                msg && *msg ? msg : "internal error");
        break;
    }
}

static const char *finish_reason(ie_finish_t f)
{
    return f == IE_FINISH_LENGTH || f == IE_FINISH_CONTEXT ? "length" : "stop";
}

static void add_usage(cJSON *o, size_t n_prompt, size_t n_gen)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(n_prompt + n_gen));
}

/* ------------------------------------------------------------ parameters */

/* A request's generation settings, pointing into its parsed JSON. */
typedef struct gen {
    int chat;
    ie_gen_params_t gp;
    const char *stops[IE_HTTP_MAX_STOP];
    int priority;
    int stream, include_usage;
    int n;    /* choices, 1..IE_HTTP_MAX_N                 */
    int lp_k; /* -1: no logprobs; else alternatives per token
                 (chat top_logprobs, completions logprobs)    */
    ie_chat_opts_t chat_opts;
    char *schema_text;                       /* response_format's schema (malloc'd), or NULL */
    ie_logit_bias_t *bias;                   /* logit_bias's entries (malloc'd), or NULL */
    int echo;                                /* completions: the answer starts with the prompt */
    const char *suffix;                      /* completions: fill in the middle before it (in the body) */
    int32_t stop_ids[IE_HTTP_MAX_STOP_IDS];  /* stop_token_ids */
    const char *choice[IE_GRAMMAR_MAX_ALTS]; /* guided_choice (strings in the body) */
    ie_oai_tools_t tools;                    /* chat: tools / tool_choice (owned until handed to the request) */
} gen_t;

/* Optional number `k`: 0 absent or null, 1 found (*v), -1 not a number. */
static int opt_num(const cJSON *o, const char *k, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) return -1;
    *v = it->valuedouble;
    return 1;
}

/* Optional float in [lo, hi] (open bounds when lo_open / hi_open). */
static int opt_float(const cJSON *o, const char *k, double lo, double hi, int lo_open, float *out, http_err_t *e)
{
    double v;
    int f = opt_num(o, k, &v);
    if (f < 0 || (f && (v < lo || v > hi || (lo_open && v == lo))))
        return bad_param(e, k, "'%s' must be a number in %c%g, %g]", k, lo_open ? '(' : '[', lo, hi);
    if (f) *out = (float)v;
    return 0;
}

/* Optional integer in [lo, hi]; *found (may be NULL) says whether given. */
static int opt_int(const cJSON *o, const char *k, double lo, double hi, long long *out, int *found, http_err_t *e)
{
    double v;
    int f = opt_num(o, k, &v);
    if (f < 0 || (f && (v != floor(v) || v < lo || v > hi)))
        return bad_param(e, k, "'%s' must be an integer in [%.0f, %.0f]", k, lo, hi);
    if (f) *out = (long long)v;
    if (found) *found = f;
    return 0;
}

/* Optional boolean: absent/null leaves *out. */
static int opt_bool(const cJSON *o, const char *k, int *out, http_err_t *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsBool(it)) return bad_param(e, k, "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(it);
    return 0;
}

/* Log-probabilities: chat "logprobs" (boolean) with "top_logprobs"
 * (0..20, only with logprobs true, as OpenAI has it); completions'
 * legacy "logprobs" (an integer 0..5: alternatives per token). */
static int parse_logprobs(const cJSON *root, gen_t *g, http_err_t *e)
{
    long long v = 0;
    int found = 0;
    g->lp_k = -1;
    if (g->chat) {
        int on = 0;
        if (opt_bool(root, "logprobs", &on, e)) return -1;
        if (opt_int(root, "top_logprobs", 0, IE_LOGPROBS_MAX_TOP, &v, &found, e)) return -1;
        if (found && !on) return bad_param(e, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
        if (on) g->lp_k = (int)v;
    } else {
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
        if (cJSON_IsBool(lp)) return bad_param(e, "logprobs", "'logprobs' must be an integer in [0, 5]");
        if (opt_int(root, "logprobs", 0, 5, &v, &found, e)) return -1;
        const cJSON *tlp = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        if (tlp && !cJSON_IsNull(tlp))
            return bad_param(e, "top_logprobs", "'top_logprobs' is a chat parameter; completions take 'logprobs'");
        if (found) g->lp_k = (int)v;
    }
    g->gp.logprobs = g->lp_k >= 0;
    g->gp.top_logprobs = g->lp_k >= 0 ? g->lp_k : 0;
    return 0;
}

/* OpenAI's "logit_bias": an object mapping token ids (as strings, "42")
 * to a bias in [-100, 100] added to the token's logit before sampling
 * (-100 in effect bans it, +100 all but forces it). */
static int parse_logit_bias(ie_http_t *h, const cJSON *root, gen_t *g, http_err_t *e)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias"), *it;
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb))
        return bad_param(e, "logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
    int n = cJSON_GetArraySize(lb);
    if (n > h->n_vocab)
        return bad_param(e, "logit_bias", "'logit_bias' has %d entries; the vocabulary has %d tokens", n,
                         (int)h->n_vocab);
    if (n == 0) return 0;
    if (!(g->bias = malloc((size_t)n * sizeof *g->bias)))
        return err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
    int k = 0;
    cJSON_ArrayForEach(it, lb)
    {
        const char *key = it->string;
        char *end = NULL;
        errno = 0;
        long id = key && *key >= '0' && *key <= '9' ? strtol(key, &end, 10) : -1;
        if (id < 0 || errno || !end || *end || id >= h->n_vocab)
            return bad_param(e, "logit_bias", "'logit_bias': the key '%.32s' is not a token id in [0, %d)",
                             key ? key : "", (int)h->n_vocab);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return bad_param(e, "logit_bias", "'logit_bias': the bias of token %ld must be a number in [-100, 100]",
                             id);
        g->bias[k++] = (ie_logit_bias_t){(int32_t)id, (float)it->valuedouble};
    }
    g->gp.sampling.logit_bias = g->bias;
    g->gp.sampling.n_logit_bias = k;
    return 0;
}

/* vLLM's structured outputs beside response_format: "guided_json" (a
 * schema, object or JSON text), "guided_choice" (strings: the answer is
 * one of them exactly), or both as "structured_outputs" {"json" | "choice"}.
 * At most one way per request. */
static int parse_guided(const cJSON *root, gen_t *g, http_err_t *e)
{
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "structured_outputs");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(root, "guided_json");
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(root, "guided_choice");
    const char *pj = "guided_json", *pc = "guided_choice";
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so) || (js && !cJSON_IsNull(js)) || (ch && !cJSON_IsNull(ch)))
            return bad_param(e, "structured_outputs",
                             "'structured_outputs' must be an object ({\"json\": schema} or {\"choice\": [...]}), "
                             "without guided_json / guided_choice");
        js = cJSON_GetObjectItemCaseSensitive(so, "json");
        ch = cJSON_GetObjectItemCaseSensitive(so, "choice");
        pj = pc = "structured_outputs";
    }
    const int has_js = js && !cJSON_IsNull(js), has_ch = ch && !cJSON_IsNull(ch);
    if ((has_js || has_ch) && g->gp.json_schema)
        return bad_param(e, has_js ? pj : pc, "'%s' cannot be combined with 'response_format'", has_js ? pj : pc);
    if (has_js && has_ch) return bad_param(e, pc, "give a schema or a choice, not both");
    if (has_js) {
        if (cJSON_IsString(js)) g->schema_text = strdup(js->valuestring);
        else if (cJSON_IsObject(js)) g->schema_text = cJSON_PrintUnformatted(js);
        else return bad_param(e, pj, "'%s' must be a JSON Schema (an object or its JSON text)", pj);
        if (!g->schema_text)
            return err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        ie_grammar_t *gr = NULL; /* compiled here too, so a bad one names its keyword */
        if (ie_grammar_compile(g->schema_text, &gr) != IE_OK) return bad_param(e, pj, "%s", ie_error_last());
        ie_grammar_destroy(&gr);
        g->gp.json_schema = g->schema_text;
    }
    if (has_ch) {
        const cJSON *it;
        size_t n = 0;
        if (!cJSON_IsArray(ch) || cJSON_GetArraySize(ch) < 1 || cJSON_GetArraySize(ch) > IE_GRAMMAR_MAX_ALTS)
            return bad_param(e, pc, "'%s' must be a list of 1 to %d strings", pc, IE_GRAMMAR_MAX_ALTS);
        cJSON_ArrayForEach(it, ch)
        {
            if (!cJSON_IsString(it) || !it->valuestring[0])
                return bad_param(e, pc, "'%s' must hold non-empty strings", pc);
            g->choice[n++] = it->valuestring;
        }
        g->gp.choice = g->choice;
        g->gp.n_choice = n;
    }
    return 0;
}

/* The sampling and control parameters shared by both endpoints. */
static int parse_gen(ie_http_t *h, const cJSON *root, gen_t *g, http_err_t *e)
{
    ie_sampler_params_t *sp = &g->gp.sampling;
    long long v;
    int found = 0;

    ie_gen_params_default(&g->gp);
    ie_engine_chat_opts(h->o.engine, &g->chat_opts); /* the model's own template */
    *sp = ie_sampler_params_default();               /* temperature 1, filters off: OpenAI's defaults */
    /* completions: 16 tokens like OpenAI; chat: until the model ends its
     * turn or the context is full */
    g->gp.max_new = g->chat ? h->n_ctx : 16;
    /* 0 only with echo: the prompt's log-probabilities alone (scoring) */
    if (opt_int(root, "max_tokens", 0, 1 << 24, &v, &found, e)) return -1;
    if (found) g->gp.max_new = (int)v;
    const int zero_max = found && v == 0;
    if (g->chat) {
        if (opt_int(root, "max_completion_tokens", 1, 1 << 24, &v, &found, e)) return -1;
        if (found) g->gp.max_new = (int)v;
    }
    if (opt_float(root, "temperature", 0, 2, 0, &sp->temperature, e)) return -1;
    if (opt_float(root, "top_p", 0, 1, 1, &sp->top_p, e)) return -1;
    if (opt_float(root, "min_p", 0, 1, 0, &sp->min_p, e)) return -1;
    if (opt_float(root, "frequency_penalty", -2, 2, 0, &sp->frequency_penalty, e)) return -1;
    if (opt_float(root, "presence_penalty", -2, 2, 0, &sp->presence_penalty, e)) return -1;
    if (opt_float(root, "repetition_penalty", 0, 100, 1, &sp->repeat_penalty, e)) return -1;
    v = 0;
    if (opt_int(root, "top_k", -1, 1 << 30, &v, &found, e)) return -1;
    if (found) sp->top_k = v < 0 ? 0 : (int32_t)v; /* -1: off (vLLM) */
    /* seed: JSON numbers are doubles here, so seeds beyond 2^53 lose bits */
    if (opt_int(root, "seed", -9.2e18, 1.8e19, &v, &found, e)) return -1;
    sp->seed = found ? (uint64_t)v : ie_sampler_seed_random();
    v = 0;
    if (opt_int(root, "priority", -1000000, 1000000, &v, NULL, e)) return -1;
    g->priority = (int)v;
    v = 1;
    if (opt_int(root, "n", 1, IE_HTTP_MAX_N, &v, NULL, e)) return -1;
    g->n = (int)v;
    if (opt_int(root, "best_of", 1, 1, &v, NULL, e)) return bad_param(e, "best_of", "'best_of' must be 1");
    /* vLLM's extensions: no end before min_tokens; ignore_eos, none at all */
    if (opt_bool(root, "ignore_eos", &g->gp.ignore_eos, e)) return -1;
    v = 0;
    if (opt_int(root, "min_tokens", 0, 1 << 24, &v, NULL, e)) return -1;
    if (v > g->gp.max_new)
        return bad_param(e, "min_tokens", "'min_tokens' (%lld) must not exceed the tokens asked for (%d)", v,
                         g->gp.max_new);
    g->gp.min_new = (int)v;
    if (opt_bool(root, "stream", &g->stream, e)) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return bad_param(e, "stream_options", "'stream_options' must be an object");
        if (opt_bool(so, "include_usage", &g->include_usage, e))
            return bad_param(e, "stream_options", "'stream_options.include_usage' must be a boolean");
    }
    if (opt_bool(root, "echo", &g->echo, e)) return -1;
    if (g->echo && g->chat) return bad_param(e, "echo", "'echo' is a /v1/completions parameter");
    if (zero_max && !g->echo)
        return bad_param(e, "max_tokens", "'max_tokens' must be an integer in [1, %d] (0 only with 'echo')",
                         1 << 24);
    if (parse_logprobs(root, g, e)) return -1;
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (suffix && !cJSON_IsNull(suffix)) {
        if (!cJSON_IsString(suffix)) return bad_param(e, "suffix", "'suffix' must be a string");
        if (suffix->valuestring[0] && g->chat)
            return bad_param(e, "suffix", "'suffix' is a /v1/completions parameter");
        if (suffix->valuestring[0] && g->echo)
            return bad_param(e, "suffix", "'suffix' and 'echo' cannot be used together");
        if (suffix->valuestring[0]) g->suffix = suffix->valuestring;
    }
    if (parse_logit_bias(h, root, g, e)) return -1;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!g->chat && tools && !cJSON_IsNull(tools) && !(cJSON_IsArray(tools) && !tools->child))
        return bad_param(e, "tools", "'tools' are for /v1/chat/completions");
    /* structured output: the schema is compiled (checked) here already */
    if (ie_oai_response_format(cJSON_GetObjectItemCaseSensitive(root, "response_format"), &g->schema_text) != IE_OK)
        return bad_param(e, "response_format", "%s", ie_error_last());
    if (g->schema_text) g->gp.json_schema = g->schema_text;
    if (parse_guided(root, g, e)) return -1;
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (re && !cJSON_IsNull(re) &&
        (!cJSON_IsString(re) || ie_harmony_effort_parse(re->valuestring, &g->chat_opts.effort) != IE_OK))
        return bad_param(e, "reasoning_effort", "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");

    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    size_t n_stop = 0;
    if (cJSON_IsString(stop)) {
        g->stops[n_stop++] = stop->valuestring;
    } else if (cJSON_IsArray(stop)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, stop)
        {
            if (!cJSON_IsString(it)) return bad_param(e, "stop", "'stop' must be a string or a list of strings");
            if (n_stop == IE_HTTP_MAX_STOP)
                return bad_param(e, "stop", "'stop' has more than %d strings", IE_HTTP_MAX_STOP);
            g->stops[n_stop++] = it->valuestring;
        }
    } else if (stop && !cJSON_IsNull(stop)) {
        return bad_param(e, "stop", "'stop' must be a string or a list of strings");
    }
    g->gp.stop = n_stop ? g->stops : NULL;
    g->gp.n_stop = n_stop;
    /* vLLM's: token ids that end the answer like EOS, the stop string kept
     * in the text, control tokens' text shown */
    const cJSON *sti = cJSON_GetObjectItemCaseSensitive(root, "stop_token_ids");
    if (sti && !cJSON_IsNull(sti)) {
        const cJSON *it;
        if (!cJSON_IsArray(sti) || cJSON_GetArraySize(sti) > IE_HTTP_MAX_STOP_IDS)
            return bad_param(e, "stop_token_ids", "'stop_token_ids' must be a list of at most %d token ids",
                             IE_HTTP_MAX_STOP_IDS);
        cJSON_ArrayForEach(it, sti)
        {
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
                it->valuedouble >= h->n_vocab)
                return bad_param(e, "stop_token_ids", "'stop_token_ids' must hold token ids in [0, %d)",
                                 (int)h->n_vocab);
            g->stop_ids[g->gp.n_stop_ids++] = (int32_t)it->valuedouble;
        }
        g->gp.stop_ids = g->stop_ids;
    }
    if (opt_bool(root, "include_stop_str_in_output", &g->gp.include_stop, e)) return -1;
    int skip_special = 1;
    if (opt_bool(root, "skip_special_tokens", &skip_special, e)) return -1;
    g->gp.show_special = !skip_special;
    if (g->chat) {
        char param[32], why[256];
        int rc = ie_oai_tools_parse(root, h->chat_fmt, g->chat_opts.tmpl, &g->tools, param, sizeof param, why,
                                    sizeof why);
        if (rc == -2)
            return err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        if (rc != 0) return bad_param(e, param, "%s", why);
        if (g->tools.schema && (g->gp.json_schema || g->gp.n_choice))
            return bad_param(e, "tool_choice",
                             "a forced tool call cannot be combined with 'response_format' or a guided output");
        if (g->tools.schema) g->gp.json_schema = g->tools.schema; /* the call's JSON, through the grammar */
        g->chat_opts.tools_json = g->tools.tools_json;
    }
    if (ie_sampler_params_validate(sp) != IE_OK)
        return err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", NULL, "%s",
                       ie_error_last());
    return 0;
}

/* A JSON array of numbers that are token ids -> ids (malloc'd). */
static int ids_from_json(ie_http_t *h, const cJSON *arr, int32_t **ids_out, size_t *n_out, http_err_t *e)
{
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    const cJSON *it;
    if (!ids) return err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble >= h->n_vocab) {
            free(ids);
            return bad_param(e, "prompt", "'prompt': token ids must be integers in [0, %d)", (int)h->n_vocab);
        }
        ids[i++] = (int32_t)it->valuedouble;
    }
    *ids_out = ids;
    *n_out = i;
    return 0;
}

/* One prompt of a request: its ids (malloc'd) and, for a string prompt,
 * the string (in the parsed body). */
typedef struct prompt_in {
    int32_t *ids;
    size_t n;
    const char *text;
} prompt_in_t;

static void prompts_free(prompt_in_t *p, int n)
{
    for (int i = 0; p && i < n; i++) free(p[i].ids);
    free(p);
}

/* One string prompt -> ids, tokenized like the CLI's --prompt (BOS and
 * special-token text as the tokenizer says). */
static int prompt_encode(ie_http_t *h, const char *text, prompt_in_t *out, http_err_t *e)
{
    const double t0 = ie_now_ms();
    ie_status_t st = ie_tokenizer_encode(h->tok, text, strlen(text), IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL,
                                         &out->ids, &out->n);
    if (h->m_stage) ie_metric_observe(h->m_stage, "tokenize", (ie_now_ms() - t0) / 1e3);
    if (st == IE_ERR_NOMEM)
        return err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
    if (st != IE_OK) return bad_param(e, "prompt", "'prompt': %s", ie_error_last());
    out->text = text;
    return 0;
}

/* Fill in the middle (a "suffix"): the prompt is the text before the gap,
 * the model writes what goes between; out->ids = [BOS] <prefix token> the
 * prompt's tokens <suffix token> the suffix's tokens <middle token> (the
 * prefix-suffix-middle order llama.cpp's infill uses; both texts tokenized
 * as plain text, BOS where the model adds one). fim: the three ids. */
static int prompt_encode_fim(ie_http_t *h, const char *text, const char *suffix, const int32_t fim[3],
                             prompt_in_t *out, http_err_t *e)
{
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    const int bos = ie_tokenizer_add_bos(h->tok);
    const double t0 = ie_now_ms();
    ie_status_t st = ie_tokenizer_encode(h->tok, text, strlen(text), 0, &a, &na);
    if (st == IE_OK) st = ie_tokenizer_encode(h->tok, suffix, strlen(suffix), 0, &b, &nb);
    if (h->m_stage) ie_metric_observe(h->m_stage, "tokenize", (ie_now_ms() - t0) / 1e3);
    const size_t n = (size_t)bos + 3 + na + nb;
    int32_t *ids = st == IE_OK ? malloc(n * sizeof *ids) : NULL;
    if (ids) {
        size_t k = 0;
        if (bos) ids[k++] = ie_tokenizer_bos(h->tok);
        ids[k++] = fim[0];
        memcpy(ids + k, a, na * sizeof *a);
        k += na;
        ids[k++] = fim[1];
        memcpy(ids + k, b, nb * sizeof *b);
        k += nb;
        ids[k++] = fim[2];
        out->ids = ids;
        out->n = n;
        out->text = text;
    }
    free(a);
    free(b);
    if (st == IE_OK && !ids) st = IE_ERR_NOMEM;
    if (st == IE_ERR_NOMEM)
        return err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
    if (st != IE_OK) return bad_param(e, "prompt", "'prompt' / 'suffix': %s", ie_error_last());
    return 0;
}

/* /v1/completions' prompt -> prompts (*out malloc'd, *n_out of them): a
 * string, a list of token ids, or a list of strings or of such lists (a
 * batch: OpenAI's, at most IE_HTTP_MAX_PROMPTS). Each must fit the
 * context and hold a token. With a suffix (fill in the middle) each is a
 * text, framed by the model's FIM tokens (prompt_encode_fim). */
static int prompts_parse(ie_http_t *h, const cJSON *root, const char *suffix, prompt_in_t **out, int *n_out,
                         http_err_t *e)
{
    int32_t fim[3] = {-1, -1, -1};
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt"), *it;
    int n = 1, rc = 0;
    if (cJSON_IsArray(p) && !cJSON_IsNumber(p->child)) n = cJSON_GetArraySize(p); /* a batch */
    if (n < 1 || n > IE_HTTP_MAX_PROMPTS)
        return bad_param(e, "prompt", n ? "'prompt': at most %d prompts in one request" : "'prompt' is empty",
                         IE_HTTP_MAX_PROMPTS);
    if (!cJSON_IsString(p) && !cJSON_IsArray(p))
        return bad_param(e, "prompt", "'prompt' must be a string, a list of token ids or a list of those");
    if (suffix && !ie_tokenizer_fim(h->tok, &fim[0], &fim[1], &fim[2]))
        return bad_param(e, "suffix",
                         "'suffix': this model has no fill-in-the-middle tokens (such as <|fim_prefix|>, "
                         "<fim_prefix> or <PRE>)");
    if (suffix && cJSON_IsArray(p) && (cJSON_IsNumber(p->child) || !cJSON_IsString(p->child)))
        return bad_param(e, "suffix", "'suffix' needs the prompt as text, not token ids");
    prompt_in_t *v = calloc((size_t)n, sizeof *v);
    if (!v) return err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
    if (suffix && cJSON_IsString(p)) {
        rc = prompt_encode_fim(h, p->valuestring, suffix, fim, &v[0], e);
    } else if (cJSON_IsString(p)) {
        rc = prompt_encode(h, p->valuestring, &v[0], e);
    } else if (cJSON_IsNumber(p->child)) {
        rc = ids_from_json(h, p, &v[0].ids, &v[0].n, e);
    } else {
        int i = 0;
        cJSON_ArrayForEach(it, p)
        {
            if (cJSON_IsString(it) && suffix) rc = prompt_encode_fim(h, it->valuestring, suffix, fim, &v[i], e);
            else if (cJSON_IsString(it)) rc = prompt_encode(h, it->valuestring, &v[i], e);
            else if (cJSON_IsArray(it) && !suffix) rc = ids_from_json(h, it, &v[i].ids, &v[i].n, e);
            else if (cJSON_IsArray(it))
                rc = bad_param(e, "suffix", "'suffix' needs the prompt as text, not token ids");
            else rc = bad_param(e, "prompt", "'prompt'[%d] must be a string or a list of token ids", i);
            if (rc) break;
            i++;
        }
    }
    for (int i = 0; i < n && rc == 0; i++) {
        if (v[i].n == 0) {
            rc = bad_param(e, "prompt", n > 1 ? "'prompt'[%d] is empty" : "the prompt is empty", i);
        } else if (v[i].n > (size_t)h->n_ctx) {
            rc = err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "context_length_exceeded", "prompt",
                         "the prompt%s has %zu tokens; the context holds %d", n > 1 ? "s' longest" : "", v[i].n,
                         h->n_ctx);
        }
    }
    if (rc) {
        prompts_free(v, n);
        return rc;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* Echo (completions): a prompt's ids, and its text as given (a string
 * prompt) or decoded with special tokens shown (token ids), into pr. -1
 * out of memory. */
static int echo_prepare(ie_http_t *h, const prompt_in_t *in, rprompt_t *pr)
{
    const int32_t *ids = in->ids;
    const size_t n = in->n;
    if (!(pr->ids = malloc((n ? n : 1) * sizeof *ids))) return -1;
    memcpy(pr->ids, ids, n * sizeof *ids);
    pr->n_ids = n;
    if (in->text) return (pr->echo_text = strdup(in->text)) ? 0 : -1;
    ie_detok_t *d = NULL;
    ie_buf_t b = {0};
    int rc = ie_detok_new(h->tok, &d) == IE_OK ? ie_buf_append(&b, "", 0) : -1;
    if (d) ie_detok_set_special(d, 1);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *piece = ie_detok_push(d, ids[i]);
        rc = ie_buf_append(&b, piece, strlen(piece));
    }
    if (rc == 0) {
        const char *tail = ie_detok_flush(d);
        rc = ie_buf_append(&b, tail, strlen(tail));
    }
    ie_detok_destroy(&d);
    if (rc != 0) {
        ie_buf_free(&b);
        return -1;
    }
    pr->echo_text = b.data; /* NUL-terminated */
    return 0;
}

/* /v1/chat/completions' messages -> ids through the model's chat template.
 * OpenAI's content parts ([{"type": "text", "text": ...}]) are joined into
 * one string; "name" is dropped. "chat_template_kwargs" (an object, as vLLM
 * takes it, e.g. {"enable_thinking": false}) become template variables. */
static int chat_ids(ie_http_t *h, const cJSON *root, const gen_t *g, int32_t **ids, size_t *n, http_err_t *e)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    cJSON *norm = NULL;
    char *json = NULL, *kw_json = NULL;
    int rc = 0, i = 0;
    cJSON *m;
    ie_chat_opts_t co = g->chat_opts;

    if (!cJSON_IsArray(msgs) || !msgs->child)
        return bad_param(e, "messages", "'messages' must be a non-empty list of messages");
    if (h->chat_fmt == IE_CHAT_NONE)
        return bad_param(e, "messages", "this model has no chat template; use /v1/completions");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw))
            return bad_param(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        if (!(kw_json = cJSON_PrintUnformatted(kw))) goto oom;
        co.template_kwargs = kw_json;
    }
    if (!(norm = cJSON_Duplicate(msgs, 1))) goto oom;
    /* developer -> system where the template lacks it (harmony has the
     * role), content null -> "", tool_calls' arguments -> objects */
    char why[256];
    int prc = ie_tool_messages_prepare(norm,
                                       h->chat_fmt == IE_CHAT_HARMONY ? "developer" : ie_jinja_source(co.tmpl), why,
                                       sizeof why);
    if (prc == -2) goto oom;
    if (prc != 0) {
        rc = bad_param(e, "messages", "%s", why);
        goto cleanup;
    }
    cJSON_ArrayForEach(m, norm)
    {
        i++;
        if (!cJSON_IsObject(m)) {
            rc = bad_param(e, "messages", "'messages[%d]' is not an object", i - 1);
            goto cleanup;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(m, "name");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsArray(content)) continue;
        ie_buf_t b = {0};
        const cJSON *part;
        cJSON_ArrayForEach(part, content)
        {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
                ie_buf_free(&b);
                rc = bad_param(e, "messages", "'messages[%d].content': only text parts are supported", i - 1);
                goto cleanup;
            }
            if (ie_buf_append(&b, text->valuestring, strlen(text->valuestring)) != 0) {
                ie_buf_free(&b);
                goto oom;
            }
        }
        cJSON *s = cJSON_CreateString(b.data ? b.data : "");
        ie_buf_free(&b);
        if (!s || !cJSON_ReplaceItemInObjectCaseSensitive(m, "content", s)) {
            cJSON_Delete(s);
            goto oom;
        }
    }
    if (!(json = cJSON_PrintUnformatted(norm))) goto oom;
    const double t0 = ie_now_ms();
    ie_status_t st = ie_chat_encode(h->tok, json, &co, ids, n, NULL);
    if (h->m_stage) ie_metric_observe(h->m_stage, "tokenize", (ie_now_ms() - t0) / 1e3);
    if (st == IE_ERR_NOMEM) goto oom;
    if (st != IE_OK) rc = bad_param(e, "messages", "%s", ie_error_last());
    goto cleanup;
oom:
    rc = err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
cleanup:
    cJSON_Delete(norm);
    free(json);
    free(kw_json);
    return rc;
}

/* --------------------------------------------------------------- answers */

/* The harmony parser's channels as they are emitted (a stream's deltas). */
typedef struct chan_bufs {
    ie_buf_t final, analysis;
    int oom;
} chan_bufs_t;

static void on_harmony(void *user, ie_harmony_channel_t ch, const char *text, size_t len)
{
    chan_bufs_t *cb = user;
    ie_buf_t *b = ch == IE_HARMONY_CH_FINAL ? &cb->final : ch == IE_HARMONY_CH_ANALYSIS ? &cb->analysis : NULL;
    if (b && len && ie_buf_append(b, text, len) != 0) cb->oom = 1;
}

/* Identity shared by a response and all its chunks. */
typedef struct ident {
    char id[48];
    long created;
} ident_t;

static void ident_make(ident_t *x, int chat)
{
    snprintf(x->id, sizeof x->id, "%s%016llx%08llx", chat ? "chatcmpl-" : "cmpl-",
             (unsigned long long)ie_sampler_seed_random(), (unsigned long long)(ie_sampler_seed_random() >> 32));
    x->created = (long)time(NULL);
}

static cJSON *resp_head(ie_http_t *h, const ident_t *x, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", x->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)x->created);
    cJSON_AddStringToObject(o, "model", h->model_name);
    return o;
}

/* -------------------------------------------------------------- logprobs */

#define IE_HTTP_TOK_MAX 256 /* bytes of a token shown at most */

/* A token's text for JSON (raw bytes, special tokens' text included, each
 * byte of an invalid or cut UTF-8 sequence as U+FFFD: a token may hold
 * part of a character) into out; its raw bytes into raw[0..*n_raw). */
static void tok_text(const ie_tokenizer_t *tok, int32_t id, char out[3 * IE_HTTP_TOK_MAX + 1],
                     unsigned char raw[IE_HTTP_TOK_MAX], size_t *n_raw)
{
    int n = ie_tokenizer_token_bytes(tok, id, 1, (char *)raw, IE_HTTP_TOK_MAX);
    size_t len = n < 0 ? 0 : (size_t)n > IE_HTTP_TOK_MAX ? IE_HTTP_TOK_MAX : (size_t)n, o = 0;
    for (size_t i = 0; i < len;) {
        const unsigned char b = raw[i];
        size_t L = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
        if (L && i + L <= len && ie_tokenizer_check_utf8((const char *)raw + i, L) == IE_OK) {
            memcpy(out + o, raw + i, L);
            o += L;
            i += L;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    *n_raw = len;
}

/* Characters (code points) of UTF-8 text t[0..n): its bytes that do not
 * continue a sequence. */
static size_t utf8_chars(const char *t, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)t[i] & 0xC0) != 0x80;
    return c;
}

/* Characters a token adds to the text (special: control tokens' text
 * counted, as an echoed prompt shows it; else none, the output hides
 * them). For completions' text_offset. */
static size_t tok_chars(const ie_tokenizer_t *tok, int32_t id, int special)
{
    char raw[IE_HTTP_TOK_MAX];
    int n = ie_tokenizer_token_bytes(tok, id, special, raw, sizeof raw);
    return n > 0 ? utf8_chars(raw, (size_t)n < sizeof raw ? (size_t)n : sizeof raw) : 0;
}

/* A log-probability for JSON: -inf (a token that cannot occur) is not a
 * JSON number; OpenAI's clients read -9999.0 as "never" (vLLM's value). */
static double lp_num(float v) { return isfinite(v) ? (double)v : -9999.0; }

/* {"token", "logprob", "bytes"} of one token (chat). */
static cJSON *lp_entry(const ie_tokenizer_t *tok, int32_t id, float logprob)
{
    char text[3 * IE_HTTP_TOK_MAX + 1];
    unsigned char raw[IE_HTTP_TOK_MAX];
    size_t n_raw = 0;
    tok_text(tok, id, text, raw, &n_raw);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "logprob", lp_num(logprob));
    cJSON *b = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; b && i < n_raw; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber(raw[i]));
    return o;
}

/* o's array `key`, made if absent; NULL out of memory. */
static cJSON *lp_array(cJSON *o, const char *key)
{
    cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    return a ? a : cJSON_AddArrayToObject(o, key);
}

/* Append tokens lp[0..n) to a "logprobs" object o: chat {"content":
 * [{token, logprob, bytes, top_logprobs: [...]}]}, completions {tokens,
 * token_logprobs, top_logprobs: [{token: logprob}], text_offset} with each
 * top_logprobs dict holding the k alternatives and the sampled token
 * (OpenAI's legacy shape). Generated end-of-turn tokens are left out, like
 * their text; the prompt's (echo: `prompt` set) are all there, special
 * tokens' text counted, and a NaN logprob (the first token's) is null
 * with a null top_logprobs. *chars: the text length in characters before
 * lp[0], advanced past them. -1 out of memory. */
static int lp_json_add(cJSON *o, const ie_tokenizer_t *tok, int chat, int k, const tok_lp_t *lp, size_t n,
                       size_t *chars, int prompt)
{
    cJSON *content = NULL, *tokens = NULL, *tlp = NULL, *tops = NULL, *offs = NULL;
    if (chat) {
        content = lp_array(o, "content");
    } else {
        tokens = lp_array(o, "tokens");
        tlp = lp_array(o, "token_logprobs");
        tops = lp_array(o, "top_logprobs");
        offs = lp_array(o, "text_offset");
    }
    if (chat ? !content : !tokens || !tlp || !tops || !offs) return -1;
    for (size_t i = 0; i < n; i++) {
        const tok_lp_t *t = &lp[i];
        if (!prompt && ie_tokenizer_is_eog(tok, t->id)) continue;
        const int m = t->n_top < k ? t->n_top : k;
        const size_t at = *chars;
        *chars += tok_chars(tok, t->id, prompt);
        if (chat) {
            cJSON *e = lp_entry(tok, t->id, t->logprob);
            cJSON *alts = e ? cJSON_AddArrayToObject(e, "top_logprobs") : NULL;
            if (!alts || !cJSON_AddItemToArray(content, e)) {
                cJSON_Delete(e);
                goto oom;
            }
            for (int j = 0; j < m; j++)
                if (!cJSON_AddItemToArray(alts, lp_entry(tok, t->top[j].id, t->top[j].logprob))) goto oom;
        } else {
            char text[3 * IE_HTTP_TOK_MAX + 1];
            unsigned char raw[IE_HTTP_TOK_MAX];
            size_t n_raw;
            tok_text(tok, t->id, text, raw, &n_raw);
            cJSON_AddItemToArray(tokens, cJSON_CreateString(text));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)at));
            if (isnan(t->logprob)) { /* nothing comes before the prompt's first token */
                cJSON_AddItemToArray(tlp, cJSON_CreateNull());
                cJSON_AddItemToArray(tops, cJSON_CreateNull());
                continue;
            }
            cJSON *d = cJSON_CreateObject();
            if (!d || !cJSON_AddItemToArray(tops, d)) {
                cJSON_Delete(d);
                goto oom;
            }
            cJSON_AddItemToArray(tlp, cJSON_CreateNumber(lp_num(t->logprob)));
            for (int j = 0; j <= m; j++) { /* the alternatives, then the sampled token */
                char alt[3 * IE_HTTP_TOK_MAX + 1];
                const int32_t id = j < m ? t->top[j].id : t->id;
                tok_text(tok, id, alt, raw, &n_raw);
                /* two ids may show as the same text (cut UTF-8): the
                 * likelier one keeps the key */
                if (!cJSON_GetObjectItemCaseSensitive(d, alt))
                    cJSON_AddNumberToObject(d, alt, lp_num(j < m ? t->top[j].logprob : t->logprob));
            }
        }
    }
    return 0;
oom:
    return -1;
}

/* A new "logprobs" object for generated tokens lp[0..n) (lp_json_add);
 * NULL out of memory. */
static cJSON *lp_json(const ie_tokenizer_t *tok, int chat, int k, const tok_lp_t *lp, size_t n, size_t *chars)
{
    cJSON *o = cJSON_CreateObject();
    if (o && lp_json_add(o, tok, chat, k, lp, n, chars, 0) == 0) return o;
    cJSON_Delete(o);
    return NULL;
}


/* A choice's calls, when the request parses them (r->tools): content (the
 * text outside the calls, or null), tool_calls, and finish_reason
 * "tool_calls" unless the answer was cut short. Without calls, content is
 * the text. -1 out of memory. */
static int tools_message(const req_t *r, const choice_t *c, const char *text, cJSON *msg, const char **finish)
{
    ie_tool_calls_t calls;
    if (ie_oai_tools_extract(&r->tools, text, strlen(text), &calls) != IE_OK) return -1;
    int rc = 0;
    if (!calls.n) {
        rc = cJSON_AddStringToObject(msg, "content", text) ? 0 : -1;
    } else {
        cJSON *arr = ie_oai_tool_calls_json(&calls, 0);
        if (!arr ||
            !(calls.content ? cJSON_AddStringToObject(msg, "content", calls.content)
                            : cJSON_AddNullToObject(msg, "content")) ||
            !cJSON_AddItemToObject(msg, "tool_calls", arr)) {
            cJSON_Delete(arr);
            rc = -1;
        }
        if (c->finish != IE_FINISH_LENGTH && c->finish != IE_FINISH_CONTEXT) *finish = "tool_calls";
    }
    ie_tool_calls_free(&calls);
    return rc;
}

/* A harmony choice's calls: the generated ids' text with its control
 * tokens (the headers that name the recipient are made of them), parsed
 * for to=functions.NAME messages. *calls is empty when the request does
 * not parse harmony calls or there are none. -1 out of memory. */
static int harmony_calls(ie_http_t *h, const req_t *r, const choice_t *c, ie_tool_calls_t *calls)
{
    ie_buf_t raw = {0};
    char piece[256];
    int rc = 0;
    memset(calls, 0, sizeof *calls);
    if (r->tools.fmt != IE_TOOL_FMT_HARMONY) return 0;
    for (size_t k = 0; c->all_ids && k < c->n_gen && rc == 0; k++) {
        int l = ie_tokenizer_token_bytes(h->tok, c->all_ids[k], 1, piece, sizeof piece);
        if (l > 0 && (size_t)l <= sizeof piece && ie_buf_append(&raw, piece, (size_t)l) != 0) rc = -1;
    }
    if (rc == 0 && ie_oai_tools_extract(&r->tools, raw.data ? raw.data : "", raw.len, calls) != IE_OK) rc = -1;
    ie_buf_free(&raw);
    return rc;
}

/* The non-streamed answer of a finished request (every choice DONE). */
static cJSON *final_json(ie_http_t *h, req_t *r, int chat, int lp_k)
{
    ident_t x;
    cJSON *o = NULL;
    ie_harmony_parser_t *hp = NULL;
    size_t n_gen = 0;
    ident_make(&x, chat);
    if (!(o = resp_head(h, &x, chat ? "chat.completion" : "text_completion"))) goto fail;
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < r->n; i++) {
        const choice_t *c = &r->ch[i];
        const rprompt_t *pr = &r->pr[c->prompt];
        cJSON *ch = cJSON_CreateObject();
        if (!cJSON_AddItemToArray(choices, ch)) {
            cJSON_Delete(ch);
            goto fail;
        }
        cJSON_AddNumberToObject(ch, "index", i);
        const char *text = c->all_text ? c->all_text : "", *fin = finish_reason(c->finish);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            if (h->chat_fmt == IE_CHAT_HARMONY) {
                /* the text hides control tokens: channels come from the ids */
                if (ie_harmony_parser_new(h->tok, NULL, NULL, &hp) != IE_OK) goto fail;
                for (size_t k = 0; k < c->n_gen; k++)
                    if (c->all_ids && ie_harmony_parser_push_token(hp, c->all_ids[k]) != IE_OK) goto fail;
                if (ie_harmony_parser_finish(hp) != IE_OK) goto fail;
                const char *final = ie_harmony_parser_text(hp, IE_HARMONY_CH_FINAL, NULL);
                ie_tool_calls_t calls;
                if (harmony_calls(h, r, c, &calls) != 0) goto fail;
                cJSON *arr = calls.n ? ie_oai_tool_calls_json(&calls, 0) : NULL;
                ie_tool_calls_free(&calls);
                if (arr && !final[0]) cJSON_AddNullToObject(msg, "content");
                else cJSON_AddStringToObject(msg, "content", final);
                cJSON_AddStringToObject(msg, "reasoning_content",
                                        ie_harmony_parser_text(hp, IE_HARMONY_CH_ANALYSIS, NULL));
                ie_harmony_parser_destroy(&hp);
                if (arr && !cJSON_AddItemToObject(msg, "tool_calls", arr)) {
                    cJSON_Delete(arr);
                    goto fail;
                }
                if (arr && c->finish != IE_FINISH_LENGTH && c->finish != IE_FINISH_CONTEXT) fin = "tool_calls";
            } else if (r->tools.fmt != IE_TOOL_FMT_NONE) {
                if (tools_message(r, c, text, msg, &fin) != 0) goto fail;
            } else {
                cJSON_AddStringToObject(msg, "content", text);
            }
        } else if (pr->echo_text) {
            char *t = NULL;
            if (asprintf(&t, "%s%s", pr->echo_text, text) < 0) goto fail;
            cJSON_AddStringToObject(ch, "text", t);
            free(t);
        } else {
            cJSON_AddStringToObject(ch, "text", text);
        }
        if (lp_k >= 0) {
            size_t chars = 0;
            cJSON *lj = cJSON_CreateObject();
            if (!cJSON_AddItemToObject(ch, "logprobs", lj)) {
                cJSON_Delete(lj);
                goto fail;
            }
            if (pr->echo_text && pr->plp) {
                if (lp_json_add(lj, h->tok, chat, lp_k, pr->plp, pr->n_ids, &chars, 1) != 0) goto fail;
                /* the generated tokens' offsets count from the text */
                chars = utf8_chars(pr->echo_text, strlen(pr->echo_text));
            }
            if (lp_json_add(lj, h->tok, chat, lp_k, c->lp, c->n_lp, &chars, 0) != 0) goto fail;
        } else {
            cJSON_AddNullToObject(ch, "logprobs");
        }
        cJSON_AddStringToObject(ch, "finish_reason", fin);
        n_gen += c->n_gen;
    }
    add_usage(o, r->n_prompt, n_gen);
    return o;
fail:
    ie_harmony_parser_destroy(&hp);
    cJSON_Delete(o);
    return NULL;
}

/* ---------------------------------------------------------------- streams */

/* A stream's state of one choice. */
typedef struct schoice {
    ie_buf_t take; /* text taken from the request              */
    int32_t *take_ids;
    size_t n_take, cap_take;
    tok_lp_t *take_lp; /* log-probabilities taken                 */
    size_t n_take_lp, cap_take_lp;
    size_t lp_done;  /* the choice's lp entries taken so far      */
    size_t chars;    /* text offset in characters (completions)   */
    size_t sent_len; /* text bytes sent (non-harmony)             */
    ie_harmony_parser_t *hp;
    chan_bufs_t cb;
    int ended;          /* its finish chunk is out                    */
    ie_buf_t tool_text; /* tools: the whole text so far              */
    int tool_calls;     /* tools: the calls were sent                 */
    int echoed;         /* echo: the prompt's chunk is out            */
    int plp_ready;      /* echo: the prompt's logprobs are in (r->plp) */
} schoice_t;

/* The body of a streamed answer (libmicrohttpd's content reader). */
typedef struct stream {
    ie_http_t *h;
    req_t *r; /* the stream's reference                     */
    int fd, chat, harmony, include_usage, lp_k;
    ident_t x;
    ie_buf_t out; /* SSE bytes not yet handed to MHD           */
    size_t off;
    size_t seen;  /* the request's events seen                 */
    schoice_t *c; /* r->n of them */
    int started, ended;
} stream_t;

static void stream_free(void *cls)
{
    stream_t *s = cls;
    if (!s) return;
    for (int i = 0; s->c && i < s->r->n; i++) {
        schoice_t *c = &s->c[i];
        ie_buf_free(&c->take);
        free(c->take_ids);
        free(c->take_lp);
        ie_harmony_parser_destroy(&c->hp);
        ie_buf_free(&c->cb.final);
        ie_buf_free(&c->cb.analysis);
        ie_buf_free(&c->tool_text);
    }
    free(s->c);
    req_unref(s->r);
    ie_buf_free(&s->out);
    free(s);
}

/* Append "data: <json>\n\n" (js taken). -1 out of memory. */
static int sse_json(stream_t *s, cJSON *js)
{
    char *t = js ? cJSON_PrintUnformatted(js) : NULL;
    cJSON_Delete(js);
    int rc = t && ie_buf_printf(&s->out, "data: %s\n\n", t) == 0 ? 0 : -1;
    free(t);
    return rc;
}

/* One chunk of choice `index`: completions {"text"}, chat {"delta":
 * {content, reasoning_content}} (a delta of NULLs: {}), its logprobs (lp
 * taken; NULL: null), finish_reason or null. */
static int sse_chunk(stream_t *s, int index, const char *text, size_t len, const char *reasoning, size_t rlen,
                     const char *finish, cJSON *lp)
{
    cJSON *o = resp_head(s->h, &s->x, s->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    if (!o || !choices || !ch || !cJSON_AddItemToArray(choices, ch)) {
        cJSON_Delete(lp);
        cJSON_Delete(ch);
        cJSON_Delete(o);
        return -1;
    }
    cJSON_AddNumberToObject(ch, "index", index);
    /* content may hold any bytes: copy into a NUL-terminated string */
    char *t = strndup(text ? text : "", text ? len : 0), *rt = strndup(reasoning ? reasoning : "", rlen);
    if (!t || !rt) {
        free(t);
        free(rt);
        cJSON_Delete(lp);
        cJSON_Delete(o);
        return -1;
    }
    if (s->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (!s->started) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", t);
        if (reasoning) cJSON_AddStringToObject(d, "reasoning_content", rt);
    } else {
        cJSON_AddStringToObject(ch, "text", t);
    }
    free(t);
    free(rt);
    if (lp) cJSON_AddItemToObject(ch, "logprobs", lp);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    return sse_json(s, o);
}

/* The chunk of choice `index` {"delta": {"tool_calls": [{index, id, type,
 * function}, ...]}} (arr taken). */
static int sse_tool_calls(stream_t *s, int index, cJSON *arr)
{
    cJSON *o = resp_head(s->h, &s->x, "chat.completion.chunk");
    cJSON *choices = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *ch = cJSON_CreateObject(), *d = NULL;
    if (!arr || !choices || !ch || !cJSON_AddItemToArray(choices, ch)) {
        cJSON_Delete(ch);
        cJSON_Delete(o);
        cJSON_Delete(arr);
        return -1;
    }
    cJSON_AddNumberToObject(ch, "index", index);
    if (!(d = cJSON_AddObjectToObject(ch, "delta")) || !cJSON_AddItemToObject(d, "tool_calls", arr)) {
        cJSON_Delete(arr);
        cJSON_Delete(o);
        return -1;
    }
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    return sse_json(s, o);
}

/* A tools stream's choice i: content streams up to where a call could
 * begin (ie_tool_safe_len); the rest waits for the end, where the calls go
 * out whole in one delta.tool_calls chunk (or, if the text holds none, the
 * held text goes out as content). lp (taken; may be NULL) rides on the
 * content chunk. -1 out of memory. */
static int stream_tools(stream_t *s, int i, int terminal, cJSON *lp)
{
    schoice_t *c = &s->c[i];
    const choice_t *rc = &s->r->ch[i];
    if (c->take.len && ie_buf_append(&c->tool_text, c->take.data, c->take.len) != 0) {
        cJSON_Delete(lp);
        return -1;
    }
    const char *all = c->tool_text.data ? c->tool_text.data : "";
    size_t len = c->tool_text.len;
    /* text the stop matcher still held when the request ended is in
     * all_text only */
    if (terminal == IE_SCHED_DONE && rc->all_text && strlen(rc->all_text) >= len &&
        !memcmp(rc->all_text, all, len)) {
        all = rc->all_text;
        len = strlen(all);
    }
    if (terminal != IE_SCHED_DONE) {
        size_t safe = terminal ? c->sent_len : ie_tool_safe_len(s->r->tools.fmt, all, len);
        size_t n = safe > c->sent_len ? safe - c->sent_len : 0;
        if ((n || lp) && sse_chunk(s, i, all + c->sent_len, n, NULL, 0, NULL, lp) != 0) return -1;
        c->sent_len += n;
        return 0;
    }
    ie_tool_calls_t calls;
    if (ie_oai_tools_extract(&s->r->tools, all, len, &calls) != IE_OK) {
        cJSON_Delete(lp);
        return -1;
    }
    int ret = 0;
    size_t n = calls.n ? 0 : len - (len > c->sent_len ? c->sent_len : len);
    if (n || lp) ret = sse_chunk(s, i, all + c->sent_len, n, NULL, 0, NULL, lp);
    c->sent_len += n;
    if (ret == 0 && calls.n) {
        ret = sse_tool_calls(s, i, ie_oai_tool_calls_json(&calls, 1));
        c->tool_calls = 1;
    }
    ie_tool_calls_free(&calls);
    return ret;
}

static int sse_error(stream_t *s, const http_err_t *e)
{
    if (sse_json(s, err_json(e)) != 0) return -1;
    return ie_buf_printf(&s->out, "data: [DONE]\n\n");
}

/* With r->mu held: move what choice i produced since the last call into
 * the stream's state. 0, or -1 out of memory. */
static int stream_take_locked(stream_t *s, int i)
{
    choice_t *rc = &s->r->ch[i];
    schoice_t *c = &s->c[i];
    ie_buf_t tb = rc->text;
    rc->text = c->take;
    c->take = tb;
    ie_buf_reset(&rc->text);
    int32_t *ti = rc->ids;
    size_t tcap = rc->cap_ids;
    c->n_take = rc->n_ids;
    rc->ids = c->take_ids;
    rc->cap_ids = c->cap_take;
    rc->n_ids = 0;
    c->take_ids = ti;
    c->cap_take = tcap;
    c->n_take_lp = 0;
    c->plp_ready = s->r->pr[rc->prompt].plp != NULL;
    const size_t n = rc->n_lp - c->lp_done;
    if (n) {
        if (n > c->cap_take_lp) {
            tok_lp_t *p = realloc(c->take_lp, n * sizeof *p);
            if (!p) return -1;
            c->take_lp = p;
            c->cap_take_lp = n;
        }
        memcpy(c->take_lp, rc->lp + c->lp_done, n * sizeof *c->take_lp);
        c->n_take_lp = n;
        c->lp_done = rc->n_lp;
    }
    return 0;
}

/* The chunks of choice i for what was taken; at its end its finish chunk.
 * 1: the choice failed (the stream ends with its error), 0, -1: end the
 * connection. */
static int stream_choice(stream_t *s, int i, int terminal)
{
    schoice_t *c = &s->c[i];
    const choice_t *rc = &s->r->ch[i];
    cJSON *lp = NULL;
    /* echo: the prompt first, in a chunk of its own (with its logprobs,
     * which come with the prompt's first choice's first token) */
    const rprompt_t *pr = &s->r->pr[rc->prompt];
    if (pr->echo_text && !c->echoed && (s->lp_k < 0 || c->plp_ready || c->n_take || terminal)) {
        if (s->lp_k >= 0) {
            lp = cJSON_CreateObject();
            if (!lp || (c->plp_ready && lp_json_add(lp, s->h->tok, 0, s->lp_k, pr->plp, pr->n_ids, &c->chars, 1)))
                goto fail;
        }
        c->chars = utf8_chars(pr->echo_text, strlen(pr->echo_text));
        c->echoed = 1;
        if (sse_chunk(s, i, pr->echo_text, strlen(pr->echo_text), NULL, 0, NULL, lp) != 0) return -1;
        lp = NULL;
        if (!c->n_take && !terminal) return 0;
    }
    if (s->lp_k >= 0 && c->n_take_lp) {
        if (!(lp = lp_json(s->h->tok, s->chat, s->lp_k, c->take_lp, c->n_take_lp, &c->chars))) return -1;
        cJSON *arr = s->chat ? cJSON_GetObjectItemCaseSensitive(lp, "content")
                             : cJSON_GetObjectItemCaseSensitive(lp, "tokens");
        if (!cJSON_GetArraySize(arr)) { /* end-of-turn tokens only */
            cJSON_Delete(lp);
            lp = NULL;
        }
    }
    if (s->harmony) {
        for (size_t k = 0; k < c->n_take; k++)
            if (ie_harmony_parser_push_token(c->hp, c->take_ids[k]) != IE_OK) goto fail;
        if (terminal && ie_harmony_parser_finish(c->hp) != IE_OK) goto fail;
        if (c->cb.oom) goto fail;
        if (c->cb.final.len || c->cb.analysis.len || lp) {
            if (sse_chunk(s, i, c->cb.final.len || lp ? c->cb.final.data : NULL, c->cb.final.len,
                          c->cb.analysis.len ? c->cb.analysis.data : NULL, c->cb.analysis.len, NULL, lp) != 0)
                return -1;
            lp = NULL;
            ie_buf_reset(&c->cb.final);
            ie_buf_reset(&c->cb.analysis);
        }
        if (terminal == IE_SCHED_DONE && s->r->tools.fmt == IE_TOOL_FMT_HARMONY) { /* calls go out whole */
            ie_tool_calls_t calls;
            if (harmony_calls(s->h, s->r, rc, &calls) != 0) goto fail;
            int trc = calls.n ? sse_tool_calls(s, i, ie_oai_tool_calls_json(&calls, 1)) : 0;
            c->tool_calls = calls.n > 0;
            ie_tool_calls_free(&calls);
            if (trc != 0) return -1;
        }
    } else if (s->chat && s->r->tools.fmt != IE_TOOL_FMT_NONE) {
        if (stream_tools(s, i, terminal, lp) != 0) return -1;
        lp = NULL;
    } else {
        size_t len = c->take.len;
        const char *text = c->take.data;
        /* text the stop matcher still held when the request ended is in
         * all_text only */
        if (terminal == IE_SCHED_DONE && rc->all_text) {
            size_t all = strlen(rc->all_text);
            if (all > c->sent_len + len && !memcmp(rc->all_text + c->sent_len, text ? text : "", len)) {
                text = rc->all_text + c->sent_len;
                len = all - c->sent_len;
            }
        }
        if (len || lp) {
            if (sse_chunk(s, i, text ? text : "", len, NULL, 0, NULL, lp) != 0) return -1;
            lp = NULL;
        }
        c->sent_len += len;
    }
    ie_buf_reset(&c->take);
    if (!terminal) return 0;
    c->ended = 1;
    if (terminal == IE_SCHED_ERROR) return 1;
    const char *fin = c->tool_calls && rc->finish != IE_FINISH_LENGTH && rc->finish != IE_FINISH_CONTEXT
                          ? "tool_calls"
                          : finish_reason(rc->finish);
    return sse_chunk(s, i, s->chat ? NULL : "", 0, NULL, 0, fin, NULL);
fail:
    cJSON_Delete(lp);
    return -1;
}

/* Format what the request has produced since the last call into s->out
 * (waiting for it first). -1: end the connection with an error (client
 * gone, out of memory). */
static int stream_fill(stream_t *s)
{
    req_t *r = s->r;
    http_err_t e;
    int term[IE_HTTP_MAX_CHOICES];
    if (!s->started) { /* chat streams open with the role, for every choice */
        int rc = 0;
        for (int i = 0; s->chat && i < r->n && !rc; i++) rc = sse_chunk(s, i, "", 0, NULL, 0, NULL, NULL);
        s->started = 1;
        if (rc || s->chat) return rc;
    }
    pthread_mutex_lock(&r->mu);
    int w = req_wait_locked(r, s->h, s->fd, 1, s->seen);
    if (w == WAIT_GONE) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    s->seen = r->n_ev;
    /* take the pending text, ids and logprobs; the outcome is immutable
     * once set */
    int oom = r->oom, all_done = r->n_done == r->n;
    for (int i = 0; i < r->n; i++) {
        term[i] = s->c[i].ended ? 0 : r->ch[i].terminal;
        if (!s->c[i].ended && stream_take_locked(s, i) != 0) oom = 1;
    }
    pthread_mutex_unlock(&r->mu);

    if (w == WAIT_STOP && !all_done) {
        s->ended = 1;
        err_set(&e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "unavailable", NULL,
                "the server is shutting down");
        return sse_error(s, &e);
    }
    if (oom) {
        s->ended = 1;
        err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        return sse_error(s, &e);
    }
    int left = 0;
    for (int i = 0; i < r->n; i++) {
        if (s->c[i].ended) continue;
        int rc = stream_choice(s, i, term[i]);
        if (rc < 0) return -1;
        if (rc > 0) { /* a failed choice ends the stream (the others are cancelled) */
            s->ended = 1;
            pthread_mutex_lock(&r->mu);
            const choice_t *f = req_failed_locked(r); /* the one that ran, not one abandoned */
            pthread_mutex_unlock(&r->mu);
            if (!f) f = &r->ch[i];
            err_from_sched(&e, f->status, f->code, f->message);
            return sse_error(s, &e);
        }
        left += !s->c[i].ended;
    }
    if (left) return 0;

    s->ended = 1;
    if (s->include_usage) {
        cJSON *o = resp_head(s->h, &s->x, s->chat ? "chat.completion.chunk" : "text_completion");
        if (!o || !cJSON_AddArrayToObject(o, "choices")) {
            cJSON_Delete(o);
            return -1;
        }
        size_t n_gen = 0;
        for (int i = 0; i < r->n; i++) n_gen += r->ch[i].n_gen;
        add_usage(o, r->n_prompt, n_gen);
        if (sse_json(s, o) != 0) return -1;
    }
    return ie_buf_printf(&s->out, "data: [DONE]\n\n");
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_t *s = cls;
    (void)pos;
    for (;;) {
        if (s->off < s->out.len) {
            size_t n = s->out.len - s->off < max ? s->out.len - s->off : max;
            memcpy(buf, s->out.data + s->off, n);
            s->off += n;
            return (ssize_t)n;
        }
        ie_buf_reset(&s->out);
        s->off = 0;
        if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (stream_fill(s) != 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* ------------------------------------------------------------- endpoints */

/* 1 when a JSON text holds a NUL in a string: a raw 0 byte or the escape
 * \u0000 (not an escaped backslash followed by "u0000"). */
static int json_has_nul(const char *s, size_t n)
{
    if (!s) return 0;
    if (memchr(s, 0, n)) return 1;
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return 1;
        i++; /* skip the escaped character (a backslash included) */
    }
    return 0;
}

/* An error serve_oai_lora.c filled into e (the same type); -1. */
static int err_from_oai(http_err_t *e, const ie_oai_err_t *o)
{
    *e = *o;
    return -1;
}

/* The request's adapter set, leased (ie_oai_lora_lease). */
static int lora_lease(ie_http_t *h, const cJSON *root, ie_lora_lease_t *out, http_err_t *e)
{
    ie_oai_err_t oe;
    if (ie_oai_lora_lease(ie_engine_lora_cache(h->o.engine), root, h->model_name, out, &oe) != 0)
        return err_from_oai(e, &oe);
    return 0;
}

/* POST /v1/load_lora_adapter, /v1/unload_lora_adapter (vLLM's bodies and
 * plain-text answers). */
static enum MHD_Result handle_lora_admin(ie_http_t *h, struct MHD_Connection *mc, conn_t *c)
{
    http_err_t e;
    ie_oai_err_t oe;
    char msg[256];
    enum MHD_Result ret;
    cJSON *root = NULL;
    if (ie_tokenizer_check_utf8(c->body.data, c->body.len) != IE_OK || json_has_nul(c->body.data, c->body.len) ||
        !(root = cJSON_ParseWithLength(c->body.data ? c->body.data : "", c->body.len))) {
        err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_json", NULL,
                "the body is not valid JSON (UTF-8, no NUL characters)");
        return send_err(h, mc, c, &e, NULL);
    }
    int unload = c->route == ROUTE_LORA_UNLOAD;
    if (ie_oai_lora_admin(ie_engine_lora_cache(h->o.engine), unload, root, msg, sizeof msg, &oe) != 0) {
        err_from_oai(&e, &oe);
        ret = send_err(h, mc, c, &e, NULL);
    } else {
        if (h->o.verbose) fprintf(stderr, "serve: %s\n", msg);
        ret = send_body(h, mc, c, MHD_HTTP_OK, strdup(msg), "text/plain; charset=utf-8", NULL);
    }
    cJSON_Delete(root);
    return ret;
}

/* Submit choice i of r (prompt in, parameters g; seed + its number among
 * the prompt's, prompt log-probabilities for echo from the prompt's first
 * choice): lease its adapter set, then into the scheduler. A full queue
 * while choices of ours run waits for one of them to end and tries again.
 * 0 submitted; 1 stop submitting, r's state answers (the wait's outcome in
 * *w, or a choice of ours failed); -1 the error in *e. */
static int submit_choice(ie_http_t *h, const cJSON *root, req_t *r, int i, const prompt_in_t *in, gen_t *g, int *w,
                         int fd, http_err_t *e)
{
    const int j = i % r->n_per;
    const uint64_t seed = g->gp.sampling.seed;
    int rc = 0;
    g->gp.sampling.seed = seed + (uint64_t)j;
    g->gp.prompt_logprobs = g->echo && g->lp_k >= 0 && j == 0;
    /* "model": the base's name or a LoRA adapter's (vLLM's convention),
     * plus llama.cpp's "lora" list: the adapter set, leased per choice
     * until its end */
    if (lora_lease(h, root, &r->ch[i].lease, e) != 0) {
        rc = -1;
        goto done;
    }
    for (;;) {
        ie_sched_req_t sr = {.ids = in->ids,
                             .n_ids = in->n,
                             .params = &g->gp,
                             .priority = g->priority,
                             .lora = r->ch[i].lease.id + 1,
                             .lora_salt = r->ch[i].lease.salt,
                             .timeout_ms = h->o.request_timeout_ms,
                             .cb = req_on_event,
                             .cb_ctx = &r->ch[i]};
        req_ref(r); /* the scheduler's, until its terminal event */
        ie_status_t st = ie_sched_submit(h->o.sched, &sr, &r->ch[i].id);
        if (st == IE_OK) {
            r->ch[i].submitted = 1;
            goto done;
        }
        req_unref(r); /* no event will come */
        char why[256];
        snprintf(why, sizeof why, "%s", ie_error_last());
        int live = 0;
        pthread_mutex_lock(&r->mu);
        for (int k = 0; k < i; k++) live += r->ch[k].submitted && !r->ch[k].terminal;
        if (st == IE_ERR_BUSY && live) {
            *w = req_wait_locked(r, h, fd, 1, r->n_ev);
            const int failed = req_failed_locked(r) != NULL || r->oom;
            pthread_mutex_unlock(&r->mu);
            if (*w == WAIT_OK && !failed) continue;
            rc = 1;
        } else {
            pthread_mutex_unlock(&r->mu);
            err_from_sched(e, st, NULL, why);
            rc = -1;
        }
        ie_lora_cache_release(r->lc, &r->ch[i].lease, 0);
        r->ch[i].lease.set = -1;
        goto done;
    }
done:
    g->gp.sampling.seed = seed;
    return rc;
}

/* POST /v1/completions and /v1/chat/completions, body read. */
static enum MHD_Result handle_generate(ie_http_t *h, struct MHD_Connection *mc, conn_t *c)
{
    http_err_t e;
    gen_t g;
    const char *end = NULL;
    cJSON *root = NULL;
    prompt_in_t *pin = NULL; /* the prompts */
    int n_pin = 0;
    req_t *r = NULL;
    stream_t *s = NULL;
    enum MHD_Result ret = MHD_NO;

    memset(&g, 0, sizeof g);
    g.chat = c->route == ROUTE_CHAT;
    /* JSON is UTF-8 (RFC 8259): checked once for the whole body, so no
     * field (a model name echoed in an error, a stop string) carries
     * invalid bytes any further */
    if (ie_tokenizer_check_utf8(c->body.data, c->body.len) != IE_OK) {
        char why[128];
        snprintf(why, sizeof why, "%s", ie_error_last());
        err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_json", NULL,
                "the body is not valid UTF-8 (%s)", why);
        goto answer_err;
    }
    /* cJSON decodes "\u0000" into a NUL that ends its C string: the
     * prompt (or any string) would be cut there without a word */
    if (json_has_nul(c->body.data, c->body.len)) {
        err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", NULL,
                "a string in the body contains a NUL character (\\u0000), which is not accepted");
        goto answer_err;
    }
    root = cJSON_ParseWithLengthOpts(c->body.data ? c->body.data : "", c->body.len, &end, 0);
    if (!root) {
        size_t at = end && c->body.data && end >= c->body.data ? (size_t)(end - c->body.data) : 0;
        err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_json", NULL,
                "the body is not valid JSON (at byte %zu)", at);
        goto answer_err;
    }
    if (!cJSON_IsObject(root)) {
        err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_json", NULL,
                "the body must be a JSON object");
        goto answer_err;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) {
        bad_param(&e, "model", "'model' must be a string");
        goto answer_err;
    }
    if (parse_gen(h, root, &g, &e) != 0) goto answer_err;
    if (g.chat) {
        if (!(pin = calloc(1, sizeof *pin))) {
            err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
            goto answer_err;
        }
        n_pin = 1;
        if (chat_ids(h, root, &g, &pin[0].ids, &pin[0].n, &e) != 0) goto answer_err;
        if (pin[0].n == 0) {
            bad_param(&e, "messages", "the prompt is empty");
            goto answer_err;
        }
        if (pin[0].n > (size_t)h->n_ctx) {
            err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "context_length_exceeded", "messages",
                    "the prompt has %zu tokens; the context holds %d", pin[0].n, h->n_ctx);
            goto answer_err;
        }
    } else if (prompts_parse(h, root, g.suffix, &pin, &n_pin, &e) != 0) {
        goto answer_err;
    }
    if (n_pin * g.n > IE_HTTP_MAX_CHOICES) {
        bad_param(&e, "n", "%d prompts x n %d is more than %d choices in one request", n_pin, g.n,
                  IE_HTTP_MAX_CHOICES);
        goto answer_err;
    }

    if (!(r = req_new(n_pin, g.n, g.lp_k >= 0))) {
        err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        goto answer_err;
    }
    r->lc = ie_engine_lora_cache(h->o.engine);
    c->req = r;
    req_ref(r);
    r->tools = g.tools; /* the answer parses what the request asked for */
    memset(&g.tools, 0, sizeof g.tools);
    for (int p = 0; p < n_pin; p++) {
        r->n_prompt += pin[p].n;
        if (g.echo && echo_prepare(h, &pin[p], &r->pr[p]) != 0) {
            err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
            goto answer_err;
        }
    }
    /* Per prompt, n choices: n scheduler requests of the same prompt,
     * choice j seeded with the request's seed + j. First every prompt's
     * choice 0, then each prompt's others once its choice 0 has its first
     * token: by then its prompt's full KV blocks are in the prefix cache,
     * so a shared prompt is computed once (but for its last, partial
     * block). A full queue with choices of ours running: wait for one to
     * end and go on (a batch larger than the queue); with none: 429. */
    size_t n_events = 0;
    int terminal = 0, oom = 0, w = WAIT_OK, halt = 0;
    for (int phase = 0; phase < 2 && !halt; phase++) {
        for (int i = 0; i < r->n && !halt; i++) {
            const int j = i % g.n;
            if ((j == 0) != (phase == 0)) continue;
            if (j == 1) { /* the prompt's first choice has started (or ended) */
                pthread_mutex_lock(&r->mu);
                while (w == WAIT_OK && !r->ch[i - 1].n_events && !r->ch[i - 1].terminal && !r->oom)
                    w = req_wait_locked(r, h, c->fd, 1, r->n_ev);
                halt = w != WAIT_OK || req_failed_locked(r) != NULL || r->oom; /* answered below */
                pthread_mutex_unlock(&r->mu);
                if (halt) break;
            }
            const int sc = submit_choice(h, root, r, i, &pin[r->ch[i].prompt], &g, &w, c->fd, &e);
            if (sc < 0) {
                if (e.status == MHD_HTTP_BAD_REQUEST)
                    snprintf(e.param, sizeof e.param, "%s", g.chat ? "messages" : "prompt");
                goto answer_err; /* on_completed cancels the choices submitted */
            }
            halt = sc > 0;
        }
    }
    if (halt && w == WAIT_OK) {
        pthread_mutex_lock(&r->mu);
        req_abandon_locked(r);
        pthread_mutex_unlock(&r->mu);
    }

    /* non-streamed: the whole answer; streamed: the first event */
    pthread_mutex_lock(&r->mu);
    if (w == WAIT_OK) w = req_wait_locked(r, h, c->fd, g.stream, 0);
    const choice_t *failed = req_failed_locked(r);
    for (int i = 0; i < r->n; i++) n_events += r->ch[i].n_events;
    terminal = r->n_done == r->n ? IE_SCHED_DONE : 0;
    oom = r->oom;
    pthread_mutex_unlock(&r->mu);
    if (w == WAIT_GONE) goto cleanup; /* MHD_NO: closed; on_completed cancels */
    if (w == WAIT_STOP && !terminal && !failed) {
        err_set(&e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "unavailable", NULL,
                "the server is shutting down");
        goto answer_err;
    }
    if (oom) {
        err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        goto answer_err;
    }
    /* a choice that failed fails the request (before any token of a
     * stream: with its own status) */
    if (failed && (!g.stream || n_events == 0)) {
        err_from_sched(&e, failed->status, failed->code, failed->message);
        goto answer_err;
    }
    if (!g.stream) {
        ret = send_json(h, mc, c, MHD_HTTP_OK, final_json(h, r, g.chat, g.lp_k));
        goto cleanup;
    }

    if (!(s = calloc(1, sizeof *s))) {
        err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        goto answer_err;
    }
    s->h = h;
    s->r = r;
    req_ref(r);
    s->fd = c->fd;
    s->chat = g.chat;
    s->harmony = g.chat && h->chat_fmt == IE_CHAT_HARMONY;
    s->lp_k = g.lp_k;
    s->include_usage = g.include_usage;
    ident_make(&s->x, g.chat);
    int hp_bad = 0;
    if (!(s->c = calloc((size_t)r->n, sizeof *s->c))) hp_bad = 1;
    for (int i = 0; s->harmony && i < r->n && !hp_bad; i++)
        hp_bad = ie_harmony_parser_new(h->tok, on_harmony, &s->c[i].cb, &s->c[i].hp) != IE_OK;
    if (hp_bad) {
        stream_free(s);
        err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        goto answer_err;
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s,
                                                                  stream_free);
    if (!resp) {
        stream_free(s);
        goto cleanup;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    cors_headers(h, resp, 0);
    ret = MHD_queue_response(mc, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    c->status = MHD_HTTP_OK;
    count_status(h, MHD_HTTP_OK);
    goto cleanup;

answer_err:
    ret = send_err(h, mc, c, &e, NULL);
cleanup:
    for (int i = 0; r && i < r->n; i++) /* no terminal event will come for these */
        if (!r->ch[i].submitted) ie_lora_cache_release(r->lc, &r->ch[i].lease, 0);
    req_unref(r); /* this function's own reference (c->req holds another) */
    ie_oai_tools_free(&g.tools);
    cJSON_Delete(root);
    prompts_free(pin, n_pin);
    free(g.schema_text);
    free(g.bias);
    return ret;
}

/* POST /v1/embeddings, body read: one scheduler request per input
 * (pooling h->o.pooling), submitted as the queue takes them (a full queue
 * with none of ours running is a 429, else we wait for one of ours to end
 * and go on), then the vectors, normalized, in input order. A client gone
 * or a server stopping cancels the requests still running. */
static enum MHD_Result handle_embed(ie_http_t *h, struct MHD_Connection *mc, conn_t *c)
{
    http_err_t e;
    ie_embd_req_t q;
    ie_embd_err_t pe;
    ie_embd_wait_t *w = NULL;
    uint64_t *sid = NULL;
    cJSON *js = NULL;
    size_t next = 0, n_ended = 0;
    enum MHD_Result ret = MHD_NO;
    const int dim = ie_backend_geom(ie_engine_backend(h->o.engine))->n_embd;
    memset(&e, 0, sizeof e);

    if (ie_embd_parse(c->body.data, c->body.len, h->tok, h->n_vocab, h->n_ctx, &q, &pe) != IE_OK) {
        err_set(&e, pe.status, pe.status == 400 ? "invalid_request_error" : "server_error", pe.code,
                pe.param[0] ? pe.param : NULL, "%s", ie_error_last());
        goto answer_err;
    }
    if (dim <= 0) {
        err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "unsupported", NULL,
                "this server's backend gives no hidden states: embeddings are not available");
        goto answer_err;
    }
    if (ie_embd_wait_new(q.n_in, dim, &w) != IE_OK || !(sid = calloc(q.n_in, sizeof *sid))) {
        err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        goto answer_err;
    }
    /* "model": the base's name, or a LoRA adapter's (as for generation),
     * leased until every input's terminal event (ie_embd_wait_hold) */
    ie_lora_lease_t lease = {-1, 0, -1};
    if (q.model && strcmp(q.model, h->model_name)) {
        const ie_lora_use_t use = {q.model, NAN};
        if (ie_lora_cache_acquire(ie_engine_lora_cache(h->o.engine), &use, 1, &lease) != IE_OK) {
            err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found", "model",
                    "The model '%.200s' does not exist (this server has '%.200s'): %s", q.model, h->model_name,
                    ie_error_last());
            goto answer_err;
        }
        ie_embd_wait_hold(w, ie_engine_lora_cache(h->o.engine), lease);
    }
    const int lora = lease.id + 1;
    ie_gen_params_t gp;
    ie_gen_params_default(&gp);
    gp.max_new = 0;
    for (;;) {
        while (next < q.n_in) {
            ie_sched_req_t sr = {.ids = q.ids[next],
                                 .n_ids = q.n_ids[next],
                                 .params = &gp,
                                 .lora = lora,
                                 .timeout_ms = h->o.request_timeout_ms,
                                 .cb = ie_embd_wait_on_event,
                                 .cb_ctx = ie_embd_wait_slot(w, next),
                                 .pooling = h->o.pooling != IE_POOL_NONE ? h->o.pooling : IE_POOL_MEAN};
            ie_embd_wait_ref(w); /* the scheduler's, until the terminal event */
            ie_status_t st = ie_sched_submit(h->o.sched, &sr, &sid[next]);
            if (st == IE_OK) {
                next++;
                continue;
            }
            ie_embd_wait_unref(w);                          /* no event will come */
            if (st == IE_ERR_BUSY && n_ended < next) break; /* ours still run: wait for one */
            err_from_sched(&e, st, NULL, ie_error_last());
            if (e.status == MHD_HTTP_BAD_REQUEST) snprintf(e.param, sizeof e.param, "input");
            goto cancel;
        }
        if (n_ended == q.n_in) break;
        if (ie_embd_wait_poll(w, IE_HTTP_POLL_MS, &n_ended)) {
            const char *code, *msg;
            ie_status_t st = ie_embd_wait_error(w, &code, &msg);
            err_from_sched(&e, st, code, msg);
            goto cancel;
        }
        if (atomic_load(&h->stopping)) {
            err_set(&e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "unavailable", NULL,
                    "the server is shutting down");
            goto cancel;
        }
        if (peer_gone(c->fd)) {
            if (h->m_gone) ie_metric_add(h->m_gone, NULL, 1);
            for (size_t i = 0; i < next; i++) ie_sched_cancel(h->o.sched, sid[i]);
            goto cleanup; /* MHD_NO: closed */
        }
    }
    size_t n_tok = 0;
    js = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(js, "data");
    cJSON_AddStringToObject(js, "object", "list");
    for (size_t i = 0; i < q.n_in && data; i++) {
        float *v = ie_embd_wait_vec(w, i);
        cJSON *d = cJSON_CreateObject();
        if (!v || !d || !cJSON_AddItemToArray(data, d)) {
            cJSON_Delete(d);
            err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL,
                    "an embedding is missing");
            goto answer_err;
        }
        ie_embd_normalize(v, dim, h->o.embd_norm ? h->o.embd_norm : IE_EMBD_NORM_L2);
        n_tok += ie_embd_wait_tokens(w, i);
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", (double)i);
        if (q.base64) {
            char *b64 = ie_embd_base64(v, dim);
            cJSON_AddStringToObject(d, "embedding", b64 ? b64 : "");
            free(b64);
        } else {
            cJSON *arr = cJSON_AddArrayToObject(d, "embedding");
            for (int j = 0; arr && j < dim; j++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(v[j]));
        }
    }
    cJSON_AddStringToObject(js, "model", q.model ? q.model : h->model_name);
    cJSON *u = cJSON_AddObjectToObject(js, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)n_tok);
    cJSON_AddNumberToObject(u, "total_tokens", (double)n_tok);
    ret = send_json(h, mc, c, MHD_HTTP_OK, js);
    js = NULL; /* send_json's */
    goto cleanup;

cancel:
    for (size_t i = 0; i < next; i++) ie_sched_cancel(h->o.sched, sid[i]); /* the ended ones: no such request */
answer_err:
    ret = send_err(h, mc, c, &e, NULL);
cleanup:
    cJSON_Delete(js);
    ie_embd_wait_unref(w);
    free(sid);
    ie_embd_req_free(&q);
    return ret;
}

static cJSON *model_json(ie_http_t *h)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", h->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->created);
    cJSON_AddStringToObject(m, "owned_by", "clocher");
    return m;
}

/* GET /health, /metrics, /v1/models[/ID]. */
static enum MHD_Result handle_get(ie_http_t *h, struct MHD_Connection *mc, conn_t *c, const char *url)
{
    http_err_t e;
    if (!strcmp(url, "/health")) {
        ie_sched_stats_t ss; /* the cluster belongs to the serving thread; the scheduler's copy is locked */
        ie_sched_stats(h->o.sched, &ss);
        int ok = ss.ready && !ss.draining; /* a draining server leaves the load balancer's pool */
        cJSON *js = cJSON_CreateObject();
        cJSON_AddStringToObject(js, "status", ok ? "ok" : ss.draining ? "draining" : "unavailable");
        return send_json(h, mc, c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, js);
    }
    if (!strcmp(url, "/metrics")) {
        ie_buf_t b = {0};
        if (ie_metrics_render(h->o.metrics, &b) != IE_OK || !b.data) {
            ie_buf_free(&b);
            err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "rendering failed");
            return send_err(h, mc, c, &e, NULL);
        }
        return send_body(h, mc, c, MHD_HTTP_OK, b.data, "text/plain; version=0.0.4; charset=utf-8", NULL);
    }
    if (!strcmp(url, "/v1/models")) {
        cJSON *js = cJSON_CreateObject();
        cJSON_AddStringToObject(js, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(js, "data");
        cJSON_AddItemToArray(data, model_json(h));
        static _Thread_local ie_lora_info_t info[IE_LORA_CACHE_MAX];
        int n = ie_lora_cache_list(ie_engine_lora_cache(h->o.engine), info, IE_LORA_CACHE_MAX);
        for (int i = 0; i < n && i < IE_LORA_CACHE_MAX; i++) { /* adapters, with their parent */
            cJSON *m = model_json(h);
            cJSON_ReplaceItemInObject(m, "id", cJSON_CreateString(info[i].name));
            cJSON_AddStringToObject(m, "parent", h->model_name);
            cJSON_AddStringToObject(m, "root", h->model_name);
            cJSON_AddNumberToObject(m, "lora_id", info[i].index); /* llama.cpp's lora[].id */
            cJSON_AddBoolToObject(m, "resident", info[i].resident);
            cJSON_AddBoolToObject(m, "pinned", info[i].pinned);
            cJSON_AddItemToArray(data, m);
        }
        return send_json(h, mc, c, MHD_HTTP_OK, js);
    }
    /* /v1/models/ID */
    const char *id = url + strlen("/v1/models/");
    if (strcmp(id, h->model_name) && ie_lora_cache_index(ie_engine_lora_cache(h->o.engine), id) >= 0) {
        cJSON *m = model_json(h);
        cJSON_ReplaceItemInObject(m, "id", cJSON_CreateString(id));
        cJSON_AddStringToObject(m, "parent", h->model_name);
        return send_json(h, mc, c, MHD_HTTP_OK, m);
    }
    if (strcmp(id, h->model_name)) {
        err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found", "model",
                "The model '%.200s' does not exist", id);
        return send_err(h, mc, c, &e, NULL);
    }
    return send_json(h, mc, c, MHD_HTTP_OK, model_json(h));
}

/* ------------------------------------------------------- /tokenize */

/* POST /tokenize and /detokenize (serve_tok.h has the shapes): the body
 * is checked as a generation's is (UTF-8, no NUL, a JSON object); vLLM's
 * "messages" go through the chat template as /v1/chat/completions' do. */
static enum MHD_Result handle_tokenize(ie_http_t *h, struct MHD_Connection *mc, conn_t *c)
{
    http_err_t e;
    ie_tokapi_err_t te = {0};
    gen_t g;
    cJSON *root = NULL, *out = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = -1;

    memset(&g, 0, sizeof g);
    if (ie_tokenizer_check_utf8(c->body.data, c->body.len) != IE_OK || json_has_nul(c->body.data, c->body.len) ||
        !(root = cJSON_ParseWithLength(c->body.data ? c->body.data : "", c->body.len)) || !cJSON_IsObject(root)) {
        err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_json", NULL,
                "the body must be a JSON object in UTF-8 (without NUL characters)");
        goto answer;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) &&
        (!cJSON_IsString(model) ||
         (strcmp(model->valuestring, h->model_name) &&
          ie_lora_cache_index(ie_engine_lora_cache(h->o.engine), model->valuestring) < 0))) {
        err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found", "model",
                "The model does not exist (this server has '%.200s')", h->model_name);
        goto answer;
    }
    if (c->route == ROUTE_DETOKENIZE) {
        rc = ie_tokapi_detokenize(h->tok, root, &out, &te);
    } else if (cJSON_GetObjectItemCaseSensitive(root, "messages")) {
        ie_engine_chat_opts(h->o.engine, &g.chat_opts);
        if (chat_ids(h, root, &g, &ids, &n_ids, &e) != 0) goto answer;
        rc = ie_tokapi_tokenize(h->tok, h->n_ctx, root, ids ? ids : (int32_t[1]){0}, n_ids, &out, &te);
    } else {
        rc = ie_tokapi_tokenize(h->tok, h->n_ctx, root, NULL, 0, &out, &te);
    }
    if (rc != 0) {
        if (te.oom) err_set(&e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        else
            err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", te.param, "%s", te.message);
    }
answer:
    cJSON_Delete(root);
    free(ids);
    if (out) return send_json(h, mc, c, MHD_HTTP_OK, out);
    return send_err(h, mc, c, &e, NULL);
}

/* ------------------------------------------------------------- dispatch */

static void read_done(ie_http_t *h, struct MHD_Connection *mc, int phase); /* "read deadline" below */

/* 1 when the request carries "Authorization: Bearer <api_key>". The
 * comparison takes the same time wherever the first difference is. */
static int authorized(ie_http_t *h, struct MHD_Connection *mc)
{
    const char *v = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v || strncasecmp(v, "Bearer ", 7)) return 0;
    v += 7;
    while (*v == ' ') v++;
    size_t n = strlen(h->api_key), m = strlen(v);
    volatile unsigned char d = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(h->api_key[i] ^ (i < m ? v[i] : 0));
    return d == 0;
}


/* Adds the size of one header or query argument (name, value and their
 * separators) to *cls (a size_t). */
static enum MHD_Result add_value_len(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

/* Sets e and returns 1 when the request's URI or headers exceed our limits
 * (414, 431); 0 otherwise. */
static int too_big(struct MHD_Connection *mc, const char *url, http_err_t *e)
{
    size_t uri = strlen(url), hdr = 0;
    MHD_get_connection_values(mc, MHD_GET_ARGUMENT_KIND, add_value_len, &uri);
    MHD_get_connection_values(mc, MHD_HEADER_KIND, add_value_len, &hdr);
    int big = 1;
    if (uri > IE_HTTP_MAX_URI)
        err_set(e, MHD_HTTP_URI_TOO_LONG, "invalid_request_error", "uri_too_long", NULL,
                "the request URI has %zu bytes; at most %d are accepted", uri, IE_HTTP_MAX_URI);
    else if (hdr > IE_HTTP_MAX_HEADERS)
        err_set(e, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE, "invalid_request_error", "headers_too_large", NULL,
                "the request headers have %zu bytes; at most %d are accepted", hdr, IE_HTTP_MAX_HEADERS);
    else big = 0;
    return big;
}

static route_t route_of(ie_http_t *h, const char *url)
{
    if (!strcmp(url, "/v1/completions")) return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/v1/embeddings")) return ROUTE_EMBED;
    if (!strcmp(url, "/tokenize")) return ROUTE_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return ROUTE_DETOKENIZE;
    if (!strcmp(url, "/v1/load_lora_adapter")) return ROUTE_LORA_LOAD;
    if (!strcmp(url, "/v1/unload_lora_adapter")) return ROUTE_LORA_UNLOAD;
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/models") || (!strncmp(url, "/v1/models/", 11) && url[11]) ||
        (!strcmp(url, "/metrics") && h->o.metrics))
        return ROUTE_GET;
    return ROUTE_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    ie_http_t *h = cls;
    conn_t *c = *con_cls;
    (void)version;

    if (!c) { /* headers only: route and authorize; the answer waits for the
               * end of the request (answering before it is read closes the
               * connection, and answering while a client still sends can
               * lose the answer to a connection reset) */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        *con_cls = c;
        c->t0 = ie_now_ms();
        c->fd = -1;
        snprintf(c->method, sizeof c->method, "%s", method);
        snprintf(c->url, sizeof c->url, "%s", url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) c->fd = (int)ci->connect_fd;
        int post = !strcmp(method, MHD_HTTP_METHOD_POST);
        int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
        route_t rt = route_of(h, url);
        c->early = 1;
        if (too_big(mc, url, &c->err)) {
            /* answered in JSON, not by libmicrohttpd (IE_HTTP_CONN_MEMORY) */
        } else if (h->cors_origin && !strcmp(method, MHD_HTTP_METHOD_OPTIONS) && rt != ROUTE_NONE) {
            c->preflight = 1; /* before the key check: a preflight carries no credentials */
        } else if (h->api_key && (!strncmp(url, "/v1/", 4) || rt == ROUTE_TOKENIZE || rt == ROUTE_DETOKENIZE) &&
                   !authorized(h, mc)) {
            err_set(&c->err, MHD_HTTP_UNAUTHORIZED, "invalid_request_error", "invalid_api_key", NULL,
                    "Incorrect API key provided (send 'Authorization: Bearer <key>')");
        } else if (rt == ROUTE_NONE) {
            err_set(&c->err, MHD_HTTP_NOT_FOUND, "invalid_request_error", "not_found", NULL,
                    "Invalid URL (%s %.100s)", method, url);
        } else if ((rt == ROUTE_GET && !get) || (rt != ROUTE_GET && !post)) {
            c->allow = rt == ROUTE_GET ? "GET, HEAD" : "POST";
            err_set(&c->err, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", NULL,
                    "Method %s is not allowed for %.100s (%s)", method, url, c->allow);
        } else if (post && !json_content(mc)) {
            err_set(&c->err, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "invalid_request_error", "unsupported_media_type",
                    NULL, "the body must be sent as Content-Type: application/json");
        } else {
            c->early = 0;
            c->route = rt;
            /* a body declared far too large is refused before it is sent */
            const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (rt != ROUTE_GET && cl && strtoull(cl, NULL, 10) > 16 * (unsigned long long)h->max_body) {
                err_set(&c->err, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large", NULL,
                        "the body has %s bytes; at most %zu are accepted", cl, h->max_body);
                return send_err(h, mc, c, &c->err, NULL);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) { /* a piece of the body */
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (c->early || c->too_large || c->body_oom) return MHD_YES; /* read and dropped */
        if (c->body.len + n > h->max_body) {
            c->too_large = 1;
            ie_buf_free(&c->body);
        } else if (ie_buf_append(&c->body, upload_data, n) != 0) {
            c->body_oom = 1;
        }
        return MHD_YES;
    }
    /* the body is complete: the read deadline is met */
    read_done(h, mc, 0);
    if (c->preflight) return send_body(h, mc, c, MHD_HTTP_NO_CONTENT, strdup(""), "text/plain", NULL);
    if (c->early) return send_err(h, mc, c, &c->err, c->allow);
    if (c->too_large) {
        err_set(&c->err, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large", NULL,
                "the body is larger than %zu bytes", h->max_body);
        return send_err(h, mc, c, &c->err, NULL);
    }
    if (c->body_oom) {
        err_set(&c->err, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "internal", NULL, "out of memory");
        return send_err(h, mc, c, &c->err, NULL);
    }
    if (c->status) return MHD_YES; /* answered already */
    if (c->route == ROUTE_GET) return handle_get(h, mc, c, url);
    if (c->route == ROUTE_TOKENIZE || c->route == ROUTE_DETOKENIZE) return handle_tokenize(h, mc, c);
    if (c->route == ROUTE_LORA_LOAD || c->route == ROUTE_LORA_UNLOAD) return handle_lora_admin(h, mc, c);
    pthread_mutex_lock(&h->mu);
    h->n_busy++;
    pthread_mutex_unlock(&h->mu);
    c->busy = 1;
    return c->route == ROUTE_EMBED ? handle_embed(h, mc, c) : handle_generate(h, mc, c);
}

/* The request is over (answered, failed, or its client gone): cancel a
 * generation that has not ended, drop the connection's state. */
static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    ie_http_t *h = cls;
    conn_t *c = *con_cls;
    read_done(h, mc, 1); /* a kept-alive connection reads its next request from now */
    if (!c) return;
    *con_cls = NULL;
    if (c->req) {
        req_t *r = c->req;
        int cancelled = 0;
        for (int i = 0; i < r->n; i++) {
            pthread_mutex_lock(&r->mu);
            int ended = r->ch[i].terminal;
            pthread_mutex_unlock(&r->mu);
            if (r->ch[i].submitted && !ended) cancelled |= ie_sched_cancel(h->o.sched, r->ch[i].id) == IE_OK;
        }
        /* a request answered with an error may leave choices running
         * (a later choice was refused): not a client gone */
        if (cancelled && c->status < 400) {
            if (!atomic_load(&h->stopping) && h->m_gone) ie_metric_add(h->m_gone, NULL, 1);
            if (h->o.verbose) fprintf(stderr, "http: %s %s: client gone, request cancelled\n", c->method, c->url);
        }
        req_unref(r);
    }
    if (h->o.verbose)
        fprintf(stderr, "http: %s %s %u %.1f ms%s\n", c->method, c->url, c->status, ie_now_ms() - c->t0,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)");
    if (c->busy) {
        pthread_mutex_lock(&h->mu);
        h->n_busy--;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
    ie_buf_free(&c->body);
    free(c);
}

/* ------------------------------------------------------- read deadline */

/* Why a deadline of our own: libmicrohttpd's connection timeout is an idle
 * timeout that every received byte restarts, so a client sending one
 * header byte every few seconds holds its connection (and, in this
 * thread-per-connection server, a thread) forever; a thousand of them take
 * every connection. Each connection here must deliver its whole request
 * within read_timeout_ms; a slower one is shut down (its thread then sees
 * the end of the stream and libmicrohttpd closes it). */

/* Phase 0: the request of mc's connection is read whole (its deadline is
 * met); 1: its answer went out, the next request's read starts now. */
static void read_done(ie_http_t *h, struct MHD_Connection *mc, int phase)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hconn_t *hc = ci ? ci->socket_context : NULL;
    if (!hc) return;
    pthread_mutex_lock(&h->conns_mu);
    if (phase == 0) hc->reading = 0;
    if (phase == 1) {
        hc->reading = 1;
        hc->t_read = ie_now_ms();
    }
    pthread_mutex_unlock(&h->conns_mu);
}

/* Unlinks and returns the handed-off connection of fd, if any (conns_mu
 * held). */
static hconn_t *handoff_take(ie_http_t *h, int fd)
{
    hconn_t *hc = h->handoff;
    while (hc && hc->fd != fd) hc = hc->next;
    if (!hc) return NULL;
    if (hc->prev) hc->prev->next = hc->next;
    else h->handoff = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    hc->prev = hc->next = NULL;
    return hc;
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    ie_http_t *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        pthread_mutex_lock(&h->conns_mu);
        hconn_t *hc = fd ? handoff_take(h, (int)fd->connect_fd) : NULL; /* its read began at the accept */
        pthread_mutex_unlock(&h->conns_mu);
        if (!hc && fd && (hc = calloc(1, sizeof *hc))) {
            hc->fd = (int)fd->connect_fd;
            hc->peer_len = sizeof hc->peer;
            if (getpeername(hc->fd, (struct sockaddr *)&hc->peer, &hc->peer_len) != 0) hc->peer_len = 0;
            hc->t_read = ie_now_ms();
        }
        if (!hc) return; /* not watched: libmicrohttpd's idle timeout still applies */
        hc->reading = 1;
        pthread_mutex_lock(&h->conns_mu);
        hc->next = h->conns;
        if (h->conns) h->conns->prev = hc;
        h->conns = hc;
        pthread_mutex_unlock(&h->conns_mu);
        *socket_context = hc;
        return;
    }
    hconn_t *hc = *socket_context; /* CLOSED: before libmicrohttpd closes the socket */
    if (!hc) return;
    *socket_context = NULL;
    pthread_mutex_lock(&h->conns_mu);
    if (hc->prev) hc->prev->next = hc->next;
    else h->conns = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    pthread_mutex_unlock(&h->conns_mu);
    free(hc);
}

/* The gate's callbacks (serve_http_gate.h), on its thread. A connection
 * with a good first head goes to libmicrohttpd, which applies its own
 * limits and the accept policy again and closes fd when it refuses it. */
static void gate_admit(void *ctx, int fd, const struct sockaddr *sa, socklen_t len, double t_accept)
{
    ie_http_t *h = ctx;
    hconn_t *hc = calloc(1, sizeof *hc);
    pthread_mutex_lock(&h->conns_mu);
    free(handoff_take(h, fd)); /* one left by a connection libmicrohttpd never started: fd is new now */
    pthread_mutex_unlock(&h->conns_mu);
    if (hc) {
        hc->fd = fd;
        memcpy(&hc->peer, sa, len <= sizeof hc->peer ? len : sizeof hc->peer);
        hc->peer_len = len <= sizeof hc->peer ? len : 0;
        hc->t_read = t_accept;
        pthread_mutex_lock(&h->conns_mu);
        hc->next = h->handoff;
        if (h->handoff) h->handoff->prev = hc;
        h->handoff = hc;
        pthread_mutex_unlock(&h->conns_mu);
    }
    if (MHD_add_connection(h->d, fd, sa, len) != MHD_YES && hc) {
        pthread_mutex_lock(&h->conns_mu);
        hconn_t *left = handoff_take(h, fd); /* not started: ours to free */
        pthread_mutex_unlock(&h->conns_mu);
        free(left);
    }
}

static int addr_eq(const struct sockaddr_storage *a, socklen_t alen, const struct sockaddr *b)
{
    if (alen == 0 || a->ss_family != b->sa_family) return 0;
    if (b->sa_family == AF_INET)
        return !memcmp(&((const struct sockaddr_in *)a)->sin_addr, &((const struct sockaddr_in *)b)->sin_addr,
                       sizeof(struct in_addr));
    if (b->sa_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return 0;
}

static int gate_held(void *ctx, const struct sockaddr *sa, int *n_addr)
{
    ie_http_t *h = ctx;
    int n = 0;
    *n_addr = 0;
    pthread_mutex_lock(&h->conns_mu);
    for (int k = 0; k < 2; k++)
        for (hconn_t *hc = k ? h->handoff : h->conns; hc; hc = hc->next) {
            n++;
            *n_addr += addr_eq(&hc->peer, hc->peer_len, sa);
        }
    pthread_mutex_unlock(&h->conns_mu);
    return n;
}

static void gate_slow(void *ctx)
{
    ie_http_t *h = ctx;
    if (h->m_slow) ie_metric_add(h->m_slow, NULL, 1);
}

static void gate_answer(void *ctx, int status) { count_status(ctx, (unsigned)status); }

/* Shut down the connections whose request is overdue (conns_mu held). The
 * peer address is compared first: a descriptor is only shut down while it
 * is still that connection's. */
static void reap_slow(ie_http_t *h, double now)
{
    for (hconn_t *hc = h->conns; hc; hc = hc->next) {
        if (!hc->reading || hc->cut || now - hc->t_read < h->o.read_timeout_ms) continue;
        struct sockaddr_storage peer;
        socklen_t len = sizeof peer;
        if (hc->peer_len == 0 || getpeername(hc->fd, (struct sockaddr *)&peer, &len) != 0 || len != hc->peer_len ||
            memcmp(&peer, &hc->peer, len) != 0)
            continue;
        shutdown(hc->fd, SHUT_RDWR);
        hc->cut = 1;
        if (h->m_slow) ie_metric_add(h->m_slow, NULL, 1);
        if (h->o.verbose)
            fprintf(stderr, "http: a connection sent no whole request within %d ms: closed\n",
                    h->o.read_timeout_ms);
    }
}

static void *reaper_main(void *arg)
{
    ie_http_t *h = arg;
    pthread_mutex_lock(&h->conns_mu);
    while (h->reaper_running) {
        reap_slow(h, ie_now_ms());
        const struct timespec ts = ie_deadline_ms(IE_HTTP_REAP_MS);
        pthread_cond_timedwait(&h->reaper_cv, &h->conns_mu, &ts);
    }
    pthread_mutex_unlock(&h->conns_mu);
    return NULL;
}

/* ------------------------------------------------------------ lifecycle */

/* Contract: starts the server on o->addr:o->port (an IPv4/IPv6 literal or
 * "localhost"; NULL = 127.0.0.1; port 0 = any free one). engine and sched
 * are required and must outlive the server (stop it before destroying
 * them); metrics (optional) too. The strings are copied. *out receives
 * the server, owned by the caller (ie_http_stop). IE_ERR_INVAL for bad
 * options, IE_ERR_IO when the address cannot be bound, IE_ERR_NOMEM. */
ie_status_t ie_http_start(const ie_http_opts_t *o, ie_http_t **out)
{
    ie_status_t st = IE_OK;
    ie_http_t *h = NULL;
    struct sockaddr_storage ss;
    /* no listening socket of libmicrohttpd's: the gate accepts (serve_http_gate.h) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_NO_LISTEN_SOCKET;
    const char *addr;

    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_http_start: out is NULL");
    *out = NULL;
    if (!o || !o->engine || !o->sched)
        return ie_error_set(IE_ERR_INVAL, "http: an engine and a scheduler are required");
    if (!ie_engine_tokenizer(o->engine)) return ie_error_set(IE_ERR_INVAL, "http: the engine has no tokenizer");
    if (o->port < 0 || o->port > 65535) return ie_error_set(IE_ERR_INVAL, "http: bad port %d", o->port);
    if (o->max_body < 0 || o->request_timeout_ms < 0 || o->read_timeout_ms < 0 || o->max_conns < 0 ||
        o->max_conns_per_addr < 0)
        return ie_error_set(IE_ERR_INVAL,
                            "http: bad max_body %d, request_timeout_ms %d, read_timeout_ms %d or connection "
                            "limits %d / %d",
                            o->max_body, o->request_timeout_ms, o->read_timeout_ms, o->max_conns,
                            o->max_conns_per_addr);
    if (o->api_key && !*o->api_key) return ie_error_set(IE_ERR_INVAL, "http: empty API key");
    addr = o->addr && *o->addr ? o->addr : "127.0.0.1";
    if (!strcmp(addr, "localhost")) addr = "127.0.0.1";

    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)o->port);
    } else if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)o->port);
    } else {
        return ie_error_set(IE_ERR_INVAL, "http: '%s' is not an IP address", addr);
    }

    if (!(h = calloc(1, sizeof *h))) return ie_error_set(IE_ERR_NOMEM, "http: out of memory");
    pthread_mutex_init(&h->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&h->cv, &ca);
        pthread_cond_init(&h->reaper_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    pthread_mutex_init(&h->conns_mu, NULL);
    h->o = *o;
    if (h->o.read_timeout_ms == 0) h->o.read_timeout_ms = IE_HTTP_READ_TIMEOUT_MS;
    if (h->o.max_conns == 0) h->o.max_conns = IE_HTTP_MAX_CONNS;
    if (h->o.max_conns_per_addr == 0) h->o.max_conns_per_addr = IE_HTTP_MAX_CONNS_PER_ADDR;
    h->o.addr = NULL;
    h->o.api_key = NULL;
    h->o.model_name = NULL;
    h->o.cors_origin = NULL;
    h->listen_fd = MHD_INVALID_SOCKET;
    h->created = (long)time(NULL);
    h->tok = ie_engine_tokenizer(o->engine);
    ie_chat_opts_t co = {0};
    ie_engine_chat_opts(o->engine, &co);
    h->chat_fmt = ie_chat_format_for(h->tok, &co);
    h->n_ctx = ie_backend_geom(ie_engine_backend(o->engine))->n_ctx;
    h->n_vocab = ie_tokenizer_n_vocab(h->tok);
    h->max_body = o->max_body > 0 ? (size_t)o->max_body : (size_t)1 << 20;
    atomic_init(&h->stopping, 0);
    const ie_hparams_t *hp = ie_engine_hparams(o->engine);
    const char *name = o->model_name && *o->model_name ? o->model_name : hp && hp->name[0] ? hp->name : "model";
    if (!(h->model_name = strdup(name)) || (o->api_key && !(h->api_key = strdup(o->api_key))) ||
        (o->cors_origin && !(h->cors_origin = strdup(o->cors_origin)))) {
        st = ie_error_set(IE_ERR_NOMEM, "http: out of memory");
        goto cleanup;
    }
    if (o->metrics) {
        if ((st = ie_metrics_counter(o->metrics, "ie_http_requests_total", "HTTP API answers by status code",
                                     "code", &h->m_req)) != IE_OK ||
            (st = ie_metrics_counter(o->metrics, "ie_http_client_disconnects_total",
                                     "HTTP generation requests cancelled because their client went away", NULL,
                                     &h->m_gone)) != IE_OK ||
            (st = ie_metrics_counter(o->metrics, "ie_http_slow_requests_total",
                                     "HTTP connections closed for not sending a whole request within the read "
                                     "deadline",
                                     NULL, &h->m_slow)) != IE_OK)
            goto cleanup;
        static const double sb[] = {0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};
        if ((st = ie_metrics_histogram(o->metrics, "ie_stage_seconds", "Time per step in each stage", "stage", sb,
                                       10, &h->m_stage)) != IE_OK)
            goto cleanup;
    }
    int one = 1;
    h->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (h->listen_fd < 0 || setsockopt(h->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (ss.ss_family == AF_INET6 && setsockopt(h->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
        bind(h->listen_fd, (struct sockaddr *)&ss, ss.ss_family == AF_INET6 ? sizeof *in6 : sizeof *in4) != 0 ||
        listen(h->listen_fd, SOMAXCONN) != 0) {
        st = ie_error_set(IE_ERR_IO, "http: cannot listen on %s:%d (%s)", addr, o->port, strerror(errno));
        goto cleanup;
    }
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)IE_HTTP_CONN_MEMORY,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)h->o.max_conns,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)h->o.max_conns_per_addr, MHD_OPTION_END);
    if (!h->d) {
        st = ie_error_set(IE_ERR_IO, "http: cannot start libmicrohttpd (%s)", strerror(errno));
        goto cleanup;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (getsockname(h->listen_fd, (struct sockaddr *)&bound, &blen) != 0) {
        st = ie_error_set(IE_ERR_IO, "http: cannot tell which port it bound");
        goto cleanup;
    }
    h->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    ie_http_gate_opts_t go = {.max_conns = h->o.max_conns,
                              .max_conns_per_addr = h->o.max_conns_per_addr,
                              .read_timeout_ms = h->o.read_timeout_ms,
                              .max_uri = IE_HTTP_MAX_URI,
                              .max_headers = IE_HTTP_MAX_HEADERS,
                              .verbose = h->o.verbose,
                              .admit = gate_admit,
                              .held = gate_held,
                              .on_slow = gate_slow,
                              .on_answer = gate_answer,
                              .ctx = h};
    if ((st = ie_http_gate_start(h->listen_fd, &go, &h->gate)) != IE_OK) goto cleanup;
    h->reaper_running = 1;
    if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
        h->reaper_running = 0;
        st = ie_error_set(IE_ERR_NOMEM, "http: cannot start a thread");
        goto cleanup;
    }
    *out = h;
    h = NULL;
cleanup:
    if (h) ie_http_stop(&h);
    return st;
}

/* Contract: the TCP port the server listens on; -1 for NULL. */
int ie_http_port(const ie_http_t *h) { return h ? h->port : -1; }

/* Contract: see ie_http.h. Requests waiting for their generation answer
 * 503 (streams: an error event and [DONE]) within IE_HTTP_POLL_MS; their
 * generations are cancelled; open connections are closed after at most
 * IE_HTTP_STOP_GRACE_MS. Frees the server, sets *self_p to NULL. */
void ie_http_stop(ie_http_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_http_t *h = *self_p;
    *self_p = NULL;
    atomic_store(&h->stopping, 1);
    ie_http_gate_stop(&h->gate); /* no new connections (the socket stays open: clients wait, not refused) */
    if (h->reaper_running) {
        pthread_mutex_lock(&h->conns_mu);
        h->reaper_running = 0;
        pthread_cond_broadcast(&h->reaper_cv);
        pthread_mutex_unlock(&h->conns_mu);
        pthread_join(h->reaper, NULL);
    }
    if (h->d) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += IE_HTTP_STOP_GRACE_MS / 1000;
        pthread_mutex_lock(&h->mu);
        while (h->n_busy > 0)
            if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) == ETIMEDOUT) break;
        pthread_mutex_unlock(&h->mu);
        MHD_stop_daemon(h->d);
    }
    if (h->listen_fd != MHD_INVALID_SOCKET) close(h->listen_fd);
    for (hconn_t *hc = h->handoff, *nx; hc; hc = nx) {
        nx = hc->next;
        free(hc);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->conns_mu);
    pthread_cond_destroy(&h->reaper_cv);
    free(h->api_key);
    free(h->cors_origin);
    free(h->model_name);
    free(h);
}
