/* test_grammar.c — CUnit suite for coordinator/src/grammar.c: which texts
 * each JSON Schema keyword accepts and rejects (whole values, and prefixes
 * that must stay open), compile errors naming the keyword, end-of-text
 * rules, and the token mask on a toy vocabulary against a brute-force
 * per-token check.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ie_grammar.h"

/* 1 if text is a complete value of schema; 0 if rejected or incomplete. */
static int full(const char *schema, const char *text)
{
    ie_grammar_t *g = NULL;
    ie_gmatch_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_grammar_compile(schema, &g), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(g, &m), IE_OK);
    int ok = ie_gmatch_feed(m, text, strlen(text)) && ie_gmatch_done(m);
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);
    return ok;
}

/* 1 if text is a prefix the matcher keeps (complete or not). */
static int prefix(const char *schema, const char *text)
{
    ie_grammar_t *g = NULL;
    ie_gmatch_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_grammar_compile(schema, &g), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(g, &m), IE_OK);
    int ok = ie_gmatch_feed(m, text, strlen(text));
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);
    return ok;
}

/* The compile error for schema ("" if it compiles). */
static const char *compile_err(const char *schema)
{
    static char msg[512];
    ie_grammar_t *g = NULL;
    ie_status_t st = ie_grammar_compile(schema, &g);
    msg[0] = '\0';
    if (st != IE_OK) {
        CU_ASSERT_EQUAL(st, IE_ERR_INVAL);
        CU_ASSERT_PTR_NULL(g);
        snprintf(msg, sizeof msg, "%s", ie_error_last());
    }
    ie_grammar_destroy(&g);
    return msg;
}

static void test_json_object(void)
{
    CU_ASSERT_TRUE(full("", "{}"));
    CU_ASSERT_TRUE(full("", "{\"a\":[1,2.5e3,\"x\",true,null,{\"b\":{}}]}"));
    CU_ASSERT_TRUE(full("", "{ \"a\" : 1 ,\n  \"b\":false }"));
    CU_ASSERT_FALSE(full("", "[]"));
    CU_ASSERT_FALSE(full("", "\"x\""));
    CU_ASSERT_FALSE(full("", " {}")); /* no leading whitespace */
    CU_ASSERT_FALSE(full("", "{} ")); /* nor trailing */
    CU_ASSERT_FALSE(full("", "{\"a\"}"));
    CU_ASSERT_FALSE(full("", "{\"a\":1,}"));
    CU_ASSERT_FALSE(full("", "{\"a\":01}"));
    CU_ASSERT_FALSE(full("", "{\"a\":tru}"));
    CU_ASSERT_FALSE(full("", "{\"a\":1")); /* incomplete */
    CU_ASSERT_TRUE(prefix("", "{\"a\":1"));
    /* whitespace runs are bounded */
    CU_ASSERT_TRUE(prefix("", "{        "));
    CU_ASSERT_FALSE(prefix("", "{         "));
}

static void test_types(void)
{
    CU_ASSERT_TRUE(full("{\"type\":\"string\"}", "\"h\\u00e9\\n\\\"\""));
    CU_ASSERT_FALSE(full("{\"type\":\"string\"}", "12"));
    CU_ASSERT_TRUE(full("{\"type\":\"number\"}", "-0.5e-12"));
    CU_ASSERT_TRUE(full("{\"type\":\"number\"}", "12"));
    CU_ASSERT_FALSE(full("{\"type\":\"number\"}", "1."));
    CU_ASSERT_FALSE(full("{\"type\":\"number\"}", "-"));
    CU_ASSERT_FALSE(full("{\"type\":\"number\"}", "1e123")); /* exponents: 2 digits */
    CU_ASSERT_TRUE(full("{\"type\":\"integer\"}", "-42"));
    CU_ASSERT_FALSE(full("{\"type\":\"integer\"}", "4.0"));
    CU_ASSERT_FALSE(full("{\"type\":\"integer\"}", "1e3"));
    CU_ASSERT_TRUE(full("{\"type\":\"boolean\"}", "false"));
    CU_ASSERT_FALSE(full("{\"type\":\"boolean\"}", "null"));
    CU_ASSERT_TRUE(full("{\"type\":\"null\"}", "null"));
    CU_ASSERT_TRUE(full("{\"type\":[\"string\",\"null\"]}", "null"));
    CU_ASSERT_TRUE(full("{\"type\":[\"string\",\"null\"]}", "\"x\""));
    CU_ASSERT_FALSE(full("{\"type\":[\"string\",\"null\"]}", "1"));
    CU_ASSERT_TRUE(full("{\"type\":\"array\"}", "[1,\"a\",[]]"));
    CU_ASSERT_TRUE(full("{}", "3"));
    CU_ASSERT_TRUE(full("true", "[null]"));
}

static void test_strings(void)
{
    const char *s = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";
    CU_ASSERT_FALSE(full(s, "\"a\""));
    CU_ASSERT_TRUE(full(s, "\"ab\""));
    CU_ASSERT_TRUE(full(s, "\"\xc3\xa9\xe2\x82\xac\\n\"")); /* 3 code points */
    CU_ASSERT_FALSE(prefix(s, "\"abcd"));
    CU_ASSERT_FALSE(prefix("{\"type\":\"string\"}", "\"a\x01"));    /* raw control */
    CU_ASSERT_FALSE(prefix("{\"type\":\"string\"}", "\"\xc0\xaf")); /* overlong */
    CU_ASSERT_FALSE(prefix("{\"type\":\"string\"}", "\"\xed\xa0")); /* surrogate */
    CU_ASSERT_FALSE(prefix("{\"type\":\"string\"}", "\"\xf5"));
    CU_ASSERT_FALSE(prefix("{\"type\":\"string\"}", "\"\\ud8")); /* escaped surrogate */
    CU_ASSERT_FALSE(prefix("{\"type\":\"string\"}", "\"\\x"));
    CU_ASSERT_TRUE(full("{\"type\":\"string\"}", "\"\xf0\x9f\x98\x80\""));
}

static void test_objects(void)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
                    "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"],\"additionalProperties\":false}";
    CU_ASSERT_TRUE(full(s, "{\"b\":\"x\"}"));
    CU_ASSERT_TRUE(full(s, "{\"a\":1,\"b\":\"x\",\"c\":true}"));
    CU_ASSERT_TRUE(full(s, "{\"b\":\"x\",\"c\":false}"));
    CU_ASSERT_FALSE(full(s, "{}")); /* b required */
    CU_ASSERT_FALSE(full(s, "{\"a\":1}"));
    CU_ASSERT_FALSE(full(s, "{\"b\":\"x\",\"a\":1}")); /* schema order */
    CU_ASSERT_FALSE(full(s, "{\"b\":\"x\",\"d\":1}")); /* no extra keys */
    CU_ASSERT_FALSE(full(s, "{\"b\":\"x\",\"b\":\"y\"}"));
    CU_ASSERT_FALSE(prefix(s, "{\"c\"")); /* c cannot come before b */
    /* free keys: additionalProperties as a schema */
    const char *f = "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}";
    CU_ASSERT_TRUE(full(f, "{\"x\":1,\"y\":2}"));
    CU_ASSERT_FALSE(full(f, "{\"x\":\"1\"}"));
    CU_ASSERT_TRUE(full("{\"type\":\"object\",\"additionalProperties\":false}", "{}"));
    CU_ASSERT_FALSE(prefix("{\"type\":\"object\",\"additionalProperties\":false}", "{\""));
    /* a key that needs escaping */
    CU_ASSERT_TRUE(full("{\"properties\":{\"a\\\"b\":{\"const\":1}},\"required\":[\"a\\\"b\"]}", "{\"a\\\"b\":1}"));
}

static void test_arrays(void)
{
    const char *s = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}";
    CU_ASSERT_FALSE(full(s, "[]"));
    CU_ASSERT_TRUE(full(s, "[1]"));
    CU_ASSERT_TRUE(full(s, "[1, 2,3]"));
    CU_ASSERT_FALSE(prefix(s, "[1,2,3,"));
    CU_ASSERT_FALSE(full(s, "[1,\"a\"]"));
    const char *p = "{\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"boolean\"}],\"items\":false}";
    CU_ASSERT_TRUE(full(p, "[\"a\",true]"));
    CU_ASSERT_TRUE(full(p, "[\"a\"]"));
    CU_ASSERT_FALSE(full(p, "[true]"));
    CU_ASSERT_FALSE(full(p, "[\"a\",true,1]"));
}

static void test_enum_const_anyof(void)
{
    const char *e = "{\"enum\":[\"red\",\"green\",1,null,{\"k\":[1]}]}";
    CU_ASSERT_TRUE(full(e, "\"red\""));
    CU_ASSERT_TRUE(full(e, "\"green\""));
    CU_ASSERT_TRUE(full(e, "1"));
    CU_ASSERT_TRUE(full(e, "null"));
    CU_ASSERT_TRUE(full(e, "{\"k\":[1]}"));
    CU_ASSERT_FALSE(full(e, "\"re\""));
    CU_ASSERT_FALSE(full(e, "\"blue\""));
    CU_ASSERT_FALSE(full(e, "12"));
    CU_ASSERT_TRUE(full("{\"type\":\"string\",\"enum\":[\"a\",1]}", "\"a\""));
    CU_ASSERT_FALSE(full("{\"type\":\"string\",\"enum\":[\"a\",1]}", "1")); /* not a string */
    CU_ASSERT_TRUE(full("{\"const\":\"x\"}", "\"x\""));
    CU_ASSERT_FALSE(full("{\"const\":\"x\"}", "\"y\""));
    const char *a =
        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
        "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]},"
        "{\"type\":\"integer\"}]}";
    CU_ASSERT_TRUE(full(a, "{\"a\":1}"));
    CU_ASSERT_TRUE(full(a, "{\"b\":\"s\"}"));
    CU_ASSERT_TRUE(full(a, "7"));
    CU_ASSERT_FALSE(full(a, "{\"a\":\"s\"}"));
    CU_ASSERT_FALSE(full(a, "{}"));
    CU_ASSERT_TRUE(full("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", "null"));
}

static void test_ref_and_ints(void)
{
    const char *r = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
                    "\"$ref\":\"#/$defs/node\"}";
    CU_ASSERT_TRUE(full(r, "{\"v\":1}"));
    CU_ASSERT_TRUE(full(r, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}"));
    CU_ASSERT_FALSE(full(r, "{\"v\":1,\"kids\":[{}]}"));
    CU_ASSERT_TRUE(full("{\"definitions\":{\"x\":{\"type\":\"null\"}},\"items\":{\"$ref\":\"#/definitions/x\"}}",
                        "[null,null]"));
    const char *i = "{\"type\":\"integer\",\"minimum\":10,\"maximum\":250}";
    CU_ASSERT_TRUE(full(i, "10"));
    CU_ASSERT_TRUE(full(i, "250"));
    CU_ASSERT_FALSE(full(i, "9"));
    CU_ASSERT_TRUE(prefix(i, "9")); /* 90..99 */
    CU_ASSERT_FALSE(full(i, "251"));
    CU_ASSERT_FALSE(prefix(i, "260"));
    CU_ASSERT_TRUE(full(i, "26"));
    CU_ASSERT_FALSE(prefix(i, "0"));
    CU_ASSERT_FALSE(prefix(i, "-"));
    const char *n = "{\"type\":\"integer\",\"exclusiveMinimum\":-5,\"exclusiveMaximum\":0}";
    CU_ASSERT_TRUE(full(n, "-4"));
    CU_ASSERT_TRUE(full(n, "-1"));
    CU_ASSERT_FALSE(full(n, "-5"));
    CU_ASSERT_FALSE(prefix(n, "0"));
    CU_ASSERT_FALSE(prefix(n, "-0"));
    /* in a container the number ends at the comma / bracket */
    const char *arr = "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":5}}";
    CU_ASSERT_TRUE(full(arr, "[5,17]"));
    CU_ASSERT_FALSE(full(arr, "[4]"));
    CU_ASSERT_TRUE(prefix(arr, "[4"));
}

/* Nesting limit: optional deeper members are not offered where they
 * would not fit, required ones make the schema fail to compile. */
static void test_depth(void)
{
    char text[256];
    const char *r = "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"$ref\":\"#\"},{\"properties\":{\"a\":"
                    "{\"$ref\":\"#\"}}}]}}";
    /* depth 47 of arrays, then an object: its key "a" would need one more level */
    size_t n = 0;
    for (int i = 0; i < IE_GRAMMAR_MAX_DEPTH - 1; i++) text[n++] = '[';
    text[n] = '\0';
    CU_ASSERT_TRUE(prefix(r, text));
    strcpy(text + n, "{}");
    CU_ASSERT_TRUE(prefix(r, text));
    strcpy(text + n, "{\"");
    CU_ASSERT_FALSE(prefix(r, text));
    strcpy(text + n, "[]"); /* an empty array fits at the last level */
    CU_ASSERT_TRUE(prefix(r, text));
    strcpy(text + n, "[[");
    CU_ASSERT_FALSE(prefix(r, text));
    /* an instance needs 60 levels: refused at compile time */
    char deep[4096] = "";
    for (int i = 0; i < 60; i++) strcat(deep, "{\"type\":\"array\",\"minItems\":1,\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 60; i++) strcat(deep, "}");
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err(deep), "deeper"));
}

static void test_compile_errors(void)
{
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"type\":\"string\",\"pattern\":\"a+\"}"), "'pattern'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"type\":\"string\",\"format\":\"date\"}"), "'format'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"if\":{},\"then\":{}}"), "'if'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"not\":{}}"), "'not'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"allOf\":[{}]}"), "'allOf'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"type\":\"number\",\"minimum\":0}"), "'minimum'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"$ref\":\"#/$defs/nope\"}"), "$ref"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"$ref\":\"#\",\"type\":\"object\"}"), "'type'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"type\":\"strin\"}"), "'type'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"required\":[\"x\"],\"properties\":{}}"), "'required'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"enum\":[]}"), "'enum'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"minItems\":-1}"), "'minItems'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"type\":\"string\",\"enum\":[1]}"), "no finite"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}"), "no finite"));
    /* an object that must contain itself has no finite instance */
    CU_ASSERT_PTR_NOT_NULL(
        strstr(compile_err("{\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}"), "no finite"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("{\"$ref\":\"#\"}"), "no finite"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("not json"), "JSON"));
    CU_ASSERT_PTR_NOT_NULL(strstr(compile_err("[1]"), "schema"));
    CU_ASSERT_STRING_EQUAL(compile_err("{\"title\":\"t\",\"description\":\"d\",\"type\":\"null\"}"), "");
}

/* ---- the token mask on a toy vocabulary */

static const char *const toy[] = {"{",    "}",  "\"", "a",   "\"a\"", ":",  "1",    "12",    ",",   " ",
                                  "true", "tr", "ue", "\":", "{\"",   "x",  "\xc3", "\xa9",  "\"}", "<eos>",
                                  "<sp>", "0",  "-",  "[",   "]",     "nu", "ll",   "\"a\":"};
#define N_TOY ((int32_t)(sizeof toy / sizeof *toy))

static ie_gvocab_t *toy_vocab(void)
{
    size_t lens[N_TOY];
    uint8_t kind[N_TOY];
    for (int32_t i = 0; i < N_TOY; i++) {
        lens[i] = strlen(toy[i]);
        kind[i] = !strcmp(toy[i], "<eos>") ? 2 : !strcmp(toy[i], "<sp>") ? 1 : 0;
    }
    ie_gvocab_t *v = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_gvocab_new(N_TOY, toy, lens, kind, &v), IE_OK);
    return v;
}

/* Walks a schema through a token sequence; at every step the mask must
 * equal the brute-force answer (replay the history, then the token). */
static void walk(const char *schema, const int32_t *seq, size_t n_seq, ie_gvocab_t *v)
{
    ie_grammar_t *g = NULL;
    ie_gmatch_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_grammar_compile(schema, &g), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(g, &m), IE_OK);
    for (size_t s = 0; s <= n_seq; s++) {
        uint8_t allow[N_TOY];
        int32_t n_allow = ie_gvocab_mask(v, m, allow), want = 0;
        for (int32_t i = 0; i < N_TOY; i++) {
            int ok;
            if (!strcmp(toy[i], "<eos>")) {
                ok = ie_gmatch_done(m);
            } else if (!strcmp(toy[i], "<sp>")) {
                ok = 0;
            } else {
                ie_gmatch_t *c = NULL;
                CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(g, &c), IE_OK);
                for (size_t h = 0; h < s; h++) CU_ASSERT_FATAL(ie_gmatch_feed(c, toy[seq[h]], strlen(toy[seq[h]])));
                ok = ie_gmatch_feed(c, toy[i], strlen(toy[i]));
                ie_gmatch_destroy(&c);
            }
            CU_ASSERT_EQUAL(allow[i], ok);
            want += ok;
        }
        CU_ASSERT_EQUAL(n_allow, want);
        if (s < n_seq) {
            CU_ASSERT_TRUE(allow[seq[s]]);
            CU_ASSERT_EQUAL_FATAL(ie_gvocab_accept(v, m, seq[s]), IE_OK);
        }
    }
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);
}

static int32_t tid(const char *t)
{
    for (int32_t i = 0; i < N_TOY; i++)
        if (!strcmp(toy[i], t)) return i;
    return -1;
}

static void test_mask(void)
{
    ie_gvocab_t *v = toy_vocab();
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
    const int32_t seq[] = {tid("{\""), tid("a"), tid("\":"), tid(" "), tid("12"), tid("}")};
    walk(s, seq, sizeof seq / sizeof *seq, v);
    const int32_t seq2[] = {tid("{"),      tid("\"a\":"), tid("1"),  tid(","),
                            tid("\"a\":"), tid("tr"),     tid("ue"), tid("}")};
    walk("", seq2, sizeof seq2 / sizeof *seq2, v);
    const int32_t seq3[] = {tid("["),    tid("nu"),   tid("ll"), tid(","), tid("\""),
                            tid("\xc3"), tid("\xa9"), tid("\""), tid("]")};
    walk("{\"type\":\"array\",\"items\":{\"type\":[\"null\",\"string\"]}}", seq3, sizeof seq3 / sizeof *seq3, v);

    /* EOS only once the value is complete, and then nothing else */
    ie_grammar_t *g = NULL;
    ie_gmatch_t *m = NULL;
    uint8_t allow[N_TOY];
    CU_ASSERT_EQUAL_FATAL(ie_grammar_compile("", &g), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(g, &m), IE_OK);
    ie_gvocab_mask(v, m, allow);
    CU_ASSERT_FALSE(allow[tid("<eos>")]);
    CU_ASSERT_FALSE(allow[tid("<sp>")]);
    CU_ASSERT_TRUE(allow[tid("{")]);
    CU_ASSERT_TRUE(allow[tid("{\"")]);
    CU_ASSERT_FALSE(allow[tid(" ")]);
    CU_ASSERT_NOT_EQUAL(ie_gvocab_accept(v, m, tid("<eos>")), IE_OK);
    CU_ASSERT_EQUAL(ie_gvocab_accept(v, m, tid("{")), IE_OK);
    CU_ASSERT_EQUAL(ie_gvocab_accept(v, m, tid("}")), IE_OK);
    CU_ASSERT_EQUAL(ie_gvocab_mask(v, m, allow), 1);
    CU_ASSERT_TRUE(allow[tid("<eos>")]);
    float logits[N_TOY];
    for (int32_t i = 0; i < N_TOY; i++) logits[i] = 1.0f;
    CU_ASSERT_EQUAL(ie_gvocab_apply(v, m, logits), IE_OK);
    for (int32_t i = 0; i < N_TOY; i++) CU_ASSERT_EQUAL(isinf(logits[i]) != 0, i != tid("<eos>"));
    CU_ASSERT_EQUAL(ie_gvocab_accept(v, m, tid("<eos>")), IE_OK);
    CU_ASSERT_NOT_EQUAL(ie_gvocab_accept(v, m, tid("}")), IE_OK);
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);

    /* a top-level number: EOS and more digits both allowed */
    CU_ASSERT_EQUAL_FATAL(ie_grammar_compile("{\"type\":\"integer\"}", &g), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(g, &m), IE_OK);
    CU_ASSERT_EQUAL(ie_gvocab_accept(v, m, tid("1")), IE_OK);
    ie_gvocab_mask(v, m, allow);
    CU_ASSERT_TRUE(allow[tid("<eos>")]);
    CU_ASSERT_TRUE(allow[tid("12")]);
    CU_ASSERT_FALSE(allow[tid(",")]);
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);
    ie_gvocab_destroy(&v);
    ie_gvocab_destroy(&v); /* NULL-safe */
}

/* 1 if text is a complete choice (done == 1) or a kept prefix (done == 0). */
static int choice_fed(const char *const *ch, size_t n, const char *text, int done)
{
    ie_grammar_t *g = NULL;
    ie_gmatch_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_grammar_compile_choice(ch, n, &g), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gmatch_new(g, &m), IE_OK);
    int ok = ie_gmatch_feed(m, text, strlen(text)) && (!done || ie_gmatch_done(m));
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);
    return ok;
}

/* guided_choice: exactly the raw strings, any bytes, one a prefix of another. */
static void test_choice(void)
{
    const char *ch[] = {"positive", "negative", "neg", "\"q\" {x}", "caf\xc3\xa9"};
    for (int i = 0; i < 5; i++) CU_ASSERT_TRUE(choice_fed(ch, 5, ch[i], 1));
    CU_ASSERT_TRUE(choice_fed(ch, 5, "nega", 0));
    CU_ASSERT_FALSE(choice_fed(ch, 5, "nega", 1));
    CU_ASSERT_FALSE(choice_fed(ch, 5, "negatives", 0));
    CU_ASSERT_FALSE(choice_fed(ch, 5, "Positive", 0));
    CU_ASSERT_FALSE(choice_fed(ch, 5, " positive", 0));
    CU_ASSERT_FALSE(choice_fed(ch, 5, "\"positive\"", 0)); /* raw text, not a JSON string */
    CU_ASSERT_FALSE(choice_fed(ch, 5, "", 1));
    ie_grammar_t *g = NULL;
    const char *many[IE_GRAMMAR_MAX_ALTS + 1], *empty[] = {"a", ""};
    for (int i = 0; i <= IE_GRAMMAR_MAX_ALTS; i++) many[i] = "x";
    CU_ASSERT_EQUAL(ie_grammar_compile_choice(many, IE_GRAMMAR_MAX_ALTS, &g), IE_OK);
    ie_grammar_destroy(&g);
    CU_ASSERT_EQUAL(ie_grammar_compile_choice(many, IE_GRAMMAR_MAX_ALTS + 1, &g), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(g);
    CU_ASSERT_EQUAL(ie_grammar_compile_choice(empty, 2, &g), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_grammar_compile_choice(many, 0, &g), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_grammar_compile_choice(NULL, 1, &g), IE_ERR_INVAL);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("grammar", NULL, NULL);
    CU_add_test(s, "json_object", test_json_object);
    CU_add_test(s, "types", test_types);
    CU_add_test(s, "strings", test_strings);
    CU_add_test(s, "objects", test_objects);
    CU_add_test(s, "arrays", test_arrays);
    CU_add_test(s, "enum_const_anyof", test_enum_const_anyof);
    CU_add_test(s, "ref_and_ints", test_ref_and_ints);
    CU_add_test(s, "depth", test_depth);
    CU_add_test(s, "compile_errors", test_compile_errors);
    CU_add_test(s, "mask", test_mask);
    CU_add_test(s, "choice", test_choice);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
