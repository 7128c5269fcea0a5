/* ie_cli_batch.h — the prompts batcher of the generate mode
 * (apps/cli/cli_batch.c): tokenizer threads read the prompts (a file, one
 * per line, or one given text), tokenize them and put them into a bounded
 * ring; the consumer takes them strictly in input order.
 *
 * Memory is bounded whatever the input's size: the ring holds `depth`
 * prompts, a reader blocks while the prompt it would read does not fit the
 * ring (it is `depth` ahead of the consumer), and each reader holds one line.
 * A prompt that cannot be used (invalid UTF-8, longer than the line limit or
 * than the context, empty after tokenization) comes out in its place with
 * its status and message; the others go on.
 */
#ifndef IE_CLI_BATCH_H
#define IE_CLI_BATCH_H

#include "ie_status.h"
#include "ie_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_cli_batcher ie_cli_batcher_t;

typedef struct ie_cli_batch_opts {
    const char *path;          /* prompts file (one per line, empty lines skipped), or NULL */
    const char *text;          /* with path NULL: the one prompt                           */
    const ie_tokenizer_t *tok; /* borrowed; must outlive the batcher                       */
    int tok_flags;             /* IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL                */
    size_t max_tokens;         /* longer prompts fail (the context)                        */
    size_t max_line;           /* longer lines fail, bytes (0: 1 MiB)                      */
    int n_threads;             /* tokenizer threads (>= 1)                                 */
    size_t depth;              /* ring slots (>= 1)                                        */
    int jsonl;                 /* each line is {"prompt": str[, "adapter": "NAME[:SCALE],..."]}
                                  (the generate mode sets it for a file named *.jsonl)     */
} ie_cli_batch_opts_t;

/* One prompt as it comes out of the ring. On failure st != IE_OK, ids NULL
 * and err says why. The consumer owns ids (free). */
typedef struct ie_cli_item {
    size_t index; /* 0-based among the prompts (non-empty lines) */
    size_t line;  /* 1-based line of the file (1 for a text)     */
    int32_t *ids;
    size_t n_ids;
    ie_status_t st;
    char err[240];
    char *adapter; /* jsonl: the line's adapter set (malloc'd, consumer frees), else NULL */
} ie_cli_item_t;

/* Start the threads. The file is opened here: IE_ERR_IO when it cannot be
 * read; IE_ERR_INVAL for bad options; IE_ERR_NOMEM. Caller owns *out
 * (ie_cli_batcher_destroy). */
ie_status_t ie_cli_batcher_start(const ie_cli_batch_opts_t *o, ie_cli_batcher_t **out);

/* The next prompt in input order. With `block` it waits for it (the time
 * waited is added to *wait_ms when not NULL); without, it returns 2 at once
 * when that prompt is not ready. Returns 1 with *it filled, 0 at the end of
 * the input, -1 when reading the file failed (ie_error_last says why). */
int ie_cli_batcher_next(ie_cli_batcher_t *b, ie_cli_item_t *it, double *wait_ms, int block);

/* Tokenization statistics so far: summed time of the tokenizer threads in
 * encode (ms) and how many distinct threads tokenized at least one prompt. */
void ie_cli_batcher_stats(const ie_cli_batcher_t *b, double *tokenize_ms, int *threads_used);

/* Stop the readers (unblocking them), join them, close the file and free
 * everything, including prompts not taken. *bp becomes NULL; accepts NULL. */
void ie_cli_batcher_destroy(ie_cli_batcher_t **bp);

#endif
