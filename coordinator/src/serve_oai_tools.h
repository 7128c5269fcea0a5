/* serve_oai_tools.h — OpenAI function calling for serve_http.c (private to
 * coordinator/src).
 *
 * A chat request's "tools", "tool_choice" and "parallel_tool_calls" become
 * an ie_oai_tools_t: the tools for the chat template, the format to parse
 * the answer in, and for a forced call the JSON Schema that the sampler's
 * grammar enforces (ie_gen_params_t.json_schema). The answer's text then
 * becomes message.tool_calls (ie_oai_tools_message) or, streamed, one
 * delta.tool_calls chunk once the text is complete (the text before the
 * first call streams as content as it comes; see ie_tool_safe_len).
 */
#ifndef IE_SERVE_OAI_TOOLS_H
#define IE_SERVE_OAI_TOOLS_H

#include "ie_chat.h"
#include "ie_tools.h"

#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct ie_oai_tools {
    ie_tool_format_t fmt;    /* parse the answer in: NONE = do not parse   */
    ie_tool_format_t native; /* the template's own format (forced calls'
                                fallback when the text is not the JSON)   */
    char *tools_json;        /* the template's `tools` (NULL: none)        */
    char *schema;            /* forced call's JSON Schema (NULL: none)     */
    int single;              /* parallel_tool_calls false: the first call  */
} ie_oai_tools_t;

/* Read root's tools / tool_choice / parallel_tool_calls for a model whose
 * chat format is fmt and template tmpl (may be NULL). On success 0 and *out
 * filled (all zero when the request has no tools); free with
 * ie_oai_tools_free. On a bad request -1 with the parameter's name in
 * param[pcap] and the message in why[wcap]; -2 out of memory. */
int ie_oai_tools_parse(const cJSON *root, ie_chat_format_t fmt, const ie_jinja_t *tmpl, ie_oai_tools_t *out,
                       char *param, size_t pcap, char *why, size_t wcap);

/* Free what ie_oai_tools_parse allocated and zero *t. Accepts NULL. */
void ie_oai_tools_free(ie_oai_tools_t *t);

/* Parse text as t says into *calls (ie_tool_calls_free). No calls when t
 * does not parse (fmt NONE) or the text holds none. IE_ERR_NOMEM only. */
ie_status_t ie_oai_tools_extract(const ie_oai_tools_t *t, const char *text, size_t len, ie_tool_calls_t *calls);

/* OpenAI's tool_calls array for calls: [{"id": "call_<24 random>",
 * "type": "function", "function": {"name", "arguments"}}], each with its
 * "index" when with_index (stream deltas). NULL out of memory. */
cJSON *ie_oai_tool_calls_json(const ie_tool_calls_t *calls, int with_index);

#endif
