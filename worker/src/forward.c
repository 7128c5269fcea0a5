/* forward.c — the forward pass: one step of n tokens through the model.
 *
 *   forward:  check the batch -> embed -> per layer: attention block,
 *             feed-forward block (dense MLP or MoE) -> final norm + head
 *
 * Read this file top to bottom as the model. Shapes: n tokens in the step,
 * d = n_embd, q_dim / kv_dim = the query / KV heads held times head_dim,
 * ff = the MLP columns held. Everything the architecture decides comes from
 * the descriptor w->arch (ie_arch_desc.h), never from its name. The
 * machinery stays behind calls: the matmuls' thread split and kernel
 * failures (matmul.c), the idle threads' prefetch (worker_prefetch_at at
 * the declared points, prefetch.c), the KV cache's blocks (attention.c),
 * NUMA copies of the head and embedding (replicas.c). A tensor-parallel
 * rank holds a slice of each matrix: the two partial results of a layer are
 * summed across ranks (reduce) before they join the residual stream.
 */
#include "ie_prof.h"
#include "worker_internal.h"

#include <math.h>
#include <string.h>

/* Sum a tensor-parallel partial result across ranks (no-op otherwise);
 * *index counts the step's reductions. */
static ie_status_t reduce(ie_worker_t *w, int *index, float *buf, size_t n)
{
    if (!w->tensor_par) return IE_OK;
    return w->opts.reduce(w->opts.reduce_ctx, (*index)++, buf, n); /* its message kept */
}

/* out[n][d] = rmsnorm(x[n][d]) * weight[d] */
static void rmsnorm_rows(const ie_worker_t *w, float *out, const float *x, const float *weight, int n)
{
    const int d = w->hp.n_embd;
    for (int i = 0; i < n; i++) w->ops->rmsnorm(out + (size_t)i * d, x + (size_t)i * d, weight, d, w->hp.rms_eps);
}

/* Validate the whole batch before touching the cache: sizes, token ids,
 * slots, positions (a slot's positions continue its cache: track the next
 * expected one), and the KV blocks they write and read. */
static ie_status_t batch_check(const ie_worker_t *w, const ie_batch_t *b, const float *hidden_in)
{
    const int n = b->n;
    if (n < 1 || n > w->opts.max_batch)
        return ie_error_set(IE_ERR_INVAL, "worker: batch of %d tokens (max %d)", n, w->opts.max_batch);
    if (!hidden_in && !w->sh.has_embed)
        return ie_error_set(IE_ERR_INVAL, "worker: this shard (layers %d..%d) has no embedding: it needs hidden_in",
                            w->sh.layer_begin, w->sh.layer_end);
    for (int i = 0; i < n; i++) {
        if (!hidden_in && (b->tokens[i] < 0 || b->tokens[i] >= w->hp.n_vocab))
            return ie_error_set(IE_ERR_RANGE, "worker: token id %d out of range [0, %d)", b->tokens[i],
                                w->hp.n_vocab);
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
        if (b->logits && b->logits[i] == IE_LOGITS_EMBD && w->sh.has_head && !b->embd)
            return ie_error_set(IE_ERR_INVAL,
                                "worker: entry %d asks for its hidden state and the batch has no embd", i);
        ie_status_t st = worker_kv_check(w, b, i);
        if (st == IE_OK) st = worker_lora_check(w, b, i);
        if (st != IE_OK) return st;
    }
    return IE_OK;
}

/* x[n][d] = the tokens' embedding rows (times arch.embd_scale when set:
 * Gemma's sqrt(d)), or the previous stage's hidden_in */
static void embed(ie_worker_t *w, const ie_batch_t *b, const float *hidden_in)
{
    const int d = w->hp.n_embd;
    if (hidden_in) {
        memcpy(w->x, hidden_in, (size_t)b->n * d * sizeof(float));
        return;
    }
    const wmat_t *te = worker_embedding(w); /* looked up on the calling thread */
    for (int i = 0; i < b->n; i++) worker_mat_row(te, b->tokens[i], w->x + (size_t)i * d);
    if (w->arch.embd_scale != 0.0f)
        for (size_t i = 0; i < (size_t)b->n * d; i++) w->x[i] *= w->arch.embd_scale;
}

/* y[n][d] = c tanh(y / c) (Gemma's soft-capping), in place */
static void softcap_rows(float *y, size_t count, float c)
{
    const float inv = 1.0f / c;
    for (size_t i = 0; i < count; i++) y[i] = c * tanhf(y[i] * inv);
}

/* Layer l's attention block: x[n][d] += Wo · attention(rmsnorm(x)) */
static ie_status_t attention_block(ie_worker_t *w, int l, const ie_batch_t *b, int *ridx)
{
    const layer_t *L = &w->layers[l];
    const int n = b->n, d = w->hp.n_embd;
    ie_status_t st;

    /* xb[n][d] = rmsnorm(x) * attn_norm */
    uint64_t t = ie_prof_begin();
    rmsnorm_rows(w, w->xb, w->x, L->attn_norm, n);
    ie_prof_end(IE_PROF_NORM, t);
    /* q[n][q_dim], k[n][kv_dim], v[n][kv_dim] = Wq, Wk, Wv · xb (+ biases) */
    worker_prefetch_at(w, PF_BEFORE_QKV, l, n);
    /* + the adapters' low-rank paths (lora.c; nothing when none runs):
     * A x rides on the base matmul's job, B (A x) is added after it */
    {
        static const ie_lora_mod_t qkv[3] = {IE_LORA_Q, IE_LORA_K, IE_LORA_V};
        float *const ys[3] = {w->q, w->k, w->v};
        worker_lora_begin(w, l, 3, qkv, ys, w->xb);
    }
    if ((st = worker_qkv(w, l, b)) != IE_OK) return st;
    worker_lora_end(w);
    t = ie_prof_begin();
    if (w->arch.qkv_bias)
        for (int i = 0; i < n; i++) {
            worker_vec_add(w->q + (size_t)i * w->q_dim, L->bq, w->q_dim);
            worker_vec_add(w->k + (size_t)i * w->kv_dim, L->bk, w->kv_dim);
            worker_vec_add(w->v + (size_t)i * w->kv_dim, L->bv, w->kv_dim);
        }
    ie_prof_end(IE_PROF_ELEMENTWISE, t);
    /* q, k heads = rmsnorm(head) * q_norm / k_norm (Qwen3, Gemma 3) */
    t = ie_prof_begin();
    if (w->arch.qk_norm) {
        const int hd = w->hp.head_dim;
        for (int64_t h = 0; h < (int64_t)n * w->q_dim / hd; h++)
            w->ops->rmsnorm(w->q + h * hd, w->q + h * hd, L->q_norm, hd, w->hp.rms_eps);
        for (int64_t h = 0; h < (int64_t)n * w->kv_dim / hd; h++)
            w->ops->rmsnorm(w->k + h * hd, w->k + h * hd, L->k_norm, hd, w->hp.rms_eps);
    }
    ie_prof_end(IE_PROF_NORM, t);
    /* rotate q and k by their positions (RoPE) */
    t = ie_prof_begin();
    worker_rope(w, l, b);
    ie_prof_end(IE_PROF_ELEMENTWISE, t);
    /* k, v -> the slot's cache at each token's position; xb[n][q_dim] =
     * softmax(q·K^T / sqrt(hd) [, sink]) · V per (token, head), over the
     * positions each token sees (a sliding layer: the last W) */
    t = ie_prof_begin();
    worker_kv_store_attend(w, l, b);
    ie_prof_end(IE_PROF_ATTENTION, t);
    /* tmp[n][d] = Wo · xb (+ bias, added by tensor rank 0 only) */
    worker_prefetch_at(w, PF_BEFORE_O, l, n);
    worker_lora_begin(w, l, 1, (const ie_lora_mod_t[]){IE_LORA_O}, &w->tmp, w->xb);
    if ((st = worker_matmul(w, &L->o, w->tmp, w->xb, n)) != IE_OK) return st;
    worker_lora_end(w);
    if (w->arch.o_bias && L->bo)
        for (int i = 0; i < n; i++) worker_vec_add(w->tmp + (size_t)i * d, L->bo, d);
    /* summed across tensor ranks; a sandwich norm on the whole sum (Gemma:
     * post_attention_norm), then the residual connection back into x */
    t = ie_prof_begin();
    if ((st = reduce(w, ridx, w->tmp, (size_t)n * d)) != IE_OK) return st;
    ie_prof_end(IE_PROF_REDUCE, t);
    t = ie_prof_begin();
    if (L->post_attn_norm) rmsnorm_rows(w, w->tmp, w->tmp, L->post_attn_norm, n);
    worker_vec_add(w->x, w->tmp, (int64_t)n * d);
    ie_prof_end(IE_PROF_ELEMENTWISE, t);
    return IE_OK;
}

/* Layer l's dense MLP on xb[n][d]: tmp[n][d] = Wd · (act(Wg · xb) * (Wu · xb)),
 * act silu or GELU (the descriptor's) */
static ie_status_t mlp_dense(ie_worker_t *w, int l, int n)
{
    const layer_t *L = &w->layers[l];
    ie_status_t st;

    /* hb[n][ff], hb2[n][ff] = Wg, Wu · xb (one job) */
    worker_prefetch_at(w, PF_BEFORE_GATE_UP, l, n);
    const wmat_t *ms[2] = {&L->gate, &L->up};
    float *ys[2] = {w->hb, w->hb2};
    worker_lora_begin(w, l, 2, (const ie_lora_mod_t[]){IE_LORA_GATE, IE_LORA_UP}, ys, w->xb);
    if ((st = worker_matmul_group(w, 2, ms, ys, w->xb, n)) != IE_OK) return st;
    worker_lora_end(w);
    /* hb = act(hb) * hb2 */
    const uint64_t t = ie_prof_begin();
    worker_swiglu(w, w->hb, w->hb2, (int64_t)n * w->ff_loc);
    ie_prof_end(IE_PROF_ELEMENTWISE, t);
    /* tmp[n][d] = Wd · hb */
    worker_prefetch_at(w, PF_BEFORE_DOWN, l, n);
    worker_lora_begin(w, l, 1, (const ie_lora_mod_t[]){IE_LORA_DOWN}, &w->tmp, w->hb);
    if ((st = worker_matmul(w, &L->down, w->tmp, w->hb, n)) != IE_OK) return st;
    worker_lora_end(w);
    return IE_OK;
}

/* Layer l's feed-forward block: x[n][d] += ffn(rmsnorm(x)), dense or MoE */
static ie_status_t ffn_block(ie_worker_t *w, int l, int n, int *ridx)
{
    const layer_t *L = &w->layers[l];
    const int d = w->hp.n_embd;
    const int moe = w->arch.ffn == IE_FFN_MOE;
    ie_status_t st;

    /* xb[n][d] = rmsnorm(x) * ffn_norm */
    uint64_t t = ie_prof_begin();
    rmsnorm_rows(w, w->xb, w->x, L->ffn_norm, n);
    ie_prof_end(IE_PROF_NORM, t);
    /* y[n][d] = the dense MLP (into tmp) or the mixture of experts (into moe) */
    float *y = moe ? w->moe : w->tmp;
    if ((st = moe ? worker_moe(w, L, n) : mlp_dense(w, l, n)) != IE_OK) return st;
    /* summed across tensor ranks; a sandwich norm on the whole sum (Gemma:
     * post_ffw_norm), then the residual connection back into x */
    t = ie_prof_begin();
    if ((st = reduce(w, ridx, y, (size_t)n * d)) != IE_OK) return st;
    ie_prof_end(IE_PROF_REDUCE, t);
    t = ie_prof_begin();
    if (L->post_ffw_norm) rmsnorm_rows(w, y, y, L->post_ffw_norm, n);
    worker_vec_add(w->x, y, (int64_t)n * d);
    ie_prof_end(IE_PROF_ELEMENTWISE, t);
    return IE_OK;
}

/* logits[nl][vocab held] = Wout · rmsnorm(x) for the nl tokens that asked
 * (b->logits[i] FULL or ARGMAX, or the last token when b->logits is NULL),
 * soft-capped when arch.final_softcap is set (elementwise: each rank caps
 * its own vocabulary slice); b->embd[ne][d] = rmsnorm(x) itself for the
 * entries that asked IE_LOGITS_EMBD (an embedding: the head's input). The
 * head can be wider than max_batch rows of scratch: it writes straight
 * into logits (NULL: no entry wants logits). */
static ie_status_t head(ie_worker_t *w, const ie_batch_t *b, float *logits)
{
    const int d = w->hp.n_embd;
    /* xb[nl][d] = rmsnorm(x) * output_norm, gathered; embd rows likewise */
    int nl = 0, ne = 0;
    const uint64_t t = ie_prof_begin();
    for (int i = 0; i < b->n; i++) {
        const int f = b->logits ? b->logits[i] : i == b->n - 1;
        if (!f) continue;
        const float *xi = w->x + (size_t)i * d;
        if (f == IE_LOGITS_EMBD) {
            if (b->embd) w->ops->rmsnorm(b->embd + (size_t)ne++ * d, xi, w->output_norm, d, w->hp.rms_eps);
            continue;
        }
        w->ops->rmsnorm(w->xb + (size_t)nl * d, xi, w->output_norm, d, w->hp.rms_eps);
        nl++;
    }
    ie_prof_end(IE_PROF_NORM, t);
    if (nl == 0 || !logits) return IE_OK;
    /* logits = Wout · xb */
    worker_prefetch_at(w, PF_BEFORE_HEAD, w->sh.layer_begin, nl);
    ie_status_t st = worker_matmul_head(w, logits, w->xb, nl);
    if (st == IE_OK && w->arch.final_softcap != 0.0f)
        softcap_rows(logits, (size_t)nl * (size_t)(w->sh.vocab_end - w->sh.vocab_begin), w->arch.final_softcap);
    return st;
}

/* The forward pass of every step entry point: hidden_in (NULL: embed the
 * tokens), this shard's layers, hidden_out, then the head; `layers`
 * (ie_worker_step_hidden) gets the residual stream after each held layer. */
static ie_status_t forward(ie_worker_t *w, const ie_batch_t *b, const float *hidden_in, float *hidden_out,
                           float *logits_out, float *layers)
{
    const ie_shard_range_t *sh = &w->sh;
    const size_t nd = (size_t)b->n * w->hp.n_embd;
    int ridx = 0; /* tensor-parallel reductions so far */
    ie_status_t st;

    if ((st = batch_check(w, b, hidden_in)) != IE_OK) return st;
    w->step_logits = logits_out != NULL;
    worker_lora_group(w, b);
    /* x[n][d] = embeddings, or the previous stage's residual stream */
    embed(w, b, hidden_in);
    for (int l = sh->layer_begin; l < sh->layer_end; l++) {
        /* x += attention(x); x += ffn(x) */
        if ((st = attention_block(w, l, b, &ridx)) != IE_OK) return st;
        if ((st = ffn_block(w, l, b->n, &ridx)) != IE_OK) return st;
        if (layers) memcpy(layers + (size_t)(l - sh->layer_begin) * nd, w->x, nd * sizeof(float));
    }
    /* the slot caches now hold these positions */
    worker_kv_commit(w, b);
    if (hidden_out) memcpy(hidden_out, w->x, nd * sizeof(float));
    /* logits for the tokens that asked */
    if (!sh->has_head || (!logits_out && !b->embd)) return IE_OK;
    return head(w, b, logits_out);
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_step(ie_worker_t *w, const ie_batch_t *b, float *logits_out)
{
    return forward(w, b, NULL, NULL, logits_out, NULL);
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_step_hidden(ie_worker_t *w, const ie_batch_t *b, float *logits_out, float *hidden)
{
    return forward(w, b, NULL, NULL, logits_out, hidden);
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_step_shard(ie_worker_t *w, const ie_batch_t *b, const float *hidden_in, float *hidden_out,
                                 float *logits_out)
{
    return forward(w, b, hidden_in, hidden_out, logits_out, NULL);
}
