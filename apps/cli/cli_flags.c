/* cli_flags.c — the one table of engine flags and its parser (ie_cli.h).
 *
 * Why one table: the same flag (--threads, --precision, --ctx, ...) used to
 * be declared and range-checked in each binary's own getopt table, and the
 * copies could drift. Here each is declared once; a binary picks the ones it
 * takes and keeps only its own options in its getopt loop.
 */
#include "ie_cli_flags.h"
#include "ie_cli.h" /* ie_cli_parse_long */

#include "ie_worker.h" /* ie_precision_parse */

#include <stdint.h>
#include <string.h>

typedef enum {
    FK_STR,
    FK_STR_NONEMPTY,
    FK_LONG,
    FK_PREC,
    FK_SET0,
    FK_SET1,
    FK_KVTYPE,
    FK_KVROT,
    FK_LORA
} flag_kind_t;

typedef struct {
    const char *name;
    ie_flag_id_t id;
    flag_kind_t kind;
    long lo, hi; /* FK_LONG: the widest range any binary accepts */
} flag_t;

/* A flag with two names has two rows with the same id (the first name is
 * the one messages use). */
static const flag_t FLAGS[] = {
    {"model", IE_FLAG_MODEL, FK_STR, 0, 0},
    {"model-dir", IE_FLAG_MODEL, FK_STR, 0, 0},
    {"threads", IE_FLAG_THREADS, FK_LONG, 1, 1024},
    {"precision", IE_FLAG_PRECISION, FK_PREC, 0, 0},
    {"plan", IE_FLAG_PLAN, FK_STR, 0, 0},
    {"ctx", IE_FLAG_CTX, FK_LONG, 1, 1 << 24},
    {"batch", IE_FLAG_BATCH, FK_LONG, 1, 4096},
    {"max-batch", IE_FLAG_MAX_BATCH, FK_LONG, 1, 1 << 16},
    {"queue", IE_FLAG_QUEUE, FK_LONG, 1, 1 << 20},
    {"timeout-ms", IE_FLAG_TIMEOUT_MS, FK_LONG, 0, 1L << 30},
    {"kv-block", IE_FLAG_KV_BLOCK, FK_LONG, 1, 1 << 16},
    {"kv-blocks", IE_FLAG_KV_BLOCKS, FK_LONG, 0, INT32_MAX},
    {"kv-mem-mb", IE_FLAG_KV_MEM_MB, FK_LONG, 1, 1L << 30},
    {"no-prefix-cache", IE_FLAG_NO_PREFIX, FK_SET0, 0, 0},
    {"kv-swa-full", IE_FLAG_KV_SWA_FULL, FK_SET1, 0, 0},
    {"no-pin", IE_FLAG_NO_PIN, FK_SET0, 0, 0},
    {"verbose", IE_FLAG_VERBOSE, FK_SET1, 0, 0},
    {"api-key", IE_FLAG_API_KEY, FK_STR_NONEMPTY, 0, 0},
    {"metrics-port", IE_FLAG_METRICS_PORT, FK_LONG, 0, 65535},
    {"metrics-addr", IE_FLAG_METRICS_ADDR, FK_STR, 0, 0},
    {"keys-dir", IE_FLAG_KEYS_DIR, FK_STR, 0, 0},
    {"key", IE_FLAG_KEY, FK_STR, 0, 0},
    {"authorized", IE_FLAG_AUTHORIZED, FK_STR, 0, 0},
    {"cpu-latency-us", IE_FLAG_CPU_LATENCY, FK_STR, 0, 0},
    {"drain-ms", IE_FLAG_DRAIN_MS, FK_LONG, 0, 1L << 30},
    {"max-msg", IE_FLAG_MAX_MSG, FK_LONG, 1024, 1L << 30},
    {"max-body", IE_FLAG_MAX_BODY, FK_LONG, 1024, 1L << 30},
    {"prefill-chunk", IE_FLAG_PREFILL_CHUNK, FK_LONG, 1, 1 << 16},
    {"spec-ngram", IE_FLAG_SPEC_NGRAM, FK_LONG, 0, 16}, /* IE_SCHED_SPEC_MAX */
    {"step-latency-ms", IE_FLAG_STEP_LATENCY, FK_LONG, 0, 60000},
    {"http-read-timeout-ms", IE_FLAG_HTTP_READ_MS, FK_LONG, 100, 1L << 30},
    {"http-max-conns", IE_FLAG_HTTP_CONNS, FK_LONG, 1, 1 << 16},
    {"http-max-conns-per-addr", IE_FLAG_HTTP_PER_ADDR, FK_LONG, 1, 1 << 16},
    {"cors-origin", IE_FLAG_CORS_ORIGIN, FK_STR_NONEMPTY, 0, 0},
    {"cache-type-k", IE_FLAG_CACHE_TYPE_K, FK_KVTYPE, 0, 0},
    {"cache-type-v", IE_FLAG_CACHE_TYPE_V, FK_KVTYPE, 0, 0},
    {"kv-rotate", IE_FLAG_KV_ROTATE, FK_KVROT, 0, 0},
    {"lora", IE_FLAG_LORA, FK_LORA, 0, 0},
    {"adapter", IE_FLAG_ADAPTER, FK_STR_NONEMPTY, 0, 0},
    {"pooling", IE_FLAG_POOLING, FK_STR_NONEMPTY, 0, 0},
    {"embd-normalize", IE_FLAG_EMBD_NORM, FK_LONG, -1, 2},
    {"lora-budget-mb", IE_FLAG_LORA_BUDGET, FK_STR_NONEMPTY, 0, 0},
};
#define N_FLAGS (sizeof FLAGS / sizeof FLAGS[0])

static const flag_t *flag_of(ie_flag_id_t id)
{
    for (size_t i = 0; i < N_FLAGS; i++)
        if (FLAGS[i].id == id) return &FLAGS[i];
    return NULL;
}

int ie_cli_parser_init(ie_cli_parser_t *p, int argc, char **argv, const ie_cli_pick_t *picks, size_t n,
                       const struct option *own)
{
    size_t k = 0;
    memset(p, 0, sizeof *p);
    p->argc = argc;
    p->argv = argv;
    p->picks = picks;
    p->n_picks = n;
    for (size_t i = 0; i < n; i++) {
        if (!flag_of(picks[i].id)) return -1;
        for (size_t j = 0; j < N_FLAGS; j++) {
            if (FLAGS[j].id != picks[i].id) continue;
            if (k >= IE_CLI_MAX_OPTS) return -1;
            const int takes = FLAGS[j].kind != FK_SET0 && FLAGS[j].kind != FK_SET1;
            p->opts[k++] = (struct option){FLAGS[j].name, takes ? required_argument : no_argument, 0,
                                           (int)FLAGS[j].id};
        }
    }
    for (const struct option *o = own; o && o->name; o++) {
        if (k >= IE_CLI_MAX_OPTS) return -1;
        p->opts[k++] = *o;
    }
    p->opts[k] = (struct option){0, 0, 0, 0};
    optind = 1;
    opterr = 0;
    return 0;
}

/* Check arg for pick `pk` of flag f and store it; 0, or -1 for a bad value. */
static int store(const flag_t *f, const ie_cli_pick_t *pk, const char *arg)
{
    switch (f->kind) {
    case FK_STR: *(const char **)pk->dst = arg; return 0;
    case FK_STR_NONEMPTY:
        if (!*arg) return -1; /* nothing is stored for a bad value */
        *(const char **)pk->dst = arg;
        return 0;
    case FK_PREC: return ie_precision_parse(arg, (ie_precision_t *)pk->dst) == IE_OK ? 0 : -1;
    case FK_KVTYPE: return ie_kv_type_parse(arg, (ie_kv_type_t *)pk->dst) == IE_OK ? 0 : -1;
    case FK_KVROT: return ie_kv_rotate_parse(arg, (ie_kv_rotate_t *)pk->dst) == IE_OK ? 0 : -1;
    case FK_SET0: *(int *)pk->dst = 0; return 0;
    case FK_SET1: *(int *)pk->dst = 1; return 0;
    case FK_LORA: {
        /* NAME=PATH appended; a bad form, a repeated name or too many: -1 */
        ie_cli_loras_t *l = pk->dst;
        const char *eq = strchr(arg, '=');
        const size_t nl = eq ? (size_t)(eq - arg) : 0;
        if (!eq || nl == 0 || nl >= sizeof l->name[0] || !eq[1] || l->n >= IE_CLI_MAX_LORA) return -1;
        for (int i = 0; i < l->n; i++)
            if (strlen(l->name[i]) == nl && !memcmp(l->name[i], arg, nl)) return -1;
        memcpy(l->name[l->n], arg, nl);
        l->name[l->n][nl] = '\0';
        l->path[l->n++] = eq + 1;
        return 0;
    }
    case FK_LONG: {
        const long lo = pk->lo < pk->hi ? pk->lo : f->lo, hi = pk->lo < pk->hi ? pk->hi : f->hi;
        return ie_cli_parse_long(arg, lo, hi, (long *)pk->dst);
    }
    }
    return -1;
}

int ie_cli_next(ie_cli_parser_t *p)
{
    int c = getopt_long(p->argc, p->argv, "", p->opts, NULL);
    if (c < (int)IE_FLAG_MODEL || c >= (int)IE_FLAG_END) return c == '?' ? IE_CLI_UNKNOWN : c;
    for (size_t i = 0; i < p->n_picks; i++) {
        if ((int)p->picks[i].id != c) continue;
        p->last = p->picks[i].id;
        return store(flag_of(p->last), &p->picks[i], optarg) == 0 ? IE_CLI_ENGINE : IE_CLI_BAD;
    }
    return IE_CLI_UNKNOWN; /* not reached: only picked flags are in the table */
}

/* Contract (ie_cli_flags.h). */
const char *ie_cli_flag_hint(const ie_cli_parser_t *p, int c)
{
    const flag_t *f = c == IE_CLI_BAD ? flag_of(p->last) : NULL;
    if (f && f->kind == FK_KVTYPE) return " (expected f32, f16, bf16, q8 (q8_0), q4 (q4_0), fp8_e4m3 or fp8_e5m2)";
    if (f && f->kind == FK_KVROT) return " (expected on, off or auto)";
    return "";
}

const char *ie_cli_flag_name(const ie_cli_parser_t *p, int c)
{
    if (c == IE_CLI_BAD || c == IE_CLI_ENGINE) {
        const flag_t *f = flag_of(p->last);
        return f ? f->name : "?";
    }
    for (const struct option *o = p->opts; o->name; o++)
        if (o->val == c) return o->name;
    return "?";
}
