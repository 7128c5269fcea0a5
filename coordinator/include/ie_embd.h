/* ie_embd.h — embeddings over the HTTP API (POST /v1/embeddings, OpenAI's
 * shape): the request's parser, the pooled vectors' normalization and
 * encoding, and the collector of a batch of embedding requests' answers
 * from the scheduler.
 *
 * An embedding is the pooled final-norm hidden state of the input's
 * positions (the head's input: ie_backend.h, IE_LOGITS_EMBD), pooled by the
 * scheduler (ie_sched_req_t.pooling: mean, last or cls) and then
 * normalized here (L2 by default, as llama-server's embd_normalize 2, or
 * not at all). The serving side (serve_http.c) submits one scheduler
 * request per input and answers when all have ended.
 */
#ifndef IE_EMBD_H
#define IE_EMBD_H

#include "ie_lora_cache.h"
#include "ie_sched.h"
#include "ie_status.h"
#include "ie_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Inputs per request at most (OpenAI's own limit). */
#define IE_EMBD_MAX_INPUTS 2048

/* Normalizations of the pooled vector (llama-server's embd_normalize
 * values for the two offered). */
#define IE_EMBD_NORM_NONE (-1)
#define IE_EMBD_NORM_L2 2

/* One parsed request. */
typedef struct ie_embd_req {
    int32_t **ids; /* [n_in] token ids of each input (owned)        */
    size_t *n_ids; /* [n_in] their counts (each >= 1, <= n_ctx)      */
    size_t n_in;   /* inputs (>= 1)                                 */
    int base64;    /* encoding_format "base64" (else "float")       */
    char *model;   /* "model" as sent (owned), NULL when absent     */
} ie_embd_req_t;

/* Where a parse failed: HTTP status (400, or 500 for out of memory), the
 * OpenAI error code ("invalid_json", "invalid_value",
 * "context_length_exceeded", ...) and the parameter ("" none); the
 * message is ie_error_last(). */
typedef struct ie_embd_err {
    unsigned status;
    const char *code; /* static */
    char param[32];
} ie_embd_err_t;

/* Parse a /v1/embeddings body (len bytes, any bytes: checked to be UTF-8
 * JSON without NUL characters in strings). "input": a string, an array of
 * strings, an array of token ids, or an array of arrays of token ids (none
 * empty, at most IE_EMBD_MAX_INPUTS, each at most n_ctx tokens and ids in
 * [0, n_vocab)); strings are tokenized with the tokenizer's special tokens
 * (BOS) as a completion prompt is. "encoding_format": "float" (default) or
 * "base64"; "dimensions" (any value but null) is refused: the model's
 * width is the only one; "user" is ignored; "model" is returned for the
 * caller to check. IE_OK fills *out (free with ie_embd_req_free); else
 * IE_ERR_INVAL / IE_ERR_RANGE / IE_ERR_NOMEM with *err filled and
 * nothing to free. */
ie_status_t ie_embd_parse(const char *body, size_t len, const ie_tokenizer_t *tok, int32_t n_vocab, int n_ctx,
                          ie_embd_req_t *out, ie_embd_err_t *err);

/* Free what ie_embd_parse filled (accepts a zeroed one). */
void ie_embd_req_free(ie_embd_req_t *r);

/* "mean", "last", "cls" -> the pooling; IE_POOL_NONE for anything else. */
ie_pooling_t ie_pooling_parse(const char *s);

/* The name of a pooling ("mean", ...; "none"): a static string. */
const char *ie_pooling_name(ie_pooling_t p);

/* Normalize v[n] in place: IE_EMBD_NORM_L2 divides by its Euclidean norm
 * (a zero vector stays zero), IE_EMBD_NORM_NONE leaves it. */
void ie_embd_normalize(float *v, int n, int norm);

/* v[n] as base64 of its little-endian f32 bytes (OpenAI's
 * encoding_format "base64"), NUL-terminated, malloc'd; NULL on out of
 * memory. */
char *ie_embd_base64(const float *v, int n);

/* ------------------------------------------------------------ collector
 * The answers of n scheduler requests, one per input. Each submission
 * takes a reference (ie_embd_wait_ref) that its terminal event drops, so
 * the collector outlives a caller that leaves early (a client gone). */
typedef struct ie_embd_wait ie_embd_wait_t;

/* IE_ERR_NOMEM. One reference, the caller's. */
ie_status_t ie_embd_wait_new(size_t n, int dim, ie_embd_wait_t **out);

void ie_embd_wait_ref(ie_embd_wait_t *w);
void ie_embd_wait_unref(ie_embd_wait_t *w); /* accepts NULL */

/* Keep the request's adapter lease (ie_lora_cache_acquire) until the last
 * reference goes, after the scheduler's terminal events of every input:
 * the adapter cannot be detached under an input still queued. Once. */
void ie_embd_wait_hold(ie_embd_wait_t *w, ie_lora_cache_t *lc, ie_lora_lease_t lease);

/* The cb_ctx of input i's request; its callback is ie_embd_wait_on_event. */
void *ie_embd_wait_slot(ie_embd_wait_t *w, size_t i);

/* ie_sched_cb for the requests (serving thread): a DONE stores input i's
 * vector and prompt token count; an ERROR its status, code and message
 * (the first error stands). Either wakes the waiter and drops the
 * submission's reference. */
void ie_embd_wait_on_event(void *ctx, const ie_sched_event_t *ev);

/* Wait up to timeout_ms for the count of ended requests to exceed
 * *n_ended (or for an error); *n_ended becomes the count. Returns 1 when
 * an error was recorded. */
int ie_embd_wait_poll(ie_embd_wait_t *w, int timeout_ms, size_t *n_ended);

/* The first error (after ie_embd_wait_poll returned 1): status, the
 * scheduler's code and message (the collector's, valid while it lives). */
ie_status_t ie_embd_wait_error(ie_embd_wait_t *w, const char **code, const char **message);

/* Input i's vector (dim floats; NULL before its DONE) and prompt tokens. */
float *ie_embd_wait_vec(ie_embd_wait_t *w, size_t i);
size_t ie_embd_wait_tokens(const ie_embd_wait_t *w, size_t i);

#endif
