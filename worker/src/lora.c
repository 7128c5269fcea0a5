/* lora.c — LoRA adapters on the forward pass: the table of attached
 * adapters and the low-rank path of each adapted projection.
 *
 * The base matmul runs once for every token of the step; then, for each
 * adapter the step uses, the tokens that asked for it (grouped once per
 * step, worker_lora_group) get y += scale * B (A x) through the kernels'
 * lora_shrink (u = scale * A x), which rides on the base matmul's own pool
 * job (its input is the matmul's), and lora_expand (y += B u), one pool
 * job after it; each pass is split over the weights of all modules of a
 * call (q/k/v, gate/up) and all groups. Adapters are never merged into the
 * base weights.
 * A tensor-parallel rank runs its share: B's rows of the row-split
 * projections (q, k, v, gate, up: the rows the rank's output holds), A's
 * columns of the column-split ones (o, down: the partial sum the reduce
 * then adds up like the base's) — cut in place from a whole adapter, or
 * an adapter already cut (ie_lora_slice: a cluster rank holds only its
 * share).
 */
#include "ie_prof.h"
#include "worker_internal.h"

#include <stdlib.h>
#include <string.h>

/* Module m's extent in the share sh: its output rows [*ob, *ob + *on)
 * and input columns [*ib, *ib + *in) of the whole n_out x n_in matrix. */
static void share_of(const ie_hparams_t *hp, const ie_shard_range_t *sh, ie_lora_mod_t m, int64_t n_out,
                     int64_t n_in, int64_t *ob, int64_t *on, int64_t *ib, int64_t *in)
{
    const int64_t hd = hp->head_dim;
    *ob = 0, *on = n_out, *ib = 0, *in = n_in;
    switch (m) {
    case IE_LORA_Q: *ob = sh->head_begin * hd, *on = (sh->head_end - sh->head_begin) * hd; break;
    case IE_LORA_K:
    case IE_LORA_V: *ob = sh->kv_head_begin * hd, *on = (sh->kv_head_end - sh->kv_head_begin) * hd; break;
    case IE_LORA_GATE:
    case IE_LORA_UP: *ob = sh->ff_begin, *on = sh->ff_end - sh->ff_begin; break;
    case IE_LORA_O: *ib = sh->head_begin * hd, *in = (sh->head_end - sh->head_begin) * hd; break;
    case IE_LORA_DOWN: *ib = sh->ff_begin, *in = sh->ff_end - sh->ff_begin; break;
    default: break;
    }
}

/* Copy rows x [c0, c0 + nc) of an ld-wide matrix of `es`-byte elements. */
static void *cut(const void *src, int rows, int64_t ld, int64_t c0, int64_t nc, size_t es)
{
    if (!src) return NULL;
    char *d = malloc((size_t)rows * (size_t)nc * es + 1);
    if (!d) return NULL;
    for (int r = 0; r < rows; r++)
        memcpy(d + (size_t)r * (size_t)nc * es, (const char *)src + ((size_t)r * (size_t)ld + (size_t)c0) * es,
               (size_t)nc * es);
    return d;
}

/* Contract (ie_worker.h). */
ie_status_t ie_lora_slice(const ie_lora_t *a, const ie_hparams_t *hp, const ie_shard_range_t *sh, ie_lora_t **out)
{
    ie_status_t st = IE_OK;
    ie_lora_t *o = NULL;
    *out = NULL;
    if (!a || !hp || !sh || !out) return ie_error_set(IE_ERR_INVAL, "lora slice: NULL argument");
    if (a->n_layer != hp->n_layer || sh->layer_begin < 0 || sh->layer_end > hp->n_layer || sh->head_begin < 0 ||
        sh->head_end > hp->n_head || sh->head_begin > sh->head_end || sh->kv_head_begin < 0 ||
        sh->kv_head_end > hp->n_head_kv || sh->kv_head_begin > sh->kv_head_end || sh->ff_begin < 0 ||
        sh->ff_end > hp->n_ff || sh->ff_begin > sh->ff_end)
        return ie_error_set(IE_ERR_INVAL,
                            "lora slice: the share does not fit the model (or the adapter's %d layers)",
                            a->n_layer);
    if (!(o = calloc(1, sizeof *o)) || !(o->mats = calloc((size_t)a->n_layer * IE_LORA_NMOD, sizeof *o->mats))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    o->n_layer = a->n_layer;
    o->format = a->format;
    o->fingerprint = a->fingerprint;
    for (int l = sh->layer_begin; l < sh->layer_end; l++)
        for (int m = 0; m < IE_LORA_NMOD; m++) {
            const ie_lora_mat_t *s = ie_lora_mat(a, l, (ie_lora_mod_t)m);
            if (!s || !s->rank) continue;
            int64_t want_out, want_in, ob, on, ib, in;
            ie_lora_mat_t *d = &o->mats[(size_t)l * IE_LORA_NMOD + (size_t)m];
            {
                /* the whole shape, from the model (the loader checked it) */
                const int64_t dm = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
                              kvd = (int64_t)hp->n_head_kv * hp->head_dim;
                want_out = m == IE_LORA_Q                         ? qd
                           : m == IE_LORA_K || m == IE_LORA_V     ? kvd
                           : m == IE_LORA_GATE || m == IE_LORA_UP ? hp->n_ff
                                                                  : dm;
                want_in = m == IE_LORA_O ? qd : m == IE_LORA_DOWN ? hp->n_ff : dm;
            }
            if (s->n_out != want_out || s->n_in != want_in) {
                st = ie_error_set(IE_ERR_INVAL, "lora slice: layer %d %s is %lld x %lld, the model's %lld x %lld",
                                  l, ie_lora_mod_name((ie_lora_mod_t)m), (long long)s->n_out, (long long)s->n_in,
                                  (long long)want_out, (long long)want_in);
                goto cleanup;
            }
            share_of(hp, sh, (ie_lora_mod_t)m, s->n_out, s->n_in, &ob, &on, &ib, &in);
            if (on <= 0 || in <= 0) continue; /* nothing of it here */
            *d = (ie_lora_mat_t){.rank = s->rank, .n_in = in, .n_out = on, .scale = s->scale};
            const size_t es = s->a8 ? 1 : s->a16 ? 2 : 4;
            const void *sa = s->a8 ? (const void *)s->a8 : s->a16 ? (const void *)s->a16 : (const void *)s->a;
            const void *sb = s->a8 ? (const void *)s->bt8 : s->a16 ? (const void *)s->bt16 : (const void *)s->bt;
            /* int8 B^T: rows of four ranks, 4-byte elements (ie_kernels.h) */
            void *na = cut(sa, s->rank, s->n_in, ib, in, es),
                 *nb = s->a8 ? cut(sb, (s->rank + 3) / 4, s->n_out, ob, on, 4)
                             : cut(sb, s->rank, s->n_out, ob, on, es);
            if (s->a8) d->a8 = na, d->bt8 = nb;
            else if (s->a16) d->a16 = na, d->bt16 = nb;
            else d->a = na, d->bt = nb;
            if (s->a8) /* column scales: the share's columns */
                d->sa8 = cut(s->sa8, 1, s->n_in, ib, in, 4), d->sbt8 = cut(s->sbt8, 1, s->n_out, ob, on, 4);
            if (!na || !nb || (s->a8 && (!d->sa8 || !d->sbt8))) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            o->n_mats++;
            o->mods |= 1u << m;
            if (s->rank > o->max_rank) o->max_rank = s->rank;
            o->bytes += s->a8 ? (uint64_t)s->rank * (uint64_t)in + (uint64_t)((s->rank + 3) & ~3) * (uint64_t)on +
                                    (uint64_t)(in + on) * 4u /* codes and column scales */
                              : (uint64_t)s->rank * (uint64_t)(in + on) * es;
        }

cleanup:
    if (st != IE_OK) ie_lora_destroy(&o);
    *out = o;
    return st;
}

/* Whether adapters run here in int8 (ie_lora_quantize_int8). env
 * IE_LORA_DTYPE=int8 or =wide (the file's f32/bf16) decides; by default
 * int8 when the base's projections are quantized: that path rounds weights
 * and activations already, far more than an adapter's int8 columns, and
 * the decode step then streams half the adapter bytes; an f32/bf16/f16
 * base keeps the file's weights, so the exact paths stay exact. Every
 * process decides alike from the same weights (a cluster's ranks agree). */
static int lora_int8(const ie_worker_t *w)
{
    const char *e = getenv("IE_LORA_DTYPE");
    if (e && !strcmp(e, "int8")) return 1;
    if (e && !strcmp(e, "wide")) return 0;
    if (w->sh.layer_begin >= w->sh.layer_end) return 0;
    const ie_dtype_t t = w->layers[w->sh.layer_begin].q.dtype;
    return t != IE_DTYPE_F32 && t != IE_DTYPE_F16 && t != IE_DTYPE_BF16;
}

/* Whether a worker that wants int8 (int8) makes its own copy of adapter
 * a: when some matrix is in f32/bf16. ie_worker_lora_prepare makes it;
 * ie_worker_lora_cost counts it beforehand. */
static int makes_int8_copy(const ie_lora_t *a, int int8)
{
    int wide = 0;
    for (int k = 0; k < a->n_layer * IE_LORA_NMOD; k++) wide |= a->mats[k].rank && !a->mats[k].a8;
    return wide && int8;
}

/* Contract (ie_worker.h). */
void ie_worker_lora_target(const ie_worker_t *w, ie_worker_lora_target_t *out)
{
    memset(out, 0, sizeof *out);
    out->hp = w->hp;
    out->sh = w->sh;
    out->moe = w->arch.ffn == IE_FFN_MOE;
    out->int8 = lora_int8(w);
}

/* Whether two targets take the same prepared adapters: the fields
 * ie_worker_lora_prepare and the forward pass's share_of read. */
static int target_same(const ie_worker_lora_target_t *a, const ie_worker_lora_target_t *b)
{
    const ie_shard_range_t *x = &a->sh, *y = &b->sh;
    return a->hp.n_layer == b->hp.n_layer && a->hp.head_dim == b->hp.head_dim && a->hp.n_embd == b->hp.n_embd &&
           a->hp.n_ff == b->hp.n_ff && a->hp.n_head == b->hp.n_head && a->hp.n_head_kv == b->hp.n_head_kv &&
           a->moe == b->moe && a->int8 == b->int8 && x->layer_begin == y->layer_begin &&
           x->layer_end == y->layer_end && x->head_begin == y->head_begin && x->head_end == y->head_end &&
           x->kv_head_begin == y->kv_head_begin && x->kv_head_end == y->kv_head_end && x->ff_begin == y->ff_begin &&
           x->ff_end == y->ff_end;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_lora_prepare(const ie_worker_lora_target_t *t, const ie_lora_t *a, ie_lora_t **run_out)
{
    ie_status_t st = IE_OK;
    if (run_out) *run_out = NULL;
    if (!t || !a || !run_out) return ie_error_set(IE_ERR_INVAL, "worker: lora_prepare: NULL argument");
    if (a->n_layer != t->hp.n_layer)
        return ie_error_set(IE_ERR_INVAL, "worker: adapter made for %d layers; the model has %d", a->n_layer,
                            t->hp.n_layer);
    if (t->moe && (a->mods >> IE_LORA_GATE))
        return ie_error_set(IE_ERR_UNSUPPORTED, "worker: adapter adapts the MLP of a mixture-of-experts model");
    for (int l = 0; l < t->hp.n_layer; l++) /* each matrix the whole or this share (ie_lora_slice) */
        for (int m = 0; m < IE_LORA_NMOD; m++) {
            const ie_lora_mat_t *mt = ie_lora_mat(a, l, (ie_lora_mod_t)m);
            if (!mt || !mt->rank) continue;
            int64_t ob, on, ib, in;
            share_of(&t->hp, &t->sh, (ie_lora_mod_t)m, mt->n_out, mt->n_in, &ob, &on, &ib, &in);
            if ((mt->n_out != on && ob + on > mt->n_out) || (mt->n_in != in && ib + in > mt->n_in))
                return ie_error_set(IE_ERR_INVAL,
                                    "worker: adapter's layer %d %s (%lld x %lld) is neither the whole matrix nor "
                                    "this rank's share (%lld x %lld)",
                                    l, ie_lora_mod_name((ie_lora_mod_t)m), (long long)mt->n_out,
                                    (long long)mt->n_in, (long long)on, (long long)in);
        }
    if (makes_int8_copy(a, t->int8)) st = ie_lora_quantize_int8(a, run_out);
    return st;
}

/* Contract (ie_worker.h). */
int ie_worker_lora_next_id(const ie_worker_t *w)
{
    for (int i = 0; i < IE_WORKER_MAX_LORA; i++)
        if (!w->lora[i].ad) return i;
    return -1;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_lora_attach(ie_worker_t *w, const ie_worker_lora_target_t *t, const ie_lora_t *a,
                                  ie_lora_t **run, float scale, int *id_out)
{
    ie_status_t st = IE_OK;
    int id = -1;
    if (!w || !t || !a || !run || !id_out) return ie_error_set(IE_ERR_INVAL, "worker: lora_attach: NULL argument");
    {
        ie_worker_lora_target_t now;
        ie_worker_lora_target(w, &now);
        if (!target_same(t, &now))
            return ie_error_set(IE_ERR_INVAL, "worker: adapter prepared for another shard or adapter dtype");
    }
    const ie_lora_t *r = *run ? *run : a;
    if ((id = ie_worker_lora_next_id(w)) < 0)
        return ie_error_set(IE_ERR_RANGE, "worker: %d adapters attached already", IE_WORKER_MAX_LORA);
    const size_t B = (size_t)w->opts.max_batch;
    if (!w->lora_rows && !(w->lora_rows = malloc(B * sizeof *w->lora_rows))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if (r->max_rank > w->lora_tmp_rank) {
        float *tmp = realloc(w->lora_tmp,
                             3 * B * (size_t)r->max_rank * sizeof *tmp); /* a block per module of a job */
        if (!tmp) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        w->lora_tmp = tmp;
        w->lora_tmp_rank = r->max_rank;
    }
    {
        /* env IE_LORA_POOL_MIN: the multiply-adds under which a call runs
         * on the calling thread (tests set 0 to drive the pool path) */
        const char *e = getenv("IE_LORA_POOL_MIN");
        w->lora_pool_min = e && *e ? atof(e) : 2e5;
    }
    w->lora[id].own = *run;
    *run = NULL;
    w->lora[id].ad = r;
    w->lora[id].scale = scale;
    *id_out = id;

cleanup:
    return st;
}

/* Contract (ie_worker.h): prepare and attach in one call, for a caller on
 * the worker's thread that has no reason to split them. */
ie_status_t ie_worker_lora_add(ie_worker_t *w, const ie_lora_t *a, float scale, int *id_out)
{
    ie_status_t st = IE_OK;
    ie_worker_lora_target_t t;
    ie_lora_t *run = NULL;
    if (!w || !a || !id_out) return ie_error_set(IE_ERR_INVAL, "worker: lora_add: NULL argument");
    ie_worker_lora_target(w, &t);
    if ((st = ie_worker_lora_prepare(&t, a, &run)) == IE_OK)
        st = ie_worker_lora_attach(w, &t, a, &run, scale, id_out);
    ie_lora_destroy(&run); /* NULL once the worker took it */
    return st;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_lora_remove(ie_worker_t *w, int id)
{
    if (!w || id < 0 || id >= IE_WORKER_MAX_LORA || !w->lora[id].ad)
        return ie_error_set(IE_ERR_RANGE, "worker: no adapter %d attached", id);
    w->lora[id].ad = NULL;
    ie_lora_destroy(&w->lora[id].own);
    return IE_OK;
}

/* Contract (ie_worker.h). */
uint64_t ie_worker_lora_bytes(const ie_worker_t *w, int id)
{
    if (!w || id < 0 || id >= IE_WORKER_MAX_LORA || !w->lora[id].ad || !w->lora[id].own) return 0;
    return w->lora[id].own->bytes;
}

/* Contract (ie_worker.h): the copy ie_worker_lora_prepare would make. */
uint64_t ie_worker_lora_cost(const ie_worker_t *w, const ie_lora_t *a)
{
    if (!w || !a) return 0;
    return makes_int8_copy(a, lora_int8(w)) ? ie_lora_int8_bytes(a) : 0;
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
    w->lora_open = 0; /* a step that failed inside a call left it open */
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
    const int id = w->lora_groups[g].id;
    const ie_lora_mat_t *mt = ie_lora_mat(w->lora[id].ad, l, m);
    if (!mt || !mt->rank) return 0;
    *p = (ie_lora_args_t){.a = mt->a,
                          .bt = mt->bt,
                          .a16 = mt->a16,
                          .bt16 = mt->bt16,
                          .a8 = mt->a8,
                          .bt8 = mt->bt8,
                          .sa = mt->sa8,
                          .sbt = mt->sbt8,
                          .lda = mt->n_in,
                          .ldb = mt->n_out,
                          .rank = mt->rank,
                          .n_in = mt->n_in,
                          .n_out = mt->n_out,
                          .scale = mt->scale * w->lora[id].scale,
                          .x = x,
                          .y = y};
    /* element offsets of this rank's share (f32 or bf16 alike): none when
     * the matrix is the share already (ie_lora_slice) */
    int64_t ob, on, ib, in;
    share_of(&w->hp, sh, m, mt->n_out, mt->n_in, &ob, &on, &ib, &in);
    const int64_t b_off = mt->n_out == on ? 0 : ob, a_off = mt->n_in == in ? 0 : ib;
    p->n_out = on;
    p->n_in = in;
    if (mt->a8) p->a8 += a_off, p->bt8 += 4 * b_off, p->sa += a_off, p->sbt += b_off; /* 4 ranks a column */
    else if (mt->a16) p->a16 += a_off, p->bt16 += b_off;
    else p->a += a_off, p->bt += b_off;
    p->ldx = p->n_in;
    p->ldy = p->n_out;
    return 1;
}

/* A call's two passes split over the weights: the shrink the rows of
 * every (module, group)'s A (units of 4 rows), the expand the columns of
 * every B^T (units of 64), each thread a contiguous run of units weighted
 * by the weights they read, so every adapter byte is read once a step by
 * one thread for the whole group (a split by tokens read each adapter
 * once per token). u of arg k lives in lora_tmp block mi[k] at the
 * group's rows (lora_tmp_rank floats apart): groups never share it. */
#define SHRINK_UNIT 4
#define EXPAND_UNIT 64

static float *lora_u(const lora_job_t *j, int k)
{
    const ie_worker_t *w = j->w;
    return w->lora_tmp + ((size_t)j->mi[k] * (size_t)w->opts.max_batch + (size_t)w->lora_groups[j->grp[k]].first) *
                             (size_t)w->lora_tmp_rank;
}

/* The bytes of arg p that units [b, e) of pass ex read, as a prefetch
 * hint (ie_lora_args_t.pf) for the call before it */
static void lora_hint(const ie_lora_args_t *p, int ex, int64_t b, int64_t e, ie_lora_args_t *q)
{
    const size_t es = p->a8 ? 1 : p->a16 ? 2 : 4;
    if (!ex) { /* A's rows [b, e) */
        const char *a = p->a8 ? (const char *)p->a8 : p->a16 ? (const char *)p->a16 : (const char *)p->a;
        q->pf = a + (size_t)b * (size_t)p->lda * es;
        q->pf_rows = e - b, q->pf_len = p->n_in * (int64_t)es, q->pf_ld = p->lda * (int64_t)es;
    } else if (p->a8) { /* B^T's columns [b, e) in its groups of four ranks */
        q->pf = (const char *)p->bt8 + (size_t)b * 4u;
        q->pf_rows = (p->rank + 3) / 4, q->pf_len = (e - b) * 4, q->pf_ld = p->ldb * 4;
    } else {
        q->pf = (p->a16 ? (const char *)p->bt16 : (const char *)p->bt) + (size_t)b * es;
        q->pf_rows = p->rank, q->pf_len = (e - b) * (int64_t)es, q->pf_ld = p->ldb * (int64_t)es;
    }
}

/* Thread ith's units of pass `ex` (0 shrink, 1 expand): walk the args in
 * order and run the units whose first weight falls in its share; each
 * call fetches the next one's weights as it goes (lora_hint). */
static void lora_pass(const lora_job_t *j, int ex, int ith, int nth)
{
    const ie_worker_t *w = j->w;
    const double lo = j->total[ex] * ith / nth, hi = j->total[ex] * (ith + 1) / nth;
    double at = 0;
    int n = 0, ks[LORA_MAX_ARGS];
    int64_t bs[LORA_MAX_ARGS], es[LORA_MAX_ARGS];
    for (int k = 0; k < j->n_args && at < hi; k++) {
        const ie_lora_args_t *p = &j->args[k];
        const int64_t nu = ex ? p->n_out : p->rank, unit = ex ? EXPAND_UNIT : SHRINK_UNIT;
        const double per = (double)(ex ? p->rank : p->n_in); /* weights per row (column) of A (B^T) */
        int64_t b = -1, e = -1;
        for (int64_t u0 = 0; u0 < nu && at + (double)u0 * per < hi; u0 += unit)
            if (at + (double)u0 * per >= lo) {
                if (b < 0) b = u0;
                e = u0 + unit < nu ? u0 + unit : nu;
            }
        if (b >= 0) ks[n] = k, bs[n] = b, es[n++] = e;
        at += (double)nu * per;
    }
    for (int i = 0; i < n; i++) {
        ie_lora_args_t p = j->args[ks[i]];
        if (i + 1 < n) lora_hint(&j->args[ks[i + 1]], ex, bs[i + 1], es[i + 1], &p);
        const lora_group_t *gr = &w->lora_groups[j->grp[ks[i]]];
        const int32_t *rows = w->lora_rows + gr->first;
        if (ex) w->ops->lora_expand(&p, rows, gr->n, bs[i], es[i], lora_u(j, ks[i]), w->lora_tmp_rank);
        else w->ops->lora_shrink(&p, rows, gr->n, (int)bs[i], (int)es[i], lora_u(j, ks[i]), w->lora_tmp_rank);
    }
}

static void lora_shrink_run(void *ctx, int ith, int nth) { lora_pass(ctx, 0, ith, nth); }
static void lora_expand_run(void *ctx, int ith, int nth) { lora_pass(ctx, 1, ith, nth); }

/* Contract (worker_internal.h). */
void worker_lora_begin(ie_worker_t *w, int l, int nm, const ie_lora_mod_t *ms, float *const *ys, const float *x)
{
    lora_job_t *j = &w->lora_job;
    w->lora_open = 0;
    if (!w->lora_ngroups) return;
    j->w = w;
    j->n_args = 0;
    j->total[0] = j->total[1] = j->fma = 0;
    j->shrunk = 0;
    for (int i = 0; i < nm; i++)
        for (int g = 0; g < w->lora_ngroups; g++) {
            ie_lora_args_t *p = &j->args[j->n_args];
            if (!lora_args(w, l, ms[i], g, ys[i], x, p)) continue;
            j->grp[j->n_args] = g;
            j->mi[j->n_args++] = i;
            j->total[0] += (double)p->rank * (double)p->n_in;
            j->total[1] += (double)p->rank * (double)p->n_out;
            j->fma += (double)w->lora_groups[g].n * p->rank * (double)(p->n_in + p->n_out);
        }
    w->lora_open = j->n_args > 0;
}

/* Contract (worker_internal.h). */
int worker_lora_pre(ie_worker_t *w, mm_pre_t *pre)
{
    if (!w->lora_open || w->lora_job.shrunk) return 0;
    w->lora_job.shrunk = 1;
    *pre = (mm_pre_t){lora_shrink_run, &w->lora_job};
    return 1;
}

/* Contract (worker_internal.h). */
void worker_lora_end(ie_worker_t *w)
{
    lora_job_t *j = &w->lora_job;
    if (!w->lora_open) return;
    w->lora_open = 0;
    /* small work: a fork/join would cost more than it saves */
    const int pool = j->fma >= w->lora_pool_min && w->opts.n_threads > 1;
    const uint64_t t0 = ie_prof_begin();
    if (!j->shrunk) {
        if (pool) ie_threadpool_run(w->tp, lora_shrink_run, j);
        else lora_shrink_run(j, 0, 1);
    }
    if (pool) ie_threadpool_run(w->tp, lora_expand_run, j);
    else lora_expand_run(j, 0, 1);
    ie_prof_end(IE_PROF_LORA, t0);
}

/* Contract (worker_internal.h). */
void worker_lora_free(ie_worker_t *w)
{
    for (int i = 0; i < IE_WORKER_MAX_LORA; i++) ie_lora_destroy(&w->lora[i].own);
    free(w->lora_rows);
    free(w->lora_tmp);
    w->lora_rows = NULL;
    w->lora_tmp = NULL;
}
