/* backend_worker.c — the in-process backend (ie_backend.h): one
 * ie_worker_t, called directly. Every entry is the worker's own; the
 * cluster-only ones (hint, readiness, upkeep) are left out and default. */
#include "ie_backend.h"
#include "ie_kernels.h" /* ie_isa_name */

static ie_status_t w_step(void *self, const ie_batch_t *b, float *logits_out)
{
    return ie_worker_step(self, b, logits_out);
}

static void w_seq_clear(void *self, int seq) { ie_worker_seq_clear(self, seq); }

static ie_status_t w_seq_set_len(void *self, int seq, int n_pos) { return ie_worker_seq_set_len(self, seq, n_pos); }

static ie_status_t w_kv_bind(void *self, int seq, int first, const int32_t *pb, int n)
{
    return ie_worker_kv_bind(self, seq, first, pb, n);
}

static void w_stats(void *self, ie_backend_stats_t *out)
{
    const ie_worker_t *w = self;
    out->isa = ie_isa_name(ie_worker_isa(w));
    out->hot_replicas = ie_worker_hot_replicas(w);
    out->hot_report = ie_worker_hot_report(w);
}

static ie_status_t w_lora_add(void *self, const ie_lora_t *a, float scale, int *id_out)
{
    return ie_worker_lora_add(self, a, scale, id_out);
}

static void w_destroy(void *self)
{
    ie_worker_t *w = self;
    ie_worker_destroy(&w);
}

static const ie_backend_ops_t k_worker_ops = {
    .name = "worker",
    .step = w_step,
    .seq_clear = w_seq_clear,
    .seq_set_len = w_seq_set_len,
    .kv_bind = w_kv_bind,
    .lora_add = w_lora_add,
    .stats = w_stats,
    .destroy = w_destroy,
};

ie_status_t ie_backend_worker_new(const ie_model_src_t *src, const ie_worker_opts_t *o, ie_backend_t **out)
{
    ie_worker_t *w = NULL;
    *out = NULL;
    ie_status_t st = ie_worker_new(src, o, &w);
    if (st != IE_OK) return st;
    /* nothing to keep alive between steps: a serving loop may sleep long */
    ie_backend_geom_t g = {.n_seq = o->n_seq,
                           .n_ctx = ie_worker_n_ctx(w),
                           .max_batch = ie_worker_max_batch(w),
                           .kv_block = ie_worker_kv_block(w),
                           .kv_blocks = ie_worker_kv_blocks(w),
                           .n_vocab = ie_worker_hparams(w)->n_vocab,
                           .upkeep_ms = 50};
    return ie_backend_new(&k_worker_ops, w, &g, out);
}
