/* matmul.c — matmuls on the thread pool.
 *
 * y_i = m_i · x for up to MM_MAX matrices that share their input, in one
 * pool job: the input is quantized once into the kernels' activation
 * format, then every thread runs its share of every matrix. Prefill and
 * single-thread runs split each matrix statically into whole 16-row
 * panels; decode batches (n <= 8) balance the split (threads steal panels
 * from each other's shares, mm_next). A kernel's failure is reported as
 * the matmul's status. Also here: the SwiGLU, the one elementwise step
 * large enough to split across the pool.
 */
#include "ie_prof.h"
#include "worker_internal.h"

#include <math.h>

#include <stdio.h>

typedef struct mm_task {
    const ie_kernels_t *ops;
    int nm;
    const wmat_t *m[MM_MAX];
    float *y[MM_MAX];          /* [n_tok][m->n_out]                           */
    _Atomic int failed;        /* 1 + the index of a matrix whose kernel failed (0: none) */
    _Atomic int failed_st;     /* that kernel's status (ie_status_t)                       */
    const wmat_t *rep[MM_MAX]; /* per-node copies of m[i] (NULL: none)    */
    const int *share_repl;     /* [nth] the copy share ith reads          */
    const void *act;
    size_t act_stride;
    int n_tok;
    mm_span_t *spans; /* non-NULL: balanced (spans[i * nth + t]: matrix i, thread t) */
    int64_t chunk;    /* panels a steal takes */
    mm_pre_t pre;     /* run by every thread before its share (fn NULL: nothing) */
} mm_task_t;

/* Balanced decode matmuls (PANEL16 and ROWS matrices; rows go in units of
 * IE_PANEL). Every thread starts on its static share of each
 * matrix (whole panels, as the unbalanced split), claiming it from the
 * front in shrinking pieces (half of what is left, at least `chunk`); once
 * its share is empty it takes `chunk` panels at a time from the back of the
 * others' shares of the same matrix, so both finish within about a chunk of
 * each other, while each thread still streams its own share front to back
 * (a steal reads the far end). Measured on this 2-core VM: per decode
 * matmul the two halves' times differ by ~10-15% in either direction, at
 * random (the pool's join waited ~15-30 us per job). */
typedef struct mm_src {
    mm_task_t *t;
    int i, ith, nth;
    int own_done;
} mm_src_t;

static int mm_next(void *ctx, int64_t *p0, int64_t *p1)
{
    mm_src_t *s = ctx;
    mm_span_t *sp = s->t->spans + (size_t)s->i * (size_t)s->nth;
    const uint64_t c = (uint64_t)s->t->chunk;
    if (!s->own_done) {
        _Atomic uint64_t *a = &sp[s->ith].span;
        uint64_t v = atomic_load_explicit(a, memory_order_relaxed);
        for (;;) {
            const uint64_t f = v & 0xffffffffu, b = v >> 32;
            if (f >= b) break;
            uint64_t n = (b - f) / 2;
            if (n < c) n = c;
            if (n > b - f) n = b - f;
            if (atomic_compare_exchange_weak_explicit(a, &v, (f + n) | (b << 32), memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *p0 = (int64_t)f;
                *p1 = (int64_t)(f + n);
                return 1;
            }
        }
        s->own_done = 1;
    }
    for (int k = 1; k < s->nth; k++) {
        _Atomic uint64_t *a = &sp[(s->ith + k) % s->nth].span;
        uint64_t v = atomic_load_explicit(a, memory_order_relaxed);
        for (;;) {
            const uint64_t f = v & 0xffffffffu, b = v >> 32;
            if (f >= b) break;
            const uint64_t n = c < b - f ? c : b - f;
            if (atomic_compare_exchange_weak_explicit(a, &v, f | ((b - n) << 32), memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *p0 = (int64_t)(b - n);
                *p1 = (int64_t)b;
                return 1;
            }
        }
    }
    return 0;
}

/* Keep the first failing kernel's matrix and status for mm_failed. */
static void mm_check(mm_task_t *t, int i, ie_status_t ks)
{
    if (ks == IE_OK) return;
    atomic_store_explicit(&t->failed_st, (int)ks, memory_order_relaxed);
    atomic_store_explicit(&t->failed, i + 1, memory_order_relaxed);
}

static void mm_run(void *ctx, int ith, int nth)
{
    mm_task_t *t = ctx;
    if (t->pre.fn) t->pre.fn(t->pre.ctx, ith, nth);
    for (int i = 0; i < t->nm; i++) {
        const wmat_t *m = t->rep[i] ? &t->rep[i][t->share_repl[ith]] : t->m[i]; /* same bytes */
        long b, e;
        if (m->layout == IE_LAYOUT_PANEL16 && t->spans) {
            mm_src_t src = {t, i, ith, nth, 0};
            ie_pmat_t pm = {m->dtype, m->group, m->n_in, m->n_out, m->data};
            mm_check(t, i,
                     t->ops->matmul_packed_ranges(&pm, mm_next, &src, t->act, t->act_stride, t->n_tok, t->y[i],
                                                  m->n_out));
        } else if (m->layout == IE_LAYOUT_PANEL16) {
            /* whole panels per thread */
            ie_split_range((long)((m->n_out + IE_PANEL - 1) / IE_PANEL), ith, nth, &b, &e);
            b *= IE_PANEL;
            e = e * IE_PANEL < m->n_out ? e * IE_PANEL : (long)m->n_out;
            if (b >= e) continue;
            ie_pmat_t pm = {m->dtype, m->group, m->n_in, m->n_out, m->data};
            mm_check(t, i, t->ops->matmul_packed(&pm, b, e, t->act, t->act_stride, t->n_tok, t->y[i], m->n_out));
        } else if (m->layout == IE_LAYOUT_BSR) {
            ie_split_range((long)(m->n_out / m->bsr.br), ith, nth, &b, &e);
            if (b < e)
                t->ops->matmul_bsr(&m->bsr, b * m->bsr.br, e * m->bsr.br, t->act, t->act_stride / sizeof(float),
                                   t->n_tok, t->y[i], m->n_out);
        } else if (t->spans) {
            /* rows in units of IE_PANEL, through the same claims */
            mm_src_t src = {t, i, ith, nth, 0};
            int64_t p0, p1;
            while (mm_next(&src, &p0, &p1)) {
                const int64_t r1 = p1 * IE_PANEL < m->n_out ? p1 * IE_PANEL : m->n_out;
                mm_check(t, i,
                         ie_kernels_matmul(t->ops, m->dtype, m->data, m->n_in, p0 * IE_PANEL, r1, t->act,
                                           t->act_stride, t->n_tok, t->y[i], m->n_out));
            }
        } else {
            /* 16-row units, as the balanced claims cut rows: a row's sum
             * then does not depend on which of the two ran it */
            ie_split_range((long)((m->n_out + IE_PANEL - 1) / IE_PANEL), ith, nth, &b, &e);
            b *= IE_PANEL;
            e = e * IE_PANEL < m->n_out ? e * IE_PANEL : (long)m->n_out;
            if (b < e)
                mm_check(t, i,
                         ie_kernels_matmul(t->ops, m->dtype, m->data, m->n_in, b, e, t->act, t->act_stride,
                                           t->n_tok, t->y[i], m->n_out));
        }
    }
}

typedef struct q_task {
    const ie_kernels_t *ops;
    int stream; /* act_quantize_stream (decode: rows the other threads read) */
    ie_dtype_t act;
    const float *x;
    int64_t n_in;
    void *out;
    size_t out_stride;
    int n_tok;
} q_task_t;

static void q_run(void *ctx, int ith, int nth)
{
    q_task_t *t = ctx;
    long b, e;
    ie_split_range(t->n_tok, ith, nth, &b, &e);
    for (long i = b; i < e; i++)
        (t->stream ? t->ops->act_quantize_stream : t->ops->act_quantize)(t->act, t->x + (size_t)i * t->n_in,
                                                                         (char *)t->out + (size_t)i * t->out_stride,
                                                                         t->n_in);
}

/* A kernel said no: the step must not go on with stale rows. */
static ie_status_t mm_failed(const ie_worker_t *w, const wmat_t *m, ie_status_t ks, int n)
{
    return ie_error_set(
        IE_ERR_INTERNAL,
        "worker: the %s matmul kernel failed (%s) on a %s/%s matrix of %lld x %lld (group %d, %d tokens)",
        ie_isa_name(w->ops->isa), ie_status_str(ks), ie_dtype_name(m->dtype), ie_layout_name(m->layout),
        (long long)m->n_out, (long long)m->n_in, m->group, n);
}

/* Two pieces of pre-work in one job. */
typedef struct pre_pair {
    mm_pre_t a, b;
} pre_pair_t;

static void pre_pair_run(void *ctx, int ith, int nth)
{
    const pre_pair_t *p = ctx;
    if (p->a.fn) p->a.fn(p->a.ctx, ith, nth);
    if (p->b.fn) p->b.fn(p->b.ctx, ith, nth);
}

/* Contract (worker_internal.h). Matrices whose kernels want different
 * activation formats run in separate passes. The shrink of an open LoRA
 * call (worker_lora_begin) joins the first job's pre-work. */
ie_status_t worker_matmul_rep(ie_worker_t *w, int nm, const wmat_t *const *m, const wmat_t *const *rep,
                              float *const *y, const float *x, int n, const mm_pre_t *pre)
{
    int done[MM_MAX] = {0};
    ie_dtype_t acts[MM_MAX]; /* each matrix's activation rows, asked once */
    const int nth = ie_threadpool_size(w->tp);
    for (int i = 0; i < nm; i++)
        acts[i] = ie_kernels_act_dtype(w->ops, m[i]->dtype, m[i]->layout == IE_LAYOUT_PANEL16, n);
    pre_pair_t both = {{0}, {0}};
    const mm_pre_t chained = {pre_pair_run, &both};
    if (worker_lora_pre(w, &both.b)) {
        if (pre) both.a = *pre;
        pre = &chained;
    }
    for (int i = 0; i < nm; i++) {
        if (done[i]) continue;
        const ie_dtype_t act = acts[i];
        int64_t n_in = m[i]->n_in;
        mm_task_t t = {.ops = w->ops, .n_tok = n, .share_repl = w->share_repl};
        if (pre) { /* in the first job */
            t.pre = *pre;
            pre = NULL;
        }
        for (int j = i; j < nm; j++) {
            if (!done[j] && acts[j] == act) {
                t.m[t.nm] = m[j];
                t.rep[t.nm] = rep ? rep[j] : NULL;
                t.y[t.nm] = y[j];
                t.nm++;
                done[j] = 1;
            }
        }
        if (act == IE_DTYPE_F32) {
            t.act = x;
            t.act_stride = (size_t)n_in * sizeof(float);
        } else {
            /* decode rows go around this core's caches (act_quantize_stream):
             * the other threads read the buffer in the last matmul */
            const int stream = w->stream_act && n <= 8 && nth > 1;
            q_task_t q = {w->ops, stream, act, x, n_in, w->act, ie_dtype_row_bytes(act, n_in), n};
            const uint64_t tq = ie_prof_begin();
            if (n >= 8) ie_threadpool_run(w->tp, q_run, &q);
            else q_run(&q, 0, 1);
            ie_prof_end(IE_PROF_ACT_QUANT, tq);
            t.act = w->act;
            t.act_stride = q.out_stride;
        }
        if (w->balance && nth > 1 && n <= 8) {
            int bsr = 0;
            for (int k = 0; k < t.nm; k++) bsr += t.m[k]->layout == IE_LAYOUT_BSR;
            if (!bsr) {
                t.spans = w->spans;
                /* a steal: ~48 KiB of the first matrix's panels (rows: 16) */
                const wmat_t *m0 = t.m[0];
                const size_t pb = m0->layout == IE_LAYOUT_PANEL16
                                      ? ie_pack_panel_bytes(m0->dtype, m0->group, m0->n_in)
                                      : (size_t)IE_PANEL * ie_dtype_row_bytes(m0->dtype, m0->n_in);
                t.chunk = pb ? (int64_t)((48u << 10) / pb) : 1;
                if (t.chunk < 1) t.chunk = 1;
                for (int k = 0; k < t.nm; k++) {
                    const long np = (long)((t.m[k]->n_out + IE_PANEL - 1) / IE_PANEL);
                    for (int th = 0; th < nth; th++) {
                        long b, e;
                        ie_split_range(np, th, nth, &b, &e);
                        atomic_store_explicit(&w->spans[(size_t)k * (size_t)nth + (size_t)th].span,
                                              (uint64_t)b | ((uint64_t)e << 32), memory_order_relaxed);
                    }
                }
            }
        }
        const uint64_t tm = ie_prof_begin();
        ie_threadpool_run(w->tp, mm_run, &t);
        ie_prof_end(IE_PROF_MATMUL + ((unsigned)t.m[0]->dtype < IE_PROF_MATMUL_N ? (int)t.m[0]->dtype : 0), tm);
        const int bad = atomic_load_explicit(&t.failed, memory_order_relaxed);
        if (bad)
            return mm_failed(w, t.m[bad - 1], (ie_status_t)atomic_load_explicit(&t.failed_st, memory_order_relaxed),
                             n);
    }
    return IE_OK;
}

/* Contract (worker_internal.h). */
ie_status_t worker_matmul_group(ie_worker_t *w, int nm, const wmat_t *const *m, float *const *y, const float *x,
                                int n)
{
    return worker_matmul_rep(w, nm, m, NULL, y, x, n, NULL);
}

/* Contract (worker_internal.h). */
ie_status_t worker_matmul(ie_worker_t *w, const wmat_t *m, float *y, const float *x, int n)
{
    const wmat_t *ms[1] = {m};
    float *ys[1] = {y};
    return worker_matmul_group(w, 1, ms, ys, x, n);
}

typedef struct swiglu_task {
    const ie_kernels_t *vec;
    float *g;
    const float *u;
    int64_t n;
    int gelu; /* GELU (tanh approximation) instead of silu */
} swiglu_task_t;

/* out[i] = gelu_tanh(g[i]) * u[i], in float32 with PyTorch's constants
 * (gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))). */
static void geglu_f32(float *out, const float *g, const float *u, int64_t n)
{
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        out[i] = 0.5f * x * (1.0f + tanhf(beta * (x + kappa * x * x * x))) * u[i];
    }
}

static void swiglu_run(void *ctx, int ith, int nth)
{
    swiglu_task_t *t = ctx;
    long b, e;
    ie_split_range((long)((t->n + 15) / 16), ith, nth, &b, &e); /* whole vectors per thread */
    int64_t i0 = (int64_t)b * 16, i1 = (int64_t)e * 16 < t->n ? (int64_t)e * 16 : t->n;
    if (i0 >= i1) return;
    if (t->gelu) geglu_f32(t->g + i0, t->g + i0, t->u + i0, i1 - i0);
    else t->vec->swiglu(t->g + i0, t->g + i0, t->u + i0, i1 - i0);
}

/* Contract (worker_internal.h). */
void worker_swiglu(ie_worker_t *w, float *g, const float *u, int64_t n)
{
    swiglu_task_t t = {w->ops, g, u, n, w->arch.act == IE_ACT_GELU_TANH};
    if (n >= 16384) ie_threadpool_run(w->tp, swiglu_run, &t);
    else swiglu_run(&t, 0, 1);
}
