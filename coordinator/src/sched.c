/* sched.c — the request scheduler (ie_sched.h).
 *
 * Request life: submit -> queue (sorted: priority desc, arrival asc) ->
 * admitted into a free slot, taking the cached blocks of its longest known
 * prefix -> PREFILL (chunks of its known tokens) -> DECODE (one token per
 * step) -> terminal event. Preemption sends a running request back to the
 * queue with its tokens so far; it is recomputed (prefill of prompt +
 * generated tokens, no sampling) and continues where it stopped.
 *
 * Locking: `mu` guards the queue, the live list (for cancel), the flags
 * other threads set and the stats snapshot. The running set, the KV pool
 * and the backend belong to the stepping thread. Events are collected
 * during a step and delivered after the lock is released.
 */
#include "ie_sched.h"
#include "ie_clock.h"

#include "ie_array.h"
#include "ie_grammar.h"
#include "ie_kvpool.h"
#include "ie_stop.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { S_WAIT, S_PREFILL, S_DECODE, S_DONE } sstate_t;

typedef struct sreq {
    uint64_t id, order;
    int priority;
    sstate_t state;
    int32_t *toks; /* prompt, then generated tokens            */
    size_t n_toks, toks_cap, n_prompt;
    size_t n_known; /* tokens to have in the cache before the
                                next sampled token: n_prompt fresh,
                                n_toks - 1 after a preemption          */
    size_t n_fed;   /* positions in the cache                   */
    int fresh;      /* never sampled yet: the last known token
                                wants logits                            */
    int slot;
    int32_t adapter;     /* the backend's adapter id, -1: the base model   */
    uint64_t salt;       /* its prefix-cache namespace (0: the base)       */
    int32_t *blocks;     /* physical block of each logical block     */
    int n_blocks, n_pub; /* bound; published (a prefix of them)      */
    size_t n_cached;
    int max_new;
    int min_new, ignore_eos; /* ie_gen_params_t's: EOG masked until then  */
    int32_t *stop_ids;       /* the request's own end ids (params->stop_ids) */
    float *stop_row;         /* their logits while masked              */
    size_t n_stop_ids;
    int include_stop;     /* keep the stop string that ended the text */
    int spec_miss;        /* this step: a draft was refused (1), and
                             the backend's length mended (2)        */
    ie_pooling_t pooling; /* != IE_POOL_NONE: an embedding request       */
    float *embd;          /* its pooled vector so far (n_embd floats)    */
    ie_sampler_t *smp;
    ie_grammar_t *gram; /* structured output (json_schema), else NULL */
    ie_gmatch_t *gm;    /* its matcher: the text generated so far    */
    /* log-probabilities (params->logprobs): of the token sampled last */
    int lp_on, lp_k;
    double lp_lse;
    float lp_tok;
    int lp_n;
    ie_token_logprob_t lp_top[IE_LOGPROBS_MAX_TOP];
    /* prompt log-probabilities (params->prompt_logprobs), else NULL:
     * plp[i] of prompt token i, plp_top[i * plp_k ..] its alternatives */
    float *plp;
    ie_token_logprob_t *plp_top;
    int plp_k;
    ie_detok_t *detok;
    ie_stop_t *stop;
    char *text;
    size_t text_len, text_cap;
    double *lat;
    size_t n_lat, lat_cap;
    double t_submit, t_admit, t_first, t_prev, deadline;
    double hold_until; /* a lost worker's requests wait until then
                                for the backend (0: never failed)        */
    double not_before; /* retry back-off                           */
    int admitted;
    int ran;    /* was in a step that succeeded             */
    int cancel; /* set under mu by ie_sched_cancel          */
    ie_sched_cb cb;
    void *cb_ctx;
    /* the terminal outcome, filled when it ends */
    ie_sched_ev_kind_t end;
    ie_finish_t finish;
    ie_status_t status;
    const char *code;
    char msg[256];
    struct sreq *next_live; /* all live requests (for cancel)           */
} sreq_t;

/* A token event of this step (text is a slice of the request's text). */
typedef struct tok_ev {
    sreq_t *q;
    int32_t id;
    size_t off, len;
    int first; /* the request's first token */
} tok_ev_t;

struct ie_sched {
    ie_sched_opts_t o;
    ie_backend_t *be;
    const ie_tokenizer_t *tok;
    int n_seq, n_ctx, B, bt, chunk, max_lblocks, kv_blocks; /* the backend's geometry */
    double ew_dec;                                          /* moving average (ms) of a decode-only step */
    double fit_w, fit_n, fit_nn, fit_y, fit_ny;             /* decayed sums of mixed steps' prompt tokens n and
                                                   extra time y (prefill_budget) */
    unsigned n_mixed;                                       /* budgets handed out (alternation)             */
    int last_budget;                                        /* the last one (growth cap)                    */
    int32_t n_vocab, n_embd;
    int32_t *eog;   /* the ids that end a generation: the tokenizer's EOG
                       tokens and the stop ids (min_new / ignore_eos mask them) */
    float *eog_row; /* their logits, kept while they are masked */
    int n_eog;
    ie_gvocab_t *gvocab; /* the token trie for json_schema masks: built at
                            the first such submission (under mu), then
                            read by the stepping thread only */
    ie_kvpool_t *pool;
    int prefix_cache;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sreq_t **queue; /* sorted; queue_max + n_seq capacity       */
    int n_queue, queue_cap;
    sreq_t *live;
    sreq_t **run; /* [n_seq] by slot                          */
    uint64_t next_id, next_order;
    int pending;  /* a submit or cancel since the last step   */
    int draining; /* ie_sched_drain: submissions are refused   */
    /* step buffers */
    int32_t *b_tok, *b_pos, *b_seq, *b_ad;
    uint8_t *b_logits;
    uint8_t *b_draft; /* the entry is a draft token (opts.spec_ngram) */
    int spec;         /* drafts allowed: opts.spec_ngram on a ring-less backend */
    sreq_t **b_req;   /* the request of each batch entry          */
    float *logits;
    float *b_embd; /* [B][n_embd] the step's hidden-state rows   */
    float *lp_row; /* a raw row kept for log-probabilities (the
                                sampler writes its penalties into the row) */
    tok_ev_t *tev;
    int n_tev;
    sreq_t **ended; /* terminal this step                        */
    int n_ended, ended_cap;
    int32_t *unbind;      /* a slot's table when it is let go          */
    int ident;            /* the pool is full size: slots start bound
                                to their own blocks                      */
    ie_sched_stats_t st;  /* under mu                                 */
    ie_metric_t *m_stage; /* ie_stage_seconds{stage} */
    ie_metric_t *m_req, *m_gen, *m_prompt, *m_queue, *m_ttft, *m_lat, *m_kv_used, *m_kv_cached, *m_kv_total,
        *m_kv_ratio, *m_hit, *m_miss, *m_preempt, *m_queued, *m_running, *m_spec_draft, *m_spec_ok;
};

/* ------------------------------------------------------------ helpers */

static int text_append(sreq_t *q, const char *s, size_t n)
{
    if (q->text_len + n + 1 > q->text_cap) {
        size_t c = q->text_cap ? q->text_cap : 256;
        while (c < q->text_len + n + 1) c *= 2;
        char *p = realloc(q->text, c);
        if (!p) return -1;
        q->text = p;
        q->text_cap = c;
    }
    memcpy(q->text + q->text_len, s, n);
    q->text_len += n;
    q->text[q->text_len] = '\0';
    return 0;
}

/* Newly decoded text through the stop-string matcher into the output.
 * Returns 1 when a stop string completed; -1 out of memory. */
static int emit_text(sreq_t *q, const char *s, size_t n)
{
    if (!q->stop) return n && text_append(q, s, n) != 0 ? -1 : 0;
    size_t emit = 0;
    int stopped = 0;
    if (ie_stop_feed(q->stop, s, n, &emit, &stopped) != IE_OK) return -1;
    if (emit && text_append(q, ie_stop_emit_data(q->stop), emit) != 0) return -1;
    return stopped;
}

static void sreq_free(sreq_t *q)
{
    if (!q) return;
    free(q->toks);
    free(q->blocks);
    ie_sampler_destroy(&q->smp);
    ie_gmatch_destroy(&q->gm);
    ie_grammar_destroy(&q->gram);
    ie_detok_destroy(&q->detok);
    ie_stop_destroy(&q->stop);
    free(q->text);
    free(q->lat);
    free(q->embd);
    free(q->plp);
    free(q->plp_top);
    free(q->stop_ids);
    free(q->stop_row);
    free(q);
}

static void metric_add(ie_metric_t *m, const char *label, double v)
{
    if (m) ie_metric_add(m, label, v);
}

/* queue order: priority desc, then arrival */
static int before(const sreq_t *a, const sreq_t *b)
{
    return a->priority != b->priority ? a->priority > b->priority : a->order < b->order;
}

static void queue_insert(ie_sched_t *s, sreq_t *q)
{
    int at = s->n_queue;
    while (at > 0 && before(q, s->queue[at - 1])) at--;
    memmove(&s->queue[at + 1], &s->queue[at], (size_t)(s->n_queue - at) * sizeof *s->queue);
    s->queue[at] = q;
    s->n_queue++;
    q->state = S_WAIT;
}

static void queue_remove_at(ie_sched_t *s, int i)
{
    memmove(&s->queue[i], &s->queue[i + 1], (size_t)(s->n_queue - i - 1) * sizeof *s->queue);
    s->n_queue--;
}

static void live_unlink(ie_sched_t *s, sreq_t *q)
{
    for (sreq_t **pp = &s->live; *pp; pp = &(*pp)->next_live)
        if (*pp == q) {
            *pp = q->next_live;
            return;
        }
}

/* Record q's end; it is delivered and freed after the step. */
static void end_req(ie_sched_t *s, sreq_t *q, ie_sched_ev_kind_t kind, ie_status_t st, const char *code,
                    const char *fmt, const char *arg)
{
    q->end = kind;
    q->status = st;
    q->code = code;
    snprintf(q->msg, sizeof q->msg, fmt ? fmt : "%s", arg ? arg : "");
    q->state = S_DONE;
    if (s->n_ended == s->ended_cap) { /* sized for every live request; grows only on a surge */
        int c = s->ended_cap * 2;
        sreq_t **p = realloc(s->ended, (size_t)c * sizeof *p);
        if (!p) return; /* cannot happen often: ended_cap starts at queue + slots */
        s->ended = p;
        s->ended_cap = c;
    }
    s->ended[s->n_ended++] = q;
}

/* Give back a running request's blocks and slot. */
static void release_slot(ie_sched_t *s, sreq_t *q)
{
    for (int j = 0; j < q->n_blocks; j++) ie_kvpool_release(s->pool, q->blocks[j]);
    if (q->slot >= 0) {
        /* leave the slot as the backend starts it: bound to its own blocks
         * in a full-size pool (ie_engine_logits and other direct users of
         * a slot rely on that), else unbound */
        if (q->n_blocks) {
            for (int j = 0; j < q->n_blocks; j++) s->unbind[j] = s->ident ? q->slot * s->max_lblocks + j : -1;
            ie_backend_kv_bind(s->be, q->slot, 0, s->unbind, q->n_blocks);
        }
        ie_backend_seq_clear(s->be, q->slot);
        s->run[q->slot] = NULL;
    }
    q->n_blocks = q->n_pub = 0;
    q->slot = -1;
    q->n_fed = 0;
}

/* Send a running request back to the queue (its tokens kept). */
static void preempt(ie_sched_t *s, sreq_t *q)
{
    release_slot(s, q);
    if (!q->fresh) q->n_known = q->n_toks - 1;
    queue_insert(s, q);
    s->st.preemptions++;
    metric_add(s->m_preempt, NULL, 1);
    if (s->o.timing) s->o.timing->preemptions++;
}

/* The running request to preempt: lowest priority, latest arrival. */
static sreq_t *victim(ie_sched_t *s)
{
    sreq_t *v = NULL;
    for (int k = 0; k < s->n_seq; k++) {
        sreq_t *q = s->run[k];
        if (q && (!v || before(v, q))) v = q;
    }
    return v;
}

/* Make sure position pos of q has a bound block. 0 ok, -1 pool empty. */
static int ensure_block(ie_sched_t *s, sreq_t *q, size_t pos)
{
    int lb = (int)(pos / (size_t)s->bt);
    if (lb < q->n_blocks) return 0;
    int32_t b;
    if (ie_kvpool_alloc(s->pool, &b) != IE_OK) return -1;
    if (ie_backend_kv_bind(s->be, q->slot, lb, &b, 1) != IE_OK) {
        ie_kvpool_release(s->pool, b);
        return -1;
    }
    q->blocks[q->n_blocks++] = b;
    return 0;
}

static int backend_ready(ie_sched_t *s) { return ie_backend_ready(s->be); }

/* 1 if q's next token may not end the generation (min_new, ignore_eos). */
static int eog_masked(const sreq_t *q) { return q->ignore_eos || q->n_toks - q->n_prompt < (size_t)q->min_new; }

/* The logits q's sampled token needs: only the arg max for a greedy
 * request without penalties, unless it reports log-probabilities or
 * follows a json_schema (both need the whole row, which the cluster sends
 * only for FULL: the mask can move the arg max). */
static uint8_t row_kind(const sreq_t *q)
{
    return ie_sampler_argmax_only(q->smp) && !q->lp_on && !q->gm && !eog_masked(q) ? IE_LOGITS_ARGMAX
                                                                                   : IE_LOGITS_FULL;
}

/* ------------------------------------------------------------- public */

/* s->eog: every id of the vocabulary that ends a generation, ascending
 * (a scan at start-up: the tokenizer answers one id at a time). */
static ie_status_t eog_ids(ie_sched_t *s)
{
    size_t cap = 0, n = 0;
    for (int32_t id = 0; id < s->n_vocab; id++) {
        int eog = ie_tokenizer_is_eog(s->tok, id);
        for (size_t k = 0; !eog && k < s->o.n_stop_ids; k++) eog = s->o.stop_ids[k] == id;
        if (!eog) continue;
        if (ie_array_grow((void **)&s->eog, &cap, n + 1, sizeof *s->eog) != 0)
            return ie_error_set(IE_ERR_NOMEM, "out of memory");
        s->eog[n++] = id;
    }
    if (!(s->eog_row = malloc((n ? n : 1) * sizeof *s->eog_row)))
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    s->n_eog = (int)n;
    return IE_OK;
}

/* 1 if generating id ends q: one of s->eog or of q's own stop ids. */
static int ends_generation(const ie_sched_t *s, const sreq_t *q, int32_t id)
{
    int lo = 0, hi = s->n_eog;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (s->eog[mid] == id) return 1;
        if (s->eog[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    for (size_t k = 0; k < q->n_stop_ids; k++)
        if (q->stop_ids[k] == id) return 1;
    return 0;
}

/* Mask q's end-of-generation tokens in its row lg (-inf). Under a grammar
 * that leaves nothing else (a finished JSON document) they stay: the
 * request ends rather than fails. */
static void eog_mask(ie_sched_t *s, const sreq_t *q, float *lg)
{
    for (int k = 0; k < s->n_eog; k++) {
        s->eog_row[k] = lg[s->eog[k]];
        lg[s->eog[k]] = -INFINITY;
    }
    for (size_t k = 0; k < q->n_stop_ids; k++) {
        q->stop_row[k] = lg[q->stop_ids[k]];
        lg[q->stop_ids[k]] = -INFINITY;
    }
    if (!q->gm) return;
    for (int32_t id = 0; id < s->n_vocab; id++)
        if (lg[id] > -INFINITY) return;
    for (size_t k = q->n_stop_ids; k-- > 0;) lg[q->stop_ids[k]] = q->stop_row[k]; /* reverse: a repeated id */
    for (int k = 0; k < s->n_eog; k++) lg[s->eog[k]] = s->eog_row[k];
}

ie_status_t ie_sched_new(const ie_sched_opts_t *o, ie_sched_t **out)
{
    ie_status_t st = IE_OK;
    *out = NULL;
    if (!o || !o->backend) return ie_error_set(IE_ERR_INVAL, "scheduler: no backend");
    if (!o->tok) return ie_error_set(IE_ERR_INVAL, "scheduler: no tokenizer (the engine was created without one)");
    if (o->queue_max < 0 || o->prefill_chunk < 0 || o->retry_ms < 0)
        return ie_error_set(IE_ERR_INVAL, "scheduler: bad options");
    ie_sched_t *s = calloc(1, sizeof *s);
    if (!s) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    s->o = *o;
    s->be = o->backend;
    const ie_backend_geom_t *g = ie_backend_geom(s->be);
    s->tok = o->tok;
    s->n_seq = g->n_seq;
    s->n_ctx = g->n_ctx;
    s->B = g->max_batch;
    s->bt = g->kv_block;
    s->kv_blocks = g->kv_blocks;
    /* while streams decode, a step takes at most this many prompt tokens
     * (each costs about as much as a stream's token, and every stream
     * waits for the whole step); alone, a prompt takes the whole step */
    s->chunk = o->prefill_chunk > 0 ? o->prefill_chunk : o->step_latency_ms >= 0 ? s->B : IE_SCHED_PREFILL_CHUNK;
    if (s->chunk > s->B) s->chunk = s->B;
    s->max_lblocks = (s->n_ctx + s->bt - 1) / s->bt;
    s->n_vocab = g->n_vocab;
    s->n_embd = g->n_embd;
    /* a backend whose sliding layers keep a ring per slot has no window
     * rows for a prefix another slot computed (ie_worker.h "paged KV") */
    s->prefix_cache = !o->no_prefix_cache && !g->kv_ring_len;
    /* a ring's positions written by a refused draft overwrote ones still needed */
    s->spec = o->spec_ngram > 0 && !g->kv_ring_len;
    s->queue_cap = (o->queue_max > 0 ? o->queue_max : 64) + s->n_seq;
    s->ended_cap = s->queue_cap + 1;
    s->next_id = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca; /* waits measured on the monotonic clock: a wall-clock jump cannot stretch them */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    size_t B = (size_t)s->B;
    s->queue = calloc((size_t)s->queue_cap, sizeof *s->queue);
    s->run = calloc((size_t)s->n_seq, sizeof *s->run);
    s->b_tok = malloc(B * sizeof *s->b_tok);
    s->b_pos = malloc(B * sizeof *s->b_pos);
    s->b_seq = malloc(B * sizeof *s->b_seq);
    s->b_logits = malloc(B);
    s->b_draft = calloc(B, 1);
    s->b_ad = malloc(B * sizeof *s->b_ad);
    s->b_req = malloc(B * sizeof *s->b_req);
    s->logits = malloc(B * (size_t)s->n_vocab * sizeof *s->logits);
    s->lp_row = malloc((size_t)s->n_vocab * sizeof *s->lp_row);
    s->tev = malloc(((size_t)s->n_seq + B) * sizeof *s->tev); /* drafts: several tokens a request */
    s->ended = malloc((size_t)s->ended_cap * sizeof *s->ended);
    s->unbind = malloc((size_t)s->max_lblocks * sizeof *s->unbind);
    if (s->n_embd > 0) s->b_embd = malloc(B * (size_t)s->n_embd * sizeof *s->b_embd);
    if (!s->queue || !s->run || !s->b_tok || !s->b_pos || !s->b_seq || !s->b_logits || !s->b_draft || !s->b_ad ||
        !s->b_req || !s->logits || !s->lp_row || !s->tev || !s->ended || !s->unbind ||
        (s->n_embd > 0 && !s->b_embd)) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if ((st = eog_ids(s)) != IE_OK) goto cleanup;
    s->ident = s->kv_blocks >= s->n_seq * s->max_lblocks;
    if ((st = ie_kvpool_new(s->kv_blocks, s->bt, &s->pool)) != IE_OK) goto cleanup;
    s->st.kv_blocks = s->kv_blocks;
    s->st.ready = backend_ready(s);
    if (o->metrics) {
        static const double qb[] = {0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 30};
        static const double lb[] = {0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1};
        ie_metrics_t *m = o->metrics;
        ie_metrics_counter(m, "ie_requests_total", "Requests ended, by outcome", "status", &s->m_req);
        ie_metrics_counter(m, "ie_tokens_generated_total", "Tokens generated", NULL, &s->m_gen);
        ie_metrics_counter(m, "ie_prompt_tokens_total", "Prompt tokens of admitted requests", NULL, &s->m_prompt);
        ie_metrics_histogram(m, "ie_request_queue_seconds", "Time requests waited in the queue", NULL, qb, 8,
                             &s->m_queue);
        ie_metrics_histogram(m, "ie_time_to_first_token_seconds", "Submission to first token", NULL, qb, 8,
                             &s->m_ttft);
        ie_metrics_histogram(m, "ie_token_latency_seconds", "Time between a stream's tokens", NULL, lb, 8,
                             &s->m_lat);
        ie_metrics_gauge(m, "ie_kv_blocks_used", "KV cache blocks in use", NULL, &s->m_kv_used);
        ie_metrics_gauge(m, "ie_kv_blocks", "KV cache blocks in the pool", NULL, &s->m_kv_total);
        ie_metrics_gauge(m, "ie_kv_blocks_cached", "KV cache blocks idle and kept for the prefix cache", NULL,
                         &s->m_kv_cached);
        ie_metrics_gauge(m, "ie_kv_used_ratio", "Share of KV cache blocks in use", NULL, &s->m_kv_ratio);
        ie_metrics_counter(m, "ie_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache",
                           NULL, &s->m_hit);
        ie_metrics_counter(m, "ie_prefix_cache_miss_tokens_total", "Prompt tokens computed", NULL, &s->m_miss);
        ie_metrics_counter(m, "ie_preemptions_total", "Sequences preempted for KV blocks", NULL, &s->m_preempt);
        ie_metrics_counter(m, "ie_spec_draft_tokens_total", "Draft tokens fed (prompt-lookup speculative decoding)",
                           NULL, &s->m_spec_draft);
        ie_metrics_counter(m, "ie_spec_accepted_tokens_total", "Draft tokens the model confirmed", NULL,
                           &s->m_spec_ok);
        ie_metrics_gauge(m, "ie_queue_depth", "Requests waiting", NULL, &s->m_queued);
        ie_metrics_gauge(m, "ie_running_requests", "Requests in the running batch", NULL, &s->m_running);
        /* the CLI's stage timers (docs/CLI.md), per step: the forward pass
         * of a step with prompt tokens (prefill) or without (decode), then
         * sampling and detokenizing its rows; queue wait is
         * ie_request_queue_seconds */
        static const double sb[] = {0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};
        ie_metrics_histogram(m, "ie_stage_seconds", "Time per step in each stage", "stage", sb, 10, &s->m_stage);
        if (s->m_kv_total) ie_metric_set(s->m_kv_total, NULL, s->st.kv_blocks);
        if (s->m_kv_used) ie_metric_set(s->m_kv_used, NULL, 0);
        if (s->m_kv_cached) ie_metric_set(s->m_kv_cached, NULL, 0);
        if (s->m_kv_ratio) ie_metric_set(s->m_kv_ratio, NULL, 0);
        if (s->m_queued) ie_metric_set(s->m_queued, NULL, 0);
        if (s->m_running) ie_metric_set(s->m_running, NULL, 0);
    }

cleanup:
    if (st != IE_OK) {
        ie_sched_destroy(&s);
        return st;
    }
    *out = s;
    return IE_OK;
}

/* Deliver and free what ended (called without mu held). */
static void deliver_ended(ie_sched_t *s, sreq_t **ended, int n);

void ie_sched_destroy(ie_sched_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_sched_t *s = *self_p;
    if (s->queue && s->run && s->ended) {
        pthread_mutex_lock(&s->mu);
        s->n_ended = 0;
        for (int k = 0; k < s->n_seq; k++)
            if (s->run[k]) {
                sreq_t *q = s->run[k];
                release_slot(s, q);
                end_req(s, q, IE_SCHED_ERROR, IE_ERR_UNAVAILABLE, "unavailable", "the server is shutting down",
                        NULL);
            }
        for (int i = 0; i < s->n_queue; i++)
            end_req(s, s->queue[i], IE_SCHED_ERROR, IE_ERR_UNAVAILABLE, "unavailable",
                    "the server is shutting down", NULL);
        s->n_queue = 0;
        pthread_mutex_unlock(&s->mu);
        deliver_ended(s, s->ended, s->n_ended);
        s->n_ended = 0;
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    ie_kvpool_destroy(&s->pool);
    free(s->queue);
    free(s->run);
    free(s->b_tok);
    free(s->b_pos);
    free(s->b_seq);
    free(s->b_logits);
    free(s->b_draft);
    free(s->b_ad);
    free(s->b_req);
    free(s->logits);
    free(s->b_embd);
    ie_gvocab_destroy(&s->gvocab);
    free(s->lp_row);
    free(s->eog);
    free(s->eog_row);
    free(s->tev);
    free(s->ended);
    free(s->unbind);
    free(s);
    *self_p = NULL;
}

void ie_sched_set_timing(ie_sched_t *s, ie_gen_stats_t *timing)
{
    if (s) s->o.timing = timing;
}

/* Structured output for q: compile the schema (IE_ERR_INVAL names the
 * keyword) or the choices, make its matcher, and the scheduler's token
 * trie if this is the first such request. */
static ie_status_t sched_grammar(ie_sched_t *s, sreq_t *q, const ie_gen_params_t *p)
{
    if (p->json_schema && p->n_choice)
        return ie_error_set(IE_ERR_INVAL, "a json_schema and a choice cannot be combined");
    ie_status_t st = p->n_choice ? ie_grammar_compile_choice(p->choice, p->n_choice, &q->gram)
                                 : ie_grammar_compile(p->json_schema, &q->gram);
    if (st == IE_OK) st = ie_gmatch_new(q->gram, &q->gm);
    if (st != IE_OK) return st;
    pthread_mutex_lock(&s->mu);
    if (!s->gvocab) st = ie_gvocab_from_tokenizer(s->tok, s->o.stop_ids, s->o.n_stop_ids, &s->gvocab);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* IE_ERR_RANGE naming `what` if an id of ids[0..n) is outside the vocabulary. */
static ie_status_t ids_in_vocab(const ie_sched_t *s, const char *what, const int32_t *ids, size_t n)
{
    for (size_t j = 0; j < n; j++)
        if (ids[j] < 0 || ids[j] >= s->n_vocab)
            return ie_error_set(IE_ERR_RANGE, "%s %d out of range (vocabulary %d)", what, (int)ids[j],
                                (int)s->n_vocab);
    return IE_OK;
}

ie_status_t ie_sched_submit(ie_sched_t *s, const ie_sched_req_t *r, uint64_t *id_out)
{
    ie_status_t st = IE_OK;
    sreq_t *q = NULL;
    if (id_out) *id_out = 0;
    if (!r || !r->cb || !r->params || (r->n_ids && !r->ids))
        return ie_error_set(IE_ERR_INVAL, "submit: bad arguments");
    const ie_gen_params_t *p = r->params;
    if (r->n_ids == 0) return ie_error_set(IE_ERR_INVAL, "the prompt is empty");
    if (r->n_ids > (size_t)s->n_ctx)
        return ie_error_set(IE_ERR_RANGE, "the prompt has %zu tokens; the context holds %d", r->n_ids, s->n_ctx);
    if (p->max_new < 0) return ie_error_set(IE_ERR_INVAL, "max_new must be >= 0 (got %d)", p->max_new);
    if (p->min_new < 0) return ie_error_set(IE_ERR_INVAL, "min_new must be >= 0 (got %d)", p->min_new);
    if (r->timeout_ms < 0) return ie_error_set(IE_ERR_INVAL, "timeout must be >= 0");
    if ((st = ids_in_vocab(s, "token id", r->ids, r->n_ids)) != IE_OK) return st;
    if (p->n_stop_ids && !p->stop_ids) return ie_error_set(IE_ERR_INVAL, "stop_ids is NULL");
    if ((st = ids_in_vocab(s, "stop token id", p->stop_ids, p->n_stop_ids)) != IE_OK) return st;
    if ((st = ie_sampler_params_validate(&p->sampling)) != IE_OK) return st;
    if (r->pooling != IE_POOL_NONE && (r->pooling < IE_POOL_MEAN || r->pooling > IE_POOL_CLS))
        return ie_error_set(IE_ERR_INVAL, "unknown pooling %d", (int)r->pooling);
    if (r->pooling != IE_POOL_NONE && s->n_embd <= 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "this backend cannot give hidden states (embeddings)");
    if ((p->logprobs || p->prompt_logprobs) && (p->top_logprobs < 0 || p->top_logprobs > IE_LOGPROBS_MAX_TOP))
        return ie_error_set(IE_ERR_INVAL, "top_logprobs must be in [0, %d] (got %d)", IE_LOGPROBS_MAX_TOP,
                            p->top_logprobs);

    if (!(q = calloc(1, sizeof *q))) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    q->pooling = r->pooling;
    if (q->pooling != IE_POOL_NONE && !(q->embd = calloc((size_t)s->n_embd, sizeof *q->embd))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    q->toks_cap = r->n_ids + (size_t)(p->max_new < s->n_ctx ? p->max_new : s->n_ctx) + 1;
    q->toks = malloc(q->toks_cap * sizeof *q->toks);
    q->blocks = malloc((size_t)s->max_lblocks * sizeof *q->blocks);
    if (!q->toks || !q->blocks || text_append(q, "", 0) != 0) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    memcpy(q->toks, r->ids, r->n_ids * sizeof *q->toks);
    q->n_toks = q->n_prompt = q->n_known = r->n_ids;
    q->fresh = 1;
    q->slot = -1;
    q->max_new = q->pooling != IE_POOL_NONE ? 0 : p->max_new; /* an embedding samples nothing */
    q->min_new = p->min_new;
    q->ignore_eos = p->ignore_eos != 0;
    q->include_stop = p->include_stop != 0;
    if (p->n_stop_ids) {
        q->stop_ids = malloc(p->n_stop_ids * sizeof *q->stop_ids);
        q->stop_row = malloc(p->n_stop_ids * sizeof *q->stop_row);
        if (!q->stop_ids || !q->stop_row) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        memcpy(q->stop_ids, p->stop_ids, p->n_stop_ids * sizeof *q->stop_ids);
        q->n_stop_ids = p->n_stop_ids;
    }
    q->lp_on = p->logprobs != 0 && q->pooling == IE_POOL_NONE;
    q->lp_k = q->lp_on ? p->top_logprobs : 0;
    if (p->prompt_logprobs && q->pooling == IE_POOL_NONE) {
        q->plp_k = p->top_logprobs < s->n_vocab ? p->top_logprobs : (int)s->n_vocab;
        q->plp = malloc(r->n_ids * sizeof *q->plp);
        if (q->plp_k) q->plp_top = calloc(r->n_ids * (size_t)q->plp_k, sizeof *q->plp_top);
        if (!q->plp || (q->plp_k && !q->plp_top)) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory for the prompt's log-probabilities");
            goto cleanup;
        }
        for (size_t j = 0; j < r->n_ids; j++) q->plp[j] = NAN;
    }
    q->priority = r->priority;
    q->adapter = r->lora - 1;
    q->salt = r->lora <= 0 ? 0 : r->lora_salt ? r->lora_salt : (uint64_t)r->lora;
    q->cb = r->cb;
    q->cb_ctx = r->cb_ctx;
    if ((st = ie_sampler_new(&p->sampling, s->n_vocab, &q->smp)) != IE_OK) goto cleanup;
    if ((st = ie_detok_new(s->tok, &q->detok)) != IE_OK) goto cleanup;
    if (p->show_special) ie_detok_set_special(q->detok, 1);
    if (p->n_stop && (st = ie_stop_new(p->stop, p->n_stop, &q->stop)) != IE_OK) goto cleanup;
    for (size_t j = 0; j < r->n_ids; j++) ie_sampler_accept(q->smp, r->ids[j]);
    if ((p->json_schema || p->n_choice) && (st = sched_grammar(s, q, p)) != IE_OK) goto cleanup;
    q->t_submit = ie_now_ms();
    q->deadline = r->timeout_ms > 0 ? q->t_submit + r->timeout_ms : 0;

    pthread_mutex_lock(&s->mu);
    if (s->draining) {
        pthread_mutex_unlock(&s->mu);
        st = ie_error_set(IE_ERR_UNAVAILABLE, "the server is shutting down; no new requests are accepted");
        goto cleanup;
    }
    /* queue_max wait beyond the slots that are free now (a burst between
     * two steps fills the idle slots first, then the queue) */
    const int queue_max = s->o.queue_max > 0 ? s->o.queue_max : 64;
    int cap = queue_max;
    for (int k = 0; k < s->n_seq; k++) cap += s->run[k] == NULL;
    if (s->n_queue >= cap) {
        pthread_mutex_unlock(&s->mu);
        /* the queue's own limit, not n_queue: the requests about to take
         * the free slots are queued too until the next step */
        st = ie_error_set(IE_ERR_BUSY, "server busy: the queue is full (%d requests waiting); try again later",
                          queue_max);
        goto cleanup;
    }
    q->id = s->next_id++;
    q->order = s->next_order++;
    queue_insert(s, q);
    q->next_live = s->live;
    s->live = q;
    s->st.submitted++;
    s->pending = 1;
    if (id_out) *id_out = q->id;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    q = NULL;

cleanup:
    sreq_free(q);
    return st;
}

ie_status_t ie_sched_cancel(ie_sched_t *s, uint64_t id)
{
    ie_status_t st = IE_OK;
    pthread_mutex_lock(&s->mu);
    sreq_t *q = s->live;
    while (q && q->id != id) q = q->next_live;
    if (!q || q->state == S_DONE || q->cancel) {
        st = ie_error_set(IE_ERR_RANGE, "no such request");
    } else {
        q->cancel = 1;
        s->pending = 1;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void ie_sched_wake(void *sched)
{
    ie_sched_t *s = sched;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->pending = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void update_gauges(ie_sched_t *s);

int ie_sched_drop_salt(ie_sched_t *s, uint64_t salt)
{
    int n = 0;
    if (!s || !salt) return 0;
    pthread_mutex_lock(&s->mu);
    n = ie_kvpool_drop_salt(s->pool, salt);
    update_gauges(s);
    pthread_mutex_unlock(&s->mu);
    return n;
}

void ie_sched_wait(ie_sched_t *s, int timeout_ms)
{
    pthread_mutex_lock(&s->mu);
    int busy = s->n_queue > 0 || s->pending;
    for (int k = 0; !busy && k < s->n_seq; k++) busy = s->run[k] != NULL;
    if (!busy && timeout_ms > 0) {
        const struct timespec ts = ie_deadline_ms(timeout_ms);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
}

void ie_sched_drain(ie_sched_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void ie_sched_stats(ie_sched_t *s, ie_sched_stats_t *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->n_queue;
    out->draining = s->draining;
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- step */

static void fill_event(const ie_sched_t *s, const sreq_t *q, ie_sched_event_t *ev, double now)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = q->end;
    ev->id = q->id;
    ev->user = q->cb_ctx;
    ev->all_text = q->text ? q->text : "";
    ev->ids = q->toks + q->n_prompt;
    ev->n_gen = q->n_toks - q->n_prompt;
    ev->n_prompt = q->n_prompt;
    ev->n_cached = q->n_cached;
    ev->finish = q->finish;
    ev->queue_ms = q->admitted ? q->t_admit - q->t_submit : now - q->t_submit;
    ev->ttft_ms = q->t_first > 0 ? q->t_first - q->t_submit : 0;
    ev->total_ms = now - q->t_submit;
    double dsum = 0;
    for (size_t k = 0; k < q->n_lat; k++) dsum += q->lat[k];
    ev->decode_tps = dsum > 0 ? (double)q->n_lat / (dsum / 1e3) : 0;
    ev->lat_ms = q->lat;
    ev->n_lat = q->n_lat;
    if (q->pooling != IE_POOL_NONE && q->end == IE_SCHED_DONE) {
        ev->embd = q->embd;
        ev->n_embd = s->n_embd;
    }
    if (q->plp && q->end == IE_SCHED_DONE) {
        ev->prompt_lp = q->plp;
        ev->prompt_top = q->plp_top;
        ev->prompt_k = q->plp_k;
    }
    ev->status = q->end == IE_SCHED_ERROR ? q->status : IE_OK;
    ev->code = q->end == IE_SCHED_ERROR ? q->code : NULL;
    ev->message = q->end == IE_SCHED_ERROR ? q->msg : NULL;
}

static void deliver_ended(ie_sched_t *s, sreq_t **ended, int n)
{
    double now = ie_now_ms();
    for (int i = 0; i < n; i++) {
        sreq_t *q = ended[i];
        ie_sched_event_t ev;
        fill_event(s, q, &ev, now);
        if (q->end == IE_SCHED_DONE) {
            metric_add(s->m_req, "ok", 1);
        } else {
            metric_add(s->m_req, q->code, 1);
        }
        q->cb(q->cb_ctx, &ev);
    }
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n; i++) {
        sreq_t *q = ended[i];
        live_unlink(s, q);
        if (q->end == IE_SCHED_DONE) s->st.completed++;
        else s->st.failed++;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) sreq_free(ended[i]);
}

/* The prefix cache's namespace of q's blocks: its adapter set's (0: the
 * base; unique per attached set, so two adapters never share KV, nor
 * one adapter the KV of another that had its id before). */
static uint64_t kv_salt(const sreq_t *q) { return q->salt; }

/* Admit queued requests into free slots (mu held). */
static void admit(ie_sched_t *s, double now)
{
    int ready = backend_ready(s);
    for (int i = 0; i < s->n_queue;) {
        sreq_t *q = s->queue[i];
        int slot = -1;
        for (int k = 0; k < s->n_seq && slot < 0; k++)
            if (!s->run[k]) slot = k;
        if (slot < 0) return;
        /* waiting for a replacement worker; and a moment between tries: the
         * cluster may still count a dead rank as ready until its heartbeat
         * times out, and a try then fails at once */
        if ((!ready && q->hold_until > now) || now < q->not_before) {
            i++;
            continue;
        }
        /* the longest cached prefix; a fresh request computes at least its
         * last prompt token (its logits are needed) */
        size_t lim = q->fresh ? q->n_known - 1 : q->n_known;
        int max_b = (int)(lim / (size_t)s->bt), k = 0;
        /* an embedding needs every position's hidden state, prompt
         * log-probabilities every position's logits: nothing cached */
        if (s->prefix_cache && max_b > 0 && q->pooling == IE_POOL_NONE && !(q->plp && q->fresh))
            k = ie_kvpool_match(s->pool, kv_salt(q), q->toks, q->n_known, q->blocks, max_b);
        /* blocks to finish its prefill and take one more token, against
         * what the pool has left after the running prefills' own needs */
        int need = (int)((q->n_known + (size_t)s->bt) / (size_t)s->bt) - k, owed = 0;
        for (int r = 0; r < s->n_seq; r++) {
            const sreq_t *o = s->run[r];
            if (o && o->state == S_PREFILL) {
                int want = (int)((o->n_known + (size_t)s->bt) / (size_t)s->bt) - o->n_blocks;
                owed += want > 0 ? want : 0;
            }
        }
        if (ie_kvpool_available(s->pool) - owed < need) {
            int running = 0;
            for (int r = 0; r < s->n_seq; r++) running |= s->run[r] != NULL;
            for (int j = 0; j < k; j++) ie_kvpool_release(s->pool, q->blocks[j]);
            if (running) return; /* wait for blocks; keep the order */
            queue_remove_at(s, i);
            char why[160];
            snprintf(why, sizeof why, "the request needs %d KV blocks; the pool has %d (--kv-blocks)", need + k,
                     s->kv_blocks);
            end_req(s, q, IE_SCHED_ERROR, IE_ERR_RANGE, "invalid_request", "%s", why);
            continue;
        }
        queue_remove_at(s, i);
        q->slot = slot;
        s->run[slot] = q;
        ie_backend_seq_clear(s->be, slot);
        q->n_blocks = q->n_pub = k;
        q->n_fed = (size_t)k * (size_t)s->bt;
        if (k && (ie_backend_kv_bind(s->be, slot, 0, q->blocks, k) != IE_OK ||
                  ie_backend_seq_set_len(s->be, slot, (int)q->n_fed) != IE_OK)) {
            for (int j = 0; j < k; j++) ie_kvpool_release(s->pool, q->blocks[j]);
            q->n_blocks = q->n_pub = 0;
            q->n_fed = 0;
            ie_backend_seq_clear(s->be, slot);
        }
        if (q->fresh) {
            q->n_cached = q->n_fed;
            s->st.prefix_hit_tokens += q->n_fed;
            s->st.prefix_miss_tokens += q->n_known - q->n_fed;
            metric_add(s->m_hit, NULL, (double)q->n_fed);
            metric_add(s->m_miss, NULL, (double)(q->n_known - q->n_fed));
            metric_add(s->m_prompt, NULL, (double)q->n_prompt);
            if (s->o.timing) {
                s->o.timing->prefix_hit_tokens += q->n_fed;
                s->o.timing->prefix_miss_tokens += q->n_known - q->n_fed;
            }
        }
        if (!q->admitted) {
            q->admitted = 1;
            q->t_admit = now;
            if (s->m_queue) ie_metric_observe(s->m_queue, NULL, (now - q->t_submit) / 1e3);
        }
        q->state = q->n_fed < q->n_known ? S_PREFILL : S_DECODE;
        /* (re)computed from position 0: after a preemption too */
        if (q->pooling != IE_POOL_NONE) memset(q->embd, 0, (size_t)s->n_embd * sizeof *q->embd);
    }
}

/* Drop cancelled and timed-out requests (mu held). */
static void reap(ie_sched_t *s, double now)
{
    for (int k = 0; k < s->n_seq; k++) {
        sreq_t *q = s->run[k];
        if (!q) continue;
        if (q->cancel || (q->deadline > 0 && now >= q->deadline)) {
            release_slot(s, q);
            if (q->cancel)
                end_req(s, q, IE_SCHED_ERROR, IE_ERR_INVAL, "cancelled", "cancelled by the client", NULL);
            else end_req(s, q, IE_SCHED_ERROR, IE_ERR_TIMEOUT, "timeout", "the request timed out", NULL);
        }
    }
    for (int i = 0; i < s->n_queue;) {
        sreq_t *q = s->queue[i];
        int held_out = !backend_ready(s) && q->hold_until > 0 && now >= q->hold_until;
        if (q->cancel || (q->deadline > 0 && now >= q->deadline) || held_out) {
            queue_remove_at(s, i);
            if (q->cancel)
                end_req(s, q, IE_SCHED_ERROR, IE_ERR_INVAL, "cancelled", "cancelled by the client", NULL);
            else if (held_out)
                end_req(s, q, IE_SCHED_ERROR, IE_ERR_UNAVAILABLE, "unavailable",
                        "no replacement worker registered in time", NULL);
            else end_req(s, q, IE_SCHED_ERROR, IE_ERR_TIMEOUT, "timeout", "the request timed out", NULL);
        } else {
            i++;
        }
    }
}

/* The logits byte of an embedding request's position pos: its hidden
 * state when the pooling reads it (mean: every position; last: the last;
 * cls: the first), else nothing. */
static uint8_t embd_flag(const sreq_t *q, size_t pos)
{
    const int want = q->pooling == IE_POOL_MEAN ? 1 : q->pooling == IE_POOL_LAST ? pos + 1 == q->n_known : pos == 0;
    return want ? IE_LOGITS_EMBD : 0;
}

/* The logits a prompt position needs for prompt log-probabilities: the
 * whole row while the request has not sampled (after a preemption its
 * values are known), at every position but the last (whose row, if any,
 * is the one sampled from). */
static uint8_t plp_flag(const sreq_t *q, size_t pos)
{
    return q->plp && q->fresh && pos + 1 < q->n_prompt ? IE_LOGITS_FULL : 0;
}

/* A prompt position's row (plp_flag): the next prompt token's raw
 * log-probability and the position's top plp_k tokens. */
static void plp_take(ie_sched_t *s, sreq_t *q, size_t pos, const float *row)
{
    double lse = 0;
    ie_token_logprob_t top[IE_LOGPROBS_MAX_TOP];
    int n = ie_logprobs_row(row, s->n_vocab, q->plp_k, &lse, top);
    q->plp[pos + 1] = ie_logprobs_of(row[q->toks[pos + 1]], lse);
    if (n > 0) memcpy(q->plp_top + (pos + 1) * (size_t)q->plp_k, top, (size_t)n * sizeof *top);
}

/* An embedding request's entry at pos ran: pool its hidden-state row (NULL
 * when it asked for none); at the last position, finish it. Its blocks go
 * straight back to the pool, never published: a one-off input does not
 * push generation prompts out of the prefix cache. */
static void embd_take(ie_sched_t *s, sreq_t *q, size_t pos, const float *row)
{
    const int d = s->n_embd;
    if (row)
        for (int j = 0; j < d; j++) q->embd[j] += row[j];
    if (pos + 1 != q->n_known) return;
    if (q->pooling == IE_POOL_MEAN)
        for (int j = 0; j < d; j++) q->embd[j] /= (float)q->n_known;
    q->finish = IE_FINISH_LENGTH;
    release_slot(s, q);
    end_req(s, q, IE_SCHED_DONE, IE_OK, NULL, NULL, NULL);
}

/* Latency-bounded prefill. A step that decodes streams and also computes
 * prompt tokens makes every stream wait for all of it, so the prompt
 * tokens it takes are bounded by time, not by a fixed count. Measured
 * model of such a step: a decode-only step (ew_dec, a moving average) plus
 * pre_fixed plus pre_tok per prompt token. The two prompt terms are the
 * intercept and slope of an exponentially weighted least-squares fit of
 * (step time - ew_dec) against the prompt tokens of recent mixed steps:
 * the per-token average alone misleads, because deep in a long prompt one
 * token costs about as much as ten (each reads the whole cached context
 * once per step, whatever the number of its tokens: measured on SmolLM2 at
 * position ~3,000, 1 token 65 ms, 13 tokens 61 ms, 52 tokens 145 ms).
 * Mixed steps alternate their budget with 1.5x it, so the fit always sees
 * two sizes. The budget is (target - ew_dec - pre_fixed) / pre_tok tokens,
 * at least IE_SCHED_PREFILL_MIN (a prompt always advances), at most
 * s->chunk, at most 2x + 1 the last budget; where the fixed part alone
 * overshoots the target (it cannot be met), the step may take twice that
 * unavoidable time, so the prompt is not starved for nothing. Until
 * measured: IE_SCHED_PREFILL_MIN. */
static int prefill_budget(ie_sched_t *s)
{
    if (s->o.step_latency_ms < 0) return s->chunk;
    const int lo = s->chunk < IE_SCHED_PREFILL_MIN ? s->chunk : IE_SCHED_PREFILL_MIN;
    double target = s->o.step_latency_ms > 0 ? s->o.step_latency_ms : IE_SCHED_STEP_LATENCY_X * s->ew_dec;
    if (s->o.step_latency_ms == 0 && target < IE_SCHED_STEP_LATENCY_MS) target = IE_SCHED_STEP_LATENCY_MS;
    double n = lo;
    if (s->ew_dec > 0 && s->fit_w > 0) {
        const double w = s->fit_w, var = w * s->fit_nn - s->fit_n * s->fit_n;
        double tok = var > 1e-9 ? (w * s->fit_ny - s->fit_n * s->fit_y) / var : s->fit_y / s->fit_n;
        if (tok < 1e-3) tok = 1e-3;
        double fixed = var > 1e-9 ? (s->fit_y - tok * s->fit_n) / w : 0;
        if (fixed < 0) fixed = 0;
        const double base = s->ew_dec + fixed;
        if (target < 2 * base && base + lo * tok > target) target = 2 * base;
        n = (target - base) / tok;
    }
    if (s->n_mixed++ & 1) n *= 1.5; /* two sizes for the fit */
    /* a noisy fit can put the slope near zero and ask for everything: the
     * budget at most doubles from one step to the next, so a wrong
     * estimate costs one step of twice the work before it is measured */
    if (n > 2.0 * s->last_budget + 1) n = 2.0 * s->last_budget + 1;
    s->last_budget = n < lo ? lo : n > s->chunk ? s->chunk : (int)n;
    return s->last_budget;
}

/* Fold a step's time into the cost model: a decode-only step into ew_dec
 * (weight 1/4), a mixed one into the fit (each older step's weight times
 * 0.9: the fit follows a prompt into deeper, dearer positions). */
static void measure_step(ie_sched_t *s, int n_pre, int nb, double step_ms)
{
    if (n_pre == 0) {
        s->ew_dec = s->ew_dec > 0 ? s->ew_dec + 0.25 * (step_ms - s->ew_dec) : step_ms;
        return;
    }
    if (s->ew_dec <= 0 || nb == n_pre) return; /* a prompt alone says nothing of the streams' wait */
    const double y = step_ms - s->ew_dec, n = n_pre, f = 0.9;
    s->fit_w = f * s->fit_w + 1;
    s->fit_n = f * s->fit_n + n;
    s->fit_nn = f * s->fit_nn + n * n;
    s->fit_y = f * s->fit_y + y;
    s->fit_ny = f * s->fit_ny + n * y;
}

/* Pack the step: decode tokens first, then prompt chunks. Blocks are
 * allocated as positions need them; when the pool is dry the lowest
 * running request is preempted. Returns the batch size. */
/* Prompt-lookup drafts (opts.spec_ngram): the tokens that followed the
 * most recent earlier occurrence of q's last IE_SCHED_SPEC_MATCH tokens
 * (else of fewer, down to its last one) in its prompt and output, at most
 * k of them, into out. Returns how many. */
#define IE_SCHED_SPEC_MATCH 3
static int spec_lookup(const sreq_t *q, int k, int32_t *out)
{
    const size_t n = q->n_toks;
    for (size_t len = IE_SCHED_SPEC_MATCH; len >= 1; len--) {
        if (n < len + 1) continue;
        const int32_t *tail = q->toks + n - len;
        for (size_t i = n - len; i-- > 0;) {
            if (memcmp(q->toks + i, tail, len * sizeof *tail) != 0) continue;
            int m = 0;
            while (m < k && i + len + (size_t)m < n) {
                out[m] = q->toks[i + len + (size_t)m];
                m++;
            }
            return m;
        }
    }
    return 0;
}

/* After q's decode entry (the last of b), its drafts: greedy requests
 * only (the arg max decides a draft, nothing else may), bounded by the
 * batch, its tokens left, the context and the blocks the pool has (no
 * preemption for a guess). Returns the new entry count. */
static int spec_add(ie_sched_t *s, sreq_t *q, int nb)
{
    q->spec_miss = 0;
    if (!s->spec || row_kind(q) != IE_LOGITS_ARGMAX || q->plp) return nb;
    int k = s->o.spec_ngram < IE_SCHED_SPEC_MAX ? s->o.spec_ngram : IE_SCHED_SPEC_MAX;
    const int left = q->max_new - (int)(q->n_toks - q->n_prompt) - 1; /* this step's own token is one */
    if (k > left) k = left;
    if (k > s->B - nb) k = s->B - nb;
    if ((size_t)k + 1 + q->n_fed > (size_t)s->n_ctx) k = (int)((size_t)s->n_ctx - 1 - q->n_fed);
    if (k <= 0) return nb;
    int32_t draft[IE_SCHED_SPEC_MAX];
    const int m = spec_lookup(q, k, draft);
    for (int j = 0; j < m; j++) {
        const size_t pos = q->n_fed + 1 + (size_t)j;
        if (ensure_block(s, q, pos) != 0) break;
        s->b_tok[nb] = draft[j];
        s->b_pos[nb] = (int32_t)pos;
        s->b_seq[nb] = q->slot;
        s->b_logits[nb] = IE_LOGITS_ARGMAX;
        s->b_draft[nb] = 1;
        s->b_req[nb] = q;
        nb++;
        s->st.spec_drafted++;
        metric_add(s->m_spec_draft, NULL, 1);
    }
    return nb;
}

static int build(ie_sched_t *s, int *has_prefill)
{
    int nb = 0;
    *has_prefill = 0;
    for (;;) {
        nb = 0;
        int restart = 0;
        /* decode tokens, in slot order */
        for (int k = 0; k < s->n_seq && !restart; k++) {
            sreq_t *q = s->run[k];
            if (!q || q->state != S_DECODE) continue;
            while (ensure_block(s, q, q->n_fed) != 0) {
                sreq_t *v = victim(s);
                preempt(s, v);
                if (v == q) break;
                restart = 1; /* a request already packed may be gone */
                break;
            }
            if (restart || q->slot < 0) continue;
            s->b_tok[nb] = q->toks[q->n_toks - 1];
            s->b_pos[nb] = (int32_t)q->n_fed;
            s->b_seq[nb] = q->slot;
            s->b_logits[nb] = row_kind(q);
            s->b_draft[nb] = 0;
            s->b_req[nb] = q;
            nb++;
            nb = spec_add(s, q, nb);
        }
        if (restart) continue;
        break;
    }
    /* prompt chunks, in queue order of the running requests */
    sreq_t *order[256];
    int n_order = 0;
    for (int k = 0; k < s->n_seq && n_order < 256; k++)
        if (s->run[k] && s->run[k]->state == S_PREFILL) order[n_order++] = s->run[k];
    for (int a = 1; a < n_order; a++) /* few: insertion sort */
        for (int b = a; b > 0 && before(order[b], order[b - 1]); b--) {
            sreq_t *t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    int budget = nb == 0 ? s->B : n_order > 0 ? prefill_budget(s) : 0; /* nb: the streams' decode tokens */
    for (int i = 0; i < n_order && nb < s->B && budget > 0; i++) {
        sreq_t *q = order[i];
        while (q->n_fed < q->n_known && nb < s->B && budget > 0) {
            if (ensure_block(s, q, q->n_fed) != 0) break; /* no preemption for prompt chunks */
            s->b_tok[nb] = q->toks[q->n_fed];
            s->b_pos[nb] = (int32_t)q->n_fed;
            s->b_seq[nb] = q->slot;
            q->n_fed++;
            s->b_logits[nb] = q->pooling != IE_POOL_NONE                             ? embd_flag(q, q->n_fed - 1)
                              : q->fresh && q->n_fed == q->n_known && q->max_new > 0 ? row_kind(q)
                                                                                     : plp_flag(q, q->n_fed - 1);
            s->b_draft[nb] = 0;
            s->b_req[nb] = q;
            nb++;
            budget--;
            *has_prefill = 1;
        }
    }
    if (nb == 0) { /* every running request waits for blocks: free some */
        sreq_t *v = victim(s);
        int n_run = 0;
        for (int k = 0; k < s->n_seq; k++) n_run += s->run[k] != NULL;
        if (v && n_run > 1) preempt(s, v);
    }
    return nb;
}

/* Undo the positions a failed step would have added. */
static void unfeed(ie_sched_t *s, int nb)
{
    for (int i = 0; i < nb; i++)
        if (s->b_req[i]->state == S_PREFILL || s->b_req[i]->state == S_DECODE)
            if ((size_t)s->b_pos[i] < s->b_req[i]->n_fed) s->b_req[i]->n_fed = (size_t)s->b_pos[i];
}

/* Publish the full blocks q's cache now holds. */
static void publish(ie_sched_t *s, sreq_t *q)
{
    while (q->n_pub < q->n_blocks && (size_t)(q->n_pub + 1) * (size_t)s->bt <= q->n_fed) {
        int j = q->n_pub;
        ie_kvpool_publish(s->pool, q->blocks[j], kv_salt(q), j ? q->blocks[j - 1] : -1,
                          q->toks + (size_t)j * s->bt);
        q->n_pub++;
    }
}

/* Finish q normally: flush held text, keep its full blocks for reuse,
 * free its slot. */
static int finish(ie_sched_t *s, sreq_t *q, ie_finish_t why)
{
    int oom = 0;
    if (why != IE_FINISH_STOP) {
        const char *tail = ie_detok_flush(q->detok);
        if (emit_text(q, tail, strlen(tail)) < 0) oom = 1;
        if (q->stop) {
            size_t n = 0;
            if (ie_stop_flush(q->stop, &n) != IE_OK) oom = 1;
            if (n && text_append(q, ie_stop_emit_data(q->stop), n) != 0) oom = 1;
        }
    }
    q->finish = why;
    if (s->prefix_cache) publish(s, q);
    release_slot(s, q);
    if (oom) end_req(s, q, IE_SCHED_ERROR, IE_ERR_NOMEM, "out_of_memory", "out of memory during generation", NULL);
    else end_req(s, q, IE_SCHED_DONE, IE_OK, NULL, NULL, NULL);
    return oom ? -1 : 0;
}

/* Take the sampled token id for q. */
static void take_token(ie_sched_t *s, sreq_t *q, int32_t id, double now)
{
    ie_sampler_accept(q->smp, id);
    q->toks[q->n_toks++] = id;
    const int first = q->fresh;
    if (q->fresh) {
        q->fresh = 0;
        q->t_first = now;
        if (s->m_ttft) ie_metric_observe(s->m_ttft, NULL, (now - q->t_submit) / 1e3);
    } else {
        if (ie_array_grow((void **)&q->lat, &q->lat_cap, q->n_lat + 1, sizeof *q->lat) == 0)
            q->lat[q->n_lat++] = now - q->t_prev;
        if (s->m_lat) ie_metric_observe(s->m_lat, NULL, (now - q->t_prev) / 1e3);
    }
    q->t_prev = now;
    metric_add(s->m_gen, NULL, 1);
    size_t before_len = q->text_len;
    int r = 0;
    ie_finish_t why = IE_FINISH_NONE;
    if (ends_generation(s, q, id)) {
        why = IE_FINISH_EOS;
    } else {
        const char *piece = ie_detok_push(q->detok, id);
        /* the first min_new tokens' text is not matched against the stop
         * strings (vLLM's min_tokens): it bypasses the matcher */
        if (q->n_toks - q->n_prompt <= (size_t)q->min_new) r = text_append(q, piece, strlen(piece)) != 0 ? -1 : 0;
        else r = emit_text(q, piece, strlen(piece));
        if (r > 0) why = IE_FINISH_STOP;
        if (r > 0 && q->include_stop) { /* the stop string itself, which the matcher cut */
            const char *stop = ie_stop_string(q->stop, ie_stop_matched(q->stop));
            if (stop && text_append(q, stop, strlen(stop)) != 0) r = -1;
        } else if ((int)(q->n_toks - q->n_prompt) >= q->max_new) why = IE_FINISH_LENGTH;
        else if (q->n_toks - 1 >= (size_t)s->n_ctx) why = IE_FINISH_CONTEXT;
    }
    if (r < 0) {
        if (s->prefix_cache) publish(s, q);
        release_slot(s, q);
        end_req(s, q, IE_SCHED_ERROR, IE_ERR_NOMEM, "out_of_memory", "out of memory during generation", NULL);
    } else if (why != IE_FINISH_NONE) {
        finish(s, q, why);
    } else {
        q->state = S_DECODE;
    }
    /* after finish: the text it flushes (held-back stop prefixes, an
     * incomplete UTF-8 tail as U+FFFD) goes out with the last token, so the
     * streamed pieces always add up to the final text */
    s->tev[s->n_tev++] = (tok_ev_t){q, id, before_len, q->text_len - before_len, first};
}

/* After a successful step: sample the rows, move prefills on. */
static void advance(ie_sched_t *s, int nb, int has_prefill, double step_ms)
{
    int row = 0, erow = 0; /* logits rows; hidden-state rows */
    double now = ie_now_ms();
    size_t n_pre = 0, n_dec = 0;
    double sample_ms = 0, detok_ms = 0, grammar_ms = 0;
    s->n_tev = 0;
    for (int i = 0; i < nb; i++) {
        sreq_t *q = s->b_req[i];
        q->ran = 1;
        /* a draft counts if the token sampled before it is the draft: then
         * its KV and its row are this request's next; else it and the
         * request's later drafts are dropped */
        if (s->b_draft[i]) {
            if (q->state != S_DECODE || q->spec_miss || q->toks[q->n_toks - 1] != s->b_tok[i]) {
                q->spec_miss = 1;
                row++;
                continue;
            }
            s->st.spec_accepted++;
            metric_add(s->m_spec_ok, NULL, 1);
        }
        if (q->state == S_DECODE) q->n_fed++; /* its decode token is in */
        else n_pre++;
        if (q->pooling != IE_POOL_NONE) { /* an embedding: no logits, nothing sampled */
            const int has = s->b_logits[i] == IE_LOGITS_EMBD;
            embd_take(s, q, (size_t)s->b_pos[i], has ? s->b_embd + (size_t)erow++ * (size_t)s->n_embd : NULL);
            continue;
        }
        if (s->b_logits[i] && plp_flag(q, (size_t)s->b_pos[i]) && q->state == S_PREFILL) {
            plp_take(s, q, (size_t)s->b_pos[i], s->logits + (size_t)row++ * (size_t)s->n_vocab);
            continue;
        }
        if (!s->b_logits[i]) {
            /* a prompt chunk: the last known token of a resumed request
             * (or of one that wants no tokens) ends its prefill */
            if (q->state == S_PREFILL && (size_t)s->b_pos[i] + 1 == q->n_known) {
                if (q->fresh) finish(s, q, IE_FINISH_LENGTH); /* max_new 0 */
                else q->state = S_DECODE;
            }
            continue;
        }
        float *lg = s->logits + (size_t)row++ * (size_t)s->n_vocab;
        int32_t id;
        const int timed = s->o.timing || s->m_stage;
        const double ts = timed ? ie_now_ms() : 0;
        if (q->lp_on) { /* the raw row, before the grammar mask and the sampler's penalties */
            memcpy(s->lp_row, lg, (size_t)s->n_vocab * sizeof *lg);
            q->lp_n = ie_logprobs_row(lg, s->n_vocab, q->lp_k, &q->lp_lse, q->lp_top);
        }
        /* structured output: tokens that would leave the schema's language
         * go to -inf here, before the sampler's chain; its penalties keep
         * -inf at -inf, so this is the same as masking after them */
        ie_status_t sst = q->gm ? ie_gvocab_apply(s->gvocab, q->gm, lg) : IE_OK;
        const double tg = timed ? ie_now_ms() : 0;
        if (q->gm) grammar_ms += tg - ts;
        if (sst == IE_OK && eog_masked(q)) eog_mask(s, q, lg);
        if (sst == IE_OK) sst = ie_sampler_sample(q->smp, lg, &id);
        if (sst == IE_OK && q->gm) sst = ie_gvocab_accept(s->gvocab, q->gm, id);
        if (sst == IE_OK && q->lp_on) q->lp_tok = ie_logprobs_of(s->lp_row[id], q->lp_lse);
        const double td = timed ? ie_now_ms() : 0;
        sample_ms += td - ts;
        if (sst != IE_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", ie_error_last());
            release_slot(s, q);
            end_req(s, q, IE_SCHED_ERROR, IE_ERR_INTERNAL, "internal", "%s", why);
            continue;
        }
        if (!has_prefill) n_dec++;
        take_token(s, q, id, now);
        if (timed) detok_ms += ie_now_ms() - td; /* text, stop strings, events */
    }
    /* refused drafts: the backend holds their positions; the request's
     * length is what it accepted */
    for (int i = 0; i < nb; i++) {
        sreq_t *q = s->b_req[i];
        if (!s->b_draft[i] || q->spec_miss != 1) continue;
        q->spec_miss = 2;
        if (q->state != S_DECODE || q->slot < 0) continue;
        if (ie_backend_seq_set_len(s->be, q->slot, (int)q->n_fed) != IE_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", ie_error_last());
            release_slot(s, q);
            end_req(s, q, IE_SCHED_ERROR, IE_ERR_INTERNAL, "internal", "%s", why);
        }
    }
    if (s->prefix_cache)
        for (int k = 0; k < s->n_seq; k++)
            if (s->run[k]) publish(s, s->run[k]);
    measure_step(s, (int)n_pre, nb, step_ms);
    if (s->m_stage) {
        ie_metric_observe(s->m_stage, has_prefill ? "prefill" : "decode", step_ms / 1e3);
        ie_metric_observe(s->m_stage, "sample", sample_ms / 1e3);
        if (grammar_ms > 0) ie_metric_observe(s->m_stage, "grammar", grammar_ms / 1e3); /* part of sample */
        ie_metric_observe(s->m_stage, "detokenize", detok_ms / 1e3);
    }
    if (s->o.timing) {
        s->o.timing->sample_ms += sample_ms;
        s->o.timing->detok_ms += detok_ms;
        if (has_prefill) {
            s->o.timing->prefill_ms += step_ms;
            s->o.timing->prefill_tokens += n_pre;
        } else {
            s->o.timing->decode_ms += step_ms;
            s->o.timing->decode_tokens += n_dec;
        }
    }
}

/* A failed step: a lost worker requeues (retry) or ends the running
 * requests; any other failure ends the requests of the step. */
static void step_failed(ie_sched_t *s, ie_status_t st, int nb, double now, int was_ready)
{
    char why[256];
    snprintf(why, sizeof why, "%s", ie_error_last());
    unfeed(s, nb);
    if (st == IE_ERR_UNAVAILABLE) ie_kvpool_forget(s->pool); /* a new worker holds no K/V */
    const char *code = st == IE_ERR_UNAVAILABLE || st == IE_ERR_TIMEOUT ? "unavailable"
                       : st == IE_ERR_NOMEM                             ? "out_of_memory"
                                                                        : "internal";
    for (int k = 0; k < s->n_seq; k++) {
        sreq_t *q = s->run[k];
        int in_step = 0;
        for (int i = 0; q && i < nb && !in_step; i++) in_step = s->b_req[i] == q;
        if (!q || (st != IE_ERR_UNAVAILABLE && !in_step)) continue;
        /* a request that never ran on a ready backend waits for nothing:
         * with no worker there is no loss to recover from, and the docs
         * promise "unavailable" at once */
        const int never = !was_ready && !q->ran && q->hold_until == 0;
        if (st == IE_ERR_UNAVAILABLE && s->o.retry_ms > 0 && !never &&
            (q->hold_until == 0 || now < q->hold_until)) {
            if (q->hold_until == 0) q->hold_until = now + s->o.retry_ms; /* the window opens at the first loss */
            q->not_before = now + 250;
            preempt(s, q);
        } else {
            release_slot(s, q);
            end_req(s, q, IE_SCHED_ERROR, st, code, "%s", why);
        }
    }
}

static void update_gauges(ie_sched_t *s)
{
    ie_kvpool_stats_t ps;
    ie_kvpool_stats(s->pool, &ps);
    int running = 0;
    for (int k = 0; k < s->n_seq; k++) running += s->run[k] != NULL;
    s->st.running = running;
    s->st.kv_used = ps.used;
    s->st.ready = backend_ready(s);
    s->st.kv_cached = ps.cached;
    if (s->m_kv_used) ie_metric_set(s->m_kv_used, NULL, ps.used);
    if (s->m_kv_cached) ie_metric_set(s->m_kv_cached, NULL, ps.cached);
    if (s->m_kv_ratio) ie_metric_set(s->m_kv_ratio, NULL, ps.n_blocks ? (double)ps.used / ps.n_blocks : 0);
    if (s->m_queued) ie_metric_set(s->m_queued, NULL, s->n_queue);
    if (s->m_running) ie_metric_set(s->m_running, NULL, running);
}

/* Will the step after this one likely be the same requests, one position
 * on (ie_backend_hint_next)? Not when a prompt is in it or a request
 * waits to join, nor when one ends by length with this step's token. */
static int lookahead_ok(const ie_sched_t *s, int nb, int has_prefill)
{
    if (has_prefill || s->n_queue > 0) return 0;
    for (int i = 0; i < nb; i++) {
        const sreq_t *q = s->b_req[i];
        if (s->b_draft[i]) return 0; /* the next step depends on what this one accepts */
        if ((int)(q->n_toks + 1 - q->n_prompt) >= q->max_new || q->n_toks + 1 >= (size_t)s->n_ctx) return 0;
    }
    return 1;
}

ie_status_t ie_sched_step(ie_sched_t *s, int *busy_out)
{
    double now = ie_now_ms();
    int has_prefill = 0, nb = 0;
    pthread_mutex_lock(&s->mu);
    s->pending = 0;
    s->n_ended = 0;
    s->n_tev = 0;
    reap(s, now);
    admit(s, now);
    nb = build(s, &has_prefill);
    const int ahead = nb > 0 && lookahead_ok(s, nb, has_prefill);
    const int was_ready = backend_ready(s);
    pthread_mutex_unlock(&s->mu);

    if (nb > 0) {
        int any_ad = 0;
        for (int i = 0; i < nb; i++) any_ad |= (s->b_ad[i] = s->b_req[i]->adapter) >= 0;
        ie_batch_t b = {nb, s->b_tok, s->b_pos, s->b_seq, s->b_logits, any_ad ? s->b_ad : NULL, s->b_embd};
        ie_backend_hint_next(s->be, ahead);
        double t0 = ie_now_ms();
        ie_status_t st = ie_backend_step(s->be, &b, s->logits);
        double t1 = ie_now_ms();
        pthread_mutex_lock(&s->mu);
        if (st == IE_OK) advance(s, nb, has_prefill, t1 - t0);
        else step_failed(s, st, nb, t1, was_ready);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    update_gauges(s);
    int running = s->st.running;
    pthread_mutex_unlock(&s->mu);

    for (int i = 0; i < s->n_tev; i++) {
        tok_ev_t *t = &s->tev[i];
        ie_sched_event_t ev = {.kind = IE_SCHED_TOKEN,
                               .id = t->q->id,
                               .user = t->q->cb_ctx,
                               .token = t->id,
                               .text = t->q->text + t->off,
                               .len = t->len,
                               .has_logprob = t->q->lp_on,
                               .logprob = t->q->lp_tok,
                               .top = t->q->lp_on ? t->q->lp_top : NULL,
                               .n_top = t->q->lp_on ? t->q->lp_n : 0};
        if (t->first && t->q->plp) { /* known since the prefill: a stream may show them first */
            ev.prompt_lp = t->q->plp;
            ev.prompt_top = t->q->plp_top;
            ev.prompt_k = t->q->plp_k;
            ev.n_prompt = t->q->n_prompt;
        }
        t->q->cb(t->q->cb_ctx, &ev);
    }
    int n_ended = s->n_ended;
    s->n_tev = 0;
    deliver_ended(s, s->ended, n_ended);
    s->n_ended = 0;
    if (busy_out) *busy_out = nb > 0 || n_ended > 0 || running > 0;
    return IE_OK;
}
