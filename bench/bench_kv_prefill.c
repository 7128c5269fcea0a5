/* bench_kv_prefill.c — prefill at depth with each KV cache type, A/B
 * interleaved (docs/KVCACHE.md, "Speed"; issue 22: a q8 cache's prefill at
 * depth within 10% of the f32 cache's).
 *
 * --rounds rounds, each running every type in turn (--types, default
 * f32,q8; K and V the same type: f32, q8, f32, q8, ...), one worker alive
 * at a time: it is made, filled to --depth positions (a prompt of
 * arbitrary ids, in steps of 512, fill_s its first round), then --new
 * tokens are prefilled in one step at positions depth .. depth+new-1, timed, with the step's attention time
 * (ie_prof's IE_PROF_ATTENTION: scores, softmax, values, and a typed
 * cache's decode of the visible rows). Per type: the median step time, its
 * tokens/s and attention's share; per round the ratio of each type's step
 * to the first type's (the A/B figure, both read within seconds of each
 * other on the same load). Prints a table and one JSON line; asserts
 * nothing.
 *
 * usage: bench_kv_prefill --model PATH [--threads N] [--depth N] [--new N]
 *                         [--rounds N] [--types f32,q8,...] [--kv-rotate auto|on|off]
 */
#define _GNU_SOURCE
#include "ie_model_src.h"
#include "ie_prof.h"
#include "ie_worker.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define MAX_TYPES 8
#define MAX_ROUNDS 64

static double median(double *v, int n)
{
    if (n == 0) return NAN;
    qsort(v, (size_t)n, sizeof v[0], cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Prefill ids[from .. to) of slot 0 in steps of at most `step` tokens,
 * logits of the last only. */
static ie_status_t fill(ie_worker_t *w, const int32_t *ids, int from, int to, int step, float *logits)
{
    ie_status_t st = IE_OK;
    int32_t *pos = malloc((size_t)step * sizeof *pos), *seq = calloc((size_t)step, sizeof *seq);
    uint8_t *want = calloc((size_t)step, 1);
    if (!pos || !seq || !want) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
    for (int i0 = from; st == IE_OK && i0 < to; i0 += step) {
        const int m = to - i0 < step ? to - i0 : step;
        for (int k = 0; k < m; k++) pos[k] = i0 + k, want[k] = i0 + k == to - 1;
        ie_batch_t b = {m, ids + i0, pos, seq, want, NULL, NULL};
        st = ie_worker_step(w, &b, logits);
    }
    free(pos);
    free(seq);
    free(want);
    return st;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *types = "f32,q8";
    int threads = 2, depth = 4096, nnew = 512, rounds = 2;
    ie_kv_rotate_t rot = IE_KV_ROTATE_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) depth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) nnew = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) types = argv[++i];
        else if (!strcmp(argv[i], "--kv-rotate") && i + 1 < argc && ie_kv_rotate_parse(argv[i + 1], &rot) == IE_OK)
            i++;
        else {
            fprintf(stderr, "usage: bench_kv_prefill --model PATH [--threads N] [--depth N] [--new N] "
                            "[--rounds N] [--types f32,q8,...] [--kv-rotate auto|on|off]\n");
            return 2;
        }
    }
    ie_kv_type_t kt[MAX_TYPES];
    int nt = 0;
    {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", types);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (nt == MAX_TYPES || ie_kv_type_parse(t, &kt[nt]) != IE_OK) {
                fprintf(stderr, "bench_kv_prefill: bad --types entry '%s' (at most %d types)\n", t, MAX_TYPES);
                return 2;
            }
            nt++;
        }
    }
    if (!model || nt < 1 || threads < 1 || depth < 0 || depth > 65536 || nnew < 1 || nnew > 4096 || rounds < 1 ||
        rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_kv_prefill: --model and --types are required; --threads >= 1, --depth in "
                        "[0, 65536], --new in [1, 4096], --rounds in [1, 64]\n");
        return 2;
    }
    int rc = 1;
    ie_model_src_t *src = NULL;
    ie_worker_t *w[MAX_TYPES] = {0};
    float *logits = NULL;
    int32_t *ids = NULL;
    static double step_s[MAX_TYPES][MAX_ROUNDS], att_s[MAX_TYPES][MAX_ROUNDS];
    double fill_s[MAX_TYPES] = {0};
    if (ie_model_src_open(model, &src) != IE_OK) {
        fprintf(stderr, "bench_kv_prefill: %s\n", ie_error_last());
        goto out;
    }
    const int n_vocab = ie_model_src_hparams(src)->n_vocab, total = depth + nnew;
    ids = malloc((size_t)total * sizeof *ids);
    logits = malloc((size_t)n_vocab * sizeof *logits);
    if (!ids || !logits) {
        fprintf(stderr, "bench_kv_prefill: out of memory\n");
        goto out;
    }
    for (int i = 0; i < total; i++) ids[i] = (int32_t)((1 + 7919 * (int64_t)i) % n_vocab);
    ie_prof_enable(1);
    for (int r = 0; r < rounds; r++)
        for (int t = 0; t < nt; t++) {
            /* one worker alive at a time: an idle worker's pool threads
             * would share the 2 cores with the timed one (measured: the
             * second of two workers ran 1.9x slower whatever its type) */
            ie_worker_opts_t o;
            ie_worker_opts_default(&o);
            o.n_threads = threads;
            o.n_ctx = total + 1;
            o.max_batch = nnew > 512 ? nnew : 512;
            o.kv_type_k = o.kv_type_v = kt[t];
            o.kv_rotate = rot;
            double t0 = now_s();
            if (ie_worker_new(src, &o, &w[t]) != IE_OK || fill(w[t], ids, 0, depth, 512, logits) != IE_OK) {
                fprintf(stderr, "bench_kv_prefill: %s: %s\n", ie_kv_type_name(kt[t]), ie_error_last());
                goto out;
            }
            if (r == 0) fill_s[t] = now_s() - t0;
            ie_prof_reset();
            t0 = now_s();
            if (fill(w[t], ids, depth, total, nnew, logits) != IE_OK) {
                fprintf(stderr, "bench_kv_prefill: %s: %s\n", ie_kv_type_name(kt[t]), ie_error_last());
                goto out;
            }
            step_s[t][r] = now_s() - t0;
            att_s[t][r] = (double)ie_prof_get(IE_PROF_ATTENTION) * 1e-9;
            ie_worker_destroy(&w[t]);
        }
    ie_prof_enable(0);
    printf("bench_kv_prefill: %s, %d thread(s), %d new tokens in one step after %d cached positions, %d "
           "round(s) of %s in turn\n",
           model, threads, nnew, depth, rounds, types);
    printf("%-9s %9s %9s %9s %9s %9s %12s\n", "cache", "fill_s", "step_s", "tok/s", "attn_s", "attn_frac",
           "vs_first");
    /* the table line by line, the JSON object into a buffer */
    char *jbuf = NULL;
    size_t jlen = 0;
    FILE *json = open_memstream(&jbuf, &jlen);
    if (!json) goto out;
    fprintf(json,
            "{\"bench\":\"kv_prefill\",\"model\":\"%s\",\"threads\":%d,\"depth\":%d,\"new\":%d,"
            "\"rounds\":%d,\"types\":{",
            model, threads, depth, nnew, rounds);
    for (int t = 0; t < nt; t++) {
        double st[MAX_ROUNDS], at[MAX_ROUNDS], ratio[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) {
            st[r] = step_s[t][r];
            at[r] = att_s[t][r];
            ratio[r] = step_s[t][r] / step_s[0][r]; /* the same round: seconds apart */
        }
        const double ms = median(st, rounds), ma = median(at, rounds), mr = median(ratio, rounds);
        printf("%-9s %9.2f %9.3f %9.1f %9.3f %9.3f %12.3f\n", ie_kv_type_name(kt[t]), fill_s[t], ms, nnew / ms, ma,
               ma / ms, mr);
        fprintf(json, "%s\"%s\":{\"fill_s\":%.3f,\"step_s\":%.4f,\"tok_s\":%.2f,\"attn_s\":%.4f,\"ratio\":[",
                t ? "," : "", ie_kv_type_name(kt[t]), fill_s[t], ms, nnew / ms, ma);
        for (int r = 0; r < rounds; r++) fprintf(json, "%s%.4f", r ? "," : "", step_s[t][r] / step_s[0][r]);
        fprintf(json, "]}");
    }
    fclose(json);
    printf("%s}}\n", jbuf ? jbuf : "");
    free(jbuf);
    rc = 0;
out:
    for (int t = 0; t < nt; t++) ie_worker_destroy(&w[t]);
    free(logits);
    free(ids);
    ie_model_src_destroy(&src);
    return rc;
}
