/* fuzz_safetensors.c — libFuzzer target for the safetensors reader.
 *
 * Parses arbitrary bytes with ie_safetensors_open_memory(); when accepted,
 * looks every tensor up by name and touches the first and last byte of its
 * data so ASan reports anything the validator let escape the buffer. Run via
 * scripts/fuzz.sh.
 */
#include "ie_safetensors.h"

#include <stdint.h>

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ie_safetensors_t *st = NULL;

    if (ie_safetensors_open_memory(data, size, &st) != IE_OK) return 0;
    for (int64_t i = 0; i < ie_safetensors_count(st); i++) {
        const ie_safetensors_tensor_t *t = ie_safetensors_get(st, i);
        const uint8_t *p = t->data;
        if (ie_safetensors_find(st, t->name) == NULL) __builtin_trap(); /* every name must be findable */
        if (t->nbytes) g_sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1]);
        g_sink ^= (uint8_t)(t->dtype_str[0] + t->ndim);
    }
    ie_safetensors_destroy(&st);
    return 0;
}
