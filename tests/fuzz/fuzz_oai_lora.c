/* fuzz_oai_lora.c — libFuzzer target for the HTTP API's LoRA fields
 * (serve_oai_lora.c): a request body's `model` + llama.cpp `lora` list
 * (ie_oai_lora_lease) and vLLM's unload body (ie_oai_lora_admin), over a
 * registry with one adapter name whose weights cannot load (so a lease
 * that gets as far as attaching fails cleanly: no file is read but that
 * one missing path). Checks: every answer is 0 or an error with a status
 * the docs list; a lease is the base's or one the registry gave. Load
 * bodies are not fuzzed (they read arbitrary paths). Seeds:
 * tests/fuzz/corpus_oai_lora. Run via scripts/fuzz.sh.
 */
#include "ie_backend.h"
#include "ie_serve_lora.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static ie_status_t f_step(void *self, const ie_batch_t *b, float *out)
{
    (void)self, (void)b, (void)out;
    return IE_OK;
}
static void f_clear(void *self, int seq) { (void)self, (void)seq; }
static ie_status_t f_set_len(void *self, int seq, int n)
{
    (void)self, (void)seq, (void)n;
    return IE_OK;
}
static ie_status_t f_bind(void *self, int seq, int first, const int32_t *pb, int n)
{
    (void)self, (void)seq, (void)first, (void)pb, (void)n;
    return IE_OK;
}
static const ie_backend_ops_t k_ops = {
    .name = "fuzz", .step = f_step, .seq_clear = f_clear, .seq_set_len = f_set_len, .kv_bind = f_bind};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ie_backend_t *be;
    static ie_lora_cache_t *lc;
    static ie_hparams_t hp;
    if (!be) {
        ie_backend_geom_t g = {
            .n_seq = 1, .n_ctx = 16, .max_batch = 4, .kv_block = 16, .kv_blocks = 1, .n_vocab = 8, .upkeep_ms = 50};
        if (ie_backend_new(&k_ops, NULL, &g, &be) != IE_OK) __builtin_trap();
        ie_lora_cache_opts_t o = {.backend = be, .hp = &hp};
        if (ie_lora_cache_new(&o, &lc) != IE_OK) __builtin_trap();
    }
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    cJSON *root = cJSON_Parse(s);
    free(s);
    if (!root) return 0;
    ie_lora_lease_t l;
    ie_oai_err_t e;
    if (ie_oai_lora_lease(lc, root, "base", &l, &e) == 0) {
        if (l.id != -1 || l.salt != 0) __builtin_trap(); /* nothing can attach here */
    } else if (e.status != 400 && e.status != 404 && e.status != 500 && e.status != 503) {
        __builtin_trap();
    }
    char msg[256];
    if (ie_oai_lora_admin(lc, 1, root, msg, sizeof msg, &e) == 0) __builtin_trap(); /* nothing to unload */
    if (e.status != 400 && e.status != 404) __builtin_trap();
    cJSON_Delete(root);
    return 0;
}
