/* shard.c — shard plans: which layers, heads, MLP columns, experts and
 * vocabulary rows one rank of a pipeline- or tensor-parallel deployment
 * holds (ie_worker.h). Pure arithmetic on the hyper-parameters, so every
 * rank (and the coordinator) computes the same plan without talking.
 *
 * Splits give the first ranks the extra unit (layers, KV heads, experts;
 * 32-row units of the head, and units of the MLP's columns that ffn_down's
 * blocks allow: 32, 256 for the k-quants' super-blocks). The column cuts
 * of the row-parallel matrices (attn_output's follow the heads: head_dim *
 * heads per rank; ffn_down's the MLP split) must fall on the blocks of the
 * stored types: ie_shard_units reads those from the model source, and a
 * plan given them (ie_shard_plan_units) refuses a rank count that would
 * cut a block, naming the counts the shapes allow. A plan without them
 * (ie_shard_plan) assumes blocks of 32; the worker still checks every cut
 * when it binds the slices (IE_ERR_INVAL). */
#include "ie_worker.h"

#include <stdio.h>
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

/* The column unit a cut of tensor t must fall on: its block (or int8w /
 * int4w group) size, never below 32 (the engine's own int types, which
 * --precision int8w/int4w may make of any source, use groups of 32). */
static int col_unit(const ie_tensor_t *t)
{
    int u = ie_dtype_is_intw(t->dtype) ? t->group : ie_dtype_block_elems(t->dtype);
    return u > 32 ? u : 32;
}

/* Contract (ie_worker.h). */
ie_status_t ie_shard_units(const ie_model_src_t *src, ie_shard_units_t *out)
{
    if (!src || !out) return ie_error_set(IE_ERR_INVAL, "shard units: NULL argument");
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    memset(out, 0, sizeof *out);
    out->o_unit = out->ff_unit = 32;
    for (int l = 0; l < hp->n_layer; l++) {
        static const char *const sfx[2] = {"attn_output", "ffn_down"};
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, sfx[k]);
            const ie_tensor_t *t = ie_model_src_tensor(src, name);
            if (!t) continue; /* MoE (ffn_down_exps, cut by experts) or missing: binding says */
            int *u = k == 0 ? &out->o_unit : &out->ff_unit;
            char *what = k == 0 ? out->o_what : out->ff_what;
            const int cu = col_unit(t);
            if (cu > *u) {
                *u = cu;
                snprintf(what, sizeof out->o_what, "%s (%s, blocks of %d)", name, ie_dtype_name(t->dtype), cu);
            }
        }
    }
    return IE_OK;
}

/* 1 when a tensor plan of R ranks cuts attn_output's and ffn_down's
 * columns on units u (the other limits of such a plan are checked apart):
 * every rank's first query column is a multiple of u->o_unit, and the MLP
 * has a unit of u->ff_unit columns for every rank. Blocks of 32 are left
 * to the binding, as before units were known: f32/f16/bf16 sources can be
 * cut anywhere, and whether a 32-element type's cut fits is its check. */
static int tensor_cuts_fit(const ie_hparams_t *hp, const ie_shard_units_t *u, int R)
{
    if (hp->n_expert == 0 && (int64_t)R * u->ff_unit > hp->n_ff) return 0;
    for (int r = 0; u->o_unit > 32 && r < R; r++) {
        int64_t b, e;
        split(hp->n_head, r, R, &b, &e);
        if (b * hp->head_dim % u->o_unit != 0) return 0;
    }
    return 1;
}

/* The tensor plan's refusal when R ranks would cut a block: which
 * tensor, and the rank counts (up to the KV heads) that the shapes allow. */
static ie_status_t refuse_cut(const ie_hparams_t *hp, const ie_shard_units_t *u, int R)
{
    char allow[256] = "", why[160];
    size_t n = 0;
    const int top = hp->n_head_kv < MAX_RANKS ? hp->n_head_kv : MAX_RANKS;
    for (int c = 1; c <= top && n < sizeof allow - 16; c++)
        if ((int64_t)c * 32 <= hp->n_vocab && tensor_cuts_fit(hp, u, c))
            n += (size_t)snprintf(allow + n, sizeof allow - n, "%s%d", n ? ", " : "", c);
    if (hp->n_expert == 0 && (int64_t)R * u->ff_unit > hp->n_ff)
        snprintf(why, sizeof why, "the MLP (%d) has only %d units of %d columns for %s", hp->n_ff,
                 hp->n_ff / u->ff_unit, u->ff_unit, u->ff_what[0] ? u->ff_what : "ffn_down");
    else {
        int64_t at = 0; /* the first cut off a block */
        for (int r = 1; r < R && at == 0; r++) {
            int64_t b, e;
            split(hp->n_head, r, R, &b, &e);
            if (b * hp->head_dim % u->o_unit != 0) at = b * hp->head_dim;
        }
        snprintf(why, sizeof why, "its heads would cut the columns of %s at %lld",
                 u->o_what[0] ? u->o_what : "attn_output", (long long)at);
    }
    return ie_error_set(IE_ERR_INVAL, "tensor plan: %d ranks, but %s; the shapes allow tensor:N for N in {%s}", R,
                        why, allow);
}

/* Contract (ie_worker.h). */
ie_status_t ie_shard_plan(const ie_hparams_t *hp, const ie_shard_t *s, ie_shard_range_t *out)
{
    return ie_shard_plan_units(hp, NULL, s, out);
}

/* Contract (ie_worker.h). NONE accepts n_ranks 0 (zeroed options) or 1;
 * PIPELINE and TENSOR need 1 <= n_ranks <= 64 and 0 <= rank < n_ranks. */
ie_status_t ie_shard_plan_units(const ie_hparams_t *hp, const ie_shard_units_t *units, const ie_shard_t *s,
                                ie_shard_range_t *out)
{
    ie_status_t st = IE_OK;
    ie_shard_range_t r;
    if (!hp || !s || !out) return ie_error_set(IE_ERR_INVAL, "shard plan: NULL argument");
    ie_shard_units_t u32 = {.o_unit = 32, .ff_unit = 32};
    const ie_shard_units_t *u = units ? units : &u32;
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
            split_units(hp->n_ff, u->ff_unit, k, R, &r.ff_begin, &r.ff_end);
        }
        if (!tensor_cuts_fit(hp, u, R)) st = refuse_cut(hp, u, R);
        break;
    default: st = ie_error_set(IE_ERR_INVAL, "shard plan: unknown kind %d", (int)s->kind); break;
    }

cleanup:
    if (st == IE_OK) *out = r;
    return st;
}
