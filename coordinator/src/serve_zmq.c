/* serve_zmq.c — client requests over ZeroMQ (ie_serve.h). */
#include "ie_serve.h"
#include "ie_clock.h"

#include "ie_chat.h"
#include "ie_proto.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct pending {
    ie_client_req_t req;
    char env[2][256];   /* routing envelope: identity [+ empty delimiter] */
    size_t env_len[2];
    int n_env;
    double t_arrive;
    uint64_t order;
} pending_t;

typedef struct server {
    const ie_serve_opts_t *o;
    pending_t **q;
    int n_q;
    uint64_t order;
    ie_buf_t out;
    ie_parts_t in;
    ie_metric_t *m_req, *m_gen, *m_prompt, *m_queue, *m_kv, *m_lat;
    /* the running set, for the streaming callback */
    pending_t **run;
    int32_t sent[64];   /* token events sent per request of the set      */
} server_t;

static void reply(server_t *s, const pending_t *p, const ie_buf_t *body)
{
    ie_frame_t f[3];
    int n = 0;
    for (int i = 0; i < p->n_env; i++) f[n++] = (ie_frame_t){p->env[i], p->env_len[i]};
    f[n++] = (ie_frame_t){body->data, body->len};
    if (ie_sock_send(s->o->sock, f, n, 100) != IE_OK && s->o->verbose)
        fprintf(stderr, "ie-coordinator: reply to a client lost: %s\n", ie_error_last());
}

static void reply_error(server_t *s, const pending_t *p, const char *id, const char *code, const char *msg)
{
    if (ie_client_enc_error(&s->out, id ? id : "", code, msg) == IE_OK) reply(s, p, &s->out);
    if (s->m_req) ie_metric_add(s->m_req, code, 1);
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
    ie_client_req_clear(&p->req);
    free(p);
}

/* Take one message from the socket (already in s->in). */
static void on_message(server_t *s)
{
    pending_t *p = calloc(1, sizeof *p);
    if (!p) return;
    /* envelope: identity, then an empty delimiter from REQ sockets */
    int body = s->in.n - 1;
    if (body < 1 || body > 2 || s->in.size[0] > sizeof p->env[0] || (body == 2 && s->in.size[1] != 0)) {
        free(p);
        return; /* not a client message shape: nothing to answer to */
    }
    for (int i = 0; i < body; i++) {
        memcpy(p->env[i], s->in.data[i], s->in.size[i]);
        p->env_len[i] = s->in.size[i];
    }
    p->n_env = body;
    ie_status_t st = ie_client_req_decode(s->in.data[body], s->in.size[body], &p->req);
    if (st != IE_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s", ie_error_last());
        fprintf(stderr, "ie-coordinator: malformed client request: %s\n", why);
        reply_error(s, p, NULL, "invalid_request", why);
        pending_free(p);
        return;
    }
    if (!strcmp(p->req.type, "cancel")) {
        int found = 0;
        for (int i = 0; i < s->n_q; i++) {
            pending_t *w = s->q[i];
            if (strcmp(w->req.id, p->req.id) || w->env_len[0] != p->env_len[0] ||
                memcmp(w->env[0], p->env[0], p->env_len[0]))
                continue;
            reply_error(s, w, w->req.id, "cancelled", "cancelled by the client");
            pending_free(w);
            memmove(&s->q[i], &s->q[i + 1], (size_t)(s->n_q - i - 1) * sizeof *s->q);
            s->n_q--;
            found = 1;
            break;
        }
        if (!found) reply_error(s, p, p->req.id, "not_found", "no queued request with that id");
        pending_free(p);
        return;
    }
    int cap = s->o->queue_max > 0 ? s->o->queue_max : 64;
    if (s->n_q >= cap) {
        char why[128];
        snprintf(why, sizeof why, "server busy: %d requests waiting; try again later", s->n_q);
        reply_error(s, p, p->req.id, "busy", why);
        pending_free(p);
        return;
    }
    p->t_arrive = ie_now_ms();
    p->order = s->order++;
    /* keep the queue sorted: priority desc, then arrival */
    int at = s->n_q;
    while (at > 0 && s->q[at - 1]->req.priority < p->req.priority) at--;
    memmove(&s->q[at + 1], &s->q[at], (size_t)(s->n_q - at) * sizeof *s->q);
    s->q[at] = p;
    s->n_q++;
}

static int same_params(const ie_client_req_t *a, const ie_client_req_t *b)
{
    if (a->max_new != b->max_new || a->temperature != b->temperature || a->top_k != b->top_k ||
        a->top_p != b->top_p || a->min_p != b->min_p || a->repeat_penalty != b->repeat_penalty ||
        a->seed != b->seed || a->n_stop != b->n_stop)
        return 0;
    for (size_t i = 0; i < a->n_stop; i++)
        if (strcmp(a->stop[i], b->stop[i])) return 0;
    return 1;
}

static void on_token(void *ctx, size_t index, int32_t id, const char *text, size_t len)
{
    server_t *s = ctx;
    pending_t *p = s->run[index];
    if (!p->req.stream) return;
    if (ie_client_enc_token(&s->out, p->req.id, s->sent[index]++, id, text, len) == IE_OK) reply(s, p, &s->out);
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
    ie_status_t st = ie_chat_encode(tok, json, NULL, ids, n, NULL);
    free(json);
    return st;
}

static void run_set(server_t *s)
{
    ie_engine_t *e = s->o->engine;
    pending_t *set[64]; /* the engine batches what fits its slots; a set holds at most 64 */
    int n = 0;
    for (int i = 0; i < s->n_q && n < 64;) {
        if (n == 0 || same_params(&s->q[i]->req, &set[0]->req)) {
            set[n++] = s->q[i];
            memmove(&s->q[i], &s->q[i + 1], (size_t)(s->n_q - i - 1) * sizeof *s->q);
            s->n_q--;
        } else {
            i++;
        }
    }
    int32_t *ids[64] = {0};
    size_t n_ids[64] = {0};
    ie_gen_result_t res[64];
    pending_t *ok[64];
    const int32_t *ok_ids[64];
    size_t ok_n[64];
    int m = 0;
    double t0 = ie_now_ms();
    for (int i = 0; i < n; i++) {
        if (s->m_queue) ie_metric_observe(s->m_queue, NULL, (t0 - set[i]->t_arrive) / 1e3);
        if (encode(s, &set[i]->req, &ids[i], &n_ids[i]) != IE_OK || n_ids[i] == 0) {
            char why[600];
            snprintf(why, sizeof why, "%s", n_ids[i] == 0 && ids[i] ? "empty prompt" : ie_error_last());
            reply_error(s, set[i], set[i]->req.id, "invalid_request", why);
            continue;
        }
        ok[m] = set[i];
        ok_ids[m] = ids[i];
        ok_n[m] = n_ids[i];
        m++;
    }
    if (m > 0) {
        const ie_client_req_t *r = &ok[0]->req;
        ie_gen_params_t gp;
        ie_gen_params_default(&gp);
        gp.max_new = r->max_new;
        gp.sampling.temperature = r->temperature;
        gp.sampling.top_k = r->top_k;
        gp.sampling.top_p = r->top_p;
        gp.sampling.min_p = r->min_p;
        gp.sampling.repeat_penalty = r->repeat_penalty;
        gp.sampling.seed = r->seed >= 0 ? (uint64_t)r->seed : ie_sampler_seed_random();
        gp.stop = (const char *const *)r->stop;
        gp.n_stop = r->n_stop;
        gp.on_token = on_token;
        gp.on_token_ctx = s;
        s->run = ok;
        memset(s->sent, 0, sizeof s->sent);
        if (s->m_kv) ie_metric_set(s->m_kv, NULL, 1.0);
        ie_gen_stats_t stats = {0};
        ie_status_t st = ie_engine_generate_ids(e, ok_ids, ok_n, (size_t)m, &gp, res, &stats);
        if (s->m_kv) ie_metric_set(s->m_kv, NULL, 0.0);
        double t1 = ie_now_ms();
        for (int i = 0; i < m; i++) {
            if (st != IE_OK) {
                char why[600];
                snprintf(why, sizeof why, "%s", ie_error_last());
                reply_error(s, ok[i], ok[i]->req.id, code_for(st), why);
                continue;
            }
            ie_gen_result_t *g = &res[i];
            double dsum = 0;
            for (size_t k = 0; k < g->n_lat; k++) {
                dsum += g->lat_ms[k];
                if (s->m_lat) ie_metric_observe(s->m_lat, NULL, g->lat_ms[k] / 1e3);
            }
            ie_client_done_t d = {.id = ok[i]->req.id, .text = g->text ? g->text : "",
                                  .finish = ie_finish_name(g->stop), .text_len = g->text ? strlen(g->text) : 0,
                                  .n_prompt = (int32_t)g->n_prompt, .n_gen = (int32_t)g->n_gen,
                                  .ttft_ms = g->ttft_ms, .total_ms = t1 - ok[i]->t_arrive,
                                  .decode_tps = dsum > 0 ? g->n_lat / (dsum / 1e3) : 0};
            if (ie_client_enc_done(&s->out, &d) == IE_OK) reply(s, ok[i], &s->out);
            if (s->m_req) ie_metric_add(s->m_req, "ok", 1);
            if (s->m_gen) ie_metric_add(s->m_gen, NULL, (double)g->n_gen);
            if (s->m_prompt) ie_metric_add(s->m_prompt, NULL, (double)g->n_prompt);
            ie_gen_result_clear(g);
        }
    }
    for (int i = 0; i < n; i++) {
        free(ids[i]);
        pending_free(set[i]);
    }
}

ie_status_t ie_serve_zmq(const ie_serve_opts_t *o)
{
    server_t s = {.o = o};
    int cap = o->queue_max > 0 ? o->queue_max : 64;
    s.q = calloc((size_t)cap + 1, sizeof *s.q);
    if (!s.q) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    if (o->metrics) {
        static const double qb[] = {0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 30};
        static const double lb[] = {0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1};
        ie_metrics_counter(o->metrics, "ie_requests_total", "Client requests answered, by outcome", "status",
                           &s.m_req);
        ie_metrics_counter(o->metrics, "ie_tokens_generated_total", "Tokens generated", NULL, &s.m_gen);
        ie_metrics_counter(o->metrics, "ie_prompt_tokens_total", "Prompt tokens processed", NULL, &s.m_prompt);
        ie_metrics_histogram(o->metrics, "ie_request_queue_seconds", "Time requests waited in the queue", NULL,
                             qb, 8, &s.m_queue);
        ie_metrics_histogram(o->metrics, "ie_token_latency_seconds", "Time between a stream's tokens", NULL, lb, 8,
                             &s.m_lat);
        ie_metrics_gauge(o->metrics, "ie_kv_used_ratio", "Share of KV sequence slots in use", NULL, &s.m_kv);
        ie_metric_set(s.m_kv, NULL, 0);
    }
    ie_status_t st = IE_OK;
    while (!(o->stop && *o->stop)) {
        ie_cluster_t *c = ie_engine_cluster(o->engine);
        if (c) ie_cluster_service(c, 0); /* heartbeats, registrations, systemd watchdog */
        int ready = 0;
        if (ie_sock_poll(&o->sock, 1, &ready, s.n_q ? 0 : 50) < 0) {
            st = ie_error_set(IE_ERR_IO, "client socket: poll failed");
            break;
        }
        for (int k = 0; ready && k < 256 && ie_sock_recv(o->sock, &s.in, 0) == IE_OK; k++) on_message(&s);
        if (s.n_q) run_set(&s);
    }
    for (int i = 0; i < s.n_q; i++) {
        reply_error(&s, s.q[i], s.q[i]->req.id, "unavailable", "the coordinator is shutting down");
        pending_free(s.q[i]);
    }
    free(s.q);
    ie_parts_free(&s.in);
    ie_buf_free(&s.out);
    return st;
}
