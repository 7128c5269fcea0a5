/* serve_oai_lora.c — the HTTP API's LoRA parts (ie_serve_lora.h). */
#include "ie_serve_lora.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int fail(ie_oai_err_t *e, unsigned status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ie_oai_err_set with the type that goes with the status. */
static int fail(ie_oai_err_t *e, unsigned status, const char *code, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ie_oai_err_vset(e, status, status >= 500 ? "server_error" : "invalid_request_error", code, param, fmt, ap);
    va_end(ap);
    return -1;
}

/* Contract (ie_serve_lora.h). */
int ie_oai_lora_lease(ie_lora_cache_t *lc, const cJSON *root, const char *base, ie_lora_lease_t *out,
                      ie_oai_err_t *e)
{
    ie_lora_use_t uses[IE_LORA_SET_PARTS];
    char names[IE_LORA_SET_PARTS][IE_LORA_NAME_MAX];
    int n = 0;
    *out = (ie_lora_lease_t){-1, 0, -1};
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "lora");
    if (cJSON_IsString(model) && strcmp(model->valuestring, base)) {
        /* vLLM's convention: the model field names an adapter */
        if (ie_lora_cache_index(lc, model->valuestring) < 0)
            return fail(e, 404, "model_not_found", "model",
                        "The model '%.200s' does not exist (this server has '%.200s')", model->valuestring, base);
        snprintf(names[n], sizeof names[n], "%s", model->valuestring);
        uses[n] = (ie_lora_use_t){names[n], NAN};
        n++;
    }
    if (list && !cJSON_IsNull(list)) {
        const cJSON *it;
        int k = 0;
        if (!cJSON_IsArray(list))
            return fail(e, 400, "invalid_value", "lora",
                        "'lora' must be an array of {\"id\" or \"name\", \"scale\"}");
        cJSON_ArrayForEach(it, list)
        {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(it, "scale");
            double scale = 1.0;
            if (!cJSON_IsObject(it) || (!id == !nm))
                return fail(e, 400, "invalid_value", "lora",
                            "lora[%d] must be an object with one of \"id\" and \"name\"", k);
            if (sc && !cJSON_IsNumber(sc))
                return fail(e, 400, "invalid_value", "lora", "lora[%d].scale must be a number", k);
            if (sc) scale = sc->valuedouble;
            if (!isfinite(scale) || fabs(scale) > 1e6)
                return fail(e, 400, "invalid_value", "lora", "lora[%d].scale is out of range", k);
            if (n >= IE_LORA_SET_PARTS)
                return fail(e, 400, "invalid_value", "lora", "at most %d adapters per request", IE_LORA_SET_PARTS);
            if (id) {
                double v = cJSON_IsNumber(id) ? id->valuedouble : -1;
                if (v < 0 || v != floor(v) || v >= IE_LORA_CACHE_MAX ||
                    ie_lora_cache_name_at(lc, (int)v, names[n]) != 0)
                    return fail(e, 404, "model_not_found", "lora", "lora[%d].id: no adapter has that id", k);
            } else if (!cJSON_IsString(nm)) {
                return fail(e, 400, "invalid_value", "lora", "lora[%d].name must be a string", k);
            } else if (ie_lora_cache_index(lc, nm->valuestring) < 0) {
                return fail(e, 404, "model_not_found", "lora", "The lora adapter '%.200s' cannot be found.",
                            nm->valuestring);
            } else {
                snprintf(names[n], sizeof names[n], "%s", nm->valuestring);
            }
            for (int j = 0; j < n; j++)
                if (!strcmp(names[j], names[n]))
                    return fail(e, 400, "invalid_value", "lora", "adapter '%s' is named twice", names[n]);
            k++;
            if (scale == 0) continue; /* llama.cpp: a zero scale turns it off */
            uses[n] = (ie_lora_use_t){names[n], (float)scale};
            n++;
        }
    }
    if (n == 0) return 0;
    ie_status_t st = ie_lora_cache_acquire(lc, uses, n, out);
    if (st == IE_OK) return 0;
    if (st == IE_ERR_RANGE) /* unloaded since it was looked up */
        return fail(e, 404, "model_not_found", "model", "%s", ie_error_last());
    if (st == IE_ERR_BUSY) return fail(e, 503, "unavailable", NULL, "%s", ie_error_last());
    if (st == IE_ERR_INVAL) return fail(e, 400, "invalid_value", "lora", "%s", ie_error_last());
    return fail(e, 500, "internal", NULL, "LoRA adapter could not be attached: %s", ie_error_last());
}

/* Contract (ie_serve_lora.h). */
int ie_oai_lora_admin(ie_lora_cache_t *lc, int unload, const cJSON *root, char *msg, size_t msg_cap,
                      ie_oai_err_t *e)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "lora_name");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(root, "lora_path");
    const cJSON *pin = cJSON_GetObjectItemCaseSensitive(root, "pinned");
    if (!cJSON_IsObject(root)) return fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
    if (unload) {
        int deferred = 0;
        if (!cJSON_IsString(name) || !*name->valuestring)
            return fail(e, 400, "invalid_value", "lora_name", "'lora_name' must be provided.");
        if (ie_lora_cache_unload(lc, name->valuestring, &deferred) != IE_OK)
            return fail(e, 404, "model_not_found", "lora_name", "The lora adapter '%.200s' cannot be found.",
                        name->valuestring);
        snprintf(msg, msg_cap, "Success: LoRA adapter '%s' removed successfully.%s", name->valuestring,
                 deferred ? " (requests running it finish first)" : "");
        return 0;
    }
    if (!cJSON_IsString(name) || !*name->valuestring || !cJSON_IsString(path) || !*path->valuestring)
        return fail(e, 400, "invalid_value", NULL, "Both 'lora_name' and 'lora_path' must be provided.");
    if (pin && !cJSON_IsBool(pin)) return fail(e, 400, "invalid_value", "pinned", "'pinned' must be a boolean");
    if (ie_lora_cache_load(lc, name->valuestring, path->valuestring, 1.0f, cJSON_IsTrue(pin)) != IE_OK)
        return fail(e, 400, "invalid_value", "lora_path", "%s", ie_error_last());
    snprintf(msg, msg_cap, "Success: LoRA adapter '%s' added successfully.", name->valuestring);
    return 0;
}
