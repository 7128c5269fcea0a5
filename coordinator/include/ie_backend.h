/* ie_backend.h — the step boundary: what the scheduler needs from whatever
 * runs the model.
 *
 * A backend holds the weights and the paged KV cache of n_seq sequence
 * slots and runs steps: a batch of (token, position, slot) in, a row of
 * logits out for every token that asks. The scheduler (ie_sched.h) decides
 * what goes into each step and which KV blocks each slot uses; the backend
 * only carries that out. Two implementations:
 *
 *   ie_backend_worker_new    one ie_worker_t in this process, called
 *                            directly (ie_worker.h)
 *   ie_backend_cluster_new   an ie_cluster_t: workers over ZeroMQ, one or
 *                            more hosts (ie_cluster.h)
 *
 * and a test builds a third from made-up logits (tests/unit/test_sched.c).
 * Nobody asks which one runs: an entry that only one implementation needs
 * (the cluster's hint, readiness and upkeep) is a no-op in the other.
 *
 * An implementation fills an ie_backend_ops_t (a table of functions that
 * take its own `self`) and wraps itself with ie_backend_new:
 *
 *     static const ie_backend_ops_t k_ops = {.name = "mine", .step = my_step, ...};
 *     ie_backend_geom_t g = {.n_seq = 2, .n_ctx = 64, ...};
 *     ie_backend_t *b; ie_backend_new(&k_ops, me, &g, &b);
 *     ... ie_backend_step(b, &batch, logits) ...
 *     ie_backend_destroy(&b);            (calls ops->destroy(me))
 *
 * Threads: a backend belongs to one thread at a time (the scheduler's
 * stepping thread); only ie_backend_geom, ie_backend_name and
 * ie_backend_lora_cost may be called from others (the scheduler keeps a
 * locked copy of readiness for them: ie_sched_stats).
 */
#ifndef IE_BACKEND_H
#define IE_BACKEND_H

#include "ie_status.h"
#include "ie_worker.h" /* ie_batch_t, ie_worker_opts_t */

#include <stddef.h>
#include <stdint.h>

typedef struct ie_backend ie_backend_t;

/* The shape of a backend, fixed when it is made. */
typedef struct ie_backend_geom {
    int n_seq;       /* sequence slots: seq ids 0..n_seq-1              */
    int n_ctx;       /* KV positions per slot                           */
    int max_batch;   /* tokens per step at most                         */
    int kv_block;    /* positions per KV block                          */
    int kv_blocks;   /* blocks in the pool (physical ids 0..kv_blocks-1);
                         the first n_seq * ceil(n_ctx / kv_block) of a
                         full-size pool start bound to the slots in order */
    int32_t n_vocab; /* floats per logits row                           */
    int32_t n_embd;  /* floats per hidden-state row (IE_LOGITS_EMBD); 0:
                        this backend cannot give them                   */
    int upkeep_ms;   /* a serving loop calls ie_backend_upkeep at least
                         this often (it may sleep this long when idle)   */
    int kv_ring_len; /* positions of a slot's sliding-layer ring (0:
                        none): a slot holds only its own last positions
                        of those layers, so blocks another slot computed
                        cannot be reused (no prefix-cache hits)          */
} ie_backend_geom_t;

/* What the CLI reports about a backend after a run. */
typedef struct ie_backend_stats {
    const char *isa;            /* kernels in use ("avx512", ...); for a
                                   cluster this host's best (each rank
                                   picks its own)                        */
    int lookahead;              /* 1: this backend may send a step ahead
                                   on the hint (the two counts below mean
                                   something); 0: it never does          */
    uint64_t lookahead_used;    /* steps sent ahead on a hint and used   */
    uint64_t lookahead_dropped; /* ... and dropped (the batch differed)  */
    int hot_replicas;           /* per-node copies of the head and
                                   embeddings (IE_HOT_REPLICATE)         */
    const char *hot_report;     /* their one-line report; "" when none   */
    const char *endpoint;       /* where workers register (a cluster's
                                   bound ROUTER); "" in process          */
    int workers, workers_ready; /* a cluster's ranks / those registered
                                   and ready (0 / 0 in process)          */
} ie_backend_stats_t;

/* One adapter of a set attached under one id (ops.lora_add). */
typedef struct ie_backend_lora_part {
    const char *name;      /* the engine's name for it (messages)       */
    const char *path;      /* where the engine loaded it: a cluster's
                              ranks load the same path from their disk */
    const ie_lora_t *lora; /* loaded for this base; lora->fingerprint
                              is the file's                            */
    float scale;           /* its weight in the set (1: as trained)     */
} ie_backend_lora_part_t;

/* An implementation. Entries marked optional may be NULL (the wrapper
 * below then does what the comment says). */
typedef struct ie_backend_ops {
    const char *name; /* for messages: "worker", "cluster"               */
    /* Run one step: ie_worker_step's contract. b->n <= max_batch tokens;
     * writes n_vocab floats per token with b->logits[i] set, in batch
     * order, to logits_out; an entry flagged IE_LOGITS_EMBD takes no row
     * there but writes its final-norm hidden state (n_embd floats, the
     * head's input: an embedding) to b->embd, in batch order, instead.
     * Every token is checked first (IE_ERR_INVAL /
     * IE_ERR_RANGE, nothing run); IE_ERR_UNAVAILABLE when the model cannot
     * run now (a cluster that lost a worker: the caller rebinds its KV
     * blocks and recomputes once ready again). Required. */
    ie_status_t (*step)(void *self, const ie_batch_t *b, float *logits_out);
    /* Forget slot seq's positions (its block table stays). A bad slot is
     * ignored. Required. */
    void (*seq_clear)(void *self, int seq);
    /* Slot seq now holds positions 0..n_pos-1 (KV already in its bound
     * blocks, e.g. from the prefix cache): ie_worker_seq_set_len.
     * IE_ERR_RANGE for a bad slot, n_pos outside 0..n_ctx or a position in
     * an unbound block. Required. */
    ie_status_t (*seq_set_len)(void *self, int seq, int n_pos);
    /* Bind logical blocks first..first+n-1 of slot seq to physical blocks
     * pb[0..n) (-1 unbinds): ie_worker_kv_bind. IE_ERR_RANGE for a bad
     * slot, range or block id. Required. */
    ie_status_t (*kv_bind)(void *self, int seq, int first, const int32_t *pb, int n);
    /* The scheduler's word on the next step (holds for that one step):
     * same 1 when the step after it will likely be the same slots at their
     * next positions, 0 when not. Results never depend on it; a backend
     * may use it to send that step ahead (ie_cluster_lookahead). Optional:
     * ignored. */
    void (*hint_next)(void *self, int same);
    /* 1 when steps can run now, 0 when they would fail with
     * IE_ERR_UNAVAILABLE (a cluster waiting for workers). Optional:
     * always 1. */
    int (*ready)(void *self);
    /* Keep the backend alive between steps for up to timeout_ms (a
     * cluster answers registrations and heartbeats). Returns ready.
     * Optional: returns at once. */
    int (*upkeep)(void *self, int timeout_ms);
    /* Fill *out (zeroed first by the wrapper). Strings are the backend's,
     * valid until it is destroyed. Optional: all zero / "". */
    void (*stats)(void *self, ie_backend_stats_t *out);
    /* Attach the weighted sum of n adapters (1 <= n <= 8) under one id,
     * *id_out, that ie_batch_t.adapter names: a request's adapter set.
     * parts[i].lora must stay alive until the id is removed (or the
     * backend destroyed); the parts array need not. In process: n 1 is
     * ie_worker_lora_add(lora, scale), n > 1 an ie_lora_concat the backend
     * owns. A cluster sends name, path, fingerprint and scale of each part
     * to every rank, which loads the path from its own disk, refuses a
     * fingerprint that differs, and slices A/B like its base weights; the
     * call returns once every rank has it. Errors: ie_worker_lora_add's,
     * ie_lora_concat's, a rank's refusal (message names the rank).
     * Optional: IE_ERR_UNSUPPORTED. */
    ie_status_t (*lora_add)(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out);
    /* Detach id (everywhere: a cluster's ranks too) and free what the
     * backend made for it; the id may be given out again. IE_ERR_RANGE
     * for an id not attached. Between steps only. Optional:
     * IE_ERR_UNSUPPORTED. */
    ie_status_t (*lora_remove)(void *self, int id);
    /* lora_add in two halves, so that the stepping thread can step while
     * the slow part runs elsewhere — a cluster's ranks load the set; in
     * process a helper thread sums it and makes the worker's int8 copy:
     * begin checks and sends (or hands over) the set and gives its id;
     * poll (pumping, or waiting for the helper, for up to timeout_ms)
     * returns 0 while an answer is owed, else 1 with *st lora_add's
     * outcome and message (on failure the id is free again). Steps
     * between the two are fine (no batch names the id yet); no other
     * lora_add / lora_remove may come before poll returns 1 (in process:
     * another begin or a lora_add meanwhile is IE_ERR_BUSY). The parts'
     * adapters must stay alive until then even if it fails. Destroying
     * the backend with an attach owed is fine (nothing attached).
     * Optional (both or neither): lora_add runs whole in begin. */
    ie_status_t (*lora_add_begin)(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out);
    int (*lora_add_poll)(void *self, int id, int timeout_ms, ie_status_t *st);
    /* The bytes this backend holds *in this process* for the set attached
     * under id beyond its parts' own weights (those are the caller's): in
     * process, the concatenated copy of a set of several parts and the
     * worker's int8 copy on a quantized base (ie_worker_lora_bytes). 0 for
     * an id not attached. An engine's adapter budget charges it to the set
     * until the id is removed. A cluster leaves it out (0): its ranks'
     * copies live in their own processes, and each holds a slice.
     * Optional: 0. */
    uint64_t (*lora_bytes)(void *self, int id);
    /* What lora_bytes would say for the set of the one adapter a (scale
     * 1), before attaching it: an engine refuses at load an adapter that
     * with its copy exceeds the budget alone. Any thread (it attaches
     * nothing). Optional: 0. */
    uint64_t (*lora_cost)(void *self, const ie_lora_t *a);
    /* Free self and everything it owns. Optional. */
    void (*destroy)(void *self);
} ie_backend_ops_t;

/* Wrap an implementation: ops (static, must outlive the backend) over self
 * (owned by the backend from now on: ie_backend_destroy calls
 * ops->destroy(self), also when this call fails). geom is copied. IE_OK
 * or IE_ERR_INVAL (a required entry missing, a geometry value < 1),
 * IE_ERR_NOMEM. Caller owns *out. */
ie_status_t ie_backend_new(const ie_backend_ops_t *ops, void *self, const ie_backend_geom_t *geom,
                           ie_backend_t **out);

/* Destroy the implementation and the wrapper; *self_p becomes NULL.
 * Accepts NULL and a NULL *self_p. */
void ie_backend_destroy(ie_backend_t **self_p);

/* The entries above, on a backend. */
const ie_backend_geom_t *ie_backend_geom(const ie_backend_t *b);
const char *ie_backend_name(const ie_backend_t *b);
ie_status_t ie_backend_step(ie_backend_t *b, const ie_batch_t *batch, float *logits_out);
void ie_backend_seq_clear(ie_backend_t *b, int seq);
ie_status_t ie_backend_seq_set_len(ie_backend_t *b, int seq, int n_pos);
ie_status_t ie_backend_kv_bind(ie_backend_t *b, int seq, int first, const int32_t *pb, int n);
void ie_backend_hint_next(ie_backend_t *b, int same);
int ie_backend_ready(ie_backend_t *b);
int ie_backend_upkeep(ie_backend_t *b, int timeout_ms);
ie_status_t ie_backend_lora_add(ie_backend_t *b, const ie_backend_lora_part_t *parts, int n, int *id_out);
ie_status_t ie_backend_lora_remove(ie_backend_t *b, int id);
/* ops.lora_add_begin: IE_OK with *pending 1 (ie_backend_lora_add_poll
 * until it returns 1) or 0 (attached already: a backend without the two
 * halves ran lora_add); lora_add's errors (nothing attached). */
ie_status_t ie_backend_lora_add_begin(ie_backend_t *b, const ie_backend_lora_part_t *parts, int n, int *id_out,
                                      int *pending);
/* ops.lora_add_poll: 1 with *st (message set on failure) once the attach
 * begun under id has its outcome, 0 while it has not. */
int ie_backend_lora_add_poll(ie_backend_t *b, int id, int timeout_ms, ie_status_t *st);
/* ops.lora_bytes: what the backend holds in this process for id (0 when
 * it has no such entry). */
uint64_t ie_backend_lora_bytes(ie_backend_t *b, int id);
/* ops.lora_cost: what attaching adapter a alone would add in this process
 * (0 when the backend does not say). */
uint64_t ie_backend_lora_cost(ie_backend_t *b, const ie_lora_t *a);
void ie_backend_stats(ie_backend_t *b, ie_backend_stats_t *out);

/* ------------------------------------------------------ implementations */

/* One ie_worker_t in this process, made here from src and o (ie_worker_new's
 * errors) and owned by the backend. src must outlive it. Caller owns *out. */
ie_status_t ie_backend_worker_new(const ie_model_src_t *src, const ie_worker_opts_t *o, ie_backend_t **out);

/* The cluster's implementation, ie_backend_cluster_new, is declared in
 * ie_cluster.h: nothing here needs to know of the network. */

#endif
