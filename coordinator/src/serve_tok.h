/* serve_tok.h — the bodies of POST /tokenize and /detokenize (serve_http.c
 * routes them), in the two shapes clients use:
 *
 *   llama-server: /tokenize {"content", "add_special" (false),
 *                 "parse_special" (true), "with_pieces" (false)}
 *                 -> {"tokens": [id...]} or, with pieces,
 *                 {"tokens": [{"id", "piece"}...]} (piece: a string, or
 *                 its bytes as numbers when they are not valid UTF-8);
 *   vLLM:         /tokenize {"prompt", "add_special_tokens" (true),
 *                 "return_token_strs" (false)} or {"messages", ...} (the
 *                 chat template, rendered by the caller)
 *                 -> {"count", "max_model_len", "tokens"[, "token_strs"]}.
 *
 * The shape is told by the field names ("content" vs "prompt"/"messages").
 * /detokenize {"tokens": [id...]} answers {"content", "prompt"} (the text
 * under both shapes' names). Internal to the coordinator library. */
#ifndef IE_SERVE_TOK_H
#define IE_SERVE_TOK_H

#include "ie_tokenizer.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Why a body was refused: the field (static) and a message; oom set when
 * the reason is memory (HTTP 500), else the request is bad (400). */
typedef struct ie_tokapi_err {
    const char *param;
    char message[256];
    int oom;
} ie_tokapi_err_t;

/* Contract: root is the parsed body of POST /tokenize (an object). chat_ids
 * (n_chat of them) are the ids of vLLM's "messages" form, rendered by the
 * caller through the chat template; NULL for the text forms, which are
 * tokenized here. n_ctx is reported as max_model_len. Returns 0 and *out
 * (the caller's), or -1 with *e filled. */
int ie_tokapi_tokenize(const ie_tokenizer_t *tok, int n_ctx, const cJSON *root, const int32_t *chat_ids,
                       size_t n_chat, cJSON **out, ie_tokapi_err_t *e);

/* Contract: root is the parsed body of POST /detokenize. Every id must be
 * an integer in [0, n_vocab) (else -1, param "tokens"); control tokens
 * are written as their text (both servers do). Returns 0 and *out, or -1
 * with *e filled. */
int ie_tokapi_detokenize(const ie_tokenizer_t *tok, const cJSON *root, cJSON **out, ie_tokapi_err_t *e);

#endif
