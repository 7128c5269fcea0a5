/* threadpool.c — persistent fork-join pool (see ie_threadpool.h).
 *
 * Protocol. The owner publishes a job by writing fn/ctx, resetting `done`
 * and then bumping the generation counter `gen` (release). Workers wait for
 * `gen` to move past the last value they saw: first spinning with pause (a
 * forward pass issues hundreds of jobs per token a few microseconds apart,
 * so a sleep/wake per job would cost more than the work), then yielding,
 * then sleeping on a condition variable.
 *
 * Shares are claimed, not assigned: share i (i >= 1) is run by whoever
 * first moves claimed[i] from gen-1 to gen with a CAS — normally worker i,
 * which claims as soon as it sees the job. The owner runs share 0, then
 * claims and runs every share whose worker has not started yet. On an
 * oversubscribed machine a descheduled worker thus delays nothing: without
 * this a join waited for the scheduler to run that worker again (hundreds of
 * microseconds per job with a busy neighbour). Every share still runs
 * exactly once per job; `done` counts finished shares 1..n-1 (release by the
 * runner, acquire by the owner, so their writes are visible after the join).
 * A worker that wakes late for an already finished job fails its CAS (the
 * slot holds gen, not gen-1) and never touches the job's fields.
 *
 * Lost wake-ups are excluded by a Dekker pair on seq_cst atomics: a worker
 * increments `n_sleeping` under the mutex before re-checking `gen`; the owner
 * bumps `gen` before reading `n_sleeping`, and broadcasts under the mutex if
 * anyone may be asleep. Every shared field is atomic or mutex-guarded, so
 * the pool is ThreadSanitizer-clean.
 */
#define _GNU_SOURCE
#include "ie_threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define IE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define IE_CPU_RELAX() __asm__ volatile("yield")
#else
#define IE_CPU_RELAX() ((void)0)
#endif

/* Spin this many pause iterations (~10-50 us), then yield until
 * IE_TP_YIELD_NS have passed since the wait began, then sleep. */
#define IE_TP_SPIN 4096
#define IE_TP_YIELD_NS 2000000LL

typedef struct ie_worker {
    struct ie_threadpool *pool;
    pthread_t thread;
    int ith;
    int cpu; /* pinned CPU, or -1 */
} ie_worker_t;

struct ie_threadpool {
    int n;                /* threads in all, the owner included */
    ie_worker_t *workers; /* n-1 workers (ith = 1..n-1)         */

    _Atomic(ie_task_fn) fn; /* current job (published before gen)       */
    _Atomic(void *) ctx;
    _Atomic unsigned gen;      /* bumped once per job, by the owner only     */
    _Atomic unsigned *claimed; /* [n]: last gen in which share i was taken */
    _Atomic int done;          /* shares 1..n-1 finished in this job         */
    _Atomic int stop;
    _Atomic int n_sleeping;
    _Atomic(const ie_idle_t *) idle; /* between jobs, on workers (set_idle) */

    pthread_mutex_t mu;
    pthread_cond_t cv;

    int pinned;    /* owner thread pinned by us           */
    int owner_cpu; /* the CPU it was pinned to, or -1     */
    pthread_t owner;
    cpu_set_t owner_mask; /* owner's affinity before pinning     */
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Wait until gen != seen or stop; returns the new generation. */
static unsigned wait_for_job(struct ie_threadpool *tp, unsigned seen)
{
    unsigned g;
    for (int i = 0; i < IE_TP_SPIN; i++) {
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&tp->stop, memory_order_acquire)) return g;
        IE_CPU_RELAX();
    }
    const long long t0 = now_ns();
    for (;;) {
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&tp->stop, memory_order_acquire)) return g;
        if (now_ns() - t0 > IE_TP_YIELD_NS) break;
        sched_yield();
    }
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->n_sleeping, 1); /* seq_cst: pairs with the owner's gen bump */
    while ((g = atomic_load(&tp->gen)) == seen && !atomic_load(&tp->stop)) pthread_cond_wait(&tp->cv, &tp->mu);
    atomic_fetch_sub(&tp->n_sleeping, 1);
    pthread_mutex_unlock(&tp->mu);
    return g;
}

/* Take share ith of job g; fails if someone else did, or g is over. */
static int claim(struct ie_threadpool *tp, int ith, unsigned g)
{
    unsigned expect = g - 1;
    return atomic_compare_exchange_strong_explicit(&tp->claimed[ith], &expect, g, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

static void *worker_main(void *arg)
{
    ie_worker_t *w = arg;
    struct ie_threadpool *tp = w->pool;
    if (w->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(w->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
    }
    unsigned seen = 0;
    for (;;) {
        seen = wait_for_job(tp, seen);
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        if (claim(tp, w->ith, seen)) {
            ie_task_fn fn = atomic_load_explicit(&tp->fn, memory_order_relaxed);
            void *ctx = atomic_load_explicit(&tp->ctx, memory_order_relaxed);
            fn(ctx, w->ith, tp->n);
            atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
        }
        /* acquire: pairs with set_idle's release (the owner's writes before
         * it, which the hook reads, are visible) */
        const ie_idle_t *idle = atomic_load_explicit(&tp->idle, memory_order_acquire);
        if (idle) idle->fn(idle->ctx, w->ith, tp->n, tp, seen);
    }
    return NULL;
}

/* The first hardware thread of CPU c's core (its sibling list's first). */
static int core_of(int c)
{
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
    FILE *f = fopen(path, "r");
    int first = c;
    if (f) {
        if (fscanf(f, "%d", &first) != 1) first = c;
        fclose(f);
    }
    return first < 0 || first >= CPU_SETSIZE ? c : first;
}

/* AFFINITY=compact: the hardware threads of one core before the next core
 * (threads that share caches sit together); otherwise ("scatter", the
 * default) one CPU per physical core first, then the remaining hardware
 * threads. Returns the CPUs picked (at most max) from the allowed set. */
static int pick_cpus(int *cpus, int max, const cpu_set_t *allowed)
{
    int n = 0;
    const char *aff = getenv("AFFINITY");
    if (aff && !strcmp(aff, "compact")) {
        char taken[CPU_SETSIZE];
        memset(taken, 0, sizeof taken);
        for (int c = 0; c < CPU_SETSIZE && n < max; c++) {
            if (!CPU_ISSET(c, allowed) || taken[c]) continue;
            const int core = core_of(c);
            for (int d = c; d < CPU_SETSIZE && n < max; d++) /* c and its siblings */
                if (CPU_ISSET(d, allowed) && !taken[d] && core_of(d) == core) {
                    taken[d] = 1;
                    cpus[n++] = d;
                }
        }
        return n;
    }
    char seen_core[CPU_SETSIZE];
    memset(seen_core, 0, sizeof seen_core);
    /* First pass: the first hardware thread of each core (by sibling list). */
    for (int c = 0; c < CPU_SETSIZE && n < max; c++) {
        if (!CPU_ISSET(c, allowed)) continue;
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        int first = c;
        if (f) {
            if (fscanf(f, "%d", &first) != 1) first = c;
            fclose(f);
        }
        if (first < 0 || first >= CPU_SETSIZE) first = c;
        if (seen_core[first]) continue;
        seen_core[first] = 1;
        cpus[n++] = c;
    }
    /* More threads than cores: fill with the remaining hardware threads. */
    for (int c = 0; c < CPU_SETSIZE && n < max; c++) {
        if (!CPU_ISSET(c, allowed)) continue;
        int used = 0;
        for (int i = 0; i < n; i++) used |= cpus[i] == c;
        if (!used) cpus[n++] = c;
    }
    return n;
}

ie_status_t ie_threadpool_new(int n_threads, int pin, ie_threadpool_t **out)
{
    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_threadpool_new: out is NULL");
    *out = NULL;
    if (n_threads < 0) return ie_error_set(IE_ERR_INVAL, "ie_threadpool_new: n_threads %d < 0", n_threads);

    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    int n_cpu = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) n_cpu = CPU_COUNT(&allowed);
    if (n_cpu <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_cpu = nc > 0 ? (int)nc : 1;
        CPU_ZERO(&allowed);
        for (int c = 0; c < n_cpu && c < CPU_SETSIZE; c++) CPU_SET(c, &allowed);
    }
    if (n_threads == 0) n_threads = n_cpu;

    const char *env = getenv("IE_TP_USE_AFFINITY");
    if (env && (env[0] == '0' || env[0] == '1') && env[1] == '\0') pin = env[0] == '1';
    /* Pinning more threads than CPUs would stack threads on one core. */
    if (n_threads > n_cpu) pin = 0;

    struct ie_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return ie_error_set(IE_ERR_NOMEM, "ie_threadpool_new: out of memory");
    tp->n = n_threads;
    atomic_init(&tp->fn, NULL);
    atomic_init(&tp->ctx, NULL);
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->idle, NULL);
    atomic_init(&tp->done, 0);
    atomic_init(&tp->stop, 0);
    atomic_init(&tp->n_sleeping, 0);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);

    int cpus[CPU_SETSIZE];
    int n_pick = pin ? pick_cpus(cpus, n_threads, &allowed) : 0;
    if (n_pick < n_threads) pin = 0;

    const size_t nt = (size_t)(unsigned)n_threads; /* >= 1 here */
    tp->claimed = calloc(nt, sizeof *tp->claimed);
    if (nt > 1) tp->workers = calloc(nt - 1, sizeof *tp->workers);
    if (!tp->claimed || (n_threads > 1 && !tp->workers)) {
        free((void *)tp->claimed);
        free(tp->workers);
        pthread_cond_destroy(&tp->cv);
        pthread_mutex_destroy(&tp->mu);
        free(tp);
        return ie_error_set(IE_ERR_NOMEM, "ie_threadpool_new: out of memory");
    }
    for (int i = 0; i < n_threads; i++) atomic_init(&tp->claimed[i], 0);
    for (int i = 1; i < n_threads; i++) {
        ie_worker_t *w = &tp->workers[i - 1];
        w->pool = tp;
        w->ith = i;
        w->cpu = pin ? cpus[i] : -1;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            /* Stop the ones already started, then fail. */
            tp->n = i; /* workers 1..i-1 exist */
            ie_threadpool_destroy(&tp);
            return ie_error_set(IE_ERR_INTERNAL, "ie_threadpool_new: pthread_create: %s", strerror(rc));
        }
    }
    if (pin) {
        tp->owner = pthread_self();
        if (pthread_getaffinity_np(tp->owner, sizeof tp->owner_mask, &tp->owner_mask) == 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpus[0], &set);
            tp->pinned = pthread_setaffinity_np(tp->owner, sizeof set, &set) == 0;
        }
    }
    tp->owner_cpu = tp->pinned ? cpus[0] : -1;
    *out = tp;
    return IE_OK;
}

void ie_threadpool_destroy(ie_threadpool_t **self_p)
{
    if (!self_p || !*self_p) return;
    struct ie_threadpool *tp = *self_p;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->workers[i - 1].thread, NULL);
    if (tp->pinned && pthread_equal(tp->owner, pthread_self()))
        pthread_setaffinity_np(tp->owner, sizeof tp->owner_mask, &tp->owner_mask);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->mu);
    free(tp->workers);
    free((void *)tp->claimed);
    free(tp);
    *self_p = NULL;
}

int ie_threadpool_size(const ie_threadpool_t *tp) { return tp ? tp->n : 0; }

/* Contract (ie_threadpool.h): workers report the CPU they were given at
 * creation (their own pthread_setaffinity_np is best effort). */
int ie_threadpool_cpu(const ie_threadpool_t *tp, int ith)
{
    if (!tp || ith < 0 || ith >= tp->n) return -1;
    return ith == 0 ? tp->owner_cpu : tp->workers[ith - 1].cpu;
}

void ie_threadpool_run(ie_threadpool_t *tp, ie_task_fn fn, void *ctx)
{
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    const unsigned g = atomic_load_explicit(&tp->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&tp->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&tp->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    atomic_store(&tp->gen, g); /* seq_cst: publishes fn/ctx/done; Dekker with n_sleeping */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }

    fn(ctx, 0, tp->n);
    /* Shares whose worker has not started yet: run them here. */
    for (int i = 1; i < tp->n; i++) {
        if (claim(tp, i, g)) {
            fn(ctx, i, tp->n);
            atomic_fetch_add_explicit(&tp->done, 1, memory_order_relaxed);
        }
    }

    /* Join: the remaining shares are running on their workers right now. */
    int spins = 0;
    while (atomic_load_explicit(&tp->done, memory_order_acquire) != tp->n - 1) {
        if (++spins < IE_TP_SPIN) IE_CPU_RELAX();
        else sched_yield();
    }
}

void ie_threadpool_set_idle(ie_threadpool_t *tp, const ie_idle_t *idle)
{
    if (tp) atomic_store_explicit(&tp->idle, idle, memory_order_release);
}

int ie_threadpool_idle_over(const ie_threadpool_t *tp, unsigned gen)
{
    return atomic_load_explicit(&tp->gen, memory_order_relaxed) != gen ||
           atomic_load_explicit(&tp->stop, memory_order_relaxed);
}

void ie_split_range(long n, int ith, int nth, long *b, long *e)
{
    if (n <= 0 || nth <= 0) { /* nothing to split, or nobody to split it for */
        *b = *e = 0;
        if (nth <= 0 && n > 0) *e = n;
        return;
    }
    const long q = n / nth, r = n % nth;
    *b = (long)ith * q + (ith < r ? ith : r);
    *e = *b + q + (ith < r ? 1 : 0);
}
