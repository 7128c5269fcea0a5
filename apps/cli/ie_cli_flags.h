/* ie_cli_flags.h — the engine flags: one table for every executable
 * (apps/cli/cli_flags.c, library ie_cli; ie_cli.h includes it).
 */
#ifndef IE_CLI_FLAGS_H
#define IE_CLI_FLAGS_H

#include <getopt.h>
#include <stddef.h>

/* Each flag that more than one binary takes (the engine's --model,
 * --threads, --precision, --plan, --ctx, --batch, ..., the services'
 * --metrics-port, --keys-dir, ...) is declared once, with its value's kind
 * and its accepted range, in cli_flags.c, and its value is checked there. A
 * binary picks the flags it accepts, each with where its value goes (and,
 * where the binary accepts a narrower range, that range), adds the options
 * only it has, and reads them with ie_cli_next, a getopt_long loop:
 *
 *     const ie_cli_pick_t picks[] = { IE_CLI_PICK(IE_FLAG_MODEL, &model),
 *                                     IE_CLI_PICK(IE_FLAG_THREADS, &threads) };
 *     static const struct option own[] = { {"ids", required_argument, 0, 'i'}, {0, 0, 0, 0} };
 *     ie_cli_parser_t p;
 *     ie_cli_parser_init(&p, argc, argv, picks, IE_CLI_NPICKS(picks), own);
 *     while ((c = ie_cli_next(&p)) != -1) switch (c) { case IE_CLI_ENGINE: break;
 *                                                     case IE_CLI_BAD: ...; case 'i': ...; default: ... }
 *
 * Each binary keeps its own messages for a bad or unknown flag. Its own
 * options' values stay below IE_FLAG_MODEL (0x1000). */
typedef enum ie_flag_id {
    IE_FLAG_MODEL = 0x1000, /* --model / --model-dir PATH         const char * */
    IE_FLAG_THREADS,        /* --threads N (1..1024)              long         */
    IE_FLAG_PRECISION,      /* --precision P (ie_precision_parse) ie_precision_t */
    IE_FLAG_PLAN,           /* --plan SPEC                        const char * */
    IE_FLAG_CTX,            /* --ctx N (1..2^24)                  long         */
    IE_FLAG_BATCH,          /* --batch N (1..4096)                long         */
    IE_FLAG_MAX_BATCH,      /* --max-batch N (1..65536)           long         */
    IE_FLAG_QUEUE,          /* --queue N (1..2^20)                long         */
    IE_FLAG_TIMEOUT_MS,     /* --timeout-ms N (0..2^30)           long         */
    IE_FLAG_KV_BLOCK,       /* --kv-block N (1..65536)            long         */
    IE_FLAG_KV_BLOCKS,      /* --kv-blocks N (0..INT32_MAX)       long         */
    IE_FLAG_KV_MEM_MB,      /* --kv-mem-mb N (1..2^30)            long         */
    IE_FLAG_NO_PREFIX,      /* --no-prefix-cache: sets 0          int          */
    IE_FLAG_NO_PIN,         /* --no-pin: sets 0                   int          */
    IE_FLAG_VERBOSE,        /* --verbose: sets 1                  int          */
    IE_FLAG_API_KEY,        /* --api-key K (not empty)            const char * */
    IE_FLAG_METRICS_PORT,   /* --metrics-port N (0..65535)        long         */
    IE_FLAG_METRICS_ADDR,   /* --metrics-addr A                   const char * */
    IE_FLAG_KEYS_DIR,       /* --keys-dir DIR                     const char * */
    IE_FLAG_KEY,            /* --key NAME                         const char * */
    IE_FLAG_AUTHORIZED,     /* --authorized FILE                  const char * */
    IE_FLAG_CPU_LATENCY,    /* --cpu-latency-us US                const char * */
    IE_FLAG_DRAIN_MS,       /* --drain-ms N (0..2^30)             long         */
    IE_FLAG_MAX_MSG,        /* --max-msg N (1024..2^30)           long         */
    IE_FLAG_MAX_BODY,       /* --max-body N (1024..2^30)          long         */
    IE_FLAG_PREFILL_CHUNK,  /* --prefill-chunk N (1..65536)       long         */
    IE_FLAG_STEP_LATENCY,   /* --step-latency-ms N (0..60000; 0 off) long      */
    IE_FLAG_HTTP_READ_MS,   /* --http-read-timeout-ms N (100..)   long         */
    IE_FLAG_HTTP_CONNS,     /* --http-max-conns N (1..65536)      long         */
    IE_FLAG_HTTP_PER_ADDR,  /* --http-max-conns-per-addr N        long         */
    IE_FLAG_CORS_ORIGIN,    /* --cors-origin ORIGIN (not empty)   const char * */
    IE_FLAG_CACHE_TYPE_K,   /* --cache-type-k T (ie_kv_type_parse) ie_kv_type_t */
    IE_FLAG_CACHE_TYPE_V,   /* --cache-type-v T                   ie_kv_type_t */
    IE_FLAG_KV_ROTATE,      /* --kv-rotate on|off|auto            ie_kv_rotate_t */
    IE_FLAG_LORA,           /* --lora NAME=PATH (repeatable)      ie_cli_loras_t */
    IE_FLAG_ADAPTER,        /* --adapter NAME (not empty)         const char * */
    IE_FLAG_POOLING,        /* --pooling mean|last|cls (checked by
                               the binary: ie_pooling_parse)      const char * */
    IE_FLAG_EMBD_NORM,      /* --embd-normalize 2|-1 (checked by
                               the binary)                        long         */
    IE_FLAG_LORA_BUDGET,    /* --lora-budget-mb MB (decimal; 0: no limit) const char * */
    IE_FLAG_KV_SWA_FULL,    /* --kv-swa-full: sets 1              int          */
    IE_FLAG_SPEC_NGRAM,     /* --spec-ngram K (0..16; 0 off)      long         */
    IE_FLAG_END
} ie_flag_id_t;

/* The --lora flags given, in order: name (1..63 characters, no '=', each
 * once) and the PATH after the first '=' (argv's own string). */
#define IE_CLI_MAX_LORA 16
typedef struct ie_cli_loras {
    int n;
    char name[IE_CLI_MAX_LORA][64];
    const char *path[IE_CLI_MAX_LORA];
} ie_cli_loras_t;

/* A binary's pick: flag `id`, its value stored in *dst (of the type listed
 * above); lo < hi narrows an integer flag's range for this binary. */
typedef struct ie_cli_pick {
    ie_flag_id_t id;
    void *dst;
    long lo, hi;
} ie_cli_pick_t;
#define IE_CLI_PICK(id, dst) \
    {                        \
        (id), (dst), 0, 0    \
    }
#define IE_CLI_PICK_RANGE(id, dst, lo, hi) \
    {                                      \
        (id), (dst), (lo), (hi)            \
    }
#define IE_CLI_NPICKS(a) (sizeof(a) / sizeof((a)[0]))

/* ie_cli_next's answers besides the binary's own option values and -1. */
enum {
    IE_CLI_ENGINE = 0x2000, /* a picked flag, stored; p->last says which */
    IE_CLI_BAD,             /* a picked flag with a bad value (optarg)   */
    IE_CLI_UNKNOWN = '?'    /* unknown or incomplete option              */
};

#define IE_CLI_MAX_OPTS 64
typedef struct ie_cli_parser {
    int argc;
    char **argv;
    const ie_cli_pick_t *picks;
    size_t n_picks;
    struct option opts[IE_CLI_MAX_OPTS + 1]; /* getopt table: picked flags, then the binary's own */
    ie_flag_id_t last;                       /* the picked flag last read (IE_CLI_ENGINE/BAD)    */
} ie_cli_parser_t;

/* Builds p's getopt table from picks[0..n) and own (terminated by a zero
 * entry; NULL for none) and resets getopt (optind = 1, no getopt messages).
 * p keeps pointers to argv, picks and own. Returns 0, or -1 when the table
 * would exceed IE_CLI_MAX_OPTS or a pick names no flag (a programming error). */
int ie_cli_parser_init(ie_cli_parser_t *p, int argc, char **argv, const ie_cli_pick_t *picks, size_t n,
                       const struct option *own);

/* The next option: a picked flag is checked and stored (IE_CLI_ENGINE) or
 * rejected (IE_CLI_BAD, nothing stored); the binary's own options come back
 * as their getopt value with optarg set, an unknown or incomplete one as
 * IE_CLI_UNKNOWN; -1 at the end (optind: the first operand). */
int ie_cli_next(ie_cli_parser_t *p);

/* The long name (without "--") of what ie_cli_next just returned (`c`): the
 * first name of the rejected flag for IE_CLI_BAD, the first name with that
 * value for an own option; "?" otherwise. */
const char *ie_cli_flag_name(const ie_cli_parser_t *p, int c);
/* For a bad value (c == IE_CLI_BAD) of a flag with a fixed set of values:
 * " (expected ...)" naming them; "" otherwise. */
const char *ie_cli_flag_hint(const ie_cli_parser_t *p, int c);

#endif
