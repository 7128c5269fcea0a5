/* fuzz_embd.c — libFuzzer target for /v1/embeddings' request parser
 * (ie_embd_parse): any bytes as the body, against the tiny Llama
 * fixture's tokenizer (run from the repository root); an accepted request
 * must hold 1..IE_EMBD_MAX_INPUTS inputs of 1..n_ctx ids in the
 * vocabulary. */
#include "ie_embd.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static ie_tokenizer_t *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (ie_tokenizer_load("tests/data/tiny_llama/tokenizer.json", &g_tok) != IE_OK) {
        fprintf(stderr, "fuzz_embd: run from the repository root (%s)\n", ie_error_last());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ie_embd_req_t r;
    ie_embd_err_t e;
    if (ie_embd_parse((const char *)data, size, g_tok, 512, 64, &r, &e) != IE_OK) return 0;
    if (r.n_in < 1 || r.n_in > IE_EMBD_MAX_INPUTS) abort();
    for (size_t i = 0; i < r.n_in; i++) {
        if (r.n_ids[i] < 1 || r.n_ids[i] > 64) abort();
        for (size_t j = 0; j < r.n_ids[i]; j++)
            if (r.ids[i][j] < 0 || r.ids[i][j] >= 512) abort();
    }
    ie_embd_req_free(&r);
    return 0;
}
