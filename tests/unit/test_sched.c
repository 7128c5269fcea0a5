/* test_sched.c — the request scheduler (ie_sched.h) on the real SmolLM2
 * model: requests joining a running batch, 16 streams at once, the prefix
 * cache, preemption in a small KV pool, the bounded queue, cancellation,
 * timeouts, priorities and shutdown — and in every case a greedy request's
 * ids equal what it generates alone on a one-slot engine. Last, the
 * scheduler over a fake backend of made-up logits: the step boundary
 * (ie_backend.h) is all it needs.
 */
#include "ie_grammar.h"
#include "ie_sched.h"
#include "ie_engine.h" /* the real backends, the reference runs */
#include "ie_model_src.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL IE_TEST_DATA "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define N_CTX 512
#define MAX_REQ 64

static ie_engine_t *g_solo; /* the reference: one slot */

static const char *k_prompts[] = {
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "The three primary colours are",
    "My favourite recipe for pancakes starts with",
    "In 1969, the first person to walk on the moon",
    "Water boils at",
    "A haiku about autumn:",
};
#define N_PROMPTS (int)(sizeof k_prompts / sizeof *k_prompts)

/* A long shared prefix (a system prompt) for the prefix cache. */
#define SYSTEM                                                                                             \
    "<|im_start|>system\nYou are a careful assistant. Answer briefly and truthfully. If you do not know, " \
    "say so. Never invent facts, names or numbers. Prefer plain words over jargon, short sentences over "  \
    "long ones, and examples over abstractions. Keep answers under fifty words.<|im_end|>\n"

typedef struct outcome {
    int kind; /* 0 none yet, else IE_SCHED_DONE / ERROR       */
    int n_events, n_tokens;
    int32_t ids[N_CTX];
    size_t n_gen, n_cached;
    char code[32];
    char text[4096];
    char streamed[4096];
    size_t streamed_len;
    int order; /* rank in which it ended                       */
    float embd[8];
    int n_embd;
    size_t n_prompt;
    ie_finish_t finish;
} outcome_t;

static int g_end_counter;

static void on_event(void *ctx, const ie_sched_event_t *ev)
{
    outcome_t *o = ctx;
    o->n_events++;
    if (ev->kind == IE_SCHED_TOKEN) {
        o->n_tokens++;
        if (o->streamed_len + ev->len < sizeof o->streamed) {
            memcpy(o->streamed + o->streamed_len, ev->text, ev->len);
            o->streamed_len += ev->len;
        }
        return;
    }
    CU_ASSERT_EQUAL(o->kind, 0); /* exactly one terminal event */
    o->kind = ev->kind;
    o->order = g_end_counter++;
    o->n_gen = ev->n_gen;
    o->n_cached = ev->n_cached;
    o->n_prompt = ev->n_prompt;
    o->finish = ev->finish;
    o->n_embd = ev->embd ? ev->n_embd : 0;
    if (ev->embd && ev->n_embd <= 8) memcpy(o->embd, ev->embd, (size_t)ev->n_embd * sizeof *o->embd);
    if (ev->n_gen <= N_CTX) memcpy(o->ids, ev->ids, ev->n_gen * sizeof *o->ids);
    snprintf(o->text, sizeof o->text, "%s", ev->all_text ? ev->all_text : "");
    snprintf(o->code, sizeof o->code, "%s", ev->code ? ev->code : "");
}

static ie_status_t make_engine(int n_seq, int max_batch, int kv_blocks, ie_engine_t **out)
{
    ie_engine_opts_t o;
    ie_engine_opts_default(&o);
    o.model_path = MODEL;
    o.n_threads = 2;
    o.pin_threads = 0;
    o.n_ctx = N_CTX;
    o.n_seq = n_seq;
    o.max_batch = max_batch;
    o.kv_blocks = kv_blocks;
    return ie_engine_open(&o, out);
}

static int suite_init(void)
{
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "\nmodel missing: %s (run scripts/setup.sh)\n", MODEL);
        return -1;
    }
    if (make_engine(1, 256, 0, &g_solo) != IE_OK) {
        fprintf(stderr, "\nengine creation failed: %s\n", ie_error_last());
        return -1;
    }
    return 0;
}

static int suite_clean(void)
{
    ie_engine_destroy(&g_solo);
    return 0;
}

static ie_gen_params_t greedy(int max_new)
{
    ie_gen_params_t p;
    ie_gen_params_default(&p);
    p.max_new = max_new;
    p.sampling.greedy = 1;
    return p;
}

static int32_t *encode(ie_engine_t *e, const char *text, size_t *n)
{
    int32_t *ids = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_encode(ie_engine_tokenizer(e), text, strlen(text),
                                              IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL, &ids, n),
                          IE_OK);
    return ids;
}

/* What `text` generates alone (greedy, max_new tokens). */
static void solo(const char *text, int max_new, ie_gen_result_t *r)
{
    ie_gen_params_t p = greedy(max_new);
    CU_ASSERT_EQUAL_FATAL(ie_engine_generate_batch(g_solo, &text, 1, &p, r, NULL), IE_OK);
}

static void assert_equals_solo(const outcome_t *o, const char *text, int max_new)
{
    ie_gen_result_t r;
    solo(text, max_new, &r);
    CU_ASSERT_EQUAL(o->kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(o->n_gen, r.n_gen);
    CU_ASSERT(o->n_gen == r.n_gen && memcmp(o->ids, r.ids, r.n_gen * sizeof *r.ids) == 0);
    CU_ASSERT_STRING_EQUAL(o->text, r.text);
    ie_gen_result_clear(&r);
}

static ie_status_t submit_text(ie_sched_t *s, ie_engine_t *e, const char *text, const ie_gen_params_t *p,
                               int priority, double timeout_ms, outcome_t *o, uint64_t *id)
{
    size_t n = 0;
    int32_t *ids = encode(e, text, &n);
    ie_sched_req_t r = {.ids = ids,
                        .n_ids = n,
                        .params = p,
                        .priority = priority,
                        .timeout_ms = timeout_ms,
                        .cb = on_event,
                        .cb_ctx = o};
    ie_status_t st = ie_sched_submit(s, &r, id);
    free(ids);
    return st;
}

static void run_until_idle(ie_sched_t *s)
{
    int busy = 1, guard = 0;
    while (busy && guard++ < 100000) CU_ASSERT_EQUAL_FATAL(ie_sched_step(s, &busy), IE_OK);
    CU_ASSERT(!busy);
}

static void assert_pool_clean(ie_sched_t *s)
{
    ie_sched_stats_t st;
    ie_sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.queued, 0);
    CU_ASSERT_EQUAL(st.running, 0);
    CU_ASSERT_EQUAL(st.kv_used, 0);
}

/* Requests join a running batch at any step and leave when done. */
static void test_join_leave(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[N_PROMPTS];
    memset(o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(make_engine(4, 32, 0, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e), .tok = ie_engine_tokenizer(e)};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    ie_gen_params_t p[N_PROMPTS];
    int submitted = 0, steps = 0, busy = 1;
    /* one new request every 3 steps, with different lengths */
    while (submitted < N_PROMPTS || busy) {
        if (submitted < N_PROMPTS && steps % 3 == 0) {
            p[submitted] = greedy(8 + 3 * submitted);
            CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[submitted], &p[submitted], 0, 0, &o[submitted], NULL),
                            IE_OK);
            submitted++;
        }
        CU_ASSERT_EQUAL_FATAL(ie_sched_step(s, &busy), IE_OK);
        steps++;
        CU_ASSERT_FATAL(steps < 5000);
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_equals_solo(&o[i], k_prompts[i], 8 + 3 * i);
        CU_ASSERT_EQUAL(o[i].n_tokens, (int)o[i].n_gen);
        CU_ASSERT_EQUAL((size_t)o[i].streamed_len, strlen(o[i].text));
        CU_ASSERT(memcmp(o[i].streamed, o[i].text, o[i].streamed_len) == 0);
    }
    assert_pool_clean(s);
    ie_sched_destroy(&s);
    ie_engine_destroy(&e);
}

/* 16 streams at once (prompts repeated): each equals its solo run. */
static void test_sixteen_streams(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[16];
    memset(o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(make_engine(16, 64, 0, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e),
                          .tok = ie_engine_tokenizer(e),
                          .queue_max = 16,
                          .prefill_chunk = 24};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    ie_gen_params_t p = greedy(16);
    for (int i = 0; i < 16; i++)
        CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[i % N_PROMPTS], &p, 0, 0, &o[i], NULL), IE_OK);
    run_until_idle(s);
    for (int i = 0; i < 16; i++) assert_equals_solo(&o[i], k_prompts[i % N_PROMPTS], 16);
    assert_pool_clean(s);
    ie_sched_destroy(&s);
    ie_engine_destroy(&e);
}

/* A shared system prompt is computed once; later requests take its blocks
 * from the cache and still generate what they generate alone. */
static void test_prefix_cache(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[4];
    memset(o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(make_engine(2, 64, 0, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e), .tok = ie_engine_tokenizer(e)};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    static char text[4][1024];
    const char *q[4] = {"What is 2+2?", "Name a colour.", "What is 2+2?", "Say hi."};
    for (int i = 0; i < 4; i++)
        snprintf(text[i], sizeof text[i], SYSTEM "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", q[i]);
    size_t n_sys = 0;
    free(encode(e, SYSTEM, &n_sys));
    CU_ASSERT_FATAL(n_sys >= 48);
    ie_gen_params_t p = greedy(12);
    /* the first alone: nothing cached */
    CU_ASSERT_EQUAL(submit_text(s, e, text[0], &p, 0, 0, &o[0], NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(o[0].n_cached, 0);
    /* then three together: each takes the system prompt's full blocks */
    for (int i = 1; i < 4; i++) CU_ASSERT_EQUAL(submit_text(s, e, text[i], &p, 0, 0, &o[i], NULL), IE_OK);
    run_until_idle(s);
    int bt = ie_backend_geom(ie_engine_backend(e))->kv_block;
    for (int i = 1; i < 4; i++) {
        CU_ASSERT(o[i].n_cached >= n_sys / (size_t)bt * (size_t)bt);
        CU_ASSERT(o[i].n_cached % (size_t)bt == 0);
    }
    /* the same question again: its whole prompt but the last block's
     * remainder comes from the cache */
    size_t n_q = 0;
    free(encode(e, text[2], &n_q));
    CU_ASSERT(o[2].n_cached >= (n_q - 1) / (size_t)bt * (size_t)bt);
    for (int i = 0; i < 4; i++) assert_equals_solo(&o[i], text[i], 12);
    ie_sched_stats_t st;
    ie_sched_stats(s, &st);
    CU_ASSERT(st.prefix_hit_tokens >= 3 * (n_sys / (size_t)bt * (size_t)bt));
    CU_ASSERT(st.prefix_miss_tokens > 0);
    assert_pool_clean(s);
    CU_ASSERT(st.kv_cached > 0); /* kept for reuse */
    ie_sched_destroy(&s);
    ie_engine_destroy(&e);
}

/* A pool too small for every stream's whole generation: streams are
 * preempted and recomputed, outputs unchanged, every block back at the end. */
static void test_preemption(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[6];
    memset(o, 0, sizeof o);
    /* 6 streams of ~10 prompt + 60 new tokens need ~5 blocks of 16 each (30);
     * 14 blocks hold fewer than three at their longest */
    CU_ASSERT_EQUAL_FATAL(make_engine(6, 64, 14, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e), .tok = ie_engine_tokenizer(e)};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    ie_gen_params_t p = greedy(60);
    for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[i], &p, 0, 0, &o[i], NULL), IE_OK);
    run_until_idle(s);
    ie_sched_stats_t st;
    ie_sched_stats(s, &st);
    CU_ASSERT(st.preemptions > 0);
    for (int i = 0; i < 6; i++) {
        assert_equals_solo(&o[i], k_prompts[i], 60);
        CU_ASSERT_EQUAL(o[i].n_tokens, (int)o[i].n_gen); /* each token streamed once */
    }
    assert_pool_clean(s);
    /* a request that cannot fit even alone fails instead of waiting forever */
    static char longp[8192];
    longp[0] = '\0';
    for (int i = 0; i < 60; i++) strcat(longp, "one two three four five ");
    outcome_t big = {0};
    CU_ASSERT_EQUAL(submit_text(s, e, longp, &p, 0, 0, &big, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(big.kind, IE_SCHED_ERROR);
    CU_ASSERT_STRING_EQUAL(big.code, "invalid_request"); /* it can never fit */
    assert_pool_clean(s);
    ie_sched_destroy(&s);
    ie_engine_destroy(&e);
}

/* The bounded queue, cancellation, timeouts, priorities, bad requests,
 * shutdown. */
static void test_queue_cancel_timeout_priority(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[8];
    memset(o, 0, sizeof o);
    g_end_counter = 0;
    CU_ASSERT_EQUAL_FATAL(make_engine(1, 64, 0, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e), .tok = ie_engine_tokenizer(e), .queue_max = 3};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    ie_gen_params_t p = greedy(6);
    uint64_t id[8] = {0};
    /* o[0] runs; o[1..3] fill the queue; o[4] is refused */
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[0], &p, 0, 0, &o[0], &id[0]), IE_OK);
    int busy;
    CU_ASSERT_EQUAL(ie_sched_step(s, &busy), IE_OK); /* o[0] admitted */
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[1], &p, 0, 0, &o[1], &id[1]), IE_OK);
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[2], &p, 5, 0, &o[2], &id[2]), IE_OK); /* high priority */
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[3], &p, 0, 0, &o[3], &id[3]), IE_OK);
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[4], &p, 0, 0, &o[4], &id[4]), IE_ERR_BUSY);
    CU_ASSERT_EQUAL(id[4], 0);
    /* cancel one queued (o[3]) */
    CU_ASSERT_EQUAL(ie_sched_cancel(s, id[3]), IE_OK);
    CU_ASSERT_EQUAL(ie_sched_cancel(s, id[3]), IE_ERR_RANGE); /* already cancelled */
    CU_ASSERT_EQUAL(ie_sched_cancel(s, 999999), IE_ERR_RANGE);
    run_until_idle(s);
    CU_ASSERT_EQUAL(o[4].n_events, 0);
    CU_ASSERT_EQUAL(o[3].kind, IE_SCHED_ERROR);
    CU_ASSERT_STRING_EQUAL(o[3].code, "cancelled");
    CU_ASSERT_EQUAL(o[3].n_tokens, 0);
    /* the high-priority request overtook o[1] */
    CU_ASSERT(o[0].order < o[2].order && o[2].order < o[1].order);
    assert_equals_solo(&o[0], k_prompts[0], 6);
    assert_equals_solo(&o[1], k_prompts[1], 6);
    assert_equals_solo(&o[2], k_prompts[2], 6);

    /* cancel a running request mid-stream */
    ie_gen_params_t longp = greedy(200);
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[5], &longp, 0, 0, &o[5], &id[5]), IE_OK);
    for (int k = 0; k < 5; k++) CU_ASSERT_EQUAL(ie_sched_step(s, &busy), IE_OK);
    CU_ASSERT(o[5].n_tokens >= 3);
    CU_ASSERT_EQUAL(ie_sched_cancel(s, id[5]), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(o[5].kind, IE_SCHED_ERROR);
    CU_ASSERT_STRING_EQUAL(o[5].code, "cancelled");
    assert_pool_clean(s);

    /* a timeout: 1 ms is over before the request can finish 200 tokens */
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[6], &longp, 0, 1, &o[6], &id[6]), IE_OK);
    usleep(2000);
    run_until_idle(s);
    CU_ASSERT_EQUAL(o[6].kind, IE_SCHED_ERROR);
    CU_ASSERT_STRING_EQUAL(o[6].code, "timeout");
    assert_pool_clean(s);

    /* bad requests are refused at submit, with no event */
    outcome_t bad = {0};
    int32_t big_id = 1 << 30;
    ie_sched_req_t r = {.ids = &big_id, .n_ids = 1, .params = &p, .cb = on_event, .cb_ctx = &bad};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_ERR_RANGE);
    r.n_ids = 0;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_ERR_INVAL);
    r.n_ids = 1;
    r.cb = NULL;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_ERR_INVAL);
    ie_gen_params_t neg = greedy(-1);
    int32_t one = 1;
    ie_sched_req_t r2 = {.ids = &one, .n_ids = 1, .params = &neg, .cb = on_event, .cb_ctx = &bad};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r2, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(bad.n_events, 0);

    /* shutdown ends what is left with "unavailable" */
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[7], &longp, 0, 0, &o[7], &id[7]), IE_OK);
    CU_ASSERT_EQUAL(ie_sched_step(s, &busy), IE_OK);
    ie_sched_destroy(&s);
    CU_ASSERT_EQUAL(o[7].kind, IE_SCHED_ERROR);
    CU_ASSERT_STRING_EQUAL(o[7].code, "unavailable");
    ie_engine_destroy(&e);
}

/* A burst between two steps fills the idle slots, then queue_max more. */
static void test_busy_counts_free_slots(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[5];
    memset(o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(make_engine(2, 64, 0, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e), .tok = ie_engine_tokenizer(e), .queue_max = 2};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    ie_gen_params_t p = greedy(3);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[i], &p, 0, 0, &o[i], NULL), IE_OK);
    CU_ASSERT_EQUAL(submit_text(s, e, k_prompts[4], &p, 0, 0, &o[4], NULL), IE_ERR_BUSY);
    /* the message names the queue's limit, not the queue's length (which
     * also holds the requests about to take the free slots) */
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "(2 requests waiting)"));
    run_until_idle(s);
    for (int i = 0; i < 4; i++) assert_equals_solo(&o[i], k_prompts[i], 3);
    CU_ASSERT_EQUAL(o[4].n_events, 0);
    assert_pool_clean(s);
    ie_sched_destroy(&s);
    ie_engine_destroy(&e);
}

/* The streamed pieces add up to the final text however generation ends:
 * cut by max_new inside a character (the tail becomes U+FFFD in both), and
 * with a stop string whose prefix was held back when the length ran out.
 * Greedy SmolLM2 answers this prompt with stars, 3 tokens each. */
static void test_stream_adds_up(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[2][7];
    memset(o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(make_engine(2, 64, 0, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e), .tok = ie_engine_tokenizer(e), .queue_max = 16};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    static const char *prompt = "Here are three emojis: \xf0\x9f\x8c\x9f";
    static const char *stops[] = {"\xf0\x9f\x8c\x9f!"}; /* a star then '!': never completes here */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 7; i++) {
            ie_gen_params_t p = greedy(i + 1);
            if (k) {
                p.stop = stops;
                p.n_stop = 1;
            }
            CU_ASSERT_EQUAL(submit_text(s, e, prompt, &p, 0, 0, &o[k][i], NULL), IE_OK);
        }
    run_until_idle(s);
    int cut = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 7; i++) {
            const outcome_t *q = &o[k][i];
            CU_ASSERT_EQUAL(q->kind, IE_SCHED_DONE);
            CU_ASSERT_EQUAL(q->streamed_len, strlen(q->text));
            CU_ASSERT(q->streamed_len == strlen(q->text) && memcmp(q->streamed, q->text, q->streamed_len) == 0);
            cut += strstr(q->text, "\xef\xbf\xbd") != NULL;
        }
    CU_ASSERT(cut >= 2); /* the test reached a cut inside a character */
    assert_pool_clean(s);
    ie_sched_destroy(&s);
    ie_engine_destroy(&e);
}

/* Submitters on other threads while this one steps (TSan runs this). */
typedef struct submitter {
    ie_sched_t *s;
    ie_engine_t *e;
    outcome_t *o;
    int n;
    int busy_refusals;
} submitter_t;

static void *submit_thread(void *arg)
{
    submitter_t *t = arg;
    ie_gen_params_t p = greedy(5);
    for (int i = 0; i < t->n; i++) {
        ie_status_t st;
        while ((st = submit_text(t->s, t->e, k_prompts[i % N_PROMPTS], &p, i % 3, 0, &t->o[i], NULL)) ==
               IE_ERR_BUSY) {
            t->busy_refusals++;
            usleep(1000);
        }
        CU_ASSERT_EQUAL(st, IE_OK);
    }
    return NULL;
}

static void test_threads(void)
{
    ie_engine_t *e = NULL;
    ie_sched_t *s = NULL;
    static outcome_t o[2][12];
    memset(o, 0, sizeof o);
    CU_ASSERT_EQUAL_FATAL(make_engine(4, 64, 0, &e), IE_OK);
    ie_sched_opts_t so = {.backend = ie_engine_backend(e), .tok = ie_engine_tokenizer(e), .queue_max = 4};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    submitter_t t[2] = {{s, e, o[0], 12, 0}, {s, e, o[1], 12, 0}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) CU_ASSERT_EQUAL_FATAL(pthread_create(&th[k], NULL, submit_thread, &t[k]), 0);
    int done = 0, guard = 0;
    while (done < 24 && guard++ < 200000) {
        int busy;
        CU_ASSERT_EQUAL_FATAL(ie_sched_step(s, &busy), IE_OK);
        if (!busy) ie_sched_wait(s, 5);
        ie_sched_stats_t st;
        ie_sched_stats(s, &st);
        done = (int)(st.completed + st.failed);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    CU_ASSERT_EQUAL(done, 24);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 12; i++) assert_equals_solo(&o[k][i], k_prompts[i % N_PROMPTS], 5);
    assert_pool_clean(s);
    ie_sched_destroy(&s);
    ie_engine_destroy(&e);
}

/* ------------------------------------------------------- a fake backend */

/* The scheduler against a backend that is not a model: a tiny
 * ie_backend_t of this file whose logits are made up (the next token is
 * fake_next(token, position)), and which checks the boundary's contract
 * as a worker would: every token's position is its slot's next one, and
 * lies in a bound KV block. No engine, worker or cluster is made: the
 * scheduler needs only ie_backend.h and a tokenizer (SmolLM2's, loaded
 * alone). */
#define FAKE_SEQ 2
#define FAKE_CTX 64
#define FAKE_KB 4
#define FAKE_NLB (FAKE_CTX / FAKE_KB)
#define FAKE_BLOCKS 20 /* fewer than FAKE_SEQ * FAKE_NLB: slots start unbound */

typedef struct fake {
    int32_t n_vocab;
    int embd_rows;                     /* IE_LOGITS_EMBD entries seen             */
    int len[FAKE_SEQ];                 /* positions held by each slot        */
    int32_t table[FAKE_SEQ][FAKE_NLB]; /* physical block of each logical one */
    int ready;                         /* 0: steps fail as a lost cluster's  */
    int steps, hints, bad, upkeeps, destroyed;
    int rows_full, rows_argmax; /* logits rows asked for, by kind      */
} fake_t;

static int32_t fake_next(int32_t tok, int32_t pos) { return 100 + (tok * 7 + pos) % 50; }

static ie_status_t fake_step(void *self, const ie_batch_t *b, float *logits_out)
{
    fake_t *f = self;
    if (!f->ready) return ie_error_set(IE_ERR_UNAVAILABLE, "fake: not ready");
    int want = 0;
    f->embd_rows = 0;
    for (int i = 0; i < b->n; i++) { /* check everything first, as a worker does */
        const int q = b->seq[i], pos = b->pos[i];
        if (q < 0 || q >= FAKE_SEQ || pos < 0 || pos >= FAKE_CTX || f->table[q][pos / FAKE_KB] < 0) {
            f->bad++;
            return ie_error_set(IE_ERR_RANGE, "fake: token %d (slot %d, position %d) refused", i, q, pos);
        }
    }
    for (int i = 0; i < b->n; i++) {
        const int q = b->seq[i];
        if (b->pos[i] != f->len[q]) f->bad++; /* not the slot's next position */
        f->len[q] = b->pos[i] + 1;
        if (!b->logits[i]) continue;
        if (b->logits[i] == IE_LOGITS_EMBD) { /* hidden state (token, position, 1) */
            float *e = b->embd + (size_t)f->embd_rows++ * 3;
            e[0] = (float)b->tokens[i], e[1] = (float)b->pos[i], e[2] = 1.0f;
            continue;
        }
        f->rows_full += b->logits[i] == IE_LOGITS_FULL;
        f->rows_argmax += b->logits[i] == IE_LOGITS_ARGMAX;
        float *row = logits_out + (size_t)want++ * (size_t)f->n_vocab;
        for (int32_t v = 0; v < f->n_vocab; v++) row[v] = 0.0f;
        row[fake_next(b->tokens[i], b->pos[i])] = 1.0f;
    }
    f->steps++;
    return IE_OK;
}

static void fake_seq_clear(void *self, int seq)
{
    fake_t *f = self;
    if (seq >= 0 && seq < FAKE_SEQ) f->len[seq] = 0;
}

static ie_status_t fake_seq_set_len(void *self, int seq, int n_pos)
{
    fake_t *f = self;
    if (seq < 0 || seq >= FAKE_SEQ || n_pos < 0 || n_pos > FAKE_CTX)
        return ie_error_set(IE_ERR_RANGE, "fake: bad length");
    for (int lb = 0; lb * FAKE_KB < n_pos; lb++)
        if (f->table[seq][lb] < 0) return ie_error_set(IE_ERR_RANGE, "fake: length over an unbound block");
    f->len[seq] = n_pos;
    return IE_OK;
}

static ie_status_t fake_kv_bind(void *self, int seq, int first, const int32_t *pb, int n)
{
    fake_t *f = self;
    if (seq < 0 || seq >= FAKE_SEQ || first < 0 || n < 0 || first + n > FAKE_NLB || (n && !pb))
        return ie_error_set(IE_ERR_RANGE, "fake: bad bind");
    for (int j = 0; j < n; j++)
        if (pb[j] < -1 || pb[j] >= FAKE_BLOCKS) return ie_error_set(IE_ERR_RANGE, "fake: bad block");
    for (int j = 0; j < n; j++) f->table[seq][first + j] = pb[j];
    return IE_OK;
}

static void fake_hint_next(void *self, int same)
{
    (void)same;
    ((fake_t *)self)->hints++;
}

static int fake_ready(void *self) { return ((fake_t *)self)->ready; }

static int fake_upkeep(void *self, int timeout_ms)
{
    (void)timeout_ms;
    fake_t *f = self;
    f->upkeeps++;
    return f->ready;
}

static void fake_destroy(void *self) { ((fake_t *)self)->destroyed++; }

static const ie_backend_ops_t k_fake_ops = {.name = "fake",
                                            .step = fake_step,
                                            .seq_clear = fake_seq_clear,
                                            .seq_set_len = fake_seq_set_len,
                                            .kv_bind = fake_kv_bind,
                                            .hint_next = fake_hint_next,
                                            .ready = fake_ready,
                                            .upkeep = fake_upkeep,
                                            .destroy = fake_destroy};

/* f reset (every block unbound, ready), SmolLM2's tokenizer in *tok (the
 * caller destroys it) and the fake's geometry in *g. */
static void fake_setup(fake_t *f, ie_tokenizer_t **tok, ie_backend_geom_t *g)
{
    memset(f, 0, sizeof *f);
    memset(f->table, 0xff, sizeof f->table);
    ie_model_src_t *src = NULL;
    *tok = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(MODEL, &src), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load(ie_model_src_tokenizer_path(src), tok), IE_OK);
    ie_model_src_destroy(&src);
    f->n_vocab = ie_tokenizer_n_vocab(*tok);
    f->ready = 1;
    *g = (ie_backend_geom_t){.n_seq = FAKE_SEQ,
                             .n_ctx = FAKE_CTX,
                             .max_batch = 8,
                             .kv_block = FAKE_KB,
                             .kv_blocks = FAKE_BLOCKS,
                             .n_vocab = f->n_vocab,
                             .upkeep_ms = 10};
}

/* fake_setup, then a backend over f and a scheduler with options so (its
 * backend and tokenizer filled in). The caller destroys all three. */
static ie_sched_t *fake_sched(fake_t *f, ie_tokenizer_t **tok, ie_backend_t **be, ie_sched_opts_t so)
{
    ie_backend_geom_t g;
    ie_sched_t *s = NULL;
    fake_setup(f, tok, &g);
    CU_ASSERT_EQUAL_FATAL(ie_backend_new(&k_fake_ops, f, &g, be), IE_OK);
    so.backend = *be;
    so.tok = *tok;
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    return s;
}

static void test_fake_backend(void)
{
    static fake_t f;
    ie_tokenizer_t *tok = NULL;
    ie_backend_geom_t g;
    fake_setup(&f, &tok, &g);
    ie_backend_t *be = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_backend_new(&k_fake_ops, &f, &g, &be), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_backend_name(be), "fake");
    CU_ASSERT_EQUAL(ie_backend_upkeep(be, 0), 1);
    CU_ASSERT_EQUAL(f.upkeeps, 1);
    ie_backend_stats_t bs; /* no stats entry: all zero, strings empty */
    ie_backend_stats(be, &bs);
    CU_ASSERT_STRING_EQUAL(bs.isa, "");
    CU_ASSERT_EQUAL(bs.lookahead, 0);
    CU_ASSERT_EQUAL(bs.lookahead_used, 0);
    CU_ASSERT_STRING_EQUAL(bs.endpoint, "");

    ie_sched_t *s = NULL;
    ie_sched_opts_t so = {.backend = be, .tok = tok, .prefill_chunk = 5};
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    /* three requests on two slots (the third waits for one), prompts that
     * take several chunks of 5 */
    static const int32_t p0[] = {200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211};
    static const int32_t p1[] = {300, 301, 302};
    static const int32_t p2[] = {400, 401, 402, 403, 404, 405, 406};
    const int32_t *pr[3] = {p0, p1, p2};
    const size_t np[3] = {12, 3, 7};
    static outcome_t o[3];
    memset(o, 0, sizeof o);
    ie_gen_params_t gp = greedy(9);
    for (int i = 0; i < 3; i++) {
        ie_sched_req_t r = {.ids = pr[i], .n_ids = np[i], .params = &gp, .cb = on_event, .cb_ctx = &o[i]};
        CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    }
    run_until_idle(s);
    CU_ASSERT_EQUAL(f.bad, 0); /* positions contiguous, blocks bound */
    CU_ASSERT(f.steps > 0);
    CU_ASSERT_EQUAL(f.hints, f.steps); /* one hint before every step */
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(o[i].kind, IE_SCHED_DONE);
        CU_ASSERT_EQUAL(o[i].n_gen, 9);
        /* the made-up model's greedy continuation */
        int32_t prev = pr[i][np[i] - 1], pos = (int32_t)np[i] - 1;
        for (size_t k = 0; k < o[i].n_gen; k++, pos++) {
            CU_ASSERT_EQUAL(o[i].ids[k], fake_next(prev, pos));
            prev = o[i].ids[k];
        }
    }
    assert_pool_clean(s);

    /* a backend that is not ready: the step fails, the request ends
     * "unavailable" (no retry_ms) and the scheduler reports not ready */
    f.ready = 0;
    memset(&o[0], 0, sizeof o[0]);
    ie_sched_req_t r = {.ids = p1, .n_ids = 3, .params = &gp, .cb = on_event, .cb_ctx = &o[0]};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(o[0].kind, IE_SCHED_ERROR);
    CU_ASSERT_STRING_EQUAL(o[0].code, "unavailable");
    ie_sched_stats_t st;
    ie_sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.ready, 0);
    ie_sched_destroy(&s);

    /* with a retry window too: a request that never ran on a ready backend
     * is not held for a replacement worker — "unavailable" at the first step */
    so.retry_ms = 60000;
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    memset(&o[0], 0, sizeof o[0]);
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    int busy = 1;
    for (int k = 0; k < 3 && o[0].kind == 0; k++) CU_ASSERT_EQUAL(ie_sched_step(s, &busy), IE_OK);
    CU_ASSERT_EQUAL(o[0].kind, IE_SCHED_ERROR);
    CU_ASSERT_STRING_EQUAL(o[0].code, "unavailable");

    /* draining: new requests are refused, the accepted one finishes */
    f.ready = 1;
    memset(&o[0], 0, sizeof o[0]);
    memset(&o[1], 0, sizeof o[1]);
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    ie_sched_drain(s);
    ie_sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.draining, 1);
    ie_sched_req_t r2 = r;
    r2.cb_ctx = &o[1];
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r2, NULL), IE_ERR_UNAVAILABLE);
    run_until_idle(s);
    CU_ASSERT_EQUAL(o[0].kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(o[0].n_gen, 9);
    CU_ASSERT_EQUAL(o[1].n_events, 0);
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);
    CU_ASSERT_PTR_NULL(be);
    CU_ASSERT_EQUAL(f.destroyed, 1);

    /* a table without a required entry, or a geometry value < 1, is refused
     * (and the implementation destroyed all the same) */
    ie_backend_ops_t no_step = k_fake_ops;
    no_step.step = NULL;
    CU_ASSERT_EQUAL(ie_backend_new(&no_step, &f, &g, &be), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(be);
    g.kv_blocks = 0;
    CU_ASSERT_EQUAL(ie_backend_new(&k_fake_ops, &f, &g, &be), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(f.destroyed, 3);
    ie_tokenizer_destroy(&tok);
}

/* Log-probabilities through the step boundary: a greedy request that
 * asks for them gets FULL rows (an ARGMAX-only row of a cluster would make
 * them meaningless), one that does not gets ARGMAX rows, and every TOKEN
 * event carries ln p of its token under the raw row and the top k. */
typedef struct lp_sink {
    int n_tok, n_with, bad, kind;
} lp_sink_t;

static double g_lp_want; /* ln p of the fake's chosen token */

static void on_lp_event(void *ctx, const ie_sched_event_t *ev)
{
    lp_sink_t *k = ctx;
    if (ev->kind != IE_SCHED_TOKEN) {
        k->kind = ev->kind;
        return;
    }
    k->n_tok++;
    if (!ev->has_logprob) return;
    k->n_with++;
    /* the fake's row: 1 at the next token, 0 elsewhere; top 2 = (next, id 0) */
    if (fabs(ev->logprob - g_lp_want) > 1e-5 || ev->n_top != 2 || !ev->top || ev->top[0].id != ev->token ||
        fabs(ev->top[0].logprob - g_lp_want) > 1e-5 || ev->top[1].id != 0 ||
        fabs(ev->top[1].logprob - (g_lp_want - 1.0)) > 1e-5)
        k->bad++;
}

static void test_fake_logprobs(void)
{
    static fake_t f;
    ie_tokenizer_t *tok = NULL;
    ie_backend_t *be = NULL;
    ie_sched_t *s = fake_sched(&f, &tok, &be, (ie_sched_opts_t){0});
    g_lp_want = 1.0 - log(exp(1.0) + (double)(f.n_vocab - 1));
    static const int32_t p[] = {200, 201, 202};
    ie_gen_params_t plain = greedy(4), lp = greedy(4);
    lp.logprobs = 1;
    lp.top_logprobs = 2;
    lp_sink_t a = {0}, b = {0};
    ie_sched_req_t ra = {.ids = p, .n_ids = 3, .params = &plain, .cb = on_lp_event, .cb_ctx = &a};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &ra, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(a.kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(a.n_tok, 4);
    CU_ASSERT_EQUAL(a.n_with, 0);
    CU_ASSERT_EQUAL(f.rows_argmax, 4);
    CU_ASSERT_EQUAL(f.rows_full, 0);
    ie_sched_req_t rb = {.ids = p, .n_ids = 3, .params = &lp, .cb = on_lp_event, .cb_ctx = &b};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &rb, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(b.kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(b.n_tok, 4);
    CU_ASSERT_EQUAL(b.n_with, 4);
    CU_ASSERT_EQUAL(b.bad, 0);
    CU_ASSERT_EQUAL(f.rows_full, 4);
    CU_ASSERT_EQUAL(f.rows_argmax, 4);
    /* top_logprobs beyond IE_LOGPROBS_MAX_TOP is refused at submission */
    lp.top_logprobs = IE_LOGPROBS_MAX_TOP + 1;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &rb, NULL), IE_ERR_INVAL);
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);
    ie_tokenizer_destroy(&tok);
}

/* Embedding requests (ie_sched_req_t.pooling) on the fake backend, whose
 * hidden state of (token t, position p) is (t, p, 1): pooled mean / last /
 * cls over exactly the input's positions, no token events, no sampling,
 * batched with a generation that stays as it is alone, never served from
 * the prefix cache, the pool clean afterwards. */
static void test_fake_embeddings(void)
{
    static fake_t f;
    ie_tokenizer_t *tok = NULL;
    ie_backend_geom_t g;
    fake_setup(&f, &tok, &g); /* n_embd 0: no hidden states */
    ie_backend_t *be = NULL;
    ie_sched_t *s = NULL;
    static const int32_t p0[] = {200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211};
    static const int32_t p1[] = {300, 301, 302};
    static outcome_t o[4];
    memset(o, 0, sizeof o);
    ie_gen_params_t gp = greedy(6);
    ie_sched_opts_t so = {.prefill_chunk = 5};

    /* a backend without hidden states refuses embeddings at submit */
    CU_ASSERT_EQUAL_FATAL(ie_backend_new(&k_fake_ops, &f, &g, &be), IE_OK);
    so.backend = be, so.tok = tok;
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    ie_sched_req_t e0 = {
        .ids = p0, .n_ids = 12, .params = &gp, .cb = on_event, .cb_ctx = &o[1], .pooling = IE_POOL_MEAN};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &e0, NULL), IE_ERR_UNSUPPORTED);
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);

    g.n_embd = 3;
    CU_ASSERT_EQUAL_FATAL(ie_backend_new(&k_fake_ops, &f, &g, &be), IE_OK);
    so.backend = be;
    CU_ASSERT_EQUAL_FATAL(ie_sched_new(&so, &s), IE_OK);
    /* a generation of p0 first: it publishes p0's full blocks */
    ie_sched_req_t r0 = {.ids = p0, .n_ids = 12, .params = &gp, .cb = on_event, .cb_ctx = &o[0]};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r0, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(o[0].kind, IE_SCHED_DONE);
    /* then, together with a new generation: mean of p0 (cached blocks
     * there, not taken), last and cls of p1 */
    memset(o, 0, sizeof o);
    ie_sched_req_t e1 = e0, e2 = e0;
    e1.ids = e2.ids = p1, e1.n_ids = e2.n_ids = 3;
    e1.pooling = IE_POOL_LAST, e1.cb_ctx = &o[2];
    e2.pooling = IE_POOL_CLS, e2.cb_ctx = &o[3];
    ie_sched_req_t r1 = {.ids = p1, .n_ids = 3, .params = &gp, .cb = on_event, .cb_ctx = &o[0]};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r1, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_sched_submit(s, &e0, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_sched_submit(s, &e1, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_sched_submit(s, &e2, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(f.bad, 0);
    CU_ASSERT_EQUAL(o[0].kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(o[0].n_gen, 6);
    int32_t prev = p1[2], pos = 2;
    for (size_t k = 0; k < o[0].n_gen; k++, pos++) {
        CU_ASSERT_EQUAL(o[0].ids[k], fake_next(prev, pos));
        prev = o[0].ids[k];
    }
    for (int i = 1; i < 4; i++) {
        CU_ASSERT_EQUAL(o[i].kind, IE_SCHED_DONE);
        CU_ASSERT_EQUAL(o[i].n_tokens, 0); /* no TOKEN events */
        CU_ASSERT_EQUAL(o[i].n_gen, 0);
        CU_ASSERT_EQUAL(o[i].n_cached, 0); /* computed whole */
        CU_ASSERT_EQUAL(o[i].n_embd, 3);
    }
    CU_ASSERT_EQUAL(o[1].n_prompt, 12);
    CU_ASSERT_DOUBLE_EQUAL(o[1].embd[0], 205.5, 1e-4); /* mean of 200..211 */
    CU_ASSERT_DOUBLE_EQUAL(o[1].embd[1], 5.5, 1e-4);   /* mean of positions 0..11 */
    CU_ASSERT_DOUBLE_EQUAL(o[1].embd[2], 1.0, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(o[2].embd[0], 302, 0);
    CU_ASSERT_DOUBLE_EQUAL(o[2].embd[1], 2, 0);
    CU_ASSERT_DOUBLE_EQUAL(o[3].embd[0], 300, 0);
    CU_ASSERT_DOUBLE_EQUAL(o[3].embd[1], 0, 0);
    assert_pool_clean(s);
    /* an unknown pooling is refused */
    e0.pooling = (ie_pooling_t)9;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &e0, NULL), IE_ERR_INVAL);
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);
    ie_tokenizer_destroy(&tok);
}

/* A json_schema request: the fake's rows favour tokens outside the JSON
 * language, so only the mask makes the text an instance; it asks for full
 * rows although greedy; it ends by EOS once complete (with ignore_eos
 * too); a bad schema is refused at submission naming the keyword. */
typedef struct js_sink {
    int kind;
    ie_finish_t finish;
    char text[512];
} js_sink_t;

static void on_js_event(void *ctx, const ie_sched_event_t *ev)
{
    js_sink_t *k = ctx;
    if (ev->kind == IE_SCHED_TOKEN) return;
    k->kind = ev->kind;
    k->finish = ev->finish;
    if (ev->all_text) snprintf(k->text, sizeof k->text, "%s", ev->all_text);
}

static void test_fake_json_schema(void)
{
    static fake_t f;
    ie_tokenizer_t *tok = NULL;
    ie_backend_t *be = NULL;
    ie_sched_t *s = fake_sched(&f, &tok, &be, (ie_sched_opts_t){0});
    static const int32_t p[] = {200, 201, 202};
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                         "\"b\":{\"enum\":[\"x\",\"y\"]}},\"required\":[\"a\",\"b\"]}";
    ie_gen_params_t gp = greedy(50);
    gp.json_schema = schema;
    js_sink_t k = {0};
    ie_sched_req_t r = {.ids = p, .n_ids = 3, .params = &gp, .cb = on_js_event, .cb_ctx = &k};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(k.kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(k.finish, IE_FINISH_EOS);
    CU_ASSERT_EQUAL(f.rows_argmax, 0);
    CU_ASSERT(f.rows_full > 0);
    ie_grammar_t *gr = NULL;
    ie_gmatch_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_grammar_compile(schema, &gr), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(gr, &m), IE_OK);
    CU_ASSERT_TRUE(ie_gmatch_feed(m, k.text, strlen(k.text)) && ie_gmatch_done(m));
    ie_gmatch_destroy(&m);
    /* ignore_eos: a finished document allows only EOS, so it still ends
     * there (the same text) rather than failing on a row of -inf */
    js_sink_t ki = {0};
    gp.ignore_eos = 1;
    r.cb_ctx = &ki;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(ki.kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(ki.finish, IE_FINISH_EOS);
    CU_ASSERT_STRING_EQUAL(ki.text, k.text);
    gp.ignore_eos = 0;
    ie_grammar_destroy(&gr);
    /* the same request unconstrained follows the fake's rows: not JSON */
    gp.json_schema = NULL;
    js_sink_t u = {0};
    r.cb_ctx = &u;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_NOT_EQUAL(u.text[0], '{');
    CU_ASSERT(f.rows_argmax > 0);
    gp.json_schema = "{\"type\":\"string\",\"pattern\":\"x\"}";
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "'pattern'"));
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);
    ie_tokenizer_destroy(&tok);
}

/* End-of-generation control on the fake, whose favourite tokens (100..149)
 * are all stop ids here: a plain request ends at its first token; min_new 3
 * makes three other tokens first (their rows FULL although greedy: the
 * mask must see the whole row), then the favourite ends it; ignore_eos runs
 * to max_new. Stop strings do not end the first min_new tokens, and a
 * logit bias moves a greedy request's choice (FULL rows too). */
static int fake_is_stop(int32_t id) { return id >= 100 && id < 150; }

static void test_fake_eog_control(void)
{
    static fake_t f;
    int32_t stop_ids[50];
    for (int i = 0; i < 50; i++) stop_ids[i] = 100 + i;
    ie_tokenizer_t *tok = NULL;
    ie_backend_t *be = NULL;
    ie_sched_t *s = fake_sched(&f, &tok, &be, (ie_sched_opts_t){.stop_ids = stop_ids, .n_stop_ids = 50});
    static const int32_t p[] = {200, 201, 202};
    ie_gen_params_t plain = greedy(6), mn = greedy(6), ign = greedy(6);
    mn.min_new = 3;
    ign.ignore_eos = 1;
    const ie_gen_params_t *gp[3] = {&plain, &mn, &ign};
    static outcome_t o[6];
    memset(o, 0, sizeof o);
    for (int i = 0; i < 3; i++) {
        ie_sched_req_t r = {.ids = p, .n_ids = 3, .params = gp[i], .cb = on_event, .cb_ctx = &o[i]};
        CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    }
    run_until_idle(s);
    CU_ASSERT(o[0].kind == IE_SCHED_DONE && o[0].finish == IE_FINISH_EOS && o[0].n_gen == 1);
    CU_ASSERT(fake_is_stop(o[0].ids[0]));
    CU_ASSERT(o[1].kind == IE_SCHED_DONE && o[1].finish == IE_FINISH_EOS && o[1].n_gen == 4);
    for (int k = 0; k < 3; k++) CU_ASSERT(!fake_is_stop(o[1].ids[k]) && !ie_tokenizer_is_eog(tok, o[1].ids[k]));
    CU_ASSERT(fake_is_stop(o[1].ids[3]));
    CU_ASSERT(o[2].kind == IE_SCHED_DONE && o[2].finish == IE_FINISH_LENGTH && o[2].n_gen == 6);
    for (int k = 0; k < 6; k++) CU_ASSERT(!fake_is_stop(o[2].ids[k]) && !ie_tokenizer_is_eog(tok, o[2].ids[k]));
    CU_ASSERT_EQUAL(f.rows_full, 3 + 6);
    CU_ASSERT_EQUAL(f.rows_argmax, 1 + 1);
    CU_ASSERT_EQUAL(f.bad, 0);

    /* "a" biased above the fake's favourite every step, stop string "a":
     * without min_new the first token stops it; with min_new 2 the third */
    const int32_t a = ie_tokenizer_find(tok, "a", 1);
    CU_ASSERT_FATAL(a >= 0 && !fake_is_stop(a));
    const ie_logit_bias_t bias = {a, 5.0f};
    const char *stop[] = {"a"};
    ie_gen_params_t sa = greedy(5), sb;
    sa.sampling.logit_bias = &bias;
    sa.sampling.n_logit_bias = 1;
    sa.stop = stop;
    sa.n_stop = 1;
    sb = sa;
    sb.min_new = 2;
    const int full0 = f.rows_full, argmax0 = f.rows_argmax;
    ie_sched_req_t r3 = {.ids = p, .n_ids = 3, .params = &sa, .cb = on_event, .cb_ctx = &o[3]};
    ie_sched_req_t r4 = {.ids = p, .n_ids = 3, .params = &sb, .cb = on_event, .cb_ctx = &o[4]};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r3, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r4, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT(o[3].kind == IE_SCHED_DONE && o[3].finish == IE_FINISH_STOP && o[3].n_gen == 1);
    CU_ASSERT_STRING_EQUAL(o[3].text, "");
    CU_ASSERT(o[4].kind == IE_SCHED_DONE && o[4].finish == IE_FINISH_STOP && o[4].n_gen == 3);
    CU_ASSERT_STRING_EQUAL(o[4].text, "aa");
    CU_ASSERT(o[4].ids[0] == a && o[4].ids[1] == a && o[4].ids[2] == a);
    CU_ASSERT_EQUAL(f.rows_full - full0, 1 + 3);
    CU_ASSERT_EQUAL(f.rows_argmax, argmax0);

    /* refused at submission: min_new < 0, a bias outside the vocabulary */
    mn.min_new = -1;
    ie_sched_req_t rb = {.ids = p, .n_ids = 3, .params = &mn, .cb = on_event, .cb_ctx = &o[5]};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &rb, NULL), IE_ERR_INVAL);
    const ie_logit_bias_t far = {f.n_vocab, 1.0f};
    sa.sampling.logit_bias = &far;
    rb.params = &sa;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &rb, NULL), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(o[5].kind, 0);
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);
    ie_tokenizer_destroy(&tok);
}

/* Prompt log-probabilities on the fake: entry i is ln p(prompt[i]) under
 * the row the fake gives at position i - 1 (1 at fake_next, 0 elsewhere),
 * the top 2 at that position (fake_next, then id 0); entry 0 is NaN. Such
 * a request computes its whole prompt although the prefix cache holds it
 * (and leaves the cache usable), with max_new 0 too. */
typedef struct plp_sink {
    int kind;
    size_t n_prompt, n_cached, n_gen;
    float lp[32];
    ie_token_logprob_t top[32][2];
    int k;
} plp_sink_t;

static void on_plp_event(void *ctx, const ie_sched_event_t *ev)
{
    plp_sink_t *k = ctx;
    if (ev->kind == IE_SCHED_TOKEN) return;
    k->kind = ev->kind;
    k->n_prompt = ev->n_prompt;
    k->n_cached = ev->n_cached;
    k->n_gen = ev->n_gen;
    k->k = ev->prompt_k;
    for (size_t i = 0; ev->prompt_lp && i < ev->n_prompt && i < 32; i++) {
        k->lp[i] = ev->prompt_lp[i];
        for (int j = 0; j < ev->prompt_k && j < 2; j++) k->top[i][j] = ev->prompt_top[i * (size_t)ev->prompt_k + j];
    }
}

static void test_fake_prompt_logprobs(void)
{
    static fake_t f;
    ie_tokenizer_t *tok = NULL;
    ie_backend_t *be = NULL;
    ie_sched_t *s = fake_sched(&f, &tok, &be, (ie_sched_opts_t){0});
    int32_t p[11] = {200, 201}; /* some tokens the fake predicts, some not */
    for (int i = 2; i < 11; i++) p[i] = i % 3 ? fake_next(p[i - 1], i - 1) : 300 + i;
    const double lse = log(exp(1.0) + (double)(f.n_vocab - 1));
    ie_gen_params_t plain = greedy(2), pl = greedy(2);
    pl.prompt_logprobs = 1;
    pl.top_logprobs = 2;
    plp_sink_t a = {0}, b = {0}, c = {0}, d = {0};
    ie_sched_req_t r = {.ids = p, .n_ids = 11, .params = &plain, .cb = on_plp_event, .cb_ctx = &a};
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(a.kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(a.k, 0);
    const int full0 = f.rows_full;
    r.params = &pl;
    r.cb_ctx = &b;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT_EQUAL(b.kind, IE_SCHED_DONE);
    CU_ASSERT_EQUAL(b.n_cached, 0); /* the cache holds 8 of its positions: not used */
    CU_ASSERT_EQUAL(b.n_gen, 2);
    CU_ASSERT_EQUAL(b.k, 2);
    CU_ASSERT_EQUAL(f.rows_full - full0, 10); /* the prompt's; its greedy tokens take ARGMAX rows */
    CU_ASSERT(isnan(b.lp[0]));
    for (int i = 1; i < 11; i++) {
        const int32_t want = fake_next(p[i - 1], i - 1);
        CU_ASSERT_DOUBLE_EQUAL(b.lp[i], (p[i] == want ? 1.0 : 0.0) - lse, 1e-5);
        CU_ASSERT_EQUAL(b.top[i][0].id, want);
        CU_ASSERT_DOUBLE_EQUAL(b.top[i][0].logprob, 1.0 - lse, 1e-5);
        CU_ASSERT_EQUAL(b.top[i][1].id, 0);
    }
    /* max_new 0: the prompt's values, nothing sampled */
    pl.max_new = 0;
    r.cb_ctx = &c;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT(c.kind == IE_SCHED_DONE && c.n_gen == 0 && c.n_cached == 0);
    CU_ASSERT(memcmp(c.lp + 1, b.lp + 1, 10 * sizeof *c.lp) == 0);
    /* the cache still serves the others */
    r.params = &plain;
    r.cb_ctx = &d;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_OK);
    run_until_idle(s);
    CU_ASSERT(d.kind == IE_SCHED_DONE && d.n_cached == 8);
    CU_ASSERT_EQUAL(f.bad, 0);
    pl.top_logprobs = IE_LOGPROBS_MAX_TOP + 1;
    r.params = &pl;
    CU_ASSERT_EQUAL(ie_sched_submit(s, &r, NULL), IE_ERR_INVAL);
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);
    ie_tokenizer_destroy(&tok);
}

/* Prompt-lookup speculative decoding on the fake (opts.spec_ngram 4):
 * a prompt that holds its own greedy continuation after an earlier copy
 * of its last token gets those tokens as drafts, confirmed several a step:
 * the same ids as the chain without drafts in fewer steps; drafts that the
 * model refuses cost nothing but their rows (the slot's length is given
 * back, positions stay contiguous); both at once in two slots. */
static void test_fake_spec_ngram(void)
{
    static fake_t f;
    ie_tokenizer_t *tok = NULL;
    ie_backend_t *be = NULL;
    ie_sched_t *s = fake_sched(&f, &tok, &be, (ie_sched_opts_t){.spec_ngram = 4});
    enum { L = 10, NEW = 12 };
    int32_t good[L] = {200}, bad[L] = {0, 400, 401, 402, 403, 300, 301, 302, 303, 200}, want[2][NEW];
    int32_t prev = 200;
    for (int j = 1; j <= 5; j++) good[j] = prev = fake_next(prev, L - 2 + j); /* c_j follows 200 at L-1 */
    good[6] = 300, good[7] = 301, good[8] = 302, good[9] = 200;
    bad[0] = good[1]; /* c_1, followed by tokens the model never gives */
    const int32_t *pr[2] = {good, bad};
    for (int r = 0; r < 2; r++) { /* the greedy chain */
        int32_t t = pr[r][L - 1];
        for (int j = 0; j < NEW; j++) want[r][j] = t = fake_next(t, L - 1 + j);
    }
    CU_ASSERT_EQUAL(memcmp(want[0], good + 1, 5 * sizeof *good), 0); /* the prompt holds c_1..c_5 */
    ie_gen_params_t gp = greedy(NEW);
    static outcome_t o[4];
    memset(o, 0, sizeof o);
    ie_sched_stats_t st;
    int steps[2];
    for (int r = 1; r >= 0; r--) { /* refused drafts first: its step count is the plain one */
        const int steps0 = f.steps;
        ie_sched_req_t q = {.ids = pr[r], .n_ids = L, .params = &gp, .cb = on_event, .cb_ctx = &o[r]};
        CU_ASSERT_EQUAL(ie_sched_submit(s, &q, NULL), IE_OK);
        run_until_idle(s);
        steps[r] = f.steps - steps0;
        CU_ASSERT(o[r].kind == IE_SCHED_DONE && o[r].n_gen == NEW);
        CU_ASSERT_EQUAL(memcmp(o[r].ids, want[r], sizeof want[r]), 0);
        CU_ASSERT_EQUAL(f.bad, 0); /* positions contiguous after the refusals */
        ie_sched_stats(s, &st);
        if (r == 1) CU_ASSERT(st.spec_drafted >= 4 && st.spec_accepted == 0);
    }
    CU_ASSERT_EQUAL(st.spec_accepted, 4);    /* c_2..c_5 */
    CU_ASSERT_EQUAL(steps[0], steps[1] - 4); /* ... with c_6, in one step */
    /* both at once: each its own chain */
    for (int r = 0; r < 2; r++) {
        ie_sched_req_t q = {.ids = pr[r], .n_ids = L, .params = &gp, .cb = on_event, .cb_ctx = &o[2 + r]};
        CU_ASSERT_EQUAL(ie_sched_submit(s, &q, NULL), IE_OK);
    }
    run_until_idle(s);
    for (int r = 0; r < 2; r++) CU_ASSERT(o[2 + r].n_gen == NEW && !memcmp(o[2 + r].ids, want[r], sizeof want[r]));
    CU_ASSERT_EQUAL(f.bad, 0);
    /* a sampled request gets no drafts */
    ie_sched_stats(s, &st);
    const uint64_t drafted = st.spec_drafted;
    ie_gen_params_t sp = gp;
    sp.sampling.greedy = 0;
    sp.sampling.temperature = 0.5f;
    ie_sched_req_t q = {.ids = good, .n_ids = L, .params = &sp, .cb = on_event, .cb_ctx = &o[0]};
    memset(&o[0], 0, sizeof o[0]);
    CU_ASSERT_EQUAL(ie_sched_submit(s, &q, NULL), IE_OK);
    run_until_idle(s);
    ie_sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.spec_drafted, drafted);
    ie_sched_destroy(&s);
    ie_backend_destroy(&be);
    ie_tokenizer_destroy(&tok);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("sched", suite_init, suite_clean);
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {{"join and leave at any step", test_join_leave},
                 {"16 streams equal solo runs", test_sixteen_streams},
                 {"prefix cache", test_prefix_cache},
                 {"preemption in a small pool", test_preemption},
                 {"queue, cancel, timeout, priority", test_queue_cancel_timeout_priority},
                 {"busy counts free slots", test_busy_counts_free_slots},
                 {"streamed pieces add up to the text", test_stream_adds_up},
                 {"submit from other threads", test_threads},
                 {"a fake backend behind the step boundary", test_fake_backend},
                 {"log-probabilities ask for full rows", test_fake_logprobs},
                 {"embeddings on a fake backend", test_fake_embeddings},
                 {"json_schema masks and asks for full rows", test_fake_json_schema},
                 {"min_new, ignore_eos and logit bias", test_fake_eog_control},
                 {"prompt log-probabilities", test_fake_prompt_logprobs},
                 {"prompt-lookup drafts", test_fake_spec_ngram}};
    /* IE_TEST_ONLY=word runs the tests whose name holds it (make tsan runs
     * the threaded ones: every test under TSan takes minutes) */
    const char *only = getenv("IE_TEST_ONLY");
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
        if (!only || strstr(tests[i].name, only)) CU_add_test(s, tests[i].name, tests[i].fn);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
