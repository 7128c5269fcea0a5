/* cli_lora.c — the --lora / --adapter flags of the modes that run a model
 * (ie_cli_lora_setup): load the adapters into the engine, attach the set
 * asked for. Here rather than in cli_common.c: it needs the engine, which
 * the ie_cli library does not link. */
#include "ie_cli.h"
#include "ie_engine.h"
#include "ie_lora_cache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Contract (ie_cli.h). */
int ie_cli_lora_attach(struct ie_engine *eng, const char *spec, int *id_out, char *err, size_t err_cap)
{
    ie_lora_use_t uses[IE_LORA_SET_PARTS];
    char names[IE_LORA_SET_PARTS][IE_LORA_NAME_MAX];
    ie_lora_lease_t l;
    int n = 0;
    *id_out = -1;
    for (const char *p = spec; p && *p;) {
        const char *end = strchr(p, ','), *stop = end ? end : p + strlen(p);
        const char *colon = memchr(p, ':', (size_t)(stop - p));
        size_t nl = (size_t)((colon ? colon : stop) - p);
        float scale = NAN; /* the adapter's default */
        if (n >= IE_LORA_SET_PARTS || nl == 0 || nl >= IE_LORA_NAME_MAX || (end && !end[1])) {
            snprintf(err, err_cap, "bad adapter set '%s' (NAME[:SCALE][,NAME[:SCALE]...], at most %d)", spec,
                     IE_LORA_SET_PARTS);
            return IE_EXIT_USAGE;
        }
        if (colon) {
            char *e = NULL;
            scale = strtof(colon + 1, &e);
            if (e != stop || e == colon + 1 || !isfinite(scale)) {
                snprintf(err, err_cap, "bad scale in adapter set '%s'", spec);
                return IE_EXIT_USAGE;
            }
        }
        memcpy(names[n], p, nl);
        names[n][nl] = '\0';
        uses[n] = (ie_lora_use_t){names[n], scale};
        n++;
        p = end ? end + 1 : stop;
    }
    if (n == 0) return 0;
    /* leased for the process's life: never evicted under the run */
    ie_status_t st = ie_lora_cache_acquire(ie_engine_lora_cache(eng), uses, n, &l);
    if (st != IE_OK) {
        snprintf(err, err_cap, "%s", st == IE_ERR_RANGE ? "no --lora of that name" : ie_error_last());
        return st == IE_ERR_RANGE || st == IE_ERR_INVAL ? IE_EXIT_USAGE
               : st == IE_ERR_NOMEM                     ? IE_EXIT_NOMEM
                                                        : IE_EXIT_MODEL;
    }
    *id_out = l.id;
    return 0;
}

/* Contract (ie_cli.h). */
int ie_cli_lora_budget(const char *mb, uint64_t *bytes_out)
{
    char *end = NULL;
    *bytes_out = 0;
    if (!mb) return 0;
    double v = strtod(mb, &end);
    if (end == mb || *end || !isfinite(v) || v < 0 || v > 1e9) return -1;
    *bytes_out = (uint64_t)(v * 1048576.0);
    return 0;
}

/* Contract (ie_cli.h). */
int ie_cli_lora_setup(struct ie_engine *eng, const char *mode, const ie_cli_loras_t *l, const char *adapter,
                      int *id_out)
{
    char err[300];
    int rc, id;
    *id_out = -1;
    for (int i = 0; l && i < l->n; i++) {
        ie_status_t st = ie_engine_lora_load(eng, l->name[i], l->path[i], 1.0f);
        if (st != IE_OK)
            return ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_MODEL, "%s: lora %s: %s", mode,
                               l->name[i], ie_error_last());
        /* attached once now, so that a backend that cannot run adapters
         * (a cluster plan) says so before any work */
        if ((rc = ie_cli_lora_attach(eng, l->name[i], &id, err, sizeof err)) != 0)
            return ie_cli_fail(rc, "%s: lora %s: %s", mode, l->name[i], err);
    }
    if (adapter && (rc = ie_cli_lora_attach(eng, adapter, id_out, err, sizeof err)) != 0)
        return ie_cli_fail(rc, "%s: --adapter %s: %s", mode, adapter, err);
    return 0;
}
