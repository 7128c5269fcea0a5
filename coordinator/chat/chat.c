/* chat.c — messages JSON -> prompt text and ids (see ie_chat.h).
 *
 * Every format renders into a "masked" buffer: the text plus one byte per
 * text byte saying whether it came from message content (1) or from the
 * template (0). Encoding cuts the text only at template markers found where
 * the mask is 0, so content can never produce a control token.
 *
 * A model's jinja template is rendered by ie_jinja, which gives the mask
 * itself (strings from the messages are content); its markers are all the
 * vocabulary's special tokens, since a template may use any of them.
 * ChatML is rendered here directly. Harmony is rendered by ie_harmony,
 * which returns plain text; to learn where the content lies we render the
 * same conversation a second time with every non-empty content / thinking
 * string replaced by a placeholder ("\x1e<index>\x1e", a byte no template
 * text holds), substitute the originals back with mask 1 and check that the
 * result equals the real render byte for byte.
 */
#include "ie_chat.h"
#include "ie_gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const CHATML_MARKERS[] = {"<|im_start|>", "<|im_end|>", NULL};
static const char *const HARMONY_MARKERS[] = {"<|start|>",     "<|end|>",    "<|message|>", "<|channel|>",
                                              "<|constrain|>", "<|return|>", "<|call|>",    NULL};

static int has_token(const ie_tokenizer_t *tok, const char *s) { return ie_tokenizer_find(tok, s, strlen(s)) >= 0; }

ie_chat_format_t ie_chat_format(const ie_tokenizer_t *tok)
{
    if (!tok) return IE_CHAT_NONE;
    if (has_token(tok, "<|start|>") && has_token(tok, "<|channel|>")) return IE_CHAT_HARMONY;
    if (has_token(tok, "<|im_start|>") && has_token(tok, "<|im_end|>")) return IE_CHAT_CHATML;
    return IE_CHAT_NONE;
}

ie_chat_format_t ie_chat_format_for(const ie_tokenizer_t *tok, const ie_chat_opts_t *opts)
{
    ie_chat_format_t f = ie_chat_format(tok);
    if (f == IE_CHAT_HARMONY || !tok) return f;
    if (opts && (opts->tmpl || opts->tmpl_error)) return IE_CHAT_TEMPLATE;
    return f;
}

const char *ie_chat_format_name(ie_chat_format_t f)
{
    switch (f) {
    case IE_CHAT_TEMPLATE: return "template";
    case IE_CHAT_CHATML: return "chatml";
    case IE_CHAT_HARMONY: return "harmony";
    case IE_CHAT_NONE: break;
    }
    return "none";
}

/* ------------------------------------------------------------ masked text */

typedef struct mbuf {
    char *s;    /* text, NUL-terminated            */
    uint8_t *m; /* [len] 1 = content byte          */
    size_t len, cap;
} mbuf_t;

static ie_status_t mbuf_add(mbuf_t *b, const char *s, size_t n, uint8_t mask)
{
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) c *= 2;
        char *ns = realloc(b->s, c);
        if (!ns) return ie_error_set(IE_ERR_NOMEM, "out of memory");
        b->s = ns;
        uint8_t *nm = realloc(b->m, c);
        if (!nm) return ie_error_set(IE_ERR_NOMEM, "out of memory");
        b->m = nm;
        b->cap = c;
    }
    memcpy(b->s + b->len, s, n);
    memset(b->m + b->len, mask, n);
    b->len += n;
    b->s[b->len] = '\0';
    return IE_OK;
}

static ie_status_t mbuf_str(mbuf_t *b, const char *s) { return mbuf_add(b, s, strlen(s), 0); }

static void mbuf_free(mbuf_t *b)
{
    free(b->s);
    free(b->m);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------ ChatML */

static ie_status_t chatml_render(const char *json, mbuf_t *out)
{
    ie_status_t st = IE_OK;
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsArray(root)) {
        st = ie_error_set(IE_ERR_FORMAT, "chat: messages must be a JSON array of {\"role\", \"content\"} objects%s",
                          root ? "" : " (invalid JSON)");
        goto cleanup;
    }
    int n = cJSON_GetArraySize(root);
    if (n == 0) {
        st = ie_error_set(IE_ERR_INVAL, "chat: the conversation has no messages");
        goto cleanup;
    }
    /* validate everything before writing anything */
    for (int i = 0; i < n; i++) {
        cJSON *msg = cJSON_GetArrayItem(root, i);
        if (!cJSON_IsObject(msg)) {
            st = ie_error_set(IE_ERR_FORMAT, "chat: message %d is not a JSON object", i + 1);
            goto cleanup;
        }
        cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!cJSON_IsString(role)) {
            st = ie_error_set(IE_ERR_INVAL, "chat: message %d: missing or non-string \"role\"", i + 1);
            goto cleanup;
        }
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant")) {
            st = ie_error_set(IE_ERR_INVAL, "chat: message %d: unknown role '%.40s' (system, user, assistant)",
                              i + 1, role->valuestring);
            goto cleanup;
        }
        if (!cJSON_IsString(content)) {
            st = ie_error_set(IE_ERR_INVAL, "chat: message %d: missing or non-string \"content\"", i + 1);
            goto cleanup;
        }
        if (ie_tokenizer_check_utf8(content->valuestring, strlen(content->valuestring)) != IE_OK) {
            st = ie_error_set(IE_ERR_INVAL, "chat: message %d: content is not valid UTF-8", i + 1);
            goto cleanup;
        }
    }
    for (int i = 0; i < n; i++) {
        cJSON *msg = cJSON_GetArrayItem(root, i);
        const char *role = cJSON_GetObjectItemCaseSensitive(msg, "role")->valuestring;
        const char *content = cJSON_GetObjectItemCaseSensitive(msg, "content")->valuestring;
        if ((st = mbuf_str(out, "<|im_start|>")) != IE_OK || (st = mbuf_str(out, role)) != IE_OK ||
            (st = mbuf_str(out, "\n")) != IE_OK || (st = mbuf_add(out, content, strlen(content), 1)) != IE_OK ||
            (st = mbuf_str(out, "<|im_end|>\n")) != IE_OK)
            goto cleanup;
    }
    st = mbuf_str(out, "<|im_start|>assistant\n");

cleanup:
    cJSON_Delete(root);
    return st;
}

/* ----------------------------------------------------------------- harmony */

static ie_status_t harmony_text(const char *json, const ie_harmony_opts_t *ho, char **text, size_t *len)
{
    ie_harmony_conv_t *conv = NULL;
    ie_status_t st = ie_harmony_conv_from_json(json, strlen(json), &conv);
    if (st == IE_OK && ie_harmony_conv_len(conv) == 0)
        st = ie_error_set(IE_ERR_INVAL, "chat: the conversation has no messages");
    if (st == IE_OK) st = ie_harmony_render(conv, ho, text, len);
    ie_harmony_conv_destroy(&conv);
    return st;
}

static ie_status_t harmony_render(const char *json, const ie_chat_opts_t *opts, mbuf_t *out)
{
    ie_status_t st;
    char *real = NULL, *ph_text = NULL, *ph_json = NULL, date[16];
    char **orig = NULL;
    size_t real_len = 0, ph_len = 0, n_orig = 0;
    cJSON *root = NULL;

    ie_harmony_opts_t ho = {0};
    ho.effort = opts ? opts->effort : IE_HARMONY_EFFORT_MEDIUM;
    ho.current_date = opts ? opts->current_date : NULL;
    if (!ho.current_date) { /* fixed once, so that both renders agree */
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(date, sizeof date, "%Y-%m-%d", &tm);
        ho.current_date = date;
    }
    /* the real render validates the conversation and gives its errors */
    if ((st = harmony_text(json, &ho, &real, &real_len)) != IE_OK) goto cleanup;

    root = cJSON_Parse(json); /* parsed fine above */
    int n = root ? cJSON_GetArraySize(root) : 0;
    if (!root || !(orig = calloc((size_t)n * 2 + 1, sizeof *orig))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    static const char *const KEYS[] = {"content", "thinking"};
    for (int i = 0; i < n; i++) {
        cJSON *msg = cJSON_GetArrayItem(root, i);
        for (int k = 0; k < 2; k++) {
            cJSON *v = cJSON_GetObjectItemCaseSensitive(msg, KEYS[k]);
            if (!cJSON_IsString(v) || !v->valuestring[0]) continue; /* empty: the template tests it */
            char ph[32];
            snprintf(ph, sizeof ph, "\x1e%zu\x1e", n_orig);
            if (!(orig[n_orig] = strdup(v->valuestring)) || !cJSON_SetValuestring(v, ph)) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            n_orig++;
        }
    }
    if (!(ph_json = cJSON_PrintUnformatted(root))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if ((st = harmony_text(ph_json, &ho, &ph_text, &ph_len)) != IE_OK) goto cleanup;
    for (size_t i = 0; i < ph_len && st == IE_OK;) {
        if (ph_text[i] != '\x1e') {
            size_t j = i;
            while (j < ph_len && ph_text[j] != '\x1e') j++;
            st = mbuf_add(out, ph_text + i, j - i, 0);
            i = j;
            continue;
        }
        char *end;
        unsigned long k = strtoul(ph_text + i + 1, &end, 10);
        if (*end != '\x1e' || k >= n_orig) {
            st = ie_error_set(IE_ERR_INTERNAL, "chat: harmony placeholder lost in rendering");
            break;
        }
        st = mbuf_add(out, orig[k], strlen(orig[k]), 1);
        i = (size_t)(end - ph_text) + 1;
    }
    if (st == IE_OK && (out->len != real_len || memcmp(out->s, real, real_len) != 0))
        st = ie_error_set(IE_ERR_INTERNAL, "chat: harmony content could not be located in the prompt");

cleanup:
    for (size_t i = 0; orig && i < n_orig; i++) free(orig[i]);
    free(orig);
    cJSON_Delete(root);
    free(ph_json);
    free(ph_text);
    free(real);
    return st;
}

/* ------------------------------------------------------------------- API */

static ie_status_t template_render(const ie_tokenizer_t *tok, const char *json, const ie_chat_opts_t *opts,
                                   mbuf_t *out);

static ie_status_t render_masked(const ie_tokenizer_t *tok, const char *json, const ie_chat_opts_t *opts,
                                 mbuf_t *out, const char *const **markers)
{
    if (!tok || !json) return ie_error_set(IE_ERR_INVAL, "chat: NULL tokenizer or messages");
    ie_status_t st;
    ie_chat_format_t f = ie_chat_format_for(tok, opts);
    /* harmony with tools: ie_harmony writes no function definitions, the
     * model's own (gpt-oss) template does */
    if (f == IE_CHAT_HARMONY && opts && opts->tools_json && opts->tmpl) f = IE_CHAT_TEMPLATE;
    /* only a model's own template knows how to show functions to it */
    if (opts && opts->tools_json && f != IE_CHAT_TEMPLATE)
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "chat: tools need a chat template that renders them (this model's "
                            "format is %s)",
                            ie_chat_format_name(f));
    switch (f) {
    case IE_CHAT_TEMPLATE:
        *markers = NULL; /* every special token of the vocabulary */
        st = template_render(tok, json, opts, out);
        break;
    case IE_CHAT_CHATML:
        *markers = CHATML_MARKERS;
        st = chatml_render(json, out);
        break;
    case IE_CHAT_HARMONY:
        *markers = HARMONY_MARKERS;
        st = harmony_render(json, opts, out);
        break;
    default: return ie_error_set(IE_ERR_INVAL, "model has no chat template");
    }
    if (st != IE_OK) mbuf_free(out);
    return st;
}

ie_status_t ie_chat_render(const ie_tokenizer_t *tok, const char *messages_json, const ie_chat_opts_t *opts,
                           char **prompt_out)
{
    mbuf_t b = {0};
    const char *const *markers;
    *prompt_out = NULL;
    ie_status_t st = render_masked(tok, messages_json, opts, &b, &markers);
    if (st != IE_OK) return st;
    free(b.m);
    *prompt_out = b.s;
    return IE_OK;
}

/* Append the plain-text encoding of s[0..n) to ids. */
static ie_status_t add_plain(const ie_tokenizer_t *tok, const char *s, size_t n, int32_t **ids, size_t *len,
                             size_t *cap)
{
    if (n == 0) return IE_OK;
    int32_t *piece = NULL;
    size_t np = 0;
    ie_status_t st = ie_tokenizer_encode(tok, s, n, 0, &piece, &np);
    if (st != IE_OK) return st;
    if (*len + np > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + np) c *= 2;
        int32_t *nv = realloc(*ids, c * sizeof *nv);
        if (!nv) {
            free(piece);
            return ie_error_set(IE_ERR_NOMEM, "out of memory");
        }
        *ids = nv;
        *cap = c;
    }
    memcpy(*ids + *len, piece, np * sizeof *piece);
    *len += np;
    free(piece);
    return IE_OK;
}

typedef struct marker {
    char *s;
    size_t len;
    int32_t id;
} marker_t;

static void markers_free(marker_t *mk, size_t n)
{
    for (size_t i = 0; i < n; i++) free(mk[i].s);
    free(mk);
}

static int marker_cmp(const void *a, const void *b)
{
    const marker_t *x = a, *y = b;
    return (x->len < y->len) - (x->len > y->len); /* longest first */
}

/* The markers to cut at: the named ones present in the vocabulary, or
 * (names NULL: a model's own template, which may use any of them) every
 * special token with a non-empty text. */
static ie_status_t markers_of(const ie_tokenizer_t *tok, const char *const *names, marker_t **out, size_t *n_out)
{
    size_t n = 0, cap = 0;
    marker_t *mk = NULL;
    int n_vocab = names ? 0 : ie_tokenizer_n_vocab(tok);
    char buf[256];
    for (int id = 0, k = 0;; names ? k++ : id++) {
        const char *s;
        size_t len;
        int32_t tid;
        if (names) {
            if (!names[k]) break;
            s = names[k];
            len = strlen(s);
            if ((tid = ie_tokenizer_find(tok, s, len)) < 0) continue;
        } else {
            if (id >= n_vocab) break;
            if (!ie_tokenizer_is_special(tok, id)) continue;
            int l = ie_tokenizer_token_bytes(tok, id, 1, buf, sizeof buf);
            if (l <= 0 || (size_t)l >= sizeof buf) continue;
            s = buf;
            len = (size_t)l;
            tid = id;
        }
        if (n == cap) {
            size_t c = cap ? cap * 2 : 16;
            marker_t *nm = realloc(mk, c * sizeof *nm);
            if (!nm) goto nomem;
            mk = nm;
            cap = c;
        }
        if (!(mk[n].s = malloc(len + 1))) goto nomem;
        memcpy(mk[n].s, s, len);
        mk[n].s[len] = '\0';
        mk[n].len = len;
        mk[n++].id = tid;
    }
    if (n) qsort(mk, n, sizeof *mk, marker_cmp);
    *out = mk;
    *n_out = n;
    return IE_OK;
nomem:
    markers_free(mk, n);
    return ie_error_set(IE_ERR_NOMEM, "out of memory");
}

ie_status_t ie_chat_encode(const ie_tokenizer_t *tok, const char *messages_json, const ie_chat_opts_t *opts,
                           int32_t **ids_out, size_t *n_out, char **prompt_out)
{
    mbuf_t b = {0};
    const char *const *markers;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    marker_t *mk = NULL;
    size_t n_markers = 0;
    uint8_t first[256] = {0};
    *ids_out = NULL;
    *n_out = 0;
    if (prompt_out) *prompt_out = NULL;
    ie_status_t st = render_masked(tok, messages_json, opts, &b, &markers);
    if (st != IE_OK) return st;
    if ((st = markers_of(tok, markers, &mk, &n_markers)) != IE_OK) {
        mbuf_free(&b);
        return st;
    }
    for (size_t k = 0; k < n_markers; k++) first[(unsigned char)mk[k].s[0]] = 1;

    /* cut at template markers only (longest first); all between them is
     * plain text */
    size_t piece = 0, i = 0;
    while (i < b.len && st == IE_OK) {
        size_t k = n_markers;
        if (!b.m[i] && first[(unsigned char)b.s[i]])
            for (k = 0; k < n_markers; k++)
                if (i + mk[k].len <= b.len && memcmp(b.s + i, mk[k].s, mk[k].len) == 0 &&
                    !memchr(b.m + i, 1, mk[k].len))
                    break;
        if (k == n_markers) {
            i++;
            continue;
        }
        if ((st = add_plain(tok, b.s + piece, i - piece, &ids, &n, &cap)) != IE_OK) break;
        if (n + 1 > cap) {
            size_t c = cap ? cap * 2 : 256;
            int32_t *nv = realloc(ids, c * sizeof *nv);
            if (!nv) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                break;
            }
            ids = nv;
            cap = c;
        }
        ids[n++] = mk[k].id;
        i += mk[k].len;
        piece = i;
    }
    if (st == IE_OK) st = add_plain(tok, b.s + piece, b.len - piece, &ids, &n, &cap);
    if (st == IE_OK && !ids && !(ids = malloc(sizeof *ids))) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
    markers_free(mk, n_markers);
    free(b.m);
    if (st != IE_OK) {
        free(ids);
        free(b.s);
        return st;
    }
    *ids_out = ids;
    *n_out = n;
    if (prompt_out) *prompt_out = b.s;
    else free(b.s);
    return IE_OK;
}

/* ------------------------------------------------------- jinja templates */

/* transformers' _alias_reasoning_fields: a message whose reasoning is under
 * any of reasoning_content / thinking / reasoning (first non-null wins)
 * becomes {"thinking": r, **message, "reasoning_content": r}, so templates
 * reading either name see it; key order follows Python's dict rules. */
static cJSON *alias_reasoning(const cJSON *msg)
{
    static const char *const FIELDS[] = {"reasoning_content", "thinking", "reasoning"};
    const cJSON *r = NULL;
    for (int k = 0; k < 3 && !r; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(msg, FIELDS[k]);
        if (v && !cJSON_IsNull(v)) r = v;
    }
    if (!r) return cJSON_Duplicate(msg, 1);
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToObject(o, "thinking", cJSON_Duplicate(r, 1))) goto fail;
    for (const cJSON *c = msg->child; c; c = c->next) {
        cJSON *d = cJSON_Duplicate(c, 1);
        if (!d) goto fail;
        if (cJSON_GetObjectItemCaseSensitive(o, c->string)) {
            if (!cJSON_ReplaceItemInObjectCaseSensitive(o, c->string, d)) goto fail;
        } else if (!cJSON_AddItemToObject(o, c->string, d)) goto fail;
    }
    cJSON *rc = cJSON_Duplicate(r, 1);
    if (!rc) goto fail;
    if (cJSON_GetObjectItemCaseSensitive(o, "reasoning_content")) {
        if (!cJSON_ReplaceItemInObjectCaseSensitive(o, "reasoning_content", rc)) goto fail;
    } else if (!cJSON_AddItemToObject(o, "reasoning_content", rc)) goto fail;
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

ie_status_t ie_chat_template_render(const ie_jinja_t *tmpl, const char *messages_json, const char *kwargs_json,
                                    const char *bos, const char *eos, const ie_jinja_opts_t *jopts, char **text_out,
                                    uint8_t **mask_out, size_t *len_out, int *raised)
{
    ie_status_t st = IE_OK;
    cJSON *msgs = NULL, *kw = NULL, *vars = NULL, *trusted = NULL, *list = NULL;
    char *vars_s = NULL, *trusted_s = NULL;
    *text_out = NULL;
    if (mask_out) *mask_out = NULL;
    *len_out = 0;
    if (raised) *raised = 0;
    if (!tmpl || !messages_json) return ie_error_set(IE_ERR_INVAL, "chat: NULL template or messages");
    msgs = cJSON_Parse(messages_json);
    if (!cJSON_IsArray(msgs)) {
        st = ie_error_set(IE_ERR_FORMAT, "chat: messages must be a JSON array of {\"role\", \"content\"} objects%s",
                          msgs ? "" : " (invalid JSON)");
        goto cleanup;
    }
    if (kwargs_json && !cJSON_IsObject(kw = cJSON_Parse(kwargs_json))) {
        st = ie_error_set(IE_ERR_FORMAT, "chat: template arguments must be a JSON object");
        goto cleanup;
    }
    if (!(vars = cJSON_CreateObject()) || !(trusted = cJSON_CreateObject()) || !(list = cJSON_CreateArray())) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) {
            st = ie_error_set(IE_ERR_FORMAT, "chat: message %d is not a JSON object", i + 1);
            goto cleanup;
        }
        cJSON *a = alias_reasoning(m);
        if (!a || !cJSON_AddItemToArray(list, a)) {
            cJSON_Delete(a);
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
    }
    /* what render_jinja_template passes: messages, tools, documents,
     * add_generation_prompt, then the caller's keyword arguments */
    cJSON_AddItemToObject(vars, "messages", list);
    list = NULL;
    cJSON_AddNullToObject(vars, "tools");
    cJSON_AddNullToObject(vars, "documents");
    cJSON_AddTrueToObject(vars, "add_generation_prompt");
    for (const cJSON *c = kw ? kw->child : NULL; c; c = c->next) {
        cJSON *d = cJSON_Duplicate(c, 1);
        if (!d) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        if (cJSON_GetObjectItemCaseSensitive(vars, c->string))
            cJSON_ReplaceItemInObjectCaseSensitive(vars, c->string, d);
        else cJSON_AddItemToObject(vars, c->string, d);
    }
    cJSON_AddStringToObject(trusted, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(trusted, "eos_token", eos ? eos : "");
    if (!(vars_s = cJSON_PrintUnformatted(vars)) || !(trusted_s = cJSON_PrintUnformatted(trusted))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    st = ie_jinja_render(tmpl, vars_s, trusted_s, jopts, text_out, mask_out, len_out, raised);

cleanup:
    cJSON_Delete(msgs);
    cJSON_Delete(kw);
    cJSON_Delete(vars);
    cJSON_Delete(trusted);
    cJSON_Delete(list);
    free(vars_s);
    free(trusted_s);
    return st;
}

/* The text of special token id (empty if none). */
static void token_text(const ie_tokenizer_t *tok, int32_t id, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (id < 0) return;
    int l = ie_tokenizer_token_bytes(tok, id, 1, buf, cap);
    buf[l > 0 && (size_t)l < cap ? l : 0] = '\0';
}

static ie_status_t template_render(const ie_tokenizer_t *tok, const char *json, const ie_chat_opts_t *opts,
                                   mbuf_t *out)
{
    if (!opts->tmpl)
        return ie_error_set(IE_ERR_UNSUPPORTED, "the model's chat template could not be compiled: %s",
                            opts->tmpl_error);
    /* the checks every format makes: a non-empty array of objects with
     * valid UTF-8 strings; roles and the rest are the template's business */
    cJSON *root = cJSON_Parse(json);
    ie_status_t st = IE_OK;
    if (!cJSON_IsArray(root))
        st = ie_error_set(IE_ERR_FORMAT, "chat: messages must be a JSON array of {\"role\", \"content\"} objects%s",
                          root ? "" : " (invalid JSON)");
    else if (!root->child) st = ie_error_set(IE_ERR_INVAL, "chat: the conversation has no messages");
    int i = 0;
    for (const cJSON *m = root ? root->child : NULL; st == IE_OK && m; m = m->next, i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m)) st = ie_error_set(IE_ERR_FORMAT, "chat: message %d is not a JSON object", i + 1);
        else if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
            st = ie_error_set(IE_ERR_INVAL, "chat: message %d: missing or non-string \"role\"", i + 1);
        else if (cJSON_IsString(c) && ie_tokenizer_check_utf8(c->valuestring, strlen(c->valuestring)) != IE_OK)
            st = ie_error_set(IE_ERR_INVAL, "chat: message %d: content is not valid UTF-8", i + 1);
    }
    cJSON_Delete(root);
    if (st != IE_OK) return st;

    char bos[128], eos[128], *text = NULL, *kw_s = NULL;
    uint8_t *mask = NULL;
    size_t len = 0;
    const char *kwargs = opts->template_kwargs;
    if (opts->tools_json) { /* the template's `tools`, as apply_chat_template(tools=...) passes them */
        cJSON *kw = cJSON_Parse(kwargs ? kwargs : "{}"), *tools = cJSON_Parse(opts->tools_json);
        if (!cJSON_IsObject(kw) || !cJSON_IsArray(tools))
            st = ie_error_set(IE_ERR_FORMAT, "chat: template arguments must be a JSON object and tools a list");
        else {
            cJSON_DeleteItemFromObjectCaseSensitive(kw, "tools");
            if (!cJSON_AddItemToObject(kw, "tools", tools)) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            else tools = NULL;
            /* a harmony model rendered by its template (tools): the
             * reasoning level reaches it as gpt-oss's template reads it
             * (its default, "medium", renders as if unset) */
            static const char *const EFFORT[] = {"medium", "low", "high"};
            if (st == IE_OK && ie_chat_format(tok) == IE_CHAT_HARMONY &&
                !cJSON_GetObjectItemCaseSensitive(kw, "reasoning_effort") && (unsigned)opts->effort < 3 &&
                !cJSON_AddStringToObject(kw, "reasoning_effort", EFFORT[opts->effort]))
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            if (st == IE_OK && !(kw_s = cJSON_PrintUnformatted(kw)))
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        }
        cJSON_Delete(kw);
        cJSON_Delete(tools);
        if (st != IE_OK) return st;
        kwargs = kw_s;
    }
    token_text(tok, ie_tokenizer_bos(tok), bos, sizeof bos);
    token_text(tok, ie_tokenizer_eos(tok), eos, sizeof eos);
    st = ie_chat_template_render(opts->tmpl, json, kwargs, bos, eos, NULL, &text, &mask, &len, NULL);
    free(kw_s);
    if (st == IE_OK) {
        /* runs of equal mask */
        for (size_t a = 0; a < len && st == IE_OK;) {
            size_t b = a;
            while (b < len && mask[b] == mask[a]) b++;
            st = mbuf_add(out, text + a, b - a, mask[a]);
            a = b;
        }
        if (st == IE_OK && len == 0) st = mbuf_add(out, "", 0, 0);
    }
    free(text);
    free(mask);
    return st;
}

static char *read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
        if (len_out) *len_out = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

ie_status_t ie_chat_template_find(const char *tokenizer_path, char **text_out)
{
    *text_out = NULL;
    if (!tokenizer_path) return IE_OK;
    char magic[4] = {0};
    FILE *f = fopen(tokenizer_path, "rb");
    if (!f) return ie_error_set(IE_ERR_IO, "chat template: cannot open '%s'", tokenizer_path);
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
        ie_gguf_t *g = NULL;
        ie_status_t st = ie_gguf_open(tokenizer_path, &g);
        if (st != IE_OK) return st;
        ie_gguf_str_t s;
        if (ie_gguf_find_key(g, "tokenizer.chat_template") >= 0) {
            if (ie_gguf_get_str(g, "tokenizer.chat_template", &s) != IE_OK)
                st = ie_error_set(IE_ERR_FORMAT, "GGUF key tokenizer.chat_template is not a string");
            else if (!(*text_out = malloc(s.len + 1))) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            else {
                memcpy(*text_out, s.ptr, s.len);
                (*text_out)[s.len] = '\0';
            }
        }
        ie_gguf_destroy(&g);
        return st;
    }
    /* a tokenizer.json: look beside it */
    size_t dl = strlen(tokenizer_path);
    while (dl > 0 && tokenizer_path[dl - 1] != '/') dl--;
    char path[4096];
    if (dl + 32 > sizeof path) return ie_error_set(IE_ERR_INVAL, "chat template: path too long");
    snprintf(path, sizeof path, "%.*schat_template.jinja", (int)dl, tokenizer_path);
    if ((*text_out = read_file(path, NULL))) return IE_OK;
    snprintf(path, sizeof path, "%.*stokenizer_config.json", (int)dl, tokenizer_path);
    char *cfg = read_file(path, NULL);
    if (!cfg) return IE_OK;
    ie_status_t st = IE_OK;
    cJSON *root = cJSON_Parse(cfg);
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template"), *pick = NULL;
    if (!cJSON_IsObject(root)) st = ie_error_set(IE_ERR_FORMAT, "%s is not a JSON object", path);
    else if (cJSON_IsString(ct)) pick = ct;
    else if (cJSON_IsArray(ct)) { /* [{"name": ..., "template": ...}]: "default", else the first */
        for (const cJSON *e = ct->child; e; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(t)) {
                st = ie_error_set(IE_ERR_FORMAT, "%s: chat_template entries need a string \"template\"", path);
                break;
            }
            if (!pick || (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0)) pick = t;
        }
    } else if (ct && !cJSON_IsNull(ct))
        st = ie_error_set(IE_ERR_FORMAT, "%s: chat_template must be a string or a list", path);
    if (st == IE_OK && pick && !(*text_out = strdup(pick->valuestring)))
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
    if (st != IE_OK) {
        free(*text_out);
        *text_out = NULL;
    }
    cJSON_Delete(root);
    free(cfg);
    return st;
}

static ie_status_t ids_add(int32_t **ids, size_t *n, int32_t id)
{
    if (id < 0) return IE_OK;
    for (size_t i = 0; i < *n; i++)
        if ((*ids)[i] == id) return IE_OK;
    int32_t *ni = realloc(*ids, (*n + 1) * sizeof *ni);
    if (!ni) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    ni[(*n)++] = id;
    *ids = ni;
    return IE_OK;
}

/* tokenizer_config.json's eos_token: "text" or {"content": "text"}. */
static int32_t config_token(const ie_tokenizer_t *tok, const cJSON *v)
{
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? ie_tokenizer_find(tok, v->valuestring, strlen(v->valuestring)) : -1;
}

ie_status_t ie_chat_stop_ids(const ie_tokenizer_t *tok, const char *tokenizer_path, int32_t **ids_out,
                             size_t *n_out)
{
    /* end-of-turn markers of the template families we know; only where the
     * vocabulary has them as special tokens */
    static const char *const EOT_NAMES[] = {"<end_of_turn>", "<|eot_id|>", "<|eom_id|>",    "<|im_end|>",
                                            "<|end|>",       "<|return|>", "<|endoftext|>", NULL};
    int32_t *ids = NULL;
    size_t n = 0;
    ie_status_t st = IE_OK;
    *ids_out = NULL;
    *n_out = 0;
    if (!tok) return IE_OK;
    for (int k = 0; EOT_NAMES[k] && st == IE_OK; k++) {
        int32_t id = ie_tokenizer_find(tok, EOT_NAMES[k], strlen(EOT_NAMES[k]));
        if (id >= 0 && ie_tokenizer_is_special(tok, id) && !ie_tokenizer_is_eog(tok, id))
            st = ids_add(&ids, &n, id);
    }
    /* an HF folder: generation_config.json's eos_token_id (an id or a list)
     * and tokenizer_config.json's eos_token */
    size_t dl = tokenizer_path ? strlen(tokenizer_path) : 0;
    while (dl > 0 && tokenizer_path[dl - 1] != '/') dl--;
    static const char *const FILES[] = {"generation_config.json", "tokenizer_config.json"};
    for (int f = 0; tokenizer_path && f < 2 && st == IE_OK; f++) {
        char path[4096];
        if (dl + 32 > sizeof path) break;
        snprintf(path, sizeof path, "%.*s%s", (int)dl, tokenizer_path, FILES[f]);
        char *text = read_file(path, NULL);
        cJSON *root = text ? cJSON_Parse(text) : NULL;
        free(text);
        int32_t nv = ie_tokenizer_n_vocab(tok);
        if (f == 0) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
            if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < nv)
                st = ids_add(&ids, &n, (int32_t)e->valuedouble);
            for (const cJSON *c = cJSON_IsArray(e) ? e->child : NULL; c && st == IE_OK; c = c->next)
                if (cJSON_IsNumber(c) && c->valuedouble >= 0 && c->valuedouble < nv)
                    st = ids_add(&ids, &n, (int32_t)c->valuedouble);
        } else {
            st = ids_add(&ids, &n, config_token(tok, cJSON_GetObjectItemCaseSensitive(root, "eos_token")));
        }
        cJSON_Delete(root);
    }
    /* keep only what the tokenizer does not stop on already */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!ie_tokenizer_is_eog(tok, ids[i])) ids[k++] = ids[i];
    if (st != IE_OK || k == 0) {
        free(ids);
        return st;
    }
    *ids_out = ids;
    *n_out = k;
    return IE_OK;
}
