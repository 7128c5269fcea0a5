/* probe.c — how many weight bytes a decode step streams, and how fast
 * this machine can stream them (ie_worker_stream_probe: the ceiling a
 * decode benchmark is compared with). The probe reads the matrices as the
 * matmuls cut them between threads, computing nothing.
 */
#include "worker_internal.h"

#include <stdlib.h>
#include <time.h>

static uint64_t mat_bytes(const wmat_t *m) { return m->slice; }

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
    if (w->arch.ffn == IE_FFN_MOE) {
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
        if (w->arch.ffn == IE_FFN_MOE) {
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
        if (w->arch.ffn == IE_FFN_MOE) {
            const uint64_t held = (uint64_t)(w->sh.expert_end - w->sh.expert_begin);
            k = ((uint64_t)w->hp.n_expert_used * held + (uint64_t)w->hp.n_expert - 1) / (uint64_t)w->hp.n_expert;
        }
        s += mat_bytes(&L->q) + mat_bytes(&L->k) + mat_bytes(&L->v) + mat_bytes(&L->o) +
             k * (mat_bytes(&L->gate) + mat_bytes(&L->up) + mat_bytes(&L->down)) +
             (w->arch.ffn == IE_FFN_MOE ? mat_bytes(&L->router) : 0) + 2 * (uint64_t)w->hp.n_embd * sizeof(float);
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
        if (w->arch.ffn == IE_FFN_MOE) f += (uint64_t)hp->n_expert + ne * (2 * (uint64_t)hp->n_ff + (uint64_t)d);
        s += f * sizeof(float);
    }
#undef STACK
    return s;
}
