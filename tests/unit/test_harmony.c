/* test_harmony.c — CUnit suite for the harmony chat format (coordinator/chat/harmony.c).
 *
 * - rendering: every case of tests/data/harmony_ref.json (made by
 *   tests/reference/gen_harmony_ref.py with transformers' apply_chat_template
 *   and gpt-oss's jinja template) must match byte for byte, and tokenize with
 *   o200k_harmony into the expected special tokens;
 * - the C API directly: empty conversations, defaults, effort names;
 * - bad input: malformed JSON, bad roles / channels / content, misplaced
 *   system messages, lone analysis, channel tags inside content;
 * - the streaming parser, on text cut at every byte position and byte by
 *   byte, and on token ids: channels, recipients, stop tokens.
 */
#include "ie_harmony.h"
#include "ie_tokenizer.h"

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef IE_TEST_DATA
#define IE_TEST_DATA "tests/data"
#endif

#define REF_JSON IE_TEST_DATA "/harmony_ref.json"
#define O200K IE_TEST_DATA "/o200k_base.tiktoken"

static ie_tokenizer_t *g_tok; /* o200k_harmony, shared by the tests */

static char *slurp(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) { return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len_out = (size_t)n;
    }
    return buf;
}

static size_t count_substr(const char *s, const char *sub)
{
    size_t n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub)) { n++; }
    return n;
}

/* ---------------------------------------------------------------- rendering */

static void test_reference_cases(void)
{
    size_t len = 0;
    char *buf = slurp(REF_JSON, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    cJSON *root = cJSON_Parse(buf);
    CU_ASSERT_FATAL(cJSON_IsArray(root));
    size_t n = 0, pass = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root)
    {
        n++;
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *expected = cJSON_GetObjectItem(c, "expected")->valuestring;
        const cJSON *identity = cJSON_GetObjectItem(c, "identity");
        char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
        ie_harmony_opts_t o;
        memset(&o, 0, sizeof o);
        CU_ASSERT_EQUAL(ie_harmony_effort_parse(cJSON_GetObjectItem(c, "effort")->valuestring, &o.effort), IE_OK);
        o.current_date = cJSON_GetObjectItem(c, "date")->valuestring;
        o.model_identity = cJSON_IsString(identity) ? identity->valuestring : NULL;
        o.no_generation_prompt = !cJSON_IsTrue(cJSON_GetObjectItem(c, "generation_prompt"));

        ie_harmony_conv_t *conv = NULL;
        char *text = NULL;
        size_t tl = 0;
        ie_status_t st = ie_harmony_conv_from_json(msgs, strlen(msgs), &conv);
        if (st == IE_OK) { st = ie_harmony_render(conv, &o, &text, &tl); }
        if (st == IE_OK && strcmp(text, expected) == 0 && tl == strlen(expected)) {
            pass++;
        } else {
            fprintf(stderr, "\ncase '%s': st=%d (%s)\n  got: %s\n  exp: %s\n", name, (int)st, ie_error_last(),
                    text ? text : "(null)", expected);
        }
        /* the prompt tokenizes into exactly its special tokens */
        if (text) {
            int32_t *ids = NULL;
            size_t ni = 0;
            CU_ASSERT_EQUAL(ie_tokenizer_encode(g_tok, text, tl, IE_TOK_PARSE_SPECIAL, &ids, &ni), IE_OK);
            size_t starts = 0, ends = 0;
            for (size_t i = 0; i < ni; i++) {
                starts += ids[i] == 200006;
                ends += ids[i] == 200007;
            }
            CU_ASSERT_EQUAL(starts, count_substr(text, "<|start|>"));
            CU_ASSERT_EQUAL(ends, count_substr(text, "<|end|>"));
            CU_ASSERT(ni > 0 && ids[0] == 200006);
            free(ids);
        }
        free(text);
        free(msgs);
        ie_harmony_conv_destroy(&conv);
    }
    printf("\n    harmony renderings identical to the jinja template: %zu/%zu ", pass, n);
    CU_ASSERT(n >= 10);
    CU_ASSERT_EQUAL(pass, n);
    cJSON_Delete(root);
    free(buf);
}

static void test_api(void)
{
    ie_harmony_conv_t *conv = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_harmony_conv_new(&conv), IE_OK);
    char *text = NULL;
    size_t len = 0;
    /* empty conversation, defaults: today's date, medium */
    CU_ASSERT_EQUAL(ie_harmony_render(conv, NULL, &text, &len), IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(strstr(text, "\nReasoning: medium\n") != NULL);
    const char *d = strstr(text, "Current date: ");
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT(d[14 + 4] == '-' && d[14 + 7] == '-' && d[14 + 10] == '\n');
    CU_ASSERT(len > 18 && strcmp(text + len - 18, "<|start|>assistant") == 0);
    free(text);

    ie_harmony_opts_t o = {IE_HARMONY_EFFORT_HIGH, "I am X.", "2099-01", "2000-02-03", 0};
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_DEVELOPER, IE_HARMONY_CH_NONE, "Be brief.", 9), IE_OK);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_USER, IE_HARMONY_CH_NONE, "Hi", 2), IE_OK);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_ASSISTANT, IE_HARMONY_CH_ANALYSIS, "greet", 5), IE_OK);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_ASSISTANT, IE_HARMONY_CH_NONE, "Hello", 5), IE_OK);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_USER, IE_HARMONY_CH_NONE, "", 0), IE_OK);
    CU_ASSERT_EQUAL(ie_harmony_conv_len(conv), 5);
    CU_ASSERT_EQUAL(ie_harmony_render(conv, &o, &text, &len), IE_OK);
    const char *want =
        "<|start|>system<|message|>I am X.\nKnowledge cutoff: 2099-01\nCurrent date: 2000-02-03\n\n"
        "Reasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
        "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello<|end|>"
        "<|start|>user<|message|><|end|><|start|>assistant";
    CU_ASSERT_STRING_EQUAL(text, want);
    CU_ASSERT_EQUAL(len, strlen(want));
    free(text);
    ie_harmony_conv_destroy(&conv);
    ie_harmony_conv_destroy(&conv); /* NULL is fine */

    ie_harmony_effort_t e;
    CU_ASSERT_EQUAL(ie_harmony_effort_parse("low", &e), IE_OK);
    CU_ASSERT_EQUAL(e, IE_HARMONY_EFFORT_LOW);
    CU_ASSERT_EQUAL(ie_harmony_effort_parse("LOW", &e), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_harmony_effort_parse(NULL, &e), IE_ERR_INVAL);
    CU_ASSERT_STRING_EQUAL(ie_harmony_channel_str(IE_HARMONY_CH_FINAL), "final");
    CU_ASSERT_STRING_EQUAL(ie_harmony_role_str(IE_HARMONY_ASSISTANT), "assistant");
}

static void test_bad_input(void)
{
    static const struct {
        const char *json;
        ie_status_t want;
        const char *msg; /* part of the error message */
    } cases[] = {
        {"", IE_ERR_FORMAT, "not valid JSON"},
        {"[{\"role\":\"user\",\"content\":\"x\"}", IE_ERR_FORMAT, "not valid JSON"},
        {"{\"role\":\"user\"}", IE_ERR_FORMAT, "JSON array"},
        {"[1]", IE_ERR_FORMAT, "message 0 is not a JSON object"},
        {"[] x", IE_ERR_FORMAT, "trailing"},
        {"[{\"content\":\"x\"}]", IE_ERR_INVAL, "no \"role\""},
        {"[{\"role\":5,\"content\":\"x\"}]", IE_ERR_INVAL, "\"role\" must be a string"},
        {"[{\"role\":\"bot\",\"content\":\"x\"}]", IE_ERR_INVAL, "unknown role 'bot'"},
        {"[{\"role\":\"user\"}]", IE_ERR_INVAL, "no \"content\""},
        {"[{\"role\":\"user\",\"content\":null}]", IE_ERR_INVAL, "\"content\" must be a string"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]", IE_ERR_INVAL, "must be a string"},
        {"[{\"role\":\"user\",\"content\":\"x\",\"channel\":\"final\"}]", IE_ERR_INVAL, "only assistant"},
        {"[{\"role\":\"assistant\",\"content\":\"x\",\"channel\":\"thoughts\"}]", IE_ERR_INVAL, "unknown channel"},
        {"[{\"role\":\"assistant\",\"content\":\"x\",\"channel\":7}]", IE_ERR_INVAL, "must be a string"},
        {"[{\"role\":\"assistant\",\"content\":\"x\",\"channel\":\"commentary\"}]", IE_ERR_UNSUPPORTED,
         "commentary"},
        {"[{\"role\":\"tool\",\"content\":\"x\"}]", IE_ERR_UNSUPPORTED, "tool"},
        {"[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[]}]", IE_ERR_UNSUPPORTED, "tool"},
        {"[{\"role\":\"user\",\"content\":\"x\",\"thinking\":\"y\"}]", IE_ERR_INVAL, "thinking"},
        {"[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"\\u00ff\",\"x\":1},{\"role\":1}"
         "]",
         IE_ERR_INVAL, "message 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ie_harmony_conv_t *conv = (ie_harmony_conv_t *)&cases; /* must be reset to NULL */
        ie_status_t st = ie_harmony_conv_from_json(cases[i].json, strlen(cases[i].json), &conv);
        if (st != cases[i].want || !strstr(ie_error_last(), cases[i].msg)) {
            fprintf(stderr, "\nbad case %zu: st=%d want %d, '%s' (want '%s')\n", i, (int)st, (int)cases[i].want,
                    ie_error_last(), cases[i].msg);
        }
        CU_ASSERT_EQUAL(st, cases[i].want);
        CU_ASSERT(strstr(ie_error_last(), cases[i].msg) != NULL);
        CU_ASSERT_PTR_NULL(conv);
    }

    /* well-formed JSON the renderer refuses */
    static const struct {
        const char *json;
        const char *msg;
    } render_bad[] = {
        {"[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"system\",\"content\":\"y\"}]", "may only come first"},
        {"[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"developer\",\"content\":\"y\"}]",
         "may only come first"},
        {"[{\"role\":\"assistant\",\"channel\":\"analysis\",\"content\":\"x\"}]", "followed by its final"},
        {"[{\"role\":\"assistant\",\"channel\":\"analysis\",\"content\":\"x\"},{\"role\":\"user\",\"content\":"
         "\"y\"}]",
         "followed by its final"},
        {"[{\"role\":\"assistant\",\"content\":\"a<|channel|>final<|message|>b\"}]", "<|channel|> tags"},
        {"[{\"role\":\"assistant\",\"thinking\":\"<|channel|>analysis<|message|>\",\"content\":\"b\"}]",
         "<|channel|> tags"},
    };
    for (size_t i = 0; i < sizeof render_bad / sizeof render_bad[0]; i++) {
        ie_harmony_conv_t *conv = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_harmony_conv_from_json(render_bad[i].json, strlen(render_bad[i].json), &conv),
                              IE_OK);
        char *text = (char *)"junk";
        size_t len = 7;
        ie_status_t st = ie_harmony_render(conv, NULL, &text, &len);
        CU_ASSERT_EQUAL(st, IE_ERR_INVAL);
        CU_ASSERT(strstr(ie_error_last(), render_bad[i].msg) != NULL);
        CU_ASSERT_PTR_NULL(text);
        CU_ASSERT_EQUAL(len, 0);
        ie_harmony_conv_destroy(&conv);
    }

    /* the C API checks too */
    ie_harmony_conv_t *conv = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_harmony_conv_new(&conv), IE_OK);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_USER, IE_HARMONY_CH_NONE, "bad \xff", 5), IE_ERR_INVAL);
    CU_ASSERT(strstr(ie_error_last(), "invalid UTF-8") != NULL);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_USER, IE_HARMONY_CH_FINAL, "x", 1), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_ASSISTANT, IE_HARMONY_CH_OTHER, "x", 1), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, (ie_harmony_role_t)9, IE_HARMONY_CH_NONE, "x", 1), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_harmony_conv_add(conv, IE_HARMONY_USER, IE_HARMONY_CH_NONE, NULL, 0), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_harmony_conv_len(conv), 0);
    ie_harmony_opts_t o;
    memset(&o, 0, sizeof o);
    o.effort = (ie_harmony_effort_t)7;
    char *text = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(ie_harmony_render(conv, &o, &text, &len), IE_ERR_INVAL);
    o.effort = IE_HARMONY_EFFORT_LOW;
    o.current_date = "\xc3";
    CU_ASSERT_EQUAL(ie_harmony_render(conv, &o, &text, &len), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_harmony_render(NULL, NULL, &text, &len), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(text);
    ie_harmony_conv_destroy(&conv);
    CU_ASSERT_EQUAL(ie_harmony_conv_from_json(NULL, 0, &conv), IE_ERR_INVAL);
}

/* ---------------------------------------------------------------- parser */

/* What the emit callback saw, per channel. */
typedef struct seen {
    char text[5][512];
    size_t len[5];
    size_t calls;
} seen_t;

static void on_emit(void *user, ie_harmony_channel_t ch, const char *text, size_t len)
{
    seen_t *s = user;
    s->calls++;
    if ((unsigned)ch < 5 && s->len[ch] + len < sizeof s->text[ch]) {
        memcpy(s->text[ch] + s->len[ch], text, len);
        s->len[ch] += len;
        s->text[ch][s->len[ch]] = '\0';
    }
}

static const char STREAM[] =
    "<|channel|>analysis<|message|>User asks 2+2. <b>Easy</b> < 5.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is 4 \xF0\x9F\x8C\x8D.<|return|>ignored<|end|>";
static const char STREAM_ANALYSIS[] = "User asks 2+2. <b>Easy</b> < 5.";
static const char STREAM_FINAL[] = "The answer is 4 \xF0\x9F\x8C\x8D.";

static void check_stream_result(const ie_harmony_parser_t *p, const seen_t *s)
{
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_ANALYSIS, NULL), STREAM_ANALYSIS);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_FINAL, NULL), STREAM_FINAL);
    CU_ASSERT_STRING_EQUAL(s->text[IE_HARMONY_CH_ANALYSIS], STREAM_ANALYSIS);
    CU_ASSERT_STRING_EQUAL(s->text[IE_HARMONY_CH_FINAL], STREAM_FINAL);
    CU_ASSERT_EQUAL(s->len[IE_HARMONY_CH_NONE] + s->len[IE_HARMONY_CH_OTHER] + s->len[IE_HARMONY_CH_COMMENTARY], 0);
    CU_ASSERT_EQUAL(ie_harmony_parser_stop(p), IE_HARMONY_STOP_RETURN);
    CU_ASSERT_EQUAL(ie_harmony_parser_n_messages(p), 2);
}

static void test_parser_split_text(void)
{
    size_t n = strlen(STREAM);
    /* one cut at every position, and a second cut 3 bytes later */
    for (size_t cut = 0; cut <= n; cut++) {
        for (size_t extra = 0; extra <= 3; extra += 3) {
            size_t cut2 = cut + extra > n ? n : cut + extra;
            seen_t s;
            memset(&s, 0, sizeof s);
            ie_harmony_parser_t *p = NULL;
            CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(NULL, on_emit, &s, &p), IE_OK);
            CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, STREAM, cut), IE_OK);
            CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, STREAM + cut, cut2 - cut), IE_OK);
            CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, STREAM + cut2, n - cut2), IE_OK);
            CU_ASSERT_EQUAL(ie_harmony_parser_finish(p), IE_OK);
            check_stream_result(p, &s);
            ie_harmony_parser_destroy(&p);
        }
    }
    /* byte by byte, watching the current channel */
    seen_t s;
    memset(&s, 0, sizeof s);
    ie_harmony_parser_t *p = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(NULL, on_emit, &s, &p), IE_OK);
    int saw_analysis = 0, saw_final = 0;
    for (size_t i = 0; i < n; i++) {
        CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, STREAM + i, 1), IE_OK);
        saw_analysis |= ie_harmony_parser_channel(p) == IE_HARMONY_CH_ANALYSIS;
        saw_final |= ie_harmony_parser_channel(p) == IE_HARMONY_CH_FINAL;
    }
    CU_ASSERT_EQUAL(ie_harmony_parser_finish(p), IE_OK);
    CU_ASSERT(saw_analysis && saw_final);
    check_stream_result(p, &s);
    CU_ASSERT(s.calls > 10);
    /* input after the stop is ignored */
    CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, "more", 4), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_FINAL, NULL), STREAM_FINAL);
    ie_harmony_parser_destroy(&p);
    ie_harmony_parser_destroy(&p);
}

static void test_parser_edge_cases(void)
{
    ie_harmony_parser_t *p = NULL;
    size_t len = 0;

    /* a cut-off marker prefix is content once the stream ends */
    CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(NULL, NULL, NULL, &p), IE_OK);
    const char *s1 = "<|channel|>final<|message|>a <|en";
    CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, s1, strlen(s1)), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_FINAL, &len), "a ");
    CU_ASSERT_EQUAL(ie_harmony_parser_finish(p), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_FINAL, &len), "a <|en");
    CU_ASSERT_EQUAL(len, 6);
    CU_ASSERT_EQUAL(ie_harmony_parser_stop(p), IE_HARMONY_STOP_NONE);
    ie_harmony_parser_destroy(&p);

    /* a tool call: commentary channel, recipient, <|constrain|>, <|call|> */
    CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(NULL, NULL, NULL, &p), IE_OK);
    const char *s2 = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
    CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, s2, strlen(s2)), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_COMMENTARY, NULL), "{\"city\":\"Paris\"}");
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_recipient(p), "functions.get_weather");
    CU_ASSERT_EQUAL(ie_harmony_parser_stop(p), IE_HARMONY_STOP_CALL);
    ie_harmony_parser_destroy(&p);

    /* recipient before the channel; no channel at all; unknown channel */
    CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(NULL, NULL, NULL, &p), IE_OK);
    const char *s3 = " to=browser.search<|channel|>commentary<|message|>q<|end|>"
                     "<|start|>assistant<|message|>plain<|end|><|start|>assistant<|channel|>weird<|message|>w";
    CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, s3, strlen(s3)), IE_OK);
    CU_ASSERT_EQUAL(ie_harmony_parser_finish(p), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_recipient(p), "browser.search");
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_COMMENTARY, NULL), "q");
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_NONE, NULL), "plain");
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_OTHER, NULL), "w");
    CU_ASSERT_EQUAL(ie_harmony_parser_n_messages(p), 3);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, (ie_harmony_channel_t)99, &len), "");
    CU_ASSERT_EQUAL(len, 0);
    /* no tokenizer: no token input */
    CU_ASSERT_EQUAL(ie_harmony_parser_push_token(p, 5), IE_ERR_INVAL);
    ie_harmony_parser_destroy(&p);

    /* a model that skips <|end|><|start|>assistant before the next channel */
    CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(NULL, NULL, NULL, &p), IE_OK);
    const char *s4 = "<|channel|>analysis<|message|>x<|channel|>final<|message|>y<|return|>";
    CU_ASSERT_EQUAL(ie_harmony_parser_push_text(p, s4, strlen(s4)), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_ANALYSIS, NULL), "x");
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_FINAL, NULL), "y");
    ie_harmony_parser_destroy(&p);
    CU_ASSERT_EQUAL(ie_harmony_parser_new(NULL, NULL, NULL, NULL), IE_ERR_INVAL);
}

static void test_parser_tokens(void)
{
    int32_t *ids = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_encode(g_tok, STREAM, strlen(STREAM), IE_TOK_PARSE_SPECIAL, &ids, &n),
                          IE_OK);
    seen_t s;
    memset(&s, 0, sizeof s);
    ie_harmony_parser_t *p = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(g_tok, on_emit, &s, &p), IE_OK);
    for (size_t i = 0; i < n; i++) { CU_ASSERT_EQUAL(ie_harmony_parser_push_token(p, ids[i]), IE_OK); }
    CU_ASSERT_EQUAL(ie_harmony_parser_finish(p), IE_OK);
    check_stream_result(p, &s);
    ie_harmony_parser_destroy(&p);
    free(ids);

    /* the emoji split over two tokens reaches the callback whole */
    const char *s2 = "<|channel|>final<|message|>\xF0\x9F\x8C\x8D";
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_encode(g_tok, s2, strlen(s2), IE_TOK_PARSE_SPECIAL, &ids, &n), IE_OK);
    CU_ASSERT(n >= 4);
    memset(&s, 0, sizeof s);
    CU_ASSERT_EQUAL_FATAL(ie_harmony_parser_new(g_tok, on_emit, &s, &p), IE_OK);
    for (size_t i = 0; i < n; i++) { CU_ASSERT_EQUAL(ie_harmony_parser_push_token(p, ids[i]), IE_OK); }
    CU_ASSERT_EQUAL(s.calls, 1);
    CU_ASSERT_STRING_EQUAL(s.text[IE_HARMONY_CH_FINAL], "\xF0\x9F\x8C\x8D");
    /* ordinary tokens that spell a marker are content; <|endoftext|> stops */
    int32_t *plain = NULL;
    size_t np = 0;
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_encode(g_tok, "<|end|>", 7, 0, &plain, &np), IE_OK);
    for (size_t i = 0; i < np; i++) { CU_ASSERT_EQUAL(ie_harmony_parser_push_token(p, plain[i]), IE_OK); }
    CU_ASSERT_EQUAL(ie_harmony_parser_push_token(p, 200018), IE_OK); /* <|endofprompt|>: ignored */
    CU_ASSERT_EQUAL(ie_harmony_parser_push_token(p, 199999), IE_OK); /* <|endoftext|> */
    CU_ASSERT_EQUAL(ie_harmony_parser_stop(p), IE_HARMONY_STOP_EOS);
    CU_ASSERT_STRING_EQUAL(ie_harmony_parser_text(p, IE_HARMONY_CH_FINAL, NULL), "\xF0\x9F\x8C\x8D<|end|>");
    ie_harmony_parser_destroy(&p);
    free(plain);
    free(ids);
}

/* ---------------------------------------------------------------- main */

int main(void)
{
    if (ie_tokenizer_load(O200K, &g_tok) != IE_OK) {
        fprintf(stderr, "load %s: %s\n", O200K, ie_error_last());
        return 1;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) { return 1; }
    CU_pSuite s = CU_add_suite("harmony", NULL, NULL);
    CU_add_test(s, "renderings vs the jinja template", test_reference_cases);
    CU_add_test(s, "C API and defaults", test_api);
    CU_add_test(s, "bad input", test_bad_input);
    CU_add_test(s, "parser: text split anywhere", test_parser_split_text);
    CU_add_test(s, "parser: edge cases", test_parser_edge_cases);
    CU_add_test(s, "parser: token ids", test_parser_tokens);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    ie_tokenizer_destroy(&g_tok);
    return fails ? 1 : 0;
}
