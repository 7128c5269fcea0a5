/* bench_decode.c — decode against the bandwidth it could reach, token by
 * token.
 *
 * This machine's read bandwidth flips between ~35 and ~50-65 GB/s within
 * seconds, so a decode rate and a bandwidth probe taken a minute apart do
 * not make a fraction. Here every decode step (one token, batch 1, greedy)
 * is paired with ie_worker_stream_probe, a read of the same weight bytes by
 * the same threads cut the same way, a few milliseconds before or after it
 * (the order alternates), twice: "jobs", one pool job per matmul job of the
 * step (the fork/joins a step cannot avoid), and "flat", one job for all of
 * it (the plain stream). For each token the fraction is probe time / step
 * time; the medians are printed over all tokens and apart for the tokens
 * whose paired read ran in the high phase (>= --high-gbps) and the low one.
 * Bytes are ie_worker_bytes_per_token's (every matrix once, one embedding
 * row). Prints a table and one JSON line; asserts nothing.
 * --ab OPTION (an ie_worker_set_decode_option name: balance, prefetch,
 * stream, kvprefetch)
 * switches the option on for tokens 0,1, off for 2,3, and so on (each arm
 * gets both orders), and prints every row for each arm: an A/B in one
 * run, each token still paired with its own read.
 *
 * usage: bench_decode --model PATH [--threads N] [--tokens N] [--prompt N]
 *                     [--precision native|bf16|int8w|int4w|...] [--high-gbps G]
 *                     [--ab balance|prefetch|stream|kvprefetch]
 *                     [--cache-type-k T] [--cache-type-v T] [--kv-rotate auto|on|off]
 * The cache types (docs/KVCACHE.md) show what a smaller cache read buys at
 * depth: --prompt 4096 puts every decode step 4,096 positions deep.
 */
#define _GNU_SOURCE
#include "ie_model_src.h"
#include "ie_worker.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

typedef struct {
    double step, jobs, flat; /* seconds */
    int arm;                 /* --ab: 0 option on, 1 off; else 0 */
} sample_t;

static double median(double *v, int n)
{
    if (n == 0) return NAN;
    qsort(v, (size_t)n, sizeof v[0], cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Medians over the samples of one phase (0 low, 1 high, -1 all) and arm
 * (-1: all): one table row, one JSON member. Returns -1 when out of
 * memory. */
static int summarize(const sample_t *s, int n, double bytes, double high, int phase, int arm, const char *label,
                     FILE *json, int *first)
{
    /* five columns of n values: frac jobs, frac flat, t/s, read jobs, read flat */
    double *col = malloc(5 * (size_t)(n ? n : 1) * sizeof *col);
    if (!col) return -1;
    double *a = col, *b = col + n, *c = col + 2 * n, *d = col + 3 * n, *e = col + 4 * n;
    int m = 0;
    for (int i = 0; i < n; i++) {
        const double read = bytes / s[i].jobs / 1e9;
        if (phase >= 0 && (read >= high) != phase) continue;
        if (arm >= 0 && s[i].arm != arm) continue;
        a[m] = s[i].jobs / s[i].step;
        b[m] = s[i].flat / s[i].step;
        c[m] = 1.0 / s[i].step;
        d[m] = read;
        e[m] = bytes / s[i].flat / 1e9;
        m++;
    }
    const double fj = median(a, m), ff = median(b, m), tps = median(c, m), rj = median(d, m), rf = median(e, m);
    if (m == 0) printf("%-9s %5d\n", label, 0);
    else printf("%-9s %5d %9.1f %9.1f %9.1f %9.1f %9.3f %9.3f\n", label, m, tps, tps * bytes / 1e9, rj, rf, fj, ff);
    fprintf(json, "%s\"%s\":{\"n\":%d", *first ? "" : ",", label, m);
    if (m)
        fprintf(json,
                ",\"decode_tps\":%.2f,\"decode_gbps\":%.2f,\"read_jobs_gbps\":%.2f,\"read_flat_gbps\":%.2f,"
                "\"frac_jobs\":%.4f,\"frac_flat\":%.4f",
                tps, tps * bytes / 1e9, rj, rf, fj, ff);
    fprintf(json, "}");
    *first = 0;
    free(col);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *prec = "native", *ab = NULL;
    int threads = 2, tokens = 128, prompt = 8;
    ie_kv_type_t kvk = IE_KV_F32, kvv = IE_KV_F32;
    ie_kv_rotate_t kvrot = IE_KV_ROTATE_AUTO;
    double high = 45.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) prec = argv[++i];
        else if (!strcmp(argv[i], "--high-gbps") && i + 1 < argc) high = atof(argv[++i]);
        else if (!strcmp(argv[i], "--ab") && i + 1 < argc) ab = argv[++i];
        else if (!strcmp(argv[i], "--cache-type-k") && i + 1 < argc && ie_kv_type_parse(argv[i + 1], &kvk) == IE_OK)
            i++;
        else if (!strcmp(argv[i], "--cache-type-v") && i + 1 < argc && ie_kv_type_parse(argv[i + 1], &kvv) == IE_OK)
            i++;
        else if (!strcmp(argv[i], "--kv-rotate") && i + 1 < argc &&
                 ie_kv_rotate_parse(argv[i + 1], &kvrot) == IE_OK)
            i++;
        else {
            fprintf(stderr, "usage: bench_decode --model PATH [--threads N] [--tokens N] [--prompt N] "
                            "[--precision P] [--high-gbps G] [--ab balance|prefetch|stream|kvprefetch] "
                            "[--cache-type-k T] [--cache-type-v T] [--kv-rotate auto|on|off]\n");
            return 2;
        }
    }
    if (!model || threads < 1 || tokens < 1 || prompt < 1 || prompt > 4096) {
        fprintf(stderr, "bench_decode: --model is required; --threads, --tokens >= 1, --prompt in [1, 4096]\n");
        return 2;
    }
    int rc = 1;
    ie_model_src_t *src = NULL;
    ie_worker_t *w = NULL;
    float *logits = NULL;
    sample_t *smp = NULL;
    int32_t *ids = NULL, *pos = NULL, *seq = NULL;
    uint8_t *want = NULL;
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_threads = threads;
    o.n_ctx = prompt + tokens + 1;
    o.max_batch = prompt < 512 ? prompt : 512;
    o.kv_type_k = kvk;
    o.kv_type_v = kvv;
    o.kv_rotate = kvrot;
    if (ie_precision_parse(prec, &o.precision) != IE_OK || ie_model_src_open(model, &src) != IE_OK ||
        ie_worker_new(src, &o, &w) != IE_OK) {
        fprintf(stderr, "bench_decode: %s\n", ie_error_last());
        goto out;
    }
    const int n_vocab = ie_worker_hparams(w)->n_vocab;
    const double bytes = (double)ie_worker_bytes_per_token(w);
    logits = malloc((size_t)n_vocab * sizeof *logits);
    smp = calloc((size_t)tokens, sizeof *smp);
    ids = malloc((size_t)prompt * sizeof *ids);
    pos = malloc((size_t)prompt * sizeof *pos);
    seq = calloc((size_t)prompt, sizeof *seq);
    want = calloc((size_t)prompt, 1);
    if (!logits || !smp || !ids || !pos || !seq || !want) {
        fprintf(stderr, "bench_decode: out of memory\n");
        goto out;
    }
    /* a fixed prompt of arbitrary ids, then greedy tokens */
    for (int i = 0; i < prompt; i++) {
        ids[i] = (int32_t)((1 + 7919 * (int64_t)i) % n_vocab);
        pos[i] = i;
    }
    want[prompt - 1] = 1;
    for (int i0 = 0; i0 < prompt; i0 += o.max_batch) { /* prefill in steps of max_batch */
        const int m = prompt - i0 < o.max_batch ? prompt - i0 : o.max_batch;
        ie_batch_t b = {m, ids + i0, pos + i0, seq + i0, want + i0, NULL, NULL};
        if (ie_worker_step(w, &b, logits) != IE_OK) {
            fprintf(stderr, "bench_decode: prefill: %s\n", ie_error_last());
            goto out;
        }
    }
    const int warm = tokens > 16 ? 8 : 0;
    int n = 0;
    for (int t = 0; t < tokens; t++) {
        int32_t tok = (int32_t)ie_argmax_f32(logits, n_vocab, NULL), p = prompt + t, sq = 0;
        uint8_t one = 1;
        ie_batch_t d = {1, &tok, &p, &sq, &one, NULL, NULL};
        sample_t s = {0};
        ie_status_t st = IE_OK;
        if (ab) {
            s.arm = (t / 2) % 2;
            st = ie_worker_set_decode_option(w, ab, s.arm == 0);
        }
        if (st != IE_OK) {
            /* an unknown --ab name: reported below */
        } else if (t % 2 == 0) { /* step first, then the reads; the next token the other way round */
            const double t0 = now_s();
            st = ie_worker_step(w, &d, logits);
            s.step = now_s() - t0;
            if (st == IE_OK) st = ie_worker_stream_probe(w, 0, &s.jobs);
            if (st == IE_OK) st = ie_worker_stream_probe(w, 1, &s.flat);
        } else {
            st = ie_worker_stream_probe(w, 1, &s.flat);
            if (st == IE_OK) st = ie_worker_stream_probe(w, 0, &s.jobs);
            const double t0 = now_s();
            if (st == IE_OK) st = ie_worker_step(w, &d, logits);
            s.step = now_s() - t0;
        }
        if (st != IE_OK) {
            fprintf(stderr, "bench_decode: token %d: %s\n", t, ie_error_last());
            goto out;
        }
        if (t >= warm) smp[n++] = s;
    }
    printf("bench_decode: %s, precision %s, %d thread(s), %d tokens after a %d-token prompt (first %d not "
           "counted), %.1f MB per token, KV cache %s/%s (%zu bytes per position)\n",
           model, prec, threads, n, prompt, warm, bytes / 1e6, ie_kv_type_name(kvk), ie_kv_type_name(kvv),
           ie_worker_kv_bytes_per_pos(w));
    printf("each token: decode step vs reads of the same bytes by the same threads (jobs: one pool job per "
           "matmul job; flat: one job); medians of per-token figures\n");
    printf("%-9s %5s %9s %9s %9s %9s %9s %9s\n", "phase", "n", "tok/s", "GB/s", "read_j", "read_f", "frac_j",
           "frac_f");
    /* the table goes to stdout line by line, the JSON object to a buffer */
    char *jbuf = NULL;
    size_t jlen = 0;
    FILE *json = open_memstream(&jbuf, &jlen);
    if (!json) goto out;
    fprintf(json,
            "{\"bench\":\"decode\",\"model\":\"%s\",\"precision\":\"%s\",\"threads\":%d,"
            "\"mb_per_token\":%.1f,\"high_gbps\":%.1f,\"cache_type_k\":\"%s\",\"cache_type_v\":\"%s\","
            "\"prompt\":%d,",
            model, prec, threads, bytes / 1e6, high, ie_kv_type_name(kvk), ie_kv_type_name(kvv), prompt);
    int first = 1, sum_rc = 0;
    if (ab) fprintf(json, "\"ab\":\"%s\",", ab);
    for (int arm = ab ? 0 : -1; arm <= (ab ? 1 : -1); arm++) {
        char l[3][32];
        const char *pre = arm < 0 ? "" : arm == 0 ? "on:" : "off:";
        snprintf(l[0], sizeof l[0], "%sall", pre);
        snprintf(l[1], sizeof l[1], "%shigh", pre);
        snprintf(l[2], sizeof l[2], "%slow", pre);
        sum_rc |= summarize(smp, n, bytes, high, -1, arm, l[0], json, &first) |
                  summarize(smp, n, bytes, high, 1, arm, l[1], json, &first) |
                  summarize(smp, n, bytes, high, 0, arm, l[2], json, &first);
    }
    fclose(json);
    if (sum_rc != 0) {
        fprintf(stderr, "bench_decode: out of memory\n");
        free(jbuf);
        goto out;
    }
    printf("%s}\n", jbuf);
    free(jbuf);
    rc = 0;
out:
    free(logits);
    free(smp);
    free(ids);
    free(pos);
    free(seq);
    free(want);
    ie_worker_destroy(&w);
    ie_model_src_destroy(&src);
    return rc;
}
