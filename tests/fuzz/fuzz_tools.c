/* fuzz_tools.c — libFuzzer target for the tool-call parsers and request
 * checks (coordinator/chat/tools.c).
 *
 * The input is generated text: every format parses it (all of it and every
 * prefix length the stream hold-back sees), and each call found must carry
 * a name and arguments that are a JSON object. The same bytes, if they are
 * JSON, go through the tools-list check, the forced-call schema and the
 * message rewrite. Any crash, leak or sanitizer report is a bug; "no calls"
 * and errors are fine.
 */
#include "ie_tools.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    static const ie_tool_format_t FMTS[] = {IE_TOOL_FMT_HERMES, IE_TOOL_FMT_LLAMA3, IE_TOOL_FMT_MISTRAL,
                                            IE_TOOL_FMT_HARMONY, IE_TOOL_FMT_JSON};
    for (size_t f = 0; f < sizeof FMTS / sizeof FMTS[0]; f++) {
        ie_tool_calls_t c;
        if (ie_tool_parse(FMTS[f], text, size, &c) == IE_OK) {
            for (size_t i = 0; i < c.n; i++) {
                cJSON *a = cJSON_Parse(c.calls[i].arguments);
                if (!c.calls[i].name[0] || !cJSON_IsObject(a)) abort();
                cJSON_Delete(a);
            }
            if (!c.n && size && !memchr(text, 0, size) && (!c.content || strlen(c.content) != size)) abort();
            ie_tool_calls_free(&c);
        }
        size_t last = 0; /* the first 128 prefixes (each call scans its whole prefix) */
        for (size_t n = 0; n <= size && n < 128; n++) {
            size_t s = ie_tool_safe_len(FMTS[f], text, n);
            if (s > n || (s < last && FMTS[f] != IE_TOOL_FMT_JSON)) abort(); /* never shrinks as text grows */
            last = s;
        }
    }
    cJSON *j = cJSON_ParseWithLength(text, size);
    if (j) {
        char why[128];
        if (ie_tool_list_check(j, why, sizeof why) == 0) {
            free(ie_tool_call_schema(j, NULL));
            free(ie_tool_call_schema(j, "f"));
        }
        (void)ie_tool_messages_prepare(j, NULL, why, sizeof why);
        cJSON_Delete(j);
    }
    return 0;
}
