/* ie_engine.h — the public C API of clocher (embedded mode).
 *
 * An engine is a coordinator (tokenizer, scheduler, samplers) and a worker
 * (weights, KV cache, kernels) in one process:
 *
 *     ie_engine_opts_t o; ie_engine_opts_default(&o);
 *     o.model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
 *     ie_engine_t *e; if (ie_engine_open(&o, &e) != IE_OK) ... ie_error_last()
 *     ie_gen_params_t p; ie_gen_params_default(&p); p.max_new = 32;
 *     ie_gen_result_t r; ie_engine_generate_batch(e, &prompt, 1, &p, &r);
 *     ... r.text, r.n_gen ...
 *     ie_gen_result_clear(&r); ie_engine_destroy(&e);
 *
 * Several prompts in one call run as a continuously batched set: up to
 * opts.n_seq sequences decode together in each step (each with its own KV
 * slot, position and sampler); a finished one frees its slot for the next.
 */
#ifndef IE_ENGINE_H
#define IE_ENGINE_H

#include "ie_cluster.h"
#include "ie_sampler.h"
#include "ie_status.h"
#include "ie_tokenizer.h"
#include "ie_worker.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_engine ie_engine_t;

typedef struct ie_engine_opts {
    const char *model_path;   /* GGUF file or HF directory              */
    const char *tokenizer_path; /* NULL: the model's own               */
    int n_threads;            /* compute threads (>= 1)                 */
    int pin_threads;          /* pin them to cores                      */
    int n_ctx;                /* KV positions per sequence; 0: min(train
                                 context, 4096)                         */
    int n_seq;                /* sequences decoded together (>= 1)      */
    int max_batch;            /* prefill chunk, tokens per step         */
    ie_precision_t precision;
    int no_tokenizer;         /* 1: do not load one (logits-only use)   */
    /* Distributed execution (docs/OPERATIONS.md). plan NONE: one worker
     * in this process, called directly. PIPELINE/TENSOR: n_workers
     * workers behind the cluster protocol — as threads of this process
     * over ZeroMQ inproc:// when cluster_bind is NULL, else remote
     * ie-worker processes registering at cluster_bind. */
    ie_shard_kind_t plan;
    int n_workers;            /* >= 1 when plan != NONE                 */
    const char *cluster_bind; /* e.g. "tcp://0.0.0.0:5555"; NULL: inproc */
    int cluster_wait_ms;      /* create waits this long for the workers
                                 (0: 60 s; < 0: not at all — steps fail
                                 with IE_ERR_UNAVAILABLE until ready)   */
    int heartbeat_ms, dead_ms;/* 0: 250 / 2000                          */
    ie_net_t *net;            /* ZeroMQ context to use (CURVE set up by
                                 the caller); NULL: the engine makes one */
    ie_metrics_t *metrics;    /* optional registry for cluster metrics   */
    /* Paged KV cache (ie_worker.h, ie_kvpool.h): positions per block
     * (0: 16) and blocks in the pool (0: n_seq * ceil(n_ctx / kv_block),
     * enough for every slot's whole context). A smaller pool serves more
     * slots than memory for full contexts allows; the scheduler preempts
     * a sequence when the pool runs out. */
    int kv_block, kv_blocks;
    int prefix_cache;         /* reuse cached KV blocks of equal prompt
                                 prefixes across requests (default 1)   */
} ie_engine_opts_t;

void ie_engine_opts_default(ie_engine_opts_t *o);

/* Load the model and tokenizer and build the worker. Errors: IE_ERR_IO /
 * IE_ERR_FORMAT / IE_ERR_UNSUPPORTED for the model or tokenizer,
 * IE_ERR_NOMEM, IE_ERR_INVAL for options. Caller owns *out. */
ie_status_t ie_engine_open(const ie_engine_opts_t *o, ie_engine_t **out);

void ie_engine_destroy(ie_engine_t **self_p);

const ie_hparams_t *ie_engine_hparams(const ie_engine_t *e);
/* One pointer the public API (api.c) keeps with the engine: NULL at open,
 * freed with free() by ie_engine_destroy. */
void **ie_engine_ext(const ie_engine_t *e);
const ie_tokenizer_t *ie_engine_tokenizer(const ie_engine_t *e);
/* The in-process worker (plan NONE), else NULL. */
ie_worker_t *ie_engine_worker(ie_engine_t *e);
/* The cluster (plan PIPELINE/TENSOR), else NULL. */
ie_cluster_t *ie_engine_cluster(ie_engine_t *e);
/* One raw step (ie_worker_step's contract) on whichever backend runs the
 * model, and the slot reset that goes with it. */
ie_status_t ie_engine_step(ie_engine_t *e, const ie_batch_t *b, float *logits_out);
void ie_engine_seq_clear(ie_engine_t *e, int seq);
/* Paged KV on whichever backend runs the model: ie_worker_kv_bind's and
 * ie_worker_seq_set_len's contracts. A cluster checks the arguments at
 * once and sends the operations to every rank with the next step. */
ie_status_t ie_engine_kv_bind(ie_engine_t *e, int seq, int first, const int32_t *pb, int n);
ie_status_t ie_engine_seq_set_len(ie_engine_t *e, int seq, int n_pos);
int ie_engine_kv_block(const ie_engine_t *e);
int ie_engine_kv_blocks(const ie_engine_t *e);
int ie_engine_n_seq(const ie_engine_t *e);
/* opts.prefix_cache as created. */
int ie_engine_prefix_cache(const ie_engine_t *e);
int ie_engine_max_batch(const ie_engine_t *e);
int ie_engine_n_ctx(const ie_engine_t *e);

typedef enum ie_finish {
    IE_FINISH_NONE = 0,
    IE_FINISH_EOS,       /* the model ended its turn             */
    IE_FINISH_STOP,    /* a stop string appeared               */
    IE_FINISH_LENGTH,    /* max_new tokens generated             */
    IE_FINISH_CONTEXT    /* the sequence filled its KV slot      */
} ie_finish_t;

const char *ie_finish_name(ie_finish_t r);

typedef struct ie_gen_params {
    int max_new;                  /* tokens to generate at most (>= 0)  */
    ie_sampler_params_t sampling;
    const char *const *stop;      /* stop strings (not part of output)  */
    size_t n_stop;
    int add_special;              /* BOS/EOS per the tokenizer's rules  */
    int parse_special;            /* special-token text -> tokens       */
    /* Streaming (optional): called after every sampled token of prompt
     * `index` with the token and the text it released (after stop-string
     * holding; may be empty, not NUL-terminated). */
    void (*on_token)(void *ctx, size_t index, int32_t id, const char *text, size_t len);
    void *on_token_ctx;
    /* Cancellation (optional): once *cancel is nonzero (on_token may set
     * it), every request of the call is cancelled before the next step
     * (ie_sched_cancel) and the call fails with IE_ERR_INVAL "cancelled". */
    const volatile int *cancel;
} ie_gen_params_t;

/* max_new 128, sampler defaults, no stop strings, add_special 1,
 * parse_special 1 (prompts are the user's own: chat markup works). */
void ie_gen_params_default(ie_gen_params_t *p);

typedef struct ie_gen_result {
    char *text;               /* generated text (malloc'd, NUL-terminated) */
    int32_t *ids;             /* generated ids (malloc'd)                */
    size_t n_gen;
    size_t n_prompt;          /* prompt tokens                           */
    ie_finish_t stop;
    double ttft_ms;           /* from the call's start (tokenization and
                                 waiting for a slot included) to the
                                 first token                            */
    double *lat_ms;           /* per generated token after the first:
                                 time since the previous one (malloc'd)  */
    size_t n_lat;
} ie_gen_result_t;

/* Free a result's buffers and zero it. Accepts a zeroed result. */
void ie_gen_result_clear(ie_gen_result_t *r);

/* Step timing. A step that holds any prompt tokens is a prefill step (its
 * time and prompt tokens count here, with any decode token riding along);
 * a step of decode tokens only is a decode step. Sampling and
 * detokenizing between steps count in neither. */
typedef struct ie_gen_stats {
    double prefill_ms;        /* time in prefill steps                   */
    double decode_ms;         /* time in decode-only steps               */
    size_t prefill_tokens;    /* prompt tokens                           */
    size_t decode_tokens;     /* tokens sampled after decode-only steps  */
    size_t prefix_hit_tokens; /* prompt tokens whose KV came from the
                                 prefix cache (not computed)             */
    size_t prefix_miss_tokens;/* prompt tokens computed                  */
    size_t preemptions;       /* sequences preempted (KV pool full)      */
} ie_gen_stats_t;

/* Generate for n prompts (UTF-8). results[i] belongs to prompts[i]; the
 * caller clears each. Fails before generating anything on invalid UTF-8
 * (IE_ERR_INVAL, naming the prompt), a prompt that does not fit the context
 * (IE_ERR_RANGE) or bad sampling params; on failure every result is
 * cleared. stats (optional) accumulates timing of the whole call. */
ie_status_t ie_engine_generate_batch(ie_engine_t *e, const char *const *prompts, size_t n,
                               const ie_gen_params_t *p, ie_gen_result_t *results,
                               ie_gen_stats_t *stats);

/* As ie_engine_generate_batch, for prompts already tokenized (e.g. by
 * ie_chat_encode): prompt i is ids[i][0..n_ids[i]), used as given
 * (p->add_special and p->parse_special do not apply). Errors as
 * ie_engine_generate_batch, plus IE_ERR_RANGE for an id outside the model's
 * vocabulary and IE_ERR_INVAL for an empty prompt. */
ie_status_t ie_engine_generate_ids(ie_engine_t *e, const int32_t *const *ids, const size_t *n_ids, size_t n,
                                   const ie_gen_params_t *p, ie_gen_result_t *results,
                                   ie_gen_stats_t *stats);

/* Logits for every position of `ids` in sequence slot 0 (cleared first):
 * out holds n * n_vocab floats, row i after consuming ids[0..i]. `decode`
 * 1 feeds one token per step, 0 prefills in chunks of max_batch. */
ie_status_t ie_engine_logits(ie_engine_t *e, const int32_t *ids, size_t n, int decode, float *out);

#endif
