/* test_shard.c — shard plans (ie_shard_plan) and sharded workers
 * (ie_worker_step_shard) against the unsharded worker.
 *
 * Plans: for SmolLM2-like and GPT-OSS-like hyper-parameters, the ranges of
 * all ranks tile layers / KV heads / MLP columns / experts / vocabulary
 * without gap or overlap, on the documented boundaries; impossible plans
 * are IE_ERR_INVAL.
 *
 * Workers, on the tiny fixtures (tiny_llama_*: 2 layers, 4/2 heads of 16,
 * ff 128, vocab 512; tiny_gptoss.gguf: 3 layers, 4/2 heads of 16, 8 experts
 * top-2, vocab 512), two sequence slots, a prefill step then decode steps:
 *   PIPELINE (2 stages; 3 on the 3-layer gpt-oss): hidden_out -> hidden_in
 *     chaining gives logits bit-identical (memcmp) to the unsharded worker.
 *   TENSOR (2 ranks, one thread each, summed by this file's own all-reduce
 *     through a shared buffer and a barrier): concatenated vocab slices
 *     within TOL_F32 * max|logit| (f32 weights) / TOL_Q * max|logit|
 *     (quantized / int8w) of the unsharded logits — the sums only change
 *     order — and the same argmax on every row. 3 ranks are refused (2 KV
 *     heads).
 *   A reduce error aborts the step (its status returned, positions not
 *     advanced) and the same step retried gives the unsharded logits.
 * head_dim is 16 in every fixture: the attention output's column cuts
 * (2 heads * 16 = 32 per rank) stay on 32-element blocks, so q8_0 and
 * int8w (group 32) can be cut too. */
#include "ie_worker.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_F32 1e-4
#define TOL_Q 1e-3
#define MAXR 4

/* ------------------------------------------------------------- plans */

static ie_hparams_t smollm2(void)
{
    ie_hparams_t hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = 30;
    hp.n_embd = 576;
    hp.n_head = 9;
    hp.n_head_kv = 3;
    hp.head_dim = 64;
    hp.n_ff = 1536;
    hp.n_vocab = 49152;
    return hp;
}

static ie_hparams_t gptoss(void)
{
    ie_hparams_t hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = 36;
    hp.n_embd = 2880;
    hp.n_head = 64;
    hp.n_head_kv = 8;
    hp.head_dim = 64;
    hp.n_ff = 2880;
    hp.n_expert = 128;
    hp.n_expert_used = 4;
    hp.n_vocab = 201088;
    return hp;
}

/* ranges [b[r], e[r]) tile [0, n) in rank order, each non-empty unless
 * allow_empty, each start a multiple of `align` */
static int tiles(const int64_t *b, const int64_t *e, int R, int64_t n, int64_t align)
{
    int64_t at = 0;
    for (int r = 0; r < R; r++) {
        if (b[r] != at || e[r] <= b[r] || b[r] % align != 0) return 0;
        at = e[r];
    }
    return at == n;
}

static void check_plans(const ie_hparams_t *hp, int max_tensor)
{
    ie_shard_range_t p[64];
    int64_t b[64], e[64];
    /* pipeline: every stage count up to n_layer */
    for (int R = 1; R <= hp->n_layer && R <= 64; R++) {
        for (int r = 0; r < R; r++) {
            ie_shard_t s = {IE_SHARD_PIPELINE, r, R};
            CU_ASSERT_EQUAL_FATAL(ie_shard_plan(hp, &s, &p[r]), IE_OK);
            b[r] = p[r].layer_begin;
            e[r] = p[r].layer_end;
            CU_ASSERT_EQUAL(p[r].has_embed, r == 0);
            CU_ASSERT_EQUAL(p[r].has_head, r == R - 1);
            CU_ASSERT(p[r].kv_head_begin == 0 && p[r].kv_head_end == hp->n_head_kv);
            CU_ASSERT(p[r].ff_begin == 0 && p[r].ff_end == hp->n_ff);
            CU_ASSERT(p[r].expert_begin == 0 && p[r].expert_end == hp->n_expert);
            if (r == R - 1) CU_ASSERT(p[r].vocab_begin == 0 && p[r].vocab_end == hp->n_vocab);
            /* as even as possible, the first stages take the extra layer */
            const int64_t len = e[r] - b[r], base = hp->n_layer / R;
            CU_ASSERT_EQUAL(len, base + (r < hp->n_layer % R));
        }
        CU_ASSERT(tiles(b, e, R, hp->n_layer, 1));
    }
    /* tensor: every rank count the shapes allow */
    for (int R = 1; R <= max_tensor; R++) {
        int64_t kb[64], ke[64], hb[64], he[64], fb[64], fe[64], xb[64], xe[64], vb[64], ve[64];
        for (int r = 0; r < R; r++) {
            ie_shard_t s = {IE_SHARD_TENSOR, r, R};
            CU_ASSERT_EQUAL_FATAL(ie_shard_plan(hp, &s, &p[r]), IE_OK);
            CU_ASSERT(p[r].layer_begin == 0 && p[r].layer_end == hp->n_layer);
            CU_ASSERT(p[r].has_embed == 1 && p[r].has_head == 1);
            kb[r] = p[r].kv_head_begin, ke[r] = p[r].kv_head_end;
            hb[r] = p[r].head_begin, he[r] = p[r].head_end;
            fb[r] = p[r].ff_begin, fe[r] = p[r].ff_end;
            xb[r] = p[r].expert_begin, xe[r] = p[r].expert_end;
            vb[r] = p[r].vocab_begin, ve[r] = p[r].vocab_end;
            /* query heads dealt evenly; the KV heads are exactly those they read */
            CU_ASSERT(he[r] - hb[r] == hp->n_head / R || he[r] - hb[r] == hp->n_head / R + 1);
            const int group = hp->n_head / hp->n_head_kv;
            CU_ASSERT(kb[r] == hb[r] / group && ke[r] == (he[r] + group - 1) / group);
            /* a KV head is shared by two ranks only when its group is cut */
            if (r > 0) CU_ASSERT(kb[r] == ke[r - 1] || (kb[r] == ke[r - 1] - 1 && hb[r] % group != 0));
        }
        CU_ASSERT(tiles(hb, he, R, hp->n_head, 1));
        CU_ASSERT(kb[0] == 0 && ke[R - 1] == hp->n_head_kv);
        if (hp->n_head_kv % R == 0) CU_ASSERT(tiles(kb, ke, R, hp->n_head_kv, 1)); /* whole groups */
        CU_ASSERT(tiles(vb, ve, R, hp->n_vocab, 32));
        if (hp->n_expert > 0) {
            CU_ASSERT(tiles(xb, xe, R, hp->n_expert, 1));
            for (int r = 0; r < R; r++) CU_ASSERT(fb[r] == 0 && fe[r] == hp->n_ff);
        } else {
            CU_ASSERT(tiles(fb, fe, R, hp->n_ff, 32));
        }
    }
}

static void test_plan_coverage(void)
{
    ie_hparams_t a = smollm2(), g = gptoss();
    check_plans(&a, 3);
    check_plans(&g, 8);
    ie_shard_range_t p;
    /* NONE: everything; zeroed options (n_ranks 0) count as 1 */
    ie_shard_t none = {IE_SHARD_NONE, 0, 0};
    CU_ASSERT_EQUAL(ie_shard_plan(&g, &none, &p), IE_OK);
    CU_ASSERT(p.layer_end == 36 && p.has_embed && p.has_head && p.expert_end == 128 && p.vocab_end == 201088 &&
              p.kv_head_end == 8 && p.ff_end == 2880);
    /* SmolLM2, 2 tensor ranks: 5+4 query heads (KV heads 0-1 and 1-2, the
     * middle group cut), ff 768+768, vocab 24576 each */
    ie_shard_t t = {IE_SHARD_TENSOR, 1, 2};
    CU_ASSERT_EQUAL(ie_shard_plan(&a, &t, &p), IE_OK);
    CU_ASSERT(p.head_begin == 5 && p.head_end == 9 && p.kv_head_begin == 1 && p.kv_head_end == 3 &&
              p.ff_begin == 768 && p.ff_end == 1536 && p.vocab_begin == 24576 && p.vocab_end == 49152);
    t.rank = 0;
    CU_ASSERT_EQUAL(ie_shard_plan(&a, &t, &p), IE_OK);
    CU_ASSERT(p.head_begin == 0 && p.head_end == 5 && p.kv_head_begin == 0 && p.kv_head_end == 2);
    /* 3 ranks: whole groups, one KV head each */
    ie_shard_t t3 = {IE_SHARD_TENSOR, 2, 3};
    CU_ASSERT_EQUAL(ie_shard_plan(&a, &t3, &p), IE_OK);
    CU_ASSERT(p.head_begin == 6 && p.head_end == 9 && p.kv_head_begin == 2 && p.kv_head_end == 3);
    /* 30 layers in 4 stages: 8 8 7 7 */
    ie_shard_t pp = {IE_SHARD_PIPELINE, 2, 4};
    CU_ASSERT_EQUAL(ie_shard_plan(&a, &pp, &p), IE_OK);
    CU_ASSERT(p.layer_begin == 16 && p.layer_end == 23 && !p.has_embed && !p.has_head);
}

/* Column units of the stored types (k-quants: 256): the MLP is split on
 * them, and a rank count whose heads cut attn_output off its blocks is
 * refused naming the counts that work. */
static void test_plan_units(void)
{
    ie_hparams_t a = smollm2();
    ie_shard_range_t p;
    int64_t b[MAXR], e[MAXR];
    /* SmolLM2 with a q6_K ffn_down (1536 = 6 x 256): 2 and 3 ranks cut it on 256 */
    const ie_shard_units_t ff256 = {.o_unit = 32, .ff_unit = 256};
    for (int R = 2; R <= 3; R++) {
        for (int r = 0; r < R; r++) {
            ie_shard_t t = {IE_SHARD_TENSOR, r, R};
            CU_ASSERT_EQUAL_FATAL(ie_shard_plan_units(&a, &ff256, &t, &p), IE_OK);
            b[r] = p.ff_begin;
            e[r] = p.ff_end;
        }
        CU_ASSERT(tiles(b, e, R, 1536, 256));
    }
    /* a Llama-7B shape with q4_K attn_output (32 heads of 128, 8 KV heads,
     * ff 11008 = 43 x 256): uneven head splits cut a super-block */
    ie_hparams_t l7 = a;
    l7.n_head = 32;
    l7.n_head_kv = 8;
    l7.head_dim = 128;
    l7.n_embd = 4096;
    l7.n_ff = 11008;
    l7.n_vocab = 32000;
    ie_shard_units_t k256 = {.o_unit = 256, .ff_unit = 256};
    snprintf(k256.o_what, sizeof k256.o_what, "blk.0.attn_output.weight (q4_K, blocks of 256)");
    const int ok[9] = {0, 1, 1, 0, 1, 0, 0, 0, 1};
    for (int R = 1; R <= 8; R++) {
        ie_shard_t t = {IE_SHARD_TENSOR, R - 1, R};
        ie_status_t st = ie_shard_plan_units(&l7, &k256, &t, &p);
        CU_ASSERT_EQUAL(st, ok[R] ? IE_OK : IE_ERR_INVAL);
        if (st == IE_OK) CU_ASSERT(p.ff_begin % 256 == 0 && p.ff_end == 11008);
    }
    ie_shard_t t3 = {IE_SHARD_TENSOR, 0, 3};
    CU_ASSERT_EQUAL(ie_shard_plan_units(&l7, &k256, &t3, &p), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "blk.0.attn_output.weight (q4_K, blocks of 256) at 1408"));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "tensor:N for N in {1, 2, 4, 8}"));
    /* without units (ie_shard_plan) the same plan is left to the binding */
    CU_ASSERT_EQUAL(ie_shard_plan(&l7, &t3, &p), IE_OK);
    /* an MLP of one super-block cannot feed 2 ranks */
    ie_hparams_t small = l7;
    small.n_ff = 256;
    ie_shard_t t2 = {IE_SHARD_TENSOR, 1, 2};
    CU_ASSERT_EQUAL(ie_shard_plan_units(&small, &k256, &t2, &p), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "the MLP (256) has only 1 units of 256 columns"));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "N in {1}"));
    /* pipeline plans never cut columns */
    ie_shard_t pp = {IE_SHARD_PIPELINE, 1, 2};
    CU_ASSERT_EQUAL(ie_shard_plan_units(&l7, &k256, &pp, &p), IE_OK);
}

static void test_plan_errors(void)
{
    ie_hparams_t a = smollm2(), g = gptoss();
    ie_shard_range_t p;
    memset(&p, 0x5a, sizeof p);
    ie_shard_range_t keep = p;
    const struct {
        const ie_hparams_t *hp;
        ie_shard_t s;
        const char *says;
    } bad[] = {
        {&a, {IE_SHARD_PIPELINE, 0, 31}, "31 stages but only 30 layers"},
        {&a, {IE_SHARD_TENSOR, 0, 4}, "4 ranks but only 3 KV heads"},
        {&g, {IE_SHARD_TENSOR, 0, 9}, "9 ranks but only 8 KV heads"},
        {&a, {IE_SHARD_TENSOR, 0, 0}, "rank 0 of 0"},
        {&a, {IE_SHARD_PIPELINE, 2, 2}, "rank 2 of 2"},
        {&a, {IE_SHARD_PIPELINE, -1, 2}, "rank -1 of 2"},
        {&a, {IE_SHARD_PIPELINE, 0, 65}, "ranks <= 64"},
        {&a, {IE_SHARD_NONE, 0, 2}, "none plan: 2 ranks"},
        {&a, {(ie_shard_kind_t)7, 0, 1}, "unknown kind"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(ie_shard_plan(bad[i].hp, &bad[i].s, &p), IE_ERR_INVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), bad[i].says));
        if (!strstr(ie_error_last(), bad[i].says)) printf("\n  got '%s'", ie_error_last());
    }
    CU_ASSERT_EQUAL(memcmp(&p, &keep, sizeof p), 0); /* *out untouched on failure */
    /* MLP and experts narrower than the ranks */
    ie_hparams_t nf = a;
    nf.n_ff = 64;
    nf.n_head_kv = 3;
    ie_shard_t t3 = {IE_SHARD_TENSOR, 0, 3};
    CU_ASSERT_EQUAL(ie_shard_plan(&nf, &t3, &p), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "MLP"));
    ie_hparams_t fe = g;
    fe.n_expert = 4;
    ie_shard_t t5 = {IE_SHARD_TENSOR, 0, 5};
    CU_ASSERT_EQUAL(ie_shard_plan(&fe, &t5, &p), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "only 4 experts"));
    /* names */
    ie_shard_kind_t k;
    CU_ASSERT_EQUAL(ie_shard_kind_parse("tensor", &k), IE_OK);
    CU_ASSERT_EQUAL(k, IE_SHARD_TENSOR);
    CU_ASSERT_EQUAL(ie_shard_kind_parse("pipeline", &k), IE_OK);
    CU_ASSERT_EQUAL(k, IE_SHARD_PIPELINE);
    CU_ASSERT_EQUAL(ie_shard_kind_parse("none", &k), IE_OK);
    CU_ASSERT_EQUAL(k, IE_SHARD_NONE);
    CU_ASSERT_EQUAL(ie_shard_kind_parse("data", &k), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_shard_kind_parse(NULL, &k), IE_ERR_INVAL);
    CU_ASSERT_STRING_EQUAL(ie_shard_kind_name(IE_SHARD_PIPELINE), "pipeline");
}

/* ----------------------------------------------------------- workers */

/* The test's tiny all-reduce: every rank publishes its buffer, waits, sums
 * all of them in rank order into its own scratch, waits again (everyone
 * has read), then writes the sum back. fail_index >= 0: every rank fails
 * that reduction (all together, so nobody is left at the barrier). */
typedef struct allreduce {
    int R;
    pthread_barrier_t bar;
    float *buf[MAXR];
    float *sum[MAXR];
    int fail_index;
    int calls;
} allreduce_t;

typedef struct rank_ctx {
    allreduce_t *ar;
    int rank;
} rank_ctx_t;

static ie_status_t test_reduce(void *ctx, int index, float *buf, size_t n)
{
    rank_ctx_t *rc = ctx;
    allreduce_t *ar = rc->ar;
    if (rc->rank == 0) __atomic_add_fetch(&ar->calls, 1, __ATOMIC_RELAXED);
    if (index == ar->fail_index) return ie_error_set(IE_ERR_IO, "test: reduce %d failed", index);
    ar->buf[rc->rank] = buf;
    pthread_barrier_wait(&ar->bar);
    float *s = ar->sum[rc->rank];
    for (size_t i = 0; i < n; i++) {
        float v = ar->buf[0][i];
        for (int r = 1; r < ar->R; r++) v += ar->buf[r][i];
        s[i] = v;
    }
    pthread_barrier_wait(&ar->bar);
    memcpy(buf, s, n * sizeof(float));
    return IE_OK;
}

#define N_SEQ 2
#define MAX_B 16

static ie_worker_opts_t base_opts(ie_precision_t prec)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_seq = N_SEQ;
    o.max_batch = MAX_B;
    o.n_ctx = 32;
    o.precision = prec;
    o.n_threads = 2;
    o.pin_threads = 0;
    return o;
}

/* The steps every comparison runs: a prefill of slot 0 (6 tokens) and slot
 * 1 (4 tokens) in one step, then 3 decode steps of both slots. */
#define N_STEPS 4
typedef struct steps {
    ie_batch_t b[N_STEPS];
    int32_t tok[N_STEPS][MAX_B], pos[N_STEPS][MAX_B], seq[N_STEPS][MAX_B];
    uint8_t want[N_STEPS][MAX_B];
    int rows; /* logits rows over all steps */
} steps_t;

static void make_steps(steps_t *s)
{
    memset(s, 0, sizeof *s);
    static const int32_t p0[6] = {5, 17, 300, 42, 7, 511}, p1[4] = {100, 200, 300, 9};
    int n = 0;
    for (int i = 0; i < 6; i++, n++) {
        s->tok[0][n] = p0[i], s->pos[0][n] = i, s->seq[0][n] = 0, s->want[0][n] = 1;
    }
    for (int i = 0; i < 4; i++, n++) {
        s->tok[0][n] = p1[i], s->pos[0][n] = i, s->seq[0][n] = 1, s->want[0][n] = (uint8_t)(i == 3);
    }
    s->b[0] = (ie_batch_t){n, s->tok[0], s->pos[0], s->seq[0], s->want[0], NULL, NULL};
    s->rows = 7;
    for (int t = 1; t < N_STEPS; t++) {
        s->tok[t][0] = 33 * t + 1, s->pos[t][0] = 5 + t, s->seq[t][0] = 0, s->want[t][0] = 1;
        s->tok[t][1] = 41 * t + 3, s->pos[t][1] = 3 + t, s->seq[t][1] = 1, s->want[t][1] = 1;
        s->b[t] = (ie_batch_t){2, s->tok[t], s->pos[t], s->seq[t], s->want[t], NULL, NULL};
        s->rows += 2;
    }
}

static int step_rows(const ie_batch_t *b)
{
    int r = 0;
    for (int i = 0; i < b->n; i++) r += b->logits[i] != 0;
    return r;
}

/* Unsharded logits of all steps: rows x n_vocab. */
static float *reference(const ie_model_src_t *src, ie_precision_t prec, const steps_t *s)
{
    ie_worker_opts_t o = base_opts(prec);
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &w), IE_OK);
    const int nv = ie_worker_hparams(w)->n_vocab;
    float *out = malloc((size_t)s->rows * nv * sizeof(float)), *at = out;
    for (int t = 0; t < N_STEPS; t++) {
        CU_ASSERT_EQUAL_FATAL(ie_worker_step(w, &s->b[t], at), IE_OK);
        at += (size_t)step_rows(&s->b[t]) * nv;
    }
    ie_worker_destroy(&w);
    return out;
}

static ie_model_src_t *open_src(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", IE_TEST_DATA, name);
    ie_model_src_t *src = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(path, &src), IE_OK);
    return src;
}

static void pipeline_case(const char *model, ie_precision_t prec, int R)
{
    ie_model_src_t *src = open_src(model);
    steps_t s;
    make_steps(&s);
    float *ref = reference(src, prec, &s);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    const int nv = hp->n_vocab, d = hp->n_embd;
    ie_worker_t *w[MAXR] = {0};
    uint64_t bytes = 0, whole;
    for (int r = 0; r < R; r++) {
        ie_worker_opts_t o = base_opts(prec);
        o.shard = (ie_shard_t){IE_SHARD_PIPELINE, r, R};
        CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &w[r]), IE_OK);
        bytes += ie_worker_weight_bytes(w[r]);
    }
    {
        ie_worker_opts_t o = base_opts(prec);
        ie_worker_t *full = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &full), IE_OK);
        whole = ie_worker_weight_bytes(full);
        ie_worker_destroy(&full);
    }
    /* the stages hold the model between them (a tied head counted twice
     * at most: the first stage's lookups, the last stage's head) */
    CU_ASSERT(bytes >= whole && bytes <= whole + (uint64_t)nv * d * 4);
    float *got = malloc((size_t)s.rows * nv * sizeof(float)), *at = got;
    float *h[2] = {malloc((size_t)MAX_B * d * sizeof(float)), malloc((size_t)MAX_B * d * sizeof(float))};
    for (int t = 0; t < N_STEPS; t++) {
        for (int r = 0; r < R; r++) {
            const float *in = r == 0 ? NULL : h[(r - 1) & 1];
            float *out = r == R - 1 ? NULL : h[r & 1];
            CU_ASSERT_EQUAL_FATAL(ie_worker_step_shard(w[r], &s.b[t], in, out, r == R - 1 ? at : NULL), IE_OK);
        }
        at += (size_t)step_rows(&s.b[t]) * nv;
    }
    CU_ASSERT_EQUAL(memcmp(got, ref, (size_t)s.rows * nv * sizeof(float)), 0);
    /* a later stage without hidden_in is refused */
    CU_ASSERT_EQUAL(ie_worker_step_shard(w[1], &s.b[1], NULL, NULL, NULL), IE_ERR_INVAL);
    /* a later stage does not check token ids (it never reads them) */
    if (R > 1) {
        int32_t bad_tok[2] = {-5, 1 << 30};
        ie_batch_t bb = s.b[N_STEPS - 1];
        bb.tokens = bad_tok;
        ie_worker_seq_clear(w[R - 1], 0);
        ie_worker_seq_clear(w[R - 1], 1);
        int32_t p0[2] = {0, 0};
        bb.pos = p0;
        CU_ASSERT_EQUAL(ie_worker_step_shard(w[R - 1], &bb, h[0], NULL, NULL), IE_OK);
        CU_ASSERT_EQUAL(ie_worker_step_shard(w[0], &bb, NULL, h[0], NULL), IE_ERR_RANGE);
    }
    printf("\n  %s pipeline x%d: logits bit-identical (%d rows)", model, R, s.rows);
    for (int r = 0; r < R; r++) ie_worker_destroy(&w[r]);
    free(h[0]);
    free(h[1]);
    free(got);
    free(ref);
    ie_model_src_destroy(&src);
}

/* ---- tensor parallel: one thread per rank per step */

typedef struct rank_job {
    ie_worker_t *w;
    const ie_batch_t *b;
    float *logits;
    ie_status_t st;
    char err[256]; /* the rank thread's ie_error_last() on failure */
} rank_job_t;

static void *rank_main(void *p)
{
    rank_job_t *j = p;
    j->st = ie_worker_step_shard(j->w, j->b, NULL, NULL, j->logits);
    if (j->st != IE_OK) snprintf(j->err, sizeof j->err, "%s", ie_error_last());
    return NULL;
}

typedef struct tp_set {
    int R;
    ie_worker_t *w[MAXR];
    rank_ctx_t rc[MAXR];
    allreduce_t ar;
    float *part[MAXR];
    char err[256]; /* rank 0's error message of the last failed step */
} tp_set_t;

static void tp_open(tp_set_t *t, const ie_model_src_t *src, ie_precision_t prec, int R)
{
    memset(t, 0, sizeof *t);
    t->R = R;
    t->ar.R = R;
    t->ar.fail_index = -1;
    pthread_barrier_init(&t->ar.bar, NULL, (unsigned)R);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    for (int r = 0; r < R; r++) {
        ie_worker_opts_t o = base_opts(prec);
        o.shard = (ie_shard_t){IE_SHARD_TENSOR, r, R};
        t->rc[r] = (rank_ctx_t){&t->ar, r};
        o.reduce = test_reduce;
        o.reduce_ctx = &t->rc[r];
        CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &t->w[r]), IE_OK);
        t->ar.sum[r] = malloc((size_t)MAX_B * hp->n_embd * sizeof(float));
        t->part[r] = malloc((size_t)MAX_B * hp->n_vocab * sizeof(float));
    }
}

static void tp_close(tp_set_t *t)
{
    for (int r = 0; r < t->R; r++) {
        ie_worker_destroy(&t->w[r]);
        free(t->ar.sum[r]);
        free(t->part[r]);
    }
    pthread_barrier_destroy(&t->ar.bar);
}

/* One step on every rank; the vocab slices gathered into out (rows x nv).
 * Returns the first non-OK status of a rank (they agree). */
static ie_status_t tp_step(tp_set_t *t, const ie_batch_t *b, float *out, int nv)
{
    pthread_t th[MAXR];
    rank_job_t j[MAXR];
    for (int r = 0; r < t->R; r++) {
        j[r] = (rank_job_t){t->w[r], b, t->part[r], IE_OK, ""};
        pthread_create(&th[r], NULL, rank_main, &j[r]);
    }
    ie_status_t st = IE_OK;
    for (int r = 0; r < t->R; r++) {
        pthread_join(th[r], NULL);
        if (st == IE_OK) st = j[r].st;
        CU_ASSERT_EQUAL(j[r].st, j[0].st);
    }
    if (st != IE_OK) {
        snprintf(t->err, sizeof t->err, "%s", j[0].err);
        return st;
    }
    const int rows = step_rows(b);
    for (int r = 0; r < t->R; r++) {
        const ie_shard_range_t *sh = ie_worker_shard(t->w[r]);
        const int64_t nl = sh->vocab_end - sh->vocab_begin;
        for (int i = 0; i < rows; i++)
            memcpy(out + (size_t)i * nv + sh->vocab_begin, t->part[r] + (size_t)i * nl, (size_t)nl * sizeof(float));
    }
    return IE_OK;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void tensor_case(const char *model, ie_precision_t prec, int R, double tol)
{
    ie_model_src_t *src = open_src(model);
    steps_t s;
    make_steps(&s);
    float *ref = reference(src, prec, &s);
    const int nv = ie_model_src_hparams(src)->n_vocab;
    tp_set_t t;
    tp_open(&t, src, prec, R);
    float *got = malloc((size_t)s.rows * nv * sizeof(float)), *at = got;
    for (int k = 0; k < N_STEPS; k++) {
        CU_ASSERT_EQUAL_FATAL(tp_step(&t, &s.b[k], at, nv), IE_OK);
        at += (size_t)step_rows(&s.b[k]) * nv;
    }
    double md = 0, mx = 0;
    int same_argmax = 1;
    for (int i = 0; i < s.rows; i++) {
        const float *g = got + (size_t)i * nv, *f = ref + (size_t)i * nv;
        for (int j = 0; j < nv; j++) {
            md = fmax(md, fabs((double)g[j] - f[j]));
            mx = fmax(mx, fabs((double)f[j]));
        }
        same_argmax &= argmax(g, nv) == argmax(f, nv);
    }
    CU_ASSERT(md <= tol * mx);
    CU_ASSERT(same_argmax);
    /* the shards hold no more than the whole (plus the replicated
     * embedding / router / norms), each rank less than the whole */
    uint64_t whole;
    {
        ie_worker_opts_t o = base_opts(prec);
        ie_worker_t *full = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &full), IE_OK);
        whole = ie_worker_weight_bytes(full);
        ie_worker_destroy(&full);
    }
    for (int r = 0; r < R; r++) CU_ASSERT(ie_worker_weight_bytes(t.w[r]) < whole);
    printf("\n  %s %s tensor x%d: max |diff| %.3g (%.3g of max |logit| %.3g), argmax %s, %d reduces/rank", model,
           ie_precision_name(prec), R, md, md / mx, mx, same_argmax ? "same" : "DIFFERENT", t.ar.calls);
    tp_close(&t);
    free(got);
    free(ref);
    ie_model_src_destroy(&src);
}

/* ie_shard_units reads the stored types: the mixed k-quant fixture has
 * attn_output in q5_0 / iq4_nl (32) and ffn_down in q6_K (256); the q4_K
 * one 256 for both; a q8_0 model 32. */
static void test_units_from_model(void)
{
    ie_model_src_t *src = open_src("tiny_kq_mixed.gguf");
    ie_shard_units_t u;
    CU_ASSERT_EQUAL(ie_shard_units(src, &u), IE_OK);
    CU_ASSERT(u.o_unit == 32 && u.ff_unit == 256 && u.o_what[0] == 0);
    CU_ASSERT_STRING_EQUAL(u.ff_what, "blk.0.ffn_down.weight (q6_K, blocks of 256)");
    ie_model_src_destroy(&src);
    src = open_src("tiny_kq_q4_K.gguf");
    CU_ASSERT_EQUAL(ie_shard_units(src, &u), IE_OK);
    CU_ASSERT(u.o_unit == 256 && u.ff_unit == 256);
    ie_model_src_destroy(&src);
    src = open_src("tiny_llama_q8_0.gguf");
    CU_ASSERT_EQUAL(ie_shard_units(src, &u), IE_OK);
    CU_ASSERT(u.o_unit == 32 && u.ff_unit == 32);
    ie_model_src_destroy(&src);
}

static void test_pipeline_llama(void)
{
    pipeline_case("tiny_llama_f32.gguf", IE_PREC_NATIVE, 2);
    pipeline_case("tiny_llama_q8_0.gguf", IE_PREC_NATIVE, 2);
    pipeline_case("tiny_llama_tied", IE_PREC_NATIVE, 2);
    pipeline_case("tiny_llama_q4_0.gguf", IE_PREC_INT8W, 2);
    pipeline_case("tiny_kq_mixed.gguf", IE_PREC_NATIVE, 2); /* k-quant mixes, repacked */
    pipeline_case("tiny_kq_tied.gguf", IE_PREC_NATIVE, 2);  /* a q5_K tied head */
}

static void test_pipeline_gptoss(void)
{
    pipeline_case("tiny_gptoss.gguf", IE_PREC_NATIVE, 2);
    pipeline_case("tiny_gptoss.gguf", IE_PREC_NATIVE, 3);
}

static void test_tensor_llama(void)
{
    tensor_case("tiny_llama_f32.gguf", IE_PREC_NATIVE, 2, TOL_F32);
    tensor_case("tiny_llama_f32.gguf", IE_PREC_INT8W, 2, TOL_Q);
    tensor_case("tiny_llama_q8_0.gguf", IE_PREC_NATIVE, 2, TOL_Q);
    tensor_case("tiny_llama_tied", IE_PREC_NATIVE, 2, TOL_F32);
    /* k-quant slices (q6_K ffn_down at column 256, q5_0 / iq4_nl attn_output
     * at 128, q4_K / q6_K rows), dequantized: only the sums' order differs */
    tensor_case("tiny_kq_mixed.gguf", IE_PREC_F32, 2, TOL_F32);
    /* 3 ranks: only 2 KV heads */
    ie_model_src_t *src = open_src("tiny_llama_f32.gguf");
    ie_worker_opts_t o = base_opts(IE_PREC_NATIVE);
    o.shard = (ie_shard_t){IE_SHARD_TENSOR, 0, 3};
    o.reduce = test_reduce;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL(ie_worker_new(src, &o, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "3 ranks but only 2 KV heads"));
    CU_ASSERT_PTR_NULL(w);
    /* 2 ranks without a reduce callback */
    o.shard = (ie_shard_t){IE_SHARD_TENSOR, 0, 2};
    o.reduce = NULL;
    CU_ASSERT_EQUAL(ie_worker_new(src, &o, &w), IE_ERR_INVAL);
    /* int8w with one scale per row of 64: attn_output's 32-column cut no
     * longer holds whole groups */
    o.reduce = test_reduce;
    o.precision = IE_PREC_INT8W;
    o.quant_group = 64;
    CU_ASSERT_EQUAL(ie_worker_new(src, &o, &w), IE_ERR_INVAL);
    ie_model_src_destroy(&src);
}

static void test_tensor_gptoss(void)
{
    tensor_case("tiny_gptoss.gguf", IE_PREC_NATIVE, 2, TOL_F32);
    tensor_case("tiny_gptoss.gguf", IE_PREC_INT8W, 2, TOL_Q);
}

/* A failing reduce aborts the step with its status, positions do not
 * advance, and the same step then succeeds with the unsharded logits. */
static void test_reduce_error(void)
{
    ie_model_src_t *src = open_src("tiny_gptoss.gguf");
    steps_t s;
    make_steps(&s);
    float *ref = reference(src, IE_PREC_NATIVE, &s);
    const int nv = ie_model_src_hparams(src)->n_vocab;
    tp_set_t t;
    tp_open(&t, src, IE_PREC_NATIVE, 2);
    float *got = malloc((size_t)s.rows * nv * sizeof(float)), *at = got;
    for (int k = 0; k < N_STEPS; k++) {
        if (k == 0 || k == 2) {
            t.ar.fail_index = k == 0 ? 3 : 0; /* mid-prefill; first reduce of a decode step */
            CU_ASSERT_EQUAL(tp_step(&t, &s.b[k], at, nv), IE_ERR_IO);
            CU_ASSERT_PTR_NOT_NULL(strstr(t.err, "test: reduce"));
            t.ar.fail_index = -1;
            /* slot 0 holds what it held before: one past that skips ahead
             * (refused in validation, before any reduce) */
            int32_t tok = 1, pos = s.b[k].pos[0] + 1, sq = 0;
            uint8_t want = 1;
            ie_batch_t ahead = {1, &tok, &pos, &sq, &want, NULL, NULL};
            for (int r = 0; r < 2; r++)
                CU_ASSERT_EQUAL(ie_worker_step_shard(t.w[r], &ahead, NULL, NULL, t.part[r]), IE_ERR_RANGE);
        }
        CU_ASSERT_EQUAL_FATAL(tp_step(&t, &s.b[k], at, nv), IE_OK);
        at += (size_t)step_rows(&s.b[k]) * nv;
    }
    double md = 0, mx = 0;
    for (size_t i = 0; i < (size_t)s.rows * nv; i++) {
        md = fmax(md, fabs((double)got[i] - ref[i]));
        mx = fmax(mx, fabs((double)ref[i]));
    }
    CU_ASSERT(md <= TOL_F32 * mx);
    tp_close(&t);
    free(got);
    free(ref);
    ie_model_src_destroy(&src);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("shard", NULL, NULL);
    CU_add_test(s, "plans tile the model (smollm2, gpt-oss)", test_plan_coverage);
    CU_add_test(s, "impossible plans refused", test_plan_errors);
    CU_add_test(s, "plans on the stored blocks (k-quants: 256)", test_plan_units);
    CU_add_test(s, "column units from the stored types", test_units_from_model);
    CU_add_test(s, "pipeline llama == unsharded (bit-identical)", test_pipeline_llama);
    CU_add_test(s, "pipeline gpt-oss 2/3 stages == unsharded", test_pipeline_gptoss);
    CU_add_test(s, "tensor llama x2 (f32, int8w, q8_0, tied)", test_tensor_llama);
    CU_add_test(s, "tensor gpt-oss MoE x2", test_tensor_gptoss);
    CU_add_test(s, "reduce error aborts the step, retry succeeds", test_reduce_error);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
