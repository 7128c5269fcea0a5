/* engine.c — the engine's assembly (ie_engine.h): open the model source
 * and the tokenizer, build the backend that runs the model (one worker in
 * this process, or a cluster and, for an in-process plan, its workers as
 * threads), and run each generate call on a scheduler of its own over that
 * backend. Scheduling lives in sched.c, the step boundary in ie_backend.h;
 * nothing here branches on which backend runs once it is built.
 */
#include "ie_engine.h"
#include "ie_lora_cache.h"

#include "ie_chat.h"
#include "ie_cluster.h"
#include "ie_model_src.h"
#include "ie_node.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>

struct ie_engine {
    ie_engine_opts_t opts;
    ie_model_src_t *src;
    ie_tokenizer_t *tok;
    ie_jinja_t *chat_tmpl; /* the model's chat template, NULL if none  */
    char *chat_tmpl_err;   /* why the model's template did not compile */
    int32_t *stop_ids;     /* end-of-turn ids beyond the tokenizer's    */
    size_t n_stop_ids;
    ie_backend_t *backend;    /* worker (plan NONE) or cluster              */
    ie_kv_layout_t kv_layout; /* the whole model's KV cache (its rings) */
    ie_net_t *net;
    int own_net;
    pthread_t *nodes; /* in-process workers                       */
    struct node_slot *node_opts;
    int n_nodes;
    volatile sig_atomic_t node_stop;
    char ep[96];
    int32_t *b_tok, *b_pos, *b_seq; /* [max_batch] ie_engine_logits' steps */
    uint8_t *b_logits;
    void *ext;           /* the public API's block (ie_engine_ext)   */
    ie_sched_t *sched;   /* opts.keep_sched: the one generate calls share */
    ie_lora_cache_t *lc; /* LoRA adapters and the sets requests run  */
    int logits_adapter;  /* ie_engine_logits' adapter id (-1: base)    */
    int32_t *b_adapter;  /* [max_batch]                                  */
};

void ie_engine_opts_default(ie_engine_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->n_threads = 1;
    o->pin_threads = 1;
    o->n_seq = 1;
    o->max_batch = 256;
    o->precision = IE_PREC_NATIVE;
    o->prefix_cache = 1;
}

/* Contract (ie_engine.h). */
ie_status_t ie_engine_opts_plan(ie_engine_opts_t *o, const char *spec)
{
    o->plan = IE_SHARD_NONE;
    o->n_workers = 0;
    if (spec && !strcmp(spec, "none")) return IE_OK;
    const char *colon = spec ? strchr(spec, ':') : NULL;
    char kind[16];
    char *end;
    long n = 0;
    ie_shard_kind_t k;
    if (colon && (size_t)(colon - spec) < sizeof kind && colon[1] >= '0' && colon[1] <= '9') {
        memcpy(kind, spec, (size_t)(colon - spec));
        kind[colon - spec] = '\0';
        errno = 0;
        n = strtol(colon + 1, &end, 10);
        if (!errno && !*end && n >= 1 && n <= 64 && ie_shard_kind_parse(kind, &k) == IE_OK && k != IE_SHARD_NONE) {
            o->plan = k;
            o->n_workers = (int)n;
            return IE_OK;
        }
    }
    return ie_error_set(IE_ERR_INVAL, "bad plan '%s' (none, pipeline:N or tensor:N)", spec ? spec : "(null)");
}

/* An in-process worker; a node that stops with an error (it could not
 * even open the model) leaves its status and message for the engine. */
typedef struct node_slot {
    ie_node_opts_t o;
    _Atomic int failed;
    ie_status_t st;
    char err[512];
    char peer[96]; /* its peer endpoint (inproc://...)                */
} node_slot_t;

static void *node_main(void *arg)
{
    node_slot_t *ns = arg;
    ie_status_t st = ie_node_run(&ns->o);
    if (st != IE_OK) {
        ns->st = st;
        snprintf(ns->err, sizeof ns->err, "%s", ie_error_last());
        atomic_store(&ns->failed, 1);
    }
    return NULL;
}

/* Distributed execution: the cluster as the backend (and, without
 * cluster_bind, its workers as threads of this process over inproc://). */
static ie_status_t start_cluster(ie_engine_t *e, const ie_worker_opts_t *wo)
{
    ie_status_t st;
    const ie_engine_opts_t *o = &e->opts;
    if (o->n_workers < 1 || o->n_workers > 64)
        return ie_error_set(IE_ERR_INVAL, "engine: %d workers (1..64)", o->n_workers);
    if (o->net) {
        e->net = o->net;
    } else {
        if ((st = ie_net_new(&e->net)) != IE_OK) return st;
        e->own_net = 1;
    }
    if (!o->cluster_bind) snprintf(e->ep, sizeof e->ep, "inproc://ie-cluster-%p", (void *)e);
    ie_cluster_opts_t co = {.bind = o->cluster_bind ? o->cluster_bind : e->ep,
                            .plan = o->plan,
                            .n_ranks = o->n_workers,
                            .n_ctx = wo->n_ctx,
                            .n_seq = wo->n_seq,
                            .max_batch = wo->max_batch,
                            .precision = wo->precision,
                            .kv_block = wo->kv_block,
                            .kv_blocks = wo->kv_blocks,
                            .kv_mem_bytes = wo->kv_mem_bytes,
                            .kv_type_k = wo->kv_type_k,
                            .kv_type_v = wo->kv_type_v,
                            .kv_rotate = wo->kv_rotate,
                            .kv_swa_full = wo->kv_swa_full,
                            .heartbeat_ms = o->heartbeat_ms,
                            .dead_ms = o->dead_ms,
                            .step_timeout_ms = o->step_timeout_ms,
                            .net = e->net,
                            .metrics = o->metrics,
                            .verbose = o->cluster_bind != NULL};
    ie_cluster_t *c = NULL;
    if ((st = ie_cluster_new(&co, e->src, &c)) != IE_OK) return st;
    /* the backend owns the cluster from here; `cl` stays a borrowed view
     * for waiting below, valid while e->backend lives */
    ie_cluster_t *cl = c;
    if ((st = ie_backend_cluster_new(&c, &e->backend)) != IE_OK) return st;
    if (!o->cluster_bind) {
        int nt = o->n_threads / o->n_workers;
        e->nodes = calloc((size_t)o->n_workers, sizeof *e->nodes);
        e->node_opts = calloc((size_t)o->n_workers, sizeof *e->node_opts);
        if (!e->nodes || !e->node_opts) return ie_error_set(IE_ERR_NOMEM, "out of memory");
        for (int r = 0; r < o->n_workers; r++) {
            ie_node_opts_t *no = &e->node_opts[r].o;
            ie_node_opts_default(no);
            no->model_path = o->model_path;
            no->coordinator = e->ep;
            snprintf(e->node_opts[r].peer, sizeof e->node_opts[r].peer, "inproc://ie-peer-%p-%d", (void *)e, r);
            no->peer_bind = e->node_opts[r].peer;
            no->rank = r;
            no->n_threads = nt > 0 ? nt : 1;
            no->pin_threads = o->pin_threads;
            no->net = e->net;
            no->stop = &e->node_stop;
            no->quiet = 1;
            if (pthread_create(&e->nodes[r], NULL, node_main, &e->node_opts[r]) != 0)
                return ie_error_set(IE_ERR_INTERNAL, "engine: cannot start worker thread %d", r);
            e->n_nodes = r + 1;
        }
    }
    if (o->cluster_wait_ms < 0) return IE_OK;
    int left = o->cluster_wait_ms > 0 ? o->cluster_wait_ms : 60000;
    for (;;) {
        st = ie_cluster_wait_ready(cl, left < 100 ? left : 100);
        if (st != IE_ERR_TIMEOUT || (left -= 100) <= 0) return st;
        for (int r = 0; r < e->n_nodes; r++) /* an in-process worker that died will not come */
            if (atomic_load(&e->node_opts[r].failed))
                return ie_error_set(e->node_opts[r].st, "%s", e->node_opts[r].err);
    }
}

ie_status_t ie_engine_open(const ie_engine_opts_t *o, ie_engine_t **out)
{
    ie_status_t st = IE_OK;
    ie_engine_t *e = NULL;
    *out = NULL;
    if (!o || !o->model_path) return ie_error_set(IE_ERR_INVAL, "engine: no model path");
    if (o->n_threads < 1 || o->n_seq < 1 || o->max_batch < 1 || o->n_ctx < 0)
        return ie_error_set(IE_ERR_INVAL, "engine: bad options (threads %d, seq %d, batch %d, ctx %d)",
                            o->n_threads, o->n_seq, o->max_batch, o->n_ctx);
    e = calloc(1, sizeof *e);
    if (!e) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    e->opts = *o;

    if ((st = ie_model_src_open(o->model_path, &e->src)) != IE_OK) goto cleanup;
    const ie_hparams_t *hp = ie_model_src_hparams(e->src);
    const char *tpath = o->tokenizer_path ? o->tokenizer_path : ie_model_src_tokenizer_path(e->src);
    if (o->no_tokenizer) {
        /* logits-only use: ids come from the caller */
    } else if (!tpath) {
        st = ie_error_set(IE_ERR_FORMAT, "model '%s' has no tokenizer (tokenizer.json missing)", o->model_path);
        goto cleanup;
    } else if ((st = ie_tokenizer_load(tpath, &e->tok)) != IE_OK) {
        goto cleanup;
    } else if (ie_tokenizer_n_vocab(e->tok) > hp->n_vocab) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer has %d tokens but the model's vocabulary is %d",
                          ie_tokenizer_n_vocab(e->tok), hp->n_vocab);
        goto cleanup;
    }
    if (e->tok) {
        /* A template that does not compile must not stop non-chat use of
         * the model: keep the reason for the chat calls to report. */
        char *text = NULL;
        if ((st = ie_chat_template_find(tpath, &text)) == IE_OK && text &&
            ie_jinja_parse(text, strlen(text), &e->chat_tmpl) != IE_OK &&
            !(e->chat_tmpl_err = strdup(ie_error_last())))
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        free(text);
        if (st == IE_OK) st = ie_chat_stop_ids(e->tok, tpath, &e->stop_ids, &e->n_stop_ids);
        if (st != IE_OK) goto cleanup;
    }

    ie_worker_opts_t wo;
    ie_worker_opts_default(&wo);
    wo.n_threads = o->n_threads;
    wo.pin_threads = o->pin_threads;
    wo.n_seq = o->n_seq;
    wo.max_batch = o->max_batch < o->n_seq ? o->n_seq : o->max_batch;
    wo.precision = o->precision;
    wo.kv_block = o->kv_block;
    wo.kv_blocks = o->kv_blocks;
    wo.kv_mem_bytes = o->kv_mem_mb > 0 ? (uint64_t)o->kv_mem_mb << 20 : 0;
    wo.kv_type_k = o->kv_type_k;
    wo.kv_type_v = o->kv_type_v;
    wo.kv_rotate = o->kv_rotate;
    wo.kv_swa_full = o->kv_swa_full;
    wo.n_ctx = o->n_ctx ? o->n_ctx : (hp->n_ctx_train > 0 && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    /* the whole model's cache, for the bytes a token reports */
    if ((st = ie_worker_kv_layout(hp, NULL, &wo, &e->kv_layout)) != IE_OK) goto cleanup;
    /* the one place that knows which backend runs (a plan: each rank's
     * budget is kv_mem_mb, ie_cluster_opts_t.kv_mem_bytes) */
    if (o->plan == IE_SHARD_NONE) {
        if ((st = ie_backend_worker_new(e->src, &wo, &e->backend)) != IE_OK) goto cleanup;
    } else if ((st = start_cluster(e, &wo)) != IE_OK) {
        goto cleanup;
    }

    size_t B = (size_t)wo.max_batch;
    e->b_tok = malloc(B * sizeof(int32_t));
    e->b_pos = malloc(B * sizeof(int32_t));
    e->b_seq = malloc(B * sizeof(int32_t));
    e->b_logits = malloc(B);
    e->b_adapter = malloc(B * sizeof *e->b_adapter);
    e->logits_adapter = -1;
    if (!e->b_tok || !e->b_pos || !e->b_seq || !e->b_logits || !e->b_adapter)
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
    if (st == IE_OK) {
        ie_lora_cache_opts_t lo = {.backend = e->backend,
                                   .hp = ie_model_src_hparams(e->src),
                                   .budget_bytes = o->lora_budget_bytes,
                                   .metrics = o->metrics};
        st = ie_lora_cache_new(&lo, &e->lc);
    }
    if (st == IE_OK && o->metrics) { /* the cache's types and cost per token, for /metrics */
        ie_metric_t *mk = NULL, *mv = NULL, *mb = NULL, *mr = NULL, *mf = NULL;
        if ((st = ie_metrics_gauge(o->metrics, "ie_kv_cache_type_k", "1 for the K cache's storage type", "type",
                                   &mk)) == IE_OK &&
            (st = ie_metrics_gauge(o->metrics, "ie_kv_cache_type_v", "1 for the V cache's storage type", "type",
                                   &mv)) == IE_OK &&
            (st = ie_metrics_gauge(o->metrics, "ie_kv_cache_bytes_per_token",
                                   "KV cache bytes per token of context (the pool's layers, K and V)", NULL,
                                   &mb)) == IE_OK &&
            (st = ie_metrics_gauge(o->metrics, "ie_kv_cache_ring_bytes",
                                   "KV cache bytes of the sliding layers' rings (every slot, K and V)", NULL,
                                   &mr)) == IE_OK &&
            (st = ie_metrics_gauge(o->metrics, "ie_kv_cache_recent_bytes",
                                   "f32 K and V rows of a q4/fp8_e4m3 cache's recent window and sinks (every slot)",
                                   NULL, &mf)) == IE_OK) {
            ie_metric_set(mk, ie_kv_type_name(o->kv_type_k), 1);
            ie_metric_set(mv, ie_kv_type_name(o->kv_type_v), 1);
            ie_metric_set(mb, NULL, (double)ie_engine_kv_bytes_per_token(e));
            ie_metric_set(mr, NULL, (double)ie_engine_kv_ring_bytes(e));
            ie_metric_set(mf, NULL, (double)ie_engine_kv_recent_bytes(e));
        }
    }

cleanup:
    if (st != IE_OK) {
        ie_engine_destroy(&e);
        return st;
    }
    *out = e;
    return IE_OK;
}

void ie_engine_destroy(ie_engine_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_engine_t *e = *self_p;
    ie_sched_destroy(&e->sched);                          /* before the backend it drives */
    ie_lora_cache_destroy(&e->lc);                        /* detaches its sets: before the backend */
    ie_backend_destroy(&e->backend);                      /* a cluster says BYE to its workers */
    __atomic_store_n(&e->node_stop, 1, __ATOMIC_RELEASE); /* read by the worker threads */
    for (int r = 0; r < e->n_nodes; r++) pthread_join(e->nodes[r], NULL);
    free(e->nodes);
    free(e->node_opts);
    if (e->own_net) ie_net_destroy(&e->net);
    ie_tokenizer_destroy(&e->tok);
    ie_jinja_destroy(&e->chat_tmpl);
    free(e->chat_tmpl_err);
    free(e->stop_ids);
    ie_model_src_destroy(&e->src);
    free(e->b_tok);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_logits);
    free(e->b_adapter);
    free(e->ext);
    free(e);
    *self_p = NULL;
}

const ie_hparams_t *ie_engine_hparams(const ie_engine_t *e) { return ie_model_src_hparams(e->src); }

/* Contract (ie_engine.h): from the shapes, so a cluster's ranks together
 * report what one worker of the whole model would. */
size_t ie_engine_kv_bytes_per_token(const ie_engine_t *e)
{
    return (size_t)(e->kv_layout.block_bytes / (uint64_t)e->kv_layout.kv_block);
}
/* Contract (ie_engine.h). */
uint64_t ie_engine_kv_ring_bytes(const ie_engine_t *e) { return e->kv_layout.ring_bytes; }
/* Contract (ie_engine.h). */
uint64_t ie_engine_kv_recent_bytes(const ie_engine_t *e) { return e->kv_layout.recent_bytes; }
/* Contract (ie_engine.h). */
int ie_engine_kv_ring_positions(const ie_engine_t *e) { return e->kv_layout.ring_len; }
/* Contract (ie_engine.h). */
int64_t ie_engine_kv_pool_positions(const ie_engine_t *e)
{
    const ie_backend_geom_t *g = ie_backend_geom(e->backend);
    return (int64_t)g->kv_blocks * g->kv_block;
}
const ie_tokenizer_t *ie_engine_tokenizer(const ie_engine_t *e) { return e->tok; }

void ie_engine_chat_opts(const ie_engine_t *e, ie_chat_opts_t *o)
{
    o->tmpl = e->chat_tmpl;
    o->tmpl_error = e->chat_tmpl_err;
}
ie_backend_t *ie_engine_backend(ie_engine_t *e) { return e->backend; }
void **ie_engine_ext(const ie_engine_t *e) { return (void **)&e->ext; }

void ie_engine_sched_opts(ie_engine_t *e, ie_sched_opts_t *out)
{
    *out = (ie_sched_opts_t){.backend = e->backend,
                             .tok = e->tok,
                             .stop_ids = e->stop_ids,
                             .n_stop_ids = e->n_stop_ids,
                             .no_prefix_cache = !e->opts.prefix_cache};
}

void ie_gen_result_clear(ie_gen_result_t *r)
{
    if (!r) return;
    free(r->text);
    free(r->ids);
    free(r->lat_ms);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ generate */

/* One call's requests on a scheduler of their own (ie_sched.h). */
typedef struct gen_call {
    const ie_gen_params_t *p;
    ie_gen_result_t *results;
    size_t n_done;
    ie_status_t st; /* first failure, IE_OK if none             */
    char err[512];
} gen_call_t;

typedef struct gen_item {
    gen_call_t *g;
    size_t index;
} gen_item_t;

static void gen_event(void *ctx, const ie_sched_event_t *ev)
{
    gen_item_t *it = ctx;
    gen_call_t *g = it->g;
    ie_gen_result_t *r = &g->results[it->index];
    if (ev->kind == IE_SCHED_TOKEN) {
        if (g->p->on_token) g->p->on_token(g->p->on_token_ctx, it->index, ev->token, ev->text, ev->len);
        return;
    }
    g->n_done++;
    if (ev->kind == IE_SCHED_ERROR) {
        if (g->st == IE_OK) {
            g->st = ev->status != IE_OK ? ev->status : IE_ERR_INTERNAL;
            snprintf(g->err, sizeof g->err, "%s", ev->message ? ev->message : "request failed");
        }
        return;
    }
    r->text = strdup(ev->all_text);
    r->ids = malloc((ev->n_gen ? ev->n_gen : 1) * sizeof *r->ids);
    r->lat_ms = malloc((ev->n_lat ? ev->n_lat : 1) * sizeof *r->lat_ms);
    if (!r->text || !r->ids || !r->lat_ms) {
        if (g->st == IE_OK) {
            g->st = IE_ERR_NOMEM;
            snprintf(g->err, sizeof g->err, "out of memory during generation");
        }
        return;
    }
    if (ev->n_gen) memcpy(r->ids, ev->ids, ev->n_gen * sizeof *r->ids);
    if (ev->n_lat) memcpy(r->lat_ms, ev->lat_ms, ev->n_lat * sizeof *r->lat_ms); /* NULL when none */
    r->n_gen = ev->n_gen;
    r->n_lat = ev->n_lat;
    r->n_prompt = ev->n_prompt;
    r->stop = ev->finish;
    r->ttft_ms = ev->ttft_ms;
}

/* One body for both entry points: prompts as text (ids NULL) or as ids. */
static ie_status_t generate(ie_engine_t *e, const char *const *prompts, const int32_t *const *ids,
                            const size_t *n_ids, size_t n, const ie_gen_params_t *p, ie_gen_result_t *results,
                            ie_gen_stats_t *stats);

ie_status_t ie_engine_generate_batch(ie_engine_t *e, const char *const *prompts, size_t n, const ie_gen_params_t *p,
                                     ie_gen_result_t *results, ie_gen_stats_t *stats)
{
    if (n && !prompts) {
        memset(results, 0, n * sizeof *results);
        return ie_error_set(IE_ERR_INVAL, "generate: bad arguments");
    }
    return generate(e, prompts, NULL, NULL, n, p, results, stats);
}

ie_status_t ie_engine_generate_ids(ie_engine_t *e, const int32_t *const *ids, const size_t *n_ids, size_t n,
                                   const ie_gen_params_t *p, ie_gen_result_t *results, ie_gen_stats_t *stats)
{
    if (n && (!ids || !n_ids)) {
        memset(results, 0, n * sizeof *results);
        return ie_error_set(IE_ERR_INVAL, "generate: bad arguments");
    }
    return generate(e, NULL, ids, n_ids, n, p, results, stats);
}

static ie_status_t generate(ie_engine_t *e, const char *const *prompts, const int32_t *const *ids,
                            const size_t *n_ids, size_t n, const ie_gen_params_t *p, ie_gen_result_t *results,
                            ie_gen_stats_t *stats)
{
    ie_status_t st = IE_OK;
    const ie_hparams_t *hp = ie_engine_hparams(e);
    int32_t **toks = NULL;
    size_t *n_toks = NULL;
    gen_item_t *items = NULL;
    uint64_t *rid = NULL;
    ie_sched_t *sched = NULL;
    size_t n_sub = 0; /* requests submitted */
    gen_call_t g = {.p = p, .results = results};

    if (n == 0) return IE_OK;
    memset(results, 0, n * sizeof *results);
    if (!e->tok) return ie_error_set(IE_ERR_INVAL, "generate: the engine was created without a tokenizer");
    if (!p || p->max_new < 0) return ie_error_set(IE_ERR_INVAL, "generate: bad arguments");
    if ((st = ie_sampler_params_validate(&p->sampling)) != IE_OK) return st;
    toks = calloc(n, sizeof *toks);
    n_toks = calloc(n, sizeof *n_toks);
    items = calloc(n, sizeof *items);
    rid = calloc(n, sizeof *rid);
    if (!toks || !n_toks || !items || !rid) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }

    /* tokenize everything first: a bad prompt fails the call up front */
    int flags = (p->add_special ? IE_TOK_ADD_SPECIAL : 0) | (p->parse_special ? IE_TOK_PARSE_SPECIAL : 0);
    for (size_t i = 0; i < n; i++) {
        if (ids ? !ids[i] && n_ids[i] : !prompts[i]) {
            st = ie_error_set(IE_ERR_INVAL, "prompt %zu is NULL", i + 1);
            goto cleanup;
        }
        if (ids) { /* already tokens: check the range */
            for (size_t j = 0; j < n_ids[i]; j++)
                if (ids[i][j] < 0 || ids[i][j] >= hp->n_vocab) {
                    st = ie_error_set(IE_ERR_RANGE, "prompt %zu: token id %d out of range (vocabulary %d)", i + 1,
                                      (int)ids[i][j], (int)hp->n_vocab);
                    goto cleanup;
                }
            n_toks[i] = n_ids[i];
        } else if ((st = ie_tokenizer_encode(e->tok, prompts[i], strlen(prompts[i]), flags, &toks[i],
                                             &n_toks[i])) != IE_OK) {
            char why[400]; /* ie_error_last() is the buffer being written */
            snprintf(why, sizeof why, "%s", ie_error_last());
            ie_error_set(st, "prompt %zu: %s", i + 1, why);
            goto cleanup;
        }
        if (n_toks[i] == 0) {
            st = ie_error_set(IE_ERR_INVAL, "prompt %zu is empty after tokenization", i + 1);
            goto cleanup;
        }
        if (n_toks[i] > (size_t)ie_backend_geom(e->backend)->n_ctx) {
            st = ie_error_set(IE_ERR_RANGE, "prompt %zu has %zu tokens; the context holds %d", i + 1, n_toks[i],
                              ie_backend_geom(e->backend)->n_ctx);
            goto cleanup;
        }
    }

    if (e->opts.keep_sched) { /* the engine's scheduler: its prefix cache persists */
        if (!e->sched) {
            ie_sched_opts_t so;
            ie_engine_sched_opts(e, &so);
            so.queue_max = 1000000;
            so.prefill_chunk = ie_backend_geom(e->backend)->max_batch; /* offline: throughput, not latency */
            so.step_latency_ms = -1;
            if ((st = ie_sched_new(&so, &e->sched)) != IE_OK) goto cleanup;
        }
        sched = e->sched;
        ie_sched_set_timing(sched, stats);
    } else {
        ie_sched_opts_t so;
        ie_engine_sched_opts(e, &so);
        so.queue_max = (int)(n < 1000000 ? n : 1000000);
        so.prefill_chunk = ie_backend_geom(e->backend)->max_batch; /* no one waits between tokens here */
        so.step_latency_ms = -1;
        so.timing = stats;
        if ((st = ie_sched_new(&so, &sched)) != IE_OK) goto cleanup;
    }
    for (; n_sub < n; n_sub++) {
        const size_t i = n_sub;
        items[i] = (gen_item_t){&g, i};
        ie_sched_req_t r = {.ids = ids ? ids[i] : toks[i],
                            .n_ids = n_toks[i],
                            .params = p,
                            .cb = gen_event,
                            .cb_ctx = &items[i],
                            .lora = p->adapters ? p->adapters[i] + 1 : 0,
                            .lora_salt = p->adapters ? ie_lora_cache_salt(e->lc, p->adapters[i]) : 0};
        if ((st = ie_sched_submit(sched, &r, &rid[i])) != IE_OK) goto cleanup;
    }
    int idle = 0, cancelled = 0;
    /* a cancelled call still steps until every request has ended, so that
     * nothing of it is left in a kept scheduler */
    while (g.n_done < n && (g.st == IE_OK || cancelled)) {
        int busy = 0;
        if (p->cancel && *p->cancel && !cancelled) {                       /* each ends with ERROR "cancelled" */
            for (size_t i = 0; i < n; i++) ie_sched_cancel(sched, rid[i]); /* finished ones: RANGE, ignored */
            cancelled = 1;
        }
        if ((st = ie_engine_sched_step(e, sched, &busy)) != IE_OK) goto cleanup;
        /* nothing runs and nothing can: a scheduler bug, not a hang */
        if (!busy && g.n_done < n && ++idle > 1000) {
            st = ie_error_set(IE_ERR_INTERNAL, "generate: the scheduler stalled");
            goto cleanup;
        }
        if (busy) idle = 0;
    }
    if (g.st != IE_OK) st = ie_error_set(g.st, "%s", g.err);

cleanup:
    if (sched && sched == e->sched) {
        ie_sched_set_timing(sched, NULL);
        /* after a failure some of this call's requests may still be queued
         * or running, and their events point into this frame: destroying
         * the scheduler ends them now (the cache goes with it) */
        if (g.n_done < n_sub) ie_sched_destroy(&e->sched);
    } else {
        ie_sched_destroy(&sched); /* ends what is left (after a failure) */
    }
    for (size_t i = 0; toks && i < n; i++) free(toks[i]);
    free(toks);
    free(n_toks);
    free(items);
    free(rid);
    if (st != IE_OK)
        for (size_t i = 0; i < n; i++) ie_gen_result_clear(&results[i]);
    return st;
}

ie_status_t ie_engine_logits(ie_engine_t *e, const int32_t *ids, size_t n, int decode, float *out)
{
    const ie_backend_geom_t *g = ie_backend_geom(e->backend);
    int B = g->max_batch;
    if (n == 0) return IE_OK;
    /* slot 0 is rebound below: a kept scheduler's cached blocks would be
     * overwritten, so it goes (with its prefix cache) */
    ie_sched_destroy(&e->sched);
    if (n > (size_t)g->n_ctx)
        return ie_error_set(IE_ERR_RANGE, "logits: %zu tokens do not fit the context of %d", n, g->n_ctx);
    /* slot 0 on the pool's first blocks (what a full-size pool starts
     * with; a smaller pool may have been handed out by a scheduler) */
    int bt = g->kv_block, nbk = (int)((n + (size_t)bt - 1) / (size_t)bt);
    if (nbk > g->kv_blocks)
        return ie_error_set(IE_ERR_RANGE, "logits: %zu tokens need %d KV blocks; the pool has %d", n, nbk,
                            g->kv_blocks);
    int32_t *tab = malloc((size_t)nbk * sizeof *tab);
    if (!tab) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    for (int j = 0; j < nbk; j++) tab[j] = j;
    ie_backend_seq_clear(e->backend, 0);
    ie_status_t bst = ie_backend_kv_bind(e->backend, 0, 0, tab, nbk);
    free(tab);
    if (bst != IE_OK) return bst;
    size_t chunk = decode ? 1 : (size_t)B;
    for (size_t i = 0; i < n; i += chunk) {
        int m = (int)(n - i < chunk ? n - i : chunk);
        for (int k = 0; k < m; k++) {
            e->b_tok[k] = ids[i + k];
            e->b_pos[k] = (int32_t)(i + k);
            e->b_seq[k] = 0;
            e->b_logits[k] = 1;
            e->b_adapter[k] = e->logits_adapter;
        }
        ie_batch_t b = {m,        e->b_tok,    e->b_pos,
                        e->b_seq, e->b_logits, e->logits_adapter >= 0 ? e->b_adapter : NULL,
                        NULL};
        ie_lora_cache_step_begin(e->lc);
        ie_status_t st = ie_backend_step(e->backend, &b, out + i * (size_t)g->n_vocab);
        ie_lora_cache_step_end(e->lc);
        if (st != IE_OK) return st;
    }
    return IE_OK;
}

/* Contract (ie_engine.h). */
ie_status_t ie_engine_lora_load(ie_engine_t *e, const char *name, const char *path, float scale)
{
    if (!e) return ie_error_set(IE_ERR_INVAL, "lora: NULL argument");
    return ie_lora_cache_load(e->lc, name, path, scale, 1);
}

/* Contract (ie_engine.h). */
int ie_engine_lora_find(const ie_engine_t *e, const char *name)
{
    ie_lora_lease_t l;
    if (!e || !name || !*name) return -1;
    const ie_lora_use_t u = {name, NAN};
    if (ie_lora_cache_acquire(e->lc, &u, 1, &l) != IE_OK) return -1;
    ie_lora_cache_release(e->lc, &l, 0); /* attached, idle: the caller runs it before anything evicts it */
    return l.id;
}

int ie_engine_lora_count(const ie_engine_t *e) { return e ? ie_lora_cache_list(e->lc, NULL, 0) : 0; }

const char *ie_engine_lora_name(const ie_engine_t *e, int i)
{
    static _Thread_local ie_lora_info_t info[IE_LORA_CACHE_MAX];
    if (!e || i < 0) return NULL;
    int n = ie_lora_cache_list(e->lc, info, IE_LORA_CACHE_MAX);
    return i < n && i < IE_LORA_CACHE_MAX ? info[i].name : NULL;
}

/* Contract (ie_engine.h). */
ie_status_t ie_engine_set_logits_adapter(ie_engine_t *e, int id)
{
    if (id != -1 && !ie_lora_cache_salt(e->lc, id))
        return ie_error_set(IE_ERR_RANGE, "lora: no adapter %d loaded", id);
    e->logits_adapter = id;
    return IE_OK;
}

ie_lora_cache_t *ie_engine_lora_cache(ie_engine_t *e) { return e ? e->lc : NULL; }

/* Contract (ie_engine.h). */
ie_status_t ie_engine_sched_step(ie_engine_t *e, ie_sched_t *s, int *busy_out)
{
    uint64_t salts[IE_LORA_SET_MAX];
    ie_lora_cache_step_begin(e->lc);
    /* sets detached since the last step (here or by an unload): their
     * prefix blocks can never match again, so they are freed now */
    for (int n; (n = ie_lora_cache_take_detached(e->lc, salts, IE_LORA_SET_MAX)) > 0;)
        for (int i = 0; i < n; i++) ie_sched_drop_salt(s, salts[i]);
    ie_status_t st = ie_sched_step(s, busy_out);
    ie_lora_cache_step_end(e->lc);
    return st;
}
