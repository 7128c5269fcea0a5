/* ie_engine.h — the engine: a model source, a tokenizer, a backend that
 * runs the model (ie_backend.h: one worker in this process, or a cluster
 * of workers) and a scheduler (ie_sched.h) per call, assembled behind one
 * handle. The CLI modes and the servers use it; the public library
 * (include/clocher.h) wraps it.
 *
 *     ie_engine_opts_t o;
 *     ie_engine_opts_default(&o);
 *     o.model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
 *     ie_engine_t *e = NULL;
 *     if (ie_engine_open(&o, &e) != IE_OK) {
 *         fprintf(stderr, "%s\n", ie_error_last());
 *         return 1;
 *     }
 *     const char *prompt = "The capital of France is";
 *     ie_gen_params_t p;
 *     ie_gen_params_default(&p);
 *     p.max_new = 32;
 *     ie_gen_result_t r;
 *     if (ie_engine_generate_batch(e, &prompt, 1, &p, &r, NULL) == IE_OK)
 *         printf("%s (%zu tokens)\n", r.text, r.n_gen);
 *     ie_gen_result_clear(&r);
 *     ie_engine_destroy(&e);
 *
 * Several prompts in one call run as a continuously batched set: up to
 * opts.n_seq sequences decode together in each step (each with its own KV
 * slot, position and sampler); a finished one frees its slot for the next.
 *
 * Ownership: the engine owns its model source, tokenizer and backend;
 * pointers it returns (hparams, tokenizer, backend) are borrowed, valid
 * until ie_engine_destroy. Results (ie_gen_result_t) belong to the caller,
 * who frees them with ie_gen_result_clear.
 *
 * Threads: one call at a time per engine. A serving front end instead
 * makes its own scheduler over the engine's backend (ie_engine_sched_opts)
 * and steps it on one thread; it must not call the engine's generate or
 * logits functions meanwhile (they use the same slots).
 */
#ifndef IE_ENGINE_H
#define IE_ENGINE_H

#include "ie_backend.h"
#include "ie_gen.h"
#include "ie_metrics.h"
#include "ie_sched.h"
#include "ie_status.h"
#include "ie_tokenizer.h"
#include "ie_transport.h"
#include "ie_worker.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_engine ie_engine_t;

typedef struct ie_engine_opts {
    const char *model_path;     /* GGUF file or HF directory              */
    const char *tokenizer_path; /* NULL: the model's own               */
    int n_threads;              /* compute threads (>= 1)                 */
    int pin_threads;            /* pin them to cores                      */
    int n_ctx;                  /* KV positions per sequence; 0: min(train
                                 context, 4096)                         */
    int n_seq;                  /* sequences decoded together (>= 1)      */
    int max_batch;              /* prefill chunk, tokens per step         */
    ie_precision_t precision;
    int no_tokenizer; /* 1: do not load one (logits-only use)   */
    /* Distributed execution (docs/OPERATIONS.md). plan NONE: one worker
     * in this process, called directly. PIPELINE/TENSOR: n_workers
     * workers behind the cluster protocol — as threads of this process
     * over ZeroMQ inproc:// when cluster_bind is NULL, else remote
     * ie-worker processes registering at cluster_bind. */
    ie_shard_kind_t plan;
    int n_workers;             /* >= 1 when plan != NONE                 */
    const char *cluster_bind;  /* e.g. "tcp://0.0.0.0:5555"; NULL: inproc */
    int cluster_wait_ms;       /* create waits this long for the workers
                                 (0: 60 s; < 0: not at all — steps fail
                                 with IE_ERR_UNAVAILABLE until ready)   */
    int heartbeat_ms, dead_ms; /* 0: 250 / 2000                          */
    int step_timeout_ms;       /* a cluster step's deadline (0: 30 s,
                                 IE_CLUSTER_STEP_TIMEOUT_MS)             */
    ie_net_t *net;             /* ZeroMQ context to use (CURVE set up by
                                 the caller); NULL: the engine makes one */
    ie_metrics_t *metrics;     /* optional registry for cluster metrics   */
    /* Paged KV cache (ie_worker.h, ie_kvpool.h): positions per block
     * (0: 16) and blocks in the pool (0: n_seq * ceil(n_ctx / kv_block),
     * enough for every slot's whole context). A smaller pool serves more
     * slots than memory for full contexts allows; the scheduler preempts
     * a sequence when the pool runs out. */
    int kv_block, kv_blocks;
    /* with kv_blocks 0: the pool's size in MiB of the chosen cache types,
     * after the sliding layers' rings (ie_worker_opts_t.kv_mem_bytes; a
     * plan: each rank's, the pool the fewest blocks of any rank) */
    long kv_mem_mb;
    /* how the cache stores K and V, and the Hadamard rotation
     * (ie_worker_opts_t; zero: f32, rotation AUTO) */
    ie_kv_type_t kv_type_k, kv_type_v;
    /* 1: sliding-window layers keep the whole context in the pool (and
     * the prefix cache works for them), not a ring of their window
     * (ie_worker_opts_t.kv_swa_full; docs/KVCACHE.md) */
    int kv_swa_full;
    ie_kv_rotate_t kv_rotate;
    int prefix_cache;           /* reuse cached KV blocks of equal prompt
                                 prefixes across requests (default 1)   */
    int keep_sched;             /* 1: every generate call runs on one
                                 scheduler kept by the engine, so its
                                 prefix cache outlives the call (a
                                 conversation's earlier turns are not
                                 recomputed); 0 (default): a scheduler per
                                 call, nothing kept between calls        */
    uint64_t lora_budget_bytes; /* LoRA weights held at most (0: no
                                 limit; ie_lora_cache.h)                 */
} ie_engine_opts_t;

/* n_threads 1, pin_threads 1, n_seq 1, max_batch 256, precision NATIVE,
 * prefix_cache 1, everything else 0 / NULL (plan NONE: one worker in this
 * process). */
void ie_engine_opts_default(ie_engine_opts_t *o);

/* Set o->plan and o->n_workers from "none", "pipeline:N" or "tensor:N"
 * (N in 1..64, digits only). IE_OK, or IE_ERR_INVAL naming the spec (o
 * then says plan NONE). */
ie_status_t ie_engine_opts_plan(ie_engine_opts_t *o, const char *spec);

/* Load the model and tokenizer and build the backend (for a plan, start
 * the cluster and, without cluster_bind, its workers as threads; wait for
 * them as cluster_wait_ms says). o is copied; its strings, net and metrics
 * must outlive the engine. Errors: IE_ERR_IO / IE_ERR_FORMAT /
 * IE_ERR_UNSUPPORTED for the model or tokenizer, IE_ERR_NOMEM,
 * IE_ERR_INVAL for options, IE_ERR_TIMEOUT when the workers did not come.
 * Caller owns *out and frees it with ie_engine_destroy. */
ie_status_t ie_engine_open(const ie_engine_opts_t *o, ie_engine_t **out);

/* Free the engine and everything it owns (the backend first: a cluster
 * says BYE to its workers, then in-process worker threads are joined).
 * *self_p becomes NULL; accepts NULL. */
void ie_engine_destroy(ie_engine_t **self_p);

/* The model's hyper-parameters; borrowed, valid until destroy. */
const ie_hparams_t *ie_engine_hparams(const ie_engine_t *e);
/* Bytes the KV pool takes per token of context: every layer in it (not
 * the sliding layers kept in a ring) and KV head, K and V in their types
 * (ie_kv_head_bytes). */
size_t ie_engine_kv_bytes_per_token(const ie_engine_t *e);
/* The sliding layers' rings (ie_worker.h "paged KV"): positions a slot's
 * ring holds (0: none) and the bytes of every slot's rings, the whole
 * model's (a plan's ranks together). */
int ie_engine_kv_ring_positions(const ie_engine_t *e);
uint64_t ie_engine_kv_ring_bytes(const ie_engine_t *e);
/* Bytes of the f32 K rows a q4 K keeps of each slot's recent window and
 * sinks (docs/KVCACHE.md), the whole model's; 0 for other types. Outside
 * the pool and kv_mem_mb's budget. */
uint64_t ie_engine_kv_recent_bytes(const ie_engine_t *e);
/* The KV pool: positions it holds (blocks times positions a block; with
 * --kv-mem-mb, what the budget holds in the chosen types). */
int64_t ie_engine_kv_pool_positions(const ie_engine_t *e);
/* The tokenizer, NULL when opened with no_tokenizer; borrowed. */
const ie_tokenizer_t *ie_engine_tokenizer(const ie_engine_t *e);
/* Put the model's chat template (o->tmpl, borrowed, valid until destroy;
 * NULL if the model has none) and, if it did not compile, the reason
 * (o->tmpl_error) into chat options; other fields are left as they are. */
struct ie_chat_opts;
void ie_engine_chat_opts(const ie_engine_t *e, struct ie_chat_opts *o);
/* The backend that runs the model (worker or cluster: callers need not
 * know which); borrowed, valid until destroy. Its geometry says the
 * slots, context, batch, KV pool and vocabulary. */
ie_backend_t *ie_engine_backend(ie_engine_t *e);
/* Scheduler options for this engine: its backend and tokenizer and
 * opts.prefix_cache; every other field zero (the scheduler's defaults).
 * The caller may change the rest before ie_sched_new. */
void ie_engine_sched_opts(ie_engine_t *e, ie_sched_opts_t *out);
/* One pointer the public API (api.c) keeps with the engine: NULL at open,
 * freed with free() by ie_engine_destroy. */
void **ie_engine_ext(const ie_engine_t *e);

typedef struct ie_gen_result {
    char *text;   /* generated text (malloc'd, NUL-terminated) */
    int32_t *ids; /* generated ids (malloc'd)                */
    size_t n_gen;
    size_t n_prompt; /* prompt tokens                           */
    ie_finish_t stop;
    double ttft_ms; /* from the call's start (tokenization and
                                 waiting for a slot included) to the
                                 first token                            */
    double *lat_ms; /* per generated token after the first:
                                 time since the previous one (malloc'd)  */
    size_t n_lat;
} ie_gen_result_t;

/* Free a result's buffers and zero it. Accepts a zeroed result. */
void ie_gen_result_clear(ie_gen_result_t *r);

/* Generate for n prompts (UTF-8). results[i] belongs to prompts[i]; the
 * caller clears each. Fails before generating anything on invalid UTF-8
 * (IE_ERR_INVAL, naming the prompt), a prompt that does not fit the context
 * (IE_ERR_RANGE) or bad sampling params; on failure every result is
 * cleared. stats (optional) accumulates timing of the whole call. */
ie_status_t ie_engine_generate_batch(ie_engine_t *e, const char *const *prompts, size_t n, const ie_gen_params_t *p,
                                     ie_gen_result_t *results, ie_gen_stats_t *stats);

/* As ie_engine_generate_batch, for prompts already tokenized (e.g. by
 * ie_chat_encode): prompt i is ids[i][0..n_ids[i]), used as given
 * (p->add_special and p->parse_special do not apply). Errors as
 * ie_engine_generate_batch, plus IE_ERR_RANGE for an id outside the model's
 * vocabulary and IE_ERR_INVAL for an empty prompt. */
ie_status_t ie_engine_generate_ids(ie_engine_t *e, const int32_t *const *ids, const size_t *n_ids, size_t n,
                                   const ie_gen_params_t *p, ie_gen_result_t *results, ie_gen_stats_t *stats);

/* Logits for every position of `ids` in sequence slot 0 (cleared first):
 * out holds n * n_vocab floats, row i after consuming ids[0..i]. `decode`
 * 1 feeds one token per step, 0 prefills in chunks of max_batch. */
ie_status_t ie_engine_logits(ie_engine_t *e, const int32_t *ids, size_t n, int decode, float *out);

/* ---- LoRA adapters (ie_lora.h): loaded for the base model, attached to
 * the backend under a name, never merged into the base weights. */
#define IE_ENGINE_MAX_LORA 64

/* Load the adapter at path (PEFT directory or GGUF LoRA) and register it,
 * pinned (never evicted), as `name` with default scale (1: as trained):
 * ie_lora_cache_load. It is attached to the backend when a request first
 * leases it (on a cluster: every rank, a rank's refusal naming the rank
 * and adapter). IE_ERR_INVAL for a bad or taken name (1..63 characters,
 * none of '=' ',' ':'), ie_lora_load's errors; nothing changes on
 * failure. */
ie_status_t ie_engine_lora_load(ie_engine_t *e, const char *name, const char *path, float scale);

/* The backend's adapter id of `name` at its default scale
 * (ie_batch_t.adapter), attaching it if needed; -1 when none is loaded
 * under it. NULL or "" is the base: -1. The id is not leased: for
 * single-threaded callers (the CLI) that run it before anything can
 * evict it; servers lease sets (ie_lora_cache_acquire). */
int ie_engine_lora_find(const ie_engine_t *e, const char *name);

/* Adapters loaded, and the name of the i-th (NULL when out of range). */
int ie_engine_lora_count(const ie_engine_t *e);
const char *ie_engine_lora_name(const ie_engine_t *e, int i);

/* The adapter ie_engine_logits runs (-1: the base, the default); an id
 * from ie_engine_lora_find. IE_ERR_RANGE for an id not loaded. */
ie_status_t ie_engine_set_logits_adapter(ie_engine_t *e, int id);

/* The engine's adapter registry (ie_lora_cache.h): run-time load/unload,
 * leased adapter sets; borrowed, valid until destroy. */
struct ie_lora_cache;
struct ie_lora_cache *ie_engine_lora_cache(ie_engine_t *e);

/* ie_sched_step(s) bracketed by the registry's step lock (adapters are
 * attached and detached between steps only), first freeing the prefix
 * blocks of adapter sets detached since the last step (ie_sched_drop_salt):
 * what a serving loop over the engine's backend calls instead of
 * ie_sched_step. */
ie_status_t ie_engine_sched_step(ie_engine_t *e, ie_sched_t *s, int *busy_out);

#endif
