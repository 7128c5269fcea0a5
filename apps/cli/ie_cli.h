/* ie_cli.h — what the executables share (exit codes, the one error exit,
 * config files, signals: apps/cli/cli_common.c and cli_config.c; the flag
 * table is ie_cli_flags.h; library ie_cli) and the modes (subcommands) of
 * the `inference-engine` executable (apps/cli/cli_*.c).
 *
 * Each mode takes the argument vector that starts at its own name (argv[0]
 * is the mode), prints its result as JSON on stdout (one line) and errors as
 * one "error: ..." line on stderr, and returns the process exit code.
 * main() dispatches on argv[1].
 */
#ifndef IE_CLI_H
#define IE_CLI_H

#include "ie_cli_flags.h" /* the engine flag table and its parser */
#include "ie_status.h"

#include <signal.h>

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

/* Load the --lora adapters into eng and look up --adapter (NULL: the
 * base; *id_out -1). 0, or the exit code after the error line "MODE:
 * lora NAME: <reason>" (IE_EXIT_MODEL for an adapter that cannot be
 * used, IE_EXIT_USAGE for an --adapter not among the --lora names,
 * IE_EXIT_NOMEM). */
struct ie_engine;
int ie_cli_lora_setup(struct ie_engine *eng, const char *mode, const ie_cli_loras_t *l, const char *adapter,
                      int *id_out);

/* Default mode: generate text for --prompt / --prompts-file. */
int ie_cli_run(int argc, char **argv);

/* `inference-engine tokenize --tokenizer PATH [--no-bos] [--parse-special]
 * [--lines]`: read UTF-8 text from stdin and print {"ids":[...]} (one line;
 * with --lines one line per input line, each tokenized without its '\n').
 * Exit: 0 ok, 2 bad usage or invalid UTF-8 input, 3 tokenizer missing or
 * invalid, 1 other failures (I/O, memory). Messages go to stderr. */
int ie_cli_tokenize(int argc, char **argv);

/* `inference-engine embed`: one embedding (JSON line) per stdin line,
 * through the scheduler as /v1/embeddings (cli_embed.c). Returns the exit
 * code. */
int ie_cli_embed(int argc, char **argv);

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
