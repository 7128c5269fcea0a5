/* ie_chat.h — a conversation (messages as JSON) -> the model's prompt.
 *
 * The template is chosen in this order (ie_chat_format_for):
 *   - harmony (gpt-oss): the vocabulary has "<|start|>" and "<|channel|>";
 *     rendered by ie_harmony (see ie_harmony.h), ends in "<|start|>assistant";
 *   - the model's own Jinja chat_template (GGUF tokenizer.chat_template, or
 *     chat_template.jinja / tokenizer_config.json next to tokenizer.json; see
 *     ie_chat_template_find), rendered by ie_jinja exactly as transformers'
 *     apply_chat_template(..., add_generation_prompt=True) renders it;
 *   - ChatML, the fallback for a vocabulary with "<|im_start|>" and
 *     "<|im_end|>" but no template: "<|im_start|>{role}\n{content}<|im_end|>\n"
 *     per message, then "<|im_start|>assistant\n" (no default system
 *     message: that is SmolLM2's template's own, and comes with it).
 *
 * Special tokens are trusted only where the template puts them. Message
 * content is user data: a user typing "<|im_end|>" must not end the turn.
 * ie_chat_encode therefore never tokenizes the rendered text as a whole with
 * IE_TOK_PARSE_SPECIAL; it cuts the text at special tokens found in the
 * template's own text (the jinja renderer marks which bytes came from the
 * messages) and encodes everything between two of them, content included,
 * as plain text. For a conversation without special-token text in its
 * content this gives exactly the ids of tokenizing the rendered text with
 * special-token parsing (what Hugging Face's apply_chat_template does);
 * with it, the content's "<|im_end|>" becomes ordinary text tokens.
 * (Rejecting such content was the alternative; it would make it impossible
 * to ask the model about its own markup.)
 */
#ifndef IE_CHAT_H
#define IE_CHAT_H

#include "ie_harmony.h"
#include "ie_jinja.h"
#include "ie_status.h"
#include "ie_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ie_chat_format {
    IE_CHAT_NONE = 0, /* the vocabulary has no chat markup we know */
    IE_CHAT_CHATML,
    IE_CHAT_HARMONY,
    IE_CHAT_TEMPLATE /* the model's jinja chat_template */
} ie_chat_format_t;

/* Options; a zeroed struct (or NULL) gives the defaults. */
typedef struct ie_chat_opts {
    ie_harmony_effort_t effort; /* harmony only; zero = medium           */
    const char *current_date;   /* harmony only; NULL: today (local time) */
    /* The model's compiled chat template (NULL: none). tmpl_error, if not
     * NULL, says why the model's template could not be compiled: chat then
     * fails with it rather than silently using another format. */
    const ie_jinja_t *tmpl;
    const char *tmpl_error;
    /* extra template variables, a JSON object such as
     * {"enable_thinking": false}; NULL: none */
    const char *template_kwargs;
    /* the template's `tools` variable, a JSON array of OpenAI tool
     * objects ({"type": "function", "function": {...}}); NULL: none.
     * Only a model's Jinja template renders it: a harmony model with
     * tools is rendered by its template (opts->tmpl) instead of
     * ie_harmony; ChatML, or harmony without a template:
     * IE_ERR_UNSUPPORTED. */
    const char *tools_json;
} ie_chat_opts_t;

/* The chat format of a tokenizer's vocabulary (harmony wins if both). */
ie_chat_format_t ie_chat_format(const ie_tokenizer_t *tok);
/* The format ie_chat_render / _encode use with these options: harmony by
 * vocabulary, else the template if opts has one (or a template error),
 * else ChatML by vocabulary, else none. opts may be NULL. */
ie_chat_format_t ie_chat_format_for(const ie_tokenizer_t *tok, const ie_chat_opts_t *opts);
/* "none", "chatml", "harmony", "template". Never NULL. */
const char *ie_chat_format_name(ie_chat_format_t f);

/* Render messages_json ([{"role": ..., "content": ...}, ...], NUL-terminated)
 * into the prompt text. On success *prompt_out is a malloc'd NUL-terminated
 * string the caller frees; on failure NULL. The text is for display and for
 * callers that need a string; to feed a model use ie_chat_encode, which keeps
 * special-token text in content from becoming tokens.
 * Errors (the message says what and, where it can, which message):
 * IE_ERR_FORMAT the JSON is not an array of objects; IE_ERR_INVAL empty
 * conversation, missing or non-string role / content, unknown role (ChatML:
 * system, user, assistant; harmony: also developer), invalid UTF-8, a
 * vocabulary with no chat template ("model has no chat template"), a
 * conversation the model's template rejects ("chat template raised: ...")
 * or fails on ("chat template line N: ...");
 * IE_ERR_UNSUPPORTED opts->tools_json with no model template to render it,
 * harmony features ie_harmony does not render (tools),
 * a model template that did not compile (opts->tmpl_error); IE_ERR_NOMEM. */
ie_status_t ie_chat_render(const ie_tokenizer_t *tok, const char *messages_json, const ie_chat_opts_t *opts,
                           char **prompt_out);

/* Render and tokenize as described at the top of this file (no BOS is
 * added beyond what the template writes: transformers tokenizes a chat
 * with add_special_tokens=False). On success *ids_out (malloc'd, caller
 * frees) holds *n_out ids; on failure NULL and 0. prompt_out (may be NULL)
 * receives the rendered text as ie_chat_render gives it (caller frees).
 * Errors as ie_chat_render. */
ie_status_t ie_chat_encode(const ie_tokenizer_t *tok, const char *messages_json, const ie_chat_opts_t *opts,
                           int32_t **ids_out, size_t *n_out, char **prompt_out);

/* The chat template text of the model whose tokenizer is at
 * tokenizer_path: a GGUF's tokenizer.chat_template; for a tokenizer.json,
 * chat_template.jinja in the same folder, else tokenizer_config.json's
 * "chat_template" (a string, or a list of {"name", "template"}: "default",
 * else the first). On success *text_out is malloc'd (caller frees) or NULL
 * when the model has none. Errors: IE_ERR_FORMAT an unreadable GGUF or
 * tokenizer_config.json, or a chat_template of the wrong type; IE_ERR_IO;
 * IE_ERR_NOMEM. */
ie_status_t ie_chat_template_find(const char *tokenizer_path, char **text_out);

/* The model's end-of-turn token ids that the tokenizer does not already
 * stop on (ie_tokenizer_is_eog): the special tokens <end_of_turn>,
 * <|eot_id|>, <|eom_id|>, <|im_end|>, <|end|>, <|return|>, <|endoftext|>
 * where the vocabulary has them, and for a tokenizer.json the ids of
 * generation_config.json's eos_token_id (an id or a list) and
 * tokenizer_config.json's eos_token beside it. On success *ids_out is
 * malloc'd (caller frees; NULL when there are none) with *n_out ids.
 * Errors: IE_ERR_NOMEM. Unreadable or absent files are skipped. */
ie_status_t ie_chat_stop_ids(const ie_tokenizer_t *tok, const char *tokenizer_path, int32_t **ids_out,
                             size_t *n_out);

/* Render messages_json (a JSON array of message objects) with a model's
 * Jinja chat template exactly as transformers' apply_chat_template(...,
 * tokenize=False, add_generation_prompt=True) does: the template sees
 * messages (reasoning fields aliased as transformers does), tools = None,
 * documents = None, add_generation_prompt = True, the members of
 * kwargs_json (a JSON object or NULL, e.g. {"enable_thinking": false}) and
 * bos_token / eos_token (template text, not content; NULL = ""). Results
 * and errors as ie_jinja_render (mask_out and raised may be NULL); also
 * IE_ERR_FORMAT when messages_json is not an array of objects. */
ie_status_t ie_chat_template_render(const ie_jinja_t *tmpl, const char *messages_json, const char *kwargs_json,
                                    const char *bos, const char *eos, const ie_jinja_opts_t *jopts, char **text_out,
                                    uint8_t **mask_out, size_t *len_out, int *raised);

#endif
