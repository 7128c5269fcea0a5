/* test_embd.c — /v1/embeddings' request parser, normalization and base64
 * (ie_embd.h), on the tiny Llama fixture's tokenizer (512 ids). */
#include "ie_embd.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ie_tokenizer_t *g_tok;

static int suite_init(void)
{
    return ie_tokenizer_load(IE_TEST_DATA "/tiny_llama/tokenizer.json", &g_tok) == IE_OK ? 0 : -1;
}

static int suite_clean(void)
{
    ie_tokenizer_destroy(&g_tok);
    return 0;
}

static ie_status_t parse(const char *body, ie_embd_req_t *r, ie_embd_err_t *e)
{
    return ie_embd_parse(body, strlen(body), g_tok, 512, 8, r, e);
}

/* Every accepted shape of "input", with the fields around it. */
static void test_shapes(void)
{
    ie_embd_req_t r;
    ie_embd_err_t e;
    CU_ASSERT_EQUAL_FATAL(parse("{\"input\": [1, 2, 3]}", &r, &e), IE_OK);
    CU_ASSERT_EQUAL(r.n_in, 1);
    CU_ASSERT_EQUAL(r.n_ids[0], 3);
    CU_ASSERT_EQUAL(r.ids[0][2], 3);
    CU_ASSERT_EQUAL(r.base64, 0);
    CU_ASSERT_PTR_NULL(r.model);
    ie_embd_req_free(&r);
    CU_ASSERT_EQUAL_FATAL(parse("{\"input\": [[1], [4, 5]], \"model\": \"m\", \"encoding_format\": \"base64\", "
                                "\"user\": \"u\", \"dimensions\": null}",
                                &r, &e),
                          IE_OK);
    CU_ASSERT_EQUAL(r.n_in, 2);
    CU_ASSERT_EQUAL(r.n_ids[1], 2);
    CU_ASSERT_EQUAL(r.ids[1][1], 5);
    CU_ASSERT_EQUAL(r.base64, 1);
    CU_ASSERT_STRING_EQUAL(r.model, "m");
    ie_embd_req_free(&r);
    CU_ASSERT_EQUAL_FATAL(parse("{\"input\": [\"hello\", \"a b\"], \"encoding_format\": \"float\"}", &r, &e),
                          IE_OK);
    CU_ASSERT_EQUAL(r.n_in, 2);
    CU_ASSERT(r.n_ids[0] >= 1 && r.n_ids[1] >= 1);
    ie_embd_req_free(&r);
    CU_ASSERT_EQUAL_FATAL(parse("{\"input\": \"hello\"}", &r, &e), IE_OK);
    CU_ASSERT_EQUAL(r.n_in, 1);
    ie_embd_req_free(&r);
    ie_embd_req_free(&r); /* twice: a zeroed one is fine */
}

/* Every refusal names its parameter and leaves nothing to free. */
static void test_refusals(void)
{
    static const struct {
        const char *body, *param, *code;
        unsigned status;
    } k[] = {
        {"", "", "invalid_json", 400},
        {"[1]", "", "invalid_json", 400},
        {"{\"input\": \"a\\u0000b\"}", "", "invalid_value", 400},
        {"{\"input\": \"\xff\"}", "", "invalid_json", 400},
        {"{}", "input", "invalid_value", 400},
        {"{\"input\": null}", "input", "invalid_value", 400},
        {"{\"input\": \"\"}", "input", "invalid_value", 400},
        {"{\"input\": []}", "input", "invalid_value", 400},
        {"{\"input\": [[]]}", "input", "invalid_value", 400},
        {"{\"input\": [[1], []]}", "input", "invalid_value", 400},
        {"{\"input\": [\"a\", 1]}", "input", "invalid_value", 400},
        {"{\"input\": [1, \"a\"]}", "input", "invalid_value", 400},
        {"{\"input\": [[1], \"a\"]}", "input", "invalid_value", 400},
        {"{\"input\": [1, 512]}", "input", "invalid_value", 400},
        {"{\"input\": [1, -1]}", "input", "invalid_value", 400},
        {"{\"input\": [1, 1.5]}", "input", "invalid_value", 400},
        {"{\"input\": [1, 1e300]}", "input", "invalid_value", 400},
        {"{\"input\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", "input", "context_length_exceeded", 400},
        {"{\"input\": 5}", "input", "invalid_value", 400},
        {"{\"input\": {}}", "input", "invalid_value", 400},
        {"{\"input\": \"a\", \"dimensions\": 4}", "dimensions", "invalid_value", 400},
        {"{\"input\": \"a\", \"encoding_format\": \"hex\"}", "encoding_format", "invalid_value", 400},
        {"{\"input\": \"a\", \"encoding_format\": true}", "encoding_format", "invalid_value", 400},
        {"{\"input\": \"a\", \"model\": 1}", "model", "invalid_value", 400},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        ie_embd_req_t r;
        ie_embd_err_t e;
        memset(&e, 0, sizeof e);
        ie_status_t st = parse(k[i].body, &r, &e);
        CU_ASSERT(st == IE_ERR_INVAL || st == IE_ERR_RANGE);
        if (st == IE_OK) {
            fprintf(stderr, "accepted: %s\n", k[i].body);
            ie_embd_req_free(&r);
            continue;
        }
        CU_ASSERT_EQUAL(e.status, k[i].status);
        CU_ASSERT_STRING_EQUAL(e.param, k[i].param);
        CU_ASSERT_STRING_EQUAL(e.code, k[i].code);
        CU_ASSERT_EQUAL(r.n_in, 0);
        CU_ASSERT_PTR_NULL(r.ids);
    }
    /* a text longer than the context (8 tokens here) */
    ie_embd_req_t r;
    ie_embd_err_t e;
    CU_ASSERT_EQUAL(parse("{\"input\": \"one two three four five six seven eight nine ten\"}", &r, &e),
                    IE_ERR_RANGE);
    CU_ASSERT_STRING_EQUAL(e.code, "context_length_exceeded");
    /* more than IE_EMBD_MAX_INPUTS inputs */
    size_t n = IE_EMBD_MAX_INPUTS + 1, len = 16 + n * 4;
    char *big = malloc(len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(big);
    size_t o = (size_t)snprintf(big, len, "{\"input\": [");
    for (size_t i = 0; i < n; i++) o += (size_t)snprintf(big + o, len - o, "%s[1]", i ? "," : "");
    snprintf(big + o, len - o, "]}");
    CU_ASSERT_EQUAL(parse(big, &r, &e), IE_ERR_INVAL);
    CU_ASSERT_STRING_EQUAL(e.param, "input");
    free(big);
}

static void test_pooling_names(void)
{
    CU_ASSERT_EQUAL(ie_pooling_parse("mean"), IE_POOL_MEAN);
    CU_ASSERT_EQUAL(ie_pooling_parse("last"), IE_POOL_LAST);
    CU_ASSERT_EQUAL(ie_pooling_parse("cls"), IE_POOL_CLS);
    CU_ASSERT_EQUAL(ie_pooling_parse("max"), IE_POOL_NONE);
    CU_ASSERT_EQUAL(ie_pooling_parse(NULL), IE_POOL_NONE);
    CU_ASSERT_STRING_EQUAL(ie_pooling_name(IE_POOL_LAST), "last");
    CU_ASSERT_STRING_EQUAL(ie_pooling_name(IE_POOL_NONE), "none");
}

/* L2 and none; base64 of little-endian f32 against hand-made strings. */
static void test_normalize_base64(void)
{
    float v[3] = {3, 0, 4};
    ie_embd_normalize(v, 3, IE_EMBD_NORM_NONE);
    CU_ASSERT_EQUAL(v[0], 3.0f);
    ie_embd_normalize(v, 3, IE_EMBD_NORM_L2);
    CU_ASSERT_DOUBLE_EQUAL(v[0], 0.6, 1e-7);
    CU_ASSERT_DOUBLE_EQUAL(v[2], 0.8, 1e-7);
    float z[2] = {0, 0};
    ie_embd_normalize(z, 2, IE_EMBD_NORM_L2); /* stays zero, no NaN */
    CU_ASSERT(z[0] == 0.0f && z[1] == 0.0f);
    const float one = 1.0f, two[2] = {1.0f, -2.0f};
    char *b = ie_embd_base64(&one, 1); /* 00 00 80 3f */
    CU_ASSERT_STRING_EQUAL(b, "AACAPw==");
    free(b);
    b = ie_embd_base64(two, 2); /* 00 00 80 3f 00 00 00 c0 */
    CU_ASSERT_STRING_EQUAL(b, "AACAPwAAAMA=");
    free(b);
    const float three[3] = {0.5f, 0.25f, 2.0f}; /* 12 bytes: no padding */
    b = ie_embd_base64(three, 3);
    CU_ASSERT_STRING_EQUAL(b, "AAAAPwAAgD4AAABA");
    free(b);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("embd", suite_init, suite_clean);
    CU_add_test(s, "input shapes and fields", test_shapes);
    CU_add_test(s, "refusals", test_refusals);
    CU_add_test(s, "pooling names", test_pooling_names);
    CU_add_test(s, "normalize and base64", test_normalize_base64);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
