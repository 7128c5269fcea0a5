/* ie_serve_lora.h — the HTTP API's LoRA parts (serve_oai_lora.c), kept
 * out of serve_http.c: a request's adapter set (OpenAI `model` naming an
 * adapter, llama.cpp's `lora: [{"id"|"name", "scale"}]`) and vLLM's
 * POST /v1/load_lora_adapter and /v1/unload_lora_adapter (docs/HTTP.md,
 * docs/LORA.md). The caller turns errors into OpenAI's error shape.
 */
#ifndef IE_SERVE_LORA_H
#define IE_SERVE_LORA_H

#include "ie_lora_cache.h"
#include "ie_oai_err.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* The adapter set a request body asks for, leased into *out: `model`
 * (NULL, null, the base's name `base`, or an adapter's name: that adapter
 * at its default scale) plus the `lora` list (absent, null or an array of
 * at most 8 objects {"id": registry index | "name": string, "scale":
 * finite number, default 1}; scale 0 parts are dropped). No parts: the
 * base's lease (id -1). Returns 0, or -1 with *e filled (404
 * model_not_found for an unknown model or adapter, 400 invalid_value for
 * a malformed list, 503 when every adapter set is in use, 500 when an
 * evicted adapter cannot be reloaded). The caller releases the lease
 * (ie_lora_cache_release) at the request's end. */
int ie_oai_lora_lease(ie_lora_cache_t *lc, const cJSON *root, const char *base, ie_lora_lease_t *out,
                      ie_oai_err_t *e);

/* POST /v1/load_lora_adapter (unload 0: {"lora_name", "lora_path"[,
 * "pinned": bool]}) or /v1/unload_lora_adapter (unload 1: {"lora_name"})
 * with the parsed body root. On success returns 0 and writes vLLM's plain
 * text answer into msg; else -1 with *e: 400 for a missing or bad field,
 * a name taken or an adapter that does not load (the loader's message),
 * 404 for unloading an unknown name. */
int ie_oai_lora_admin(ie_lora_cache_t *lc, int unload, const cJSON *root, char *msg, size_t msg_cap,
                      ie_oai_err_t *e);

#endif
