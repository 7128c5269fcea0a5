/* backend_worker.c — the in-process backend (ie_backend.h): one
 * ie_worker_t, called directly. Every entry is the worker's own; the
 * cluster-only ones (hint, readiness, upkeep) are left out and default.
 *
 * An attach through lora_add_begin / lora_add_poll runs its slow half —
 * sum a set (ie_lora_concat), check it and make the int8 copy on a
 * quantized base (ie_worker_lora_prepare) — on a helper thread while the
 * serving thread steps on; poll attaches the result on the serving thread
 * (ie_worker_lora_attach: cheap). A thread per attach, not one kept for
 * the backend's life: the contract allows one attach in flight, attaches
 * are rare, a thread's start costs microseconds beside a prepare's tens of
 * milliseconds, and a thread that lives only for its job needs no idle
 * state or stop protocol: destroy cancels and joins the one in flight. */
#include "ie_backend.h"
#include "ie_clock.h"
#include "ie_kernels.h" /* ie_isa_name */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The attach in flight (one at most: ie_backend.h). The serving thread
 * fills the inputs before the helper starts and reads the outputs after
 * `done` (under mu); meanwhile the helper alone touches the outputs. */
typedef struct wjob {
    int busy;    /* begun, poll has not returned 1 yet (serving thread) */
    int started; /* a helper thread runs it (joined by poll or destroy)  */
    pthread_t th;
    int id; /* the worker slot it will get (its first free one)    */
    /* inputs */
    int n;
    const ie_lora_t *list[8];
    float scales[8];
    ie_worker_lora_target_t t;
    int delay_ms;
    atomic_int cancel; /* destroy: stop at the next stage                  */
    /* outputs, the helper's until done */
    int done; /* (wback.mu)                                        */
    ie_status_t st;
    char err[512];  /* the message: ie_error is per thread      */
    ie_lora_t *cat; /* the sum of a set of several parts        */
    ie_lora_t *run; /* what the worker runs (int8 copy) or NULL */
} wjob_t;

/* The backend's own state beside the worker: the concatenated adapter
 * sets it made, by adapter id, freed when the id is removed; the attach in
 * flight (begin names its id before it: ie_worker_lora_next_id). */
typedef struct wback {
    ie_worker_t *w;
    ie_lora_t *made[IE_WORKER_MAX_LORA];
    int prep_delay_ms; /* tests only: env IE_TEST_LORA_PREP_DELAY_MS */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the helper is done (CLOCK_MONOTONIC)        */
    wjob_t job;
} wback_t;

static ie_status_t w_step(void *self, const ie_batch_t *b, float *logits_out)
{
    return ie_worker_step(((wback_t *)self)->w, b, logits_out);
}

static void w_seq_clear(void *self, int seq) { ie_worker_seq_clear(((wback_t *)self)->w, seq); }

static ie_status_t w_seq_set_len(void *self, int seq, int n_pos)
{
    return ie_worker_seq_set_len(((wback_t *)self)->w, seq, n_pos);
}

static ie_status_t w_kv_bind(void *self, int seq, int first, const int32_t *pb, int n)
{
    return ie_worker_kv_bind(((wback_t *)self)->w, seq, first, pb, n);
}

static void w_stats(void *self, ie_backend_stats_t *out)
{
    const ie_worker_t *w = ((wback_t *)self)->w;
    out->isa = ie_isa_name(ie_worker_isa(w));
    out->hot_replicas = ie_worker_hot_replicas(w);
    out->hot_report = ie_worker_hot_report(w);
}

/* Contract (ie_backend.h, ops.lora_add): the whole attach on the calling
 * thread (the CLI's --lora at start, a caller without a loop to step). */
static ie_status_t w_lora_add(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    wback_t *wb = self;
    ie_status_t st;
    ie_lora_t *cat = NULL;
    const ie_lora_t *list[8];
    float scales[8];
    int id = -1;
    if (wb->job.busy) /* it would take the id begin promised */
        return ie_error_set(IE_ERR_BUSY, "worker: an adapter attach is in flight (lora_add_poll first)");
    if (n == 1) {
        st = ie_worker_lora_add(wb->w, parts[0].lora, parts[0].scale, &id);
    } else {
        for (int i = 0; i < n; i++) list[i] = parts[i].lora, scales[i] = parts[i].scale;
        if ((st = ie_lora_concat(list, scales, n, &cat)) == IE_OK) st = ie_worker_lora_add(wb->w, cat, 1.0f, &id);
    }
    if (st == IE_OK) {
        wb->made[id] = cat;
        *id_out = id;
    } else {
        ie_lora_destroy(&cat);
    }
    return st;
}

static int job_cancelled(wjob_t *j) { return atomic_load(&j->cancel); }

/* The slow half of the attach j, on its helper thread (on the serving
 * thread when no thread could start): the test seam's delay, the sum of
 * a set, the check and int8 copy (ie_worker_lora_prepare). Reads j's
 * inputs and the parts (alive until poll: ie_backend.h), writes j's
 * outputs alone: never the worker, which steps meanwhile. Stops between
 * stages once cancelled. The outcome in j->st, its message in j->err. */
static void job_prepare(wjob_t *j)
{
    ie_status_t st = IE_OK;
    for (int slept = 0; slept < j->delay_ms && !job_cancelled(j); slept += 10) {
        struct timespec ts = {0, 10 * 1000000L}; /* the test seam */
        nanosleep(&ts, NULL);
    }
    if (job_cancelled(j)) st = ie_error_set(IE_ERR_UNAVAILABLE, "worker: adapter attach cancelled");
    else if (j->n > 1) st = ie_lora_concat(j->list, j->scales, j->n, &j->cat);
    if (st == IE_OK && job_cancelled(j)) st = ie_error_set(IE_ERR_UNAVAILABLE, "worker: adapter attach cancelled");
    if (st == IE_OK) st = ie_worker_lora_prepare(&j->t, j->n > 1 ? j->cat : j->list[0], &j->run);
    j->st = st;
    if (st != IE_OK) snprintf(j->err, sizeof j->err, "%s", ie_error_last());
}

static void *job_main(void *arg)
{
    wback_t *wb = arg;
    job_prepare(&wb->job);
    pthread_mutex_lock(&wb->mu);
    wb->job.done = 1;
    pthread_cond_broadcast(&wb->cv);
    pthread_mutex_unlock(&wb->mu);
    return NULL;
}

/* Forget the attach in flight: join its thread, free what it made. */
static void job_end(wback_t *wb)
{
    wjob_t *j = &wb->job;
    if (j->started) pthread_join(j->th, NULL);
    ie_lora_destroy(&j->cat);
    ie_lora_destroy(&j->run);
    memset(j, 0, sizeof *j);
    atomic_init(&j->cancel, 0);
}

/* Contract (ie_backend.h, ops.lora_add_begin): the id is the worker's
 * first free slot, which stays free until poll (no other add or remove
 * comes before, by the contract; lora_add refuses meanwhile); the sum and
 * prepare go to a helper thread, or run here when none can start. */
static ie_status_t w_lora_add_begin(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    wback_t *wb = self;
    wjob_t *j = &wb->job;
    const int id = ie_worker_lora_next_id(wb->w);
    if (j->busy) return ie_error_set(IE_ERR_BUSY, "worker: an adapter attach is in flight (lora_add_poll first)");
    if (id < 0) return ie_error_set(IE_ERR_RANGE, "worker: %d adapters attached already", IE_WORKER_MAX_LORA);
    for (int i = 0; i < n; i++) {
        if (!parts[i].lora) return ie_error_set(IE_ERR_INVAL, "worker: lora_add_begin: part %d has no adapter", i);
        j->list[i] = parts[i].lora, j->scales[i] = parts[i].scale;
    }
    j->n = n;
    j->id = id;
    j->delay_ms = wb->prep_delay_ms;
    ie_worker_lora_target(wb->w, &j->t);
    j->busy = 1;
    if (pthread_create(&j->th, NULL, job_main, wb) == 0) {
        j->started = 1;
    } else { /* no thread: the whole attach here, between two steps, as before */
        job_prepare(j);
        j->done = 1;
    }
    *id_out = id;
    return IE_OK;
}

/* Contract (ie_backend.h, ops.lora_add_poll): waits for the helper up to
 * timeout_ms, then attaches its result here, on the serving thread. */
static int w_lora_add_poll(void *self, int id, int timeout_ms, ie_status_t *st)
{
    wback_t *wb = self;
    wjob_t *j = &wb->job;
    int done = 0, wid = -1;
    if (!j->busy || id != j->id) {
        *st = ie_error_set(IE_ERR_RANGE, "worker: no adapter set %d being attached", id);
        return 1;
    }
    pthread_mutex_lock(&wb->mu);
    if (!j->done && timeout_ms > 0) {
        const struct timespec ts = ie_deadline_ms(timeout_ms);
        while (!j->done && pthread_cond_timedwait(&wb->cv, &wb->mu, &ts) == 0) {}
    }
    done = j->done;
    pthread_mutex_unlock(&wb->mu);
    if (!done) return 0;
    if (j->started) pthread_join(j->th, NULL);
    j->started = 0;
    if (j->st != IE_OK) {
        *st = ie_error_set(j->st, "%s", j->err);
    } else if ((*st = ie_worker_lora_attach(wb->w, &j->t, j->n > 1 ? j->cat : j->list[0], &j->run,
                                            j->n > 1 ? 1.0f : j->scales[0], &wid)) == IE_OK) {
        if (wid != id) { /* cannot be: the slot was taken behind begin's back */
            ie_worker_lora_remove(wb->w, wid);
            *st = ie_error_set(IE_ERR_INTERNAL, "worker: adapter slot %d taken while its attach was in flight", id);
        } else {
            wb->made[id] = j->cat; /* the set's sum, freed at remove */
            j->cat = NULL;
        }
    }
    job_end(wb); /* frees a sum not attached; run is the worker's or freed */
    return 1;
}

static ie_status_t w_lora_remove(void *self, int id)
{
    wback_t *wb = self;
    ie_status_t st = ie_worker_lora_remove(wb->w, id);
    if (st == IE_OK) ie_lora_destroy(&wb->made[id]);
    return st;
}

/* Contract (ie_backend.h, ops.lora_bytes): the concatenated copy made
 * here for a set of several parts, plus the worker's own int8 copy. */
static uint64_t w_lora_bytes(void *self, int id)
{
    const wback_t *wb = self;
    if (id < 0 || id >= IE_WORKER_MAX_LORA) return 0;
    return (wb->made[id] ? wb->made[id]->bytes : 0) + ie_worker_lora_bytes(wb->w, id);
}

/* Contract (ie_backend.h, ops.lora_cost): one adapter gets no
 * concatenated copy, only the worker's own. */
static uint64_t w_lora_cost(void *self, const ie_lora_t *a) { return ie_worker_lora_cost(((wback_t *)self)->w, a); }

static void w_destroy(void *self)
{
    wback_t *wb = self;
    atomic_store(&wb->job.cancel, 1); /* an attach in flight stops at its next stage */
    job_end(wb);
    pthread_mutex_destroy(&wb->mu);
    pthread_cond_destroy(&wb->cv);
    ie_worker_destroy(&wb->w);
    for (int i = 0; i < IE_WORKER_MAX_LORA; i++) ie_lora_destroy(&wb->made[i]);
    free(wb);
}

static const ie_backend_ops_t k_worker_ops = {
    .name = "worker",
    .step = w_step,
    .seq_clear = w_seq_clear,
    .seq_set_len = w_seq_set_len,
    .kv_bind = w_kv_bind,
    .lora_add = w_lora_add,
    .lora_remove = w_lora_remove,
    .lora_add_begin = w_lora_add_begin,
    .lora_add_poll = w_lora_add_poll,
    .lora_bytes = w_lora_bytes,
    .lora_cost = w_lora_cost,
    .stats = w_stats,
    .destroy = w_destroy,
};

ie_status_t ie_backend_worker_new(const ie_model_src_t *src, const ie_worker_opts_t *o, ie_backend_t **out)
{
    ie_worker_t *w = NULL;
    wback_t *wb = NULL;
    *out = NULL;
    ie_status_t st = ie_worker_new(src, o, &w);
    if (st != IE_OK) return st;
    if (!(wb = calloc(1, sizeof *wb))) {
        ie_worker_destroy(&w);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    wb->w = w;
    atomic_init(&wb->job.cancel, 0);
    {
        const char *d = getenv("IE_TEST_LORA_PREP_DELAY_MS"); /* read once, as ie-worker does */
        wb->prep_delay_ms = d ? atoi(d) : 0;
    }
    {
        pthread_condattr_t ca;
        int ok = pthread_condattr_init(&ca) == 0;
        if (ok) {
            ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_mutex_init(&wb->mu, NULL) == 0;
            if (ok && pthread_cond_init(&wb->cv, &ca) != 0) {
                pthread_mutex_destroy(&wb->mu);
                ok = 0;
            }
            pthread_condattr_destroy(&ca);
        }
        if (!ok) {
            ie_worker_destroy(&w);
            free(wb);
            return ie_error_set(IE_ERR_NOMEM, "worker backend: no lock for adapter attaches");
        }
    }
    /* nothing to keep alive between steps: a serving loop may sleep long */
    ie_backend_geom_t g = {.n_seq = o->n_seq,
                           .n_ctx = ie_worker_n_ctx(w),
                           .max_batch = ie_worker_max_batch(w),
                           .kv_block = ie_worker_kv_block(w),
                           .kv_blocks = ie_worker_kv_blocks(w),
                           .n_vocab = ie_worker_hparams(w)->n_vocab,
                           .n_embd = ie_worker_hparams(w)->n_embd,
                           .upkeep_ms = 50,
                           .kv_ring_len = ie_worker_kv_ring_len(w)};
    return ie_backend_new(&k_worker_ops, wb, &g, out);
}
