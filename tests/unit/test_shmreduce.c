/* test_shmreduce.c — the same-host tensor-parallel reduce (ie_shmreduce.h):
 * threads acting as ranks run thousands of reductions of random sizes and
 * must get exactly the bits of a plain rank-order sum; votes decide alike
 * on every rank (missing, mismatched or switched-off peers mean ZeroMQ);
 * a peer that never arrives times out; a peer that gave up on a reduction
 * is seen as gone past it; names are unlinked once every rank attached.
 * Meant to be run under ThreadSanitizer too (IE_TEST_ONLY=threads). */
#define _GNU_SOURCE
#include "ie_clock.h"
#include "ie_shmreduce.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t g_cid_seq;

/* A fresh cluster id per test (pid and a counter: parallel test runs on
 * one host never share one). */
static uint64_t new_cid(void) { return splitmix(((uint64_t)getpid() << 20) ^ ++g_cid_seq ^ (uint64_t)time(NULL)); }

/* Whether the segment name of (cid, epoch, rank) exists. */
static int seg_exists(uint64_t cid, uint64_t epoch, int rank)
{
    char name[96];
    snprintf(name, sizeof name, "/ie-tp-%016llx-%llu-%d", (unsigned long long)cid, (unsigned long long)epoch, rank);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0) close(fd);
    return fd >= 0;
}

/* Partial of rank r in reduction k, element j: values spread over decades
 * so that the summation order matters for the bits. */
static float part_value(uint64_t seed, int r, int k, size_t j)
{
    uint64_t h = splitmix(seed ^ splitmix(((uint64_t)r << 56) ^ ((uint64_t)k << 24) ^ j));
    float m = (float)(h >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
    static const float sc[4] = {1e-3f, 1.0f, 37.0f, 1e4f};
    return m * sc[(h >> 8) & 3];
}

/* ------------------------------------------------------------ many reductions */

typedef struct sched_item {
    uint64_t step;
    int index;
    size_t n;
} sched_item_t;

typedef struct cluster {
    uint64_t cid, epoch, seed;
    int P, spin_us, n_red;
    size_t maxf;
    sched_item_t *plan;
    pthread_barrier_t created;
} cluster_t;

typedef struct rank_arg {
    cluster_t *c;
    int rank;
    ie_status_t st_new, st_attach;
    int n_ok, n_bad, n_err;
    char err[256];
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    cluster_t *c = a->c;
    ie_shmreduce_t *s = NULL;
    ie_shmreduce_opts_t o = {.cluster_id = c->cid,
                             .epoch = c->epoch,
                             .rank = a->rank,
                             .n_ranks = c->P,
                             .max_floats = c->maxf,
                             .spin_us = c->spin_us};
    float *buf = malloc(c->maxf * sizeof(float)), *want = malloc(c->maxf * sizeof(float));
    a->st_new = ie_shmreduce_new(&o, &s);
    pthread_barrier_wait(&c->created); /* every segment exists: the READY barrier of a real cluster */
    if (a->st_new != IE_OK) goto done;
    a->st_attach = ie_shmreduce_attach(s, 10000);
    if (a->st_attach != IE_OK) goto done;
    for (int k = 0; k < c->n_red; k++) {
        const sched_item_t *it = &c->plan[k];
        for (size_t j = 0; j < it->n; j++) {
            buf[j] = part_value(c->seed, a->rank, k, j);
            float v = part_value(c->seed, 0, k, j); /* the plain rank-order sum */
            for (int r = 1; r < c->P; r++) v += part_value(c->seed, r, k, j);
            want[j] = v;
        }
        ie_status_t st = ie_shmreduce_run(s, it->step, it->index, buf, it->n, 10000);
        if (st != IE_OK) {
            if (!a->n_err++) snprintf(a->err, sizeof a->err, "%s", ie_error_last());
            break;
        }
        if (memcmp(buf, want, it->n * sizeof(float)) != 0) a->n_bad++;
        else a->n_ok++;
    }
done:
    ie_shmreduce_destroy(&s);
    free(buf);
    free(want);
    return NULL;
}

static void run_cluster(int P, int n_red, size_t maxf, int spin_us)
{
    cluster_t c = {.cid = new_cid(), .epoch = 7, .P = P, .spin_us = spin_us, .n_red = n_red, .maxf = maxf};
    c.seed = splitmix(c.cid);
    c.plan = calloc((size_t)n_red, sizeof *c.plan);
    /* steps strictly increase; each has 1..7 reductions (odd counts too, so
     * the buffer parity does not follow the index); sizes 1..maxf */
    uint64_t step = 1, h = c.seed;
    for (int k = 0; k < n_red;) {
        h = splitmix(h);
        int m = 1 + (int)(h % 7);
        for (int i = 0; i < m && k < n_red; i++, k++) {
            h = splitmix(h);
            c.plan[k] = (sched_item_t){step, i, (h & 3) == 0 ? maxf : 1 + (size_t)(h >> 8) % maxf};
        }
        step += 1 + (h >> 60) % 3; /* steps may skip numbers */
    }
    pthread_barrier_init(&c.created, NULL, (unsigned)P);
    pthread_t th[8];
    rank_arg_t a[8];
    memset(a, 0, sizeof a);
    for (int r = 0; r < P; r++) {
        a[r].c = &c;
        a[r].rank = r;
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < P; r++) {
        CU_ASSERT_EQUAL(a[r].st_new, IE_OK);
        CU_ASSERT_EQUAL(a[r].st_attach, IE_OK);
        CU_ASSERT_EQUAL(a[r].n_bad, 0);
        CU_ASSERT_EQUAL(a[r].n_err, 0);
        CU_ASSERT_EQUAL(a[r].n_ok, n_red);
        if (a[r].n_err) fprintf(stderr, "\n  rank %d: %s\n", r, a[r].err);
        CU_ASSERT_FALSE(seg_exists(c.cid, c.epoch, r)); /* unlinked at attach, nothing left */
    }
    pthread_barrier_destroy(&c.created);
    free(c.plan);
}

static int n_many(void) { return getenv("IE_SHM_TEST_QUICK") ? 500 : 4000; }

static void test_threads_2_ranks(void) { run_cluster(2, n_many(), 4 * 576, 0); }
static void test_threads_3_ranks(void) { run_cluster(3, n_many(), 3 * 576 + 5, 0); }
static void test_threads_3_ranks_sleeping(void) { run_cluster(3, n_many() / 2, 64, -1); } /* futex at once */
static void test_threads_4_ranks_tiny(void) { run_cluster(4, n_many() / 2, 1, 0); }

/* ------------------------------------------------------------ deciding */

static ie_shmreduce_opts_t opts(uint64_t cid, uint64_t epoch, int rank, int P, size_t maxf)
{
    return (ie_shmreduce_opts_t){.cluster_id = cid, .epoch = epoch, .rank = rank, .n_ranks = P, .max_floats = maxf};
}

static void test_env_off_and_bad_options(void)
{
    ie_shmreduce_t *s = (ie_shmreduce_t *)&s;
    const uint64_t cid = new_cid();
    ie_shmreduce_opts_t o = opts(cid, 1, 0, 2, 16);
    setenv("IE_TP_SHM", "0", 1);
    CU_ASSERT_EQUAL(ie_shmreduce_enabled(), 0);
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_NULL(s);
    CU_ASSERT_FALSE(seg_exists(cid, 1, 0));
    setenv("IE_TP_SHM", "1", 1);
    CU_ASSERT_EQUAL(ie_shmreduce_enabled(), 1);
    unsetenv("IE_TP_SHM");
    CU_ASSERT_EQUAL(ie_shmreduce_enabled(), 1);

    o.cluster_id = 0; /* an ASSIGN from a coordinator that sends no id */
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_ERR_UNSUPPORTED);
    o = opts(cid, 1, 2, 2, 16);
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_ERR_INVAL);
    o = opts(cid, 1, 0, 1, 16);
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_ERR_INVAL);
    o = opts(cid, 1, 0, 65, 16);
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_ERR_INVAL);
    o = opts(cid, 1, 0, 2, 0);
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(s);
    ie_shmreduce_destroy(&s); /* NULL is fine */
    ie_shmreduce_destroy(NULL);
}

/* Rank 0 of 2 decides, with rank 1 made by `o1` (or absent); every rank that
 * exists must come to the same answer, `want`. */
static void decide_pair(const ie_shmreduce_opts_t *o1, int env_off_1, ie_status_t want)
{
    const uint64_t cid = new_cid();
    ie_shmreduce_opts_t o0 = opts(cid, 3, 0, 2, 100), p1 = o1 ? *o1 : o0;
    ie_shmreduce_t *s0 = NULL, *s1 = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o0, &s0), IE_OK);
    CU_ASSERT_TRUE(seg_exists(cid, 3, 0));
    if (o1) {
        if (!p1.cluster_id) p1.cluster_id = cid;
        if (env_off_1) setenv("IE_TP_SHM", "0", 1);
        ie_status_t st = ie_shmreduce_new(&p1, &s1);
        unsetenv("IE_TP_SHM");
        CU_ASSERT_EQUAL(st, env_off_1 ? IE_ERR_UNSUPPORTED : IE_OK);
    }
    /* rank 0 first: a refusal is final at once; agreement needs rank 1's vote */
    double t0 = ie_now_ms();
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s0, want == IE_OK ? 50 : 3000), want == IE_OK ? IE_ERR_UNAVAILABLE : want);
    if (want == IE_ERR_UNSUPPORTED) CU_ASSERT(ie_now_ms() - t0 < 2000); /* decided without waiting out */
    if (s1) CU_ASSERT_EQUAL(ie_shmreduce_attach(s1, 5000), want);
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s0, 5000), want);
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s0, 5000), want); /* final */
    if (want == IE_ERR_UNSUPPORTED) {
        float x = 1;
        CU_ASSERT_EQUAL(ie_shmreduce_run(s0, 1, 0, &x, 1, 100), IE_ERR_INTERNAL); /* not attached */
    }
    ie_shmreduce_destroy(&s0);
    ie_shmreduce_destroy(&s1);
    CU_ASSERT_PTR_NULL(s0);
    CU_ASSERT_FALSE(seg_exists(cid, 3, 0));
    CU_ASSERT_FALSE(seg_exists(cid, 3, 1));
}

static void test_votes_decide_alike(void)
{
    ie_shmreduce_opts_t o;
    decide_pair(NULL, 0, IE_ERR_UNSUPPORTED); /* rank 1 elsewhere (no segment here) */
    o = opts(0, 3, 1, 2, 100);
    decide_pair(&o, 1, IE_ERR_UNSUPPORTED); /* rank 1 runs with IE_TP_SHM=0 */
    o = opts(0, 3, 1, 2, 101);
    decide_pair(&o, 0, IE_ERR_UNSUPPORTED); /* capacity differs: both refuse */
    o = opts(0, 4, 1, 2, 100);
    decide_pair(&o, 0, IE_ERR_UNSUPPORTED); /* another epoch: not found */
    o = opts(new_cid(), 3, 1, 2, 100);
    decide_pair(&o, 0, IE_ERR_UNSUPPORTED); /* another cluster on this host */
    o = opts(0, 3, 1, 2, 100);
    decide_pair(&o, 0, IE_OK); /* the same cluster: shared memory */
}

/* A peer that has not voted yet: the attach times out (IE_ERR_UNAVAILABLE,
 * still undecided) and succeeds once the peer votes. */
static void test_vote_late(void)
{
    const uint64_t cid = new_cid();
    ie_shmreduce_opts_t o0 = opts(cid, 1, 0, 2, 8), o1 = opts(cid, 1, 1, 2, 8);
    ie_shmreduce_t *s0 = NULL, *s1 = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o0, &s0), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o1, &s1), IE_OK);
    double t0 = ie_now_ms();
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s0, 100), IE_ERR_UNAVAILABLE);
    double dt = ie_now_ms() - t0;
    CU_ASSERT(dt >= 99 && dt < 3000);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "rank 1"));
    CU_ASSERT_TRUE(seg_exists(cid, 1, 0));                /* not decided: still linked */
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s1, 100), IE_OK); /* rank 0 already voted */
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s0, 100), IE_OK);
    CU_ASSERT_FALSE(seg_exists(cid, 1, 0));
    CU_ASSERT_FALSE(seg_exists(cid, 1, 1));
    float x = 1;
    CU_ASSERT_EQUAL(ie_shmreduce_run(s0, 1, 0, &x, 9, 100), IE_ERR_RANGE); /* over capacity */
    CU_ASSERT_EQUAL(ie_shmreduce_run(s0, 1ull << 43, 0, &x, 1, 100), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_shmreduce_run(s0, 1, 1 << 20, &x, 1, 100), IE_ERR_RANGE);
    ie_shmreduce_destroy(&s0);
    ie_shmreduce_destroy(&s1);
}

/* ------------------------------------------------------------ failures */

typedef struct pair {
    uint64_t cid;
    pthread_barrier_t bar;
    atomic_int flag;
    ie_status_t st[8];
    double ms[8];
    float got[8][4];
} pair_t;

static void fill4(float *x, int r, int k)
{
    for (int j = 0; j < 4; j++) x[j] = part_value(99, r, k, (size_t)j);
}

static int sum_ok(const float *got, int k)
{
    float a[4], b[4];
    fill4(a, 0, k);
    fill4(b, 1, k);
    for (int j = 0; j < 4; j++)
        if (got[j] != a[j] + b[j]) return 0;
    return 1;
}

/* Rank 1 attaches and then never reduces; rank 0's reduction times out. */
static void *never_rank1(void *p)
{
    pair_t *c = p;
    ie_shmreduce_opts_t o = opts(c->cid, 1, 1, 2, 4);
    ie_shmreduce_t *s = NULL;
    ie_shmreduce_new(&o, &s);
    pthread_barrier_wait(&c->bar);
    c->st[1] = s ? ie_shmreduce_attach(s, 5000) : IE_ERR_IO;
    pthread_barrier_wait(&c->bar); /* rank 0 reduces now; we stay mapped, silent */
    pthread_barrier_wait(&c->bar);
    ie_shmreduce_destroy(&s);
    return NULL;
}

static void test_threads_peer_never_arrives(void)
{
    pair_t c = {.cid = new_cid()};
    pthread_barrier_init(&c.bar, NULL, 2);
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, never_rank1, &c), 0);
    ie_shmreduce_opts_t o = opts(c.cid, 1, 0, 2, 4);
    o.spin_us = 200;
    ie_shmreduce_t *s = NULL;
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_OK);
    pthread_barrier_wait(&c.bar);
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s, 5000), IE_OK);
    pthread_barrier_wait(&c.bar);
    float x[4];
    fill4(x, 0, 0);
    double t0 = ie_now_ms();
    CU_ASSERT_EQUAL(ie_shmreduce_run(s, 5, 0, x, 4, 150), IE_ERR_UNAVAILABLE);
    double dt = ie_now_ms() - t0;
    CU_ASSERT(dt >= 149 && dt < 3000);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "no partial sum from rank 1 within 150 ms"));
    pthread_barrier_wait(&c.bar);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(c.st[1], IE_OK);
    ie_shmreduce_destroy(&s);
    pthread_barrier_destroy(&c.bar);
}

/* Rank 1 gives up on (1,0) before rank 0 comes (timeout) and goes on to
 * (2,0). Rank 0 still completes (1,0) from rank 1's other buffer, sees at
 * (1,1) that rank 1 went past it (fails at once, no waiting out), and both
 * complete (2,0) with the right sum: one failed step does not poison the
 * next. */
static void *gaveup_rank1(void *p)
{
    pair_t *c = p;
    ie_shmreduce_opts_t o = opts(c->cid, 1, 1, 2, 4);
    ie_shmreduce_t *s = NULL;
    ie_shmreduce_new(&o, &s);
    pthread_barrier_wait(&c->bar);
    if (!s || ie_shmreduce_attach(s, 5000) != IE_OK) {
        c->st[1] = IE_ERR_IO;
        atomic_store(&c->flag, 1);
        ie_shmreduce_destroy(&s);
        return NULL;
    }
    float x[4];
    fill4(x, 1, 0);
    c->st[1] = ie_shmreduce_run(s, 1, 0, x, 4, 50); /* rank 0 waits for the flag: times out */
    atomic_store(&c->flag, 1);
    fill4(c->got[1], 1, 2);
    c->st[2] = ie_shmreduce_run(s, 2, 0, c->got[1], 4, 10000);
    pthread_barrier_wait(&c->bar);
    ie_shmreduce_destroy(&s);
    return NULL;
}

static void test_threads_peer_went_past(void)
{
    pair_t c = {.cid = new_cid()};
    pthread_barrier_init(&c.bar, NULL, 2);
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, gaveup_rank1, &c), 0);
    ie_shmreduce_opts_t o = opts(c.cid, 1, 0, 2, 4);
    ie_shmreduce_t *s = NULL;
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &s), IE_OK);
    pthread_barrier_wait(&c.bar);
    CU_ASSERT_EQUAL(ie_shmreduce_attach(s, 5000), IE_OK);
    while (!atomic_load(&c.flag)) usleep(1000);
    float x[4];
    fill4(x, 0, 0);
    CU_ASSERT_EQUAL(ie_shmreduce_run(s, 1, 0, x, 4, 10000), IE_OK); /* rank 1's part is still there */
    CU_ASSERT_TRUE(sum_ok(x, 0));
    fill4(x, 0, 1);
    double t0 = ie_now_ms();
    CU_ASSERT_EQUAL(ie_shmreduce_run(s, 1, 1, x, 4, 10000), IE_ERR_UNAVAILABLE);
    CU_ASSERT(ie_now_ms() - t0 < 5000);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "went past"));
    fill4(c.got[0], 0, 2);
    CU_ASSERT_EQUAL(ie_shmreduce_run(s, 2, 0, c.got[0], 4, 10000), IE_OK);
    pthread_barrier_wait(&c.bar);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(c.st[1], IE_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(c.st[2], IE_OK);
    CU_ASSERT_TRUE(sum_ok(c.got[0], 2));
    CU_ASSERT_EQUAL(memcmp(c.got[0], c.got[1], sizeof c.got[0]), 0);
    ie_shmreduce_destroy(&s);
    pthread_barrier_destroy(&c.bar);
}

/* A leftover segment of the same name (a killed process of the same rank
 * and epoch) is replaced, and a destroyed handle leaves nothing behind. */
static void test_leftover_replaced(void)
{
    const uint64_t cid = new_cid();
    ie_shmreduce_opts_t o = opts(cid, 9, 0, 2, 32);
    ie_shmreduce_t *a = NULL, *b = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o, &a), IE_OK);
    CU_ASSERT_EQUAL(ie_shmreduce_new(&o, &b), IE_OK);
    CU_ASSERT_TRUE(seg_exists(cid, 9, 0));
    ie_shmreduce_destroy(&b);
    CU_ASSERT_FALSE(seg_exists(cid, 9, 0));
    ie_shmreduce_destroy(&a); /* its name is already gone: no harm */
    CU_ASSERT_PTR_NULL(a);
}

/* A new epoch's segment sweeps the names this cluster's earlier epochs
 * left behind (ranks killed before the vote), and nobody else's. */
static void test_new_epoch_sweeps_older(void)
{
    const uint64_t cid = new_cid(), other = new_cid();
    ie_shmreduce_opts_t o;
    ie_shmreduce_t *old[3] = {NULL, NULL, NULL}, *cur = NULL, *foreign = NULL;
    o = opts(cid, 3, 0, 2, 8);
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o, &old[0]), IE_OK);
    o = opts(cid, 3, 1, 2, 8);
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o, &old[1]), IE_OK);
    o = opts(cid, 12, 1, 2, 8); /* a later epoch than the new one: kept */
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o, &old[2]), IE_OK);
    o = opts(other, 3, 0, 2, 8);
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o, &foreign), IE_OK);
    o = opts(cid, 11, 0, 2, 8);
    CU_ASSERT_EQUAL_FATAL(ie_shmreduce_new(&o, &cur), IE_OK);
    CU_ASSERT_FALSE(seg_exists(cid, 3, 0));
    CU_ASSERT_FALSE(seg_exists(cid, 3, 1));
    CU_ASSERT_TRUE(seg_exists(cid, 12, 1));
    CU_ASSERT_TRUE(seg_exists(cid, 11, 0));
    CU_ASSERT_TRUE(seg_exists(other, 3, 0));
    for (int i = 0; i < 3; i++) ie_shmreduce_destroy(&old[i]);
    ie_shmreduce_destroy(&foreign);
    ie_shmreduce_destroy(&cur);
    CU_ASSERT_FALSE(seg_exists(cid, 12, 1));
    CU_ASSERT_FALSE(seg_exists(cid, 11, 0));
    CU_ASSERT_FALSE(seg_exists(other, 3, 0));
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("shmreduce", NULL, NULL);
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"threads: 2 ranks, random sizes, bit-identical to the rank-order sum", test_threads_2_ranks},
        {"threads: 3 ranks, random sizes, bit-identical", test_threads_3_ranks},
        {"threads: 3 ranks sleeping on the futex at once", test_threads_3_ranks_sleeping},
        {"threads: 4 ranks, one float", test_threads_4_ranks_tiny},
        {"threads: a peer that never arrives times out", test_threads_peer_never_arrives},
        {"threads: a peer that gave up and went past", test_threads_peer_went_past},
        {"IE_TP_SHM=0, no cluster id, bad options", test_env_off_and_bad_options},
        {"votes: every rank decides alike", test_votes_decide_alike},
        {"votes: a late vote times out, then attaches", test_vote_late},
        {"a leftover segment is replaced", test_leftover_replaced},
        {"a new epoch sweeps the cluster's older names", test_new_epoch_sweeps_older},
    };
    /* IE_TEST_ONLY=word runs the tests whose name holds it (make tsan) */
    const char *only = getenv("IE_TEST_ONLY");
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
        if (!only || strstr(tests[i].name, only)) CU_add_test(s, tests[i].name, tests[i].fn);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
