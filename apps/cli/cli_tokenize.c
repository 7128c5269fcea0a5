/* cli_tokenize.c — the `tokenize` subcommand: stdin text -> token ids.
 *
 * Prints {"ids":[...]} per input (or per line with --lines) so scripts can
 * compare our ids with a reference tokenizer line by line.
 */
#include "ie_cli.h"
#include "ie_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: inference-engine tokenize --tokenizer PATH [--no-bos] [--parse-special] [--lines]\n"
               "  Reads UTF-8 text from stdin and prints {\"ids\":[...]}.\n"
               "  --tokenizer PATH  GGUF file, tokenizer.json, a directory holding tokenizer.json,\n"
               "                    or a tiktoken ranks file (*.tiktoken; special tokens from\n"
               "                    " IE_TIKTOKEN_SPECIALS " beside it)\n"
               "  --no-bos          add no BOS/EOS tokens\n"
               "  --parse-special   treat special-token text (e.g. <|im_start|>) as those tokens\n"
               "  --lines           tokenize each input line separately (without its newline)\n");
}

/* Whole stdin into a malloc'd buffer: 0 ok, -1 read error, -2 no memory. */
static int read_all(FILE *in, char **buf_out, size_t *len_out)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) { return -2; }
    for (;;) {
        if (len == cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return -2;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, in);
        len += n;
        if (n == 0) { break; }
    }
    if (ferror(in)) {
        free(buf);
        return -1;
    }
    *buf_out = buf;
    *len_out = len;
    return 0;
}

/* Write {"ids":[...]}\n without printf per id. */
static void print_ids(FILE *out, const int32_t *ids, size_t n)
{
    char num[16];
    fputs("{\"ids\":[", out);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i]; /* ids are never negative */
        int k = (int)sizeof num;
        do {
            num[--k] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        if (i) { fputc(',', out); }
        fwrite(num + k, 1, sizeof num - (size_t)k, out);
    }
    fputs("]}\n", out);
}

int ie_cli_tokenize(int argc, char **argv)
{
    int rc = IE_EXIT_OK;
    const char *path = NULL;
    int flags = IE_TOK_ADD_SPECIAL, lines = 0;
    ie_tokenizer_t *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--tokenizer") == 0) {
            if (i + 1 >= argc) {
                rc = ie_cli_fail(IE_EXIT_USAGE, "--tokenizer needs a PATH");
                usage(stderr);
                goto cleanup;
            }
            path = argv[++i];
        } else if (strncmp(a, "--tokenizer=", 12) == 0) {
            path = a + 12;
        } else if (strcmp(a, "--no-bos") == 0) {
            flags &= ~IE_TOK_ADD_SPECIAL;
        } else if (strcmp(a, "--parse-special") == 0) {
            flags |= IE_TOK_PARSE_SPECIAL;
        } else if (strcmp(a, "--lines") == 0) {
            lines = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            goto cleanup;
        } else {
            rc = ie_cli_fail(IE_EXIT_USAGE, "unknown argument '%s'", a);
            usage(stderr);
            goto cleanup;
        }
    }
    if (!path || !*path) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "--tokenizer PATH is required");
        usage(stderr);
        goto cleanup;
    }

    ie_status_t lst = ie_tokenizer_load(path, &tok);
    if (lst != IE_OK) {
        rc = ie_cli_fail(lst == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_MODEL, "%s", ie_error_last());
        goto cleanup;
    }
    int rr = read_all(stdin, &text, &len);
    if (rr != 0) {
        rc = ie_cli_fail(rr == -2 ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s",
                         rr == -2 ? "out of memory reading stdin" : "cannot read stdin");
        goto cleanup;
    }

    /* Validate first: nothing is printed for an invalid input, and the
     * message names the byte offset in the whole input. */
    ie_status_t st = ie_tokenizer_check_utf8(text, len);
    if (st == IE_OK && lines) {
        size_t start = 0;
        while (start < len && st == IE_OK) {
            const char *nl = memchr(text + start, '\n', len - start);
            size_t end = nl ? (size_t)(nl - text) : len;
            st = ie_tokenizer_encode(tok, text + start, end - start, flags, &ids, &n_ids);
            if (st == IE_OK) {
                print_ids(stdout, ids, n_ids);
                free(ids);
                ids = NULL;
            }
            start = end + 1;
        }
    } else if (st == IE_OK) {
        st = ie_tokenizer_encode(tok, text, len, flags, &ids, &n_ids);
        if (st == IE_OK) { print_ids(stdout, ids, n_ids); }
    }
    if (st == IE_ERR_INVAL) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "input text: %s", ie_error_last());
        goto cleanup;
    }
    if (st != IE_OK) {
        rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "%s", ie_error_last());
        goto cleanup;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) { rc = ie_cli_fail(IE_EXIT_RUNTIME, "cannot write stdout"); }

cleanup:
    free(ids);
    free(text);
    ie_tokenizer_destroy(&tok);
    return rc;
}
