/* cluster.c — the coordinator's side of the distributed service
 * (ie_cluster.h): membership by rank, epochs, heartbeats, and steps whose
 * logits come back from the ranks holding the output head.
 *
 * KV-cache operations (slot clears, block binds, lengths) are checked when
 * called and queued, in call order, as one frame of the next STEP
 * (ie_proto.h "KV operations"); every rank applies them before the step. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "ie_cluster.h"
#include "ie_clock.h"

#include "ie_proto.h"
#include "ie_sampler.h"
#include "ie_sdnotify.h"

#include <sched.h>
#include <unistd.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <limits.h>
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
    ie_status_t status; /* M_FAILED: the worker's load status         */
    /* LoRA sync of a rank that said READY (send_lora_sync): it counts as
     * ready once it acknowledged LORA lora_wait (0: no sync running);
     * lora_st / error: the first refusal among them */
    uint64_t lora_wait;
    ie_status_t lora_st;
} member_t;

/* An adapter set attached under an id (cb_lora_add): what every rank is
 * told to load. */
typedef struct clora {
    int used;
    int n;
    char name[IE_PROTO_LORA_PARTS][IE_PROTO_LORA_NAME_MAX];
    char path[IE_PROTO_LORA_PARTS][IE_PROTO_LORA_PATH_MAX];
    uint64_t fp[IE_PROTO_LORA_PARTS];
    float scale[IE_PROTO_LORA_PARTS];
} clora_t;

/* Chaining's credit (see "steps" below): a use earns 1 (up to
 * LA_CREDIT_MAX), a drop costs LA_DROP_COST; at 0 chaining pauses for
 * LA_PAUSE_STEPS steps. A drop wastes a whole step, a use saves a round
 * trip of the order of a tenth of one. */
#define LA_CREDIT_MAX 16
#define LA_DROP_COST 12
#define LA_PAUSE_STEPS 64

/* A step sent and not yet answered by every head rank. */
typedef struct pend {
    int live;      /* its answers are counted                       */
    double t_sent; /* when it went out (its deadline runs from here) */
    int chain;     /* tokens: the previous step's arg max (STEP chain) */
    uint64_t epoch, step;
    int got[IE_PROTO_MAX_RANKS];
    ie_status_t st;
    char err[IE_PROTO_TEXT_MAX];
    float *logits_out; /* FULL rows go here (NULL: none can come)       */
    int n, rows;       /* entries; their logits rows (FULL, ARGMAX)     */
    float *embd_out;   /* IE_LOGITS_EMBD rows go here (n_embd floats each) */
    int embd_rows;     /* entries flagged IE_LOGITS_EMBD                */
    uint8_t *flags;    /* [max_batch] the batch, copied                 */
    int32_t *seq, *pos;
    int32_t *tok; /* a chained step's tokens, as the ranks say      */
    int32_t *ad;  /* [max_batch] the batch's adapter ids (has_ad)    */
    int has_ad;
    int tok_set;
    float *am_val;  /* [max_batch] per flagged entry: the best (max, */
    int32_t *am_id; /* id) of the ranks' ARGMAX answers so far        */
} pend_t;

struct ie_cluster {
    ie_cluster_opts_t o;
    const ie_model_src_t *src;
    ie_hparams_t hp;
    uint64_t fp;
    uint64_t wfp; /* ie_model_src_weights_hash: workers must load the same bytes */
    ie_shard_range_t range[IE_PROTO_MAX_RANKS];
    ie_sock_t *router;
    char endpoint[IE_PROTO_ENDPOINT_MAX];
    member_t m[IE_PROTO_MAX_RANKS];
    uint64_t epoch, step;
    uint64_t cluster_id; /* random, in every ASSIGN: names the ranks' shared-memory segments */
    int kv_nlb, kv_pool; /* logical blocks per slot, blocks in the pool   */
    int kv_ring_len;     /* the longest sliding-layer ring of a rank (0: none) */
    ie_buf_t kv;         /* queued KV operations (ie_kv_ops_append)       */
    size_t kv_ids;       /* block ids in them                             */
    ie_status_t kv_lost; /* a clear that could not be queued: fail the next step */
    ie_parts_t in;
    ie_buf_t hdr;
    ie_msg_t assign_msg;
    double last_hb;
    uint8_t *flags; /* logits flags when the batch has none      */
    int flags_cap;
    ie_cluster_stats_t stats;
    ie_metric_t *m_up, *m_step, *m_step_tmo;
    uint64_t wd_us; /* systemd watchdog interval (0: none)      */
    double last_wd;
    /* the step being waited for, and a chained step sent ahead of the
     * caller's next call (ie_cluster_lookahead) */
    pend_t cur, ahead;
    int last_ok;  /* the last step answered: cur's am_id are its ids */
    int la_hint;  /* the caller's word for the next step (1: may chain) */
    int la_force; /* IE_LOOKAHEAD: 0 unset (auto), 1 "0" off, 2 "1" on */
    int n_cpu;    /* CPUs this process may use                     */
    char host[IE_PROTO_TEXT_MAX];
    int la_credit; /* + per chained step used, - per one dropped     */
    int la_pause;  /* steps left without chaining after a run of drops */
    ie_metric_t *m_la;
    ie_metric_t *m_step_fail; /* steps that failed (a lost rank, a rank's error) */
    /* LoRA adapter sets by id, the last LORA's seq, and the broadcast
     * being waited for (lora_broadcast): the ranks sent to and those
     * that answered, the first refusal */
    clora_t lora[IE_PROTO_LORA_IDS];
    uint64_t lora_seq;
    uint64_t bc_to[IE_PROTO_MAX_RANKS]; /* per rank: its LORA's seq (0: not sent) */
    int bc_got[IE_PROTO_MAX_RANKS];
    ie_status_t bc_st;
    char bc_err[IE_PROTO_TEXT_MAX];
    double bc_end;     /* when the broadcast waited for times out       */
    ie_msg_t lora_msg; /* large: kept, not on the stack */
};

static void clog_(const ie_cluster_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void clog_(const ie_cluster_t *c, const char *fmt, ...)
{
    (void)c;
    char line[1024], when[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s ie-coordinator: %s\n", ie_log_time(when, sizeof when), line);
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
    a->kv_type_k = (int32_t)c->o.kv_type_k;
    a->kv_type_v = (int32_t)c->o.kv_type_v;
    a->kv_rotate = (int32_t)c->o.kv_rotate;
    a->kv_swa_full = c->o.kv_swa_full;
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
    mb->lora_wait = 0; /* a sync of an older assignment is over */
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
    if (c->cur.live && c->cur.st == IE_OK) {
        c->cur.st = IE_ERR_UNAVAILABLE;
        snprintf(c->cur.err, sizeof c->cur.err, "worker rank %d (pid %d on %s) lost: %s", r, mb->hello.pid,
                 mb->hello.host, why);
    }
    c->ahead.live = 0; /* a new epoch: whatever the ranks were chaining is over */
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
    /* IE_ERR_UNSUPPORTED: the worker gives up (its model will not change
     * by asking again) */
    if (h->model_fp != c->fp) {
        snprintf(why, sizeof why,
                 "model mismatch: the worker's model (fingerprint %016llx) is not the "
                 "coordinator's (%016llx)",
                 (unsigned long long)h->model_fp, (unsigned long long)c->fp);
        clog_(c, "refused pid %d on %s: %s", h->pid, h->host, why);
        send_error(c, id, idn, IE_ERR_UNSUPPORTED, why);
        return;
    }
    if (h->weights_fp != c->wfp) {
        snprintf(why, sizeof why,
                 "weights mismatch: the worker's model file has the same shapes but other weights (hash "
                 "%016llx, the coordinator's %016llx); every host needs the same file, format and quantization",
                 (unsigned long long)h->weights_fp, (unsigned long long)c->wfp);
        clog_(c, "refused pid %d on %s: %s", h->pid, h->host, why);
        send_error(c, id, idn, IE_ERR_UNSUPPORTED, why);
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

/* Send member r one LORA (op, id; ADD: the set under id): its seq, or 0
 * when it could not be sent. */
static uint64_t send_lora(ie_cluster_t *c, int r, ie_lora_op_t op, int id, int64_t keep)
{
    ie_msg_t *m = &c->lora_msg;
    memset(m, 0, sizeof *m);
    m->kind = IE_MSG_LORA;
    ie_msg_lora_t *l = &m->u.lora;
    l->seq = ++c->lora_seq;
    l->op = op;
    l->id = id;
    l->keep = keep;
    const clora_t *e = &c->lora[id];
    ie_frame_t f[2] = {{NULL, 0}, {NULL, 0}};
    if (op == IE_LORA_OP_ADD) {
        l->n_name = l->n_path = e->n;
        for (int i = 0; i < e->n; i++) {
            memcpy(l->name[i], e->name[i], sizeof l->name[i]);
            memcpy(l->path[i], e->path[i], sizeof l->path[i]);
        }
        f[0] = (ie_frame_t){e->fp, (size_t)e->n * sizeof e->fp[0]};
        f[1] = (ie_frame_t){e->scale, (size_t)e->n * sizeof e->scale[0]};
    }
    const member_t *mb = &c->m[r];
    if (send_to(c, mb->ident, mb->ident_len, m, f, op == IE_LORA_OP_ADD ? 2 : 0) != IE_OK) {
        clog_(c, "cannot send a LoRA message to rank %d: %s", r, ie_error_last());
        return 0;
    }
    return l->seq;
}

/* Rank r is loaded: make its adapters the attached ones (KEEP, then ADD
 * each set) before it counts as ready; with none, at once. */
static void send_lora_sync(ie_cluster_t *c, int r)
{
    member_t *mb = &c->m[r];
    int64_t keep = 0;
    for (int id = 0; id < IE_PROTO_LORA_IDS; id++) keep |= (int64_t)c->lora[id].used << id;
    mb->lora_st = IE_OK;
    mb->lora_wait = send_lora(c, r, IE_LORA_OP_KEEP, 0, keep);
    for (int id = 0; id < IE_PROTO_LORA_IDS && mb->lora_wait; id++)
        if (c->lora[id].used) mb->lora_wait = send_lora(c, r, IE_LORA_OP_ADD, id, 0);
    if (!mb->lora_wait) { /* unreachable: it heartbeats or is lost, and is assigned again */
        mb->state = M_FAILED;
        mb->status = IE_ERR_UNAVAILABLE;
        snprintf(mb->error, sizeof mb->error, "rank %d: its adapters could not be sent", r);
    }
}

/* A LORA_ACK: a broadcast's answer (lora_broadcast counts it) and/or the
 * end of a joining rank's sync. */
static void on_lora_ack(ie_cluster_t *c, int r, const ie_msg_lora_ack_t *k)
{
    if (r < 0 || k->rank != r) return; /* not from that rank's socket: stale */
    member_t *mb = &c->m[r];
    if (c->bc_to[r] && k->seq == c->bc_to[r]) {
        c->bc_got[r] = 1;
        if (k->status != IE_OK && c->bc_st == IE_OK) {
            c->bc_st = (ie_status_t)k->status;
            snprintf(c->bc_err, sizeof c->bc_err, "%s", k->error);
        }
    } else if (k->status != IE_OK && mb->lora_wait && k->seq <= mb->lora_wait && mb->lora_st == IE_OK) {
        mb->lora_st = (ie_status_t)k->status;
        snprintf(mb->error, sizeof mb->error, "%s", k->error);
    }
    if (!mb->lora_wait || k->seq != mb->lora_wait || mb->state != M_LOADING) return;
    mb->lora_wait = 0;
    if (mb->lora_st != IE_OK) { /* an adapter attached before cannot be here: say so, stay out */
        mb->state = M_FAILED;
        mb->status = mb->lora_st;
        clog_(c, "rank %d (pid %d on %s) is not ready: %s", r, mb->hello.pid, mb->hello.host, mb->error);
        return;
    }
    mb->state = M_READY;
    set_up(c, r, 1);
}

static void on_ready(ie_cluster_t *c, int r, const ie_msg_ready_t *rd)
{
    if (r < 0 || rd->rank != r || rd->epoch != c->epoch) return; /* stale */
    member_t *mb = &c->m[r];
    if (rd->status != IE_OK) {
        mb->state = M_FAILED;
        mb->status = (ie_status_t)rd->status;
        snprintf(mb->error, sizeof mb->error, "%s", rd->error);
        clog_(c, "rank %d (pid %d on %s) is not ready: %s", r, mb->hello.pid, mb->hello.host, rd->error);
        return;
    }
    if (c->o.verbose)
        clog_(c, "rank %d ready (%.1f MB of weights, %.0f ms)", r, rd->weight_bytes / 1e6, rd->load_ms);
    send_lora_sync(c, r); /* ready once it holds the attached adapters */
}

static void pend_fail(pend_t *p, ie_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pend_fail(pend_t *p, ie_status_t st, const char *fmt, ...)
{
    if (p->st != IE_OK) return; /* the first reason stands */
    p->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
}

static void on_result(ie_cluster_t *c, const ie_msg_result_t *res)
{
    pend_t *p = c->cur.live && res->step == c->cur.step       ? &c->cur
                : c->ahead.live && res->step == c->ahead.step ? &c->ahead
                                                              : NULL;
    if (!p || res->epoch != p->epoch || res->epoch != c->epoch) return; /* stale */
    if (res->rank < 0 || res->rank >= c->o.n_ranks) return;
    p->got[res->rank] = 1;
    if (res->status != IE_OK) {
        pend_fail(p,
                  res->status == IE_ERR_RANGE || res->status == IE_ERR_INVAL ? (ie_status_t)res->status
                                                                             : IE_ERR_UNAVAILABLE,
                  "%s", res->error);
        return;
    }
    const ie_shard_range_t *sr = &c->range[res->rank];
    /* the hidden-state rows come once, from the head rank holding row 0 */
    const int has_embd = p->embd_rows > 0 && sr->vocab_begin == 0;
    const size_t embd_bytes = (size_t)p->embd_rows * (size_t)c->hp.n_embd * sizeof(float);
    const int bad = !sr->has_head || res->n_rows != p->rows || res->vocab_begin != sr->vocab_begin ||
                    res->vocab_end != sr->vocab_end || c->in.n != 3 + p->chain + has_embd ||
                    (p->chain && c->in.size[3] != (size_t)p->n * sizeof(int32_t)) ||
                    (has_embd && (c->in.size[3] != embd_bytes || !p->embd_out));
    if (bad || ie_result_logits_merge(c->in.data[2], c->in.size[2], p->flags, p->n, sr->vocab_begin, sr->vocab_end,
                                      c->hp.n_vocab, p->logits_out, p->am_val, p->am_id) != IE_OK) {
        pend_fail(p, IE_ERR_FORMAT, "rank %d sent a malformed result%s%s", res->rank, bad ? "" : ": ",
                  bad ? "" : ie_error_last());
        return;
    }
    if (has_embd) memcpy(p->embd_out, c->in.data[3], embd_bytes);
    if (p->chain) { /* every rank must have run the same tokens */
        if (!p->tok_set) {
            memcpy(p->tok, c->in.data[3], (size_t)p->n * sizeof(int32_t));
            p->tok_set = 1;
        } else if (memcmp(p->tok, c->in.data[3], (size_t)p->n * sizeof(int32_t)) != 0) {
            pend_fail(p, IE_ERR_INTERNAL, "the ranks ran different tokens in chained step %llu",
                      (unsigned long long)p->step);
        }
    }
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
    case IE_MSG_LORA_ACK: on_lora_ack(c, r, &m.u.lora_ack); break;
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
    /* the watchdog means progress: the loop ticks, and no step is overdue
     * (a step past its deadline is failed by wait_cur; if that ever did
     * not happen, systemd should restart us) */
    const int overdue = c->cur.live && t - c->cur.t_sent > c->o.step_timeout_ms;
    if (c->wd_us && !overdue && t - c->last_wd >= c->wd_us / 2000.0) {
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
    if (c->o.step_timeout_ms <= 0) c->o.step_timeout_ms = IE_CLUSTER_STEP_TIMEOUT_MS;
    c->src = src;
    c->hp = *ie_model_src_hparams(src);
    c->fp = ie_model_src_fingerprint(src);
    c->wfp = ie_model_src_weights_hash(src, 1); /* never computed with here: not kept resident */
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
    {
        ie_shard_units_t units; /* the stored blocks a column cut must respect */
        if ((st = ie_shard_units(src, &units)) != IE_OK) goto cleanup;
        for (int r = 0; r < o->n_ranks; r++) {
            ie_shard_t s = {o->plan, r, o->n_ranks};
            if ((st = ie_shard_plan_units(&c->hp, &units, &s, &c->range[r])) != IE_OK) goto cleanup;
        }
    }
    {
        /* each rank's cache: its layers and KV heads, the sliding ones in a
         * ring; a byte budget is each rank's, and one block count serves
         * every rank (a block id names the same positions on all), so the
         * pool is the fewest blocks any rank's budget holds */
        ie_worker_opts_t wo;
        ie_worker_opts_default(&wo);
        wo.n_ctx = o->n_ctx;
        wo.n_seq = o->n_seq;
        wo.kv_block = o->kv_block;
        wo.kv_type_k = o->kv_type_k;
        wo.kv_type_v = o->kv_type_v;
        wo.kv_swa_full = o->kv_swa_full;
        int fewest = INT_MAX;
        for (int r = 0; r < o->n_ranks; r++) {
            ie_kv_layout_t ly;
            int n = 0;
            if ((st = ie_worker_kv_layout(&c->hp, &c->range[r], &wo, &ly)) != IE_OK) goto cleanup;
            if (ly.ring_len > c->kv_ring_len) c->kv_ring_len = ly.ring_len;
            if (o->kv_blocks > 0 || o->kv_mem_bytes == 0) continue;
            if ((st = ie_worker_kv_budget_blocks(&ly, o->kv_mem_bytes, c->kv_pool, &n)) != IE_OK) {
                char why[512];
                snprintf(why, sizeof why, "%s", ie_error_last());
                st = ie_error_set(st, "rank %d (layers %d..%d): %s", r, c->range[r].layer_begin,
                                  c->range[r].layer_end - 1, why);
                goto cleanup;
            }
            fewest = n < fewest ? n : fewest;
        }
        if (fewest < INT_MAX) c->o.kv_blocks = c->kv_pool = fewest;
    }
    if ((st = ie_sock_new(o->net, IE_SOCK_ROUTER, &c->router)) != IE_OK) goto cleanup;
    {
        /* the largest message a worker sends is a RESULT of whole logits
         * rows for a full batch (plus its chained tokens): anything larger
         * is not from a worker, and is refused before it takes memory */
        const int64_t cap = (int64_t)o->max_batch * (c->hp.n_vocab + c->hp.n_embd) * (int64_t)sizeof(float) +
                            (int64_t)o->max_batch * (int64_t)sizeof(int32_t) + (1 << 20);
        if ((st = ie_sock_set_max_msg(c->router, cap < (1ll << 30) ? cap : 1ll << 30)) != IE_OK) goto cleanup;
    }
    if ((st = ie_sock_bind(c->router, o->bind, c->endpoint, sizeof c->endpoint)) != IE_OK) goto cleanup;
    if (o->metrics)
        ie_metrics_gauge(o->metrics, "ie_worker_up", "1 while the worker of this rank is registered and ready",
                         "worker", &c->m_up);
    if (o->metrics)
        ie_metrics_counter(o->metrics, "ie_step_timeouts_total",
                           "Steps not answered within --step-timeout-ms, by the rank that owed the answer",
                           "worker", &c->m_step_tmo);
    if (o->metrics) {
        static const double sb[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
        ie_metrics_histogram(o->metrics, "ie_step_seconds", "Wall time of one step across the workers", NULL, sb,
                             10, &c->m_step);
        ie_metrics_counter(o->metrics, "ie_step_failures_total",
                           "Steps that failed across the workers (a rank lost or unreachable, a rank's error); the "
                           "requests in them are retried or failed",
                           NULL, &c->m_step_fail);
    }
    {
        const size_t B = (size_t)o->max_batch;
        pend_t *ps[2] = {&c->cur, &c->ahead};
        for (int k = 0; k < 2; k++) {
            pend_t *p = ps[k];
            p->flags = malloc(B);
            p->seq = malloc(B * sizeof *p->seq);
            p->pos = malloc(B * sizeof *p->pos);
            p->tok = malloc(B * sizeof *p->tok);
            p->am_val = malloc(B * sizeof *p->am_val);
            p->am_id = malloc(B * sizeof *p->am_id);
            p->ad = malloc(B * sizeof *p->ad);
            if (!p->flags || !p->seq || !p->pos || !p->tok || !p->am_val || !p->am_id || !p->ad) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
        }
        const char *la = getenv("IE_LOOKAHEAD");
        c->la_force = la && (la[0] == '0' || la[0] == '1') && la[1] == '\0' ? la[0] - '0' + 1 : 0;
        cpu_set_t cs;
        c->n_cpu = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (gethostname(c->host, sizeof c->host - 1) != 0) c->host[0] = '\0';
        c->la_hint = 1;
        c->la_credit = LA_CREDIT_MAX;
    }
    if (o->metrics)
        ie_metrics_counter(o->metrics, "ie_lookahead_steps_total",
                           "Chained steps sent ahead of the scheduler (tensor plans): used, or dropped because "
                           "the next batch differed",
                           "outcome", &c->m_la);
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
    pend_t *ps[2] = {&c->cur, &c->ahead};
    for (int k = 0; k < 2; k++) {
        free(ps[k]->flags);
        free(ps[k]->seq);
        free(ps[k]->pos);
        free(ps[k]->tok);
        free(ps[k]->am_val);
        free(ps[k]->am_id);
        free(ps[k]->ad);
    }
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

/* ------------------------------------------------------------- steps */

/* Chained steps sent ahead (docs/PROTOCOL.md, "Chained steps"): after a
 * step whose every entry is an ARGMAX decode row of its own slot, the
 * cluster sends at once the step after it (each slot at its next position,
 * its token the ranks' own arg max), so the ranks go on computing while
 * the answer travels here, is sampled and scheduled. The caller's next
 * step uses it when it is that very batch (same slots and positions, the
 * arg max ids as tokens, no KV operations queued); otherwise it is
 * dropped, its answers ignored. A dropped step cost the ranks one step
 * and wrote K/V at positions no reader has reached: the next position
 * of each slot, in the block that already holds the current one (a
 * chained step never needs a new block), which every later user of those
 * positions writes before reading. The credit (LA_*) stops chaining for
 * a while when drops come often. */

void ie_cluster_lookahead(ie_cluster_t *c, int ok) { c->la_hint = ok != 0; }

/* Fill p for a step of n entries and send it to the ranks that take
 * steps; chain: the tokens frame holds -1s and the STEP says chain. */
static void pend_send(ie_cluster_t *c, pend_t *p, int n, const int32_t *tok, const int32_t *pos, const int32_t *seq,
                      const uint8_t *flags, const int32_t *ad, int chain, float *logits_out)
{
    p->live = 1;
    p->t_sent = ie_now_ms();
    p->chain = chain;
    p->epoch = c->epoch;
    p->step = ++c->step;
    memset(p->got, 0, sizeof p->got);
    p->st = IE_OK;
    p->err[0] = '\0';
    p->logits_out = logits_out;
    p->n = n;
    p->rows = 0;
    p->embd_out = NULL; /* the caller's, set after sending (ie_cluster_step) */
    p->embd_rows = 0;
    p->tok_set = 0;
    if (p->flags != flags) memcpy(p->flags, flags, (size_t)n);
    if (p->seq != seq) memcpy(p->seq, seq, (size_t)n * sizeof *seq);
    if (p->pos != pos) memcpy(p->pos, pos, (size_t)n * sizeof *pos);
    p->has_ad = ad != NULL;
    if (ad && p->ad != ad) memcpy(p->ad, ad, (size_t)n * sizeof *ad);
    for (int i = 0; i < n; i++) {
        p->rows += flags[i] == IE_LOGITS_FULL || flags[i] == IE_LOGITS_ARGMAX;
        p->embd_rows += flags[i] == IE_LOGITS_EMBD;
    }
    for (int i = 0; i < p->rows; i++) {
        p->am_val[i] = -INFINITY;
        p->am_id[i] = -1;
    }
    ie_msg_t m = {.kind = IE_MSG_STEP};
    m.u.step.epoch = c->epoch;
    m.u.step.step = p->step;
    m.u.step.n = n;
    m.u.step.chain = chain;
    m.u.step.kv_words = chain ? 0 : (int32_t)(c->kv.len / 4);
    m.u.step.has_adapter = p->has_ad;
    const size_t n4 = (size_t)n * 4;
    ie_frame_t f[6] = {{tok, n4},  {pos, n4}, {seq, n4}, {flags, (size_t)n}, {c->kv.data, chain ? 0 : c->kv.len},
                       {p->ad, n4}};
    const int tensor = c->o.plan == IE_SHARD_TENSOR;
    for (int r = 0; r < c->o.n_ranks; r++) {
        if (!tensor && r > 0) break;
        if (send_to(c, c->m[r].ident, c->m[r].ident_len, &m, f, 5 + p->has_ad) != IE_OK)
            pend_fail(p, IE_ERR_UNAVAILABLE, "cannot reach worker rank %d: %s", r, ie_error_last());
    }
    /* sent everywhere: the operations are the workers' now (applied even if
     * the step then fails); a failed send keeps them for the next step */
    if (!chain && p->st == IE_OK) {
        ie_buf_reset(&c->kv);
        c->kv_ids = 0;
    }
}

/* May the step after cur be sent ahead? Every entry an ARGMAX decode row
 * of a slot of its own whose next position is in the same KV block. */
/* Chaining hides the round trip only if this process has a CPU of its
 * own: on a host whose CPUs the ranks' threads fill, answering them here
 * interrupts a rank mid-step and its peers wait for it at the next
 * reduction (measured on 2 cores, SmolLM2 tensor:2: no gain). Unless
 * IE_LOOKAHEAD says, chain when the ranks on this host run fewer threads
 * than it has CPUs. */
static int spare_cpu(const ie_cluster_t *c)
{
    if (c->la_force) return c->la_force == 2;
    long here = 0;
    for (int r = 0; r < c->o.n_ranks; r++)
        if (!strcmp(c->m[r].hello.host, c->host)) here += c->m[r].hello.n_threads;
    return here < c->n_cpu;
}

static int may_chain(ie_cluster_t *c)
{
    const pend_t *p = &c->cur;
    if (c->o.plan != IE_SHARD_TENSOR || p->st != IE_OK || p->rows != p->n || !spare_cpu(c)) return 0;
    if (c->la_pause > 0) {
        if (--c->la_pause == 0) c->la_credit = LA_DROP_COST;
        return 0;
    }
    const int kb = c->o.kv_block > 0 ? c->o.kv_block : 16;
    for (int i = 0; i < p->n; i++) {
        if (p->flags[i] != IE_LOGITS_ARGMAX || p->pos[i] + 1 >= c->o.n_ctx || (p->pos[i] + 1) % kb == 0) return 0;
        for (int j = 0; j < i; j++)
            if (p->seq[j] == p->seq[i]) return 0;
    }
    return 1;
}

static void send_ahead(ie_cluster_t *c)
{
    const pend_t *p = &c->cur;
    pend_t *a = &c->ahead;
    for (int i = 0; i < p->n; i++) { /* built in a's own arrays: pend_send copies onto them */
        a->tok[i] = -1;
        a->pos[i] = p->pos[i] + 1;
    }
    pend_send(c, a, p->n, a->tok, a->pos, p->seq, p->flags, p->has_ad ? p->ad : NULL, 1, NULL);
    if (a->st != IE_OK) a->live = 0; /* the ranks that got it fail it: nothing will match */
}

/* Is b the step sent ahead? */
static int ahead_matches(const ie_cluster_t *c, const ie_batch_t *b, const uint8_t *flags)
{
    const pend_t *a = &c->ahead;
    if (!c->last_ok || a->epoch != c->epoch || a->st != IE_OK || c->kv.len != 0 || c->kv_lost != IE_OK ||
        b->n != a->n || a->has_ad != (b->adapter != NULL) ||
        (b->adapter && memcmp(b->adapter, a->ad, (size_t)b->n * sizeof *b->adapter) != 0))
        return 0;
    for (int i = 0; i < b->n; i++)
        if (flags[i] != IE_LOGITS_ARGMAX || b->seq[i] != a->seq[i] || b->pos[i] != a->pos[i] ||
            b->tokens[i] != c->cur.am_id[i])
            return 0;
    return 1;
}

static void la_count(ie_cluster_t *c, int used)
{
    if (used) {
        c->stats.lookahead_used++;
        if (c->la_credit < LA_CREDIT_MAX) c->la_credit++;
    } else {
        c->stats.lookahead_dropped++;
        c->la_credit -= LA_DROP_COST;
        if (c->la_credit <= 0) c->la_pause = LA_PAUSE_STEPS;
    }
    if (c->m_la) ie_metric_add(c->m_la, used ? "used" : "dropped", 1);
}

/* cur was not answered in time although its ranks heartbeat: fail it
 * (IE_ERR_UNAVAILABLE: its requests are retried as for a lost worker) and
 * re-assign every rank in a new epoch, so whatever is stuck is dropped and
 * the ranks prove themselves with READY again; until then they are down.
 * Which rank owes the answer: the tensor ranks that did not answer; in a
 * pipeline the stages hand the step on without telling us, so every stage
 * is a suspect. */
static void step_overdue(ie_cluster_t *c)
{
    const int tensor = c->o.plan == IE_SHARD_TENSOR;
    char who[256] = "";
    size_t len = 0;
    for (int r = 0; r < c->o.n_ranks; r++) {
        if (tensor && c->cur.got[r]) continue;
        char l[16];
        snprintf(l, sizeof l, "%d", r);
        if (c->m_step_tmo) ie_metric_add(c->m_step_tmo, l, 1);
        set_up(c, r, 0);
        int n = snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", r);
        if (n > 0 && (size_t)n < sizeof who - len) len += (size_t)n;
    }
    pend_fail(&c->cur, IE_ERR_UNAVAILABLE,
              "%s step %llu not answered within %d ms (--step-timeout-ms) although the workers heartbeat; "
              "rank(s) %s marked down and assigned again%s",
              ie_shard_kind_name(c->o.plan), (unsigned long long)c->cur.step, c->o.step_timeout_ms, who,
              tensor ? "" : " (a pipeline stage may not reach the next one: check --peer-bind/--advertise)");
    clog_(c, "%s", c->cur.err);
    c->ahead.live = 0;
    for (int r = 0; r < c->o.n_ranks; r++)
        if (c->m[r].state == M_READY) c->m[r].state = M_LOADING;
    replan(c);
}

/* Wait for the head ranks' answers to cur (all tensor ranks; the last
 * stage), its failure, or its deadline. */
static void wait_cur(ie_cluster_t *c)
{
    const int tensor = c->o.plan == IE_SHARD_TENSOR;
    while (c->cur.st == IE_OK) {
        int done = 1;
        for (int r = 0; r < c->o.n_ranks; r++)
            if (c->range[r].has_head && (tensor || r == c->o.n_ranks - 1) && !c->cur.got[r]) done = 0;
        if (done) break;
        const int left = (int)(c->cur.t_sent + c->o.step_timeout_ms - ie_now_ms());
        if (left <= 0) {
            step_overdue(c);
            break;
        }
        pump(c, left < c->o.heartbeat_ms ? left : c->o.heartbeat_ms);
    }
}

ie_status_t ie_cluster_step(ie_cluster_t *c, const ie_batch_t *b, float *logits_out)
{
    double t0 = ie_now_ms();
    const int hint = c->la_hint;
    c->la_hint = 1; /* the caller's word holds for one step */
    if (b->n < 1 || b->n > c->o.max_batch)
        return ie_error_set(IE_ERR_INVAL, "cluster: batch of %d tokens (max %d)", b->n, c->o.max_batch);
    for (int i = 0; b->adapter && i < b->n; i++)
        if (b->adapter[i] != -1 &&
            (b->adapter[i] < 0 || b->adapter[i] >= IE_PROTO_LORA_IDS || !c->lora[b->adapter[i]].used))
            return ie_error_set(IE_ERR_RANGE, "cluster: token %d asks for adapter %d, which is not attached", i,
                                (int)b->adapter[i]);
    if (!ie_cluster_ready(c)) {
        c->ahead.live = 0;
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
        c->ahead.live = 0;
        return ie_error_set(lost, "cluster: a slot clear could not be queued (too many KV operations before one "
                                  "step); the queued KV operations were dropped");
    }
    const uint8_t *flags = b->logits;
    for (int i = 0; flags && !b->embd && i < b->n; i++)
        if (flags[i] == IE_LOGITS_EMBD)
            return ie_error_set(IE_ERR_INVAL,
                                "cluster: entry %d asks for its hidden state and the batch has no embd", i);
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

    int adopted = 0;
    if (c->ahead.live) { /* the step sent ahead: this batch, or dropped */
        adopted = ahead_matches(c, b, flags);
        la_count(c, adopted);
        if (adopted) {
            pend_t t = c->cur;
            c->cur = c->ahead;
            c->ahead = t;
            c->cur.logits_out = logits_out;
        }
        c->ahead.live = 0;
    }
    for (;;) {
        if (!adopted) {
            pend_send(c, &c->cur, b->n, b->tokens, b->pos, b->seq, flags, b->adapter, 0, logits_out);
            c->cur.embd_out = b->embd;
        }
        if (hint && may_chain(c)) send_ahead(c);
        wait_cur(c);
        /* a chained step that failed, or ran other tokens than these (the
         * ranks' pick disagreed with ours): run the batch as given */
        if (adopted && c->cur.st != IE_ERR_UNAVAILABLE &&
            (c->cur.st != IE_OK || !c->cur.tok_set ||
             memcmp(c->cur.tok, b->tokens, (size_t)b->n * sizeof *b->tokens) != 0)) {
            if (c->o.verbose)
                clog_(c, "chained step %llu not usable (%s): sent again as a step", (unsigned long long)c->cur.step,
                      c->cur.st != IE_OK ? c->cur.err : "tokens");
            c->ahead.live = 0;
            adopted = 0;
            continue;
        }
        break;
    }
    c->cur.live = 0;
    c->last_ok = c->cur.st == IE_OK;
    if (c->cur.st != IE_OK) c->ahead.live = 0;
    if (c->cur.st == IE_OK)
        ie_result_logits_finish(flags, b->n, c->hp.n_vocab, c->cur.am_val, c->cur.am_id, logits_out);
    c->stats.steps++;
    c->stats.step_ms += ie_now_ms() - t0;
    if (c->m_step && c->cur.st == IE_OK) ie_metric_observe(c->m_step, NULL, (ie_now_ms() - t0) / 1e3);
    if (c->cur.st != IE_OK && c->m_step_fail) ie_metric_add(c->m_step_fail, NULL, 1);
    if (c->cur.st != IE_OK) return ie_error_set(c->cur.st, "%s", c->cur.err);
    return IE_OK;
}

void ie_cluster_stats(const ie_cluster_t *c, ie_cluster_stats_t *out) { *out = c->stats; }

/* ------------------------------------------------------------- backend */

/* The cluster behind the step boundary (ie_backend.h): every entry is the
 * cluster's own; the backend owns the cluster and says BYE on destroy. */

static ie_status_t cb_step(void *self, const ie_batch_t *b, float *logits_out)
{
    return ie_cluster_step(self, b, logits_out);
}

static void cb_seq_clear(void *self, int seq) { ie_cluster_seq_clear(self, seq); }

static ie_status_t cb_seq_set_len(void *self, int seq, int n_pos)
{
    return ie_cluster_seq_set_len(self, seq, n_pos);
}

static ie_status_t cb_kv_bind(void *self, int seq, int first, const int32_t *pb, int n)
{
    return ie_cluster_kv_bind(self, seq, first, pb, n);
}

static void cb_hint_next(void *self, int same) { ie_cluster_lookahead(self, same); }
static int cb_ready(void *self) { return ie_cluster_ready(self); }
static int cb_upkeep(void *self, int timeout_ms) { return ie_cluster_service(self, timeout_ms); }

static void cb_stats(void *self, ie_backend_stats_t *out)
{
    const ie_cluster_t *c = self;
    out->isa = ie_isa_name(ie_isa_best());
    out->lookahead = 1;
    out->lookahead_used = c->stats.lookahead_used;
    out->lookahead_dropped = c->stats.lookahead_dropped;
    out->endpoint = c->endpoint;
    out->workers = c->o.n_ranks;
    out->workers_ready = 0;
    for (int r = 0; r < c->o.n_ranks; r++)
        out->workers_ready += c->m[r].state == M_READY && c->m[r].assigned_epoch == c->epoch;
}

#define LORA_WAIT_MS 120000
/* The sending half of lora_broadcast: 1 when an answer is owed (then
 * bc_wait / bc_end), 0 when no rank was sent to. */
static int bc_send(ie_cluster_t *c, ie_lora_op_t op, int id)
{
    c->ahead.live = 0; /* a chained step was made with the old table: never adopted */
    c->bc_st = IE_OK;
    c->bc_err[0] = '\0';
    memset(c->bc_to, 0, sizeof c->bc_to);
    memset(c->bc_got, 0, sizeof c->bc_got);
    uint64_t seq = 0;
    for (int r = 0; r < c->o.n_ranks; r++) {
        member_t *mb = &c->m[r];
        const int syncing = mb->state == M_LOADING && mb->lora_wait;
        if (!(mb->state == M_READY || syncing)) continue;
        const uint64_t s = send_lora(c, r, op, id, 0);
        if (!s) continue; /* unreachable: lost soon, synced when back */
        seq = s;
        c->bc_to[r] = s;
        if (syncing) mb->lora_wait = s;
    }
    c->bc_end = ie_now_ms() + LORA_WAIT_MS;
    return seq != 0;
}

/* The waiting half: 1 while a rank sent to owes its answer and is not
 * lost, and the time is not up; else the broadcast's outcome into *st
 * (IE_OK, the first rank's refusal, IE_ERR_TIMEOUT) and 0. */
static int bc_wait(ie_cluster_t *c, ie_lora_op_t op, ie_status_t *st)
{
    int waiting = 0;
    for (int r = 0; r < c->o.n_ranks; r++)
        if (c->bc_to[r] && !c->bc_got[r] && c->m[r].state != M_EMPTY) waiting = 1;
    *st = IE_OK;
    if (waiting && ie_now_ms() <= c->bc_end) return 1;
    if (waiting)
        *st = ie_error_set(IE_ERR_TIMEOUT, "cluster: the ranks did not answer a LoRA %s within %d s",
                           op == IE_LORA_OP_ADD ? "load" : "unload", LORA_WAIT_MS / 1000);
    memset(c->bc_to, 0, sizeof c->bc_to); /* late answers are stale */
    if (*st == IE_OK && c->bc_st != IE_OK) *st = ie_error_set(c->bc_st, "%s", c->bc_err);
    return 0;
}

/* Send one LORA (op, id) to every rank that is ready or syncing (a rank
 * still loading gets the whole table once READY: send_lora_sync) and wait
 * for their answers, or for them to be lost, up to LORA_WAIT_MS. IE_OK,
 * or the first rank's refusal (its message names the rank and adapter),
 * IE_ERR_TIMEOUT. A syncing rank waits for this one too. */
static ie_status_t lora_broadcast(ie_cluster_t *c, ie_lora_op_t op, int id)
{
    ie_status_t st = IE_OK;
    if (!bc_send(c, op, id)) return IE_OK;
    /* every rank's message has its own seq; answers are matched per rank */
    while (bc_wait(c, op, &st)) pump(c, 50);
    return st;
}

/* The first half of cb_lora_add: check the parts and fill a free id's
 * entry with name, path (made absolute here: the ranks on this host may
 * run elsewhere), fingerprint and scale of each; marks it used. */
static ie_status_t lora_add_prepare(ie_cluster_t *c, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    int id = -1;
    if (!parts || !id_out || n < 1 || n > IE_PROTO_LORA_PARTS)
        return ie_error_set(IE_ERR_INVAL, "cluster: lora_add of %d parts (1..%d)", n, IE_PROTO_LORA_PARTS);
    for (int k = 0; k < IE_PROTO_LORA_IDS && id < 0; k++)
        if (!c->lora[k].used) id = k;
    if (id < 0) return ie_error_set(IE_ERR_RANGE, "cluster: %d adapter sets attached already", IE_PROTO_LORA_IDS);
    clora_t *e = &c->lora[id];
    memset(e, 0, sizeof *e);
    for (int i = 0; i < n; i++) {
        const ie_backend_lora_part_t *p = &parts[i];
        char *abs = p->path ? realpath(p->path, NULL) : NULL;
        const char *path = abs ? abs : p->path;
        const int bad = !p->name || !path || !p->lora || strlen(p->name) >= sizeof e->name[0] ||
                        strlen(path) >= sizeof e->path[0] || !isfinite(p->scale);
        if (!bad) {
            snprintf(e->name[i], sizeof e->name[i], "%s", p->name);
            snprintf(e->path[i], sizeof e->path[i], "%s", path);
            e->fp[i] = p->lora->fingerprint;
            e->scale[i] = p->scale;
        }
        free(abs);
        if (bad)
            return ie_error_set(IE_ERR_INVAL,
                                "cluster: adapter part %d: a name (< %d bytes), a path (< %d bytes), the loaded "
                                "adapter and a finite scale are needed",
                                i, IE_PROTO_LORA_NAME_MAX, IE_PROTO_LORA_PATH_MAX);
        if (!e->fp[i])
            return ie_error_set(IE_ERR_INVAL,
                                "cluster: adapter '%s' has no file fingerprint (not loaded from disk): the ranks "
                                "could not check their copies",
                                p->name);
    }
    e->n = n;
    e->used = 1;
    *id_out = id;
    return IE_OK;
}

/* The last half of cb_lora_add, the ranks' answers in: a refusal
 * anywhere detaches the id everywhere and is returned, named. */
static ie_status_t lora_add_done(ie_cluster_t *c, int id, ie_status_t st)
{
    clora_t *e = &c->lora[id];
    if (st != IE_OK) {
        char why[IE_PROTO_TEXT_MAX];
        snprintf(why, sizeof why, "%s", ie_error_last());
        e->used = 0;
        lora_broadcast(c, IE_LORA_OP_REMOVE, id); /* the ranks that took it */
        return ie_error_set(st, "cluster: LoRA adapter '%s'%s not attached: %s", e->name[0],
                            e->n > 1 ? " (and the rest of its set)" : "", why);
    }
    if (c->o.verbose) clog_(c, "LoRA '%s'%s attached as set %d", e->name[0], e->n > 1 ? " (a set)" : "", id);
    return IE_OK;
}

/* Contract (ie_backend.h): name, path, fingerprint and scale of every part
 * to every rank; a refusal anywhere detaches the id everywhere. */
static ie_status_t cb_lora_add(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    ie_cluster_t *c = self;
    int id = -1;
    ie_status_t st = lora_add_prepare(c, parts, n, &id);
    if (st != IE_OK) return st;
    if ((st = lora_add_done(c, id, lora_broadcast(c, IE_LORA_OP_ADD, id))) == IE_OK) *id_out = id;
    return st;
}

/* Contract (ie_backend.h): cb_lora_add's sending half; the answers come
 * in through every pump (steps and upkeep included) until cb_lora_add_poll
 * finds none owed. */
static ie_status_t cb_lora_add_begin(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    ie_cluster_t *c = self;
    int id = -1;
    ie_status_t st = lora_add_prepare(c, parts, n, &id);
    if (st != IE_OK) return st;
    if (!bc_send(c, IE_LORA_OP_ADD, id)) c->bc_end = -1; /* no rank to ask: done at the first poll */
    *id_out = id;
    return IE_OK;
}

/* Contract (ie_backend.h). */
static int cb_lora_add_poll(void *self, int id, int timeout_ms, ie_status_t *st)
{
    ie_cluster_t *c = self;
    *st = IE_OK;
    if (id < 0 || id >= IE_PROTO_LORA_IDS || !c->lora[id].used) {
        *st = ie_error_set(IE_ERR_RANGE, "cluster: no adapter set %d being attached", id);
        return 1;
    }
    if (c->bc_end >= 0 && bc_wait(c, IE_LORA_OP_ADD, st)) {
        pump(c, timeout_ms);
        if (bc_wait(c, IE_LORA_OP_ADD, st)) return 0;
    }
    c->bc_end = -1;
    *st = lora_add_done(c, id, *st);
    return 1;
}

/* Contract (ie_backend.h). A rank that cannot be told now is told when it
 * registers again (send_lora_sync's KEEP). */
static ie_status_t cb_lora_remove(void *self, int id)
{
    ie_cluster_t *c = self;
    if (id < 0 || id >= IE_PROTO_LORA_IDS || !c->lora[id].used)
        return ie_error_set(IE_ERR_RANGE, "cluster: no adapter set %d attached", id);
    c->lora[id].used = 0;
    ie_status_t st = lora_broadcast(c, IE_LORA_OP_REMOVE, id);
    if (st != IE_OK) clog_(c, "LoRA set %d: %s", id, ie_error_last());
    return IE_OK;
}

static void cb_destroy(void *self)
{
    ie_cluster_t *c = self;
    ie_cluster_destroy(&c);
}

static const ie_backend_ops_t k_cluster_ops = {
    .name = "cluster",
    .step = cb_step,
    .seq_clear = cb_seq_clear,
    .seq_set_len = cb_seq_set_len,
    .kv_bind = cb_kv_bind,
    .hint_next = cb_hint_next,
    .ready = cb_ready,
    .upkeep = cb_upkeep,
    .stats = cb_stats,
    .lora_add = cb_lora_add,
    .lora_remove = cb_lora_remove,
    .lora_add_begin = cb_lora_add_begin,
    .lora_add_poll = cb_lora_add_poll,
    /* no lora_bytes: the ranks' copies (slices, int8, sums) live in their
     * processes, outside the coordinator's budget (docs/LORA.md) */
    .destroy = cb_destroy,
};

ie_status_t ie_backend_cluster_new(ie_cluster_t **c_p, ie_backend_t **out)
{
    ie_cluster_t *c = *c_p;
    *c_p = NULL;
    *out = NULL;
    if (!c) return ie_error_set(IE_ERR_INVAL, "backend: no cluster");
    /* heartbeats and registrations want answers well inside heartbeat_ms */
    ie_backend_geom_t g = {.n_seq = c->o.n_seq,
                           .n_ctx = c->o.n_ctx,
                           .max_batch = c->o.max_batch,
                           .kv_block = c->o.kv_block > 0 ? c->o.kv_block : 16,
                           .kv_blocks = c->kv_pool,
                           .n_vocab = c->hp.n_vocab,
                           .n_embd = c->hp.n_embd,
                           .upkeep_ms = 20,
                           .kv_ring_len = c->kv_ring_len};
    return ie_backend_new(&k_cluster_ops, c, &g, out);
}
