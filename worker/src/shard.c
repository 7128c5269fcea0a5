/* shard.c — shard plans: which layers, heads, MLP columns, experts and
 * vocabulary rows one rank of a pipeline- or tensor-parallel deployment
 * holds (ie_worker.h). Pure arithmetic on the hyper-parameters, so every
 * rank (and the coordinator) computes the same plan without talking.
 *
 * Splits give the first ranks the extra unit (layers, KV heads, experts;
 * 32-row units of the head and 32-column units of the MLP, so that block
 * types and int8w/int4w groups of 32 are never cut). Whether a cut also
 * falls on the block boundaries of the stored weights (attn_output's
 * columns follow the heads: head_dim * heads per rank) depends on their
 * types, which the plan does not see: the worker checks that when it binds
 * the slices and refuses a model it cannot cut (IE_ERR_INVAL). */
#include "ie_worker.h"

#include <string.h>

#define MAX_RANKS 64

const char *ie_shard_kind_name(ie_shard_kind_t k)
{
    switch (k) {
    case IE_SHARD_NONE: return "none";
    case IE_SHARD_PIPELINE: return "pipeline";
    case IE_SHARD_TENSOR: return "tensor";
    }
    return "invalid";
}

ie_status_t ie_shard_kind_parse(const char *s, ie_shard_kind_t *out)
{
    static const ie_shard_kind_t all[] = {IE_SHARD_NONE, IE_SHARD_PIPELINE, IE_SHARD_TENSOR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (s && strcmp(s, ie_shard_kind_name(all[i])) == 0) {
            *out = all[i];
            return IE_OK;
        }
    }
    return ie_error_set(IE_ERR_INVAL, "unknown shard kind '%s' (expected none, pipeline or tensor)",
                        s ? s : "(null)");
}

/* Rank r's share [*b, *e) of n units over R ranks, the first n % R ranks
 * one unit more. */
static void split(int64_t n, int r, int R, int64_t *b, int64_t *e)
{
    const int64_t q = n / R, rem = n % R;
    *b = r * q + (r < rem ? r : rem);
    *e = *b + q + (r < rem ? 1 : 0);
}

/* The same over units of `unit` elements (the last unit may be short). */
static void split_units(int64_t n, int64_t unit, int r, int R, int64_t *b, int64_t *e)
{
    split((n + unit - 1) / unit, r, R, b, e);
    *b *= unit;
    *e = *e * unit < n ? *e * unit : n;
}

/* Contract (ie_worker.h). NONE accepts n_ranks 0 (zeroed options) or 1;
 * PIPELINE and TENSOR need 1 <= n_ranks <= 64 and 0 <= rank < n_ranks. */
ie_status_t ie_shard_plan(const ie_hparams_t *hp, const ie_shard_t *s, ie_shard_range_t *out)
{
    ie_status_t st = IE_OK;
    ie_shard_range_t r;
    if (!hp || !s || !out) return ie_error_set(IE_ERR_INVAL, "shard plan: NULL argument");
    const int R = s->kind == IE_SHARD_NONE && s->n_ranks == 0 ? 1 : s->n_ranks, k = s->rank;
    /* everything: NONE, and the starting point of the others */
    r = (ie_shard_range_t){.layer_begin = 0,
                           .layer_end = hp->n_layer,
                           .has_embed = 1,
                           .has_head = 1,
                           .head_begin = 0,
                           .head_end = hp->n_head,
                           .kv_head_begin = 0,
                           .kv_head_end = hp->n_head_kv,
                           .ff_begin = 0,
                           .ff_end = hp->n_ff,
                           .expert_begin = 0,
                           .expert_end = hp->n_expert,
                           .vocab_begin = 0,
                           .vocab_end = hp->n_vocab};
    int64_t b, e;

    if (R < 1 || R > MAX_RANKS || k < 0 || k >= R) {
        st = ie_error_set(IE_ERR_INVAL, "%s plan: rank %d of %d (need 0 <= rank < ranks <= %d)",
                          ie_shard_kind_name(s->kind), k, R, MAX_RANKS);
        goto cleanup;
    }
    switch (s->kind) {
    case IE_SHARD_NONE:
        if (R != 1) st = ie_error_set(IE_ERR_INVAL, "none plan: %d ranks (an unsharded worker is 1)", R);
        break;
    case IE_SHARD_PIPELINE:
        if (R > hp->n_layer) {
            st = ie_error_set(IE_ERR_INVAL, "pipeline plan: %d stages but only %d layers", R, hp->n_layer);
            break;
        }
        split(hp->n_layer, k, R, &b, &e);
        r.layer_begin = (int)b;
        r.layer_end = (int)e;
        r.has_embed = k == 0;
        r.has_head = k == R - 1;
        if (!r.has_head) r.vocab_begin = r.vocab_end = 0;
        break;
    case IE_SHARD_TENSOR:
        if (R > hp->n_head_kv) {
            st = ie_error_set(IE_ERR_INVAL, "tensor plan: %d ranks but only %d KV heads", R, hp->n_head_kv);
            break;
        }
        if ((int64_t)R * 32 > hp->n_vocab) {
            st = ie_error_set(IE_ERR_INVAL, "tensor plan: %d ranks but the vocabulary (%d) has only %d rows of 32",
                              R, hp->n_vocab, (hp->n_vocab + 31) / 32);
            break;
        }
        /* Query heads are dealt evenly and each rank holds the KV heads its
         * query heads read. When the KV heads divide evenly this is a split
         * by KV-head groups; when they do not (SmolLM2's 9 query / 3 KV
         * heads on 2 ranks: 5 + 4 query heads, KV heads 0-1 and 1-2) the
         * group cut in two is held by both ranks, which costs its k/v
         * projection twice but evens the attention out: the ranks meet at
         * a reduction after it in every layer, so the rank with a whole KV
         * group more (2 + 1) would make the other wait each time. */
        {
            const int group = hp->n_head / hp->n_head_kv;
            split(hp->n_head, k, R, &b, &e);
            r.head_begin = (int)b;
            r.head_end = (int)e;
            r.kv_head_begin = (int)(b / group);
            r.kv_head_end = (int)((e + group - 1) / group);
        }
        split_units(hp->n_vocab, 32, k, R, &r.vocab_begin, &r.vocab_end);
        if (hp->n_expert > 0) {
            if (R > hp->n_expert) {
                st = ie_error_set(IE_ERR_INVAL, "tensor plan: %d ranks but only %d experts", R, hp->n_expert);
                break;
            }
            split(hp->n_expert, k, R, &b, &e);
            r.expert_begin = (int)b;
            r.expert_end = (int)e;
        } else {
            if ((int64_t)R * 32 > hp->n_ff) {
                st = ie_error_set(IE_ERR_INVAL, "tensor plan: %d ranks but the MLP (%d) has only %d columns of 32",
                                  R, hp->n_ff, hp->n_ff / 32);
                break;
            }
            split_units(hp->n_ff, 32, k, R, &r.ff_begin, &r.ff_end);
        }
        break;
    default: st = ie_error_set(IE_ERR_INVAL, "shard plan: unknown kind %d", (int)s->kind); break;
    }

cleanup:
    if (st == IE_OK) *out = r;
    return st;
}
