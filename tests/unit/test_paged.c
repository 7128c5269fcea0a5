/* test_paged.c — the paged KV cache (ie_worker.h "paged KV") on the tiny
 * fixtures (tiny_llama: 2 layers, 4/2 heads of 16; tiny_gptoss.gguf: 3
 * layers, sliding window 8 on layers 0 and 2), n_ctx 64, two or three slots.
 *
 * The reference is a worker whose blocks are as long as the context (one
 * block per slot: exactly the old contiguous cache). Against it, memcmp of
 * every logits row:
 *   - the default pool (blocks of 16, every slot bound to its own);
 *   - small pools (blocks of 1, 3, 5, 16) bound by hand to scrambled
 *     physical blocks, prefill in chunks then decode; on GPT-OSS the sliding
 *     window starts anywhere inside a block;
 *   - two slots sharing prompt-prefix blocks: slot B bound to slot A's full
 *     blocks, ie_worker_seq_set_len, then its own blocks for the rest.
 * Errors: a step touching an unbound block (written or read) is IE_ERR_RANGE
 * naming slot and position and changes nothing (lengths, K/V); bad bind and
 * set-length arguments are refused and change nothing; bad pool options are
 * IE_ERR_INVAL.
 *
 * The same through the engine's cluster backend (in-process workers over
 * inproc://, ie_backend_kv_bind / ie_backend_seq_set_len / seq_clear queued
 * and sent with the next STEP): pipeline:2 gives the embedded worker's bits,
 * tensor:2 with a scrambled small pool gives the bits of tensor:2 with the
 * default pool; queued operations apply in call order on every rank (clears
 * included), survive a step that fails, and an over-long queue is refused.
 */
#include "ie_engine.h"
#include "ie_worker.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA IE_TEST_DATA "/tiny_llama"
#define GPTOSS IE_TEST_DATA "/tiny_gptoss.gguf"
#define N_CTX 64
#define MAXP 48

static ie_model_src_t *g_llama, *g_gptoss;

static int suite_init(void)
{
    if (ie_model_src_open(LLAMA, &g_llama) != IE_OK || ie_model_src_open(GPTOSS, &g_gptoss) != IE_OK) return -1;
    return 0;
}

static int suite_clean(void)
{
    ie_model_src_destroy(&g_llama);
    ie_model_src_destroy(&g_gptoss);
    return 0;
}

/* 1: sliding layers keep the whole context in the pool (no ring) */
static int g_swa_full;

static ie_worker_t *make_worker(const ie_model_src_t *src, int n_seq, int kv_block, int kv_blocks)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_seq = n_seq;
    o.max_batch = 32;
    o.n_ctx = N_CTX;
    o.n_threads = 2;
    o.pin_threads = 0;
    o.kv_block = kv_block;
    o.kv_blocks = kv_blocks;
    o.kv_swa_full = g_swa_full;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &w), IE_OK);
    return w;
}

/* A token stream: prompt ids[0..n) fed in chunks of `chunk` from position
 * `from` (the cache already holds 0..from), logits of every position into
 * out[pos * nv]. */
typedef ie_status_t (*step_fn)(void *ctx, const ie_batch_t *b, float *logits);

static ie_status_t worker_step(void *ctx, const ie_batch_t *b, float *logits)
{
    return ie_worker_step(ctx, b, logits);
}

static ie_status_t feed(step_fn fn, void *ctx, int seq, const int32_t *ids, int from, int n, int chunk, int nv,
                        float *out)
{
    int32_t pos[32], sq[32];
    uint8_t want[32];
    for (int i = from; i < n; i += chunk) {
        const int m = n - i < chunk ? n - i : chunk;
        for (int k = 0; k < m; k++) {
            pos[k] = i + k;
            sq[k] = seq;
            want[k] = 1;
        }
        ie_batch_t b = {m, ids + i, pos, sq, want, NULL, NULL};
        ie_status_t st = fn(ctx, &b, out + (size_t)i * nv);
        if (st != IE_OK) return st;
    }
    return IE_OK;
}

static void prompt(int32_t *ids, int n, int salt)
{
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + salt * 101 + 11) % 500 + 1);
}

/* The reference logits of ids[0..n) in one slot of a contiguous cache,
 * prefill chunks of `chunk`. */
static void reference(const ie_model_src_t *src, const int32_t *ids, int n, int chunk, float *out)
{
    ie_worker_t *w = make_worker(src, 1, N_CTX, 0);
    const int nv = ie_worker_hparams(w)->n_vocab;
    CU_ASSERT_EQUAL(feed(worker_step, w, 0, ids, 0, n, chunk, nv, out), IE_OK);
    ie_worker_destroy(&w);
}

static void test_default_pool(void)
{
    ie_worker_t *w = make_worker(g_llama, 3, 0, 0);
    CU_ASSERT_EQUAL(ie_worker_kv_block(w), 16);
    CU_ASSERT_EQUAL(ie_worker_kv_blocks(w), 3 * 4);
    ie_worker_destroy(&w);
    w = make_worker(g_llama, 2, 5, 0); /* 64 positions: 13 blocks of 5 */
    CU_ASSERT_EQUAL(ie_worker_kv_blocks(w), 2 * 13);
    ie_worker_destroy(&w);
    /* bad pool options */
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_ctx = N_CTX;
    o.pin_threads = 0;
    o.kv_block = -1;
    CU_ASSERT_EQUAL(ie_worker_new(g_llama, &o, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(w);
    o.kv_block = 0;
    o.kv_blocks = -3;
    CU_ASSERT_EQUAL(ie_worker_new(g_llama, &o, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(w);
}

/* Bind slot seq's logical blocks 0..nlb-1 to tab[], run the prompt,
 * compare with the reference row by row. */
static void check_layout(const ie_model_src_t *src, int kv_block, int kv_blocks, int scramble, int chunk)
{
    int32_t ids[MAXP];
    const int n = MAXP;
    prompt(ids, n, kv_block);
    ie_worker_t *w = make_worker(src, 2, kv_block, kv_blocks);
    const int nv = ie_worker_hparams(w)->n_vocab, nlb = (N_CTX + kv_block - 1) / kv_block;
    const int need = (n + kv_block - 1) / kv_block;
    float *ref = malloc((size_t)n * nv * sizeof(float)), *got = malloc((size_t)n * nv * sizeof(float));
    CU_ASSERT_FATAL(ref && got);
    reference(src, ids, n, chunk, ref);
    if (scramble) {
        /* slot 1's blocks, scattered over the pool back to front with a
         * stride (kv_blocks >= need) */
        int32_t tab[64];
        CU_ASSERT_FATAL(need <= 64 && kv_blocks >= need);
        for (int lb = 0; lb < need; lb++)
            tab[lb] = (int32_t)((kv_blocks - 1 - lb * 3) % kv_blocks + kv_blocks) % kv_blocks;
        /* make it a permutation of distinct blocks: resolve collisions */
        for (int lb = 0; lb < need; lb++)
            for (int k = 0; k < lb; k++)
                if (tab[k] == tab[lb]) {
                    tab[lb] = (tab[lb] + 1) % kv_blocks;
                    k = -1;
                }
        CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 1, 0, tab, need), IE_OK);
        CU_ASSERT(nlb >= need);
    }
    CU_ASSERT_EQUAL(feed(worker_step, w, 1, ids, 0, n, chunk, nv, got), IE_OK);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += memcmp(got + (size_t)i * nv, ref + (size_t)i * nv, (size_t)nv * 4) != 0;
    if (bad)
        fprintf(stderr, "\n  %s block %d pool %d chunk %d: %d rows differ\n", src == g_llama ? "llama" : "gptoss",
                kv_block, kv_blocks, chunk, bad);
    CU_ASSERT_EQUAL(bad, 0);
    free(ref);
    free(got);
    ie_worker_destroy(&w);
}

static void test_layouts(void)
{
    const ie_model_src_t *srcs[2] = {g_llama, g_gptoss};
    for (int s = 0; s < 2; s++) {
        check_layout(srcs[s], 16, 0, 0, 7); /* default pool: identity tables */
        check_layout(srcs[s], 5, 0, 0, 16);
        check_layout(srcs[s], 1, 0, 0, 3);
        /* small pools (fewer blocks than 2 slots x whole context): unbound
         * until bound, scrambled */
        check_layout(srcs[s], 5, 11, 1, 7);
        check_layout(srcs[s], 3, 20, 1, 16);
        check_layout(srcs[s], 16, 3, 1, 1);
        check_layout(srcs[s], 1, MAXP + 3, 1, 5);
    }
}

/* Slot 0 prefills the prompt's first 2 full blocks, slot 1 binds them and
 * says it holds them (set_len), then both continue on blocks of their own
 * with different tokens: each must give the bits of a contiguous run of its
 * own token stream with the same step shapes. */
static void check_shared(const ie_model_src_t *src, int kb)
{
    const int shared = 2 * kb, n = shared + 9;
    int32_t a[MAXP], b[MAXP];
    CU_ASSERT_FATAL(n <= MAXP);
    prompt(a, n, 1);
    memcpy(b, a, (size_t)shared * sizeof(int32_t));
    for (int i = shared; i < n; i++) b[i] = (a[i] + 7) % 500 + 1; /* a different continuation */
    const int need = (n + kb - 1) / kb;
    ie_worker_t *ref = make_worker(src, 1, N_CTX, 0);
    ie_worker_t *w = make_worker(src, 2, kb, 2 * need);
    const int nv = ie_worker_hparams(w)->n_vocab;
    float *ra = malloc((size_t)n * nv * 4), *rb = malloc((size_t)n * nv * 4);
    float *ga = malloc((size_t)n * nv * 4), *gb = malloc((size_t)n * nv * 4);
    CU_ASSERT_FATAL(ra && rb && ga && gb);
    /* reference: the shared prefix as one chunk, then the rest token by token */
    CU_ASSERT_EQUAL(feed(worker_step, ref, 0, a, 0, shared, shared, nv, ra), IE_OK);
    CU_ASSERT_EQUAL(feed(worker_step, ref, 0, a, shared, n, 1, nv, ra), IE_OK);
    ie_worker_seq_clear(ref, 0);
    CU_ASSERT_EQUAL(feed(worker_step, ref, 0, b, 0, shared, shared, nv, rb), IE_OK);
    CU_ASSERT_EQUAL(feed(worker_step, ref, 0, b, shared, n, 1, nv, rb), IE_OK);

    /* a pool of 2 * need: slot 0 on the odd blocks from the top, slot 1
     * shares its first two and takes even ones for the rest */
    int32_t t0[MAXP], t1[MAXP];
    for (int lb = 0; lb < need; lb++) {
        t0[lb] = (int32_t)(2 * need - 1 - 2 * lb);
        t1[lb] = lb < 2 ? t0[lb] : (int32_t)(2 * lb);
    }
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, t0, need), IE_OK);
    CU_ASSERT_EQUAL(feed(worker_step, w, 0, a, 0, shared, shared, nv, ga), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 1, 0, t1, 2), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 1, shared), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 1, 2, t1 + 2, need - 2), IE_OK);
    memcpy(gb, ga, (size_t)shared * nv * 4); /* the shared rows were computed once */
    /* interleave the two continuations one token a step */
    for (int i = shared; i < n; i++) {
        CU_ASSERT_EQUAL(feed(worker_step, w, 1, b, i, i + 1, 1, nv, gb), IE_OK);
        CU_ASSERT_EQUAL(feed(worker_step, w, 0, a, i, i + 1, 1, nv, ga), IE_OK);
    }
    CU_ASSERT(memcmp(ga, ra, (size_t)n * nv * 4) == 0);
    CU_ASSERT(memcmp(gb, rb, (size_t)n * nv * 4) == 0);
    free(ra);
    free(rb);
    free(ga);
    free(gb);
    ie_worker_destroy(&ref);
    ie_worker_destroy(&w);
}

static void test_shared_prefix(void)
{
    check_shared(g_llama, 5);
    check_shared(g_llama, 16);
    /* sharing a prefix's sliding rows needs them in the pool: the window
     * (8) reaches back into the shared blocks */
    g_swa_full = 1;
    check_shared(g_gptoss, 5);
    check_shared(g_gptoss, 3);
    g_swa_full = 0;
    /* with the sliding layers' ring a slot set to a prefix it did not
     * compute has no window rows: its next step is refused, named */
    ie_worker_t *w = make_worker(g_gptoss, 2, 3, 0);
    CU_ASSERT(ie_worker_kv_ring_len(w) > 0 && ie_worker_kv_ring_len(w) < N_CTX);
    int32_t a[MAXP];
    prompt(a, 12, 1);
    const int nv = ie_worker_hparams(w)->n_vocab;
    float *ga = malloc((size_t)12 * nv * 4);
    CU_ASSERT_FATAL(ga != NULL);
    CU_ASSERT_EQUAL(feed(worker_step, w, 0, a, 0, 9, 9, nv, ga), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 1, 9), IE_OK);
    CU_ASSERT_EQUAL(feed(worker_step, w, 1, a, 9, 10, 1, nv, ga), IE_ERR_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "ring does not hold position"));
    /* and a rewind inside the ring keeps it: slot 0 back to 5, on again */
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, 5), IE_OK);
    CU_ASSERT_EQUAL(feed(worker_step, w, 0, a, 5, 12, 7, nv, ga), IE_OK);
    free(ga);
    ie_worker_destroy(&w);
}

static int has(const char *s) { return strstr(ie_error_last(), s) != NULL; }

static void test_unbound_blocks(void)
{
    const int kb = 4;
    int32_t ids[MAXP];
    prompt(ids, MAXP, 3);
    ie_worker_t *w = make_worker(g_llama, 2, kb, 6);
    const int nv = ie_worker_hparams(w)->n_vocab;
    float *ref = malloc((size_t)MAXP * nv * 4), *got = malloc((size_t)MAXP * nv * 4);
    CU_ASSERT_FATAL(ref && got);
    reference(g_llama, ids, 12, 4, ref);

    /* nothing bound: the first write fails, naming slot and position */
    int32_t pos[2] = {0, 0}, seq[2] = {1, 0};
    uint8_t want[2] = {1, 1};
    ie_batch_t b = {1, ids, pos, seq, want, NULL, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, got), IE_ERR_RANGE);
    CU_ASSERT(has("slot 1 position 0") && has("not bound"));

    /* slot 0 bound to blocks 3, 5 (positions 0..7): 8 positions fine */
    const int32_t t0[2] = {3, 5};
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, t0, 2), IE_OK);
    CU_ASSERT_EQUAL(feed(worker_step, w, 0, ids, 0, 8, 4, nv, got), IE_OK);
    CU_ASSERT(memcmp(got, ref, (size_t)8 * nv * 4) == 0);
    /* position 8 (block 2) is unbound; with a good entry of another slot
     * before it, the whole step fails and nothing moves */
    pos[0] = 8;
    seq[0] = 0;
    b.tokens = ids + 8;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, got), IE_ERR_RANGE);
    CU_ASSERT(has("slot 0 position 8"));
    const int32_t t1[1] = {0};
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 1, 0, t1, 1), IE_OK);
    int32_t two_tok[2] = {7, ids[8]};
    int32_t two_pos[2] = {0, 8}, two_seq[2] = {1, 0};
    ie_batch_t b2 = {2, two_tok, two_pos, two_seq, want, NULL, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &b2, got), IE_ERR_RANGE); /* slot 1 fine, slot 0 not */
    /* slot 1 did not advance: position 1 skips ahead */
    int32_t p1 = 1, s1 = 1;
    ie_batch_t b3 = {1, ids, &p1, &s1, want, NULL, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &b3, got), IE_ERR_RANGE);
    CU_ASSERT(has("skips ahead"));
    /* a read of an unbound block: unbind slot 0's block 0 after writing */
    const int32_t t2[1] = {-1};
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, t2, 1), IE_OK);
    const int32_t t3[1] = {2};
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 2, t3, 1), IE_OK); /* block 2 (pos 8..11) bound */
    b.n = 1;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, got), IE_ERR_RANGE); /* writes block 2, reads block 0 */
    CU_ASSERT(has("slot 0 position 0") && has("read"));
    /* set_len over an unbound block is refused and keeps the length (8) */
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, 3), IE_ERR_RANGE);
    CU_ASSERT(has("slot 0 position 0"));
    /* rebind block 0: the cache is intact, positions 8..11 continue it */
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, t0, 1), IE_OK);
    CU_ASSERT_EQUAL(feed(worker_step, w, 0, ids, 8, 12, 4, nv, got), IE_OK);
    CU_ASSERT(memcmp(got + (size_t)8 * nv, ref + (size_t)8 * nv, (size_t)4 * nv * 4) == 0);
    free(ref);
    free(got);
    ie_worker_destroy(&w);
}

static void test_bad_arguments(void)
{
    ie_worker_t *w = make_worker(g_llama, 2, 5, 7); /* 13 logical blocks, pool of 7 */
    const int32_t ok[3] = {0, 1, 2}, bad_hi[2] = {1, 7}, bad_lo[2] = {1, -2};
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, -1, 0, ok, 1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 2, 0, ok, 1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, -1, ok, 1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 11, ok, 3), IE_ERR_RANGE); /* 11..13: past 13 blocks */
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, ok, -1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, NULL, 2), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, bad_hi, 2), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, bad_lo, 2), IE_ERR_RANGE);
    /* nothing changed: slot 0 is still unbound */
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, 1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, NULL, 0), IE_OK);   /* an empty bind is fine */
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 10, ok, 3), IE_OK);    /* the last three blocks */
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, 1), IE_ERR_RANGE); /* block 0 still unbound */
    CU_ASSERT_EQUAL(ie_worker_kv_bind(w, 0, 0, ok, 3), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, 15), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, 16), IE_ERR_RANGE); /* block 3 unbound */
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, -1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, N_CTX + 1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 2, 0), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_worker_seq_set_len(w, 0, 0), IE_OK);
    ie_worker_destroy(&w);
}

/* ------------------------------------------------------------ cluster */

static ie_engine_t *make_engine(ie_shard_kind_t plan, int kv_block, int kv_blocks)
{
    ie_engine_opts_t o;
    ie_engine_opts_default(&o);
    o.model_path = LLAMA;
    o.no_tokenizer = 1;
    o.n_threads = 2;
    o.pin_threads = 0;
    o.n_ctx = N_CTX;
    o.n_seq = 2;
    o.max_batch = 16;
    o.plan = plan;
    o.n_workers = plan == IE_SHARD_NONE ? 0 : 2;
    o.kv_block = kv_block;
    o.kv_blocks = kv_blocks;
    ie_engine_t *e = NULL;
    ie_status_t st = ie_engine_open(&o, &e);
    if (st != IE_OK) fprintf(stderr, "\nengine: %s\n", ie_error_last());
    CU_ASSERT_EQUAL_FATAL(st, IE_OK);
    return e;
}

static ie_status_t engine_step(void *ctx, const ie_batch_t *b, float *logits)
{
    return ie_backend_step(ie_engine_backend(ctx), b, logits);
}

/* The shared-prefix scenario of check_shared through an engine (any
 * backend) with a pool of 8 blocks of 5: logits of both streams. */
static void engine_shared(ie_engine_t *e, const int32_t *a, const int32_t *b, int n, float *ga, float *gb)
{
    const int kb = 5, shared = 10, nv = ie_engine_hparams(e)->n_vocab;
    const int32_t t0[4] = {6, 2, 5, 0}, t1[4] = {6, 2, 7, 1};
    CU_ASSERT_EQUAL(ie_backend_geom(ie_engine_backend(e))->kv_block, kb);
    CU_ASSERT_EQUAL(ie_backend_geom(ie_engine_backend(e))->kv_blocks, 8);
    CU_ASSERT_EQUAL(ie_backend_geom(ie_engine_backend(e))->n_seq, 2);
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 0, 0, t0, 4), IE_OK);
    CU_ASSERT_EQUAL(feed(engine_step, e, 0, a, 0, shared, shared, nv, ga), IE_OK);
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 1, 0, t1, 2), IE_OK);
    CU_ASSERT_EQUAL(ie_backend_seq_set_len(ie_engine_backend(e), 1, shared), IE_OK);
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 1, 2, t1 + 2, 2), IE_OK);
    memcpy(gb, ga, (size_t)shared * nv * 4);
    for (int i = shared; i < n; i++) {
        CU_ASSERT_EQUAL(feed(engine_step, e, 1, b, i, i + 1, 1, nv, gb), IE_OK);
        CU_ASSERT_EQUAL(feed(engine_step, e, 0, a, i, i + 1, 1, nv, ga), IE_OK);
    }
}

/* The same two streams, each alone in a contiguous cache (what a paged
 * run must reproduce) on backend e (default pool). */
static void engine_alone(ie_engine_t *e, const int32_t *ids, int n, float *out)
{
    const int shared = 10, nv = ie_engine_hparams(e)->n_vocab;
    ie_backend_seq_clear(ie_engine_backend(e), 0);
    CU_ASSERT_EQUAL(feed(engine_step, e, 0, ids, 0, shared, shared, nv, out), IE_OK);
    CU_ASSERT_EQUAL(feed(engine_step, e, 0, ids, shared, n, 1, nv, out), IE_OK);
}

static void check_cluster(ie_shard_kind_t plan)
{
    const int n = 19, na = 22; /* slot 0 later continues to 22 */
    int32_t a[MAXP], b[MAXP];
    prompt(a, na, 4);
    memcpy(b, a, 10 * sizeof(int32_t));
    for (int i = 10; i < n; i++) b[i] = (a[i] + 3) % 500 + 1;
    /* reference: pipeline is bit-identical to the embedded worker; tensor
     * sums in another order, so its reference is tensor with the default
     * (identity) pool */
    ie_engine_t *ref = make_engine(plan == IE_SHARD_PIPELINE ? IE_SHARD_NONE : plan, 0, 0);
    ie_engine_t *e = make_engine(plan, 5, 8);
    const int nv = ie_engine_hparams(e)->n_vocab;
    float *ra = malloc((size_t)na * nv * 4), *rb = malloc((size_t)n * nv * 4);
    float *ga = malloc((size_t)na * nv * 4), *gb = malloc((size_t)n * nv * 4);
    CU_ASSERT_FATAL(ra && rb && ga && gb);
    engine_alone(ref, a, na, ra);
    engine_alone(ref, b, n, rb);
    engine_shared(e, a, b, n, ga, gb);
    CU_ASSERT(memcmp(ga, ra, (size_t)n * nv * 4) == 0);
    CU_ASSERT(memcmp(gb, rb, (size_t)n * nv * 4) == 0);

    /* the embedded engine runs the same calls to the same bits */
    if (plan == IE_SHARD_PIPELINE) {
        ie_engine_t *emb = make_engine(IE_SHARD_NONE, 5, 8);
        engine_shared(emb, a, b, n, ga, gb);
        CU_ASSERT(memcmp(ga, ra, (size_t)n * nv * 4) == 0);
        CU_ASSERT(memcmp(gb, rb, (size_t)n * nv * 4) == 0);
        ie_engine_destroy(&emb);
    }

    /* call order on every rank: set_len then clear leaves slot 1 empty
     * (position 10 skips ahead), clear then set_len leaves 10 positions */
    int32_t p10 = 10, s1 = 1;
    uint8_t want = 1;
    ie_batch_t bt = {1, b + 10, &p10, &s1, &want, NULL, NULL};
    CU_ASSERT_EQUAL(ie_backend_seq_set_len(ie_engine_backend(e), 1, 10), IE_OK);
    ie_backend_seq_clear(ie_engine_backend(e), 1);
    CU_ASSERT_EQUAL(ie_backend_step(ie_engine_backend(e), &bt, gb), IE_ERR_RANGE);
    CU_ASSERT(has("skips ahead"));
    ie_backend_seq_clear(ie_engine_backend(e), 1);
    CU_ASSERT_EQUAL(ie_backend_seq_set_len(ie_engine_backend(e), 1, 10), IE_OK);
    CU_ASSERT_EQUAL(ie_backend_step(ie_engine_backend(e), &bt, gb + (size_t)10 * nv), IE_OK);
    CU_ASSERT(memcmp(gb + (size_t)10 * nv, rb + (size_t)10 * nv, (size_t)nv * 4) == 0);

    /* operations queued before a step that fails still apply on every
     * rank (pipeline: the failing stage passes them on to the next): bind
     * slot 0's block 4 (positions 20..24, unbound so far), fail the step on
     * a block of slot 1 unbound in the same queue, then continue slot 0
     * into block 4 — every stage must have it bound */
    const int32_t more[1] = {3}, unb[1] = {-1}, moved[2] = {3, 4};
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 0, 4, more, 1), IE_OK);
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 1, 2, unb, 1), IE_OK);
    CU_ASSERT_EQUAL(ie_backend_step(ie_engine_backend(e), &bt, gb), IE_ERR_RANGE);
    CU_ASSERT(has("slot 1 position 10") && has("not bound"));
    CU_ASSERT_EQUAL(feed(engine_step, e, 0, a, n, na, 1, nv, ga), IE_OK);
    CU_ASSERT(memcmp(ga, ra, (size_t)na * nv * 4) == 0);

    /* arguments are checked at call time */
    const int32_t bad[1] = {8};
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 0, 0, bad, 1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 2, 0, moved, 1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_backend_kv_bind(ie_engine_backend(e), 0, 12, moved, 2), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_backend_seq_set_len(ie_engine_backend(e), 0, N_CTX + 1), IE_ERR_RANGE);
    /* a queue of more block ids than one step carries is refused */
    int32_t *many = malloc(13 * sizeof(int32_t));
    CU_ASSERT_FATAL(many != NULL);
    for (int i = 0; i < 13; i++) many[i] = -1;
    ie_status_t st = IE_OK;
    int k = 0;
    for (; k < 70000 && st == IE_OK; k++) st = ie_backend_kv_bind(ie_engine_backend(e), 1, 0, many, 13);
    CU_ASSERT_EQUAL(st, IE_ERR_RANGE);
    CU_ASSERT(has("65536"));
    CU_ASSERT(k > 5000);
    free(many);
    /* the accepted ones go with the next step (slot 1 all unbound now) */
    CU_ASSERT_EQUAL(ie_backend_step(ie_engine_backend(e), &bt, gb), IE_ERR_RANGE);
    CU_ASSERT(has("slot 1"));

    free(ra);
    free(rb);
    free(ga);
    free(gb);
    ie_engine_destroy(&ref);
    ie_engine_destroy(&e);
}

static void test_cluster_pipeline(void) { check_cluster(IE_SHARD_PIPELINE); }
static void test_cluster_tensor(void) { check_cluster(IE_SHARD_TENSOR); }

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("paged", suite_init, suite_clean);
    CU_add_test(s, "default pool and bad pool options", test_default_pool);
    CU_add_test(s, "block layouts == contiguous (bits)", test_layouts);
    CU_add_test(s, "shared prefix blocks == separate runs (bits)", test_shared_prefix);
    CU_add_test(s, "unbound blocks refused, nothing changes", test_unbound_blocks);
    CU_add_test(s, "bad bind / set-length arguments", test_bad_arguments);
    CU_add_test(s, "cluster pipeline:2 paged == embedded", test_cluster_pipeline);
    CU_add_test(s, "cluster tensor:2 paged == default pool", test_cluster_tensor);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
