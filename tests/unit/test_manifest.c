/* test_manifest.c — CUnit suite for apps/convert/manifest.c: parsing
 * (valid manifests, unknown keys, bad regexes, dtypes and groups), first
 * match wins, shape checks with and without a fallback, the pretranspose
 * selection, and the default manifests under configs/.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ie_manifest.h"

static ie_manifest_t *parse_ok(const char *text)
{
    ie_manifest_t *m = NULL;
    ie_status_t st = ie_manifest_parse(text, strlen(text), "test", &m);
    if (st != IE_OK) fprintf(stderr, "\nunexpected: %s\n", ie_error_last());
    CU_ASSERT_EQUAL_FATAL(st, IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    return m;
}

/* Parsing fails with IE_ERR_FORMAT and the message contains `needle`. */
static void parse_bad(const char *text, const char *needle)
{
    ie_manifest_t *m = (ie_manifest_t *)1;
    ie_status_t st = ie_manifest_parse(text, strlen(text), "test", &m);
    CU_ASSERT_EQUAL(st, IE_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(m);
    if (!strstr(ie_error_last(), needle)) {
        fprintf(stderr, "\nmessage '%s' lacks '%s'\n", ie_error_last(), needle);
        CU_FAIL("error message");
    }
    CU_ASSERT_PTR_NULL(strchr(ie_error_last(), '\n'));
}

static void test_parse_valid(void)
{
    ie_manifest_t *m = parse_ok(
        "{\"version\":1,\"comment\":\"x\",\"rules\":["
        "{\"pattern\":\"^blk\\\\.\\\\d+\\\\.ffn_.*\\\\.weight$\",\"dtype\":\"int4w\",\"group\":64,"
        "\"zero\":\"affine\",\"scale\":\"mse\"},"
        "{\"pattern\":\"attn\",\"dtype\":\"int8w\",\"group\":\"row\"},"
        "{\"pattern\":\"^output\",\"dtype\":\"bsr\",\"block\":[4,8],\"threshold\":0.5},"
        "{\"pattern\":\"x\",\"dtype\":\"mxfp4\"},"
        "{\"pattern\":\"y\",\"dtype\":\"int8w\",\"fallback\":\"keep\",\"comment\":\"c\"},"
        "{\"pattern\":\"z\",\"dtype\":\"bf16\"}],"
        "\"gate\":{\"min_layer_cosine\":0.99,\"max_kl\":0.01,\"max_ppl_increase_pct\":1.5}}");
    CU_ASSERT_EQUAL(m->n_rules, 6);
    CU_ASSERT_EQUAL(m->rules[0].target, IE_QT_INT4W);
    CU_ASSERT_EQUAL(m->rules[0].group, 64);
    CU_ASSERT_EQUAL(m->rules[0].affine, 1);
    CU_ASSERT_EQUAL(m->rules[0].scale, IE_QSCALE_MSE);
    CU_ASSERT_EQUAL(m->rules[1].group, IE_GROUP_ROW);
    CU_ASSERT_EQUAL(m->rules[1].affine, 0);
    CU_ASSERT_EQUAL(m->rules[1].scale, IE_QSCALE_ABSMAX);
    CU_ASSERT_EQUAL(m->rules[2].target, IE_QT_BSR);
    CU_ASSERT_EQUAL(m->rules[2].br, 4);
    CU_ASSERT_EQUAL(m->rules[2].bc, 8);
    CU_ASSERT_DOUBLE_EQUAL(m->rules[2].threshold, 0.5, 1e-9);
    CU_ASSERT_EQUAL(m->rules[3].target, IE_QT_MXFP4);
    CU_ASSERT_EQUAL(m->rules[4].has_fallback, 1);
    CU_ASSERT_EQUAL(m->rules[4].fallback, IE_QT_KEEP);
    CU_ASSERT_EQUAL(m->rules[4].group, 32);
    CU_ASSERT_EQUAL(m->rules[5].target, IE_QT_BF16);
    CU_ASSERT(m->gate.has_min_layer_cosine && m->gate.has_max_kl && m->gate.has_max_ppl_increase_pct);
    CU_ASSERT_DOUBLE_EQUAL(m->gate.min_layer_cosine, 0.99, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(m->gate.max_ppl_increase_pct, 1.5, 1e-12);
    CU_ASSERT_PTR_NOT_NULL(m->json);
    ie_manifest_destroy(&m);
    CU_ASSERT_PTR_NULL(m);
    ie_manifest_destroy(&m); /* NULL is fine */

    m = parse_ok("{\"version\":1,\"rules\":[]}");
    CU_ASSERT_EQUAL(m->n_rules, 0);
    CU_ASSERT(!m->gate.has_min_layer_cosine && !m->gate.has_max_kl && !m->gate.has_max_ppl_increase_pct);
    ie_manifest_destroy(&m);
}

static void test_parse_errors(void)
{
    parse_bad("{\"version\":1,\"rules\":[", "invalid JSON");
    parse_bad("[]", "JSON object");
    parse_bad("{\"rules\":[]}", "\"version\" must be 1");
    parse_bad("{\"version\":2,\"rules\":[]}", "\"version\" must be 1");
    parse_bad("{\"version\":1}", "\"rules\" must be an array");
    /* unknown keys, at every level */
    parse_bad("{\"version\":1,\"rules\":[],\"gates\":{}}", "unknown key \"gates\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\",\"gruop\":32}]}",
              "unknown key \"gruop\" in rule 0");
    parse_bad("{\"version\":1,\"rules\":[],\"gate\":{\"min_cosine\":0.9}}",
              "unknown key \"min_cosine\" in \"gate\"");
    /* regex */
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"blk.(\",\"dtype\":\"int8w\"}]}", "rule 0: bad pattern");
    parse_bad(
        "{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\"},{\"pattern\":\"[\",\"dtype\":\"f16\"}]}",
        "rule 1: bad pattern");
    parse_bad("{\"version\":1,\"rules\":[{\"dtype\":\"int8w\"}]}", "needs a \"pattern\"");
    /* dtype */
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int3w\"}]}", "unknown dtype \"int3w\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\"}]}", "needs a \"dtype\"");
    /* group */
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\",\"group\":48}]}", "bad \"group\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\",\"group\":0}]}", "bad \"group\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\",\"group\":32.5}]}",
              "bad \"group\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\",\"group\":\"col\"}]}",
              "bad \"group\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"bf16\",\"group\":32}]}",
              "int8w/int4w only");
    /* zero / scale / bsr / fallback */
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\",\"zero\":\"affine\"}]}",
              "symmetric only");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int4w\",\"zero\":\"asym\"}]}", "\"zero\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int4w\",\"scale\":\"max\"}]}", "\"scale\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"bsr\",\"block\":[0,4]}]}", "\"block\"");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int8w\",\"threshold\":1}]}", "bsr only");
    parse_bad("{\"version\":1,\"rules\":[{\"pattern\":\"a\",\"dtype\":\"int4w\",\"fallback\":\"int4w\"}]}",
              "\"fallback\"");
    parse_bad("{\"version\":1,\"rules\":[],\"gate\":{\"max_kl\":\"small\"}}", "gate \"max_kl\"");
}

static void test_first_match_wins(void)
{
    ie_manifest_t *m = parse_ok(
        "{\"version\":1,\"rules\":["
        "{\"pattern\":\"^blk\\\\.0\\\\.\",\"dtype\":\"keep\"},"
        "{\"pattern\":\"^blk\\\\.\\\\d+\\\\.ffn_(gate|up)\\\\.weight$\",\"dtype\":\"int4w\"},"
        "{\"pattern\":\"^blk\\\\.\",\"dtype\":\"int8w\"}]}");
    CU_ASSERT_EQUAL(ie_manifest_match(m, "blk.0.ffn_up.weight"), 0);
    CU_ASSERT_EQUAL(ie_manifest_match(m, "blk.1.ffn_up.weight"), 1);
    CU_ASSERT_EQUAL(ie_manifest_match(m, "blk.12.ffn_gate.weight"), 1);
    CU_ASSERT_EQUAL(ie_manifest_match(m, "blk.12.ffn_down.weight"), 2);
    CU_ASSERT_EQUAL(ie_manifest_match(m, "blk.3.attn_q.weight"), 2);
    CU_ASSERT_EQUAL(ie_manifest_match(m, "output.weight"), -1);

    int64_t ne[4] = {576, 1536, 1, 1};
    ie_qdecision_t d;
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "blk.1.ffn_up.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2,
                                       ne, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.rule, 1);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_I4W);
    CU_ASSERT_EQUAL(d.group, 32);
    CU_ASSERT_EQUAL(d.layout, IE_LAYOUT_PANEL16);
    CU_ASSERT_EQUAL(d.lossless, 0);
    /* Q4_0 source -> int4w g32 symmetric: lossless repack */
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "blk.1.ffn_up.weight", IE_DTYPE_Q4_0, IE_LAYOUT_ROWS, 0, 2,
                                       ne, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.lossless, 1);
    /* Q4_1 source -> symmetric int4w is lossy */
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "blk.1.ffn_up.weight", IE_DTYPE_Q4_1, IE_LAYOUT_ROWS, 0, 2,
                                       ne, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.lossless, 0);
    /* rule 0 keeps */
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "blk.0.ffn_up.weight", IE_DTYPE_Q4_1, IE_LAYOUT_ROWS, 0, 2,
                                       ne, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.rule, 0);
    CU_ASSERT_EQUAL(d.target, IE_QT_KEEP);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_Q4_1);
    /* unmatched: kept */
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "output.weight", IE_DTYPE_BF16, IE_LAYOUT_ROWS, 0, 2, ne,
                                       &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.rule, -1);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_BF16);
    /* 1-D tensors are kept even when a rule matches */
    int64_t ne1[4] = {576, 1, 1, 1};
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "blk.3.attn_norm.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0,
                                       1, ne1, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.rule, -1);
    CU_ASSERT_EQUAL(d.target, IE_QT_KEEP);
    ie_manifest_destroy(&m);
}

static void test_group_row_length(void)
{
    ie_manifest_t *m = parse_ok("{\"version\":1,\"rules\":["
                                "{\"pattern\":\"^a$\",\"dtype\":\"int8w\",\"group\":128},"
                                "{\"pattern\":\"^b$\",\"dtype\":\"int4w\",\"group\":128,\"fallback\":\"int8w\"},"
                                "{\"pattern\":\"^c$\",\"dtype\":\"int8w\",\"group\":\"row\"},"
                                "{\"pattern\":\"^d$\",\"dtype\":\"mxfp4\"},"
                                "{\"pattern\":\"^e$\",\"dtype\":\"int4w\",\"group\":128,\"fallback\":\"keep\"},"
                                "{\"pattern\":\"^f$\",\"dtype\":\"bsr\",\"block\":[16,16]}]}");
    int64_t ne[4] = {576, 64, 1, 1}; /* 576 = 4.5 x 128 */
    ie_qdecision_t d;
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "a", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, ne, &d),
                    IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "rule 0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "tensor a"));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "group 128 does not divide the row length 576"));
    /* fallback int8w: one scale per row */
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "b", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, ne, &d), IE_OK);
    CU_ASSERT_EQUAL(d.fell_back, 1);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_I8W);
    CU_ASSERT_EQUAL(d.group, 576);
    CU_ASSERT_EQUAL(d.layout, IE_LAYOUT_ROWS);
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "c", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, ne, &d), IE_OK);
    CU_ASSERT_EQUAL(d.group, 576);
    CU_ASSERT_EQUAL(d.fell_back, 0);
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "e", IE_DTYPE_F16, IE_LAYOUT_ROWS, 0, 2, ne, &d), IE_OK);
    CU_ASSERT_EQUAL(d.target, IE_QT_KEEP);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_F16);
    CU_ASSERT_EQUAL(d.fell_back, 1);
    /* a row length that is no multiple of 32 */
    int64_t odd[4] = {100, 64, 1, 1};
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "c", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, odd, &d),
                    IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "d", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, odd, &d),
                    IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "tensor d"));
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "b", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, odd, &d),
                    IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "fallback"));
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_NONE, 0, "d", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, ne, &d), IE_OK);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_MXFP4);
    /* bsr */
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "f", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, ne, &d), IE_OK);
    CU_ASSERT_EQUAL(d.layout, IE_LAYOUT_BSR);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_F32);
    CU_ASSERT_EQUAL(d.br, 16);
    int64_t ne3[4] = {576, 64, 4, 1};
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "f", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 3, ne3, &d),
                    IE_ERR_FORMAT);
    ie_manifest_destroy(&m);
}

static void test_pretranspose(void)
{
    ie_pretranspose_t p;
    CU_ASSERT_EQUAL(ie_pretranspose_parse("none", &p), IE_OK);
    CU_ASSERT_EQUAL(p, IE_PT_NONE);
    CU_ASSERT_EQUAL(ie_pretranspose_parse("woh", &p), IE_OK);
    CU_ASSERT_EQUAL(p, IE_PT_WOH);
    CU_ASSERT_EQUAL(ie_pretranspose_parse("wxh", &p), IE_OK);
    CU_ASSERT_EQUAL(ie_pretranspose_parse("all", &p), IE_OK);
    CU_ASSERT_EQUAL(p, IE_PT_ALL);
    CU_ASSERT_EQUAL(ie_pretranspose_parse("some", &p), IE_ERR_INVAL);
    CU_ASSERT_STRING_EQUAL(ie_pretranspose_name(IE_PT_WXH), "wxh");

    static const struct {
        const char *name;
        int tied;
        int none, woh, wxh, all;
    } cases[] = {
        {"blk.0.attn_output.weight", 0, 0, 1, 0, 1},   {"output.weight", 0, 0, 1, 0, 1},
        {"token_embd.weight", 0, 0, 0, 0, 0},          {"token_embd.weight", 1, 0, 1, 0, 1},
        {"blk.3.attn_q.weight", 0, 0, 0, 1, 1},        {"blk.3.attn_k.weight", 0, 0, 0, 1, 1},
        {"blk.3.attn_v.weight", 0, 0, 0, 1, 1},        {"blk.11.ffn_gate.weight", 0, 0, 0, 1, 1},
        {"blk.11.ffn_up.weight", 0, 0, 0, 1, 1},       {"blk.11.ffn_down.weight", 0, 0, 0, 1, 1},
        {"blk.0.ffn_gate_exps.weight", 0, 0, 0, 1, 1}, {"blk.0.ffn_gate_inp.weight", 0, 0, 0, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CU_ASSERT_EQUAL(ie_pretranspose_selects(IE_PT_NONE, cases[i].name, cases[i].tied), cases[i].none);
        CU_ASSERT_EQUAL(ie_pretranspose_selects(IE_PT_WOH, cases[i].name, cases[i].tied), cases[i].woh);
        CU_ASSERT_EQUAL(ie_pretranspose_selects(IE_PT_WXH, cases[i].name, cases[i].tied), cases[i].wxh);
        CU_ASSERT_EQUAL(ie_pretranspose_selects(IE_PT_ALL, cases[i].name, cases[i].tied), cases[i].all);
    }
    /* the decision follows the selection; non-int targets stay ROWS */
    ie_manifest_t *m = parse_ok("{\"version\":1,\"rules\":[{\"pattern\":\"attn_q\",\"dtype\":\"int8w\"},"
                                "{\"pattern\":\"attn_output\",\"dtype\":\"bf16\"}]}");
    int64_t ne[4] = {64, 64, 1, 1};
    ie_qdecision_t d;
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_WOH, 0, "blk.0.attn_q.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2,
                                       ne, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.layout, IE_LAYOUT_ROWS);
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_WXH, 0, "blk.0.attn_q.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2,
                                       ne, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.layout, IE_LAYOUT_PANEL16);
    CU_ASSERT_EQUAL(ie_manifest_decide(m, IE_PT_ALL, 0, "blk.0.attn_output.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0,
                                       2, ne, &d),
                    IE_OK);
    CU_ASSERT_EQUAL(d.layout, IE_LAYOUT_ROWS);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_BF16);
    ie_manifest_destroy(&m);
}

/* The shipped default manifests parse. */
static void test_default_configs(void)
{
    static const char *const names[] = {"quant-llama.json", "quant-gpt-oss.json"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/../../configs/%s", IE_TEST_DATA, names[i]);
        ie_manifest_t *m = NULL;
        ie_status_t st = ie_manifest_load(path, &m);
        if (st != IE_OK) fprintf(stderr, "\n%s\n", ie_error_last());
        CU_ASSERT_EQUAL(st, IE_OK);
        CU_ASSERT(m && m->n_rules > 0);
        ie_manifest_destroy(&m);
    }
    ie_manifest_t *m = NULL;
    CU_ASSERT_EQUAL(ie_manifest_load("/nonexistent/manifest.json", &m), IE_ERR_IO);
    CU_ASSERT_PTR_NULL(m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return CU_get_error();
    CU_pSuite s = CU_add_suite("manifest", NULL, NULL);
    CU_add_test(s, "parse valid", test_parse_valid);
    CU_add_test(s, "parse errors", test_parse_errors);
    CU_add_test(s, "first match wins", test_first_match_wins);
    CU_add_test(s, "group vs row length", test_group_row_length);
    CU_add_test(s, "pretranspose", test_pretranspose);
    CU_add_test(s, "default configs", test_default_configs);
    CU_basic_set_mode(CU_BRM_NORMAL);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
