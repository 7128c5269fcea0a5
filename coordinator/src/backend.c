/* backend.c — the step boundary's wrapper (ie_backend.h): one table of
 * functions and its self, and the defaults of the optional entries.
 * The implementations are backend_worker.c and cluster.c. */
#include "ie_backend.h"

#include <stdlib.h>

struct ie_backend {
    const ie_backend_ops_t *ops;
    void *self;
    ie_backend_geom_t geom;
};

ie_status_t ie_backend_new(const ie_backend_ops_t *ops, void *self, const ie_backend_geom_t *geom,
                           ie_backend_t **out)
{
    ie_status_t st = IE_OK;
    ie_backend_t *b = NULL;
    *out = NULL;
    if (!ops || !geom || !ops->step || !ops->seq_clear || !ops->seq_set_len || !ops->kv_bind) {
        st = ie_error_set(IE_ERR_INVAL, "backend: a required entry is missing");
        goto cleanup;
    }
    if (geom->n_seq < 1 || geom->n_ctx < 1 || geom->max_batch < 1 || geom->kv_block < 1 || geom->kv_blocks < 1 ||
        geom->n_vocab < 1 || geom->upkeep_ms < 1) {
        st = ie_error_set(IE_ERR_INVAL,
                          "backend %s: bad geometry (slots %d, context %d, batch %d, KV block %d, "
                          "blocks %d, vocabulary %d, upkeep %d ms)",
                          ops->name ? ops->name : "?", geom->n_seq, geom->n_ctx, geom->max_batch, geom->kv_block,
                          geom->kv_blocks, (int)geom->n_vocab, geom->upkeep_ms);
        goto cleanup;
    }
    if (!(b = calloc(1, sizeof *b))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    b->ops = ops;
    b->self = self;
    b->geom = *geom;

cleanup:
    if (st != IE_OK) {
        if (ops && ops->destroy) ops->destroy(self); /* self is ours from the call on */
        return st;
    }
    *out = b;
    return IE_OK;
}

void ie_backend_destroy(ie_backend_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_backend_t *b = *self_p;
    if (b->ops->destroy) b->ops->destroy(b->self);
    free(b);
    *self_p = NULL;
}

const ie_backend_geom_t *ie_backend_geom(const ie_backend_t *b) { return &b->geom; }
const char *ie_backend_name(const ie_backend_t *b) { return b->ops->name ? b->ops->name : ""; }

ie_status_t ie_backend_step(ie_backend_t *b, const ie_batch_t *batch, float *logits_out)
{
    return b->ops->step(b->self, batch, logits_out);
}

void ie_backend_seq_clear(ie_backend_t *b, int seq) { b->ops->seq_clear(b->self, seq); }

ie_status_t ie_backend_seq_set_len(ie_backend_t *b, int seq, int n_pos)
{
    return b->ops->seq_set_len(b->self, seq, n_pos);
}

ie_status_t ie_backend_kv_bind(ie_backend_t *b, int seq, int first, const int32_t *pb, int n)
{
    return b->ops->kv_bind(b->self, seq, first, pb, n);
}

ie_status_t ie_backend_lora_add(ie_backend_t *b, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    if (!b->ops->lora_add)
        return ie_error_set(IE_ERR_UNSUPPORTED, "backend %s: LoRA adapters are not supported here (run unsharded)",
                            ie_backend_name(b));
    if (!parts || n < 1 || n > 8 || !id_out)
        return ie_error_set(IE_ERR_INVAL, "backend %s: lora_add of %d parts (1..8)", ie_backend_name(b), n);
    return b->ops->lora_add(b->self, parts, n, id_out);
}

ie_status_t ie_backend_lora_add_begin(ie_backend_t *b, const ie_backend_lora_part_t *parts, int n, int *id_out,
                                      int *pending)
{
    *pending = 0;
    if (!b->ops->lora_add_begin || !b->ops->lora_add_poll) return ie_backend_lora_add(b, parts, n, id_out);
    if (!parts || n < 1 || n > 8 || !id_out)
        return ie_error_set(IE_ERR_INVAL, "backend %s: lora_add of %d parts (1..8)", ie_backend_name(b), n);
    ie_status_t st = b->ops->lora_add_begin(b->self, parts, n, id_out);
    *pending = st == IE_OK;
    return st;
}

int ie_backend_lora_add_poll(ie_backend_t *b, int id, int timeout_ms, ie_status_t *st)
{
    *st = IE_OK;
    return b->ops->lora_add_poll ? b->ops->lora_add_poll(b->self, id, timeout_ms, st) : 1;
}

uint64_t ie_backend_lora_bytes(ie_backend_t *b, int id)
{
    return b->ops->lora_bytes ? b->ops->lora_bytes(b->self, id) : 0;
}

uint64_t ie_backend_lora_cost(ie_backend_t *b, const ie_lora_t *a)
{
    return b->ops->lora_cost ? b->ops->lora_cost(b->self, a) : 0;
}

ie_status_t ie_backend_lora_remove(ie_backend_t *b, int id)
{
    if (!b->ops->lora_remove)
        return ie_error_set(IE_ERR_UNSUPPORTED, "backend %s: LoRA adapters cannot be removed here",
                            ie_backend_name(b));
    return b->ops->lora_remove(b->self, id);
}

void ie_backend_hint_next(ie_backend_t *b, int same)
{
    if (b->ops->hint_next) b->ops->hint_next(b->self, same);
}

int ie_backend_ready(ie_backend_t *b) { return b->ops->ready ? b->ops->ready(b->self) : 1; }

int ie_backend_upkeep(ie_backend_t *b, int timeout_ms)
{
    return b->ops->upkeep ? b->ops->upkeep(b->self, timeout_ms) : ie_backend_ready(b);
}

void ie_backend_stats(ie_backend_t *b, ie_backend_stats_t *out)
{
    *out = (ie_backend_stats_t){.isa = "", .hot_report = "", .endpoint = ""};
    if (b->ops->stats) b->ops->stats(b->self, out);
}
