/* attention.c — RoPE, the paged KV cache and attention.
 *
 * The cache is a pool of blocks of kv_block positions of every held layer
 * ([block][layer][kv_block][kv_dim]); a slot's block table maps its logical
 * blocks to physical ones (worker_internal.h, ie_worker.h "paged KV").
 * Attention runs one (token, KV head, share of its query heads) per unit of
 * work on the pool, reading K and V through the slot's table. A decode
 * step also fetches into L2 the cache rows each thread's attention share
 * will read, while the q/k/v matmul streams (att_prefetch).
 */
#include "worker_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rope tables for every position, computed in float32 the way HF does so
 * logits agree (ie_rope_table_f32). Frequency factors (rope_freqs.weight,
 * llama.cpp's freq_factors) and linear scaling (Gemma 3's global layers:
 * rope_freq_scale = 1 / factor) divide each pair's frequency; a set
 * rope_attn_factor multiplies cos and sin. Sliding layers with a base of
 * their own (Gemma 3's rope_theta_swa, never scaled) get a second pair. */
static void rope_tables(ie_worker_t *w)
{
    const ie_hparams_t *hp = &w->hp;
    size_t half = (size_t)hp->rope_dim / 2;
    if (w->rope_cos_swa != w->rope_cos)
        for (int p = 0; p < w->opts.n_ctx; p++)
            ie_rope_table_f32(w->rope_cos_swa + p * half, w->rope_sin_swa + p * half, hp->rope_dim, p,
                              hp->rope_theta_swa);
    if (w->arch.rope_scaling == IE_ROPE_SCALING_NONE &&
        (hp->rope_attn_factor == 0.0f || hp->rope_attn_factor == 1.0f)) {
        for (int p = 0; p < w->opts.n_ctx; p++)
            ie_rope_table_f32(w->rope_cos + p * half, w->rope_sin + p * half, hp->rope_dim, p, hp->rope_theta);
        return;
    }
    if (w->arch.rope_scaling != IE_ROPE_SCALING_YARN) {
        const float mscale = hp->rope_attn_factor != 0.0f ? hp->rope_attn_factor : 1.0f;
        const int linear = w->arch.rope_scaling == IE_ROPE_SCALING_LINEAR;
        const float factor = linear ? 1.0f / hp->rope_freq_scale : 1.0f;
        for (size_t i = 0; i < half; i++) {
            /* ie_rope_table_f32's inv_freq, then the factor, as HF divides
             * its inv_freq (float32 throughout) */
            float inv_freq = 1.0f / powf(hp->rope_theta, (float)(2 * i) / (float)hp->rope_dim);
            if (w->rope_freqs) inv_freq /= w->rope_freqs[i];
            if (linear) inv_freq /= factor;
            for (int p = 0; p < w->opts.n_ctx; p++) {
                const float a = (float)p * inv_freq;
                w->rope_cos[(size_t)p * half + i] = (float)cos((double)a) * mscale;
                w->rope_sin[(size_t)p * half + i] = (float)sin((double)a) * mscale;
            }
        }
        return;
    }
    /* YaRN (docs/GPTOSS.md 2.2), in float32 like transformers'
     * _compute_yarn_parameters: high-frequency pairs keep their frequency,
     * low-frequency ones are divided by the factor, a linear ramp between;
     * cos and sin carry the attention factor. */
    double d = hp->rope_dim, base = hp->rope_theta, L = hp->rope_yarn_orig_ctx;
    double low = d * log(L / (hp->rope_yarn_beta_fast * 2 * M_PI)) / (2 * log(base));
    double high = d * log(L / (hp->rope_yarn_beta_slow * 2 * M_PI)) / (2 * log(base));
    if (hp->rope_yarn_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > d - 1) high = d - 1;
    if (low == high) high += 0.001;
    float factor = hp->rope_yarn_factor, mscale = hp->rope_attn_factor;
    for (size_t i = 0; i < half; i++) {
        float pos_freq = powf(hp->rope_theta, (float)(2 * i) / (float)hp->rope_dim);
        float extrap = 1.0f / pos_freq, interp = 1.0f / (factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float keep = 1.0f - ramp; /* weight of the original frequency */
        float inv_freq = interp * (1.0f - keep) + extrap * keep;
        for (int p = 0; p < w->opts.n_ctx; p++) {
            float a = (float)p * inv_freq;
            w->rope_cos[(size_t)p * half + i] = cosf(a) * mscale;
            w->rope_sin[(size_t)p * half + i] = sinf(a) * mscale;
        }
    }
}

typedef struct att_task {
    ie_worker_t *w;
    const ie_batch_t *b;
    int layer;
    int sg; /* query heads per unit (a share of one KV head's group) */
    /* a prefill over a cache not f32 (attend): -1 every token not
     * marked in kv_mark; else only the tokens of slot `seq`, whose rows
     * lo .. were decoded once into kv_pre (the f32 kernels read them) */
    int seq, lo;
    int i0, i1; /* the tokens of the step this job attends */
} att_task_t;

/* The rows of slot seq's cache c (0: K, 1: V) of layer l from held KV
 * head kh on: the pool's through the slot's block table, a ring layer's
 * through the ring's cyclic table (position j in ring block
 * (j / kv_block) % kv_ring_nrb), so the kernels read either alike. */
static ie_kv_rows_t kv_rows(const ie_worker_t *w, int c, int l, int seq, int kh)
{
    const layer_t *L = &w->layers[l];
    const size_t off = (size_t)L->kv_li * w->kv_layer_bytes[c] + (size_t)kh * w->kv_head_bytes[c];
    if (L->ring)
        return (ie_kv_rows_t){(c ? w->vring : w->kring) + (size_t)seq * w->kv_ring_slot_bytes[c] + off,
                              w->kv_row_bytes[c], w->kv_ring_tab, w->kv_block, w->kv_ring_block_bytes[c]};
    return (ie_kv_rows_t){(c ? w->vcache : w->kcache) + off, w->kv_row_bytes[c], w->btab + (size_t)seq * w->kv_nlb,
                          w->kv_block, w->kv_block_bytes[c]};
}

/* Unit u of an attention job (att_run's numbering): token i, held KV head
 * kh, query heads h0 .. h0+nh-1 (local numbers), the visible positions
 * j0 .. j0+cnt-1 and the K and V rows of its slot. Returns 0 for a unit
 * with no query heads (the last share of a group cut between ranks). */
typedef struct att_unit {
    int i, kh, h0, nh, j0, cnt;
    ie_kv_rows_t kq, vq; /* the K and V rows as bytes (any type) */
} att_unit_t;

static int att_unit(const att_task_t *t, long u, att_unit_t *a)
{
    const ie_worker_t *w = t->w;
    const ie_hparams_t *hp = &w->hp;
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv, nsub = (group + t->sg - 1) / t->sg;
    a->i = t->i0 + (int)(u / (w->n_kv_loc * nsub));
    const int r = (int)(u % (w->n_kv_loc * nsub));
    a->kh = r / nsub;
    /* this KV head's query heads held here (local numbers): a whole
     * group, or the part of a group cut between two ranks */
    const int kg = w->sh.kv_head_begin + a->kh;
    const int qa = kg * group > w->sh.head_begin ? kg * group : w->sh.head_begin;
    const int qe = (kg + 1) * group < w->sh.head_end ? (kg + 1) * group : w->sh.head_end;
    a->h0 = qa - w->sh.head_begin + (r % nsub) * t->sg;
    const int hend = qe - w->sh.head_begin;
    if (a->h0 >= hend) return 0;
    a->nh = hend - a->h0 < t->sg ? hend - a->h0 : t->sg;
    const int seq = t->b->seq[a->i], pos = t->b->pos[a->i];
    /* a sliding layer sees the last W positions, itself included */
    a->j0 = w->layers[t->layer].swa && pos >= hp->sliding_window ? pos - hp->sliding_window + 1 : 0;
    a->cnt = pos + 1 - a->j0;
    /* this head's rows of the slot's blocks (ie_attn.h's paged view) */
    a->kq = kv_rows(w, 0, t->layer, seq, a->kh);
    a->vq = kv_rows(w, 1, t->layer, seq, a->kh);
    (void)hd;
    return 1;
}

/* Units per attention job (att_run deals them round-robin). */
static long att_units(const att_task_t *t)
{
    const ie_hparams_t *hp = &t->w->hp;
    const int group = hp->n_head / hp->n_head_kv, nsub = (group + t->sg - 1) / t->sg;
    return (long)(t->i1 - t->i0) * t->w->n_kv_loc * nsub;
}

/* m = the mean of the first KVQ_SMOOTH_ROWS rows of a smoothed cache c's
 * view, on the channels of kv_smooth_keep only (0 elsewhere): RoPE turns a
 * channel pair by an angle growing with the position, so a mean taken at
 * positions 0..15 stands for a later row only on the pairs RoPE barely
 * turns (measured: the whole mean helps at 512 positions and hurts at
 * 8192). The mean is taken in the basis the rows are stored in (rotated
 * or not); the mask applies in RoPE's. */
static void kv_mean_head(const ie_worker_t *w, int c, const ie_kv_rows_t *rows, float *m)
{
    const int hd = w->hp.head_dim;
    kvq_mean(w->ops, w->kv_type[c], rows, hd, m);
    if (!w->kv_smooth_keep) return;
    if (w->kv_rot[c]) kvq_fwht(m, hd);
    for (int i = 0; i < hd; i++)
        if (!w->kv_smooth_keep[i]) m[i] = 0.0f;
    if (w->kv_rot[c]) kvq_fwht(m, hd);
}

/* kv_recent: the index of slot seq's row for position j on held layer ll
 * in k_recent: a sink's own place (sink), else the window's ring place. */
static size_t recent_index(const ie_worker_t *w, int seq, size_t ll, int j, int sink)
{
    const size_t per = (size_t)(w->k_recent_len + w->k_sinks);
    const size_t base = ((size_t)seq * (size_t)(w->sh.layer_end - w->sh.layer_begin) + ll) * per;
    return base + (sink ? (size_t)(w->k_recent_len + j) : (size_t)(j % w->k_recent_len));
}

/* Row j (of the recent window or a sink) of cache c (0 K, 1 V) of token
 * i (slot seq) on held layer ll in f32, rotated (kv_recent): the step's
 * own copy when j is one of its tokens, else the slot's rows when they
 * still hold j; NULL: neither (the cache's row stands). */
static const float *recent_row(const ie_worker_t *w, const ie_batch_t *b, int i, int seq, size_t ll, int j, int c)
{
    const int k = i - (b->pos[i] - j); /* a slot's tokens come in order */
    if (k >= 0 && b->seq[k] == seq && b->pos[k] == j) return (c ? w->v_batch : w->k_batch) + (size_t)k * w->kv_dim;
    const size_t r = recent_index(w, seq, ll, j, j < w->k_sinks);
    return w->k_recent_pos[r] == j ? (c ? w->v_recent : w->k_recent) + r * w->kv_dim : NULL;
}

/* The first row of token pos's recent window in a view from j0, and the
 * end of the sinks before it (kv_recent): rows j0 .. s1-1 and g0 .. pos
 * are read in f32. */
static void recent_span(const ie_worker_t *w, int pos, int j0, int *s1, int *g0)
{
    *g0 = pos - w->k_recent_len + 1 > j0 ? pos - w->k_recent_len + 1 : j0;
    *s1 = w->k_sinks < *g0 ? w->k_sinks : *g0;
}

/* Where a unit's rows are read from: K and V views and types, row j of
 * the unit at K row j + koff and V row j + voff; smooth_k: these K rows
 * are stored less the smoothing mean (the q.m add applies). */
typedef struct att_src {
    ie_kv_type_t kt, vt;
    ie_kv_rows_t k, v;
    int koff, voff, smooth_k;
} att_src_t;

/* A run of a unit's rows [j, j + n) attended by one kv_attend call. */
typedef struct att_seg {
    const att_src_t *src;
    int j, n;
    int add;   /* the smoothing's scale * q.m joins these scores */
    int vmean; /* these V rows hold v - m: their weight times m is added back */
} att_seg_t;

/* Rows of a unit the worker may hold in f32 (kv_recent: the sinks and
 * the recent window), 0 without. */
static int att_f32_rows(const ie_worker_t *w) { return w->kv_recent ? w->k_recent_len + w->k_sinks : 0; }

/* Runs a unit splits into at most: the rows before and from
 * KVQ_SMOOTH_ROWS, the rows between the sinks and the window, and each
 * f32 row on its own (they alternate with the cache's when the worker
 * lost some). */
static int att_seg_max(const ie_worker_t *w) { return att_f32_rows(w) + 4; }

/* A unit's sources and runs (att_plan). */
typedef struct att_plan {
    att_src_t src[3]; /* the cache (a prefill: kv_pre), the sinks' f32 rows, the window's */
    att_seg_t *seg;   /* [att_seg_max] */
    int ns;
} att_plan_t;

/* Rows [j, e) of source src onto the plan, cut at KVQ_SMOOTH_ROWS (rows
 * from there on may be stored less the smoothing means: smk / smv), joined
 * to the last run when they continue it alike. */
static void att_push(att_plan_t *p, const att_src_t *src, int j, int e, int smk, int smv)
{
    while (j < e) {
        const int sm = j >= KVQ_SMOOTH_ROWS, cut = sm || e <= KVQ_SMOOTH_ROWS ? e : KVQ_SMOOTH_ROWS;
        const int add = sm && smk && src->smooth_k, vmean = sm && smv;
        att_seg_t *last = p->ns ? &p->seg[p->ns - 1] : NULL;
        if (last && last->src == src && last->j + last->n == j && last->add == add && last->vmean == vmean)
            last->n += cut - j;
        else p->seg[p->ns++] = (att_seg_t){src, j, cut - j, add, vmean};
        j = cut;
    }
}

/* Rows [j, e) of the f32 source r (row j at copy row j + r->koff of
 * kcopy / vcopy) where the worker holds them (recent_row; V too with
 * kv_recent_v), the others from the cache c. */
static void att_push_f32(const att_task_t *t, const att_unit_t *a, att_plan_t *p, const att_src_t *c,
                         const att_src_t *r, float *kcopy, float *vcopy, int j, int e, int smk, int smv)
{
    const ie_worker_t *w = t->w;
    const int hd = w->hp.head_dim, seq = t->b->seq[a->i];
    const size_t ll = (size_t)(t->layer - w->sh.layer_begin), hb = (size_t)hd * sizeof(float);
    for (; j < e; j++) {
        const float *kr = recent_row(w, t->b, a->i, seq, ll, j, 0);
        const float *vr = kr && w->kv_recent_v ? recent_row(w, t->b, a->i, seq, ll, j, 1) : NULL;
        const int f32 = kr && (!w->kv_recent_v || vr);
        if (f32) {
            memcpy(kcopy + (size_t)(j + r->koff) * hd, kr + (size_t)a->kh * hd, hb);
            if (vr) memcpy(vcopy + (size_t)(j + r->voff) * hd, vr + (size_t)a->kh * hd, hb);
        }
        att_push(p, f32 ? r : c, j, j + 1, smk, smv);
    }
}

/* The runs of unit a: its visible rows j0 .. pos from the cache (a
 * prefill: the step's decoded rows kv_pre, a q8 K the cache's own) except,
 * with kv_recent, the rows of the slot's sinks and of the token's recent
 * window (recent_span) the worker holds in f32: their K from copies at
 * kcopy, their V from copies at vcopy with kv_recent_v (a quantized V),
 * else the cache's ((k_sinks + k_recent_len) x hd floats each).
 * Smoothing: a K's q.m is added to the cache rows from KVQ_SMOOTH_ROWS on
 * that hold k - m (a prefill's decoded rows have m back already, pre_run),
 * a V's m weighted by those rows' share. */
static void att_plan(const att_task_t *t, const att_unit_t *a, float *kcopy, float *vcopy, att_plan_t *p)
{
    const ie_worker_t *w = t->w;
    const layer_t *L = &w->layers[t->layer];
    const int hd = w->hp.head_dim, pre = t->seq >= 0, end = a->j0 + a->cnt;
    const ie_kv_type_t kt = w->kv_type[0], vt = w->kv_type[1];
    const size_t pre_stride = (size_t)w->kv_dim * sizeof(float);
    att_src_t *c = &p->src[0];
    /* a q8 K is always scored on integers (a prefill too: one exact int32
     * dot a row costs no more than the f32 one over its decoded copy), so
     * a recomputed prefix scores as its decode steps did */
    if (pre && kt != IE_KV_Q8)
        *c = (att_src_t){.kt = IE_KV_F32,
                         .k = {(const unsigned char *)(w->kv_pre[0] + (size_t)a->kh * hd), pre_stride, NULL, 0, 0},
                         .koff = -t->lo};
    else *c = (att_src_t){.kt = kt, .k = a->kq, .koff = 0, .smooth_k = 1};
    if (pre) {
        c->vt = IE_KV_F32;
        c->v = (ie_kv_rows_t){(const unsigned char *)(w->kv_pre[1] + (size_t)a->kh * hd), pre_stride, NULL, 0, 0};
        c->voff = -t->lo;
    } else c->vt = vt, c->v = a->vq, c->voff = 0;
    const int smk = w->kv_smooth[0] && !L->swa && (!pre || kt == IE_KV_Q8);
    const int smv = w->kv_smooth[1] && !L->swa && !pre;
    p->ns = 0;
    if (!w->kv_recent || L->swa) {
        att_push(p, c, a->j0, end, smk, smv);
        return;
    }
    /* copy rows: the sinks [j0, s1) at 0.., the window [g0, pos] after them */
    int s1, g0;
    recent_span(w, t->b->pos[a->i], a->j0, &s1, &g0);
    const int ns1 = s1 > a->j0 ? s1 - a->j0 : 0;
    const ie_kv_rows_t kc = {(const unsigned char *)kcopy, (size_t)hd * sizeof(float), NULL, 0, 0};
    const ie_kv_rows_t vc = {(const unsigned char *)vcopy, (size_t)hd * sizeof(float), NULL, 0, 0};
    for (int k = 1; k <= 2; k++) {
        const int off = k == 1 ? -a->j0 : ns1 - g0;
        p->src[k] = (att_src_t){.kt = IE_KV_F32, .k = kc, .koff = off};
        if (w->kv_recent_v) p->src[k].vt = IE_KV_F32, p->src[k].v = vc, p->src[k].voff = off;
        else p->src[k].vt = c->vt, p->src[k].v = c->v, p->src[k].voff = c->voff;
    }
    att_push_f32(t, a, p, c, &p->src[1], kcopy, vcopy, a->j0, s1, smk, smv);
    if (s1 < g0) att_push(p, c, s1, g0, smk, smv);
    att_push_f32(t, a, p, c, &p->src[2], kcopy, vcopy, g0, end, smk, smv);
}

/* Floats of a thread's attention scratch (att_run): two online-softmax
 * states of `group` heads (the unit's, a run's: hd + 2 floats a head),
 * the q.m adds, the V-smoothing share (2 a head) and the copies of the
 * f32 K and V rows (att_f32_rows each). */
static size_t att_ws_floats(const ie_worker_t *w, int group, int hd)
{
    return (size_t)group * (2 * (size_t)hd + 7) + 2 * (size_t)att_f32_rows(w) * (size_t)hd;
}

/* One (token, held KV head, share of its query heads) per unit of work: the
 * shared K and V rows are read once for all those heads (GQA) by the fused
 * kernel (kv_attend: scores, an online f32 softmax and the weighted sum of
 * values in one pass), run by run of att_plan, the runs' partial states
 * merged (ie_attn_state_merge) and normalized once with the sink
 * (ie_attn_state_finish) into xb. The kernel reads the slot's rows through
 * its block table (a paged view) with the arithmetic of a contiguous pass,
 * so any block size and placement gives the same bits. Units are dealt
 * round-robin: a causal prefill's later tokens cost more, contiguous shares
 * would leave the first thread idle. */
static void att_run(void *ctx, int ith, int nth)
{
    att_task_t *t = ctx;
    ie_worker_t *w = t->w;
    const ie_hparams_t *hp = &w->hp;
    const layer_t *L = &w->layers[t->layer];
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const float scale = hp->attn_scale != 0.0f ? hp->attn_scale : 1.0f / sqrtf((float)hd);
    /* this thread's scratch: states of the unit (tot) and of a run (run) */
    float *ws = w->att_ws + (size_t)ith * att_ws_floats(w, group, hd);
    const ie_attn_state_t tot = {ws, ws + group, ws + 2 * group, (size_t)hd};
    const ie_attn_state_t run = {ws + 2 * group + (size_t)group * hd, ws + 3 * group + (size_t)group * hd,
                                 ws + 4 * group + (size_t)group * hd, (size_t)hd};
    float *addv = ws + 4 * group + 2 * (size_t)group * hd, *vm_m = addv + group, *vm_l = vm_m + group;
    float *kcopy = vm_l + group, *vcopy = kcopy + (size_t)att_f32_rows(w) * hd;
    /* a rotated cache: the rotated queries in this thread's share of kv_tmp */
    float *qrot = w->kv_tmp ? w->kv_tmp + (size_t)ith * (size_t)group * hd : NULL;
    /* a smoothed cache: this thread's K and V means */
    float *mk = w->kv_mean ? w->kv_mean + (size_t)ith * 2 * hd : NULL, *mv = mk ? mk + hd : NULL;
    const long units = att_units(t);
    att_unit_t a;
    att_plan_t plan = {.seg = w->att_segs + (size_t)ith * (size_t)att_seg_max(w)};
    for (long u = ith; u < units; u += nth) {
        if (!att_unit(t, u, &a)) continue;
        const int pre = t->seq >= 0;
        if (pre ? t->b->seq[a.i] != t->seq : w->kv_mark && w->kv_mark[a.i]) continue;
        const float *q = w->q + (size_t)a.i * w->q_dim + (size_t)a.h0 * hd;
        if (w->kv_rot[0]) { /* K is stored rotated: rotate Q alike, q.k stays */
            memcpy(qrot, q, (size_t)a.nh * hd * sizeof(float));
            for (int hh = 0; hh < a.nh; hh++) kvq_fwht(qrot + (size_t)hh * hd, hd);
            q = qrot;
        }
        att_plan(t, &a, kcopy, vcopy, &plan);
        int add = 0, vmean = 0;
        for (int s = 0; s < plan.ns; s++) add |= plan.seg[s].add, vmean |= plan.seg[s].vmean;
        if (add) { /* rows that hold k - m: q.k = q.(k - m) + q.m */
            kv_mean_head(w, 0, &a.kq, mk);
            for (int hh = 0; hh < a.nh; hh++) {
                const float *qh = q + (size_t)hh * hd;
                float qm = 0.0f;
                for (int i = 0; i < hd; i++) qm += qh[i] * mk[i];
                addv[hh] = qm * scale;
            }
        }
        for (int hh = 0; hh < a.nh; hh++) vm_l[hh] = 0.0f;
        for (int s = 0; s < plan.ns; s++) {
            const att_seg_t *g = &plan.seg[s];
            const att_src_t *src = g->src;
            const ie_kv_attend_t at = {.kt = src->kt,
                                       .vt = src->vt,
                                       .k = &src->k,
                                       .v = &src->v,
                                       .kj = g->j + src->koff,
                                       .vj = g->j + src->voff,
                                       .n = g->n,
                                       .hd = hd,
                                       .nh = a.nh,
                                       .q = q,
                                       .q_stride = (size_t)hd,
                                       .scale = scale,
                                       .cap = w->arch.attn_softcap,
                                       .add = g->add ? addv : NULL};
            const ie_attn_state_t *st = s ? &run : &tot;
            w->ops->kv_attend(&at, st);
            if (g->vmean) /* the running max and sum of the rows holding v - m */
                for (int hh = 0; hh < a.nh; hh++) {
                    if (st->l[hh] == 0.0f) continue;
                    if (vm_l[hh] == 0.0f) {
                        vm_m[hh] = st->m[hh], vm_l[hh] = st->l[hh];
                        continue;
                    }
                    const float m = vm_m[hh] > st->m[hh] ? vm_m[hh] : st->m[hh];
                    vm_l[hh] = vm_l[hh] * expf(vm_m[hh] - m) + st->l[hh] * expf(st->m[hh] - m);
                    vm_m[hh] = m;
                }
            if (s) ie_attn_state_merge(&tot, &run, a.nh, hd);
        }
        if (vmean) { /* their weight times m, before the one normalization */
            kv_mean_head(w, 1, &a.vq, mv);
            for (int hh = 0; hh < a.nh; hh++) {
                if (vm_l[hh] == 0.0f) continue;
                const float c = vm_l[hh] * expf(vm_m[hh] - tot.m[hh]);
                float *o = tot.o + (size_t)hh * hd;
                for (int i = 0; i < hd; i++) o[i] += c * mv[i];
            }
        }
        float *out = w->xb + (size_t)a.i * w->q_dim + (size_t)a.h0 * hd;
        ie_attn_state_finish(&tot, a.nh, hd, L->sinks ? &L->sinks[a.h0] : NULL, out, (size_t)hd);
        if (w->kv_rot[1]) /* V was stored rotated: the weighted sum is too */
            for (int hh = 0; hh < a.nh; hh++) kvq_fwht(out + (size_t)hh * hd, hd);
    }
}

/* Every 64-byte line of [p, p + n), into L2. */
static void prefetch_l2(const void *p, size_t n)
{
    const uintptr_t a = (uintptr_t)p, e = a + n;
    for (uintptr_t l = a & ~(uintptr_t)63; l < e; l += 64) __builtin_prefetch((const void *)l, 0, 2);
}

/* Decode: fetch into L2 the cached K and V rows that att_run's share ith
 * will read after this matmul job, the token's own row left out (the owner
 * writes it after the job). Run by every thread before its share of the
 * q/k/v matmul: a decode step's cache rows are read once per layer, a
 * head's hd floats out of every kv_dim, from DRAM (the weights stream
 * evicts them), and that scattered read ran latency-bound in att_run; as
 * prefetches ahead of the matmul's stream they cost the bandwidth of their
 * bytes and are still in L2 (the job streams ~0.7 MB a thread for
 * TinyLlama) when attention runs. At most KVPF_MAX bytes, the first rows
 * (attention's own prefetch streams the rest): at 1000 positions the whole
 * share (~1 MB a thread) measured slightly slower than none. In-run A/B
 * (bench_decode --ab kvprefetch, Q4_0 TinyLlama shape, ~150 positions):
 * +0.017 to +0.027 of the paired read in the high-bandwidth phase. */
#define KVPF_MAX ((size_t)256 << 10) /* bytes a thread fetches ahead */
static void att_prefetch(void *ctx, int ith, int nth)
{
    const att_task_t *t = ctx;
    const size_t kbytes = t->w->kv_head_bytes[0], vbytes = t->w->kv_head_bytes[1];
    const long units = att_units(t);
    size_t left = KVPF_MAX;
    att_unit_t a;
    for (long u = ith; u < units; u += nth) {
        if (!att_unit(t, u, &a)) continue;
        for (int j = 0; j + 1 < a.cnt && left >= kbytes + vbytes; j++, left -= kbytes + vbytes) {
            prefetch_l2(ie_kv_row(&a.kq, a.j0 + j), kbytes);
            prefetch_l2(ie_kv_row(&a.vq, a.j0 + j), vbytes);
        }
    }
}

/* Query heads per attention unit: a whole KV group unless that leaves the
 * pool short of work (a decode step of few KV heads), then halves. */
static int att_share(const ie_worker_t *w, int n)
{
    const int group = w->hp.n_head / w->hp.n_head_kv, nth = w->opts.n_threads;
    int sg = group;
    while (nth > 1 && sg > 1 && (long)n * w->n_kv_loc * ((group + sg - 1) / sg) < 2L * nth) sg = (sg + 1) / 2;
    return sg;
}

/* Positions of a slot's ring for sliding window W (0: no ring): the
 * window and W - 1 more positions, whole blocks (a step stores and attends
 * kv_ring_chunk >= W tokens at a time, so the rows its tokens read, W - 1
 * before the chunk and the chunk's own, never exceed the ring); none when
 * that is not less than the whole context. */
static int ring_len(int W, int n_ctx, int kb)
{
    const int64_t nrb = (2 * (int64_t)W - 1 + kb - 1) / kb, nlb = ((int64_t)n_ctx + kb - 1) / kb;
    return W > 0 && nrb < nlb ? (int)(nrb * kb) : 0;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_kv_layout(const ie_hparams_t *hp, const ie_shard_range_t *sh, const ie_worker_opts_t *o,
                                ie_kv_layout_t *out)
{
    ie_arch_desc_t arch;
    ie_status_t st = ie_arch_desc_init(hp, &arch);
    if (st != IE_OK) return st;
    const int l0 = sh ? sh->layer_begin : 0, l1 = sh ? sh->layer_end : hp->n_layer;
    const int kvh = sh ? sh->kv_head_end - sh->kv_head_begin : hp->n_head_kv;
    int n_swa = 0;
    for (int l = l0; l < l1; l++) n_swa += arch.sliding && hp->layer_swa[l];
    out->kv_block = o->kv_block > 0 ? o->kv_block : 16;
    out->ring_len = !o->kv_swa_full && n_swa ? ring_len(hp->sliding_window, o->n_ctx, out->kv_block) : 0;
    const int n_ring = out->ring_len ? n_swa : 0;
    out->block_bytes = out->ring_bytes = 0;
    /* a q4 K's f32 rows of the recent window and sinks, and V's alike when
     * it is quantized and not smoothed (worker_kv_new's kv_recent_v) */
    const int recent_v = o->kv_type_v != IE_KV_F32 && !kvq_smooths(o->kv_type_v, 1);
    out->recent_bytes = kvq_recent(o->kv_type_k)
                            ? (uint64_t)(1 + recent_v) * (uint64_t)o->n_seq * (uint64_t)(l1 - l0) *
                                  (uint64_t)(kvq_recent_len() + kvq_sinks()) * (uint64_t)kvh *
                                  (uint64_t)hp->head_dim * sizeof(float)
                            : 0;
    for (int c = 0; c < 2; c++) {
        const ie_kv_type_t t = c ? o->kv_type_v : o->kv_type_k;
        const size_t hb = ie_kv_head_bytes(t, hp->head_dim);
        if (!hb)
            return ie_error_set(IE_ERR_INVAL, "KV cache type %s cannot hold a head of %d values%s",
                                ie_kv_type_name(t), hp->head_dim,
                                (unsigned)t < IE_KV_TYPE_COUNT
                                    ? " (q4: a multiple of 32; every type but f32: at most 256)"
                                    : "");
        const uint64_t row = (uint64_t)kvh * hb;
        out->block_bytes += (uint64_t)out->kv_block * (uint64_t)(l1 - l0 - n_ring) * row;
        out->ring_bytes += (uint64_t)o->n_seq * (uint64_t)out->ring_len * (uint64_t)n_ring * row;
    }
    return IE_OK;
}

/* Contract (ie_worker.h): the rings first (a fixed cost per slot), whole
 * blocks from the rest; a layout with no pool layers needs no pool bytes. */
ie_status_t ie_worker_kv_budget_blocks(const ie_kv_layout_t *ly, uint64_t budget, int full, int *blocks)
{
    const uint64_t left = budget > ly->ring_bytes ? budget - ly->ring_bytes : 0;
    const uint64_t n = ly->block_bytes ? left / ly->block_bytes : left > 0 ? (uint64_t)full : 0;
    if (n < 1)
        return ie_error_set(IE_ERR_INVAL,
                            "KV memory budget of %llu bytes holds no block of %d positions (%llu bytes) after the "
                            "sliding layers' rings (%llu bytes)",
                            (unsigned long long)budget, ly->kv_block, (unsigned long long)ly->block_bytes,
                            (unsigned long long)ly->ring_bytes);
    /* never more than every slot's whole context needs */
    *blocks = n > (uint64_t)full ? full : (int)n;
    return IE_OK;
}

/* Contract (worker_internal.h). */
ie_status_t worker_kv_new(ie_worker_t *w)
{
    const ie_worker_opts_t *opts = &w->opts;
    const ie_shard_range_t *sh = &w->sh;
    const int qgroup = w->hp.n_head / w->hp.n_head_kv, half = w->hp.rope_dim / 2;

    w->kv_block = opts->kv_block > 0 ? opts->kv_block : 16;
    w->kv_nlb = (int)(((int64_t)opts->n_ctx + w->kv_block - 1) / w->kv_block);
    const int64_t full_pool = (int64_t)opts->n_seq * w->kv_nlb;
    if (opts->kv_blocks == 0 && full_pool > INT32_MAX)
        return ie_error_set(IE_ERR_INVAL, "worker: %d slots of %d KV blocks do not fit a block id", opts->n_seq,
                            w->kv_nlb);
    w->kv_blocks = opts->kv_blocks > 0 ? opts->kv_blocks : (int)full_pool;
    w->all_swa = sh->layer_end > sh->layer_begin;
    for (int l = sh->layer_begin; l < sh->layer_end; l++) w->all_swa &= w->layers[l].swa;
    /* Sliding layers keep a ring of their window, not the whole context:
     * the window W and W - 1 more positions, whole blocks (a step stores
     * and attends kv_ring_chunk >= W tokens at a time, so the rows its
     * tokens read, W - 1 before the chunk and the chunk's own, are never
     * more than the ring). A worker-local ring rather than pool blocks
     * released as they leave the window: the coordinator's pool, block
     * accounting, prefix cache and cluster protocol stay one block table
     * of the full layers, and nothing outside this file learns of it but
     * the pool's size. No ring when it would hold the whole context. */
    const int W = w->hp.sliding_window;
    int n_ring = 0;
    for (int l = sh->layer_begin; l < sh->layer_end; l++) n_ring += w->layers[l].swa;
    w->kv_ring_len = !opts->kv_swa_full && n_ring > 0 ? ring_len(W, opts->n_ctx, w->kv_block) : 0;
    w->kv_ring_nrb = w->kv_ring_len / w->kv_block;
    w->kv_ring_chunk = w->kv_ring_nrb ? w->kv_ring_len - W + 1 : 0;
    w->kv_pool_layers = 0;
    for (int l = sh->layer_begin, nr = 0; l < sh->layer_end; l++) {
        layer_t *L = &w->layers[l];
        L->ring = w->kv_ring_nrb > 0 && L->swa;
        L->kv_li = L->ring ? nr++ : w->kv_pool_layers++;
    }
    if (!w->kv_ring_nrb) n_ring = 0;
    /* the pool in bytes of the chosen types: a q8 cache holds ~4x the
     * positions of an f32 one in the same memory */
    const int hd = w->hp.head_dim;
    uint64_t kv_bytes_k = 0, kv_bytes_v = 0;
    for (int c = 0; c < 2; c++) {
        const ie_kv_type_t t = c ? opts->kv_type_v : opts->kv_type_k;
        w->kv_type[c] = t;
        w->kv_rot[c] = kvq_rotates(t, opts->kv_rotate);
        w->kv_smooth[c] = kvq_smooths(t, c);
        w->kv_head_bytes[c] = ie_kv_head_bytes(t, hd);
        if (!w->kv_head_bytes[c])
            return ie_error_set(IE_ERR_INVAL, "KV cache type %s cannot hold a head of %d values%s",
                                ie_kv_type_name(t), hd,
                                (unsigned)t < IE_KV_TYPE_COUNT
                                    ? " (q4: a multiple of 32; every type but f32: at most 256)"
                                    : "");
        w->kv_row_bytes[c] = (size_t)w->n_kv_loc * w->kv_head_bytes[c];
        w->kv_layer_bytes[c] = (size_t)w->kv_block * w->kv_row_bytes[c];
        w->kv_block_bytes[c] = (size_t)w->kv_pool_layers * w->kv_layer_bytes[c];
        w->kv_ring_block_bytes[c] = (size_t)n_ring * w->kv_layer_bytes[c];
        w->kv_ring_slot_bytes[c] = (size_t)w->kv_ring_nrb * w->kv_ring_block_bytes[c];
    }
    const uint64_t ring_bytes = (uint64_t)opts->n_seq * (w->kv_ring_slot_bytes[0] + w->kv_ring_slot_bytes[1]);
    /* a byte budget (no block count given): as many whole blocks of the
     * chosen types as it holds (at most the full pool), so a q8 cache
     * gets ~4x an f32 one's positions */
    if (opts->kv_blocks == 0 && opts->kv_mem_bytes > 0) {
        const ie_kv_layout_t ly = {w->kv_block, w->kv_ring_len,
                                   (uint64_t)w->kv_block_bytes[0] + w->kv_block_bytes[1], ring_bytes, 0};
        ie_status_t st = ie_worker_kv_budget_blocks(&ly, opts->kv_mem_bytes, (int)full_pool, &w->kv_blocks);
        if (st != IE_OK) return st;
    }
    w->opts.kv_block = w->kv_block;
    w->opts.kv_blocks = w->kv_blocks;
    for (int c = 0; c < 2; c++) {
        const uint64_t b = (uint64_t)w->kv_blocks * (uint64_t)w->kv_block_bytes[c];
        if ((uint64_t)w->kv_blocks > 0 && b / (uint64_t)w->kv_blocks != (uint64_t)w->kv_block_bytes[c])
            return ie_error_set(IE_ERR_NOMEM, "out of memory: a KV cache of %d blocks of %d positions is too large",
                                w->kv_blocks, w->kv_block);
        *(c ? &kv_bytes_v : &kv_bytes_k) = b;
    }
    if (kv_bytes_k > (uint64_t)SIZE_MAX / 4 || kv_bytes_v > (uint64_t)SIZE_MAX / 4)
        return ie_error_set(IE_ERR_NOMEM, "out of memory: a KV cache of %d blocks of %d positions is too large",
                            w->kv_blocks, w->kv_block);
    const size_t kv_bytes = (size_t)(kv_bytes_k + kv_bytes_v);
    /* Block-major and on huge pages. Decode reads a head's rows out of
     * every cached position of a layer, ~1 KiB apart: on 4 KiB pages a TLB
     * miss every few rows, its page walk from DRAM (the weight stream
     * evicts the tables), and the hardware prefetchers stop at every page.
     * Measured (Q4_0 TinyLlama shape, 2 threads, 1016 positions,
     * alternating runs): 71-75 t/s against 66-68 in the high-bandwidth
     * phase (0.75-0.79 of the paired read against 0.70), 0.87-0.88 against
     * 0.83-0.86 in the low. Block-major keeps the cost of huge pages
     * small: a block holds every held layer, so the first write into a
     * 2 MiB region commits blocks of all layers at once (a fresh slot: 2 MiB
     * per cache), where a layer-major cache committed 2 MiB per layer. */
    w->kcache = worker_big_alloc(kv_bytes_k ? (size_t)kv_bytes_k : 1);
    w->vcache = worker_big_alloc(kv_bytes_v ? (size_t)kv_bytes_v : 1);
    if (w->kv_ring_nrb) { /* ring_bytes / n_seq fit a size_t: they are less than the full pool's */
        w->kring = worker_big_alloc((size_t)opts->n_seq * w->kv_ring_slot_bytes[0]);
        w->vring = worker_big_alloc((size_t)opts->n_seq * w->kv_ring_slot_bytes[1]);
        w->kv_ring_tab = malloc((size_t)w->kv_nlb * sizeof(int32_t));
        w->kv_ring_pos = malloc((size_t)opts->n_seq * w->kv_ring_len * sizeof(int32_t));
        if (!w->kring || !w->vring || !w->kv_ring_tab || !w->kv_ring_pos)
            return ie_error_set(IE_ERR_NOMEM, "out of memory allocating the sliding layers' KV rings (%llu bytes)",
                                (unsigned long long)ring_bytes);
        for (int lb = 0; lb < w->kv_nlb; lb++) w->kv_ring_tab[lb] = lb % w->kv_ring_nrb;
        for (size_t i = 0; i < (size_t)opts->n_seq * w->kv_ring_len; i++) w->kv_ring_pos[i] = -1;
    }
    /* a prefill's decoded rows: up to KVQ_PRE_BYTES of them, K and V */
    if (w->kv_type[0] != IE_KV_F32 || w->kv_type[1] != IE_KV_F32) {
        const size_t row = (size_t)w->kv_dim * sizeof(float) * 2;
        const size_t rows = KVQ_PRE_BYTES / (row ? row : 1);
        w->kv_pre_rows = (int)(rows < (size_t)opts->n_ctx ? rows : (size_t)opts->n_ctx);
        w->kv_pre[0] = worker_big_alloc((size_t)w->kv_pre_rows * w->kv_dim * sizeof(float) + 64);
        w->kv_pre[1] = worker_big_alloc((size_t)w->kv_pre_rows * w->kv_dim * sizeof(float) + 64);
        w->kv_mark = malloc((size_t)opts->max_batch);
        if (!w->kv_pre[0] || !w->kv_pre[1] || !w->kv_mark)
            return ie_error_set(IE_ERR_NOMEM, "out of memory allocating the KV decode scratch");
    }
    const int kv_tmp = w->kv_rot[0] || w->kv_rot[1];
    w->kv_tmp = kv_tmp ? worker_big_alloc((size_t)opts->n_threads * (size_t)qgroup * (size_t)hd * sizeof(float))
                       : NULL;
    const int kv_sm = w->kv_smooth[0] || w->kv_smooth[1];
    w->kv_mean = kv_sm
                     ? worker_big_alloc(((size_t)opts->n_threads * 2 * hd + 2 * (size_t)w->kv_dim) * sizeof(float))
                     : NULL;
    w->kv_recent = kvq_recent(w->kv_type[0]);
    if (w->kv_recent) {
        w->k_recent_len = kvq_recent_len();
        w->k_sinks = kvq_sinks();
        const size_t rows = (size_t)opts->n_seq * (size_t)(sh->layer_end - sh->layer_begin) *
                            (size_t)(w->k_recent_len + w->k_sinks);
        w->k_batch = malloc((size_t)opts->max_batch * w->kv_dim * sizeof(float));
        w->k_recent = malloc(rows * w->kv_dim * sizeof(float));
        w->kv_recent_v = w->kv_type[1] != IE_KV_F32 && !w->kv_smooth[1];
        if (w->kv_recent_v) {
            w->v_batch = malloc((size_t)opts->max_batch * w->kv_dim * sizeof(float));
            w->v_recent = malloc(rows * w->kv_dim * sizeof(float));
            if (!w->v_batch || !w->v_recent)
                return ie_error_set(IE_ERR_NOMEM, "out of memory allocating the V's f32 recent rows");
        }
        w->k_recent_pos = malloc(rows * sizeof(int32_t));
        if (!w->k_batch || !w->k_recent || !w->k_recent_pos)
            return ie_error_set(IE_ERR_NOMEM, "out of memory allocating the q4 K's f32 recent rows");
        for (size_t r = 0; r < rows; r++) w->k_recent_pos[r] = -1;
    }
    w->seq_len = calloc((size_t)opts->n_seq, sizeof(int));
    w->btab = malloc((size_t)full_pool * sizeof(int32_t));
    w->rope_cos = malloc((size_t)opts->n_ctx * half * sizeof(float));
    w->rope_sin = malloc((size_t)opts->n_ctx * half * sizeof(float));
    /* sliding layers' own tables only when their RoPE differs (Gemma 3) */
    const int swa_tables = w->arch.sliding && w->hp.rope_theta_swa != 0.0f &&
                           (w->hp.rope_theta_swa != w->hp.rope_theta ||
                            w->arch.rope_scaling != IE_ROPE_SCALING_NONE);
    w->rope_cos_swa = swa_tables ? malloc((size_t)opts->n_ctx * half * sizeof(float)) : w->rope_cos;
    w->rope_sin_swa = swa_tables ? malloc((size_t)opts->n_ctx * half * sizeof(float)) : w->rope_sin;
    w->att_ws = malloc((size_t)opts->n_threads * att_ws_floats(w, qgroup, w->hp.head_dim) * sizeof(float));
    w->att_segs = malloc((size_t)opts->n_threads * (size_t)att_seg_max(w) * sizeof *w->att_segs);
    if (!w->kcache || !w->vcache || !w->seq_len || !w->btab || !w->rope_cos || !w->rope_sin || !w->rope_cos_swa ||
        !w->rope_sin_swa || !w->att_ws || !w->att_segs || (kv_tmp && !w->kv_tmp) || (kv_sm && !w->kv_mean))
        return ie_error_set(IE_ERR_NOMEM, "out of memory allocating KV cache (%zu bytes) and scratch", kv_bytes);
    /* a pool with room for every slot's whole context starts as the
     * unpaged cache (slot s owns blocks s*kv_nlb ..); a smaller one unbound */
    for (int64_t i = 0; i < full_pool; i++) w->btab[i] = w->kv_blocks >= full_pool ? (int32_t)i : -1;
    rope_tables(w);
    /* a smoothed cache: the channels RoPE turns by at most 1 radian over
     * the context (the angle at position 1 times n_ctx); dims past
     * rope_dim do not turn. IE_KV_SMOOTH_ALL=1: every channel (measuring) */
    const char *all = getenv("IE_KV_SMOOTH_ALL");
    if (kv_sm && !(all && !strcmp(all, "1"))) {
        const int half = w->hp.rope_dim / 2;
        if (!(w->kv_smooth_keep = malloc((size_t)hd)))
            return ie_error_set(IE_ERR_NOMEM, "out of memory allocating the KV smoothing mask");
        memset(w->kv_smooth_keep, 1, (size_t)hd);
        for (int i = 0; i < half && opts->n_ctx > 1; i++) {
            const float ang = fabsf(atan2f(w->rope_sin[half + i], w->rope_cos[half + i]));
            const int keep = ang * (float)opts->n_ctx <= 1.0f;
            const int d0 = w->arch.rope_layout == IE_ROPE_NEOX ? i : 2 * i;
            const int d1 = w->arch.rope_layout == IE_ROPE_NEOX ? i + half : 2 * i + 1;
            w->kv_smooth_keep[d0] = w->kv_smooth_keep[d1] = (uint8_t)keep;
        }
    }
    return IE_OK;
}

/* Contract (worker_internal.h): in the pool its own position, and the
 * window before it (all of it unless every held layer slides and none
 * has a ring); in a ring, the window before the slot's first token of the
 * step (the later ones follow it one by one and read the step's own rows). */
ie_status_t worker_kv_check(const ie_worker_t *w, const ie_batch_t *b, int i)
{
    const int pos = b->pos[i], kb = w->kv_block, seq = b->seq[i], W = w->hp.sliding_window;
    const int j0 = w->all_swa && !w->kv_ring_nrb && pos >= W ? pos - W + 1 : 0;
    const int32_t *tab = w->btab + (size_t)seq * w->kv_nlb;
    for (int lb = pos / kb; w->kv_pool_layers > 0 && lb >= j0 / kb; lb--)
        if (tab[lb] < 0) {
            const int at = lb * kb > j0 ? lb * kb : j0;
            return ie_error_set(IE_ERR_RANGE, "worker: slot %d position %d: its KV block %d is not bound%s", seq,
                                lb == pos / kb ? pos : at, lb, lb == pos / kb ? "" : " (read by a later position)");
        }
    if (!w->kv_ring_nrb) return IE_OK;
    int prev = -1;
    for (int k = 0; k < i; k++)
        if (b->seq[k] == seq) prev = k;
    if (prev >= 0) {
        if (pos != b->pos[prev] + 1)
            return ie_error_set(IE_ERR_RANGE,
                                "worker: slot %d position %d follows its position %d in the step (the sliding "
                                "layers' ring takes a slot's positions in order)",
                                seq, pos, b->pos[prev]);
        return IE_OK;
    }
    const int32_t *rp = w->kv_ring_pos + (size_t)seq * w->kv_ring_len;
    for (int j = pos >= W ? pos - W + 1 : 0; j < pos; j++)
        if (rp[j % w->kv_ring_len] != j)
            return ie_error_set(IE_ERR_RANGE,
                                "worker: slot %d position %d: the sliding layers' ring does not hold position %d "
                                "(it keeps the last %d positions computed in this slot)",
                                seq, pos, j, w->kv_ring_len);
    return IE_OK;
}

/* Contract (worker_internal.h). */
ie_status_t worker_qkv(ie_worker_t *w, int l, const ie_batch_t *b)
{
    const layer_t *L = &w->layers[l];
    const int n = b->n;
    /* decode: each thread fetches the cache rows its attention share
     * reads, ahead of its share of q/k/v */
    att_task_t at = {w, b, l, att_share(w, n), -1, 0, 0, n};
    const mm_pre_t kvpf = {att_prefetch, &at};
    const wmat_t *ms[3] = {&L->q, &L->k, &L->v};
    float *ys[3] = {w->q, w->k, w->v};
    return worker_matmul_rep(w, 3, ms, NULL, ys, w->xb, n, w->kvpf_on && n <= 8 ? &kvpf : NULL);
}

/* Contract (worker_internal.h). */
void worker_rope(ie_worker_t *w, int l, const ie_batch_t *b)
{
    const ie_hparams_t *hp = &w->hp;
    const int hd = hp->head_dim, half = hp->rope_dim / 2;
    const ie_rope_layout_t layout = w->arch.rope_layout;
    const int swa = w->layers[l].swa;
    const float *cos_t = swa ? w->rope_cos_swa : w->rope_cos, *sin_t = swa ? w->rope_sin_swa : w->rope_sin;
    for (int i = 0; i < b->n; i++) {
        const float *c = cos_t + (size_t)b->pos[i] * half;
        const float *s = sin_t + (size_t)b->pos[i] * half;
        for (int h = 0; h < w->n_head_loc; h++)
            ie_rope_apply_f32(w->q + (size_t)i * w->q_dim + (size_t)h * hd, hd, hp->rope_dim, c, s, layout);
        for (int h = 0; h < w->n_kv_loc; h++)
            ie_rope_apply_f32(w->k + (size_t)i * w->kv_dim + (size_t)h * hd, hd, hp->rope_dim, c, s, layout);
    }
}

/* The K (c 0) or V means of every held head of slot seq on layer l into
 * the store's part of kv_mean ([2][kv_dim]). */
static float *kv_means(ie_worker_t *w, int c, int l, int seq)
{
    const int hd = w->hp.head_dim;
    float *m = w->kv_mean + (size_t)w->opts.n_threads * 2 * hd + (size_t)c * w->kv_dim;
    for (int h = 0; h < w->n_kv_loc; h++) {
        const ie_kv_rows_t r = kv_rows(w, c, l, seq, h);
        kv_mean_head(w, c, &r, m + (size_t)h * hd);
    }
    return m;
}

/* k, v of tokens i0 .. i1-1 -> layer l of their slots' caches (the pool
 * or the ring) at their positions. A smoothed cache's rows from
 * KVQ_SMOOTH_ROWS on are stored less the mean of the slot's first rows, so
 * those are written first (pass 0), whatever the order of the tokens. */
static void kv_store(ie_worker_t *w, int l, const ie_batch_t *b, int i0, int i1)
{
    const int hd = w->hp.head_dim;
    const int sm[2] = {w->kv_smooth[0] && !w->layers[l].swa, w->kv_smooth[1] && !w->layers[l].swa};
    for (int pass = 0; pass < 2; pass++) {
        int mseq[2] = {-1, -1}; /* the slot whose means kv_mean holds */
        const float *m[2] = {NULL, NULL};
        for (int i = i0; i < i1; i++) {
            for (int c = 0; c < 2; c++) {
                const int smooth = sm[c] && b->pos[i] >= KVQ_SMOOTH_ROWS;
                if (smooth != pass) continue;
                const ie_kv_rows_t rows = kv_rows(w, c, l, b->seq[i], 0);
                float *src = (c ? w->v : w->k) + (size_t)i * w->kv_dim;
                unsigned char *dst = (unsigned char *)ie_kv_row(&rows, b->pos[i]);
                if (w->kv_type[c] == IE_KV_F32 && !w->kv_rot[c]) {
                    memcpy(dst, src, (size_t)w->kv_dim * sizeof(float));
                    continue;
                }
                if (smooth && mseq[c] != b->seq[i]) m[c] = kv_means(w, c, l, mseq[c] = b->seq[i]);
                /* k and v are scratch this step reads no more: rotate (and
                 * smooth, in the basis the rows are read in) in place */
                /* kv_recent: the rotated row's f32 copy (the slot's ring takes
                 * it after attention, recent_commit) */
                const int kc = (c ? w->kv_recent_v : w->kv_recent) && !w->layers[l].swa;
                float *fc = c ? w->v_batch : w->k_batch;
                for (int h = 0; h < w->n_kv_loc; h++) {
                    float *x = src + (size_t)h * hd;
                    if (w->kv_rot[c]) kvq_fwht(x, hd);
                    if (kc) memcpy(fc + (size_t)i * w->kv_dim + (size_t)h * hd, x, (size_t)hd * sizeof(float));
                    if (smooth)
                        for (int e = 0; e < hd; e++) x[e] -= m[c][(size_t)h * hd + e];
                    ie_kv_encode(w->kv_type[c], x, hd, dst + (size_t)h * w->kv_head_bytes[c]);
                }
            }
        }
    }
}

typedef struct pre_task {
    ie_worker_t *w;
    int layer, seq, lo, n; /* rows lo .. lo+n-1 of slot seq */
    const float *m[2];     /* a smoothed cache's means ([kv_dim]), else NULL */
} pre_task_t;

/* Share ith of a step's pre-decode: rows of every held KV head, K (unless
 * q8) and V (an f32 one copied), into kv_pre. */
static void pre_run(void *ctx, int ith, int nth)
{
    const pre_task_t *t = ctx;
    ie_worker_t *w = t->w;
    const int hd = w->hp.head_dim;
    const int r0 = (int)((long)t->n * ith / nth), r1 = (int)((long)t->n * (ith + 1) / nth);
    for (int c = w->kv_type[0] == IE_KV_Q8; c < 2; c++) { /* a q8 K is read as it is (att_run) */
        const ie_kv_rows_t rows = kv_rows(w, c, t->layer, t->seq, 0);
        for (int r = r0; r < r1; r++) {
            const int j = t->lo + r;
            const unsigned char *row = ie_kv_row(&rows, j);
            float *y = w->kv_pre[c] + (size_t)r * w->kv_dim;
            for (int h = 0; h < w->n_kv_loc; h++)
                w->ops->kv_decode(w->kv_type[c], row + (size_t)h * w->kv_head_bytes[c], hd, y + (size_t)h * hd);
            if (t->m[c] && j >= KVQ_SMOOTH_ROWS) /* stored less the mean: add it back */
                for (int e = 0; e < w->kv_dim; e++) y[e] += t->m[c][e];
        }
    }
}

/* Attention of tokens i0 .. i1-1 of layer l (their rows stored). A cache
 * not f32: the tokens of a slot with at least KVQ_PRE_MIN tokens here (a
 * prefill) would each decode every row they see, the same rows again and
 * again; their rows are decoded once into kv_pre and read by the f32
 * kernels. Other tokens decode chunks of their own rows (att_run). */
static void attend(ie_worker_t *w, int l, const ie_batch_t *b, int i0, int i1)
{
    att_task_t at = {w, b, l, att_share(w, i1 - i0), -1, 0, i0, i1};
    if (w->kv_pre[0] && i1 - i0 >= KVQ_PRE_MIN) {
        memset(w->kv_mark + i0, 0, (size_t)(i1 - i0));
        const int swa = w->layers[l].swa, W = w->hp.sliding_window;
        for (int i = i0; i < i1; i++) {
            if (w->kv_mark[i]) continue;
            const int seq = b->seq[i];
            int cnt = 0, lo = INT_MAX, hi = 0;
            for (int k = i; k < i1; k++)
                if (b->seq[k] == seq) {
                    const int p = b->pos[k], j0 = swa && p >= W ? p - W + 1 : 0;
                    cnt++;
                    lo = j0 < lo ? j0 : lo;
                    hi = p + 1 > hi ? p + 1 : hi;
                }
            if (cnt < KVQ_PRE_MIN || hi - lo > w->kv_pre_rows) continue;
            for (int k = i; k < i1; k++)
                if (b->seq[k] == seq) w->kv_mark[k] = 1;
            pre_task_t pt = {w, l, seq, lo, hi - lo, {NULL, NULL}};
            for (int c = w->kv_type[0] == IE_KV_Q8; c < 2; c++) /* a q8 K: att_run adds q.m */
                if (w->kv_smooth[c] && !swa && hi > KVQ_SMOOTH_ROWS) pt.m[c] = kv_means(w, c, l, seq);
            ie_threadpool_run(w->tp, pre_run, &pt);
            att_task_t one = {w, b, l, at.sg, seq, lo, i0, i1};
            ie_threadpool_run(w->tp, att_run, &one);
        }
        for (int i = i0; i < i1; i++)
            if (!w->kv_mark[i]) {
                ie_threadpool_run(w->tp, att_run, &at); /* the rest, each on its own rows */
                break;
            }
        return;
    }
    if (w->kv_mark) memset(w->kv_mark + i0, 0, (size_t)(i1 - i0));
    ie_threadpool_run(w->tp, att_run, &at);
}

/* kv_recent: the f32 K (and kv_recent_v: V) rows of tokens i0 .. i1-1
 * into their slots' rings and sinks, after their attention (which read
 * them from k_batch, v_batch): written before,
 * a step's later rows would take the ring places of the window rows its
 * first tokens read from earlier steps. */
static void recent_commit(ie_worker_t *w, int l, const ie_batch_t *b, int i0, int i1)
{
    if (!w->kv_recent || w->layers[l].swa) return;
    const size_t ll = (size_t)(l - w->sh.layer_begin);
    for (int i = i0; i < i1; i++) {
        for (int sink = 0; sink <= (b->pos[i] < w->k_sinks); sink++) { /* a sink: in both places */
            const size_t r = recent_index(w, b->seq[i], ll, b->pos[i], sink);
            w->k_recent_pos[r] = b->pos[i];
            memcpy(w->k_recent + r * w->kv_dim, w->k_batch + (size_t)i * w->kv_dim,
                   (size_t)w->kv_dim * sizeof(float));
            if (w->kv_recent_v)
                memcpy(w->v_recent + r * w->kv_dim, w->v_batch + (size_t)i * w->kv_dim,
                       (size_t)w->kv_dim * sizeof(float));
        }
    }
}

/* Contract (worker_internal.h). */
void worker_kv_store_attend(ie_worker_t *w, int l, const ie_batch_t *b)
{
    const int chunk = w->layers[l].ring ? w->kv_ring_chunk : b->n;
    for (int i0 = 0; i0 < b->n; i0 += chunk) {
        const int i1 = b->n - i0 < chunk ? b->n : i0 + chunk;
        kv_store(w, l, b, i0, i1);
        attend(w, l, b, i0, i1);
        recent_commit(w, l, b, i0, i1);
    }
}

/* Contract (worker_internal.h). */
void worker_kv_commit(ie_worker_t *w, const ie_batch_t *b)
{
    for (int i = 0; i < b->n; i++) {
        if (b->pos[i] + 1 > w->seq_len[b->seq[i]]) w->seq_len[b->seq[i]] = b->pos[i] + 1;
        /* a slot's positions come in order (worker_kv_check): the last wins */
        if (w->kv_ring_nrb)
            w->kv_ring_pos[(size_t)b->seq[i] * w->kv_ring_len + b->pos[i] % w->kv_ring_len] = b->pos[i];
    }
}

/* Forget slot seq's ring rows of positions n_pos and later. */
static void ring_truncate(ie_worker_t *w, int seq, int n_pos)
{
    if (!w->kv_ring_nrb) return;
    int32_t *rp = w->kv_ring_pos + (size_t)seq * w->kv_ring_len;
    for (int r = 0; r < w->kv_ring_len; r++)
        if (rp[r] >= n_pos) rp[r] = -1;
}

/* Forget slot seq's f32 recent rows of positions [p0, p1). */
static void recent_truncate(ie_worker_t *w, int seq, int p0, int p1)
{
    if (!w->kv_recent) return;
    const size_t n = (size_t)(w->sh.layer_end - w->sh.layer_begin) * (size_t)(w->k_recent_len + w->k_sinks);
    int32_t *rp = w->k_recent_pos + (size_t)seq * n;
    for (size_t r = 0; r < n; r++)
        if (rp[r] >= p0 && rp[r] < p1) rp[r] = -1;
}

/* Contract (ie_worker.h). */
void ie_worker_seq_clear(ie_worker_t *w, int seq)
{
    if (seq >= 0 && seq < w->opts.n_seq) {
        w->seq_len[seq] = 0;
        ring_truncate(w, seq, 0);
        recent_truncate(w, seq, 0, INT_MAX);
    }
}

/* Contract (ie_worker.h): every argument is checked before the table
 * changes. */
ie_status_t ie_worker_kv_bind(ie_worker_t *w, int seq, int first, const int32_t *pb, int n)
{
    if (seq < 0 || seq >= w->opts.n_seq)
        return ie_error_set(IE_ERR_RANGE, "worker: KV bind: slot %d out of range [0, %d)", seq, w->opts.n_seq);
    if (first < 0 || n < 0 || (int64_t)first + n > w->kv_nlb || (n > 0 && !pb))
        return ie_error_set(IE_ERR_RANGE, "worker: KV bind: logical blocks %d..%lld of slot %d outside [0, %d)",
                            first, (long long)first + n - 1, seq, w->kv_nlb);
    for (int i = 0; i < n; i++)
        if (pb[i] < -1 || pb[i] >= w->kv_blocks)
            return ie_error_set(IE_ERR_RANGE, "worker: KV bind: physical block %d outside the pool [0, %d)", pb[i],
                                w->kv_blocks);
    if (n > 0) memcpy(w->btab + (size_t)seq * w->kv_nlb + first, pb, (size_t)n * sizeof(int32_t));
    /* rebound positions hold other rows now */
    recent_truncate(w, seq, first * w->kv_block, (first + n) * w->kv_block);
    return IE_OK;
}

/* Contract (ie_worker.h). */
ie_status_t ie_worker_seq_set_len(ie_worker_t *w, int seq, int n_pos)
{
    if (seq < 0 || seq >= w->opts.n_seq)
        return ie_error_set(IE_ERR_RANGE, "worker: set length: slot %d out of range [0, %d)", seq, w->opts.n_seq);
    if (n_pos < 0 || n_pos > w->opts.n_ctx)
        return ie_error_set(IE_ERR_RANGE, "worker: set length: %d positions (0..%d)", n_pos, w->opts.n_ctx);
    const int32_t *tab = w->btab + (size_t)seq * w->kv_nlb;
    for (int lb = 0; w->kv_pool_layers > 0 && lb * w->kv_block < n_pos; lb++)
        if (tab[lb] < 0)
            return ie_error_set(IE_ERR_RANGE,
                                "worker: set length: slot %d position %d: its KV block %d is not bound", seq,
                                lb * w->kv_block, lb);
    w->seq_len[seq] = n_pos;
    ring_truncate(w, seq, n_pos);
    recent_truncate(w, seq, n_pos, INT_MAX);
    return IE_OK;
}

int ie_worker_kv_block(const ie_worker_t *w) { return w->kv_block; }
int ie_worker_kv_blocks(const ie_worker_t *w) { return w->kv_blocks; }

/* Contract (ie_worker.h). */
size_t ie_worker_kv_bytes_per_pos(const ie_worker_t *w)
{
    return (w->kv_block_bytes[0] + w->kv_block_bytes[1]) / (size_t)w->kv_block;
}

/* Contract (ie_worker.h). */
int ie_worker_kv_ring_len(const ie_worker_t *w) { return w->kv_ring_len; }
/* Contract (ie_worker.h). */
uint64_t ie_worker_kv_ring_bytes(const ie_worker_t *w)
{
    return (uint64_t)w->opts.n_seq * (w->kv_ring_slot_bytes[0] + w->kv_ring_slot_bytes[1]);
}
