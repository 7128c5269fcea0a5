/* serve_zmq.c — the serving loop and the ZeroMQ client endpoint (ie_serve.h).
 *
 * A client request becomes one scheduler request; its events are turned
 * into replies on this thread (the only one that touches the socket). A
 * request's state outlives the loop if it must: when the loop ends, open
 * requests are answered "unavailable" and orphaned, and the scheduler's
 * terminal event later only frees them.
 */
#include "ie_serve.h"
#include "ie_clock.h"

#include "ie_chat.h"
#include "ie_proto.h"
#include "ie_sdnotify.h"
#include "ie_lora_cache.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct server server_t;

typedef struct pending {
    ie_client_req_t req;
    char env[2][256]; /* routing envelope: identity [+ empty delimiter] */
    size_t env_len[2];
    int n_env;
    uint64_t sid;       /* scheduler id                                   */
    int32_t sent;       /* token events sent                              */
    int peer;           /* the client's connection (ie_sock_last_peer)     */
    int gone;           /* that connection ended: cancelled, not answered  */
    server_t *srv;      /* NULL once orphaned                             */
    ie_client_lp_t *lp; /* with req.logprobs >= 0: every token's, for "done" */
    size_t n_lp, cap_lp;
    int lp_oom;            /* one could not be kept: "done" goes without them */
    ie_lora_cache_t *lc;   /* the adapter set it leased (lease.id -1: */
    ie_lora_lease_t lease; /* the base), given back at its end       */
    struct pending *next;
} pending_t;

struct server {
    const ie_serve_opts_t *o;
    ie_buf_t out;
    ie_parts_t in;
    ie_metric_t *m_req;
    pending_t *open; /* submitted, not ended                           */
};

/* IE_ERR_UNAVAILABLE: the client's connection is gone (ROUTER_MANDATORY). */
static ie_status_t reply_env(server_t *s, char env[2][256], const size_t *env_len, int n_env, const ie_buf_t *body)
{
    ie_frame_t f[3];
    int n = 0;
    for (int i = 0; i < n_env; i++) f[n++] = (ie_frame_t){env[i], env_len[i]};
    f[n++] = (ie_frame_t){body->data, body->len};
    ie_status_t st = ie_sock_send(s->o->sock, f, n, 100);
    if (st != IE_OK && s->o->verbose)
        fprintf(stderr, "ie-coordinator: reply to a client lost: %s\n", ie_error_last());
    return st;
}

static void reply_error(server_t *s, pending_t *p, const char *id, const char *code, const char *msg)
{
    if (p->gone) return; /* nobody to answer */
    if (ie_client_enc_error(&s->out, id ? id : "", code, msg) == IE_OK)
        reply_env(s, p->env, p->env_len, p->n_env, &s->out);
}

static const char *code_for(ie_status_t st)
{
    switch (st) {
    case IE_ERR_INVAL:
    case IE_ERR_RANGE:
    case IE_ERR_FORMAT: return "invalid_request";
    case IE_ERR_UNAVAILABLE:
    case IE_ERR_TIMEOUT: return "unavailable";
    case IE_ERR_BUSY: return "busy";
    case IE_ERR_NOMEM: return "out_of_memory";
    default: return "internal";
    }
}

static void pending_free(pending_t *p)
{
    if (!p) return;
    ie_lora_cache_release(p->lc, &p->lease, 0); /* no-op once released */
    ie_client_req_clear(&p->req);
    free(p->lp);
    free(p);
}

static void unlink_open(server_t *s, pending_t *p)
{
    for (pending_t **pp = &s->open; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            return;
        }
}

/* Scheduler events of a ZeroMQ request (on the loop's thread). */
/* A TOKEN event's log-probabilities in the reply's form. */
static void lp_from_event(ie_client_lp_t *lp, const ie_sched_event_t *ev)
{
    memset(lp, 0, sizeof *lp);
    lp->token = ev->token;
    lp->logprob = ev->logprob;
    lp->n_top = ev->n_top < IE_CLIENT_TOP_MAX ? ev->n_top : IE_CLIENT_TOP_MAX;
    for (int32_t j = 0; j < lp->n_top; j++) {
        lp->top_ids[j] = ev->top[j].id;
        lp->top_lps[j] = ev->top[j].logprob;
    }
}

/* Keep a token's log-probabilities for the "done" reply. */
static void lp_keep(pending_t *p, const ie_client_lp_t *lp)
{
    if (p->lp_oom) return;
    if (p->n_lp == p->cap_lp) {
        size_t cap = p->cap_lp ? p->cap_lp * 2 : 32;
        ie_client_lp_t *n = realloc(p->lp, cap * sizeof *n);
        if (!n) {
            p->lp_oom = 1;
            return;
        }
        p->lp = n;
        p->cap_lp = cap;
    }
    p->lp[p->n_lp++] = *lp;
}

static void on_event(void *ctx, const ie_sched_event_t *ev)
{
    pending_t *p = ctx;
    server_t *s = p->srv;
    if (ev->kind != IE_SCHED_TOKEN) { /* the adapter set is free to go */
        ie_lora_cache_release(p->lc, &p->lease, ev->n_gen);
        p->lease.set = -1;
    }
    if (!s) { /* the loop has ended and already answered */
        if (ev->kind != IE_SCHED_TOKEN) pending_free(p);
        return;
    }
    if (ev->kind == IE_SCHED_TOKEN) {
        ie_client_lp_t lp, *lpp = NULL;
        if (ev->has_logprob) {
            lp_from_event(&lp, ev);
            lpp = &lp;
            lp_keep(p, &lp);
        }
        if (p->req.stream && !p->gone &&
            ie_client_enc_token_lp(&s->out, p->req.id, p->sent++, ev->token, ev->text, ev->len, lpp) == IE_OK &&
            reply_env(s, p->env, p->env_len, p->n_env, &s->out) == IE_ERR_UNAVAILABLE) {
            p->gone = 1; /* no such peer any more: the end of its connection may not be reported yet */
            ie_sched_cancel(s->o->sched, p->sid);
        }
        return;
    }
    if (ev->kind == IE_SCHED_DONE) {
        ie_client_done_t d = {.id = p->req.id,
                              .text = ev->all_text,
                              .finish = ie_finish_name(ev->finish),
                              .text_len = strlen(ev->all_text),
                              .n_prompt = (int32_t)ev->n_prompt,
                              .n_gen = (int32_t)ev->n_gen,
                              .ttft_ms = ev->ttft_ms,
                              .total_ms = ev->total_ms,
                              .decode_tps = ev->decode_tps,
                              .n_lp = p->n_lp};
        /* asked for: a list, empty when no token came (lp still NULL);
         * one that could not be kept is left out rather than cut short */
        static const ie_client_lp_t none;
        if (p->req.logprobs >= 0 && !p->lp_oom) d.lp = p->lp ? p->lp : &none;
        if (!p->gone && ie_client_enc_done(&s->out, &d) == IE_OK)
            reply_env(s, p->env, p->env_len, p->n_env, &s->out);
    } else {
        reply_error(s, p, p->req.id, ev->code, ev->message);
    }
    unlink_open(s, p);
    pending_free(p);
}

/* Tokens of a request: chat messages through the model's template, text
 * as the CLI does (BOS per the tokenizer, special-token text parsed). */
static ie_status_t encode(server_t *s, const ie_client_req_t *r, int32_t **ids, size_t *n)
{
    const ie_tokenizer_t *tok = ie_engine_tokenizer(s->o->engine);
    if (r->prompt)
        return ie_tokenizer_encode(tok, r->prompt, strlen(r->prompt), IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL,
                                   ids, n);
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < r->n_messages; i++) {
        cJSON *m = cJSON_CreateObject();
        if (!m) break;
        cJSON_AddItemToArray(arr, m);
        cJSON_AddStringToObject(m, "role", r->messages[i].role);
        cJSON_AddStringToObject(m, "content", r->messages[i].content);
    }
    char *json = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    if (!json) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    ie_chat_opts_t co = {0};
    ie_engine_chat_opts(s->o->engine, &co);
    ie_status_t st = ie_chat_encode(tok, json, &co, ids, n, NULL);
    free(json);
    return st;
}

/* The request's adapter set ("adapter" at its default scale, then the
 * "lora" list; scale 0 parts dropped), leased into p. IE_ERR_RANGE for an
 * unknown name or id (code "not_found"), the registry's errors. */
static ie_status_t lease(server_t *s, pending_t *p)
{
    const ie_client_req_t *r = &p->req;
    ie_lora_use_t uses[IE_LORA_SET_PARTS];
    char names[IE_LORA_SET_PARTS][IE_LORA_NAME_MAX];
    int n = 0;
    p->lc = ie_engine_lora_cache(s->o->engine);
    p->lease = (ie_lora_lease_t){-1, 0, -1};
    if (r->adapter) uses[n++] = (ie_lora_use_t){r->adapter, NAN};
    for (size_t i = 0; i < r->n_lora; i++) {
        if (r->lora[i].scale == 0) continue;
        if (n >= IE_LORA_SET_PARTS)
            return ie_error_set(IE_ERR_INVAL, "at most %d adapters per request", IE_LORA_SET_PARTS);
        if (!r->lora[i].name && ie_lora_cache_name_at(p->lc, r->lora[i].id, names[n]) != 0)
            return ie_error_set(IE_ERR_RANGE, "no adapter has id %d", (int)r->lora[i].id);
        uses[n] = (ie_lora_use_t){r->lora[i].name ? r->lora[i].name : names[n], r->lora[i].scale};
        n++;
    }
    return n ? ie_lora_cache_acquire(p->lc, uses, n, &p->lease) : IE_OK;
}

/* A "generate" request: into the scheduler, or an error reply now. */
static void submit(server_t *s, pending_t *p)
{
    const ie_client_req_t *r = &p->req;
    int32_t *ids = NULL;
    ie_logit_bias_t *bias = NULL;
    size_t n = 0;
    ie_status_t st = encode(s, r, &ids, &n);
    if (st == IE_OK && r->n_bias && !(bias = malloc(r->n_bias * sizeof *bias)))
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
    for (size_t i = 0; bias && i < r->n_bias; i++) bias[i] = (ie_logit_bias_t){r->bias[i].id, r->bias[i].bias};
    if (st == IE_OK) st = lease(s, p);
    if (st == IE_OK) {
        ie_gen_params_t gp;
        ie_gen_params_default(&gp);
        gp.max_new = r->max_new;
        gp.sampling.temperature = r->temperature;
        gp.sampling.top_k = r->top_k;
        gp.sampling.top_p = r->top_p;
        gp.sampling.min_p = r->min_p;
        gp.sampling.repeat_penalty = r->repeat_penalty;
        gp.sampling.frequency_penalty = r->frequency_penalty;
        gp.sampling.presence_penalty = r->presence_penalty;
        gp.sampling.logit_bias = bias; /* copied by the sampler at submission */
        gp.sampling.n_logit_bias = (int32_t)r->n_bias;
        gp.min_new = r->min_new;
        gp.ignore_eos = r->ignore_eos;
        gp.stop_ids = r->stop_ids; /* copied at submission, like the choices */
        gp.n_stop_ids = r->n_stop_ids;
        gp.choice = (const char *const *)r->choice;
        gp.n_choice = r->n_choice;
        gp.include_stop = r->include_stop;
        gp.show_special = r->show_special;
        gp.sampling.seed = r->seed >= 0 ? (uint64_t)r->seed : ie_sampler_seed_random();
        gp.stop = (const char *const *)r->stop;
        gp.n_stop = r->n_stop;
        gp.logprobs = r->logprobs >= 0;
        gp.top_logprobs = r->logprobs >= 0 ? r->logprobs : 0;
        gp.json_schema = r->json_schema; /* compiled by submit: a bad one is refused there */
        ie_sched_req_t sr = {.ids = ids,
                             .n_ids = n,
                             .params = &gp,
                             .priority = r->priority,
                             .lora = p->lease.id + 1,
                             .lora_salt = p->lease.salt,
                             .timeout_ms = s->o->request_timeout_ms,
                             .cb = on_event,
                             .cb_ctx = p};
        p->srv = s;
        p->next = s->open; /* before submit: events come only from a step */
        s->open = p;
        st = ie_sched_submit(s->o->sched, &sr, &p->sid);
        if (st != IE_OK) unlink_open(s, p);
    }
    free(ids);
    free(bias);
    if (st == IE_OK) return;
    char why[600];
    snprintf(why, sizeof why, "%s", ie_error_last());
    const char *code = st == IE_ERR_RANGE && (r->adapter || r->n_lora) && strstr(why, "adapter") ? "not_found"
                                                                                                 : code_for(st);
    if (st != IE_ERR_BUSY) fprintf(stderr, "ie-coordinator: request '%s' refused: %s\n", r->id, why);
    reply_error(s, p, r->id, code, why);
    if (s->m_req) ie_metric_add(s->m_req, code, 1);
    pending_free(p);
}

/* Connections that ended: their clients' requests are cancelled (a client
 * that disconnects mid-stream must not hold a slot until its request
 * ends by itself) and never answered. */
static void peers_gone(server_t *s)
{
    int fds[64], n;
    while ((n = ie_sock_peers_gone(s->o->sock, fds, 64)) > 0) {
        for (int i = 0; i < n; i++)
            for (pending_t *p = s->open; p; p = p->next) {
                if (p->gone || p->peer < 0 || p->peer != fds[i]) continue;
                p->gone = 1;
                if (ie_sched_cancel(s->o->sched, p->sid) == IE_OK && s->o->verbose)
                    fprintf(stderr, "ie-coordinator: request '%s' cancelled: its client disconnected\n", p->req.id);
            }
        if (n < 64) break;
    }
}

/* "load_lora" / "unload_lora": the registry's load or unload, answered
 * "ok" or an error ("invalid_request" for an adapter that does not load
 * or a name taken, "not_found" for unloading an unknown name). */
static void lora_admin(server_t *s, pending_t *p)
{
    ie_lora_cache_t *lc = ie_engine_lora_cache(s->o->engine);
    const ie_client_req_t *r = &p->req;
    char msg[256];
    int deferred = 0;
    const int load = !strcmp(r->type, "load_lora");
    ie_status_t st = load ? ie_lora_cache_load(lc, r->lora_name, r->lora_path, 1.0f, r->pinned)
                          : ie_lora_cache_unload(lc, r->lora_name, &deferred);
    if (st != IE_OK) {
        snprintf(msg, sizeof msg, "%s", ie_error_last());
        reply_error(s, p, r->id,
                    !load                ? (st == IE_ERR_RANGE ? "not_found" : code_for(st))
                    : st == IE_ERR_NOMEM ? "out_of_memory"
                                         : "invalid_request", /* the adapter's fault: missing, bad, refused */
                    msg);
    } else {
        snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' %s successfully.%s", r->lora_name,
                 load ? "added" : "removed", deferred ? " (requests running it finish first)" : "");
        if (ie_client_enc_ok(&s->out, r->id, msg) == IE_OK) reply_env(s, p->env, p->env_len, p->n_env, &s->out);
    }
    pending_free(p);
}

/* Take one message from the socket (already in s->in). */
static void on_message(server_t *s)
{
    pending_t *p = calloc(1, sizeof *p);
    if (!p) return;
    p->peer = ie_sock_last_peer(s->o->sock);
    if (s->in.n < 2 || s->in.size[0] > sizeof p->env[0]) {
        free(p);
        return; /* no routing identity: nothing to answer to */
    }
    /* envelope: identity, then an empty delimiter from REQ sockets */
    const int delim = s->in.n >= 3 && s->in.size[1] == 0;
    const int body = 1 + delim;
    for (int i = 0; i < body; i++) {
        if (s->in.size[i]) memcpy(p->env[i], s->in.data[i], s->in.size[i]); /* the delimiter is empty */
        p->env_len[i] = s->in.size[i];
    }
    p->n_env = body;
    if (s->in.n != body + 1) { /* a request is one frame: say so rather than drop it */
        char why[160];
        snprintf(why, sizeof why,
                 "a request is one MessagePack frame; this message has %d frames after the envelope",
                 s->in.n - body);
        reply_error(s, p, NULL, "invalid_request", why);
        if (s->m_req) ie_metric_add(s->m_req, "invalid_request", 1);
        pending_free(p);
        return;
    }
    ie_status_t st = ie_client_req_decode(s->in.data[body], s->in.size[body], &p->req);
    if (st != IE_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s", ie_error_last());
        fprintf(stderr, "ie-coordinator: malformed client request: %s\n", why);
        reply_error(s, p, NULL, "invalid_request", why);
        if (s->m_req) ie_metric_add(s->m_req, "invalid_request", 1);
        pending_free(p);
        return;
    }
    if (!strcmp(p->req.type, "cancel")) {
        pending_t *w = s->open;
        while (w && (strcmp(w->req.id, p->req.id) || w->env_len[0] != p->env_len[0] ||
                     memcmp(w->env[0], p->env[0], p->env_len[0])))
            w = w->next;
        /* the cancelled request itself is answered "cancelled" */
        if (!w || ie_sched_cancel(s->o->sched, w->sid) != IE_OK)
            reply_error(s, p, p->req.id, "not_found", "no open request with that id");
        pending_free(p);
        return;
    }
    if (!strcmp(p->req.type, "load_lora") || !strcmp(p->req.type, "unload_lora")) {
        lora_admin(s, p);
        return;
    }
    submit(s, p);
}

/* systemd's STATUS= line (what `systemctl status` shows), kept current:
 * at most once a second, and only when its text changes. */
static void sd_status_update(const ie_serve_opts_t *o, ie_backend_t *be, double *last, char *prev, size_t cap)
{
    const double t = ie_now_ms();
    if (t - *last < 1000) return;
    *last = t;
    ie_backend_stats_t bs;
    ie_sched_stats_t ss;
    char now[160];
    memset(&bs, 0, sizeof bs);
    ie_backend_stats(be, &bs);
    ie_sched_stats(o->sched, &ss);
    if (bs.workers > 0)
        snprintf(now, sizeof now, "%d of %d workers ready; %d requests running, %d waiting", bs.workers_ready,
                 bs.workers, ss.running, ss.queued);
    else snprintf(now, sizeof now, "%d requests running, %d waiting", ss.running, ss.queued);
    if (strcmp(now, prev) == 0) return;
    snprintf(prev, cap, "%s", now);
    ie_sd_status("%s", now);
}

ie_status_t ie_serve_run(const ie_serve_opts_t *o)
{
    server_t s = {.o = o};
    ie_status_t st = IE_OK;
    if (!o || !o->engine || !o->sched) return ie_error_set(IE_ERR_INVAL, "serve: no engine or scheduler");
    if (o->metrics)
        ie_metrics_counter(o->metrics, "ie_requests_total", "Requests ended, by outcome", "status", &s.m_req);
    int busy = 0;
    ie_backend_t *be = ie_engine_backend(o->engine);
    const int upkeep_ms = ie_backend_geom(be)->upkeep_ms;
    double sd_last = 0;
    char sd_prev[160] = "";
    double drain_end = -1; /* >= 0: stopping; the accepted requests may run until then */
    /* this thread owns the backend: HTTP threads' adapter attaches and
     * detaches queue for its steps (ie_lora_cache.h) */
    ie_lora_cache_stepper(ie_engine_lora_cache(o->engine), 1, ie_sched_wake, o->sched);
    for (;;) {
        if (o->stop && *o->stop && drain_end < 0) {
            /* SIGTERM: refuse new requests, let the accepted ones finish
             * (systemd and load balancers expect a drain), then leave */
            ie_sched_stats_t ss;
            ie_sd_stopping(); /* systemd: stopping, TimeoutStopSec runs from here */
            ie_sched_drain(o->sched);
            ie_sched_stats(o->sched, &ss);
            drain_end = ie_now_ms() + (o->drain_ms > 0 ? o->drain_ms : 0);
            if (ss.queued + ss.running > 0)
                fprintf(stderr,
                        "ie-coordinator: stopping: %d running and %d queued requests may finish within %d ms\n",
                        ss.running, ss.queued, o->drain_ms);
        }
        if (drain_end >= 0) {
            ie_sched_stats_t ss;
            ie_sched_stats(o->sched, &ss);
            if (ss.queued + ss.running == 0 || ie_now_ms() >= drain_end) break;
        }
        /* a cluster's heartbeats, registrations, systemd watchdog (adapter
         * attaches run on this thread too, in the step's step_begin: no
         * other thread talks to the backend's sockets) */
        ie_backend_upkeep(be, 0);
        sd_status_update(o, be, &sd_last, sd_prev, sizeof sd_prev);
        if (o->sock) {
            int ready = 0;
            peers_gone(&s); /* also when no message comes */
            if (ie_sock_poll((ie_sock_t *const *)&o->sock, 1, &ready, busy ? 0 : 2) < 0) {
                st = ie_error_set(IE_ERR_IO, "client socket: poll failed");
                break;
            }
            for (int k = 0; ready && k < 256 && ie_sock_recv(o->sock, &s.in, 0) == IE_OK; k++) {
                /* the end of a connection is reported before its number can
                 * be reused, so ends read now all precede this message */
                peers_gone(&s);
                on_message(&s);
            }
        } else if (!busy) {
            ie_sched_wait(o->sched, upkeep_ms);
        }
        if ((st = ie_engine_sched_step(o->engine, o->sched, &busy)) != IE_OK) break;
    }
    ie_lora_cache_stepper(ie_engine_lora_cache(o->engine), 0, NULL, NULL);
    for (pending_t *p = s.open; p; p = p->next) { /* answered now, freed by their terminal event */
        reply_error(&s, p, p->req.id, "unavailable", "the coordinator is shutting down");
        ie_sched_cancel(o->sched, p->sid);
        p->srv = NULL;
    }
    ie_parts_free(&s.in);
    ie_buf_free(&s.out);
    return st;
}
