/* lora.c — LoRA adapters on the forward pass: the table of attached
 * adapters and the low-rank path of each adapted projection.
 *
 * The base matmul runs once for every token of the step; then, for each
 * adapter the step uses, the tokens that asked for it (grouped once per
 * step, worker_lora_group) get y += scale * B (A x) through the kernels'
 * lora_f32 (lora_bf16 for an adapter kept in bf16), one row at a time,
 * the rows of q/k/v (gate/up) in one pool job when the work outweighs a
 * fork/join. Adapters are never merged into the base weights.
 * A tensor-parallel rank runs its slice in place: B's rows of the
 * row-split projections (q, k, v, gate, up: the rows the rank's output
 * holds), A's columns of the column-split ones (o, down: the partial sum
 * the reduce then adds up like the base's).
 */
#include "worker_internal.h"

#include <stdlib.h>
#include <string.h>

/* Contract (ie_worker.h). */
ie_status_t ie_worker_lora_add(ie_worker_t *w, const ie_lora_t *a, float scale, int *id_out)
{
    ie_status_t st = IE_OK;
    int id = -1;
    if (!w || !a || !id_out) return ie_error_set(IE_ERR_INVAL, "worker: lora_add: NULL argument");
    if (a->n_layer != w->hp.n_layer)
        return ie_error_set(IE_ERR_INVAL, "worker: adapter made for %d layers; the model has %d", a->n_layer,
                            w->hp.n_layer);
    if (w->arch.ffn == IE_FFN_MOE && (a->mods >> IE_LORA_GATE))
        return ie_error_set(IE_ERR_UNSUPPORTED, "worker: adapter adapts the MLP of a mixture-of-experts model");
    for (int i = 0; i < IE_WORKER_MAX_LORA; i++)
        if (!w->lora[i].ad) {
            id = i;
            break;
        }
    if (id < 0) return ie_error_set(IE_ERR_RANGE, "worker: %d adapters attached already", IE_WORKER_MAX_LORA);
    const size_t B = (size_t)w->opts.max_batch;
    if (!w->lora_rows && !(w->lora_rows = malloc(B * sizeof *w->lora_rows))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if (a->max_rank > w->lora_tmp_rank) {
        float *t = realloc(w->lora_tmp, 3 * B * (size_t)a->max_rank * sizeof *t); /* a block per module of a job */
        if (!t) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        w->lora_tmp = t;
        w->lora_tmp_rank = a->max_rank;
    }
    {
        /* env IE_LORA_POOL_MIN: the multiply-adds under which a call runs
         * on the calling thread (tests set 0 to drive the pool path) */
        const char *e = getenv("IE_LORA_POOL_MIN");
        w->lora_pool_min = e && *e ? atof(e) : 2e5;
    }
    w->lora[id].ad = a;
    w->lora[id].scale = scale;
    *id_out = id;

cleanup:
    return st;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_lora_remove(ie_worker_t *w, int id)
{
    if (!w || id < 0 || id >= IE_WORKER_MAX_LORA || !w->lora[id].ad)
        return ie_error_set(IE_ERR_RANGE, "worker: no adapter %d attached", id);
    w->lora[id].ad = NULL;
    return IE_OK;
}

/* Contract (worker_internal.h). */
ie_status_t worker_lora_check(const ie_worker_t *w, const ie_batch_t *b, int i)
{
    if (!b->adapter || b->adapter[i] == -1) return IE_OK;
    const int id = b->adapter[i];
    if (id < 0 || id >= IE_WORKER_MAX_LORA || !w->lora[id].ad)
        return ie_error_set(IE_ERR_RANGE, "worker: token %d asks for adapter %d, which is not attached", i, id);
    return IE_OK;
}

/* Contract (worker_internal.h). */
void worker_lora_group(ie_worker_t *w, const ie_batch_t *b)
{
    w->lora_ngroups = 0;
    if (!b->adapter) return;
    /* counting sort of the batch rows by adapter id, in batch order */
    int cnt[IE_WORKER_MAX_LORA] = {0};
    for (int i = 0; i < b->n; i++)
        if (b->adapter[i] >= 0) cnt[b->adapter[i]]++;
    int off = 0;
    for (int id = 0; id < IE_WORKER_MAX_LORA; id++) {
        if (!cnt[id]) continue;
        w->lora_groups[w->lora_ngroups++] = (lora_group_t){id, off, 0};
        off += cnt[id];
    }
    for (int i = 0; i < b->n; i++) {
        if (b->adapter[i] < 0) continue;
        for (int g = 0; g < w->lora_ngroups; g++)
            if (w->lora_groups[g].id == b->adapter[i]) {
                lora_group_t *gr = &w->lora_groups[g];
                w->lora_rows[gr->first + gr->n++] = i;
                break;
            }
    }
}

/* The kernel arguments of module m of layer l for group g (rank 0: the
 * adapter leaves that projection alone), cut to this rank's slice. */
static int lora_args(const ie_worker_t *w, int l, ie_lora_mod_t m, int g, float *y, const float *x,
                     ie_lora_args_t *p)
{
    const ie_shard_range_t *sh = &w->sh;
    const int hd = w->hp.head_dim, id = w->lora_groups[g].id;
    const ie_lora_mat_t *mt = ie_lora_mat(w->lora[id].ad, l, m);
    if (!mt || !mt->rank) return 0;
    *p = (ie_lora_args_t){.a = mt->a,
                          .bt = mt->bt,
                          .a16 = mt->a16,
                          .bt16 = mt->bt16,
                          .lda = mt->n_in,
                          .ldb = mt->n_out,
                          .rank = mt->rank,
                          .n_in = mt->n_in,
                          .n_out = mt->n_out,
                          .scale = mt->scale * w->lora[id].scale,
                          .x = x,
                          .y = y};
    /* element offsets of the slice (f32 or bf16 alike) */
    int64_t a_off = 0, b_off = 0;
    switch (m) {
    case IE_LORA_Q: b_off = (int64_t)sh->head_begin * hd, p->n_out = w->q_dim; break;
    case IE_LORA_K:
    case IE_LORA_V: b_off = (int64_t)sh->kv_head_begin * hd, p->n_out = w->kv_dim; break;
    case IE_LORA_GATE:
    case IE_LORA_UP: b_off = sh->ff_begin, p->n_out = w->ff_loc; break;
    case IE_LORA_O: a_off = (int64_t)sh->head_begin * hd, p->n_in = w->q_dim; break;
    case IE_LORA_DOWN: a_off = sh->ff_begin, p->n_in = w->ff_loc; break;
    default: break;
    }
    if (mt->a16) p->a16 += a_off, p->bt16 += b_off;
    else p->a += a_off, p->bt += b_off;
    p->ldx = p->n_in;
    p->ldy = p->n_out;
    return 1;
}

/* One pool job over every (module, group, row) of a worker_lora_apply
 * call: unit u goes to thread u % nth. Each (module, row) has its own
 * slice of lora_tmp (a row sits in one group; block i per module), so
 * units never share memory. */
typedef struct lora_job {
    ie_worker_t *w;
    ie_lora_args_t args[3 * IE_WORKER_MAX_LORA];
    int grp[3 * IE_WORKER_MAX_LORA]; /* args[k]'s group                */
    int mi[3 * IE_WORKER_MAX_LORA];  /* ... and module (its tmp block)  */
    int n_args;
} lora_job_t;

static void lora_run(void *ctx, int ith, int nth)
{
    lora_job_t *j = ctx;
    const ie_worker_t *w = j->w;
    int u = 0;
    for (int k = 0; k < j->n_args; k++) {
        const lora_group_t *gr = &w->lora_groups[j->grp[k]];
        float *tmp = w->lora_tmp + (size_t)j->mi[k] * (size_t)w->opts.max_batch * (size_t)w->lora_tmp_rank;
        for (int r = 0; r < gr->n; r++, u++)
            if (u % nth == ith)
                (j->args[k].a16 ? w->ops->lora_bf16
                                : w->ops->lora_f32)(&j->args[k], w->lora_rows + gr->first + r, 1,
                                                    tmp + (size_t)(gr->first + r) * (size_t)j->args[k].rank);
    }
}

/* Contract (worker_internal.h). */
void worker_lora_apply(ie_worker_t *w, int l, int nm, const ie_lora_mod_t *ms, float *const *ys, const float *x)
{
    if (!w->lora_ngroups) return;
    lora_job_t j;
    j.w = w;
    j.n_args = 0;
    double fma = 0;
    for (int i = 0; i < nm; i++)
        for (int g = 0; g < w->lora_ngroups; g++) {
            ie_lora_args_t *p = &j.args[j.n_args];
            if (!lora_args(w, l, ms[i], g, ys[i], x, p)) continue;
            j.grp[j.n_args] = g;
            j.mi[j.n_args++] = i;
            fma += (double)w->lora_groups[g].n * p->rank * (double)(p->n_in + p->n_out);
        }
    /* small work: the fork/join (~15-30 us on the pool) would cost more */
    if (fma < w->lora_pool_min || w->opts.n_threads < 2) lora_run(&j, 0, 1);
    else ie_threadpool_run(w->tp, lora_run, &j);
}

/* Contract (worker_internal.h). */
void worker_lora_free(ie_worker_t *w)
{
    free(w->lora_rows);
    free(w->lora_tmp);
    w->lora_rows = NULL;
    w->lora_tmp = NULL;
}
