/* coordinator_main.c — `ie-coordinator`: the coordinator process of the
 * distributed service (docs/OPERATIONS.md). It loads the tokenizer and the
 * model's shape (not its weights), waits for ie-worker processes to
 * register, assigns them shards, and serves clients over ZeroMQ and, with
 * --http-port, the OpenAI-compatible HTTP API (docs/HTTP.md).
 *
 *   ie-coordinator --model PATH --plan tensor --workers 2 \
 *                  --bind tcp://0.0.0.0:5555 --client-bind tcp://127.0.0.1:5556
 *   ie-coordinator --config /etc/clocher/coordinator.conf
 *
 * Exit codes: 0 stopped by a signal, 2 bad usage, 3 model unreadable,
 * 1 other failures.
 */
#include "ie_cli.h"
#include "ie_clock.h"
#include "ie_cpulat.h"
#include "ie_embd.h"
#include "ie_engine.h"
#include "ie_lora_cache.h"
#include "ie_http.h"
#include "ie_metrics.h"
#include "ie_numa.h"
#include "ie_sdnotify.h"
#include "ie_serve.h"
#include "ie_transport.h"

#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t g_stop;

/* What an endpoint listens on, for the log: ie_sock_bind's connectable
 * form says 127.0.0.1 for a wildcard bind, which would read as "loopback
 * only"; show the wildcard with the port actually bound. */
static const char *listening(const char *requested, const char *bound, char *out, size_t cap)
{
    static const char *const k_wild[] = {"tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"};
    const char *port = strrchr(bound, ':');
    for (size_t i = 0; port && i < sizeof k_wild / sizeof k_wild[0]; i++)
        if (!strncmp(requested, k_wild[i], strlen(k_wild[i]))) {
            snprintf(out, cap, "%.*s%s (every interface)", (int)strlen(k_wild[i]) - 1, k_wild[i], port);
            return out;
        }
    return bound;
}

static void usage(FILE *f)
{
    fputs("usage: ie-coordinator --model PATH --workers N [options]\n"
          "  --config FILE            key = value lines (flags without --); flags win\n"
          "  --model PATH             model (tokenizer and shapes are read; weights stay with workers)\n"
          "  --plan pipeline|tensor   how the model is cut (tensor)\n"
          "  --workers N              workers in the plan (2)\n"
          "  --bind EP                endpoint workers connect to (tcp://127.0.0.1:5555)\n"
          "  --client-bind EP         endpoint clients connect to (tcp://127.0.0.1:5556)\n"
          "  --ctx N --batch N --max-batch N   KV positions, sequences together, tokens per step\n"
          "  --kv-block N --kv-blocks N        KV-cache blocks: positions per block (16), blocks in\n"
          "                                    the pool (0: batch * ceil(ctx / kv-block))\n"
          "  --no-prefix-cache        do not reuse the KV blocks of equal prompt prefixes\n"
          "  --cache-type-k T --cache-type-v T  KV cache types (f32, f16, bf16, q8, q4, fp8_e4m3,\n"
          "                                    fp8_e5m2; docs/KVCACHE.md), sent to every worker\n"
          "  --kv-rotate auto|on|off  Hadamard rotation of a quantized cache (auto: on)\n"
          "  --precision P            weights precision the workers use (native)\n"
          "  --queue N                waiting client requests at most (64)\n"
          "  --timeout-ms N           a request's time limit, queue included (0: none)\n"
          "  --retry-ms N             requests hit by a lost worker wait this long for a\n"
          "                           replacement and are recomputed (10000; 0: fail at once)\n"
          "  --heartbeat-ms N --dead-ms N      liveness (250 / 2000)\n"
          "  --metrics-port N --metrics-addr A Prometheus /metrics (off / 127.0.0.1)\n"
          "  --http-port N --http-addr A       OpenAI-compatible HTTP API, /metrics included\n"
          "                                    (off / 127.0.0.1; docs/HTTP.md)\n"
          "  --api-key KEY            the HTTP API requires 'Authorization: Bearer KEY' (env IE_API_KEY)\n"
          "  --step-timeout-ms N      a step not answered within N ms fails and its ranks are assigned\n"
          "                           again (30000)\n"
          "  --drain-ms N             on SIGTERM, refuse new requests and let running ones finish for\n"
          "                           up to N ms (30000)\n"
          "  --prefill-chunk N        prompt tokens per step at most while streams decode\n"
          "  --spec-ngram K           prompt-lookup speculative decoding for greedy requests: up to\n"
          "                           K drafts a step (0 off; 1..16)\n"
          "  --step-latency-ms N      a step with decoding streams lasts about N ms (0 off;\n"
          "                           default: 4 decode-only steps, measured)\n"
          "  --max-msg N              client (ZeroMQ) message bytes at most (1048576)\n"
          "  --max-body N             HTTP request body bytes at most, more is 413 (1048576)\n"
          "  --http-read-timeout-ms N --http-max-conns N --http-max-conns-per-addr N\n"
          "                           a connection's whole request within N ms (10000); open HTTP\n"
          "                           connections (1024) and per client address (256)\n"
          "  --cors-origin ORIGIN     let web pages of ORIGIN ('*': any) call the HTTP API (CORS; off)\n"
          "  --pooling P              /v1/embeddings: mean, last or cls of the hidden states (mean)\n"
          "  --embd-normalize N       ... then 2: L2-normalized, -1: as pooled (2)\n"
          "  --keys-dir DIR --key NAME          CURVE: this coordinator's key pair\n"
          "  --authorized DIR         CURVE: public keys allowed in: DIR/workers/*.pub may join as workers,\n"
          "                           DIR/clients/*.pub may use the client port (DIR/*.pub: workers)\n"
          "  --cpu-latency-us N       hold a PM QoS request: CPUs wake within N us (0: idle CPUs poll;\n"
          "                           needs /dev/cpu_dma_latency; env IE_CPU_LATENCY_US; docs/OPERATIONS.md)\n"
          "  --lora NAME=PATH         a LoRA adapter (repeatable): attached once every worker is ready, each\n"
          "                           worker reading PATH (or its --lora-dir) from its own disk; one refused\n"
          "                           (a worker's copy differs) is logged and left out, the base serves on\n"
          "  --lora-budget-mb MB      LoRA weights held at most (0: no limit)\n"
          "  --verbose\n",
          f);
}

int main(int argc, char **argv)
{
    int rc = 0, c;
    char err[512];
    int ac = 0;
    char **av = NULL;
    const char *model = NULL, *bind = "tcp://127.0.0.1:5555", *client_bind = "tcp://127.0.0.1:5556";
    const char *metrics_addr = "127.0.0.1", *keys_dir = NULL, *key_name = NULL, *authorized = NULL;
    long workers = 2, ctx = 0, batch = 4, max_batch = 256, queue = 64, hb = 250, dead = 2000, metrics_port = 0;
    long retry_ms = 10000, timeout_ms = 0, http_port = 0, step_timeout_ms = 30000, drain_ms = 30000;
    long prefill_chunk = 0, spec_ngram = 0, step_lat = -1, max_msg = 1 << 20, max_body = 1 << 20, read_ms = 0,
         conns = 0, conns_addr = 0;
    const char *http_addr = "127.0.0.1", *api_key = NULL, *cpulat = NULL, *cors = NULL, *pooling_s = "mean";
    long embd_norm = 2;
    char *model_name = NULL;
    ie_http_t *http = NULL;
    long kv_block = 0, kv_blocks = 0;
    ie_kv_type_t kv_k = IE_KV_F32, kv_v = IE_KV_F32;
    ie_kv_rotate_t kv_rot = IE_KV_ROTATE_AUTO;
    int prefix_cache = 1;
    ie_shard_kind_t plan = IE_SHARD_TENSOR;
    ie_precision_t prec = IE_PREC_NATIVE;
    int verbose = 0;
    ie_net_t *net = NULL;
    ie_sock_t *client = NULL;
    ie_metrics_t *metrics = NULL;
    ie_metrics_server_t *msrv = NULL;
    ie_engine_t *eng = NULL;
    ie_sched_t *sched = NULL;
    ie_status_t st = IE_OK;

    if (ie_cli_config_expand(argc, argv, &ac, &av, err, sizeof err) != 0) {
        return ie_cli_fail(IE_EXIT_USAGE, "%s", err);
    }
    enum { O_WORKERS = 1, O_BIND, O_CBIND, O_HB, O_DEAD, O_HELP, O_RETRY, O_HPORT, O_HADDR, O_STEP_TMO };
    static const struct option lo[] = {{"workers", required_argument, 0, O_WORKERS},
                                       {"bind", required_argument, 0, O_BIND},
                                       {"client-bind", required_argument, 0, O_CBIND},
                                       {"heartbeat-ms", required_argument, 0, O_HB},
                                       {"dead-ms", required_argument, 0, O_DEAD},
                                       {"help", no_argument, 0, O_HELP},
                                       {"retry-ms", required_argument, 0, O_RETRY},
                                       {"http-port", required_argument, 0, O_HPORT},
                                       {"http-addr", required_argument, 0, O_HADDR},
                                       {"step-timeout-ms", required_argument, 0, O_STEP_TMO},
                                       {0, 0, 0, 0}};
    const char *plan_s = NULL;
    ie_cli_loras_t loras = {0};
    const char *lora_budget = NULL;
    const ie_cli_pick_t picks[] = {IE_CLI_PICK(IE_FLAG_MODEL, &model),
                                   IE_CLI_PICK(IE_FLAG_PLAN, &plan_s),
                                   IE_CLI_PICK(IE_FLAG_CTX, &ctx),
                                   IE_CLI_PICK_RANGE(IE_FLAG_BATCH, &batch, 1, 64),
                                   IE_CLI_PICK(IE_FLAG_MAX_BATCH, &max_batch),
                                   IE_CLI_PICK(IE_FLAG_PRECISION, &prec),
                                   IE_CLI_PICK(IE_FLAG_QUEUE, &queue),
                                   IE_CLI_PICK(IE_FLAG_METRICS_PORT, &metrics_port),
                                   IE_CLI_PICK(IE_FLAG_METRICS_ADDR, &metrics_addr),
                                   IE_CLI_PICK(IE_FLAG_KEYS_DIR, &keys_dir),
                                   IE_CLI_PICK(IE_FLAG_KEY, &key_name),
                                   IE_CLI_PICK(IE_FLAG_AUTHORIZED, &authorized),
                                   IE_CLI_PICK(IE_FLAG_VERBOSE, &verbose),
                                   IE_CLI_PICK(IE_FLAG_KV_BLOCK, &kv_block),
                                   IE_CLI_PICK(IE_FLAG_KV_BLOCKS, &kv_blocks),
                                   IE_CLI_PICK(IE_FLAG_NO_PREFIX, &prefix_cache),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_K, &kv_k),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_V, &kv_v),
                                   IE_CLI_PICK(IE_FLAG_KV_ROTATE, &kv_rot),
                                   IE_CLI_PICK_RANGE(IE_FLAG_TIMEOUT_MS, &timeout_ms, 0, 86400000),
                                   IE_CLI_PICK(IE_FLAG_API_KEY, &api_key),
                                   IE_CLI_PICK(IE_FLAG_CPU_LATENCY, &cpulat),
                                   IE_CLI_PICK(IE_FLAG_DRAIN_MS, &drain_ms),
                                   IE_CLI_PICK(IE_FLAG_PREFILL_CHUNK, &prefill_chunk),
                                   IE_CLI_PICK(IE_FLAG_SPEC_NGRAM, &spec_ngram),
                                   IE_CLI_PICK(IE_FLAG_STEP_LATENCY, &step_lat),
                                   IE_CLI_PICK(IE_FLAG_MAX_MSG, &max_msg),
                                   IE_CLI_PICK(IE_FLAG_MAX_BODY, &max_body),
                                   IE_CLI_PICK(IE_FLAG_HTTP_READ_MS, &read_ms),
                                   IE_CLI_PICK(IE_FLAG_HTTP_CONNS, &conns),
                                   IE_CLI_PICK(IE_FLAG_HTTP_PER_ADDR, &conns_addr),

                                   IE_CLI_PICK(IE_FLAG_CORS_ORIGIN, &cors),
                                   IE_CLI_PICK(IE_FLAG_POOLING, &pooling_s),
                                   IE_CLI_PICK(IE_FLAG_EMBD_NORM, &embd_norm),
                                   IE_CLI_PICK(IE_FLAG_LORA, &loras),
                                   IE_CLI_PICK(IE_FLAG_LORA_BUDGET, &lora_budget)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, ac, av, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        int bad = 0;
        switch (c) {
        case IE_CLI_ENGINE: /* the coordinator's --plan is a kind; --workers gives the count */
            if (fl.last == IE_FLAG_PLAN) bad = ie_shard_kind_parse(plan_s, &plan) != IE_OK || plan == IE_SHARD_NONE;
            break;
        case IE_CLI_BAD: bad = 1; break;
        case O_WORKERS: bad = ie_cli_parse_long(optarg, 1, 64, &workers); break;
        case O_BIND: bind = optarg; break;
        case O_CBIND: client_bind = optarg; break;
        case O_HB: bad = ie_cli_parse_long(optarg, 10, 60000, &hb); break;
        case O_DEAD: bad = ie_cli_parse_long(optarg, 50, 600000, &dead); break;
        case O_RETRY: bad = ie_cli_parse_long(optarg, 0, 3600000, &retry_ms); break;
        case O_HPORT: bad = ie_cli_parse_long(optarg, 0, 65535, &http_port); break;
        case O_HADDR: http_addr = optarg; break;
        case O_STEP_TMO: bad = ie_cli_parse_long(optarg, 100, 3600000, &step_timeout_ms); break;
        case O_HELP: usage(stdout); goto cleanup;
        default:
            rc = ie_cli_fail(IE_EXIT_USAGE, "unknown or incomplete option '%s' (see --help)", av[optind - 1]);
            goto cleanup;
        }
        if (bad) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for %s%s", optarg, av[optind - 2 >= 0 ? optind - 2 : 0],
                             ie_cli_flag_hint(&fl, c));
            goto cleanup;
        }
    }
    if (optind < ac || !model) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "--model is required (see --help)");
        goto cleanup;
    }
    if (ie_pooling_parse(pooling_s) == IE_POOL_NONE || (embd_norm != 2 && embd_norm != -1)) {
        rc = ie_cli_fail(IE_EXIT_USAGE,
                         "bad --pooling '%s' or --embd-normalize %ld (expected mean, last or cls; 2 or -1)",
                         pooling_s, embd_norm);
        goto cleanup;
    }
    if (!!keys_dir != !!key_name) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "CURVE needs --keys-dir and --key together");
        goto cleanup;
    }
    if (ie_cpulat_apply(cpulat, "ie-coordinator") != IE_OK) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", ie_error_last());
        goto cleanup;
    }
    ie_cli_stop_on_signals(&g_stop);

    if ((st = ie_net_new(&net)) != IE_OK) goto fail;
    if (keys_dir && (st = ie_net_curve_from_dir(net, keys_dir, key_name, authorized)) != IE_OK) goto fail;
    if ((st = ie_metrics_new(&metrics)) != IE_OK) goto fail;
    if (metrics_port > 0 && (st = ie_metrics_serve(metrics, metrics_addr, (int)metrics_port, &msrv)) != IE_OK)
        goto fail;
    {
        ie_topo_t t;
        char d[256] = "unknown";
        if (ie_topo_read(&t) == IE_OK) ie_topo_describe(&t, d, sizeof d);
        ie_log("ie-coordinator: topology %s\n", d);
    }
    ie_engine_opts_t eo;
    ie_engine_opts_default(&eo);
    eo.model_path = model;
    eo.n_ctx = (int)ctx;
    eo.n_seq = (int)batch;
    eo.max_batch = (int)max_batch;
    eo.precision = prec;
    eo.kv_block = (int)kv_block;
    eo.kv_blocks = (int)kv_blocks;
    eo.kv_type_k = kv_k;
    eo.kv_type_v = kv_v;
    eo.kv_rotate = kv_rot;
    eo.prefix_cache = prefix_cache;
    eo.plan = plan;
    eo.n_workers = (int)workers;
    eo.cluster_bind = bind;
    eo.cluster_wait_ms = -1; /* serve (with "unavailable" answers) while workers join */
    eo.heartbeat_ms = (int)hb;
    eo.dead_ms = (int)dead;
    eo.step_timeout_ms = (int)step_timeout_ms;
    eo.net = net;
    eo.metrics = metrics;
    if (lora_budget) { /* MB, a decimal */
        char *end = NULL;
        double mb = strtod(lora_budget, &end);
        if (end == lora_budget || *end || !(mb >= 0 && mb <= 1e9)) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for --lora-budget-mb", lora_budget);
            goto cleanup;
        }
        eo.lora_budget_bytes = (uint64_t)(mb * 1048576.0);
    }
    if ((st = ie_engine_open(&eo, &eng)) != IE_OK) goto fail;
    for (int i = 0; i < loras.n; i++) /* read here first: a bad file fails the start */
        if ((st = ie_engine_lora_load(eng, loras.name[i], loras.path[i], 1.0f)) != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_MODEL, "lora %s: %s", loras.name[i],
                             ie_error_last());
            goto cleanup;
        }
    if (loras.n > 0) { /* every rank checks its copy: attach once they are all here */
        ie_backend_t *be = ie_engine_backend(eng);
        ie_log("ie-coordinator: waiting for %ld workers to attach %d LoRA adapter(s)\n", workers, loras.n);
        while (!g_stop && !ie_backend_upkeep(be, 100)) {}
        for (int i = 0; i < loras.n && !g_stop; i++) {
            /* attached at once (ie_engine_lora_find leases it), so that a
             * rank's refusal shows here, not at the first request: a refused
             * adapter is dropped, the base serves */
            if (ie_engine_lora_find(eng, loras.name[i]) >= 0) {
                ie_log("ie-coordinator: LoRA %s attached (%s)\n", loras.name[i], loras.path[i]);
                continue;
            }
            ie_log("ie-coordinator: error: LoRA %s not attached: %s\n", loras.name[i], ie_error_last());
            ie_lora_cache_unload(ie_engine_lora_cache(eng), loras.name[i], NULL);
        }
    }
    if ((st = ie_sock_new(net, IE_SOCK_ROUTER, &client)) != IE_OK) goto fail;
    if ((st = ie_sock_set_max_msg(client, max_msg)) != IE_OK) goto fail;
    if ((st = ie_sock_watch_peers(client, IE_SERVE_CLIENT_HEARTBEAT_MS)) != IE_OK) goto fail;
    if ((st = ie_sock_set_role(client, IE_ROLE_CLIENT)) != IE_OK) goto fail; /* worker keys are no clients */
    char cep[300];
    if ((st = ie_sock_bind(client, client_bind, cep, sizeof cep)) != IE_OK) goto fail;
    ie_backend_stats_t bs;
    ie_backend_stats(ie_engine_backend(eng), &bs);
    char wshow[320], cshow[320];
    ie_log("ie-coordinator: %s plan, %ld workers; workers at %s, clients at %s%s\n", ie_shard_kind_name(plan),
           workers, listening(bind, bs.endpoint, wshow, sizeof wshow),
           listening(client_bind, cep, cshow, sizeof cshow), keys_dir ? " (CURVE)" : "");
    if (msrv)
        ie_log("ie-coordinator: metrics at http://%s:%d/metrics\n", metrics_addr, ie_metrics_server_port(msrv));
    ie_sd_ready("accepting clients; waiting for workers");
    ie_sched_opts_t scho;
    ie_engine_sched_opts(eng, &scho);
    scho.queue_max = (int)queue;
    scho.retry_ms = (int)retry_ms;
    scho.prefill_chunk = (int)prefill_chunk;
    scho.spec_ngram = (int)spec_ngram;
    scho.step_latency_ms = step_lat < 0 ? 0 : step_lat == 0 ? -1 : (double)step_lat; /* flag 0 = off */
    scho.metrics = metrics;
    if ((st = ie_sched_new(&scho, &sched)) != IE_OK) goto fail;
    ie_serve_opts_t so = {.engine = eng,
                          .sched = sched,
                          .sock = client,
                          .stop = &g_stop,
                          .metrics = metrics,
                          .request_timeout_ms = (int)timeout_ms,
                          .drain_ms = (int)drain_ms,
                          .verbose = verbose};
    if (http_port > 0) {
        ie_http_opts_t ho = {.engine = eng,
                             .sched = sched,
                             .addr = http_addr,
                             .port = (int)http_port,
                             .api_key = api_key ? api_key : getenv("IE_API_KEY"),
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
        if (ho.api_key && !*ho.api_key) ho.api_key = NULL;
        if (!(model_name = ie_cli_base_name(model))) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto fail;
        }
        ho.model_name = model_name;
        if ((st = ie_http_start(&ho, &http)) != IE_OK) { /* not the model's fault: exit 1 (2 for a bad address) */
            rc = ie_cli_fail(st == IE_ERR_INVAL ? IE_EXIT_USAGE : IE_EXIT_RUNTIME, "%s", ie_error_last());
            goto cleanup;
        }
        ie_log("ie-coordinator: HTTP API at http://%s:%d/v1\n", http_addr, ie_http_port(http));
    }
    st = ie_serve_run(&so);
    ie_sd_stopping();
    if (st != IE_OK) goto fail;
    goto cleanup;
fail:
    rc = ie_cli_fail(st == IE_ERR_INVAL                          ? IE_EXIT_USAGE
                     : ie_cli_exit_for_load(st) == IE_EXIT_MODEL ? IE_EXIT_MODEL
                                                                 : IE_EXIT_RUNTIME,
                     "%s", ie_error_last());
cleanup:
    ie_http_stop(&http); /* before the scheduler: its requests are cancelled there */
    ie_sched_destroy(&sched);
    ie_sock_destroy(&client);
    ie_engine_destroy(&eng);
    ie_metrics_server_stop(&msrv);
    ie_metrics_destroy(&metrics);
    ie_net_destroy(&net);
    ie_cli_config_free(ac, av);
    free(model_name);
    return rc;
}
