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
#include "ie_lora_cache.h"
#include "ie_harmony.h"
#include "ie_grammar.h"
#include "ie_cli_batch.h"
#include "ie_dtype.h"
#include "ie_prof.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
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
          "  --prompts-file FILE            one prompt per line (env PROMPTS), streamed: a bad line is\n"
          "                                 reported in its place (errors), the others go on\n"
          "  --lora NAME=PATH               load a LoRA adapter (PEFT dir or GGUF; repeatable)\n"
          "  --adapter NAME[:W][,NAME[:W]]  run the prompts with an adapter (set: summed with weights W;\n"
          "                                 docs/LORA.md); a prompts file named *.jsonl gives each line's\n"
          "                                 own: {\"prompt\": str, \"adapter\": \"NAME[:W],...\"}\n"
          "  --prefetch N                   prompts tokenized ahead, the ring's depth (max(64, 4*batch))\n"
          "  --tokenize-threads N           threads tokenizing the prompts (2 for a file)\n"
          "  --aggregate                    one summary instead of per-prompt text/stop_reason/ids\n"
          "  --model-json F --model-bin F   an IEBIN pair (model.ie.json + model.ie.bin, one directory)\n"
          "  --pretranspose none|all        at load: use stored matrices as they are / pack into PANEL16\n"
          "  --device auto|cpu|cuda         cpu (auto); this build has no CUDA backend\n"
          "  --profile                      add each kernel class's share of the step time (profile)\n"
          "  --chat JSON|@FILE              messages [{\"role\",\"content\"},...], chat template applied\n"
          "  --reasoning low|medium|high    harmony models' reasoning effort (medium)\n"
          "  --chat-template-kwargs JSON    extra chat-template variables, e.g. {\"enable_thinking\":false}\n"
          "  --show-prompt                  with --chat: add the rendered prompt and its ids to the JSON\n"
          "  --max-new N                    tokens to generate per prompt (128)\n"
          "  --threads N                    compute threads (env THREADS; online CPUs)\n"
          "  --batch N                      prompts decoded together (env BATCH; 1)\n"
          "  --ctx N                        KV positions per sequence (min(train, 4096))\n"
          "  --kv-block N                   positions per KV-cache block (16)\n"
          "  --kv-blocks N                  KV-cache blocks in the pool (0: batch * ceil(ctx / kv-block))\n"
          "  --kv-mem-mb N                  without --kv-blocks: the pool is the blocks N MiB hold in the cache "
          "types\n"
          "                                 (a plan: N MiB a worker)\n"
          "  --no-prefix-cache              do not reuse the KV blocks of equal prompt prefixes\n"
          "  --kv-swa-full                  sliding-window layers keep the whole context (default: a ring of\n"
          "                                 their window; the prefix cache then skips such models)\n"
          "  --cache-type-k T / --cache-type-v T  KV cache storage: f32 (default), f16, bf16,\n"
          "                                 q8 (q8_0), q4 (q4_0), fp8_e4m3, fp8_e5m2 (docs/KVCACHE.md)\n"
          "  --kv-rotate auto|on|off        Hadamard rotation of K/V (auto: on for q8, q4, fp8)\n"
          "  --warmup N / --rounds N        unmeasured / measured repetitions (0 / env RUNS, 1)\n"
          "  --greedy                       arg max decoding\n"
          "  --temperature T --top-k K --top-p P --min-p P\n"
          "  --repeat-penalty R --frequency-penalty F --presence-penalty P\n"
          "  --seed S                       sampling seed (random if absent)\n"
          "  --logit-bias ID+B|ID-B         add B to token ID's logit (repeatable; -inf bans it)\n"
          "  --ignore-eos                   do not end at EOS / end-of-turn tokens: run to --max-new\n"
          "  --spec-ngram K                 prompt-lookup speculative decoding: greedy prompts feed up to K\n"
          "                                 tokens that followed their last tokens before (0 off; 1..16)\n"
          "  --json-schema JSON|@FILE       structured output: each answer an instance of the schema\n"
          "                                 (\"\" any JSON object; docs/HTTP.md lists the keywords)\n"
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
          "environment (flags win; docs/CLI.md): THREADS, BATCH, RUNS, PROMPTS, IE_PRECISION,\n"
          "  IE_REQUIRE_MODEL=1, IE_ACT_PREC=auto, AFFINITY=compact|scatter|none, IE_TP_USE_AFFINITY=0|1,\n"
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

/* ------------------------------------------------------------ latencies */

/* Per-token latencies for the percentiles in bounded memory: exact up to
 * LAT_EXACT values, then a log histogram (1 % wide buckets from 0.1 us):
 * a million-prompt run must not keep every token's latency. */
#define LAT_EXACT ((size_t)1 << 16)
#define LAT_BUCKETS 4096
#define LAT_BASE 1e-4
#define LAT_GROWTH 1.01
typedef struct lat_acc {
    double v[LAT_EXACT];
    size_t n;        /* values in v (exact mode) */
    uint64_t *hist;  /* non-NULL: histogram mode */
    uint64_t n_hist; /* values in hist           */
} lat_acc_t;

static int lat_bucket(double x)
{
    if (!(x > LAT_BASE)) return 0;
    double b = log(x / LAT_BASE) / log(LAT_GROWTH);
    return b >= LAT_BUCKETS - 1 ? LAT_BUCKETS - 1 : (int)b;
}

/* Add one latency; -1 when out of memory. */
static int lat_add(lat_acc_t *a, double x)
{
    if (!a->hist && a->n < LAT_EXACT) {
        a->v[a->n++] = x;
        return 0;
    }
    if (!a->hist) {
        if (!(a->hist = calloc(LAT_BUCKETS, sizeof *a->hist))) return -1;
        for (size_t i = 0; i < a->n; i++) a->hist[lat_bucket(a->v[i])]++;
        a->n_hist = a->n;
        a->n = 0;
    }
    a->hist[lat_bucket(x)]++;
    a->n_hist++;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The p-quantile (0..1): interpolated when exact, else the geometric middle
 * of its bucket (within 0.5 %). Sorts a->v. */
static double lat_percentile(lat_acc_t *a, double p)
{
    if (a->hist) {
        uint64_t rank = (uint64_t)(p * (double)(a->n_hist - 1)), seen = 0;
        for (int b = 0; b < LAT_BUCKETS; b++)
            if ((seen += a->hist[b]) > rank) return LAT_BASE * pow(LAT_GROWTH, b + 0.5);
        return 0.0;
    }
    if (a->n == 0) return 0.0;
    qsort(a->v, a->n, sizeof *a->v, cmp_double);
    double r = p * (double)(a->n - 1);
    size_t i = (size_t)r;
    double f = r - (double)i;
    return i + 1 < a->n ? a->v[i] * (1 - f) + a->v[i + 1] * f : a->v[i];
}

/* ---------------------------------------------------------------- spill */

/* A JSON array written element by element to a temporary file, so the
 * output line of a long prompts file is streamed, not held in memory. */
typedef struct spill {
    FILE *f;
    size_t n;
    int failed;
} spill_t;

static void spill_add(spill_t *s, const char *json)
{
    if (!s->f && !s->failed && !(s->f = tmpfile())) s->failed = 1;
    if (s->failed) return;
    if ((s->n++ && fputc(',', s->f) == EOF) || fputs(json, s->f) == EOF) s->failed = 1;
}

static void spill_add_item(spill_t *s, cJSON *item)
{
    char *j = item ? cJSON_PrintUnformatted(item) : NULL;
    if (!j) s->failed = 1;
    else spill_add(s, j);
    free(j);
    cJSON_Delete(item);
}

/* Write `,"key":[...]` (bare: the one element alone) to out; -1 on error. */
static int spill_emit(spill_t *s, const char *key, int bare, FILE *out)
{
    char buf[65536];
    size_t k;
    if (s->failed || (s->f && (fflush(s->f) != 0 || fseek(s->f, 0, SEEK_SET) != 0))) return -1;
    fprintf(out, ",\"%s\":%s", key, bare ? "" : "[");
    while (s->f && (k = fread(buf, 1, sizeof buf, s->f)) > 0)
        if (fwrite(buf, 1, k, out) != k) return -1;
    if (s->f && ferror(s->f)) return -1;
    if (!bare) fputc(']', out);
    return 0;
}

static void spill_close(spill_t *s)
{
    if (s->f) fclose(s->f);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------- environment */

/* The seeds' environment, read before the flags (so flags win). Each
 * variable is either honoured (its value becomes the default) or refused
 * with a message; 0, or an exit code after printing the error. */
typedef struct env_defaults {
    long threads, batch, rounds;
    ie_precision_t prec;
    const char *prompts_file;
    int require_model;
} env_defaults_t;

static int env_long(const char *name, long lo, long hi, long *out)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    if (ie_cli_parse_long(v, lo, hi, out) != 0)
        return ie_cli_fail(IE_EXIT_USAGE, "%s='%s' is not a number in %ld..%ld", name, v, lo, hi);
    return 0;
}

static int env_read(env_defaults_t *d, int plan_none)
{
    int rc;
    const char *v;
    if ((rc = env_long("THREADS", 1, 1024, &d->threads)) || (rc = env_long("BATCH", 1, 4096, &d->batch)) ||
        (rc = env_long("RUNS", 1, 1000, &d->rounds)))
        return rc;
    if ((v = getenv("IE_PRECISION")) && *v && ie_precision_parse(v, &d->prec) != IE_OK)
        return ie_cli_fail(IE_EXIT_USAGE,
                           "IE_PRECISION='%s' is not a precision (native, f32, bf16, f16, int8w, int4w)", v);
    if ((v = getenv("PROMPTS")) && *v) d->prompts_file = v;
    if ((v = getenv("IE_REQUIRE_MODEL")) && *v) {
        if (!strcmp(v, "1")) d->require_model = 1;
        else if (strcmp(v, "0") != 0) return ie_cli_fail(IE_EXIT_USAGE, "IE_REQUIRE_MODEL='%s': use 1 or 0", v);
        else
            return ie_cli_fail(IE_EXIT_USAGE, "%s",
                               "IE_REQUIRE_MODEL=0 is not supported: this engine has no model-less mode");
    }
    if ((v = getenv("IE_ACT_PREC")) && *v && strcmp(v, "auto") != 0)
        return ie_cli_fail(IE_EXIT_USAGE,
                           "IE_ACT_PREC='%s' is not supported: activations follow the weights' kernels "
                           "(f32, int8 for int8w/int4w and GGUF quants); only 'auto' is accepted",
                           v);
    if ((v = getenv("IE_TP_USE_AFFINITY")) && *v && strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return ie_cli_fail(IE_EXIT_USAGE, "IE_TP_USE_AFFINITY='%s': use 0 or 1", v);
    if ((v = getenv("IE_HOT_REPLICATE")) && *v && strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return ie_cli_fail(IE_EXIT_USAGE, "IE_HOT_REPLICATE='%s': use 0 or 1", v);
    if ((v = getenv("AFFINITY")) && *v && plan_none && strcmp(v, "none") && strcmp(v, "auto") &&
        strcmp(v, "compact") && strcmp(v, "scatter"))
        return ie_cli_fail(IE_EXIT_USAGE,
                           "AFFINITY='%s': the embedded thread pool takes compact, scatter, auto or none "
                           "(CPU lists are for plan workers)",
                           v);
    return 0;
}

/* ------------------------------------------------------------------ run */

/* A prompt between the ring and the output: submitted to the scheduler
 * (running), or done (result or error) and waiting for its turn. */
typedef struct slot {
    ie_cli_item_t it; /* st/err: the batcher's or the scheduler's failure */
    ie_gen_result_t r;
    int done;
    size_t *running; /* the round's count of prompts in the scheduler */
} slot_t;

/* The scheduler's events for one prompt: its result (or error) into the
 * slot. Tokens are not streamed here. */
static void on_event(void *ctx, const ie_sched_event_t *ev)
{
    slot_t *sl = ctx;
    ie_gen_result_t *r = &sl->r;
    if (ev->kind == IE_SCHED_TOKEN) return;
    sl->done = 1;
    (*sl->running)--;
    if (ev->kind == IE_SCHED_ERROR) {
        sl->it.st = ev->status != IE_OK ? ev->status : IE_ERR_INTERNAL;
        snprintf(sl->it.err, sizeof sl->it.err, "line %zu: %s", sl->it.line, ev->message ? ev->message : "failed");
        return;
    }
    r->text = strdup(ev->all_text);
    r->ids = malloc((ev->n_gen ? ev->n_gen : 1) * sizeof *r->ids);
    r->lat_ms = malloc((ev->n_lat ? ev->n_lat : 1) * sizeof *r->lat_ms);
    if (!r->text || !r->ids || !r->lat_ms) {
        ie_gen_result_clear(r);
        sl->it.st = IE_ERR_NOMEM;
        snprintf(sl->it.err, sizeof sl->it.err, "out of memory during generation");
        return;
    }
    if (ev->n_gen) memcpy(r->ids, ev->ids, ev->n_gen * sizeof *r->ids);
    if (ev->n_lat) memcpy(r->lat_ms, ev->lat_ms, ev->n_lat * sizeof *r->lat_ms);
    r->n_gen = ev->n_gen;
    r->n_lat = ev->n_lat;
    r->n_prompt = ev->n_prompt;
    r->stop = ev->finish;
    r->ttft_ms = ev->ttft_ms;
}

/* What one prompt's slot in the output says. */
static void emit_result(spill_t *texts, spill_t *reasons, spill_t *ids, const ie_gen_result_t *r, const char *why)
{
    spill_add_item(texts, cJSON_CreateString(r && r->text ? r->text : ""));
    spill_add_item(reasons, cJSON_CreateString(r ? ie_finish_name(r->stop) : why));
    cJSON *one = cJSON_CreateArray();
    for (size_t k = 0; r && one && k < r->n_gen; k++) cJSON_AddItemToArray(one, cJSON_CreateNumber(r->ids[k]));
    spill_add_item(ids, one);
}

#define RUN_MAX_SETS 64 /* distinct adapter sets the JSON line names */

/* A JSONL prompt's adapter set `spec`: attached (ie_cli_lora_attach; the
 * registry reuses an attached equal set), added to ran[] (the distinct
 * sets that ran) and its backend id returned. A bad set fails that prompt
 * alone (it->st IE_ERR_INVAL, it->err says why) and returns -2. */
static int prompt_adapter(ie_engine_t *eng, const char *spec, char ran[][128], int *n_ran, ie_cli_item_t *it)
{
    char why[200];
    int id = -1;
    if (ie_cli_lora_attach(eng, spec, &id, why, sizeof why) != 0) {
        it->st = IE_ERR_INVAL;
        snprintf(it->err, sizeof it->err, "line %zu: adapter '%.60s': %.120s", it->line, spec, why);
        return -2;
    }
    int known = 0;
    for (int i = 0; i < *n_ran && !known; i++) known = !strcmp(ran[i], spec);
    if (!known && *n_ran < RUN_MAX_SETS && strlen(spec) < 128) snprintf(ran[(*n_ran)++], 128, "%s", spec);
    return id;
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
        O_SHOWPROMPT,
        O_TMPLKW,
        O_PREFETCH,
        O_AGGREGATE,
        O_TOKTHREADS,
        O_MODEL_JSON,
        O_MODEL_BIN,
        O_PRETRANSPOSE,
        O_DEVICE,
        O_PROFILE,
        O_IGNORE_EOS,
        O_LOGIT_BIAS,
        O_JSON_SCHEMA
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
                                       {"chat-template-kwargs", required_argument, 0, O_TMPLKW},
                                       {"prefetch", required_argument, 0, O_PREFETCH},
                                       {"aggregate", no_argument, 0, O_AGGREGATE},
                                       {"tokenize-threads", required_argument, 0, O_TOKTHREADS},
                                       {"model-json", required_argument, 0, O_MODEL_JSON},
                                       {"model-bin", required_argument, 0, O_MODEL_BIN},
                                       {"pretranspose", required_argument, 0, O_PRETRANSPOSE},
                                       {"device", required_argument, 0, O_DEVICE},
                                       {"profile", no_argument, 0, O_PROFILE},
                                       {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
                                       {"logit-bias", required_argument, 0, O_LOGIT_BIAS},
                                       {"json-schema", required_argument, 0, O_JSON_SCHEMA},
                                       {0, 0, 0, 0}};

    const double t_start = ie_now_ms();
    const char *model = NULL, *prompt = NULL, *pfile = NULL, *chat = NULL;
    const char *model_json = NULL, *model_bin = NULL, *pretranspose = NULL, *device = "auto";
    char *model_dir = NULL; /* --model-json's directory (owned) */
    char *chat_json = NULL; /* --chat's JSON (owned: maybe read from a file) */
    int32_t *chat_ids = NULL;
    size_t n_chat_ids = 0;
    ie_chat_format_t chat_fmt = IE_CHAT_NONE;
    ie_chat_opts_t chat_opts = {0};
    int have_reasoning = 0, show_prompt = 0, aggregate = 0, profile = 0;
    char *chat_prompt = NULL;
    char *harmony_analysis = NULL;
    ie_harmony_parser_t *hp = NULL;
    env_defaults_t env = {.threads = sysconf(_SC_NPROCESSORS_ONLN),
                          .batch = 1,
                          .rounds = 1,
                          .prec = IE_PREC_NATIVE};
    long max_new = 128, ctx = 0, warmup = 0, prefetch = 0, tok_threads = 0;
    int greedy = 0, print_text = 0, special = 1, pin = 1, have_seed = 0, prefix_cache = 1, swa_full = 0;
    long kv_block = 0, kv_blocks = 0, kv_mem_mb = 0, spec_ngram = 0;
    uint64_t spec_drafted = 0, spec_accepted = 0;
    ie_kv_type_t kv_k = IE_KV_F32, kv_v = IE_KV_F32;
    ie_kv_rotate_t kv_rot = IE_KV_ROTATE_AUTO;
    const char *plan = NULL;
    ie_sampler_params_t sp = ie_sampler_params_default();
    sp.temperature = 0.8f; /* llama.cpp's defaults for an interactive CLI */
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;
    const char **stops = NULL;
    size_t n_stop = 0;
    const char *json_schema_arg = NULL; /* --json-schema JSON|@FILE */
    char *json_schema = NULL;           /* its text (owned) */
    ie_logit_bias_t *biases = NULL;     /* --logit-bias, in order */
    int32_t n_bias = 0;
    int ignore_eos = 0;
    int rc = IE_EXIT_OK, c;
    long lv;
    ie_engine_t *eng = NULL;
    ie_cli_batcher_t *bat = NULL;
    ie_sched_t *sched = NULL;
    ie_cli_loras_t loras = {0};
    const char *adapter = NULL;
    static char ran[RUN_MAX_SETS][128]; /* per-prompt adapter sets that ran (JSONL) */
    int n_ran = 0;
    int aid = -1;
    slot_t *slots = NULL;
    size_t W = 0, running = 0; /* running: function scope, the slots' callbacks count on it until cleanup */
    lat_acc_t *lat = NULL;
    spill_t sp_text = {0}, sp_reason = {0}, sp_ids = {0}, sp_err = {0};
    cJSON *js = NULL;
    char msg[600];

    {
        const char *pl = NULL; /* AFFINITY lists are for plan workers: peek at the plan */
        for (int i = 1; i + 1 < argc; i++)
            if (!strcmp(argv[i], "--plan")) pl = argv[i + 1];
        if (!pl) pl = getenv("IE_PLAN");
        if ((rc = env_read(&env, !pl || !*pl || !strcmp(pl, "none"))) != 0) return rc;
    }
    long threads = env.threads, batch = env.batch, rounds = env.rounds;
    ie_precision_t prec = env.prec;
    if (threads < 1) threads = 1;
    const ie_cli_pick_t picks[] = {IE_CLI_PICK(IE_FLAG_MODEL, &model),
                                   IE_CLI_PICK(IE_FLAG_THREADS, &threads),
                                   IE_CLI_PICK(IE_FLAG_BATCH, &batch),
                                   IE_CLI_PICK(IE_FLAG_CTX, &ctx),
                                   IE_CLI_PICK(IE_FLAG_PRECISION, &prec),
                                   IE_CLI_PICK(IE_FLAG_NO_PIN, &pin),
                                   IE_CLI_PICK(IE_FLAG_PLAN, &plan),
                                   IE_CLI_PICK(IE_FLAG_KV_BLOCK, &kv_block),
                                   IE_CLI_PICK(IE_FLAG_KV_BLOCKS, &kv_blocks),
                                   IE_CLI_PICK(IE_FLAG_NO_PREFIX, &prefix_cache),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_K, &kv_k),
                                   IE_CLI_PICK(IE_FLAG_CACHE_TYPE_V, &kv_v),
                                   IE_CLI_PICK(IE_FLAG_KV_ROTATE, &kv_rot),
                                   IE_CLI_PICK(IE_FLAG_KV_MEM_MB, &kv_mem_mb),
                                   IE_CLI_PICK(IE_FLAG_KV_SWA_FULL, &swa_full),
                                   IE_CLI_PICK(IE_FLAG_SPEC_NGRAM, &spec_ngram),

                                   IE_CLI_PICK(IE_FLAG_LORA, &loras),
                                   IE_CLI_PICK(IE_FLAG_ADAPTER, &adapter)};
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
        case O_TMPLKW: chat_opts.template_kwargs = optarg; break;
        case O_REASONING:
            bad = ie_harmony_effort_parse(optarg, &chat_opts.effort) != IE_OK;
            have_reasoning = 1;
            break;
        case O_MAXNEW: bad = ie_cli_parse_long(optarg, 0, 1 << 24, &max_new); break;
        case O_WARMUP: bad = ie_cli_parse_long(optarg, 0, 1000, &warmup); break;
        case O_ROUNDS: bad = ie_cli_parse_long(optarg, 1, 1000, &rounds); break;
        case O_PREFETCH: bad = ie_cli_parse_long(optarg, 1, 1 << 20, &prefetch); break;
        case O_TOKTHREADS: bad = ie_cli_parse_long(optarg, 1, 64, &tok_threads); break;
        case O_AGGREGATE: aggregate = 1; break;
        case O_PROFILE: profile = 1; break;
        case O_IGNORE_EOS: ignore_eos = 1; break;
        case O_JSON_SCHEMA: json_schema_arg = optarg; break;
        case O_LOGIT_BIAS: {
            ie_logit_bias_t *nb = realloc(biases, (size_t)(n_bias + 1) * sizeof *nb);
            if (!nb) {
                rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
                goto cleanup;
            }
            biases = nb;
            bad = ie_logit_bias_parse(optarg, &biases[n_bias++]) != IE_OK;
            break;
        }
        case O_MODEL_JSON: model_json = optarg; break;
        case O_MODEL_BIN: model_bin = optarg; break;
        case O_PRETRANSPOSE:
            pretranspose = optarg;
            bad = strcmp(optarg, "none") && strcmp(optarg, "woh") && strcmp(optarg, "wxh") && strcmp(optarg, "all");
            break;
        case O_DEVICE:
            device = optarg;
            bad = strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda");
            break;
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
            snprintf(msg, sizeof msg, "bad value '%s' for --%s%s", optarg, ie_cli_flag_name(&fl, c),
                     ie_cli_flag_hint(&fl, c));
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
            goto cleanup;
        }
    }
    if (optind < argc) {
        snprintf(msg, sizeof msg, "unexpected argument '%s'", argv[optind]);
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
        goto cleanup;
    }
    if (!pin) unsetenv("IE_TP_USE_AFFINITY"); /* --no-pin wins over the variable */
    {
        const char *a = getenv("AFFINITY"); /* none: the embedded pool does not pin */
        if (a && !strcmp(a, "none") && !(plan || (getenv("IE_PLAN") && *getenv("IE_PLAN")))) pin = 0;
    }
    if (pretranspose) {
        /* at run time the choice is whether stored matrices are packed
         * into PANEL16 at load (IE_REPACK); the per-class split exists
         * only at conversion (ie-convert --pretranspose) */
        if (!strcmp(pretranspose, "woh") || !strcmp(pretranspose, "wxh")) {
            rc = ie_cli_fail(IE_EXIT_USAGE,
                             "--pretranspose %s is a conversion choice (ie-convert --pretranspose); at run "
                             "time only 'all' (pack at load) and 'none' (use the stored layout) apply",
                             pretranspose);
            goto cleanup;
        }
        setenv("IE_REPACK", strcmp(pretranspose, "none") ? "1" : "0", 1);
    }
    if (model_json || model_bin) {
        if (model || !model_json || !model_bin) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s",
                             "--model-json and --model-bin go together, instead of --model (see --help)");
            goto cleanup;
        }
        /* an IEBIN pair is opened by its directory: the bin must be the
         * json's sibling model.ie.bin */
        const char *slash = strrchr(model_json, '/');
        size_t dl = slash ? (size_t)(slash - model_json) : 1;
        model_dir = slash ? strndup(model_json, dl ? dl : 1) : strdup(".");
        if (!model_dir) {
            rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
            goto cleanup;
        }
        char *rj = realpath(model_json, NULL), *rb = realpath(model_bin, NULL);
        int ok = rj && rb, sibling = 0;
        if (ok) {
            char *bs = strrchr(rb, '/'), *js_ = strrchr(rj, '/');
            sibling = bs && js_ && bs - rb == js_ - rj && !strncmp(rb, rj, (size_t)(bs - rb)) &&
                      !strcmp(bs + 1, "model.ie.bin") && !strcmp(js_ + 1, "model.ie.json");
        }
        free(rj);
        free(rb);
        if (!ok) {
            rc = ie_cli_fail(IE_EXIT_MODEL, "cannot read model '%s'",
                             access(model_json, R_OK) ? model_json : model_bin);
            goto cleanup;
        }
        if (!sibling) {
            rc =
                ie_cli_fail(IE_EXIT_USAGE, "%s",
                            "--model-json and --model-bin must be model.ie.json and model.ie.bin in one directory");
            goto cleanup;
        }
        model = model_dir;
    }
    if (!pfile && !prompt && !chat && env.prompts_file) pfile = env.prompts_file; /* PROMPTS */
    if (!model) {
        rc = env.require_model ? ie_cli_fail(IE_EXIT_MODEL, "%s", "no model given and IE_REQUIRE_MODEL=1")
                               : ie_cli_fail(IE_EXIT_USAGE, "%s", "--model is required (see --help)");
        goto cleanup;
    }
    if (!!prompt + !!pfile + !!chat != 1) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s",
                         "give exactly one of --prompt, --prompts-file and --chat (see --help)");
        goto cleanup;
    }
    if ((have_reasoning || show_prompt || chat_opts.template_kwargs) && !chat) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", "--reasoning, --show-prompt and --chat-template-kwargs need --chat");
        goto cleanup;
    }
    if (chat && !special) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", "--no-special does not apply to --chat (the template decides)");
        goto cleanup;
    }
    if (!strcmp(device, "cuda")) {
        rc = ie_cli_fail(IE_EXIT_ENGINE, "%s", "--device cuda: this build has no CUDA backend (use cpu or auto)");
        goto cleanup;
    }
    sp.greedy = greedy;
    sp.logit_bias = biases;
    sp.n_logit_bias = n_bias;
    if (!have_seed) sp.seed = ie_sampler_seed_random();
    if (ie_sampler_params_validate(&sp) != IE_OK) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", ie_error_last());
        goto cleanup;
    }
    if (json_schema_arg) { /* read and compiled now: a bad schema fails before the model loads */
        ie_grammar_t *gr = NULL;
        ie_status_t gst = IE_OK;
        if (json_schema_arg[0] == '@') {
            size_t len = 0;
            gst = ie_file_read("--json-schema", json_schema_arg + 1, IE_CLI_MAX_TEXT, &json_schema, &len);
        } else if (!(json_schema = strdup(json_schema_arg))) {
            gst = ie_error_set(IE_ERR_NOMEM, "out of memory");
        }
        if (gst == IE_OK) gst = ie_grammar_compile(json_schema, &gr);
        ie_grammar_destroy(&gr);
        if (gst != IE_OK) {
            rc = ie_cli_fail(gst == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "--json-schema: %s",
                             ie_error_last());
            goto cleanup;
        }
    }
    if (pfile && access(pfile, R_OK) != 0) { /* before the model loads */
        snprintf(msg, sizeof msg, "cannot read prompts file '%s': %s", pfile, strerror(errno));
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", msg);
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
    }

    ie_engine_opts_t eo;
    ie_engine_opts_default(&eo);
    eo.model_path = model;
    eo.n_threads = (int)threads;
    eo.pin_threads = pin;
    eo.n_seq = pfile ? (int)batch : 1; /* a file's length is not known up front */
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
    const double load_ms = ie_now_ms() - t_start;
    const ie_tokenizer_t *tok = ie_engine_tokenizer(eng);

    if (chat) {
        ie_engine_chat_opts(eng, &chat_opts);
        chat_fmt = ie_chat_format_for(tok, &chat_opts);
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
    gp.ignore_eos = ignore_eos;
    gp.json_schema = json_schema;
    for (int32_t i = 0; i < n_bias; i++) /* before any prompt runs: a bad id is the command's error */
        if (biases[i].id >= ie_backend_geom(ie_engine_backend(eng))->n_vocab) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "--logit-bias: token %d is outside the vocabulary (%d tokens)",
                             (int)biases[i].id, (int)ie_backend_geom(ie_engine_backend(eng))->n_vocab);
            goto cleanup;
        }

    const size_t B = (size_t)eo.n_seq;
    W = 4 * B + 16; /* prompts in the scheduler or done and not yet reported */
    slots = calloc(W, sizeof *slots);
    lat = calloc(1, sizeof *lat);
    if (!slots || !lat) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
        goto cleanup;
    }
    const size_t pl = pfile ? strlen(pfile) : 0;
    ie_cli_batch_opts_t bo = {.path = pfile,
                              .jsonl = pl > 6 && !strcmp(pfile + pl - 6, ".jsonl"),
                              .text = prompt,
                              .tok = tok,
                              .tok_flags = (special ? IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL : 0),
                              .max_tokens = (size_t)ie_backend_geom(ie_engine_backend(eng))->n_ctx,
                              .n_threads = (int)(tok_threads ? tok_threads
                                                 : pfile     ? 2
                                                             : 1),
                              .depth = (size_t)(prefetch           ? prefetch
                                                : (long)B * 4 > 64 ? (long)B * 4
                                                                   : 64)};

    ie_gen_stats_t stats = {0};
    size_t tokens_in = 0, tokens_out = 0, n_items = 0, n_failed = 0, n_ok_total = 0;
    size_t stop_counts[8] = {0};
    double wall = 0, ttft_sum = 0, queue_ms = 0, tokenize_ms = 0;
    int tok_used = 0;
    char first_err[256] = "";
    ie_status_t first_err_st = IE_OK;
    for (long r = 0; r < warmup + rounds; r++) {
        const int measured = r >= warmup, last = r == warmup + rounds - 1;
        ie_gen_stats_t s = {0};
        double qwait = 0;
        const double t0 = ie_now_ms();
        int chat_left = chat != NULL;
        if (profile && r == warmup) { /* the measured rounds only */
            ie_prof_reset();
            ie_prof_enable(1);
        }
        n_items = n_failed = 0;
        if (!chat && (st = ie_cli_batcher_start(&bo, &bat)) != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "%s", ie_error_last());
            goto cleanup;
        }
        /* continuous batching in input order: prompts enter the
         * scheduler as they come out of the ring, up to W ahead of the
         * oldest one not yet reported; results are reported in order */
        ie_sched_opts_t so;
        ie_engine_sched_opts(eng, &so);
        so.queue_max = (int)W;
        so.timing = &s;
        so.spec_ngram = (int)spec_ngram;
        if ((st = ie_sched_new(&so, &sched)) != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s", ie_error_last());
            goto cleanup;
        }
        size_t next_emit = 0, next_sub = 0;
        running = 0;
        int input_done = 0, idle = 0;
        while (!input_done || next_emit < next_sub) {
            while (!input_done && next_sub < next_emit + W) {
                slot_t *sl = &slots[next_sub % W];
                int got;
                memset(sl, 0, sizeof *sl);
                if (chat) {
                    got = chat_left;
                    if (got) sl->it = (ie_cli_item_t){.line = 1, .n_ids = n_chat_ids};
                    chat_left = 0;
                } else {
                    /* wait for the ring only when the engine has nothing to do */
                    got = ie_cli_batcher_next(bat, &sl->it, &qwait, running == 0);
                }
                if (got == 2) break; /* not tokenized yet: step meanwhile */
                if (got < 0) {
                    rc = ie_cli_fail(IE_EXIT_RUNTIME, "%s", ie_error_last());
                    goto cleanup;
                }
                if (got == 0) {
                    input_done = 1;
                    break;
                }
                sl->running = &running;
                next_sub++;
                int pid = aid; /* a JSONL line's own adapter set, else --adapter */
                if (sl->it.st == IE_OK && sl->it.adapter &&
                    (pid = prompt_adapter(eng, sl->it.adapter, ran, &n_ran, &sl->it)) < -1) {
                    free(sl->it.ids);
                    sl->it.ids = NULL;
                }
                free(sl->it.adapter);
                sl->it.adapter = NULL;
                if (sl->it.st != IE_OK) {
                    sl->done = 1;
                    continue;
                }
                ie_sched_req_t rq = {.ids = chat ? chat_ids : sl->it.ids,
                                     .n_ids = sl->it.n_ids,
                                     .params = &gp,
                                     .lora = pid + 1, /* 0: the base */
                                     .lora_salt = ie_lora_cache_salt(ie_engine_lora_cache(eng), pid),
                                     .cb = on_event,
                                     .cb_ctx = sl};
                st = ie_sched_submit(sched, &rq, NULL); /* the ids are copied */
                free(sl->it.ids);
                sl->it.ids = NULL;
                if (st != IE_OK) {
                    rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s", ie_error_last());
                    goto cleanup;
                }
                running++;
            }
            if (running) {
                int busy = 0;
                if ((st = ie_engine_sched_step(eng, sched, &busy)) != IE_OK) {
                    rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s", ie_error_last());
                    goto cleanup;
                }
                /* nothing runs and nothing can: a scheduler bug, not a hang */
                idle = busy ? 0 : idle + 1;
                if (idle > 1000) {
                    rc = ie_cli_fail(IE_EXIT_RUNTIME, "%s", "generate: the scheduler stalled");
                    goto cleanup;
                }
            }
            for (; next_emit < next_sub && slots[next_emit % W].done; next_emit++) {
                slot_t *sl = &slots[next_emit % W];
                ie_cli_item_t *it = &sl->it;
                ie_gen_result_t *rr = it->st == IE_OK ? &sl->r : NULL;
                n_items++;
                if (!rr) {
                    if (it->st != IE_ERR_INVAL && it->st != IE_ERR_RANGE) { /* not the prompt's fault */
                        rc = ie_cli_fail(it->st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s", it->err);
                        goto cleanup;
                    }
                    n_failed++;
                    if (!first_err[0]) {
                        snprintf(first_err, sizeof first_err, "%s", it->err);
                        first_err_st = it->st;
                    }
                    if (last && (!aggregate || n_failed <= 16)) {
                        cJSON *e = cJSON_CreateObject();
                        cJSON_AddNumberToObject(e, "index", (double)it->index);
                        cJSON_AddNumberToObject(e, "line", (double)it->line);
                        cJSON_AddStringToObject(e, "error", it->err);
                        spill_add_item(&sp_err, e);
                    }
                    if (last && !aggregate) emit_result(&sp_text, &sp_reason, &sp_ids, NULL, "error");
                    ie_gen_result_clear(&sl->r);
                    continue;
                }
                if (chat_fmt == IE_CHAT_HARMONY && last) {
                    /* the engine's text hides control tokens, so channels
                     * come from the ids; text is the answer (final channel) */
                    st = ie_harmony_parser_new(tok, NULL, NULL, &hp);
                    for (size_t q = 0; st == IE_OK && q < rr->n_gen; q++)
                        st = ie_harmony_parser_push_token(hp, rr->ids[q]);
                    if (st == IE_OK) st = ie_harmony_parser_finish(hp);
                    if (st != IE_OK) {
                        rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s",
                                         ie_error_last());
                        goto cleanup;
                    }
                    free(rr->text);
                    rr->text = strdup(ie_harmony_parser_text(hp, IE_HARMONY_CH_FINAL, NULL));
                    harmony_analysis = strdup(ie_harmony_parser_text(hp, IE_HARMONY_CH_ANALYSIS, NULL));
                    if (!rr->text || !harmony_analysis) {
                        rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
                        goto cleanup;
                    }
                }
                if (measured) {
                    tokens_in += rr->n_prompt;
                    tokens_out += rr->n_gen;
                    ttft_sum += rr->ttft_ms;
                    n_ok_total++;
                    if ((unsigned)rr->stop < 8) stop_counts[rr->stop]++;
                    for (size_t q = 0; q < rr->n_lat; q++)
                        if (lat_add(lat, rr->lat_ms[q]) != 0) {
                            rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
                            goto cleanup;
                        }
                }
                if (last && !aggregate) emit_result(&sp_text, &sp_reason, &sp_ids, rr, NULL);
                if (last && print_text) fprintf(stderr, "%s\n", rr->text ? rr->text : "");
                ie_gen_result_clear(&sl->r);
            }
        }
        ie_sched_stats_t sst;
        ie_sched_stats(sched, &sst);
        spec_drafted += sst.spec_drafted;
        spec_accepted += sst.spec_accepted;
        ie_sched_destroy(&sched);
        const double t1 = ie_now_ms();
        if (bat && measured) {
            double tms;
            int used;
            ie_cli_batcher_stats(bat, &tms, &used);
            tokenize_ms += tms;
            if (used > tok_used) tok_used = used;
        }
        ie_cli_batcher_destroy(&bat);
        if (n_failed == n_items) { /* nothing could run: the input is bad */
            rc = ie_cli_fail(first_err_st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "%s",
                             n_items ? first_err : "prompts file has no prompts");
            goto cleanup;
        }
        if (!measured) continue;
        wall += (t1 - t0) / 1e3;
        queue_ms += qwait;
        stats.prefill_ms += s.prefill_ms;
        stats.decode_ms += s.decode_ms;
        stats.sample_ms += s.sample_ms;
        stats.detok_ms += s.detok_ms;
        stats.prefill_tokens += s.prefill_tokens;
        stats.decode_tokens += s.decode_tokens;
        stats.prefix_hit_tokens += s.prefix_hit_tokens;
        stats.prefix_miss_tokens += s.prefix_miss_tokens;
        stats.preemptions += s.preemptions;
    }
    ie_prof_enable(0);
    if (sp_text.failed || sp_reason.failed || sp_ids.failed || sp_err.failed) {
        rc = ie_cli_fail(IE_EXIT_RUNTIME, "%s", "cannot write the results to a temporary file");
        goto cleanup;
    }

    js = cJSON_CreateObject();
    cJSON_AddStringToObject(js, "model", model);
    cJSON_AddNumberToObject(js, "prompts", (double)n_items);
    {
        cJSON *ja = cJSON_AddArrayToObject(js, "adapters"); /* the adapters that ran */
        if (ja && adapter) cJSON_AddItemToArray(ja, cJSON_CreateString(adapter));
        for (int i = 0; ja && i < n_ran; i++)
            if (!adapter || strcmp(ran[i], adapter)) cJSON_AddItemToArray(ja, cJSON_CreateString(ran[i]));
    }
    cJSON_AddNumberToObject(js, "failed", (double)n_failed);
    cJSON_AddNumberToObject(js, "tokens_in", (double)tokens_in);
    cJSON_AddNumberToObject(js, "tokens_out", (double)tokens_out);
    cJSON_AddNumberToObject(js, "wall_s", wall);
    cJSON_AddNumberToObject(js, "tps", wall > 0 ? tokens_out / wall : 0);
    cJSON_AddNumberToObject(js, "prefill_tps",
                            stats.prefill_ms > 0 ? stats.prefill_tokens / (stats.prefill_ms / 1e3) : 0);
    cJSON_AddNumberToObject(js, "decode_tps",
                            stats.decode_ms > 0 ? stats.decode_tokens / (stats.decode_ms / 1e3) : 0);
    cJSON_AddNumberToObject(js, "ttft_ms", n_ok_total ? ttft_sum / (double)n_ok_total : 0);
    cJSON_AddNumberToObject(js, "latency_p50_ms", lat_percentile(lat, 0.50));
    cJSON_AddNumberToObject(js, "latency_p95_ms", lat_percentile(lat, 0.95));
    cJSON_AddNumberToObject(js, "kv_hits",
                            (double)stats.prefix_hit_tokens); /* prompt tokens from the prefix cache */
    cJSON_AddNumberToObject(js, "kv_misses", (double)stats.prefix_miss_tokens); /* prompt tokens computed */
    cJSON_AddNumberToObject(js, "preemptions", (double)stats.preemptions);
    if (spec_ngram > 0) { /* draft tokens fed / confirmed, every round */
        cJSON_AddNumberToObject(js, "spec_drafted", (double)spec_drafted);
        cJSON_AddNumberToObject(js, "spec_accepted", (double)spec_accepted);
    }
    {
        /* the main thread's time line: load, then per measured round
         * waiting for the ring, steps, sampling, detokenizing and the rest
         * (scheduling, results); tokenize is the reader threads' time
         * (overlapping the rest: its cost on this thread is queue_wait) */
        const double total = load_ms + wall * 1e3;
        const double named = load_ms + queue_ms + stats.prefill_ms + stats.decode_ms + stats.sample_ms +
                             stats.detok_ms;
        cJSON *t = cJSON_AddObjectToObject(js, "timers_ms");
        cJSON_AddNumberToObject(t, "load", load_ms);
        cJSON_AddNumberToObject(t, "queue_wait", queue_ms);
        cJSON_AddNumberToObject(t, "prefill", stats.prefill_ms);
        cJSON_AddNumberToObject(t, "decode", stats.decode_ms);
        cJSON_AddNumberToObject(t, "sample", stats.sample_ms);
        cJSON_AddNumberToObject(t, "detokenize", stats.detok_ms);
        cJSON_AddNumberToObject(t, "other", total > named ? total - named : 0);
        cJSON_AddNumberToObject(t, "total", total);
        cJSON_AddNumberToObject(t, "tokenize", tokenize_ms);
        cJSON_AddNumberToObject(js, "tokenize_threads", (double)tok_used);
    }
    if (profile) {
        /* each kernel class's share of the step time (prefill + decode);
         * "other" is what no bracket covers (embedding, scheduling in the
         * worker, thread-pool hand-offs) */
        const double step_ns = (stats.prefill_ms + stats.decode_ms) * 1e6;
        double sum = 0;
        cJSON *pr = cJSON_AddObjectToObject(js, "profile");
        cJSON_AddNumberToObject(pr, "step_ms", step_ns / 1e6);
        static const char *const fixed[] = {"attention", "norm", "act_quant", "reduce", "elementwise", "lora"};
        for (int k = 0; k < IE_PROF_N; k++) {
            const uint64_t ns = ie_prof_get(k);
            if (!ns) continue;
            char name[48];
            if (k < IE_PROF_MATMUL_N) snprintf(name, sizeof name, "matmul_%s", ie_dtype_name((ie_dtype_t)k));
            else snprintf(name, sizeof name, "%s", fixed[k - IE_PROF_MATMUL_N]);
            cJSON_AddNumberToObject(pr, name, step_ns > 0 ? (double)ns / step_ns : 0);
            sum += (double)ns;
        }
        cJSON_AddNumberToObject(pr, "other", step_ns > sum ? (step_ns - sum) / step_ns : 0);
    }
    cJSON_AddNumberToObject(js, "rss_peak_mb", ie_rss_peak_mb());
    cJSON_AddNumberToObject(js, "threads", (double)threads);
    cJSON_AddStringToObject(js, "precision", ie_precision_name(prec));
    cJSON_AddStringToObject(js, "cache_type_k", ie_kv_type_name(kv_k));
    cJSON_AddStringToObject(js, "cache_type_v", ie_kv_type_name(kv_v));
    cJSON_AddNumberToObject(js, "kv_bytes_per_token", (double)ie_engine_kv_bytes_per_token(eng));
    cJSON_AddNumberToObject(js, "kv_pool_positions", (double)ie_engine_kv_pool_positions(eng));
    cJSON_AddNumberToObject(js, "kv_ring_positions", ie_engine_kv_ring_positions(eng));
    cJSON_AddNumberToObject(js, "kv_ring_bytes", (double)ie_engine_kv_ring_bytes(eng));
    cJSON_AddNumberToObject(js, "kv_recent_bytes", (double)ie_engine_kv_recent_bytes(eng));
    ie_backend_stats_t bs;
    ie_backend_stats(ie_engine_backend(eng), &bs);
    cJSON_AddStringToObject(js, "isa", bs.isa);
    cJSON_AddStringToObject(js, "device", "cpu");
    cJSON_AddNumberToObject(js, "batch", (double)eo.n_seq);
    cJSON_AddNumberToObject(js, "prefetch", (double)bo.depth);
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
    if (harmony_analysis) {
        cJSON *ch = cJSON_AddObjectToObject(js, "channels");
        cJSON_AddStringToObject(ch, "analysis", harmony_analysis);
        cJSON_AddStringToObject(ch, "final", ie_harmony_parser_text(hp, IE_HARMONY_CH_FINAL, NULL));
    }
    if (aggregate) {
        cJSON *sr = cJSON_AddObjectToObject(js, "stop_reasons");
        for (int k = 0; k < 8; k++)
            if (stop_counts[k]) cJSON_AddNumberToObject(sr, ie_finish_name((ie_finish_t)k), (double)stop_counts[k]);
    }
    char *line = cJSON_PrintUnformatted(js);
    if (!line) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "%s", "out of memory");
        goto cleanup;
    }
    /* the summary, then the spilled arrays (one element alone, as a
     * scalar, for one prompt), on the same line */
    line[strlen(line) - 1] = '\0'; /* the closing brace */
    fputs(line, stdout);
    free(line);
    const int bare = n_items == 1;
    int werr = 0;
    if (!aggregate)
        werr |= spill_emit(&sp_text, "text", bare, stdout) | spill_emit(&sp_reason, "stop_reason", bare, stdout) |
                spill_emit(&sp_ids, "ids", bare, stdout);
    if (n_failed) werr |= spill_emit(&sp_err, "errors", 0, stdout);
    fputs("}\n", stdout);
    if (werr || fflush(stdout) != 0) rc = ie_cli_fail(IE_EXIT_RUNTIME, "%s", "cannot write the output");

cleanup:
    cJSON_Delete(js);
    ie_cli_batcher_destroy(&bat);
    ie_sched_destroy(&sched); /* ends what still runs (after a failure): before the slots go */
    for (size_t i = 0; slots && i < W; i++) {
        free(slots[i].it.ids);
        ie_gen_result_clear(&slots[i].r);
    }
    free(slots);
    if (lat) free(lat->hist);
    free(lat);
    spill_close(&sp_text);
    spill_close(&sp_reason);
    spill_close(&sp_ids);
    spill_close(&sp_err);
    ie_engine_destroy(&eng);
    free(stops);
    free(biases);
    free(json_schema);
    free(chat_json);
    free(chat_ids);
    free(chat_prompt);
    free(harmony_analysis);
    free(model_dir);
    ie_harmony_parser_destroy(&hp);
    return rc;
}
