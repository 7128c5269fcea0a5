/* fuzz_jinja.c — libFuzzer target for the chat-template interpreter.
 *
 * The input is a template: parse it and, if it parses, render it twice with
 * a small conversation (once with add_generation_prompt and a thinking
 * switch, once with an empty conversation), with tight output / step /
 * memory limits so that runaway templates end in an error, not a timeout.
 * Any crash, leak or sanitizer report is a bug; errors are fine.
 */
#include "ie_chat.h"
#include "ie_jinja.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char MESSAGES[] =
    "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi <|im_end|> {{ x }}\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>t</think>Hello\",\"reasoning_content\":\"r\"},"
    "{\"role\":\"user\",\"content\":\"\\u00e9\\ud83c\\udf89 bye\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ie_jinja_t *t = NULL;
    if (ie_jinja_parse((const char *)data, size, &t) != IE_OK) return 0;
    ie_jinja_opts_t jo = {
        .has_now = 1, .now = 1768478400, .max_output = 1 << 16, .max_memory = 32 << 20, .max_steps = 200000};
    char *text = NULL;
    uint8_t *mask = NULL;
    size_t len = 0;
    if (ie_chat_template_render(t, MESSAGES, "{\"enable_thinking\":false}", "<s>", "</s>", &jo, &text, &mask, &len,
                                NULL) == IE_OK) {
        free(text);
        free(mask);
    }
    if (ie_chat_template_render(t, "[]", NULL, NULL, NULL, &jo, &text, NULL, &len, NULL) == IE_OK) free(text);
    ie_jinja_destroy(&t);
    return 0;
}
