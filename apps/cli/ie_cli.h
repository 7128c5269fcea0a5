/* ie_cli.h — what the executables share (exit codes, the one error exit,
 * the engine flag table, config files, signals: apps/cli/cli_common.c,
 * cli_flags.c and cli_config.c, library ie_cli) and the modes (subcommands) of the
 * `inference-engine` executable (apps/cli/cli_*.c).
 *
 * Each mode takes the argument vector that starts at its own name (argv[0]
 * is the mode), prints its result as JSON on stdout (one line) and errors as
 * one "error: ..." line on stderr, and returns the process exit code.
 * main() dispatches on argv[1].
 */
#ifndef IE_CLI_H
#define IE_CLI_H

#include "ie_status.h"

#include <getopt.h>
#include <signal.h>
#include <stddef.h>

/* Exit codes shared by every mode. */
enum {
    IE_EXIT_OK = 0,
    IE_EXIT_RUNTIME = 1, /* I/O or other failure at run time          */
    IE_EXIT_USAGE = 2,   /* bad usage or bad input (flags, UTF-8)     */
    IE_EXIT_MODEL = 3,   /* model/tokenizer missing or invalid        */
    IE_EXIT_ENGINE = 5,  /* engine creation failed                    */
    IE_EXIT_NOMEM = 6    /* out of memory                             */
};

/* The one way to exit on error: prints "error: " + the printf-formatted
 * message + '\n' to stderr and returns `code` (so a mode writes
 * `return ie_cli_fail(IE_EXIT_USAGE, "bad value '%s'", v);`). */
int ie_cli_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Strict integer flag value: the whole string s is a base-10 number in
 * [lo, hi]; stores it in *out and returns 0, else -1 (out untouched). */
int ie_cli_parse_long(const char *s, long lo, long hi, long *out);

/* ---- The engine flags: one table for every executable.
 *
 * Each flag that more than one binary takes (the engine's --model,
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
    IE_FLAG_END
} ie_flag_id_t;

/* A binary's pick: flag `id`, its value stored in *dst (of the type listed
 * above); lo < hi narrows an integer flag's range for this binary. */
typedef struct ie_cli_pick {
    ie_flag_id_t id;
    void *dst;
    long lo, hi;
} ie_cli_pick_t;
#define IE_CLI_PICK(id, dst) { (id), (dst), 0, 0 }
#define IE_CLI_PICK_RANGE(id, dst, lo, hi) { (id), (dst), (lo), (hi) }
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

struct ie_engine_opts;
/* Distributed execution for a mode: spec "none", "pipeline:N" or
 * "tensor:N" (N workers, run as threads of this process over ZeroMQ
 * inproc://). spec NULL: env IE_PLAN, else none. Sets eo->plan and
 * eo->n_workers; returns 0, or -1 for a malformed spec. */
int ie_cli_plan(const char *spec, struct ie_engine_opts *eo);

/* Configuration files of the service binaries (ie-coordinator,
 * ie-worker): "--config FILE" in argv names a file of "key = value" lines
 * (# comments; a key alone is a switch; keys are long flag names, '_' or
 * '-'). The result is argv[0], the file's flags, then the command line's
 * other arguments — so the command line wins. Returns 0 (free the result
 * with ie_cli_config_free) or -1 with a reason in err. */
int ie_cli_config_expand(int argc, char **argv, int *argc_out, char ***argv_out, char *err, size_t errcap);
void ie_cli_config_free(int argc, char **argv);

/* Service binaries: SIGINT/SIGTERM set *flag (the main loop then stops
 * cleanly); SIGPIPE is ignored. */
void ie_cli_stop_on_signals(volatile sig_atomic_t *flag);

/* Largest text input the modes read whole (prompts, chat JSON, corpora). */
#define IE_CLI_MAX_TEXT ((size_t)1 << 30)

/* Exit code for a failed model/engine load with status st. */
int ie_cli_exit_for_load(ie_status_t st);

/* Default mode: generate text for --prompt / --prompts-file. */
int ie_cli_run(int argc, char **argv);

/* `inference-engine tokenize --tokenizer PATH [--no-bos] [--parse-special]
 * [--lines]`: read UTF-8 text from stdin and print {"ids":[...]} (one line;
 * with --lines one line per input line, each tokenized without its '\n').
 * Exit: 0 ok, 2 bad usage or invalid UTF-8 input, 3 tokenizer missing or
 * invalid, 1 other failures (I/O, memory). Messages go to stderr. */
int ie_cli_tokenize(int argc, char **argv);

/* `perplexity --model PATH --file TEXT --ctx N [--chunks K]`. */
int ie_cli_perplexity(int argc, char **argv);

/* `logits --model PATH --ids 1,2,3 [--mode prefill|decode] --out FILE`. */
int ie_cli_logits(int argc, char **argv);

/* `serve --model PATH [--host A] [--port N] [--api-key K] ...`: the
 * OpenAI-compatible HTTP API (docs/HTTP.md) until SIGINT/SIGTERM. Writes
 * "listening on http://HOST:PORT" to stderr when ready. Exit: 0 stopped by
 * a signal, 2 bad usage, 3 model unreadable, 1 other failures. */
int ie_cli_serve(int argc, char **argv);

/* The last component of a path, without trailing '/' (a served model's
 * default name). Caller frees; NULL when out of memory. */
char *ie_cli_base_name(const char *path);

#endif
