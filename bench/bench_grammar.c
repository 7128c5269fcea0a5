/* bench_grammar.c — time of one structured-output token mask
 * (ie_gvocab_apply, coordinator/src/grammar.c) on a real vocabulary.
 *
 *   bench_grammar TOKENIZER [REPS]   (a GGUF or tokenizer.json)
 *
 * Tokenizes a JSON document that fits the schema below, then walks its
 * tokens through a matcher, timing the mask before each one (REPS times,
 * the minimum kept per position) — the scheduler's per-row, per-step cost.
 * Prints the trie build time and the mean / max mask time.
 */
#include "ie_clock.h"
#include "ie_grammar.h"
#include "ie_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"role\":{\"enum\":[\"engineer\","
    "\"artist\"]},\"skills\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"age\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":150}},\"required\":[\"name\",\"role\",\"skills\",\"age\"]}";
static const char *const DOC = "{\"name\": \"Ada Lovelace, mathematician of London\", \"role\": \"engineer\", "
                               "\"skills\": [\"analysis\", \"poetry of science\", \"notes on the engine\"], "
                               "\"age\": 36}";

int main(int argc, char **argv)
{
    int rc = 1;
    ie_tokenizer_t *tok = NULL;
    ie_gvocab_t *v = NULL;
    ie_grammar_t *g = NULL;
    ie_gmatch_t *m = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    size_t n = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s TOKENIZER [REPS]\n", argv[0]);
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1) reps = 1;
    if (ie_tokenizer_load(argv[1], &tok) != IE_OK) goto fail;
    double t0 = ie_now_ms();
    if (ie_gvocab_from_tokenizer(tok, NULL, 0, &v) != IE_OK) goto fail;
    double t_build = ie_now_ms() - t0;
    if (ie_grammar_compile(SCHEMA, &g) != IE_OK || ie_gmatch_new(g, &m) != IE_OK) goto fail;
    if (ie_tokenizer_encode(tok, DOC, strlen(DOC), 0, &ids, &n) != IE_OK) goto fail;
    if (!(logits = malloc((size_t)ie_gvocab_n(v) * sizeof *logits))) goto fail;
    double sum = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            for (int32_t k = 0; k < ie_gvocab_n(v); k++) logits[k] = 0;
            double a = ie_now_ms();
            if (ie_gvocab_apply(v, m, logits) != IE_OK) goto fail;
            double t = ie_now_ms() - a;
            if (t < best) best = t;
        }
        sum += best;
        if (best > mx) mx = best;
        if (ie_gvocab_accept(v, m, ids[i]) != IE_OK) {
            fprintf(stderr, "token %zu (%d) rejected: the document does not fit the schema\n", i, ids[i]);
            goto fail;
        }
    }
    printf("vocabulary %d tokens: trie built in %.1f ms\n", ie_gvocab_n(v), t_build);
    printf("mask over %zu steps: mean %.3f ms, max %.3f ms (min of %d reps each)\n", n, sum / (double)n, mx, reps);
    printf("complete at the end: %d\n", ie_gmatch_done(m));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_grammar: %s\n", ie_error_last());
done:
    free(logits);
    free(ids);
    ie_gmatch_destroy(&m);
    ie_grammar_destroy(&g);
    ie_gvocab_destroy(&v);
    ie_tokenizer_destroy(&tok);
    return rc;
}
