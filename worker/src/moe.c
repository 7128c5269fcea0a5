/* moe.c — the mixture of experts (GPT-OSS, docs/GPTOSS.md 2.3; Qwen3-MoE).
 *
 * Router logits (+ bias), then per token either the top-k logits and a
 * softmax over those k (IE_ROUTE_TOPK_SOFTMAX, GPT-OSS) or a softmax over
 * all experts and the top-k probabilities, optionally renormalized to sum
 * 1 (IE_ROUTE_SOFTMAX_TOPK, Qwen3-MoE norm_topk_prob). Each used expert
 * then runs once over all its tokens (matrix work in prefill): gate/up
 * (+ biases), the gating — plain SwiGLU silu(gate) * up, or GPT-OSS's
 * clamped one (gate clamped above and up on both sides at the limit,
 * (up + 1) * gate * sigmoid(alpha * gate)) — down (+ bias), weighted into
 * the output. A tensor-parallel rank runs only its experts (the top-k is
 * over all of them, the same on every rank), so its output is its share of
 * the sum.
 */
#include "worker_internal.h"

#include <math.h>
#include <string.h>

/* Expert e of a bound expert stack, as a plain matrix. */
static wmat_t expert_mat(const wmat_t *m, int e)
{
    wmat_t r = *m;
    r.data = (const char *)m->data + (size_t)e * m->slice;
    return r;
}

/* sel[n][k], selw[n][k] = the top-k experts of each token and their weights,
 * from the router logits rlog[n][E]. */
static ie_status_t route(ie_worker_t *w, const layer_t *L, int n)
{
    const int E = w->hp.n_expert, k = w->arch.top_k;
    ie_status_t st;
    /* rlog[n][E] = Wr · xb (+ bias) */
    if ((st = worker_matmul(w, &L->router, w->rlog, w->xb, n)) != IE_OK) return st;
    for (int i = 0; i < n; i++) {
        float *r = w->rlog + (size_t)i * E;
        int32_t *sel = w->sel + (size_t)i * k;
        float *sw = w->selw + (size_t)i * k;
        if (L->router_b) worker_vec_add(r, L->router_b, E);
        /* softmax first: the top-k of the probabilities (same order) */
        if (w->arch.routing == IE_ROUTE_SOFTMAX_TOPK) ie_softmax_f32(r, E);
        /* top-k by value, ties to the lower expert id */
        for (int t = 0; t < k; t++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int u = 0; u < t; u++) taken |= sel[u] == e;
                if (!taken && (best < 0 || r[e] > r[best])) best = e;
            }
            sel[t] = best;
            sw[t] = r[best];
        }
        if (w->arch.routing == IE_ROUTE_TOPK_SOFTMAX) {
            ie_softmax_f32(sw, k); /* over the k selected */
        } else if (w->arch.norm_topk) {
            float sum = 0.0f;
            for (int t = 0; t < k; t++) sum += sw[t];
            for (int t = 0; t < k; t++) sw[t] /= sum; /* > 0: softmax outputs are positive */
        }
    }
    return IE_OK;
}

/* Contract (worker_internal.h). */
ie_status_t worker_moe(ie_worker_t *w, const layer_t *L, int n)
{
    const ie_hparams_t *hp = &w->hp;
    const int d = hp->n_embd, ff = hp->n_ff, k = w->arch.top_k;
    const int e0 = w->sh.expert_begin, e1 = w->sh.expert_end; /* experts held */
    const float limit = w->arch.gate_limit, alpha = w->arch.gate_alpha;
    ie_status_t st;

    if ((st = route(w, L, n)) != IE_OK) return st;
    memset(w->moe, 0, (size_t)n * d * sizeof(float));
    for (int e = e0; e < e1; e++) {
        /* xg[m][d] = the rows of the m tokens routed to e, roww[m] their weights */
        int m = 0;
        for (int i = 0; i < n; i++)
            for (int t = 0; t < k; t++)
                if (w->sel[(size_t)i * k + t] == e) {
                    w->rows[m] = i;
                    w->roww[m] = w->selw[(size_t)i * k + t];
                    memcpy(w->xg + (size_t)m * d, w->xb + (size_t)i * d, (size_t)d * sizeof(float));
                    m++;
                }
        if (m == 0) continue;
        /* hb[m][ff], hb2[m][ff] = Wg, Wu · xg (one job) */
        wmat_t g = expert_mat(&L->gate, e - e0), u = expert_mat(&L->up, e - e0), dn = expert_mat(&L->down, e - e0);
        const wmat_t *ms[2] = {&g, &u};
        float *ys[2] = {w->hb, w->hb2};
        if ((st = worker_matmul_group(w, 2, ms, ys, w->xg, m)) != IE_OK) return st;
        if (w->arch.gating == IE_GATING_SWIGLU) {
            /* hb = silu(hb + gate bias) * (hb2 + up bias) */
            if (L->gate_b)
                for (int r = 0; r < m; r++) {
                    worker_vec_add(w->hb + (size_t)r * ff, L->gate_b + (size_t)(e - e0) * ff, ff);
                    worker_vec_add(w->hb2 + (size_t)r * ff, L->up_b + (size_t)(e - e0) * ff, ff);
                }
            worker_swiglu(w, w->hb, w->hb2, (int64_t)m * ff);
        } else {
            /* hb = clamped SwiGLU(hb + gate bias, hb2 + up bias) */
            const float *gb = L->gate_b ? L->gate_b + (size_t)(e - e0) * ff : NULL;
            const float *ub = L->up_b ? L->up_b + (size_t)(e - e0) * ff : NULL;
            for (int r = 0; r < m; r++) {
                float *gr = w->hb + (size_t)r * ff, *ur = w->hb2 + (size_t)r * ff;
                for (int j = 0; j < ff; j++) {
                    float gv = gb ? gr[j] + gb[j] : gr[j], uv = ub ? ur[j] + ub[j] : ur[j];
                    gv = gv > limit ? limit : gv;
                    uv = uv > limit ? limit : uv < -limit ? -limit : uv;
                    gr[j] = (uv + 1.0f) * (gv / (1.0f + expf(-alpha * gv)));
                }
            }
        }
        /* tmp[m][d] = Wd · hb; moe[token] += weight * (tmp + down bias) */
        if ((st = worker_matmul(w, &dn, w->tmp, w->hb, m)) != IE_OK) return st;
        const float *db = L->down_b ? L->down_b + (size_t)(e - e0) * d : NULL;
        for (int r = 0; r < m; r++) {
            float *y = w->tmp + (size_t)r * d, *o = w->moe + (size_t)w->rows[r] * d, wt = w->roww[r];
            if (db) worker_vec_add(y, db, d);
            for (int j = 0; j < d; j++) o[j] += wt * y[j];
        }
    }
    return IE_OK;
}
