/* fuzz_tokapi.c — libFuzzer target for the bodies of POST /tokenize and
 * /detokenize (coordinator/src/serve_tok.c). The first byte picks the
 * endpoint (even: /tokenize, odd: /detokenize), the rest is the body, parsed
 * by cJSON as the server does; every object goes through the handler with
 * a real tokenizer (run from the repository root). An answer must be an
 * object, a refusal must name its reason. */
#include "../../coordinator/src/serve_tok.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ie_tokenizer_t *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (ie_tokenizer_load("tests/data/tiny_llama/tokenizer.json", &g_tok) != IE_OK) {
        fprintf(stderr, "fuzz_tokapi: run from the repository root (%s)\n", ie_error_last());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    cJSON *root = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return 0;
    }
    cJSON *out = NULL;
    ie_tokapi_err_t e = {0};
    int rc = data[0] & 1 ? ie_tokapi_detokenize(g_tok, root, &out, &e)
                         : ie_tokapi_tokenize(g_tok, 4096, root, NULL, 0, &out, &e);
    if (rc == 0 && !cJSON_IsObject(out)) abort();
    if (rc != 0 && (out || !e.message[0])) abort();
    cJSON_Delete(out);
    cJSON_Delete(root);
    return 0;
}
