/* cli_embed.c — the `embed` subcommand: one embedding per stdin line.
 *
 * Each non-empty line of stdin is one input (tokenized as a prompt is:
 * BOS, special-token text); every input goes through the scheduler as an
 * embedding request (ie_sched_req_t.pooling), as /v1/embeddings sends it,
 * and one JSON line per input comes out in input order:
 * {"index": i, "tokens": n, "embedding": [...]} or, for a line that cannot
 * be embedded (empty, too long, not UTF-8), {"index": i, "error": "..."}.
 */
#include "ie_cli.h"
#include "ie_cli_flags.h"
#include "ie_embd.h"
#include "ie_engine.h"
#include "ie_sched.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fputs(
        "usage: inference-engine embed --model PATH [options] < lines\n"
        "  Prints one JSON line per stdin line: {\"index\", \"tokens\", \"embedding\"} or {\"index\", \"error\"}.\n"
        "  --model PATH          GGUF file, IEBIN or Hugging Face directory\n"
        "  --pooling P           mean, last or cls of the final-norm hidden states (mean)\n"
        "  --embd-normalize N    2: L2-normalized, -1: as pooled (2)\n"
        "  --threads N           compute threads (online CPUs)\n"
        "  --batch N             inputs computed together (8)\n"
        "  --ctx N               positions per input at most (min(train, 4096))\n"
        "  --precision P         weights: native, f32, bf16, f16, int8w, int4w (native)\n"
        "  --plan P              none, pipeline:N or tensor:N in-process workers (env IE_PLAN)\n"
        "  --no-pin              do not pin threads to cores\n",
        f);
}

/* One input's outcome, filled by the scheduler's callback. */
typedef struct out {
    int done;
    float *vec;
    size_t tokens;
    char error[256];
} out_t;

static int g_dim;

static void on_event(void *ctx, const ie_sched_event_t *ev)
{
    out_t *o = ctx;
    if (ev->kind == IE_SCHED_TOKEN) return;
    o->done = 1;
    o->tokens = ev->n_prompt;
    if (ev->kind == IE_SCHED_DONE && ev->embd && ev->n_embd == g_dim && (o->vec = malloc((size_t)g_dim * 4)))
        memcpy(o->vec, ev->embd, (size_t)g_dim * sizeof *o->vec);
    else snprintf(o->error, sizeof o->error, "%s", ev->message ? ev->message : "no vector (out of memory)");
}

static void print_out(size_t i, const out_t *o, int norm)
{
    cJSON *js = cJSON_CreateObject();
    cJSON_AddNumberToObject(js, "index", (double)i);
    if (o->vec) {
        ie_embd_normalize(o->vec, g_dim, norm);
        cJSON_AddNumberToObject(js, "tokens", (double)o->tokens);
        cJSON *a = cJSON_AddArrayToObject(js, "embedding");
        for (int j = 0; a && j < g_dim; j++) cJSON_AddItemToArray(a, cJSON_CreateNumber(o->vec[j]));
    } else {
        cJSON_AddStringToObject(js, "error", o->error[0] ? o->error : "not embedded");
    }
    char *s = cJSON_PrintUnformatted(js);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(js);
}

/* Contract (ie_cli.h): the embed mode; returns the process exit code. */
int ie_cli_embed(int argc, char **argv)
{
    enum { O_HELP = 256 };
    static const struct option lo[] = {{"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    const char *model = NULL, *plan = NULL, *pooling_s = "mean";
    long embd_norm = 2, threads = sysconf(_SC_NPROCESSORS_ONLN), batch = 8, ctx = 0;
    int pin = 1, rc = IE_EXIT_OK, c;
    ie_precision_t prec = IE_PREC_NATIVE;
    ie_engine_t *eng = NULL;
    ie_sched_t *sched = NULL;
    ie_status_t st = IE_OK;
    char *line = NULL;
    size_t line_cap = 0, n_in = 0, cap = 0;
    out_t *outs = NULL;
    int32_t **ids = NULL;
    size_t *n_ids = NULL;

    if (threads < 1) threads = 1;
    const ie_cli_pick_t picks[] = {
        IE_CLI_PICK(IE_FLAG_MODEL, &model),        IE_CLI_PICK(IE_FLAG_THREADS, &threads),
        IE_CLI_PICK(IE_FLAG_BATCH, &batch),        IE_CLI_PICK(IE_FLAG_CTX, &ctx),
        IE_CLI_PICK(IE_FLAG_PRECISION, &prec),     IE_CLI_PICK(IE_FLAG_PLAN, &plan),
        IE_CLI_PICK(IE_FLAG_NO_PIN, &pin),         IE_CLI_PICK(IE_FLAG_POOLING, &pooling_s),
        IE_CLI_PICK(IE_FLAG_EMBD_NORM, &embd_norm)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, argc, argv, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        if (c == IE_CLI_ENGINE) continue;
        if (c == O_HELP) {
            usage(stdout);
            goto cleanup;
        }
        if (c == IE_CLI_BAD) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for --%s%s", optarg, ie_cli_flag_name(&fl, c),
                             ie_cli_flag_hint(&fl, c));
            goto cleanup;
        }
        rc = ie_cli_fail(IE_EXIT_USAGE, "unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
        goto cleanup;
    }
    if (optind < argc || !model) {
        rc = ie_cli_fail(IE_EXIT_USAGE, optind < argc ? "unexpected argument '%s'" : "--model is required%s",
                         optind < argc ? argv[optind] : " (see --help)");
        goto cleanup;
    }
    const ie_pooling_t pooling = ie_pooling_parse(pooling_s);
    if (pooling == IE_POOL_NONE || (embd_norm != 2 && embd_norm != -1)) {
        rc = ie_cli_fail(IE_EXIT_USAGE,
                         "bad --pooling '%s' or --embd-normalize %ld (expected mean, last or cls; 2 or -1)",
                         pooling_s, embd_norm);
        goto cleanup;
    }
    ie_engine_opts_t eo;
    ie_engine_opts_default(&eo);
    eo.model_path = model;
    eo.n_threads = (int)threads;
    eo.pin_threads = pin;
    eo.n_seq = (int)batch;
    eo.n_ctx = (int)ctx;
    eo.precision = prec;
    if (ie_cli_plan(plan, &eo) != 0) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "bad plan '%s' (none, pipeline:N or tensor:N)",
                         plan ? plan : getenv("IE_PLAN"));
        goto cleanup;
    }
    if ((st = ie_engine_open(&eo, &eng)) != IE_OK) {
        rc = ie_cli_fail(ie_cli_exit_for_load(st), "%s", ie_error_last());
        goto cleanup;
    }
    const ie_backend_geom_t *g = ie_backend_geom(ie_engine_backend(eng));
    const ie_tokenizer_t *tok = ie_engine_tokenizer(eng);
    g_dim = g->n_embd;
    ie_sched_opts_t so;
    ie_engine_sched_opts(eng, &so);
    if ((st = ie_sched_new(&so, &sched)) != IE_OK) goto fail;

    /* read and tokenize every line first: the outcomes print in order */
    ssize_t len;
    while ((len = getline(&line, &line_cap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (n_in == cap) {
            size_t nc = cap ? cap * 2 : 64;
            out_t *o2 = realloc(outs, nc * sizeof *o2);
            if (o2) outs = o2;
            int32_t **i2 = o2 ? realloc(ids, nc * sizeof *i2) : NULL;
            if (i2) ids = i2;
            size_t *n2 = i2 ? realloc(n_ids, nc * sizeof *n2) : NULL;
            if (!n2) {
                st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                goto fail;
            }
            n_ids = n2;
            cap = nc;
        }
        out_t *o = &outs[n_in];
        memset(o, 0, sizeof *o);
        ids[n_in] = NULL;
        n_ids[n_in] = 0;
        if (len == 0 || memchr(line, 0, (size_t)len)) {
            snprintf(o->error, sizeof o->error, "%s", len ? "the line holds a NUL byte" : "the line is empty");
        } else if (ie_tokenizer_encode(tok, line, (size_t)len, IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL,
                                       &ids[n_in], &n_ids[n_in]) != IE_OK) {
            snprintf(o->error, sizeof o->error, "%s", ie_error_last());
        }
        n_in++;
    }
    /* submit as the queue takes them, stepping the scheduler meanwhile */
    size_t next = 0, n_done = 0;
    for (;;) {
        for (; next < n_in; next++) {
            if (!ids[next]) continue;
            ie_gen_params_t gp;
            ie_gen_params_default(&gp);
            ie_sched_req_t r = {.ids = ids[next],
                                .n_ids = n_ids[next],
                                .params = &gp,
                                .cb = on_event,
                                .cb_ctx = &outs[next],
                                .pooling = pooling};
            ie_status_t sst = ie_sched_submit(sched, &r, NULL);
            if (sst == IE_ERR_BUSY) break;
            if (sst != IE_OK) snprintf(outs[next].error, sizeof outs[next].error, "%s", ie_error_last());
        }
        int busy = 0;
        if ((st = ie_sched_step(sched, &busy)) != IE_OK) goto fail;
        for (; n_done < n_in && (!ids[n_done] || outs[n_done].done || outs[n_done].error[0]); n_done++)
            print_out(n_done, &outs[n_done], (int)embd_norm);
        if (n_done == n_in) break;
    }
    goto cleanup;
fail:
    rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s", ie_error_last());
cleanup:
    ie_sched_destroy(&sched);
    ie_engine_destroy(&eng);
    for (size_t i = 0; i < n_in; i++) {
        free(ids[i]);
        free(outs[i].vec);
    }
    free(ids);
    free(n_ids);
    free(outs);
    free(line);
    return rc;
}
