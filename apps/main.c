/* main.c — `inference-engine`: the embedded engine's command line.
 *
 *   inference-engine --model PATH --prompt TEXT [options]   generate; prints
 *                                                         one JSON line
 *   inference-engine tokenize --tokenizer PATH ...         text -> ids
 *   inference-engine perplexity --model PATH --file TEXT --ctx N
 *   inference-engine logits --model PATH --ids 1,2,3 --out FILE
 *   inference-engine serve --model PATH [--port 8080]   the OpenAI-compatible
 *                                                     HTTP API (docs/HTTP.md)
 *
 * Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input, 3 model
 * missing/unreadable/invalid, 5 engine creation failed, 6 out of memory.
 * See docs/CLI.md.
 */
#include "ie_cli.h"
#include "ie_cpulat.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    /* IE_CPU_LATENCY_US: a PM QoS request held while the command runs */
    if (ie_cpulat_apply(NULL, "inference-engine") != IE_OK) {
        return ie_cli_fail(IE_EXIT_USAGE, "%s", ie_error_last());
    }
    if (argc > 1) {
        if (!strcmp(argv[1], "tokenize")) return ie_cli_tokenize(argc - 1, argv + 1);
        if (!strcmp(argv[1], "perplexity")) return ie_cli_perplexity(argc - 1, argv + 1);
        if (!strcmp(argv[1], "logits")) return ie_cli_logits(argc - 1, argv + 1);
        if (!strcmp(argv[1], "serve")) return ie_cli_serve(argc - 1, argv + 1);
        if (!strcmp(argv[1], "embed")) return ie_cli_embed(argc - 1, argv + 1);
    }
    return ie_cli_run(argc, argv);
}
