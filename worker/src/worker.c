/* worker.c — weights binding, KV cache and the Llama forward pass.
 *
 * Data path of one step (n tokens, any mix of sequences and positions):
 *   x[n][d]    = embedding rows of the tokens
 *   per layer:   xb = rmsnorm(x)             q,k,v = Wq,Wk,Wv · xb (one GEMM)
 *                rope(q, k); k,v -> cache[slot][pos]
 *                att = softmax(q·K^T/sqrt(hd)) · V   per (token, head)
 *                x += Wo · att
 *                xb = rmsnorm(x)             g,u = Wg,Wu · xb  (one GEMM)
 *                x += Wd · (silu(g) * u)
 *   logits     = Wout · rmsnorm(x) for the tokens that asked
 * Every matmul sees all n tokens, so prefill is matrix-matrix work and a
 * decode batch streams each weight matrix once.
 *
 * KV cache: a pool of physical blocks of kv_block positions of every held
 * layer, [block][layer][kv_block][kv_dim]; each slot's block table maps its logical
 * blocks (positions lb*kv_block ..) to physical ones. K/V rows are written
 * through the table and attention reads them through it (ie_attn.h's paged
 * views: the bits of the contiguous cache). The
 * default pool gives every slot its own blocks (the unpaged cache); a
 * smaller one starts unbound and the caller binds (ie_worker_kv_bind).
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
#include "ie_worker.h"

#include "ie_attn.h"
#include "ie_mmap.h"
#include "ie_numa.h"
#include "ie_kernels.h"
#include "ie_threadpool.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ------------------------------------------------------------------ types */

typedef struct wmat {
    ie_dtype_t dtype;
    ie_layout_t layout; /* ROWS (ggml types), PANEL16 (int8w/int4w/bf16/f16), BSR */
    int group;          /* PANEL16 / ROWS int types: scale group        */
    const void *data;   /* n_out rows of n_in elements                  */
    int64_t n_in;
    int64_t n_out;
    size_t slice;       /* bytes of one matrix (expert stride)          */
    int64_t n_mat;      /* matrices in the stack (experts held), 0 unbound */
    ie_bsr_t bsr;       /* BSR: view into data                          */
} wmat_t;

typedef struct layer {
    const float *attn_norm; /* (d)                                     */
    const float *ffn_norm;  /* (d)  post_attention_norm for GPT-OSS    */
    wmat_t q;               /* (n_head*hd, d)                          */
    wmat_t k, v;            /* (n_kv*hd, d)                            */
    wmat_t o;               /* (d, n_head*hd)                          */
    /* dense MLP (Llama) */
    wmat_t gate, up;        /* (ff, d)                                 */
    wmat_t down;            /* (d, ff)                                 */
    /* GPT-OSS: attention extras */
    const float *bq, *bk, *bv, *bo; /* biases, NULL when absent        */
    const float *sinks;     /* (n_head) sink logits, NULL when absent  */
    int swa;                /* sliding-window layer                     */
    /* GPT-OSS: MoE. Expert matrices hold n_expert matrices back to back;
     * gate/up/down here describe one expert (data = expert 0). */
    wmat_t router;          /* (n_expert, d)                            */
    const float *router_b;  /* (n_expert)                               */
    const float *gate_b, *up_b, *down_b; /* (E, ff), (E, ff), (E, d)    */
} layer_t;

/* A thread's unclaimed panels of one matrix in a balanced decode matmul:
 * front (low 32 bits) and back (high 32 bits), one cache line each. */
typedef struct mm_span {
    _Alignas(64) _Atomic uint64_t span;
} mm_span_t;
#define MM_SPANS_PER_THREAD 3 /* MM_MAX */

struct ie_worker {
    ie_hparams_t hp;
    ie_worker_opts_t opts;
    int copy_weights;        /* resolved opts.copy_weights                */
    int repack;              /* resolved opts.repack                      */
    char *cache_dir;         /* repack cache directory, or NULL           */
    int binding_head;        /* bind_mats is binding the output head      */
    int src_file_mapped;     /* every source tensor is in a file mapping  */
    ie_shard_range_t sh;     /* what this worker holds (ie_shard_plan)    */
    int tensor_par;          /* tensor-parallel with n_ranks > 1: reduce  */
    uint64_t probe_sink;     /* ie_worker_stream_probe's reads end here   */
    int n_head_loc, n_kv_loc; /* query / KV heads held                    */
    int64_t ff_loc;          /* dense MLP columns held (expert ff: all)  */
    const ie_kernels_t *ops;
    ie_threadpool_t *tp;

    wmat_t tok_embd;         /* (vocab, d)                               */
    wmat_t output;           /* (vocab, d), may share tok_embd's data    */
    const float *output_norm;
    layer_t *layers;         /* [n_layer]                                */

    void **owned;            /* buffers we allocated for weights         */
    size_t n_owned, cap_owned;

    /* hot-weight replicas (IE_HOT_REPLICATE): copy r of the head and of
     * the embedding for the r-th node among the pool's threads */
    int n_repl;              /* nodes with a copy (0: no copies)         */
    int *share_repl;         /* [n_threads] copy read by share ith       */
    wmat_t *head_repl;       /* [n_repl] or NULL (head not replicated)   */
    wmat_t *embd_repl;       /* [n_repl] or NULL; tied: head_repl's data */
    void **repl_mem;         /* [2 * n_repl] our copies (ie_numa_alloc)  */
    size_t *repl_bytes;      /* [2 * n_repl] their sizes                 */
    int hot_copies;          /* copies made                              */
    char hot_report[512];    /* what was found and done ("" not asked)  */

    int q_dim, kv_dim;       /* held heads: n_head_loc*hd, n_kv_loc*hd    */
    int kv_block;            /* positions per KV block                    */
    int kv_blocks;           /* physical blocks in the pool               */
    int kv_nlb;              /* logical blocks per slot: ceil(n_ctx/kv_block) */
    int all_swa;             /* every held layer slides (reads a window)  */
    size_t kv_layer_stride;  /* floats per layer in a block: kv_block*kv_dim */
    size_t kv_block_stride;  /* floats per block: held layers*kv_layer_stride */
    float *kcache, *vcache;  /* [kv_blocks][held layer][kv_block][kv_dim],
                                layer l at l - sh.layer_begin             */
    int32_t *btab;           /* [n_seq][kv_nlb] physical block, -1 unbound */
    int *seq_len;            /* [n_seq] positions held                   */

    float *rope_cos, *rope_sin; /* [n_ctx][rope_dim/2]                   */

    /* scratch, sized for max_batch tokens */
    float *x;    /* [B][d]   residual stream                              */
    float *xb;   /* [B][max(d, q_dim)] normed input / attention output     */
    float *q;    /* [B][q_dim]                                            */
    float *k;    /* [B][kv_dim]                                           */
    float *v;    /* [B][kv_dim]                                           */
    float *hb;   /* [B][ff]  gate, then silu(gate)*up                     */
    float *hb2;  /* [B][ff]  up                                           */
    float *tmp;  /* [B][d]   matmul output before the residual add        */
    void *act;   /* [B][act row] quantized activations                    */
    struct mm_span *spans; /* [MM_MAX][n_threads] decode balancing (mm_run) */
    int balance;           /* balance decode matmuls (env IE_DECODE_BALANCE) */
    /* idle prefetch (worker_idle): the next decode matmul's first matrix,
     * set by the owner before each job (NULL: none); per worker thread,
     * touched by that thread only, how far it has fetched its share */
    _Atomic(const struct wmat *) pf_next;
    struct pf_state *pf;   /* [n_threads], or NULL (one thread)          */
    ie_idle_t idle_hook;   /* {worker_idle, this}: installed in the pool  */
    int pf_on;             /* idle prefetch on (env IE_DECODE_PREFETCH)  */
    int stream_act;        /* decode activations by act_quantize_stream (env IE_DECODE_STREAM) */
    int kvpf_on;           /* decode: KV rows prefetched during q/k/v (env IE_DECODE_KVPREFETCH) */
    size_t act_row_cap;
    float *scores; /* [n_threads][group][n_ctx] attention probabilities   */
    /* MoE scratch */
    float *xg;     /* [B][d] rows routed to one expert                    */
    float *moe;    /* [B][d] MoE output before the residual add           */
    float *rlog;   /* [B][n_expert] router logits                         */
    int32_t *sel;  /* [B][k] selected experts                             */
    float *selw;   /* [B][k] their weights                                */
    int32_t *rows; /* [B] token rows of one expert                        */
    float *roww;   /* [B] their weights                                   */
};

/* ------------------------------------------------------------ utilities */

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

/* Large zeroed buffer from its own anonymous mapping: zero pages cost no
 * memory until first written. `huge` asks for huge pages (streamed weights
 * and scratch: 4 KiB pages cost ~1/3 of the read bandwidth here; the KV
 * cache, see ie_worker_new). Huge allocations
 * start 2 MiB-aligned (THP only backs aligned 2 MiB ranges: an unaligned
 * 2-6 MiB weight matrix got almost none); the mapping's size for
 * big_free() sits in a header before the data. */
#define BIG_HDR 64
#define HUGE_SZ ((size_t)2 << 20)
#define PAGE_SZ ((size_t)4096)
static void *big_alloc_ex(size_t n, int huge)
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

static void *big_alloc(size_t n) { return big_alloc_ex(n, 1); }

static void big_free(void *q)
{
    if (!q) return;
    /* huge allocations start 2 MiB-aligned with their header one page
     * before; the others have it BIG_HDR bytes before */
    char *p = ((uintptr_t)q & (HUGE_SZ - 1)) == 0 ? (char *)q - PAGE_SZ : (char *)q - BIG_HDR;
    munmap(p, *(size_t *)p);
}

static int own(ie_worker_t *w, void *p)
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

/* --------------------------------------------------------- weight binding */

/* ------------------------------------------------------- weight binding */

static int dtype_computable(ie_dtype_t t)
{
    return t == IE_DTYPE_F32 || t == IE_DTYPE_F16 || t == IE_DTYPE_BF16 || t == IE_DTYPE_Q8_0 ||
           t == IE_DTYPE_Q4_0 || t == IE_DTYPE_Q4_1 || t == IE_DTYPE_MXFP4 || ie_dtype_is_intw(t);
}

/* Row r of a dense matrix in any layout, as floats. */
static void mat_row(const wmat_t *m, int64_t r, float *out)
{
    if (m->layout == IE_LAYOUT_PANEL16) {
        ie_pmat_t pm = {m->dtype, m->group, m->n_in, m->n_out, m->data};
        ie_pack_dequant_row(&pm, r, out);
    } else if (ie_dtype_is_intw(m->dtype)) {
        size_t rb = ie_qrow_bytes(m->dtype, m->group, m->n_in);
        ie_qrow_dequantize(m->dtype, m->group, (const char *)m->data + (size_t)r * rb, out, m->n_in);
    } else {
        size_t rb = ie_dtype_row_bytes(m->dtype, m->n_in);
        ie_dequantize_row(m->dtype, (const char *)m->data + (size_t)r * rb, out, m->n_in);
    }
}

/* Conversion of a stack of n_mat matrices (src, described as a wmat) into
 * `to`/`layout`, 16 rows (one panel) per unit of work. */
typedef struct convert_task {
    wmat_t src;          /* slice 0; slices src_slice bytes apart          */
    size_t src_slice;
    int64_t n_mat;
    ie_dtype_t to;
    ie_layout_t layout;
    int group;
    ie_qscale_t how;
    void *dst;
    size_t dst_slice;
    _Atomic int failed;
} convert_task_t;

static void convert_run(void *ctx, int ith, int nth)
{
    convert_task_t *c = ctx;
    const int64_t n_in = c->src.n_in, n_out = c->src.n_out, np = (n_out + IE_PANEL - 1) / IE_PANEL;
    long b, e;
    ie_split_range((long)(np * c->n_mat), ith, nth, &b, &e);
    float *rows = NULL;
    if (b < e && !(rows = malloc((size_t)IE_PANEL * (size_t)n_in * sizeof(float)))) {
        c->failed = 1;
        return;
    }
    const int lossless = c->layout == IE_LAYOUT_PANEL16 && c->src.layout == IE_LAYOUT_ROWS &&
                         ie_pack_target(c->src.dtype) == c->to &&
                         (ie_dtype_is_intw(c->src.dtype) ? c->src.group : 32) == c->group;
    for (long u = b; u < e; u++) {
        const int64_t s = u / np, p = u % np, r0 = p * IE_PANEL;
        const int64_t cnt = n_out - r0 < IE_PANEL ? n_out - r0 : IE_PANEL;
        wmat_t sm = c->src;
        sm.data = (const char *)c->src.data + (size_t)s * c->src_slice;
        char *dslice = (char *)c->dst + (size_t)s * c->dst_slice;
        if (c->layout == IE_LAYOUT_PANEL16) {
            char *dp = dslice + (size_t)p * ie_pack_panel_bytes(c->to, c->group, n_in);
            int rc;
            if (lossless) {
                const size_t rb = ie_tensor_bytes(sm.dtype, IE_LAYOUT_ROWS, sm.group, n_in, 1);
                rc = ie_pack_repack(sm.dtype, c->group, (const char *)sm.data + (size_t)r0 * rb, n_in, 0, cnt,
                                    cnt, dp);
            } else {
                for (int64_t r = 0; r < cnt; r++) mat_row(&sm, r0 + r, rows + (size_t)r * n_in);
                rc = ie_pack_quantize(c->to, c->group, c->how, rows, n_in, 0, cnt, cnt, dp);
            }
            if (rc != 0) c->failed = 1;
            continue;
        }
        /* ROWS of f32 / f16 / bf16 */
        const size_t drb = ie_dtype_row_bytes(c->to, n_in);
        for (int64_t r = 0; r < cnt; r++) {
            char *dst = dslice + (size_t)(r0 + r) * drb;
            float *f = c->to == IE_DTYPE_F32 ? (float *)dst : rows;
            mat_row(&sm, r0 + r, f);
            if (c->to == IE_DTYPE_BF16)
                for (int64_t i = 0; i < n_in; i++) ((ie_bf16_t *)dst)[i] = ie_f32_to_bf16(f[i]);
            else if (c->to == IE_DTYPE_F16)
                for (int64_t i = 0; i < n_in; i++) ((ie_f16_t *)dst)[i] = ie_f32_to_f16(f[i]);
        }
    }
    free(rows);
}

/* ---- on-disk repack cache: converted stacks keyed by a hash of the source
 * bytes and everything that decides the result. */

/* What a bind converts: a whole source tensor, or the slice of it a shard
 * holds (then data/nbytes are the cut's own bytes, so the cache key — the
 * hash of exactly the bytes converted plus the shapes after the cut — is
 * right for slices without naming the cut). */
typedef struct src_mat {
    ie_dtype_t dtype;
    ie_layout_t layout;
    int group;
    const void *data;
    uint64_t nbytes;
} src_mat_t;

static void cache_path(const ie_worker_t *w, const src_mat_t *t, const convert_task_t *c, char *out,
                       size_t cap)
{
    char key[256];
    snprintf(key, sizeof key, "v1|%s|%s|%d|%s|%s|%d|%d|%lld|%lld|%lld", ie_dtype_name(t->dtype),
             ie_layout_name(t->layout), t->group, ie_dtype_name(c->to), ie_layout_name(c->layout), c->group,
             (int)c->how, (long long)c->src.n_in, (long long)c->src.n_out, (long long)c->n_mat);
    XXH3_state_t *st = XXH3_createState();
    unsigned long long h = 0;
    if (st) {
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, key, strlen(key));
        XXH3_64bits_update(st, t->data, (size_t)t->nbytes);
        h = XXH3_64bits_digest(st);
        XXH3_freeState(st);
    }
    snprintf(out, cap, "%s/%016llx-%s-%s-g%d.iepack", w->cache_dir, h, ie_dtype_name(c->to),
             ie_layout_name(c->layout), c->group);
}

static int cache_load(const char *path, void *dst, size_t bytes)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat sb;
    int rc = -1;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == bytes) {
        size_t got = 0;
        while (got < bytes) {
            ssize_t n = pread(fd, (char *)dst + got, bytes - got > (1u << 30) ? (1u << 30) : bytes - got,
                              (off_t)got);
            if (n <= 0) break;
            got += (size_t)n;
        }
        rc = got == bytes ? 0 : -1;
    }
    close(fd);
    return rc;
}

static void cache_store(const char *path, const void *src, size_t bytes)
{
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t put = 0;
    while (put < bytes) {
        ssize_t n = write(fd, (const char *)src + put, bytes - put > (1u << 30) ? (1u << 30) : bytes - put);
        if (n <= 0) break;
        put += (size_t)n;
    }
    if (close(fd) == 0 && put == bytes && rename(tmp, path) == 0) return;
    unlink(tmp); /* the cache is best effort: a failed store only costs the next load */
}

/* After a matrix was copied or converted, its pages in the source's file
 * mapping are no longer needed: drop them from this process (a read-only
 * file mapping refaults from the file if anything reads them again), so a
 * repacked model does not stay resident twice. Only for sources whose
 * tensors all live in file mappings (GGUF, IEBIN). */
static void drop_source_pages(const ie_worker_t *w, const ie_tensor_t *t)
{
    if (t && w->src_file_mapped) ie_file_release_pages(t->data, (size_t)t->nbytes);
}

/* The part of a matrix stack a shard binds: rows [r0, r1), columns
 * [c0, c1) of matrices [e0, e1). */
typedef struct cut {
    int64_t r0, r1, c0, c1, e0, e1;
} cut_t;

static ie_status_t bind_src(ie_worker_t *w, const char *name, const src_mat_t *s, const ie_tensor_t *drop,
                            void **tmp, int64_t n_in, int64_t n_out, int64_t n_mat, wmat_t *m);

/* Bind the cut `c` of a 2-D weight matrix stack (ne = [n_in, n_out, n_mat])
 * in the layout the kernels run best, converting it when the precision asks
 * for another type. A cut of rows or columns is copied out in the source's
 * own encoding first (ie_tensor_slice), a cut of experts only is a byte
 * range of the stack; then both go through the same conversion as a whole
 * tensor. A cut off the source's block/group/panel boundaries is
 * IE_ERR_INVAL naming the tensor. keep_src: do not drop the source's pages
 * (the tied embedding, still read for lookups). */
static ie_status_t bind_cut(ie_worker_t *w, const ie_model_src_t *src, const char *name, int64_t n_in,
                            int64_t n_out, int64_t n_mat, const cut_t *c, int keep_src, wmat_t *m)
{
    const ie_tensor_t *t = ie_model_src_tensor(src, name);
    if (!t) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'", name);
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_mat || t->ne[3] != 1)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                            (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)n_in,
                            (long long)n_out, (long long)n_mat);
    const int whole_rc = c->r0 == 0 && c->r1 == n_out && c->c0 == 0 && c->c1 == n_in;
    const int whole = whole_rc && c->e0 == 0 && c->e1 == n_mat;
    memset(m, 0, sizeof *m);
    m->n_in = n_in;
    m->n_out = n_out;

    if (t->layout == IE_LAYOUT_BSR) {
        char err[160];
        if (n_mat != 1)
            return ie_error_set(IE_ERR_UNSUPPORTED, "model: tensor '%s': block-sparse expert stacks are not supported",
                                name);
        if (!whole)
            return ie_error_set(IE_ERR_UNSUPPORTED, "model: block-sparse tensor '%s' cannot be sharded", name);
        if (ie_bsr_view(t->data, (size_t)t->nbytes, n_in, n_out, &m->bsr, err, sizeof err) != 0)
            return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s': %s", name, err);
        m->dtype = IE_DTYPE_F32;
        m->layout = IE_LAYOUT_BSR;
        m->data = t->data;
        m->slice = (size_t)t->nbytes;
        m->n_mat = 1;
        return IE_OK; /* kept sparse whatever the precision */
    }
    if (!dtype_computable(t->dtype) || (t->layout == IE_LAYOUT_PANEL16 && !ie_dtype_is_packable(t->dtype)) ||
        (t->layout != IE_LAYOUT_ROWS && t->layout != IE_LAYOUT_PANEL16))
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: tensor '%s' has type %s in layout %s, which the engine cannot compute with",
                            name, ie_dtype_name(t->dtype), ie_layout_name(t->layout));
    const size_t src_slice = ie_tensor_bytes(t->dtype, t->layout, t->group, n_in, n_out);
    if (src_slice == 0)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' row length %lld does not fit %s (group %d)", name,
                            (long long)n_in, ie_dtype_name(t->dtype), t->group);
    if ((uint64_t)src_slice * (uint64_t)n_mat > t->nbytes)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' holds %llu bytes, its shape needs %llu", name,
                            (unsigned long long)t->nbytes, (unsigned long long)src_slice * (uint64_t)n_mat);

    src_mat_t s = {t->dtype, t->layout, t->group, t->data, t->nbytes};
    const int64_t ne = c->e1 - c->e0;
    if (whole) return bind_src(w, name, &s, keep_src ? NULL : t, NULL, n_in, n_out, n_mat, m);
    if (whole_rc) { /* experts only: a byte range of the stack */
        s.data = (const char *)t->data + (size_t)c->e0 * src_slice;
        s.nbytes = (uint64_t)src_slice * (uint64_t)ne;
        return bind_src(w, name, &s, keep_src ? NULL : t, NULL, n_in, n_out, ne, m);
    }
    const int64_t ni = c->c1 - c->c0, no = c->r1 - c->r0;
    const size_t sb = ie_tensor_bytes(t->dtype, t->layout, t->group, ni, no);
    void *tmp = sb ? big_alloc(sb * (size_t)ne) : NULL;
    if (sb && !tmp) return ie_error_set(IE_ERR_NOMEM, "out of memory slicing '%s'", name);
    for (int64_t e = 0; e < ne; e++) {
        if (sb == 0 || ie_tensor_slice(t->dtype, t->layout, t->group, (const char *)t->data +
                                       (size_t)(c->e0 + e) * src_slice, n_in, n_out, c->r0, c->r1, c->c0, c->c1,
                                       (char *)tmp + (size_t)e * sb) != 0) {
            big_free(tmp);
            return ie_error_set(IE_ERR_INVAL,
                                "tensor plan: cannot cut rows [%lld, %lld) x columns [%lld, %lld) out of '%s' "
                                "(%s/%s group %d): not on its block boundaries",
                                (long long)c->r0, (long long)c->r1, (long long)c->c0, (long long)c->c1, name,
                                ie_dtype_name(t->dtype), ie_layout_name(t->layout), t->group);
        }
    }
    s.data = tmp;
    s.nbytes = (uint64_t)sb * (uint64_t)ne;
    ie_status_t st = bind_src(w, name, &s, keep_src ? NULL : t, &tmp, ni, no, ne, m);
    big_free(tmp); /* NULL when bind_src kept it */
    return st;
}

/* Bind the source stack s (n_mat matrices of n_out rows of n_in) into m:
 * as is, copied, or converted per the precision. tmp: NULL, or a buffer of
 * ours holding s's bytes, which bind_src takes over (and NULLs) when it
 * uses it as is. drop: the tensor whose file pages to release once the
 * bytes live elsewhere (NULL: none). */
static ie_status_t bind_src(ie_worker_t *w, const char *name, const src_mat_t *t, const ie_tensor_t *drop,
                            void **tmp, int64_t n_in, int64_t n_out, int64_t n_mat, wmat_t *m)
{
    memset(m, 0, sizeof *m);
    m->n_in = n_in;
    m->n_out = n_out;
    m->n_mat = n_mat;
    const size_t src_slice = ie_tensor_bytes(t->dtype, t->layout, t->group, n_in, n_out);
    /* what the source is, as a matrix */
    wmat_t sm = {.dtype = t->dtype, .layout = t->layout, .group = t->group, .data = t->data,
                 .n_in = n_in, .n_out = n_out, .slice = src_slice, .n_mat = n_mat};

    /* what we want it to be */
    ie_dtype_t to = t->dtype;
    ie_layout_t lay = t->layout;
    int group = t->group;
    switch (w->opts.precision) {
    case IE_PREC_NATIVE:
        if (t->layout == IE_LAYOUT_ROWS && ie_dtype_is_intw(t->dtype)) {
            lay = IE_LAYOUT_PANEL16; /* engine-native rows always run packed */
        } else if (t->layout == IE_LAYOUT_ROWS && w->repack && ie_pack_target(t->dtype) != IE_DTYPE_INVALID &&
                   ie_pack_check(ie_pack_target(t->dtype), 32, n_in) == 0) {
            to = ie_pack_target(t->dtype); /* bf16, f16 too: their decode GEMV reads panels */
            lay = IE_LAYOUT_PANEL16;
            group = 32;
        }
        break;
    case IE_PREC_F32: to = IE_DTYPE_F32; lay = IE_LAYOUT_ROWS; group = 0; break;
    case IE_PREC_BF16:
    case IE_PREC_F16:
        to = w->opts.precision == IE_PREC_BF16 ? IE_DTYPE_BF16 : IE_DTYPE_F16;
        lay = w->repack && ie_pack_check(to, 32, n_in) == 0 ? IE_LAYOUT_PANEL16 : IE_LAYOUT_ROWS;
        group = lay == IE_LAYOUT_PANEL16 ? 32 : 0;
        break;
    case IE_PREC_INT8W:
    case IE_PREC_INT4W:
        /* int4w keeps the output head (the tied embedding) at 8 bits, as
         * llama.cpp's 4-bit mixes do: it is the most sensitive matrix */
        to = w->opts.precision == IE_PREC_INT8W || w->binding_head
                 ? IE_DTYPE_I8W
                 : (w->opts.quant_affine ? IE_DTYPE_I4WA : IE_DTYPE_I4W);
        lay = IE_LAYOUT_PANEL16;
        group = w->opts.quant_group > 0 ? w->opts.quant_group : 32;
        if (ie_pack_check(to, group, n_in) != 0)
            return ie_error_set(IE_ERR_INVAL, "model: %s group %d does not divide the row length %lld of '%s'",
                                ie_dtype_name(to), group, (long long)n_in, name);
        break;
    }
    m->dtype = to;
    m->layout = lay;
    m->group = lay == IE_LAYOUT_PANEL16 ? group : 0;
    m->slice = ie_tensor_bytes(to, lay, m->group, n_in, n_out);
    const size_t bytes = m->slice * (size_t)n_mat;

    if (to == t->dtype && lay == t->layout && group == t->group) {
        if (tmp && *tmp) { /* a slice already in our memory */
            if (own(w, *tmp) != 0) return ie_error_set(IE_ERR_NOMEM, "out of memory");
            m->data = *tmp;
            *tmp = NULL;
            drop_source_pages(w, drop);
            return IE_OK;
        }
        if (!w->copy_weights) {
            m->data = t->data;
            return IE_OK;
        }
        /* same type: a plain copy into huge-page memory (file mappings use
         * 4 KiB pages, which cost a third of the read bandwidth) */
        void *dst = big_alloc(bytes);
        if (!dst || own(w, dst) != 0) {
            big_free(dst);
            return ie_error_set(IE_ERR_NOMEM, "out of memory copying '%s' (%zu bytes)", name, bytes);
        }
        memcpy(dst, t->data, bytes);
        drop_source_pages(w, drop);
        m->data = dst;
        return IE_OK;
    }
    void *dst = big_alloc(bytes);
    if (!dst || own(w, dst) != 0) {
        big_free(dst);
        return ie_error_set(IE_ERR_NOMEM, "out of memory converting '%s' to %s (%zu bytes)", name,
                            ie_dtype_name(to), bytes);
    }
    convert_task_t c = {.src = sm, .src_slice = src_slice, .n_mat = n_mat, .to = to, .layout = lay,
                        .group = m->group, .how = w->opts.quant_scale, .dst = dst, .dst_slice = m->slice};
    char path[PATH_MAX];
    int cached = 0;
    if (w->cache_dir) {
        cache_path(w, t, &c, path, sizeof path);
        cached = cache_load(path, dst, bytes) == 0;
    }
    if (!cached) {
        ie_threadpool_run(w->tp, convert_run, &c);
        if (c.failed)
            return ie_error_set(IE_ERR_NOMEM, "worker: converting '%s' to %s failed", name, ie_dtype_name(to));
        if (w->cache_dir) cache_store(path, dst, bytes);
    }
    drop_source_pages(w, drop);
    m->data = dst;
    return IE_OK;
}

/* Bind a vector of n floats (norms, biases, sinks; n1 > 1 for per-expert
 * biases of shape [n, n1]); F16/BF16 tensors (HF checkpoints) are
 * converted once. */
static ie_status_t bind_vec2(ie_worker_t *w, const ie_model_src_t *src, const char *name, int64_t n,
                             int64_t n1, const float **out)
{
    const ie_tensor_t *t = ie_model_src_tensor(src, name);
    if (!t) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'", name);
    if (t->ne[0] != n || t->ne[1] != n1 || t->ne[2] != 1 || t->ne[3] != 1)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], (long long)n, (long long)n1);
    n *= n1;
    if (t->dtype == IE_DTYPE_F32) {
        *out = t->data;
        return IE_OK;
    }
    if (t->dtype != IE_DTYPE_F16 && t->dtype != IE_DTYPE_BF16)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: vector tensor '%s' has type %s (expected f32, f16 or bf16)",
                            name, ie_dtype_name(t->dtype));
    float *f = big_alloc((size_t)n * sizeof(float));
    if (!f || own(w, f) != 0) {
        big_free(f);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    ie_dequantize_row(t->dtype, t->data, f, n);
    *out = f;
    return IE_OK;
}

static ie_status_t bind_vec(ie_worker_t *w, const ie_model_src_t *src, const char *name, int64_t n,
                            const float **out)
{
    return bind_vec2(w, src, name, n, 1, out);
}

/* Rope tables for every position, computed in float32 the way HF does so
 * logits agree (ie_rope_table_f32). */
static void rope_tables(ie_worker_t *w)
{
    const ie_hparams_t *hp = &w->hp;
    size_t half = (size_t)hp->rope_dim / 2;
    if (hp->rope_yarn_factor <= 0) {
        for (int p = 0; p < w->opts.n_ctx; p++)
            ie_rope_table_f32(w->rope_cos + p * half, w->rope_sin + p * half, hp->rope_dim, p, hp->rope_theta);
        return;
    }
    /* YaRN (docs/GPTOSS.md 2.2), in float32 like transformers'
     * _compute_yarn_parameters: high-frequency pairs keep their frequency,
     * low-frequency ones are divided by the factor, a linear ramp between;
     * cos and sin carry the attention factor. */
    double d = hp->rope_dim, base = hp->rope_theta, L = hp->rope_yarn_orig_ctx;
    double low = d * log(L / (hp->rope_yarn_beta_fast * 2 * M_PI)) / (2 * log(base));
    double high = d * log(L / (hp->rope_yarn_beta_slow * 2 * M_PI)) / (2 * log(base));
    if (hp->rope_yarn_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > d - 1) high = d - 1;
    if (low == high) high += 0.001;
    float factor = hp->rope_yarn_factor, mscale = hp->rope_attn_factor;
    for (size_t i = 0; i < half; i++) {
        float pos_freq = powf(hp->rope_theta, (float)(2 * i) / (float)hp->rope_dim);
        float extrap = 1.0f / pos_freq, interp = 1.0f / (factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float keep = 1.0f - ramp; /* weight of the original frequency */
        float inv_freq = interp * (1.0f - keep) + extrap * keep;
        for (int p = 0; p < w->opts.n_ctx; p++) {
            float a = (float)p * inv_freq;
            w->rope_cos[(size_t)p * half + i] = cosf(a) * mscale;
            w->rope_sin[(size_t)p * half + i] = sinf(a) * mscale;
        }
    }
}

/* Copy the weights into our own huge-page memory? Measured here (TinyLlama
 * Q4_0, 2 threads, interleaved A/B): +2-3% decode for twice the resident
 * memory, so it is off unless asked for (opts or IE_WEIGHTS_COPY=1). */
static int resolve_copy(int want)
{
    const char *env = getenv("IE_WEIGHTS_COPY");
    if (env && (env[0] == '0' || env[0] == '1') && !env[1]) return env[0] == '1';
    return want > 0;
}

/* ---------------------------------------------------- hot-weight replicas */

/* IE_HOT_REPLICATE (ie_worker.h, docs/OPERATIONS.md). Meant for a worker
 * whose pool spans several NUMA nodes (the embedded engine on a multi-socket
 * host); a distributed worker bound to one node already reads local memory.
 * The head is streamed whole every token by every thread, so a remote copy
 * costs the interconnect's bandwidth on every token; the embedding is read
 * a few rows a step but is the head's own buffer when tied. */

/* The options as the environment overrides them. Only read when asked
 * for, so a stray IE_HOT_REPL_LIMIT_MB does not break a worker. */
static ie_status_t hot_env(const ie_worker_opts_t *o, int *want, double *limit_mb, int *fake)
{
    const char *e = getenv("IE_HOT_REPLICATE");
    char *end = NULL;
    *want = (e && (e[0] == '0' || e[0] == '1') && !e[1]) ? e[0] == '1' : o->hot_replicate > 0;
    *limit_mb = o->hot_repl_limit_mb;
    *fake = 0;
    if (!*want) return IE_OK;
    if ((e = getenv("IE_HOT_REPL_LIMIT_MB")) && *e) {
        errno = 0;
        double v = strtod(e, &end);
        if (*end || errno || !(v >= 0 && v <= 1e9))
            return ie_error_set(IE_ERR_INVAL, "worker: IE_HOT_REPL_LIMIT_MB='%s' is not a size in MiB", e);
        *limit_mb = v;
    }
    if (!(*limit_mb >= 0 && *limit_mb <= 1e9))
        return ie_error_set(IE_ERR_INVAL, "worker: hot_repl_limit_mb %g is not a size in MiB", *limit_mb);
    if ((e = getenv("IE_NUMA_FAKE_NODES")) && *e) {
        errno = 0;
        long v = strtol(e, &end, 10);
        if (*end || errno || v < 1 || v > 64)
            return ie_error_set(IE_ERR_INVAL, "worker: IE_NUMA_FAKE_NODES='%s' (expected 1..64)", e);
        *fake = (int)v;
    }
    return IE_OK;
}

static void fmt_size(char *out, size_t cap, double bytes)
{
    if (bytes >= 1048576.0) snprintf(out, cap, "%.1f MiB", bytes / 1048576.0);
    else snprintf(out, cap, "%.1f KiB", bytes / 1024.0);
}

/* Append to the report (truncated at its size, never overflowing). */
static void hot_say(ie_worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hot_say(ie_worker_t *w, const char *fmt, ...)
{
    size_t len = strlen(w->hot_report);
    if (len + 1 >= sizeof w->hot_report) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->hot_report + len, sizeof w->hot_report - len, fmt, ap);
    va_end(ap);
}

/* w->n_repl copies of m, copy r on node nodes[r] (node 0 for fake nodes);
 * *out receives the [n_repl] descriptors, which differ from m only in where
 * the bytes are. The memory goes to w->repl_mem at once, so destroy frees
 * whatever was made before a failure. */
static ie_status_t hot_copy(ie_worker_t *w, const wmat_t *m, const int *nodes, int fake, const char *name,
                            wmat_t **out)
{
    const size_t bytes = m->slice * (size_t)m->n_mat;
    wmat_t *c = calloc((size_t)w->n_repl, sizeof *c);
    if (!c) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    *out = c;
    for (int r = 0; r < w->n_repl; r++) {
        const int node = fake ? 0 : nodes[r];
        void *p = ie_numa_alloc(bytes, node);
        if (!p) {
            char why[160];
            snprintf(why, sizeof why, "%s", ie_error_last());
            return ie_error_set(IE_ERR_NOMEM, "worker: cannot copy '%s' (%zu bytes) to node %d: %s", name, bytes,
                                node, why);
        }
        size_t k = 0;
        while (w->repl_mem[k]) k++; /* 2 * n_repl slots, at most 2 tensors */
        w->repl_mem[k] = p;
        w->repl_bytes[k] = bytes;
        /* streamed like every weight: huge pages where THP allows
         * (big_alloc's reasoning); then the copy lands on node's pages */
        madvise(p, bytes, MADV_HUGEPAGE);
        memcpy(p, m->data, bytes);
        c[r] = *m;
        c[r].data = p;
        if (m->layout == IE_LAYOUT_BSR && ie_bsr_view(p, bytes, m->n_in, m->n_out, &c[r].bsr, NULL, 0) != 0)
            return ie_error_set(IE_ERR_INTERNAL, "worker: the copy of '%s' is not the blob it copied", name);
    }
    w->hot_copies += w->n_repl;
    return IE_OK;
}

/* Find the pool threads' nodes, then copy the head and the embedding for
 * each node while the cap allows; w->hot_report says what happened. Not
 * asked for: nothing, report "". Fails only on bad settings or memory. */
static ie_status_t hot_setup(ie_worker_t *w)
{
    ie_status_t st = IE_OK;
    int want = 0, fake = 0, n = 0, unpinned = 0;
    double limit_mb = 0;
    const int nt = w->opts.n_threads;
    int *node_of = NULL, *nodes = NULL;
    char a[32], b[32];

    if ((st = hot_env(&w->opts, &want, &limit_mb, &fake)) != IE_OK || !want) return st;
    node_of = malloc((size_t)nt * sizeof *node_of);
    nodes = malloc((size_t)nt * sizeof *nodes);
    w->share_repl = calloc((size_t)nt, sizeof *w->share_repl);
    if (!node_of || !nodes || !w->share_repl) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    /* the node of the thread that runs each share: its pinned CPU's */
    for (int i = 0; i < nt; i++) {
        node_of[i] = fake ? i % fake : ie_numa_node_of_cpu(ie_threadpool_cpu(w->tp, i));
        unpinned |= node_of[i] < 0;
    }
    for (int i = 0; i < nt && !unpinned; i++) {
        int r = 0;
        while (r < n && nodes[r] != node_of[i]) r++;
        if (r == n) nodes[n++] = node_of[i];
        w->share_repl[i] = r;
    }
    if (n < 2) {
        ie_topo_t t;
        const int machine = fake ? fake : ie_topo_read(&t) == IE_OK ? t.n_nodes : 1;
        if (machine <= 1) hot_say(w, "1 node: no replicas needed");
        else if (unpinned) hot_say(w, "%d nodes, but the pool's threads are not pinned: no replicas", machine);
        else hot_say(w, "%d nodes, the pool's %d thread%s on node %d only: no replicas needed", machine, nt,
                     nt == 1 ? "" : "s", nodes[0]);
        goto cleanup;
    }

    w->n_repl = n;
    w->repl_mem = calloc(2 * (size_t)n, sizeof *w->repl_mem);
    w->repl_bytes = calloc(2 * (size_t)n, sizeof *w->repl_bytes);
    if (!w->repl_mem || !w->repl_bytes) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if (fake) hot_say(w, "%d fake nodes (IE_NUMA_FAKE_NODES, copies on node 0), %d threads:", n, nt);
    else {
        hot_say(w, "%d nodes (", n);
        for (int r = 0; r < n; r++) hot_say(w, "%s%d", r ? "," : "", nodes[r]);
        hot_say(w, "), %d threads:", nt);
    }
    if (!w->sh.has_head && !w->sh.has_embed) hot_say(w, " this shard holds neither head nor embedding");
    const double cap = limit_mb * 1048576.0;
    double used = 0;
    const char *sep = w->sh.has_head || w->sh.has_embed ? " " : "; ";
    const int tied = w->sh.has_head && w->sh.has_embed && w->tok_embd.data == w->output.data;
    /* the head first: every token streams all of it */
    for (int which = 0; which < 2; which++) {
        const wmat_t *m = which == 0 ? &w->output : &w->tok_embd;
        const int held = which == 0 ? w->sh.has_head : w->sh.has_embed;
        const char *name = which == 0 ? (w->hp.tied_embeddings ? "token_embd.weight (tied head)" : "output.weight")
                                      : "token_embd.weight";
        if (!held || !m->data) continue;
        if (which == 1 && tied) {
            if (w->head_repl) {
                if (!(w->embd_repl = calloc((size_t)n, sizeof *w->embd_repl))) {
                    st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                    goto cleanup;
                }
                for (int r = 0; r < n; r++) {
                    w->embd_repl[r] = w->tok_embd;
                    w->embd_repl[r].data = w->head_repl[r].data;
                }
                hot_say(w, ", lookups read the head's copies");
            }
            continue;
        }
        const double need = (double)m->slice * (double)m->n_mat * n;
        fmt_size(a, sizeof a, (double)m->slice * (double)m->n_mat);
        if (used + need > cap) {
            fmt_size(b, sizeof b, cap - used);
            hot_say(w, "%sskipped %s: %d x %s, %s of the cap left", sep, name, n, a, b);
            sep = "; ";
            continue;
        }
        if ((st = hot_copy(w, m, nodes, fake, name, which == 0 ? &w->head_repl : &w->embd_repl)) != IE_OK)
            goto cleanup;
        used += need;
        hot_say(w, "%s%s %d x %s", sep, name, n, a);
        sep = "; ";
    }
    fmt_size(a, sizeof a, used);
    fmt_size(b, sizeof b, cap);
    hot_say(w, "%s%s of the %s cap", sep, a, b);

cleanup:
    free(node_of);
    free(nodes);
    return st;
}

/* ---------------------------------------------------- idle prefetch
 *
 * Between decode jobs the owner thread alone does the serial work (norms,
 * activation quantization, rope, residual adds: ~20 us per layer here)
 * while the other threads wait. They spend that wait fetching into their
 * L2 the start of their share of the next matmul, which the owner names
 * before each job (w->pf_next): the share is the static split's, where a
 * balanced matmul (mm_next) begins each thread, so those bytes are not read
 * from DRAM again when the job comes. Each thread keeps how far it got for
 * the matrix it last fetched (a job in between, e.g. attention, resumes
 * it), fetches at most PF_MAX bytes, and stops within 4 KiB of the next
 * job's publication. Weights are read-only after load. */
#define PF_MAX ((size_t)64 << 10)
#define PF_STEP ((size_t)4096)

typedef struct pf_state {
    _Alignas(64) const struct wmat *m; /* the matrix being fetched */
    size_t done;                       /* bytes of the share fetched */
} pf_state_t;

static void worker_idle(void *ctx, int ith, int nth, const ie_threadpool_t *tp, unsigned gen)
{
    ie_worker_t *w = ctx;
    const wmat_t *m = atomic_load_explicit(&w->pf_next, memory_order_relaxed);
    if (!m || !m->data) return;
    size_t unit;
    int64_t units;
    if (m->layout == IE_LAYOUT_PANEL16)
        unit = ie_pack_panel_bytes(m->dtype, m->group, m->n_in);
    else if (m->layout == IE_LAYOUT_ROWS)
        unit = (size_t)IE_PANEL * ie_dtype_row_bytes(m->dtype, m->n_in);
    else
        return;
    units = (m->n_out + IE_PANEL - 1) / IE_PANEL;
    long b, e;
    ie_split_range((long)units, ith, nth, &b, &e);
    if (b >= e || unit == 0) return;
    size_t len = (size_t)(e - b) * unit;
    if (m->layout == IE_LAYOUT_ROWS) { /* the last unit may be short */
        const size_t end = (size_t)m->n_out * ie_dtype_row_bytes(m->dtype, m->n_in);
        len = end - (size_t)b * unit < len ? end - (size_t)b * unit : len;
    }
    if (len > PF_MAX) len = PF_MAX;
    pf_state_t *ps = &w->pf[ith];
    if (ps->m != m) {
        ps->m = m;
        ps->done = 0;
    }
    const char *base = (const char *)m->data + (size_t)b * unit;
    while (ps->done < len && !ie_threadpool_idle_over(tp, gen)) {
        const size_t stop = ps->done + PF_STEP < len ? ps->done + PF_STEP : len;
        for (size_t o = ps->done; o < stop; o += 64) __builtin_prefetch(base + o, 0, 3);
        ps->done = stop;
    }
}

/* Name the matrix the matmul after the next job starts with (NULL: none),
 * for worker_idle. Decode batches only: prefill matmuls are not bound by
 * reading the weights. */
static void pf_set(ie_worker_t *w, const wmat_t *m, int n)
{
    if (w->pf) atomic_store_explicit(&w->pf_next, w->pf_on && n <= 8 ? m : NULL, memory_order_relaxed);
}

/* A decode switch (IE_DECODE_*): on unless the variable is exactly "0". */
static int env_on(const char *name)
{
    const char *e = getenv(name);
    return !(e && e[0] == '0' && e[1] == '\0');
}

ie_status_t ie_worker_new(const ie_model_src_t *src, const ie_worker_opts_t *opts, ie_worker_t **out)
{
    ie_status_t st = IE_OK;
    ie_worker_t *w = NULL;
    char name[96];
    *out = NULL;

    if (!src || !opts) return ie_error_set(IE_ERR_INVAL, "worker: NULL argument");
    if (opts->n_threads < 1 || opts->n_threads > 1024 || opts->n_ctx < 1 || opts->n_seq < 1 ||
        opts->max_batch < 1)
        return ie_error_set(IE_ERR_INVAL, "worker: bad options (threads %d, ctx %d, seq %d, batch %d)",
                            opts->n_threads, opts->n_ctx, opts->n_seq, opts->max_batch);
    if (opts->kv_block < 0 || opts->kv_blocks < 0)
        return ie_error_set(IE_ERR_INVAL, "worker: bad KV pool (block of %d positions, %d blocks)", opts->kv_block,
                            opts->kv_blocks);
    w = calloc(1, sizeof *w);
    if (!w) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    w->hp = *ie_model_src_hparams(src);
    w->opts = *opts;
    const ie_hparams_t *hp = &w->hp;

    w->ops = ie_kernels_get(opts->isa);
    if (!w->ops) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "worker: kernels for ISA '%s' are not available on this CPU",
                          ie_isa_name(opts->isa));
        goto cleanup;
    }
    if ((st = ie_threadpool_new(opts->n_threads, opts->pin_threads, &w->tp)) != IE_OK) goto cleanup;
    w->copy_weights = resolve_copy(opts->copy_weights);
    w->src_file_mapped = ie_model_src_kind(src) == IE_SRC_GGUF || ie_model_src_kind(src) == IE_SRC_IEBIN;
    {
        const char *env = getenv("IE_REPACK");
        w->repack = (env && (env[0] == '0' || env[0] == '1') && !env[1]) ? env[0] == '1' : opts->repack > 0;
        const char *g = getenv("IE_QUANT_GROUP");
        if (g && *g) {
            char *end;
            long v = strtol(g, &end, 10);
            if (*end || v < 32 || v > (1 << 20)) {
                st = ie_error_set(IE_ERR_INVAL, "worker: IE_QUANT_GROUP='%s' is not a group size", g);
                goto cleanup;
            }
            w->opts.quant_group = (int)v;
        }
        const char *qs = getenv("IE_QUANT_SCALE");
        if (qs && *qs) {
            if (strcmp(qs, "absmax") == 0) w->opts.quant_scale = IE_QSCALE_ABSMAX;
            else if (strcmp(qs, "mse") == 0) w->opts.quant_scale = IE_QSCALE_MSE;
            else {
                st = ie_error_set(IE_ERR_INVAL, "worker: IE_QUANT_SCALE='%s' (expected absmax or mse)", qs);
                goto cleanup;
            }
        }
        const char *af = getenv("IE_QUANT_AFFINE");
        if (af && (af[0] == '0' || af[0] == '1') && !af[1]) w->opts.quant_affine = af[0] == '1';
        const char *dir = opts->repack_cache ? opts->repack_cache : getenv("IE_REPACK_CACHE");
        if (dir && *dir) {
            if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                st = ie_error_set(IE_ERR_IO, "worker: cannot create repack cache directory '%s': %s", dir,
                                  strerror(errno));
                goto cleanup;
            }
            if (!(w->cache_dir = strdup(dir))) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
        }
    }
    if (hp->rope_dim <= 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2) {
        st = ie_error_set(IE_ERR_FORMAT, "model: rope dimension %d invalid for head_dim %d", hp->rope_dim,
                          hp->head_dim);
        goto cleanup;
    }

    /* the shard: which layers, heads, columns, experts and vocab rows */
    if ((st = ie_shard_plan(hp, &opts->shard, &w->sh)) != IE_OK) goto cleanup;
    w->tensor_par = opts->shard.kind == IE_SHARD_TENSOR && opts->shard.n_ranks > 1;
    if (w->tensor_par && !opts->reduce) {
        st = ie_error_set(IE_ERR_INVAL, "worker: a tensor-parallel shard of %d ranks needs a reduce callback",
                          opts->shard.n_ranks);
        goto cleanup;
    }
    const ie_shard_range_t *sh = &w->sh;
    const int qgroup = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    w->n_kv_loc = sh->kv_head_end - sh->kv_head_begin;
    w->n_head_loc = sh->head_end - sh->head_begin;
    w->ff_loc = sh->ff_end - sh->ff_begin;
    int64_t d = hp->n_embd, ff = w->ff_loc;
    w->q_dim = w->n_head_loc * hd;
    w->kv_dim = w->n_kv_loc * hd;
    /* this rank's rows of q and of k/v; o takes the q range as columns */
    const int64_t q0 = (int64_t)sh->head_begin * hd, q1 = (int64_t)sh->head_end * hd;
    const int64_t kv0 = (int64_t)sh->kv_head_begin * hd, kv1 = (int64_t)sh->kv_head_end * hd;
    const int64_t qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd;
    const int64_t nv_loc = sh->vocab_end - sh->vocab_begin;

    /* Embeddings are read a row at a time (dequantized on lookup), so they
     * keep the file's type whatever the precision — unless they are tied
     * and the output head converted them whole, then lookups read the head.
     * Only ranks that embed (or whose head is the tied embedding) need it. */
    const ie_tensor_t *te = NULL;
    if (sh->has_embed || (sh->has_head && hp->tied_embeddings)) {
        te = ie_model_src_tensor(src, "token_embd.weight");
        if (!te) {
            st = ie_error_set(IE_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
            goto cleanup;
        }
        if (!dtype_computable(te->dtype) || te->layout == IE_LAYOUT_BSR || te->ne[0] != d ||
            te->ne[1] != hp->n_vocab ||
            ie_tensor_bytes(te->dtype, te->layout, te->group, d, hp->n_vocab) == 0 ||
            ie_tensor_bytes(te->dtype, te->layout, te->group, d, hp->n_vocab) > te->nbytes) {
            st = ie_error_set(IE_ERR_FORMAT,
                              "model: tensor 'token_embd.weight' is %s/%s [%lld, %lld], expected a dense [%lld, %d]",
                              ie_dtype_name(te->dtype), ie_layout_name(te->layout), (long long)te->ne[0],
                              (long long)te->ne[1], (long long)d, hp->n_vocab);
            goto cleanup;
        }
        if (sh->has_embed)
            w->tok_embd = (wmat_t){.dtype = te->dtype, .layout = te->layout, .group = te->group, .data = te->data,
                                   .n_in = d, .n_out = hp->n_vocab, .n_mat = 1,
                                   .slice = ie_tensor_bytes(te->dtype, te->layout, te->group, d, hp->n_vocab)};
    }
    if (sh->has_head) {
        const cut_t hc = {sh->vocab_begin, sh->vocab_end, 0, d, 0, 1};
        const int whole_head = nv_loc == hp->n_vocab;
        w->binding_head = 1;
        /* a sliced tied head must not drop the pages the lookups read */
        st = bind_cut(w, src, hp->tied_embeddings ? "token_embd.weight" : "output.weight", d, hp->n_vocab, 1, &hc,
                      hp->tied_embeddings && sh->has_embed && !whole_head, &w->output);
        w->binding_head = 0;
        if (st != IE_OK) goto cleanup;
        if (hp->tied_embeddings && sh->has_embed && whole_head && w->output.data != te->data)
            w->tok_embd = w->output;
        if ((st = bind_vec(w, src, "output_norm.weight", d, &w->output_norm)) != IE_OK) goto cleanup;
    }

    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    int moe = hp->n_expert > 0;
    int64_t E = moe ? hp->n_expert : 1;
    if (moe && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)) {
        st = ie_error_set(IE_ERR_FORMAT, "model: %d experts used of %d", hp->n_expert_used, hp->n_expert);
        goto cleanup;
    }
    const int64_t e0 = moe ? sh->expert_begin : 0, e1 = moe ? sh->expert_end : 1;
    for (int l = sh->layer_begin; l < sh->layer_end; l++) {
        layer_t *L = &w->layers[l];
#define BIND_CUT(field, suffix, nin, nout, nmat, ...)                                     \
        snprintf(name, sizeof name, "blk.%d." suffix ".weight", l);                       \
        if ((st = bind_cut(w, src, name, nin, nout, nmat, &(const cut_t){__VA_ARGS__}, 0, &L->field)) != IE_OK) \
            goto cleanup;
#define BIND_VEC(field, suffix, n, n1)                                            \
        snprintf(name, sizeof name, "blk.%d." suffix, l);                         \
        if ((st = bind_vec2(w, src, name, n, n1, &L->field)) != IE_OK) goto cleanup;
        BIND_VEC(attn_norm, "attn_norm.weight", d, 1);
        BIND_CUT(q, "attn_q", d, qd, 1, q0, q1, 0, d, 0, 1);
        BIND_CUT(k, "attn_k", d, kvd, 1, kv0, kv1, 0, d, 0, 1);
        BIND_CUT(v, "attn_v", d, kvd, 1, kv0, kv1, 0, d, 0, 1);
        BIND_CUT(o, "attn_output", qd, d, 1, 0, d, q0, q1, 0, 1);
        if (hp->attn_bias) {
            /* biases follow their matrices' rows; o's bias is added once,
             * by the first rank, before the sum across ranks */
            BIND_VEC(bq, "attn_q.bias", qd, 1);
            BIND_VEC(bk, "attn_k.bias", kvd, 1);
            BIND_VEC(bv, "attn_v.bias", kvd, 1);
            L->bq += q0;
            L->bk += kv0;
            L->bv += kv0;
            if (sh->head_begin == 0) {
                BIND_VEC(bo, "attn_output.bias", d, 1);
            }
        }
        if (hp->attn_sinks) {
            BIND_VEC(sinks, "attn_sinks.weight", hp->n_head, 1);
            L->sinks += sh->head_begin;
        }
        L->swa = hp->sliding_window > 0 && hp->layer_swa[l];
        if (!moe) {
            BIND_VEC(ffn_norm, "ffn_norm.weight", d, 1);
            BIND_CUT(gate, "ffn_gate", d, hp->n_ff, 1, sh->ff_begin, sh->ff_end, 0, d, 0, 1);
            BIND_CUT(up, "ffn_up", d, hp->n_ff, 1, sh->ff_begin, sh->ff_end, 0, d, 0, 1);
            BIND_CUT(down, "ffn_down", hp->n_ff, d, 1, 0, d, sh->ff_begin, sh->ff_end, 0, 1);
        } else {
            /* the router stays whole (every rank selects the same top-k);
             * the expert stacks keep this rank's experts */
            BIND_VEC(ffn_norm, "post_attention_norm.weight", d, 1);
            BIND_CUT(router, "ffn_gate_inp", d, E, 1, 0, E, 0, d, 0, 1);
            BIND_VEC(router_b, "ffn_gate_inp.bias", E, 1);
            BIND_CUT(gate, "ffn_gate_exps", d, ff, E, 0, ff, 0, d, e0, e1);
            BIND_CUT(up, "ffn_up_exps", d, ff, E, 0, ff, 0, d, e0, e1);
            BIND_CUT(down, "ffn_down_exps", ff, d, E, 0, d, 0, ff, e0, e1);
            BIND_VEC(gate_b, "ffn_gate_exps.bias", ff, E);
            BIND_VEC(up_b, "ffn_up_exps.bias", ff, E);
            BIND_VEC(down_b, "ffn_down_exps.bias", d, E);
            L->gate_b += e0 * ff;
            L->up_b += e0 * ff;
            L->down_b += e0 * d;
        }
#undef BIND_CUT
#undef BIND_VEC
    }

    /* KV cache (held layers and heads only): the block pool, the tables */
    w->kv_block = opts->kv_block > 0 ? opts->kv_block : 16;
    w->kv_nlb = (int)(((int64_t)opts->n_ctx + w->kv_block - 1) / w->kv_block);
    const int64_t full_pool = (int64_t)opts->n_seq * w->kv_nlb;
    if (opts->kv_blocks == 0 && full_pool > INT32_MAX) {
        st = ie_error_set(IE_ERR_INVAL, "worker: %d slots of %d KV blocks do not fit a block id", opts->n_seq,
                          w->kv_nlb);
        goto cleanup;
    }
    w->kv_blocks = opts->kv_blocks > 0 ? opts->kv_blocks : (int)full_pool;
    w->opts.kv_block = w->kv_block;
    w->opts.kv_blocks = w->kv_blocks;
    w->all_swa = sh->layer_end > sh->layer_begin;
    for (int l = sh->layer_begin; l < sh->layer_end; l++) w->all_swa &= w->layers[l].swa;
    size_t B = (size_t)opts->max_batch;
    const uint64_t kv_floats = (uint64_t)(sh->layer_end - sh->layer_begin) * (uint64_t)w->kv_blocks *
                               (uint64_t)w->kv_block * (uint64_t)w->kv_dim;
    if (kv_floats > (uint64_t)SIZE_MAX / 8) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory: a KV cache of %d blocks of %d positions is too large",
                          w->kv_blocks, w->kv_block);
        goto cleanup;
    }
    w->kv_layer_stride = (size_t)w->kv_block * (size_t)w->kv_dim;
    w->kv_block_stride = (size_t)(sh->layer_end - sh->layer_begin) * w->kv_layer_stride;
    size_t kv_bytes = (size_t)kv_floats * sizeof(float);
    size_t wide = (size_t)(d > w->q_dim ? d : w->q_dim);
    int64_t max_in = ff > (int64_t)wide ? ff : (int64_t)wide;
    w->act_row_cap = ie_dtype_row_bytes(IE_DTYPE_Q16_P, (max_in + 31) / 32 * 32); /* the widest act row */
    int half = hp->rope_dim / 2;
    /* Block-major and on huge pages. Decode reads a head's rows out of
     * every cached position of a layer, ~1 KiB apart: on 4 KiB pages a TLB
     * miss every few rows, its page walk from DRAM (the weight stream
     * evicts the tables), and the hardware prefetchers stop at every page.
     * Measured (Q4_0 TinyLlama shape, 2 threads, 1016 positions,
     * alternating runs): 71-75 t/s against 66-68 in the high-bandwidth
     * phase (0.75-0.79 of the paired read against 0.70), 0.87-0.88 against
     * 0.83-0.86 in the low. Block-major keeps the cost of huge pages
     * small: a block holds every held layer, so the first write into a
     * 2 MiB region commits blocks of all layers at once (a fresh slot: 2 MiB
     * per cache), where a layer-major cache committed 2 MiB per layer. */
    w->kcache = big_alloc(kv_bytes ? kv_bytes : 1);
    w->vcache = big_alloc(kv_bytes ? kv_bytes : 1);
    w->seq_len = calloc((size_t)opts->n_seq, sizeof(int));
    w->btab = malloc((size_t)full_pool * sizeof(int32_t));
    w->rope_cos = malloc((size_t)opts->n_ctx * half * sizeof(float));
    w->rope_sin = malloc((size_t)opts->n_ctx * half * sizeof(float));
    w->x = big_alloc(B * d * sizeof(float));
    w->xb = big_alloc(B * wide * sizeof(float));
    w->q = big_alloc(B * w->q_dim * sizeof(float));
    w->k = big_alloc(B * w->kv_dim * sizeof(float));
    w->v = big_alloc(B * w->kv_dim * sizeof(float));
    w->hb = big_alloc(B * ff * sizeof(float));
    w->hb2 = big_alloc(B * ff * sizeof(float));
    w->tmp = big_alloc(B * d * sizeof(float));
    w->act = big_alloc(B * w->act_row_cap);
    w->spans = big_alloc(MM_SPANS_PER_THREAD * (size_t)opts->n_threads * sizeof *w->spans);
    w->balance = env_on("IE_DECODE_BALANCE");
    w->stream_act = env_on("IE_DECODE_STREAM");
    w->kvpf_on = env_on("IE_DECODE_KVPREFETCH");
    w->pf_on = env_on("IE_DECODE_PREFETCH");
    {
        atomic_init(&w->pf_next, NULL);
        if (opts->n_threads > 1) {
            w->pf = big_alloc((size_t)opts->n_threads * sizeof *w->pf);
            if (!w->pf) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory: worker scratch");
                goto cleanup;
            }
            w->idle_hook = (ie_idle_t){worker_idle, w};
            ie_threadpool_set_idle(w->tp, &w->idle_hook);
        }
    }
    w->scores = big_alloc((size_t)opts->n_threads * (size_t)qgroup * opts->n_ctx * sizeof(float));
    if (moe) {
        int k = hp->n_expert_used;
        w->xg = big_alloc(B * d * sizeof(float));
        w->moe = big_alloc(B * d * sizeof(float));
        w->rlog = big_alloc(B * E * sizeof(float));
        w->sel = big_alloc(B * k * sizeof(int32_t));
        w->selw = big_alloc(B * k * sizeof(float));
        w->rows = big_alloc(B * sizeof(int32_t));
        w->roww = big_alloc(B * sizeof(float));
        if (!w->xg || !w->moe || !w->rlog || !w->sel || !w->selw || !w->rows || !w->roww) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory allocating MoE scratch");
            goto cleanup;
        }
    }
    if (!w->kcache || !w->vcache || !w->seq_len || !w->btab || !w->rope_cos || !w->rope_sin || !w->x || !w->xb ||
        !w->q || !w->k || !w->v || !w->hb || !w->hb2 || !w->tmp || !w->act || !w->scores || !w->spans) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory allocating KV cache (%zu bytes) and scratch", 2 * kv_bytes);
        goto cleanup;
    }
    /* a pool with room for every slot's whole context starts as the
     * unpaged cache (slot s owns blocks s*kv_nlb ..); a smaller one unbound */
    for (int64_t i = 0; i < full_pool; i++) w->btab[i] = w->kv_blocks >= full_pool ? (int32_t)i : -1;
    rope_tables(w);
    st = hot_setup(w); /* after every weight is bound */

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
    for (size_t i = 0; i < w->n_owned; i++) big_free(w->owned[i]);
    free(w->owned);
    for (int i = 0; w->repl_mem && i < 2 * w->n_repl; i++) ie_numa_free(w->repl_mem[i], w->repl_bytes[i]);
    free(w->repl_mem);
    free(w->repl_bytes);
    free(w->head_repl);
    free(w->embd_repl);
    free(w->share_repl);
    free(w->cache_dir);
    free(w->layers);
    big_free(w->kcache);
    big_free(w->vcache);
    free(w->seq_len);
    free(w->btab);
    free(w->rope_cos);
    free(w->rope_sin);
    big_free(w->x);
    big_free(w->xb);
    big_free(w->q);
    big_free(w->k);
    big_free(w->v);
    big_free(w->hb);
    big_free(w->hb2);
    big_free(w->tmp);
    big_free(w->act);
    big_free(w->spans);
    big_free(w->pf);
    big_free(w->scores);
    big_free(w->xg);
    big_free(w->moe);
    big_free(w->rlog);
    big_free(w->sel);
    big_free(w->selw);
    big_free(w->rows);
    big_free(w->roww);
    free(w);
    *self_p = NULL;
}

/* ------------------------------------------------------------- matmuls */

#define MM_MAX MM_SPANS_PER_THREAD

/* Work each thread does before its share of a matmul job. */
typedef struct mm_pre {
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
} mm_pre_t;

typedef struct mm_task {
    const ie_kernels_t *ops;
    int nm;
    const wmat_t *m[MM_MAX];
    float *y[MM_MAX];       /* [n_tok][m->n_out]                           */
    _Atomic int failed;
    const wmat_t *rep[MM_MAX]; /* per-node copies of m[i] (NULL: none)    */
    const int *share_repl;     /* [nth] the copy share ith reads          */
    const void *act;
    size_t act_stride;
    int n_tok;
    mm_span_t *spans; /* non-NULL: balanced (spans[i * nth + t]: matrix i, thread t) */
    int64_t chunk;    /* panels a steal takes */
    mm_pre_t pre; /* run by every thread before its share (fn NULL: nothing) */
} mm_task_t;

/* Balanced decode matmuls (PANEL16 and ROWS matrices; rows go in units of
 * IE_PANEL). Every thread starts on its static share of each
 * matrix (whole panels, as the unbalanced split), claiming it from the
 * front in shrinking pieces (half of what is left, at least `chunk`); once
 * its share is empty it takes `chunk` panels at a time from the back of the
 * others' shares of the same matrix, so both finish within about a chunk of
 * each other, while each thread still streams its own share front to back
 * (a steal reads the far end). Measured on this 2-core VM: per decode
 * matmul the two halves' times differ by ~10-15% in either direction, at
 * random (the pool's join waited ~15-30 us per job). */
typedef struct mm_src {
    mm_task_t *t;
    int i, ith, nth;
    int own_done;
} mm_src_t;

static int mm_next(void *ctx, int64_t *p0, int64_t *p1)
{
    mm_src_t *s = ctx;
    mm_span_t *sp = s->t->spans + (size_t)s->i * (size_t)s->nth;
    const uint64_t c = (uint64_t)s->t->chunk;
    if (!s->own_done) {
        _Atomic uint64_t *a = &sp[s->ith].span;
        uint64_t v = atomic_load_explicit(a, memory_order_relaxed);
        for (;;) {
            const uint64_t f = v & 0xffffffffu, b = v >> 32;
            if (f >= b) break;
            uint64_t n = (b - f) / 2;
            if (n < c) n = c;
            if (n > b - f) n = b - f;
            if (atomic_compare_exchange_weak_explicit(a, &v, (f + n) | (b << 32), memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *p0 = (int64_t)f;
                *p1 = (int64_t)(f + n);
                return 1;
            }
        }
        s->own_done = 1;
    }
    for (int k = 1; k < s->nth; k++) {
        _Atomic uint64_t *a = &sp[(s->ith + k) % s->nth].span;
        uint64_t v = atomic_load_explicit(a, memory_order_relaxed);
        for (;;) {
            const uint64_t f = v & 0xffffffffu, b = v >> 32;
            if (f >= b) break;
            const uint64_t n = c < b - f ? c : b - f;
            if (atomic_compare_exchange_weak_explicit(a, &v, f | ((b - n) << 32), memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *p0 = (int64_t)(b - n);
                *p1 = (int64_t)b;
                return 1;
            }
        }
    }
    return 0;
}

static void mm_run(void *ctx, int ith, int nth)
{
    mm_task_t *t = ctx;
    if (t->pre.fn) t->pre.fn(t->pre.ctx, ith, nth);
    for (int i = 0; i < t->nm; i++) {
        const wmat_t *m = t->rep[i] ? &t->rep[i][t->share_repl[ith]] : t->m[i]; /* same bytes */
        long b, e;
        if (m->layout == IE_LAYOUT_PANEL16 && t->spans) {
            mm_src_t src = {t, i, ith, nth, 0};
            ie_pmat_t pm = {m->dtype, m->group, m->n_in, m->n_out, m->data};
            if (t->ops->matmul_packed_ranges(&pm, mm_next, &src, t->act, t->act_stride, t->n_tok, t->y[i],
                                             m->n_out) != 0)
                t->failed = 1;
        } else if (m->layout == IE_LAYOUT_PANEL16) {
            /* whole panels per thread */
            ie_split_range((long)((m->n_out + IE_PANEL - 1) / IE_PANEL), ith, nth, &b, &e);
            b *= IE_PANEL;
            e = e * IE_PANEL < m->n_out ? e * IE_PANEL : (long)m->n_out;
            if (b >= e) continue;
            ie_pmat_t pm = {m->dtype, m->group, m->n_in, m->n_out, m->data};
            if (t->ops->matmul_packed(&pm, b, e, t->act, t->act_stride, t->n_tok, t->y[i], m->n_out) != 0)
                t->failed = 1;
        } else if (m->layout == IE_LAYOUT_BSR) {
            ie_split_range((long)(m->n_out / m->bsr.br), ith, nth, &b, &e);
            if (b < e)
                t->ops->matmul_bsr(&m->bsr, b * m->bsr.br, e * m->bsr.br, t->act, t->act_stride / sizeof(float),
                                   t->n_tok, t->y[i], m->n_out);
        } else if (t->spans) {
            /* rows in units of IE_PANEL, through the same claims */
            mm_src_t src = {t, i, ith, nth, 0};
            int64_t p0, p1;
            while (mm_next(&src, &p0, &p1)) {
                const int64_t r1 = p1 * IE_PANEL < m->n_out ? p1 * IE_PANEL : m->n_out;
                if (ie_kernels_matmul(t->ops, m->dtype, m->data, m->n_in, p0 * IE_PANEL, r1, t->act, t->act_stride, t->n_tok,
                                   t->y[i], m->n_out) != 0)
                    t->failed = 1;
            }
        } else {
            /* 16-row units, as the balanced claims cut rows: a row's sum
             * then does not depend on which of the two ran it */
            ie_split_range((long)((m->n_out + IE_PANEL - 1) / IE_PANEL), ith, nth, &b, &e);
            b *= IE_PANEL;
            e = e * IE_PANEL < m->n_out ? e * IE_PANEL : (long)m->n_out;
            if (b < e &&
                ie_kernels_matmul(t->ops, m->dtype, m->data, m->n_in, b, e, t->act, t->act_stride, t->n_tok, t->y[i],
                               m->n_out) != 0)
                t->failed = 1;
        }
    }
}

typedef struct q_task {
    const ie_kernels_t *ops;
    int stream; /* act_quantize_stream (decode: rows the other threads read) */
    ie_dtype_t act;
    const float *x;
    int64_t n_in;
    void *out;
    size_t out_stride;
    int n_tok;
} q_task_t;

static void q_run(void *ctx, int ith, int nth)
{
    q_task_t *t = ctx;
    long b, e;
    ie_split_range(t->n_tok, ith, nth, &b, &e);
    for (long i = b; i < e; i++)
        (t->stream ? t->ops->act_quantize_stream : t->ops->act_quantize)(
            t->act, t->x + (size_t)i * t->n_in, (char *)t->out + (size_t)i * t->out_stride, t->n_in);
}

/* y_i = m_i · x for up to MM_MAX matrices sharing the input x [n][n_in].
 * Matrices whose kernels want different activation formats run in
 * separate passes. rep: NULL, or per matrix NULL or its per-node copies
 * (share ith reads rep[i][w->share_repl[ith]]). */
static void matmul_rep(ie_worker_t *w, int nm, const wmat_t *const *m, const wmat_t *const *rep,
                       float *const *y, const float *x, int n, const mm_pre_t *pre)
{
    int done[MM_MAX] = {0};
    const int nth = ie_threadpool_size(w->tp);
    for (int i = 0; i < nm; i++) {
        if (done[i]) continue;
        ie_dtype_t act = ie_matmul_act_dtype(m[i]->dtype);
        int64_t n_in = m[i]->n_in;
        mm_task_t t = {.ops = w->ops, .n_tok = n, .share_repl = w->share_repl};
        if (pre) { /* in the first job */
            t.pre = *pre;
            pre = NULL;
        }
        for (int j = i; j < nm; j++) {
            if (!done[j] && ie_matmul_act_dtype(m[j]->dtype) == act) {
                t.m[t.nm] = m[j];
                t.rep[t.nm] = rep ? rep[j] : NULL;
                t.y[t.nm] = y[j];
                t.nm++;
                done[j] = 1;
            }
        }
        if (act == IE_DTYPE_F32) {
            t.act = x;
            t.act_stride = (size_t)n_in * sizeof(float);
        } else {
            /* decode rows go around this core's caches (act_quantize_stream):
             * the other threads read the buffer in the last matmul */
            const int stream = w->stream_act && n <= 8 && nth > 1;
            q_task_t q = {w->ops, stream, act, x, n_in, w->act, ie_dtype_row_bytes(act, n_in), n};
            if (n >= 8)
                ie_threadpool_run(w->tp, q_run, &q);
            else
                q_run(&q, 0, 1);
            t.act = w->act;
            t.act_stride = q.out_stride;
        }
        if (w->balance && nth > 1 && n <= 8) {
            int bsr = 0;
            for (int k = 0; k < t.nm; k++) bsr += t.m[k]->layout == IE_LAYOUT_BSR;
            if (!bsr) {
                t.spans = w->spans;
                /* a steal: ~48 KiB of the first matrix's panels (rows: 16) */
                const wmat_t *m0 = t.m[0];
                const size_t pb = m0->layout == IE_LAYOUT_PANEL16
                                      ? ie_pack_panel_bytes(m0->dtype, m0->group, m0->n_in)
                                      : (size_t)IE_PANEL * ie_dtype_row_bytes(m0->dtype, m0->n_in);
                t.chunk = pb ? (int64_t)((48u << 10) / pb) : 1;
                if (t.chunk < 1) t.chunk = 1;
                for (int k = 0; k < t.nm; k++) {
                    const long np = (long)((t.m[k]->n_out + IE_PANEL - 1) / IE_PANEL);
                    for (int th = 0; th < nth; th++) {
                        long b, e;
                        ie_split_range(np, th, nth, &b, &e);
                        atomic_store_explicit(&w->spans[(size_t)k * (size_t)nth + (size_t)th].span,
                                              (uint64_t)b | ((uint64_t)e << 32), memory_order_relaxed);
                    }
                }
            }
        }
        ie_threadpool_run(w->tp, mm_run, &t);
    }
}

static void matmul_group(ie_worker_t *w, int nm, const wmat_t *const *m, float *const *y, const float *x,
                         int n)
{
    matmul_rep(w, nm, m, NULL, y, x, n, NULL);
}

static void matmul1(ie_worker_t *w, const wmat_t *m, float *y, const float *x, int n)
{
    const wmat_t *ms[1] = {m};
    float *ys[1] = {y};
    matmul_group(w, 1, ms, ys, x, n);
}

/* ----------------------------------------------------------- attention */

typedef struct att_task {
    ie_worker_t *w;
    const ie_batch_t *b;
    int layer;
    int sg; /* query heads per unit (a share of one KV head's group) */
} att_task_t;

/* Unit u of an attention job (att_run's numbering): token i, held KV head
 * kh, query heads h0 .. h0+nh-1 (local numbers), the visible positions
 * j0 .. j0+cnt-1 and the K and V rows of its slot. Returns 0 for a unit
 * with no query heads (the last share of a group cut between ranks). */
typedef struct att_unit {
    int i, kh, h0, nh, j0, cnt;
    ie_attn_rows_t kr, vr;
} att_unit_t;

static int att_unit(const att_task_t *t, long u, att_unit_t *a)
{
    const ie_worker_t *w = t->w;
    const ie_hparams_t *hp = &w->hp;
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv, nsub = (group + t->sg - 1) / t->sg;
    a->i = (int)(u / (w->n_kv_loc * nsub));
    const int r = (int)(u % (w->n_kv_loc * nsub));
    a->kh = r / nsub;
    /* this KV head's query heads held here (local numbers): a whole
     * group, or the part of a group cut between two ranks */
    const int kg = w->sh.kv_head_begin + a->kh;
    const int qa = kg * group > w->sh.head_begin ? kg * group : w->sh.head_begin;
    const int qe = (kg + 1) * group < w->sh.head_end ? (kg + 1) * group : w->sh.head_end;
    a->h0 = qa - w->sh.head_begin + (r % nsub) * t->sg;
    const int hend = qe - w->sh.head_begin;
    if (a->h0 >= hend) return 0;
    a->nh = hend - a->h0 < t->sg ? hend - a->h0 : t->sg;
    const int seq = t->b->seq[a->i], pos = t->b->pos[a->i];
    /* a sliding layer sees the last W positions, itself included */
    a->j0 = w->layers[t->layer].swa && pos >= hp->sliding_window ? pos - hp->sliding_window + 1 : 0;
    a->cnt = pos + 1 - a->j0;
    /* this head's rows of the slot's blocks (ie_attn.h's paged view) */
    const size_t head = (size_t)(t->layer - w->sh.layer_begin) * w->kv_layer_stride + (size_t)a->kh * hd;
    const int32_t *tab = w->btab + (size_t)seq * w->kv_nlb;
    a->kr = (ie_attn_rows_t){w->kcache + head, (size_t)w->kv_dim, tab, w->kv_block, w->kv_block_stride};
    a->vr = (ie_attn_rows_t){w->vcache + head, (size_t)w->kv_dim, tab, w->kv_block, w->kv_block_stride};
    return 1;
}

/* Units per attention job (att_run deals them round-robin). */
static long att_units(const att_task_t *t)
{
    const ie_hparams_t *hp = &t->w->hp;
    const int group = hp->n_head / hp->n_head_kv, nsub = (group + t->sg - 1) / t->sg;
    return (long)t->b->n * t->w->n_kv_loc * nsub;
}

/* One (token, held KV head, share of its query heads) per unit of work: the
 * shared K and V rows are read once for all those heads (GQA), scores over
 * the slot's cache up to the token's position, softmax, weighted sum of
 * values into xb. The kernels read the slot's rows through its block table
 * (a paged view, ie_attn.h) with the arithmetic of a contiguous pass, so
 * any block size and placement gives the same bits. Units are dealt
 * round-robin: a causal prefill's later tokens cost more, contiguous shares
 * would leave the first thread idle. */
static void att_run(void *ctx, int ith, int nth)
{
    att_task_t *t = ctx;
    ie_worker_t *w = t->w;
    const ie_hparams_t *hp = &w->hp;
    const layer_t *L = &w->layers[t->layer];
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const size_t ld = (size_t)w->opts.n_ctx;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = w->scores + (size_t)ith * (size_t)group * ld;
    const long units = att_units(t);
    att_unit_t a;
    for (long u = ith; u < units; u += nth) {
        if (!att_unit(t, u, &a)) continue;
        const float *q = w->q + (size_t)a.i * w->q_dim + (size_t)a.h0 * hd;
        w->ops->attn_scores(q, (size_t)hd, a.nh, &a.kr, a.j0, a.cnt, hd, scale, scores, ld);
        for (int hh = 0; hh < a.nh; hh++)
            w->ops->softmax(scores + (size_t)hh * ld, a.cnt, L->sinks ? &L->sinks[a.h0 + hh] : NULL);
        w->ops->attn_values(scores, ld, a.nh, &a.vr, a.j0, a.cnt, hd, w->xb + (size_t)a.i * w->q_dim + (size_t)a.h0 * hd,
                        (size_t)hd);
    }
}

/* Every 64-byte line of [p, p + n), into L2. */
static void prefetch_l2(const void *p, size_t n)
{
    const uintptr_t a = (uintptr_t)p, e = a + n;
    for (uintptr_t l = a & ~(uintptr_t)63; l < e; l += 64) __builtin_prefetch((const void *)l, 0, 2);
}

/* Decode: fetch into L2 the cached K and V rows that att_run's share ith
 * will read after this matmul job, the token's own row left out (the owner
 * writes it after the job). Run by every thread before its share of the
 * q/k/v matmul: a decode step's cache rows are read once per layer, a
 * head's hd floats out of every kv_dim, from DRAM (the weights stream
 * evicts them), and that scattered read ran latency-bound in att_run; as
 * prefetches ahead of the matmul's stream they cost the bandwidth of their
 * bytes and are still in L2 (the job streams ~0.7 MB a thread for
 * TinyLlama) when attention runs. At most KVPF_MAX bytes, the first rows
 * (attention's own prefetch streams the rest): at 1000 positions the whole
 * share (~1 MB a thread) measured slightly slower than none. In-run A/B
 * (bench_decode --ab kvprefetch, Q4_0 TinyLlama shape, ~150 positions):
 * +0.017 to +0.027 of the paired read in the high-bandwidth phase. */
#define KVPF_MAX ((size_t)256 << 10) /* bytes a thread fetches ahead */
static void att_prefetch(void *ctx, int ith, int nth)
{
    const att_task_t *t = ctx;
    const size_t row_bytes = (size_t)t->w->hp.head_dim * sizeof(float);
    const long units = att_units(t);
    size_t left = KVPF_MAX;
    att_unit_t a;
    for (long u = ith; u < units; u += nth) {
        if (!att_unit(t, u, &a)) continue;
        ie_attn_cursor_t ck, cv;
        ie_attn_cursor_init(&ck, &a.kr, a.j0);
        ie_attn_cursor_init(&cv, &a.vr, a.j0);
        for (int j = 0; j + 1 < a.cnt && left >= 2 * row_bytes; j++, left -= 2 * row_bytes) {
            prefetch_l2(ie_attn_cursor_next(&ck), row_bytes);
            prefetch_l2(ie_attn_cursor_next(&cv), row_bytes);
        }
    }
}

/* hb = silu(hb) * hb2 over n elements, split across the pool when large. */
typedef struct swiglu_task {
    const ie_kernels_t *vec;
    float *g;
    const float *u;
    int64_t n;
} swiglu_task_t;

static void swiglu_run(void *ctx, int ith, int nth)
{
    swiglu_task_t *t = ctx;
    long b, e;
    ie_split_range((long)((t->n + 15) / 16), ith, nth, &b, &e); /* whole vectors per thread */
    int64_t i0 = (int64_t)b * 16, i1 = (int64_t)e * 16 < t->n ? (int64_t)e * 16 : t->n;
    if (i0 < i1) t->vec->swiglu(t->g + i0, t->g + i0, t->u + i0, i1 - i0);
}

static void swiglu_par(ie_worker_t *w, float *g, const float *u, int64_t n)
{
    swiglu_task_t t = {w->ops, g, u, n};
    if (n >= 16384)
        ie_threadpool_run(w->tp, swiglu_run, &t);
    else
        swiglu_run(&t, 0, 1);
}

/* Query heads per attention unit: a whole KV group unless that leaves the
 * pool short of work (a decode step of few KV heads), then halves. */
static int att_share(const ie_worker_t *w, int n)
{
    const int group = w->hp.n_head / w->hp.n_head_kv, nth = w->opts.n_threads;
    int sg = group;
    while (nth > 1 && sg > 1 && (long)n * w->n_kv_loc * ((group + sg - 1) / sg) < 2L * nth) sg = (sg + 1) / 2;
    return sg;
}

/* ----------------------------------------------------------------- MoE */

static void add_bias(float *y, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += b[i];
}

/* Expert e of a bound expert stack, as a plain matrix. */
static wmat_t expert_mat(const wmat_t *m, int e)
{
    wmat_t r = *m;
    r.data = (const char *)m->data + (size_t)e * m->slice;
    return r;
}

/* GPT-OSS mixture of experts on w->xb [n][d] into w->moe [n][d]
 * (docs/GPTOSS.md 2.3): router logits + bias, top-k, softmax over the k
 * selected logits; each used expert runs once over all its tokens (matrix
 * work in prefill): gate/up + biases, gate clamped above and up on both
 * sides at the limit, (up + 1) * gate * sigmoid(alpha * gate), down + bias,
 * weighted into the output. A tensor-parallel rank runs only its experts
 * (the top-k is over all of them, the same on every rank), so its output
 * is its share of the sum. */
static void moe_forward(ie_worker_t *w, const layer_t *L, int n)
{
    const ie_hparams_t *hp = &w->hp;
    int d = hp->n_embd, ff = hp->n_ff, E = hp->n_expert, k = hp->n_expert_used;
    const int e0 = w->sh.expert_begin, e1 = w->sh.expert_end; /* experts held */
    float limit = hp->swiglu_limit, alpha = hp->swiglu_alpha;

    matmul1(w, &L->router, w->rlog, w->xb, n);
    for (int i = 0; i < n; i++) {
        float *r = w->rlog + (size_t)i * E;
        int32_t *sel = w->sel + (size_t)i * k;
        float *sw = w->selw + (size_t)i * k;
        add_bias(r, L->router_b, E);
        /* top-k by value, ties to the lower expert id */
        for (int t = 0; t < k; t++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int u = 0; u < t; u++) taken |= sel[u] == e;
                if (!taken && (best < 0 || r[e] > r[best])) best = e;
            }
            sel[t] = best;
            sw[t] = r[best];
        }
        ie_softmax_f32(sw, k);
    }
    memset(w->moe, 0, (size_t)n * d * sizeof(float));
    for (int e = e0; e < e1; e++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            for (int t = 0; t < k; t++)
                if (w->sel[(size_t)i * k + t] == e) {
                    w->rows[m] = i;
                    w->roww[m] = w->selw[(size_t)i * k + t];
                    memcpy(w->xg + (size_t)m * d, w->xb + (size_t)i * d, (size_t)d * sizeof(float));
                    m++;
                }
        if (m == 0) continue;
        wmat_t g = expert_mat(&L->gate, e - e0), u = expert_mat(&L->up, e - e0), dn = expert_mat(&L->down, e - e0);
        const wmat_t *ms[2] = {&g, &u};
        float *ys[2] = {w->hb, w->hb2};
        matmul_group(w, 2, ms, ys, w->xg, m);
        const float *gb = L->gate_b + (size_t)(e - e0) * ff, *ub = L->up_b + (size_t)(e - e0) * ff;
        for (int r = 0; r < m; r++) {
            float *gr = w->hb + (size_t)r * ff, *ur = w->hb2 + (size_t)r * ff;
            for (int j = 0; j < ff; j++) {
                float gv = gr[j] + gb[j], uv = ur[j] + ub[j];
                gv = gv > limit ? limit : gv;
                uv = uv > limit ? limit : uv < -limit ? -limit : uv;
                gr[j] = (uv + 1.0f) * (gv / (1.0f + expf(-alpha * gv)));
            }
        }
        matmul1(w, &dn, w->tmp, w->hb, m);
        const float *db = L->down_b + (size_t)(e - e0) * d;
        for (int r = 0; r < m; r++) {
            float *y = w->tmp + (size_t)r * d, *o = w->moe + (size_t)w->rows[r] * d, wt = w->roww[r];
            for (int j = 0; j < d; j++) o[j] += wt * (y[j] + db[j]);
        }
    }
}

/* ---------------------------------------------------------------- step */

/* Sum a tensor-parallel partial result across ranks (no-op otherwise). */
static ie_status_t reduce(ie_worker_t *w, int *index, float *buf, size_t n)
{
    if (!w->tensor_par) return IE_OK;
    return w->opts.reduce(w->opts.reduce_ctx, (*index)++, buf, n); /* its message kept */
}

/* The forward pass of every step entry point: hidden_in (NULL: embed the
 * tokens), this shard's layers, hidden_out, then the head; `layers`
 * (ie_worker_step_hidden) gets the residual stream after each held layer. */
static ie_status_t step_run(ie_worker_t *w, const ie_batch_t *b, const float *hidden_in, float *hidden_out,
                            float *logits_out, float *layers)
{
    const ie_hparams_t *hp = &w->hp;
    const ie_shard_range_t *sh = &w->sh;
    int n = b->n, d = hp->n_embd, hd = hp->head_dim, half = hp->rope_dim / 2;
    int64_t ff = w->ff_loc;
    int ridx = 0;
    ie_status_t st = IE_OK;

    if (n < 1 || n > w->opts.max_batch)
        return ie_error_set(IE_ERR_INVAL, "worker: batch of %d tokens (max %d)", n, w->opts.max_batch);
    if (!hidden_in && !sh->has_embed)
        return ie_error_set(IE_ERR_INVAL, "worker: this shard (layers %d..%d) has no embedding: it needs hidden_in",
                            sh->layer_begin, sh->layer_end);
    /* Validate the whole batch before touching the cache. Positions of a
     * slot must continue its cache: track the next expected position. */
    for (int i = 0; i < n; i++) {
        if (!hidden_in && (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab))
            return ie_error_set(IE_ERR_RANGE, "worker: token id %d out of range [0, %d)", b->tokens[i],
                                hp->n_vocab);
        if (b->seq[i] < 0 || b->seq[i] >= w->opts.n_seq)
            return ie_error_set(IE_ERR_RANGE, "worker: sequence slot %d out of range [0, %d)", b->seq[i],
                                w->opts.n_seq);
        if (b->pos[i] < 0 || b->pos[i] >= w->opts.n_ctx)
            return ie_error_set(IE_ERR_RANGE, "worker: position %d past the context size %d", b->pos[i],
                                w->opts.n_ctx);
        int expect = w->seq_len[b->seq[i]];
        for (int j = 0; j < i; j++)
            if (b->seq[j] == b->seq[i] && b->pos[j] + 1 > expect) expect = b->pos[j] + 1;
        if (b->pos[i] > expect)
            return ie_error_set(IE_ERR_RANGE, "worker: slot %d position %d skips ahead of its cache (%d)",
                                b->seq[i], b->pos[i], expect);
        /* every block the token writes or reads must be bound: its own
         * position, and the window before it (all of it unless every held
         * layer slides) */
        const int pos = b->pos[i], kb = w->kv_block;
        const int j0 = w->all_swa && pos >= hp->sliding_window ? pos - hp->sliding_window + 1 : 0;
        const int32_t *tab = w->btab + (size_t)b->seq[i] * w->kv_nlb;
        for (int lb = pos / kb; lb >= j0 / kb; lb--)
            if (tab[lb] < 0) {
                const int at = lb * kb > j0 ? lb * kb : j0;
                return ie_error_set(IE_ERR_RANGE, "worker: slot %d position %d: its KV block %d is not bound%s",
                                    b->seq[i], lb == pos / kb ? pos : at, lb,
                                    lb == pos / kb ? "" : " (read by a later position)");
            }
    }

    /* embeddings, or the previous stage's residual stream */
    if (hidden_in)
        memcpy(w->x, hidden_in, (size_t)n * d * sizeof(float));
    else {
        /* looked up on the calling thread (share 0): its node's copy */
        const wmat_t *te = w->embd_repl ? &w->embd_repl[w->share_repl[0]] : &w->tok_embd;
        for (int i = 0; i < n; i++) mat_row(te, b->tokens[i], w->x + (size_t)i * d);
    }

    for (int l = sh->layer_begin; l < sh->layer_end; l++) {
        const layer_t *L = &w->layers[l];

        /* attention: norm, q/k/v in one pass over the tokens */
        for (int i = 0; i < n; i++)
            w->ops->rmsnorm(w->xb + (size_t)i * d, w->x + (size_t)i * d, L->attn_norm, d, hp->rms_eps);
        pf_set(w, &L->o, n); /* what the idle threads fetch next (worker_idle) */
        att_task_t at = {w, b, l, att_share(w, n)};
        {
            /* decode: each thread fetches the cache rows its attention
             * share reads, ahead of its share of q/k/v */
            const wmat_t *ms[3] = {&L->q, &L->k, &L->v};
            float *ys[3] = {w->q, w->k, w->v};
            const mm_pre_t kvpf = {att_prefetch, &at};
            matmul_rep(w, 3, ms, NULL, ys, w->xb, n, w->kvpf_on && n <= 8 ? &kvpf : NULL);
        }
        if (L->bq)
            for (int i = 0; i < n; i++) {
                add_bias(w->q + (size_t)i * w->q_dim, L->bq, w->q_dim);
                add_bias(w->k + (size_t)i * w->kv_dim, L->bk, w->kv_dim);
                add_bias(w->v + (size_t)i * w->kv_dim, L->bv, w->kv_dim);
            }
        /* rope, then append k and v to the slot's cache */
        for (int i = 0; i < n; i++) {
            const float *c = w->rope_cos + (size_t)b->pos[i] * half;
            const float *s = w->rope_sin + (size_t)b->pos[i] * half;
            for (int h = 0; h < w->n_head_loc; h++)
                ie_rope_apply_f32(w->q + (size_t)i * w->q_dim + (size_t)h * hd, hd, hp->rope_dim, c, s,
                                  hp->rope_layout);
            for (int h = 0; h < w->n_kv_loc; h++)
                ie_rope_apply_f32(w->k + (size_t)i * w->kv_dim + (size_t)h * hd, hd, hp->rope_dim, c, s,
                                  hp->rope_layout);
            const int kb = w->kv_block;
            const int32_t pb = w->btab[(size_t)b->seq[i] * w->kv_nlb + b->pos[i] / kb];
            size_t off = (size_t)pb * w->kv_block_stride + (size_t)(l - sh->layer_begin) * w->kv_layer_stride +
                         (size_t)(b->pos[i] % kb) * w->kv_dim;
            memcpy(w->kcache + off, w->k + (size_t)i * w->kv_dim, (size_t)w->kv_dim * sizeof(float));
            memcpy(w->vcache + off, w->v + (size_t)i * w->kv_dim, (size_t)w->kv_dim * sizeof(float));
        }
        ie_threadpool_run(w->tp, att_run, &at);
        /* output projection (tensor-parallel: this rank's heads' share,
         * summed across ranks), residual connection back into x */
        pf_set(w, hp->n_expert > 0 ? NULL : &L->gate, n);
        matmul1(w, &L->o, w->tmp, w->xb, n);
        if (L->bo)
            for (int i = 0; i < n; i++) add_bias(w->tmp + (size_t)i * d, L->bo, d);
        if ((st = reduce(w, &ridx, w->tmp, (size_t)n * d)) != IE_OK) return st;
        for (size_t i = 0; i < (size_t)n * d; i++) w->x[i] += w->tmp[i];

        /* feed-forward: norm, then a dense SwiGLU MLP or the MoE */
        for (int i = 0; i < n; i++)
            w->ops->rmsnorm(w->xb + (size_t)i * d, w->x + (size_t)i * d, L->ffn_norm, d, hp->rms_eps);
        if (hp->n_expert > 0) {
            moe_forward(w, L, n);
            if ((st = reduce(w, &ridx, w->moe, (size_t)n * d)) != IE_OK) return st;
            for (size_t i = 0; i < (size_t)n * d; i++) w->x[i] += w->moe[i];
        } else {
            pf_set(w, &L->down, n);
            {
                const wmat_t *ms[2] = {&L->gate, &L->up};
                float *ys[2] = {w->hb, w->hb2};
                matmul_group(w, 2, ms, ys, w->xb, n);
            }
            swiglu_par(w, w->hb, w->hb2, (int64_t)n * ff);
            /* then the next layer's q, or the head (per-node copies: not fetched) */
            pf_set(w, l + 1 < sh->layer_end ? &w->layers[l + 1].q
                      : sh->has_head && logits_out && !w->head_repl ? &w->output : NULL, n);
            matmul1(w, &L->down, w->tmp, w->hb, n);
            if ((st = reduce(w, &ridx, w->tmp, (size_t)n * d)) != IE_OK) return st;
            for (size_t i = 0; i < (size_t)n * d; i++) w->x[i] += w->tmp[i];
        }
        if (layers) memcpy(layers + (size_t)(l - sh->layer_begin) * n * d, w->x, (size_t)n * d * sizeof(float));
    }

    /* the slot caches now hold these positions */
    for (int i = 0; i < n; i++)
        if (b->pos[i] + 1 > w->seq_len[b->seq[i]]) w->seq_len[b->seq[i]] = b->pos[i] + 1;
    if (hidden_out) memcpy(hidden_out, w->x, (size_t)n * d * sizeof(float));
    if (!sh->has_head || !logits_out) return IE_OK;

    /* logits for the tokens that asked: gather, norm, project */
    int nl = 0;
    for (int i = 0; i < n; i++) {
        if (b->logits && !b->logits[i]) continue;
        if (!b->logits && i != n - 1) continue;
        w->ops->rmsnorm(w->xb + (size_t)nl * d, w->x + (size_t)i * d, w->output_norm, d, hp->rms_eps);
        nl++;
    }
    /* the output projection can be wider than max_batch rows of scratch:
     * run it in chunks straight into the caller's buffer */
    if (nl > 0) {
        /* after the head, the idle threads fetch the first layer's q for
         * the next step (sampling and scheduling run meanwhile) */
        pf_set(w, sh->layer_end > sh->layer_begin ? &w->layers[sh->layer_begin].q : NULL, nl);
        const wmat_t *ms[1] = {&w->output}, *rp[1] = {w->head_repl}; /* per-node copies, if any */
        float *ys[1] = {logits_out};
        matmul_rep(w, 1, ms, rp, ys, w->xb, nl, NULL);
    }
    return IE_OK;
}

ie_status_t ie_worker_step(ie_worker_t *w, const ie_batch_t *b, float *logits_out)
{
    return step_run(w, b, NULL, NULL, logits_out, NULL);
}

ie_status_t ie_worker_step_hidden(ie_worker_t *w, const ie_batch_t *b, float *logits_out, float *hidden)
{
    return step_run(w, b, NULL, NULL, logits_out, hidden);
}

ie_status_t ie_worker_step_shard(ie_worker_t *w, const ie_batch_t *b, const float *hidden_in, float *hidden_out,
                                 float *logits_out)
{
    return step_run(w, b, hidden_in, hidden_out, logits_out, NULL);
}

const ie_shard_range_t *ie_worker_shard(const ie_worker_t *w) { return &w->sh; }
void ie_worker_seq_clear(ie_worker_t *w, int seq)
{
    if (seq >= 0 && seq < w->opts.n_seq) w->seq_len[seq] = 0;
}

/* Contract (ie_worker.h): every argument is checked before the table
 * changes. */
ie_status_t ie_worker_kv_bind(ie_worker_t *w, int seq, int first, const int32_t *pb, int n)
{
    if (seq < 0 || seq >= w->opts.n_seq)
        return ie_error_set(IE_ERR_RANGE, "worker: KV bind: slot %d out of range [0, %d)", seq, w->opts.n_seq);
    if (first < 0 || n < 0 || (int64_t)first + n > w->kv_nlb || (n > 0 && !pb))
        return ie_error_set(IE_ERR_RANGE, "worker: KV bind: logical blocks %d..%lld of slot %d outside [0, %d)",
                            first, (long long)first + n - 1, seq, w->kv_nlb);
    for (int i = 0; i < n; i++)
        if (pb[i] < -1 || pb[i] >= w->kv_blocks)
            return ie_error_set(IE_ERR_RANGE, "worker: KV bind: physical block %d outside the pool [0, %d)", pb[i],
                                w->kv_blocks);
    if (n > 0) memcpy(w->btab + (size_t)seq * w->kv_nlb + first, pb, (size_t)n * sizeof(int32_t));
    return IE_OK;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_seq_set_len(ie_worker_t *w, int seq, int n_pos)
{
    if (seq < 0 || seq >= w->opts.n_seq)
        return ie_error_set(IE_ERR_RANGE, "worker: set length: slot %d out of range [0, %d)", seq, w->opts.n_seq);
    if (n_pos < 0 || n_pos > w->opts.n_ctx)
        return ie_error_set(IE_ERR_RANGE, "worker: set length: %d positions (0..%d)", n_pos, w->opts.n_ctx);
    const int32_t *tab = w->btab + (size_t)seq * w->kv_nlb;
    for (int lb = 0; lb * w->kv_block < n_pos; lb++)
        if (tab[lb] < 0)
            return ie_error_set(IE_ERR_RANGE, "worker: set length: slot %d position %d: its KV block %d is not bound",
                                seq, lb * w->kv_block, lb);
    w->seq_len[seq] = n_pos;
    return IE_OK;
}

ie_status_t ie_worker_set_decode_option(ie_worker_t *w, const char *name, int on)
{
    if (!w || !name) return ie_error_set(IE_ERR_INVAL, "ie_worker_set_decode_option: NULL argument");
    if (!strcmp(name, "balance"))
        w->balance = on != 0;
    else if (!strcmp(name, "prefetch")) {
        w->pf_on = on != 0;
        if (!w->pf_on && w->pf) atomic_store_explicit(&w->pf_next, NULL, memory_order_relaxed);
    } else if (!strcmp(name, "stream"))
        w->stream_act = on != 0;
    else if (!strcmp(name, "kvprefetch"))
        w->kvpf_on = on != 0;
    else
        return ie_error_set(IE_ERR_INVAL,
                            "ie_worker_set_decode_option: unknown option '%s' (balance, prefetch, stream, kvprefetch)",
                            name);
    return IE_OK;
}

int ie_worker_hot_replicas(const ie_worker_t *w) { return w ? w->hot_copies : 0; }
const char *ie_worker_hot_report(const ie_worker_t *w) { return w ? w->hot_report : ""; }

/* Contract (ie_worker.h). */
const void *ie_worker_hot_replica(const ie_worker_t *w, int embd, int r, size_t *bytes_out)
{
    const wmat_t *c = !w ? NULL : embd ? w->embd_repl : w->head_repl;
    if (bytes_out) *bytes_out = 0;
    if (!c || r < 0 || r >= w->n_repl) return NULL;
    if (bytes_out) *bytes_out = c[r].slice * (size_t)c[r].n_mat;
    return c[r].data;
}

/* Contract (ie_worker.h). */
int ie_worker_hot_replica_of(const ie_worker_t *w, int ith)
{
    if (!w || (!w->head_repl && !w->embd_repl) || ith < 0 || ith >= w->opts.n_threads) return -1;
    return w->share_repl[ith];
}

int ie_worker_kv_block(const ie_worker_t *w) { return w->kv_block; }
int ie_worker_kv_blocks(const ie_worker_t *w) { return w->kv_blocks; }

const ie_hparams_t *ie_worker_hparams(const ie_worker_t *w) { return &w->hp; }
int ie_worker_n_ctx(const ie_worker_t *w) { return w->opts.n_ctx; }
int ie_worker_max_batch(const ie_worker_t *w) { return w->opts.max_batch; }
int ie_worker_n_threads(const ie_worker_t *w) { return w->opts.n_threads; }
ie_isa_t ie_worker_isa(const ie_worker_t *w) { return w->ops->isa; }

static uint64_t mat_bytes(const wmat_t *m) { return m->slice; }

/* ------------------------------------------------------- stream probe */

typedef struct probe_task {
    uint64_t (*read)(const void *p, size_t n);
    int nm, cap;
    const wmat_t **m;
    int64_t *n_slices; /* matrices of each stack read (MoE: k experts) */
    _Atomic uint64_t sink;
} probe_task_t;

/* Share ith of every matrix in the job, cut as mm_run's static split cuts
 * it: whole panels, 16-row pieces, or (BSR) 4 KiB pieces of the bytes. */
static void probe_run(void *ctx, int ith, int nth)
{
    probe_task_t *t = ctx;
    uint64_t x = 0;
    for (int i = 0; i < t->nm; i++) {
        const wmat_t *m = t->m[i];
        size_t unit;
        long units;
        if (m->layout == IE_LAYOUT_PANEL16) {
            unit = ie_pack_panel_bytes(m->dtype, m->group, m->n_in);
            units = (long)((m->n_out + IE_PANEL - 1) / IE_PANEL);
        } else if (m->layout == IE_LAYOUT_BSR) {
            unit = 4096;
            units = (long)((m->slice + unit - 1) / unit);
        } else {
            unit = (size_t)IE_PANEL * ie_dtype_row_bytes(m->dtype, m->n_in);
            units = (long)((m->n_out + IE_PANEL - 1) / IE_PANEL);
        }
        long b, e;
        ie_split_range(units, ith, nth, &b, &e);
        size_t lo = (size_t)b * unit, hi = (size_t)e * unit;
        if (hi > m->slice) hi = m->slice;
        for (int64_t k = 0; k < t->n_slices[i] && lo < hi; k++)
            x ^= t->read((const uint8_t *)m->data + (size_t)k * m->slice + lo, hi - lo);
    }
    atomic_fetch_xor_explicit(&t->sink, x, memory_order_relaxed);
}

static void probe_add(probe_task_t *t, const wmat_t *m, int64_t n)
{
    if (m->n_mat > 0 && t->nm < t->cap) {
        t->m[t->nm] = m;
        t->n_slices[t->nm] = n < m->n_mat ? n : m->n_mat;
        t->nm++;
    }
}

/* Run the job collected so far (grouped mode; `last` also in flat mode). */
static void probe_flush(ie_worker_t *w, probe_task_t *t, int flat, int last)
{
    if (t->nm == 0 || (flat && !last)) return;
    ie_threadpool_run(w->tp, probe_run, t);
    t->nm = 0;
}

/* Contract (ie_worker.h). Grouped, the jobs are a decode step's matmul
 * jobs: q/k/v, o, (MoE: the router), gate/up, down per layer, then the
 * head. */
ie_status_t ie_worker_stream_probe(ie_worker_t *w, int flat, double *seconds)
{
    if (!w || !seconds) return ie_error_set(IE_ERR_INVAL, "ie_worker_stream_probe: NULL argument");
    const int n_layers = w->sh.layer_end - w->sh.layer_begin;
    probe_task_t t = {.read = w->ops->stream_read, .cap = 8 * (n_layers > 0 ? n_layers : 0) + 1};
    t.m = malloc((size_t)t.cap * sizeof *t.m);
    t.n_slices = malloc((size_t)t.cap * sizeof *t.n_slices);
    if (!t.m || !t.n_slices) {
        free(t.m);
        free(t.n_slices);
        return ie_error_set(IE_ERR_NOMEM, "ie_worker_stream_probe: out of memory");
    }
    atomic_init(&t.sink, 0);
    int64_t k = 1;
    if (w->hp.n_expert > 0) {
        const int64_t held = w->sh.expert_end - w->sh.expert_begin;
        k = ((int64_t)w->hp.n_expert_used * held + w->hp.n_expert - 1) / w->hp.n_expert;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int l = w->sh.layer_begin; l < w->sh.layer_end; l++) {
        const layer_t *L = &w->layers[l];
        probe_add(&t, &L->q, 1);
        probe_add(&t, &L->k, 1);
        probe_add(&t, &L->v, 1);
        probe_flush(w, &t, flat, 0);
        probe_add(&t, &L->o, 1);
        probe_flush(w, &t, flat, 0);
        if (w->hp.n_expert > 0) {
            probe_add(&t, &L->router, 1);
            probe_flush(w, &t, flat, 0);
        }
        probe_add(&t, &L->gate, k);
        probe_add(&t, &L->up, k);
        probe_flush(w, &t, flat, 0);
        probe_add(&t, &L->down, k);
        probe_flush(w, &t, flat, 0);
    }
    if (w->sh.has_head) probe_add(&t, &w->output, 1);
    probe_flush(w, &t, flat, 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    w->probe_sink ^= atomic_load(&t.sink); /* keeps the reads */
    free(t.m);
    free(t.n_slices);
    *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return IE_OK;
}

/* Contract (ie_worker.h). A shard counts its layers, its embedding row
 * only when it embeds and its head only when it has one; a tensor-parallel
 * rank holding E' of E experts expects k * E'/E of them per token. */
uint64_t ie_worker_bytes_per_token(const ie_worker_t *w)
{
    const wmat_t *te = &w->tok_embd;
    uint64_t s = 0;
    if (w->sh.has_embed)
        s += ie_tensor_bytes(te->dtype, te->layout, te->group, te->n_in, te->n_out) / (uint64_t)te->n_out;
    if (w->sh.has_head) s += mat_bytes(&w->output);
    for (int l = w->sh.layer_begin; l < w->sh.layer_end; l++) {
        const layer_t *L = &w->layers[l];
        /* a MoE layer streams its router and the k experts it uses */
        uint64_t k = 1;
        if (w->hp.n_expert > 0) {
            const uint64_t held = (uint64_t)(w->sh.expert_end - w->sh.expert_begin);
            k = ((uint64_t)w->hp.n_expert_used * held + (uint64_t)w->hp.n_expert - 1) / (uint64_t)w->hp.n_expert;
        }
        s += mat_bytes(&L->q) + mat_bytes(&L->k) + mat_bytes(&L->v) + mat_bytes(&L->o) +
             k * (mat_bytes(&L->gate) + mat_bytes(&L->up) + mat_bytes(&L->down)) +
             (w->hp.n_expert > 0 ? mat_bytes(&L->router) : 0) + 2 * (uint64_t)w->hp.n_embd * sizeof(float);
    }
    return s;
}

/* Contract (ie_worker.h): every bound matrix stack (experts held only),
 * the embedding when this shard looks tokens up and it is not the head's
 * own buffer, and the float vectors (norms, biases, sinks) of its layers. */
uint64_t ie_worker_weight_bytes(const ie_worker_t *w)
{
    const ie_hparams_t *hp = &w->hp;
    const int64_t d = hp->n_embd;
    uint64_t s = 0;
#define STACK(m) ((uint64_t)(m).slice * (uint64_t)(m).n_mat)
    if (w->sh.has_embed && w->tok_embd.data != w->output.data) s += STACK(w->tok_embd);
    if (w->sh.has_head) s += STACK(w->output) + (uint64_t)d * sizeof(float);
    const uint64_t qd = (uint64_t)w->q_dim, kvd = (uint64_t)w->kv_dim;
    const uint64_t ne = (uint64_t)(w->sh.expert_end - w->sh.expert_begin);
    for (int l = w->sh.layer_begin; l < w->sh.layer_end; l++) {
        const layer_t *L = &w->layers[l];
        s += STACK(L->q) + STACK(L->k) + STACK(L->v) + STACK(L->o) + STACK(L->gate) + STACK(L->up) +
             STACK(L->down) + STACK(L->router);
        uint64_t f = 2 * (uint64_t)d; /* the two norms */
        if (L->bq) f += qd + 2 * kvd + (L->bo ? (uint64_t)d : 0);
        if (L->sinks) f += (uint64_t)w->n_head_loc;
        if (hp->n_expert > 0) f += (uint64_t)hp->n_expert + ne * (2 * (uint64_t)hp->n_ff + (uint64_t)d);
        s += f * sizeof(float);
    }
#undef STACK
    return s;
}
