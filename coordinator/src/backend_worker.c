/* backend_worker.c — the in-process backend (ie_backend.h): one
 * ie_worker_t, called directly. Every entry is the worker's own; the
 * cluster-only ones (hint, readiness, upkeep) are left out and default. */
#include "ie_backend.h"
#include "ie_kernels.h" /* ie_isa_name */

#include <stdlib.h>

/* The backend's own state beside the worker: the concatenated adapter
 * sets it made, by adapter id, freed when the id is removed. */
typedef struct wback {
    ie_worker_t *w;
    ie_lora_t *made[IE_WORKER_MAX_LORA];
} wback_t;

static ie_status_t w_step(void *self, const ie_batch_t *b, float *logits_out)
{
    return ie_worker_step(((wback_t *)self)->w, b, logits_out);
}

static void w_seq_clear(void *self, int seq) { ie_worker_seq_clear(((wback_t *)self)->w, seq); }

static ie_status_t w_seq_set_len(void *self, int seq, int n_pos)
{
    return ie_worker_seq_set_len(((wback_t *)self)->w, seq, n_pos);
}

static ie_status_t w_kv_bind(void *self, int seq, int first, const int32_t *pb, int n)
{
    return ie_worker_kv_bind(((wback_t *)self)->w, seq, first, pb, n);
}

static void w_stats(void *self, ie_backend_stats_t *out)
{
    const ie_worker_t *w = ((wback_t *)self)->w;
    out->isa = ie_isa_name(ie_worker_isa(w));
    out->hot_replicas = ie_worker_hot_replicas(w);
    out->hot_report = ie_worker_hot_report(w);
}

static ie_status_t w_lora_add(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    wback_t *wb = self;
    ie_status_t st;
    ie_lora_t *cat = NULL;
    const ie_lora_t *list[8];
    float scales[8];
    if (n == 1) return ie_worker_lora_add(wb->w, parts[0].lora, parts[0].scale, id_out);
    for (int i = 0; i < n; i++) list[i] = parts[i].lora, scales[i] = parts[i].scale;
    if ((st = ie_lora_concat(list, scales, n, &cat)) != IE_OK) return st;
    if ((st = ie_worker_lora_add(wb->w, cat, 1.0f, id_out)) != IE_OK) {
        ie_lora_destroy(&cat);
        return st;
    }
    wb->made[*id_out] = cat;
    return IE_OK;
}

static ie_status_t w_lora_remove(void *self, int id)
{
    wback_t *wb = self;
    ie_status_t st = ie_worker_lora_remove(wb->w, id);
    if (st == IE_OK) ie_lora_destroy(&wb->made[id]);
    return st;
}

/* Contract (ie_backend.h, ops.lora_bytes): the concatenated copy made
 * here for a set of several parts, plus the worker's own int8 copy. */
static uint64_t w_lora_bytes(void *self, int id)
{
    const wback_t *wb = self;
    if (id < 0 || id >= IE_WORKER_MAX_LORA) return 0;
    return (wb->made[id] ? wb->made[id]->bytes : 0) + ie_worker_lora_bytes(wb->w, id);
}

/* Contract (ie_backend.h, ops.lora_cost): one adapter gets no
 * concatenated copy, only the worker's own. */
static uint64_t w_lora_cost(void *self, const ie_lora_t *a) { return ie_worker_lora_cost(((wback_t *)self)->w, a); }

static void w_destroy(void *self)
{
    wback_t *wb = self;
    ie_worker_destroy(&wb->w);
    for (int i = 0; i < IE_WORKER_MAX_LORA; i++) ie_lora_destroy(&wb->made[i]);
    free(wb);
}

static const ie_backend_ops_t k_worker_ops = {
    .name = "worker",
    .step = w_step,
    .seq_clear = w_seq_clear,
    .seq_set_len = w_seq_set_len,
    .kv_bind = w_kv_bind,
    .lora_add = w_lora_add,
    .lora_remove = w_lora_remove,
    .lora_bytes = w_lora_bytes,
    .lora_cost = w_lora_cost,
    .stats = w_stats,
    .destroy = w_destroy,
};

ie_status_t ie_backend_worker_new(const ie_model_src_t *src, const ie_worker_opts_t *o, ie_backend_t **out)
{
    ie_worker_t *w = NULL;
    wback_t *wb = NULL;
    *out = NULL;
    ie_status_t st = ie_worker_new(src, o, &w);
    if (st != IE_OK) return st;
    if (!(wb = calloc(1, sizeof *wb))) {
        ie_worker_destroy(&w);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    wb->w = w;
    /* nothing to keep alive between steps: a serving loop may sleep long */
    ie_backend_geom_t g = {.n_seq = o->n_seq,
                           .n_ctx = ie_worker_n_ctx(w),
                           .max_batch = ie_worker_max_batch(w),
                           .kv_block = ie_worker_kv_block(w),
                           .kv_blocks = ie_worker_kv_blocks(w),
                           .n_vocab = ie_worker_hparams(w)->n_vocab,
                           .n_embd = ie_worker_hparams(w)->n_embd,
                           .upkeep_ms = 50,
                           .kv_ring_len = ie_worker_kv_ring_len(w)};
    return ie_backend_new(&k_worker_ops, wb, &g, out);
}
