/* worker_internal.h — the worker's state and the calls between its files.
 *
 * The worker is cut by job, one file each:
 *   worker.c     life cycle (ie_worker_new as a list of named steps,
 *                destroy), options, scratch, accessors, memory helpers
 *   arch_desc.c  the architecture descriptor (ie_arch_desc.h)
 *   bind.c       weight binding: shard cuts, conversion, the repack cache
 *   forward.c    the forward pass, block by block (start reading here)
 *   attention.c  RoPE, the paged KV cache, attention and its KV prefetch
 *   moe.c        the mixture of experts (GPT-OSS, Qwen3-MoE)
 *   matmul.c     matmuls on the thread pool (static and balanced split)
 *   prefetch.c   idle threads fetching the next matmul's weights
 *   replicas.c   NUMA hot-weight replicas of the head and embedding
 *   probe.c      the weight-stream bandwidth probe and byte counts
 *
 * Data path of one step (n tokens, any mix of sequences and positions):
 *   x[n][d]    = embedding rows of the tokens
 *   per layer:   xb = rmsnorm(x)             q,k,v = Wq,Wk,Wv · xb (one GEMM)
 *                rope(q, k); k,v -> cache[slot][pos]
 *                att = softmax(q·K^T/sqrt(hd)) · V   per (token, head)
 *                x += Wo · att
 *                xb = rmsnorm(x)             g,u = Wg,Wu · xb  (one GEMM)
 *                x += Wd · (silu(g) * u)     (or the MoE)
 *   logits     = Wout · rmsnorm(x) for the tokens that asked
 * Every matmul sees all n tokens, so prefill is matrix-matrix work and a
 * decode batch streams each weight matrix once.
 *
 * KV cache: a pool of physical blocks of kv_block positions of every held
 * layer, [block][layer][kv_block][kv_dim]; each slot's block table maps its
 * logical blocks (positions lb*kv_block ..) to physical ones. K/V rows are
 * written through the table and attention reads them through it (ie_attn.h's
 * paged views: the bits of the contiguous cache). The default pool gives
 * every slot its own blocks (the unpaged cache); a smaller one starts
 * unbound and the caller binds (ie_worker_kv_bind).
 *
 * Shards (ie_shard_plan, shard.c): a pipeline stage binds and runs only its
 * layers (KV cache for those only), embeds only on the first stage and
 * projects only on the last; a tensor-parallel rank binds row/column cuts
 * of every matrix (ie_tensor_slice, then the usual conversion), runs its KV
 * heads, MLP columns or experts, and sums the two partial results of each
 * layer (Wo · att, the MLP/MoE output) across ranks through opts.reduce
 * before the residual add, so x stays replicated. An unsharded worker runs
 * the very same code with whole cuts and no reduce.
 */
#ifndef IE_WORKER_INTERNAL_H
#define IE_WORKER_INTERNAL_H

#include "ie_arch_desc.h"
#include "ie_attn.h"
#include "ie_threadpool.h"
#include "ie_kernels.h"
#include "ie_lora.h"
#include "ie_worker.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ types */

/* A bound weight matrix, or a stack of n_mat of them (MoE experts). */
typedef struct wmat {
    ie_dtype_t dtype;
    ie_layout_t layout; /* ROWS (ggml types), PANEL16 (int8w/int4w/bf16/f16), BSR */
    int group;          /* PANEL16 / ROWS int types: scale group        */
    const void *data;   /* n_out rows of n_in elements                  */
    int64_t n_in;
    int64_t n_out;
    size_t slice;  /* bytes of one matrix (expert stride)          */
    int64_t n_mat; /* matrices in the stack (experts held), 0 unbound */
    ie_bsr_t bsr;  /* BSR: view into data                          */
} wmat_t;

typedef struct layer {
    const float *attn_norm; /* (d)                                     */
    const float *ffn_norm;  /* (d)  post_attention_norm for GPT-OSS    */
    wmat_t q;               /* (n_head*hd, d)                          */
    wmat_t k, v;            /* (n_kv*hd, d)                            */
    wmat_t o;               /* (d, n_head*hd)                          */
    /* dense MLP (Llama) */
    wmat_t gate, up; /* (ff, d)                                 */
    wmat_t down;     /* (d, ff)                                 */
    /* GPT-OSS: attention extras */
    const float *bq, *bk, *bv, *bo; /* biases, NULL when absent (bo: on
                                       tensor rank 0 only)              */
    const float *sinks;             /* (n_head) sink logits, NULL when absent  */
    const float *q_norm, *k_norm;   /* (head_dim) per-head RMS norms (qk_norm) */
    const float *post_attn_norm;    /* (d) on the attention block's output and */
    const float *post_ffw_norm;     /* (d) the MLP's, before the residual add
                                       (IE_NORM_SANDWICH; NULL otherwise)      */
    int swa;                        /* sliding-window layer                     */
    int ring;                       /* its K/V live in the slot's ring (swa)    */
    int kv_li;                      /* its index among the held layers of its
                                       store: the pool's or the ring's          */
    /* GPT-OSS: MoE. Expert matrices hold n_expert matrices back to back;
     * gate/up/down here describe one expert (data = expert 0). */
    wmat_t router;                       /* (n_expert, d)                            */
    const float *router_b;               /* (n_expert)                               */
    const float *gate_b, *up_b, *down_b; /* (E, ff), (E, ff), (E, d)    */
} layer_t;

/* A thread's unclaimed panels of one matrix in a balanced decode matmul:
 * front (low 32 bits) and back (high 32 bits), one cache line each. */
typedef struct mm_span {
    _Alignas(64) _Atomic uint64_t span;
} mm_span_t;
#define MM_MAX 3 /* matrices sharing one input in one matmul job */

struct pf_state; /* prefetch.c */

/* An attached adapter (lora.c) and one step's group of its tokens. */
typedef struct wlora {
    const ie_lora_t *ad; /* NULL: free entry                         */
    float scale;         /* the caller's, times each matrix's own    */
    ie_lora_t *own;      /* ad when the worker holds its own int8
                            copy (freed with the entry), else NULL  */
} wlora_t;
typedef struct lora_group {
    int id;       /* adapter                                     */
    int first, n; /* its batch rows: lora_rows[first .. first+n) */
} lora_group_t;
/* One worker_lora_begin call: the kernel arguments of each (module,
 * group) with an adapter matrix, and the weights of its two passes. */
#define LORA_MAX_ARGS (3 * IE_WORKER_MAX_LORA)
typedef struct lora_job {
    struct ie_worker *w;
    ie_lora_args_t args[LORA_MAX_ARGS];
    int grp[LORA_MAX_ARGS]; /* args[k]'s group                         */
    int mi[LORA_MAX_ARGS];  /* ... and module (its block of lora_tmp)  */
    int n_args;
    double total[2]; /* weights of all args: A (shrink), B (expand)  */
    double fma;      /* multiply-adds of the call                    */
    int shrunk;      /* the shrink pass has run                      */
} lora_job_t;

struct ie_worker {
    ie_hparams_t hp;
    ie_arch_desc_t arch; /* what the forward pass does (ie_arch_desc.h) */
    ie_worker_opts_t opts;
    int copy_weights;         /* resolved opts.copy_weights                */
    int repack;               /* resolved opts.repack                      */
    char *cache_dir;          /* repack cache directory, or NULL           */
    int binding_head;         /* bind_src is binding the output head       */
    int src_file_mapped;      /* every source tensor is in a file mapping  */
    ie_shard_range_t sh;      /* what this worker holds (ie_shard_plan)    */
    int tensor_par;           /* tensor-parallel with n_ranks > 1: reduce  */
    uint64_t probe_sink;      /* ie_worker_stream_probe's reads end here   */
    int n_head_loc, n_kv_loc; /* query / KV heads held                    */
    int64_t ff_loc;           /* dense MLP columns held (expert ff: all)  */
    const ie_kernels_t *ops;
    ie_threadpool_t *tp;

    wmat_t tok_embd; /* (vocab, d)                               */
    wmat_t output;   /* (vocab, d), may share tok_embd's data    */
    const float *output_norm;
    layer_t *layers; /* [n_layer]                                */

    void **owned; /* buffers we allocated for weights         */
    size_t n_owned, cap_owned;

    /* hot-weight replicas (IE_HOT_REPLICATE): copy r of the head and of
     * the embedding for the r-th node among the pool's threads */
    int n_repl;           /* nodes with a copy (0: no copies)         */
    int *share_repl;      /* [n_threads] copy read by share ith       */
    wmat_t *head_repl;    /* [n_repl] or NULL (head not replicated)   */
    wmat_t *embd_repl;    /* [n_repl] or NULL; tied: head_repl's data */
    void **repl_mem;      /* [2 * n_repl] our copies (ie_numa_alloc)  */
    size_t *repl_bytes;   /* [2 * n_repl] their sizes                 */
    int hot_copies;       /* copies made                              */
    char hot_report[512]; /* what was found and done ("" not asked)  */

    int q_dim, kv_dim; /* held heads: n_head_loc*hd, n_kv_loc*hd    */
    int kv_block;      /* positions per KV block                    */
    int kv_blocks;     /* physical blocks in the pool               */
    int kv_nlb;        /* logical blocks per slot: ceil(n_ctx/kv_block) */
    int all_swa;       /* every held layer slides (reads a window)  */
    /* per cache (0: K, 1: V): its type, bytes of one head, of a
     * position's row (n_kv_loc heads), of a layer in a block
     * (kv_block rows) and of a block (held layers) */
    ie_kv_type_t kv_type[2];
    int kv_rot[2]; /* rotated by kvq_fwht before it is stored  */
    /* smoothed (kvq_smooths): on a layer that does not slide, a head at
     * position >= KVQ_SMOOTH_ROWS is stored less the mean of the slot's
     * first KVQ_SMOOTH_ROWS decoded heads (kvq_mean), added back when read */
    int kv_smooth[2];
    uint8_t *kv_smooth_keep; /* [hd] 1: channel smoothed (RoPE turns it
                                by at most 1 radian over n_ctx positions) */
    /* a q4 K (kvq_recent): the K rows of each token's last k_recent_len
     * positions (its own included) and of the slot's first k_sinks read in
     * f32 (rotated, not smoothed) from the step's copy (k_batch) or each
     * slot's rows (position j at j % k_recent_len, a sink also at
     * k_recent_len + j) */
    int kv_recent;
    int k_recent_len; /* kvq_recent_len(): the window, in positions */
    int k_sinks;      /* kvq_sinks(): the first positions kept      */
    /* and V's rows alike when V is quantized and not smoothed: the
     * weighted sum of V gets p_j (v_j - decoded v_j) for those rows */
    int kv_recent_v;
    float *v_batch;        /* [max_batch][kv_dim] (kv_recent_v)         */
    float *v_recent;       /* as k_recent (kv_recent_v), k_recent_pos's  */
    float *k_batch;        /* [max_batch][kv_dim]                       */
    float *k_recent;       /* [n_seq][held layers][k_recent_len + k_sinks]
                              [kv_dim]                                 */
    int32_t *k_recent_pos; /* [n_seq][held layers][k_recent_len + k_sinks]
                              position held, -1 none                  */
    size_t kv_head_bytes[2];
    size_t kv_row_bytes[2];
    size_t kv_layer_bytes[2];
    size_t kv_block_bytes[2];
    unsigned char *kcache, *vcache; /* [kv_blocks][held layer][kv_block]
                                [n_kv_loc heads encoded], layer l at
                                l - sh.layer_begin                        */
    float *kv_pre[2];               /* [kv_pre_rows][kv_dim] a prefill's rows decoded
                         (K, V; a cache not f32), else NULL             */
    int kv_pre_rows;
    uint8_t *kv_mark; /* [max_batch] tokens attended from kv_pre        */
    float *kv_tmp;    /* [n_threads][group*hd] rotated queries (a
                      rotated cache), else NULL                         */
    float *kv_mean;   /* a smoothed cache: [n_threads][2][hd] att_run's
                         means, then [2][kv_dim] the store's and a
                         prefill's (K, V); else NULL                     */
    int32_t *btab;    /* [n_seq][kv_nlb] physical block, -1 unbound */
    /* Sliding layers' ring (worker_kv_new): each slot keeps the last
     * kv_ring_len = kv_ring_nrb * kv_block positions of the held sliding
     * layers, position j in ring block (j / kv_block) % kv_ring_nrb, read
     * through kv_ring_tab like a block table. kv_ring_nrb 0: no ring, every
     * held layer lives in the pool. */
    int kv_ring_nrb;
    int kv_ring_len;
    int kv_ring_chunk;             /* tokens a ring layer stores and attends
                                        at a time: kv_ring_len - window + 1 */
    int kv_pool_layers;            /* held layers in the pool               */
    size_t kv_ring_block_bytes[2]; /* a ring block: held ring layers       */
    size_t kv_ring_slot_bytes[2];  /* one slot's ring                      */
    unsigned char *kring, *vring;  /* [n_seq][nrb][ring layer][kv_block][row] */
    int32_t *kv_ring_tab;          /* [kv_nlb] lb % kv_ring_nrb             */
    int32_t *kv_ring_pos;          /* [n_seq][kv_ring_len] position a ring
                                        row holds, -1 none                    */
    int *seq_len;                  /* [n_seq] positions held                   */

    float *rope_cos, *rope_sin; /* [n_ctx][rope_dim/2]                   */
    const float *rope_freqs;    /* [rope_dim/2] frequency divisors
                                   (IE_ROPE_SCALING_FREQS), else NULL     */
    /* the sliding layers' tables: their own base (hp.rope_theta_swa,
     * unscaled), or rope_cos / rope_sin themselves when the same */
    float *rope_cos_swa, *rope_sin_swa;

    /* scratch, sized for max_batch tokens */
    float *x;   /* [B][d]   residual stream                              */
    float *xb;  /* [B][max(d, q_dim)] normed input / attention output     */
    float *q;   /* [B][q_dim]                                            */
    float *k;   /* [B][kv_dim]                                           */
    float *v;   /* [B][kv_dim]                                           */
    float *hb;  /* [B][ff]  gate, then silu(gate)*up                     */
    float *hb2; /* [B][ff]  up                                           */
    float *tmp; /* [B][d]   matmul output before the residual add        */
    void *act;  /* [B][act row] quantized activations                    */
    size_t act_row_cap;
    float *att_ws;            /* [n_threads][att_ws_floats] attention states, scratch */
    struct att_seg *att_segs; /* [n_threads][att_seg_max] a unit's runs of rows (attention.c) */
    /* MoE scratch */
    float *xg;     /* [B][d] rows routed to one expert                    */
    float *moe;    /* [B][d] MoE output before the residual add           */
    float *rlog;   /* [B][n_expert] router logits                         */
    int32_t *sel;  /* [B][k] selected experts                             */
    float *selw;   /* [B][k] their weights                                */
    int32_t *rows; /* [B] token rows of one expert                        */
    float *roww;   /* [B] their weights                                   */

    /* decode machinery (matmul.c, prefetch.c, attention.c) */
    mm_span_t *spans; /* [MM_MAX][n_threads] decode balancing         */
    int balance;      /* balance decode matmuls (env IE_DECODE_BALANCE) */
    /* idle prefetch (prefetch.c): the next decode matmul's first matrix,
     * set by the owner before each job (NULL: none); per worker thread,
     * touched by that thread only, how far it has fetched its share */
    _Atomic(const struct wmat *) pf_next;
    struct pf_state *pf; /* [n_threads], or NULL (one thread)          */
    ie_idle_t idle_hook; /* {worker_idle, this}: installed in the pool  */
    int pf_on;           /* idle prefetch on (env IE_DECODE_PREFETCH)  */
    int stream_act;      /* decode activations by act_quantize_stream (env IE_DECODE_STREAM) */
    int kvpf_on;         /* decode: KV rows prefetched during q/k/v (env IE_DECODE_KVPREFETCH) */
    int step_logits;     /* this step computes logits (the last prefetch point) */

    /* LoRA (lora.c) */
    wlora_t lora[IE_WORKER_MAX_LORA];
    lora_group_t lora_groups[IE_WORKER_MAX_LORA]; /* this step's groups */
    int lora_ngroups;
    int32_t *lora_rows; /* [max_batch] batch rows grouped by adapter   */
    float *lora_tmp;    /* [3][max_batch][lora_tmp_rank] the kernels' A x */
    int lora_tmp_rank;
    double lora_pool_min; /* multiply-adds from which a call uses the pool */
    lora_job_t lora_job;  /* the call between worker_lora_begin and _end */
    int lora_open;        /* ... begun and not ended                      */
};

/* ------------------------------------------------------- worker.c: memory */

/* Large zeroed buffer of its own mapping (huge: 2 MiB-aligned, THP asked);
 * free with worker_big_free (NULL accepted). */
void *worker_big_alloc_ex(size_t n, int huge);
void *worker_big_alloc(size_t n);
void worker_big_free(void *q);

/* Keep p (a worker_big_alloc buffer) until destroy. -1: out of memory
 * (p is not kept). */
int worker_own(ie_worker_t *w, void *p);

/* y[0..n) += b[0..n): biases, and the residual adds of the forward pass */
static inline void worker_vec_add(float *y, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += b[i];
}

/* ------------------------------------------------------------ bind.c */

/* The loading options the environment overrides (IE_WEIGHTS_COPY,
 * IE_REPACK, IE_QUANT_*, IE_REPACK_CACHE), resolved into w. */
ie_status_t worker_bind_options(ie_worker_t *w, const ie_model_src_t *src);

/* Bind the shard's embedding, head and layers (w->sh, w->arch decide
 * which tensors, under which names). */
ie_status_t worker_bind_weights(ie_worker_t *w, const ie_model_src_t *src);

/* Row r of a dense matrix in any layout, as floats: out[n_in]. */
void worker_mat_row(const wmat_t *m, int64_t r, float *out);

/* ---------------------------------------------------------- kvquant.c */

/* A slot's tokens in one step from which attention decodes its rows once
 * for all of them, and the most bytes (K and V, f32) that decode takes. */
#define KVQ_PRE_MIN 4
#define KVQ_PRE_BYTES ((size_t)64 << 20)

/* Whether a cache of type t is rotated under switch r. */
int kvq_rotates(ie_kv_type_t t, ie_kv_rotate_t r);

/* Rows of a smoothed cache whose mean is subtracted from every later row. */
#define KVQ_SMOOTH_ROWS 16

/* Whether cache c (0 K, 1 V) of type t is smoothed: a q4 K. The
 * environment's IE_KV_SMOOTH changes that for measurements: "0" none, "k"
 * a q4 or FP8 K, "kv" K and V of those types (docs/KVCACHE.md: a smoothed
 * V and FP8 measured worse). Softmax does not change when q.m is added to
 * every score, nor a weighted sum of V rows (weights summing to 1) less m
 * other than by m: storing k - m (v - m) and adding m back when read is
 * exact, and takes K's large per-channel offsets out of the range the
 * 4-bit codes must span (SageAttention's smoothing of K). m is the mean of
 * the slot's first KVQ_SMOOTH_ROWS rows as decoded from the cache, so it
 * is rebuilt from the cache alone: a shared prefix, a recomputed one and
 * every block layout give the same m. Layers that slide are not smoothed
 * (their first rows leave the window). */
int kvq_smooths(ie_kv_type_t t, int c);

/* Positions of a q4 K read in f32 (kv_recent): a token's last KVQ_RECENT,
 * its own included. */
#define KVQ_RECENT 64

/* Whether a K cache of type t keeps its recent rows in f32: a q4 or
 * fp8_e4m3 one (measured to pay, docs/KVCACHE.md), unless the environment
 * sets IE_KV_RECENT=0 (measuring; "all": every type but f32). A quantized
 * V that is not smoothed then keeps its recent rows alike. The last
 * positions before a token are the ones it attends to most (the recent
 * context); KIVI keeps them in full precision until their block is full.
 * Here the cache still holds them in q4 (so a shared prefix, preemption
 * and plans see the same cache); a token reads the f32 copy of its last
 * kvq_recent_len() rows where the worker still has it. A sliding window
 * rather than KIVI's open block: the simulation measured the last 64
 * positions at +0.87% where the own 32-block gave +1.60% (docs/KVCACHE.md). */
int kvq_recent(ie_kv_type_t t);

/* The window of kv_recent in positions: KVQ_RECENT, or the environment's
 * IE_KV_RECENT_W (1 .. 4096; measuring and the tests' short contexts). */
int kvq_recent_len(void);

/* Positions a kv_recent K also reads in f32 from the start of the slot
 * (attention sinks: the first rows take a large share of the attention
 * whatever their distance). */
#define KVQ_SINKS 4

/* The sinks of kv_recent: KVQ_SINKS, or the environment's IE_KV_SINKS
 * (0 .. 256; measuring and the tests). */
int kvq_sinks(void);

/* m[0..hd) = the mean (summed in double, in row order) of rows 0 ..
 * KVQ_SMOOTH_ROWS-1 of the view, decoded by ops->kv_decode (the same bits
 * on every ISA). Every row must be written and its block bound. */
void kvq_mean(const ie_kernels_t *ops, ie_kv_type_t t, const ie_kv_rows_t *rows, int hd, float *m);
/* x[0..hd) <- H x, H the orthonormal Walsh-Hadamard matrix of order p (the
 * largest power of two dividing hd) on each block of p values: symmetric,
 * its own inverse, so dot products of rotated vectors are unchanged. */
void kvq_fwht(float *x, int hd);

/* --------------------------------------------------------- attention.c */

/* The KV block pool and tables, the RoPE tables and attention's scratch. */
ie_status_t worker_kv_new(ie_worker_t *w);

/* Token i of b may run: every KV block it writes or reads is bound. */
ie_status_t worker_kv_check(const ie_worker_t *w, const ie_batch_t *b, int i);

/* q[n][q_dim], k[n][kv_dim], v[n][kv_dim] = Wq, Wk, Wv · xb[n][d] of layer
 * l, in one matmul job; a decode job also fetches the KV rows attention
 * will read. */
ie_status_t worker_qkv(ie_worker_t *w, int l, const ie_batch_t *b);

/* Rotate q and k of every token by its position (the descriptor's RoPE;
 * layer l picks the sliding or the global layers' tables). */
void worker_rope(ie_worker_t *w, int l, const ie_batch_t *b);

/* Layer l: k, v of every token -> its slot's cache at its position (the
 * pool, or a sliding layer's ring), then xb[n][q_dim] =
 * softmax(softcap(q·K^T * scale)) · V over each token's visible positions,
 * per (token, head), on the pool; scale is hp.attn_scale or 1/sqrt(hd),
 * softcap c tanh(s / c) when arch.attn_softcap is set. A ring layer takes
 * the step kv_ring_chunk tokens at a time, so no row a token reads is
 * overwritten before it attends. */
void worker_kv_store_attend(ie_worker_t *w, int l, const ie_batch_t *b);

/* The slots' caches now hold the batch's positions. */
void worker_kv_commit(ie_worker_t *w, const ie_batch_t *b);

/* -------------------------------------------------------------- lora.c */

/* Work each thread does before its share of a matmul job. */
typedef struct mm_pre {
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
} mm_pre_t;


/* Token i's adapter id is -1 or attached (IE_ERR_RANGE otherwise). */
ie_status_t worker_lora_check(const ie_worker_t *w, const ie_batch_t *b, int i);

/* Group the step's tokens by adapter (none when b->adapter is NULL). */
void worker_lora_group(ie_worker_t *w, const ie_batch_t *b);

/* The low-rank paths of the nm (1..3) modules ms[i] of layer l that
 * share input rows x[n][this rank's n_in] (the base matmul's own input):
 * between worker_lora_begin and worker_lora_end, ys[i][n][this rank's
 * n_out] += each group's adapter's B (scale * A x). The shrink (A x)
 * rides on the next matmul job as its pre-work (worker_lora_pre) so it
 * costs no fork/join of its own; _end runs the expand after the base
 * matmul has written ys (one pool job when the work outweighs a
 * fork/join), and the shrink first if no matmul took it. */
void worker_lora_begin(ie_worker_t *w, int l, int nm, const ie_lora_mod_t *ms, float *const *ys, const float *x);
void worker_lora_end(ie_worker_t *w);

/* The shrink of the open call as pre-work for a matmul job (each thread
 * its share): 1 and *pre set once per call, else 0 (nothing open, or
 * taken already). */
int worker_lora_pre(ie_worker_t *w, mm_pre_t *pre);

/* Free the LoRA scratch (the adapters are the caller's). */
void worker_lora_free(ie_worker_t *w);

/* --------------------------------------------------------------- moe.c */

/* moe[n][d] = the mixture of experts of layer L on xb[n][d] (this rank's
 * experts' share on a tensor-parallel rank). */
ie_status_t worker_moe(ie_worker_t *w, const layer_t *L, int n);

/* ------------------------------------------------------------ matmul.c */


/* y_i[n][m_i->n_out] = m_i · x[n][n_in] for up to MM_MAX matrices sharing
 * the input x. rep: NULL, or per matrix NULL or its per-node copies (share
 * ith reads rep[i][w->share_repl[ith]]). pre: NULL, or work every thread
 * does first. A kernel failure is IE_ERR_INTERNAL naming the matrix's type
 * and shape (y is then unspecified). */
ie_status_t worker_matmul_rep(ie_worker_t *w, int nm, const wmat_t *const *m, const wmat_t *const *rep,
                              float *const *y, const float *x, int n, const mm_pre_t *pre);
ie_status_t worker_matmul_group(ie_worker_t *w, int nm, const wmat_t *const *m, float *const *y, const float *x,
                                int n);
ie_status_t worker_matmul(ie_worker_t *w, const wmat_t *m, float *y, const float *x, int n);

/* g[0..n) = act(g) * u, act = silu or the descriptor's GELU (tanh
 * approximation), split across the pool when large. */
void worker_swiglu(ie_worker_t *w, float *g, const float *u, int64_t n);

/* ---------------------------------------------------------- prefetch.c */

/* The declared points of a step where the owner names the matrix that the
 * idle threads fetch next (the first of the matmul job after the next). */
typedef enum worker_pf_point {
    PF_BEFORE_QKV,     /* layer l's attention norm done: fetch Wo          */
    PF_BEFORE_O,       /* attention done: fetch the MLP's gate             */
    PF_BEFORE_GATE_UP, /* fetch the MLP's down                             */
    PF_BEFORE_DOWN,    /* fetch the next layer's Wq, or the head           */
    PF_BEFORE_HEAD     /* fetch the first layer's Wq for the next step     */
} worker_pf_point_t;

/* Idle prefetch state and the pool's idle hook (n_threads > 1). */
ie_status_t worker_prefetch_new(ie_worker_t *w);

/* Name what the idle threads fetch at point `at` of layer l (n tokens:
 * decode batches only). No effect on results. */
void worker_prefetch_at(ie_worker_t *w, worker_pf_point_t at, int l, int n);

/* ---------------------------------------------------------- replicas.c */

/* Find the pool threads' nodes and copy the head and embedding per node
 * when asked (IE_HOT_REPLICATE); after every weight is bound. */
ie_status_t worker_replicas_new(ie_worker_t *w);

/* The embedding the calling thread (share 0) looks tokens up in. */
const wmat_t *worker_embedding(const ie_worker_t *w);

/* logits[n][vocab held] = Wout · x[n][d], each share reading its node's copy. */
ie_status_t worker_matmul_head(ie_worker_t *w, float *logits, const float *x, int n);

#endif
