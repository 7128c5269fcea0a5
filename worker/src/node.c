/* node.c — the worker process's runtime (ie_node.h): register with the
 * coordinator, load the assigned shard, run steps, reduce with peers,
 * heartbeat. The only transport it sees is ie_transport.h; the only wire
 * format ie_proto.h. */
#define _GNU_SOURCE
#include "ie_node.h"
#include "ie_clock.h"

#include "ie_model_src.h"
#include "ie_numa.h"
#include "ie_proto.h"
#include "ie_sdnotify.h"
#include "ie_shmreduce.h"
#include "ie_worker.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define QCAP 8 /* partial sums buffered per peer */

typedef struct peerq {
    ie_parts_t m[QCAP];
    ie_msg_partial_t h[QCAP];
    int head, n;
} peerq_t;

/* An adapter set attached under the coordinator's id (handle_lora):
 * this rank's share of it, and what it was made of (an ADD of the same
 * parts keeps it). */
typedef struct nlora {
    ie_lora_t *ad; /* NULL: the id is free                           */
    int wid;       /* its id in the worker (ie_worker_lora_add)      */
    int n;
    char name[IE_PROTO_LORA_PARTS][IE_PROTO_LORA_NAME_MAX];
    uint64_t fp[IE_PROTO_LORA_PARTS];
    float scale[IE_PROTO_LORA_PARTS];
} nlora_t;

typedef struct node {
    const ie_node_opts_t *o;
    ie_net_t *net;
    int own_net;
    ie_sock_t *coord; /* DEALER to the coordinator                        */
    ie_sock_t *pull;  /* peer input: partial sums, pipeline hops          */
    ie_sock_t *push[IE_PROTO_MAX_RANKS];
    char peer_ep[IE_PROTO_ENDPOINT_MAX];
    const char *public_key;

    ie_model_src_t *src;
    uint64_t fp, wfp;
    ie_worker_t *w;
    ie_msg_assign_t as; /* current assignment (valid when assigned)       */
    int assigned;       /* an ASSIGN was applied and the shard is loaded  */
    int registered;     /* the coordinator knows us (heard from it)       */
    int announced;      /* READY=1 sent to systemd                        */
    int node_id;        /* NUMA node bound to (-1 none)                   */
    char topo[IE_PROTO_TEXT_MAX];

    /* heartbeat thread */
    pthread_t hb;
    int hb_started;
    atomic_int hb_stop;
    atomic_int busy;
    atomic_int rank;
    atomic_uint_fast64_t epoch;
    atomic_int hb_ms;
    _Atomic double tick_ms; /* main loop's last sign of life            */

    /* step state */
    uint64_t cur_step;
    double transfer_ms;
    peerq_t pq[IE_PROTO_MAX_RANKS];
    /* same-host reduce of the current epoch (ie_shmreduce.h); NULL: none
     * or the cluster decided for ZeroMQ */
    ie_shmreduce_t *shm;
    uint64_t shm_cid, shm_epoch; /* the assignment it was set up for     */
    int shm_rank, shm_used;      /* shm_used: decided for shared memory  */
    int n_cpu;                   /* CPUs this process may use (at start) */
    float *hidden_out, *logits;
    size_t hidden_cap, logits_cap;
    float *embd; /* a step's IE_LOGITS_EMBD rows (head ranks)   */
    size_t embd_cap;
    /* chained steps (ie_proto.h): the previous step's ARGMAX answer of
     * this rank (n pairs; no head: none), valid for step am_step of epoch
     * am_epoch when am_n > 0; the tokens a chained step ran, the gather */
    float *am_prev, *gather;
    size_t am_cap, gather_cap;
    int am_n;
    uint64_t am_step, am_epoch;
    int32_t *chain_tok;
    size_t chain_cap;
    ie_parts_t in;
    ie_buf_t hdr;
    double last_coord_ms, last_hello_ms;
    /* LoRA adapters by the coordinator's id; a step's adapter frame
     * translated to the worker's ids */
    nlora_t lora[IE_PROTO_LORA_IDS];
    int32_t *ad_loc;
    size_t ad_cap;
    /* tests only (IE_TEST_LORA_ACK_DELAY_MS): an adapter attach's answer
     * is held that long while steps go on, the seam for checking that a
     * slow attach stalls only the request that waits for it */
    int ack_delay_ms;
    ie_msg_t held_ack;
    double held_due; /* 0: none held */
    /* LORA messages waiting for their answer, oldest first, and the
     * adapter thread that prepares their ADDs (the LoRA section below) */
    pthread_mutex_t lq_mu; /* guards the list's links and each state  */
    pthread_cond_t lq_cv;  /* work for the thread; an ADD prepared   */
    struct lora_req *lq_head, *lq_tail;
    int lq_n;
    int lq_stop;    /* the thread's cue to leave (lq_mu)          */
    int lq_started; /* 1 running, -1 could not start, 0 not yet   */
    int lq_init;    /* lq_mu and lq_cv made                       */
    pthread_t lq_thread;
    /* tests only (IE_TEST_LORA_PREP_DELAY_MS): an ADD's preparation
     * starts that much later, the seam for checking that the steps go
     * on meanwhile */
    int prep_delay_ms;

    /* metrics */
    ie_metric_t *m_compute, *m_transfer, *m_steps;
    char rank_label[16];
} node_t;

static void logf_(const node_t *nd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const node_t *nd, const char *fmt, ...)
{
    char line[1024], when[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s ie-worker[%d rank %d]: %s\n", ie_log_time(when, sizeof when), (int)getpid(),
            atomic_load(&nd->rank), line);
}

void ie_node_opts_default(ie_node_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->rank = -1;
    o->n_threads = 1;
    o->pin_threads = 1;
    o->numa_node = -1;
    o->peer_bind = "tcp://127.0.0.1:0";
}

/* ------------------------------------------------------------ sending */

static ie_status_t send_msg(ie_sock_t *s, ie_buf_t *hdr, const ie_msg_t *m, const ie_frame_t *extra, int n_extra,
                            int timeout_ms)
{
    ie_status_t st = ie_msg_encode(m, hdr);
    if (st != IE_OK) return st;
    ie_frame_t f[8];
    f[0] = (ie_frame_t){hdr->data, hdr->len};
    for (int i = 0; i < n_extra && i < 7; i++) f[i + 1] = extra[i];
    return ie_sock_send(s, f, 1 + n_extra, timeout_ms);
}

static void send_hello(node_t *nd)
{
    ie_msg_t m = {.kind = IE_MSG_HELLO};
    ie_msg_hello_t *h = &m.u.hello;
    h->rank = nd->assigned ? (int32_t)nd->as.rank : nd->o->rank;
    h->pid = (int32_t)getpid();
    h->numa_node = nd->node_id;
    h->n_threads = nd->o->n_threads;
    h->model_fp = nd->fp;
    h->weights_fp = nd->wfp;
    if (gethostname(h->host, sizeof h->host - 1) != 0) snprintf(h->host, sizeof h->host, "?");
    snprintf(h->peer_endpoint, sizeof h->peer_endpoint, "%s", nd->peer_ep);
    snprintf(h->public_key, sizeof h->public_key, "%s", nd->public_key ? nd->public_key : "");
    snprintf(h->topology, sizeof h->topology, "%s", nd->topo);
    if (send_msg(nd->coord, &nd->hdr, &m, NULL, 0, 100) != IE_OK && nd->o->verbose)
        logf_(nd, "hello not sent: %s", ie_error_last());
    nd->last_hello_ms = ie_now_ms();
}

static void send_result_error(node_t *nd, uint64_t epoch, uint64_t step, ie_status_t st, const char *why)
{
    ie_msg_t m = {.kind = IE_MSG_RESULT};
    m.u.result.epoch = epoch;
    m.u.result.step = step;
    m.u.result.rank = nd->assigned ? nd->as.rank : -1;
    m.u.result.status = st == IE_OK ? IE_ERR_INTERNAL : st;
    snprintf(m.u.result.error, sizeof m.u.result.error, "worker rank %d: %s", m.u.result.rank, why);
    send_msg(nd->coord, &nd->hdr, &m, NULL, 0, 1000);
}

/* ---------------------------------------------------------- heartbeat */

static void *hb_main(void *arg)
{
    node_t *nd = arg;
    ie_sock_t *s = NULL;
    ie_buf_t hdr = {0};
    if (ie_sock_new(nd->net, IE_SOCK_DEALER, &s) != IE_OK ||
        ie_sock_connect(s, nd->o->coordinator, nd->o->coordinator_key) != IE_OK) {
        logf_(nd, "heartbeat socket: %s", ie_error_last());
        goto done;
    }
    uint64_t wd_us = ie_sd_watchdog_usec();
    double last_wd = 0;
    while (!atomic_load(&nd->hb_stop)) {
        int r = atomic_load(&nd->rank);
        if (r >= 0) {
            ie_msg_t m = {.kind = IE_MSG_HEARTBEAT};
            m.u.heartbeat.epoch = atomic_load(&nd->epoch);
            m.u.heartbeat.rank = r;
            m.u.heartbeat.busy = atomic_load(&nd->busy);
            send_msg(s, &hdr, &m, NULL, 0, 0);
        }
        double t = ie_now_ms();
        /* the watchdog vouches for the main loop, not for this thread: ping
         * while the loop turns or a step is computing */
        if (wd_us && t - last_wd >= wd_us / 2000.0 &&
            (atomic_load(&nd->busy) || t - atomic_load(&nd->tick_ms) < wd_us / 2000.0)) {
            ie_sd_watchdog();
            last_wd = t;
        }
        int ms = atomic_load(&nd->hb_ms);
        for (int slept = 0; slept < ms && !atomic_load(&nd->hb_stop); slept += 20) usleep(20000);
    }
done:
    ie_sock_destroy(&s);
    ie_buf_free(&hdr);
    return NULL;
}

/* ------------------------------------------------------------- reduce */

static void pq_clear(node_t *nd)
{
    for (int r = 0; r < IE_PROTO_MAX_RANKS; r++) {
        peerq_t *q = &nd->pq[r];
        q->head = q->n = 0;
    }
}

static void pq_free(node_t *nd)
{
    for (int r = 0; r < IE_PROTO_MAX_RANKS; r++)
        for (int i = 0; i < QCAP; i++) ie_parts_free(&nd->pq[r].m[i]);
}

/* File a PARTIAL message (in nd->in) under its sender. */
static void pq_put(node_t *nd, const ie_msg_partial_t *h)
{
    if (h->from_rank < 0 || h->from_rank >= IE_PROTO_MAX_RANKS) return;
    if (h->epoch != atomic_load(&nd->epoch) || h->step < nd->cur_step) return; /* stale */
    peerq_t *q = &nd->pq[h->from_rank];
    if (q->n == QCAP) { /* cannot happen with in-order peers; drop oldest */
        q->head = (q->head + 1) % QCAP;
        q->n--;
    }
    int slot = (q->head + q->n) % QCAP;
    ie_parts_t tmp = q->m[slot]; /* swap buffers: no copy */
    q->m[slot] = nd->in;
    nd->in = tmp;
    q->h[slot] = *h;
    q->n++;
}

/* Same-host ranks: reduce through shared memory once every rank agreed
 * (ie_shmreduce_attach, at the first reduction of the epoch). Returns
 * IE_ERR_UNSUPPORTED when the cluster uses ZeroMQ; the handle is then gone. */
static ie_status_t shm_reduce(node_t *nd, int index, float *buf, size_t n, double t0)
{
    ie_status_t st = ie_shmreduce_attach(nd->shm, nd->as.dead_ms);
    if (st == IE_OK && !nd->shm_used) {
        nd->shm_used = 1;
        if (nd->o->verbose) logf_(nd, "tensor reduce: shared memory (%d ranks on this host)", nd->as.n_ranks);
    }
    if (st == IE_OK) {
        int left = nd->as.dead_ms - (int)(ie_now_ms() - t0);
        st = ie_shmreduce_run(nd->shm, nd->cur_step, index, buf, n, left > 0 ? left : 0);
    }
    if (st == IE_ERR_UNSUPPORTED) {
        if (nd->o->verbose) logf_(nd, "tensor reduce: ZeroMQ (%s)", ie_error_last());
        ie_shmreduce_destroy(&nd->shm);
    }
    return st;
}

static ie_status_t node_reduce(void *ctx, int index, float *buf, size_t n)
{
    node_t *nd = ctx;
    const int me = nd->as.rank, P = nd->as.n_ranks;
    double t0 = ie_now_ms();
    ie_status_t st = IE_OK;
    if (nd->shm && (st = shm_reduce(nd, index, buf, n, t0)) != IE_ERR_UNSUPPORTED) {
        nd->transfer_ms += ie_now_ms() - t0;
        return st;
    }
    st = IE_OK;
    ie_msg_t m = {.kind = IE_MSG_PARTIAL};
    m.u.partial.epoch = nd->as.epoch;
    m.u.partial.step = nd->cur_step;
    m.u.partial.from_rank = me;
    m.u.partial.index = index;
    m.u.partial.count = (int64_t)n;
    ie_frame_t f = {buf, n * sizeof(float)};
    for (int r = 0; r < P; r++) {
        if (r == me) continue;
        if ((st = send_msg(nd->push[r], &nd->hdr, &m, &f, 1, nd->as.dead_ms)) != IE_OK) {
            char why[IE_PROTO_TEXT_MAX]; /* ie_error_set must not read its own buffer */
            snprintf(why, sizeof why, "%s", ie_error_last());
            return ie_error_set(IE_ERR_UNAVAILABLE, "tensor reduce: cannot send to rank %d: %s", r, why);
        }
    }
    /* wait until every peer's queue head is this (step, index) */
    const float *part[IE_PROTO_MAX_RANKS];
    for (int r = 0; r < P; r++) {
        if (r == me) {
            part[r] = buf; /* summed in place: element j reads every part's j before writing it */
            continue;
        }
        peerq_t *q = &nd->pq[r];
        for (;;) {
            while (q->n > 0) { /* drop what belongs to earlier reductions */
                const ie_msg_partial_t *h = &q->h[q->head];
                if (h->step < nd->cur_step || (h->step == nd->cur_step && h->index < index)) {
                    q->head = (q->head + 1) % QCAP;
                    q->n--;
                } else {
                    break;
                }
            }
            if (q->n > 0) break;
            int left = (int)(nd->as.dead_ms - (ie_now_ms() - t0));
            if (left <= 0)
                return ie_error_set(IE_ERR_UNAVAILABLE, "tensor reduce: no partial sum from rank %d within %d ms",
                                    r, nd->as.dead_ms);
            st = ie_sock_recv(nd->pull, &nd->in, left);
            if (st == IE_ERR_TIMEOUT) continue;
            if (st != IE_OK) return st;
            ie_msg_t pm;
            if (ie_msg_decode(nd->in.data[0], nd->in.size[0], &pm) != IE_OK || pm.kind != IE_MSG_PARTIAL) {
                logf_(nd, "peer socket: dropped a malformed message (%s)", ie_error_last());
                continue;
            }
            if (nd->in.n != 2 || nd->in.size[1] != (size_t)pm.u.partial.count * sizeof(float)) {
                logf_(nd, "peer socket: partial sum frame of %zu bytes for %lld floats dropped",
                      nd->in.n > 1 ? nd->in.size[1] : 0, (long long)pm.u.partial.count);
                continue;
            }
            pq_put(nd, &pm.u.partial);
        }
        const ie_msg_partial_t *h = &q->h[q->head];
        if (h->step != nd->cur_step || h->index != index || (size_t)h->count != n)
            return ie_error_set(IE_ERR_INTERNAL,
                                "tensor reduce: rank %d sent step %llu index %d (%lld floats), "
                                "expected step %llu index %d (%zu)",
                                r, (unsigned long long)h->step, h->index, (long long)h->count,
                                (unsigned long long)nd->cur_step, index, n);
        part[r] = q->m[q->head].data[1];
    }
    ie_reduce_rank_sum(buf, part, P, n); /* the same expression as the shared-memory path */
    for (int r = 0; r < P; r++) {
        if (r == me) continue;
        peerq_t *q = &nd->pq[r];
        q->head = (q->head + 1) % QCAP;
        q->n--;
    }
    nd->transfer_ms += ie_now_ms() - t0;
    return IE_OK;
}

static int grow(float **p, size_t *cap, size_t n)
{
    if (*cap >= n) return 0;
    float *q = realloc(*p, n * sizeof(float));
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* The forward pass's reductions are numbered from 1: a chained step's
 * token gather is reduction 0 of its step. */
static ie_status_t node_reduce_fwd(void *ctx, int index, float *buf, size_t n)
{
    return node_reduce(ctx, index + 1, buf, n);
}

/* A chained step's tokens (ie_proto.h, "chained steps"): every rank's
 * arg max of the previous step's entries, summed into one gather vector,
 * and the same pick as the coordinator's merge. Into nd->chain_tok. */
static ie_status_t chain_tokens(node_t *nd, const ie_msg_step_t *h)
{
    const int P = nd->as.n_ranks, n = h->n;
    const ie_hparams_t *hp = ie_worker_hparams(nd->w);
    ie_status_t why = IE_OK; /* this rank cannot chain: it says so in the gather, so every rank fails alike */
    if (nd->as.plan != IE_SHARD_TENSOR)
        return ie_error_set(IE_ERR_INVAL, "chained step: only tensor plans chain steps");
    const size_t len = ie_chain_gather_len(P, n);
    if (P > 1 && len > (size_t)nd->as.max_batch * (size_t)hp->n_embd)
        return ie_error_set(IE_ERR_RANGE, "chained step: %d ranks x %d entries do not fit one reduction", P, n);
    if (nd->am_n != n || nd->am_step + 1 != h->step || nd->am_epoch != h->epoch)
        why = ie_error_set(IE_ERR_INVAL, "chained step %llu: rank %d has no arg max of %d entries from step %llu",
                           (unsigned long long)h->step, nd->as.rank, n, (unsigned long long)h->step - 1);
    if (nd->chain_cap < (size_t)n) {
        int32_t *t = realloc(nd->chain_tok, (size_t)n * sizeof *t);
        if (!t) return ie_error_set(IE_ERR_NOMEM, "out of memory");
        nd->chain_tok = t;
        nd->chain_cap = (size_t)n;
    }
    if (grow(&nd->gather, &nd->gather_cap, len) != 0) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    ie_chain_gather_put(nd->gather, P, nd->as.rank, n, ie_worker_shard(nd->w)->has_head ? nd->am_prev : NULL);
    if (why != IE_OK) /* an id of -1 is refused by every rank's pick */
        for (int i = 0; i < n; i++) nd->gather[ie_chain_gather_len(nd->as.rank, n) + 2 * (size_t)i + 1] = -1.0f;
    char reason[IE_PROTO_TEXT_MAX];
    snprintf(reason, sizeof reason, "%s", why != IE_OK ? ie_error_last() : "");
    ie_status_t st = P > 1 ? node_reduce(nd, 0, nd->gather, len) : IE_OK;
    if (st == IE_OK) st = ie_chain_gather_pick(nd->gather, P, n, hp->n_vocab, nd->chain_tok);
    if (why != IE_OK) return ie_error_set(why, "%s", reason);
    return st;
}

/* Remember this rank's ARGMAX answer of step h (all n entries ARGMAX in a
 * tensor plan; else nothing to chain on). packed: the RESULT payload. */
static void chain_note(node_t *nd, const ie_msg_step_t *h, const uint8_t *flags, const float *packed)
{
    nd->am_n = 0;
    if (nd->as.plan != IE_SHARD_TENSOR || h->n < 1) return;
    for (int i = 0; i < h->n; i++)
        if (flags[i] != IE_LOGITS_ARGMAX) return;
    if (packed && grow(&nd->am_prev, &nd->am_cap, (size_t)2 * h->n) != 0) return;
    if (packed) memcpy(nd->am_prev, packed, (size_t)2 * h->n * sizeof(float));
    nd->am_n = h->n;
    nd->am_step = h->step;
    nd->am_epoch = h->epoch;
}

/* ------------------------------------------------------------- assign */

static int same_shard(const ie_msg_assign_t *a, const ie_msg_assign_t *b)
{
    return a->plan == b->plan && a->rank == b->rank && a->n_ranks == b->n_ranks && a->n_ctx == b->n_ctx &&
           a->n_seq == b->n_seq && a->max_batch == b->max_batch && a->precision == b->precision &&
           a->kv_block == b->kv_block && a->kv_blocks == b->kv_blocks && a->kv_type_k == b->kv_type_k &&
           a->kv_type_v == b->kv_type_v && a->kv_rotate == b->kv_rotate && a->kv_swa_full == b->kv_swa_full;
}

/* CPUs for this rank's pool: AFFINITY=<list> as given; "auto": when
 * several ranks share the machine, rank r takes the r-th block of
 * n_threads CPUs of the allowed set (so two 1-thread workers on a 2-core
 * node do not both pin to core 0); "none": leave the affinity alone. */
static void apply_affinity(node_t *nd, int rank)
{
    const char *aff = nd->o->affinity ? nd->o->affinity : getenv("AFFINITY");
    if (aff && !strcmp(aff, "none")) return;
    cpu_set_t allowed, set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    if (aff && *aff && strcmp(aff, "auto") != 0 && strcmp(aff, "compact") != 0 && strcmp(aff, "scatter") != 0) {
        const char *p = aff;
        while (*p) {
            char *end;
            long a = strtol(p, &end, 10), b = a;
            if (end == p || a < 0 || a >= CPU_SETSIZE) break;
            p = end;
            if (*p == '-') {
                b = strtol(p + 1, &end, 10);
                if (end == p + 1 || b < a || b >= CPU_SETSIZE) break;
                p = end;
            }
            for (long c = a; c <= b; c++) CPU_SET((int)c, &set);
            if (*p == ',') p++;
            else break;
        }
        if (*p || CPU_COUNT(&set) == 0) {
            logf_(nd, "AFFINITY='%s' is not a CPU list; ignored", aff);
            return;
        }
    } else {
        int cpus[CPU_SETSIZE], n = 0;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
        int k = nd->o->n_threads;
        if (n == 0 || k >= n) return;
        int first = (rank * k) % n;
        for (int i = 0; i < k; i++) CPU_SET(cpus[(first + i) % n], &set);
    }
    if (sched_setaffinity(0, sizeof set, &set) != 0) logf_(nd, "sched_setaffinity: %s", strerror(errno));
}

static void close_peers(node_t *nd)
{
    for (int r = 0; r < IE_PROTO_MAX_RANKS; r++) ie_sock_destroy(&nd->push[r]);
}

static ie_status_t connect_peers(node_t *nd)
{
    const ie_msg_assign_t *a = &nd->as;
    close_peers(nd);
    for (int r = 0; r < a->n_ranks; r++) {
        int want = a->plan == IE_SHARD_TENSOR ? r != a->rank : r == a->rank + 1;
        if (!want) continue;
        /* ZeroMQ would connect in the background and retry for ever: a peer
         * address that cannot be reached (a wildcard advertised as
         * loopback, a wrong --advertise, a firewall) is said here, before
         * READY, instead of as a failed reduction at the first step */
        if (ie_endpoint_probe(a->peer_endpoint[r], 2000) != IE_OK) {
            char why[IE_PROTO_TEXT_MAX];
            snprintf(why, sizeof why, "%s", ie_error_last());
            return ie_error_set(IE_ERR_UNAVAILABLE,
                                "peer rank %d's address is not reachable from this host (%s): check that worker's "
                                "--peer-bind and --advertise",
                                r, why);
        }
        ie_status_t st = ie_sock_new(nd->net, IE_SOCK_PUSH, &nd->push[r]);
        if (st == IE_OK)
            st = ie_sock_connect(nd->push[r], a->peer_endpoint[r], a->peer_key[r][0] ? a->peer_key[r] : NULL);
        if (st != IE_OK) return st;
    }
    return IE_OK;
}

/* Tensor ranks: this epoch's shared-memory segment, made before READY so
 * that it exists when any peer runs its first reduction (the coordinator
 * sends no STEP before every rank is READY). A repeated ASSIGN of the same
 * epoch keeps what is there (peers may have mapped it, or decided). A
 * segment that cannot be made only means ZeroMQ: the peers, unable to open
 * it, decide so too. */
static void setup_shm(node_t *nd, const ie_msg_assign_t *a)
{
    if (nd->shm_cid == a->cluster_id && nd->shm_epoch == a->epoch && nd->shm_rank == a->rank && a->cluster_id)
        return;
    ie_shmreduce_destroy(&nd->shm);
    nd->shm_cid = a->cluster_id;
    nd->shm_epoch = a->epoch;
    nd->shm_rank = a->rank;
    nd->shm_used = 0;
    if (a->plan != IE_SHARD_TENSOR || a->n_ranks < 2) return;
    if (a->cluster_id == 0 || !ie_shmreduce_enabled()) {
        if (nd->o->verbose)
            logf_(nd, "tensor reduce: ZeroMQ (%s)",
                  a->cluster_id ? "IE_TP_SHM=0" : "the coordinator sent no cluster id");
        return;
    }
    ie_shmreduce_opts_t so = {.cluster_id = a->cluster_id,
                              .epoch = a->epoch,
                              .rank = a->rank,
                              .n_ranks = a->n_ranks,
                              .max_floats = (size_t)a->max_batch * (size_t)ie_worker_hparams(nd->w)->n_embd};
    /* A waiting rank spins briefly (its peers run on their own cores, the
     * wait is short) unless the ranks' threads outnumber the CPUs (say 3
     * ranks on 2 cores): then a spinning rank holds a core a peer needs,
     * so it sleeps at once (measured: tensor:3 on 2 cores 105 t/s spinning
     * 50 us, 160 t/s sleeping, 131-146 over ZeroMQ). Peers are assumed to
     * run as many threads as this rank. */
    if (nd->n_cpu > 0 && (long)a->n_ranks * nd->o->n_threads > nd->n_cpu) so.spin_us = -1;
    if (ie_shmreduce_new(&so, &nd->shm) != IE_OK && nd->o->verbose)
        logf_(nd, "tensor reduce: ZeroMQ (no shared-memory segment: %s)", ie_error_last());
}

/* ------------------------------------------------------------- LoRA
 *
 * LORA messages are answered in the order they came: the coordinator
 * counts a joining rank ready at the answer to its last one and takes the
 * refusals of those before it (docs/PROTOCOL.md). An ADD's slow half —
 * read each part from this host's disk, check its fingerprint, sum a set
 * (ie_lora_concat), cut this rank's share (ie_lora_slice), make the copy
 * the worker runs (ie_worker_lora_prepare: int8) — runs on the adapter
 * thread while the main loop steps on; its cheap half (the set published
 * under its id, ie_worker_lora_attach) runs on the main loop between two
 * steps, and then the answer goes out. So the messages wait in a queue
 * (lq_*, oldest first): its head is applied and answered once ready (a
 * KEEP or REMOVE at once, an ADD once prepared); the adapter thread
 * prepares the ADDs one at a time, in order.
 *
 * A drop of an id whose ADD is still queued or being prepared (a REMOVE
 * of it, a KEEP without its bit, a reload of the shard) supersedes that
 * ADD: its preparation stops at the next part or stage (a file being read
 * is read to its end), nothing is attached, and it is answered IE_OK in
 * its place — in order it would have been attached and at once detached.
 * The coordinator sends such a drop only once it gave up on the ADD (a
 * refusal elsewhere, its time limit), so nobody waits for that outcome. */

/* Messages waiting; past that the main loop waits for the head (a
 * joining rank is sent a KEEP and <= 32 ADDs at once). */
#define LQ_MAX 64

enum { LQ_WAITING, LQ_RUNNING, LQ_DONE };

/* One LORA message waiting for its answer. The main loop makes, walks
 * and frees it; `state` is shared (nd->lq_mu), and while it is LQ_RUNNING
 * the outcome fields (st, err, ad, run) are the adapter thread's. */
typedef struct lora_req {
    struct lora_req *next;
    ie_msg_lora_t m;
    uint64_t fp[IE_PROTO_LORA_PARTS]; /* ADD: each part's fingerprint    */
    float sc[IE_PROTO_LORA_PARTS];    /* ... and scale                   */
    /* ... and where this host reads it (lora_path) */
    char path[IE_PROTO_LORA_PARTS][IE_PROTO_LORA_PATH_MAX + 256];
    ie_worker_lora_target_t t;   /* what the set must fit               */
    int delay_ms;                /* IE_TEST_LORA_PREP_DELAY_MS          */
    int prep;                    /* an ADD with a set to prepare        */
    int superseded;              /* dropped before attached (above)     */
    atomic_int cancel;           /* ... told to the adapter thread      */
    int state;                   /* LQ_* (nd->lq_mu)                    */
    ie_status_t st;              /* the outcome: IE_OK or a refusal     */
    char err[IE_PROTO_TEXT_MAX]; /* ... and its message                 */
    ie_lora_t *ad;               /* this rank's share of the set        */
    ie_lora_t *run;              /* what the worker runs: ad's int8
                                    copy, or NULL (ad itself)           */
} lora_req_t;

/* Detach and free the set under the coordinator's id (free: nothing). */
static void lora_drop(node_t *nd, int id)
{
    nlora_t *e = &nd->lora[id];
    if (!e->ad) return;
    if (nd->w) ie_worker_lora_remove(nd->w, e->wid);
    ie_lora_destroy(&e->ad);
    memset(e, 0, sizeof *e);
}

static void lora_drop_all(node_t *nd)
{
    for (int id = 0; id < IE_PROTO_LORA_IDS; id++) lora_drop(nd, id);
}

/* Where this host keeps the adapter the coordinator has at `path`:
 * --lora-dir DIR rewrites it to DIR/<its last component>. */
static void lora_path(const node_t *nd, const char *path, char *out, size_t cap)
{
    if (!nd->o->lora_dir) {
        snprintf(out, cap, "%s", path);
        return;
    }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* "dir/" names dir */
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(out, cap, "%s/%.*s", nd->o->lora_dir, (int)(n - b), path + b);
}

static int lq_cancelled(lora_req_t *r) { return atomic_load(&r->cancel); }

/* The slow half of ADD r, on the adapter thread (on the main loop when
 * that thread could not start): load its parts from this host's disk
 * (each file's fingerprint must be the coordinator's), sum them
 * (ie_lora_concat), cut this rank's share (ie_lora_slice: r->ad) and make
 * what the worker runs (ie_worker_lora_prepare: r->run). Reads and writes
 * r alone, never the node or the worker: it runs while they step. Stops
 * between parts and stages once superseded. The outcome in r->st / r->err
 * (errors name the adapter and path). */
static void lora_prepare(lora_req_t *r)
{
    ie_status_t st = IE_OK;
    ie_lora_t *parts[IE_PROTO_LORA_PARTS] = {0}, *sum = NULL;
    const ie_msg_lora_t *lm = &r->m;
    const int n = lm->n_name;
    const ie_hparams_t *hp = &r->t.hp;
    for (int slept = 0; slept < r->delay_ms && !lq_cancelled(r); slept += 10) usleep(10000); /* the test seam */
    for (int i = 0; i < n && st == IE_OK; i++) {
        char why[IE_PROTO_TEXT_MAX];
        uint64_t f = 0;
        if (lq_cancelled(r)) {
            st = ie_error_set(IE_ERR_UNAVAILABLE, "adapter set %d: dropped before it was attached", lm->id);
            break;
        }
        /* the cheap check first: a differing copy is said as such, not as
         * whatever shape error its bytes would give */
        if ((st = ie_lora_fingerprint(r->path[i], &f)) != IE_OK) {
            snprintf(why, sizeof why, "%s", ie_error_last());
            st = ie_error_set(st, "adapter '%s': %s", lm->name[i], why);
        } else if (f != r->fp[i]) {
            st = ie_error_set(IE_ERR_INVAL,
                              "adapter '%s': '%s' on this host differs from the coordinator's copy (fingerprint "
                              "%016llx, the coordinator's %016llx)",
                              lm->name[i], r->path[i], (unsigned long long)f, (unsigned long long)r->fp[i]);
        } else if ((st = ie_lora_load(r->path[i], hp, &parts[i])) != IE_OK) {
            snprintf(why, sizeof why, "%s", ie_error_last());
            st = ie_error_set(st, "adapter '%s': %s", lm->name[i], why);
        } else if (parts[i]->fingerprint != r->fp[i]) { /* changed between the two reads */
            st = ie_error_set(IE_ERR_INVAL, "adapter '%s': '%s' changed while it was read", lm->name[i],
                              r->path[i]);
        }
    }
    if (st == IE_OK && n > 1) st = ie_lora_concat((const ie_lora_t *const *)parts, r->sc, n, &sum);
    if (st == IE_OK) st = ie_lora_slice(n > 1 ? sum : parts[0], hp, &r->t.sh, &r->ad);
    if (st == IE_OK && !lq_cancelled(r)) st = ie_worker_lora_prepare(&r->t, r->ad, &r->run);
    for (int i = 0; i < n; i++) ie_lora_destroy(&parts[i]);
    ie_lora_destroy(&sum);
    r->st = st;
    if (st != IE_OK) snprintf(r->err, sizeof r->err, "%s", ie_error_last());
}

/* The adapter thread: prepare the queue's ADDs, oldest first, until
 * lq_stop; each one done wakes a main loop waiting for it (lq_pump). */
static void *lq_main(void *arg)
{
    node_t *nd = arg;
    pthread_mutex_lock(&nd->lq_mu);
    while (!nd->lq_stop) {
        lora_req_t *r = nd->lq_head;
        while (r && !(r->prep && r->state == LQ_WAITING)) r = r->next;
        if (!r) {
            pthread_cond_wait(&nd->lq_cv, &nd->lq_mu);
            continue;
        }
        r->state = LQ_RUNNING;
        pthread_mutex_unlock(&nd->lq_mu);
        lora_prepare(r);
        pthread_mutex_lock(&nd->lq_mu);
        r->state = LQ_DONE;
        pthread_cond_broadcast(&nd->lq_cv);
    }
    pthread_mutex_unlock(&nd->lq_mu);
    return NULL;
}

static void lora_req_free(lora_req_t **rp)
{
    lora_req_t *r = *rp;
    if (!r) return;
    ie_lora_destroy(&r->ad);
    ie_lora_destroy(&r->run);
    free(r);
    *rp = NULL;
}

/* Whether the set under r's id is r's already: the same names,
 * fingerprints and scales (an ADD of it keeps it). */
static int lora_same(const node_t *nd, const lora_req_t *r)
{
    const nlora_t *e = &nd->lora[r->m.id];
    int same = e->ad && e->n == r->m.n_name;
    for (int i = 0; same && i < r->m.n_name; i++)
        same = !strcmp(e->name[i], r->m.name[i]) && e->fp[i] == r->fp[i] && e->scale[i] == r->sc[i];
    return same;
}

/* Whether a message still queued may change the set under id (a KEEP may
 * change any). The main loop alone writes the list: it walks it unlocked. */
static int lq_touches(const node_t *nd, int id)
{
    for (const lora_req_t *r = nd->lq_head; r; r = r->next)
        if (r->m.op == IE_LORA_OP_KEEP || r->m.id == id) return 1;
    return 0;
}

/* Drops of the ids in mask supersede their queued ADDs (the rule above). */
static void lq_supersede(node_t *nd, uint64_t mask)
{
    for (lora_req_t *r = nd->lq_head; r; r = r->next)
        if (r->m.op == IE_LORA_OP_ADD && ((mask >> r->m.id) & 1) && !r->superseded) {
            r->superseded = 1;
            atomic_store(&r->cancel, 1);
        }
}

/* Send the LORA_ACK of message lm: st, and for a refusal the calling
 * thread's ie_error_last(), named by rank. */
static void lora_answer(node_t *nd, const ie_msg_lora_t *lm, ie_status_t st)
{
    ie_msg_t m = {.kind = IE_MSG_LORA_ACK};
    ie_msg_lora_ack_t *k = &m.u.lora_ack;
    k->seq = lm->seq;
    k->rank = nd->assigned ? nd->as.rank : -1;
    k->id = lm->id;
    k->status = st;
    if (st != IE_OK) {
        snprintf(k->error, sizeof k->error, "worker rank %d: %s", k->rank, ie_error_last());
        if (!nd->o->quiet) logf_(nd, "LoRA: %s", k->error);
    }
    if (lm->op == IE_LORA_OP_ADD && nd->ack_delay_ms > 0) {
        if (nd->held_due > 0) send_msg(nd->coord, &nd->hdr, &nd->held_ack, NULL, 0, 1000);
        nd->held_ack = m;
        nd->held_due = ie_now_ms() + nd->ack_delay_ms;
    } else {
        send_msg(nd->coord, &nd->hdr, &m, NULL, 0, 1000);
    }
}

/* Apply message r, the queue's head and ready (its ADD prepared), to the
 * attached sets, on the main loop between two steps, and answer it. */
static void lora_apply(node_t *nd, lora_req_t *r)
{
    const ie_msg_lora_t *lm = &r->m;
    ie_status_t st = IE_OK;
    if (!r->prep && r->st != IE_OK) { /* refused on arrival: no shard, a malformed message */
        st = ie_error_set(r->st, "%s", r->err);
        goto reply;
    }
    if (lm->op == IE_LORA_OP_KEEP) {
        for (int id = 0; id < IE_PROTO_LORA_IDS; id++)
            if (!((lm->keep >> id) & 1)) lora_drop(nd, id);
        goto reply;
    }
    if (lm->op == IE_LORA_OP_REMOVE) {
        lora_drop(nd, lm->id);
        goto reply;
    }
    if (r->superseded) {
        if (nd->o->verbose) logf_(nd, "adapter set %d dropped before it was attached", lm->id);
        goto reply;
    }
    if (lora_same(nd, r)) goto reply; /* a rank joining is sent what it may hold already */
    lora_drop(nd, lm->id);
    if (!r->prep || !nd->w) { /* cannot be: a set not held is prepared, a reload supersedes */
        st = ie_error_set(IE_ERR_INTERNAL, "adapter set %d: nothing prepared to attach", lm->id);
        goto reply;
    }
    if (r->st != IE_OK) {
        st = ie_error_set(r->st, "%s", r->err);
        goto reply;
    }
    const int n = lm->n_name;
    int wid = -1;
    if ((st = ie_worker_lora_attach(nd->w, &r->t, r->ad, &r->run, n > 1 ? 1.0f : r->sc[0], &wid)) != IE_OK)
        goto reply;
    nlora_t *e = &nd->lora[lm->id];
    e->ad = r->ad;
    r->ad = NULL;
    e->wid = wid;
    e->n = n;
    for (int i = 0; i < n; i++) {
        snprintf(e->name[i], sizeof e->name[i], "%s", lm->name[i]);
        e->fp[i] = r->fp[i];
        e->scale[i] = r->sc[i];
    }
    if (nd->o->verbose)
        logf_(nd, "adapter set %d attached (%s%s, %.3f MB here)", lm->id, lm->name[0], n > 1 ? ", ..." : "",
              e->ad->bytes / 1e6);

reply:
    lora_answer(nd, lm, st);
}

/* Apply and answer the queue's messages from its head while they are
 * ready; wait: wait for each, until the queue is empty. Main loop. */
static void lq_pump(node_t *nd, int wait)
{
    for (;;) {
        pthread_mutex_lock(&nd->lq_mu);
        lora_req_t *r = nd->lq_head;
        while (wait && r && r->prep && r->state != LQ_DONE) pthread_cond_wait(&nd->lq_cv, &nd->lq_mu);
        if (r && r->prep && r->state != LQ_DONE) r = NULL; /* still being prepared */
        if (r) {
            nd->lq_head = r->next;
            if (!nd->lq_head) nd->lq_tail = NULL;
            nd->lq_n--;
        }
        pthread_mutex_unlock(&nd->lq_mu);
        if (!r) return;
        lora_apply(nd, r);
        lora_req_free(&r);
    }
}

/* Queue r behind the messages before it. An ADD to prepare wakes the
 * adapter thread (started at the first); when it cannot start, r is
 * prepared here and now, on the main loop, as before that thread was. */
static void lq_push(node_t *nd, lora_req_t *r)
{
    if (r->prep && !nd->lq_started) {
        const int rc = pthread_create(&nd->lq_thread, NULL, lq_main, nd);
        if (rc == 0) {
            nd->lq_started = 1;
            pthread_setname_np(nd->lq_thread, "ie-lora");
        } else {
            nd->lq_started = -1;
            logf_(nd, "warning: no adapter thread (%s): adapters load on the main loop, between steps",
                  strerror(rc));
        }
    }
    if (r->prep && nd->lq_started < 0) {
        lora_prepare(r);
        r->state = LQ_DONE;
    }
    pthread_mutex_lock(&nd->lq_mu);
    if (nd->lq_tail) nd->lq_tail->next = r;
    else nd->lq_head = r;
    nd->lq_tail = r;
    nd->lq_n++;
    pthread_cond_broadcast(&nd->lq_cv);
    pthread_mutex_unlock(&nd->lq_mu);
}

/* Stop the adapter thread (what it prepares is dropped at its next
 * stage) and free the messages still queued, unanswered: the node is
 * leaving. */
static void lq_stop(node_t *nd)
{
    pthread_mutex_lock(&nd->lq_mu);
    nd->lq_stop = 1;
    for (lora_req_t *r = nd->lq_head; r; r = r->next) atomic_store(&r->cancel, 1);
    pthread_cond_broadcast(&nd->lq_cv);
    pthread_mutex_unlock(&nd->lq_mu);
    if (nd->lq_started > 0) pthread_join(nd->lq_thread, NULL);
    nd->lq_started = 0;
    while (nd->lq_head) {
        lora_req_t *r = nd->lq_head;
        nd->lq_head = r->next;
        lora_req_free(&r);
    }
    nd->lq_tail = NULL;
    nd->lq_n = 0;
}

/* A LORA from the coordinator (ie_proto.h): queued behind the messages
 * before it, its ADD prepared on the adapter thread, applied and answered
 * (LORA_ACK) on this loop once ready (lq_pump). */
static void handle_lora(node_t *nd, const ie_msg_lora_t *lm)
{
    const ie_parts_t *in = &nd->in;
    lora_req_t *r = calloc(1, sizeof *r);
    if (!r) { /* answered at once: out of order, but answered */
        lora_answer(nd, lm, ie_error_set(IE_ERR_NOMEM, "out of memory"));
        return;
    }
    r->m = *lm;
    atomic_init(&r->cancel, 0);
    r->state = LQ_WAITING;
    if (!nd->assigned || !nd->w) {
        r->st = ie_error_set(IE_ERR_UNAVAILABLE, "no shard loaded");
    } else if (lm->op == IE_LORA_OP_KEEP) {
        lq_supersede(nd, ~(uint64_t)lm->keep);
    } else if (lm->op == IE_LORA_OP_REMOVE) {
        lq_supersede(nd, (uint64_t)1 << lm->id);
    } else if (in->n != 3 || in->size[1] != (size_t)lm->n_name * sizeof(uint64_t) ||
               in->size[2] != (size_t)lm->n_name * sizeof(float)) {
        r->st = ie_error_set(IE_ERR_FORMAT, "malformed lora message (frame sizes)");
    } else {
        memcpy(r->fp, in->data[1], in->size[1]);
        memcpy(r->sc, in->data[2], in->size[2]);
        /* a set held already is kept without a read; when a message still
         * queued may change it, lora_apply decides at its turn */
        r->prep = lq_touches(nd, lm->id) || !lora_same(nd, r);
        if (r->prep) {
            for (int i = 0; i < lm->n_name; i++) lora_path(nd, lm->path[i], r->path[i], sizeof r->path[i]);
            ie_worker_lora_target(nd->w, &r->t);
            r->delay_ms = nd->prep_delay_ms;
        }
    }
    if (r->st != IE_OK) snprintf(r->err, sizeof r->err, "%s", ie_error_last());
    lq_push(nd, r);
    lq_pump(nd, nd->lq_n > LQ_MAX);
}

static void handle_assign(node_t *nd, const ie_msg_assign_t *a)
{
    ie_status_t st = IE_OK;
    double t0 = ie_now_ms();
    char why[IE_PROTO_TEXT_MAX] = "";
    int reload = !nd->assigned || !nd->w || !same_shard(&nd->as, a);

    if (a->rank < 0 || a->rank >= a->n_ranks || a->n_ranks > IE_PROTO_MAX_RANKS) {
        st = ie_error_set(IE_ERR_FORMAT, "assignment of rank %d of %d", a->rank, a->n_ranks);
        goto reply;
    }
    atomic_store(&nd->rank, a->rank);
    snprintf(nd->rank_label, sizeof nd->rank_label, "%d", a->rank);
    /* heartbeats carry the new epoch while the shard loads, so a load
     * longer than dead_ms does not look like a dead worker */
    atomic_store(&nd->epoch, a->epoch);
    if (reload) {
        /* the ADDs still queued were for the old shard: superseded (the
         * LoRA section's rule) and answered before READY, as before */
        lq_supersede(nd, ~(uint64_t)0);
        lq_pump(nd, 1);
        lora_drop_all(nd); /* the coordinator sends them again once READY */
        ie_worker_destroy(&nd->w);
        nd->assigned = 0;
        if (nd->o->numa_node < 0) {
            ie_topo_t t;
            int node = -1;
            const char *pol = nd->o->numa_policy ? nd->o->numa_policy : getenv("NUMA_POLICY");
            const int automatic = !pol || !*pol || !strcmp(pol, "auto");
            if ((st = ie_topo_read(&t)) != IE_OK ||
                (st = ie_numa_pick(&t, pol, a->rank, a->n_ranks, &node)) != IE_OK ||
                (node >= 0 && (st = ie_numa_bind(node)) != IE_OK)) {
                /* a policy that names a node is a configuration error; "auto"
                 * is only a wish (hwloc and libnuma can disagree, a cgroup
                 * can refuse the node): run unbound and say so */
                if (!automatic) goto reply;
                logf_(nd, "warning: NUMA_POLICY=auto: no binding for rank %d (%s); running unbound", a->rank,
                      ie_error_last());
                node = -1;
                st = IE_OK;
            }
            nd->node_id = node;
        }
        apply_affinity(nd, a->rank);
        ie_worker_opts_t wo;
        ie_worker_opts_default(&wo);
        wo.n_threads = nd->o->n_threads;
        wo.pin_threads = nd->o->pin_threads;
        wo.n_ctx = a->n_ctx;
        wo.n_seq = a->n_seq;
        wo.max_batch = a->max_batch;
        wo.kv_block = a->kv_block;
        wo.kv_blocks = a->kv_blocks;
        wo.kv_type_k = (ie_kv_type_t)a->kv_type_k;
        wo.kv_type_v = (ie_kv_type_t)a->kv_type_v;
        wo.kv_rotate = (ie_kv_rotate_t)a->kv_rotate;
        wo.kv_swa_full = a->kv_swa_full;
        wo.precision = (ie_precision_t)a->precision;
        wo.shard = (ie_shard_t){(ie_shard_kind_t)a->plan, a->rank, a->n_ranks};
        wo.reduce = node_reduce_fwd;
        wo.reduce_ctx = nd;
        if ((st = ie_worker_new(nd->src, &wo, &nd->w)) != IE_OK) goto reply;
    }
    nd->as = *a;
    atomic_store(&nd->epoch, a->epoch);
    atomic_store(&nd->hb_ms, a->heartbeat_ms > 0 ? a->heartbeat_ms : 250);
    pq_clear(nd);
    nd->cur_step = 0;
    if ((st = connect_peers(nd)) != IE_OK) goto reply;
    setup_shm(nd, a);
    nd->assigned = 1;

reply:
    if (st != IE_OK) {
        snprintf(why, sizeof why, "%s", ie_error_last());
        ie_shmreduce_destroy(&nd->shm); /* whatever it was for is over */
        nd->shm_cid = 0;
    }
    ie_msg_t m = {.kind = IE_MSG_READY};
    m.u.ready.epoch = a->epoch;
    m.u.ready.rank = a->rank;
    m.u.ready.status = st;
    m.u.ready.load_ms = ie_now_ms() - t0;
    m.u.ready.weight_bytes = nd->w ? ie_worker_weight_bytes(nd->w) : 0;
    snprintf(m.u.ready.error, sizeof m.u.ready.error, "%s", why);
    send_msg(nd->coord, &nd->hdr, &m, NULL, 0, 1000);
    if (st != IE_OK) {
        if (!nd->o->quiet) logf_(nd, "shard load failed: %s", why);
        return;
    }
    const ie_shard_range_t *r = ie_worker_shard(nd->w);
    if (nd->o->verbose)
        logf_(nd, "%s rank %d of %d: layers %d-%d, heads %d-%d (kv %d-%d), vocab %lld-%lld, %.1f MB, %s in %.0f ms",
              ie_shard_kind_name((ie_shard_kind_t)a->plan), a->rank, a->n_ranks, r->layer_begin, r->layer_end - 1,
              r->head_begin, r->head_end - 1, r->kv_head_begin, r->kv_head_end - 1, (long long)r->vocab_begin,
              (long long)r->vocab_end - 1, ie_worker_weight_bytes(nd->w) / 1e6, reload ? "loaded" : "kept",
              m.u.ready.load_ms);
    if (reload && !nd->o->quiet && ie_worker_hot_report(nd->w)[0]) /* IE_HOT_REPLICATE asked for */
        logf_(nd, "hot weights: %s", ie_worker_hot_report(nd->w));
    ie_sd_status("rank %d of %d (%s), epoch %llu", a->rank, a->n_ranks,
                 ie_shard_kind_name((ie_shard_kind_t)a->plan), (unsigned long long)a->epoch);
    if (!nd->announced) {
        char s[128];
        snprintf(s, sizeof s, "shard loaded: rank %d of %d", a->rank, a->n_ranks);
        ie_sd_ready(s);
        nd->announced = 1;
    }
}

/* --------------------------------------------------------------- step */

/* Apply a validated frame of KV operations (ie_proto.h) in order, up to
 * the first the worker refuses (its predecessors stay applied, as separate
 * calls on an embedded worker would). */
static ie_status_t apply_kv(node_t *nd, const int32_t *words, size_t n_words)
{
    ie_kv_op_t op;
    size_t off = 0;
    ie_status_t st = IE_OK;
    for (int k = 0; ie_kv_ops_next(words, n_words, &off, &op); k++) {
        switch (op.kind) {
        case IE_KV_OP_CLEAR: ie_worker_seq_clear(nd->w, op.seq); break;
        case IE_KV_OP_BIND: st = ie_worker_kv_bind(nd->w, op.seq, op.first, op.pb, op.n); break;
        case IE_KV_OP_SET_LEN: st = ie_worker_seq_set_len(nd->w, op.seq, op.n); break;
        }
        if (st != IE_OK) {
            char why[IE_PROTO_TEXT_MAX];
            snprintf(why, sizeof why, "%s", ie_error_last());
            return ie_error_set(st, "KV operation %d: %s", k, why);
        }
    }
    return IE_OK;
}

/* A pipeline stage whose step did not go through still hands the step's KV
 * operations to the next stage (a STEP of n = 0 carrying only them), so
 * every stage's tables stay the same as the coordinator's picture. */
static void forward_kv(node_t *nd, const ie_msg_step_t *h)
{
    if (h->kv_words == 0 || nd->as.plan != IE_SHARD_PIPELINE || nd->as.rank + 1 >= nd->as.n_ranks) return;
    ie_msg_t m = {.kind = IE_MSG_STEP};
    m.u.step = *h;
    m.u.step.n = 0;
    m.u.step.has_hidden = 0;
    m.u.step.has_adapter = 0;
    ie_frame_t f[5] = {{NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}, {nd->in.data[5], nd->in.size[5]}};
    if (send_msg(nd->push[nd->as.rank + 1], &nd->hdr, &m, f, 5, nd->as.dead_ms) != IE_OK)
        logf_(nd, "KV operations of step %llu not passed on: %s", (unsigned long long)h->step, ie_error_last());
}

/* Run the STEP in nd->in (header already decoded into h): its KV
 * operations first, then its tokens. n = 0 is a previous stage passing on
 * the operations of a step that failed there: apply, pass on, no result. */
/* A step's compute time: its wall time less the transfers (never < 0). */
static double res_ms(double wall, double transfer) { return wall > transfer ? wall - transfer : 0; }

static void handle_step(node_t *nd, const ie_msg_step_t *h)
{
    const ie_parts_t *in = &nd->in;
    ie_status_t st = IE_OK;
    if (!nd->assigned || h->epoch != nd->as.epoch) {
        if (h->n > 0)
            send_result_error(nd, h->epoch, h->step, IE_ERR_UNAVAILABLE,
                              nd->assigned ? "step from another cluster epoch" : "no shard loaded");
        return;
    }
    const int n = h->n;
    const int d = ie_worker_hparams(nd->w)->n_embd;
    const int nf = 6 + (h->has_hidden ? 1 : 0) + (h->has_adapter ? 1 : 0), fa = 6 + (h->has_hidden ? 1 : 0);
    if (n < 0 || n > nd->as.max_batch || in->n != nf || in->size[1] != (size_t)n * 4 ||
        in->size[2] != (size_t)n * 4 || in->size[3] != (size_t)n * 4 || in->size[4] != (size_t)n ||
        in->size[5] != (size_t)h->kv_words * 4 || (h->has_hidden && in->size[6] != (size_t)n * d * sizeof(float)) ||
        (h->has_adapter && in->size[fa] != (size_t)n * 4)) {
        if (n > 0) send_result_error(nd, h->epoch, h->step, IE_ERR_FORMAT, "malformed step message (frame sizes)");
        return;
    }
    if (ie_kv_ops_check(in->data[5], in->size[5], NULL) != IE_OK) {
        if (n > 0) send_result_error(nd, h->epoch, h->step, IE_ERR_FORMAT, ie_error_last());
        return;
    }
    st = apply_kv(nd, in->data[5], (size_t)h->kv_words);
    if (n == 0) {
        if (st != IE_OK && nd->o->verbose) logf_(nd, "step %llu: %s", (unsigned long long)h->step, ie_error_last());
        forward_kv(nd, h);
        return;
    }
    if (st != IE_OK) goto fail;
    const ie_shard_range_t *r = ie_worker_shard(nd->w);
    if (!r->has_embed && !h->has_hidden) {
        st = ie_error_set(IE_ERR_FORMAT, "step without hidden state for a later stage");
        goto fail;
    }
    ie_batch_t b = {n, in->data[1], in->data[2], in->data[3], in->data[4], NULL, NULL};
    if (h->has_adapter) { /* the coordinator's adapter ids -> the worker's */
        if (nd->ad_cap < (size_t)n) {
            int32_t *p = realloc(nd->ad_loc, (size_t)nd->as.max_batch * sizeof *p);
            if (!p) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                goto fail;
            }
            nd->ad_loc = p;
            nd->ad_cap = (size_t)nd->as.max_batch;
        }
        const int32_t *ad = in->data[fa];
        for (int i = 0; i < n; i++) {
            if (ad[i] == -1) {
                nd->ad_loc[i] = -1;
                continue;
            }
            if (ad[i] < 0 || ad[i] >= IE_PROTO_LORA_IDS || !nd->lora[ad[i]].ad) {
                st = ie_error_set(IE_ERR_RANGE, "token %d asks for adapter set %d, which is not attached here", i,
                                  (int)ad[i]);
                goto fail;
            }
            nd->ad_loc[i] = nd->lora[ad[i]].wid;
        }
        b.adapter = nd->ad_loc;
    }
    nd->cur_step = h->step;
    nd->transfer_ms = 0;
    double t0 = ie_now_ms(); /* the token gather counts as transfer time of the step */
    if (h->chain) {          /* the tokens are the previous step's arg max, agreed on by the ranks */
        st = chain_tokens(nd, h);
        if (st != IE_OK) goto fail;
        b.tokens = nd->chain_tok;
    }
    nd->am_n = 0;                  /* noted again below once this step has answered */
    int rows = 0, n_embd_rows = 0; /* logits rows; hidden-state rows (embeddings) */
    for (int i = 0; i < n; i++) {
        rows += b.logits[i] == IE_LOGITS_FULL || b.logits[i] == IE_LOGITS_ARGMAX;
        n_embd_rows += b.logits[i] == IE_LOGITS_EMBD;
    }
    const int last = nd->as.plan != IE_SHARD_PIPELINE || nd->as.rank == nd->as.n_ranks - 1;
    const int64_t nv = r->vocab_end - r->vocab_begin;
    if ((!last && grow(&nd->hidden_out, &nd->hidden_cap, (size_t)n * d) != 0) ||
        (r->has_head && grow(&nd->logits, &nd->logits_cap, (size_t)(rows ? rows : 1) * nv) != 0) ||
        (r->has_head && n_embd_rows && grow(&nd->embd, &nd->embd_cap, (size_t)n_embd_rows * d) != 0)) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (r->has_head && n_embd_rows) b.embd = nd->embd;
    atomic_store(&nd->busy, 1);
    st = ie_worker_step_shard(nd->w, &b, h->has_hidden ? in->data[6] : NULL, last ? NULL : nd->hidden_out,
                              r->has_head && rows ? nd->logits : NULL);
    double t1 = ie_now_ms();
    atomic_store(&nd->busy, 0);
    if (nd->m_compute) {
        ie_metric_add(nd->m_compute, nd->rank_label, res_ms(t1 - t0, nd->transfer_ms) / 1e3);
        ie_metric_add(nd->m_transfer, nd->rank_label, nd->transfer_ms / 1e3);
        ie_metric_add(nd->m_steps, nd->rank_label, 1);
    }
    if (st != IE_OK) goto fail;
    if (!last) { /* hop to the next stage, the KV operations with it */
        ie_msg_t m = {.kind = IE_MSG_STEP};
        m.u.step = *h;
        m.u.step.has_hidden = 1;
        ie_frame_t f[7] = {{in->data[1], in->size[1]},
                           {in->data[2], in->size[2]},
                           {in->data[3], in->size[3]},
                           {in->data[4], in->size[4]},
                           {in->data[5], in->size[5]},
                           {nd->hidden_out, (size_t)n * d * sizeof(float)},
                           {h->has_adapter ? in->data[fa] : NULL, h->has_adapter ? in->size[fa] : 0}};
        double ts = ie_now_ms();
        if ((st = send_msg(nd->push[nd->as.rank + 1], &nd->hdr, &m, f, 6 + (h->has_adapter ? 1 : 0),
                           nd->as.dead_ms)) != IE_OK)
            send_result_error(nd, h->epoch, h->step, IE_ERR_UNAVAILABLE, "next pipeline stage unreachable");
        if (nd->m_transfer) ie_metric_add(nd->m_transfer, nd->rank_label, (ie_now_ms() - ts) / 1e3);
        return;
    }
    if (!r->has_head) {
        chain_note(nd, h, b.logits, NULL);
        return;
    }
    ie_msg_t m = {.kind = IE_MSG_RESULT};
    ie_msg_result_t *res = &m.u.result;
    res->epoch = h->epoch;
    res->step = h->step;
    res->rank = nd->as.rank;
    res->status = IE_OK;
    res->n_rows = rows;
    res->vocab_begin = r->vocab_begin;
    res->vocab_end = r->vocab_end;
    res->compute_ms = res_ms(t1 - t0, nd->transfer_ms);
    res->transfer_ms = nd->transfer_ms;
    /* ARGMAX rows shrink to their (max, id) (docs/PROTOCOL.md, RESULT) */
    ie_frame_t f[2] = {{nd->logits,
                        ie_result_logits_pack(nd->logits, b.logits, n, nv, r->vocab_begin) * sizeof(float)},
                       {nd->chain_tok, (size_t)n * sizeof(int32_t)}}; /* a chained step's tokens */
    chain_note(nd, h, b.logits, nd->logits);                          /* all ARGMAX: the payload is the n pairs */
    int nf_out = h->chain ? 2 : 1;
    /* hidden-state rows: once, from the head rank holding vocabulary row 0
     * (a chained step is all ARGMAX: never both extra frames) */
    if (!h->chain && n_embd_rows && r->vocab_begin == 0) {
        f[1] = (ie_frame_t){nd->embd, (size_t)n_embd_rows * d * sizeof(float)};
        nf_out = 2;
    }
    if (send_msg(nd->coord, &nd->hdr, &m, f, nf_out, nd->as.dead_ms) != IE_OK) {
        logf_(nd, "result of step %llu not sent: %s", (unsigned long long)h->step, ie_error_last());
        send_result_error(nd, h->epoch, h->step, IE_ERR_INTERNAL, ie_error_last()); /* never silence */
    }
    return;

fail:
    if (nd->o->verbose) logf_(nd, "step %llu failed: %s", (unsigned long long)h->step, ie_error_last());
    send_result_error(nd, h->epoch, h->step, st, ie_error_last());
    forward_kv(nd, h);
}

/* --------------------------------------------------------------- main */

static ie_status_t handle_coord(node_t *nd)
{
    ie_msg_t m;
    if (ie_msg_decode(nd->in.data[0], nd->in.size[0], &m) != IE_OK) {
        logf_(nd, "coordinator sent a malformed message: %s", ie_error_last());
        return IE_OK;
    }
    nd->last_coord_ms = ie_now_ms();
    nd->registered = 1;
    switch (m.kind) {
    case IE_MSG_ASSIGN:
        handle_assign(nd, &m.u.assign);
        nd->last_coord_ms = ie_now_ms(); /* loading time is not the coordinator's silence */
        break;
    case IE_MSG_STEP:
        handle_step(nd, &m.u.step);
        nd->last_coord_ms = ie_now_ms(); /* nor is a long step's compute time (its heartbeats wait queued) */
        break;
    case IE_MSG_HEARTBEAT:
        /* a coordinator that forgot us (restarted) says epoch 0 */
        if (nd->assigned && m.u.heartbeat.epoch != nd->as.epoch) nd->registered = 0;
        break;
    case IE_MSG_LORA:
        handle_lora(nd, &m.u.lora);
        nd->last_coord_ms = ie_now_ms(); /* nor an adapter prepared here (no adapter thread) */
        break;
    case IE_MSG_BYE: return IE_ERR_UNAVAILABLE; /* leave */
    case IE_MSG_ERROR:
        logf_(nd, "coordinator: %s", m.u.error.message);
        nd->registered = 0;
        if (m.u.error.code == IE_ERR_UNSUPPORTED) /* our model is not the cluster's: asking again will not help */
            return ie_error_set(IE_ERR_FORMAT, "refused by the coordinator: %s", m.u.error.message);
        break;
    default: logf_(nd, "unexpected %s from the coordinator", ie_msg_kind_name(m.kind)); break;
    }
    return IE_OK;
}

static ie_status_t handle_peer(node_t *nd)
{
    ie_msg_t m;
    if (ie_msg_decode(nd->in.data[0], nd->in.size[0], &m) != IE_OK) {
        logf_(nd, "peer sent a malformed message: %s", ie_error_last());
        return IE_OK;
    }
    if (m.kind == IE_MSG_STEP) { /* a pipeline hop: its compute time is not the coordinator's silence either */
        double t0 = ie_now_ms();
        handle_step(nd, &m.u.step);
        nd->last_coord_ms += ie_now_ms() - t0;
    } else if (m.kind == IE_MSG_PARTIAL && nd->in.n == 2 &&
               nd->in.size[1] == (size_t)m.u.partial.count * sizeof(float))
        pq_put(nd, &m.u.partial);
    return IE_OK;
}

/* 1 for a tcp endpoint bound to every interface (0.0.0.0, [::], *). */
static int wildcard_bind(const char *ep)
{
    return ep &&
           (!strncmp(ep, "tcp://0.0.0.0:", 14) || !strncmp(ep, "tcp://[::]:", 11) || !strncmp(ep, "tcp://*:", 8));
}

/* *o->stop is set by a signal handler (ie-worker) or by another thread
 * (an engine destroying its in-process workers): read it atomically. */
static int stop_requested(const ie_node_opts_t *o) { return o->stop && __atomic_load_n(o->stop, __ATOMIC_ACQUIRE); }

ie_status_t ie_node_run(const ie_node_opts_t *o)
{
    ie_status_t st = IE_OK;
    node_t *nd = calloc(1, sizeof *nd);
    if (!nd) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    nd->o = o;
    nd->node_id = o->numa_node;
    {
        const char *d = getenv("IE_TEST_LORA_ACK_DELAY_MS");
        nd->ack_delay_ms = d ? atoi(d) : 0;
        d = getenv("IE_TEST_LORA_PREP_DELAY_MS");
        nd->prep_delay_ms = d ? atoi(d) : 0;
    }
    if (pthread_mutex_init(&nd->lq_mu, NULL) != 0 || pthread_cond_init(&nd->lq_cv, NULL) != 0) {
        free(nd);
        return ie_error_set(IE_ERR_INTERNAL, "worker: cannot make the adapter queue's lock");
    }
    nd->lq_init = 1;
    atomic_init(&nd->rank, -1);
    atomic_init(&nd->hb_ms, 250);
    atomic_store(&nd->tick_ms, ie_now_ms());
    {
        cpu_set_t cs; /* before placement narrows this thread's mask */
        nd->n_cpu = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    }
    if (!o->model_path || !o->coordinator || o->n_threads < 1) {
        st = ie_error_set(IE_ERR_INVAL, "worker: model path, coordinator endpoint and threads >= 1 are required");
        goto cleanup;
    }
    if ((st = ie_model_src_open(o->model_path, &nd->src)) != IE_OK) goto cleanup;
    nd->fp = ie_model_src_fingerprint(nd->src);
    {
        const double t0 = ie_now_ms();
        nd->wfp = ie_model_src_weights_hash(nd->src, 0);
        if (o->verbose) logf_(nd, "weights hash %016llx (%.0f ms)", (unsigned long long)nd->wfp, ie_now_ms() - t0);
    }
    {
        ie_topo_t t;
        if (ie_topo_read(&t) == IE_OK) ie_topo_describe(&t, nd->topo, sizeof nd->topo);
        if (o->numa_node >= 0 && (st = ie_numa_bind(o->numa_node)) != IE_OK) goto cleanup;
    }
    if (o->net) {
        nd->net = o->net;
    } else {
        if ((st = ie_net_new(&nd->net)) != IE_OK) goto cleanup;
        nd->own_net = 1;
    }
    ie_net_is_secure(nd->net, &nd->public_key);
    if ((st = ie_sock_new(nd->net, IE_SOCK_DEALER, &nd->coord)) != IE_OK) goto cleanup;
    if ((st = ie_sock_connect(nd->coord, o->coordinator, o->coordinator_key)) != IE_OK) goto cleanup;
    if ((st = ie_sock_new(nd->net, IE_SOCK_PULL, &nd->pull)) != IE_OK) goto cleanup;
    if ((st = ie_sock_bind(nd->pull, o->peer_bind, nd->peer_ep, sizeof nd->peer_ep)) != IE_OK) goto cleanup;
    const char *adv = o->advertise;
    char guess[128];
    if (!adv && wildcard_bind(o->peer_bind)) {
        /* bound everywhere, and the connectable form says loopback: peers on
         * other hosts could not use it. This host's address toward the
         * coordinator is one they most likely can. */
        if (ie_endpoint_local_addr(o->coordinator, guess, sizeof guess) == IE_OK) {
            adv = guess;
            logf_(nd,
                  "warning: --peer-bind %s without --advertise: advertising %s (this host's address toward the "
                  "coordinator); give --advertise if peers reach this host by another name",
                  o->peer_bind, guess);
        } else {
            logf_(nd, "warning: --peer-bind %s without --advertise: peers on other hosts cannot reach %s (%s)",
                  o->peer_bind, nd->peer_ep, ie_error_last());
        }
    }
    if (adv && !strncmp(nd->peer_ep, "tcp://", 6)) { /* tcp://any:port -> tcp://advertise:port */
        const char *port = strrchr(nd->peer_ep, ':');
        char ep[IE_PROTO_ENDPOINT_MAX];
        snprintf(ep, sizeof ep, "tcp://%s%s", adv, port ? port : "");
        snprintf(nd->peer_ep, sizeof nd->peer_ep, "%s", ep);
    }
    if (o->metrics) {
        ie_metrics_counter(o->metrics, "ie_worker_compute_seconds_total", "Time in the forward pass", "worker",
                           &nd->m_compute);
        ie_metrics_counter(o->metrics, "ie_worker_transfer_seconds_total",
                           "Time exchanging partial sums and hidden states with peers", "worker", &nd->m_transfer);
        ie_metrics_counter(o->metrics, "ie_worker_steps_total", "Steps run", "worker", &nd->m_steps);
    }
    if (pthread_create(&nd->hb, NULL, hb_main, nd) != 0) {
        st = ie_error_set(IE_ERR_INTERNAL, "worker: cannot start the heartbeat thread");
        goto cleanup;
    }
    nd->hb_started = 1;
    if (o->verbose)
        logf_(nd, "model %s, coordinator %s, peers at %s; %s", o->model_path, o->coordinator, nd->peer_ep,
              nd->topo);
    ie_sd_status("registering with %s", o->coordinator);
    send_hello(nd);

    while (!stop_requested(o)) {
        atomic_store(&nd->tick_ms, ie_now_ms());
        ie_sock_t *socks[2] = {nd->coord, nd->pull};
        int ready[2] = {0, 0};
        /* while an adapter is being prepared, look for it often: its
         * answer waits for this loop */
        int k = ie_sock_poll(socks, 2, ready, nd->lq_head ? 5 : 100);
        if (k < 0) {
            st = ie_error_set(IE_ERR_IO, "worker: poll failed");
            break;
        }
        if (ready[0] && ie_sock_recv(nd->coord, &nd->in, 0) == IE_OK && nd->in.n >= 1) {
            const ie_status_t hs = handle_coord(nd);
            if (hs == IE_ERR_UNAVAILABLE && o->verbose) logf_(nd, "coordinator said bye");
            if (hs != IE_ERR_UNAVAILABLE) st = hs; /* refused for good */
            if (hs != IE_OK) break;
        }
        if (ready[1] && ie_sock_recv(nd->pull, &nd->in, 0) == IE_OK && nd->in.n >= 1) handle_peer(nd);
        if (nd->lq_head) lq_pump(nd, 0); /* adapters prepared meanwhile: attach, answer */
        double t = ie_now_ms();
        if (nd->held_due > 0 && t >= nd->held_due) { /* the test seam's held answer */
            send_msg(nd->coord, &nd->hdr, &nd->held_ack, NULL, 0, 1000);
            nd->held_due = 0;
        }
        int dead = nd->assigned ? nd->as.dead_ms : 2000;
        if (nd->registered && t - nd->last_coord_ms > dead) {
            logf_(nd, "coordinator silent for %.1f s; registering again", (t - nd->last_coord_ms) / 1e3);
            nd->registered = 0;
        }
        if (!nd->registered && t - nd->last_hello_ms > 1000) send_hello(nd);
        /* registered, never assigned (the plan waits for more workers): the
         * heartbeat thread has no rank to speak for, so the HELLO is our
         * sign of life; without it the coordinator drops us after dead_ms
         * and we register again, over and over. Once a rank is assigned
         * (even one whose load failed) the heartbeats speak for us. */
        if (nd->registered && atomic_load(&nd->rank) < 0 && t - nd->last_hello_ms > 250) send_hello(nd);
    }
    ie_sd_stopping();
    if (nd->registered && stop_requested(o)) { /* stopped here: tell the coordinator, it need not wait */
        ie_msg_t bye = {.kind = IE_MSG_BYE};
        send_msg(nd->coord, &nd->hdr, &bye, NULL, 0, 100);
    }

cleanup:
    if (nd->hb_started) {
        atomic_store(&nd->hb_stop, 1);
        pthread_join(nd->hb, NULL);
    }
    if (st != IE_OK && !o->quiet) fprintf(stderr, "ie-worker: %s\n", ie_error_last());
    close_peers(nd);
    ie_shmreduce_destroy(&nd->shm);
    ie_sock_destroy(&nd->coord);
    ie_sock_destroy(&nd->pull);
    if (nd->own_net) ie_net_destroy(&nd->net);
    if (nd->lq_init) lq_stop(nd); /* joins the adapter thread: nothing it holds outlives it */
    lora_drop_all(nd);
    ie_worker_destroy(&nd->w);
    free(nd->ad_loc);
    ie_model_src_destroy(&nd->src);
    pq_free(nd);
    ie_parts_free(&nd->in);
    ie_buf_free(&nd->hdr);
    free(nd->hidden_out);
    free(nd->logits);
    free(nd->embd);
    free(nd->am_prev);
    free(nd->gather);
    free(nd->chain_tok);
    if (nd->lq_init) {
        pthread_mutex_destroy(&nd->lq_mu);
        pthread_cond_destroy(&nd->lq_cv);
    }
    free(nd);
    return st;
}
