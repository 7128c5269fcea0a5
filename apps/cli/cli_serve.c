/* cli_serve.c — `inference-engine serve`: the embedded engine as an
 * OpenAI-compatible HTTP server (docs/HTTP.md).
 *
 *   inference-engine serve --model PATH [--host 127.0.0.1] [--port 8080]
 *                          [--api-key KEY] [--batch 8] [--queue 64] ...
 *
 * One process: the engine (n_seq = --batch sequence slots), the scheduler,
 * the HTTP API on libmicrohttpd's threads and, with --zmq-bind, the ZeroMQ
 * client endpoint of the distributed service, all fed into one serving
 * loop (ie_serve_run) on the main thread until SIGINT/SIGTERM. When the
 * server listens it writes one line to stderr, "listening on
 * http://HOST:PORT" (the real port when --port 0 picked one).
 */
#include "ie_cli.h"
#include "ie_embd.h"
#include "ie_engine.h"
#include "ie_http.h"
#include "ie_metrics.h"
#include "ie_sched.h"
#include "ie_serve.h"
#include "ie_transport.h"

#include <getopt.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;

static void usage(FILE *f)
{
    fputs("usage: inference-engine serve --model PATH [options]\n"
          "  --model PATH          GGUF file, IEBIN or Hugging Face directory\n"
          "  --host ADDR           listen address, an IP literal or localhost (127.0.0.1)\n"
          "  --port N              TCP port; 0 picks a free one (8080)\n"
          "  --api-key KEY         require 'Authorization: Bearer KEY' on /v1/ (env IE_API_KEY)\n"
          "  --cors-origin ORIGIN  let web pages of ORIGIN ('*': any) call the API (CORS; off)\n"
          "  --model-name NAME     the model's id in the API (the model file's base name)\n"
          "  --pooling P           /v1/embeddings: mean, last or cls of the positions' final-norm\n"
          "                        hidden states (mean)\n"
          "  --embd-normalize N    ... then 2: L2-normalized, -1: as pooled (2)\n"
          "  --threads N           compute threads (online CPUs)\n"
          "  --batch N             sequence slots: requests decoded together (8)\n"
          "  --max-batch N         tokens per engine step at most (256)\n"
          "  --ctx N               KV positions per sequence (min(train, 4096))\n"
          "  --kv-block N          positions per KV-cache block (16)\n"
          "  --kv-blocks N         KV-cache blocks in the pool (0: batch * ceil(ctx / kv-block))\n"
          "  --kv-mem-mb N         without --kv-blocks: the pool is the blocks N MiB hold in the cache types\n"
          "                        (a plan: N MiB a worker)\n"
          "  --no-prefix-cache     do not reuse the KV blocks of equal prompt prefixes\n"
          "  --kv-swa-full         sliding-window layers keep the whole context (default: a ring of their\n"
          "                        window; the prefix cache then skips such models)\n"
          "  --lora NAME=PATH      load a LoRA adapter (pinned), repeatable; a request's \"model\": NAME runs it\n"
          "  --lora-budget-mb N    LoRA weights held at most; least recently used unpinned ones are evicted\n"
          "  --queue N             waiting requests at most; more are answered 429 (64)\n"
          "  --timeout-ms N        per-request limit, 504 after it (0: none)\n"
          "  --max-body N          request body bytes at most, more is 413 (1048576)\n"
          "  --max-msg N           ZeroMQ request message bytes at most; a larger frame drops its\n"
          "                        connection (1048576)\n"
          "  --http-read-timeout-ms N  a connection's whole request must arrive within N ms (10000)\n"
          "  --http-max-conns N    open HTTP connections at most (1024)\n"
          "  --http-max-conns-per-addr N  ... from one client address (256)\n"
          "  --prefill-chunk N     prompt tokens per step at most while streams decode\n"
          "  --spec-ngram K        prompt-lookup speculative decoding for greedy requests: up to\n"
          "                        K drafts a step (0 off; 1..16)\n"
          "  --step-latency-ms N   a step with decoding streams lasts about N ms (0 off;\n"
          "                        default: 4 decode-only steps, measured)\n"
          "  --drain-ms N          on SIGTERM, refuse new requests and let running ones finish\n"
          "                        for up to N ms (30000)\n"
          "  --precision P         weights: native, f32, bf16, f16, int8w, int4w (native)\n"
          "  --plan P              none, pipeline:N or tensor:N in-process workers (env IE_PLAN)\n"
          "  --zmq-bind EP         also serve ZeroMQ clients (docs/PROTOCOL.md) on EP\n"
          "  --no-pin              do not pin threads to cores\n"
          "  --verbose             one log line per HTTP request\n",
          f);
}

/* Contract (ie_cli.h): the serve mode; returns the process exit code. */
int ie_cli_serve(int argc, char **argv)
{
    enum { O_HOST = 256, O_PORT, O_NAME, O_ZMQ, O_HELP };
    static const struct option lo[] = {{"host", required_argument, 0, O_HOST},
                                       {"port", required_argument, 0, O_PORT},
                                       {"model-name", required_argument, 0, O_NAME},
                                       {"zmq-bind", required_argument, 0, O_ZMQ},
                                       {"help", no_argument, 0, O_HELP},
                                       {0, 0, 0, 0}};
    const char *model = NULL, *host = "127.0.0.1", *api_key = NULL, *model_name = NULL, *plan = NULL,
               *zmq_bind = NULL, *cors = NULL, *pooling_s = "mean";
    long embd_norm = 2;
    long port = 8080, threads = sysconf(_SC_NPROCESSORS_ONLN), batch = 8, max_batch = 256, ctx = 0, queue = 64,
         timeout_ms = 0, max_body = 1 << 20, kv_block = 0, kv_blocks = 0, max_msg = 1 << 20, drain_ms = 30000,
         prefill_chunk = 0, spec_ngram = 0, read_ms = 0, conns = 0, conns_addr = 0, step_lat = -1, kv_mem_mb = 0;
    int pin = 1, verbose = 0, prefix_cache = 1, swa_full = 0, rc = IE_EXIT_OK, c;
    ie_precision_t prec = IE_PREC_NATIVE;
    ie_kv_type_t kv_k = IE_KV_F32, kv_v = IE_KV_F32;
    ie_kv_rotate_t kv_rot = IE_KV_ROTATE_AUTO;
    char *default_name = NULL;
    ie_metrics_t *metrics = NULL;
    ie_net_t *net = NULL;
    ie_sock_t *sock = NULL;
    ie_engine_t *eng = NULL;
    ie_sched_t *sched = NULL;
    ie_http_t *http = NULL;
    ie_status_t st = IE_OK;
    ie_cli_loras_t loras = {0};
    const char *lora_budget = NULL;
    int no_adapter;

    if (threads < 1) threads = 1;
    const ie_cli_pick_t picks[] = {IE_CLI_PICK(IE_FLAG_MODEL, &model),
                                   IE_CLI_PICK(IE_FLAG_API_KEY, &api_key),
                                   IE_CLI_PICK(IE_FLAG_CORS_ORIGIN, &cors),
                                   IE_CLI_PICK(IE_FLAG_POOLING, &pooling_s),
                                   IE_CLI_PICK(IE_FLAG_EMBD_NORM, &embd_norm),
                                   IE_CLI_PICK(IE_FLAG_THREADS, &threads),
                                   IE_CLI_PICK(IE_FLAG_BATCH, &batch),
                                   IE_CLI_PICK(IE_FLAG_MAX_BATCH, &max_batch),
                                   IE_CLI_PICK(IE_FLAG_CTX, &ctx),
                                   IE_CLI_PICK(IE_FLAG_QUEUE, &queue),
                                   IE_CLI_PICK(IE_FLAG_TIMEOUT_MS, &timeout_ms),
                                   IE_CLI_PICK(IE_FLAG_PRECISION, &prec),
                                   IE_CLI_PICK(IE_FLAG_PLAN, &plan),
                                   IE_CLI_PICK(IE_FLAG_NO_PIN, &pin),
                                   IE_CLI_PICK(IE_FLAG_VERBOSE, &verbose),
                                   IE_CLI_PICK(IE_FLAG_KV_BLOCK, &kv_block),
                                   IE_CLI_PICK(IE_FLAG_KV_BLOCKS, &kv_blocks),
                                   IE_CLI_PICK(IE_FLAG_KV_MEM_MB, &kv_mem_mb),
                                   IE_CLI_PICK(IE_FLAG_NO_PREFIX, &prefix_cache),
                                   IE_CLI_PICK(IE_FLAG_KV_SWA_FULL, &swa_full),
                                   IE_CLI_PICK(IE_FLAG_MAX_BODY, &max_body),
                                   IE_CLI_PICK(IE_FLAG_MAX_MSG, &max_msg),
                                   IE_CLI_PICK(IE_FLAG_DRAIN_MS, &drain_ms),
                                   IE_CLI_PICK(IE_FLAG_PREFILL_CHUNK, &prefill_chunk),
                                   IE_CLI_PICK(IE_FLAG_SPEC_NGRAM, &spec_ngram),
                                   IE_CLI_PICK(IE_FLAG_STEP_LATENCY, &step_lat),
                                   IE_CLI_PICK(IE_FLAG_HTTP_READ_MS, &read_ms),
                                   IE_CLI_PICK(IE_FLAG_HTTP_CONNS, &conns),
                                   IE_CLI_PICK(IE_FLAG_HTTP_PER_ADDR, &conns_addr),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_K, &kv_k),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_V, &kv_v),
                                   IE_CLI_PICK(IE_FLAG_KV_ROTATE, &kv_rot),

                                   IE_CLI_PICK(IE_FLAG_LORA, &loras),
                                   IE_CLI_PICK(IE_FLAG_LORA_BUDGET, &lora_budget)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, argc, argv, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        int bad = 0;
        switch (c) {
        case IE_CLI_ENGINE: break;
        case IE_CLI_BAD: bad = 1; break;
        case O_HOST: host = optarg; break;
        case O_PORT: bad = ie_cli_parse_long(optarg, 0, 65535, &port); break;
        case O_NAME:
            model_name = optarg;
            bad = !*optarg;
            break;
        case O_ZMQ: zmq_bind = optarg; break;
        case O_HELP: usage(stdout); goto cleanup;
        default:
            rc = ie_cli_fail(IE_EXIT_USAGE, "unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
            goto cleanup;
        }
        if (bad) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for --%s%s", optarg, ie_cli_flag_name(&fl, c),
                             ie_cli_flag_hint(&fl, c));
            goto cleanup;
        }
    }
    if (optind < argc) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
        goto cleanup;
    }
    if (!model) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "--model is required (see --help)");
        goto cleanup;
    }
    if (ie_pooling_parse(pooling_s) == IE_POOL_NONE || (embd_norm != 2 && embd_norm != -1)) {
        rc = ie_cli_fail(IE_EXIT_USAGE,
                         "bad --pooling '%s' or --embd-normalize %ld (expected mean, last or cls; 2 or -1)",
                         pooling_s, embd_norm);
        goto cleanup;
    }
    if (!api_key) {
        const char *env = getenv("IE_API_KEY");
        if (env && *env) api_key = env;
    }
    if (!model_name) {
        if (!(default_name = ie_cli_base_name(model))) {
            rc = ie_cli_fail(IE_EXIT_NOMEM, "out of memory");
            goto cleanup;
        }
        model_name = default_name;
    }

    ie_engine_opts_t eo;
    ie_engine_opts_default(&eo);
    eo.model_path = model;
    eo.n_threads = (int)threads;
    eo.pin_threads = pin;
    eo.n_seq = (int)batch;
    eo.max_batch = (int)max_batch;
    eo.n_ctx = (int)ctx;
    eo.precision = prec;
    eo.kv_block = (int)kv_block;
    eo.kv_blocks = (int)kv_blocks;
    eo.kv_mem_mb = kv_mem_mb;
    eo.kv_type_k = kv_k;
    eo.kv_type_v = kv_v;
    eo.kv_rotate = kv_rot;
    eo.prefix_cache = prefix_cache;
    eo.kv_swa_full = swa_full;
    if (ie_cli_lora_budget(lora_budget, &eo.lora_budget_bytes) != 0) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for --lora-budget-mb (MB, a decimal >= 0)", lora_budget);
        goto cleanup;
    }
    if (ie_cli_plan(plan, &eo) != 0) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "bad plan '%s' (none, pipeline:N or tensor:N)",
                         plan ? plan : getenv("IE_PLAN"));
        goto cleanup;
    }
    ie_cli_stop_on_signals(&g_stop);

    if ((st = ie_metrics_new(&metrics)) != IE_OK) goto fail;
    if (zmq_bind) { /* the engine's workers (a plan) share the client socket's context */
        if ((st = ie_net_new(&net)) != IE_OK) goto fail;
        eo.net = net;
    }
    eo.metrics = metrics;
    if ((st = ie_engine_open(&eo, &eng)) != IE_OK) {
        rc = ie_cli_fail(ie_cli_exit_for_load(st), "%s", ie_error_last());
        goto cleanup;
    }
    if ((rc = ie_cli_lora_setup(eng, "serve", &loras, NULL, &no_adapter)) != 0) goto cleanup;
    ie_sched_opts_t so;
    ie_engine_sched_opts(eng, &so);
    so.queue_max = (int)queue;
    so.prefill_chunk = (int)prefill_chunk;
    so.spec_ngram = (int)spec_ngram;
    so.step_latency_ms = step_lat < 0 ? 0 : step_lat == 0 ? -1 : (double)step_lat; /* flag 0 = off */
    so.metrics = metrics;
    if ((st = ie_sched_new(&so, &sched)) != IE_OK) goto fail;
    if (zmq_bind) {
        char ep[300];
        if ((st = ie_sock_new(net, IE_SOCK_ROUTER, &sock)) != IE_OK) goto fail;
        if ((st = ie_sock_set_max_msg(sock, max_msg)) != IE_OK) goto fail;
        if ((st = ie_sock_watch_peers(sock, IE_SERVE_CLIENT_HEARTBEAT_MS)) != IE_OK) goto fail;
        if ((st = ie_sock_bind(sock, zmq_bind, ep, sizeof ep)) != IE_OK) goto fail;
        fprintf(stderr, "serve: ZeroMQ clients at %s\n", ep);
    }
    ie_http_opts_t ho = {.engine = eng,
                         .sched = sched,
                         .addr = host,
                         .port = (int)port,
                         .api_key = api_key,
                         .model_name = model_name,
                         .metrics = metrics,
                         .request_timeout_ms = (int)timeout_ms,
                         .max_body = (int)max_body,
                         .read_timeout_ms = (int)read_ms,
                         .max_conns = (int)conns,
                         .max_conns_per_addr = (int)conns_addr,
                         .verbose = verbose,
                         .cors_origin = cors,
                         .pooling = ie_pooling_parse(pooling_s),
                         .embd_norm = (int)embd_norm};
    if ((st = ie_http_start(&ho, &http)) != IE_OK) goto fail;
    int v6 = strchr(host, ':') != NULL;
    fprintf(stderr, "listening on http://%s%s%s:%d\n", v6 ? "[" : "", host, v6 ? "]" : "", ie_http_port(http));
    fflush(stderr);

    ie_serve_opts_t sv;
    memset(&sv, 0, sizeof sv);
    sv.engine = eng;
    sv.sched = sched;
    sv.sock = sock;
    sv.request_timeout_ms = (int)timeout_ms;
    sv.stop = &g_stop;
    sv.drain_ms = (int)drain_ms;
    sv.metrics = metrics;
    sv.verbose = verbose;
    if ((st = ie_serve_run(&sv)) != IE_OK) goto fail;
    goto cleanup;
fail:
    rc = ie_cli_fail(st == IE_ERR_INVAL   ? IE_EXIT_USAGE
                     : st == IE_ERR_NOMEM ? IE_EXIT_NOMEM
                                          : IE_EXIT_RUNTIME,
                     "%s", ie_error_last());
cleanup:
    /* the server first (its requests are cancelled), then the scheduler
     * (which ends what is left and drops the requests' last references) */
    ie_http_stop(&http);
    ie_sched_destroy(&sched);
    ie_sock_destroy(&sock);
    ie_engine_destroy(&eng);
    ie_net_destroy(&net);
    ie_metrics_destroy(&metrics);
    free(default_name);
    return rc;
}
