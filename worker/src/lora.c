/* lora.c — LoRA adapters on the forward pass: the table of attached
 * adapters and the low-rank path of each adapted projection.
 *
 * The base matmul runs once for every token of the step; then, for each
 * adapter the step uses, the tokens that asked for it (grouped once per
 * step, worker_lora_group) get y += scale * B (A x) through the kernels'
 * lora_f32 — A is read once per group and row of the shrink, B^T once per
 * token of the expand. Adapters are never merged into the base weights.
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
        float *t = realloc(w->lora_tmp, B * (size_t)a->max_rank * sizeof *t);
        if (!t) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        w->lora_tmp = t;
        w->lora_tmp_rank = a->max_rank;
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

/* Contract (worker_internal.h). */
void worker_lora_apply(ie_worker_t *w, int l, ie_lora_mod_t m, float *y, const float *x)
{
    const ie_shard_range_t *sh = &w->sh;
    const int hd = w->hp.head_dim;
    for (int g = 0; g < w->lora_ngroups; g++) {
        const lora_group_t *gr = &w->lora_groups[g];
        const ie_lora_mat_t *mt = ie_lora_mat(w->lora[gr->id].ad, l, m);
        if (!mt || !mt->rank) continue;
        ie_lora_args_t p = {.a = mt->a,
                            .bt = mt->bt,
                            .lda = mt->n_in,
                            .ldb = mt->n_out,
                            .rank = mt->rank,
                            .n_in = mt->n_in,
                            .n_out = mt->n_out,
                            .scale = mt->scale * w->lora[gr->id].scale,
                            .x = x,
                            .y = y};
        /* this rank's slice (whole cuts when unsharded) */
        switch (m) {
        case IE_LORA_Q: p.bt += (size_t)sh->head_begin * hd, p.n_out = w->q_dim; break;
        case IE_LORA_K:
        case IE_LORA_V: p.bt += (size_t)sh->kv_head_begin * hd, p.n_out = w->kv_dim; break;
        case IE_LORA_GATE:
        case IE_LORA_UP: p.bt += sh->ff_begin, p.n_out = w->ff_loc; break;
        case IE_LORA_O: p.a += (size_t)sh->head_begin * hd, p.n_in = w->q_dim; break;
        case IE_LORA_DOWN: p.a += sh->ff_begin, p.n_in = w->ff_loc; break;
        default: break;
        }
        p.ldx = p.n_in;
        p.ldy = p.n_out;
        w->ops->lora_f32(&p, w->lora_rows + gr->first, gr->n, w->lora_tmp);
    }
}

/* Contract (worker_internal.h). */
void worker_lora_free(ie_worker_t *w)
{
    free(w->lora_rows);
    free(w->lora_tmp);
    w->lora_rows = NULL;
    w->lora_tmp = NULL;
}
