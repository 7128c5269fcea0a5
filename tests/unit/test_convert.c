/* test_convert.c — ie-convert end to end (ie_convert_main) with the ggml
 * block types of issue 18, on models made here (no model files):
 *
 *   - writing q4_K / q6_K / q8_0 (and every other k-quant this build can
 *     quantize): the IEBIN tensor's bytes are exactly ie_quantize_row's of
 *     the source rows, dequantize (ie_dequantize_row) within the type's
 *     error bound of the source floats, and PANEL16 (where this build packs
 *     the type) dequantizes bit for bit like those rows;
 *   - k-quant sources: an IEBIN holding q4_K / q6_K tensors converted to
 *     int8w (ROWS) and int4w affine (PANEL16) within int8 / int4 bounds of
 *     the dequantized source, "keep" and same-type targets copy the bytes;
 *   - row lengths that are not whole blocks: an error without a fallback,
 *     llama-quantize's substitutes with "fallback": "auto";
 *   - a NaN scale in a k-quant source stops the conversion (exit 3).
 *
 * The source is a one-layer Llama with 256-wide rows (n_embd 256, n_ff 512)
 * and random f32 weights, written as IEBIN with tiny_llama's tokenizer.
 */
#include "ie_convert.h"
#include "ie_iebin.h"
#include "ie_kernels.h"
#include "ie_model_src.h"
#include "ie_pack.h"

#include <CUnit/Basic.h>
#include <cjson/cJSON.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOK_JSON IE_TEST_DATA "/tiny_llama/tokenizer.json"
#define E 256 /* n_embd  */
#define F 512 /* n_ff    */
#define V 512 /* n_vocab (the tokenizer's) */

static char g_root[64];
static int g_seq;
static char g_src[128]; /* the f32 source model */

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[512];
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            if (unlink(p) != 0) rm_tree(p);
        }
    if (d) closedir(d);
    rmdir(dir);
}

static void new_dir(char *out, size_t cap) { snprintf(out, cap, "%s/m%d", g_root, g_seq++); }

/* ---------------------------------------------------------------- source */

typedef struct spec {
    const char *name;
    int n_dims;
    int64_t ne0, ne1;
} spec_t;

static const spec_t k_specs[] = {
    {"token_embd.weight", 2, E, V},      {"output_norm.weight", 1, E, 1},       {"output.weight", 2, E, V},
    {"blk.0.attn_norm.weight", 1, E, 1}, {"blk.0.attn_q.weight", 2, E, E},      {"blk.0.attn_k.weight", 2, E, 128},
    {"blk.0.attn_v.weight", 2, E, 128},  {"blk.0.attn_output.weight", 2, E, E}, {"blk.0.ffn_norm.weight", 1, E, 1},
    {"blk.0.ffn_gate.weight", 2, E, F},  {"blk.0.ffn_up.weight", 2, E, F},      {"blk.0.ffn_down.weight", 2, F, E},
};
#define N_SPECS ((int)(sizeof k_specs / sizeof k_specs[0]))

static float *g_w[N_SPECS]; /* the source floats */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(g_rng >> 11) + 0.5) / 9007199254740992.0;
}

/* Gaussian weights (sd 0.05) with an outlier now and then, as real
 * weights have; norms near 1. */
static void make_weights(void)
{
    for (int i = 0; i < N_SPECS; i++) {
        size_t n = (size_t)(k_specs[i].ne0 * k_specs[i].ne1);
        g_w[i] = malloc(n * sizeof(float));
        for (size_t k = 0; k < n; k++) {
            double g = sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand());
            if (k_specs[i].n_dims == 1) g_w[i][k] = (float)(1.0 + 0.1 * g);
            else g_w[i][k] = (float)(0.05 * g * (urand() < 0.002 ? 8.0 : 1.0));
        }
    }
}

static ie_hparams_t hp256(void)
{
    ie_hparams_t hp;
    memset(&hp, 0, sizeof hp);
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.arch_id = IE_ARCH_LLAMA;
    snprintf(hp.name, sizeof hp.name, "test_convert 256");
    hp.n_layer = 1;
    hp.n_embd = E;
    hp.n_ff = F;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim = 64;
    hp.n_vocab = V;
    hp.n_ctx_train = 256;
    hp.rope_dim = 64;
    hp.rope_theta = 10000.0f;
    hp.rms_eps = 1e-5f;
    hp.rope_layout = IE_ROPE_NEOX;
    hp.rope_attn_factor = 1.0f;
    return hp;
}

/* Write the f32 source model into dir; 0 or -1 (before any test runs). */
static int write_source(const char *dir)
{
    ie_iebin_writer_t *w = NULL;
    ie_hparams_t hp = hp256();
    if (ie_iebin_writer_open(dir, &w) != IE_OK) return -1;
    for (int i = 0; i < N_SPECS; i++) {
        const spec_t *s = &k_specs[i];
        ie_tensor_t t = {s->name,        IE_DTYPE_F32,
                         s->n_dims,      {s->ne0, s->ne1, 1, 1},
                         g_w[i],         (uint64_t)(s->ne0 * s->ne1) * sizeof(float),
                         IE_LAYOUT_ROWS, 0};
        if (ie_iebin_writer_add(w, &t, NULL) != IE_OK) break;
    }
    if (ie_iebin_writer_set_tokenizer(w, TOK_JSON) != IE_OK) {
        ie_iebin_writer_abort(&w);
        return -1;
    }
    return ie_iebin_writer_finish(&w, &hp, NULL) == IE_OK ? 0 : -1;
}

static int spec_index(const char *name)
{
    for (int i = 0; i < N_SPECS; i++)
        if (!strcmp(k_specs[i].name, name)) return i;
    return -1;
}

/* ---------------------------------------------------------------- running */

/* ie-convert --in IN --out-dir OUT --q4-map <manifest> --pretranspose PT. */
static int convert(const char *in, const char *out, const char *manifest, const char *pt)
{
    char mpath[256];
    snprintf(mpath, sizeof mpath, "%s/manifest%d.json", g_root, g_seq++);
    FILE *f = fopen(mpath, "w");
    if (!f || fputs(manifest, f) < 0) abort();
    fclose(f);
    char *argv[] = {"ie-convert", "--in",           (char *)in, "--out-dir", (char *)out, "--q4-map", mpath,
                    "--quiet",    "--pretranspose", (char *)pt, "--threads", "2",         NULL};
    fflush(stdout);
    int rc = ie_convert_main((int)(sizeof argv / sizeof argv[0]) - 1, argv);
    fflush(stdout);
    unlink(mpath);
    return rc;
}

/* Can this build quantize ggml type t (ie_quantize_row on one block)? */
static int can_quantize(ie_dtype_t t)
{
    float z[IE_QK_K] = {0};
    uint8_t out[512];
    return ie_quantize_row(t, z, out, ie_dtype_block_elems(t)) == 0;
}

/* Row r of tensor t as floats (ROWS ggml, ROWS int, or PANEL16). */
static void row_of(const ie_tensor_t *t, int64_t r, float *dst)
{
    int64_t n_in = t->ne[0];
    if (t->layout == IE_LAYOUT_PANEL16) {
        ie_pmat_t m = {t->dtype, t->group, n_in, t->ne[1], t->data};
        ie_pack_dequant_row(&m, r, dst);
    } else if (ie_dtype_is_intw(t->dtype)) {
        size_t rb = ie_qrow_bytes(t->dtype, t->group, n_in);
        ie_qrow_dequantize(t->dtype, t->group, (const char *)t->data + (size_t)r * rb, dst, n_in);
    } else {
        size_t rb = ie_dtype_row_bytes(t->dtype, n_in);
        ie_dequantize_row(t->dtype, (const char *)t->data + (size_t)r * rb, dst, n_in);
    }
}

/* Relative RMS error a ggml type may have on these Gaussian weights, and
 * the largest error per element relative to its row's max |x|: about 1.3x
 * what this data measures (q8_0 0.0065 / 0.0042, q6_K 0.021 / 0.025, q5_K
 * 0.039 / 0.058, q5_0 0.051 / 0.062, q4_K 0.078 / 0.114, iq4_xs 0.085 /
 * 0.112, q4_0 0.103 / 0.124, q3_K 0.157 / 0.214, q2_K 0.278 / 0.445); a
 * wrong scale or code layout is off by far more. */
static void type_bounds(ie_dtype_t t, double *rel_rms, double *rel_max)
{
    switch (t) {
    case IE_DTYPE_Q8_0: *rel_rms = 0.009, *rel_max = 0.006; break;
    case IE_DTYPE_Q6_K: *rel_rms = 0.028, *rel_max = 0.034; break;
    case IE_DTYPE_Q5_K:
    case IE_DTYPE_Q5_0:
    case IE_DTYPE_Q5_1: *rel_rms = 0.067, *rel_max = 0.081; break;
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q4_1:
    case IE_DTYPE_IQ4_NL:
    case IE_DTYPE_IQ4_XS: *rel_rms = 0.111, *rel_max = 0.149; break;
    case IE_DTYPE_Q4_0: *rel_rms = 0.134, *rel_max = 0.162; break;
    case IE_DTYPE_Q3_K: *rel_rms = 0.205, *rel_max = 0.28; break;
    default: *rel_rms = 0.362, *rel_max = 0.58; break; /* q2_K */
    }
}

/* Check tensor `name` of the converted model against the source: dtype and
 * layout as wanted, ROWS bytes = ie_quantize_row of the source rows (PANEL16:
 * the same values bit for bit), and the dequantized error within bounds. */
static void check_ggml_tensor(const ie_model_src_t *m, const char *name, ie_dtype_t want, ie_layout_t lay)
{
    const ie_tensor_t *t = ie_model_src_tensor(m, name);
    int si = spec_index(name);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_FATAL(si >= 0);
    CU_ASSERT_EQUAL(t->dtype, want);
    CU_ASSERT_EQUAL(t->layout, lay);
    if (t->dtype != want || t->layout != lay) {
        printf("\n%s: %s %s, wanted %s %s\n", name, ie_dtype_name(t->dtype), ie_layout_name(t->layout),
               ie_dtype_name(want), ie_layout_name(lay));
        return;
    }
    int64_t n_in = t->ne[0], n_out = t->ne[1];
    size_t rb = ie_dtype_row_bytes(want, n_in);
    void *q = malloc(rb);
    float *ref = malloc((size_t)n_in * sizeof(float)), *got = malloc((size_t)n_in * sizeof(float));
    double se = 0, ss = 0, rel_rms, rel_max, worst = 0;
    int bytes_equal = 1, values_equal = 1;
    type_bounds(want, &rel_rms, &rel_max);
    for (int64_t r = 0; r < n_out; r++) {
        const float *x = g_w[si] + r * n_in;
        CU_ASSERT_EQUAL_FATAL(ie_quantize_row(want, x, q, n_in), 0);
        if (lay == IE_LAYOUT_ROWS) bytes_equal &= memcmp((const char *)t->data + (size_t)r * rb, q, rb) == 0;
        ie_dequantize_row(want, q, ref, n_in);
        row_of(t, r, got);
        values_equal &= memcmp(ref, got, (size_t)n_in * sizeof(float)) == 0;
        float amax = 0;
        for (int64_t k = 0; k < n_in; k++) amax = fmaxf(amax, fabsf(x[k]));
        for (int64_t k = 0; k < n_in; k++) {
            double e = (double)got[k] - x[k];
            se += e * e;
            ss += (double)x[k] * x[k];
            if (fabs(e) / amax > worst) worst = fabs(e) / amax;
        }
    }
    CU_ASSERT(bytes_equal);
    CU_ASSERT(values_equal);
    double rel = sqrt(se / ss);
    CU_ASSERT(rel <= rel_rms);
    CU_ASSERT(worst <= rel_max);
    if (getenv("IE_TEST_VERBOSE") || !bytes_equal || !values_equal || rel > rel_rms || worst > rel_max)
        printf("\n%s as %s: bytes %d values %d rel rms %.4f (<= %.3f) max %.4f (<= %.3f)\n", name,
               ie_dtype_name(want), bytes_equal, values_equal, rel, rel_rms, worst, rel_max);
    free(q);
    free(ref);
    free(got);
}

/* The "quant" record of tensor `name` in dir's model.ie.json has `key` =
 * string `val` (val NULL: key is true). */
static int quant_has(const char *dir, const char *name, const char *key, const char *val)
{
    char path[256];
    snprintf(path, sizeof path, "%s/model.ie.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    size_t got = fread(text, 1, (size_t)n, f);
    fclose(f);
    text[got] = '\0';
    cJSON *root = cJSON_Parse(text), *t;
    free(text);
    int ok = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors"))
    {
        const cJSON *nm = cJSON_GetObjectItem(t, "name"), *q = cJSON_GetObjectItem(t, "quant");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, name) || !q) continue;
        const cJSON *v = cJSON_GetObjectItem(q, key);
        ok = val ? cJSON_IsString(v) && !strcmp(v->valuestring, val) : cJSON_IsTrue(v);
    }
    cJSON_Delete(root);
    return ok;
}

/* ---------------------------------------------------------------- tests */

/* A llama-quantize-like mix (q4_K, q6_K on attn_v / ffn_down / output,
 * q8_0 embedding) in ROWS, then with --pretranspose all. */
static void test_write_mix(void)
{
    static const char *man =
        "{\"version\":1,\"rules\":["
        "{\"pattern\":\"^output\\\\.weight$\",\"dtype\":\"q6_K\"},"
        "{\"pattern\":\"^blk\\\\.\\\\d+\\\\.(attn_v|ffn_down)\\\\.weight$\",\"dtype\":\"q6_K\"},"
        "{\"pattern\":\"^blk\\\\.\\\\d+\\\\.\",\"dtype\":\"q4_K\"},"
        "{\"pattern\":\"^token_embd\\\\.weight$\",\"dtype\":\"q8_0\"}]}";
    static const struct {
        const char *name;
        ie_dtype_t dt;
    } want[] = {{"output.weight", IE_DTYPE_Q6_K},         {"blk.0.attn_v.weight", IE_DTYPE_Q6_K},
                {"blk.0.ffn_down.weight", IE_DTYPE_Q6_K}, {"blk.0.attn_q.weight", IE_DTYPE_Q4_K},
                {"blk.0.attn_k.weight", IE_DTYPE_Q4_K},   {"blk.0.attn_output.weight", IE_DTYPE_Q4_K},
                {"blk.0.ffn_gate.weight", IE_DTYPE_Q4_K}, {"blk.0.ffn_up.weight", IE_DTYPE_Q4_K},
                {"token_embd.weight", IE_DTYPE_Q8_0}};
    CU_ASSERT_FATAL(can_quantize(IE_DTYPE_Q4_K) && can_quantize(IE_DTYPE_Q6_K));
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_Q4_K, IE_QK_K, E), 0); /* so pass 1 writes PANEL16 k-quants */
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_Q6_K, IE_QK_K, F), 0);
    for (int pass = 0; pass < 2; pass++) {
        char out[128];
        ie_model_src_t *m = NULL;
        new_dir(out, sizeof out);
        CU_ASSERT_EQUAL_FATAL(convert(g_src, out, man, pass ? "all" : "none"), 0);
        CU_ASSERT_EQUAL_FATAL(ie_model_src_open(out, &m), IE_OK);
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            ie_layout_t lay = IE_LAYOUT_ROWS;
            int qk = ie_dtype_block_elems(want[i].dt);
            /* --pretranspose all packs what this build can pack; the
             * untied embedding is looked up by rows and never packed */
            if (pass && strcmp(want[i].name, "token_embd.weight") && ie_pack_check(want[i].dt, qk, E) == 0)
                lay = IE_LAYOUT_PANEL16;
            check_ggml_tensor(m, want[i].name, want[i].dt, lay);
            CU_ASSERT(quant_has(out, want[i].name, "scheme", ie_dtype_name(want[i].dt)));
            CU_ASSERT(quant_has(out, want[i].name, "from", "f32"));
        }
        /* norms are kept */
        CU_ASSERT_EQUAL(ie_model_src_tensor(m, "output_norm.weight")->dtype, IE_DTYPE_F32);
        ie_model_src_destroy(&m);
        rm_tree(out);
    }
}

/* Every other ggml type this build quantizes, on ffn_gate (rows of 256). */
static void test_write_each_type(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_Q5_0, IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL, IE_DTYPE_Q2_K,
                                       IE_DTYPE_Q3_K, IE_DTYPE_Q5_K, IE_DTYPE_IQ4_XS, IE_DTYPE_Q4_0,
                                       IE_DTYPE_Q4_1, IE_DTYPE_Q4_K, IE_DTYPE_Q6_K};
    int n_done = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (!can_quantize(types[i])) continue; /* refused by the manifest: test_manifest checks the message */
        char out[128], man[256];
        ie_model_src_t *m = NULL;
        new_dir(out, sizeof out);
        snprintf(man, sizeof man, "{\"version\":1,\"rules\":[{\"pattern\":\"ffn_gate\",\"dtype\":\"%s\"}]}",
                 ie_dtype_name(types[i]));
        CU_ASSERT_EQUAL_FATAL(convert(g_src, out, man, "none"), 0);
        CU_ASSERT_EQUAL_FATAL(ie_model_src_open(out, &m), IE_OK);
        check_ggml_tensor(m, "blk.0.ffn_gate.weight", types[i], IE_LAYOUT_ROWS);
        ie_model_src_destroy(&m);
        rm_tree(out);
        n_done++;
    }
    CU_ASSERT(n_done >= 4); /* q4_0, q4_1, q4_K, q6_K at least */
}

/* int8w / int4w affine from a k-quant source: within the target's rounding
 * of the dequantized source. */
static void check_int_tensor(const ie_model_src_t *m, const ie_model_src_t *src, const char *name, ie_dtype_t want)
{
    const ie_tensor_t *t = ie_model_src_tensor(m, name), *s = ie_model_src_tensor(src, name);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(t->dtype, want);
    if (t->dtype != want) return;
    int64_t n_in = t->ne[0], G = t->group;
    float *x = malloc((size_t)n_in * sizeof(float)), *y = malloc((size_t)n_in * sizeof(float));
    int ok = 1;
    for (int64_t r = 0; r < t->ne[1]; r++) {
        row_of(s, r, x);
        row_of(t, r, y);
        for (int64_t g0 = 0; g0 < n_in; g0 += G) {
            float lo = x[g0], hi = x[g0];
            for (int64_t k = g0; k < g0 + G; k++) lo = fminf(lo, x[k]), hi = fmaxf(hi, x[k]);
            float amax = fmaxf(fabsf(lo), fabsf(hi));
            /* half a step, plus the f16 rounding of the scale (and offset) */
            double step = want == IE_DTYPE_I8W ? amax / 127.0 : (hi - lo) / 15.0;
            double bound = 0.5 * step * 1.01 + 2e-3 * amax + 1e-7;
            for (int64_t k = g0; k < g0 + G; k++)
                if (fabs((double)y[k] - x[k]) > bound) ok = 0;
        }
    }
    CU_ASSERT(ok);
    if (!ok) printf("\n%s as %s: outside the rounding bound\n", name, ie_dtype_name(want));
    free(x);
    free(y);
}

static void test_kquant_source(void)
{
    char kq[128], out[128];
    ie_model_src_t *src = NULL, *m = NULL;
    new_dir(kq, sizeof kq);
    CU_ASSERT_EQUAL_FATAL(
        convert(g_src, kq,
                "{\"version\":1,\"rules\":[{\"pattern\":\"ffn_down|output\\\\.\",\"dtype\":\"q6_K\"},"
                "{\"pattern\":\".\",\"dtype\":\"q4_K\"}]}",
                "none"),
        0);
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(kq, &src), IE_OK);
    CU_ASSERT_EQUAL(ie_model_src_tensor(src, "blk.0.attn_q.weight")->dtype, IE_DTYPE_Q4_K);
    CU_ASSERT_EQUAL(ie_model_src_tensor(src, "blk.0.ffn_down.weight")->dtype, IE_DTYPE_Q6_K);

    /* -> int8w g32 ROWS and int4w affine g32 PANEL16 */
    for (int pass = 0; pass < 2; pass++) {
        new_dir(out, sizeof out);
        CU_ASSERT_EQUAL_FATAL(
            convert(
                kq, out,
                pass ? "{\"version\":1,\"rules\":[{\"pattern\":\"^blk\",\"dtype\":\"int4w\",\"zero\":\"affine\"},"
                       "{\"pattern\":\".\",\"dtype\":\"int8w\"}]}"
                     : "{\"version\":1,\"rules\":[{\"pattern\":\".\",\"dtype\":\"int8w\"}]}",
                pass ? "all" : "none"),
            0);
        CU_ASSERT_EQUAL_FATAL(ie_model_src_open(out, &m), IE_OK);
        for (int i = 0; i < N_SPECS; i++) {
            if (k_specs[i].n_dims == 1) continue;
            int blk = !strncmp(k_specs[i].name, "blk", 3);
            check_int_tensor(m, src, k_specs[i].name, pass && blk ? IE_DTYPE_I4WA : IE_DTYPE_I8W);
            CU_ASSERT_EQUAL(ie_model_src_tensor(m, k_specs[i].name)->layout,
                            pass && strcmp(k_specs[i].name, "token_embd.weight") ? IE_LAYOUT_PANEL16
                                                                                 : IE_LAYOUT_ROWS);
        }
        CU_ASSERT(quant_has(out, "blk.0.attn_q.weight", "from", "q4_K"));
        ie_model_src_destroy(&m);
        rm_tree(out);
    }

    /* keep, and a target equal to the source's type: the same bytes */
    new_dir(out, sizeof out);
    CU_ASSERT_EQUAL_FATAL(convert(kq, out,
                                  "{\"version\":1,\"rules\":[{\"pattern\":\"attn\",\"dtype\":\"keep\"},"
                                  "{\"pattern\":\"ffn_down|output\\\\.\",\"dtype\":\"q6_k\"},"
                                  "{\"pattern\":\".\",\"dtype\":\"q4_K\"}]}",
                                  "none"),
                          0);
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(out, &m), IE_OK);
    for (int i = 0; i < N_SPECS; i++) {
        const ie_tensor_t *a = ie_model_src_tensor(src, k_specs[i].name),
                          *b = ie_model_src_tensor(m, k_specs[i].name);
        CU_ASSERT(a->dtype == b->dtype && a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0);
    }
    CU_ASSERT(quant_has(out, "blk.0.ffn_down.weight", "lossless", NULL));
    ie_model_src_destroy(&m);
    rm_tree(out);

    /* a NaN super-block scale in a converted k-quant tensor: exit 3 */
    {
        const ie_tensor_t *t = ie_model_src_tensor(src, "blk.0.attn_q.weight");
        char path[256];
        new_dir(out, sizeof out);
        ie_iebin_t *ib = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_iebin_open(kq, &ib), IE_OK);
        uint64_t off = 0;
        for (int64_t i = 0; i < ie_iebin_n_tensors(ib); i++) {
            const ie_tensor_t *u = ie_iebin_tensor(ib, i);
            if (!strcmp(u->name, t->name))
                off = (uint64_t)((const char *)u->data - (const char *)ie_iebin_tensor(ib, 0)->data);
        }
        ie_iebin_destroy(&ib);
        /* tensor 0's data is at blob offset 0: the writer aligns from 0 */
        snprintf(path, sizeof path, "%s/model.ie.bin", kq);
        FILE *f = fopen(path, "r+b");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        const uint8_t nan16[2] = {0x00, 0x7e}; /* q4_K: d is the block's first field */
        CU_ASSERT_EQUAL(fseek(f, (long)(off + 144 * 3), SEEK_SET), 0);
        CU_ASSERT_EQUAL(fwrite(nan16, 1, 2, f), 2);
        fclose(f);
        setenv("IE_IEBIN_VERIFY", "0", 1);
        CU_ASSERT_EQUAL(convert(kq, out, "{\"version\":1,\"rules\":[{\"pattern\":\".\",\"dtype\":\"int8w\"}]}",
                                "none"),
                        3);
        unsetenv("IE_IEBIN_VERIFY");
        CU_ASSERT(access(out, F_OK) != 0); /* nothing written */
        rm_tree(out);
    }
    ie_model_src_destroy(&src);
    rm_tree(kq);
}

/* tiny_llama's rows (64, 128) are no multiple of 256: an error without a
 * fallback, llama-quantize's substitutes with "auto". */
static void test_fallbacks(void)
{
    char out[128];
    ie_model_src_t *m = NULL;
    const char *gguf = IE_TEST_DATA "/tiny_llama_f32.gguf";
    new_dir(out, sizeof out);
    CU_ASSERT_EQUAL(convert(gguf, out, "{\"version\":1,\"rules\":[{\"pattern\":\"^blk\",\"dtype\":\"q4_K\"}]}",
                            "none"),
                    2);
    CU_ASSERT(access(out, F_OK) != 0);
    CU_ASSERT_FATAL(can_quantize(IE_DTYPE_Q5_0) && can_quantize(IE_DTYPE_IQ4_NL) && can_quantize(IE_DTYPE_Q4_0));
    CU_ASSERT_EQUAL_FATAL(convert(gguf, out,
                                  "{\"version\":1,\"rules\":["
                                  "{\"pattern\":\"ffn_down\",\"dtype\":\"q6_K\",\"fallback\":\"auto\"},"
                                  "{\"pattern\":\"attn_output\",\"dtype\":\"q3_K\",\"fallback\":\"auto\"},"
                                  "{\"pattern\":\"ffn_gate\",\"dtype\":\"iq4_xs\",\"fallback\":\"auto\"},"
                                  "{\"pattern\":\"^blk\",\"dtype\":\"q4_K\",\"fallback\":\"auto\"}]}",
                                  "none"),
                          0);
    {
        CU_ASSERT_EQUAL_FATAL(ie_model_src_open(out, &m), IE_OK);
        CU_ASSERT_EQUAL(ie_model_src_tensor(m, "blk.0.ffn_down.weight")->dtype, IE_DTYPE_Q8_0);
        CU_ASSERT_EQUAL(ie_model_src_tensor(m, "blk.1.attn_q.weight")->dtype, IE_DTYPE_Q5_0);
        CU_ASSERT_EQUAL(ie_model_src_tensor(m, "blk.1.ffn_up.weight")->dtype, IE_DTYPE_Q5_0);
        CU_ASSERT_EQUAL(ie_model_src_tensor(m, "blk.0.attn_output.weight")->dtype, IE_DTYPE_Q4_0);
        CU_ASSERT_EQUAL(ie_model_src_tensor(m, "blk.0.ffn_gate.weight")->dtype, IE_DTYPE_IQ4_NL);
        CU_ASSERT_EQUAL(ie_model_src_tensor(m, "output.weight")->dtype, IE_DTYPE_F32); /* no rule */
        CU_ASSERT(quant_has(out, "blk.1.attn_q.weight", "fallback", NULL));
        CU_ASSERT(quant_has(out, "blk.1.attn_q.weight", "scheme", "q5_0"));
        ie_model_src_destroy(&m);
    }
    rm_tree(out);
}

int main(void)
{
    unsigned failures;
    snprintf(g_root, sizeof g_root, "/tmp/ie_test_convert_XXXXXX");
    if (!mkdtemp(g_root)) return 2;
    make_weights();
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("convert", NULL, NULL);
    new_dir(g_src, sizeof g_src);
    if (write_source(g_src) != 0) {
        fprintf(stderr, "cannot write the source model: %s\n", ie_error_last());
        return 2;
    }
    CU_add_test(s, "write a q4_K/q6_K/q8_0 mix, ROWS and PANEL16", test_write_mix);
    CU_add_test(s, "write every ggml type this build quantizes", test_write_each_type);
    CU_add_test(s, "k-quant sources -> int8w / int4w, keep, lossless, NaN scale", test_kquant_source);
    CU_add_test(s, "rows not whole blocks: error, fallback auto", test_fallbacks);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    for (int i = 0; i < N_SPECS; i++) free(g_w[i]);
    rm_tree(g_root);
    return failures ? 1 : 0;
}
