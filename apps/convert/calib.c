/* calib.c — ie-convert's calibration gate (ie_convert.h): the converted
 * model against a float reference on a calibration text.
 *
 * Both models see the same chunks of tokens, each from an empty cache. The
 * reference (the source at --precision f32) runs first; its residual streams
 * after every layer and its log-probabilities are kept, and the worker is
 * freed before the converted model's worker is made, so only one model's
 * weights are resident at a time. Then per position:
 *   cosine(ref, quant) of the residual stream after each layer,
 *   KL(ref || quant) = sum_v p_ref(v) (log p_ref(v) - log p_quant(v)),
 *   the negative log-likelihood of the next token under both models.
 */
#include "ie_convert.h"
#include "ie_worker.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* In-place log-softmax of n floats (double accumulation). */
static void log_softmax(float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)x[i] - mx);
    float lz = (float)(mx + log(z));
    for (int i = 0; i < n; i++) x[i] -= lz;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0 && bb == 0) return 1.0;
    if (aa == 0 || bb == 0) return 0.0;
    return ab / sqrt(aa * bb);
}

void ie_calib_report_clear(ie_calib_report_t *r)
{
    if (!r) return;
    free(r->layer_cos);
    free(r->layer_cos_min);
    memset(r, 0, sizeof *r);
}

/* Tokens of chunk c: [c*chunk, min(n, (c+1)*chunk)). */
static size_t chunk_len(size_t n, size_t chunk, size_t c)
{
    size_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    return e - b;
}

/* Run one chunk through w: tokens (first one replaced by bos if asked),
 * every position's logits into logits, the residual streams into hidden. */
static ie_status_t run_chunk(ie_worker_t *w, const int32_t *ids, size_t len, const ie_calib_opts_t *o, int32_t *tok,
                             int32_t *pos, int32_t *seq, uint8_t *want, float *logits, float *hidden)
{
    for (size_t k = 0; k < len; k++) {
        tok[k] = (k == 0 && o->add_bos && o->bos >= 0) ? o->bos : ids[k];
        pos[k] = (int32_t)k;
        seq[k] = 0;
        want[k] = 1;
    }
    ie_worker_seq_clear(w, 0);
    ie_batch_t b = {(int)len, tok, pos, seq, want, NULL, NULL};
    return ie_worker_step_hidden(w, &b, logits, hidden);
}

static ie_status_t new_worker(const ie_model_src_t *src, ie_precision_t prec, const ie_calib_opts_t *o,
                              ie_worker_t **out)
{
    ie_worker_opts_t wo;
    ie_worker_opts_default(&wo);
    wo.n_threads = o->n_threads;
    wo.pin_threads = 0;
    wo.n_ctx = o->chunk;
    wo.n_seq = 1;
    wo.max_batch = o->chunk;
    wo.precision = prec;
    return ie_worker_new(src, &wo, out);
}

ie_status_t ie_calib_run(const ie_model_src_t *ref, const ie_model_src_t *quant, const int32_t *ids, size_t n,
                         const ie_calib_opts_t *o, ie_calib_report_t *r)
{
    ie_status_t st = IE_OK;
    const ie_hparams_t *hp = ie_model_src_hparams(ref);
    const int L = hp->n_layer, D = hp->n_embd, V = hp->n_vocab;
    const size_t chunk = (size_t)(o->chunk > 0 ? o->chunk : 128);
    ie_worker_t *w = NULL;
    float *ref_lp = NULL, *ref_h = NULL, *logits = NULL, *hidden = NULL;
    int32_t *tok = NULL, *pos = NULL, *seq = NULL;
    uint8_t *want = NULL;
    double *cos_sum = NULL;
    memset(r, 0, sizeof *r);

    if (n < 2) return ie_error_set(IE_ERR_INVAL, "calibration: need at least 2 tokens, got %zu", n);
    if (ie_model_src_hparams(quant)->n_layer != L || ie_model_src_hparams(quant)->n_vocab != V ||
        ie_model_src_hparams(quant)->n_embd != D)
        return ie_error_set(IE_ERR_INTERNAL, "calibration: converted model's shape differs from the source");
    /* a final chunk of one token has nothing to predict; drop it */
    if (n % chunk == 1) n--;
    size_t n_chunks = (n + chunk - 1) / chunk;

    r->n_layer = L;
    r->chunk = (int)chunk;
    r->layer_cos = calloc((size_t)L, sizeof(double));
    r->layer_cos_min = malloc((size_t)L * sizeof(double));
    cos_sum = calloc((size_t)L, sizeof(double));
    ref_lp = malloc(n * (size_t)V * sizeof(float));
    ref_h = malloc((size_t)L * n * (size_t)D * sizeof(float));
    logits = malloc(chunk * (size_t)V * sizeof(float));
    hidden = malloc((size_t)L * chunk * (size_t)D * sizeof(float));
    tok = malloc(chunk * sizeof *tok);
    pos = malloc(chunk * sizeof *pos);
    seq = malloc(chunk * sizeof *seq);
    want = malloc(chunk);
    if (!r->layer_cos || !r->layer_cos_min || !cos_sum || !ref_lp || !ref_h || !logits || !hidden || !tok || !pos ||
        !seq || !want) {
        st = ie_error_set(IE_ERR_NOMEM, "calibration: out of memory (%zu tokens x %d vocabulary)", n, V);
        goto done;
    }
    for (int l = 0; l < L; l++) r->layer_cos_min[l] = 1.0;

    /* ---- reference: log-probs and residual streams, chunk by chunk.
     * ref_h layout: chunk c's block [l][k][D] starts at c*chunk*L*D. */
    if ((st = new_worker(ref, IE_PREC_F32, o, &w)) != IE_OK) goto done;
    for (size_t c = 0; c < n_chunks; c++) {
        size_t len = chunk_len(n, chunk, c), t0 = c * chunk;
        float *lp = ref_lp + t0 * (size_t)V;
        if ((st = run_chunk(w, ids + t0, len, o, tok, pos, seq, want, lp, ref_h + t0 * (size_t)L * D)) != IE_OK)
            goto done;
        for (size_t k = 0; k < len; k++) log_softmax(lp + k * (size_t)V, V);
    }
    ie_worker_destroy(&w);

    /* ---- converted model, compared as it goes */
    if ((st = new_worker(quant, IE_PREC_NATIVE, o, &w)) != IE_OK) goto done;
    double kl_sum = 0, kl_max = 0, nll_ref = 0, nll_q = 0;
    size_t scored = 0, agree = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        size_t len = chunk_len(n, chunk, c), t0 = c * chunk;
        if ((st = run_chunk(w, ids + t0, len, o, tok, pos, seq, want, logits, hidden)) != IE_OK) goto done;
        const float *rh = ref_h + t0 * (size_t)L * D;
        for (int l = 0; l < L; l++)
            for (size_t k = 0; k < len; k++) {
                size_t off = ((size_t)l * len + k) * D;
                double cs = cosine(rh + off, hidden + off, D);
                cos_sum[l] += cs;
                if (cs < r->layer_cos_min[l]) r->layer_cos_min[l] = cs;
            }
        for (size_t k = 0; k < len; k++) {
            float *q = logits + k * (size_t)V;
            const float *p = ref_lp + (t0 + k) * (size_t)V;
            log_softmax(q, V);
            double kl = 0;
            for (int v = 0; v < V; v++) {
                double pr = exp((double)p[v]);
                kl += pr * ((double)p[v] - (double)q[v]);
            }
            if (kl < 0) kl = 0; /* rounding */
            kl_sum += kl;
            if (kl > kl_max) kl_max = kl;
            agree += argmax(p, V) == argmax(q, V);
            if (k + 1 < len) {
                int32_t next = ids[t0 + k + 1];
                nll_ref -= p[next];
                nll_q -= q[next];
                scored++;
            }
        }
    }
    ie_worker_destroy(&w);

    for (int l = 0; l < L; l++) r->layer_cos[l] = cos_sum[l] / (double)n;
    r->n_tokens = n;
    r->n_scored = scored;
    r->n_chunks = n_chunks;
    r->kl_mean = kl_sum / (double)n;
    r->kl_max = kl_max;
    r->top1_agree = (double)agree / (double)n;
    r->ppl_ref = exp(nll_ref / (double)scored);
    r->ppl_quant = exp(nll_q / (double)scored);
    r->ppl_delta_pct = 100.0 * (r->ppl_quant / r->ppl_ref - 1.0);
    r->pass = 1;

done:
    ie_worker_destroy(&w);
    free(cos_sum);
    free(ref_lp);
    free(ref_h);
    free(logits);
    free(hidden);
    free(tok);
    free(pos);
    free(seq);
    free(want);
    if (st != IE_OK) ie_calib_report_clear(r);
    return st;
}

void ie_calib_gate(ie_calib_report_t *r, const ie_manifest_gate_t *g)
{
    r->worst_layer = 0;
    for (int l = 1; l < r->n_layer; l++)
        if (r->layer_cos[l] < r->layer_cos[r->worst_layer]) r->worst_layer = l;
    double worst = r->n_layer > 0 ? r->layer_cos[r->worst_layer] : 1.0;
    r->fail_cos = g->has_min_layer_cosine && !(worst >= g->min_layer_cosine);
    r->fail_kl = g->has_max_kl && !(r->kl_mean <= g->max_kl);
    r->fail_ppl = g->has_max_ppl_increase_pct && !(r->ppl_delta_pct <= g->max_ppl_increase_pct);
    r->pass = !r->fail_cos && !r->fail_kl && !r->fail_ppl;
}

static const char *verdict(int has, int fail) { return !has ? "-" : fail ? "FAIL" : "PASS"; }

void ie_calib_report_print(FILE *f, const ie_calib_report_t *r, const ie_manifest_gate_t *g)
{
    fprintf(f,
            "calibration: %zu tokens in %zu chunk(s) of <= %d positions; reference = source at f32, "
            "converted = native\n",
            r->n_tokens, r->n_chunks, r->chunk);
    fprintf(f, "  layer   cosine(mean)   cosine(min)\n");
    for (int l = 0; l < r->n_layer; l++)
        fprintf(f, "  %5d   %12.6f   %11.6f%s\n", l, r->layer_cos[l], r->layer_cos_min[l],
                l == r->worst_layer ? "   <- lowest" : "");
    char thr[64];
    fprintf(f, "  %-26s %-30s %-16s %s\n", "metric", "value", "gate", "result");
    if (g->has_min_layer_cosine) snprintf(thr, sizeof thr, ">= %.6g", g->min_layer_cosine);
    else snprintf(thr, sizeof thr, "(none)");
    char val[96];
    snprintf(val, sizeof val, "%.6f (layer %d)", r->n_layer ? r->layer_cos[r->worst_layer] : 1.0, r->worst_layer);
    fprintf(f, "  %-26s %-30s %-16s %s\n", "min layer cosine", val, thr,
            verdict(g->has_min_layer_cosine, r->fail_cos));
    if (g->has_max_kl) snprintf(thr, sizeof thr, "<= %.6g", g->max_kl);
    else snprintf(thr, sizeof thr, "(none)");
    snprintf(val, sizeof val, "%.6f (max %.4f)", r->kl_mean, r->kl_max);
    fprintf(f, "  %-26s %-30s %-16s %s\n", "KL(ref||quant) nats/token", val, thr,
            verdict(g->has_max_kl, r->fail_kl));
    if (g->has_max_ppl_increase_pct) snprintf(thr, sizeof thr, "<= %+.6g%%", g->max_ppl_increase_pct);
    else snprintf(thr, sizeof thr, "(none)");
    snprintf(val, sizeof val, "%.4f -> %.4f (%+.3f%%)", r->ppl_ref, r->ppl_quant, r->ppl_delta_pct);
    fprintf(f, "  %-26s %-30s %-16s %s\n", "perplexity ref -> quant", val, thr,
            verdict(g->has_max_ppl_increase_pct, r->fail_ppl));
    snprintf(val, sizeof val, "%.2f%%", 100.0 * r->top1_agree);
    fprintf(f, "  %-26s %-30s %-16s %s\n", "top-1 agreement", val, "-", "-");
    fprintf(f, "gate: %s\n", r->pass ? "PASS" : "FAIL");
}

char *ie_calib_report_json(const ie_calib_report_t *r, const ie_manifest_gate_t *g)
{
    cJSON *o = cJSON_CreateObject(), *gate = NULL, *lc = NULL, *lm = NULL;
    char *s = NULL;
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "tokens", (double)r->n_tokens);
    cJSON_AddNumberToObject(o, "scored", (double)r->n_scored);
    cJSON_AddNumberToObject(o, "chunks", (double)r->n_chunks);
    cJSON_AddNumberToObject(o, "chunk", r->chunk);
    cJSON_AddStringToObject(o, "reference", "f32");
    if (!(lc = cJSON_AddArrayToObject(o, "layer_cosine"))) goto done;
    if (!(lm = cJSON_AddArrayToObject(o, "layer_cosine_min"))) goto done;
    for (int l = 0; l < r->n_layer; l++) {
        cJSON_AddItemToArray(lc, cJSON_CreateNumber(r->layer_cos[l]));
        cJSON_AddItemToArray(lm, cJSON_CreateNumber(r->layer_cos_min[l]));
    }
    cJSON_AddNumberToObject(o, "min_layer_cosine", r->n_layer ? r->layer_cos[r->worst_layer] : 1.0);
    cJSON_AddNumberToObject(o, "worst_layer", r->worst_layer);
    cJSON_AddNumberToObject(o, "kl_mean", r->kl_mean);
    cJSON_AddNumberToObject(o, "kl_max", r->kl_max);
    cJSON_AddNumberToObject(o, "ppl_ref", r->ppl_ref);
    cJSON_AddNumberToObject(o, "ppl_quant", r->ppl_quant);
    cJSON_AddNumberToObject(o, "ppl_increase_pct", r->ppl_delta_pct);
    cJSON_AddNumberToObject(o, "top1_agreement", r->top1_agree);
    if (!(gate = cJSON_AddObjectToObject(o, "gate"))) goto done;
    if (g->has_min_layer_cosine) cJSON_AddNumberToObject(gate, "min_layer_cosine", g->min_layer_cosine);
    if (g->has_max_kl) cJSON_AddNumberToObject(gate, "max_kl", g->max_kl);
    if (g->has_max_ppl_increase_pct) cJSON_AddNumberToObject(gate, "max_ppl_increase_pct", g->max_ppl_increase_pct);
    cJSON_AddBoolToObject(o, "pass", r->pass);
    s = cJSON_PrintUnformatted(o);
done:
    cJSON_Delete(o);
    return s;
}
