/* test_threadpool.c — fork-join semantics of ie_threadpool and ie_split_range.
 * Meant to be run under ThreadSanitizer too (build with -fsanitize=thread):
 * the per-thread slots below are plain (non-atomic) memory, so a missing
 * happens-before edge in the pool shows up as a reported race.
 */
#define _GNU_SOURCE
#include "ie_threadpool.h"

#include <CUnit/Basic.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    long count[64]; /* times share ith ran (plain memory: written by one thread per run) */
    int nth_seen[64];
    atomic_int calls; /* total calls in this run */
} run_ctx_t;

static void task_count(void *p, int ith, int nth)
{
    run_ctx_t *c = p;
    c->count[ith]++;
    c->nth_seen[ith] = nth;
    atomic_fetch_add(&c->calls, 1);
}

static void check_runs(int n_threads, int pin, int runs, int sleep_between)
{
    ie_threadpool_t *tp = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(n_threads, pin, &tp), IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tp);
    CU_ASSERT_EQUAL(ie_threadpool_size(tp), n_threads);
    run_ctx_t *c = calloc(1, sizeof *c);
    int bad = 0;
    for (int r = 0; r < runs; r++) {
        atomic_store(&c->calls, 0);
        ie_threadpool_run(tp, task_count, c);
        if (atomic_load(&c->calls) != n_threads) bad++;
        for (int i = 0; i < n_threads; i++) /* read plain memory right after the join */
            if (c->count[i] != r + 1 || c->nth_seen[i] != n_threads) bad++;
        if (sleep_between) {
            struct timespec ts = {0, 5 * 1000 * 1000}; /* past the spin+yield window */
            nanosleep(&ts, NULL);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    for (int i = n_threads; i < 64; i++) CU_ASSERT_EQUAL(c->count[i], 0);
    ie_threadpool_destroy(&tp);
    CU_ASSERT_PTR_NULL(tp);
    free(c);
}

static void test_runs_1(void) { check_runs(1, 0, 10000, 0); }
static void test_runs_2(void) { check_runs(2, 0, 10000, 0); }
static void test_runs_4(void) { check_runs(4, 0, 10000, 0); }
static void test_runs_pinned(void) { check_runs(2, 1, 2000, 0); }
static void test_runs_after_sleep(void) { check_runs(3, 0, 20, 1); } /* workers on the condvar */

/* Shares that take ~2 us: workers claim their own (the owner may also take
 * those of late workers). Every share runs exactly once either way, and
 * over many runs both paths occur. */
typedef struct {
    pthread_t owner;
    long count[8];
    atomic_long by_worker, by_owner;
} claim_ctx_t;

static void task_claim(void *p, int ith, int nth)
{
    claim_ctx_t *c = p;
    (void)nth;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 2000);
    c->count[ith]++;
    if (ith > 0) atomic_fetch_add(pthread_equal(pthread_self(), c->owner) ? &c->by_owner : &c->by_worker, 1);
}

static void test_claims(void)
{
    ie_threadpool_t *tp = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(3, 0, &tp), IE_OK);
    claim_ctx_t *c = calloc(1, sizeof *c);
    c->owner = pthread_self();
    int bad = 0;
    /* 3000 runs, more if no worker got to claim a share yet (on a busy
     * machine workers may be descheduled for a long time), at most ~10 s */
    const time_t t_end = time(NULL) + 10;
    for (int r = 0; r < 3000 || (atomic_load(&c->by_worker) == 0 && time(NULL) < t_end); r++) {
        ie_threadpool_run(tp, task_claim, c);
        for (int i = 0; i < 3; i++) bad += c->count[i] != r + 1;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(atomic_load(&c->by_worker) > 0);
    printf("\n  shares 1..2 run by their worker %ld times, taken over by the owner %ld times ",
           atomic_load(&c->by_worker), atomic_load(&c->by_owner));
    ie_threadpool_destroy(&tp);
    free(c);
}

/* Work that takes a while on some threads only: the join must wait for it. */
typedef struct {
    long sum[8];
} work_ctx_t;
static void task_uneven(void *p, int ith, int nth)
{
    work_ctx_t *c = p;
    long s = 0;
    const long n = ith == nth - 1 ? 2000000 : 10;
    for (long i = 0; i < n; i++) s += i & 7;
    c->sum[ith] = s;
}

static void test_uneven(void)
{
    ie_threadpool_t *tp = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(4, 0, &tp), IE_OK);
    for (int r = 0; r < 20; r++) {
        work_ctx_t c;
        memset(&c, 0, sizeof c);
        ie_threadpool_run(tp, task_uneven, &c);
        CU_ASSERT_EQUAL(c.sum[3], 7000000);
        CU_ASSERT_EQUAL(c.sum[0], 29);
    }
    ie_threadpool_destroy(&tp);
}

static void test_destroy(void)
{
    ie_threadpool_t *tp = NULL;
    ie_threadpool_destroy(NULL);
    ie_threadpool_destroy(&tp);    /* *self_p NULL: no-op */
    for (int n = 1; n <= 4; n++) { /* destroy without any run */
        CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(n, 0, &tp), IE_OK);
        ie_threadpool_destroy(&tp);
        CU_ASSERT_PTR_NULL(tp);
    }
    /* destroy while workers sleep on the condition variable */
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(3, 0, &tp), IE_OK);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    ie_threadpool_destroy(&tp);
    /* 0 threads means one per CPU */
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(0, 0, &tp), IE_OK);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) CU_ASSERT_EQUAL(ie_threadpool_size(tp), CPU_COUNT(&set));
    ie_threadpool_destroy(&tp);
    CU_ASSERT_EQUAL(ie_threadpool_new(-1, 0, &tp), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_threadpool_new(2, 0, NULL), IE_ERR_INVAL);
}

static void test_affinity_env(void)
{
    /* IE_TP_USE_AFFINITY=0 overrides pin=1: the owner's mask is unchanged. */
    cpu_set_t before, during;
    CU_ASSERT_EQUAL_FATAL(sched_getaffinity(0, sizeof before, &before), 0);
    setenv("IE_TP_USE_AFFINITY", "0", 1);
    ie_threadpool_t *tp = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(2, 1, &tp), IE_OK);
    sched_getaffinity(0, sizeof during, &during);
    CU_ASSERT(CPU_EQUAL(&before, &during));
    ie_threadpool_destroy(&tp);
    /* =1 with pin=0: the owner is pinned to one CPU while the pool lives
     * (when there are at least 2 CPUs), and restored afterwards. */
    setenv("IE_TP_USE_AFFINITY", "1", 1);
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(2, 0, &tp), IE_OK);
    sched_getaffinity(0, sizeof during, &during);
    if (CPU_COUNT(&before) >= 2) CU_ASSERT_EQUAL(CPU_COUNT(&during), 1);
    run_ctx_t *c = calloc(1, sizeof *c);
    ie_threadpool_run(tp, task_count, c);
    CU_ASSERT_EQUAL(atomic_load(&c->calls), 2);
    free(c);
    ie_threadpool_destroy(&tp);
    sched_getaffinity(0, sizeof during, &during);
    CU_ASSERT(CPU_EQUAL(&before, &during));
    unsetenv("IE_TP_USE_AFFINITY");
}

/* The idle hook: every worker calls it after every job with its own
 * thread number and that job's generation, and it may run until the next
 * job is published (here it waits for exactly that, so a hook that did
 * not see the publication would hang the test); cleared, it is not
 * called. */
typedef struct {
    _Atomic int calls[4];
    _Atomic int bad;
} idle_rec_t;

static void idle_wait(void *ctx, int ith, int nth, const ie_threadpool_t *tp, unsigned gen)
{
    idle_rec_t *r = ctx;
    if (ith < 1 || ith >= nth || nth != 4) atomic_fetch_add(&r->bad, 1);
    else atomic_fetch_add(&r->calls[ith], 1);
    while (!ie_threadpool_idle_over(tp, gen)) sched_yield();
}

static void nop_task(void *ctx, int ith, int nth)
{
    (void)ctx;
    (void)ith;
    (void)nth;
}

static void test_idle_hook(void)
{
    ie_threadpool_t *tp = NULL;
    CU_ASSERT_FATAL(ie_threadpool_new(4, 0, &tp) == IE_OK);
    idle_rec_t r;
    memset(&r, 0, sizeof r);
    const ie_idle_t hook = {idle_wait, &r};
    ie_threadpool_set_idle(tp, &hook);
    /* jobs until every worker has idled at least once (a worker the
     * scheduler keeps off a core may see none of the first jobs: the owner
     * runs its share); ~10 s at most */
    int all = 0, jobs = 0;
    for (; jobs < 100000 && !all; jobs++) {
        ie_threadpool_run(tp, nop_task, NULL);
        all = 1;
        for (int i = 1; i < 4; i++) all &= atomic_load(&r.calls[i]) > 0;
        if (jobs > 1000) usleep(100);
    }
    CU_ASSERT(all);
    ie_threadpool_set_idle(tp, NULL);
    ie_threadpool_run(tp, nop_task, NULL); /* publishes the clear; hooks return */
    usleep(20000);
    int before[4];
    for (int i = 1; i < 4; i++) before[i] = atomic_load(&r.calls[i]);
    for (int i = 0; i < 50; i++) ie_threadpool_run(tp, nop_task, NULL);
    usleep(20000);
    CU_ASSERT_EQUAL(atomic_load(&r.bad), 0);
    for (int i = 1; i < 4; i++) {
        CU_ASSERT(before[i] <= jobs + 1);                     /* at most one call per job */
        CU_ASSERT_EQUAL(atomic_load(&r.calls[i]), before[i]); /* cleared: no more calls */
    }
    ie_threadpool_destroy(&tp);
    /* destroyed with the hook set: the hooks see the stop and return */
    memset(&r, 0, sizeof r);
    CU_ASSERT_FATAL(ie_threadpool_new(4, 0, &tp) == IE_OK);
    ie_threadpool_set_idle(tp, &hook);
    for (int i = 0; i < 10; i++) ie_threadpool_run(tp, nop_task, NULL);
    ie_threadpool_destroy(&tp);
    CU_ASSERT_PTR_NULL(tp);
    CU_ASSERT_EQUAL(atomic_load(&r.bad), 0);
}

static void test_split_range(void)
{
    int bad = 0;
    for (long n = 0; n <= 200; n++)
        for (int nth = 1; nth <= 9; nth++) {
            long expect_b = 0, minsz = n + 1, maxsz = -1;
            for (int ith = 0; ith < nth; ith++) {
                long b, e;
                ie_split_range(n, ith, nth, &b, &e);
                if (b != expect_b || e < b) bad++; /* contiguous, in order, no overlap */
                expect_b = e;
                if (e - b < minsz) minsz = e - b;
                if (e - b > maxsz) maxsz = e - b;
            }
            if (expect_b != n) bad++;     /* covers [0, n) */
            if (maxsz - minsz > 1) bad++; /* balanced */
        }
    long b, e;
    ie_split_range(1L << 40, 3, 4, &b, &e); /* no overflow on big n */
    if (b != 3 * (1L << 38) || e != 1L << 40) bad++;
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("threadpool", NULL, NULL);
    CU_add_test(s, "10k runs, 1 thread", test_runs_1);
    CU_add_test(s, "10k runs, 2 threads", test_runs_2);
    CU_add_test(s, "10k runs, 4 threads", test_runs_4);
    CU_add_test(s, "pinned runs", test_runs_pinned);
    CU_add_test(s, "runs after workers sleep", test_runs_after_sleep);
    CU_add_test(s, "shares claimed by workers or the owner", test_claims);
    CU_add_test(s, "uneven work joins", test_uneven);
    CU_add_test(s, "destroy", test_destroy);
    CU_add_test(s, "IE_TP_USE_AFFINITY", test_affinity_env);
    CU_add_test(s, "idle hook between jobs", test_idle_hook);
    CU_add_test(s, "split_range", test_split_range);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
