/* fuzz_gguf.c — libFuzzer target for the GGUF reader.
 *
 * Parses arbitrary bytes with ie_gguf_open_memory(); when they are accepted,
 * walks every key and tensor through the public getters and touches the first
 * and last byte of every tensor's data, so ASan reports any pointer the
 * validator let escape the buffer. Run via scripts/fuzz.sh.
 */
#include "ie_gguf.h"

#include <stdint.h>
#include <string.h>

static volatile uint8_t g_sink;

/* NUL-terminated copy of a (bounded) GGUF string, for the by-name lookups. */
static void cstr(char *dst, size_t cap, ie_gguf_str_t s)
{
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

static void walk_kv(const ie_gguf_t *g, int64_t i)
{
    char key[512];
    int64_t iv;
    float fv;
    int bv;
    ie_gguf_str_t sv;
    ie_gguf_type_t et;
    uint64_t n;

    cstr(key, sizeof key, ie_gguf_kv_key(g, i));
    (void)ie_gguf_kv_type(g, i);
    (void)ie_gguf_get_i64(g, key, &iv);
    (void)ie_gguf_get_f32(g, key, &fv);
    (void)ie_gguf_get_bool(g, key, &bv);
    if (ie_gguf_get_str(g, key, &sv) == IE_OK && sv.len) g_sink ^= (uint8_t)(sv.ptr[0] ^ sv.ptr[sv.len - 1]);
    if (ie_gguf_get_arr(g, key, &et, &n) != IE_OK || n == 0) return;
    for (uint64_t k = 0; k < n && k < 64; k++) { /* first elements, and the last one below */
        (void)ie_gguf_arr_i64(g, key, k, &iv);
        (void)ie_gguf_arr_f32(g, key, k, &fv);
        if (ie_gguf_arr_str(g, key, k, &sv) == IE_OK && sv.len) g_sink ^= (uint8_t)sv.ptr[sv.len - 1];
    }
    (void)ie_gguf_arr_i64(g, key, n - 1, &iv);
    (void)ie_gguf_arr_str(g, key, n - 1, &sv);
    (void)ie_gguf_arr_i64(g, key, n, &iv); /* out of range */
    if (ie_gguf_arr_data(g, key)) g_sink ^= *(const uint8_t *)ie_gguf_arr_data(g, key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ie_gguf_t *g = NULL;
    char name[512];

    if (ie_gguf_open_memory(data, size, &g) != IE_OK) return 0;
    (void)ie_gguf_version(g);
    (void)ie_gguf_alignment(g);
    for (int64_t i = 0; i < ie_gguf_kv_count(g); i++) walk_kv(g, i);
    for (int64_t i = 0; i < ie_gguf_tensor_count(g); i++) {
        const ie_gguf_tensor_info_t *t = ie_gguf_tensor(g, i);
        const uint8_t *p = t->data;
        (void)ie_gguf_ggml_type_name(t->ggml_type);
        if (t->nbytes) g_sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1]);
        cstr(name, sizeof name, t->name);
        (void)ie_gguf_find_tensor(g, name);
    }
    ie_gguf_destroy(&g);
    return 0;
}
