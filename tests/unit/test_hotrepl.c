/* test_hotrepl.c — per-NUMA-node copies of hot weights (IE_HOT_REPLICATE,
 * ie_worker.h "hot replicas"). This machine has one node, so the multi-node
 * path runs on fake nodes (IE_NUMA_FAKE_NODES=2: share ith on node ith % 2,
 * distinct copies all on node 0):
 *   - logits with copies are bit-identical (memcmp) to a worker without,
 *     on SmolLM2 (tied head: one copy per node serves head and lookups)
 *     and tiny GPT-OSS (separate head and embedding), prefill and decode;
 *   - each fake node's shares read their own copy: zeroing copy 1 of the
 *     head zeroes exactly the logits rows of node 1's share and leaves the
 *     others' bits alone; zeroing every copy zeroes every row (nobody reads
 *     the original); the lookups read share 0's node's embedding copy;
 *   - the cap skips what does not fit and says so;
 *   - on the real one-node topology nothing is copied ("1 node: no
 *     replicas needed"); the environment overrides the options.
 * A missing SmolLM2 (scripts/setup.sh) fails the suite.
 */
#define _GNU_SOURCE
#include "ie_numa.h"
#include "ie_threadpool.h"
#include "ie_worker.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SMOLLM2 IE_TEST_DATA "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GPTOSS IE_TEST_DATA "/tiny_gptoss.gguf"

static ie_model_src_t *g_smol, *g_gptoss;

static int suite_init(void)
{
    unsetenv("IE_HOT_REPLICATE");
    unsetenv("IE_HOT_REPL_LIMIT_MB");
    unsetenv("IE_NUMA_FAKE_NODES");
    unsetenv("IE_TP_USE_AFFINITY");
    if (ie_model_src_open(SMOLLM2, &g_smol) != IE_OK) return -1;
    return ie_model_src_open(GPTOSS, &g_gptoss) == IE_OK ? 0 : -1;
}

static int suite_clean(void)
{
    ie_model_src_destroy(&g_smol);
    ie_model_src_destroy(&g_gptoss);
    return 0;
}

/* A worker of `threads` unpinned threads; hot copies asked for when
 * `hot`, under `cap_mb`. */
static ie_status_t make(const ie_model_src_t *src, int threads, ie_precision_t prec, int hot, double cap_mb,
                        ie_worker_t **w)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_threads = threads;
    o.pin_threads = 0;
    o.n_ctx = 64;
    o.max_batch = 16;
    o.precision = prec;
    o.hot_replicate = hot;
    if (cap_mb >= 0) o.hot_repl_limit_mb = cap_mb;
    return ie_worker_new(src, &o, w);
}

static const int32_t k_ids[8] = {1, 504, 3458, 314, 4649, 314, 216, 42};

/* Logits of a fresh run: prefill of 6 tokens (every position's row), then
 * two decode steps; out holds 8 rows. */
static void run(ie_worker_t *w, float *out)
{
    const int nv = ie_worker_hparams(w)->n_vocab;
    int32_t ids[8], pos[8], seq[8] = {0};
    uint8_t want[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = k_ids[i] % nv;
        pos[i] = i;
        want[i] = 1;
    }
    ie_worker_seq_clear(w, 0);
    ie_batch_t pre = {6, ids, pos, seq, want, NULL, NULL};
    CU_ASSERT_EQUAL_FATAL(ie_worker_step(w, &pre, out), IE_OK);
    for (int i = 6; i < 8; i++) {
        ie_batch_t one = {1, ids + i, pos + i, seq, want, NULL, NULL};
        CU_ASSERT_EQUAL_FATAL(ie_worker_step(w, &one, out + (size_t)i * nv), IE_OK);
    }
}

/* One decode-shaped step of token k_ids[0] at position 0: one row. */
static void run1(ie_worker_t *w, float *out)
{
    const int32_t id = k_ids[0] % ie_worker_hparams(w)->n_vocab, pos = 0, seq = 0;
    ie_worker_seq_clear(w, 0);
    ie_batch_t b = {1, &id, &pos, &seq, NULL, NULL, NULL};
    CU_ASSERT_EQUAL_FATAL(ie_worker_step(w, &b, out), IE_OK);
}

/* (a): logits with copies == without, bit for bit. */
static void check_bits(const ie_model_src_t *src, ie_precision_t prec, int threads, int want_copies)
{
    ie_worker_t *ref = NULL, *hot = NULL;
    CU_ASSERT_EQUAL_FATAL(make(src, threads, prec, 0, -1, &ref), IE_OK);
    setenv("IE_NUMA_FAKE_NODES", "2", 1);
    ie_status_t st = make(src, threads, prec, 1, -1, &hot);
    unsetenv("IE_NUMA_FAKE_NODES");
    CU_ASSERT_EQUAL_FATAL(st, IE_OK);
    printf("\n    %s, %d threads: %s", ie_precision_name(prec), threads, ie_worker_hot_report(hot));
    CU_ASSERT_EQUAL(ie_worker_hot_report(ref)[0], '\0');
    CU_ASSERT_EQUAL(ie_worker_hot_replicas(ref), 0);
    CU_ASSERT_EQUAL(ie_worker_hot_replicas(hot), want_copies);
    for (int i = 0; i < threads; i++) CU_ASSERT_EQUAL(ie_worker_hot_replica_of(hot, i), i % 2);
    const size_t nv = (size_t)ie_worker_hparams(ref)->n_vocab;
    float *a = malloc(8 * nv * sizeof(float)), *b = malloc(8 * nv * sizeof(float));
    CU_ASSERT_FATAL(a && b);
    run(ref, a);
    run(hot, b);
    CU_ASSERT_EQUAL(memcmp(a, b, 8 * nv * sizeof(float)), 0);
    free(a);
    free(b);
    ie_worker_destroy(&ref);
    ie_worker_destroy(&hot);
}

static void test_bits_smollm2(void)
{
    check_bits(g_smol, IE_PREC_NATIVE, 2, 2); /* tied: head copies only */
    check_bits(g_smol, IE_PREC_NATIVE, 3, 2);
}

static void test_bits_gptoss(void)
{
    check_bits(g_gptoss, IE_PREC_NATIVE, 2, 4); /* head and embedding */
    check_bits(g_gptoss, IE_PREC_NATIVE, 3, 4);
    check_bits(g_gptoss, IE_PREC_INT8W, 2, 4); /* PANEL16 head */
}

/* Overwrite copy r of the head (embd 0) or embedding (1) with zeros. */
static void zero_copy(ie_worker_t *w, int embd, int r)
{
    size_t bytes = 0;
    void *p = (void *)ie_worker_hot_replica(w, embd, r, &bytes);
    CU_ASSERT_FATAL(p != NULL && bytes > 0);
    memset(p, 0, bytes);
}

/* (b): with 3 threads on 2 fake nodes, shares 0 and 2 read copy 0, share 1
 * copy 1. Zeroing head copy 1 must zero one contiguous block of rows (share
 * 1's: the middle third, whole panels) and keep every other row's bits;
 * zeroing copy 0 too must zero every row. The static split
 * (IE_DECODE_BALANCE=0): balanced decode matmuls let a thread take rows of
 * another share, read from its own node's copy, so which rows come from
 * copy 1 would depend on timing. */
static void check_who_reads(const ie_model_src_t *src, const char *what)
{
    ie_worker_t *ref = NULL, *hot = NULL;
    CU_ASSERT_EQUAL_FATAL(make(src, 3, IE_PREC_NATIVE, 0, -1, &ref), IE_OK);
    setenv("IE_NUMA_FAKE_NODES", "2", 1);
    setenv("IE_DECODE_BALANCE", "0", 1); /* see below */
    ie_status_t st = make(src, 3, IE_PREC_NATIVE, 1, -1, &hot);
    unsetenv("IE_DECODE_BALANCE");
    unsetenv("IE_NUMA_FAKE_NODES");
    CU_ASSERT_EQUAL_FATAL(st, IE_OK);
    CU_ASSERT_EQUAL(ie_worker_hot_replica_of(hot, 0), 0);
    CU_ASSERT_EQUAL(ie_worker_hot_replica_of(hot, 1), 1);
    CU_ASSERT_EQUAL(ie_worker_hot_replica_of(hot, 2), 0);
    const int nv = ie_worker_hparams(ref)->n_vocab;
    float *a = malloc((size_t)nv * sizeof(float)), *b = malloc((size_t)nv * sizeof(float));
    CU_ASSERT_FATAL(a && b);
    run1(ref, a);

    zero_copy(hot, 0, 1);
    run1(hot, b);
    int first = -1, last = -1, other_bad = 0;
    for (int i = 0; i < nv; i++) {
        if (b[i] == 0.0f && a[i] != 0.0f) {
            if (first < 0) first = i;
            last = i;
        }
    }
    for (int i = 0; i < nv; i++) {
        const int in_block = first >= 0 && i >= first && i <= last;
        if (in_block ? b[i] != 0.0f : memcmp(&a[i], &b[i], sizeof(float)) != 0) other_bad++;
    }
    printf("\n    %s: head copy 1 zeroed -> rows %d..%d of %d are 0, %d rows off", what, first, last, nv,
           other_bad);
    CU_ASSERT_EQUAL(other_bad, 0);
    /* share 1 of 3: the middle third (panel rounding aside) */
    CU_ASSERT(first > nv / 3 - 64 && first < nv / 3 + 64);
    CU_ASSERT(last > 2 * nv / 3 - 64 && last < 2 * nv / 3 + 64);

    zero_copy(hot, 0, 0);
    run1(hot, b);
    int nonzero = 0;
    for (int i = 0; i < nv; i++) nonzero += b[i] != 0.0f;
    CU_ASSERT_EQUAL(nonzero, 0); /* no share reads the original head */
    free(a);
    free(b);
    ie_worker_destroy(&ref);
    ie_worker_destroy(&hot);
}

static void test_who_reads_smollm2(void) { check_who_reads(g_smol, "SmolLM2"); }

/* GPT-OSS: head as above; the lookups run on the calling thread (share 0),
 * so zeroing embedding copy 1 changes nothing and zeroing copy 0 changes
 * the logits. */
static void test_who_reads_gptoss(void)
{
    check_who_reads(g_gptoss, "tiny GPT-OSS");

    ie_worker_t *ref = NULL, *hot = NULL;
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 2, IE_PREC_NATIVE, 0, -1, &ref), IE_OK);
    setenv("IE_NUMA_FAKE_NODES", "2", 1);
    setenv("IE_DECODE_BALANCE", "0", 1);
    ie_status_t st = make(g_gptoss, 2, IE_PREC_NATIVE, 1, -1, &hot);
    unsetenv("IE_DECODE_BALANCE");
    unsetenv("IE_NUMA_FAKE_NODES");
    CU_ASSERT_EQUAL_FATAL(st, IE_OK);
    const size_t nv = (size_t)ie_worker_hparams(ref)->n_vocab;
    float *a = malloc(nv * sizeof(float)), *b = malloc(nv * sizeof(float));
    CU_ASSERT_FATAL(a && b);
    run1(ref, a);
    zero_copy(hot, 1, 1);
    run1(hot, b);
    CU_ASSERT_EQUAL(memcmp(a, b, nv * sizeof(float)), 0);
    zero_copy(hot, 1, 0);
    run1(hot, b);
    CU_ASSERT_NOT_EQUAL(memcmp(a, b, nv * sizeof(float)), 0);
    free(a);
    free(b);
    ie_worker_destroy(&ref);
    ie_worker_destroy(&hot);
}

/* (c): the cap. Tiny GPT-OSS: room for the head's two copies but not the
 * embedding's; no room at all; SmolLM2's tied head over a 30 MiB cap. */
static void test_cap(void)
{
    ie_worker_t *w = NULL;
    size_t head = 0, embd = 0;
    setenv("IE_NUMA_FAKE_NODES", "2", 1);
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 2, IE_PREC_NATIVE, 1, -1, &w), IE_OK);
    CU_ASSERT_PTR_NOT_NULL(ie_worker_hot_replica(w, 0, 0, &head));
    CU_ASSERT_PTR_NOT_NULL(ie_worker_hot_replica(w, 1, 1, &embd));
    CU_ASSERT_PTR_NULL(ie_worker_hot_replica(w, 1, 2, NULL)); /* two nodes */
    ie_worker_destroy(&w);
    CU_ASSERT_FATAL(head > 0 && embd > 0);

    const double fit_head = (2.0 * head + embd) / 1048576.0; /* the head's copies, not the embedding's */
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 2, IE_PREC_NATIVE, 1, fit_head, &w), IE_OK);
    printf("\n    cap %.3f MiB: %s", fit_head, ie_worker_hot_report(w));
    CU_ASSERT_EQUAL(ie_worker_hot_replicas(w), 2);
    CU_ASSERT_PTR_NOT_NULL(ie_worker_hot_replica(w, 0, 1, NULL));
    CU_ASSERT_PTR_NULL(ie_worker_hot_replica(w, 1, 0, NULL));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_worker_hot_report(w), "skipped token_embd.weight"));
    CU_ASSERT_PTR_NULL(strstr(ie_worker_hot_report(w), "skipped output.weight"));
    ie_worker_destroy(&w);

    /* the environment's cap wins over the options' */
    setenv("IE_HOT_REPL_LIMIT_MB", "0", 1);
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 2, IE_PREC_NATIVE, 1, 1024, &w), IE_OK);
    printf("\n    cap 0: %s", ie_worker_hot_report(w));
    CU_ASSERT_EQUAL(ie_worker_hot_replicas(w), 0);
    CU_ASSERT_EQUAL(ie_worker_hot_replica_of(w, 0), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_worker_hot_report(w), "skipped output.weight"));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_worker_hot_report(w), "skipped token_embd.weight"));
    ie_worker_destroy(&w);
    unsetenv("IE_HOT_REPL_LIMIT_MB");

    CU_ASSERT_EQUAL_FATAL(make(g_smol, 2, IE_PREC_NATIVE, 1, 30, &w), IE_OK);
    printf("\n    SmolLM2, cap 30 MiB: %s", ie_worker_hot_report(w));
    CU_ASSERT_EQUAL(ie_worker_hot_replicas(w), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_worker_hot_report(w), "skipped token_embd.weight (tied head)"));
    ie_worker_destroy(&w);
    unsetenv("IE_NUMA_FAKE_NODES");
}

/* (d): the real topology. On one node nothing is copied, pinned or not. */
static void test_one_node(void)
{
    ie_topo_t t;
    CU_ASSERT_EQUAL_FATAL(ie_topo_read(&t), IE_OK);
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 2, IE_PREC_NATIVE, 1, -1, &w), IE_OK);
    printf("\n    this machine (%d node%s): %s", t.n_nodes, t.n_nodes == 1 ? "" : "s", ie_worker_hot_report(w));
    if (t.n_nodes == 1) {
        CU_ASSERT_STRING_EQUAL(ie_worker_hot_report(w), "1 node: no replicas needed");
        CU_ASSERT_EQUAL(ie_worker_hot_replicas(w), 0);
        CU_ASSERT_EQUAL(ie_worker_hot_replica_of(w, 0), -1);
        CU_ASSERT_PTR_NULL(ie_worker_hot_replica(w, 0, 0, NULL));
    }
    ie_worker_destroy(&w);

    /* pinned threads: their CPUs' node */
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 16;
    o.hot_replicate = 1;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_gptoss, &o, &w), IE_OK);
    if (t.n_nodes == 1) CU_ASSERT_STRING_EQUAL(ie_worker_hot_report(w), "1 node: no replicas needed");
    ie_worker_destroy(&w);
}

/* What the real path reads: the CPU each pool thread is pinned to and
 * that CPU's node. */
static void test_thread_nodes(void)
{
    ie_threadpool_t *tp = NULL;
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(2, 0, &tp), IE_OK);
    CU_ASSERT_EQUAL(ie_threadpool_cpu(tp, 0), -1); /* not pinned */
    CU_ASSERT_EQUAL(ie_threadpool_cpu(tp, 1), -1);
    CU_ASSERT_EQUAL(ie_threadpool_cpu(tp, 2), -1); /* no such thread */
    ie_threadpool_destroy(&tp);
    if (ncpu >= 2) {
        CU_ASSERT_EQUAL_FATAL(ie_threadpool_new(2, 1, &tp), IE_OK);
        const int c0 = ie_threadpool_cpu(tp, 0), c1 = ie_threadpool_cpu(tp, 1);
        CU_ASSERT(c0 >= 0 && c1 >= 0 && c0 != c1);
        CU_ASSERT(ie_numa_node_of_cpu(c0) >= 0);
        CU_ASSERT(ie_numa_node_of_cpu(c1) >= 0);
        ie_threadpool_destroy(&tp);
    }
    CU_ASSERT_EQUAL(ie_numa_node_of_cpu(-1), -1);
    ie_topo_t t;
    if (ie_topo_read(&t) == IE_OK && t.n_nodes == 1) CU_ASSERT_EQUAL(ie_numa_node_of_cpu(0), 0);
}

/* The environment over the options, and bad values. */
static void test_env(void)
{
    ie_worker_t *w = NULL;
    setenv("IE_HOT_REPLICATE", "1", 1);
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 1, IE_PREC_NATIVE, 0, -1, &w), IE_OK);
    CU_ASSERT_NOT_EQUAL(ie_worker_hot_report(w)[0], '\0');
    ie_worker_destroy(&w);
    setenv("IE_HOT_REPLICATE", "0", 1);
    setenv("IE_NUMA_FAKE_NODES", "2", 1);
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 2, IE_PREC_NATIVE, 1, -1, &w), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_worker_hot_report(w), "");
    CU_ASSERT_EQUAL(ie_worker_hot_replicas(w), 0);
    ie_worker_destroy(&w);
    unsetenv("IE_HOT_REPLICATE");

    /* one thread on fake nodes: one node in use */
    CU_ASSERT_EQUAL_FATAL(make(g_gptoss, 1, IE_PREC_NATIVE, 1, -1, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_hot_replicas(w), 0);
    ie_worker_destroy(&w);

    setenv("IE_NUMA_FAKE_NODES", "0", 1);
    CU_ASSERT_EQUAL(make(g_gptoss, 2, IE_PREC_NATIVE, 1, -1, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(w);
    unsetenv("IE_NUMA_FAKE_NODES");
    setenv("IE_HOT_REPL_LIMIT_MB", "lots", 1);
    CU_ASSERT_EQUAL(make(g_gptoss, 2, IE_PREC_NATIVE, 1, -1, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(w);
    /* not asked for: the cap is not even read */
    CU_ASSERT_EQUAL(make(g_gptoss, 2, IE_PREC_NATIVE, 0, -1, &w), IE_OK);
    ie_worker_destroy(&w);
    unsetenv("IE_HOT_REPL_LIMIT_MB");
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.hot_replicate = 1;
    o.hot_repl_limit_mb = -1;
    CU_ASSERT_EQUAL(ie_worker_new(g_gptoss, &o, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(w);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("hotrepl", suite_init, suite_clean);
    CU_add_test(s, "SmolLM2: copies == none (bits)", test_bits_smollm2);
    CU_add_test(s, "tiny GPT-OSS: copies == none (bits)", test_bits_gptoss);
    CU_add_test(s, "SmolLM2: each fake node's shares read their copy", test_who_reads_smollm2);
    CU_add_test(s, "tiny GPT-OSS: head and lookups read their copies", test_who_reads_gptoss);
    CU_add_test(s, "the cap skips what does not fit", test_cap);
    CU_add_test(s, "one real node: no copies", test_one_node);
    CU_add_test(s, "pool threads' CPUs and nodes", test_thread_nodes);
    CU_add_test(s, "environment and bad values", test_env);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
