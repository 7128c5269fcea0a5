/* fuzz_grammar.c — libFuzzer target for the JSON Schema compiler and the
 * byte matcher (ie_grammar.h).
 *
 * Input: a schema, a NUL byte, then bytes to feed (no NUL: all schema, and
 * the schema text itself is fed). If the schema compiles, the bytes are
 * fed one at a time; a rejected byte is skipped (the state must then be as
 * before). Oracles beyond "no crash, no leak, no sanitizer report":
 *   - no dead ends: every accepted prefix either is a complete value or
 *     admits some next byte (the mask over a vocabulary of all 256 single
 *     bytes and an end token is not empty);
 *   - the mask agrees with feeding: a byte is in the mask iff the matcher
 *     takes it, and a fresh matcher fed the first 24 accepted bytes at
 *     once agrees on completeness.
 * Seeds: tests/fuzz/corpus_grammar/. Run via scripts/fuzz.sh.
 */
#include "ie_grammar.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ie_gvocab_t *g_v;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static char bytes[257][1];
    const char *ptr[257];
    size_t lens[257];
    uint8_t kind[257];
    for (int i = 0; i < 257; i++) {
        bytes[i][0] = (char)i;
        ptr[i] = bytes[i];
        lens[i] = 1;
        kind[i] = i == 256 ? 2 : 0; /* token 256: the end token */
    }
    if (ie_gvocab_new(257, ptr, lens, kind, &g_v) != IE_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t n_schema = nul ? (size_t)(nul - data) : size;
    char *schema = malloc(n_schema + 1);
    if (!schema) return 0;
    memcpy(schema, data, n_schema);
    schema[n_schema] = '\0';
    const uint8_t *feed = nul ? nul + 1 : data;
    size_t n_feed = nul ? size - n_schema - 1 : size;

    ie_grammar_t *g = NULL;
    ie_gmatch_t *m = NULL;
    char hist[24];
    size_t n_hist = 0;
    uint8_t allow[257];
    if (ie_grammar_compile(schema, &g) != IE_OK) goto done;
    if (ie_gmatch_new(g, &m) != IE_OK) goto done;
    for (size_t i = 0; i < n_feed; i++) {
        int32_t n_allow = ie_gvocab_mask(g_v, m, allow);
        if (n_allow == 0) {
            fprintf(stderr, "dead end after %zu bytes\n", n_hist);
            abort();
        }
        int took = ie_gmatch_feed(m, (const char *)&feed[i], 1);
        if (took != allow[feed[i]]) {
            fprintf(stderr, "mask says %d, feed says %d for byte %u\n", allow[feed[i]], took, feed[i]);
            abort();
        }
        if (took && n_hist < sizeof hist) hist[n_hist++] = (char)feed[i];
        if (took && n_hist < sizeof hist) { /* a replay reaches the same verdicts */
            ie_gmatch_t *c = NULL;
            if (ie_gmatch_new(g, &c) != IE_OK) abort();
            if (!ie_gmatch_feed(c, hist, n_hist)) abort();
            if (ie_gmatch_done(c) != ie_gmatch_done(m)) abort();
            ie_gmatch_destroy(&c);
        }
    }
    if (ie_gvocab_mask(g_v, m, allow) > 0 && allow[256] != ie_gmatch_done(m)) abort();
done:
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);
    free(schema);
    return 0;
}
