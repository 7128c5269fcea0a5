/* test_manifest.c — CUnit suite for apps/convert/manifest.c: parsing
 * (valid manifests, unknown keys, bad regexes, dtypes and groups), first
 * match wins, shape checks with and without a fallback, the pretranspose
 * selection, the default manifests under configs/, the seed README's
 * vocabulary (zero per-tensor, scale per-channel, ...) and ggml block
 * targets (q8_0 ... q4_K, q6_K) with their fallbacks.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ie_kernels.h"
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

/* One rule {"pattern":"^w$", "dtype":D, EXTRA} parsed and decided on a
 * [576 x 64] f32 matrix (576 = 9 x 64 = 18 x 32, not 256-divisible). */
static ie_manifest_t *one_rule(const char *dtype, const char *extra)
{
    char text[512];
    snprintf(text, sizeof text, "{\"version\":1,\"rules\":[{\"pattern\":\"^w$\",\"dtype\":\"%s\"%s%s}]}", dtype,
             extra[0] ? "," : "", extra);
    return parse_ok(text);
}

static void one_rule_bad(const char *dtype, const char *extra, const char *needle)
{
    char text[512];
    snprintf(text, sizeof text, "{\"version\":1,\"rules\":[{\"pattern\":\"^w$\",\"dtype\":\"%s\"%s%s}]}", dtype,
             extra[0] ? "," : "", extra);
    parse_bad(text, needle);
}

static ie_status_t decide_w(const ie_manifest_t *m, ie_pretranspose_t pt, ie_dtype_t src, int64_t n_in,
                            ie_qdecision_t *d)
{
    int64_t ne[4] = {n_in, 64, 1, 1};
    return ie_manifest_decide(m, pt, 0, "w", src, IE_LAYOUT_ROWS, 0, 2, ne, d);
}

/* The seed README's manifest vocabulary, each spelling mapped to a scheme
 * (docs/CONVERT.md), and the spellings that cannot be honoured refused. */
static void test_seed_vocabulary(void)
{
    ie_qdecision_t d;
    /* the seed template itself: int4w, group 64, zero per-tensor, scale per-channel */
    ie_manifest_t *m = parse_ok("{\"version\":1,\"rules\":[{\"pattern\":\"^w$\",\"dtype\":\"int4w\",\"group\":64,"
                                "\"zero\":\"per-tensor\",\"scale\":\"per-channel\"}]}");
    CU_ASSERT_EQUAL(m->rules[0].target, IE_QT_INT4W);
    CU_ASSERT_EQUAL(m->rules[0].group, 64);
    CU_ASSERT_EQUAL(m->rules[0].affine, 0);
    CU_ASSERT_EQUAL(m->rules[0].scale, IE_QSCALE_ABSMAX);
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 576, &d), IE_OK);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_I4W);
    CU_ASSERT_EQUAL(d.group, 64);
    ie_manifest_destroy(&m);

    /* zero: symmetric spellings and zero-point spellings */
    static const struct {
        const char *zero;
        int affine;
    } zs[] = {{"symmetric", 0},  {"none", 0},      {"per-tensor", 0},  {"affine", 1},
              {"asymmetric", 1}, {"per-group", 1}, {"per-channel", 1}, {"per-row", 1}};
    for (size_t i = 0; i < sizeof zs / sizeof zs[0]; i++) {
        char extra[64];
        snprintf(extra, sizeof extra, "\"zero\":\"%s\"", zs[i].zero);
        m = one_rule("int4w", extra);
        CU_ASSERT_EQUAL(m->rules[0].affine, zs[i].affine);
        CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 576, &d), IE_OK);
        CU_ASSERT_EQUAL(d.dtype, zs[i].affine ? IE_DTYPE_I4WA : IE_DTYPE_I4W);
        ie_manifest_destroy(&m);
        if (zs[i].affine) {
            one_rule_bad("int8w", extra, "int8w is symmetric only");
        } else {
            m = one_rule("int8w", extra);
            CU_ASSERT_EQUAL(m->rules[0].affine, 0);
            ie_manifest_destroy(&m);
        }
    }
    one_rule_bad("int4w", "\"zero\":\"per-block\"", "\"zero\" must be \"symmetric\" (or \"none\", \"per-tensor\")");
    one_rule_bad("bf16", "\"zero\":\"per-tensor\"", "\"zero\" applies to int8w/int4w only");

    /* scale granularity: per-channel / per-row = a scale per row, or per
     * group within each row when "group" is given; per-group = "group" */
    m = one_rule("int8w", "\"scale\":\"per-channel\"");
    CU_ASSERT_EQUAL(m->rules[0].group, IE_GROUP_ROW);
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 576, &d), IE_OK);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_I8W);
    CU_ASSERT_EQUAL(d.group, 576);
    ie_manifest_destroy(&m);
    m = one_rule("int4w", "\"scale\":\"per-row\"");
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 576, &d), IE_OK);
    CU_ASSERT_EQUAL(d.group, 576);
    ie_manifest_destroy(&m);
    m = one_rule("int4w", "\"scale\":\"per-channel\",\"group\":96");
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 576, &d), IE_OK);
    CU_ASSERT_EQUAL(d.group, 96);
    ie_manifest_destroy(&m);
    m = one_rule("int4w", "\"scale\":\"per-group\"");
    CU_ASSERT_EQUAL(m->rules[0].group, 32);
    ie_manifest_destroy(&m);
    m = one_rule("int4w", "\"scale\":\"per-group\",\"group\":64,\"method\":\"mse\"");
    CU_ASSERT_EQUAL(m->rules[0].group, 64);
    CU_ASSERT_EQUAL(m->rules[0].scale, IE_QSCALE_MSE);
    ie_manifest_destroy(&m);
    m = one_rule("int8w", "\"scale\":\"per-channel\",\"method\":\"absmax\"");
    CU_ASSERT_EQUAL(m->rules[0].scale, IE_QSCALE_ABSMAX);
    ie_manifest_destroy(&m);
    m = one_rule("int8w", "\"method\":\"mse\"");
    CU_ASSERT_EQUAL(m->rules[0].scale, IE_QSCALE_MSE);
    CU_ASSERT_EQUAL(m->rules[0].group, 32);
    ie_manifest_destroy(&m);
    one_rule_bad("int4w", "\"scale\":\"per-tensor\"", "\"scale\": \"per-tensor\" cannot be honoured");
    one_rule_bad("int4w", "\"scale\":\"per-block\"", "\"scale\" must be \"absmax\", \"mse\", \"per-channel\"");
    one_rule_bad("int4w", "\"scale\":\"mse\",\"method\":\"absmax\"", "\"scale\" already names the method");
    one_rule_bad("int4w", "\"method\":\"minmax\"", "\"method\" must be \"absmax\" or \"mse\"");
    one_rule_bad("f16", "\"method\":\"mse\"", "\"method\" applies to int8w/int4w only");
    one_rule_bad("f16", "\"scale\":\"per-channel\"", "\"scale\" applies to int8w/int4w only");
    /* a per-channel group that does not divide the row is a shape error */
    m = one_rule("int4w", "\"scale\":\"per-channel\",\"group\":128");
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 576, &d), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "group 128 does not divide the row length 576"));
    ie_manifest_destroy(&m);
}

/* ggml block targets: spelling, quantizer probe, layout, lossless copy,
 * row lengths that are not whole blocks, and the fallbacks. */
static void test_ggml_targets(void)
{
    ie_qdecision_t d;
    ie_manifest_t *m = one_rule("q8_0", "");
    CU_ASSERT_EQUAL(m->rules[0].target, IE_QT_GGML);
    CU_ASSERT_EQUAL(m->rules[0].gtype, IE_DTYPE_Q8_0);
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_ALL, IE_DTYPE_F32, 576, &d), IE_OK);
    CU_ASSERT_EQUAL(d.target, IE_QT_GGML);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_Q8_0);
    CU_ASSERT_EQUAL(d.layout, IE_LAYOUT_ROWS); /* q8_0 has no packed form of its own */
    CU_ASSERT_EQUAL(d.group, 0);
    CU_ASSERT_EQUAL(d.lossless, 0);
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_ALL, IE_DTYPE_Q8_0, 576, &d), IE_OK);
    CU_ASSERT_EQUAL(d.lossless, 1);
    /* a row that is not whole blocks: an error naming rule, tensor, block */
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_ALL, IE_DTYPE_F32, 48, &d), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "rule 0 (\"^w$\", q8_0) does not fit tensor w: row length 48 is "
                                                   "not a multiple of q8_0's block of 32"));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "\"auto\""));
    ie_manifest_destroy(&m);
    m = one_rule("Q8_0", "\"fallback\":\"auto\""); /* case-insensitive; auto: no substitute for q8_0 -> f16 */
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_ALL, IE_DTYPE_F32, 48, &d), IE_OK);
    CU_ASSERT_EQUAL(d.fell_back, 1);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_F16);
    ie_manifest_destroy(&m);
    m = one_rule("q4_0", "\"fallback\":\"bf16\"");
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 48, &d), IE_OK);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_BF16);
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_NONE, IE_DTYPE_F32, 64, &d), IE_OK);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_Q4_0);
    CU_ASSERT_EQUAL(d.fell_back, 0);
    ie_manifest_destroy(&m);
    m = one_rule("int4w", "\"group\":128,\"fallback\":\"q8_0\"");
    CU_ASSERT_EQUAL(decide_w(m, IE_PT_ALL, IE_DTYPE_F32, 576, &d), IE_OK);
    CU_ASSERT_EQUAL(d.fell_back, 1);
    CU_ASSERT_EQUAL(d.dtype, IE_DTYPE_Q8_0);
    ie_manifest_destroy(&m);

    one_rule_bad("q9_K", "", "unknown dtype \"q9_K\"");
    one_rule_bad("q8_K", "", "unknown dtype \"q8_K\""); /* activations only */
    one_rule_bad("q8_0", "\"group\":64", "\"group\" applies to int8w/int4w only");
    one_rule_bad("q8_0", "\"zero\":\"affine\"", "\"zero\" applies to int8w/int4w only");
    one_rule_bad("q8_0", "\"scale\":\"mse\"", "\"scale\" applies to int8w/int4w only");
    one_rule_bad("int8w", "\"fallback\":\"auto\"", "\"auto\" applies to ggml dtypes");
    one_rule_bad("q8_0", "\"fallback\":\"q9_0\"", "\"fallback\" must be");

    /* every ggml type: accepted exactly when this build quantizes it */
    static const char *const names[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl",
                                        "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_xs"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"version\":1,\"rules\":[{\"pattern\":\"^w$\",\"dtype\":\"%s\"}]}", names[i]);
        ie_manifest_t *mm = NULL;
        ie_status_t st = ie_manifest_parse(text, strlen(text), "test", &mm);
        static const ie_dtype_t ids[] = {IE_DTYPE_Q8_0, IE_DTYPE_Q4_0,   IE_DTYPE_Q4_1, IE_DTYPE_Q5_0,
                                         IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL, IE_DTYPE_Q2_K, IE_DTYPE_Q3_K,
                                         IE_DTYPE_Q4_K, IE_DTYPE_Q5_K,   IE_DTYPE_Q6_K, IE_DTYPE_IQ4_XS};
        ie_dtype_t t = ids[i];
        float zeros[256] = {0};
        unsigned char out[512];
        int can = ie_quantize_row(t, zeros, out, ie_dtype_block_elems(t)) == 0;
        CU_ASSERT_EQUAL(st == IE_OK, can);
        if (st == IE_OK) {
            CU_ASSERT_EQUAL(mm->rules[0].gtype, t);
        } else {
            CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "this build has no"));
        }
        ie_manifest_destroy(&mm);
    }
    CU_ASSERT_EQUAL(ie_manifest_auto_fallback(IE_DTYPE_Q2_K), IE_DTYPE_Q4_0);
    CU_ASSERT_EQUAL(ie_manifest_auto_fallback(IE_DTYPE_Q3_K), IE_DTYPE_Q4_0);
    CU_ASSERT_EQUAL(ie_manifest_auto_fallback(IE_DTYPE_IQ4_XS), IE_DTYPE_IQ4_NL);
    CU_ASSERT_EQUAL(ie_manifest_auto_fallback(IE_DTYPE_Q4_K), IE_DTYPE_Q5_0);
    CU_ASSERT_EQUAL(ie_manifest_auto_fallback(IE_DTYPE_Q5_K), IE_DTYPE_Q5_1);
    CU_ASSERT_EQUAL(ie_manifest_auto_fallback(IE_DTYPE_Q6_K), IE_DTYPE_Q8_0);
    CU_ASSERT_EQUAL(ie_manifest_auto_fallback(IE_DTYPE_Q5_0), IE_DTYPE_INVALID);
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
    CU_add_test(s, "seed README vocabulary", test_seed_vocabulary);
    CU_add_test(s, "ggml block targets and fallbacks", test_ggml_targets);
    CU_basic_set_mode(CU_BRM_NORMAL);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
