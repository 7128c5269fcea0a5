/* test_api.c — include/clocher.h, the installed library's API (api.c):
 * every function, its error paths (NULL, unknown key, bad value, invalid
 * UTF-8, id out of range) with outputs cleared on failure, streaming
 * pieces that add up to the text, cancellation from the callback, and
 * metrics that add up over an engine's life.
 *
 * Error paths use the tiny Llama fixture (fast, no chat template); real
 * text uses SmolLM2 (required: a missing model fails the suite).
 */
#include "clocher.h"

#include <CUnit/Basic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TINY IE_TEST_DATA "/tiny_llama_f32.gguf"
#define MODEL IE_TEST_DATA "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define PROMPT "The capital of France is"

static ie_engine_t *g_tiny, *g_smol;

/* A parameter set from "key", "value", ... pairs (NULL-terminated). Used
 * by suite_init too, where CUnit's asserts cannot run: aborts on failure. */
static ie_params_t *params(const char *k, ...)
{
    ie_params_t *p = NULL;
    if (ie_params_new(&p) != IE_OK) abort();
    va_list ap;
    va_start(ap, k);
    for (const char *key = k; key; key = va_arg(ap, const char *)) {
        const char *val = va_arg(ap, const char *);
        if (ie_params_set(p, key, val) != IE_OK) abort();
    }
    va_end(ap);
    return p;
}

static ie_status_t make(const char *path, ie_params_t *opts, ie_engine_t **out)
{
    ie_status_t st = ie_engine_create(path, opts, out);
    ie_params_destroy(&opts);
    return st;
}

static int suite_init(void)
{
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "\nmodel missing: %s (run scripts/setup.sh)\n", MODEL);
        return -1;
    }
    if (make(TINY, params("threads", "1", "pin", "0", NULL), &g_tiny) != IE_OK ||
        make(MODEL, params("threads", "2", "pin", "0", "ctx", "256", NULL), &g_smol) != IE_OK) {
        fprintf(stderr, "\nengine creation failed: %s\n", ie_error_last());
        return -1;
    }
    return 0;
}

static int suite_clean(void)
{
    ie_engine_destroy(&g_tiny);
    ie_engine_destroy(&g_smol);
    return 0;
}

static void test_basics(void)
{
    CU_ASSERT_STRING_EQUAL(ie_version(), "0.1.0");
    CU_ASSERT_STRING_EQUAL(ie_status_str(IE_ERR_FORMAT), "IE_ERR_FORMAT");
    CU_ASSERT_PTR_NOT_NULL(ie_error_last());
    ie_free(NULL);
    CU_ASSERT_EQUAL(ie_engine_n_vocab(NULL), 0);
    CU_ASSERT_EQUAL(ie_engine_n_vocab(g_smol), 49152);
    CU_ASSERT_EQUAL(ie_engine_n_vocab(g_tiny), 512);
}

static void test_params(void)
{
    ie_params_t *p = NULL;
    CU_ASSERT_EQUAL(ie_params_new(NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_params_new(&p), IE_OK);
    CU_ASSERT_EQUAL(ie_params_set(NULL, "a", "b"), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_params_set(p, NULL, "b"), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_params_set(p, "a", NULL), IE_ERR_INVAL);
    for (int i = 0; i < 20; i++) CU_ASSERT_EQUAL(ie_params_set(p, "stop", "x"), IE_OK); /* grows */
    CU_ASSERT_EQUAL(ie_params_set(p, "seed", "1"), IE_OK);
    CU_ASSERT_EQUAL(ie_params_set(p, "seed", "2"), IE_OK); /* replaces */
    ie_params_destroy(&p);
    CU_ASSERT_PTR_NULL(p);
    ie_params_destroy(&p);
    ie_params_destroy(NULL);
    ie_engine_destroy(NULL);
}

static void test_create_errors(void)
{
    ie_engine_t *e = (ie_engine_t *)1;
    CU_ASSERT_EQUAL(ie_engine_create(NULL, NULL, &e), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(e);
    CU_ASSERT_EQUAL(ie_engine_create(TINY, NULL, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(make(TINY, params("threads", "1", "colour", "red", NULL), &e), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "colour"));
    const char *bad[][2] = {{"threads", "two"},    {"threads", "0"},       {"pin", "2"},
                            {"ctx", "12x"},        {"precision", "f8"},    {"plan", "tensor"},
                            {"plan", "ring:2"},    {"plan", "tensor:0"},   {"prefix_cache", ""},
                            {"threads", " 4"},     {"threads", "+4"},      {"plan", "tensor: 2"},
                            {"plan", "tensor:+2"}, {"cache_type_k", "q5"}, {"cache_type_v", "int8"},
                            {"kv_rotate", "maybe"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e = (ie_engine_t *)1;
        CU_ASSERT_EQUAL(make(TINY, params(bad[i][0], bad[i][1], NULL), &e), IE_ERR_INVAL);
        CU_ASSERT_PTR_NULL(e);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), bad[i][0]));
    }
    CU_ASSERT_EQUAL(ie_engine_create(IE_TEST_DATA "/no_such_model.gguf", NULL, &e), IE_ERR_IO);
    CU_ASSERT_PTR_NULL(e);
    /* every documented key is known */
    CU_ASSERT_EQUAL(make(TINY,
                         params("threads", "1", "pin", "0", "ctx", "64", "seqs", "1", "max_batch", "16",
                                "precision", "f32", "plan", "none", "kv_block", "16", "kv_blocks", "8",
                                "prefix_cache", "0", "cache_type_k", "q8_0", "cache_type_v", "fp8_e5m2",
                                "kv_rotate", "off", NULL),
                         &e),
                    IE_OK);
    ie_engine_destroy(&e);
    CU_ASSERT_PTR_NULL(e);
}

static void test_generate_errors(void)
{
    char *text = (char *)1;
    ie_gen_info_t info = {.n_gen = 7};
    CU_ASSERT_EQUAL(ie_engine_generate(NULL, "x", NULL, NULL, NULL, &text, &info), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(text);
    CU_ASSERT_EQUAL(info.n_gen, 0);
    CU_ASSERT_EQUAL(ie_engine_generate(g_tiny, NULL, NULL, NULL, NULL, &text, NULL), IE_ERR_INVAL);
    ie_params_t *g = params("max_tokens", "2", "sampler", "beam", NULL);
    CU_ASSERT_EQUAL(ie_engine_generate(g_tiny, "x", g, NULL, NULL, &text, NULL), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "sampler"));
    ie_params_destroy(&g);
    const char *bad[][2] = {{"max_tokens", "-1"},   {"temperature", "-1"}, {"temperature", "nan"},
                            {"top_p", "0"},         {"seed", "-3"},        {"stop", ""},
                            {"add_special", "yes"}, {"seed", " -3"},       {"seed", "+3"},
                            {"temperature", " 1"},  {"logit_bias", "5"},   {"logit_bias", "x+1"},
                            {"min_tokens", "-1"},   {"ignore_eos", "2"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g = params(bad[i][0], bad[i][1], NULL);
        text = (char *)1;
        CU_ASSERT_EQUAL(ie_engine_generate(g_tiny, "x", g, NULL, NULL, &text, NULL), IE_ERR_INVAL);
        CU_ASSERT_PTR_NULL(text);
        ie_params_destroy(&g);
    }
    CU_ASSERT_EQUAL(ie_engine_generate(g_tiny, "bad \xff utf-8", NULL, NULL, NULL, &text, NULL), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "UTF-8"));
    /* a prompt longer than the context (256 positions) */
    size_t n = 4000;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = i % 2 ? ' ' : 'a';
    big[n] = '\0';
    CU_ASSERT_EQUAL(ie_engine_generate(g_smol, big, NULL, NULL, NULL, &text, NULL), IE_ERR_RANGE);
    free(big);
    /* the tiny vocabulary has no chat markup */
    const char *roles[] = {"user"}, *contents[] = {"hi"};
    CU_ASSERT_EQUAL(ie_engine_chat(g_tiny, roles, contents, 1, NULL, NULL, NULL, &text, NULL), IE_ERR_UNSUPPORTED);
    CU_ASSERT_EQUAL(ie_engine_chat(NULL, roles, contents, 1, NULL, NULL, NULL, &text, NULL), IE_ERR_INVAL);
    /* roles are the model's template's business (SmolLM2's takes any);
     * content must be UTF-8 */
    const char *bad_contents[] = {"bad \xff"};
    CU_ASSERT_EQUAL(ie_engine_chat(g_smol, roles, bad_contents, 1, NULL, NULL, NULL, &text, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_engine_chat(g_smol, roles, contents, 0, NULL, NULL, NULL, &text, NULL), IE_ERR_INVAL);
}

typedef struct pieces {
    char buf[8192];
    size_t len, n, cancel_after;
    int32_t ids[512];
} pieces_t;

static int collect(void *user, int32_t id, const char *text, size_t len)
{
    pieces_t *p = user;
    CU_ASSERT_FATAL(p->len + len < sizeof p->buf);
    memcpy(p->buf + p->len, text, len);
    p->len += len;
    p->buf[p->len] = '\0';
    if (p->n < 512) p->ids[p->n] = id;
    p->n++;
    return p->cancel_after && p->n >= p->cancel_after;
}

static void test_generate_stream(void)
{
    ie_params_t *g = params("max_tokens", "24", "temperature", "0", NULL);
    char *text = NULL, *again = NULL;
    ie_gen_info_t info;
    pieces_t pc = {0};
    CU_ASSERT_EQUAL_FATAL(ie_engine_generate(g_smol, PROMPT, g, collect, &pc, &text, &info), IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(strlen(text) > 0);
    CU_ASSERT_STRING_EQUAL(pc.buf, text); /* the pieces add up to the text */
    CU_ASSERT_EQUAL(pc.n, info.n_gen);
    CU_ASSERT(info.n_gen > 0 && info.n_gen <= 24);
    CU_ASSERT(info.n_prompt > 0);
    CU_ASSERT(!strcmp(info.finish, "length") || !strcmp(info.finish, "eos"));
    CU_ASSERT(info.ttft_ms > 0 && info.total_ms >= info.ttft_ms);
    /* greedy: the same again, without a callback */
    CU_ASSERT_EQUAL(ie_engine_generate(g_smol, PROMPT, g, NULL, NULL, &again, NULL), IE_OK);
    CU_ASSERT_STRING_EQUAL(again, text);
    ie_free(again);

    /* a stop string: the text ends before it, the pieces still add up */
    const char *cut = strchr(text + 1, ' ');
    if (cut && cut[1]) {
        char stop[8] = {0};
        memcpy(stop, cut + 1, cut[2] ? 2 : 1);
        ie_params_set(g, "stop", stop);
        pieces_t ps = {0};
        CU_ASSERT_EQUAL(ie_engine_generate(g_smol, PROMPT, g, collect, &ps, &again, &info), IE_OK);
        CU_ASSERT_STRING_EQUAL(info.finish, "stop");
        CU_ASSERT_STRING_EQUAL(ps.buf, again);
        CU_ASSERT(strncmp(again, text, strlen(again)) == 0 && strlen(again) < strlen(text));
        ie_free(again);
    }
    ie_free(text);
    ie_params_destroy(&g);
}

/* "logit_bias" forces a token (and a second entry bans the greedy one);
 * "ignore_eos" runs a chat answer that ends by itself to max_tokens. */
static void test_generate_bias_ignore_eos(void)
{
    ie_params_t *g = params("max_tokens", "3", "temperature", "0", "logit_bias", "1000+100", NULL);
    ie_gen_info_t info;
    pieces_t pc = {0};
    CU_ASSERT_EQUAL_FATAL(ie_engine_generate(g_smol, PROMPT, g, collect, &pc, NULL, &info), IE_OK);
    CU_ASSERT(pc.n == 3 && pc.ids[0] == 1000 && pc.ids[1] == 1000 && pc.ids[2] == 1000);
    ie_params_destroy(&g);
    g = params("max_tokens", "200", "temperature", "0", NULL);
    const char *roles[] = {"user"}, *contents[] = {"Name three colors."};
    CU_ASSERT_EQUAL_FATAL(ie_engine_chat(g_smol, roles, contents, 1, g, NULL, NULL, NULL, &info), IE_OK);
    CU_ASSERT_STRING_EQUAL(info.finish, "eos");
    const size_t n0 = info.n_gen;
    CU_ASSERT_FATAL(n0 < 150);
    char want[16];
    snprintf(want, sizeof want, "%zu", n0 + 6);
    ie_params_set(g, "max_tokens", want);
    ie_params_set(g, "ignore_eos", "1");
    CU_ASSERT_EQUAL(ie_engine_chat(g_smol, roles, contents, 1, g, NULL, NULL, NULL, &info), IE_OK);
    CU_ASSERT_EQUAL(info.n_gen, n0 + 6);
    CU_ASSERT_STRING_EQUAL(info.finish, "length");
    ie_params_destroy(&g);
}

static void test_cancel(void)
{
    ie_params_t *g = params("max_tokens", "40", "temperature", "0", NULL);
    char *full = NULL, *text = NULL;
    ie_gen_info_t info;
    CU_ASSERT_EQUAL_FATAL(ie_engine_generate(g_smol, PROMPT, g, NULL, NULL, &full, NULL), IE_OK);
    pieces_t pc = {.cancel_after = 3};
    CU_ASSERT_EQUAL(ie_engine_generate(g_smol, PROMPT, g, collect, &pc, &text, &info), IE_OK);
    CU_ASSERT_STRING_EQUAL(info.finish, "cancelled");
    CU_ASSERT_EQUAL(info.n_gen, 3);
    CU_ASSERT_EQUAL(pc.n, 3); /* no token after the one that cancelled */
    CU_ASSERT_STRING_EQUAL(text, pc.buf);
    CU_ASSERT(strncmp(full, text, strlen(text)) == 0);
    ie_free(text);
    /* the engine is whole afterwards: the same greedy text again */
    CU_ASSERT_EQUAL(ie_engine_generate(g_smol, PROMPT, g, NULL, NULL, &text, NULL), IE_OK);
    CU_ASSERT_STRING_EQUAL(text, full);
    ie_free(text);
    ie_free(full);
    ie_params_destroy(&g);
}

static void test_chat(void)
{
    const char *roles[] = {"user"}, *contents[] = {"What is 2+2?"};
    ie_params_t *g = params("max_tokens", "32", "temperature", "0", NULL);
    char *text = NULL;
    ie_gen_info_t info;
    pieces_t pc = {0};
    CU_ASSERT_EQUAL_FATAL(ie_engine_chat(g_smol, roles, contents, 1, g, collect, &pc, &text, &info), IE_OK);
    CU_ASSERT_STRING_EQUAL(pc.buf, text);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "4"));
    CU_ASSERT_STRING_EQUAL(info.finish, "eos");
    CU_ASSERT(info.n_prompt > 20); /* the default system message came first */
    ie_free(text);
    ie_params_destroy(&g);
}

static void test_tokenize(void)
{
    int32_t *ids = (int32_t *)1;
    size_t n = 9;
    char *text = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_engine_tokenize(g_smol, "Hello world<|im_end|>", 0, &ids, &n), IE_OK);
    CU_ASSERT(n >= 3);
    CU_ASSERT_EQUAL(ids[n - 1], 2); /* <|im_end|> parsed as the special token */
    CU_ASSERT_EQUAL_FATAL(ie_engine_detokenize(g_smol, ids, n, &text), IE_OK);
    CU_ASSERT_STRING_EQUAL(text, "Hello world<|im_end|>");
    ie_free(text);
    /* out of range */
    int32_t keep = ids[0];
    ids[0] = 49152;
    text = (char *)1;
    CU_ASSERT_EQUAL(ie_engine_detokenize(g_smol, ids, n, &text), IE_ERR_RANGE);
    CU_ASSERT_PTR_NULL(text);
    ids[0] = -1;
    CU_ASSERT_EQUAL(ie_engine_detokenize(g_smol, ids, n, &text), IE_ERR_RANGE);
    ids[0] = keep;
    ie_free(ids);
    /* empty */
    CU_ASSERT_EQUAL(ie_engine_detokenize(g_smol, NULL, 0, &text), IE_OK);
    CU_ASSERT_STRING_EQUAL(text, "");
    ie_free(text);
    CU_ASSERT_EQUAL(ie_engine_tokenize(g_smol, "", 0, &ids, &n), IE_OK);
    CU_ASSERT_EQUAL(n, 0);
    ie_free(ids);
    /* errors */
    ids = (int32_t *)1;
    CU_ASSERT_EQUAL(ie_engine_tokenize(g_smol, "a\xc3(", 0, &ids, &n), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(ids);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_EQUAL(ie_engine_tokenize(NULL, "a", 0, &ids, &n), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_engine_tokenize(g_smol, NULL, 0, &ids, &n), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_engine_tokenize(g_smol, "a", 0, NULL, &n), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_engine_detokenize(NULL, NULL, 0, &text), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_engine_detokenize(g_smol, NULL, 2, &text), IE_ERR_INVAL);
}

/* A fresh engine: metrics count exactly what its generations did. */
static void test_metrics(void)
{
    ie_engine_t *e = NULL;
    ie_engine_metrics_t m;
    CU_ASSERT_EQUAL_FATAL(make(MODEL, params("threads", "2", "pin", "0", "ctx", "256", NULL), &e), IE_OK);
    CU_ASSERT_EQUAL(ie_engine_get_metrics(NULL, &m), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_engine_get_metrics(e, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_engine_get_metrics(e, &m), IE_OK);
    CU_ASSERT_EQUAL(m.requests, 0);
    CU_ASSERT_EQUAL(m.tokens_out, 0);
    CU_ASSERT(m.rss_peak_mb > 0);

    ie_params_t *g = params("max_tokens", "16", "temperature", "0", NULL);
    size_t in = 0, out = 0;
    ie_gen_info_t info;
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(ie_engine_generate(e, PROMPT, g, NULL, NULL, NULL, &info), IE_OK);
        in += info.n_prompt;
        out += info.n_gen;
    }
    pieces_t pc = {.cancel_after = 2};
    CU_ASSERT_EQUAL(ie_engine_generate(e, "Once upon a time", g, collect, &pc, NULL, &info), IE_OK);
    in += info.n_prompt;
    out += info.n_gen;
    CU_ASSERT_EQUAL(ie_engine_get_metrics(e, &m), IE_OK);
    CU_ASSERT_EQUAL(m.requests, 4);
    CU_ASSERT_EQUAL(m.tokens_in, in);
    CU_ASSERT_EQUAL(m.tokens_out, out);
    CU_ASSERT_EQUAL(m.kv_hits + m.kv_misses, in);
    CU_ASSERT(m.prefill_tps > 0 && m.decode_tps > 0 && m.tps > 0);
    CU_ASSERT(m.latency_p50_ms > 0 && m.latency_p95_ms >= m.latency_p50_ms);
    CU_ASSERT(m.ttft_p50_ms > 0);
    CU_ASSERT(m.rss_peak_mb > 0);
    ie_params_destroy(&g);
    ie_engine_destroy(&e);
}

/* Generations one after another share the engine's prefix cache: the
 * second run of a long prompt takes its full KV blocks from the first
 * (kv_hits), and greedy output does not change. prefix_cache 0 keeps
 * nothing. */
static void test_prefix_cache_across_calls(void)
{
    static const char *const long_prompt =
        "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a wife. However little known the feelings or views of such a man may be";
    for (int cache = 1; cache >= 0; cache--) {
        ie_engine_t *e = NULL;
        CU_ASSERT_EQUAL_FATAL(
            make(MODEL, params("threads", "2", "pin", "0", "ctx", "256", "prefix_cache", cache ? "1" : "0", NULL),
                 &e),
            IE_OK);
        ie_params_t *g = params("max_tokens", "8", "temperature", "0", NULL);
        char *t1 = NULL, *t2 = NULL;
        ie_gen_info_t info;
        ie_engine_metrics_t m1, m2;
        CU_ASSERT_EQUAL(ie_engine_generate(e, long_prompt, g, NULL, NULL, &t1, &info), IE_OK);
        CU_ASSERT(info.n_prompt >= 32); /* two full KV blocks of 16 */
        CU_ASSERT_EQUAL(ie_engine_get_metrics(e, &m1), IE_OK);
        CU_ASSERT_EQUAL(m1.kv_hits, 0);
        CU_ASSERT_EQUAL(ie_engine_generate(e, long_prompt, g, NULL, NULL, &t2, &info), IE_OK);
        CU_ASSERT_EQUAL(ie_engine_get_metrics(e, &m2), IE_OK);
        if (cache) {
            CU_ASSERT(m2.kv_hits >= 16);
        } else {
            CU_ASSERT_EQUAL(m2.kv_hits, 0);
        }
        CU_ASSERT_EQUAL(m2.kv_hits + m2.kv_misses, 2 * info.n_prompt);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t2);
        CU_ASSERT_STRING_EQUAL(t1, t2);
        if (cache) { /* a call cancelled by its callback leaves the cache in place */
            pieces_t pc = {.cancel_after = 1};
            CU_ASSERT_EQUAL(ie_engine_generate(e, long_prompt, g, collect, &pc, NULL, &info), IE_OK);
            CU_ASSERT_STRING_EQUAL(info.finish, "cancelled");
            CU_ASSERT_EQUAL(ie_engine_generate(e, long_prompt, g, NULL, NULL, NULL, &info), IE_OK);
            ie_engine_metrics_t m3;
            CU_ASSERT_EQUAL(ie_engine_get_metrics(e, &m3), IE_OK);
            CU_ASSERT(m3.kv_hits >= 3 * m2.kv_hits); /* the cancelled call and the one after it hit too */
        }
        ie_free(t1);
        ie_free(t2);
        ie_params_destroy(&g);
        ie_engine_destroy(&e);
    }
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("api", suite_init, suite_clean);
    CU_add_test(s, "basics", test_basics);
    CU_add_test(s, "params", test_params);
    CU_add_test(s, "create errors", test_create_errors);
    CU_add_test(s, "generate errors", test_generate_errors);
    CU_add_test(s, "generate and stream", test_generate_stream);
    CU_add_test(s, "logit_bias and ignore_eos", test_generate_bias_ignore_eos);
    CU_add_test(s, "cancel", test_cancel);
    CU_add_test(s, "chat", test_chat);
    CU_add_test(s, "tokenize / detokenize", test_tokenize);
    CU_add_test(s, "metrics", test_metrics);
    CU_add_test(s, "prefix cache across calls", test_prefix_cache_across_calls);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
