/**
 * @file clocher.h
 * @brief The public C API of libclocher: load a model, generate text.
 *
 * This is the only header a program that uses the installed library needs
 * (`pkg-config --cflags --libs clocher`). Every type is opaque or a plain
 * output record; nothing here depends on how the engine runs the model
 * (one process, or workers behind the cluster protocol).
 *
 * @code
 *   ie_params_t *opts = NULL;
 *   ie_params_new(&opts);
 *   ie_params_set(opts, "threads", "2");
 *   ie_engine_t *e = NULL;
 *   if (ie_engine_create("models/SmolLM2-135M-Instruct.Q4_1.gguf", opts, &e) != IE_OK)
 *       fprintf(stderr, "%s\n", ie_error_last());
 *   ie_params_destroy(&opts);
 *
 *   ie_params_t *gen = NULL;
 *   ie_params_new(&gen);
 *   ie_params_set(gen, "max_tokens", "32");
 *   ie_params_set(gen, "temperature", "0");
 *   char *text = NULL;
 *   ie_engine_generate(e, "The capital of France is", gen, NULL, NULL, &text, NULL);
 *   puts(text);
 *   ie_free(text);
 *   ie_params_destroy(&gen);
 *   ie_engine_destroy(&e);
 * @endcode
 *
 * Conventions:
 * - Every fallible call returns an ::ie_status_t; on failure it records a
 *   one-line reason that ie_error_last() returns (per thread).
 * - Results come back through `*_out` parameters, which are set to
 *   NULL/zero on failure.
 * - Memory the library returns (text, id arrays) is owned by the caller and
 *   freed with ie_free(). Objects are freed with their `_destroy`, which
 *   takes the address of the pointer, sets it to NULL and accepts NULL.
 * - An engine may be used from one thread at a time; distinct engines are
 *   independent.
 */
#ifndef CLOCHER_H
#define CLOCHER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Status of every fallible call. */
typedef enum ie_status {
    IE_OK = 0,
    IE_ERR_INVAL,       /**< bad argument / bad usage                         */
    IE_ERR_IO,          /**< file missing or unreadable                       */
    IE_ERR_FORMAT,      /**< file readable but malformed / inconsistent       */
    IE_ERR_UNSUPPORTED, /**< well-formed but uses something not supported     */
    IE_ERR_NOMEM,       /**< allocation failed                                */
    IE_ERR_RANGE,       /**< value out of range (context full, id too big)    */
    IE_ERR_INTERNAL,    /**< programmer error caught at run time              */
    IE_ERR_TIMEOUT,     /**< nothing arrived in time                          */
    IE_ERR_UNAVAILABLE, /**< a peer is gone or the cluster is not ready       */
    IE_ERR_BUSY         /**< queue full: try again later                      */
} ie_status_t;

/** Static name of a status, e.g. "IE_ERR_FORMAT". Never NULL.
 *  @param st  any value (one outside the enum gives "IE_ERR_UNKNOWN")
 *  @return    the name, a static string */
const char *ie_status_str(ie_status_t st);

/** The calling thread's last recorded failure reason ("" if none).
 *  @return the reason; never NULL; valid until the next failing call on
 *          the same thread */
const char *ie_error_last(void);

/** Free memory the library returned (text, id arrays).
 *  @param p  what a `*_out` parameter received, or NULL */
void ie_free(void *p);

/** Version of the library.
 *  @return e.g. "0.1.0"; static, never NULL */
const char *ie_version(void);

/* ------------------------------------------------------------------ params */

/** A set of named options (key = value, both strings), used for engine
 *  options and for generation options. Opaque. */
typedef struct ie_params ie_params_t;

/** New empty set.
 *  @param[out] out  the set; the caller owns it and frees it with
 *                   ie_params_destroy()
 *  @return IE_OK, IE_ERR_INVAL (out NULL), IE_ERR_NOMEM */
ie_status_t ie_params_new(ie_params_t **out);

/** Set `key` to `value` (both copied). Setting a key again replaces its
 *  value, except "stop", which adds one more stop string each time. Keys
 *  are checked where the set is used: an engine or a generation call
 *  refuses a key it does not know with IE_ERR_INVAL naming the key.
 *  @param p      the set
 *  @param key    option name, e.g. "threads"
 *  @param value  its value as text, e.g. "2"
 *  @return IE_OK, IE_ERR_INVAL (NULL argument), IE_ERR_NOMEM */
ie_status_t ie_params_set(ie_params_t *p, const char *key, const char *value);

/** Free the set and NULL *self_p.
 *  @param self_p  address of the set; NULL and a NULL *self_p are accepted */
void ie_params_destroy(ie_params_t **self_p);

/* ------------------------------------------------------------------ engine */

/** A loaded model with its tokenizer, KV cache and scheduler. Opaque. */
typedef struct ie_engine ie_engine_t;

/** Load the model at `model_path` (a GGUF file, a Hugging Face checkpoint
 *  directory or an IEBIN directory) and make an engine.
 *
 *  `opts` may be NULL (defaults). Keys: "threads" (compute threads, default
 *  the number of cores), "pin" (0/1), "ctx" (KV positions per sequence),
 *  "seqs" (sequences decoded together), "max_batch" (prefill tokens per
 *  step), "precision" (native|f32|bf16|f16|int8w|int4w), "plan"
 *  (none|pipeline:N|tensor:N), "tokenizer" (a tokenizer.json or GGUF path),
 *  "kv_block", "kv_blocks", "prefix_cache" (0/1, default 1: the KV of
 *  earlier prompts stays cached across calls, so a later prompt that starts
 *  the same way, e.g. the next turn of a chat, is not recomputed; see
 *  ie_engine_metrics_t.kv_hits), "cache_type_k", "cache_type_v" (the KV
 *  cache's storage: f32 (default), f16, bf16, q8, q4, fp8_e4m3, fp8_e5m2;
 *  docs/KVCACHE.md), "kv_rotate" (auto|on|off), "kv_swa_full" (0/1,
 *  default 0: sliding-window layers keep a ring of their window, and such
 *  a model takes no prefix-cache hits; 1: the whole context, hits kept).
 *  The set is not kept.
 *
 *  Errors: IE_ERR_INVAL (bad key or value), IE_ERR_IO / IE_ERR_FORMAT /
 *  IE_ERR_UNSUPPORTED (the model or tokenizer), IE_ERR_NOMEM. Caller owns
 *  *out and frees it with ie_engine_destroy().
 *
 *  @param model_path  the model
 *  @param opts        engine options, or NULL
 *  @param[out] out    the engine (NULL on failure)
 *  @return IE_OK or one of the errors above */
ie_status_t ie_engine_create(const char *model_path, const ie_params_t *opts, ie_engine_t **out);

/** Free the engine and everything it holds; NULL *self_p.
 *  @param self_p  address of the engine; NULL and a NULL *self_p are
 *                 accepted */
void ie_engine_destroy(ie_engine_t **self_p);

/** Streaming callback: called on the generating thread after every sampled
 *  token with its id and the text it released (UTF-8, not NUL-terminated,
 *  may be empty while a character or a possible stop string is incomplete;
 *  the pieces add up to the final text). Return 0 to go on, nonzero to
 *  stop generating (the call then finishes with finish reason "cancelled"). */
typedef int (*ie_token_fn)(void *user, int32_t id, const char *text, size_t len);

/** What one generation did. */
typedef struct ie_gen_info {
    size_t n_prompt;    /**< prompt tokens                                  */
    size_t n_gen;       /**< generated tokens                               */
    const char *finish; /**< "eos", "stop", "length", "context" or
                              "cancelled" (static string)                    */
    double ttft_ms;     /**< call start to first token                      */
    double total_ms;    /**< call start to return                           */
} ie_gen_info_t;

/** Generate a continuation of `prompt` (UTF-8).
 *
 *  `gen` may be NULL (defaults: 128 tokens, temperature 1). Keys:
 *  "max_tokens", "temperature" (0 = greedy), "top_k", "top_p", "min_p",
 *  "repeat_penalty", "repeat_last_n", "frequency_penalty",
 *  "presence_penalty", "seed", "stop" (repeatable), "logit_bias"
 *  (repeatable, "ID+BIAS" / "ID-BIAS": added to token ID's logit; "-inf"
 *  bans it), "min_tokens" (no end at EOS or a stop string before then),
 *  "ignore_eos" (0/1: never end at EOS), "add_special" (0/1, default 1),
 *  "parse_special" (0/1, default 1).
 *
 *  `on_token` (may be NULL) streams tokens as they come. `text_out` (may be
 *  NULL) receives the whole generated text, NUL-terminated, owned by the
 *  caller (ie_free()). `info_out` (may be NULL) is filled on success.
 *
 *  Errors: IE_ERR_INVAL (invalid UTF-8, bad key or value), IE_ERR_RANGE
 *  (the prompt does not fit the context), IE_ERR_NOMEM, or the backend's
 *  failure (IE_ERR_UNAVAILABLE for a lost worker).
 *
 *  @param e              the engine
 *  @param prompt         the prompt, NUL-terminated UTF-8
 *  @param gen            generation options, or NULL
 *  @param on_token       streaming callback, or NULL
 *  @param user           passed to on_token as is
 *  @param[out] text_out  the generated text, or NULL not to receive it
 *  @param[out] info_out  what the generation did, or NULL
 *  @return IE_OK or one of the errors above */
ie_status_t ie_engine_generate(ie_engine_t *e, const char *prompt, const ie_params_t *gen, ie_token_fn on_token,
                               void *user, char **text_out, ie_gen_info_t *info_out);

/** As ie_engine_generate(), for a conversation rendered with the model's
 *  chat template: messages i = (roles[i], contents[i]), roles "system",
 *  "user", "assistant"; the assistant's turn is opened for the reply.
 *  Errors as ie_engine_generate(), plus IE_ERR_UNSUPPORTED when the model
 *  has no chat template clocher can render.
 *
 *  @param e              the engine
 *  @param roles          n roles
 *  @param contents       n message texts (UTF-8)
 *  @param n              number of messages (>= 1)
 *  @param gen            generation options, or NULL
 *  @param on_token       streaming callback, or NULL
 *  @param user           passed to on_token as is
 *  @param[out] text_out  the reply's text, or NULL not to receive it
 *  @param[out] info_out  what the generation did, or NULL
 *  @return IE_OK or one of the errors above */
ie_status_t ie_engine_chat(ie_engine_t *e, const char *const *roles, const char *const *contents, size_t n,
                           const ie_params_t *gen, ie_token_fn on_token, void *user, char **text_out,
                           ie_gen_info_t *info_out);

/** Token ids of `text` (UTF-8). `add_special` adds BOS/EOS as the
 *  tokenizer's rules say; special-token text is parsed as such. *ids_out is
 *  owned by the caller (ie_free()); it may be NULL when *n_out is 0.
 *  @param e             the engine
 *  @param text          NUL-terminated UTF-8
 *  @param add_special   nonzero: add BOS/EOS
 *  @param[out] ids_out  the ids
 *  @param[out] n_out    how many
 *  @return IE_OK, IE_ERR_INVAL (invalid UTF-8, NULL argument), IE_ERR_NOMEM */
ie_status_t ie_engine_tokenize(ie_engine_t *e, const char *text, int add_special, int32_t **ids_out, size_t *n_out);

/** The text of `ids` (special tokens rendered as their text), NUL-terminated,
 *  owned by the caller (ie_free()).
 *  @param e              the engine
 *  @param ids            n token ids (may be NULL when n is 0)
 *  @param n              how many
 *  @param[out] text_out  the text (NULL on failure)
 *  @return IE_OK, IE_ERR_RANGE (an id outside the vocabulary), IE_ERR_INVAL,
 *          IE_ERR_NOMEM */
ie_status_t ie_engine_detokenize(ie_engine_t *e, const int32_t *ids, size_t n, char **text_out);

/** Running totals over every generation of this engine since it was made. */
typedef struct ie_engine_metrics {
    uint64_t requests;     /**< generations finished                      */
    uint64_t tokens_in;    /**< prompt tokens                             */
    uint64_t tokens_out;   /**< generated tokens                          */
    uint64_t kv_hits;      /**< prompt tokens served from the prefix cache */
    uint64_t kv_misses;    /**< prompt tokens computed                    */
    double prefill_tps;    /**< prompt tokens / time in prefill steps     */
    double decode_tps;     /**< tokens / time in decode-only steps        */
    double tps;            /**< generated tokens / time in generate calls */
    double latency_p50_ms; /**< per-token decode latency, median          */
    double latency_p95_ms; /**< per-token decode latency, 95th percentile */
    double ttft_p50_ms;    /**< time to first token, median               */
    double rss_peak_mb;    /**< the process's peak resident memory        */
} ie_engine_metrics_t;

/** Fill *out with the engine's running totals.
 *  @param e         the engine
 *  @param[out] out  the totals (zeroed on failure)
 *  @return IE_OK, IE_ERR_INVAL (NULL argument) */
ie_status_t ie_engine_get_metrics(const ie_engine_t *e, ie_engine_metrics_t *out);

/** Vocabulary size of the loaded model.
 *  @param e  the engine, or NULL
 *  @return   the number of token ids (0 for a NULL engine) */
size_t ie_engine_n_vocab(const ie_engine_t *e);

#ifdef __cplusplus
}
#endif

#endif
