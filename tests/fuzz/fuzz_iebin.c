/* fuzz_iebin.c — libFuzzer target for the IEBIN reader (ie_iebin_open_memory).
 *
 * Input: u8 flags, u32 json_len (little-endian, clamped to what is left),
 * json_len bytes of model.ie.json, then the rest as model.ie.bin. flags bit 0
 * set turns the per-tensor hash check off (IE_IEBIN_VERIFY=0), so mutated
 * blob bytes reach the BSR validator instead of stopping at the hash. The
 * blob is copied into a 64-byte aligned buffer of exactly its size (as a
 * mapping would be aligned), so ASan sees any read past its end. Accepted
 * models are walked: every tensor's first and last byte is touched.
 *
 * Seeds (tests/fuzz/corpus_iebin/) come from the writer itself: build this
 * file on its own with -DIE_IEBIN_MAKE_SEEDS and run it with the corpus
 * directory (see make_seeds below). Run the fuzzer via scripts/fuzz.sh.
 */
#include "ie_iebin.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint8_t g_sink;

#ifndef IE_IEBIN_MAKE_SEEDS

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ie_iebin_t *m = NULL;
    uint32_t jl;
    uint8_t *blob = NULL;
    size_t bl;

    if (size < 5) return 0;
    memcpy(&jl, data + 1, 4);
    if (jl > size - 5) jl = (uint32_t)(size - 5);
    bl = size - 5 - jl;
    if (bl && !(blob = aligned_alloc(64, (bl + 63) & ~(size_t)63))) return 0;
    if (bl) memcpy(blob, data + 5 + jl, bl);
    if (data[0] & 1) setenv("IE_IEBIN_VERIFY", "0", 1);
    else unsetenv("IE_IEBIN_VERIFY");
    if (ie_iebin_open_memory((const char *)data + 5, jl, blob, bl, NULL, &m) == IE_OK) {
        const ie_hparams_t *hp = ie_iebin_hparams(m);
        g_sink ^= (uint8_t)(hp->n_layer + hp->arch[0] + ie_iebin_tokenizer_path(m)[0] +
                            ie_iebin_content_hash(m)[9]);
        for (int64_t i = 0; i < ie_iebin_n_tensors(m); i++) {
            const ie_tensor_t *t = ie_iebin_tensor(m, i);
            const uint8_t *p = t ? t->data : NULL;
            if (!t || !t->nbytes || p < blob || t->nbytes > bl || p - blob > (ptrdiff_t)(bl - t->nbytes))
                __builtin_trap(); /* the validator let a tensor escape the blob */
            g_sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1] ^ t->name[0]);
        }
        ie_iebin_destroy(&m);
    }
    free(blob);
    return 0;
}

#else /* seed writer: cc -DIE_IEBIN_MAKE_SEEDS ... fuzz_iebin.c; ./a.out tests/fuzz/corpus_iebin TOKENIZER_JSON */

#include "ie_bsr.h"
#include "ie_pack.h"

#include <stdio.h>

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *b;
    long len;
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = malloc((size_t)len + 1);
    if (fread(b, 1, (size_t)len, f) != (size_t)len) abort();
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Write model dir `tmp` as one seed file: flags, json_len, json, blob. */
static void seed(const char *tmp, const char *out, uint8_t flags)
{
    char p[512];
    size_t jn, bn;
    char *j, *b;
    uint32_t jl;
    FILE *f = fopen(out, "wb");
    snprintf(p, sizeof p, "%s/%s", tmp, IE_IEBIN_JSON);
    j = slurp(p, &jn);
    snprintf(p, sizeof p, "%s/%s", tmp, IE_IEBIN_BIN);
    b = slurp(p, &bn);
    jl = (uint32_t)jn;
    fwrite(&flags, 1, 1, f);
    fwrite(&jl, 4, 1, f);
    fwrite(j, 1, jn, f);
    fwrite(b, 1, bn, f);
    fclose(f);
    free(j);
    free(b);
}

static ie_hparams_t hp_tiny(int gptoss)
{
    ie_hparams_t hp;
    memset(&hp, 0, sizeof hp);
    hp.arch_id = gptoss ? IE_ARCH_GPTOSS : IE_ARCH_LLAMA;
    snprintf(hp.name, sizeof hp.name, "seed");
    hp.n_layer = 2, hp.n_embd = 64, hp.n_ff = 64, hp.n_head = 4, hp.n_head_kv = 2, hp.head_dim = 16;
    hp.n_vocab = 32, hp.n_ctx_train = 64, hp.rope_dim = 16, hp.rope_theta = 1e4f, hp.rms_eps = 1e-5f;
    if (gptoss) {
        hp.n_expert = 4, hp.n_expert_used = 2, hp.sliding_window = 8, hp.layer_swa[0] = 1;
        hp.attn_bias = hp.attn_sinks = 1, hp.swiglu_limit = 7, hp.swiglu_alpha = 1.702f;
        hp.rope_yarn_factor = 32, hp.rope_yarn_orig_ctx = 32, hp.rope_yarn_beta_fast = 32,
        hp.rope_yarn_beta_slow = 1;
        hp.rope_attn_factor = 1.3f, hp.rope_layout = IE_ROPE_NEOX;
    }
    return hp;
}

int main(int argc, char **argv)
{
    static uint8_t bytes[8192];
    char tmp[] = "/tmp/iebin_seedXXXXXX", out[512];
    ie_iebin_writer_t *w = NULL;
    ie_hparams_t hp = hp_tiny(0);
    float dense[32 * 32] = {0};
    void *bsr = NULL;
    size_t bsr_n = 0;

    if (argc < 3 || !mkdtemp(tmp)) return 2;
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(i * 131 + 7);
    for (int i = 0; i < 16 * 16; i++) dense[(i / 16) * 32 + i % 16] = (float)i; /* one non-zero block */
    if (ie_bsr_from_dense(dense, 32, 32, 16, 16, 0.0f, &bsr, &bsr_n) != 0) return 1;
    {
        ie_tensor_t ts[] = {
            {"a.f32", IE_DTYPE_F32, 1, {64, 1, 1, 1}, bytes, 256, IE_LAYOUT_ROWS, 0},
            {"b.q4_0",
             IE_DTYPE_Q4_0,
             2,
             {64, 4, 1, 1},
             bytes,
             ie_tensor_bytes(IE_DTYPE_Q4_0, IE_LAYOUT_ROWS, 0, 64, 4),
             IE_LAYOUT_ROWS,
             0},
            {"c.int4w",
             IE_DTYPE_I4W,
             2,
             {64, 16, 1, 1},
             bytes,
             ie_tensor_bytes(IE_DTYPE_I4W, IE_LAYOUT_PANEL16, 32, 64, 16),
             IE_LAYOUT_PANEL16,
             32},
            {"d.bsr", IE_DTYPE_F32, 2, {32, 32, 1, 1}, bsr, bsr_n, IE_LAYOUT_BSR, 0},
            {"e.int8w",
             IE_DTYPE_I8W,
             3,
             {64, 3, 2, 1},
             bytes,
             2 * ie_tensor_bytes(IE_DTYPE_I8W, IE_LAYOUT_ROWS, 64, 64, 3),
             IE_LAYOUT_ROWS,
             64},
        };
        if (ie_iebin_writer_open(tmp, &w) != IE_OK) return 1;
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            if (ie_iebin_writer_add(w, &ts[i], i == 2 ? "{\"scheme\":\"int4w\"}" : NULL) != IE_OK) return 1;
        if (ie_iebin_writer_set_tokenizer(w, argv[2]) != IE_OK) return 1;
        if (ie_iebin_writer_finish(&w, &hp, "{\"seed\":1}") != IE_OK) return 1;
    }
    snprintf(out, sizeof out, "%s/mixed.bin", argv[1]);
    seed(tmp, out, 0);
    snprintf(out, sizeof out, "%s/mixed_noverify.bin", argv[1]);
    seed(tmp, out, 1);

    hp = hp_tiny(1);
    if (ie_iebin_writer_open(tmp, &w) != IE_OK || ie_iebin_writer_set_tokenizer(w, argv[2]) != IE_OK ||
        ie_iebin_writer_finish(&w, &hp, NULL) != IE_OK)
        return 1;
    snprintf(out, sizeof out, "%s/gptoss_empty.bin", argv[1]);
    seed(tmp, out, 0);
    free(bsr);
    printf("seeds written; remove %s\n", tmp);
    return 0;
}

#endif
