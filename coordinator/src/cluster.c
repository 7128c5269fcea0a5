/* cluster.c — the coordinator's side of the distributed service
 * (ie_cluster.h): membership by rank, epochs, heartbeats, and steps whose
 * logits come back from the ranks holding the output head.
 *
 * KV-cache operations (slot clears, block binds, lengths) are checked when
 * called and queued, in call order, as one frame of the next STEP
 * (ie_proto.h "KV operations"); every rank applies them before the step. */
#include "ie_cluster.h"
#include "ie_clock.h"

#include "ie_proto.h"
#include "ie_sampler.h"
#include "ie_sdnotify.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { M_EMPTY = 0, M_LOADING, M_READY, M_FAILED } mstate_t;

typedef struct member {
    mstate_t state;
    char ident[256]; /* routing id of the worker's main socket        */
    size_t ident_len;
    ie_msg_hello_t hello;
    uint64_t assigned_epoch;
    double last_seen;
    char error[IE_PROTO_TEXT_MAX];
    ie_status_t status;  /* M_FAILED: the worker's load status         */
} member_t;

struct ie_cluster {
    ie_cluster_opts_t o;
    const ie_model_src_t *src;
    ie_hparams_t hp;
    uint64_t fp;
    ie_shard_range_t range[IE_PROTO_MAX_RANKS];
    ie_sock_t *router;
    char endpoint[IE_PROTO_ENDPOINT_MAX];
    member_t m[IE_PROTO_MAX_RANKS];
    uint64_t epoch, step;
    uint64_t cluster_id; /* random, in every ASSIGN: names the ranks' shared-memory segments */
    int kv_nlb, kv_pool;  /* logical blocks per slot, blocks in the pool   */
    ie_buf_t kv;         /* queued KV operations (ie_kv_ops_append)       */
    size_t kv_ids;       /* block ids in them                             */
    ie_status_t kv_lost; /* a clear that could not be queued: fail the next step */
    ie_parts_t in;
    ie_buf_t hdr;
    ie_msg_t assign_msg;
    double last_hb;
    uint8_t *flags;      /* logits flags when the batch has none      */
    int flags_cap;
    ie_cluster_stats_t stats;
    ie_metric_t *m_up, *m_step;
    uint64_t wd_us;      /* systemd watchdog interval (0: none)      */
    double last_wd;
    /* the step being waited for */
    int waiting;
    int got[IE_PROTO_MAX_RANKS];
    ie_status_t step_st;
    char step_err[IE_PROTO_TEXT_MAX];
    float *logits_out;
    int rows;
    const uint8_t *sent_flags; /* the step's logits flags (ie_worker.h)  */
    int sent_n;
    float *am_val;             /* per flagged row: the best (max, id) of */
    int32_t *am_id;            /* the ranks' ARGMAX answers so far       */
    int am_cap;
};

static void clog_(const ie_cluster_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void clog_(const ie_cluster_t *c, const char *fmt, ...)
{
    (void)c;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ie-coordinator: %s\n", line);
}

static void set_up(ie_cluster_t *c, int r, int up)
{
    if (!c->m_up) return;
    char l[16];
    snprintf(l, sizeof l, "%d", r);
    ie_metric_set(c->m_up, l, up);
}

/* Send header m (+ frames) to member r's main socket. */
static ie_status_t send_to(ie_cluster_t *c, const char *ident, size_t ident_len, const ie_msg_t *m,
                           const ie_frame_t *extra, int n_extra)
{
    ie_status_t st = ie_msg_encode(m, &c->hdr);
    if (st != IE_OK) return st;
    ie_frame_t f[8];
    f[0] = (ie_frame_t){ident, ident_len};
    f[1] = (ie_frame_t){c->hdr.data, c->hdr.len};
    size_t bytes = c->hdr.len;
    for (int i = 0; i < n_extra && i < 6; i++) {
        f[i + 2] = extra[i];
        bytes += extra[i].size;
    }
    st = ie_sock_send(c->router, f, 2 + n_extra, 1000);
    if (st == IE_OK) c->stats.bytes_sent += bytes;
    return st;
}

static void send_error(ie_cluster_t *c, const char *ident, size_t ident_len, ie_status_t code, const char *msg)
{
    ie_msg_t m = {.kind = IE_MSG_ERROR};
    m.u.error.code = code;
    snprintf(m.u.error.message, sizeof m.u.error.message, "%s", msg);
    send_to(c, ident, ident_len, &m, NULL, 0);
}

static void send_assign(ie_cluster_t *c, int r)
{
    ie_msg_t *m = &c->assign_msg; /* large (the peer table): kept, not on the stack */
    memset(m, 0, sizeof *m);
    m->kind = IE_MSG_ASSIGN;
    ie_msg_assign_t *a = &m->u.assign;
    a->epoch = c->epoch;
    a->plan = c->o.plan;
    a->rank = r;
    a->n_ranks = c->o.n_ranks;
    a->n_ctx = c->o.n_ctx;
    a->n_seq = c->o.n_seq;
    a->max_batch = c->o.max_batch;
    a->kv_block = c->o.kv_block;
    a->kv_blocks = c->o.kv_blocks;
    a->precision = c->o.precision;
    a->heartbeat_ms = c->o.heartbeat_ms;
    a->dead_ms = c->o.dead_ms;
    a->cluster_id = c->cluster_id;
    for (int k = 0; k < c->o.n_ranks; k++) {
        snprintf(a->peer_endpoint[k], sizeof a->peer_endpoint[k], "%s", c->m[k].hello.peer_endpoint);
        snprintf(a->peer_key[k], sizeof a->peer_key[k], "%s", c->m[k].hello.public_key);
    }
    member_t *mb = &c->m[r];
    mb->assigned_epoch = c->epoch;
    mb->state = M_LOADING;
    if (send_to(c, mb->ident, mb->ident_len, m, NULL, 0) != IE_OK)
        clog_(c, "cannot send the assignment to rank %d: %s", r, ie_error_last());
}

/* Membership changed: a new epoch, every member re-assigned once all
 * ranks are filled (peers need the whole table). */
static void replan(ie_cluster_t *c)
{
    c->epoch++;
    for (int r = 0; r < c->o.n_ranks; r++)
        if (c->m[r].state == M_EMPTY) return; /* wait for the rest */
    for (int r = 0; r < c->o.n_ranks; r++) send_assign(c, r);
}

int ie_cluster_ready(const ie_cluster_t *c)
{
    for (int r = 0; r < c->o.n_ranks; r++)
        if (c->m[r].state != M_READY || c->m[r].assigned_epoch != c->epoch) return 0;
    return 1;
}

static void lose(ie_cluster_t *c, int r, const char *why)
{
    member_t *mb = &c->m[r];
    clog_(c, "worker rank %d (pid %d on %s) lost: %s", r, mb->hello.pid, mb->hello.host, why);
    if (c->waiting && c->step_st == IE_OK) {
        c->step_st = IE_ERR_UNAVAILABLE;
        snprintf(c->step_err, sizeof c->step_err, "worker rank %d (pid %d on %s) lost: %s", r, mb->hello.pid,
                 mb->hello.host, why);
    }
    memset(mb, 0, sizeof *mb);
    set_up(c, r, 0);
}

static int find_ident(const ie_cluster_t *c, const void *id, size_t n)
{
    for (int r = 0; r < c->o.n_ranks; r++)
        if (c->m[r].state != M_EMPTY && c->m[r].ident_len == n && !memcmp(c->m[r].ident, id, n)) return r;
    return -1;
}

static void on_hello(ie_cluster_t *c, const void *id, size_t idn, const ie_msg_hello_t *h)
{
    char why[IE_PROTO_TEXT_MAX];
    if (h->model_fp != c->fp) {
        snprintf(why, sizeof why, "model mismatch: the worker's model (fingerprint %016llx) is not the "
                 "coordinator's (%016llx)", (unsigned long long)h->model_fp, (unsigned long long)c->fp);
        clog_(c, "refused pid %d on %s: %s", h->pid, h->host, why);
        send_error(c, id, idn, IE_ERR_INVAL, why);
        return;
    }
    if (idn > sizeof c->m[0].ident) return;
    int known = find_ident(c, id, idn);
    if (known >= 0) { /* it lost us (or the assignment): say it again */
        c->m[known].hello = *h;
        c->m[known].last_seen = ie_now_ms();
        int full = 1; /* all ranks filled: re-send its assignment */
        for (int r = 0; r < c->o.n_ranks; r++) full &= c->m[r].state != M_EMPTY;
        if (full) send_assign(c, known);
        return;
    }
    int r = -1;
    if (h->rank >= 0) {
        if (h->rank >= c->o.n_ranks) {
            snprintf(why, sizeof why, "rank %d asked for, but the %s plan has %d ranks", h->rank,
                     ie_shard_kind_name(c->o.plan), c->o.n_ranks);
            send_error(c, id, idn, IE_ERR_INVAL, why);
            clog_(c, "refused pid %d on %s: %s", h->pid, h->host, why);
            return;
        }
        if (c->m[h->rank].state != M_EMPTY) {
            snprintf(why, sizeof why, "rank %d is held by pid %d on %s", h->rank, c->m[h->rank].hello.pid,
                     c->m[h->rank].hello.host);
            send_error(c, id, idn, IE_ERR_BUSY, why);
            clog_(c, "refused pid %d on %s: %s", h->pid, h->host, why);
            return;
        }
        r = h->rank;
    } else {
        for (int k = 0; k < c->o.n_ranks && r < 0; k++)
            if (c->m[k].state == M_EMPTY) r = k;
        if (r < 0) {
            snprintf(why, sizeof why, "all %d ranks are taken", c->o.n_ranks);
            send_error(c, id, idn, IE_ERR_BUSY, why);
            clog_(c, "refused pid %d on %s: %s", h->pid, h->host, why);
            return;
        }
    }
    member_t *mb = &c->m[r];
    memset(mb, 0, sizeof *mb);
    memcpy(mb->ident, id, idn);
    mb->ident_len = idn;
    mb->hello = *h;
    mb->state = M_LOADING;
    mb->last_seen = ie_now_ms();
    if (c->o.verbose)
        clog_(c, "worker pid %d on %s (node %d, %d threads, peers at %s) takes rank %d; %s", h->pid, h->host,
              h->numa_node, h->n_threads, h->peer_endpoint, r, h->topology);
    replan(c);
}

static void on_ready(ie_cluster_t *c, int r, const ie_msg_ready_t *rd)
{
    if (r < 0 || rd->rank != r || rd->epoch != c->epoch) return; /* stale */
    member_t *mb = &c->m[r];
    if (rd->status != IE_OK) {
        mb->state = M_FAILED;
        mb->status = (ie_status_t)rd->status;
        snprintf(mb->error, sizeof mb->error, "%s", rd->error);
        if (c->o.verbose) clog_(c, "rank %d could not load its shard: %s", r, rd->error);
        return;
    }
    mb->state = M_READY;
    set_up(c, r, 1);
    if (c->o.verbose) clog_(c, "rank %d ready (%.1f MB of weights, %.0f ms)", r, rd->weight_bytes / 1e6, rd->load_ms);
}

static void on_result(ie_cluster_t *c, const ie_msg_result_t *res)
{
    if (!c->waiting || res->epoch != c->epoch || res->step != c->step) return; /* stale */
    if (res->rank < 0 || res->rank >= c->o.n_ranks) return;
    if (res->status != IE_OK) {
        if (c->step_st == IE_OK) {
            c->step_st = res->status == IE_ERR_RANGE || res->status == IE_ERR_INVAL ? (ie_status_t)res->status
                                                                                     : IE_ERR_UNAVAILABLE;
            snprintf(c->step_err, sizeof c->step_err, "%s", res->error);
        }
        c->got[res->rank] = 1;
        return;
    }
    const ie_shard_range_t *sr = &c->range[res->rank];
    const int bad = !sr->has_head || res->n_rows != c->rows || res->vocab_begin != sr->vocab_begin ||
                    res->vocab_end != sr->vocab_end || c->in.n != 3;
    if (bad || ie_result_logits_merge(c->in.data[2], c->in.size[2], c->sent_flags, c->sent_n, sr->vocab_begin,
                                      sr->vocab_end, c->hp.n_vocab, c->logits_out, c->am_val, c->am_id) != IE_OK) {
        if (c->step_st == IE_OK) {
            c->step_st = IE_ERR_FORMAT;
            snprintf(c->step_err, sizeof c->step_err, "rank %d sent a malformed result%s%s", res->rank,
                     bad ? "" : ": ", bad ? "" : ie_error_last());
        }
        c->got[res->rank] = 1;
        return;
    }
    c->got[res->rank] = 1;
    c->stats.compute_ms += res->compute_ms;
    c->stats.transfer_ms += res->transfer_ms;
}

/* Read and act on one message already received into c->in. */
static void handle(ie_cluster_t *c)
{
    if (c->in.n < 2) return;
    const void *id = c->in.data[0];
    size_t idn = c->in.size[0];
    size_t bytes = 0;
    for (int i = 1; i < c->in.n; i++) bytes += c->in.size[i];
    c->stats.bytes_received += bytes;
    ie_msg_t m;
    if (ie_msg_decode(c->in.data[1], c->in.size[1], &m) != IE_OK) {
        char why[IE_PROTO_TEXT_MAX];
        snprintf(why, sizeof why, "malformed message: %s", ie_error_last());
        clog_(c, "%s", why);
        send_error(c, id, idn, IE_ERR_FORMAT, why);
        return;
    }
    int r = find_ident(c, id, idn);
    if (r >= 0) c->m[r].last_seen = ie_now_ms();
    switch (m.kind) {
    case IE_MSG_HELLO: on_hello(c, id, idn, &m.u.hello); break;
    case IE_MSG_READY: on_ready(c, r, &m.u.ready); break;
    case IE_MSG_RESULT: on_result(c, &m.u.result); break;
    case IE_MSG_HEARTBEAT: {
        int k = m.u.heartbeat.rank;
        if (k >= 0 && k < c->o.n_ranks && c->m[k].state != M_EMPTY &&
            (m.u.heartbeat.epoch == c->m[k].assigned_epoch || m.u.heartbeat.epoch == c->epoch))
            c->m[k].last_seen = ie_now_ms();
        break;
    }
    case IE_MSG_BYE:
        if (r >= 0) lose(c, r, "it said bye");
        break;
    case IE_MSG_ERROR: clog_(c, "worker says: %s", m.u.error.message); break;
    default: {
        char why[128];
        snprintf(why, sizeof why, "unexpected %s message", ie_msg_kind_name(m.kind));
        send_error(c, id, idn, IE_ERR_FORMAT, why);
        break;
    }
    }
}

/* Heartbeats out, silent members lost. */
static void tick(ie_cluster_t *c)
{
    double t = ie_now_ms();
    /* the coordinator's loop is alive as long as it ticks, steps included */
    if (c->wd_us && t - c->last_wd >= c->wd_us / 2000.0) {
        ie_sd_watchdog();
        c->last_wd = t;
    }
    if (t - c->last_hb >= c->o.heartbeat_ms) {
        c->last_hb = t;
        ie_msg_t m = {.kind = IE_MSG_HEARTBEAT};
        m.u.heartbeat.epoch = c->epoch;
        m.u.heartbeat.rank = -1;
        for (int r = 0; r < c->o.n_ranks; r++)
            if (c->m[r].state != M_EMPTY) send_to(c, c->m[r].ident, c->m[r].ident_len, &m, NULL, 0);
    }
    for (int r = 0; r < c->o.n_ranks; r++) {
        if (c->m[r].state == M_EMPTY || t - c->m[r].last_seen <= c->o.dead_ms) continue;
        char why[64];
        snprintf(why, sizeof why, "silent for %.1f s", (t - c->m[r].last_seen) / 1e3);
        lose(c, r, why);
    }
}

/* Poll once (up to timeout_ms) and handle what came. */
static void pump(ie_cluster_t *c, int timeout_ms)
{
    int ready = 0;
    int hb_left = (int)(c->o.heartbeat_ms - (ie_now_ms() - c->last_hb));
    if (hb_left < timeout_ms) timeout_ms = hb_left > 0 ? hb_left : 0;
    if (ie_sock_poll(&c->router, 1, &ready, timeout_ms) > 0 && ready) {
        /* drain what is there without blocking */
        for (int k = 0; k < 64 && ie_sock_recv(c->router, &c->in, 0) == IE_OK; k++) handle(c);
    }
    tick(c);
}

ie_status_t ie_cluster_new(const ie_cluster_opts_t *o, const ie_model_src_t *src, ie_cluster_t **out)
{
    ie_status_t st = IE_OK;
    *out = NULL;
    if (!o || !src || !o->net || !o->bind)
        return ie_error_set(IE_ERR_INVAL, "cluster: bind endpoint, net and model are required");
    if (o->n_ranks < 1 || o->n_ranks > IE_PROTO_MAX_RANKS || o->n_seq < 1 || o->n_ctx < 1 || o->max_batch < 1 ||
        o->kv_block < 0 || o->kv_blocks < 0)
        return ie_error_set(IE_ERR_INVAL,
                            "cluster: bad options (%d workers, %d sequences, ctx %d, batch %d, KV blocks %d of %d)",
                            o->n_ranks, o->n_seq, o->n_ctx, o->max_batch, o->kv_blocks, o->kv_block);
    if (o->plan != IE_SHARD_PIPELINE && o->plan != IE_SHARD_TENSOR)
        return ie_error_set(IE_ERR_INVAL, "cluster: the plan must be pipeline or tensor");
    ie_cluster_t *c = calloc(1, sizeof *c);
    if (!c) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    c->o = *o;
    if (c->o.heartbeat_ms <= 0) c->o.heartbeat_ms = 250;
    if (c->o.dead_ms <= 0) c->o.dead_ms = 2000;
    c->src = src;
    c->hp = *ie_model_src_hparams(src);
    c->fp = ie_model_src_fingerprint(src);
    /* one id per cluster: ranks of clusters that share a host (parallel
     * tests, two services) never open each other's segments */
    while (c->cluster_id == 0) c->cluster_id = ie_sampler_seed_random();
    /* the workers' pool (ie_worker_new's defaults), for checking binds */
    {
        const int kb = o->kv_block > 0 ? o->kv_block : 16;
        const int64_t nlb = ((int64_t)o->n_ctx + kb - 1) / kb, full = nlb * o->n_seq;
        if (o->kv_blocks == 0 && full > INT32_MAX) {
            st = ie_error_set(IE_ERR_INVAL, "cluster: %d slots of %lld KV blocks do not fit a block id", o->n_seq,
                              (long long)nlb);
            goto cleanup;
        }
        c->kv_nlb = (int)nlb;
        c->kv_pool = o->kv_blocks > 0 ? o->kv_blocks : (int)full;
    }
    for (int r = 0; r < o->n_ranks; r++) {
        ie_shard_t s = {o->plan, r, o->n_ranks};
        if ((st = ie_shard_plan(&c->hp, &s, &c->range[r])) != IE_OK) goto cleanup;
    }
    if ((st = ie_sock_new(o->net, IE_SOCK_ROUTER, &c->router)) != IE_OK) goto cleanup;
    if ((st = ie_sock_bind(c->router, o->bind, c->endpoint, sizeof c->endpoint)) != IE_OK) goto cleanup;
    if (o->metrics)
        ie_metrics_gauge(o->metrics, "ie_worker_up", "1 while the worker of this rank is registered and ready",
                         "worker", &c->m_up);
    if (o->metrics) {
        static const double sb[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
        ie_metrics_histogram(o->metrics, "ie_step_seconds", "Wall time of one step across the workers", NULL, sb,
                             10, &c->m_step);
    }
    for (int r = 0; r < o->n_ranks; r++) set_up(c, r, 0);
    c->last_hb = ie_now_ms();
    c->wd_us = ie_sd_watchdog_usec();

cleanup:
    if (st != IE_OK) {
        ie_cluster_destroy(&c);
        return st;
    }
    *out = c;
    return IE_OK;
}

void ie_cluster_destroy(ie_cluster_t **c_p)
{
    if (!c_p || !*c_p) return;
    ie_cluster_t *c = *c_p;
    if (c->router) {
        ie_msg_t m = {.kind = IE_MSG_BYE};
        for (int r = 0; r < c->o.n_ranks; r++)
            if (c->m[r].state != M_EMPTY) send_to(c, c->m[r].ident, c->m[r].ident_len, &m, NULL, 0);
    }
    ie_sock_destroy(&c->router);
    ie_parts_free(&c->in);
    ie_buf_free(&c->hdr);
    ie_buf_free(&c->kv);
    free(c->flags);
    free(c->am_val);
    free(c->am_id);
    free(c);
    *c_p = NULL;
}

const char *ie_cluster_endpoint(const ie_cluster_t *c) { return c->endpoint; }

int ie_cluster_service(ie_cluster_t *c, int timeout_ms)
{
    double end = ie_now_ms() + timeout_ms;
    do {
        int left = (int)(end - ie_now_ms());
        pump(c, left > 0 ? left : 0);
        if (ie_cluster_ready(c)) return 1;
    } while (ie_now_ms() < end);
    return ie_cluster_ready(c);
}

void ie_cluster_describe(const ie_cluster_t *c, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int r = 0; r < c->o.n_ranks && len < cap; r++) {
        const member_t *mb = &c->m[r];
        static const char *names[] = {"empty", "loading", "ready", "failed"};
        int n = mb->state == M_EMPTY
                    ? snprintf(out + len, cap - len, "%srank %d: empty", r ? "; " : "", r)
                    : snprintf(out + len, cap - len, "%srank %d: pid %d on %s, node %d, %s%s%s", r ? "; " : "", r,
                               mb->hello.pid, mb->hello.host, mb->hello.numa_node, names[mb->state],
                               mb->state == M_FAILED ? ": " : "", mb->state == M_FAILED ? mb->error : "");
        if (n < 0) break;
        len += (size_t)n;
    }
}

ie_status_t ie_cluster_wait_ready(ie_cluster_t *c, int timeout_ms)
{
    double end = ie_now_ms() + timeout_ms;
    while (!ie_cluster_service(c, 50) && ie_now_ms() < end) {
        /* a shard that failed to load will not load by waiting: say why */
        for (int r = 0; r < c->o.n_ranks; r++)
            if (c->m[r].state == M_FAILED && c->m[r].assigned_epoch == c->epoch)
                return ie_error_set(c->m[r].status != IE_OK ? c->m[r].status : IE_ERR_INTERNAL, "%s",
                                    c->m[r].error);
    }
    if (ie_cluster_ready(c)) return IE_OK;
    char d[1024];
    ie_cluster_describe(c, d, sizeof d);
    return ie_error_set(IE_ERR_TIMEOUT, "cluster not ready after %.1f s (%s plan, %d workers): %s",
                        timeout_ms / 1e3, ie_shard_kind_name(c->o.plan), c->o.n_ranks, d);
}

/* Queue one KV operation of `words` words carrying `ids` block ids, within
 * one step's limits (IE_ERR_RANGE naming them) or IE_ERR_NOMEM. */
static ie_status_t kv_queue(ie_cluster_t *c, const ie_kv_op_t *op, size_t words, size_t ids)
{
    if (c->kv_ids + ids > IE_PROTO_KV_IDS_MAX || c->kv.len / 4 + words > IE_PROTO_KV_WORDS_MAX)
        return ie_error_set(IE_ERR_RANGE,
                            "cluster: one step carries at most %d KV block ids (%d words of operations); %zu ids "
                            "(%zu words) are queued already: run a step before queueing more",
                            IE_PROTO_KV_IDS_MAX, IE_PROTO_KV_WORDS_MAX, c->kv_ids, c->kv.len / 4);
    ie_status_t st = ie_kv_ops_append(&c->kv, op);
    if (st == IE_OK) c->kv_ids += ids;
    return st;
}

void ie_cluster_seq_clear(ie_cluster_t *c, int seq)
{
    if (seq < 0 || seq >= c->o.n_seq) return; /* as ie_worker_seq_clear */
    const ie_kv_op_t op = {.kind = IE_KV_OP_CLEAR, .seq = seq};
    ie_status_t st = kv_queue(c, &op, 2, 0);
    if (st != IE_OK && c->kv_lost == IE_OK) c->kv_lost = st; /* no status to return: the next step fails */
}

/* Contract (ie_cluster.h): the worker's argument checks, here. */
ie_status_t ie_cluster_kv_bind(ie_cluster_t *c, int seq, int first, const int32_t *pb, int n)
{
    if (seq < 0 || seq >= c->o.n_seq)
        return ie_error_set(IE_ERR_RANGE, "cluster: KV bind: slot %d out of range [0, %d)", seq, c->o.n_seq);
    if (first < 0 || n < 0 || (int64_t)first + n > c->kv_nlb || (n > 0 && !pb))
        return ie_error_set(IE_ERR_RANGE, "cluster: KV bind: logical blocks %d..%lld of slot %d outside [0, %d)",
                            first, (long long)first + n - 1, seq, c->kv_nlb);
    for (int i = 0; i < n; i++)
        if (pb[i] < -1 || pb[i] >= c->kv_pool)
            return ie_error_set(IE_ERR_RANGE, "cluster: KV bind: physical block %d outside the pool [0, %d)", pb[i],
                                c->kv_pool);
    const ie_kv_op_t op = {.kind = IE_KV_OP_BIND, .seq = seq, .first = first, .n = n, .pb = pb};
    return kv_queue(c, &op, 4 + (size_t)n, (size_t)n);
}

ie_status_t ie_cluster_seq_set_len(ie_cluster_t *c, int seq, int n_pos)
{
    if (seq < 0 || seq >= c->o.n_seq)
        return ie_error_set(IE_ERR_RANGE, "cluster: set length: slot %d out of range [0, %d)", seq, c->o.n_seq);
    if (n_pos < 0 || n_pos > c->o.n_ctx)
        return ie_error_set(IE_ERR_RANGE, "cluster: set length: %d positions (0..%d)", n_pos, c->o.n_ctx);
    const ie_kv_op_t op = {.kind = IE_KV_OP_SET_LEN, .seq = seq, .n = n_pos};
    return kv_queue(c, &op, 3, 0);
}

ie_status_t ie_cluster_step(ie_cluster_t *c, const ie_batch_t *b, float *logits_out)
{
    double t0 = ie_now_ms();
    if (b->n < 1 || b->n > c->o.max_batch)
        return ie_error_set(IE_ERR_INVAL, "cluster: batch of %d tokens (max %d)", b->n, c->o.max_batch);
    if (!ie_cluster_ready(c)) {
        /* a moment's grace for a worker re-registering after a restart */
        ie_cluster_service(c, 0);
        if (!ie_cluster_ready(c)) {
            char d[1024];
            ie_cluster_describe(c, d, sizeof d);
            return ie_error_set(IE_ERR_UNAVAILABLE, "cluster not ready: %s", d);
        }
    }
    if (c->kv_lost != IE_OK) { /* a slot clear was not queued: the caller's picture is wrong */
        ie_status_t lost = c->kv_lost;
        c->kv_lost = IE_OK;
        ie_buf_reset(&c->kv);
        c->kv_ids = 0;
        return ie_error_set(lost, "cluster: a slot clear could not be queued (too many KV operations before one "
                            "step); the queued KV operations were dropped");
    }
    const uint8_t *flags = b->logits;
    if (!flags) { /* as ie_worker_step: the last token only */
        if (c->flags_cap < b->n) {
            uint8_t *p = realloc(c->flags, (size_t)b->n);
            if (!p) return ie_error_set(IE_ERR_NOMEM, "out of memory");
            c->flags = p;
            c->flags_cap = b->n;
        }
        memset(c->flags, 0, (size_t)b->n);
        c->flags[b->n - 1] = 1;
        flags = c->flags;
    }
    int rows = 0;
    for (int i = 0; i < b->n; i++) rows += flags[i] != 0;
    if (c->am_cap < rows) {
        float *v = realloc(c->am_val, (size_t)rows * sizeof *v);
        if (v) c->am_val = v;
        int32_t *d = realloc(c->am_id, (size_t)rows * sizeof *d);
        if (d) c->am_id = d;
        if (!v || !d) return ie_error_set(IE_ERR_NOMEM, "out of memory");
        c->am_cap = rows;
    }
    for (int i = 0; i < rows; i++) {
        c->am_val[i] = -INFINITY;
        c->am_id[i] = -1;
    }

    ie_msg_t m = {.kind = IE_MSG_STEP};
    m.u.step.epoch = c->epoch;
    m.u.step.step = ++c->step;
    m.u.step.n = b->n;
    m.u.step.kv_words = (int32_t)(c->kv.len / 4);
    const size_t n4 = (size_t)b->n * 4;
    ie_frame_t f[5] = {{b->tokens, n4}, {b->pos, n4}, {b->seq, n4}, {flags, (size_t)b->n}, {c->kv.data, c->kv.len}};
    memset(c->got, 0, sizeof c->got);
    c->waiting = 1;
    c->step_st = IE_OK;
    c->step_err[0] = '\0';
    c->logits_out = logits_out;
    c->rows = rows;
    c->sent_flags = flags;
    c->sent_n = b->n;
    const int tensor = c->o.plan == IE_SHARD_TENSOR;
    for (int r = 0; r < c->o.n_ranks; r++) {
        if (!tensor && r > 0) break;
        if (send_to(c, c->m[r].ident, c->m[r].ident_len, &m, f, 5) != IE_OK && c->step_st == IE_OK) {
            c->step_st = IE_ERR_UNAVAILABLE;
            snprintf(c->step_err, sizeof c->step_err, "cannot reach worker rank %d: %s", r, ie_error_last());
        }
    }
    /* sent everywhere: the operations are the workers' now (applied even if
     * the step then fails); a failed send keeps them for the next step */
    if (c->step_st == IE_OK) {
        ie_buf_reset(&c->kv);
        c->kv_ids = 0;
    }
    /* wait for the head ranks (all tensor ranks; the last stage) */
    while (c->step_st == IE_OK) {
        int done = 1;
        for (int r = 0; r < c->o.n_ranks; r++)
            if (c->range[r].has_head && (tensor || r == c->o.n_ranks - 1) && !c->got[r]) done = 0;
        if (done) break;
        pump(c, c->o.heartbeat_ms);
    }
    c->waiting = 0;
    if (c->step_st == IE_OK) ie_result_logits_finish(flags, b->n, c->hp.n_vocab, c->am_val, c->am_id, logits_out);
    c->stats.steps++;
    c->stats.step_ms += ie_now_ms() - t0;
    if (c->m_step && c->step_st == IE_OK) ie_metric_observe(c->m_step, NULL, (ie_now_ms() - t0) / 1e3);
    if (c->step_st != IE_OK) return ie_error_set(c->step_st, "%s", c->step_err);
    return IE_OK;
}

void ie_cluster_stats(const ie_cluster_t *c, ie_cluster_stats_t *out) { *out = c->stats; }
