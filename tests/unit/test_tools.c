/* test_tools.c — CUnit suite for coordinator/chat/tools.c (ie_tools.h).
 *
 * - parsers on strings, per format: one and several calls, nested JSON and
 *   braces inside strings in the arguments, text around the calls, junk,
 *   truncated calls (all or nothing: no calls, the whole text as content);
 * - the streaming hold-back (ie_tool_safe_len) never lets a call's start out;
 * - format detection on the published templates of tests/data/templates;
 * - request checks: tools lists (missing name, bad parameters, duplicates),
 *   the forced-call schema, and the message rewrite (developer, content
 *   null, arguments string -> object);
 * - rendering with tools: 10 tool-capable templates x the cases of
 *   tools_expected.json (tests/reference/gen_tool_templates.py, transformers'
 *   render_jinja_template(tools=...)), byte for byte, after the same
 *   message rewrite.
 */
#include "ie_chat.h"
#include "ie_jinja.h"
#include "ie_tools.h"

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef IE_TEST_DATA
#define IE_TEST_DATA "tests/data"
#endif
#define TDIR IE_TEST_DATA "/templates"
#define NOW 1768478400 /* the generator's pinned clock, UTC */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

/* arguments equal as JSON values (key order kept by cJSON's printer) */
static int json_eq(const char *a, const char *b)
{
    cJSON *x = cJSON_Parse(a), *y = cJSON_Parse(b);
    int eq = x && y && cJSON_Compare(x, y, 1);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return eq;
}

static ie_tool_calls_t parse(ie_tool_format_t f, const char *text)
{
    ie_tool_calls_t c;
    CU_ASSERT_EQUAL_FATAL(ie_tool_parse(f, text, strlen(text), &c), IE_OK);
    return c;
}

/* text is not calls: none, and the content is the text unchanged */
static void check_plain(ie_tool_format_t f, const char *text)
{
    ie_tool_calls_t c = parse(f, text);
    CU_ASSERT_EQUAL(c.n, 0);
    if (c.n) printf("\n  %s: '%s' parsed as %zu calls", ie_tool_format_name(f), text, c.n);
    CU_ASSERT(text[0] ? c.content && strcmp(c.content, text) == 0 : c.content == NULL);
    ie_tool_calls_free(&c);
}

static void check_call(const ie_tool_calls_t *c, size_t i, const char *name, const char *args)
{
    CU_ASSERT_FATAL(i < c->n);
    CU_ASSERT_STRING_EQUAL(c->calls[i].name, name);
    CU_ASSERT(json_eq(c->calls[i].arguments, args));
    if (!json_eq(c->calls[i].arguments, args)) printf("\n  args '%s' != '%s'", c->calls[i].arguments, args);
}

static void test_hermes(void)
{
    ie_tool_calls_t c = parse(IE_TOOL_FMT_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                                  "{\"city\": \"Paris\"}}\n</tool_call>");
    CU_ASSERT_EQUAL(c.n, 1);
    check_call(&c, 0, "get_weather", "{\"city\":\"Paris\"}");
    CU_ASSERT_PTR_NULL(c.content);
    ie_tool_calls_free(&c);
    /* several, text before, nested arguments with braces and tags in strings */
    c = parse(IE_TOOL_FMT_HERMES,
              "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": \"}{ </tool_call> \\\"x\", "
              "\"o\": {\"l\": [1, {\"d\": null}]}}}\n</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": "
              "{}}</tool_call>");
    CU_ASSERT_EQUAL(c.n, 0); /* a </tool_call> inside a string ends the block early: not calls */
    ie_tool_calls_free(&c);
    c = parse(IE_TOOL_FMT_HERMES,
              "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": \"}{ \\\"x\", "
              "\"o\": {\"l\": [1, {\"d\": null}]}}}\n</tool_call>\n<tool_call>{\"name\": \"b\", "
              "\"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>\n");
    CU_ASSERT_EQUAL(c.n, 2);
    check_call(&c, 0, "a", "{\"q\": \"}{ \\\"x\", \"o\": {\"l\": [1, {\"d\": null}]}}");
    check_call(&c, 1, "b", "{\"k\": 2}"); /* arguments as a JSON string: taken as the JSON */
    CU_ASSERT(c.content && strcmp(c.content, "Let me look.") == 0);
    ie_tool_calls_free(&c);
    /* the closing tag missing on the last call (stopped at end of turn) */
    c = parse(IE_TOOL_FMT_HERMES, "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"n\": 1}}\n");
    CU_ASSERT_EQUAL(c.n, 1);
    ie_tool_calls_free(&c);
    /* "parameters" as some fine-tunes write it; missing arguments = {} */
    c = parse(IE_TOOL_FMT_HERMES, "<tool_call>{\"name\": \"x\", \"parameters\": {\"n\": 1}}</tool_call>"
                                  "<tool_call>{\"name\": \"y\"}</tool_call>");
    CU_ASSERT_EQUAL(c.n, 2);
    check_call(&c, 0, "x", "{\"n\": 1}");
    check_call(&c, 1, "y", "{}");
    ie_tool_calls_free(&c);
    /* not calls */
    check_plain(IE_TOOL_FMT_HERMES, "Just an answer.");
    check_plain(IE_TOOL_FMT_HERMES, "");
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>\n{\"name\": \"x\", \"argum");     /* truncated */
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>{\"arguments\": {}}</tool_call>"); /* no name */
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>{\"name\": 3}</tool_call>");       /* bad name */
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call>");
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>{\"name\": \"x\"} trailing</tool_call>"); /* junk */
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>not json at all</tool_call>");
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>{\"name\": \"x\", \"arguments\": \"nope\"}</tool_call>");
    /* one good call and one bad: all or nothing */
    check_plain(IE_TOOL_FMT_HERMES, "<tool_call>{\"name\": \"x\"}</tool_call><tool_call>{oops</tool_call>");
}

static void test_llama3(void)
{
    ie_tool_calls_t c = parse(IE_TOOL_FMT_LLAMA3,
                              "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
    CU_ASSERT_EQUAL(c.n, 1);
    check_call(&c, 0, "get_weather", "{\"city\": \"Oslo\"}");
    CU_ASSERT_PTR_NULL(c.content);
    ie_tool_calls_free(&c);
    c = parse(IE_TOOL_FMT_LLAMA3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": {\"y\": [1,2]}}}; "
                                  "{\"name\": \"b\", \"arguments\": {}}");
    CU_ASSERT_EQUAL(c.n, 2);
    check_call(&c, 0, "a", "{\"x\": {\"y\": [1,2]}}");
    check_call(&c, 1, "b", "{}");
    ie_tool_calls_free(&c);
    c = parse(IE_TOOL_FMT_LLAMA3, "Calling it.<|python_tag|>{\"name\": \"a\", \"parameters\": {}}");
    CU_ASSERT_EQUAL(c.n, 1);
    CU_ASSERT(c.content && !strcmp(c.content, "Calling it."));
    ie_tool_calls_free(&c);
    check_plain(IE_TOOL_FMT_LLAMA3, "The answer is {\"name\": \"a\"}"); /* JSON not at the start */
    check_plain(IE_TOOL_FMT_LLAMA3, "{\"name\": \"a\", \"parameters\": {\"x\": 1}");
    check_plain(IE_TOOL_FMT_LLAMA3, "{\"city\": \"Oslo\"}");                           /* no name */
    check_plain(IE_TOOL_FMT_LLAMA3, "{\"name\": \"a\", \"parameters\": {}} and more"); /* junk after */
    check_plain(IE_TOOL_FMT_LLAMA3, "{\"name\": \"a\", \"parameters\": {}}; ");        /* dangling ';' */
}

static void test_mistral(void)
{
    ie_tool_calls_t c = parse(IE_TOOL_FMT_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"k\": \"v\"}, "
                                                   "\"id\": \"abc123xyz\"}, {\"name\": \"b\", \"arguments\": {}}]");
    CU_ASSERT_EQUAL(c.n, 2);
    check_call(&c, 0, "a", "{\"k\": \"v\"}");
    check_call(&c, 1, "b", "{}");
    ie_tool_calls_free(&c);
    /* the marker is a control token, absent from decoded text */
    c = parse(IE_TOOL_FMT_MISTRAL, " [{\"name\": \"a\", \"arguments\": {\"n\": [1, {\"m\": 2}]}}]");
    CU_ASSERT_EQUAL(c.n, 1);
    check_call(&c, 0, "a", "{\"n\": [1, {\"m\": 2}]}");
    ie_tool_calls_free(&c);
    /* v11: name[ARGS]{...}, repeated */
    c = parse(IE_TOOL_FMT_MISTRAL, "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]b[ARGS]{}");
    CU_ASSERT_EQUAL(c.n, 2);
    check_call(&c, 0, "get_weather", "{\"city\": \"Rome\"}");
    check_call(&c, 1, "b", "{}");
    CU_ASSERT(c.content && !strcmp(c.content, "Sure."));
    ie_tool_calls_free(&c);
    check_plain(IE_TOOL_FMT_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\", \"argu");
    check_plain(IE_TOOL_FMT_MISTRAL, "[TOOL_CALLS][]");
    check_plain(IE_TOOL_FMT_MISTRAL, "[1, 2, 3]");
    check_plain(IE_TOOL_FMT_MISTRAL, "[TOOL_CALLS]x[ARGS]{\"a\": ");
    check_plain(IE_TOOL_FMT_MISTRAL, "No calls here.");
}

static void test_harmony(void)
{
    ie_tool_calls_t c = parse(IE_TOOL_FMT_HARMONY,
                              "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
                              "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": "
                              "\"Paris\"}<|call|>");
    CU_ASSERT_EQUAL(c.n, 1);
    check_call(&c, 0, "get_weather", "{\"city\": \"Paris\"}");
    CU_ASSERT_PTR_NULL(c.content); /* analysis is not content */
    ie_tool_calls_free(&c);
    /* recipient before the channel (also produced by gpt-oss) */
    c = parse(IE_TOOL_FMT_HARMONY, " to=functions.lookup<|channel|>commentary json<|message|>{\"q\": {\"a\": "
                                   "[1]}}<|call|>");
    CU_ASSERT_EQUAL(c.n, 1);
    check_call(&c, 0, "lookup", "{\"q\": {\"a\": [1]}}");
    ie_tool_calls_free(&c);
    check_plain(IE_TOOL_FMT_HARMONY, "<|channel|>final<|message|>Hello.<|return|>");
    check_plain(IE_TOOL_FMT_HARMONY, "<|channel|>commentary to=functions.x <|message|>{\"a\": <|call|>");
    check_plain(IE_TOOL_FMT_HARMONY, "<|channel|>commentary to=functions. <|message|>{}<|call|>");
}

static void test_json(void)
{
    ie_tool_calls_t c = parse(IE_TOOL_FMT_JSON, " {\"name\": \"f\", \"arguments\": {\"a\": {\"b\": \"}\"}}} \n");
    CU_ASSERT_EQUAL(c.n, 1);
    check_call(&c, 0, "f", "{\"a\": {\"b\": \"}\"}}");
    ie_tool_calls_free(&c);
    check_plain(IE_TOOL_FMT_JSON, "{\"name\": \"f\", \"arguments\": {\"a\": 1}");
    check_plain(IE_TOOL_FMT_JSON, "{\"arguments\": {}}");
    check_plain(IE_TOOL_FMT_JSON, "I will call f.");
    /* NUL bytes are not calls (and must not cut the text) */
    ie_tool_calls_t z;
    CU_ASSERT_EQUAL(ie_tool_parse(IE_TOOL_FMT_JSON, "{\"name\":\"f\"}\0x", 15, &z), IE_OK);
    CU_ASSERT_EQUAL(z.n, 0);
    ie_tool_calls_free(&z);
    CU_ASSERT_EQUAL(ie_tool_parse(IE_TOOL_FMT_NONE, "x", 1, &z), IE_ERR_INVAL);
}

/* Every prefix of a call's text: what may be sent never reaches into the
 * call, and the whole text's calls come back once it is complete. */
static void test_safe_len(void)
{
    static const struct {
        ie_tool_format_t f;
        const char *text;
        size_t call_at;
    } cases[] = {
        {IE_TOOL_FMT_HERMES, "Hi there. <tool_call>{\"name\": \"a\"}</tool_call>", 10},
        {IE_TOOL_FMT_LLAMA3, "{\"name\": \"a\", \"parameters\": {}}", 0},
        {IE_TOOL_FMT_LLAMA3, "ok<|python_tag|>{\"name\": \"a\"}", 2},
        {IE_TOOL_FMT_MISTRAL, "[{\"name\": \"a\"}]", 0},
        {IE_TOOL_FMT_MISTRAL, "so[TOOL_CALLS][{\"name\": \"a\"}]", 2},
        {IE_TOOL_FMT_JSON, "{\"name\": \"a\"}", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t n = strlen(cases[k].text);
        for (size_t i = 0; i <= n; i++) {
            size_t s = ie_tool_safe_len(cases[k].f, cases[k].text, i);
            CU_ASSERT(s <= i && s <= cases[k].call_at);
        }
        /* the plain prefix streams as soon as it can no longer be a marker */
        if (cases[k].call_at > 2) CU_ASSERT_EQUAL(ie_tool_safe_len(cases[k].f, cases[k].text, 5), 5);
    }
    CU_ASSERT_EQUAL(ie_tool_safe_len(IE_TOOL_FMT_HERMES, "abc <tool", 9), 4);
    CU_ASSERT_EQUAL(ie_tool_safe_len(IE_TOOL_FMT_HERMES, "abc <b>", 7), 7);
    CU_ASSERT_EQUAL(ie_tool_safe_len(IE_TOOL_FMT_LLAMA3, "Paris is", 8), 8);
}

static void test_detect(void)
{
    static const struct {
        const char *file;
        ie_tool_format_t f;
    } cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", IE_TOOL_FMT_HERMES},
        {"Qwen-Qwen3-0.6B.jinja", IE_TOOL_FMT_HERMES},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", IE_TOOL_FMT_HERMES},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", IE_TOOL_FMT_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", IE_TOOL_FMT_LLAMA3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", IE_TOOL_FMT_MISTRAL},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", IE_TOOL_FMT_MISTRAL},
        {"google-gemma-2-2b-it.jinja", IE_TOOL_FMT_NONE},
        {"microsoft-Phi-3.5-mini-instruct.jinja", IE_TOOL_FMT_NONE},
        {"HuggingFaceTB-SmolLM3-3B.jinja", IE_TOOL_FMT_NONE},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, TDIR "/%s", cases[k].file);
        char *src = slurp(path);
        CU_ASSERT_PTR_NOT_NULL_FATAL(src);
        ie_tool_format_t f = ie_tool_format_detect(src, 0);
        if (f != cases[k].f) printf("\n  %s: %s", cases[k].file, ie_tool_format_name(f));
        CU_ASSERT_EQUAL(f, cases[k].f);
        free(src);
    }
    CU_ASSERT_EQUAL(ie_tool_format_detect(NULL, 1), IE_TOOL_FMT_HARMONY);
    CU_ASSERT_EQUAL(ie_tool_format_detect(NULL, 0), IE_TOOL_FMT_NONE);
}

static void check_tools(const char *json, const char *needle)
{
    cJSON *t = cJSON_Parse(json);
    char why[256] = "";
    int rc = ie_tool_list_check(t, why, sizeof why);
    if (needle) {
        CU_ASSERT_EQUAL(rc, -1);
        CU_ASSERT(strstr(why, needle) != NULL);
        if (!strstr(why, needle)) printf("\n  %s: '%s'", json, why);
    } else {
        CU_ASSERT_EQUAL(rc, 0);
        if (rc) printf("\n  %s: '%s'", json, why);
    }
    cJSON_Delete(t);
}

static void test_requests(void)
{
    check_tools("[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\"}}},"
                "{\"type\":\"function\",\"function\":{\"name\":\"b.c-d_e\",\"description\":\"x\"}}]",
                NULL);
    check_tools("[]", NULL);
    check_tools("{}", "must be a list");
    check_tools("[1]", "'tools[0]' is not an object");
    check_tools("[{\"type\":\"function\",\"function\":{\"description\":\"x\"}}]", "'tools[0].function.name'");
    check_tools("[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[1]}}]",
                "'tools[0].function.parameters'");
    check_tools("[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":\"{}\"}}]", "parameters");
    check_tools("[{\"type\":\"retrieval\",\"function\":{\"name\":\"a\"}}]", "'tools[0].type'");
    check_tools("[{\"type\":\"function\"}]", "'tools[0].function' must be an object");
    check_tools("[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", "1 to 64");
    check_tools("[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":{"
                "\"name\":\"a\"}}]",
                "both named 'a'");

    /* the forced call's schema */
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"c\":{\"type\":\"string\"}}}}},{\"type\":\"function\","
                               "\"function\":{\"name\":\"s\"}}]");
    char *s = ie_tool_call_schema(tools, "w");
    CU_ASSERT(s && json_eq(s, "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"w\"},\"arguments\":{"
                              "\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"string\"}}}},\"required\":["
                              "\"name\",\"arguments\"],\"additionalProperties\":false}"));
    free(s);
    s = ie_tool_call_schema(tools, NULL);
    cJSON *any = cJSON_Parse(s ? s : "");
    CU_ASSERT(cJSON_GetArraySize(cJSON_GetObjectItem(any, "anyOf")) == 2);
    cJSON_Delete(any);
    free(s);
    CU_ASSERT_PTR_NULL(ie_tool_call_schema(tools, "nope"));
    cJSON_Delete(tools);

    /* the message rewrite */
    cJSON *m = cJSON_Parse("[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"assistant\",\"content\":null,"
                           "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"w\","
                           "\"arguments\":\"{\\\"c\\\": \\\"P\\\"}\"}},{\"id\":\"c2\",\"type\":\"function\","
                           "\"function\":{\"name\":\"w\",\"arguments\":\"not json\"}}]},{\"role\":\"tool\","
                           "\"tool_call_id\":\"c1\",\"content\":\"18\"}]");
    char why[256];
    CU_ASSERT_EQUAL(ie_tool_messages_prepare(m, "{{ messages }}", why, sizeof why), 0);
    cJSON *want = cJSON_Parse("[{\"role\":\"system\",\"content\":\"d\"},{\"role\":\"assistant\",\"content\":\"\","
                              "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"w\","
                              "\"arguments\":{\"c\":\"P\"}}},{\"id\":\"c2\",\"type\":\"function\",\"function\":{"
                              "\"name\":\"w\",\"arguments\":\"not json\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
                              "\"c1\",\"content\":\"18\"}]");
    CU_ASSERT(cJSON_Compare(m, want, 1));
    cJSON_Delete(m);
    cJSON_Delete(want);
    /* a template that knows developer keeps it */
    m = cJSON_Parse("[{\"role\":\"developer\",\"content\":\"d\"}]");
    CU_ASSERT_EQUAL(ie_tool_messages_prepare(m, "{% if role == 'developer' %}", why, sizeof why), 0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(m->child, "role")->valuestring, "developer");
    cJSON_Delete(m);
    static const char *const bad[] = {
        "[{\"role\":\"assistant\",\"tool_calls\":{}}]",
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]",
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"w\",\"arguments\":5}}]}]",
        "[{\"role\":\"assistant\",\"tool_calls\":[7]}]",
        "[{\"role\":\"tool\",\"tool_call_id\":\"c\"}]",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        m = cJSON_Parse(bad[k]);
        why[0] = '\0';
        CU_ASSERT_EQUAL(ie_tool_messages_prepare(m, NULL, why, sizeof why), -1);
        CU_ASSERT(strstr(why, "messages[0]") != NULL);
        cJSON_Delete(m);
    }
}

static void test_reference(void)
{
    char *doc_s = slurp(TDIR "/tools_expected.json");
    CU_ASSERT_PTR_NOT_NULL_FATAL(doc_s);
    cJSON *doc = cJSON_Parse(doc_s);
    cJSON *cases = cJSON_GetObjectItem(doc, "cases"), *renders = cJSON_GetObjectItem(doc, "renders");
    CU_ASSERT_FATAL(cJSON_IsArray(cases) && cJSON_IsObject(renders));
    ie_jinja_opts_t jo = {.has_now = 1, .now = NOW};
    int n_ok = 0, n_total = 0;
    for (cJSON *t = renders->child; t; t = t->next) {
        char path[512];
        snprintf(path, sizeof path, TDIR "/%s", t->string);
        char *src = slurp(path);
        CU_ASSERT_PTR_NOT_NULL_FATAL(src);
        ie_jinja_t *tmpl = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_jinja_parse(src, strlen(src), &tmpl), IE_OK);
        const char *bos = cJSON_GetObjectItem(t, "bos_token")->valuestring;
        const char *eos = cJSON_GetObjectItem(t, "eos_token")->valuestring;
        for (cJSON *c = cases->child; c; c = c->next) {
            const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
            cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(t, "renders"), name);
            CU_ASSERT_PTR_NOT_NULL_FATAL(want);
            cJSON *msgs = cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), 1);
            char why[256];
            CU_ASSERT_EQUAL_FATAL(ie_tool_messages_prepare(msgs, src, why, sizeof why), 0);
            cJSON *kw = cJSON_CreateObject();
            cJSON_AddItemToObject(kw, "tools", cJSON_Duplicate(cJSON_GetObjectItem(c, "tools"), 1));
            char *msgs_s = cJSON_PrintUnformatted(msgs), *kw_s = cJSON_PrintUnformatted(kw);
            char *text = NULL;
            size_t len = 0;
            int raised = 0;
            ie_status_t st = ie_chat_template_render(tmpl, msgs_s, kw_s, bos, eos, &jo, &text, NULL, &len, &raised);
            cJSON *wt = cJSON_GetObjectItem(want, "text");
            n_total++;
            int ok;
            if (wt) {
                ok = st == IE_OK && len == strlen(wt->valuestring) && !memcmp(text, wt->valuestring, len);
                if (!ok) {
                    printf("\n  %s / %s: %s", t->string, name, st == IE_OK ? "differs" : ie_error_last());
                    if (st == IE_OK) printf("\n--- got:\n%s\n--- want:\n%s\n---", text, wt->valuestring);
                }
            } else {
                ok = st != IE_OK && (!cJSON_IsTrue(cJSON_GetObjectItem(want, "raised")) || raised);
                if (!ok) printf("\n  %s / %s: expected an error", t->string, name);
            }
            CU_ASSERT(ok);
            n_ok += ok;
            free(text);
            free(msgs_s);
            free(kw_s);
            cJSON_Delete(msgs);
            cJSON_Delete(kw);
        }
        ie_jinja_destroy(&tmpl);
        free(src);
    }
    printf("\n  %d/%d template x tool-case renders equal transformers' ", n_ok, n_total);
    CU_ASSERT(n_total >= 50);
    CU_ASSERT_EQUAL(n_ok, n_total);
    cJSON_Delete(doc);
    free(doc_s);
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("tools", NULL, NULL);
    CU_add_test(s, "hermes / qwen <tool_call>", test_hermes);
    CU_add_test(s, "llama 3 JSON", test_llama3);
    CU_add_test(s, "mistral [TOOL_CALLS]", test_mistral);
    CU_add_test(s, "harmony commentary to=functions", test_harmony);
    CU_add_test(s, "forced call JSON", test_json);
    CU_add_test(s, "stream hold-back", test_safe_len);
    CU_add_test(s, "format detection", test_detect);
    CU_add_test(s, "tools, schema, message rewrite", test_requests);
    CU_add_test(s, "templates with tools vs transformers", test_reference);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
