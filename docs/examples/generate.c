/* generate.c — the installed library from outside the tree: load a model,
 * stream a greedy continuation of a prompt to stdout, print the metrics.
 *
 *   cc generate.c $(pkg-config --cflags --libs clocher) -o generate
 *   ./generate models/SmolLM2-135M-Instruct.Q4_1.gguf ["prompt" [max_tokens]]
 */
#include <clocher.h>

#include <stdio.h>
#include <stdlib.h>

/* Called after every token with the text it completed (maybe empty). */
static int print_piece(void *user, int32_t id, const char *text, size_t len)
{
    (void)user;
    (void)id;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* nonzero would stop the generation */
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [PROMPT [MAX_TOKENS]]\n", argv[0]);
        return 2;
    }
    const char *prompt = argc > 2 ? argv[2] : "The capital of France is";
    const char *max_tokens = argc > 3 ? argv[3] : "32";
    int rc = 1;
    ie_params_t *opts = NULL, *gen = NULL;
    ie_engine_t *e = NULL;
    char *text = NULL;
    ie_gen_info_t info;
    ie_engine_metrics_t m;

    if (ie_params_new(&opts) != IE_OK || ie_params_set(opts, "threads", "2") != IE_OK ||
        ie_params_set(opts, "pin", "0") != IE_OK)
        goto fail;
    if (ie_engine_create(argv[1], opts, &e) != IE_OK) goto fail;
    if (ie_params_new(&gen) != IE_OK || ie_params_set(gen, "max_tokens", max_tokens) != IE_OK ||
        ie_params_set(gen, "temperature", "0") != IE_OK)
        goto fail;

    printf("%s", prompt);
    if (ie_engine_generate(e, prompt, gen, print_piece, NULL, &text, &info) != IE_OK) goto fail;
    printf("\n");
    if (ie_engine_get_metrics(e, &m) != IE_OK) goto fail;
    fprintf(stderr, "clocher %s: %zu prompt + %zu generated tokens (%s), TTFT %.1f ms, %.1f tokens/s\n",
            ie_version(), info.n_prompt, info.n_gen, info.finish, info.ttft_ms, m.tps);
    rc = info.n_gen > 0 ? 0 : 1;
    goto done;

fail:
    fprintf(stderr, "error: %s\n", ie_error_last());
done:
    ie_free(text);
    ie_params_destroy(&gen);
    ie_params_destroy(&opts);
    ie_engine_destroy(&e);
    return rc;
}
