/* cli_eval.c — evaluation modes of `inference-engine`:
 *
 *   perplexity: llama.cpp's method — the text's tokens are cut into
 *     non-overlapping windows of N; each window is evaluated from an empty
 *     cache (its first token replaced by BOS when the tokenizer adds one)
 *     and only its second half is scored, so every scored token has at
 *     least N/2 tokens of context.
 *   logits: raw float32 logits of every position for given ids, for the
 *     reference comparisons in tests/.
 */
#include "ie_cli.h"
#include "ie_mmap.h"
#include "ie_engine.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Apply the plan (spec, else env IE_PLAN) to *eo and open the engine; 0,
 * or the exit code after the error line ("MODE: bad plan 'x'", or the
 * engine's own message). */
static int open_engine(const char *mode, const char *plan, ie_engine_opts_t *eo, ie_engine_t **eng)
{
    if (ie_cli_plan(plan, eo) != 0)
        return ie_cli_fail(IE_EXIT_USAGE, "%s: bad plan '%s'", mode, plan ? plan : getenv("IE_PLAN"));
    ie_status_t st = ie_engine_open(eo, eng);
    if (st != IE_OK) return ie_cli_fail(ie_cli_exit_for_load(st), "%s", ie_error_last());
    return 0;
}

int ie_cli_perplexity(int argc, char **argv)
{
    static const struct option lo[] = {{"file", required_argument, 0, 'f'},
                                       {"chunks", required_argument, 0, 'k'},
                                       {0, 0, 0, 0}};
    const char *model = NULL, *file = NULL, *plan = NULL;
    long ctx = 512, chunks = 0, threads = sysconf(_SC_NPROCESSORS_ONLN), batch = 512;
    ie_precision_t prec = IE_PREC_NATIVE;
    ie_kv_type_t kv_k = IE_KV_F32, kv_v = IE_KV_F32;
    ie_kv_rotate_t kv_rot = IE_KV_ROTATE_AUTO;
    int c, rc = IE_EXIT_OK;
    char *text = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    ie_engine_t *eng = NULL;
    int32_t *tok = NULL, *pos = NULL, *seq = NULL, *ad = NULL;
    uint8_t *want = NULL;
    ie_cli_loras_t loras = {0};
    const char *adapter = NULL;
    int aid = -1;

    const ie_cli_pick_t picks[] = {IE_CLI_PICK(IE_FLAG_MODEL, &model),
                                   IE_CLI_PICK_RANGE(IE_FLAG_CTX, &ctx, 4, 1 << 20),
                                   IE_CLI_PICK(IE_FLAG_THREADS, &threads),
                                   IE_CLI_PICK(IE_FLAG_PRECISION, &prec),
                                   IE_CLI_PICK_RANGE(IE_FLAG_BATCH, &batch, 1, 1 << 16),
                                   IE_CLI_PICK(IE_FLAG_PLAN, &plan),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_K, &kv_k),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_V, &kv_v),
                                   IE_CLI_PICK(IE_FLAG_KV_ROTATE, &kv_rot),

                                   IE_CLI_PICK(IE_FLAG_LORA, &loras),
                                   IE_CLI_PICK(IE_FLAG_ADAPTER, &adapter)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, argc, argv, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        int bad = 0;
        switch (c) {
        case IE_CLI_ENGINE: break;
        case IE_CLI_BAD: bad = 1; break;
        case 'f': file = optarg; break;
        case 'k': bad = ie_cli_parse_long(optarg, 0, 1 << 30, &chunks); break;
        default:
            return ie_cli_fail(IE_EXIT_USAGE, "perplexity: unknown or incomplete option '%s'", argv[optind - 1]);
        }
        if (bad)
            return ie_cli_fail(IE_EXIT_USAGE, "perplexity: bad value '%s'%s", optarg, ie_cli_flag_hint(&fl, c));
    }
    if (!model || !file || optind < argc)
        return ie_cli_fail(IE_EXIT_USAGE, "%s",
                           "usage: inference-engine perplexity --model PATH --file TEXT --ctx N "
                           "[--chunks K] [--threads N] [--precision P]");

    size_t len = 0;
    ie_status_t rst = ie_file_read("perplexity", file, IE_CLI_MAX_TEXT, &text, &len);
    if (rst != IE_OK)
        return ie_cli_fail(rst == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "%s", ie_error_last());

    ie_engine_opts_t eo;
    ie_engine_opts_default(&eo);
    eo.model_path = model;
    eo.n_threads = (int)threads;
    eo.n_ctx = (int)ctx;
    eo.max_batch = (int)(batch < ctx ? batch : ctx);
    eo.precision = prec;
    eo.kv_type_k = kv_k;
    eo.kv_type_v = kv_v;
    eo.kv_rotate = kv_rot;
    if ((rc = open_engine("perplexity", plan, &eo, &eng)) != 0) goto cleanup;
    if ((rc = ie_cli_lora_setup(eng, "perplexity", &loras, adapter, &aid)) != 0) goto cleanup;
    ie_status_t st;
    const ie_tokenizer_t *tk = ie_engine_tokenizer(eng);
    size_t n_ids = 0;
    /* BOS goes at the start of each window, not of the text */
    if ((st = ie_tokenizer_encode(tk, text, len, 0, &ids, &n_ids)) != IE_OK) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "perplexity: %s", ie_error_last());
        goto cleanup;
    }
    int32_t bos = ie_tokenizer_bos(tk);
    int add_bos = 0;
    {
        /* the tokenizer's own rule: does encoding with ADD_SPECIAL add BOS? */
        int32_t *t1 = NULL;
        size_t n1 = 0;
        if (ie_tokenizer_encode(tk, "a", 1, IE_TOK_ADD_SPECIAL, &t1, &n1) == IE_OK && n1 > 0 && bos >= 0 &&
            t1[0] == bos)
            add_bos = 1;
        free(t1);
    }
    size_t n_win = n_ids / (size_t)ctx;
    if (chunks > 0 && (size_t)chunks < n_win) n_win = (size_t)chunks;
    if (n_win == 0) {
        char m[128];
        snprintf(m, sizeof m, "%zu tokens, need at least --ctx %ld", n_ids, ctx);
        rc = ie_cli_fail(IE_EXIT_USAGE, "perplexity: text too short: %s", m);
        goto cleanup;
    }

    const ie_hparams_t *hp = ie_engine_hparams(eng);
    ie_backend_t *be = ie_engine_backend(eng);
    int B = ie_backend_geom(be)->max_batch;
    size_t first = (size_t)ctx / 2;
    logits = malloc((size_t)B * hp->n_vocab * sizeof(float));
    tok = malloc((size_t)B * sizeof *tok);
    pos = malloc((size_t)B * sizeof *pos);
    seq = calloc((size_t)B, sizeof *seq);
    want = malloc((size_t)B);
    ad = malloc((size_t)B * sizeof *ad);
    if (!logits || !tok || !pos || !seq || !want || !ad) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
        goto cleanup;
    }
    double nll = 0;
    size_t scored = 0;
    for (size_t wi = 0; wi < n_win; wi++) {
        const int32_t *win = ids + wi * (size_t)ctx;
        ie_backend_seq_clear(be, 0);
        for (size_t s0 = 0; s0 < (size_t)ctx; s0 += (size_t)B) {
            int m = (int)((size_t)ctx - s0 < (size_t)B ? (size_t)ctx - s0 : (size_t)B);
            for (int k = 0; k < m; k++) {
                size_t p = s0 + k;
                tok[k] = (p == 0 && add_bos) ? bos : win[p];
                pos[k] = (int32_t)p;
                want[k] = p >= first && p + 1 < (size_t)ctx;
                ad[k] = aid;
            }
            ie_batch_t b = {m, tok, pos, seq, want, aid >= 0 ? ad : NULL, NULL};
            if ((st = ie_backend_step(be, &b, logits)) != IE_OK) {
                rc = ie_cli_fail(IE_EXIT_RUNTIME, "perplexity: %s", ie_error_last());
                goto cleanup;
            }
            int row = 0;
            for (int k = 0; k < m; k++) {
                if (!want[k]) continue;
                const float *lg = logits + (size_t)row++ * hp->n_vocab;
                double mx = lg[0];
                for (int v = 1; v < hp->n_vocab; v++) mx = lg[v] > mx ? lg[v] : mx;
                double z = 0;
                for (int v = 0; v < hp->n_vocab; v++) z += exp((double)lg[v] - mx);
                nll -= (double)lg[win[s0 + k + 1]] - mx - log(z);
                scored++;
            }
        }
    }
    printf("{\"ppl\":%.6f,\"tokens\":%zu,\"chunks\":%zu,\"ctx\":%ld,\"nll\":%.6f,\"adapter\":%s%s%s}\n",
           exp(nll / (double)scored), scored, n_win, ctx, nll / (double)scored, adapter ? "\"" : "",
           adapter ? adapter : "null", adapter ? "\"" : "");
    fflush(stdout);

cleanup:
    free(text);
    free(ids);
    free(logits);
    free(tok);
    free(pos);
    free(seq);
    free(want);
    free(ad);
    ie_engine_destroy(&eng);
    return rc;
}

int ie_cli_logits(int argc, char **argv)
{
    static const struct option lo[] = {{"ids", required_argument, 0, 'i'},
                                       {"mode", required_argument, 0, 'M'},
                                       {"out", required_argument, 0, 'o'},
                                       {0, 0, 0, 0}};
    const char *model = NULL, *ids_s = NULL, *out = NULL, *plan = NULL;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    int decode = 0, c, rc = IE_EXIT_OK;
    ie_precision_t prec = IE_PREC_NATIVE;
    ie_kv_type_t kv_k = IE_KV_F32, kv_v = IE_KV_F32;
    ie_kv_rotate_t kv_rot = IE_KV_ROTATE_AUTO;
    int32_t *ids = NULL;
    float *logits = NULL;
    ie_engine_t *eng = NULL;
    FILE *f = NULL;
    ie_cli_loras_t loras = {0};
    const char *adapter = NULL;
    int aid = -1;

    const ie_cli_pick_t picks[] = {
        IE_CLI_PICK(IE_FLAG_MODEL, &model),       IE_CLI_PICK(IE_FLAG_THREADS, &threads),
        IE_CLI_PICK(IE_FLAG_PRECISION, &prec),    IE_CLI_PICK(IE_FLAG_PLAN, &plan),
        IE_CLI_PICK(IE_FLAG_CACHE_TYPE_K, &kv_k), IE_CLI_PICK(IE_FLAG_CACHE_TYPE_V, &kv_v),
        IE_CLI_PICK(IE_FLAG_KV_ROTATE, &kv_rot),

        IE_CLI_PICK(IE_FLAG_LORA, &loras),        IE_CLI_PICK(IE_FLAG_ADAPTER, &adapter)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, argc, argv, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        int bad = 0;
        switch (c) {
        case IE_CLI_ENGINE: break;
        case IE_CLI_BAD: bad = 1; break;
        case 'i': ids_s = optarg; break;
        case 'o': out = optarg; break;
        case 'M':
            if (!strcmp(optarg, "decode")) decode = 1;
            else if (!strcmp(optarg, "prefill")) decode = 0;
            else bad = 1;
            break;
        default: return ie_cli_fail(IE_EXIT_USAGE, "logits: unknown or incomplete option '%s'", argv[optind - 1]);
        }
        if (bad) return ie_cli_fail(IE_EXIT_USAGE, "logits: bad value '%s'%s", optarg, ie_cli_flag_hint(&fl, c));
    }
    if (!model || !ids_s || !out || optind < argc)
        return ie_cli_fail(
            IE_EXIT_USAGE, "%s",
            "usage: inference-engine logits --model PATH --ids 1,2,3 "
            "[--mode prefill|decode] [--precision P] [--lora NAME=PATH ... --adapter NAME] --out FILE");
    /* parse the id list */
    size_t n = 1;
    for (const char *s = ids_s; *s; s++) n += *s == ',';
    ids = malloc(n * sizeof *ids);
    if (!ids) return ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
    {
        const char *s = ids_s;
        for (size_t i = 0; i < n; i++) {
            char *end;
            errno = 0;
            long v = strtol(s, &end, 10);
            if (errno || end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
                rc = ie_cli_fail(IE_EXIT_USAGE, "logits: bad id list '%s'", ids_s);
                goto cleanup;
            }
            ids[i] = (int32_t)v;
            s = *end ? end + 1 : end;
        }
    }
    ie_engine_opts_t eo;
    ie_engine_opts_default(&eo);
    eo.model_path = model;
    eo.n_threads = (int)threads;
    eo.n_ctx = (int)(n < 16 ? 16 : n);
    eo.precision = prec;
    eo.kv_type_k = kv_k;
    eo.kv_type_v = kv_v;
    eo.kv_rotate = kv_rot;
    eo.no_tokenizer = 1;
    if ((rc = open_engine("logits", plan, &eo, &eng)) != 0) goto cleanup;
    if ((rc = ie_cli_lora_setup(eng, "logits", &loras, adapter, &aid)) != 0) goto cleanup;
    if (ie_engine_set_logits_adapter(eng, aid) != IE_OK) {
        rc = ie_cli_fail(IE_EXIT_RUNTIME, "logits: %s", ie_error_last());
        goto cleanup;
    }
    ie_status_t st;
    const ie_hparams_t *hp = ie_engine_hparams(eng);
    logits = malloc(n * (size_t)hp->n_vocab * sizeof(float));
    if (!logits) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
        goto cleanup;
    }
    if ((st = ie_engine_logits(eng, ids, n, decode, logits)) != IE_OK) {
        rc = ie_cli_fail(st == IE_ERR_RANGE ? IE_EXIT_USAGE : IE_EXIT_RUNTIME, "logits: %s", ie_error_last());
        goto cleanup;
    }
    f = fopen(out, "wb");
    if (!f || fwrite(logits, sizeof(float), n * (size_t)hp->n_vocab, f) != n * (size_t)hp->n_vocab) {
        rc = ie_cli_fail(IE_EXIT_RUNTIME, "logits: cannot write '%s'", out);
        goto cleanup;
    }
    printf("{\"n_tokens\":%zu,\"n_vocab\":%d,\"adapter\":%s%s%s}\n", n, hp->n_vocab, adapter ? "\"" : "",
           adapter ? adapter : "null", adapter ? "\"" : "");
    fflush(stdout);

cleanup:
    if (f && fclose(f) != 0 && rc == IE_EXIT_OK)
        rc = ie_cli_fail(IE_EXIT_RUNTIME, "logits: cannot write '%s'", out);
    free(ids);
    free(logits);
    ie_engine_destroy(&eng);
    return rc;
}
