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
 */
#include "ie_worker.h"

#include "ie_threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------ types */

typedef struct wmat {
    ie_dtype_t dtype;
    const void *data; /* n_out rows of n_in elements                */
    int64_t n_in;
    int64_t n_out;
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

struct ie_worker {
    ie_hparams_t hp;
    ie_worker_opts_t opts;
    int copy_weights;        /* resolved opts.copy_weights                */
    const ie_matmul_ops_t *ops;
    ie_threadpool_t *tp;

    wmat_t tok_embd;         /* (vocab, d)                               */
    wmat_t output;           /* (vocab, d), may share tok_embd's data    */
    const float *output_norm;
    layer_t *layers;         /* [n_layer]                                */

    void **owned;            /* buffers we allocated for weights         */
    size_t n_owned, cap_owned;

    int q_dim, kv_dim;       /* n_head*hd, n_kv*hd                        */
    size_t kv_layer_stride;  /* floats per layer: n_seq*n_ctx*kv_dim     */
    float *kcache, *vcache;  /* [n_layer][n_seq][n_ctx][kv_dim]          */
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
    size_t act_row_cap;
    float *scores; /* [n_threads][n_ctx]                                  */
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
    o->repack = 1;
    o->isa = ie_isa_best();
}

/* Large zeroed buffer from its own anonymous mapping: zero pages cost no
 * memory until first written. `huge` asks for huge pages (streamed weights
 * and scratch: 4 KiB pages cost ~1/3 of the read bandwidth here). The KV
 * cache does not ask: it is reserved for the whole context but written a
 * position at a time in every layer, and a 2 MiB first-touch per layer would
 * zero (and keep resident) megabytes for a few tokens. The first 64 bytes
 * hold the mapping's size for big_free(). */
#define BIG_HDR 64
static void *big_alloc_ex(size_t n, int huge)
{
    size_t total = n + BIG_HDR;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (huge && total >= (2u << 20)) madvise(p, total, MADV_HUGEPAGE);
    *(size_t *)p = total;
    return (char *)p + BIG_HDR;
}

static void *big_alloc(size_t n) { return big_alloc_ex(n, 1); }

static void big_free(void *q)
{
    if (!q) return;
    char *p = (char *)q - BIG_HDR;
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

typedef struct convert_task {
    const ie_tensor_t *t;
    ie_dtype_t to;
    void *dst;
    int64_t n_in, n_rows;
} convert_task_t;

static void convert_rows(void *ctx, int ith, int nth)
{
    convert_task_t *c = ctx;
    long b, e;
    ie_split_range((long)c->n_rows, ith, nth, &b, &e);
    size_t src_row = ie_dtype_row_bytes(c->t->dtype, c->n_in);
    size_t dst_row = ie_dtype_row_bytes(c->to, c->n_in);
    float *row = NULL;
    if (c->to != IE_DTYPE_F32) {
        row = malloc((size_t)c->n_in * sizeof(float));
        if (!row) return; /* caller checks the sentinel below */
    }
    for (long r = b; r < e; r++) {
        const char *src = (const char *)c->t->data + (size_t)r * src_row;
        char *dst = (char *)c->dst + (size_t)r * dst_row;
        float *f = row ? row : (float *)dst;
        ie_dequantize_row(c->t->dtype, src, f, c->n_in);
        if (c->to == IE_DTYPE_BF16) {
            for (int64_t i = 0; i < c->n_in; i++) ((ie_bf16_t *)dst)[i] = ie_f32_to_bf16(f[i]);
        } else if (c->to == IE_DTYPE_F16) {
            for (int64_t i = 0; i < c->n_in; i++) ((ie_f16_t *)dst)[i] = ie_f32_to_f16(f[i]);
        }
    }
    free(row);
}

static int dtype_computable(ie_dtype_t t)
{
    return t == IE_DTYPE_F32 || t == IE_DTYPE_F16 || t == IE_DTYPE_BF16 ||
           t == IE_DTYPE_Q8_0 || t == IE_DTYPE_Q4_0 || t == IE_DTYPE_Q4_1 ||
           t == IE_DTYPE_MXFP4;
}

/* Bind a 2-D weight matrix (ne = [n_in, n_out]), converting it when the
 * precision asks for another type. */
static ie_status_t bind_mats(ie_worker_t *w, const ie_model_src_t *src, const char *name,
                             int64_t n_in, int64_t n_out, int64_t n_mat, wmat_t *m)
{
    const ie_tensor_t *t = ie_model_src_tensor(src, name);
    if (!t) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'", name);
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_mat || t->ne[3] != 1)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                            (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)n_in,
                            (long long)n_out, (long long)n_mat);
    if (!dtype_computable(t->dtype))
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: tensor '%s' has type %s, which the engine cannot compute with",
                            name, ie_dtype_name(t->dtype));
    if (ie_dtype_row_bytes(t->dtype, n_in) == 0)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' row length %lld is not a multiple of the %s block",
                            name, (long long)n_in, ie_dtype_name(t->dtype));

    ie_dtype_t to = t->dtype;
    switch (w->opts.precision) {
    case IE_PREC_NATIVE: break;
    case IE_PREC_F32: to = IE_DTYPE_F32; break;
    case IE_PREC_BF16: to = IE_DTYPE_BF16; break;
    case IE_PREC_F16: to = IE_DTYPE_F16; break;
    case IE_PREC_INT8W: case IE_PREC_INT4W:
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: precision %s not wired yet", ie_precision_name(w->opts.precision));
    }
    m->n_in = n_in;
    m->n_out = n_out;
    m->dtype = to;
    n_out *= n_mat; /* rows of all matrices, converted alike */
    size_t bytes = ie_dtype_row_bytes(to, n_in) * (size_t)n_out;
    if (to == t->dtype && !w->copy_weights) {
        m->data = t->data;
        return IE_OK;
    }
    if (to == t->dtype) {
        /* same type: a plain copy into huge-page memory (file mappings use
         * 4 KiB pages, which cost a third of the read bandwidth) */
        void *dst = big_alloc(bytes);
        if (!dst || own(w, dst) != 0) {
            big_free(dst);
            return ie_error_set(IE_ERR_NOMEM, "out of memory copying '%s' (%zu bytes)", name, bytes);
        }
        memcpy(dst, t->data, bytes);
        m->data = dst;
        return IE_OK;
    }
    void *dst = big_alloc(bytes);
    if (!dst || own(w, dst) != 0) {
        big_free(dst);
        return ie_error_set(IE_ERR_NOMEM, "out of memory converting '%s' to %s (%zu bytes)", name,
                            ie_dtype_name(to), bytes);
    }
    convert_task_t c = {t, to, dst, n_in, n_out};
    ie_threadpool_run(w->tp, convert_rows, &c);
    m->data = dst;
    return IE_OK;
}

static ie_status_t bind_mat(ie_worker_t *w, const ie_model_src_t *src, const char *name,
                            int64_t n_in, int64_t n_out, wmat_t *m)
{
    return bind_mats(w, src, name, n_in, n_out, 1, m);
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
    if (hp->rope_dim <= 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2) {
        st = ie_error_set(IE_ERR_FORMAT, "model: rope dimension %d invalid for head_dim %d", hp->rope_dim,
                          hp->head_dim);
        goto cleanup;
    }

    int64_t d = hp->n_embd, ff = hp->n_ff;
    w->q_dim = hp->n_head * hp->head_dim;
    w->kv_dim = hp->n_head_kv * hp->head_dim;

    /* Embeddings are read a row at a time (dequantized on lookup), so they
     * keep the file's type whatever the precision. */
    const ie_tensor_t *te = ie_model_src_tensor(src, "token_embd.weight");
    if (!te) {
        st = ie_error_set(IE_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
        goto cleanup;
    }
    if (!dtype_computable(te->dtype) || te->ne[0] != d || te->ne[1] != hp->n_vocab) {
        st = ie_error_set(IE_ERR_FORMAT, "model: tensor 'token_embd.weight' is %s [%lld, %lld], expected [%lld, %d]",
                          ie_dtype_name(te->dtype), (long long)te->ne[0], (long long)te->ne[1],
                          (long long)d, hp->n_vocab);
        goto cleanup;
    }
    w->tok_embd = (wmat_t){te->dtype, te->data, d, hp->n_vocab};
    if ((st = bind_mat(w, src, hp->tied_embeddings ? "token_embd.weight" : "output.weight", d,
                       hp->n_vocab, &w->output)) != IE_OK)
        goto cleanup;
    if ((st = bind_vec(w, src, "output_norm.weight", d, &w->output_norm)) != IE_OK) goto cleanup;

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
    for (int l = 0; l < hp->n_layer; l++) {
        layer_t *L = &w->layers[l];
#define BIND_MATS(field, suffix, nin, nout, nmat)                                 \
        snprintf(name, sizeof name, "blk.%d." suffix ".weight", l);               \
        if ((st = bind_mats(w, src, name, nin, nout, nmat, &L->field)) != IE_OK) goto cleanup;
#define BIND_VEC(field, suffix, n, n1)                                            \
        snprintf(name, sizeof name, "blk.%d." suffix, l);                         \
        if ((st = bind_vec2(w, src, name, n, n1, &L->field)) != IE_OK) goto cleanup;
        BIND_VEC(attn_norm, "attn_norm.weight", d, 1);
        BIND_MATS(q, "attn_q", d, w->q_dim, 1);
        BIND_MATS(k, "attn_k", d, w->kv_dim, 1);
        BIND_MATS(v, "attn_v", d, w->kv_dim, 1);
        BIND_MATS(o, "attn_output", w->q_dim, d, 1);
        if (hp->attn_bias) {
            BIND_VEC(bq, "attn_q.bias", w->q_dim, 1);
            BIND_VEC(bk, "attn_k.bias", w->kv_dim, 1);
            BIND_VEC(bv, "attn_v.bias", w->kv_dim, 1);
            BIND_VEC(bo, "attn_output.bias", d, 1);
        }
        if (hp->attn_sinks) {
            BIND_VEC(sinks, "attn_sinks.weight", hp->n_head, 1);
        }
        L->swa = hp->sliding_window > 0 && hp->layer_swa[l];
        if (!moe) {
            BIND_VEC(ffn_norm, "ffn_norm.weight", d, 1);
            BIND_MATS(gate, "ffn_gate", d, ff, 1);
            BIND_MATS(up, "ffn_up", d, ff, 1);
            BIND_MATS(down, "ffn_down", ff, d, 1);
        } else {
            BIND_VEC(ffn_norm, "post_attention_norm.weight", d, 1);
            BIND_MATS(router, "ffn_gate_inp", d, E, 1);
            BIND_VEC(router_b, "ffn_gate_inp.bias", E, 1);
            BIND_MATS(gate, "ffn_gate_exps", d, ff, E);
            BIND_MATS(up, "ffn_up_exps", d, ff, E);
            BIND_MATS(down, "ffn_down_exps", ff, d, E);
            BIND_VEC(gate_b, "ffn_gate_exps.bias", ff, E);
            BIND_VEC(up_b, "ffn_up_exps.bias", ff, E);
            BIND_VEC(down_b, "ffn_down_exps.bias", d, E);
        }
#undef BIND_MATS
#undef BIND_VEC
    }

    /* KV cache and scratch */
    size_t B = (size_t)opts->max_batch;
    w->kv_layer_stride = (size_t)opts->n_seq * (size_t)opts->n_ctx * (size_t)w->kv_dim;
    size_t kv_bytes = (size_t)hp->n_layer * w->kv_layer_stride * sizeof(float);
    size_t wide = (size_t)(d > w->q_dim ? d : w->q_dim);
    int64_t max_in = ff > (int64_t)wide ? ff : (int64_t)wide;
    w->act_row_cap = ie_dtype_row_bytes(IE_DTYPE_Q8_1, (max_in + 31) / 32 * 32);
    int half = hp->rope_dim / 2;
    w->kcache = big_alloc_ex(kv_bytes, 0);
    w->vcache = big_alloc_ex(kv_bytes, 0);
    w->seq_len = calloc((size_t)opts->n_seq, sizeof(int));
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
    w->scores = big_alloc((size_t)opts->n_threads * opts->n_ctx * sizeof(float));
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
    if (!w->kcache || !w->vcache || !w->seq_len || !w->rope_cos || !w->rope_sin || !w->x || !w->xb ||
        !w->q || !w->k || !w->v || !w->hb || !w->hb2 || !w->tmp || !w->act || !w->scores) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory allocating KV cache (%zu bytes) and scratch", 2 * kv_bytes);
        goto cleanup;
    }
    rope_tables(w);

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
    free(w->layers);
    big_free(w->kcache);
    big_free(w->vcache);
    free(w->seq_len);
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

#define MM_MAX 3

typedef struct mm_task {
    const ie_matmul_ops_t *ops;
    int nm;
    const wmat_t *m[MM_MAX];
    float *y[MM_MAX];       /* [n_tok][m->n_out]                           */
    const void *act;
    size_t act_stride;
    int n_tok;
    /* activation quantization, done by all threads before the barrier-free
     * matmul when the batch is large (each thread its own token rows) */
} mm_task_t;

static void mm_run(void *ctx, int ith, int nth)
{
    mm_task_t *t = ctx;
    for (int i = 0; i < t->nm; i++) {
        const wmat_t *m = t->m[i];
        long b, e;
        ie_split_range((long)m->n_out, ith, nth, &b, &e);
        if (b < e)
            t->ops->matmul(m->dtype, m->data, m->n_in, b, e, t->act, t->act_stride, t->n_tok, t->y[i],
                           m->n_out);
    }
}

typedef struct q_task {
    const ie_matmul_ops_t *ops;
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
        t->ops->act_quantize(t->act, t->x + (size_t)i * t->n_in, (char *)t->out + (size_t)i * t->out_stride,
                             t->n_in);
}

/* y_i = m_i · x for up to MM_MAX matrices sharing the input x [n][n_in].
 * Matrices whose kernels want different activation formats run in
 * separate passes. */
static void matmul_group(ie_worker_t *w, int nm, const wmat_t *const *m, float *const *y, const float *x,
                         int n)
{
    int done[MM_MAX] = {0};
    for (int i = 0; i < nm; i++) {
        if (done[i]) continue;
        ie_dtype_t act = ie_matmul_act_dtype(m[i]->dtype);
        int64_t n_in = m[i]->n_in;
        mm_task_t t = {.ops = w->ops, .n_tok = n};
        for (int j = i; j < nm; j++) {
            if (!done[j] && ie_matmul_act_dtype(m[j]->dtype) == act) {
                t.m[t.nm] = m[j];
                t.y[t.nm] = y[j];
                t.nm++;
                done[j] = 1;
            }
        }
        if (act == IE_DTYPE_F32) {
            t.act = x;
            t.act_stride = (size_t)n_in * sizeof(float);
        } else {
            q_task_t q = {w->ops, act, x, n_in, w->act, ie_dtype_row_bytes(act, n_in), n};
            if (n >= 8)
                ie_threadpool_run(w->tp, q_run, &q);
            else
                q_run(&q, 0, 1);
            t.act = w->act;
            t.act_stride = q.out_stride;
        }
        ie_threadpool_run(w->tp, mm_run, &t);
    }
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
} att_task_t;

/* One (token, head) pair per unit of work: scores over the slot's cache up
 * to the token's position, softmax, weighted sum of values into xb. */
static void att_run(void *ctx, int ith, int nth)
{
    att_task_t *t = ctx;
    ie_worker_t *w = t->w;
    const ie_hparams_t *hp = &w->hp;
    const layer_t *L = &w->layers[t->layer];
    int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    float scale = 1.0f / sqrtf((float)hd);
    float *scores = w->scores + (size_t)ith * w->opts.n_ctx;
    long b, e;
    ie_split_range((long)t->b->n * hp->n_head, ith, nth, &b, &e);
    for (long u = b; u < e; u++) {
        int i = (int)(u / hp->n_head), h = (int)(u % hp->n_head), kh = h / group;
        int seq = t->b->seq[i], pos = t->b->pos[i];
        const float *q = w->q + (size_t)i * w->q_dim + (size_t)h * hd;
        size_t base = (size_t)t->layer * w->kv_layer_stride + (size_t)seq * w->opts.n_ctx * w->kv_dim;
        const float *kc = w->kcache + base + (size_t)kh * hd;
        const float *vc = w->vcache + base + (size_t)kh * hd;
        /* a sliding layer sees the last W positions, itself included */
        int j0 = L->swa && pos >= hp->sliding_window ? pos - hp->sliding_window + 1 : 0;
        int cnt = pos + 1 - j0;
        for (int j = 0; j < cnt; j++)
            scores[j] = w->ops->dot_f32(q, kc + (size_t)(j0 + j) * w->kv_dim, hd) * scale;
        if (L->sinks) {
            /* the sink logit joins the softmax and its share is dropped */
            float sink = L->sinks[h], m = sink, z = 0;
            for (int j = 0; j < cnt; j++) m = scores[j] > m ? scores[j] : m;
            for (int j = 0; j < cnt; j++) z += scores[j] = expf(scores[j] - m);
            z += expf(sink - m);
            for (int j = 0; j < cnt; j++) scores[j] /= z;
        } else {
            ie_softmax_f32(scores, cnt);
        }
        float *out = w->xb + (size_t)i * w->q_dim + (size_t)h * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j < cnt; j++) w->ops->axpy_f32(out, scores[j], vc + (size_t)(j0 + j) * w->kv_dim, hd);
    }
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
    r.data = (const char *)m->data + (size_t)e * ie_dtype_row_bytes(m->dtype, m->n_in) * (size_t)m->n_out;
    return r;
}

/* GPT-OSS mixture of experts on w->xb [n][d] into w->moe [n][d]
 * (docs/GPTOSS.md 2.3): router logits + bias, top-k, softmax over the k
 * selected logits; each used expert runs once over all its tokens (matrix
 * work in prefill): gate/up + biases, gate clamped above and up on both
 * sides at the limit, (up + 1) * gate * sigmoid(alpha * gate), down + bias,
 * weighted into the output. */
static void moe_forward(ie_worker_t *w, const layer_t *L, int n)
{
    const ie_hparams_t *hp = &w->hp;
    int d = hp->n_embd, ff = hp->n_ff, E = hp->n_expert, k = hp->n_expert_used;
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
    for (int e = 0; e < E; e++) {
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
        wmat_t g = expert_mat(&L->gate, e), u = expert_mat(&L->up, e), dn = expert_mat(&L->down, e);
        const wmat_t *ms[2] = {&g, &u};
        float *ys[2] = {w->hb, w->hb2};
        matmul_group(w, 2, ms, ys, w->xg, m);
        const float *gb = L->gate_b + (size_t)e * ff, *ub = L->up_b + (size_t)e * ff;
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
        const float *db = L->down_b + (size_t)e * d;
        for (int r = 0; r < m; r++) {
            float *y = w->tmp + (size_t)r * d, *o = w->moe + (size_t)w->rows[r] * d, wt = w->roww[r];
            for (int j = 0; j < d; j++) o[j] += wt * (y[j] + db[j]);
        }
    }
}

/* ---------------------------------------------------------------- step */

ie_status_t ie_worker_step(ie_worker_t *w, const ie_batch_t *b, float *logits_out)
{
    return ie_worker_step_hidden(w, b, logits_out, NULL);
}

ie_status_t ie_worker_step_hidden(ie_worker_t *w, const ie_batch_t *b, float *logits_out, float *hidden)
{
    const ie_hparams_t *hp = &w->hp;
    int n = b->n, d = hp->n_embd, ff = hp->n_ff, hd = hp->head_dim, half = hp->rope_dim / 2;

    if (n < 1 || n > w->opts.max_batch)
        return ie_error_set(IE_ERR_INVAL, "worker: batch of %d tokens (max %d)", n, w->opts.max_batch);
    /* Validate the whole batch before touching the cache. Positions of a
     * slot must continue its cache: track the next expected position. */
    for (int i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab)
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
    }

    /* embeddings */
    size_t erow = ie_dtype_row_bytes(w->tok_embd.dtype, d);
    for (int i = 0; i < n; i++)
        ie_dequantize_row(w->tok_embd.dtype, (const char *)w->tok_embd.data + (size_t)b->tokens[i] * erow,
                          w->x + (size_t)i * d, d);

    for (int l = 0; l < hp->n_layer; l++) {
        const layer_t *L = &w->layers[l];

        /* attention: norm, q/k/v in one pass over the tokens */
        for (int i = 0; i < n; i++)
            ie_rmsnorm_f32(w->xb + (size_t)i * d, w->x + (size_t)i * d, L->attn_norm, d, hp->rms_eps);
        {
            const wmat_t *ms[3] = {&L->q, &L->k, &L->v};
            float *ys[3] = {w->q, w->k, w->v};
            matmul_group(w, 3, ms, ys, w->xb, n);
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
            for (int h = 0; h < hp->n_head; h++)
                ie_rope_apply_f32(w->q + (size_t)i * w->q_dim + (size_t)h * hd, hd, hp->rope_dim, c, s,
                                  hp->rope_layout);
            for (int h = 0; h < hp->n_head_kv; h++)
                ie_rope_apply_f32(w->k + (size_t)i * w->kv_dim + (size_t)h * hd, hd, hp->rope_dim, c, s,
                                  hp->rope_layout);
            size_t off = (size_t)l * w->kv_layer_stride +
                         ((size_t)b->seq[i] * w->opts.n_ctx + (size_t)b->pos[i]) * w->kv_dim;
            memcpy(w->kcache + off, w->k + (size_t)i * w->kv_dim, (size_t)w->kv_dim * sizeof(float));
            memcpy(w->vcache + off, w->v + (size_t)i * w->kv_dim, (size_t)w->kv_dim * sizeof(float));
        }
        att_task_t at = {w, b, l};
        ie_threadpool_run(w->tp, att_run, &at);
        /* residual connection back into x */
        matmul1(w, &L->o, w->tmp, w->xb, n);
        if (L->bo)
            for (int i = 0; i < n; i++) add_bias(w->tmp + (size_t)i * d, L->bo, d);
        for (size_t i = 0; i < (size_t)n * d; i++) w->x[i] += w->tmp[i];

        /* feed-forward: norm, then a dense SwiGLU MLP or the MoE */
        for (int i = 0; i < n; i++)
            ie_rmsnorm_f32(w->xb + (size_t)i * d, w->x + (size_t)i * d, L->ffn_norm, d, hp->rms_eps);
        if (hp->n_expert > 0) {
            moe_forward(w, L, n);
            for (size_t i = 0; i < (size_t)n * d; i++) w->x[i] += w->moe[i];
            if (hidden) memcpy(hidden + (size_t)l * n * d, w->x, (size_t)n * d * sizeof(float));
            continue;
        }
        {
            const wmat_t *ms[2] = {&L->gate, &L->up};
            float *ys[2] = {w->hb, w->hb2};
            matmul_group(w, 2, ms, ys, w->xb, n);
        }
        ie_swiglu_f32(w->hb, w->hb, w->hb2, (int64_t)n * ff);
        matmul1(w, &L->down, w->tmp, w->hb, n);
        for (size_t i = 0; i < (size_t)n * d; i++) w->x[i] += w->tmp[i];
        if (hidden) memcpy(hidden + (size_t)l * n * d, w->x, (size_t)n * d * sizeof(float));
    }

    /* the slot caches now hold these positions */
    for (int i = 0; i < n; i++)
        if (b->pos[i] + 1 > w->seq_len[b->seq[i]]) w->seq_len[b->seq[i]] = b->pos[i] + 1;

    /* logits for the tokens that asked: gather, norm, project */
    int nl = 0;
    for (int i = 0; i < n; i++) {
        if (b->logits && !b->logits[i]) continue;
        if (!b->logits && i != n - 1) continue;
        ie_rmsnorm_f32(w->xb + (size_t)nl * d, w->x + (size_t)i * d, w->output_norm, d, hp->rms_eps);
        nl++;
    }
    /* the output projection can be wider than max_batch rows of scratch:
     * run it in chunks straight into the caller's buffer */
    if (nl > 0 && logits_out) matmul1(w, &w->output, logits_out, w->xb, nl);
    return IE_OK;
}

void ie_worker_seq_clear(ie_worker_t *w, int seq)
{
    if (seq >= 0 && seq < w->opts.n_seq) w->seq_len[seq] = 0;
}

const ie_hparams_t *ie_worker_hparams(const ie_worker_t *w) { return &w->hp; }
int ie_worker_n_ctx(const ie_worker_t *w) { return w->opts.n_ctx; }
int ie_worker_max_batch(const ie_worker_t *w) { return w->opts.max_batch; }
int ie_worker_n_threads(const ie_worker_t *w) { return w->opts.n_threads; }
ie_isa_t ie_worker_isa(const ie_worker_t *w) { return w->ops->isa; }

static uint64_t mat_bytes(const wmat_t *m) { return ie_dtype_row_bytes(m->dtype, m->n_in) * (uint64_t)m->n_out; }

uint64_t ie_worker_bytes_per_token(const ie_worker_t *w)
{
    uint64_t s = mat_bytes(&w->output) + ie_dtype_row_bytes(w->tok_embd.dtype, w->tok_embd.n_in);
    for (int l = 0; l < w->hp.n_layer; l++) {
        const layer_t *L = &w->layers[l];
        /* a MoE layer streams its router and the k experts it uses */
        uint64_t k = w->hp.n_expert > 0 ? (uint64_t)w->hp.n_expert_used : 1;
        s += mat_bytes(&L->q) + mat_bytes(&L->k) + mat_bytes(&L->v) + mat_bytes(&L->o) +
             k * (mat_bytes(&L->gate) + mat_bytes(&L->up) + mat_bytes(&L->down)) +
             (w->hp.n_expert > 0 ? mat_bytes(&L->router) : 0) + 2 * (uint64_t)w->hp.n_embd * sizeof(float);
    }
    return s;
}
