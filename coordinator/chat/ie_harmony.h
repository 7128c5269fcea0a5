/* ie_harmony.h — OpenAI's "harmony" chat format (gpt-oss).
 *
 * Two halves:
 *   - rendering: a conversation (system / developer / user / assistant
 *     messages, assistant ones on the analysis or final channel) becomes the
 *     exact prompt text that gpt-oss's chat template (openai-gpt-oss jinja,
 *     apply_chat_template with add_generation_prompt=True) produces, ending
 *     in "<|start|>assistant". Tokenize it with IE_TOK_PARSE_SPECIAL;
 *   - parsing: a streaming parser splits what the model generates after that
 *     prompt into channels (analysis = chain of thought, final = the answer,
 *     commentary = tool calls) and reports the token that stopped it.
 *
 * What the template does, and so what we do:
 *   - the system message is always ours: model identity, "Knowledge cutoff",
 *     "Current date", "Reasoning: low|medium|high", the valid channels;
 *   - a first message with role system or developer becomes the developer
 *     message "# Instructions\n\n<content>\n\n" (omitted when empty);
 *   - earlier assistant turns are rendered as final-channel messages; their
 *     chain of thought (analysis) is dropped, as the template drops it.
 * Not supported (IE_ERR_UNSUPPORTED): tools, tool calls, tool messages, the
 * commentary channel on input. Stricter than the template (IE_ERR_INVAL):
 * a system / developer message that is not first (the template silently
 * ignores it), an analysis message not followed by its final message.
 */
#ifndef IE_HARMONY_H
#define IE_HARMONY_H

#include "ie_status.h"
#include "ie_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ie_harmony_role {
    IE_HARMONY_SYSTEM = 0,
    IE_HARMONY_DEVELOPER,
    IE_HARMONY_USER,
    IE_HARMONY_ASSISTANT
} ie_harmony_role_t;

typedef enum ie_harmony_channel {
    IE_HARMONY_CH_NONE = 0, /* no <|channel|> in the header (or not an assistant message) */
    IE_HARMONY_CH_ANALYSIS,
    IE_HARMONY_CH_COMMENTARY,
    IE_HARMONY_CH_FINAL,
    IE_HARMONY_CH_OTHER /* a channel name we do not know */
} ie_harmony_channel_t;

/* Zero is the template's default, "medium". */
typedef enum ie_harmony_effort {
    IE_HARMONY_EFFORT_MEDIUM = 0,
    IE_HARMONY_EFFORT_LOW,
    IE_HARMONY_EFFORT_HIGH
} ie_harmony_effort_t;

/* Rendering options; a zeroed struct (or NULL) gives the template defaults. */
typedef struct ie_harmony_opts {
    ie_harmony_effort_t effort;
    const char *model_identity;   /* NULL: "You are ChatGPT, a large language model trained by OpenAI." */
    const char *knowledge_cutoff; /* NULL: "2024-06" (fixed in the template) */
    const char *current_date;     /* NULL: today, local time, "%Y-%m-%d" (strftime_now) */
    int no_generation_prompt;     /* 1: training-style render: no trailing "<|start|>assistant",
                                     a last assistant message ends in <|return|> and keeps its
                                     analysis (add_generation_prompt=False) */
} ie_harmony_opts_t;

/* "low" / "medium" / "high" -> *out. IE_ERR_INVAL for anything else. */
ie_status_t ie_harmony_effort_parse(const char *s, ie_harmony_effort_t *out);
/* Static name: "system", "analysis", ... Never NULL. */
const char *ie_harmony_role_str(ie_harmony_role_t role);
const char *ie_harmony_channel_str(ie_harmony_channel_t ch);

/* ---- conversations ------------------------------------------------- */

typedef struct ie_harmony_conv ie_harmony_conv_t;

/* An empty conversation. Caller owns *out (ie_harmony_conv_destroy). */
ie_status_t ie_harmony_conv_new(ie_harmony_conv_t **out);
/* Free and set *self_p to NULL. Accepts NULL. */
void ie_harmony_conv_destroy(ie_harmony_conv_t **self_p);

/* Append a message; content (UTF-8, may be empty) is copied. channel is
 * IE_HARMONY_CH_NONE for non-assistant messages; for assistant ones NONE
 * means final. IE_ERR_INVAL: NULL content, invalid UTF-8, a channel on a
 * non-assistant message, an unknown role or channel. */
ie_status_t ie_harmony_conv_add(ie_harmony_conv_t *conv, ie_harmony_role_t role, ie_harmony_channel_t channel,
                                const char *content, size_t len);

size_t ie_harmony_conv_len(const ie_harmony_conv_t *conv);

/* Parse [{"role": "...", "content": "...", "channel"?: "analysis"|"final",
 * "thinking"?: "..."}, ...] (roles system, developer, user, assistant;
 * "thinking" on an assistant message is its analysis, as in the
 * transformers chat format). Caller owns *out. Errors (the message names
 * the message index and field): IE_ERR_FORMAT bad JSON or not an array of
 * objects; IE_ERR_INVAL missing / non-string role or content, unknown role
 * or channel, channel on a non-assistant message, invalid UTF-8;
 * IE_ERR_UNSUPPORTED role "tool", tool_calls, channel "commentary". */
ie_status_t ie_harmony_conv_from_json(const char *json, size_t len, ie_harmony_conv_t **out);

/* Render the prompt text (see the top of this file). On success *text_out
 * is a malloc'd NUL-terminated string the caller frees and *len_out its
 * length; on failure NULL and 0. opts may be NULL. Errors IE_ERR_INVAL
 * (system/developer not first, lone analysis message, content holding
 * "<|channel|>analysis<|message|>" or "<|channel|>final<|message|>" as
 * the template refuses, bad opts strings), IE_ERR_NOMEM. */
ie_status_t ie_harmony_render(const ie_harmony_conv_t *conv, const ie_harmony_opts_t *opts, char **text_out,
                              size_t *len_out);

/* ---- streaming output parser --------------------------------------- */

/* Why the parser stopped. */
typedef enum ie_harmony_stop {
    IE_HARMONY_STOP_NONE = 0, /* still running (or ended without a stop token)  */
    IE_HARMONY_STOP_RETURN,   /* <|return|>: the final answer is complete          */
    IE_HARMONY_STOP_CALL,     /* <|call|>: a tool call waits for its result        */
    IE_HARMONY_STOP_EOS       /* another end-of-generation token (<|endoftext|>) */
} ie_harmony_stop_t;

/* Called with each piece of message content as soon as it is known (never
 * a partial UTF-8 character in token mode; text mode passes bytes through). */
typedef void (*ie_harmony_emit_fn)(void *user, ie_harmony_channel_t ch, const char *text, size_t len);

typedef struct ie_harmony_parser ie_harmony_parser_t;

/* A parser for the text generated after a prompt ending in
 * "<|start|>assistant" (so it starts inside an assistant header). tok may
 * be NULL for text-only use (ie_harmony_parser_push_text); it is needed by
 * push_token and must outlive the parser. emit may be NULL. Caller owns
 * *out. */
ie_status_t ie_harmony_parser_new(const ie_tokenizer_t *tok, ie_harmony_emit_fn emit, void *user,
                                  ie_harmony_parser_t **out);
/* Free and set *self_p to NULL. Accepts NULL. */
void ie_harmony_parser_destroy(ie_harmony_parser_t **self_p);

/* Feed generated text in any chunking: the markers <|start|>, <|channel|>,
 * <|message|>, <|constrain|>, <|end|>, <|return|>, <|call|> are recognised
 * even when split across chunks (a possible marker prefix at the end of a
 * chunk is held back until the next one or ie_harmony_parser_finish).
 * After a stop, input is ignored. IE_ERR_NOMEM only. */
ie_status_t ie_harmony_parser_push_text(ie_harmony_parser_t *p, const char *text, size_t len);

/* Feed one generated token (needs a tokenizer). Only the special tokens are
 * markers; ordinary tokens are content even if they spell "<|end|>". EOG
 * tokens other than <|return|> / <|call|> stop with IE_HARMONY_STOP_EOS;
 * other control tokens are ignored. IE_ERR_INVAL: no tokenizer. */
ie_status_t ie_harmony_parser_push_token(ie_harmony_parser_t *p, int32_t id);

/* End of input: releases held-back text and incomplete UTF-8 (as U+FFFD). */
ie_status_t ie_harmony_parser_finish(ie_harmony_parser_t *p);

ie_harmony_stop_t ie_harmony_parser_stop(const ie_harmony_parser_t *p);
/* Everything received so far on a channel (all its messages joined),
 * NUL-terminated, valid until the next push; *len_out (may be NULL) its
 * length. Never NULL. */
const char *ie_harmony_parser_text(const ie_harmony_parser_t *p, ie_harmony_channel_t ch, size_t *len_out);
/* Channel of the message being received (NONE between messages). */
ie_harmony_channel_t ie_harmony_parser_channel(const ie_harmony_parser_t *p);
/* Recipient ("functions.get_weather") of the latest message with a "to="
 * in its header, or "". Never NULL. */
const char *ie_harmony_parser_recipient(const ie_harmony_parser_t *p);
/* Number of messages whose content started (<|message|> seen). */
size_t ie_harmony_parser_n_messages(const ie_harmony_parser_t *p);

#endif
