/* worker.c — the worker's life cycle: options, ie_worker_new as a list of
 * named steps, scratch memory, destroy, and the small accessors.
 *
 * The worker's jobs live in their own files (worker_internal.h lists
 * them); the forward pass is forward.c.
 */
#include "worker_internal.h"

#include "ie_numa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ------------------------------------------------------------ options */

const char *ie_precision_name(ie_precision_t p)
{
    switch (p) {
    case IE_PREC_NATIVE: return "native";
    case IE_PREC_F32: return "f32";
    case IE_PREC_BF16: return "bf16";
    case IE_PREC_F16: return "f16";
    case IE_PREC_INT8W: return "int8w";
    case IE_PREC_INT4W: return "int4w";
    }
    return "invalid";
}

ie_status_t ie_precision_parse(const char *s, ie_precision_t *out)
{
    static const ie_precision_t all[] = {IE_PREC_NATIVE, IE_PREC_F32,   IE_PREC_BF16,
                                         IE_PREC_F16,    IE_PREC_INT8W, IE_PREC_INT4W};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (s && strcmp(s, ie_precision_name(all[i])) == 0) {
            *out = all[i];
            return IE_OK;
        }
    }
    return ie_error_set(IE_ERR_INVAL, "unknown precision '%s' (expected native, f32, bf16, f16, int8w or int4w)",
                        s ? s : "(null)");
}

void ie_worker_opts_default(ie_worker_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->n_threads = 1;
    o->pin_threads = 1;
    o->n_ctx = 2048;
    o->n_seq = 1;
    o->max_batch = 256;
    o->precision = IE_PREC_NATIVE;
    o->copy_weights = 0;
    o->quant_group = 32;
    o->quant_scale = IE_QSCALE_ABSMAX;
    o->repack = 1;
    o->isa = ie_isa_best();
    o->hot_repl_limit_mb = 1024;
}

/* ------------------------------------------------------------ memory */

/* Large zeroed buffer from its own anonymous mapping: zero pages cost no
 * memory until first written. `huge` asks for huge pages (streamed weights
 * and scratch: 4 KiB pages cost ~1/3 of the read bandwidth here; the KV
 * cache, see worker_kv_new). Huge allocations
 * start 2 MiB-aligned (THP only backs aligned 2 MiB ranges: an unaligned
 * 2-6 MiB weight matrix got almost none); the mapping's size for
 * worker_big_free() sits in a header before the data. */
#define BIG_HDR 64
#define HUGE_SZ ((size_t)2 << 20)
#define PAGE_SZ ((size_t)4096)
void *worker_big_alloc_ex(size_t n, int huge)
{
    if (huge && n >= HUGE_SZ) {
        /* Transparent huge pages need 2 MiB-aligned virtual addresses: map
         * with slack, keep one 4 KiB page for the header right before a
         * 2 MiB-aligned start, give the rest of the slack back. */
        size_t total = n + HUGE_SZ + PAGE_SZ;
        char *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        char *data = (char *)(((uintptr_t)base + PAGE_SZ + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
        char *start = data - PAGE_SZ;
        char *end = (char *)(((uintptr_t)data + n + PAGE_SZ - 1) & ~(uintptr_t)(PAGE_SZ - 1));
        if (start > base) munmap(base, (size_t)(start - base));
        if (base + total > end) munmap(end, (size_t)(base + total - end));
        madvise(data, (size_t)(end - data), MADV_HUGEPAGE);
        *(size_t *)start = (size_t)(end - start);
        return data;
    }
    size_t total = n + BIG_HDR;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *(size_t *)p = total;
    return (char *)p + BIG_HDR;
}

void *worker_big_alloc(size_t n) { return worker_big_alloc_ex(n, 1); }

void worker_big_free(void *q)
{
    if (!q) return;
    /* huge allocations start 2 MiB-aligned with their header one page
     * before; the others have it BIG_HDR bytes before */
    char *p = ((uintptr_t)q & (HUGE_SZ - 1)) == 0 ? (char *)q - PAGE_SZ : (char *)q - BIG_HDR;
    munmap(p, *(size_t *)p);
}

int worker_own(ie_worker_t *w, void *p)
{
    if (w->n_owned == w->cap_owned) {
        size_t cap = w->cap_owned ? w->cap_owned * 2 : 64;
        void **n = realloc(w->owned, cap * sizeof *n);
        if (!n) return -1;
        w->owned = n;
        w->cap_owned = cap;
    }
    w->owned[w->n_owned++] = p;
    return 0;
}

/* A decode switch (IE_DECODE_*): on unless the variable is exactly "0". */
static int env_on(const char *name)
{
    const char *e = getenv(name);
    return !(e && e[0] == '0' && e[1] == '\0');
}

/* ------------------------------------------------------------ new / destroy */

static ie_status_t check_opts(const ie_model_src_t *src, const ie_worker_opts_t *opts)
{
    if (!src || !opts) return ie_error_set(IE_ERR_INVAL, "worker: NULL argument");
    if (opts->n_threads < 1 || opts->n_threads > 1024 || opts->n_ctx < 1 || opts->n_seq < 1 || opts->max_batch < 1)
        return ie_error_set(IE_ERR_INVAL, "worker: bad options (threads %d, ctx %d, seq %d, batch %d)",
                            opts->n_threads, opts->n_ctx, opts->n_seq, opts->max_batch);
    if (opts->kv_block < 0 || opts->kv_blocks < 0)
        return ie_error_set(IE_ERR_INVAL, "worker: bad KV pool (block of %d positions, %d blocks)", opts->kv_block,
                            opts->kv_blocks);
    if ((unsigned)opts->kv_type_k >= IE_KV_TYPE_COUNT || (unsigned)opts->kv_type_v >= IE_KV_TYPE_COUNT ||
        (unsigned)opts->kv_rotate > IE_KV_ROTATE_OFF)
        return ie_error_set(IE_ERR_INVAL, "worker: bad KV cache types (%d, %d) or rotation %d",
                            (int)opts->kv_type_k, (int)opts->kv_type_v, (int)opts->kv_rotate);
    return IE_OK;
}

/* The kernel tables of the ISA asked for, and the thread pool. */
static ie_status_t start_kernels(ie_worker_t *w)
{
    w->ops = ie_kernels_get(w->opts.isa);
    if (!w->ops)
        return ie_error_set(IE_ERR_UNSUPPORTED, "worker: kernels for ISA '%s' are not available on this CPU: %s",
                            ie_isa_name(w->opts.isa), ie_isa_unsupported_reason(w->opts.isa));
    return ie_threadpool_new(w->opts.n_threads, w->opts.pin_threads, &w->tp);
}

/* Which layers, heads, columns, experts and vocab rows this worker holds,
 * and the sizes that follow. */
static ie_status_t plan_shard(ie_worker_t *w, const ie_model_src_t *src)
{
    const ie_hparams_t *hp = &w->hp;
    const ie_shard_t *s = &w->opts.shard;
    ie_shard_units_t units;
    ie_status_t st;
    if (hp->rope_dim <= 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return ie_error_set(IE_ERR_FORMAT, "model: rope dimension %d invalid for head_dim %d", hp->rope_dim,
                            hp->head_dim);
    if ((st = ie_shard_units(src, &units)) != IE_OK) return st;
    if ((st = ie_shard_plan_units(hp, &units, s, &w->sh)) != IE_OK) return st;
    w->tensor_par = s->kind == IE_SHARD_TENSOR && s->n_ranks > 1;
    if (w->tensor_par && !w->opts.reduce)
        return ie_error_set(IE_ERR_INVAL, "worker: a tensor-parallel shard of %d ranks needs a reduce callback",
                            s->n_ranks);
    w->n_kv_loc = w->sh.kv_head_end - w->sh.kv_head_begin;
    w->n_head_loc = w->sh.head_end - w->sh.head_begin;
    w->ff_loc = w->sh.ff_end - w->sh.ff_begin;
    w->q_dim = w->n_head_loc * hp->head_dim;
    w->kv_dim = w->n_kv_loc * hp->head_dim;
    return IE_OK;
}

/* The step's scratch, sized for max_batch tokens, and the decode switches. */
static ie_status_t new_scratch(ie_worker_t *w)
{
    const ie_hparams_t *hp = &w->hp;
    const size_t B = (size_t)w->opts.max_batch, d = (size_t)hp->n_embd, ff = (size_t)w->ff_loc;
    const size_t wide = d > (size_t)w->q_dim ? d : (size_t)w->q_dim;
    const size_t max_in = ff > wide ? ff : wide;
    /* the widest activation row any bound matrix can ask for: every n_in
     * is d, q_dim or ff_loc, in Q16_P (int8w, 2.25 B per element), Q8_P
     * (int4w, q5_0/q5_1/iq4_nl: 1.25), Q8_K (the 256-element k-quants:
     * 292 per 256) or BF16 rows (2); F32 activations read x itself */
    {
        static const ie_dtype_t acts[] = {IE_DTYPE_Q16_P, IE_DTYPE_Q8_P, IE_DTYPE_Q8_K,
                                          IE_DTYPE_BF16,  IE_DTYPE_Q8_0, IE_DTYPE_Q8_1};
        w->act_row_cap = 0;
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
            const int qk = ie_dtype_block_elems(acts[i]) > 32 ? ie_dtype_block_elems(acts[i]) : 32;
            const size_t rb = ie_dtype_row_bytes(acts[i], (int64_t)((max_in + qk - 1) / qk * qk));
            if (rb > w->act_row_cap) w->act_row_cap = rb;
        }
    }
    w->x = worker_big_alloc(B * d * sizeof(float));
    w->xb = worker_big_alloc(B * wide * sizeof(float));
    w->q = worker_big_alloc(B * w->q_dim * sizeof(float));
    w->k = worker_big_alloc(B * w->kv_dim * sizeof(float));
    w->v = worker_big_alloc(B * w->kv_dim * sizeof(float));
    w->hb = worker_big_alloc(B * ff * sizeof(float));
    w->hb2 = worker_big_alloc(B * ff * sizeof(float));
    w->tmp = worker_big_alloc(B * d * sizeof(float));
    w->act = worker_big_alloc(B * w->act_row_cap);
    w->spans = worker_big_alloc(MM_MAX * (size_t)w->opts.n_threads * sizeof *w->spans);
    if (!w->x || !w->xb || !w->q || !w->k || !w->v || !w->hb || !w->hb2 || !w->tmp || !w->act || !w->spans)
        return ie_error_set(IE_ERR_NOMEM, "out of memory allocating worker scratch");
    if (w->arch.ffn == IE_FFN_MOE) {
        const size_t E = (size_t)hp->n_expert, k = (size_t)hp->n_expert_used;
        w->xg = worker_big_alloc(B * d * sizeof(float));
        w->moe = worker_big_alloc(B * d * sizeof(float));
        w->rlog = worker_big_alloc(B * E * sizeof(float));
        w->sel = worker_big_alloc(B * k * sizeof(int32_t));
        w->selw = worker_big_alloc(B * k * sizeof(float));
        w->rows = worker_big_alloc(B * sizeof(int32_t));
        w->roww = worker_big_alloc(B * sizeof(float));
        if (!w->xg || !w->moe || !w->rlog || !w->sel || !w->selw || !w->rows || !w->roww)
            return ie_error_set(IE_ERR_NOMEM, "out of memory allocating MoE scratch");
    }
    w->balance = env_on("IE_DECODE_BALANCE");
    w->stream_act = env_on("IE_DECODE_STREAM");
    w->kvpf_on = env_on("IE_DECODE_KVPREFETCH");
    w->pf_on = env_on("IE_DECODE_PREFETCH");
    return IE_OK;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_new(const ie_model_src_t *src, const ie_worker_opts_t *opts, ie_worker_t **out)
{
    ie_status_t st;
    ie_worker_t *w = NULL;
    *out = NULL;

    if ((st = check_opts(src, opts)) != IE_OK) return st;
    if (!(w = calloc(1, sizeof *w))) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    w->hp = *ie_model_src_hparams(src);
    w->opts = *opts;
    if ((st = ie_arch_desc_init(&w->hp, &w->arch)) != IE_OK) goto cleanup; /* what the pass does */
    if ((st = start_kernels(w)) != IE_OK) goto cleanup;                    /* kernels, thread pool */
    if ((st = worker_bind_options(w, src)) != IE_OK) goto cleanup;         /* env overrides */
    if ((st = plan_shard(w, src)) != IE_OK) goto cleanup;                  /* what this worker holds */
    if ((st = worker_bind_weights(w, src)) != IE_OK) goto cleanup;         /* bind.c */
    if ((st = worker_kv_new(w)) != IE_OK) goto cleanup;                    /* KV cache, RoPE tables */
    if ((st = new_scratch(w)) != IE_OK) goto cleanup;                      /* step scratch */
    if ((st = worker_prefetch_new(w)) != IE_OK) goto cleanup;              /* idle prefetch hook */
    st = worker_replicas_new(w);                                           /* after every weight is bound */

cleanup:
    if (st != IE_OK) {
        ie_worker_destroy(&w);
        return st;
    }
    *out = w;
    return IE_OK;
}

void ie_worker_destroy(ie_worker_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_worker_t *w = *self_p;
    ie_threadpool_destroy(&w->tp);
    for (size_t i = 0; i < w->n_owned; i++) worker_big_free(w->owned[i]);
    free(w->owned);
    for (int i = 0; w->repl_mem && i < 2 * w->n_repl; i++) ie_numa_free(w->repl_mem[i], w->repl_bytes[i]);
    free(w->repl_mem);
    free(w->repl_bytes);
    free(w->head_repl);
    free(w->embd_repl);
    free(w->share_repl);
    free(w->cache_dir);
    worker_lora_free(w);
    free(w->layers);
    worker_big_free(w->kcache);
    worker_big_free(w->vcache);
    worker_big_free(w->kv_tmp);
    worker_big_free(w->kv_mean);
    free(w->kv_smooth_keep);
    free(w->k_batch);
    free(w->k_recent);
    free(w->v_batch);
    free(w->v_recent);
    free(w->k_recent_pos);
    worker_big_free(w->kv_pre[0]);
    worker_big_free(w->kv_pre[1]);
    free(w->kv_mark);
    free(w->seq_len);
    free(w->btab);
    worker_big_free(w->kring);
    worker_big_free(w->vring);
    free(w->kv_ring_tab);
    free(w->kv_ring_pos);
    if (w->rope_cos_swa != w->rope_cos) free(w->rope_cos_swa);
    if (w->rope_sin_swa != w->rope_sin) free(w->rope_sin_swa);
    free(w->rope_cos);
    free(w->rope_sin);
    worker_big_free(w->x);
    worker_big_free(w->xb);
    worker_big_free(w->q);
    worker_big_free(w->k);
    worker_big_free(w->v);
    worker_big_free(w->hb);
    worker_big_free(w->hb2);
    worker_big_free(w->tmp);
    worker_big_free(w->act);
    worker_big_free(w->spans);
    worker_big_free(w->pf);
    free(w->att_ws);
    free(w->att_segs);
    worker_big_free(w->xg);
    worker_big_free(w->moe);
    worker_big_free(w->rlog);
    worker_big_free(w->sel);
    worker_big_free(w->selw);
    worker_big_free(w->rows);
    worker_big_free(w->roww);
    free(w);
    *self_p = NULL;
}

/* ------------------------------------------------------------ accessors */

const ie_shard_range_t *ie_worker_shard(const ie_worker_t *w) { return &w->sh; }
const ie_hparams_t *ie_worker_hparams(const ie_worker_t *w) { return &w->hp; }
int ie_worker_n_ctx(const ie_worker_t *w) { return w->opts.n_ctx; }
int ie_worker_max_batch(const ie_worker_t *w) { return w->opts.max_batch; }
int ie_worker_n_threads(const ie_worker_t *w) { return w->opts.n_threads; }
ie_isa_t ie_worker_isa(const ie_worker_t *w) { return w->ops->isa; }

ie_status_t ie_worker_set_decode_option(ie_worker_t *w, const char *name, int on)
{
    if (!w || !name) return ie_error_set(IE_ERR_INVAL, "ie_worker_set_decode_option: NULL argument");
    if (!strcmp(name, "balance")) w->balance = on != 0;
    else if (!strcmp(name, "prefetch")) {
        w->pf_on = on != 0;
        if (!w->pf_on && w->pf) atomic_store_explicit(&w->pf_next, NULL, memory_order_relaxed);
    } else if (!strcmp(name, "stream")) w->stream_act = on != 0;
    else if (!strcmp(name, "kvprefetch")) w->kvpf_on = on != 0;
    else
        return ie_error_set(
            IE_ERR_INVAL,
            "ie_worker_set_decode_option: unknown option '%s' (balance, prefetch, stream, kvprefetch)", name);
    return IE_OK;
}

/* Contract (ie_worker.h). */
void ie_worker_test_set_matmul_ops(ie_worker_t *w, const ie_kernels_t *ops) { w->ops = ops; }
