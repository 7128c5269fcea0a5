/* cli_run.c — the default `inference-engine` mode: generate and report.
 *
 * Prints exactly one JSON line on stdout; everything else goes to stderr.
 * --warmup N runs the whole workload N times unmeasured first; --rounds R
 * measures it R times and reports the aggregate (tokens summed, latency
 * percentiles over every token of every round, text of the last round).
 * --chat renders a conversation with the model's chat template (ie_chat.h)
 * and feeds its ids; for harmony models the output is split into channels.
 */
#include "ie_chat.h"
#include "ie_clock.h"
#include "ie_cli.h"
#include "ie_proc.h"
#include "ie_mmap.h"
#include "ie_engine.h"
#include "ie_harmony.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fputs("usage: inference-engine --model PATH (--prompt TEXT | --prompts-file FILE | --chat JSON) [options]\n"
          "       inference-engine tokenize|perplexity|logits ... (see docs/CLI.md)\n"
          "options:\n"
          "  --model PATH, --model-dir DIR  GGUF file or Hugging Face directory\n"
          "  --prompt TEXT                  one prompt\n"
          "  --prompts-file FILE            one prompt per line (with --lora, \"@NAME text\" runs\n"
          "                                 adapter NAME, \"@base text\" the base model)\n"
          "  --lora NAME=PATH               load a LoRA adapter (PEFT dir or GGUF; repeatable)\n"
          "  --adapter NAME                 run the prompts with adapter NAME\n"
          "  --chat JSON|@FILE              messages [{\"role\",\"content\"},...], chat template applied\n"
          "  --reasoning low|medium|high    harmony models' reasoning effort (medium)\n"
          "  --show-prompt                  with --chat: add the rendered prompt and its ids to the JSON\n"
          "  --max-new N                    tokens to generate per prompt (128)\n"
          "  --threads N                    compute threads (online CPUs)\n"
          "  --batch N                      prompts decoded together (1)\n"
          "  --ctx N                        KV positions per sequence (min(train, 4096))\n"
          "  --kv-block N                   positions per KV-cache block (16)\n"
          "  --kv-blocks N                  KV-cache blocks in the pool (0: batch * ceil(ctx / kv-block))\n"
          "  --no-prefix-cache              do not reuse the KV blocks of equal prompt prefixes\n"
          "  --warmup N / --rounds N        unmeasured / measured repetitions (0 / 1)\n"
          "  --greedy                       arg max decoding\n"
          "  --temperature T --top-k K --top-p P --min-p P\n"
          "  --repeat-penalty R --frequency-penalty F --presence-penalty P\n"
          "  --seed S                       sampling seed (random if absent)\n"
          "  --stop STR                     stop string (repeatable)\n"
          "  --precision P                  weights: native (as stored; GGUF Q8_0/Q4_0/Q4_1, bf16,\n"
          "                                 f16 repacked losslessly into row panels), f32, bf16,\n"
          "                                 f16, or int8w / int4w (quantized at load, group 32;\n"
          "                                 env IE_QUANT_GROUP, IE_QUANT_AFFINE=1)\n"
          "  --no-special                   do not add BOS/EOS or parse special tokens\n"
          "  --print-text                   also write the generated text to stderr\n"
          "  --no-pin                       do not pin threads to cores\n"
          "  --plan none|pipeline:N|tensor:N  run the model on N in-process workers over the\n"
          "                                 cluster protocol (env IE_PLAN; docs/OPERATIONS.md)\n"
          "environment:\n"
          "  IE_HOT_REPLICATE=1             threads on several NUMA nodes: a copy of the output\n"
          "                                 head and embeddings in each node's memory (JSON\n"
          "                                 hot_replicas, hot_repl); IE_HOT_REPL_LIMIT_MB caps all\n"
          "                                 copies (1024)\n",
          f);
}

int ie_cli_plan(const char *spec, ie_engine_opts_t *eo)
{
    if (!spec) spec = getenv("IE_PLAN");
    if (!spec || !*spec) return ie_engine_opts_plan(eo, "none") == IE_OK ? 0 : -1;
    return ie_engine_opts_plan(eo, spec) == IE_OK ? 0 : -1;
}

static int parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *v, size_t n, double p)
{
    if (n == 0) return 0.0;
    qsort(v, n, sizeof *v, cmp_double);
    double r = p * (double)(n - 1);
    size_t i = (size_t)r;
    double f = r - (double)i;
    return i + 1 < n ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}


/* With --lora: each prompt's adapter id in *out (malloc'd; NULL without
 * --lora): --adapter's (aid, -1 the base), or NAME for a prompt that
 * starts with "@NAME " where NAME is a --lora name or "base" (the prefix
 * is removed from the prompt). 0, or the exit code after the message. */
static int prompt_adapters(ie_engine_t *eng, const ie_cli_loras_t *l, int aid, char **prompts, size_t n,
                           int32_t **out)
{
    *out = NULL;
    if (l->n == 0) return 0;
    int32_t *a = malloc((n ? n : 1) * sizeof *a);
    if (!a) return ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
    for (size_t i = 0; i < n; i++) {
        a[i] = aid;
        char *p = prompts[i], *sp = p[0] == '@' ? strchr(p, ' ') : NULL;
        if (!sp || sp - p - 1 >= 64) continue;
        char name[64];
        memcpy(name, p + 1, (size_t)(sp - p - 1));
        name[sp - p - 1] = '\0';
        const int id = ie_engine_lora_find(eng, name);
        if (id < 0 && strcmp(name, "base") != 0) continue; /* not a prefix: the text itself */
        a[i] = id;
        memmove(p, sp + 1, strlen(sp + 1) + 1);
    }
    *out = a;
    return 0;
}

/* Read one prompt per line (trailing \r\n stripped, empty lines skipped).
 * Caller frees each line and the array. */
static int read_prompts(const char *path, char ***out, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char **v = NULL, *line = NULL;
    size_t n = 0, cap = 0, lcap = 0;
    ssize_t len;
    int rc = 0;
    errno = 0;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = -1;
                break;
            }
            v = nv;
        }
        if (!(v[n] = strdup(line))) {
            rc = -1;
            break;
        }
        n++;
    }
    if (ferror(f)) rc = -1;
    free(line);
    fclose(f);
    if (rc != 0) {
        for (size_t i = 0; i < n; i++) free(v[i]);
        free(v);
        if (!errno) errno = ENOMEM;
        return -1;
    }
    *out = v;
    *n_out = n;
    return 0;
}

int ie_cli_run(int argc, char **argv)
{
    enum {
        O_PROMPT = 256,
        O_PFILE,
        O_MAXNEW,
        O_WARMUP,
        O_ROUNDS,
        O_GREEDY,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_REP,
        O_FREQ,
        O_PRES,
        O_SEED,
        O_STOP,
        O_NOSPECIAL,
        O_PRINT,
        O_HELP,
        O_CHAT,
        O_REASONING,
        O_SHOWPROMPT
    };
    static const struct option lo[] = {{"prompt", required_argument, 0, O_PROMPT},
                                       {"prompts-file", required_argument, 0, O_PFILE},
                                       {"max-new", required_argument, 0, O_MAXNEW},
                                       {"warmup", required_argument, 0, O_WARMUP},
                                       {"rounds", required_argument, 0, O_ROUNDS},
                                       {"greedy", no_argument, 0, O_GREEDY},
                                       {"temperature", required_argument, 0, O_TEMP},
                                       {"top-k", required_argument, 0, O_TOPK},
                                       {"top-p", required_argument, 0, O_TOPP},
                                       {"min-p", required_argument, 0, O_MINP},
                                       {"repeat-penalty", required_argument, 0, O_REP},
                                       {"frequency-penalty", required_argument, 0, O_FREQ},
                                       {"presence-penalty", required_argument, 0, O_PRES},
                                       {"seed", required_argument, 0, O_SEED},
                                       {"stop", required_argument, 0, O_STOP},
                                       {"no-special", no_argument, 0, O_NOSPECIAL},
                                       {"print-text", no_argument, 0, O_PRINT},
                                       {"help", no_argument, 0, O_HELP},
                                       {"chat", required_argument, 0, O_CHAT},
                                       {"reasoning", required_argument, 0, O_REASONING},
                                       {"show-prompt", no_argument, 0, O_SHOWPROMPT},
                                       {0, 0, 0, 0}};

    const char *model = NULL, *prompt = NULL, *pfile = NULL, *chat = NULL;
    char *chat_json = NULL; /* --chat's JSON (owned: maybe read from a file) */
    int32_t *chat_ids = NULL;
    size_t n_chat_ids = 0;
    ie_chat_format_t chat_fmt = IE_CHAT_NONE;
    ie_chat_opts_t chat_opts = {0};
    int have_reasoning = 0, show_prompt = 0;
    char *chat_prompt = NULL;
    ie_harmony_parser_t *hp = NULL;
    long max_new = 128, threads = sysconf(_SC_NPROCESSORS_ONLN), batch = 1, ctx = 0, warmup = 0, rounds = 1;
    int greedy = 0, print_text = 0, special = 1, pin = 1, have_seed = 0, prefix_cache = 1;
    long kv_block = 0, kv_blocks = 0;
    const char *plan = NULL;
    ie_sampler_params_t sp = ie_sampler_params_default();
    sp.temperature = 0.8f; /* llama.cpp's defaults for an interactive CLI */
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;
    ie_precision_t prec = IE_PREC_NATIVE;
    const char **stops = NULL;
    size_t n_stop = 0;
    char **prompts = NULL;
    size_t n_prompts = 0;
    int rc = IE_EXIT_OK, c;
    long lv;
    ie_engine_t *eng = NULL;
    ie_gen_result_t *res = NULL;
    double *lat = NULL;
    cJSON *js = NULL;
    char msg[600];
    ie_cli_loras_t loras = {0};
    const char *adapter = NULL;
    int aid = -1;
    int32_t *ads = NULL;

    if (threads < 1) threads = 1;
    const ie_cli_pick_t picks[] = {
        IE_CLI_PICK(IE_FLAG_MODEL, &model),         IE_CLI_PICK(IE_FLAG_THREADS, &threads),
        IE_CLI_PICK(IE_FLAG_BATCH, &batch),         IE_CLI_PICK(IE_FLAG_CTX, &ctx),
        IE_CLI_PICK(IE_FLAG_PRECISION, &prec),      IE_CLI_PICK(IE_FLAG_NO_PIN, &pin),
        IE_CLI_PICK(IE_FLAG_PLAN, &plan),           IE_CLI_PICK(IE_FLAG_KV_BLOCK, &kv_block),
        IE_CLI_PICK(IE_FLAG_KV_BLOCKS, &kv_blocks), IE_CLI_PICK(IE_FLAG_NO_PREFIX, &prefix_cache),
        IE_CLI_PICK(IE_FLAG_LORA, &loras),          IE_CLI_PICK(IE_FLAG_ADAPTER, &adapter)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, argc, argv, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        int bad = 0;
        switch (c) {
        case IE_CLI_ENGINE: break;
        case IE_CLI_BAD: bad = 1; break;
        case O_PROMPT: prompt = optarg; break;
        case O_PFILE: pfile = optarg; break;
        case O_CHAT: chat = optarg; break;
        case O_SHOWPROMPT: show_prompt = 1; break;
        case O_REASONING:
            bad = ie_harmony_effort_parse(optarg, &chat_opts.effort) != IE_OK;
            have_reasoning = 1;
            break;
        case O_MAXNEW: bad = ie_cli_parse_long(optarg, 0, 1 << 24, &max_new); break;
        case O_WARMUP: bad = ie_cli_parse_long(optarg, 0, 1000, &warmup); break;
        case O_ROUNDS: bad = ie_cli_parse_long(optarg, 1, 1000, &rounds); break;
        case O_GREEDY: greedy = 1; break;
        case O_TEMP: bad = parse_float(optarg, &sp.temperature); break;
        case O_TOPK:
            bad = ie_cli_parse_long(optarg, 0, 1 << 30, &lv);
            sp.top_k = (int32_t)lv;
            break;
        case O_TOPP: bad = parse_float(optarg, &sp.top_p); break;
        case O_MINP: bad = parse_float(optarg, &sp.min_p); break;
        case O_REP: bad = parse_float(optarg, &sp.repeat_penalty); break;
        case O_FREQ: bad = parse_float(optarg, &sp.frequency_penalty); break;
        case O_PRES: bad = parse_float(optarg, &sp.presence_penalty); break;
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            bad = errno || end == optarg || *end || optarg[0] == '-';
            sp.seed = s;
            have_seed = 1;
            break;
        }
        case O_STOP: {
            const char **ns = realloc(stops, (n_stop + 1) * sizeof *ns);
            if (!ns) {
                rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
                goto cleanup;
            }
            stops = ns;
            stops[n_stop++] = optarg;
            break;
        }
        case O_NOSPECIAL: special = 0; break;
        case O_PRINT: print_text = 1; break;
        case O_HELP: usage(stdout); goto cleanup;
        default:
            snprintf(msg, sizeof msg, "unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
            goto cleanup;
        }
        if (bad) {
            snprintf(msg, sizeof msg, "bad value '%s' for --%s", optarg, ie_cli_flag_name(&fl, c));
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
            goto cleanup;
        }
    }
    if (optind < argc) {
        snprintf(msg, sizeof msg, "unexpected argument '%s'", argv[optind]);
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
        goto cleanup;
    }
    if (!model) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", "--model is required (see --help)");
        goto cleanup;
    }
    if (!!prompt + !!pfile + !!chat != 1) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s",
                         "give exactly one of --prompt, --prompts-file and --chat (see --help)");
        goto cleanup;
    }
    if ((have_reasoning || show_prompt) && !chat) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", "--reasoning and --show-prompt need --chat");
        goto cleanup;
    }
    if (chat && !special) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", "--no-special does not apply to --chat (the template decides)");
        goto cleanup;
    }
    sp.greedy = greedy;
    if (!have_seed) sp.seed = ie_sampler_seed_random();
    if (ie_sampler_params_validate(&sp) != IE_OK) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", ie_error_last());
        goto cleanup;
    }
    if (chat) {
        /* "@file" reads the JSON from a file; the syntax is checked now so
         * that a typo fails before the model loads */
        if (chat[0] == '@') {
            size_t chat_len;
            ie_status_t rst = ie_file_read("--chat", chat + 1, IE_CLI_MAX_TEXT, &chat_json, &chat_len);
            if (rst != IE_OK) {
                rc = ie_cli_fail(rst == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "%s", ie_error_last());
                goto cleanup;
            }
        } else if (!(chat_json = strdup(chat))) {
            rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
            goto cleanup;
        }
        cJSON *probe = cJSON_Parse(chat_json);
        if (!probe) {
            const char *at = cJSON_GetErrorPtr();
            snprintf(msg, sizeof msg, "--chat: invalid JSON at byte %ld",
                     at && at >= chat_json ? (long)(at - chat_json) : 0L);
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
            goto cleanup;
        }
        cJSON_Delete(probe);
        prompts = calloc(1, sizeof *prompts); /* the slot of the one "prompt"; ids come from the chat */
        if (!prompts || !(prompts[0] = strdup(""))) {
            free(prompts);
            prompts = NULL;
            rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
            goto cleanup;
        }
        n_prompts = 1;
    } else if (pfile) {
        if (read_prompts(pfile, &prompts, &n_prompts) != 0) {
            snprintf(msg, sizeof msg, "cannot read prompts file '%s': %s", pfile, strerror(errno));
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
            goto cleanup;
        }
        if (n_prompts == 0) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s", "prompts file has no prompts");
            goto cleanup;
        }
    } else {
        prompts = malloc(sizeof *prompts);
        if (!prompts || !(prompts[0] = strdup(prompt))) {
            free(prompts);
            prompts = NULL;
            rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
            goto cleanup;
        }
        n_prompts = 1;
    }

    ie_engine_opts_t eo;
    ie_engine_opts_default(&eo);
    eo.model_path = model;
    eo.n_threads = (int)threads;
    eo.pin_threads = pin;
    eo.n_seq = (int)(batch < (long)n_prompts ? batch : (long)n_prompts);
    eo.n_ctx = (int)ctx;
    eo.precision = prec;
    eo.kv_block = (int)kv_block;
    eo.kv_blocks = (int)kv_blocks;
    eo.prefix_cache = prefix_cache;
    if (ie_cli_plan(plan, &eo) != 0) {
        snprintf(msg, sizeof msg, "bad plan '%s' (none, pipeline:N or tensor:N)", plan ? plan : getenv("IE_PLAN"));
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
        goto cleanup;
    }
    ie_status_t st = ie_engine_open(&eo, &eng);
    if (st != IE_OK) {
        rc = ie_cli_fail(ie_cli_exit_for_load(st), "%s", ie_error_last());
        goto cleanup;
    }

    if ((rc = ie_cli_lora_setup(eng, "generate", &loras, adapter, &aid)) != 0) goto cleanup;
    if ((rc = prompt_adapters(eng, &loras, aid, prompts, n_prompts, &ads)) != 0) goto cleanup;

    if (chat) {
        const ie_tokenizer_t *tok = ie_engine_tokenizer(eng);
        chat_fmt = ie_chat_format(tok);
        st = ie_chat_encode(tok, chat_json, &chat_opts, &chat_ids, &n_chat_ids, &chat_prompt);
        if (st != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM      ? IE_EXIT_NOMEM
                             : st == IE_ERR_INTERNAL ? IE_EXIT_RUNTIME
                                                     : IE_EXIT_USAGE,
                             "%s", ie_error_last());
            goto cleanup;
        }
    }

    ie_gen_params_t gp;
    ie_gen_params_default(&gp);
    gp.max_new = (int)max_new;
    gp.sampling = sp;
    gp.stop = stops;
    gp.n_stop = n_stop;
    gp.add_special = special;
    gp.parse_special = special;
    gp.adapters = ads;

    res = calloc(n_prompts, sizeof *res);
    if (!res) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
        goto cleanup;
    }
    ie_gen_stats_t stats = {0};
    size_t tokens_in = 0, tokens_out = 0, n_lat = 0, lat_cap = 0;
    double wall = 0, ttft_sum = 0;
    for (long r = 0; r < warmup + rounds; r++) {
        int measured = r >= warmup;
        for (size_t i = 0; i < n_prompts; i++) ie_gen_result_clear(&res[i]);
        ie_gen_stats_t s = {0};
        double t0 = ie_now_s();
        if (chat) {
            const int32_t *one = chat_ids;
            st = ie_engine_generate_ids(eng, &one, &n_chat_ids, 1, &gp, res, &s);
        } else {
            st = ie_engine_generate_batch(eng, (const char *const *)prompts, n_prompts, &gp, res, &s);
        }
        double t1 = ie_now_s();
        if (st != IE_OK) {
            int code = st == IE_ERR_INVAL || st == IE_ERR_RANGE ? IE_EXIT_USAGE
                       : st == IE_ERR_NOMEM                     ? IE_EXIT_NOMEM
                                                                : IE_EXIT_RUNTIME;
            rc = ie_cli_fail(code, "%s", ie_error_last());
            goto cleanup;
        }
        if (!measured) continue;
        wall += t1 - t0;
        stats.prefill_ms += s.prefill_ms;
        stats.decode_ms += s.decode_ms;
        stats.prefill_tokens += s.prefill_tokens;
        stats.decode_tokens += s.decode_tokens;
        stats.prefix_hit_tokens += s.prefix_hit_tokens;
        stats.prefix_miss_tokens += s.prefix_miss_tokens;
        stats.preemptions += s.preemptions;
        for (size_t i = 0; i < n_prompts; i++) {
            tokens_in += res[i].n_prompt;
            tokens_out += res[i].n_gen;
            ttft_sum += res[i].ttft_ms;
            if (n_lat + res[i].n_lat > lat_cap) {
                lat_cap = (n_lat + res[i].n_lat) * 2;
                double *nl = realloc(lat, lat_cap * sizeof *nl);
                if (!nl) {
                    rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
                    goto cleanup;
                }
                lat = nl;
            }
            memcpy(lat + n_lat, res[i].lat_ms, res[i].n_lat * sizeof *lat);
            n_lat += res[i].n_lat;
        }
    }

    js = cJSON_CreateObject();
    cJSON_AddStringToObject(js, "model", model);
    cJSON_AddNumberToObject(js, "prompts", (double)n_prompts);
    {
        /* the adapters that ran, each once, in the order of --lora */
        cJSON *ja = cJSON_AddArrayToObject(js, "adapters");
        for (int k = 0; ja && k < loras.n; k++) {
            int used = 0, id = ie_engine_lora_find(eng, loras.name[k]);
            for (size_t i = 0; ads && i < n_prompts; i++) used |= ads[i] == id;
            if (used) cJSON_AddItemToArray(ja, cJSON_CreateString(loras.name[k]));
        }
    }
    cJSON_AddNumberToObject(js, "tokens_in", (double)tokens_in);
    cJSON_AddNumberToObject(js, "tokens_out", (double)tokens_out);
    cJSON_AddNumberToObject(js, "wall_s", wall);
    cJSON_AddNumberToObject(js, "tps", wall > 0 ? tokens_out / wall : 0);
    cJSON_AddNumberToObject(js, "prefill_tps",
                            stats.prefill_ms > 0 ? stats.prefill_tokens / (stats.prefill_ms / 1e3) : 0);
    cJSON_AddNumberToObject(js, "decode_tps",
                            stats.decode_ms > 0 ? stats.decode_tokens / (stats.decode_ms / 1e3) : 0);
    cJSON_AddNumberToObject(js, "ttft_ms", ttft_sum / (double)(n_prompts * rounds));
    double p50 = percentile(lat, n_lat, 0.50), p95 = percentile(lat, n_lat, 0.95);
    cJSON_AddNumberToObject(js, "latency_p50_ms", p50);
    cJSON_AddNumberToObject(js, "latency_p95_ms", p95);
    cJSON_AddNumberToObject(js, "kv_hits",
                            (double)stats.prefix_hit_tokens); /* prompt tokens from the prefix cache */
    cJSON_AddNumberToObject(js, "kv_misses", (double)stats.prefix_miss_tokens); /* prompt tokens computed */
    cJSON_AddNumberToObject(js, "preemptions", (double)stats.preemptions);
    cJSON_AddNumberToObject(js, "rss_peak_mb", ie_rss_peak_mb());
    cJSON_AddNumberToObject(js, "threads", (double)threads);
    cJSON_AddStringToObject(js, "precision", ie_precision_name(prec));
    ie_backend_stats_t bs;
    ie_backend_stats(ie_engine_backend(eng), &bs);
    cJSON_AddStringToObject(js, "isa", bs.isa);
    cJSON_AddNumberToObject(js, "batch", (double)eo.n_seq);
    if (bs.lookahead) { /* steps sent ahead on the scheduler's hint, used and dropped (a cluster's chained steps) */
        cJSON_AddNumberToObject(js, "lookahead_used", (double)bs.lookahead_used);
        cJSON_AddNumberToObject(js, "lookahead_dropped", (double)bs.lookahead_dropped);
    }
    /* per-node copies of the head and embeddings (IE_HOT_REPLICATE) */
    cJSON_AddNumberToObject(js, "hot_replicas", (double)bs.hot_replicas);
    if (bs.hot_report[0]) cJSON_AddStringToObject(js, "hot_repl", bs.hot_report);
    {
        char sb[24];
        snprintf(sb, sizeof sb, "%llu", (unsigned long long)sp.seed);
        cJSON_AddRawToObject(js, "seed", sb);
    } /* exact: a double loses 64-bit seeds */
    cJSON_AddNumberToObject(js, "rounds", (double)rounds);
    if (chat) cJSON_AddStringToObject(js, "chat_format", ie_chat_format_name(chat_fmt));
    if (show_prompt) {
        cJSON_AddStringToObject(js, "prompt", chat_prompt);
        cJSON *pids = cJSON_AddArrayToObject(js, "prompt_ids");
        for (size_t k = 0; k < n_chat_ids; k++) cJSON_AddItemToArray(pids, cJSON_CreateNumber(chat_ids[k]));
    }
    if (chat_fmt == IE_CHAT_HARMONY) {
        /* the engine's text hides control tokens, so channels come from the
         * ids; text is the answer (final channel) */
        const ie_tokenizer_t *tok = ie_engine_tokenizer(eng);
        st = ie_harmony_parser_new(tok, NULL, NULL, &hp);
        for (size_t k = 0; st == IE_OK && k < res[0].n_gen; k++)
            st = ie_harmony_parser_push_token(hp, res[0].ids[k]);
        if (st == IE_OK) st = ie_harmony_parser_finish(hp);
        if (st != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s", ie_error_last());
            goto cleanup;
        }
        free(res[0].text);
        res[0].text = strdup(ie_harmony_parser_text(hp, IE_HARMONY_CH_FINAL, NULL));
        if (!res[0].text) {
            rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
            goto cleanup;
        }
        cJSON *ch = cJSON_AddObjectToObject(js, "channels");
        cJSON_AddStringToObject(ch, "analysis", ie_harmony_parser_text(hp, IE_HARMONY_CH_ANALYSIS, NULL));
        cJSON_AddStringToObject(ch, "final", ie_harmony_parser_text(hp, IE_HARMONY_CH_FINAL, NULL));
    }
    if (n_prompts == 1) {
        cJSON_AddStringToObject(js, "text", res[0].text ? res[0].text : "");
        cJSON_AddStringToObject(js, "stop_reason", ie_finish_name(res[0].stop));
        cJSON *ids = cJSON_AddArrayToObject(js, "ids");
        for (size_t k = 0; k < res[0].n_gen; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(res[0].ids[k]));
    } else {
        cJSON *texts = cJSON_AddArrayToObject(js, "text");
        cJSON *reasons = cJSON_AddArrayToObject(js, "stop_reason");
        cJSON *ids = cJSON_AddArrayToObject(js, "ids");
        for (size_t i = 0; i < n_prompts; i++) {
            cJSON_AddItemToArray(texts, cJSON_CreateString(res[i].text ? res[i].text : ""));
            cJSON_AddItemToArray(reasons, cJSON_CreateString(ie_finish_name(res[i].stop)));
            cJSON *one = cJSON_CreateArray();
            for (size_t k = 0; k < res[i].n_gen; k++) cJSON_AddItemToArray(one, cJSON_CreateNumber(res[i].ids[k]));
            cJSON_AddItemToArray(ids, one);
        }
    }
    char *line = cJSON_PrintUnformatted(js);
    if (!line) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
        goto cleanup;
    }
    if (print_text)
        for (size_t i = 0; i < n_prompts; i++) fprintf(stderr, "%s\n", res[i].text ? res[i].text : "");
    printf("%s\n", line);
    fflush(stdout);
    free(line);

cleanup:
    cJSON_Delete(js);
    for (size_t i = 0; res && i < n_prompts; i++) ie_gen_result_clear(&res[i]);
    free(res);
    free(lat);
    ie_engine_destroy(&eng);
    for (size_t i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(ads);
    free(stops);
    free(chat_json);
    free(chat_ids);
    free(chat_prompt);
    ie_harmony_parser_destroy(&hp);
    return rc;
}
