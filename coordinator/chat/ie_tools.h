/* ie_tools.h — function calling ("tools") around a model's chat template.
 *
 * Three pieces, all on text and JSON (no tokenizer, no engine):
 *   - the tool-call format of a model, detected from its chat template's
 *     text as llama.cpp's common/chat.cpp does (ie_tool_format_detect);
 *   - parsers of generated text into calls {name, arguments} plus the text
 *     outside the calls (ie_tool_parse), and the offset up to which a
 *     stream may send text before a call could begin (ie_tool_safe_len);
 *   - request checks and rewrites for OpenAI's chat API: the "tools" list
 *     (ie_tool_list_check), the JSON Schema of a forced call
 *     (ie_tool_call_schema) and the messages as HF templates expect them
 *     (ie_tool_messages_prepare).
 *
 * Formats (the model's own markup; control tokens such as <|python_tag|> or
 * [TOOL_CALLS] are not in decoded text, so each parser takes the call with
 * or without its marker):
 *   HERMES   (Hermes, Qwen2.5, Qwen3, QwQ, SmolLM3):
 *            <tool_call>{"name": N, "arguments": {...}}</tool_call>, several
 *   LLAMA3   (Llama 3.1 / 3.2 / 3.3): [<|python_tag|>]{"name": N,
 *            "parameters": {...}}, several separated by ';'
 *   MISTRAL  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...], or the
 *            newer [TOOL_CALLS]N[ARGS]{...} (repeated)
 *   HARMONY  gpt-oss: <|channel|>commentary to=functions.N <|constrain|>json
 *            <|message|>{...}<|call|> (text with the harmony markers)
 *   JSON     a forced call (tool_choice "required" or named): the whole text
 *            is {"name": N, "arguments": {...}} (what ie_tool_call_schema
 *            describes)
 * Text that does not parse as calls is never an error: the result has no
 * calls and content is the whole text (a model may talk about <tool_call>).
 */
#ifndef IE_TOOLS_H
#define IE_TOOLS_H

#include "ie_status.h"

#include <cjson/cJSON.h>
#include <stddef.h>

typedef enum ie_tool_format {
    IE_TOOL_FMT_NONE = 0, /* the template does not mention tools */
    IE_TOOL_FMT_HERMES,
    IE_TOOL_FMT_LLAMA3,
    IE_TOOL_FMT_MISTRAL,
    IE_TOOL_FMT_HARMONY,
    IE_TOOL_FMT_JSON
} ie_tool_format_t;

/* One parsed call: both strings malloc'd; arguments is JSON text (an
 * object, as OpenAI's function.arguments). */
typedef struct ie_tool_call {
    char *name;
    char *arguments;
} ie_tool_call_t;

/* Calls and the text around them. content is NULL when that text is empty
 * (or only whitespace). */
typedef struct ie_tool_calls {
    ie_tool_call_t *calls;
    size_t n;
    char *content;
} ie_tool_calls_t;

/* The format of a chat template's text (NULL: none). harmony = 1 for a
 * harmony vocabulary (gpt-oss), whose template is not ours to read. A
 * template that mentions "tools" in no known markup gets HERMES, the most
 * common convention (llama.cpp's generic fallback is JSON too). */
ie_tool_format_t ie_tool_format_detect(const char *template_text, int harmony);
/* "none", "hermes", "llama3", "mistral", "harmony", "json". Never NULL. */
const char *ie_tool_format_name(ie_tool_format_t f);

/* Parse generated text[0..len) in format f into *out (zeroed first; free
 * with ie_tool_calls_free). All or nothing: if any call in the text fails
 * to parse (bad JSON, no name, truncated), out has no calls and content is
 * the whole text. Errors: IE_ERR_INVAL NULL out or f NONE; IE_ERR_NOMEM. */
ie_status_t ie_tool_parse(ie_tool_format_t f, const char *text, size_t len, ie_tool_calls_t *out);

/* Free what ie_tool_parse put in c and zero it. Accepts NULL. */
void ie_tool_calls_free(ie_tool_calls_t *c);

/* How many leading bytes of a growing generated text a stream can send as
 * content now: up to where a call starts or could start (a marker, or a
 * marker's prefix at the end; for LLAMA3 / MISTRAL / JSON a text that opens
 * with '{' / '[' is held whole). The rest is parsed when the text is done. */
size_t ie_tool_safe_len(ie_tool_format_t f, const char *text, size_t len);

/* Check OpenAI's "tools": an array of {"type": "function", "function":
 * {"name": string of [A-Za-z0-9_.-]{1,64}, "description"?: string,
 * "parameters"?: object, "strict"?: bool}}, names unique. 0 when good;
 * else -1 with a message in why[cap] naming the entry. */
int ie_tool_list_check(const cJSON *tools, char *why, size_t cap);

/* The JSON Schema of one forced call {"name", "arguments"}: for name (not
 * NULL) that function's; else any of tools (anyOf, one branch per function,
 * name as const, arguments as its parameters or {"type": "object"}).
 * Returns malloc'd JSON text, or NULL (name not in tools, out of memory). */
char *ie_tool_call_schema(const cJSON *tools, const char *name);

/* Rewrite OpenAI chat messages (an array; edited in place) into what HF
 * chat templates expect, as vLLM does before apply_chat_template:
 *   - role "developer" becomes "system" unless the template text mentions
 *     "developer" (llama.cpp does the same);
 *   - an assistant message's tool_calls[].function.arguments, a JSON string
 *     in the API, becomes the object it encodes (templates iterate it or
 *     print it with tojson); a string that is not a JSON object stays;
 *   - content null (an assistant turn that only calls tools) becomes ""
 *     as vLLM's message parsing makes it: several published templates
 *     (Qwen3, QwQ, Granite) fail on None in transformers.
 * 0 when good; -1 with why[cap] for a malformed tool_calls entry (not an
 * array of {"function": {"name": string, "arguments": string|object}}) or
 * a tool message whose content is missing; -2 out of memory. */
int ie_tool_messages_prepare(cJSON *msgs, const char *template_text, char *why, size_t cap);

#endif
