/* fuzz_lora.c — libFuzzer target for the LoRA adapter reader (PEFT
 * adapter_config.json + adapter_model.safetensors, ie_lora.h).
 *
 * Input: a little-endian u16 n, then n bytes of config JSON, then the
 * safetensors image. Loads them with ie_lora_load_peft_memory against a
 * fixed tiny Llama (the tests' fixture shapes, GGUF row order so the q/k
 * permutation runs too); when accepted, reads every element of every
 * matrix so ASan reports anything the checks let escape. Seeds:
 * tests/fuzz/corpus_lora (from tests/data/lora). Run via scripts/fuzz.sh.
 */
#include "ie_lora.h"

#include <stdint.h>
#include <string.h>

static volatile float g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ie_hparams_t hp;
    ie_lora_t *a = NULL;
    if (size < 2) return 0;
    const size_t n = (size_t)data[0] | (size_t)data[1] << 8;
    if (n > size - 2) return 0;
    memset(&hp, 0, sizeof hp);
    strcpy(hp.arch, "llama");
    hp.n_layer = 2, hp.n_embd = 64, hp.n_ff = 128, hp.n_head = 4, hp.n_head_kv = 2, hp.head_dim = 16;
    hp.n_vocab = 512, hp.rope_layout = IE_ROPE_NORMAL;
    if (ie_lora_load_peft_memory((const char *)data + 2, n, data + 2 + n, size - 2 - n, &hp, &a) != IE_OK) return 0;
    for (int l = 0; l < a->n_layer; l++)
        for (int m = 0; m < IE_LORA_NMOD; m++) {
            const ie_lora_mat_t *mt = ie_lora_mat(a, l, (ie_lora_mod_t)m);
            if (!mt->rank) continue;
            float s = 0;
            for (int64_t i = 0; i < mt->rank * mt->n_in; i++) s += mt->a ? mt->a[i] : (float)mt->a16[i];
            for (int64_t i = 0; i < mt->rank * mt->n_out; i++) s += mt->bt ? mt->bt[i] : (float)mt->bt16[i];
            g_sink += s;
        }
    ie_lora_destroy(&a);
    return 0;
}
