/* serve_oai_tools.c — tools / tool_choice for the HTTP chat API (see
 * serve_oai_tools.h). Behaviour follows OpenAI where it is defined and vLLM
 * where OpenAI leaves it open (both noted in docs/HTTP.md):
 *   - tool_choice defaults to "auto" when tools are given; without tools
 *     only "none" (or null) is accepted;
 *   - "none" still renders the tools into the prompt (vLLM's default) but
 *     never parses calls out of the answer;
 *   - "required" / a named function force one call through the sampler's
 *     grammar (json_schema of {"name", "arguments"});
 *   - a model whose template does not mention tools is refused (400)
 *     rather than silently prompted without them.
 */
#include "serve_oai_tools.h"

#include "ie_grammar.h"
#include "ie_sampler.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *param, size_t pcap, const char *p, char *why, size_t wcap, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int bad(char *param, size_t pcap, const char *p, char *why, size_t wcap, const char *fmt, ...)
{
    va_list ap;
    snprintf(param, pcap, "%s", p);
    va_start(ap, fmt);
    vsnprintf(why, wcap, fmt, ap);
    va_end(ap);
    return -1;
}

void ie_oai_tools_free(ie_oai_tools_t *t)
{
    if (!t) return;
    free(t->tools_json);
    free(t->schema);
    memset(t, 0, sizeof *t);
}

int ie_oai_tools_parse(const cJSON *root, ie_chat_format_t fmt, const ie_jinja_t *tmpl, ie_oai_tools_t *out,
                       char *param, size_t pcap, char *why, size_t wcap)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    memset(out, 0, sizeof *out);
    if (par && !cJSON_IsNull(par) && !cJSON_IsBool(par))
        return bad(param, pcap, "parallel_tool_calls", why, wcap, "'parallel_tool_calls' must be a boolean");
    const int has_tools = tools && !cJSON_IsNull(tools) && !(cJSON_IsArray(tools) && !tools->child);
    const int has_choice = choice && !cJSON_IsNull(choice);
    if (!has_tools) {
        if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
            return bad(param, pcap, "tools", why, wcap, "'tools' must be a list of {\"type\": \"function\", ...}");
        if (has_choice && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")))
            return bad(param, pcap, "tool_choice", why, wcap,
                       "'tool_choice' is only allowed when 'tools' are specified");
        return 0;
    }
    char msg[256];
    if (ie_tool_list_check(tools, msg, sizeof msg) != 0) return bad(param, pcap, "tools", why, wcap, "%s", msg);

    /* which call: "none" | "auto" | "required" | {"type": "function", "function": {"name"}} */
    const char *forced_name = NULL;
    int none = 0, forced = 0;
    if (!has_choice || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto"))) {
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) {
        none = 1;
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) {
        forced = 1;
    } else if (cJSON_IsObject(choice)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"),
                                                             "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
            return bad(param, pcap, "tool_choice", why, wcap,
                       "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}");
        forced = 1;
        forced_name = name->valuestring;
    } else {
        return bad(param, pcap, "tool_choice", why, wcap,
                   "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}");
    }

    /* only a model template that knows tools can show them to the model */
    const char *src = ie_jinja_source(tmpl);
    if (fmt == IE_CHAT_HARMONY) {
        /* our harmony renderer writes no function definitions; the model's
         * own template (gpt-oss's) does, and chat.c then renders with it */
        if (!src || !strstr(src, "tools"))
            return bad(param, pcap, "tools", why, wcap,
                       "tools need this harmony (gpt-oss) model's own chat template (tokenizer.chat_template), "
                       "which it does not have");
        /* a forced call would have to force the harmony header too */
        if (forced)
            return bad(param, pcap, "tool_choice", why, wcap,
                       "'tool_choice' \"required\" or a named function is not supported for harmony (gpt-oss) "
                       "models; use \"auto\"");
    } else if (fmt != IE_CHAT_TEMPLATE || !src || !strstr(src, "tools"))
        return bad(param, pcap, "tools", why, wcap,
                   "this model's chat template does not support tools (it never reads the 'tools' variable)");
    out->native = ie_tool_format_detect(src, fmt == IE_CHAT_HARMONY);
    out->fmt = none ? IE_TOOL_FMT_NONE : forced ? IE_TOOL_FMT_JSON : out->native;
    out->single = cJSON_IsFalse(par);
    if (!(out->tools_json = cJSON_PrintUnformatted(tools))) goto oom;
    if (forced && !(out->schema = ie_tool_call_schema(tools, forced_name))) {
        char *any = forced_name ? ie_tool_call_schema(tools, NULL) : NULL;
        const int unknown_name = any != NULL; /* tools are fine: the name is unknown */
        free(any);
        if (unknown_name) {
            ie_oai_tools_free(out);
            return bad(param, pcap, "tool_choice", why, wcap,
                       "'tool_choice' names '%.64s', which is not in 'tools'", forced_name);
        }
        goto oom;
    }
    if (forced) { /* the grammar must take it: say so here, naming tools */
        ie_grammar_t *gr = NULL;
        ie_status_t st = ie_grammar_compile(out->schema, &gr);
        ie_grammar_destroy(&gr);
        if (st == IE_ERR_NOMEM) goto oom;
        if (st != IE_OK) {
            ie_oai_tools_free(out);
            return bad(param, pcap, "tools", why, wcap, "a forced call cannot follow these tools' parameters: %s",
                       ie_error_last());
        }
    }
    return 0;
oom:
    ie_oai_tools_free(out);
    return -2;
}

ie_status_t ie_oai_tools_extract(const ie_oai_tools_t *t, const char *text, size_t len, ie_tool_calls_t *calls)
{
    memset(calls, 0, sizeof *calls);
    if (!t || t->fmt == IE_TOOL_FMT_NONE) return IE_OK;
    ie_status_t st = ie_tool_parse(t->fmt, text, len, calls);
    /* a forced call without the grammar (or a model that ignored it) may
     * still have written its own markup */
    if (st == IE_OK && !calls->n && t->fmt == IE_TOOL_FMT_JSON && t->native != IE_TOOL_FMT_NONE) {
        ie_tool_calls_free(calls);
        st = ie_tool_parse(t->native, text, len, calls);
    }
    if (st == IE_OK && t->single)
        while (calls->n > 1) {
            calls->n--;
            free(calls->calls[calls->n].name);
            free(calls->calls[calls->n].arguments);
        }
    return st;
}

cJSON *ie_oai_tool_calls_json(const ie_tool_calls_t *calls, int with_index)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < calls->n; i++) {
        char id[40];
        /* OpenAI's ids are "call_" and 24 letters / digits */
        static const char ALNUM[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        memcpy(id, "call_", 5);
        for (int k = 0; k < 24; k++) id[5 + k] = ALNUM[ie_sampler_seed_random() % 62];
        id[29] = '\0';
        cJSON *c = cJSON_CreateObject(), *fn = NULL;
        if (c && !cJSON_AddItemToArray(arr, c)) {
            cJSON_Delete(c);
            c = NULL;
        }
        if (!c || (with_index && !cJSON_AddNumberToObject(c, "index", (double)i)) ||
            !cJSON_AddStringToObject(c, "id", id) || !cJSON_AddStringToObject(c, "type", "function") ||
            !(fn = cJSON_AddObjectToObject(c, "function")) ||
            !cJSON_AddStringToObject(fn, "name", calls->calls[i].name) ||
            !cJSON_AddStringToObject(fn, "arguments", calls->calls[i].arguments)) {
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}
