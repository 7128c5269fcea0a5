/* ie_sched.h — the coordinator's request scheduler: continuous batching over
 * a paged KV cache with a prefix cache, priorities, backpressure, timeouts
 * and cancellation. Every front end (ie_engine_generate_batch, the ZeroMQ client
 * endpoint, the HTTP API) submits requests here.
 *
 * The scheduler drives a backend (ie_backend.h: an in-process worker, a
 * cluster, or a test's fake) through its step boundary and knows nothing
 * else of it. Each ie_sched_step is one backend step: requests join the
 * running batch when a sequence slot and KV blocks are free (highest
 * priority first, then arrival), every running stream contributes its next
 * decode token, and the rest of the step is filled with prompt chunks: at
 * most prefill_chunk prompt tokens while streams decode (so a long prompt
 * adds a bounded amount of work to each of their tokens), up to the
 * backend's max_batch when none does. Finished, cancelled and timed-out
 * requests leave the batch at the step they end and free their blocks at
 * once.
 *
 * KV blocks come from an ie_kvpool. A new request first takes the cached
 * blocks of the longest equal prompt prefix (a shared system prompt is
 * computed once) and prefills only the rest; its own full blocks are
 * published as it goes. When the pool runs dry the running request of
 * lowest priority (latest arrival among equals) is preempted: its blocks
 * are released and it goes back to the head of the queue, to be recomputed
 * (prompt + tokens generated so far) later — its output is unchanged.
 *
 * Batching never changes results: a token's logits do not depend on the
 * other tokens of its step, so greedy output is identical alone or in a
 * batch.
 *
 * Threads: ie_sched_submit, ie_sched_cancel, ie_sched_stats and
 * ie_sched_wait may be called from any thread; ie_sched_step (and
 * ie_sched_destroy) from one thread at a time — the serving thread. Events
 * are delivered on the stepping thread, with no scheduler lock held (a
 * callback may call submit or cancel).
 */
#ifndef IE_SCHED_H
#define IE_SCHED_H

#include "ie_backend.h"
#include "ie_gen.h"
#include "ie_logprobs.h"
#include "ie_metrics.h"
#include "ie_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_sched ie_sched_t;

/* The default prompt-token budget of a step that also decodes streams
 * when the latency target is off (step_latency_ms < 0). */
#define IE_SCHED_PREFILL_CHUNK 32
/* Draft tokens per request and step at most (ie_sched_opts_t.spec_ngram). */
#define IE_SCHED_SPEC_MAX 16
/* With the latency target on: a step that carries decoding streams lasts
 * about IE_SCHED_STEP_LATENCY_X times the measured decode-only step, or
 * IE_SCHED_STEP_LATENCY_MS when that is longer (step_latency_ms 0), and
 * takes at least IE_SCHED_PREFILL_MIN prompt tokens, so that a prompt
 * always advances. Why both: relative to the decode step the bound holds
 * on any model and machine; the floor (20 tokens/s, still faster than
 * anyone reads) keeps a long prompt from crawling where one prompt token
 * deep in a long context costs several decode steps (its attention spans
 * the whole context, the streams' only theirs). */
#define IE_SCHED_STEP_LATENCY_X 4
#define IE_SCHED_STEP_LATENCY_MS 50.0
#define IE_SCHED_PREFILL_MIN 1

typedef struct ie_sched_opts {
    ie_backend_t *backend;     /* not owned, must outlive the scheduler; its
                              n_seq slots and KV pool are the scheduler's
                              from now on (one scheduler per backend)    */
    const ie_tokenizer_t *tok; /* not owned, must outlive the scheduler:
                              detokenizes the output; ids fit the
                              backend's vocabulary                       */
    const int32_t *stop_ids;   /* end-of-turn ids beyond the tokenizer's
                              (ie_tokenizer_is_eog), not owned, must
                              outlive the scheduler; may be NULL        */
    size_t n_stop_ids;
    int no_prefix_cache;    /* 1: never reuse cached KV blocks of equal
                              prompt prefixes (0, the default: reuse)    */
    int queue_max;          /* waiting requests at most (0: 64) beyond
                              the slots free at submit; more is
                              IE_ERR_BUSY                                */
    int prefill_chunk;      /* prompt tokens per step at most while
                              streams decode (0: the backend's max_batch
                              with the latency target on, else
                              IE_SCHED_PREFILL_CHUNK; capped at
                              max_batch); a step with no decoding stream
                              takes up to max_batch                      */
    double step_latency_ms; /* the latency target of a step that carries
                              decoding streams and prompt tokens: the
                              prompt tokens it takes are bounded by the
                              measured cost per prompt token (a moving
                              average) so that the step lasts about
                              this long (> 0: ms; 0: IE_SCHED_STEP_
                              LATENCY_X decode-only steps, measured, at
                              least IE_SCHED_STEP_LATENCY_MS; < 0: off,
                              prefill_chunk alone bounds it)            */
    int retry_ms;           /* > 0: a request whose step failed because a
                              worker was lost (one that never ran on a
                              ready backend fails at once) is
                              recomputed when the
                              backend is ready again, tried again (250 ms
                              apart) for up to this long after the first
                              loss; 0: it ends with ERROR "unavailable"
                              at once                                    */
    ie_gen_stats_t *timing; /* optional: step times and token counts
                              accumulate here (stepping thread only)     */
    int spec_ngram;         /* > 0: prompt-lookup speculative decoding:
                              a greedy request (arg max, no penalties,
                              logit bias, logprobs, grammar or end mask)
                              whose last tokens occurred before in its
                              prompt or output feeds up to this many of
                              the tokens that followed them as drafts
                              (at most IE_SCHED_SPEC_MAX);
                              each draft the arg max confirms is a token
                              of this step, the first that differs and
                              the rest are dropped (their KV positions
                              given back): the same ids, fewer steps.
                              Not on backends whose sliding layers keep a
                              ring (kv_ring_len). 0: off (the default) */
    ie_metrics_t *metrics;  /* optional: ie_requests_total{status},
                              tokens, queue/TTFT/token-latency
                              histograms, KV blocks used/total, prefix
                              hits/misses, preemptions                   */
} ie_sched_opts_t;

typedef enum ie_sched_ev_kind {
    IE_SCHED_TOKEN = 1, /* a token was sampled                          */
    IE_SCHED_DONE,      /* finished normally (terminal)                 */
    IE_SCHED_ERROR      /* failed, cancelled or timed out (terminal)    */
} ie_sched_ev_kind_t;

/* One event. Pointers are valid only during the callback. */
typedef struct ie_sched_event {
    ie_sched_ev_kind_t kind;
    uint64_t id;
    void *user; /* the request's cb_ctx                      */
    /* TOKEN */
    int32_t token;
    const char *text; /* text it released (after stop-string
                                 holding; may be empty; not NUL-terminated) */
    size_t len;
    /* TOKEN of a request with params->logprobs: has_logprob 1, logprob =
     * ln p(token) under the raw logits, top[0..n_top) the top_logprobs most
     * likely tokens (descending; ie_logprobs_row); else 0 / NULL / 0 */
    int has_logprob;
    float logprob;
    const ie_token_logprob_t *top;
    int n_top;
    /* DONE (and, with what was produced before the failure, ERROR) */
    const char *all_text; /* whole output, NUL-terminated             */
    const int32_t *ids;   /* generated ids                             */
    size_t n_gen;
    size_t n_prompt;      /* prompt tokens                             */
    size_t n_cached;      /* prompt tokens taken from the prefix cache */
    ie_finish_t finish;   /* DONE: why it ended                        */
    double queue_ms;      /* submit -> first admitted                  */
    double ttft_ms;       /* submit -> first token                     */
    double total_ms;      /* submit -> this event                      */
    double decode_tps;    /* tokens after the first / their time       */
    const double *lat_ms; /* per token after the first: time since the
                                 previous one                              */
    size_t n_lat;
    /* DONE and the first TOKEN (with n_prompt set) of a request with
     * params->prompt_logprobs: entry i in [1, n_prompt) of prompt_lp is ln p(prompt token i | the tokens before
     * it), and prompt_top[i * prompt_k ..] its prompt_k most likely
     * tokens (entry 0, the first token's, is NaN: nothing comes before
     * it); else NULL / NULL / 0 */
    const float *prompt_lp;
    const ie_token_logprob_t *prompt_top;
    int prompt_k;
    /* ERROR */
    ie_status_t status;  /* IE_ERR_TIMEOUT, IE_ERR_UNAVAILABLE, ...   */
    const char *code;    /* "cancelled", "timeout", "unavailable",
                                 "invalid_request" (needs more KV blocks
                                 than the pool has), "out_of_memory",
                                 "internal"                                */
    const char *message; /* one line                                   */
    /* DONE of an embedding request (ie_sched_req_t.pooling): the pooled
     * final-norm hidden state, not normalized (ie_embd_normalize) */
    const float *embd;
    int n_embd;
} ie_sched_event_t;

typedef void (*ie_sched_cb)(void *ctx, const ie_sched_event_t *ev);

/* An embedding request's pooling of its positions' final-norm hidden
 * states (the head's input). */
typedef enum ie_pooling {
    IE_POOL_NONE = 0, /* not an embedding: a generation request        */
    IE_POOL_MEAN,     /* the mean over every position of the input     */
    IE_POOL_LAST,     /* the last position's (what a causal LM has seen
                         the whole input at)                           */
    IE_POOL_CLS       /* the first position's                          */
} ie_pooling_t;

typedef struct ie_sched_req {
    const int32_t *ids; /* prompt tokens (copied; >= 1, each in the
                                 model's vocabulary, fits the context)     */
    size_t n_ids;
    const ie_gen_params_t *params; /* max_new, sampling (its seed fixed by
                                 the caller), stop strings (copied);
                                 on_token is ignored — events carry tokens */
    int priority;                  /* higher runs first                         */
    int lora;                      /* 0: the base model; k > 0: LoRA adapter
                                 id k - 1 of the backend (ie_engine_lora_find
                                 + 1); its prefix-cache blocks are its own */
    uint64_t lora_salt;            /* the prefix cache's namespace for it
                                 (ie_lora_lease_t.salt: unique per
                                 attached set); 0: lora itself (legacy)  */
    double timeout_ms;             /* > 0: the request ends with ERROR
                                 "timeout" this long after submission if
                                 not finished; 0: no limit                 */
    ie_sched_cb cb;                /* required                                  */
    void *cb_ctx;                  /* must stay valid until the terminal event  */
    /* != IE_POOL_NONE: an embedding request. Its prompt is computed from
     * position 0 in a slot of its own (no prefix-cache reuse, and its
     * blocks are freed, not published, at the end), params->max_new and
     * sampling are ignored, no TOKEN events; DONE carries the pooled vector
     * (embd). It queues, batches with generation and is refused when busy
     * like any request. IE_ERR_UNSUPPORTED from submit when the backend
     * gives no hidden states (geom n_embd 0). */
    ie_pooling_t pooling;
} ie_sched_req_t;

/* IE_ERR_INVAL for bad options (no backend, no tokenizer),
 * IE_ERR_NOMEM. Caller owns *out and frees it with ie_sched_destroy. */
ie_status_t ie_sched_new(const ie_sched_opts_t *o, ie_sched_t **out);

/* Every request still queued or running gets ERROR "unavailable" ("the
 * server is shutting down"), then everything is freed. */
void ie_sched_destroy(ie_sched_t **self_p);

/* Point the step timing at `timing` (NULL: none) from now on: a scheduler
 * kept across calls (ie_engine_opts_t.keep_sched) counts each call into
 * its own stats. Stepping thread only. */
void ie_sched_set_timing(ie_sched_t *s, ie_gen_stats_t *timing);

/* Queue a request. On IE_OK *id_out is its id and exactly one terminal
 * event (DONE or ERROR) will follow, from ie_sched_step or
 * ie_sched_destroy. Otherwise no event ever comes: IE_ERR_BUSY when
 * queue_max requests are waiting (message says so; answer HTTP 429 / a
 * "busy" reply), IE_ERR_UNAVAILABLE once ie_sched_drain was called,
 * IE_ERR_INVAL / IE_ERR_RANGE for a bad prompt (empty, id out of range,
 * longer than the context) or parameters, IE_ERR_NOMEM. */
ie_status_t ie_sched_submit(ie_sched_t *s, const ie_sched_req_t *r, uint64_t *id_out);

/* Cancel a queued or running request: it gets ERROR "cancelled" at the
 * next step, which frees its KV blocks. IE_ERR_RANGE ("no such request")
 * if the id is unknown or already finished. */
ie_status_t ie_sched_cancel(ie_sched_t *s, uint64_t id);

/* Make the next (or a running) ie_sched_wait return at once: the stepping
 * thread has work beside requests (a queued adapter attach). Any thread;
 * its argument is the scheduler (a callback for ie_lora_cache_stepper). */
void ie_sched_wake(void *sched);

/* Free the prefix cache's blocks of namespace `salt` now (a LoRA set was
 * detached: nothing can match them again) rather than letting them age
 * out; blocks a running request holds stay its own. salt 0 (the base's)
 * is ignored. Any thread. Returns the number of blocks freed. */
int ie_sched_drop_salt(ie_sched_t *s, uint64_t salt);

/* One scheduling round: drop cancelled / timed-out requests, admit,
 * run one backend step if any tokens are ready, sample, deliver events.
 * *busy_out (may be NULL) is 1 when requests remain queued or running.
 * A backend step that fails does not fail the scheduler: on
 * IE_ERR_UNAVAILABLE (a worker lost) the running requests end with ERROR
 * "unavailable", or with retry_ms set are requeued and recomputed when the
 * backend is ready again (within retry_ms of their first loss); any other
 * failure ends the running requests with ERROR. Returns IE_OK, or
 * IE_ERR_NOMEM when even that bookkeeping failed. */
ie_status_t ie_sched_step(ie_sched_t *s, int *busy_out);

/* Refuse new requests from now on (IE_ERR_UNAVAILABLE, "shutting down")
 * while the queued and running ones go on: a draining server. Any thread. */
void ie_sched_drain(ie_sched_t *s);

/* Block until a request is submitted or cancelled, or timeout_ms passes
 * (returns at once when work is pending). For a serving loop that has
 * nothing else to poll. */
void ie_sched_wait(ie_sched_t *s, int timeout_ms);

typedef struct ie_sched_stats {
    int ready;    /* steps can run: the backend is
                                           ready (ie_backend_ready, as of
                                           the last ie_sched_step; for
                                           health checks on other
                                           threads)                      */
    int draining; /* ie_sched_drain was called */
    int queued, running;
    int kv_blocks, kv_used, kv_cached; /* pool blocks: all / in use /
                                           cached for reuse              */
    uint64_t prefix_hit_tokens;        /* prompt tokens served from the
                                           prefix cache                  */
    uint64_t prefix_miss_tokens;       /* prompt tokens computed        */
    uint64_t preemptions;
    uint64_t submitted, completed, failed;
    uint64_t spec_drafted, spec_accepted; /* draft tokens fed / confirmed
                                           (opts.spec_ngram)             */
} ie_sched_stats_t;

void ie_sched_stats(ie_sched_t *s, ie_sched_stats_t *out);

#endif
