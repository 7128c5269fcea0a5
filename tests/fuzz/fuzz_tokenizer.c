/* fuzz_tokenizer.c — libFuzzer target for the tokenizer's outside inputs.
 *
 * First byte picks the mode:
 *   even: the rest is a tokenizer.json (written to a private temp dir, since
 *         the loader reads files); if it loads, encode a fixed text and
 *         decode every id.
 *   odd:  the rest is text for two real tokenizers (byte-level BPE from a
 *         tokenizer.json, SentencePiece BPE from a vocab GGUF; run from the
 *         repository root), with and without special-token parsing; every
 *         id is streamed back through the detokenizer.
 */
#include "ie_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_json_path[256];
static ie_tokenizer_t *g_bpe, *g_spm;

static void roundtrip(const ie_tokenizer_t *t, const char *text, size_t len, int flags)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (ie_tokenizer_encode(t, text, len, flags, &ids, &n) != IE_OK) return;
    ie_detok_t *d = NULL;
    if (ie_detok_new(t, &d) == IE_OK) {
        for (size_t i = 0; i < n; i++) (void)ie_detok_push(d, ids[i]);
        (void)ie_detok_flush(d);
        ie_detok_destroy(&d);
    }
    char buf[64];
    for (size_t i = 0; i < n; i++) (void)ie_tokenizer_token_bytes(t, ids[i], 1, buf, sizeof buf);
    free(ids);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char dir[] = "/tmp/fuzz_tok_XXXXXX";
    if (!mkdtemp(dir)) abort();
    snprintf(g_json_path, sizeof g_json_path, "%s/tok.json", dir);
    if (ie_tokenizer_load("tests/data/tiny_llama/tokenizer.json", &g_bpe) != IE_OK ||
        ie_tokenizer_load("tests/data/ggml-vocab-llama-spm.gguf", &g_spm) != IE_OK) {
        fprintf(stderr, "fuzz_tokenizer: run from the repository root (%s)\n", ie_error_last());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    if (data[0] & 1) {
        for (int flags = 0; flags < 4; flags++) {
            roundtrip(g_bpe, rest, len, flags);
            roundtrip(g_spm, rest, len, flags);
        }
        return 0;
    }
    FILE *f = fopen(g_json_path, "wb");
    if (!f) abort();
    fwrite(rest, 1, len, f);
    fclose(f);
    ie_tokenizer_t *t = NULL;
    if (ie_tokenizer_load(g_json_path, &t) == IE_OK) {
        static const char text[] = "Hello world! 123 <s> <|im_start|> \xc3\xa9\xe2\x82\xac";
        roundtrip(t, text, sizeof text - 1, IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL);
        roundtrip(t, text, sizeof text - 1, 0);
        ie_tokenizer_destroy(&t);
    }
    return 0;
}
