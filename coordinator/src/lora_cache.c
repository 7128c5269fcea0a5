/* lora_cache.c — the engine's LoRA adapter registry (ie_lora_cache.h).
 *
 * Attaching and detaching touch the backend, which belongs to the stepping
 * thread (ie_backend.h). Each such section is a job (excl_run): while a
 * stepping thread is registered (ie_lora_cache_stepper) another thread
 * queues it and waits; the stepping thread runs the queue between two
 * steps (step_begin, with step_mu and mu held) and wakes the waiter with
 * the job's status and message. With no stepping thread registered (the
 * CLI, start-up) or on the stepping thread itself (the ZeroMQ front end)
 * the job runs at once under the same two locks.
 *
 * Two locks: `step_mu` is held across each step and each job, so a job
 * never runs beside a step; `mu` guards the tables and the job queue and
 * is only ever held briefly (and while a job runs). Order: step_mu, then
 * mu. Files are read with neither held.
 *
 * An adapter entry (ent_t) lives from load to unload; its weights (lora)
 * come and go with eviction. `serial` tells a reloaded name from the
 * adapter that had it before, so a set (set_t) remembers the serials of
 * its parts. A set is attached under one backend id while live; `dead`
 * sets (a part was unloaded) wait for their last lease, then step_begin
 * detaches them and frees the entries no set needs any more.
 */
#include "ie_lora_cache.h"
#include "ie_clock.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ent {
    int used; /* slot taken (registered, or unloaded awaiting its sets) */
    int gone; /* unloaded: no longer found by name                      */
    int pinned;
    char name[IE_LORA_NAME_MAX];
    char *path;
    float scale;     /* default scale                                  */
    ie_lora_t *lora; /* NULL: evicted (or not yet reloaded)            */
    uint64_t serial; /* distinct per load                              */
    uint64_t last_use;
} ent_t;

typedef struct set {
    int live; /* attached under id                                     */
    int dead; /* detach once refs is 0                                 */
    int id, n, refs;
    int ent[IE_LORA_SET_PARTS];
    uint64_t serial[IE_LORA_SET_PARTS];
    float scale[IE_LORA_SET_PARTS];
    uint64_t salt, last_use;
    uint64_t bytes; /* the backend's own copies for it (ie_backend_lora_bytes) */
} set_t;

/* A section that touches the backend, run by excl_run (step_mu and mu
 * held): its status, and its message when it failed. */
typedef struct job {
    ie_status_t (*fn)(ie_lora_cache_t *c, void *arg);
    void *arg;
    ie_status_t st;
    int done;
    int deferrable; /* queued: may end at a later step (inflight)     */
    char err[512];
    struct job *next;
} job_t;

struct ie_lora_cache {
    ie_lora_cache_opts_t o;
    pthread_mutex_t step_mu, mu;
    pthread_cond_t job_cv; /* a job is done (waiters), under mu          */
    job_t *jobs, **jobs_tail;
    job_t *running;       /* the job fn runs now                           */
    job_t *inflight;      /* an attach its ranks still owe answers to:
                             steps go on, other jobs wait for it       */
    int inflight_id;      /* its backend id                                */
    int stepper_on;       /* a stepping thread runs the jobs            */
    pthread_t stepper;    /* that thread                                */
    void (*wake)(void *); /* rouses it from an idle wait (may be NULL) */
    void *wake_ctx;
    ent_t ent[IE_LORA_CACHE_MAX];
    set_t set[IE_LORA_SET_MAX];
    uint64_t tick, next_serial, next_salt;
    uint64_t loads, evictions;
    uint64_t *dropped; /* salts of sets detached since the last take  */
    int n_dropped, cap_dropped;
    ie_metric_t *m_req, *m_tok, *m_res, *m_bytes, *m_evict, *m_loads, *m_lat;
};

/* ------------------------------------------------------------ helpers */

static int find_name(const ie_lora_cache_t *c, const char *name)
{
    for (int i = 0; i < IE_LORA_CACHE_MAX; i++)
        if (c->ent[i].used && !c->ent[i].gone && !strcmp(c->ent[i].name, name)) return i;
    return -1;
}

/* Resident bytes: adapters' weights plus what the backend holds in this
 * process for each live set (its concatenated and int8 copies; mu held). */
static uint64_t resident_bytes(const ie_lora_cache_t *c, int *n_res)
{
    uint64_t b = 0;
    int n = 0;
    for (int i = 0; i < IE_LORA_CACHE_MAX; i++)
        if (c->ent[i].used && c->ent[i].lora) b += c->ent[i].lora->bytes, n++;
    for (int s = 0; s < IE_LORA_SET_MAX; s++)
        if (c->set[s].live) b += c->set[s].bytes;
    if (n_res) *n_res = n;
    return b;
}

static void gauges(ie_lora_cache_t *c)
{
    int n = 0;
    uint64_t b = resident_bytes(c, &n);
    ie_metric_set(c->m_res, NULL, n);
    ie_metric_set(c->m_bytes, NULL, (double)b);
}

/* Detach set s (step_mu and mu held; s idle); its salt is kept for
 * ie_lora_cache_take_detached (when memory for it fails, its prefix
 * blocks merely age out, as they did before). */
static void set_detach(ie_lora_cache_t *c, set_t *s)
{
    if (!s->live) return;
    (void)ie_backend_lora_remove(c->o.backend, s->id); /* an id we attached: cannot fail */
    if (c->n_dropped == c->cap_dropped) {
        int cap = c->cap_dropped ? 2 * c->cap_dropped : IE_LORA_SET_MAX;
        uint64_t *d = realloc(c->dropped, (size_t)cap * sizeof *d);
        if (d) c->dropped = d, c->cap_dropped = cap;
    }
    if (c->n_dropped < c->cap_dropped) c->dropped[c->n_dropped++] = s->salt;
    memset(s, 0, sizeof *s);
}

/* 1 when a live set leased now contains entry e. */
static int ent_busy(const ie_lora_cache_t *c, int e)
{
    for (int s = 0; s < IE_LORA_SET_MAX; s++) {
        const set_t *st = &c->set[s];
        if (!st->live || !st->refs) continue;
        for (int k = 0; k < st->n; k++)
            if (st->ent[k] == e) return 1;
    }
    return 0;
}

/* Detach the idle sets that contain entry e (step_mu, mu held). */
static void ent_detach_sets(ie_lora_cache_t *c, int e)
{
    for (int s = 0; s < IE_LORA_SET_MAX; s++) {
        set_t *st = &c->set[s];
        if (!st->live || st->refs) continue;
        for (int k = 0; k < st->n; k++)
            if (st->ent[k] == e) {
                set_detach(c, st);
                break;
            }
    }
}

/* 1 when a live set still points at entry e's weights. */
static int ent_attached(const ie_lora_cache_t *c, int e)
{
    for (int s = 0; s < IE_LORA_SET_MAX; s++)
        for (int k = 0; c->set[s].live && k < c->set[s].n; k++)
            if (c->set[s].ent[k] == e) return 1;
    return 0;
}

static void ent_free(ent_t *x)
{
    ie_lora_destroy(&x->lora);
    free(x->path);
    memset(x, 0, sizeof *x);
}

/* Detach dead idle sets and free unloaded entries nothing uses (step_mu,
 * mu held). */
static void reap(ie_lora_cache_t *c)
{
    for (int s = 0; s < IE_LORA_SET_MAX; s++)
        if (c->set[s].live && c->set[s].dead && !c->set[s].refs) set_detach(c, &c->set[s]);
    for (int i = 0; i < IE_LORA_CACHE_MAX; i++)
        if (c->ent[i].used && c->ent[i].gone && !ent_attached(c, i)) ent_free(&c->ent[i]);
}

/* Evict least recently used unpinned idle adapters (not `keep`, a list
 * of n entries) until the resident bytes fit the budget or nothing more
 * can go (step_mu, mu held). */
static void enforce_budget(ie_lora_cache_t *c, const int *keep, int n_keep)
{
    while (c->o.budget_bytes && resident_bytes(c, NULL) > c->o.budget_bytes) {
        int victim = -1;
        for (int i = 0; i < IE_LORA_CACHE_MAX; i++) {
            const ent_t *x = &c->ent[i];
            int kept = 0;
            for (int k = 0; k < n_keep; k++) kept |= keep[k] == i;
            if (!x->used || x->gone || !x->lora || x->pinned || kept || ent_busy(c, i)) continue;
            if (victim < 0 || x->last_use < c->ent[victim].last_use) victim = i;
        }
        if (victim < 0) break;
        ent_detach_sets(c, victim);
        ie_lora_destroy(&c->ent[victim].lora);
        c->evictions++;
        ie_metric_add(c->m_evict, NULL, 1);
    }
    gauges(c);
}

/* Read an adapter from disk, timing it into the load metrics (no lock). */
static ie_status_t load_file(ie_lora_cache_t *c, const char *path, ie_lora_t **out)
{
    double t0 = ie_now_ms();
    ie_status_t st = ie_lora_load(path, c->o.hp, out);
    if (st == IE_OK) {
        pthread_mutex_lock(&c->mu);
        c->loads++;
        pthread_mutex_unlock(&c->mu);
        ie_metric_add(c->m_loads, NULL, 1);
        ie_metric_observe(c->m_lat, NULL, (ie_now_ms() - t0) / 1e3);
    }
    return st;
}

static int name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    return n >= 1 && n < IE_LORA_NAME_MAX && !strpbrk(name, "=,:");
}

/* Run one job (step_mu and mu held), keeping its message for the thread
 * that waits on it. */
static void job_run(ie_lora_cache_t *c, job_t *j)
{
    c->running = j;
    j->st = j->fn(c, j->arg);
    c->running = NULL;
    if (c->inflight == j) return; /* answered by inflight_poll */
    if (j->st != IE_OK) snprintf(j->err, sizeof j->err, "%s", ie_error_last());
    j->done = 1;
}

static ie_status_t attach_finish(ie_lora_cache_t *c, void *arg, ie_status_t st);

/* The attach in flight, if any (step_mu and mu held): when the backend has
 * its outcome (waiting up to timeout_ms for it), finish it and wake its
 * waiter. 1 when none is left in flight. */
static int inflight_poll(ie_lora_cache_t *c, int timeout_ms)
{
    job_t *j = c->inflight;
    ie_status_t st = IE_OK;
    if (!j) return 1;
    if (!ie_backend_lora_add_poll(c->o.backend, c->inflight_id, timeout_ms, &st)) return 0;
    c->inflight = NULL;
    j->st = attach_finish(c, j->arg, st);
    if (j->st != IE_OK) snprintf(j->err, sizeof j->err, "%s", ie_error_last());
    j->done = 1;
    pthread_cond_broadcast(&c->job_cv);
    return 1;
}

/* Run every queued job (step_mu and mu held) and wake their waiters. */
static void jobs_drain(ie_lora_cache_t *c)
{
    int any = 0;
    for (job_t *j; !c->inflight && (j = c->jobs) != NULL; any = 1) {
        c->jobs = j->next;
        if (!c->jobs) c->jobs_tail = &c->jobs;
        j->deferrable = c->stepper_on; /* the stepping thread steps on while ranks answer */
        job_run(c, j);
    }
    if (any) pthread_cond_broadcast(&c->job_cv);
}

/* fn(c, arg) with the backend to itself: at once under step_mu and mu
 * when no stepping thread is registered or this is it, else queued for
 * the stepping thread's next step_begin while this thread waits. Returns
 * fn's status, its message set on this thread. */
static ie_status_t excl_run(ie_lora_cache_t *c, ie_status_t (*fn)(ie_lora_cache_t *, void *), void *arg)
{
    job_t j = {.fn = fn, .arg = arg};
    void (*wake)(void *) = NULL;
    void *wake_ctx = NULL;
    /* checked and queued in one hold of mu: the stepping thread cannot
     * unregister in between and leave the job unrun */
    pthread_mutex_lock(&c->mu);
    const int queue = c->stepper_on && !pthread_equal(c->stepper, pthread_self());
    if (queue) {
        *c->jobs_tail = &j;
        c->jobs_tail = &j.next;
        wake = c->wake, wake_ctx = c->wake_ctx;
    }
    pthread_mutex_unlock(&c->mu);
    if (queue) {
        if (wake) wake(wake_ctx); /* an idle serving loop steps at once */
        pthread_mutex_lock(&c->mu);
        while (!j.done) pthread_cond_wait(&c->job_cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
    } else {
        pthread_mutex_lock(&c->step_mu);
        pthread_mutex_lock(&c->mu);
        while (!inflight_poll(c, 50)) {} /* the backend takes one attach at a time */
        job_run(c, &j);
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_unlock(&c->step_mu);
    }
    return j.st == IE_OK ? IE_OK : ie_error_set(j.st, "%s", j.err);
}

/* ------------------------------------------------------------ public */

ie_status_t ie_lora_cache_new(const ie_lora_cache_opts_t *o, ie_lora_cache_t **out)
{
    ie_status_t st = IE_OK;
    ie_lora_cache_t *c = NULL;
    *out = NULL;
    if (!o || !o->backend || !o->hp) return ie_error_set(IE_ERR_INVAL, "lora cache: no backend or hparams");
    if (!(c = calloc(1, sizeof *c))) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    c->o = *o;
    c->next_salt = 1;
    pthread_mutex_init(&c->step_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->job_cv, NULL);
    c->jobs_tail = &c->jobs;
    if (o->metrics) {
        static const double k_lat[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
        ie_metrics_t *m = o->metrics;
        if ((st = ie_metrics_counter(m, "ie_lora_requests_total", "Requests ended, by LoRA adapter", "adapter",
                                     &c->m_req)) != IE_OK ||
            (st = ie_metrics_counter(m, "ie_lora_generated_tokens_total", "Tokens generated, by LoRA adapter",
                                     "adapter", &c->m_tok)) != IE_OK ||
            (st = ie_metrics_gauge(m, "ie_lora_resident_adapters", "LoRA adapters in memory", NULL, &c->m_res)) !=
                IE_OK ||
            (st = ie_metrics_gauge(m, "ie_lora_resident_bytes",
                                   "Bytes of LoRA weights in memory (adapters, sums, int8 copies)", NULL,
                                   &c->m_bytes)) != IE_OK ||
            (st = ie_metrics_counter(m, "ie_lora_evictions_total", "LoRA adapters evicted for the memory budget",
                                     NULL, &c->m_evict)) != IE_OK ||
            (st = ie_metrics_counter(m, "ie_lora_loads_total", "LoRA adapters read from disk (reloads included)",
                                     NULL, &c->m_loads)) != IE_OK ||
            (st = ie_metrics_histogram(m, "ie_lora_load_seconds", "Time to read and check a LoRA adapter", NULL,
                                       k_lat, (int)(sizeof k_lat / sizeof k_lat[0]), &c->m_lat)) != IE_OK) {
            ie_lora_cache_destroy(&c);
            return st;
        }
        gauges(c);
    }
    *out = c;
    return st;
}

void ie_lora_cache_destroy(ie_lora_cache_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_lora_cache_t *c = *self_p;
    /* nobody waits any more (the serving loop and its front ends are
     * gone); an attach still in flight (a stepping thread that never
     * unregistered) is finished and detached first: an in-process backend
     * reads its parts' weights, freed below, until it answers */
    if (c->inflight) {
        ie_status_t st = IE_OK;
        while (!ie_backend_lora_add_poll(c->o.backend, c->inflight_id, 50, &st)) {}
        if (st == IE_OK) ie_backend_lora_remove(c->o.backend, c->inflight_id);
        c->inflight = NULL;
    }
    for (int s = 0; s < IE_LORA_SET_MAX; s++) set_detach(c, &c->set[s]);
    for (int i = 0; i < IE_LORA_CACHE_MAX; i++) ent_free(&c->ent[i]);
    pthread_mutex_destroy(&c->step_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->job_cv);
    free(c->dropped);
    free(c);
    *self_p = NULL;
}

/* The registration half of ie_lora_cache_load (a job: step_mu, mu held):
 * takes path and lora on success. */
typedef struct load_job {
    const char *name;
    char *path;
    ie_lora_t *lora;
    float scale;
    int pinned;
} load_job_t;

static ie_status_t load_job(ie_lora_cache_t *c, void *arg)
{
    load_job_t *lj = arg;
    ie_status_t st = IE_OK;
    int slot = -1;
    for (int i = 0; i < IE_LORA_CACHE_MAX && slot < 0; i++)
        if (!c->ent[i].used) slot = i;
    if (find_name(c, lj->name) >= 0) { /* loaded meanwhile by another thread */
        st = ie_error_set(IE_ERR_INVAL, "The lora adapter '%s' has already been loaded.", lj->name);
    } else if (slot < 0) {
        st = ie_error_set(IE_ERR_RANGE, "lora: %d adapters registered already (unload one)", IE_LORA_CACHE_MAX);
    } else {
        ent_t *x = &c->ent[slot];
        x->used = 1;
        x->pinned = lj->pinned;
        snprintf(x->name, sizeof x->name, "%s", lj->name);
        x->path = lj->path, lj->path = NULL;
        x->lora = lj->lora, lj->lora = NULL;
        x->scale = lj->scale;
        x->serial = ++c->next_serial;
        x->last_use = ++c->tick;
        enforce_budget(c, &slot, 1);
    }
    return st;
}

ie_status_t ie_lora_cache_load(ie_lora_cache_t *c, const char *name, const char *path, float scale, int pinned)
{
    ie_status_t st = IE_OK;
    ie_lora_t *a = NULL;
    char *p = NULL;
    if (!c || !path) return ie_error_set(IE_ERR_INVAL, "lora: NULL argument");
    if (!name_ok(name))
        return ie_error_set(IE_ERR_INVAL, "lora: bad adapter name '%.80s' (1..63 characters, none of '=' ',' ':')",
                            name ? name : "");
    if (!isfinite(scale)) return ie_error_set(IE_ERR_INVAL, "lora: adapter '%s': scale is not finite", name);
    pthread_mutex_lock(&c->mu);
    int taken = find_name(c, name) >= 0;
    pthread_mutex_unlock(&c->mu);
    if (taken) return ie_error_set(IE_ERR_INVAL, "The lora adapter '%s' has already been loaded.", name);
    if ((st = load_file(c, path, &a)) != IE_OK) goto cleanup;
    /* with the copy the backend would make of it (a worker's int8 copy):
     * what using it alone would hold */
    const uint64_t copy = c->o.budget_bytes ? ie_backend_lora_cost(c->o.backend, a) : 0;
    if (c->o.budget_bytes && a->bytes + copy > c->o.budget_bytes) {
        st = ie_error_set(IE_ERR_RANGE,
                          "lora: adapter '%s' takes %llu bytes (%llu of them the backend's copy), "
                          "more than the budget of %llu",
                          name, (unsigned long long)(a->bytes + copy), (unsigned long long)copy,
                          (unsigned long long)c->o.budget_bytes);
        goto cleanup;
    }
    if (!(p = strdup(path))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    load_job_t lj = {name, p, a, scale, pinned};
    st = excl_run(c, load_job, &lj);
    p = lj.path, a = lj.lora; /* still here when the job failed */
cleanup:
    ie_lora_destroy(&a);
    free(p);
    return st;
}

/* ie_lora_cache_unload's work (a job: step_mu, mu held). */
typedef struct unload_job {
    const char *name;
    int deferred;
} unload_job_t;

static ie_status_t unload_job(ie_lora_cache_t *c, void *arg)
{
    unload_job_t *uj = arg;
    ie_status_t st = IE_OK;
    int e = find_name(c, uj->name);
    if (e < 0) {
        st = ie_error_set(IE_ERR_RANGE, "The lora adapter '%.80s' cannot be found.", uj->name);
    } else {
        c->ent[e].gone = 1;
        for (int s = 0; s < IE_LORA_SET_MAX; s++)
            for (int k = 0; c->set[s].live && k < c->set[s].n; k++)
                if (c->set[s].ent[k] == e) c->set[s].dead = 1;
        uj->deferred = ent_busy(c, e);
        reap(c);
        gauges(c);
    }
    return st;
}

ie_status_t ie_lora_cache_unload(ie_lora_cache_t *c, const char *name, int *deferred)
{
    ie_status_t st = IE_OK;
    if (deferred) *deferred = 0;
    if (!c || !name) return ie_error_set(IE_ERR_INVAL, "lora: NULL argument");
    unload_job_t uj = {name, 0};
    st = excl_run(c, unload_job, &uj);
    if (deferred) *deferred = uj.deferred;
    return st;
}

/* The live set equal to the key (mu held), -1 when none. */
static int find_set(const ie_lora_cache_t *c, const int *ent, const uint64_t *serial, const float *scale, int n)
{
    for (int s = 0; s < IE_LORA_SET_MAX; s++) {
        const set_t *st = &c->set[s];
        if (!st->live || st->dead || st->n != n) continue;
        int eq = 1;
        for (int k = 0; eq && k < n; k++)
            eq = st->ent[k] == ent[k] && st->serial[k] == serial[k] && st->scale[k] == scale[k];
        if (eq) return s;
    }
    return -1;
}

static void lease_of(ie_lora_cache_t *c, int s, ie_lora_lease_t *out)
{
    set_t *st = &c->set[s];
    st->refs++;
    st->last_use = ++c->tick;
    for (int k = 0; k < st->n; k++) c->ent[st->ent[k]].last_use = st->last_use;
    *out = (ie_lora_lease_t){st->id, st->salt, s};
}

/* The attaching half of ie_lora_cache_acquire (a job: step_mu, mu held):
 * the reloaded weights (fresh) go into their entries, then the equal set
 * is leased or a new one attached. stale: a part was unloaded or evicted
 * meanwhile (nothing done; the caller looks again). */
typedef struct attach_job {
    int n;
    const int *ent;
    const uint64_t *serial;
    const float *scale;
    ie_lora_t **fresh;
    ie_lora_lease_t *out;
    int stale;
    int slot; /* the set slot being attached                  */
} attach_job_t;

/* The end of an attach (step_mu, mu held): the set goes live and is
 * leased when the backend took it (st IE_OK). */
static ie_status_t attach_finish(ie_lora_cache_t *c, void *arg, ie_status_t st)
{
    attach_job_t *aj = arg;
    if (st == IE_OK) {
        set_t *ns = &c->set[aj->slot];
        const int n = aj->n;
        ns->live = 1;
        ns->n = n;
        memcpy(ns->ent, aj->ent, (size_t)n * sizeof *aj->ent);
        memcpy(ns->serial, aj->serial, (size_t)n * sizeof *aj->serial);
        memcpy(ns->scale, aj->scale, (size_t)n * sizeof *aj->scale);
        ns->salt = (1ull << 63) | c->next_salt++;
        ns->bytes = ie_backend_lora_bytes(c->o.backend, ns->id); /* the backend's word, until detached */
        lease_of(c, aj->slot, aj->out);
        enforce_budget(c, aj->ent, n);
    }
    gauges(c);
    return st;
}

static ie_status_t attach_job(ie_lora_cache_t *c, void *arg)
{
    attach_job_t *aj = arg;
    ie_status_t st = IE_OK;
    const int n = aj->n;
    const int *ent = aj->ent;
    int s;
    for (int k = 0; k < n; k++) {
        ent_t *x = &c->ent[ent[k]];
        if (!x->used || x->gone || x->serial != aj->serial[k]) aj->stale = 1; /* unloaded meanwhile: look again */
        else if (!x->lora && aj->fresh[k]) x->lora = aj->fresh[k], aj->fresh[k] = NULL;
        else if (!x->lora) aj->stale = 1;
    }
    if (aj->stale) return IE_OK;
    if ((s = find_set(c, ent, aj->serial, aj->scale, n)) >= 0) { /* attached meanwhile */
        lease_of(c, s, aj->out);
        goto done;
    }
    int free_s = -1, lru = -1;
    for (int i = 0; i < IE_LORA_SET_MAX; i++) {
        if (!c->set[i].live) {
            if (free_s < 0) free_s = i;
        } else if (!c->set[i].refs && (lru < 0 || c->set[i].last_use < c->set[lru].last_use)) {
            lru = i;
        }
    }
    if (free_s < 0 && lru < 0) {
        st = ie_error_set(IE_ERR_BUSY, "lora: all %d adapter sets are in use by requests", IE_LORA_SET_MAX);
        goto done;
    }
    if (free_s < 0) set_detach(c, &c->set[free_s = lru]);
    ie_backend_lora_part_t parts[IE_LORA_SET_PARTS];
    for (int k = 0; k < n; k++) {
        const ent_t *x = &c->ent[ent[k]];
        parts[k] = (ie_backend_lora_part_t){x->name, x->path, x->lora, aj->scale[k]};
    }
    int pending = 0;
    aj->slot = free_s;
    if ((st = ie_backend_lora_add_begin(c->o.backend, parts, n, &c->set[free_s].id, &pending)) != IE_OK) goto done;
    if (pending && c->running && c->running->deferrable) {
        /* a cluster's ranks load it: the stepping thread steps on, and a
         * later step_begin finishes it (inflight_poll); the slot is held
         * for it, as no other job runs before */
        c->inflight = c->running;
        c->inflight_id = c->set[free_s].id;
        return IE_OK;
    }
    while (pending && !ie_backend_lora_add_poll(c->o.backend, c->set[free_s].id, 50, &st)) {}
    return attach_finish(c, aj, st);
done:
    gauges(c);
    return st;
}

ie_status_t ie_lora_cache_acquire(ie_lora_cache_t *c, const ie_lora_use_t *uses, int n, ie_lora_lease_t *out)
{
    ie_status_t st = IE_OK;
    int ent[IE_LORA_SET_PARTS];
    uint64_t serial[IE_LORA_SET_PARTS];
    float scale[IE_LORA_SET_PARTS];
    ie_lora_t *fresh[IE_LORA_SET_PARTS] = {0};
    char *paths[IE_LORA_SET_PARTS] = {0};
    *out = (ie_lora_lease_t){-1, 0, -1};
    if (!c) return ie_error_set(IE_ERR_INVAL, "lora: NULL argument");
    if (n == 0 && !uses) return IE_OK;
    if (!uses || n < 1 || n > IE_LORA_SET_PARTS)
        return ie_error_set(IE_ERR_INVAL, "lora: a set has 1..%d adapters, not %d", IE_LORA_SET_PARTS, n);
    /* two rounds at most: a reload and then, if an eviction raced it, one
     * more; a third miss is reported rather than looped on */
    for (int round = 0; round < 3; round++) {
        int missing = 0;
        pthread_mutex_lock(&c->mu);
        for (int k = 0; k < n && st == IE_OK; k++) {
            int e = uses[k].name ? find_name(c, uses[k].name) : -1;
            if (e < 0) {
                st = ie_error_set(IE_ERR_RANGE, "The lora adapter '%.80s' cannot be found.",
                                  uses[k].name ? uses[k].name : "(null)");
                break;
            }
            float sc = isnan(uses[k].scale) ? c->ent[e].scale : uses[k].scale;
            if (!isfinite(sc))
                st = ie_error_set(IE_ERR_INVAL, "lora: adapter '%s': scale not finite", uses[k].name);
            /* insertion by entry slot: the key does not depend on order */
            int j = k;
            for (; j > 0 && ent[j - 1] > e; j--)
                ent[j] = ent[j - 1], serial[j] = serial[j - 1], scale[j] = scale[j - 1];
            if (j > 0 && ent[j - 1] == e)
                st = ie_error_set(IE_ERR_INVAL, "lora: adapter '%s' named twice in one set", uses[k].name);
            ent[j] = e, serial[j] = c->ent[e].serial, scale[j] = sc;
        }
        int s = st == IE_OK ? find_set(c, ent, serial, scale, n) : -1;
        if (s >= 0) {
            lease_of(c, s, out);
            pthread_mutex_unlock(&c->mu);
            goto cleanup;
        }
        for (int k = 0; st == IE_OK && k < n; k++)
            if (!c->ent[ent[k]].lora && !fresh[k]) {
                free(paths[k]);
                if (!(paths[k] = strdup(c->ent[ent[k]].path))) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                missing++;
            }
        pthread_mutex_unlock(&c->mu);
        if (st != IE_OK) goto cleanup;
        /* evicted adapters come back from disk, no lock held */
        for (int k = 0; missing && k < n; k++)
            if (paths[k] && !fresh[k] && (st = load_file(c, paths[k], &fresh[k])) != IE_OK) goto cleanup;
        attach_job_t aj = {.n = n, .ent = ent, .serial = serial, .scale = scale, .fresh = fresh, .out = out};
        st = excl_run(c, attach_job, &aj);
        if (!aj.stale) goto cleanup;
        /* the sorted positions may differ next round */
        for (int k = 0; k < IE_LORA_SET_PARTS; k++) {
            ie_lora_destroy(&fresh[k]);
            free(paths[k]);
            paths[k] = NULL;
        }
    }
    st = ie_error_set(IE_ERR_BUSY, "lora: the adapters were unloaded or evicted while loading; try again");
cleanup:
    for (int k = 0; k < IE_LORA_SET_PARTS; k++) {
        ie_lora_destroy(&fresh[k]); /* a reload another thread beat */
        free(paths[k]);
    }
    return st;
}

void ie_lora_cache_release(ie_lora_cache_t *c, const ie_lora_lease_t *l, size_t n_gen)
{
    if (!c || !l || l->set < 0 || l->set >= IE_LORA_SET_MAX) return;
    pthread_mutex_lock(&c->mu);
    set_t *s = &c->set[l->set];
    if (s->live && s->salt == l->salt && s->refs > 0) {
        s->refs--;
        for (int k = 0; k < s->n; k++) {
            ie_metric_add(c->m_req, c->ent[s->ent[k]].name, 1);
            ie_metric_add(c->m_tok, c->ent[s->ent[k]].name, (double)n_gen);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

uint64_t ie_lora_cache_salt(ie_lora_cache_t *c, int id)
{
    uint64_t salt = 0;
    if (!c || id < 0) return 0;
    pthread_mutex_lock(&c->mu);
    for (int s = 0; s < IE_LORA_SET_MAX; s++)
        if (c->set[s].live && c->set[s].id == id) salt = c->set[s].salt;
    pthread_mutex_unlock(&c->mu);
    return salt;
}

void ie_lora_cache_step_begin(ie_lora_cache_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->step_mu);
    pthread_mutex_lock(&c->mu);
    inflight_poll(c, 0);
    jobs_drain(c);
    if (!c->inflight) reap(c); /* a detach waits for the attach in flight */
    pthread_mutex_unlock(&c->mu);
}

void ie_lora_cache_stepper(ie_lora_cache_t *c, int on, void (*wake)(void *), void *wake_ctx)
{
    if (!c) return;
    pthread_mutex_lock(&c->step_mu);
    pthread_mutex_lock(&c->mu);
    c->stepper_on = on;
    c->stepper = pthread_self();
    c->wake = on ? wake : NULL;
    c->wake_ctx = on ? wake_ctx : NULL;
    while (!inflight_poll(c, 50)) {}
    jobs_drain(c); /* queued before: nobody else would run them now */
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->step_mu);
}

void ie_lora_cache_step_end(ie_lora_cache_t *c)
{
    if (c) pthread_mutex_unlock(&c->step_mu);
}

int ie_lora_cache_take_detached(ie_lora_cache_t *c, uint64_t *salts, int max)
{
    int n = 0;
    if (!c || !salts || max < 1) return 0;
    pthread_mutex_lock(&c->mu);
    n = c->n_dropped < max ? c->n_dropped : max;
    if (n > 0) memcpy(salts, c->dropped + (c->n_dropped - n), (size_t)n * sizeof *salts);
    c->n_dropped -= n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int ie_lora_cache_list(ie_lora_cache_t *c, ie_lora_info_t *out, int max)
{
    int n = 0;
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < IE_LORA_CACHE_MAX; i++) {
        const ent_t *x = &c->ent[i];
        if (!x->used || x->gone) continue;
        if (out && n < max) {
            ie_lora_info_t *o = &out[n];
            memcpy(o->name, x->name, sizeof o->name);
            o->index = i;
            o->resident = x->lora != NULL;
            o->pinned = x->pinned;
            o->bytes = x->lora ? x->lora->bytes : 0;
        }
        n++;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

int ie_lora_cache_index(ie_lora_cache_t *c, const char *name)
{
    if (!c || !name) return -1;
    pthread_mutex_lock(&c->mu);
    int e = find_name(c, name);
    pthread_mutex_unlock(&c->mu);
    return e;
}

int ie_lora_cache_name_at(ie_lora_cache_t *c, int index, char *buf)
{
    int rc = -1;
    if (!c || index < 0 || index >= IE_LORA_CACHE_MAX) return -1;
    pthread_mutex_lock(&c->mu);
    if (c->ent[index].used && !c->ent[index].gone) {
        memcpy(buf, c->ent[index].name, IE_LORA_NAME_MAX);
        rc = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void ie_lora_cache_stats(ie_lora_cache_t *c, ie_lora_cache_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    out->bytes = resident_bytes(c, &out->resident);
    for (int s = 0; s < IE_LORA_SET_MAX; s++) out->sets += c->set[s].live;
    out->loads = c->loads;
    out->evictions = c->evictions;
    pthread_mutex_unlock(&c->mu);
}
