/* ie_worker.h — the compute side: bound weights, KV cache, forward pass.
 *
 * A worker owns one model's weights (memory-mapped from the model source, or
 * converted copies for --precision f32/bf16/f16), a KV cache with a fixed
 * number of sequence slots, a thread pool and its scratch. It runs "steps":
 * a batch of tokens, each tagged with its sequence slot and position, in the
 * spirit of a continuous-batching server — prefill chunks and decode tokens
 * of several sequences share one step, and every matmul sees all of them at
 * once (matrix-matrix work for prefill, one weight stream for a decode
 * batch). The worker knows nothing of text, sampling or transport.
 */
#ifndef IE_WORKER_H
#define IE_WORKER_H

#include "ie_kernels.h"
#include "ie_lora.h"
#include "ie_model_src.h"
#include "ie_proto.h"
#include "ie_status.h"

#include <stdint.h>

typedef enum ie_precision {
    IE_PREC_NATIVE = 0, /* weights as the file stores them              */
    IE_PREC_F32 = 1,    /* every matrix converted to f32 at load        */
    IE_PREC_BF16 = 2,   /* every matrix converted to bf16 at load       */
    IE_PREC_F16 = 3,    /* every matrix converted to f16 at load        */
    IE_PREC_INT8W = 4,  /* every matrix quantized to int8w at load      */
    IE_PREC_INT4W = 5   /* every matrix quantized to int4w at load      */
} ie_precision_t;

/* "native", "f32", "bf16", "f16", "int8w", "int4w"; parse returns
 * IE_ERR_INVAL on others. */
const char *ie_precision_name(ie_precision_t p);
ie_status_t ie_precision_parse(const char *s, ie_precision_t *out);

/* ie_kv_type_t (how the KV cache stores K or V) and ie_kv_head_bytes are
 * kernels/include/ie_kvcache.h's (through ie_kernels.h). */

/* Whether K and V heads are rotated by a Walsh-Hadamard transform before
 * they are stored (Q at attention time, the attention output of a rotated
 * V after it): AUTO rotates the sub-16-bit types (q8, q4, fp8). */
typedef enum { IE_KV_ROTATE_AUTO = 0, IE_KV_ROTATE_ON = 1, IE_KV_ROTATE_OFF = 2 } ie_kv_rotate_t;

/* The type's canonical name ("f32", "q8", ...). */
const char *ie_kv_type_name(ie_kv_type_t t);
/* Parse a cache type: f32, f16, bf16, q8 (or q8_0), q4 (or q4_0),
 * fp8_e4m3, fp8_e5m2. IE_ERR_INVAL with a message naming them for
 * anything else (out untouched). */
ie_status_t ie_kv_type_parse(const char *s, ie_kv_type_t *out);
/* Parse on|off|auto into a rotation switch; IE_ERR_INVAL otherwise. */
ie_status_t ie_kv_rotate_parse(const char *s, ie_kv_rotate_t *out);

/* ------------------------------------------------------------ sharding
 * A worker can hold a shard of the model (docs/ARCHITECTURE.md):
 *   PIPELINE  rank r of R runs a contiguous range of layers; the first
 *             stage embeds tokens, the last holds the final norm and the
 *             whole output head; hidden states hop stage to stage.
 *   TENSOR    every rank runs every layer on a slice: attention by KV-head
 *             groups (query heads follow their KV head), the dense MLP by
 *             columns of gate/up and rows of down, MoE by experts (router
 *             replicated), the output head by vocabulary rows. The two
 *             partial sums of each layer (attention output, MLP/MoE output)
 *             are summed across ranks through the reduce callback, so the
 *             residual stream stays replicated on every rank.
 * Splits are as even as the shapes allow on 32-element boundaries (the
 * MLP's on ffn_down's blocks: 256 for the k-quants); a rank count the
 * shapes do not allow is IE_ERR_INVAL naming the reason (for a column cut
 * off the stored blocks, also the rank counts that work). */
typedef enum ie_shard_kind { IE_SHARD_NONE = 0, IE_SHARD_PIPELINE = 1, IE_SHARD_TENSOR = 2 } ie_shard_kind_t;

/* "none", "pipeline", "tensor"; parse returns IE_ERR_INVAL on others. */
const char *ie_shard_kind_name(ie_shard_kind_t k);
ie_status_t ie_shard_kind_parse(const char *s, ie_shard_kind_t *out);

typedef struct ie_shard {
    ie_shard_kind_t kind;
    int rank, n_ranks; /* 0 of 1 for NONE                            */
} ie_shard_t;

/* What one rank holds. Ranges are [begin, end). */
typedef struct ie_shard_range {
    int layer_begin, layer_end;     /* layers run                          */
    int has_embed;                  /* looks tokens up (else takes hidden) */
    int has_head;                   /* computes logits (a vocab slice)     */
    int head_begin, head_end;       /* query heads                         */
    int kv_head_begin, kv_head_end; /* the KV heads those query heads read
                                       (tensor: a KV head whose group is cut
                                       between two ranks is held by both)  */
    int64_t ff_begin, ff_end;       /* dense MLP columns                   */
    int expert_begin, expert_end;   /* MoE experts                         */
    int64_t vocab_begin, vocab_end; /* output head rows                    */
} ie_shard_range_t;

/* Compute rank s->rank's share for the model hp. IE_ERR_INVAL when the
 * plan cannot be cut that way (e.g. more tensor ranks than KV heads, more
 * pipeline stages than layers), with a message naming the limit. Assumes
 * the row-parallel matrices' columns come in blocks of 32. */
ie_status_t ie_shard_plan(const ie_hparams_t *hp, const ie_shard_t *s, ie_shard_range_t *out);

/* The column units a tensor plan must cut the row-parallel matrices on:
 * the largest block (or int group) of any layer's attn_output and of any
 * ffn_down as stored, at least 32 (256 for the k-quants' super-blocks);
 * o_what / ff_what name the tensor and type that set a unit above 32
 * ("" otherwise), for messages. */
typedef struct ie_shard_units {
    int o_unit, ff_unit;
    char o_what[96], ff_what[96];
} ie_shard_units_t;

/* Fill *out from the model source's tensors. IE_OK, IE_ERR_INVAL on NULL. */
ie_status_t ie_shard_units(const ie_model_src_t *src, ie_shard_units_t *out);

/* ie_shard_plan for a model whose units are *units (NULL: 32): the MLP is
 * split in units of ff_unit columns, and a tensor plan whose heads would
 * cut attn_output off its o_unit blocks, or that leaves a rank no unit of
 * the MLP, is IE_ERR_INVAL naming the tensor and the rank counts the
 * shapes allow. Every caller that has the model source plans through this
 * (the coordinator and every worker then agree). */
ie_status_t ie_shard_plan_units(const ie_hparams_t *hp, const ie_shard_units_t *units, const ie_shard_t *s,
                                ie_shard_range_t *out);

/* Tensor-parallel reduction: replace buf[0..n) by the element-wise sum of
 * every rank's buf, summed in rank order (so all ranks get bit-identical
 * results). `index` counts the reductions of one step (0, 1, 2, ...).
 * A non-OK return aborts the step with that status (its message kept). */
typedef ie_status_t (*ie_reduce_fn)(void *ctx, int index, float *buf, size_t n);

typedef struct ie_worker_opts {
    int n_threads;   /* >= 1                                        */
    int pin_threads; /* pin pool threads to cores                   */
    int n_ctx;       /* KV positions per sequence slot              */
    int n_seq;       /* sequence slots                              */
    int max_batch;   /* most tokens in one step                     */
    ie_precision_t precision;
    int copy_weights;         /* 1: copy matrices into huge-page memory; 0
                          (default): use the file mapping. Env
                          IE_WEIGHTS_COPY=0/1 overrides.              */
    ie_isa_t isa;             /* kernels to use (ie_isa_best() by default)   */
    int quant_group;          /* group of --precision int8w/int4w (32)       */
    int quant_affine;         /* int4w: 1 affine (d, m), 0 symmetric (0)     */
    ie_qscale_t quant_scale;  /* how int8w/int4w scales are chosen
                          (IE_QSCALE_ABSMAX; env IE_QUANT_SCALE=absmax|mse;
                          per-group MSE clips outliers the model needs and
                          measured worse perplexity on SmolLM2) */
    int repack;               /* 1: repack GGUF Q8_0/Q4_0/Q4_1, ROWS int
                          types, bf16 and f16 (stored, or from
                          --precision bf16/f16; rows a multiple of 32)
                          into PANEL16 at load (lossless); 0: run them
                          as rows. Env IE_REPACK=0/1 overrides.
                          Default 1.                                  */
    const char *repack_cache; /* directory for the on-disk repack
                          cache (NULL: env IE_REPACK_CACHE, else no
                          cache)                                      */
    ie_shard_t shard;         /* which part of the model (NONE: all)         */
    ie_reduce_fn reduce;      /* TENSOR with n_ranks > 1: required          */
    void *reduce_ctx;
    int kv_block;             /* positions per KV block (0: 16)              */
    ie_kv_type_t kv_type_k;   /* how the cache stores K (IE_KV_F32)          */
    ie_kv_type_t kv_type_v;   /* and V                                       */
    ie_kv_rotate_t kv_rotate; /* Hadamard rotation (AUTO: sub-16-bit types)  */
    int kv_blocks;            /* KV blocks in the pool (0: n_seq * ceil(n_ctx /
                          kv_block)); a pool at least that large starts
                          with every slot bound to its own blocks, a
                          smaller one unbound                          */
    uint64_t kv_mem_bytes;    /* with kv_blocks 0 and this > 0: the pool is
                          as many blocks as fit these bytes in the
                          chosen K/V types (IE_ERR_INVAL if none), after
                          the sliding layers' rings                     */
    int kv_swa_full;          /* 1: sliding-window layers keep the whole
                          context in the pool (0: a ring of their window
                          per slot, "paged KV" below)                   */
    int hot_replicate;        /* 1: when the pool's threads sit on several
                          NUMA nodes, copy the output head (and the
                          embedding table, one copy when tied) into
                          each of those nodes' memory; every pool
                          share reads its own node's copy. Env
                          IE_HOT_REPLICATE=0/1 overrides. Default 0. */
    double hot_repl_limit_mb; /* cap on all copies together, MiB (1024;
                          env IE_HOT_REPL_LIMIT_MB overrides); a tensor
                          whose copies do not fit is skipped (reported) */
} ie_worker_opts_t;

/* Defaults: 1 thread, pinned, n_ctx 2048, 1 slot, max_batch 256, native,
 * no weight copy, best ISA, group 32 symmetric absmax scales, repack on, no
 * cache, no hot-weight replicas (cap 1024 MiB). */
void ie_worker_opts_default(ie_worker_opts_t *o);

typedef struct ie_worker ie_worker_t;

/* Bind `src`'s tensors and allocate cache and scratch. `src` must outlive the
 * worker. Unsupported tensor types -> IE_ERR_UNSUPPORTED naming the tensor;
 * allocation failure -> IE_ERR_NOMEM. Caller owns *out. */
ie_status_t ie_worker_new(const ie_model_src_t *src, const ie_worker_opts_t *opts, ie_worker_t **out);

void ie_worker_destroy(ie_worker_t **self_p);

/* One step's tokens. Entry i is token tokens[i] of sequence slot seq[i] at
 * position pos[i]. Positions of a slot must be contiguous with what its
 * cache already holds (a token at pos p may attend to 0..p of its slot), and
 * earlier positions of the same slot may appear earlier in the same batch.
 * logits[i] != 0 asks for that token's logits: IE_LOGITS_FULL, or
 * IE_LOGITS_ARGMAX when only their arg max matters (a greedy request with
 * no penalties; ie_proto.h). A worker computes full logits either way; the
 * cluster protocol sends only each rank's (max, id) for ARGMAX rows, and
 * the coordinator hands back a row that is -inf but at the winning id.
 * IE_LOGITS_EMBD asks instead for the entry's hidden state after the final
 * norm (what the head would multiply: n_embd floats) in `embd`; such an
 * entry takes no row of logits_out. */
typedef struct ie_batch {
    int n;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *seq;
    const uint8_t *logits;
    const int32_t *adapter; /* NULL: the base model for every token; else
                               per token -1 (the base) or an id from
                               ie_worker_lora_add (IE_ERR_RANGE when not
                               attached)                                */
    float *embd;            /* n_embd floats per IE_LOGITS_EMBD entry, in
                               batch order, written by the rank(s) with
                               the head; may be NULL when no entry asks */
} ie_batch_t;

/* ------------------------------------------------------------ LoRA
 * Adapters (ie_lora.h) ride along the base model: each projection a token's
 * adapter adapts gets scale * B (A x) added to the base matmul's output,
 * tokens of different adapters and of the base mixed in one step. The
 * base weights are never changed. */
#define IE_WORKER_MAX_LORA 64

/* Attach adapter a (which must stay alive and unchanged until removed or
 * the worker is destroyed) with a scale multiplying its own (1: as
 * trained); *id_out is the id batches name it by. Each matrix is the
 * whole one or this worker's share of it (ie_lora_slice). On a quantized
 * base the worker runs its own int8 copy (ie_lora_quantize_int8; env
 * IE_LORA_DTYPE=int8|wide overrides: docs/LORA.md). IE_ERR_INVAL
 * for a layer count other than the model's or a matrix of neither shape,
 * IE_ERR_UNSUPPORTED for MLP
 * adapters on a mixture-of-experts model, IE_ERR_RANGE when
 * IE_WORKER_MAX_LORA are attached, IE_ERR_NOMEM. Between steps only. */
ie_status_t ie_worker_lora_add(ie_worker_t *w, const ie_lora_t *a, float scale, int *id_out);

/* ie_worker_lora_add in two halves, so that the slow one (a pass over the
 * weights) can run off the worker's thread while it steps (ie-worker's
 * adapter thread, worker/src/node.c):
 *   ie_worker_lora_target(w, &t);                  // w's thread
 *   ie_worker_lora_prepare(&t, a, &run);           // any thread
 *   ie_worker_lora_attach(w, &t, a, &run, s, &id); // w's thread, between steps
 * The target is what an adapter must fit on w: a plain value (no pointer
 * into w), so a prepare never reads the worker, which may step, or be
 * destroyed, meanwhile. */
typedef struct ie_worker_lora_target {
    ie_hparams_t hp;     /* the model's shapes                             */
    ie_shard_range_t sh; /* this worker's share (ie_shard_plan)            */
    int moe;             /* the MLP is a mixture of experts: no MLP adapter */
    int int8;            /* adapters run here as int8 copies (docs/LORA.md) */
} ie_worker_lora_target_t;

/* Fill *out with w's target. Reads w only (its shapes, share, weights'
 * dtype and env IE_LORA_DTYPE); on w's thread or while it does not step. */
void ie_worker_lora_target(const ie_worker_t *w, ie_worker_lora_target_t *out);

/* Check that adapter a (the whole or a share cut for t, ie_lora_slice)
 * fits a worker of target t, and make what such a worker runs: *run_out
 * is the int8 copy (ie_lora_quantize_int8) when t runs int8 and a is
 * f32/bf16, else NULL (a runs as it is). Pure: reads t and a, writes only
 * *run_out; safe on any thread, several at once. The errors of
 * ie_worker_lora_add but IE_ERR_RANGE. Caller owns *run_out. */
ie_status_t ie_worker_lora_prepare(const ie_worker_lora_target_t *t, const ie_lora_t *a, ie_lora_t **run_out);

/* The id ie_worker_lora_attach (and _add) gives the next adapter: the
 * first free slot, -1 when IE_WORKER_MAX_LORA are attached. It stays so
 * until an adapter is attached or removed (a caller that must name the id
 * before the attach: coordinator/src/backend_worker.c). */
int ie_worker_lora_next_id(const ie_worker_t *w);

/* Attach adapter a prepared for target t (ie_worker_lora_prepare gave
 * *run; *run NULL: a runs as it is) with a scale multiplying its own, as
 * ie_worker_lora_add does. Cheap (no pass over the weights: scratch grows
 * to the rank). On success the worker owns *run, which is set NULL (freed
 * at ie_worker_lora_remove or destroy), and a must stay alive and unchanged
 * as for ie_worker_lora_add; on failure *run stays the caller's.
 * IE_ERR_INVAL when t is not w's target now (prepared for another shard
 * or dtype), IE_ERR_RANGE when IE_WORKER_MAX_LORA are attached,
 * IE_ERR_NOMEM. On w's thread, between steps only. */
ie_status_t ie_worker_lora_attach(ie_worker_t *w, const ie_worker_lora_target_t *t, const ie_lora_t *a,
                                  ie_lora_t **run, float scale, int *id_out);

/* Adapter a cut to the share sh of the model hp (ie_shard_plan's range):
 * the matrices of layers outside [layer_begin, layer_end) dropped (rank
 * 0); the column-parallel projections (q: query heads, k/v: KV heads,
 * gate/up: MLP columns; each rank owns some output rows) keep A whole and
 * B^T's columns of the rank's rows; the row-parallel ones (o: the query
 * heads' columns, down: the MLP columns; each rank owns part of the input)
 * keep A's columns of the rank's part and B whole, so the ranks' partial
 * sums B (A_r x_r) add up (the reduce) to the whole B (A x). The units are
 * the base weights' own (head_dim per head). bf16 stays bf16. The result
 * owns its weights (a may be destroyed after) and has a's fingerprint; a
 * worker of that share takes it as it takes the whole (ie_worker_lora_add
 * accepts a matrix of the whole or of the rank's shape). IE_ERR_INVAL for
 * a range outside hp or a matrix of another shape, IE_ERR_NOMEM. Caller
 * owns *out (ie_lora_destroy). */
ie_status_t ie_lora_slice(const ie_lora_t *a, const ie_hparams_t *hp, const ie_shard_range_t *sh, ie_lora_t **out);

/* Detach adapter id (its id may be given out again). IE_ERR_RANGE when
 * none is attached under id. Between steps only. */
ie_status_t ie_worker_lora_remove(ie_worker_t *w, int id);

/* The bytes the worker itself allocated for attached adapter id: its int8
 * copy on a quantized base (ie_lora_quantize_int8's bytes), 0 when it runs
 * the caller's weights as given or nothing is attached under id. The
 * caller's adapter (ie_worker_lora_add's `a`) is not counted: its owner
 * counts it. An engine's adapter budget charges this to the set attached
 * under id (ie_backend_lora_bytes). Same thread as ie_worker_lora_add. */
uint64_t ie_worker_lora_bytes(const ie_worker_t *w, int id);

/* What ie_worker_lora_bytes would say after ie_worker_lora_add(w, a, ...)
 * (the int8 copy it would make, or 0), without attaching: a budget can
 * refuse an adapter that would not fit with its copy. Any thread (it
 * reads only the model's weight types and the environment). */
uint64_t ie_worker_lora_cost(const ie_worker_t *w, const ie_lora_t *a);

/* Run one step. Writes n_vocab floats per requested token to logits_out, in
 * batch order (caller provides rows * n_vocab floats). Errors: IE_ERR_RANGE
 * for a bad token id, slot or a position past n_ctx; IE_ERR_INVAL for a
 * batch larger than max_batch; IE_ERR_INTERNAL when a matmul kernel fails
 * (the message names the matrix's type and shape; the slot caches then
 * count no new positions). The same holds for the two calls below. */
ie_status_t ie_worker_step(ie_worker_t *w, const ie_batch_t *b, float *logits_out);

/* ie_worker_step that also writes, when hidden != NULL, the residual stream
 * after every layer: hidden[((size_t)l * b->n + i) * n_embd + j] for layer l
 * and batch entry i (n_layer * n * n_embd floats) — for the converter's
 * per-layer calibration report. */
ie_status_t ie_worker_step_hidden(ie_worker_t *w, const ie_batch_t *b, float *logits_out, float *hidden);

/* One step of a sharded worker (works for NONE too):
 *   hidden_in   NULL on a rank with the embedding (tokens are looked up);
 *               else n * n_embd floats of residual stream from the previous
 *               pipeline stage.
 *   hidden_out  non-NULL: n * n_embd floats of residual stream after this
 *               rank's last layer (what the next stage takes).
 *   logits_out  on a rank with the head: one row of (vocab_end -
 *               vocab_begin) floats per token that asked (NULL: skip the
 *               head).
 * The batch is validated as in ie_worker_step (token ids are checked only
 * on ranks with the embedding). On failure (a reduce error included) the
 * slot caches count no new positions. */
ie_status_t ie_worker_step_shard(ie_worker_t *w, const ie_batch_t *b, const float *hidden_in, float *hidden_out,
                                 float *logits_out);

/* This worker's share (everything for an unsharded worker). */
const ie_shard_range_t *ie_worker_shard(const ie_worker_t *w);

/* Bytes of weights this worker holds (its shard, as bound). */
uint64_t ie_worker_weight_bytes(const ie_worker_t *w);

/* Forget a slot's cache contents (positions restart at 0). Its block
 * table is left as it is. */
void ie_worker_seq_clear(ie_worker_t *w, int seq);

/* ------------------------------------------------------------ paged KV
 * The cache is a pool of kv_blocks physical blocks of kv_block positions
 * (for every layer this worker holds). Each slot has a block table: its
 * logical block lb (positions lb*kv_block .. (lb+1)*kv_block - 1) lives in
 * a physical block. With the default pool (or a larger one) every slot
 * starts bound to its own blocks (slot s, lb -> s * ceil(n_ctx/kv_block) +
 * lb): the unpaged cache, and nobody needs to bind anything. With a smaller
 * pool every table starts unbound and the caller (the coordinator's
 * scheduler, see ie_kvpool.h) binds blocks before a step uses them; one
 * physical block may be bound in several slots (a shared prompt prefix) —
 * the caller makes sure no step writes a position of a block another slot
 * reads. A step that touches a position whose block is unbound — the one
 * it writes, or one its attention reads (the whole prefix; only the window
 * when every layer the worker holds slides) — fails with IE_ERR_RANGE
 * naming slot and position, and changes nothing. Attention reads the blocks
 * through ie_attn.h's paged views: logits are bit-identical to the unpaged
 * cache for any block size and placement. ie_worker_seq_clear keeps the
 * table. Memory: kv_blocks * kv_block * (held layers) * (held KV heads) *
 * (ie_kv_head_bytes of the K type + that of the V type) bytes.
 *
 * Sliding-window layers (unless opts.kv_swa_full) are not in the pool:
 * each slot keeps a ring of its last ring_len positions of them
 * (ie_worker_kv_ring_len: the window W and W - 1 more, rounded up to whole
 * blocks; no ring when that is not less than n_ctx), written and read in
 * the ring's blocks like the pool's, so the bits are the pool's. The ring
 * takes a slot's positions in order: a step whose first token of a slot
 * needs a window row the ring no longer holds (after ie_worker_seq_set_len
 * to a prefix another slot computed, or a jump back past the ring) fails
 * with IE_ERR_RANGE, as does a slot's token not one past the slot's token
 * before it in the step. A prefix shared between slots must therefore be
 * recomputed (the coordinator takes no prefix-cache hits then). */

/* Bind slot seq's logical blocks first .. first+n-1 to physical blocks
 * pb[0..n) (-1 unbinds). IE_ERR_RANGE for a bad slot, a logical block past
 * ceil(n_ctx/kv_block) or a physical block outside the pool; nothing
 * changes then. */
ie_status_t ie_worker_kv_bind(ie_worker_t *w, int seq, int first, const int32_t *pb, int n);

/* Declare that slot seq holds positions [0, n_pos) (0 <= n_pos <= n_ctx),
 * e.g. after binding blocks another slot computed: its next token may be at
 * position n_pos. The blocks of those positions must be bound
 * (IE_ERR_RANGE otherwise, nothing changes). n_pos 0 is ie_worker_seq_clear. */
ie_status_t ie_worker_seq_set_len(ie_worker_t *w, int seq, int n_pos);

int ie_worker_kv_block(const ie_worker_t *w);
int ie_worker_kv_blocks(const ie_worker_t *w);
/* Bytes the pool takes per position of context, all held layers in it
 * and KV heads, K and V together (what a worker of the whole model
 * reports; sliding layers with a ring are not in the pool). */
size_t ie_worker_kv_bytes_per_pos(const ie_worker_t *w);
/* The KV cache a worker of the model hp holding the layers and KV heads of
 * sh would make under o (n_ctx, n_seq, kv_block, the types, kv_swa_full;
 * not kv_blocks or kv_mem_bytes): positions per block, positions of a
 * slot's ring of the sliding layers (0: none), bytes of one pool block and
 * of every slot's rings, K and V together. The worker sizes itself by it;
 * a coordinator sizes a plan's pool from its ranks' layouts. IE_ERR_INVAL
 * for a type the head size cannot take (the worker's message). */
typedef struct ie_kv_layout {
    int kv_block;
    int ring_len;
    uint64_t block_bytes;
    uint64_t ring_bytes;
    uint64_t recent_bytes; /* every slot's f32 K rows of a q4 K's recent
                              window and sinks, and V's alike when it is
                              quantized (docs/KVCACHE.md), held layers;
                              outside the pool and the budget */
} ie_kv_layout_t;
ie_status_t ie_worker_kv_layout(const ie_hparams_t *hp, const ie_shard_range_t *sh, const ie_worker_opts_t *o,
                                ie_kv_layout_t *out);
/* The pool's blocks a byte budget holds for layout ly after its rings, at
 * most full (IE_ERR_INVAL, named, when not one block). */
ie_status_t ie_worker_kv_budget_blocks(const ie_kv_layout_t *ly, uint64_t budget, int full, int *blocks);
/* Sliding layers' rings: positions one slot's ring holds (0: no ring) and
 * the bytes of every slot's ring, K and V together. */
int ie_worker_kv_ring_len(const ie_worker_t *w);
uint64_t ie_worker_kv_ring_bytes(const ie_worker_t *w);

const ie_hparams_t *ie_worker_hparams(const ie_worker_t *w);
int ie_worker_n_ctx(const ie_worker_t *w);
int ie_worker_max_batch(const ie_worker_t *w);
int ie_worker_n_threads(const ie_worker_t *w);
ie_isa_t ie_worker_isa(const ie_worker_t *w);

/* ------------------------------------------------------------ hot replicas
 * With opts.hot_replicate the worker looks at the NUMA node of every pool
 * thread (the CPU the pool pinned it to; env IE_NUMA_FAKE_NODES=N instead
 * pretends share ith runs on node ith % N and places every copy on node 0,
 * for tests on one-node machines). Threads on two or more nodes: the
 * output head, then the embedding table unless it is the head's own buffer,
 * get one copy per node while all copies together stay within
 * hot_repl_limit_mb; pool share ith reads its node's copy in the head
 * matmul, the lookups read the copy of share 0's node. Same bytes, same
 * kernels, same split: logits are bit-identical to a worker without
 * copies. The copies are freed by ie_worker_destroy. */

/* Node-local copies made (nodes x tensors replicated; 0: none). */
int ie_worker_hot_replicas(const ie_worker_t *w);

/* One line saying what was found and done, e.g. "1 node: no replicas
 * needed", "2 nodes: output.weight 2 x 21.2 MiB (token_embd shares it)",
 * "... skipped token_embd.weight (2 x 0.1 MiB over the 0.2 MiB cap)";
 * "" when replication was not asked for. Owned by the worker. */
const char *ie_worker_hot_report(const ie_worker_t *w);

/* Copy `r` (0 .. nodes-1, in the order the nodes first appear among the
 * pool's shares) of the head (embd 0) or of the embedding table (embd 1),
 * and its size in *bytes_out; NULL when there is none. The worker reads
 * it; tests overwrite it to prove which share reads which copy. */
const void *ie_worker_hot_replica(const ie_worker_t *w, int embd, int r, size_t *bytes_out);

/* The copy pool share ith reads (-1: the original, no copies). */
int ie_worker_hot_replica_of(const ie_worker_t *w, int ith);

/* Bytes of weights one decode token streams (all matrices once — for MoE
 * layers the router and n_expert_used experts — plus one embedding row),
 * for the bandwidth figures of benchmarks. */
uint64_t ie_worker_bytes_per_token(const ie_worker_t *w);

/* The bandwidth a decode step could reach here: read, with this worker's
 * threads, the weight bytes one decode step streams (the matrices that
 * ie_worker_bytes_per_token counts, without the embedding row), each
 * matrix cut between the threads as decode cuts it, with nothing computed.
 * flat = 0: one pool job per matmul job of a decode step, in its order
 * (the fork/joins a step pays, not its serial work); flat = 1: one job.
 * Writes the wall time to *seconds. A benchmark's ceiling: interleave it
 * with steps (bench/bench_decode.c) to pair each step with a read of the
 * same bytes a few milliseconds apart. IE_ERR_INVAL for NULL arguments,
 * IE_ERR_NOMEM. */
ie_status_t ie_worker_stream_probe(ie_worker_t *w, int flat, double *seconds);

/* Decode tuning switches, for A/B benchmarks in one run (a benchmark
 * flips one between steps; call only between steps). Defaults come from
 * the environment at ie_worker_new, each on unless set to 0:
 * IE_DECODE_BALANCE ("balance": balanced decode matmuls),
 * IE_DECODE_PREFETCH ("prefetch": idle threads fetch their next share),
 * IE_DECODE_STREAM ("stream": activations written with streaming stores),
 * IE_DECODE_KVPREFETCH ("kvprefetch": each thread fetches the KV-cache rows
 * its attention share will read while the q/k/v matmul streams).
 * None changes the results. IE_ERR_INVAL for a NULL worker or an unknown
 * name. */
ie_status_t ie_worker_set_decode_option(ie_worker_t *w, const char *name, int on);

/* Testing only: run this worker's matmuls through *ops (which must outlive
 * the worker, or the next call) instead of the table its ISA chose — how
 * tests make a kernel fail and check that the step reports it. */
void ie_worker_test_set_matmul_ops(ie_worker_t *w, const ie_kernels_t *ops);

#endif
