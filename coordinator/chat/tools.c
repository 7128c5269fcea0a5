/* tools.c — tool-call formats, parsers and request rewrites (see ie_tools.h).
 *
 * The parsers find the JSON of a call with cJSON_ParseWithLengthOpts, which
 * reports where a value ends, so nested objects and strings holding braces
 * need no bracket counting here. Every parser first collects its calls into
 * a scratch list and only keeps them when the whole text parsed: a model's
 * half-written call is returned as plain content, never as a broken call.
 */
#include "ie_tools.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ detection */

ie_tool_format_t ie_tool_format_detect(const char *t, int harmony)
{
    if (harmony) return IE_TOOL_FMT_HARMONY;
    if (!t) return IE_TOOL_FMT_NONE;
    if (strstr(t, "<tool_call>")) return IE_TOOL_FMT_HERMES;
    if (strstr(t, "[TOOL_CALLS]")) return IE_TOOL_FMT_MISTRAL;
    if (strstr(t, "<|start_header_id|>") && strstr(t, "ipython")) return IE_TOOL_FMT_LLAMA3;
    if (strstr(t, "tools")) return IE_TOOL_FMT_HERMES;
    return IE_TOOL_FMT_NONE;
}

const char *ie_tool_format_name(ie_tool_format_t f)
{
    switch (f) {
    case IE_TOOL_FMT_HERMES: return "hermes";
    case IE_TOOL_FMT_LLAMA3: return "llama3";
    case IE_TOOL_FMT_MISTRAL: return "mistral";
    case IE_TOOL_FMT_HARMONY: return "harmony";
    case IE_TOOL_FMT_JSON: return "json";
    case IE_TOOL_FMT_NONE: break;
    }
    return "none";
}

/* ------------------------------------------------------------- helpers */

typedef struct scratch {
    ie_tool_call_t *calls;
    size_t n, cap;
    char *content; /* text outside the calls */
    size_t clen;
    int oom;
} scratch_t;

static void calls_free(ie_tool_call_t *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(c[i].name);
        free(c[i].arguments);
    }
    free(c);
}

void ie_tool_calls_free(ie_tool_calls_t *c)
{
    if (!c) return;
    calls_free(c->calls, c->n);
    free(c->content);
    memset(c, 0, sizeof *c);
}

static void content_add(scratch_t *s, const char *t, size_t n)
{
    if (s->oom || !n) return;
    char *p = realloc(s->content, s->clen + n + 1);
    if (!p) {
        s->oom = 1;
        return;
    }
    memcpy(p + s->clen, t, n);
    s->clen += n;
    p[s->clen] = '\0';
    s->content = p;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_ws(*p)) p++;
    return p;
}

/* memmem for the portable subset: first needle in [p, end), or NULL. */
static const char *find(const char *p, const char *end, const char *needle)
{
    size_t nl = strlen(needle);
    for (; p + nl <= end; p++)
        if (*p == needle[0] && !memcmp(p, needle, nl)) return p;
    return NULL;
}

/* Add a call: name, arguments value (an object is printed compactly; a
 * string is taken as already being the JSON text, as some models write
 * it). 0 good, -1 not a call (no string name, arguments of another type). */
static int call_add(scratch_t *s, const char *name, const cJSON *args)
{
    if (!name || !name[0]) return -1;
    char *a = NULL;
    if (!args || cJSON_IsNull(args)) a = strdup("{}");
    else if (cJSON_IsObject(args)) a = cJSON_PrintUnformatted(args);
    else if (cJSON_IsString(args)) {
        cJSON *inner = cJSON_Parse(args->valuestring);
        int ok = cJSON_IsObject(inner);
        cJSON_Delete(inner);
        if (!ok) return -1;
        a = strdup(args->valuestring);
    } else return -1;
    char *n = strdup(name);
    if (!a || !n) goto oom;
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 4;
        ie_tool_call_t *nc = realloc(s->calls, c * sizeof *nc);
        if (!nc) goto oom;
        s->calls = nc;
        s->cap = c;
    }
    s->calls[s->n].name = n;
    s->calls[s->n].arguments = a;
    s->n++;
    return 0;
oom:
    free(a);
    free(n);
    s->oom = 1;
    return 0; /* reported through s->oom */
}

/* A call object {"name": N, <args_key> or "arguments"/"parameters": {...}}. */
static int call_from_json(scratch_t *s, const cJSON *o)
{
    if (!cJSON_IsObject(o)) return -1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    /* {"type": "function", "function": {...}} as some fine-tunes echo it */
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(o, "function");
    if (!name && cJSON_IsObject(fn)) return call_from_json(s, fn);
    if (!cJSON_IsString(name)) return -1;
    return call_add(s, name->valuestring, args);
}

/* Parse one JSON value at p (leading whitespace allowed); *next is where
 * it ends. NULL when none parses before end. */
static cJSON *json_at(const char *p, const char *end, const char **next)
{
    p = skip_ws(p, end);
    const char *e = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &e, 0);
    if (v && next) *next = e;
    return v;
}

/* ------------------------------------------------------------- formats */

/* <tool_call> JSON </tool_call> ... ; the closing tag may be missing on the
 * last call (generation stopped at the end of turn). */
static int parse_hermes(scratch_t *s, const char *p, const char *end)
{
    static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
    const char *q;
    while ((q = find(p, end, OPEN))) {
        content_add(s, p, (size_t)(q - p));
        const char *body = q + strlen(OPEN), *close = find(body, end, CLOSE);
        const char *stop = close ? close : end, *after = NULL;
        cJSON *v = json_at(body, stop, &after);
        int bad = !v || skip_ws(after, stop) != stop || call_from_json(s, v) != 0;
        cJSON_Delete(v);
        if (bad) return -1;
        p = close ? close + strlen(CLOSE) : end;
    }
    content_add(s, p, (size_t)(end - p));
    return s->n ? 0 : -1;
}

/* [text]<|python_tag|>{call}; {call}  or a text that is only {call}s. */
static int parse_llama3(scratch_t *s, const char *p, const char *end)
{
    static const char TAG[] = "<|python_tag|>";
    const char *tag = find(p, end, TAG);
    if (tag) {
        content_add(s, p, (size_t)(tag - p));
        p = tag + strlen(TAG);
    } else if ((p = skip_ws(p, end)) == end || *p != '{') return -1;
    for (;;) {
        const char *after = NULL;
        cJSON *v = json_at(p, end, &after);
        int bad = !v || call_from_json(s, v) != 0;
        cJSON_Delete(v);
        if (bad) return -1;
        p = skip_ws(after, end);
        if (p == end) return 0;
        if (*p != ';') return -1;
        p++;
    }
}

/* [TOOL_CALLS][{...}, ...]  or  [TOOL_CALLS]name[ARGS]{...} (repeated), or
 * the array alone (the marker is a control token, absent from text). */
static int parse_mistral(scratch_t *s, const char *p, const char *end)
{
    static const char TAG[] = "[TOOL_CALLS]", ARGS[] = "[ARGS]";
    const char *tag = find(p, end, TAG);
    if (tag) {
        content_add(s, p, (size_t)(tag - p));
        p = tag;
    } else if ((p = skip_ws(p, end)) == end || *p != '[') return -1;
    while (p < end) {
        if ((size_t)(end - p) >= strlen(TAG) && !memcmp(p, TAG, strlen(TAG))) p += strlen(TAG);
        p = skip_ws(p, end);
        if (p < end && *p == '[') { /* an array of call objects */
            const char *after = NULL;
            cJSON *v = json_at(p, end, &after);
            int bad = !cJSON_IsArray(v) || !v->child;
            for (const cJSON *c = v ? v->child : NULL; c && !bad; c = c->next) bad = call_from_json(s, c) != 0;
            cJSON_Delete(v);
            if (bad) return -1;
            p = skip_ws(after, end);
        } else { /* name[ARGS]{...} */
            const char *a = find(p, end, ARGS);
            if (!a || a == p) return -1;
            char name[128];
            size_t nl = (size_t)(a - p);
            if (nl >= sizeof name) return -1;
            memcpy(name, p, nl);
            name[nl] = '\0';
            const char *after = NULL;
            cJSON *v = json_at(a + strlen(ARGS), end, &after);
            int bad = !cJSON_IsObject(v) || call_add(s, name, v) != 0;
            cJSON_Delete(v);
            if (bad) return -1;
            p = skip_ws(after, end);
        }
        if (p < end && (size_t)(end - p) >= strlen(TAG) && !memcmp(p, TAG, strlen(TAG))) continue;
        if (p != end) return -1;
    }
    return s->n ? 0 : -1;
}

/* Harmony: messages "[<|start|>assistant]<header><|message|>body<end>",
 * header holding "<|channel|>NAME" and maybe "to=functions.N"; end one of
 * <|end|>, <|call|>, <|return|> (or the end of text). A message addressed
 * to functions.N is a call with body as arguments; the final channel is the
 * content; analysis (chain of thought) and other commentary are dropped. */
static int parse_harmony(scratch_t *s, const char *p, const char *end)
{
    static const char *const ENDS[] = {"<|end|>", "<|call|>", "<|return|>"};
    while (p < end) {
        if ((size_t)(end - p) >= 9 && !memcmp(p, "<|start|>", 9)) p += 9;
        const char *msg = find(p, end, "<|message|>");
        if (!msg) return s->n ? 0 : -1; /* a header with no message: nothing more to take */
        const char *body = msg + 11, *stop = end, *next = end;
        for (int k = 0; k < 3; k++) {
            const char *e = find(body, end, ENDS[k]);
            if (e && e < stop) {
                stop = e;
                next = e + strlen(ENDS[k]);
            }
        }
        const char *to = find(p, msg, "to=functions.");
        const char *chan = find(p, msg, "<|channel|>");
        if (to) {
            const char *n0 = to + strlen("to=functions."), *n1 = n0;
            while (n1 < msg && !is_ws(*n1) && *n1 != '<') n1++;
            char name[128];
            size_t nl = (size_t)(n1 - n0);
            if (!nl || nl >= sizeof name) return -1;
            memcpy(name, n0, nl);
            name[nl] = '\0';
            const char *after = NULL;
            cJSON *v = json_at(body, stop, &after);
            int bad = !cJSON_IsObject(v) || skip_ws(after, stop) != stop || call_add(s, name, v) != 0;
            cJSON_Delete(v);
            if (bad) return -1;
        } else if (chan && (size_t)(msg - chan) >= 16 && !memcmp(chan + 11, "final", 5)) {
            content_add(s, body, (size_t)(stop - body));
        }
        p = next;
    }
    return s->n ? 0 : -1;
}

/* The whole text is one {"name", "arguments"} object (a forced call). */
static int parse_json(scratch_t *s, const char *p, const char *end)
{
    const char *after = NULL;
    cJSON *v = json_at(p, end, &after);
    int bad = !v || skip_ws(after, end) != end || call_from_json(s, v) != 0;
    cJSON_Delete(v);
    return bad ? -1 : 0;
}

/* content without surrounding whitespace; NULL when nothing is left */
static char *content_trim(char *c)
{
    if (!c) return NULL;
    size_t a = 0, b = strlen(c);
    while (a < b && is_ws(c[a])) a++;
    while (b > a && is_ws(c[b - 1])) b--;
    if (a == b) {
        free(c);
        return NULL;
    }
    memmove(c, c + a, b - a);
    c[b - a] = '\0';
    return c;
}

ie_status_t ie_tool_parse(ie_tool_format_t f, const char *text, size_t len, ie_tool_calls_t *out)
{
    if (!out) return ie_error_set(IE_ERR_INVAL, "tools: NULL output");
    memset(out, 0, sizeof *out);
    if (f == IE_TOOL_FMT_NONE) return ie_error_set(IE_ERR_INVAL, "tools: no tool-call format");
    scratch_t s = {0};
    const char *p = text ? text : "", *end = p + (text ? len : 0);
    /* a NUL inside the text would cut cJSON's strings short: not calls */
    int rc = memchr(p, 0, (size_t)(end - p)) ? -1 : 0;
    if (rc == 0) switch (f) {
        case IE_TOOL_FMT_HERMES: rc = parse_hermes(&s, p, end); break;
        case IE_TOOL_FMT_LLAMA3: rc = parse_llama3(&s, p, end); break;
        case IE_TOOL_FMT_MISTRAL: rc = parse_mistral(&s, p, end); break;
        case IE_TOOL_FMT_HARMONY: rc = parse_harmony(&s, p, end); break;
        case IE_TOOL_FMT_JSON: rc = parse_json(&s, p, end); break;
        case IE_TOOL_FMT_NONE: rc = -1; break;
        }
    ie_status_t st = IE_OK;
    if (s.oom) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
    else if (rc != 0 || s.n == 0) { /* not calls: everything is content */ calls_free(s.calls, s.n);
        free(s.content);
        s = (scratch_t){0};
        content_add(&s, p, (size_t)(end - p));
        if (s.oom) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        else out->content = s.content; /* kept as generated (not trimmed) */
        return st;
    }
    out->calls = s.calls;
    out->n = s.n;
    out->content = content_trim(s.content);
    return st;
}

/* ------------------------------------------------------------ streaming */

/* Offset of the first occurrence of m in t, or of a prefix of m that ends
 * the text; len when neither. */
static size_t marker_at(const char *t, size_t len, const char *m)
{
    size_t ml = strlen(m);
    for (size_t i = 0; i < len; i++) {
        size_t k = len - i < ml ? len - i : ml;
        if (!memcmp(t + i, m, k)) return i;
    }
    return len;
}

size_t ie_tool_safe_len(ie_tool_format_t f, const char *t, size_t len)
{
    if (!t) return 0;
    size_t lead = 0;
    while (lead < len && is_ws(t[lead])) lead++;
    switch (f) {
    case IE_TOOL_FMT_HERMES: return marker_at(t, len, "<tool_call>");
    case IE_TOOL_FMT_LLAMA3:
        if (lead == len || t[lead] == '{') return 0;
        return marker_at(t, len, "<|python_tag|>");
    case IE_TOOL_FMT_MISTRAL:
        if (lead == len || t[lead] == '[') return 0;
        return marker_at(t, len, "[TOOL_CALLS]");
    case IE_TOOL_FMT_JSON:
    case IE_TOOL_FMT_HARMONY: return 0;
    case IE_TOOL_FMT_NONE: break;
    }
    return len;
}

/* ------------------------------------------------------------- requests */

static int fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && cap) vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* OpenAI's rule for function names: a-z, A-Z, 0-9, '_', '-' (and '.' as
 * vLLM accepts), at most 64. */
static int name_ok(const char *n)
{
    size_t l = strlen(n);
    if (!l || l > 64) return 0;
    for (size_t i = 0; i < l; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return 0;
    }
    return 1;
}

int ie_tool_list_check(const cJSON *tools, char *why, size_t cap)
{
    if (!cJSON_IsArray(tools)) return fail(why, cap, "'tools' must be a list of {\"type\": \"function\", ...}");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        if (!cJSON_IsObject(t)) return fail(why, cap, "'tools[%d]' is not an object", i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return fail(why, cap, "'tools[%d].type' must be \"function\"", i);
        if (!cJSON_IsObject(fn)) return fail(why, cap, "'tools[%d].function' must be an object", i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
        if (!cJSON_IsString(name)) return fail(why, cap, "'tools[%d].function.name' is missing or not a string", i);
        if (!name_ok(name->valuestring))
            return fail(why, cap, "'tools[%d].function.name' must be 1 to 64 of a-z, A-Z, 0-9, '_', '-', '.'", i);
        if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
            return fail(why, cap, "'tools[%d].function.description' must be a string", i);
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return fail(why, cap, "'tools[%d].function.parameters' must be a JSON Schema object", i);
        if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
            return fail(why, cap, "'tools[%d].function.strict' must be a boolean", i);
        int j = 0;
        for (const cJSON *u = tools->child; u != t; u = u->next, j++) {
            const cJSON *un = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"),
                                                               "name");
            if (!strcmp(un->valuestring, name->valuestring))
                return fail(why, cap, "'tools[%d]' and 'tools[%d]' are both named '%s'", j, i, name->valuestring);
        }
    }
    return 0;
}

/* {"type": "object", "properties": {"name": {"const": N}, "arguments": P},
 *  "required": ["name", "arguments"], "additionalProperties": false} */
static cJSON *one_schema(const cJSON *fn)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *o = cJSON_CreateObject(), *props = NULL, *nm = NULL, *args = NULL, *req = NULL;
    if (!o || !cJSON_AddStringToObject(o, "type", "object") ||
        !(props = cJSON_AddObjectToObject(o, "properties")) || !(nm = cJSON_AddObjectToObject(props, "name")) ||
        !cJSON_AddStringToObject(nm, "const", name->valuestring))
        goto fail;
    args = cJSON_IsObject(params) ? cJSON_Duplicate(params, 1) : cJSON_CreateObject();
    if (!args || (!cJSON_IsObject(params) && !cJSON_AddStringToObject(args, "type", "object")) ||
        !cJSON_AddItemToObject(props, "arguments", args)) {
        cJSON_Delete(args);
        goto fail;
    }
    if (!(req = cJSON_AddArrayToObject(o, "required")) || !cJSON_AddItemToArray(req, cJSON_CreateString("name")) ||
        !cJSON_AddItemToArray(req, cJSON_CreateString("arguments")) ||
        !cJSON_AddFalseToObject(o, "additionalProperties"))
        goto fail;
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

char *ie_tool_call_schema(const cJSON *tools, const char *name)
{
    cJSON *root = NULL, *any = NULL;
    char *out = NULL;
    size_t n = 0;
    for (const cJSON *t = cJSON_IsArray(tools) ? tools->child : NULL; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || (name && strcmp(nm->valuestring, name))) continue;
        cJSON *one = one_schema(fn);
        if (!one) goto cleanup;
        if (name) {
            root = one;
            break;
        }
        if (!any && (!(root = cJSON_CreateObject()) || !(any = cJSON_AddArrayToObject(root, "anyOf")))) {
            cJSON_Delete(one);
            goto cleanup;
        }
        cJSON_AddItemToArray(any, one);
        n++;
    }
    /* one function: its object alone (simpler for a grammar) */
    if (any && n == 1) {
        cJSON *only = cJSON_DetachItemFromArray(any, 0);
        cJSON_Delete(root);
        root = only;
    }
    if (root) out = cJSON_PrintUnformatted(root);
cleanup:
    cJSON_Delete(root);
    return out;
}

int ie_tool_messages_prepare(cJSON *msgs, const char *template_text, char *why, size_t cap)
{
    int keep_developer = template_text && strstr(template_text, "developer");
    int i = 0;
    for (cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) continue; /* the renderer names it */
        cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        int is_role = cJSON_IsString(role);
        if (is_role && !keep_developer && !strcmp(role->valuestring, "developer") &&
            !cJSON_SetValuestring(role, "system"))
            return -2;
        if (is_role && !strcmp(role->valuestring, "tool") && !cJSON_IsString(content) && !cJSON_IsArray(content))
            return fail(why, cap, "'messages[%d].content' of a tool message must be a string", i);
        if (cJSON_IsNull(content) && !cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString("")))
            return -2;
        cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!tc || cJSON_IsNull(tc)) continue;
        if (!cJSON_IsArray(tc)) return fail(why, cap, "'messages[%d].tool_calls' must be a list", i);
        int j = 0;
        for (cJSON *c = tc->child; c; c = c->next, j++) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            if (!cJSON_IsObject(fn) || !cJSON_IsString(nm))
                return fail(why, cap, "'messages[%d].tool_calls[%d].function.name' is missing or not a string", i,
                            j);
            if (args && !cJSON_IsString(args) && !cJSON_IsObject(args))
                return fail(why, cap, "'messages[%d].tool_calls[%d].function.arguments' must be a JSON string", i,
                            j);
            if (!cJSON_IsString(args)) continue;
            cJSON *obj = cJSON_Parse(args->valuestring);
            if (!cJSON_IsObject(obj)) {
                cJSON_Delete(obj); /* templates get the string as sent */
                continue;
            }
            if (!cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj)) {
                cJSON_Delete(obj);
                return -2;
            }
        }
    }
    return 0;
}
