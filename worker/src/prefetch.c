/* prefetch.c — idle threads fetch the next decode matmul's weights.
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
 * job's publication. Weights are read-only after load.
 *
 * The forward pass names no matrix itself: it calls worker_prefetch_at at
 * declared points (PF_BEFORE_*), and the plan of what comes next lives
 * here, next to the fetching. */
#include "worker_internal.h"

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
    if (m->layout == IE_LAYOUT_PANEL16) unit = ie_pack_panel_bytes(m->dtype, m->group, m->n_in);
    else if (m->layout == IE_LAYOUT_ROWS) unit = (size_t)IE_PANEL * ie_dtype_row_bytes(m->dtype, m->n_in);
    else return;
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

/* Contract (worker_internal.h). */
ie_status_t worker_prefetch_new(ie_worker_t *w)
{
    atomic_init(&w->pf_next, NULL);
    if (w->opts.n_threads <= 1) return IE_OK;
    w->pf = worker_big_alloc((size_t)w->opts.n_threads * sizeof *w->pf);
    if (!w->pf) return ie_error_set(IE_ERR_NOMEM, "out of memory: worker scratch");
    w->idle_hook = (ie_idle_t){worker_idle, w};
    ie_threadpool_set_idle(w->tp, &w->idle_hook);
    return IE_OK;
}

/* Contract (worker_internal.h). The matmul jobs of a layer run q/k/v, o,
 * gate/up, down; at each point the idle threads fetch the first matrix of
 * the job after the next one (the next job's own threads are busy). */
void worker_prefetch_at(ie_worker_t *w, worker_pf_point_t at, int l, int n)
{
    const ie_shard_range_t *sh = &w->sh;
    const layer_t *L = &w->layers[l];
    switch (at) {
    case PF_BEFORE_QKV: pf_set(w, &L->o, n); break;
    case PF_BEFORE_O: pf_set(w, w->arch.ffn == IE_FFN_MOE ? NULL : &L->gate, n); break;
    case PF_BEFORE_GATE_UP: pf_set(w, &L->down, n); break;
    case PF_BEFORE_DOWN:
        /* then the next layer's q, or the head (per-node copies: not fetched) */
        pf_set(w,
               l + 1 < sh->layer_end                             ? &w->layers[l + 1].q
               : sh->has_head && w->step_logits && !w->head_repl ? &w->output
                                                                 : NULL,
               n);
        break;
    case PF_BEFORE_HEAD:
        /* after the head, the idle threads fetch the first layer's q for
         * the next step (sampling and scheduling run meanwhile) */
        pf_set(w, sh->layer_end > sh->layer_begin ? &w->layers[sh->layer_begin].q : NULL, n);
        break;
    }
}
