/* test_jinja.c — CUnit suite for the Jinja chat-template interpreter
 * (coordinator/chat/jinja.c) and ie_chat_template_render.
 *
 * - reference: every template in tests/data/templates x every case of
 *   conversations.json must render byte for byte as transformers did
 *   (expected.json, made by tests/reference/gen_chat_templates.py); a case
 *   the template rejected must be rejected, with raised set where the
 *   template called raise_exception;
 * - the content mask: message text is marked, template text is not;
 * - language details: whitespace control, loops, namespaces, macros,
 *   filters, tests, slicing, Python str()/repr() and tojson formats;
 * - errors: syntax errors and unsupported constructs name the construct and
 *   its line; limits (output, steps, recursion) stop runaway templates.
 */
#include "ie_chat.h"
#include "ie_jinja.h"

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static void test_reference(void)
{
    char *convs_s = slurp(TDIR "/conversations.json"), *exp_s = slurp(TDIR "/expected.json");
    CU_ASSERT_PTR_NOT_NULL_FATAL(convs_s);
    CU_ASSERT_PTR_NOT_NULL_FATAL(exp_s);
    cJSON *convs = cJSON_Parse(convs_s), *exp = cJSON_Parse(exp_s);
    CU_ASSERT_FATAL(cJSON_IsArray(convs) && cJSON_IsObject(exp));
    ie_jinja_opts_t jo = {.has_now = 1, .now = NOW};
    int n_tmpl = 0, n_ok = 0, n_total = 0;
    for (cJSON *t = exp->child; t; t = t->next, n_tmpl++) {
        char path[512];
        snprintf(path, sizeof path, TDIR "/%s", t->string);
        char *src = slurp(path);
        CU_ASSERT_PTR_NOT_NULL_FATAL(src);
        ie_jinja_t *tmpl = NULL;
        ie_status_t st = ie_jinja_parse(src, strlen(src), &tmpl);
        if (st != IE_OK) printf("\n  %s: parse: %s", t->string, ie_error_last());
        CU_ASSERT_EQUAL_FATAL(st, IE_OK);
        const char *bos = cJSON_GetObjectItem(t, "bos_token")->valuestring;
        const char *eos = cJSON_GetObjectItem(t, "eos_token")->valuestring;
        cJSON *renders = cJSON_GetObjectItem(t, "renders");
        for (cJSON *c = convs->child; c; c = c->next) {
            const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
            cJSON *want = cJSON_GetObjectItem(renders, name);
            CU_ASSERT_PTR_NOT_NULL_FATAL(want);
            char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
            char *kw = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "kwargs"));
            char *text = NULL;
            uint8_t *mask = NULL;
            size_t len = 0;
            int raised = 0;
            st = ie_chat_template_render(tmpl, msgs, kw, bos, eos, &jo, &text, &mask, &len, &raised);
            cJSON *wt = cJSON_GetObjectItem(want, "text");
            n_total++;
            if (wt) {
                int same = st == IE_OK && len == strlen(wt->valuestring) && memcmp(text, wt->valuestring, len) == 0;
                if (!same) {
                    printf("\n  %s / %s: %s", t->string, name, st == IE_OK ? "differs" : ie_error_last());
                    if (st == IE_OK) printf("\n--- got:\n%s\n--- want:\n%s\n---", text, wt->valuestring);
                }
                CU_ASSERT(same);
                n_ok += same;
            } else {
                int want_raised = cJSON_IsTrue(cJSON_GetObjectItem(want, "raised"));
                int ok = st != IE_OK && (!want_raised || raised);
                if (!ok)
                    printf("\n  %s / %s: expected an error (%s), got %s", t->string, name,
                           cJSON_GetObjectItem(want, "error")->valuestring,
                           st == IE_OK ? "a render" : ie_error_last());
                if (ok && want_raised) { /* same message as the template's */
                    const char *m = strstr(ie_error_last(), "raised: ");
                    ok = m && strcmp(m + 8, cJSON_GetObjectItem(want, "error")->valuestring) == 0;
                    if (!ok) printf("\n  %s / %s: message '%s'", t->string, name, ie_error_last());
                }
                CU_ASSERT(ok);
                n_ok += ok;
            }
            free(text);
            free(mask);
            free(msgs);
            free(kw);
        }
        ie_jinja_destroy(&tmpl);
        free(src);
    }
    printf("\n  %d templates, %d of %d renders identical to transformers ", n_tmpl, n_ok, n_total);
    CU_ASSERT(n_tmpl >= 16);
    CU_ASSERT_EQUAL(n_ok, n_total);
    cJSON_Delete(convs);
    cJSON_Delete(exp);
    free(convs_s);
    free(exp_s);
}

/* Render src with vars (JSON object); returns the text (caller frees) or
 * NULL, with *st_out the status. */
static char *render(const char *src, const char *vars, ie_status_t *st_out)
{
    ie_jinja_t *t = NULL;
    char *text = NULL;
    size_t len;
    ie_jinja_opts_t jo = {.has_now = 1, .now = NOW, .max_steps = 200000, .max_output = 1 << 20};
    ie_status_t st = ie_jinja_parse(src, strlen(src), &t);
    if (st == IE_OK) st = ie_jinja_render(t, vars ? vars : "{}", NULL, &jo, &text, NULL, &len, NULL);
    ie_jinja_destroy(&t);
    if (st_out) *st_out = st;
    return text;
}

static void check(const char *src, const char *vars, const char *want)
{
    ie_status_t st;
    char *got = render(src, vars, &st);
    if (!got || strcmp(got, want) != 0)
        printf("\n  template %s\n  got  [%s] (%s)\n  want [%s]", src, got ? got : "(error)",
               got ? "" : ie_error_last(), want);
    CU_ASSERT(got && strcmp(got, want) == 0);
    free(got);
}

static void check_err(const char *src, const char *vars, const char *needle)
{
    ie_status_t st;
    char *got = render(src, vars, &st);
    CU_ASSERT_PTR_NULL(got);
    CU_ASSERT_NOT_EQUAL(st, IE_OK);
    if (!got && !strstr(ie_error_last(), needle))
        printf("\n  %s: error '%s' lacks '%s'", src, ie_error_last(), needle);
    CU_ASSERT(got == NULL && strstr(ie_error_last(), needle) != NULL);
    free(got);
}

static void test_whitespace(void)
{
    check("a  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a    b\nc");
    check("x\n    {% if true %}\ny{% endif %}", NULL, "x\ny");
    check("x {{- ' y ' -}} z", NULL, "x y z");
    check("a\n  {%- if 1 %}b{% endif -%}  \n c", NULL, "abc");
    check("a {# c #} b\n  {# line #}\nc", NULL, "a  b\nc");
    check("{% if true +%}\nkeep{% endif %}", NULL, "\nkeep");
    check("  {%+ if true %}x{% endif %}", NULL, "  x");
    check("a\n", NULL, "a");
    check("a\n\n", NULL, "a\n");
}

static void test_language(void)
{
    check("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
          "{\"xs\":[\"a\",\"b\",\"c\"]}", "1a,2b,3c");
    check("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", "{\"xs\":[]}", "empty");
    check("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\":{\"a\":1,\"b\":true}}", "a=1;b=True;");
    check("{% for x in xs if x > 1 %}{{ x }}/{{ loop.length }} {% endfor %}", "{\"xs\":[1,2,3]}", "2/2 3/2 ");
    check("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}"
          "{% endfor %}",
          "{\"xs\":[1,2,3,4,5]}", "13");
    check("{% set ns = namespace(n=0, s='') %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
          "{\"xs\":[1,2,3]}", "6");
    check("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
    check("{% macro m(a, b='d') %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", NULL, "[1|d][2|3]");
    check("{% set a, b = 1, 2 %}{{ a + b }}", NULL, "3");
    check("{% set t %}in {{ 1 + 1 }}{% endset %}[{{ t }}]", NULL, "[in 2]");
    check("{{ 'a' if false else 'b' }}{{ 'c' if true }}{{ 'd' if false }}", NULL, "bc");
    check("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 1 }}", NULL,
          "3 -4 1 2 3.5 1024 2.5");
    check("{{ 'ab' ~ 1 ~ none }} {{ [1, 'a', none, true] }} {{ {'k': 'v'} }} {{ none }} {{ undefined_x }}.", NULL,
          "ab1None [1, 'a', None, True] {'k': 'v'} None .");
    check("{{ 'hello'[::-1] }} {{ 'hello'[1:3] }} {{ [1,2,3,4][-2:] }} {{ 'héllo'[1] }} {{ 'héllo'|length }}", NULL,
          "olleh el [3, 4] é 5");
    check("{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 3.0 }} {{ 100.0 / 3 }}", NULL,
          "1e+20 0.30000000000000004 1e-05 3.0 33.333333333333336");
    check("{{ 'a' in 'cat' }} {{ 1 in [1,2] }} {{ 'k' in {'k':1} }} {{ 3 not in [1] }}", NULL,
          "True True True True");
    check("{{ (1, 2) }} {{ ('a',) }} {{ {'a': 1}|items|list }} {{ (1, 2) == [1, 2] }} {{ (1, 2)|tojson }}", NULL,
          "(1, 2) ('a',) [('a', 1)] False [1, 2]");
    check("{% for i in [1, 2, 3] %}{% if i == 1 %}{% set x = 5 %}{% endif %}[{{ x }}]{% endfor %}", NULL,
          "[5][][]");
}

static void test_filters(void)
{
    check("{{ '  x  '|trim }}|{{ xs|length }}|{{ xs|join(', ') }}|{{ xs|first }}{{ xs|last }}|{{ 'Ab'|upper }}"
          "{{ 'Ab'|lower }}",
          "{\"xs\":[\"a\",\"b\"]}", "x|2|a, b|ab|ABab");
    check("{{ x|default('d') }} {{ ''|default('e', true) }} {{ 'ab'|replace('a', 'x') }} {{ 3|string }} {{ "
          "'42'|int + 1 }}",
          NULL, "d e xb 3 43");
    check("{{ ms|selectattr('role', 'equalto', 'user')|list|length }} {{ ms|rejectattr('role', 'equalto', "
          "'user')|map(attribute='role')|join }}",
          "{\"ms\":[{\"role\":\"user\"},{\"role\":\"system\"},{\"role\":\"user\"}]}", "2 system");
    check("{{ xs|reject('equalto', 'b')|list }}", "{\"xs\":[\"a\",\"b\",\"c\"]}", "['a', 'c']");
    check("{{ d|tojson }}", "{\"d\":{\"a\":[1,2.5,null,true],\"s\":\"é\\\"<\\n\"}}",
          "{\"a\": [1, 2.5, null, true], \"s\": \"é\\\"<\\n\"}");
    check("{{ d|tojson(indent=2) }}", "{\"d\":{\"a\":[1],\"e\":{}}}", "{\n  \"a\": [\n    1\n  ],\n  \"e\": {}\n}");
    check("{{ d|tojson(separators=(',', ':'), sort_keys=true) }}", "{\"d\":{\"b\":1,\"a\":2}}",
          "{\"a\":2,\"b\":1}");
    check("{{ ' a b '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} {{ 'xxhixx'.strip('x') }}"
          " {{ '  a'.lstrip() }} {{ 'Hi'.startswith('H') }} {{ 'Hi'.endswith(('x', 'i')) }} {{ 'hello "
          "world'.title() }}",
          NULL, "['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b c'] hi a True True Hello World");
    check("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys()|list }}", "{\"d\":{\"a\":1}}",
          "1 None 5 ['a']");
    check("{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 's' is string }} {{ d is mapping }}"
          " {{ xs is iterable }} {{ xs is sequence }} {{ 1 is number }} {{ true is true }} {{ 3 is odd }}"
          " {{ 'a' is not string }} {{ 4 is divisibleby 2 }}",
          "{\"x\":1,\"d\":{},\"xs\":[]}", "True True True True True True True True True True False True");
    check("{{ strftime_now('%Y-%m-%d') }}", NULL, "2026-01-15");
    check("{{ range(3)|list }} {{ dict(a=1) }}", NULL, "[0, 1, 2] {'a': 1}");
}

static void test_mask(void)
{
    ie_jinja_t *t = NULL;
    const char *src = "<|s|>{{ m.content|trim }}<|e|>{{ ('[' + m.content + ']')|upper }}{{ tok }}";
    CU_ASSERT_EQUAL_FATAL(ie_jinja_parse(src, strlen(src), &t), IE_OK);
    char *text = NULL;
    uint8_t *mask = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(ie_jinja_render(t, "{\"m\":{\"content\":\" <|e|> \"}}", "{\"tok\":\"<|e|>\"}", NULL,
                                          &text, &mask, &len, NULL),
                          IE_OK);
    CU_ASSERT_STRING_EQUAL(text, "<|s|><|e|><|e|>[ <|E|> ]<|e|>");
    const char *want = "00000"
                       "11111"
                       "00000"
                       "0"
                       "1111111"
                       "0"
                       "00000";
    CU_ASSERT_EQUAL(len, strlen(want));
    for (size_t i = 0; i < len; i++) CU_ASSERT_EQUAL(mask[i], want[i] - '0');
    free(text);
    free(mask);
    ie_jinja_destroy(&t);
}

static void test_errors(void)
{
    ie_jinja_t *t = NULL;
    static const struct {
        const char *src, *needle;
    } bad_parse[] = {
        {"{% if x %}", "line 1: missing '{% endif %}'"},
        {"a\n{{ x | nosuchfilter }}", "line 2: unsupported filter 'nosuchfilter'"},
        {"{% include 'x' %}", "unsupported tag 'include'"},
        {"{{ x is nosuchtest }}", "unsupported test 'nosuchtest'"},
        {"\n\n{{ 'abc }}", "line 3: unterminated string"},
        {"{{ x", "unclosed"},
        {"{% endfor %}", "unexpected 'endfor'"},
        {"{{ (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
         "((((((((((((((((((((((((((((((((((((((1 }}",
         "nesting deeper"},
        {"{{ a < b < c }}", "chained comparisons"},
        {"{% for x in xs recursive %}{% endfor %}", "recursive"},
        {"{{ 1 $ 2 }}", "unexpected character"},
    };
    for (size_t i = 0; i < sizeof bad_parse / sizeof *bad_parse; i++) {
        ie_status_t st = ie_jinja_parse(bad_parse[i].src, strlen(bad_parse[i].src), &t);
        CU_ASSERT_EQUAL(st, IE_ERR_FORMAT);
        CU_ASSERT_PTR_NULL(t);
        if (!strstr(ie_error_last(), bad_parse[i].needle))
            printf("\n  %s: '%s' lacks '%s'", bad_parse[i].src, ie_error_last(), bad_parse[i].needle);
        CU_ASSERT(strstr(ie_error_last(), bad_parse[i].needle) != NULL);
        ie_jinja_destroy(&t);
    }
    check_err("{{ raise_exception('no system') }}", NULL, "raised: no system");
    check_err("\n{{ x.y }}", NULL, "line 2: 'x' is undefined");
    check_err("{{ 'a' + 1 }}", NULL, "unsupported operand");
    check_err("{{ nosuchfn(1) }}", NULL, "'nosuchfn' is undefined");
    check_err("{% for x in none %}{% endfor %}", NULL, "not iterable");
    check_err("{{ xs.append(1) }}", "{\"xs\":[]}", "list.append");
    check_err("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", NULL, "macro recursion");
    check_err("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", NULL,
              "step limit");
    check_err("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
              "{% endfor %}",
              NULL, "larger than");
    check_err("{% set x = 1 %}{% set x.a = 2 %}", NULL, "not a namespace");
    check_err("{{ 1 // 0 }}", NULL, "division");
    check_err("{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}", NULL, "nested too deeply");
    check_err("{{ 2 ** 100 }}", NULL, "integer overflow");
    check("{{ 1 ** 1000000000000 }} {{ 0 ** 0 }} {{ (-1) ** 999999999999 }} {{ [1, 2, 3][::9223372036854775807] }}",
          NULL, "1 1 -1 [1]");
    int raised = 0;
    char *text = NULL;
    size_t len;
    const char *src = "{{ raise_exception('stop') }}";
    CU_ASSERT_EQUAL_FATAL(ie_jinja_parse(src, strlen(src), &t), IE_OK);
    CU_ASSERT_EQUAL(ie_jinja_render(t, "{}", NULL, NULL, &text, NULL, &len, &raised), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(raised, 1);
    CU_ASSERT_EQUAL(ie_jinja_render(t, "[1]", NULL, NULL, &text, NULL, &len, &raised), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_jinja_render(t, "{}", "nope", NULL, &text, NULL, &len, &raised), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(text);
    ie_jinja_destroy(&t);
    ie_jinja_destroy(&t); /* NULL is fine */
    ie_jinja_destroy(NULL);
}

/* --------------------------------------------------- wiring into ie_chat */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
}

/* chat_template.jinja beats tokenizer_config.json; a list picks "default";
 * a wrong type is an error; none at all is NULL. */
static void test_template_find(void)
{
    char dir[] = "/tmp/ie_jinja_XXXXXX", p[256], tj[256];
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    write_file(tj, "{}");
    char *text = NULL;
    CU_ASSERT_EQUAL(ie_chat_template_find(tj, &text), IE_OK);
    CU_ASSERT_PTR_NULL(text);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file(p, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                  "{\"name\": \"default\", \"template\": \"D\"}]}");
    CU_ASSERT_EQUAL(ie_chat_template_find(tj, &text), IE_OK);
    CU_ASSERT(text && strcmp(text, "D") == 0);
    free(text);
    write_file(p, "{\"chat_template\": 7}");
    CU_ASSERT_EQUAL(ie_chat_template_find(tj, &text), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(text);
    write_file(p, "{\"chat_template\": \"S\"}");
    CU_ASSERT_EQUAL(ie_chat_template_find(tj, &text), IE_OK);
    CU_ASSERT(text && strcmp(text, "S") == 0);
    free(text);
    char pj[256];
    snprintf(pj, sizeof pj, "%s/chat_template.jinja", dir);
    write_file(pj, "J");
    CU_ASSERT_EQUAL(ie_chat_template_find(tj, &text), IE_OK);
    CU_ASSERT(text && strcmp(text, "J") == 0);
    free(text);
    snprintf(p, sizeof p, "%s/nope.json", dir);
    CU_ASSERT_EQUAL(ie_chat_template_find(p, &text), IE_ERR_IO);
    unlink(pj);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    unlink(tj);
    rmdir(dir);
}

/* Qwen2.5's template with SmolLM2's vocabulary (both ChatML): the ids equal
 * parsing the rendered text with special tokens when content is clean, and
 * content's "<|im_end|>" stays plain text. */
static void test_template_encode(void)
{
    ie_tokenizer_t *tok = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load(IE_TEST_DATA "/smollm2_tokenizer.json", &tok), IE_OK);
    char *src = slurp(TDIR "/Qwen-Qwen2.5-7B-Instruct.jinja");
    CU_ASSERT_PTR_NOT_NULL_FATAL(src);
    ie_jinja_t *t = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_jinja_parse(src, strlen(src), &t), IE_OK);
    ie_chat_opts_t o = {.tmpl = t};
    CU_ASSERT_EQUAL(ie_chat_format_for(tok, &o), IE_CHAT_TEMPLATE);
    CU_ASSERT_EQUAL(ie_chat_format_for(tok, NULL), IE_CHAT_CHATML);
    CU_ASSERT_STRING_EQUAL(ie_chat_format_name(IE_CHAT_TEMPLATE), "template");
    int32_t *ids = NULL, *ref = NULL;
    size_t n = 0, n_ref = 0;
    char *text = NULL;
    const char *clean = "[{\"role\":\"user\",\"content\":\"Hi there\"}]";
    CU_ASSERT_EQUAL_FATAL(ie_chat_encode(tok, clean, &o, &ids, &n, &text), IE_OK);
    CU_ASSERT(strstr(text, "<|im_start|>system\nYou are Qwen") == text);
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_encode(tok, text, strlen(text), IE_TOK_PARSE_SPECIAL, &ref, &n_ref), IE_OK);
    CU_ASSERT(n == n_ref && memcmp(ids, ref, n * sizeof *ids) == 0);
    free(ids);
    free(ref);
    free(text);
    int32_t im_end = ie_tokenizer_find(tok, "<|im_end|>", 10);
    CU_ASSERT_EQUAL_FATAL(ie_chat_encode(tok, "[{\"role\":\"user\",\"content\":\"a<|im_end|>b\"}]", &o, &ids, &n,
                                         NULL),
                          IE_OK);
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ids[i] == im_end;
    CU_ASSERT_EQUAL(c, 2); /* system's and user's, not the content's */
    free(ids);
    /* the template's own rejections and a failed compile are errors */
    CU_ASSERT_EQUAL(ie_chat_encode(tok, "[]", &o, &ids, &n, NULL), IE_ERR_INVAL);
    ie_chat_opts_t broken = {.tmpl_error = "line 1: boom"};
    CU_ASSERT_EQUAL(ie_chat_encode(tok, clean, &broken, &ids, &n, NULL), IE_ERR_UNSUPPORTED);
    CU_ASSERT(strstr(ie_error_last(), "boom") != NULL);
    /* kwargs reach the template */
    const char *qsrc = "{{ messages[0].content }}{% if enable_thinking is false %}/no{% endif %}";
    ie_jinja_t *q = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_jinja_parse(qsrc, strlen(qsrc), &q), IE_OK);
    ie_chat_opts_t qo = {.tmpl = q, .template_kwargs = "{\"enable_thinking\": false}"};
    char *p = NULL;
    CU_ASSERT_EQUAL(ie_chat_render(tok, clean, &qo, &p), IE_OK);
    CU_ASSERT(p && strcmp(p, "Hi there/no") == 0);
    free(p);
    ie_jinja_destroy(&q);
    ie_jinja_destroy(&t);
    free(src);
    ie_tokenizer_destroy(&tok);
}

/* A SentencePiece vocabulary (Llama 2's) with Mistral Nemo's template: the
 * template writes bos_token "<s>" and eos_token "</s>"; the ids equal the
 * tokenizer's own special-token parsing of the rendered text. */
static void test_template_encode_spm(void)
{
    ie_tokenizer_t *tok = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load(IE_TEST_DATA "/llama2_tokenizer.json", &tok), IE_OK);
    char *src = slurp(TDIR "/mistralai-Mistral-Nemo-Instruct-2407.jinja");
    CU_ASSERT_PTR_NOT_NULL_FATAL(src);
    ie_jinja_t *t = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_jinja_parse(src, strlen(src), &t), IE_OK);
    ie_chat_opts_t o = {.tmpl = t};
    const char *conv =
        "[{\"role\":\"user\",\"content\":\"Hi there\"},{\"role\":\"assistant\",\"content\":\"Hello!\"},"
        "{\"role\":\"user\",\"content\":\"How are you?\"}]";
    int32_t *ids = NULL, *ref = NULL;
    size_t n = 0, n_ref = 0;
    char *text = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_chat_encode(tok, conv, &o, &ids, &n, &text), IE_OK);
    CU_ASSERT(strncmp(text, "<s>[INST]Hi there[/INST]Hello!</s>", 34) == 0);
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_encode(tok, text, strlen(text), IE_TOK_PARSE_SPECIAL, &ref, &n_ref), IE_OK);
    CU_ASSERT(n == n_ref && memcmp(ids, ref, n * sizeof *ids) == 0);
    CU_ASSERT(n > 0 && ids[0] == ie_tokenizer_bos(tok));
    free(ids);
    free(ref);
    free(text);
    ie_jinja_destroy(&t);
    free(src);
    ie_tokenizer_destroy(&tok);
}

/* Extra stop ids: generation_config.json's list and tokenizer_config.json's
 * eos_token, minus what the tokenizer already stops on. */
static void test_stop_ids(void)
{
    ie_tokenizer_t *tok = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load(IE_TEST_DATA "/smollm2_tokenizer.json", &tok), IE_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(ie_chat_stop_ids(tok, NULL, &ids, &n), IE_OK);
    for (size_t i = 0; i < n; i++) CU_ASSERT(!ie_tokenizer_is_eog(tok, ids[i]));
    free(ids);
    char dir[] = "/tmp/ie_jinja_XXXXXX", p[256], q[256];
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    write_file(p, "{\"eos_token_id\": [5, 7, 99999999]}");
    snprintf(q, sizeof q, "%s/tokenizer_config.json", dir);
    write_file(q, "{\"eos_token\": {\"content\": \"<repo_name>\"}}");
    char tj[256];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    CU_ASSERT_EQUAL(ie_chat_stop_ids(tok, tj, &ids, &n), IE_OK);
    int has5 = 0, has7 = 0, has_repo = 0, has_big = 0;
    int32_t repo = ie_tokenizer_find(tok, "<repo_name>", 11);
    for (size_t i = 0; i < n; i++) {
        has5 |= ids[i] == 5;
        has7 |= ids[i] == 7;
        has_repo |= repo >= 0 && ids[i] == repo;
        has_big |= ids[i] == 99999999;
    }
    CU_ASSERT(has5 == !ie_tokenizer_is_eog(tok, 5) && has7 == !ie_tokenizer_is_eog(tok, 7));
    CU_ASSERT(repo < 0 || has_repo);
    CU_ASSERT(!has_big);
    free(ids);
    unlink(p);
    unlink(q);
    rmdir(dir);
    ie_tokenizer_destroy(&tok);
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    tzset();
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("jinja", NULL, NULL);
    CU_add_test(s, "models' templates vs transformers", test_reference);
    CU_add_test(s, "whitespace control", test_whitespace);
    CU_add_test(s, "statements and expressions", test_language);
    CU_add_test(s, "filters, tests, methods, globals", test_filters);
    CU_add_test(s, "content mask", test_mask);
    CU_add_test(s, "errors and limits", test_errors);
    CU_add_test(s, "template files", test_template_find);
    CU_add_test(s, "template encode", test_template_encode);
    CU_add_test(s, "template encode, SentencePiece", test_template_encode_spm);
    CU_add_test(s, "stop ids", test_stop_ids);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
