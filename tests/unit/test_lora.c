/* test_lora.c — LoRA adapters (issue 20):
 *   - the lora_shrink / lora_expand kernels: every ISA's twins, f32,
 *     bf16 and int8 (column scales), against the ref pair (on the bf16 weights widened) on odd
 *     ranks (1..64), group sizes (1..9), shapes and strides, rows picked
 *     out of order, the work split in pieces as threads split it, and the
 *     ref against a double-precision sum;
 *   - the loader (ie_lora_load_peft_memory, ie_lora_load): good adapters,
 *     and each refusal (DoRA, modules_to_save, unknown module, embedding
 *     adapter, rank or shape that does not fit, missing B, layer past the
 *     model, bad dtype, bad JSON, corrupted safetensors, missing files) is
 *     an error naming the tensor or key;
 *   - the worker: a step mixing the base and two adapters over three slots
 *     gives every slot the logits of its solo run, an adapter changes the
 *     logits, and a bad adapter id is refused before anything runs.
 * The numerical reference (peft) is tests/e2e/test_lora.py. */
#include "ie_dtype.h"
#include "ie_kernels.h"
#include "ie_lora.h"
#include "ie_test_writer.h"
#include "ie_worker.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MODEL IE_TEST_DATA "/tiny_llama"
#define LORA IE_TEST_DATA "/lora"

/* uniform in [-1, 1) from a xorshift state */
static float frand(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (float)((int64_t)(*s >> 40) - (1 << 23)) / (float)(1 << 23);
}

/* A's rows [j0, j1) then B's columns [o0, o1), each in `parts` pieces (as
 * a pool's threads split them); u is n_rows x ldu. */
static void run_split(const ie_kernels_t *k, const ie_lora_args_t *p, const int32_t *rows, int n_rows, float *u,
                      int64_t ldu, int parts)
{
    for (int s = 0; s < parts; s++)
        k->lora_shrink(p, rows, n_rows, p->rank * s / parts, p->rank * (s + 1) / parts, u, ldu);
    for (int s = 0; s < parts; s++)
        k->lora_expand(p, rows, n_rows, p->n_out * s / parts, p->n_out * (s + 1) / parts, u, ldu);
}

static void test_kernels(void)
{
    static const int ranks[] = {1, 2, 3, 5, 8, 13, 16, 31, 64, 67};
    static const int64_t ins[] = {1, 7, 33, 64, 100, 4100};
    static const int64_t outs[] = {1, 9, 31, 64, 130};
    uint64_t seed = 12345;
    const int max_rows = 11;
    for (int isa = 0; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *k = ie_kernels_get((ie_isa_t)isa);
        if (!k) continue;
        CU_ASSERT_PTR_NOT_NULL_FATAL(k->lora_shrink);
        CU_ASSERT_PTR_NOT_NULL_FATAL(k->lora_expand);
        for (size_t ri = 0; ri < sizeof ranks / sizeof *ranks; ri++)
            for (size_t ii = 0; ii < sizeof ins / sizeof *ins; ii++)
                for (size_t oi = 0; oi < sizeof outs / sizeof *outs; oi++) {
                    const int r = ranks[ri];
                    const int64_t n_in = ins[ii], n_out = outs[oi], lda = n_in + 3, ldb = n_out + 5;
                    const int64_t ldx = n_in + 2, ldy = n_out + 1, ldu = r + 2;
                    float *a = malloc(sizeof(float) * (size_t)(r * lda));
                    float *bt = malloc(sizeof(float) * (size_t)(r * ldb));
                    float *x = malloc(sizeof(float) * (size_t)(max_rows * ldx));
                    float *y0 = malloc(sizeof(float) * (size_t)(max_rows * ldy));
                    float *y1 = malloc(sizeof(float) * (size_t)(max_rows * ldy));
                    float *u = malloc(sizeof(float) * (size_t)(max_rows * ldu));
                    for (int64_t i = 0; i < r * lda; i++) a[i] = frand(&seed);
                    for (int64_t i = 0; i < r * ldb; i++) bt[i] = frand(&seed);
                    for (int64_t i = 0; i < max_rows * ldx; i++) x[i] = frand(&seed);
                    for (int64_t i = 0; i < max_rows * ldy; i++) y0[i] = y1[i] = frand(&seed);
                    /* a group of odd size (1..9: whole and partial register
                     * blocks of tokens), out of order, skipping rows */
                    const int32_t rows[] = {7, 2, 9, 0, 4, 10, 3, 5, 8};
                    const int n_rows = 1 + (int)((ri + ii + oi) % 9);
                    /* bf16 weights: the f32 ones rounded, and their bits; int8:
                     * codes and column scales, the f32 ones their product */
                    uint16_t *a16 = malloc(sizeof(uint16_t) * (size_t)(r * lda));
                    uint16_t *b16 = malloc(sizeof(uint16_t) * (size_t)(r * ldb));
                    int8_t *a8 = malloc((size_t)(r * lda)), *b8 = calloc((size_t)((r + 3) / 4 * 4 * ldb), 1);
                    float *sa = malloc(sizeof(float) * (size_t)lda), *sb = malloc(sizeof(float) * (size_t)ldb);
                    const int wt = (int)((ri + oi) % 3); /* f32, bf16, int8 by turns */
                    if (wt == 1) {
                        for (int64_t i = 0; i < r * lda; i++)
                            a16[i] = ie_f32_to_bf16(a[i]), a[i] = ie_bf16_to_f32(a16[i]);
                        for (int64_t i = 0; i < r * ldb; i++)
                            b16[i] = ie_f32_to_bf16(bt[i]), bt[i] = ie_bf16_to_f32(b16[i]);
                    } else if (wt == 2) {
                        for (int64_t c = 0; c < lda; c++) sa[c] = (0.5f + 0.5f * fabsf(frand(&seed))) / 127.0f;
                        for (int64_t c = 0; c < ldb; c++) sb[c] = (0.5f + 0.5f * fabsf(frand(&seed))) / 127.0f;
                        for (int64_t i = 0; i < r * lda; i++)
                            a8[i] = (int8_t)(127.0f * frand(&seed)), a[i] = (float)a8[i] * sa[i % lda];
                        for (int64_t i = 0; i < r * ldb; i++) { /* B^T in groups of four ranks */
                            int8_t *c = &b8[IE_LORA_BT8_AT(i / ldb, i % ldb, ldb)];
                            *c = (int8_t)(127.0f * frand(&seed)), bt[i] = (float)*c * sb[i % ldb];
                        }
                    }
                    ie_lora_args_t p = {a,   bt, NULL, NULL, lda,  ldb,  r,    n_in, n_out, 0.75f, x,
                                        ldx, y0, ldy,  NULL, NULL, NULL, NULL, NULL, 0,     0,     0};
                    if (wt == 1) p.a16 = a16, p.bt16 = b16, p.a = p.bt = NULL;
                    if (wt == 2) p.a8 = a8, p.bt8 = b8, p.sa = sa, p.sbt = sb, p.a = p.bt = NULL;
                    /* the oracle: the ref in one piece */
                    run_split(ie_kernels_get(IE_ISA_REF), &p, rows, n_rows, u, ldu, 1);
                    if (wt == 2) { /* ... whose int8 form is the f32 one on the products, but for
                                    * the activations' rounding: within 2% of the largest delta */
                        float *y2 = malloc(sizeof(float) * (size_t)(max_rows * ldy));
                        memcpy(y2, y1, sizeof(float) * (size_t)(max_rows * ldy));
                        ie_lora_args_t pf = p;
                        pf.a8 = pf.bt8 = NULL, pf.a = a, pf.bt = bt, pf.y = y2;
                        run_split(ie_kernels_get(IE_ISA_REF), &pf, rows, n_rows, u, ldu, 1);
                        float big = 0.0f;
                        for (int64_t i = 0; i < max_rows * ldy; i++) big = fmaxf(big, fabsf(y2[i] - y1[i]));
                        int far = 0;
                        for (int64_t i = 0; i < max_rows * ldy; i++)
                            far += fabsf(y2[i] - y0[i]) > 0.02f * big + 1e-6f * (1.0f + fabsf(y2[i]));
                        CU_ASSERT_EQUAL(far, 0);
                        if (far)
                            fprintf(stderr, "int8 rank %d in %lld out %lld rows %d: %d far (largest delta %g)\n", r,
                                    (long long)n_in, (long long)n_out, n_rows, far, (double)big);
                        free(y2);
                    }
                    p.y = y1;
                    /* a prefetch hint (bytes never read) changes nothing */
                    p.pf = (const char *)x, p.pf_rows = 3, p.pf_len = 100, p.pf_ld = 64;
                    run_split(k, &p, rows, n_rows, u, ldu, 1 + (int)(ii % 3));
                    int bad = 0;
                    /* f32 sums in another order: rounding grows with n_in (and the rank) */
                    const float ftol = 1e-5f * (float)(n_in > 100 ? n_in : 100) / 100.0f;
                    for (int t = 0; t < max_rows; t++)
                        for (int64_t o = 0; o < ldy; o++) {
                            const float e = y0[t * ldy + o], g = y1[t * ldy + o];
                            /* int8: integer sums, the oracle's bits */
                            if (wt == 2 ? memcmp(&e, &g, sizeof e) != 0 : fabsf(e - g) > ftol * (1.0f + fabsf(e)))
                                bad++;
                        }
                    CU_ASSERT_EQUAL(bad, 0);
                    if (bad)
                        fprintf(stderr, "isa %d wt %d rank %d in %lld out %lld rows %d: %d differ\n", isa, wt, r,
                                (long long)n_in, (long long)n_out, n_rows, bad);
                    /* untouched rows stay as they were (row 1 is never in the group) */
                    CU_ASSERT(y1[1 * ldy] == y0[1 * ldy]);
                    /* an expand over [o0, o1) writes nothing outside it */
                    if (n_out > 2) {
                        const float keep0 = y1[rows[0] * ldy], keep1 = y1[rows[0] * ldy + n_out - 1];
                        k->lora_expand(&p, rows, n_rows, 1, n_out - 1, u, ldu);
                        CU_ASSERT(y1[rows[0] * ldy] == keep0 && y1[rows[0] * ldy + n_out - 1] == keep1);
                    }
                    free(a), free(bt), free(x), free(y0), free(y1), free(u), free(a16), free(b16), free(a8),
                        free(b8), free(sa), free(sb);
                }
    }
}

/* The ref kernels against a double-precision sum. */
static void test_kernel_exact(void)
{
    const int r = 5;
    const int64_t n_in = 13, n_out = 11;
    uint64_t seed = 99;
    float a[5 * 13], bt[5 * 11], x[2 * 13], y[2 * 11] = {0}, u[2 * 5];
    for (size_t i = 0; i < sizeof a / sizeof *a; i++) a[i] = frand(&seed);
    for (size_t i = 0; i < sizeof bt / sizeof *bt; i++) bt[i] = frand(&seed);
    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = frand(&seed);
    const int32_t rows[] = {1};
    ie_lora_args_t p = {a,    bt, NULL,  NULL, n_in, n_out, r,    n_in, n_out, 2.0f, x,
                        n_in, y,  n_out, NULL, NULL, NULL,  NULL, NULL, 0,     0,    0};
    ie_lora_shrink_ref(&p, rows, 1, 0, r, u, r);
    ie_lora_expand_ref(&p, rows, 1, 0, n_out, u, r);
    for (int64_t o = 0; o < n_out; o++) {
        double s = 0;
        for (int j = 0; j < r; j++) {
            double uj = 0;
            for (int64_t q = 0; q < n_in; q++) uj += (double)a[j * n_in + q] * x[n_in + q];
            s += 2.0 * uj * bt[j * n_out + o];
        }
        CU_ASSERT(fabs(y[n_out + o] - s) < 1e-5 * (1 + fabs(s)));
        CU_ASSERT(y[o] == 0.0f); /* row 0 not in the group */
    }
}

/* int8 at the sums' extremes: every code and weight at its largest, rank
 * 256, n_in 4100 (a shrink's sum ~8.5e9, past 32 bits), in every sign
 * combination (the AVX-512 pair multiplies w + 128 with the codes' signed
 * planes: its expand's partial sums are largest, ~2^30, for w = 127 against
 * negative codes): every ISA gives the ref's bits, and the ref the product
 * the codes stand for. */
static void test_kernel_int8_extreme(void)
{
    const int r = 256;
    const int64_t n_in = 4100, n_out = 37;
    int8_t *a8 = malloc((size_t)(r * n_in)), *b8 = malloc((size_t)(r * n_out));
    float *sa = malloc(sizeof(float) * (size_t)n_in), *sb = malloc(sizeof(float) * (size_t)n_out);
    float *x = malloc(sizeof(float) * (size_t)(2 * n_in)), y0[2 * 37], y1[2 * 37], u[2 * 256];
    for (int64_t i = 0; i < n_in; i++) sa[i] = 1.0f;
    for (int64_t i = 0; i < n_out; i++) sb[i] = 1.0f;
    const int32_t rows[] = {0, 1};
    for (int signs = 0; signs < 8; signs++) {
        const int ga = signs & 1 ? -1 : 1, gb = signs & 2 ? -1 : 1, gx = signs & 4 ? -1 : 1;
        memset(a8, ga > 0 ? 127 : 0x81, (size_t)(r * n_in)); /* 0x81: -127 */
        memset(b8, gb > 0 ? 127 : 0x81, (size_t)(r * n_out));
        for (int64_t i = 0; i < n_in; i++) x[i] = x[n_in + i] = 0.5f * (float)gx;
        memset(y0, 0, sizeof y0);
        ie_lora_args_t p = {NULL, NULL, NULL,  NULL, n_in, n_out, r,  n_in, n_out, 1.0f, x,
                            n_in, y0,   n_out, a8,   b8,   sa,    sb, NULL, 0,     0,    0};
        ie_lora_shrink_ref(&p, rows, 2, 0, r, u, r);
        ie_lora_expand_ref(&p, rows, 2, 0, n_out, u, r);
        const double want = (double)(ga * gb * gx) * (double)r * 127.0 * (0.5 * 127.0 * (double)n_in);
        CU_ASSERT(fabs(y0[5] - want) <= 1e-5 * fabs(want));
        CU_ASSERT(fabs(y0[n_out + 36] - want) <= 1e-5 * fabs(want));
        for (int isa = IE_ISA_AVX2; isa <= IE_ISA_AVX512; isa++) {
            const ie_kernels_t *k = ie_kernels_get((ie_isa_t)isa);
            if (!k) continue;
            memset(y1, 0, sizeof y1);
            p.y = y1;
            k->lora_shrink(&p, rows, 2, 0, r, u, r);
            k->lora_expand(&p, rows, 2, 0, n_out, u, r);
            CU_ASSERT(memcmp(y0, y1, sizeof y0) == 0);
        }
    }
    free(a8), free(b8), free(sa), free(sb), free(x);
}

/* ------------------------------------------------------------------ loader */

static ie_hparams_t g_hp; /* the tiny fixture's: d 64, 4 heads of 16, 2 KV, ff 128, 2 layers */

static const char *k_cfg = "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}";

/* ie_lora_load_peft_memory of config cfg and a safetensors image holding
 * tensors a_name / b_name (NULL: left out) of the given shapes, zeros */
static ie_status_t load_mem(const char *cfg, const char *a_name, const int64_t *ash, const char *b_name,
                            const int64_t *bsh, const char *dtype, ie_lora_t **out)
{
    st_w_t w = {0};
    tbuf_t f;
    const size_t es = !strcmp(dtype, "F32") || !strcmp(dtype, "I32") ? 4 : 2;
    if (a_name) sw_tensor(&w, a_name, dtype, 2, ash, NULL, (size_t)(ash[0] * ash[1]) * es);
    if (b_name) sw_tensor(&w, b_name, dtype, 2, bsh, NULL, (size_t)(bsh[0] * bsh[1]) * es);
    sw_finish(&w, &f);
    ie_status_t st = ie_lora_load_peft_memory(cfg, strlen(cfg), f.p, f.n, &g_hp, out);
    tb_free(&f);
    return st;
}

#define QA "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
#define QB "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"

static void expect(ie_status_t got, ie_status_t want, const char *needle)
{
    CU_ASSERT_EQUAL(got, want);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), needle));
    if (got != want || !strstr(ie_error_last(), needle))
        fprintf(stderr, "wanted %d '%s', got %d '%s'\n", want, needle, got, ie_error_last());
}

static void test_loader_memory(void)
{
    const int64_t a4[2] = {4, 64}, b4[2] = {64, 4};
    ie_lora_t *ad = NULL;
    CU_ASSERT_EQUAL(load_mem(k_cfg, QA, a4, QB, b4, "F32", &ad), IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ad);
    const ie_lora_mat_t *m = ie_lora_mat(ad, 0, IE_LORA_Q);
    CU_ASSERT(m->rank == 4 && m->n_in == 64 && m->n_out == 64 && fabsf(m->scale - 2.0f) < 1e-6f);
    CU_ASSERT_EQUAL(ie_lora_mat(ad, 1, IE_LORA_Q)->rank, 0);
    CU_ASSERT_PTR_NULL(ie_lora_mat(ad, 2, IE_LORA_Q));
    ie_lora_destroy(&ad);
    CU_ASSERT_EQUAL(load_mem(k_cfg, QA, a4, QB, b4, "BF16", &ad), IE_OK);
    m = ad ? ie_lora_mat(ad, 0, IE_LORA_Q) : NULL;
    CU_ASSERT(m && m->a16 && m->bt16 && !m->a && !m->bt); /* kept as bf16 */
    ie_lora_destroy(&ad);
    /* rslora: alpha / sqrt(r) */
    CU_ASSERT_EQUAL(load_mem("{\"r\":4,\"lora_alpha\":8,\"use_rslora\":true}", QA, a4, QB, b4, "F16", &ad), IE_OK);
    CU_ASSERT(ad && fabsf(ie_lora_mat(ad, 0, IE_LORA_Q)->scale - 4.0f) < 1e-6f);
    ie_lora_destroy(&ad);

    expect(load_mem("{\"r\":4,\"use_dora\":true}", QA, a4, QB, b4, "F32", &ad), IE_ERR_UNSUPPORTED, "DoRA");
    expect(load_mem("{\"r\":4,\"modules_to_save\":[\"lm_head\"]}", QA, a4, QB, b4, "F32", &ad), IE_ERR_UNSUPPORTED,
           "modules_to_save");
    expect(load_mem("{\"r\":4,\"target_modules\":[\"lm_head\"]}", QA, a4, QB, b4, "F32", &ad), IE_ERR_UNSUPPORTED,
           "lm_head");
    expect(load_mem("{\"r\":4,\"bias\":\"all\"}", QA, a4, QB, b4, "F32", &ad), IE_ERR_UNSUPPORTED, "bias");
    expect(load_mem("{\"r\":0}", QA, a4, QB, b4, "F32", &ad), IE_ERR_FORMAT, "\"r\"");
    expect(load_mem("not json", QA, a4, QB, b4, "F32", &ad), IE_ERR_FORMAT, "JSON");
    expect(load_mem("{\"r\":8}", QA, a4, QB, b4, "F32", &ad), IE_ERR_INVAL, "rank 4");
    const int64_t a_bad[2] = {4, 65}, b_bad[2] = {63, 4}, b_r[2] = {64, 3};
    expect(load_mem(k_cfg, QA, a_bad, QB, b4, "F32", &ad), IE_ERR_INVAL, QA);
    expect(load_mem(k_cfg, QA, a4, QB, b_bad, "F32", &ad), IE_ERR_INVAL, QB);
    expect(load_mem(k_cfg, QA, a4, QB, b_r, "F32", &ad), IE_ERR_INVAL, QB);
    expect(load_mem(k_cfg, QA, a4, NULL, NULL, "F32", &ad), IE_ERR_FORMAT, QB);
    expect(load_mem(k_cfg, NULL, NULL, QB, b4, "F32", &ad), IE_ERR_FORMAT, "no lora_A");
    expect(load_mem(k_cfg, "base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight", a4,
                    "base_model.model.model.layers.5.self_attn.q_proj.lora_B.weight", b4, "F32", &ad),
           IE_ERR_INVAL, "layer 5");
    expect(load_mem(k_cfg, "base_model.model.model.embed_tokens.lora_embedding_A", a4, NULL, NULL, "F32", &ad),
           IE_ERR_UNSUPPORTED, "embedding");
    expect(load_mem(k_cfg, "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", a4, NULL, NULL,
                    "F32", &ad),
           IE_ERR_UNSUPPORTED, "DoRA");
    expect(load_mem(k_cfg, QA, a4, QB, b4, "I32", &ad), IE_ERR_UNSUPPORTED, "I32");
    expect(load_mem(k_cfg, NULL, NULL, NULL, NULL, "F32", &ad), IE_ERR_FORMAT, "no LoRA tensors");
    CU_ASSERT_PTR_NULL(ad);
    /* a corrupted safetensors image */
    {
        static const char junk[] = "\x10\0\0\0\0\0\0\0{\"a\":1";
        expect(ie_lora_load_peft_memory(k_cfg, strlen(k_cfg), junk, sizeof junk, &g_hp, &ad), IE_ERR_FORMAT, "");
        CU_ASSERT_PTR_NULL(ad);
    }
}

static void test_loader_files(void)
{
    ie_lora_t *ad = NULL;
    CU_ASSERT_EQUAL(ie_lora_load(LORA "/all16", &g_hp, &ad), IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ad);
    CU_ASSERT(ad->n_mats == 14 && ad->max_rank == 16 && ad->mods == 0x7f && !strcmp(ad->format, "peft"));
    ie_lora_destroy(&ad);
    CU_ASSERT_EQUAL(ie_lora_load(LORA "/qv8.gguf", &g_hp, &ad), IE_OK);
    CU_ASSERT(ad && ad->n_mats == 4 && ad->mods == ((1u << IE_LORA_Q) | (1u << IE_LORA_V)));
    CU_ASSERT(ad && fabsf(ie_lora_mat(ad, 0, IE_LORA_Q)->scale - 2.0f) < 1e-6f);
    ie_lora_destroy(&ad);
    expect(ie_lora_load(LORA "/missing", &g_hp, &ad), IE_ERR_IO, "missing");
    expect(ie_lora_load(LORA, &g_hp, &ad), IE_ERR_IO, "adapter_config.json");
    expect(ie_lora_load(IE_TEST_DATA "/tiny_llama_f32.gguf", &g_hp, &ad), IE_ERR_FORMAT, "general.type");
    CU_ASSERT_PTR_NULL(ad);
}

/* ------------------------------------------------------------------ worker */

static ie_model_src_t *g_src;

static int suite_init(void)
{
    if (ie_model_src_open(MODEL, &g_src) != IE_OK) return -1;
    g_hp = *ie_model_src_hparams(g_src);
    return 0;
}
static int suite_clean(void)
{
    ie_model_src_destroy(&g_src);
    return 0;
}

static const int32_t k_ids[3][6] = {{5, 17, 300, 42, 7, 9}, {100, 200, 300, 400, 9, 11}, {1, 2, 3, 4, 5, 6}};

static void worker_mixed(void)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_seq = 3;
    o.n_ctx = 32;
    o.max_batch = 32;
    o.n_threads = 2;
    o.pin_threads = 0;
    o.precision = IE_PREC_F32;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_src, &o, &w), IE_OK);
    ie_lora_t *qv = NULL, *all = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(LORA "/qv8", &g_hp, &qv), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(LORA "/all16", &g_hp, &all), IE_OK);
    int id_qv = -1, id_all = -1;
    CU_ASSERT_EQUAL(ie_worker_lora_add(w, qv, 1.0f, &id_qv), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_lora_add(w, all, 1.0f, &id_all), IE_OK);
    CU_ASSERT(id_qv >= 0 && id_all >= 0 && id_qv != id_all);
    const int nv = g_hp.n_vocab, ad_of[3] = {-1, id_qv, id_all};
    float *solo = malloc(sizeof(float) * 3 * 6 * (size_t)nv), *mixed = malloc(sizeof(float) * 18 * (size_t)nv);
    int32_t pos[18], seq[18], ad[18], tok[18];
    uint8_t want[18];
    /* solo: each slot alone, prefill of 6 */
    for (int s = 0; s < 3; s++) {
        ie_worker_seq_clear(w, s);
        for (int i = 0; i < 6; i++) pos[i] = i, seq[i] = s, ad[i] = ad_of[s], want[i] = 1;
        ie_batch_t b = {6, k_ids[s], pos, seq, want, ad, NULL};
        CU_ASSERT_EQUAL(ie_worker_step(w, &b, solo + (size_t)s * 6 * nv), IE_OK);
    }
    /* mixed: the three slots interleaved in one step */
    for (int s = 0; s < 3; s++) ie_worker_seq_clear(w, s);
    for (int i = 0; i < 18; i++) {
        const int s = i % 3, p = i / 3;
        tok[i] = k_ids[s][p], pos[i] = p, seq[i] = s, ad[i] = ad_of[s], want[i] = 1;
    }
    ie_batch_t mb = {18, tok, pos, seq, want, ad, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &mb, mixed), IE_OK);
    double worst = 0;
    for (int i = 0; i < 18; i++) {
        const float *m = mixed + (size_t)i * nv, *e = solo + ((size_t)(i % 3) * 6 + (size_t)(i / 3)) * nv;
        for (int v = 0; v < nv; v++) {
            double d = fabs((double)m[v] - e[v]) / (1.0 + fabs(e[v]));
            if (d > worst) worst = d;
        }
    }
    CU_ASSERT(worst < 1e-5);
    /* the adapters matter: slot 2's ids under the base differ */
    ie_worker_seq_clear(w, 2);
    for (int i = 0; i < 6; i++) pos[i] = i, seq[i] = 2, want[i] = 1;
    ie_batch_t bb = {6, k_ids[2], pos, seq, want, NULL, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &bb, mixed), IE_OK);
    double diff = 0;
    for (size_t i = 0; i < 6 * (size_t)nv; i++) diff = fmax(diff, fabs(mixed[i] - solo[2 * 6 * (size_t)nv + i]));
    CU_ASSERT(diff > 1e-2);
    /* a bad id: refused, nothing run */
    ie_worker_seq_clear(w, 0);
    int32_t bad = 7, p0 = 0, s0 = 0;
    uint8_t one = 1;
    ie_batch_t b1 = {1, k_ids[0], &p0, &s0, &one, &bad, NULL};
    expect(ie_worker_step(w, &b1, mixed), IE_ERR_RANGE, "adapter 7");
    CU_ASSERT_EQUAL(ie_worker_lora_remove(w, id_qv), IE_OK);
    bad = id_qv;
    expect(ie_worker_step(w, &b1, mixed), IE_ERR_RANGE, "not attached");
    CU_ASSERT_EQUAL(ie_worker_lora_remove(w, id_qv), IE_ERR_RANGE);
    free(solo);
    free(mixed);
    ie_worker_destroy(&w);
    ie_lora_destroy(&qv);
    ie_lora_destroy(&all);
}

/* on the calling thread (the fixture's work is small), then on the pool */
/* ------------------------------------------------------------ slicing */

static uint16_t to_bf16(float f) /* truncating: the values only need to be bf16-exact */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element (j, c) of A (B^T) of m, f32, bf16 or int8 times its column's scale. */
static float mat_a(const ie_lora_mat_t *m, int j, int64_t c)
{
    const size_t i = (size_t)j * (size_t)m->n_in + (size_t)c;
    return m->a8 ? (float)m->a8[i] * m->sa8[c] : m->a16 ? from_bf16(m->a16[i]) : m->a[i];
}
static float mat_bt(const ie_lora_mat_t *m, int j, int64_t c)
{
    const size_t i = (size_t)j * (size_t)m->n_out + (size_t)c;
    return m->bt8    ? (float)m->bt8[IE_LORA_BT8_AT(j, c, m->n_out)] * m->sbt8[c]
           : m->bt16 ? from_bf16(m->bt16[i])
                     : m->bt[i];
}

/* y[n_out] = B (A x[n_in]) in double. */
static void mat_apply(const ie_lora_mat_t *m, const float *x, double *y)
{
    for (int64_t o = 0; o < m->n_out; o++) y[o] = 0;
    for (int j = 0; j < m->rank; j++) {
        double t = 0;
        for (int64_t i = 0; i < m->n_in; i++) t += (double)mat_a(m, j, i) * x[i];
        for (int64_t o = 0; o < m->n_out; o++) y[o] += (double)mat_bt(m, j, o) * t;
    }
}

/* An adapter on odd shapes (d 24, 5 heads of 8, 3 KV heads, ff 40, 3
 * layers), every module, ranks 1..5, layer 2 in bf16, cut into three
 * uneven shares (a KV head held by two ranks, as a tensor plan does when
 * a group is cut): each slice holds exactly its block; the column-parallel
 * outputs of the shares laid side by side, and the row-parallel partial
 * sums added up, equal the whole adapter's output. */
static void test_slice(void)
{
    ie_hparams_t hp = {0};
    hp.n_layer = 3, hp.n_embd = 24, hp.n_head = 5, hp.n_head_kv = 3, hp.head_dim = 8, hp.n_ff = 40, hp.n_vocab = 16;
    ie_lora_t *a = calloc(1, sizeof *a);
    CU_ASSERT_FATAL(a != NULL);
    a->n_layer = hp.n_layer;
    a->format = "test";
    a->fingerprint = 0x1234;
    a->mats = calloc((size_t)hp.n_layer * IE_LORA_NMOD, sizeof *a->mats);
    CU_ASSERT_FATAL(a->mats != NULL);
    uint64_t seed = 7;
    const int64_t qd = 40, kvd = 24, d = 24, ff = 40;
    const int64_t outs[IE_LORA_NMOD] = {qd, kvd, kvd, d, ff, ff, d}, ins[IE_LORA_NMOD] = {d, d, d, qd, d, d, ff};
    for (int l = 0; l < hp.n_layer; l++)
        for (int m = 0; m < IE_LORA_NMOD; m++) {
            ie_lora_mat_t *mt = &a->mats[l * IE_LORA_NMOD + m];
            mt->rank = 1 + (l * 3 + m) % 5;
            mt->n_out = outs[m], mt->n_in = ins[m], mt->scale = 0.5f;
            const size_t na = (size_t)mt->rank * (size_t)mt->n_in, nb = (size_t)mt->rank * (size_t)mt->n_out;
            if (l == 2) {
                mt->a16 = malloc(na * 2), mt->bt16 = malloc(nb * 2);
                for (size_t i = 0; i < na; i++) mt->a16[i] = to_bf16(frand(&seed));
                for (size_t i = 0; i < nb; i++) mt->bt16[i] = to_bf16(frand(&seed));
            } else {
                mt->a = malloc(na * 4), mt->bt = malloc(nb * 4);
                for (size_t i = 0; i < na; i++) mt->a[i] = frand(&seed);
                for (size_t i = 0; i < nb; i++) mt->bt[i] = frand(&seed);
            }
            a->n_mats++;
        }
    a->mods = (1u << IE_LORA_NMOD) - 1;
    a->max_rank = 5;
    /* three shares: heads 0 | 1-3 | 4, KV heads 0 | 0-1 | 2, ff 0-6 | 7-28 | 29-39, layers all | 1-2 | 2 */
    ie_shard_range_t sh[3] = {
        {.layer_begin = 0,
         .layer_end = 3,
         .head_begin = 0,
         .head_end = 1,
         .kv_head_begin = 0,
         .kv_head_end = 1,
         .ff_begin = 0,
         .ff_end = 7},
        {.layer_begin = 1,
         .layer_end = 3,
         .head_begin = 1,
         .head_end = 4,
         .kv_head_begin = 0,
         .kv_head_end = 2,
         .ff_begin = 7,
         .ff_end = 29},
        {.layer_begin = 2,
         .layer_end = 3,
         .head_begin = 4,
         .head_end = 5,
         .kv_head_begin = 2,
         .kv_head_end = 3,
         .ff_begin = 29,
         .ff_end = 40},
    };
    ie_lora_t *sl[3] = {NULL, NULL, NULL};
    for (int r = 0; r < 3; r++) {
        CU_ASSERT_EQUAL_FATAL(ie_lora_slice(a, &hp, &sh[r], &sl[r]), IE_OK);
        CU_ASSERT_EQUAL(sl[r]->fingerprint, 0x1234);
    }
    float x[64];
    double whole[64], part[64], sum[64];
    for (int i = 0; i < 64; i++) x[i] = frand(&seed);
    for (int m = 0; m < IE_LORA_NMOD; m++) {
        const ie_lora_mat_t *w = ie_lora_mat(a, 2, (ie_lora_mod_t)m); /* layer 2: every share has it */
        mat_apply(w, x, whole);
        for (int64_t o = 0; o < w->n_out; o++) sum[o] = 0;
        for (int r = 0; r < 3; r++) {
            const ie_lora_mat_t *p = ie_lora_mat(sl[r], 2, (ie_lora_mod_t)m);
            CU_ASSERT_EQUAL(p->rank, w->rank);
            CU_ASSERT_EQUAL(!!p->a16, !!w->a16); /* bf16 stays bf16 */
            int64_t ob = 0, ib = 0;
            const int hd = hp.head_dim;
            switch (m) {
            case IE_LORA_Q: ob = sh[r].head_begin * hd; break;
            case IE_LORA_K:
            case IE_LORA_V: ob = sh[r].kv_head_begin * hd; break;
            case IE_LORA_GATE:
            case IE_LORA_UP: ob = sh[r].ff_begin; break;
            case IE_LORA_O: ib = sh[r].head_begin * hd; break;
            case IE_LORA_DOWN: ib = sh[r].ff_begin; break;
            default: break;
            }
            int exact = 1; /* the slice is exactly its block */
            for (int j = 0; j < p->rank; j++) {
                for (int64_t c = 0; c < p->n_in; c++) exact &= mat_a(p, j, c) == mat_a(w, j, ib + c);
                for (int64_t c = 0; c < p->n_out; c++) exact &= mat_bt(p, j, c) == mat_bt(w, j, ob + c);
            }
            CU_ASSERT(exact);
            if (m == IE_LORA_O || m == IE_LORA_DOWN) { /* row-parallel: partial sums over the input part */
                CU_ASSERT_EQUAL(p->n_out, w->n_out);
                mat_apply(p, x + ib, part);
                for (int64_t o = 0; o < w->n_out; o++) sum[o] += part[o];
            } else { /* column-parallel: this share's output rows */
                CU_ASSERT_EQUAL(p->n_in, w->n_in);
                mat_apply(p, x, part);
                for (int64_t o = 0; o < p->n_out; o++) sum[ob + o] = part[o];
            }
        }
        double err = 0;
        for (int64_t o = 0; o < w->n_out; o++) err = fmax(err, fabs(sum[o] - whole[o]));
        CU_ASSERT(err < 1e-9);
    }
    /* int8 (ie_lora_quantize_int8): each weight within half its column's
     * step of the original, the step its column's largest / 127; and a
     * share of the quantized adapter is bit for bit the quantized share
     * (per-column scales), so every rank of a plan runs what one process
     * would */
    ie_lora_t *qa = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_lora_quantize_int8(a, &qa), IE_OK);
    uint64_t want8 = 0; /* what it holds: codes (B^T's ranks in fours) and column scales */
    for (int k = 0; k < 3 * IE_LORA_NMOD; k++) {
        const ie_lora_mat_t *w = &a->mats[k];
        if (w->rank)
            want8 += (uint64_t)(w->rank * w->n_in + ((w->rank + 3) & ~3) * w->n_out + 4 * (w->n_in + w->n_out));
    }
    CU_ASSERT_EQUAL(qa->bytes, want8); /* ranks 1..5: the padding counts */
    int within = 1, same = 1;
    for (int l = 0; l < 3; l++)
        for (int m = 0; m < IE_LORA_NMOD; m++) {
            const ie_lora_mat_t *w = ie_lora_mat(a, l, (ie_lora_mod_t)m), *q = ie_lora_mat(qa, l, (ie_lora_mod_t)m);
            CU_ASSERT_PTR_NOT_NULL_FATAL(q->a8);
            CU_ASSERT_PTR_NULL(q->a16);
            for (int64_t c = 0; c < w->n_in; c++) {
                float mx = 0;
                for (int j = 0; j < w->rank; j++) mx = fmaxf(mx, fabsf(mat_a(w, j, c)));
                within &= fabsf(q->sa8[c] - mx / 127.0f) <= 1e-7f * mx;
                for (int j = 0; j < w->rank; j++)
                    within &= fabsf(mat_a(q, j, c) - mat_a(w, j, c)) <= 0.5001f * q->sa8[c] + 1e-30f;
            }
            for (int64_t c = 0; c < w->n_out; c++)
                for (int j = 0; j < w->rank; j++)
                    within &= fabsf(mat_bt(q, j, c) - mat_bt(w, j, c)) <= 0.5001f * q->sbt8[c] + 1e-30f;
        }
    CU_ASSERT(within);
    for (int r = 0; r < 3; r++) {
        ie_lora_t *qs = NULL, *sq = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_lora_slice(qa, &hp, &sh[r], &qs), IE_OK);
        CU_ASSERT_EQUAL_FATAL(ie_lora_quantize_int8(sl[r], &sq), IE_OK);
        same &= qs->bytes == sq->bytes; /* a share counted as its quantized self */
        for (int k = 0; k < 3 * IE_LORA_NMOD; k++) {
            const ie_lora_mat_t *x1 = &qs->mats[k], *x2 = &sq->mats[k];
            same &= x1->rank == x2->rank && x1->n_in == x2->n_in && x1->n_out == x2->n_out;
            if (!x1->rank || !same) continue;
            same &= !memcmp(x1->a8, x2->a8, (size_t)x1->rank * (size_t)x1->n_in) &&
                    !memcmp(x1->bt8, x2->bt8, (size_t)x1->rank * (size_t)x1->n_out) &&
                    !memcmp(x1->sa8, x2->sa8, sizeof(float) * (size_t)x1->n_in) &&
                    !memcmp(x1->sbt8, x2->sbt8, sizeof(float) * (size_t)x1->n_out);
        }
        ie_lora_destroy(&qs);
        ie_lora_destroy(&sq);
    }
    CU_ASSERT(same);
    ie_lora_destroy(&qa);
    /* layers outside a share are dropped */
    CU_ASSERT_EQUAL(ie_lora_mat(sl[1], 0, IE_LORA_Q)->rank, 0);
    CU_ASSERT_EQUAL(ie_lora_mat(sl[2], 1, IE_LORA_DOWN)->rank, 0);
    CU_ASSERT(sl[2]->bytes < sl[0]->bytes);
    /* a share outside the model is refused */
    ie_shard_range_t bad = sh[2];
    bad.ff_end = 41;
    ie_lora_t *no = NULL;
    CU_ASSERT_EQUAL(ie_lora_slice(a, &hp, &bad, &no), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(no);
    for (int r = 0; r < 3; r++) ie_lora_destroy(&sl[r]);
    ie_lora_destroy(&a);
}

static void test_worker_mixed(void)
{
    unsetenv("IE_LORA_POOL_MIN");
    worker_mixed();
    setenv("IE_LORA_POOL_MIN", "0", 1);
    worker_mixed();
    setenv("IE_LORA_DTYPE", "int8", 1); /* the worker's own int8 copies */
    worker_mixed();
    unsetenv("IE_LORA_DTYPE");
    unsetenv("IE_LORA_POOL_MIN");
}

/* A one-slot, one-thread f32 worker on the tiny fixture (NULL on failure,
 * which the caller asserts). */
static ie_worker_t *small_worker(void)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_seq = 1, o.n_ctx = 16, o.max_batch = 8, o.n_threads = 1, o.pin_threads = 0;
    o.precision = IE_PREC_F32;
    ie_worker_t *w = NULL;
    return ie_worker_new(g_src, &o, &w) == IE_OK ? w : NULL;
}

/* Logits of slot 0 prefilling k_ids[0] under adapter a (NULL: the base),
 * the adapter as IE_LORA_DTYPE dt has it. */
static void logits_with(const ie_lora_t *a, const char *dt, float *out)
{
    ie_worker_t *w = small_worker();
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    setenv("IE_LORA_DTYPE", dt, 1);
    int id = -1;
    if (a) CU_ASSERT_EQUAL(ie_worker_lora_add(w, a, 1.0f, &id), IE_OK);
    unsetenv("IE_LORA_DTYPE");
    int32_t pos[6], seq[6], ad[6];
    uint8_t want[6] = {0, 0, 0, 0, 0, 1};
    for (int i = 0; i < 6; i++) pos[i] = i, seq[i] = 0, ad[i] = id;
    ie_batch_t b = {6, k_ids[0], pos, seq, want, ad, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, out), IE_OK);
    ie_worker_destroy(&w);
}

/* An int8 copy moves the logits by a small part of what the adapter does. */
static void test_worker_int8(void)
{
    ie_lora_t *all = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(LORA "/all16", &g_hp, &all), IE_OK);
    const int nv = g_hp.n_vocab;
    float *base = malloc(sizeof(float) * (size_t)nv), *wide = malloc(sizeof(float) * (size_t)nv),
          *i8 = malloc(sizeof(float) * (size_t)nv);
    logits_with(NULL, "wide", base);
    logits_with(all, "wide", wide);
    logits_with(all, "int8", i8);
    double delta = 0, err = 0;
    for (int v = 0; v < nv; v++) {
        delta += ((double)wide[v] - base[v]) * ((double)wide[v] - base[v]);
        err += ((double)i8[v] - wide[v]) * ((double)i8[v] - wide[v]);
    }
    CU_ASSERT(delta > 0);
    CU_ASSERT(err > 0);                  /* int8 ran, */
    CU_ASSERT(sqrt(err / delta) < 0.02); /* within 2% of the adapter's effect */
    fprintf(stderr, " [int8: %.2e of the adapter's effect] ", sqrt(err / delta));
    free(base), free(wide), free(i8);
    ie_lora_destroy(&all);
}

/* ie_worker_lora_prepare on another thread (as ie-worker's adapter
 * thread runs it), its arguments and result. */
typedef struct prep_job {
    const ie_worker_lora_target_t *t;
    const ie_lora_t *a;
    ie_lora_t *run;
    ie_status_t st;
} prep_job_t;
static void *prep_main(void *arg)
{
    prep_job_t *j = arg;
    j->st = ie_worker_lora_prepare(j->t, j->a, &j->run);
    return NULL;
}

/* The split of ie_worker_lora_add: prepared on another thread and attached,
 * the same logits bit for bit as ie_worker_lora_add's (int8: the copy is
 * made by the prepare); an attach for another target and a prepare for
 * another model are refused, the caller keeping what it owns. */
static void test_worker_prepare_attach(void)
{
    ie_lora_t *all = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(LORA "/all16", &g_hp, &all), IE_OK);
    const int nv = g_hp.n_vocab;
    float *want = malloc(sizeof(float) * (size_t)nv), *got = malloc(sizeof(float) * (size_t)nv);
    logits_with(all, "int8", want);

    ie_worker_t *w = small_worker();
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    setenv("IE_LORA_DTYPE", "int8", 1);
    ie_worker_lora_target_t t;
    ie_worker_lora_target(w, &t);
    unsetenv("IE_LORA_DTYPE");
    CU_ASSERT_EQUAL(t.int8, 1);
    prep_job_t j = {&t, all, NULL, IE_ERR_INTERNAL};
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, prep_main, &j), 0);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(j.st, IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j.run); /* the int8 copy */
    CU_ASSERT_PTR_NOT_NULL(ie_lora_mat(j.run, 0, IE_LORA_Q)->a8);
    /* w runs the file's weights (IE_LORA_DTYPE unset, f32 base): not t */
    int id = -1;
    CU_ASSERT_EQUAL(ie_worker_lora_attach(w, &t, all, &j.run, 1.0f, &id), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(j.run); /* still the caller's */
    CU_ASSERT_EQUAL(id, -1);
    setenv("IE_LORA_DTYPE", "int8", 1);
    CU_ASSERT_EQUAL(ie_worker_lora_attach(w, &t, all, &j.run, 1.0f, &id), IE_OK);
    unsetenv("IE_LORA_DTYPE");
    CU_ASSERT_PTR_NULL(j.run); /* the worker's now */
    int32_t pos[6], seq[6], ad[6];
    uint8_t lg[6] = {0, 0, 0, 0, 0, 1};
    for (int i = 0; i < 6; i++) pos[i] = i, seq[i] = 0, ad[i] = id;
    ie_batch_t b = {6, k_ids[0], pos, seq, lg, ad, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, got), IE_OK);
    CU_ASSERT_EQUAL(memcmp(got, want, sizeof(float) * (size_t)nv), 0);
    /* a model of another depth: refused, nothing made */
    ie_worker_lora_target_t t2 = t;
    t2.hp.n_layer++;
    ie_lora_t *run = (ie_lora_t *)all; /* overwritten with NULL */
    CU_ASSERT_EQUAL(ie_worker_lora_prepare(&t2, all, &run), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(run);
    ie_worker_destroy(&w); /* frees the int8 copy it took */
    free(want), free(got);
    ie_lora_destroy(&all);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("lora", suite_init, suite_clean);
    CU_add_test(s, "lora_shrink/expand kernels == ref on odd ranks, groups, splits", test_kernels);
    CU_add_test(s, "ref kernel == double sum", test_kernel_exact);
    CU_add_test(s, "int8 kernels at the sums' extremes == ref", test_kernel_int8_extreme);
    CU_add_test(s, "loader: PEFT images and refusals", test_loader_memory);
    CU_add_test(s, "loader: fixture files", test_loader_files);
    CU_add_test(s, "worker: mixed batch == solo runs", test_worker_mixed);
    CU_add_test(s, "worker: int8 adapters close to the file's weights", test_worker_int8);
    CU_add_test(s, "worker: prepare on another thread + attach == lora_add; refusals", test_worker_prepare_attach);
    CU_add_test(s, "ie_lora_slice: odd shares, sums of the parts == the whole", test_slice);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
