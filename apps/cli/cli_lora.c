/* cli_lora.c — the --lora / --adapter flags of the modes that run a model
 * (ie_cli_lora_setup): load the adapters into the engine, find the one
 * asked for. Here rather than in cli_common.c: it needs the engine, which
 * the ie_cli library does not link. */
#include "ie_cli.h"
#include "ie_engine.h"

/* Contract (ie_cli.h). */
int ie_cli_lora_setup(struct ie_engine *eng, const char *mode, const ie_cli_loras_t *l, const char *adapter,
                      int *id_out)
{
    *id_out = -1;
    for (int i = 0; l && i < l->n; i++) {
        ie_status_t st = ie_engine_lora_load(eng, l->name[i], l->path[i], 1.0f);
        if (st != IE_OK)
            return ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_MODEL, "%s: lora %s: %s", mode,
                               l->name[i], ie_error_last());
    }
    if (adapter && (*id_out = ie_engine_lora_find(eng, adapter)) < 0)
        return ie_cli_fail(IE_EXIT_USAGE, "%s: --adapter %s: no --lora of that name", mode, adapter);
    return 0;
}
