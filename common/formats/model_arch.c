/* model_arch.c — the architectures the model source reads, one
 * msrc_arch_t each (model_<arch>.c), and lookups by id, name and HF config.
 */
#include "model_src_internal.h"

#include <stdio.h>
#include <string.h>

/* Every architecture, in the order error messages list them. */
static const msrc_arch_t *const k_archs[] = {
    &msrc_arch_llama,    &msrc_arch_gptoss, &msrc_arch_qwen2,  &msrc_arch_qwen3,
    &msrc_arch_qwen3moe, &msrc_arch_phi3,   &msrc_arch_gemma2, &msrc_arch_gemma3,
};

const msrc_arch_t *msrc_arch_by_id(ie_arch_t id)
{
    for (size_t i = 0; i < COUNT(k_archs); i++)
        if (k_archs[i]->id == id) return k_archs[i];
    return NULL;
}

const msrc_arch_t *msrc_arch_by_name(const char *name, size_t len)
{
    for (size_t i = 0; name && i < COUNT(k_archs); i++)
        if (strlen(k_archs[i]->name) == len && memcmp(k_archs[i]->name, name, len) == 0) return k_archs[i];
    return NULL;
}

/* A class in "architectures" wins over "model_type" (a fine-tune may keep
 * another model_type). */
const msrc_arch_t *msrc_arch_by_hf(const cJSON *cfg)
{
    const cJSON *archs = msrc_obj_get(cfg, "architectures"), *mt = msrc_obj_get(cfg, "model_type"), *a;
    if (cJSON_IsArray(archs)) cJSON_ArrayForEach(a, archs)
        {
            if (!cJSON_IsString(a)) continue;
            for (size_t i = 0; i < COUNT(k_archs); i++)
                for (int c = 0; c < 4 && k_archs[i]->hf_classes[c]; c++)
                    if (strcmp(a->valuestring, k_archs[i]->hf_classes[c]) == 0) return k_archs[i];
        }
    if (cJSON_IsString(mt))
        for (size_t i = 0; i < COUNT(k_archs); i++)
            if (strcmp(mt->valuestring, k_archs[i]->hf_model_type) == 0) return k_archs[i];
    return NULL;
}

const char *msrc_arch_list(char *buf, size_t cap)
{
    size_t at = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < COUNT(k_archs) && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s'%s'", i ? ", " : "", k_archs[i]->name);
    return buf;
}

/* Contract (ie_model_src.h). */
const char *ie_arch_name(ie_arch_t id)
{
    const msrc_arch_t *a = msrc_arch_by_id(id);
    return a ? a->name : NULL;
}

/* Contract (ie_model_src.h). */
int ie_arch_from_name(const char *name, ie_arch_t *out)
{
    const msrc_arch_t *a = name ? msrc_arch_by_name(name, strlen(name)) : NULL;
    if (a && out) *out = a->id;
    return a != NULL;
}
