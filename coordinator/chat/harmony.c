/* harmony.c — gpt-oss "harmony" chat format: render conversations into the
 * prompt text of gpt-oss's chat template, and parse generated output into
 * channels as it streams. See ie_harmony.h for the rules.
 *
 * The renderer mirrors openai-gpt-oss's jinja template line for line (the
 * strings below are the template's); tests/reference/gen_harmony_ref.py
 * renders the same conversations with transformers' apply_chat_template and
 * tests/unit/test_harmony.c compares byte for byte.
 */
#include "ie_harmony.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ================================================================ buffers */

/* Growable byte string, always NUL-terminated once non-empty. */
typedef struct hbuf {
    char *p;
    size_t n, cap;
} hbuf_t;

static ie_status_t hbuf_add(hbuf_t *b, const char *s, size_t n)
{
    if (n > SIZE_MAX / 2 - b->n - 1) { return ie_error_set(IE_ERR_RANGE, "harmony: text too long"); }
    if (b->n + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->n + n + 1) { ncap *= 2; }
        char *np = realloc(b->p, ncap);
        if (!np) { return ie_error_set(IE_ERR_NOMEM, "harmony: out of memory"); }
        b->p = np;
        b->cap = ncap;
    }
    if (n) { memcpy(b->p + b->n, s, n); }
    b->n += n;
    b->p[b->n] = '\0';
    return IE_OK;
}

static ie_status_t hbuf_str(hbuf_t *b, const char *s) { return hbuf_add(b, s, strlen(s)); }

/* Empty it, keeping the memory (and the NUL, so p is "" not stale text). */
static void hbuf_clear(hbuf_t *b)
{
    b->n = 0;
    if (b->p) { b->p[0] = '\0'; }
}

static void hbuf_free(hbuf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* Prefix the current error message: ie_error_set may not read the buffer
 * it writes, so copy the old message first. */
static ie_status_t rewrap(ie_status_t st, const char *what, size_t idx)
{
    char old[256];
    snprintf(old, sizeof old, "%s", ie_error_last());
    if (what) { return ie_error_set(st, "harmony: %s: %s", what, old); }
    return ie_error_set(st, "harmony: message %zu: %s", idx, old);
}

/* ================================================================ names */

static const char *const ROLE_NAMES[] = {"system", "developer", "user", "assistant"};
static const char *const CHANNEL_NAMES[] = {"none", "analysis", "commentary", "final", "other"};
static const char *const EFFORT_NAMES[] = {"medium", "low", "high"};

const char *ie_harmony_role_str(ie_harmony_role_t role)
{
    return (unsigned)role < 4 ? ROLE_NAMES[role] : "unknown";
}

const char *ie_harmony_channel_str(ie_harmony_channel_t ch)
{
    return (unsigned)ch < 5 ? CHANNEL_NAMES[ch] : "unknown";
}

ie_status_t ie_harmony_effort_parse(const char *s, ie_harmony_effort_t *out)
{
    for (int k = 0; s && k < 3; k++) {
        if (strcmp(s, EFFORT_NAMES[k]) == 0) {
            *out = (ie_harmony_effort_t)k;
            return IE_OK;
        }
    }
    return ie_error_set(IE_ERR_INVAL, "harmony: reasoning effort '%.32s' is not low, medium or high", s ? s : "");
}

/* ================================================================ conversation */

typedef struct hmsg {
    ie_harmony_role_t role;
    ie_harmony_channel_t channel;
    char *content; /* owned, NUL-terminated */
    size_t len;
} hmsg_t;

struct ie_harmony_conv {
    hmsg_t *v;
    size_t n, cap;
};

ie_status_t ie_harmony_conv_new(ie_harmony_conv_t **out)
{
    if (!out) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_conv_new: out is NULL"); }
    *out = calloc(1, sizeof **out);
    return *out ? IE_OK : ie_error_set(IE_ERR_NOMEM, "harmony: out of memory");
}

void ie_harmony_conv_destroy(ie_harmony_conv_t **self_p)
{
    if (!self_p || !*self_p) { return; }
    ie_harmony_conv_t *c = *self_p;
    for (size_t i = 0; i < c->n; i++) { free(c->v[i].content); }
    free(c->v);
    free(c);
    *self_p = NULL;
}

size_t ie_harmony_conv_len(const ie_harmony_conv_t *conv) { return conv ? conv->n : 0; }

ie_status_t ie_harmony_conv_add(ie_harmony_conv_t *conv, ie_harmony_role_t role, ie_harmony_channel_t channel,
                                const char *content, size_t len)
{
    if (!conv || !content) { return ie_error_set(IE_ERR_INVAL, "harmony: NULL conversation or content"); }
    if ((unsigned)role > IE_HARMONY_ASSISTANT) {
        return ie_error_set(IE_ERR_INVAL, "harmony: unknown role %d", (int)role);
    }
    if (role != IE_HARMONY_ASSISTANT && channel != IE_HARMONY_CH_NONE) {
        return ie_error_set(IE_ERR_INVAL, "harmony: only assistant messages have a channel (%s message on '%s')",
                            ie_harmony_role_str(role), ie_harmony_channel_str(channel));
    }
    if (channel == IE_HARMONY_CH_COMMENTARY) {
        return ie_error_set(IE_ERR_UNSUPPORTED, "harmony: commentary (tool call) messages are not supported");
    }
    if (channel != IE_HARMONY_CH_NONE && channel != IE_HARMONY_CH_ANALYSIS && channel != IE_HARMONY_CH_FINAL) {
        return ie_error_set(IE_ERR_INVAL, "harmony: unknown channel %d", (int)channel);
    }
    if (ie_tokenizer_check_utf8(content, len) != IE_OK) {
        return rewrap(IE_ERR_INVAL, ie_harmony_role_str(role), 0);
    }
    if (conv->n == conv->cap) {
        size_t ncap = conv->cap ? conv->cap * 2 : 8;
        hmsg_t *nv = realloc(conv->v, ncap * sizeof *nv);
        if (!nv) { return ie_error_set(IE_ERR_NOMEM, "harmony: out of memory"); }
        conv->v = nv;
        conv->cap = ncap;
    }
    char *copy = malloc(len + 1);
    if (!copy) { return ie_error_set(IE_ERR_NOMEM, "harmony: out of memory"); }
    memcpy(copy, content, len);
    copy[len] = '\0';
    hmsg_t *m = &conv->v[conv->n++];
    m->role = role;
    m->channel = role == IE_HARMONY_ASSISTANT && channel == IE_HARMONY_CH_NONE ? IE_HARMONY_CH_FINAL : channel;
    m->content = copy;
    m->len = len;
    return IE_OK;
}

/* A string member of a message object: NULL if absent; error if not a string. */
static ie_status_t json_str(const cJSON *msg, size_t idx, const char *key, int required, const char **out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(msg, key);
    *out = NULL;
    if (!it) {
        return required ? ie_error_set(IE_ERR_INVAL, "harmony: message %zu has no \"%s\"", idx, key) : IE_OK;
    }
    if (!cJSON_IsString(it)) {
        return ie_error_set(IE_ERR_INVAL, "harmony: message %zu: \"%s\" must be a string", idx, key);
    }
    *out = it->valuestring;
    return IE_OK;
}

ie_status_t ie_harmony_conv_from_json(const char *json, size_t len, ie_harmony_conv_t **out)
{
    ie_status_t st = IE_OK;
    cJSON *root = NULL;
    ie_harmony_conv_t *c = NULL;
    if (!out) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_conv_from_json: out is NULL"); }
    *out = NULL;
    if (!json) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_conv_from_json: json is NULL"); }
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        st = ie_error_set(IE_ERR_FORMAT, "harmony: messages are not valid JSON (near byte %zu)", at);
        goto cleanup;
    }
    for (const char *p = end; p && p < json + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            st = ie_error_set(IE_ERR_FORMAT, "harmony: trailing characters after the JSON messages (byte %zu)",
                              (size_t)(p - json));
            goto cleanup;
        }
    }
    if (!cJSON_IsArray(root)) {
        st = ie_error_set(IE_ERR_FORMAT,
                          "harmony: messages must be a JSON array of {\"role\", \"content\"} objects");
        goto cleanup;
    }
    if ((st = ie_harmony_conv_new(&c)) != IE_OK) { goto cleanup; }
    size_t idx = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, root)
    {
        const char *role_s = NULL, *content = NULL, *chan_s = NULL, *thinking = NULL;
        if (!cJSON_IsObject(msg)) {
            st = ie_error_set(IE_ERR_FORMAT, "harmony: message %zu is not a JSON object", idx);
            goto cleanup;
        }
        if ((st = json_str(msg, idx, "role", 1, &role_s)) != IE_OK) { goto cleanup; }
        int role = -1;
        for (int k = 0; k < 4; k++) {
            if (strcmp(role_s, ROLE_NAMES[k]) == 0) { role = k; }
        }
        if (strcmp(role_s, "tool") == 0 || cJSON_GetObjectItemCaseSensitive(msg, "tool_calls")) {
            st = ie_error_set(IE_ERR_UNSUPPORTED, "harmony: message %zu: tools and tool calls are not supported",
                              idx);
            goto cleanup;
        }
        if (role < 0) {
            st = ie_error_set(
                IE_ERR_INVAL,
                "harmony: message %zu: unknown role '%.32s' (want system, developer, user or assistant)", idx,
                role_s);
            goto cleanup;
        }
        if ((st = json_str(msg, idx, "content", 1, &content)) != IE_OK ||
            (st = json_str(msg, idx, "channel", 0, &chan_s)) != IE_OK ||
            (st = json_str(msg, idx, "thinking", 0, &thinking)) != IE_OK) {
            goto cleanup;
        }
        ie_harmony_channel_t ch = IE_HARMONY_CH_NONE;
        if (chan_s) {
            if (strcmp(chan_s, "analysis") == 0) {
                ch = IE_HARMONY_CH_ANALYSIS;
            } else if (strcmp(chan_s, "final") == 0) {
                ch = IE_HARMONY_CH_FINAL;
            } else if (strcmp(chan_s, "commentary") == 0) {
                st = ie_error_set(IE_ERR_UNSUPPORTED,
                                  "harmony: message %zu: channel commentary (tool calls) is not "
                                  "supported",
                                  idx);
                goto cleanup;
            } else {
                st = ie_error_set(IE_ERR_INVAL,
                                  "harmony: message %zu: unknown channel '%.32s' (want analysis or final)", idx,
                                  chan_s);
                goto cleanup;
            }
            if (role != IE_HARMONY_ASSISTANT) {
                st = ie_error_set(IE_ERR_INVAL, "harmony: message %zu: only assistant messages have a channel",
                                  idx);
                goto cleanup;
            }
        }
        if (thinking && (role != IE_HARMONY_ASSISTANT || ch == IE_HARMONY_CH_ANALYSIS)) {
            st = ie_error_set(IE_ERR_INVAL,
                              "harmony: message %zu: \"thinking\" belongs on a final assistant message", idx);
            goto cleanup;
        }
        if (thinking && (st = ie_harmony_conv_add(c, IE_HARMONY_ASSISTANT, IE_HARMONY_CH_ANALYSIS, thinking,
                                                  strlen(thinking))) != IE_OK) {
            goto cleanup;
        }
        if ((st = ie_harmony_conv_add(c, (ie_harmony_role_t)role, ch, content, strlen(content))) != IE_OK) {
            st = rewrap(st, NULL, idx);
            goto cleanup;
        }
        idx++;
    }
    *out = c;
    c = NULL;

cleanup:
    ie_harmony_conv_destroy(&c);
    cJSON_Delete(root);
    return st;
}

/* ================================================================ render */

static const char DEFAULT_IDENTITY[] = "You are ChatGPT, a large language model trained by OpenAI.";
static const char DEFAULT_CUTOFF[] = "2024-06";

/* The template refuses assistant text that already carries channel tags. */
static ie_status_t check_no_tags(const hmsg_t *m, size_t idx)
{
    if (strstr(m->content, "<|channel|>analysis<|message|>") || strstr(m->content, "<|channel|>final<|message|>")) {
        return ie_error_set(IE_ERR_INVAL,
                            "harmony: message %zu: assistant text contains <|channel|> tags; pass "
                            "the analysis and the final text as separate messages",
                            idx);
    }
    return IE_OK;
}

static ie_status_t opt_str(const char *s, const char *what)
{
    if (ie_tokenizer_check_utf8(s, strlen(s)) != IE_OK) { return rewrap(IE_ERR_INVAL, what, 0); }
    return IE_OK;
}

ie_status_t ie_harmony_render(const ie_harmony_conv_t *conv, const ie_harmony_opts_t *opts, char **text_out,
                              size_t *len_out)
{
    ie_status_t st = IE_OK;
    hbuf_t b = {0};
    static const ie_harmony_opts_t defaults;
    char today[32];
    if (!text_out || !len_out) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_render: NULL output"); }
    *text_out = NULL;
    *len_out = 0;
    if (!conv) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_render: NULL conversation"); }
    if (!opts) { opts = &defaults; }
    if ((unsigned)opts->effort > IE_HARMONY_EFFORT_HIGH) {
        return ie_error_set(IE_ERR_INVAL, "harmony: unknown reasoning effort %d", (int)opts->effort);
    }
    const char *identity = opts->model_identity ? opts->model_identity : DEFAULT_IDENTITY;
    const char *cutoff = opts->knowledge_cutoff ? opts->knowledge_cutoff : DEFAULT_CUTOFF;
    const char *date = opts->current_date;
    if (!date) {
        /* strftime_now("%Y-%m-%d"): the local date */
        time_t now = time(NULL);
        struct tm tmv;
        if (!localtime_r(&now, &tmv) || strftime(today, sizeof today, "%Y-%m-%d", &tmv) == 0) {
            return ie_error_set(IE_ERR_INTERNAL, "harmony: cannot format today's date");
        }
        date = today;
    }
    if ((st = opt_str(identity, "model identity")) != IE_OK ||
        (st = opt_str(cutoff, "knowledge cutoff")) != IE_OK || (st = opt_str(date, "current date")) != IE_OK) {
        return st;
    }

    /* ---- system message (build_system_message) */
    if ((st = hbuf_str(&b, "<|start|>system<|message|>")) != IE_OK || (st = hbuf_str(&b, identity)) != IE_OK ||
        (st = hbuf_str(&b, "\nKnowledge cutoff: ")) != IE_OK || (st = hbuf_str(&b, cutoff)) != IE_OK ||
        (st = hbuf_str(&b, "\nCurrent date: ")) != IE_OK || (st = hbuf_str(&b, date)) != IE_OK ||
        (st = hbuf_str(&b, "\n\nReasoning: ")) != IE_OK ||
        (st = hbuf_str(&b, EFFORT_NAMES[opts->effort])) != IE_OK ||
        (st = hbuf_str(&b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
                           "message.<|end|>")) != IE_OK) {
        goto cleanup;
    }

    /* ---- developer message: the first message if system or developer */
    size_t i = 0;
    if (conv->n > 0 && (conv->v[0].role == IE_HARMONY_SYSTEM || conv->v[0].role == IE_HARMONY_DEVELOPER)) {
        const hmsg_t *d = &conv->v[0];
        if (d->len > 0 &&
            ((st = hbuf_str(&b, "<|start|>developer<|message|># Instructions\n\n")) != IE_OK ||
             (st = hbuf_add(&b, d->content, d->len)) != IE_OK || (st = hbuf_str(&b, "\n\n<|end|>")) != IE_OK)) {
            goto cleanup;
        }
        i = 1;
    }

    /* ---- the other messages */
    for (; i < conv->n; i++) {
        const hmsg_t *m = &conv->v[i];
        const hmsg_t *thinking = NULL;
        switch (m->role) {
        case IE_HARMONY_SYSTEM:
        case IE_HARMONY_DEVELOPER:
            st = ie_error_set(IE_ERR_INVAL, "harmony: message %zu: a %s message may only come first", i,
                              ie_harmony_role_str(m->role));
            goto cleanup;
        case IE_HARMONY_USER:
            if ((st = hbuf_str(&b, "<|start|>user<|message|>")) != IE_OK ||
                (st = hbuf_add(&b, m->content, m->len)) != IE_OK || (st = hbuf_str(&b, "<|end|>")) != IE_OK) {
                goto cleanup;
            }
            break;
        case IE_HARMONY_ASSISTANT:
            if (m->channel == IE_HARMONY_CH_ANALYSIS) {
                /* the chain of thought belongs to the final message after it */
                if (i + 1 >= conv->n || conv->v[i + 1].role != IE_HARMONY_ASSISTANT ||
                    conv->v[i + 1].channel != IE_HARMONY_CH_FINAL) {
                    st = ie_error_set(IE_ERR_INVAL,
                                      "harmony: message %zu: an analysis message must be followed by its final "
                                      "assistant message",
                                      i);
                    goto cleanup;
                }
                if ((st = check_no_tags(m, i)) != IE_OK) { goto cleanup; }
                thinking = m;
                m = &conv->v[++i];
            }
            if ((st = check_no_tags(m, i)) != IE_OK) { goto cleanup; }
            if (opts->no_generation_prompt && i + 1 == conv->n) {
                /* training-style last turn: keeps its analysis, ends in <|return|> */
                if (thinking && ((st = hbuf_str(&b, "<|start|>assistant<|channel|>analysis<|message|>")) != IE_OK ||
                                 (st = hbuf_add(&b, thinking->content, thinking->len)) != IE_OK ||
                                 (st = hbuf_str(&b, "<|end|>")) != IE_OK)) {
                    goto cleanup;
                }
                if ((st = hbuf_str(&b, "<|start|>assistant<|channel|>final<|message|>")) != IE_OK ||
                    (st = hbuf_add(&b, m->content, m->len)) != IE_OK ||
                    (st = hbuf_str(&b, "<|return|>")) != IE_OK) {
                    goto cleanup;
                }
            } else if ((st = hbuf_str(&b, "<|start|>assistant<|channel|>final<|message|>")) != IE_OK ||
                       (st = hbuf_add(&b, m->content, m->len)) != IE_OK ||
                       (st = hbuf_str(&b, "<|end|>")) != IE_OK) {
                goto cleanup;
            }
            break;
        }
    }
    if (!opts->no_generation_prompt && (st = hbuf_str(&b, "<|start|>assistant")) != IE_OK) { goto cleanup; }
    *text_out = b.p;
    *len_out = b.n;
    b.p = NULL;

cleanup:
    hbuf_free(&b);
    return st;
}

/* ================================================================ parser */

enum { M_START, M_CHANNEL, M_MESSAGE, M_CONSTRAIN, M_END, M_RETURN, M_CALL, N_MARK };
static const char *const MARK_TEXT[N_MARK] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                              "<|end|>",   "<|return|>",  "<|call|>"};

typedef enum { ST_HEADER, ST_CONTENT, ST_BETWEEN } pstate_t;

struct ie_harmony_parser {
    const ie_tokenizer_t *tok; /* borrowed; NULL: text mode only */
    ie_detok_t *detok;
    ie_harmony_emit_fn emit;
    void *user;
    int32_t mark_id[N_MARK]; /* token ids of the markers (-1: none) */

    pstate_t state;
    int in_chan;             /* header text after <|channel|> */
    hbuf_t header;           /* header text before <|channel|> (role, to=) */
    hbuf_t chan_hdr;         /* header text after <|channel|>          */
    ie_harmony_channel_t ch; /* channel of the content being received   */
    hbuf_t text[5];          /* all content per channel                 */
    hbuf_t hold;             /* text mode: a possible marker prefix     */
    hbuf_t recipient;
    size_t n_msgs;
    ie_harmony_stop_t stop;
    int done;
};

ie_status_t ie_harmony_parser_new(const ie_tokenizer_t *tok, ie_harmony_emit_fn emit, void *user,
                                  ie_harmony_parser_t **out)
{
    ie_status_t st = IE_OK;
    if (!out) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_parser_new: out is NULL"); }
    *out = NULL;
    ie_harmony_parser_t *p = calloc(1, sizeof *p);
    if (!p) { return ie_error_set(IE_ERR_NOMEM, "harmony: out of memory"); }
    p->tok = tok;
    p->emit = emit;
    p->user = user;
    p->state = ST_HEADER; /* the prompt ended in "<|start|>assistant" */
    for (int k = 0; k < N_MARK; k++) {
        p->mark_id[k] = tok ? ie_tokenizer_find(tok, MARK_TEXT[k], strlen(MARK_TEXT[k])) : -1;
    }
    if (tok && (st = ie_detok_new(tok, &p->detok)) != IE_OK) {
        ie_harmony_parser_destroy(&p);
        return st;
    }
    *out = p;
    return IE_OK;
}

void ie_harmony_parser_destroy(ie_harmony_parser_t **self_p)
{
    if (!self_p || !*self_p) { return; }
    ie_harmony_parser_t *p = *self_p;
    ie_detok_destroy(&p->detok);
    hbuf_free(&p->header);
    hbuf_free(&p->chan_hdr);
    for (int k = 0; k < 5; k++) { hbuf_free(&p->text[k]); }
    hbuf_free(&p->hold);
    hbuf_free(&p->recipient);
    free(p);
    *self_p = NULL;
}

static int is_hspace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Plain text (never a marker) in the current state. */
static ie_status_t handle_text(ie_harmony_parser_t *p, const char *s, size_t n)
{
    ie_status_t st;
    if (n == 0) { return IE_OK; }
    if (p->state == ST_CONTENT) {
        if ((st = hbuf_add(&p->text[p->ch], s, n)) != IE_OK) { return st; }
        if (p->emit) { p->emit(p->user, p->ch, s, n); }
        return IE_OK;
    }
    /* header (or stray text between messages, dropped at the next header) */
    return hbuf_add(p->in_chan ? &p->chan_hdr : &p->header, s, n);
}

/* The header is complete: channel name and recipient. */
static ie_status_t finish_header(ie_harmony_parser_t *p)
{
    ie_status_t st = IE_OK;
    const char *c = p->chan_hdr.p ? p->chan_hdr.p : "";
    while (is_hspace(*c)) { c++; }
    size_t w = 0;
    while (c[w] && !is_hspace(c[w]) && c[w] != '<') { w++; }
    p->ch = !p->in_chan || w == 0 ? IE_HARMONY_CH_NONE : IE_HARMONY_CH_OTHER;
    for (int k = IE_HARMONY_CH_ANALYSIS; k <= IE_HARMONY_CH_FINAL && w && p->in_chan; k++) {
        if (strlen(CHANNEL_NAMES[k]) == w && memcmp(c, CHANNEL_NAMES[k], w) == 0) {
            p->ch = (ie_harmony_channel_t)k;
        }
    }
    /* "to=NAME" may sit before or after <|channel|> */
    const hbuf_t *parts[2] = {&p->header, &p->chan_hdr};
    for (int k = 0; k < 2; k++) {
        const char *h = parts[k]->p ? strstr(parts[k]->p, "to=") : NULL;
        if (h && (h == parts[k]->p || is_hspace(h[-1]))) {
            h += 3;
            size_t r = 0;
            while (h[r] && !is_hspace(h[r]) && h[r] != '<') { r++; }
            hbuf_clear(&p->recipient);
            if ((st = hbuf_add(&p->recipient, h, r)) != IE_OK) { return st; }
        }
    }
    p->state = ST_CONTENT;
    p->n_msgs++;
    return IE_OK;
}

static void new_header(ie_harmony_parser_t *p, int in_chan)
{
    p->state = ST_HEADER;
    p->in_chan = in_chan;
    hbuf_clear(&p->header);
    hbuf_clear(&p->chan_hdr);
    p->ch = IE_HARMONY_CH_NONE;
}

static ie_status_t handle_marker(ie_harmony_parser_t *p, int m)
{
    switch (m) {
    case M_START: new_header(p, 0); break;
    case M_CHANNEL:
        if (p->state == ST_HEADER) {
            p->in_chan = 1;
            hbuf_clear(&p->chan_hdr);
        } else {
            /* a header without <|end|><|start|>role before it: be lenient */
            new_header(p, 1);
        }
        break;
    case M_CONSTRAIN:
        if (p->state != ST_CONTENT) { return handle_text(p, " <|constrain|>", 14); }
        break; /* inside content: meaningless, dropped */
    case M_MESSAGE:
        if (p->state != ST_CONTENT) { return finish_header(p); }
        break;
    case M_END:
        p->state = ST_BETWEEN;
        p->ch = IE_HARMONY_CH_NONE;
        hbuf_clear(&p->header);
        hbuf_clear(&p->chan_hdr);
        p->in_chan = 0;
        break;
    case M_RETURN:
    case M_CALL:
        p->stop = m == M_RETURN ? IE_HARMONY_STOP_RETURN : IE_HARMONY_STOP_CALL;
        p->done = 1;
        p->state = ST_BETWEEN;
        break;
    }
    return IE_OK;
}

ie_status_t ie_harmony_parser_push_text(ie_harmony_parser_t *p, const char *text, size_t len)
{
    ie_status_t st = IE_OK;
    if (!p || (!text && len)) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_parser_push_text: NULL argument"); }
    if (p->done) { return IE_OK; }
    if ((st = hbuf_add(&p->hold, text, len)) != IE_OK) { return st; }
    const char *h = p->hold.p;
    size_t n = p->hold.n, i = 0;
    while (i < n && !p->done && st == IE_OK) {
        const char *lt = memchr(h + i, '<', n - i);
        size_t j = lt ? (size_t)(lt - h) : n;
        if (j > i) {
            st = handle_text(p, h + i, j - i);
            i = j;
            continue;
        }
        int match = -1, partial = 0;
        for (int k = 0; k < N_MARK; k++) {
            size_t ml = strlen(MARK_TEXT[k]);
            if (n - i >= ml) {
                if (memcmp(h + i, MARK_TEXT[k], ml) == 0) { match = k; }
            } else if (memcmp(h + i, MARK_TEXT[k], n - i) == 0) {
                partial = 1;
            }
        }
        if (match >= 0) {
            st = handle_marker(p, match);
            i += strlen(MARK_TEXT[match]);
        } else if (partial) {
            break; /* wait for the rest */
        } else {
            st = handle_text(p, h + i, 1);
            i++;
        }
    }
    if (p->done) { i = n; /* nothing after the stop token counts */ }
    memmove(p->hold.p, h + i, n - i);
    p->hold.n = n - i;
    p->hold.p[p->hold.n] = '\0';
    return st;
}

/* Text completed by the detokenizer so far. */
static ie_status_t flush_detok(ie_harmony_parser_t *p)
{
    const char *s = ie_detok_flush(p->detok);
    return handle_text(p, s, ie_detok_last_len(p->detok));
}

ie_status_t ie_harmony_parser_push_token(ie_harmony_parser_t *p, int32_t id)
{
    ie_status_t st = IE_OK;
    if (!p || !p->tok) {
        return ie_error_set(IE_ERR_INVAL, "harmony: push_token needs a parser made with a tokenizer");
    }
    if (p->done) { return IE_OK; }
    for (int k = 0; k < N_MARK; k++) {
        if (id == p->mark_id[k]) {
            if ((st = flush_detok(p)) != IE_OK) { return st; }
            return handle_marker(p, k);
        }
    }
    if (ie_tokenizer_is_eog(p->tok, id)) {
        st = flush_detok(p);
        p->stop = IE_HARMONY_STOP_EOS;
        p->done = 1;
        return st;
    }
    if (ie_tokenizer_is_special(p->tok, id)) { return IE_OK; }
    const char *s = ie_detok_push(p->detok, id);
    return handle_text(p, s, ie_detok_last_len(p->detok));
}

ie_status_t ie_harmony_parser_finish(ie_harmony_parser_t *p)
{
    ie_status_t st = IE_OK;
    if (!p) { return ie_error_set(IE_ERR_INVAL, "ie_harmony_parser_finish: NULL parser"); }
    if (!p->done && p->hold.n) { st = handle_text(p, p->hold.p, p->hold.n); }
    p->hold.n = 0;
    if (st == IE_OK && !p->done && p->detok) { st = flush_detok(p); }
    return st;
}

ie_harmony_stop_t ie_harmony_parser_stop(const ie_harmony_parser_t *p)
{
    return p ? p->stop : IE_HARMONY_STOP_NONE;
}

const char *ie_harmony_parser_text(const ie_harmony_parser_t *p, ie_harmony_channel_t ch, size_t *len_out)
{
    const hbuf_t *b = p && (unsigned)ch < 5 ? &p->text[ch] : NULL;
    if (len_out) { *len_out = b ? b->n : 0; }
    return b && b->p ? b->p : "";
}

ie_harmony_channel_t ie_harmony_parser_channel(const ie_harmony_parser_t *p)
{
    return p && p->state == ST_CONTENT ? p->ch : IE_HARMONY_CH_NONE;
}

const char *ie_harmony_parser_recipient(const ie_harmony_parser_t *p)
{
    return p && p->recipient.p ? p->recipient.p : "";
}

size_t ie_harmony_parser_n_messages(const ie_harmony_parser_t *p) { return p ? p->n_msgs : 0; }
